"""Saved models: each party's trained part of a VFL run, written into the run directory.

Layout (``<run_dir>/model/<party id>/``: ``active``, ``passive``, ``passive2`` …; the
format is documented in docs/reference/saved-models.md):

* ``weights.pt``: ``torch.save`` of ``{"bottom": state_dict}`` (passive) or
  ``{"bottom": ..., "top": ...}`` (active): tensors only, read back with
  ``torch.load(..., weights_only=True)``. The parameters and floating-point buffers are
  the parameter server's final vector (:meth:`parties.runtime.party.Party.trained_modules`).
* ``encoders.json``: the fitted feature encoder (:class:`parties.data.encoders.FittedEncoder`),
  or, with DP on, ``schema.toml``: the passive party's public schema
  (:class:`parties.data.schema.SchemaEncoder`; nothing fitted on its rows).
* ``config.toml``: the run's config (``[vfl]``).
* ``ledger.json`` (passive party): its per-record publication ledger at the end of the
  run (:meth:`parties.privacy.dp.GdpAccountant.state_dict`), which predictions continue.
* ``manifest.json``: format version, run id, role, config digest (the shared settings'
  digest, equal on both parties of one run), columns, feature names, model spec,
  embedding width, task, the label's encoding (active party), torch version and the
  sha256 of ``weights.pt``.

Each party writes only its own part and reads only its own part back.
"""

from __future__ import annotations

import dataclasses

import hashlib
import io
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import torch
from torch import nn

from pubsub.outputs import write_atomic

from parties.config import VflConfig, dump_vfl_config, load_saved_config
from parties.data import DataError
from parties.data.encoders import EncoderFormatError, FittedEncoder
from parties.core.errors import VflError
from parties.config.modelspec import BUILTINS, ModelSpecError, import_callable
from parties.models.zoo import ModelFactory

if TYPE_CHECKING:
    from parties.runtime.party import Party

#: ``manifest.json`` format version.
FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.pt"
MANIFEST_FILE = "manifest.json"


class SavedModelError(DataError):
    """A saved part cannot be used: missing or unreadable files, another format version,
    a weight file whose sha256 differs from the manifest's, or weights that do not fit
    the model (bad input: exit 2).

    Attributes:
        path: the part's directory.
    """

    def __init__(self, path: str | Path, detail: str) -> None:
        self.path = str(path)
        super().__init__(f"saved model {self.path!r}: {detail}")


class SavedModelMismatch(VflError, ValueError):
    """Two parties' saved parts come from different runs (run id or config digest).

    Attributes:
        mine / theirs: ``{"run_id": ..., "config_digest": ...}`` of each party's part.
        party: the party id whose part is ``theirs`` (None: not known).
    """

    def __init__(self, mine: Mapping[str, Any], theirs: Mapping[str, Any], *,
                 party: str | None = None) -> None:
        self.mine = dict(mine)
        self.theirs = dict(theirs)
        self.party = party
        who = "theirs" if party is None else f"the {party} party's"
        head = ("the parties' saved models come from different runs" if party is None else
                f"the {party} party's saved model comes from another run")
        super().__init__(
            f"{head}: ours is run {mine.get('run_id')!r} (config digest "
            f"{mine.get('config_digest')!r}), {who} run {theirs.get('run_id')!r} (config "
            f"digest {theirs.get('config_digest')!r})")


def part_dir(run_dir: str | Path, role: str) -> Path:
    """``<run_dir>/model/<party id>`` (``active``, ``passive``, ``passive2`` …).

    Raises:
        ValueError: not a party id.
    """
    from parties.core.ids import role_of

    role_of(role)
    return Path(run_dir) / "model" / role


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write(path: Path, data: bytes | str) -> None:
    write_atomic(path, data)  # whole or not at all; OutputError names the file


def config_digest(cfg: VflConfig, n_rows: int) -> str:
    """The shared settings' digest (:meth:`VflConfig.shared_settings`): equal on both
    parties of one run."""
    return str(cfg.shared_settings(n_rows)["digest"])


def ledger_to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    """:meth:`parties.privacy.dp.GdpAccountant.state_dict` as JSON-ready data."""
    out = {**state, "counts": {g: np.asarray(c).tolist() for g, c in state["counts"].items()}}
    if "extra" in state:  # the reassignment reserve's per-record extras
        out["extra"] = {g: np.asarray(c).tolist() for g, c in state["extra"].items()}
    return out


