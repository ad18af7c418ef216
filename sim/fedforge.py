"""The Python API of FedForge, in the smartnoise-synth shape: configure, fit on the
parties' tables, sample.

::

    from sim.fedforge import FedForge

    ff = FedForge(epsilon=1.0, delta=1e-9, mechanism="mst", engine="mbi",
                  schema="schema.toml")                 # the reviewed public schema
    ff.fit([frame_a, frame_b, "party_c.parquet"])       # one table per party
    synthetic = ff.sample(10_000)
    ff.epsilon_spent                                    # each party's ε from its ledger

**What runs.** ``fit`` writes each party's table under the run directory and runs the
whole protocol: each party measures its noisy marginals (zCDP, its own ledger), the
masked sums go up the aggregation tree, the coordinator unmasks only the sums, fits the
engine and samples. ``transport="memory"`` (the default) runs every participant as a task
of this process over an in-memory bus (:mod:`sim.launch.synth_local`); ``transport="broker"``
starts a broker and the coordinator, aggregators and parties as processes with CURVE keys
(:func:`sim.launch.synth.run_synth`): the same classes, the same messages. Parties on
different hosts run ``python -m synth parties`` against a shared broker (docs/tutorials/across-hosts.md).

**The domain is public.** With a ``schema`` (a reviewed public schema TOML, as
``psfl vfl schema`` drafts it, or a :class:`synth.domain.Schema`) no record decides a
column's levels or bins. Without one the domain is inferred from the pooled rows, which
the privacy guarantee does not cover: the API warns and the run's metrics say
``domain_source = "inferred"``.

**Errors before anything runs.** :class:`FedForgeError` (a bad argument, a party whose
columns differ from the others', naming the party and the column; an empty party),
:class:`pubsub.config.ConfigError` (an unknown or invalid setting in ``config``),
:class:`synth.engine.EngineUnavailable` (the engine's package is not installed, with the
install hint), :class:`parties.data.schema.SchemaError` (a bad schema file). During the run:
the coordinator's or a participant's error (:class:`synth.coordinator.CoordinatorError`,
:class:`synth.netutil.ParticipantError`), e.g. a budget the ledgers refuse.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from pubsub.config import ConfigError, deep_merge, expand_dotted, from_mapping, refuse_moved
from pubsub.outputs import RunDirLock, write_atomic
from synth.config import SynthConfig
from synth.domain import Schema
from synth.saved import SavedModel, load_model

Transport = Literal["memory", "broker"]


class FedForgeError(ValueError):
    """A bad argument to :class:`FedForge` or bad party data.

    Attributes:
        field: the argument (or ``parties[i]``) at fault.
        reason: what is wrong with it.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class FedForge:
    """Federated DP synthesis of one table held in row slices by several parties.

    Args:
        epsilon: each party's ε budget for this run (with ``delta`` converted to zCDP ρ;
            ``float("inf")`` = no noise).
        delta: each party's δ budget for this run.
        mechanism: ``"mst"`` or ``"aim"`` (:data:`synth.config.MECHANISMS`).
        engine: ``"mbi"``, ``"neural"``, ``"diffusion"`` or ``"auto"``.
        schema: the public schema: a TOML file path (:mod:`parties.data.schema`), a
            :class:`synth.domain.Schema`, or None to infer it (see the module docstring).
        label: the label column, for the ML-utility score (with ``holdout`` in
            :meth:`fit`).
        config: further :class:`synth.config.SynthConfig` settings, as nested tables or
            dotted keys (e.g. ``{"engine.iters": 500, "data": {"numeric_bins": 16}}``);
            unknown keys are refused, and so is a key of the flat layout before the
            nested tables (``engine_iters``), naming its new place.
        seed: the seed of the run's public randomness (split of the budget, sampling).

    Raises:
        FedForgeError: a bad argument (named).
        pubsub.config.ConfigError: a bad setting in ``config`` (named).
    """

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-9, mechanism: str = "mst",
                 engine: str = "auto", schema: str | Path | Schema | None = None,
                 label: str = "", config: Mapping[str, Any] | None = None,
                 seed: int = 0) -> None:
        given = expand_dotted(dict(config or {}))  # "aim.rounds": 8 is {"aim": {"rounds": 8}}
        refuse_moved(given, SynthConfig.MOVED_KEYS, section="synth")  # names the new place
        clash = sorted({"dataset", "parties"} & set(given))
        if "schema_file" in (given.get("data") or {}):
            clash.append("data.schema_file")
        if clash:
            raise FedForgeError("config", f"{clash} are set by fit() and schema=, "
                                          "not by config")
        settings = deep_merge(given, {
            "epsilon": float(epsilon), "delta": float(delta), "mechanism": mechanism,
            "engine": {"name": engine}, "label": label, "seed": seed, "dataset": "api"})
        if schema is not None and not isinstance(schema, (str, Path, Schema)):
            raise FedForgeError("schema", f"expected a path or a synth.domain.Schema, got "
                                          f"{type(schema).__name__}")
        if isinstance(schema, (str, Path)):
            settings = deep_merge(settings, {"data": {"schema_file": str(schema),
                                                      "domain": "declared"}})
        self._cfg = from_mapping(SynthConfig, settings, section="synth")
        self._schema = schema
        self._model: SavedModel | None = None
        self._metrics: dict[str, Any] | None = None
        self._run_dir: Path | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    # ------------------------------------------------------------------ fit
    def fit(self, parties: Sequence[pd.DataFrame | str | Path], *,
            holdout: pd.DataFrame | str | Path | None = None,
            out: str | Path | None = None, transport: Transport = "memory",
            timeout_s: float | None = None) -> FedForge:
        """Run the federated protocol over ``parties`` (one table or table file per party,
        CSV or Parquet, the same columns in each) and keep the fitted model.

        Args:
            holdout: real rows no party holds, for the quality stage's ML utility and TV
                (evaluation only; None skips the quality stage).
            out: the run directory (default: a temporary one, removed with this object).
            transport: ``"memory"`` (in this process) or ``"broker"`` (processes).
            timeout_s: stop the run after this long.

        Returns:
            ``self`` (``fit(...).sample(n)``).

        Raises:
            FedForgeError: no parties, a party that is not a table, an empty party, or a
                party whose columns differ (naming the party and the columns).
            synth.engine.EngineUnavailable: the engine is not installed.
            synth.coordinator.CoordinatorError: the coordinator failed, e.g. a budget the
                ledgers refuse (the run's own errors: see the module docstring).
            synth.netutil.ParticipantError: a participant failed.
        """
        from sim.launch.synth import declared_schema

        if transport not in ("memory", "broker"):
            raise FedForgeError("transport", f"must be 'memory' or 'broker', got {transport!r}")
        frames = [_table(p, f"parties[{i}]") for i, p in enumerate(_as_list(parties))]
        if not frames:
            raise FedForgeError("parties", "at least one party's table is needed")
        drop = tuple(self._cfg.data.drop_columns or ())
        if drop:  # left out of the synthesis: before the columns are compared and declared
            absent = [c for c in drop if c not in frames[0].columns]
            if absent:
                raise FedForgeError("data.drop_columns", f"no column(s) {absent} in "
                                    f"parties[0] (columns: {list(frames[0].columns)})")
            frames = [f.drop(columns=[c for c in drop if c in f.columns]) for f in frames]
        columns = list(frames[0].columns)
        for i, f in enumerate(frames):
            if len(f) == 0:
                raise FedForgeError(f"parties[{i}]", "has no rows")
            missing = [c for c in columns if c not in f.columns]
            extra = [c for c in f.columns if c not in columns]
            if missing or extra:
                raise FedForgeError(f"parties[{i}]", "its columns differ from parties[0]'s: "
                                    + (f"missing {missing}" if missing else "")
                                    + ("; " if missing and extra else "")
                                    + (f"extra {extra}" if extra else ""))
        hold = None if holdout is None else _table(holdout, "holdout")
        if hold is not None and drop:
            hold = hold.drop(columns=[c for c in drop if c in hold.columns])
        if hold is not None:
            missing = [c for c in columns if c not in hold.columns]
            if missing:
                raise FedForgeError("holdout", f"lacks the parties' columns {missing}")
        cfg = replace(self._cfg, parties=len(frames))
        if cfg.label and cfg.label not in columns:
            raise FedForgeError("label", f"no column {cfg.label!r} in the parties' tables "
                                         f"(columns: {columns})")
        _check_engine(cfg)
        pooled = pd.concat(frames, ignore_index=True)
        if isinstance(self._schema, Schema):
            schema, source = self._schema, "declared"
        elif self._schema is not None:
            schema, source = declared_schema(cfg, columns), "declared"
        else:
            from synth.domain import infer_schema

            warnings.warn("FedForge: no public schema given; the domain is inferred from "
                          "the parties' rows, which the privacy guarantee does not cover "
                          "(pass schema=...)", stacklevel=2)
            schema = infer_schema(pooled, numeric_bins=cfg.data.numeric_bins,
                                  binning=cfg.data.binning)  # type: ignore[arg-type]
            source = "inferred"
        unknown = [c for c in schema.names if c not in columns]
        if unknown:
            raise FedForgeError("schema", f"declares columns no party holds: {unknown}")
        cfg = replace(cfg, data=replace(cfg.data, domain=source))
        run_dir = self._directory(out)
        # held from the first file written: a second job into run_dir is refused whole
        with RunDirLock(run_dir, command="psfl synth run --party-files"):
            info = write_parties(run_dir, cfg, schema, frames, pooled=pooled, holdout=hold)
            info["domain_source"] = source
            if transport == "memory":
                from sim.launch.synth_local import run_synth_in_process

                res = run_synth_in_process(cfg, run_dir, prepared=info, timeout_s=timeout_s)
            else:
                from sim.launch.synth import run_synth

                res = run_synth(cfg, run_dir, prepared=info, timeout_s=timeout_s, quiet=True)
        self._metrics = res.metrics
        self._model = load_model(run_dir)
        return self

    # ------------------------------------------------------------------ results
    def sample(self, n: int, *, seed: int | None = None) -> pd.DataFrame:
        """``n`` synthetic records (post-processing: no budget is spent).

        Raises:
            FedForgeError: not fitted yet.
            ValueError: a bad ``n``.
        """
        if self._model is None:
            raise FedForgeError("sample", "call fit() first (or FedForge.load(run_dir))")
        return self._model.sample(n, seed=seed)

    @property
    def metrics(self) -> dict[str, Any]:
        """The run's metrics (``metrics.json``): budget, ledgers, quality, stage times."""
        if self._metrics is None:
            raise FedForgeError("metrics", "call fit() first")
        return self._metrics

    @property
    def epsilon_spent(self) -> dict[str, float]:
        """Each party's ε at the run's δ, from its own ledger."""
        return {str(k): float(v) for k, v in self.metrics.get("epsilon_spent", {}).items()}

    @property
    def run_dir(self) -> Path | None:
        """The run directory (None before ``fit``)."""
        return self._run_dir

    @classmethod
    def load(cls, run_dir: str | Path) -> FedForge:
        """A fitted FedForge from a finished run's directory (its config, metrics and
        model), ready to :meth:`sample`.

        Raises:
            synth.saved.SavedModelError: no finished run there.
        """
        import json

        from synth.config import load_synth_config

        d = Path(run_dir)
        model = load_model(d)
        cfg = load_synth_config(d / "config.toml", saved=True)  # either layout
        self = cls(epsilon=cfg.epsilon, delta=cfg.delta, mechanism=cfg.mechanism,
                   engine=cfg.engine.name, label=cfg.label, seed=cfg.seed)
        self._cfg = cfg
        self._model = model
        mpath = d / "metrics.json"
        self._metrics = json.loads(mpath.read_text()) if mpath.is_file() else None
        self._run_dir = d
        return self

    def _directory(self, out: str | Path | None) -> Path:
        if out is not None:
            self._run_dir = Path(out)
        else:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="fedforge-")
            self._run_dir = Path(self._tmp.name)
        self._run_dir.mkdir(parents=True, exist_ok=True)
        return self._run_dir

    def __repr__(self) -> str:
        c = self._cfg
        return (f"FedForge(epsilon={c.epsilon}, delta={c.delta}, mechanism={c.mechanism!r}, "
                f"engine={c.engine.name!r}, fitted={self._model is not None})")


