"""A finished FedForge run's fitted model, reloaded from its run directory to draw more rows.

The coordinator's synthesis stage saves what it fitted (``stages/ckpt/model.npz`` with its
description and the domain compression in ``stages/checkpoint.json``) beside the public
schema (``schema.json``). :func:`load_model` turns them back into a :class:`SavedModel`
whose :meth:`SavedModel.sample` draws any number of records, decoded to the schema's
values: post-processing of the DP release, so it spends no budget and reads no record.

::

    from synth.saved import load_model

    model = load_model("runs/ff")
    frame = model.sample(50_000, seed=1)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from synth.checkpoint import load_npz, read_json
from synth.domain import Domain, DomainError, Schema, decode
from synth.engine import EngineInputError, MbiFittedModel, _import_mbi
from synth.engines import load_warm_start
from synth.select import compress_domain, uncompress_codes


class SavedModelError(ValueError):
    """A run directory without a usable fitted model.

    Attributes:
        run_dir: the directory.
        reason: what is missing or malformed.
    """

    def __init__(self, run_dir: str | Path, reason: str) -> None:
        super().__init__(f"{str(run_dir)!r}: {reason}")
        self.run_dir = str(run_dir)
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedModel:
    """A fitted synthesis model over a run's public schema.

    Attributes:
        schema: the public schema the records are decoded with.
        engine: ``"mbi"``, ``"neural"`` or ``"diffusion"``.
        maps: the domain compression the model was fitted on (attribute -> map of the
            original codes to compressed ones; MST's), empty when none.
        fitted: the engine's fitted model on the compressed domain.
    """

    schema: Schema
    engine: str
    maps: dict[str, np.ndarray]
    fitted: Any

    def sample(self, n: int, *, seed: int | None = None) -> pd.DataFrame:
        """``n`` synthetic records with the schema's columns.

        Raises:
            ValueError: ``n`` is negative or not an integer.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        rng = np.random.default_rng(seed)
        codes = np.asarray(self.fitted.sample(int(n), rng), dtype=np.int32)
        codes = uncompress_codes(codes, self.schema.domain, self.maps, rng)
        return decode(codes, self.schema, rng)


def fitted_from_state(domain: Domain, meta: dict[str, Any],
                      arrays: dict[str, np.ndarray]) -> Any:
    """The fitted model that :func:`synth.engines.model_state` described.

    Raises:
        EngineInputError: the state does not fit ``domain``.
        EngineUnavailable: an mbi model without mbi installed.
    """
    state = load_warm_start(domain, meta, arrays)
    if meta.get("engine") in ("neural", "diffusion"):
        return state
    mbi = _import_mbi()
    from mbi.marginal_oracles import default_oracle

    total = float(meta["total"])
    oracle = default_oracle(cliques=state.cliques, domain=state.domain)
    mrf = mbi.MarkovRandomField(potentials=state, marginals=oracle(state, total), total=total)
    return MbiFittedModel(domain=domain, total=total, model=mrf)


def load_model(run_dir: str | Path) -> SavedModel:
    """The fitted model of the finished run in ``run_dir``.

    Raises:
        SavedModelError: no schema, no checkpoint or no saved model there (the run did not
            reach its synthesis stage), or they do not fit together.
        EngineUnavailable: the model's engine is not installed.
    """
    d = Path(run_dir)
    try:
        schema = Schema.from_dict(json.loads((d / "schema.json").read_text()))
    except FileNotFoundError:
        raise SavedModelError(d, "no schema.json: not a FedForge run directory") from None
    except (ValueError, DomainError) as exc:
        raise SavedModelError(d, f"schema.json is malformed: {exc}") from None
    ckpt = read_json(d / "stages" / "checkpoint.json")
    saved = (ckpt or {}).get("model")
    if not saved:
        raise SavedModelError(d, "no fitted model: the run did not reach its synthesis "
                                 "stage (see its events.jsonl)")
    try:
        maps = {str(a): np.asarray(v, dtype=np.int64) for a, v in saved["maps"].items()}
        cdomain = compress_domain(schema.domain, maps)
        arrays = load_npz(d / "stages" / "ckpt" / str(saved["file"]))
        fitted = fitted_from_state(cdomain, dict(saved["meta"]), arrays)
    except KeyError as exc:
        raise SavedModelError(d, f"the saved model lacks {exc} (a run from before "
                                 "saved models carried their compression)") from None
    except (OSError, EngineInputError, DomainError, ValueError) as exc:
        raise SavedModelError(d, f"the saved model cannot be loaded: {exc}") from None
    return SavedModel(schema=schema, engine=str(saved["meta"].get("engine", "mbi")),
                      maps=maps, fitted=fitted)


__all__ = ["SavedModel", "SavedModelError", "fitted_from_state", "load_model"]