def save_party_model(run_dir: str | Path, party: Party, *, run_id: str) -> Path:
    """Write ``party``'s trained part into ``<run_dir>/model/<role>/`` (see the module
    docstring); returns that directory. Call after :meth:`Party.run` returned.

    Raises:
        OSError: the directory cannot be written.
    """
    from parties.data.preflight import dp_schema
    from parties.data.schema import dump_schema

    role, cfg, data = party.role, party.cfg, party.data
    out = part_dir(run_dir, party.party)
    out.mkdir(parents=True, exist_ok=True)
    mods = party.trained_modules()
    weights = {"bottom": mods[0].state_dict()}
    if role == "active":
        weights["top"] = mods[1].state_dict()
    buf = io.BytesIO()  # torch's zip writer turns a file's OSError into a RuntimeError
    torch.save(weights, buf)
    _write(out / WEIGHTS_FILE, buf.getvalue())
    if data.encoder is not None:
        encoder = {"kind": "fitted", "file": "encoders.json"}
        _write(out / "encoders.json", orjson.dumps(data.encoder.to_dict(),
                                                   option=orjson.OPT_INDENT_2))
    else:
        encoder = {"kind": "schema", "file": "schema.toml"}
        _write(out / "schema.toml", dump_schema(dp_schema(cfg, data.columns)))
    _write(out / "config.toml", dump_vfl_config(cfg))
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "run_id": run_id,
        "role": role,
        "party": party.party,
        "config_digest": config_digest(cfg, data.n_rows),
        "n_rows": data.n_rows,
        "columns": list(data.columns),
        "d_in": int(data.x_train.shape[1]),
        "model": party.models.describe(party.role),
        "embedding_dim": cfg.model.embedding_dim,
        "task": data.task,
        "encoder": encoder,
        "torch_version": torch.__version__,
        "weights": {"file": WEIGHTS_FILE, "sha256": _sha256(out / WEIGHTS_FILE),
                    "modules": list(weights)},
        "dp": {"enabled": cfg.dp.enabled},
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if role == "active":
        manifest["label"] = ({"column": data.label, "encoding": "standardised",
                              "mean": data.label_mean, "std": data.label_std}
                             if data.task == "regression" else
                             {"column": data.label, "encoding": "binary",
                              "positive": data.label_positive})
    if role == "passive" and party.dp_acct is not None:
        _write(out / "ledger.json", orjson.dumps(ledger_to_json(party.dp_acct.state_dict()),
                                                 option=orjson.OPT_SERIALIZE_NUMPY))
        manifest["dp"]["ledger"] = "ledger.json"
    _write(out / MANIFEST_FILE, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedPart:
    """One party's saved part, loaded.

    Attributes:
        path: its directory.
        role: ``"active"`` or ``"passive"``.
        party: its party id (``active``, ``passive``, ``passive2`` …).
        manifest: ``manifest.json``.
        cfg: the run's config.
        modules: bottom (and top, active) in eval mode with the saved weights.
        encoder: :class:`parties.data.encoders.FittedEncoder` or
            :class:`parties.data.schema.SchemaEncoder`; both have ``transform(frame)``.
        ledger: the passive party's saved ledger state (JSON form), or None.
    """

    path: Path
    role: str
    party: str
    manifest: dict[str, Any]
    cfg: VflConfig
    modules: Sequence[nn.Module]
    encoder: Any
    ledger: dict[str, Any] | None

    @property
    def identity(self) -> dict[str, Any]:
        """What both parties' parts must share: ``run_id`` and ``config_digest``."""
        return {"run_id": self.manifest["run_id"],
                "config_digest": self.manifest["config_digest"]}


def _factory(cfg: VflConfig, spec: Mapping[str, Any]) -> ModelFactory:
    """The factory that rebuilds the saved architecture (a Python callable is imported by
    its recorded ``module:qualname``)."""
    model, top = str(spec.get("model", cfg.model.bottom)), str(spec.get("top_model", "mlp"))
    try:
        bottom_fn = None if model in BUILTINS else import_callable("model.bottom", model)
        top_fn = None if top in BUILTINS else import_callable("model.top", top)
    except ModelSpecError as exc:
        raise ModelSpecError(exc.key.removeprefix("vfl."), exc.value,
                             str(exc).split(": ", 2)[-1] + "; a model that cannot be "
                             "imported by its module:callable must be given again "
                             "(load_party_model(..., models=), sim.api.predict(..., "
                             "models=))") from None
    cfg = replace(cfg, model=replace(cfg.model,
                                     bottom=model if model in BUILTINS else cfg.model.bottom,
                                     top=top if top in BUILTINS else cfg.model.top))
    return ModelFactory(cfg, bottom_fn, top_fn)


def load_party_model(run_dir: str | Path, party: str, *, models: Any = None) -> SavedPart:
    """Load party ``party``'s part of the run in ``run_dir`` (``<run_dir>/model/<party>``;
    a party id: ``active``, ``passive``, ``passive2`` …).

    ``models``: the :class:`parties.models.zoo.ModelFactory` that trained it, to rebuild the
    architecture with (needed when the recorded spec is not an importable
    ``module:callable``: a lambda, a ``functools.partial``, a class defined in a script's
    ``__main__`` read from another process); None: rebuilt from the recorded spec.

    Raises:
        SavedModelError: missing/unreadable files, another format version, a sha256
            mismatch, or weights that do not fit the recorded model.
        parties.models.zoo.ModelSpecError: a recorded user factory cannot be imported.
    """
    from parties.core.ids import role_of
    from parties.data.schema import SchemaEncoder, load_schema

    path = part_dir(run_dir, party)
    role = role_of(party)
    try:
        manifest = orjson.loads((path / MANIFEST_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise SavedModelError(path, f"no readable {MANIFEST_FILE} ({exc})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise SavedModelError(path, f"format version {manifest.get('format_version')!r}, "
                              f"this version reads {FORMAT_VERSION}")
    if manifest.get("role") != role:
        raise SavedModelError(path, f"manifest role {manifest.get('role')!r} != {role!r}")
    if manifest.get("party", party) != party:
        raise SavedModelError(path, f"manifest party {manifest.get('party')!r} != {party!r}")
    wfile = path / manifest["weights"]["file"]
    try:
        digest = _sha256(wfile)
    except OSError as exc:
        raise SavedModelError(path, f"cannot read the weights ({exc})") from None
    if digest != manifest["weights"]["sha256"]:
        raise SavedModelError(path, f"{wfile.name} has sha256 {digest}, the manifest says "
                              f"{manifest['weights']['sha256']}")
    cfg = load_saved_config(path / "config.toml")
    factory = (_factory(cfg, manifest.get("model", {})) if models is None else
               dataclasses.replace(models, cfg=cfg))
    enc_info = manifest["encoder"]
    encoder: Any
    try:
        if enc_info["kind"] == "fitted":
            encoder = FittedEncoder.from_dict(
                orjson.loads((path / enc_info["file"]).read_bytes()))
        else:
            encoder = SchemaEncoder(load_schema(path / enc_info["file"]))
    except (OSError, orjson.JSONDecodeError, EncoderFormatError) as exc:
        raise SavedModelError(path, f"cannot read the encoder ({exc})") from None
    hashed = getattr(encoder, "hashed_buckets", ())
    if hashed:  # the bottom holds the hashed columns' embedding tables
        factory = factory.with_hashed(hashed)
    with torch.random.fork_rng(devices=[]):  # initial values are overwritten below
        mods = factory.modules(role, int(manifest["d_in"]))
    state = torch.load(wfile, weights_only=True)
    try:
        mods[0].load_state_dict(state["bottom"])
        if role == "active":
            mods[1].load_state_dict(state["top"])
    except (KeyError, RuntimeError) as exc:
        raise SavedModelError(path, f"the weights do not fit the recorded model ({exc})"
                              ) from None
    for m in mods:
        m.eval()
    ledger = None
    if manifest.get("dp", {}).get("ledger"):
        ledger = orjson.loads((path / manifest["dp"]["ledger"]).read_bytes())
    return SavedPart(path=path, role=role, party=party, manifest=manifest, cfg=cfg,
                     modules=mods, encoder=encoder, ledger=ledger)


def check_same_run(mine: Mapping[str, Any], theirs: Mapping[str, Any], *,
                   party: str | None = None) -> None:
    """Refuse two parts of different runs (``party``: the id of the party whose part is
    ``theirs``, named in the error).

    Raises:
        SavedModelMismatch: ``run_id`` or ``config_digest`` differ (naming both ids).
    """
    if (mine.get("run_id"), mine.get("config_digest")) != (theirs.get("run_id"),
                                                           theirs.get("config_digest")):
        raise SavedModelMismatch(mine, theirs, party=party)


__all__ = ["FORMAT_VERSION", "SavedModelError", "SavedModelMismatch", "SavedPart",
           "check_same_run", "config_digest", "load_party_model", "part_dir",
           "save_party_model"]