def write_parties(out: Path, cfg: SynthConfig, schema: Schema, frames: Sequence[pd.DataFrame],
                  *, pooled: pd.DataFrame, holdout: pd.DataFrame | None) -> dict[str, Any]:
    """Lay out a run directory as :func:`sim.launch.synth.prepare_data` does, from tables
    already split by party: ``schema.json``, ``data/parties/<id>.parquet`` (the only data a
    party reads), and, with a holdout, ``data/train.parquet`` (the pooled rows) and
    ``data/holdout.parquet`` (evaluation only). Returns the run's data info."""
    import json

    from synth.checkpoint import atomic_write_parquet

    d = out / "data"
    (d / "parties").mkdir(parents=True, exist_ok=True)
    for stale in ("train.parquet", "holdout.parquet"):
        (d / stale).unlink(missing_ok=True)
    for old in (d / "parties").glob("*.parquet"):
        old.unlink()
    ids = cfg.party_ids()
    for pid, f in zip(ids, frames, strict=True):
        atomic_write_parquet(d / "parties" / f"{pid}.parquet", f)
    if holdout is not None:
        atomic_write_parquet(d / "train.parquet", pooled)
        atomic_write_parquet(d / "holdout.parquet", holdout[list(pooled.columns)])
    write_atomic(out / "schema.json", json.dumps(schema.to_dict(), indent=1))
    return {"rows": {p: int(len(f)) for p, f in zip(ids, frames, strict=True)},
            "holdout_rows": 0 if holdout is None else int(len(holdout)),
            "train_rows": int(len(pooled)), "columns": list(schema.names),
            "domain_sizes": list(schema.domain.sizes)}


