"""The synthesis engines by name, and any engine's fitted model saved and loaded.

Owns: :func:`make_engine` (``--engine NAME``: ``mbi``, ``neural`` or ``diffusion``) and
the checkpoint codec of fitted models (:func:`model_state`, :func:`load_warm_start`).
May import every engine (:mod:`synth.engine`: the interface, mbi and the neural engine;
:mod:`synth.diffusion`); none of them imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from synth.diffusion import DiffusionEngine, DiffusionFittedModel
from synth.domain import Domain
from synth.engine import (ENGINES, EngineInputError, MbiEngine, MbiFittedModel, NeuralEngine,
                          NeuralFittedModel, _import_mbi)


# ---------------------------------------------------------------------------- persistence
def model_state(model: MbiFittedModel | NeuralFittedModel) -> tuple[dict[str, Any],
                                                                    dict[str, np.ndarray]]:
    """``(meta, arrays)`` that :func:`load_warm_start` turns back into a warm start: mbi's
    potentials per clique, or the neural model's per-row distributions. For checkpoints
    (``.npz`` arrays beside JSON meta)."""
    if isinstance(model, DiffusionFittedModel):
        return ({"engine": "diffusion", "total": model.total, "hidden": model.hidden,
                 "layers": model.layers, "steps": model.steps,
                 "self_condition": model.self_condition, "noise": model.noise,
                 "names": list(model.state)},
                {f"w{i}": v for i, v in enumerate(model.state.values())})
    if isinstance(model, NeuralFittedModel):
        return ({"engine": "neural", "total": model.total, "n": len(model.probs)},
                {f"p{j}": np.asarray(p) for j, p in enumerate(model.probs)})
    pot = model.model.potentials
    cliques = [list(c) for c in pot.cliques]
    return ({"engine": "mbi", "total": model.total, "cliques": cliques},
            {f"c{i}": np.asarray(pot.tables[tuple(c)].values) for i, c in enumerate(cliques)})


def load_warm_start(domain: Domain, meta: Mapping[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> Any:
    """A ``warm_start`` for :meth:`MbiEngine.fit` / :meth:`NeuralEngine.fit` from
    :func:`model_state`'s output.

    Raises:
        EngineInputError: the state does not fit ``domain``.
        EngineUnavailable: an mbi state without mbi installed.
    """
    if meta.get("engine") == "diffusion":
        try:
            state = {str(k): np.asarray(arrays[f"w{i}"], dtype=np.float32)
                     for i, k in enumerate(meta["names"])}
            return DiffusionFittedModel(domain=domain, total=float(meta["total"]), state=state,
                                        hidden=int(meta["hidden"]), layers=int(meta["layers"]),
                                        steps=int(meta["steps"]),
                                        self_condition=bool(meta.get("self_condition", False)),
                                        noise=str(meta.get("noise", "uniform")))
        except (KeyError, ValueError, TypeError) as exc:
            raise EngineInputError(f"saved diffusion model is malformed: {exc!r}") from None
    if meta.get("engine") == "neural":
        probs = tuple(np.asarray(arrays[f"p{j}"], dtype=np.float64) for j in range(int(meta["n"])))
        if [p.shape[1] for p in probs] != list(domain.sizes):
            raise EngineInputError("saved neural model does not fit the domain")
        return NeuralFittedModel(domain=domain, total=float(meta["total"]), probs=probs)
    mbi = _import_mbi()
    import jax.numpy as jnp

    mdom = mbi.Domain(tuple(domain.attributes), tuple(domain.sizes))
    cliques = [tuple(c) for c in meta["cliques"]]
    try:
        tables = {c: mbi.Factor(mdom.project(c), jnp.asarray(arrays[f"c{i}"]))
                  for i, c in enumerate(cliques)}
    except (KeyError, ValueError) as exc:
        raise EngineInputError(f"saved mbi potentials do not fit the domain: {exc}") from None
    return mbi.CliqueVector(mdom, cliques, tables)


# ---------------------------------------------------------------------------- factory
def make_engine(name: str, **kw: Any) -> Any:
    """The engine for ``--engine NAME``: ``"mbi"``, ``"neural"`` or ``"diffusion"``,
    built with ``kw``.

    ``make_engine("mbi")`` checks that mbi is importable, so a missing extra fails
    before any budget is spent.

    Raises:
        EngineInputError: an unknown name.
        EngineUnavailable: ``"mbi"`` without the ``mbi`` package.
        TypeError: an unknown keyword for that engine.
    """
    if name == "mbi":
        _import_mbi()
        return MbiEngine(**kw)
    if name == "neural":
        return NeuralEngine(**kw)
    if name == "diffusion":
        return DiffusionEngine(**kw)
    raise EngineInputError(f"unknown engine {name!r}; choose one of {ENGINES}")


__all__ = ["load_warm_start", "make_engine", "model_state"]