def _as_list(parties: Any) -> list[Any]:
    if isinstance(parties, (pd.DataFrame, str, Path)):
        raise FedForgeError("parties", "expected a list of tables, one per party, got a "
                                       "single " + type(parties).__name__)
    try:
        return list(parties)
    except TypeError:
        raise FedForgeError("parties", f"expected a list of tables, got "
                                       f"{type(parties).__name__}") from None


def _table(obj: Any, field: str) -> pd.DataFrame:
    if isinstance(obj, pd.DataFrame):
        return obj.reset_index(drop=True)
    if isinstance(obj, (str, Path)):
        from parties.data import DataError
        from parties.data.limits import check_csv_shape
        from synth.cli import read_table

        try:
            if str(obj).lower().endswith((".csv", ".csv.gz")) and Path(obj).is_file():
                check_csv_shape(obj)  # its lines and columns bounded, before pandas reads it
            return read_table(obj)
        except (ConfigError, DataError) as exc:
            raise FedForgeError(field, str(exc)) from None
    raise FedForgeError(field, f"expected a DataFrame or a file path, got {type(obj).__name__}")


def _check_engine(cfg: SynthConfig) -> None:
    """The engine's package is importable (before any budget is spent)."""
    from synth.engines import make_engine

    make_engine(cfg.resolved_engine())


__all__ = ["FedForge", "FedForgeError", "write_parties"]
