"""The ``synthesis`` stage: the engine fitted to the noisy aggregate marginals, and the
synthetic rows sampled from it (``synthetic.csv`` in OUT).

A fresh fit runs the engine from scratch and saves the model in the checkpoint (what
:mod:`synth.saved` reloads). A finished run reopened for a workload update refits
incrementally: warm (the engine continues from the saved model) or, with
``stream.refit = "gum"``, by moving the current synthetic records until they match the
update's new marginals (:mod:`synth.gum`); ``stream.compare_full`` also times a
from-scratch refit as the baseline.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from synth.checkpoint import atomic_save_npz, atomic_write_csv, load_npz
from synth.coord.context import RunContext
from synth.coord.types import RoundResult
from synth.domain import decode, marginals
from synth.engine import NoisyMarginal
from synth.engines import load_warm_start, make_engine, model_state
from synth.gum import gum_update
from synth.select import compress_codes, uncompress_codes


def fit_engine(ctx: RunContext, ms: list[NoisyMarginal], total: float, iters: int | None,
               warm_start: Any = None) -> Any:
    """The engine fit to ``ms`` on the compressed domain (``iters``: 0/None = the
    engine's default). Workload weights (:mod:`synth.workload`) scale a marginal's
    weight in the fit as a noise std of ``sigma / sqrt(w)`` (weighted least squares);
    ``warm_start`` continues from an earlier model."""
    cfg, engine = ctx.cfg, ctx.engine
    kw: dict[str, Any] = {}
    if iters:
        kw["iters" if engine == "mbi" else "steps"] = iters
    if engine in ("neural", "diffusion"):
        import torch

        torch.set_num_threads(cfg.engine.threads)
    if ctx.weights:
        ms = [NoisyMarginal(clique=m.clique, values=m.values,
                            sigma=m.sigma / math.sqrt(ctx.weights[tuple(sorted(m.clique))]))
              if tuple(sorted(m.clique)) in ctx.weights else m for m in ms]
    return make_engine(engine, **kw).fit(ctx.cdomain, ms, total=total, seed=cfg.seed,
                                         warm_start=warm_start)


def default_iters(ctx: RunContext) -> int:
    """The engine's iterations: ``engine.iters``, or when it is 0 the engine's own default
    (mbi's ``iters``, the neural and diffusion engines' ``steps``)."""
    if ctx.cfg.engine.iters:
        return ctx.cfg.engine.iters
    from synth.diffusion import DiffusionEngine
    from synth.engine import MbiEngine, NeuralEngine

    if ctx.engine == "mbi":
        return MbiEngine().iters
    return DiffusionEngine().steps if ctx.engine == "diffusion" else NeuralEngine().steps


class SynthesisStage:
    """Fits the engine and samples the synthetic rows.

    Args:
        ctx: the run's shared state.
        measurements: results -> the noisy marginals the engine gets.
    """

    def __init__(self, ctx: RunContext,
                 measurements: Callable[[dict[str, RoundResult]], list[NoisyMarginal]]
                 ) -> None:
        self.ctx = ctx
        self.measurements = measurements

    def fit(self, ms: list[NoisyMarginal], total: float, iters: int | None,
            warm_start: Any = None) -> Any:
        """:func:`fit_engine` with this run's state."""
        return fit_engine(self.ctx, ms, total, iters, warm_start)

    async def run(self, results: dict[str, RoundResult]
                  ) -> tuple[pd.DataFrame, dict[str, Any]]:
        """The stage; returns the synthetic rows and the fit's figures (with the codes
        before and after, and a from-scratch baseline's, for the workload reports)."""
        ctx = self.ctx
        with ctx.stage("synthesis"):
            cfg = ctx.cfg
            ms = self.measurements(results)
            total = ctx.total_rows  # dropout recovery covers all rows
            n = cfg.synthetic_rows or int(sum(ctx.rows.values()))
            warm, iters, before = None, cfg.engine.iters, None
            saved = ctx.store.doc.get("model")
            prev = ctx.stages_dir / "synthetic_codes.npy"
            incremental = ctx.reopened and bool(ctx.updates) and prev.exists()
            if incremental:
                before = np.load(prev)
            if incremental and cfg.stream.refit == "gum":
                return await self._gum(ms, before, n, total)
            if incremental and saved:  # warm: the engine continues from the saved model
                warm = load_warm_start(ctx.cdomain, saved["meta"],
                                       load_npz(ctx.store.dir / saved["file"]))
                iters = cfg.stream.iters or max(1, default_iters(ctx) // 8)

            def fit_and_sample(warm_start: Any, it: int | None
                               ) -> tuple[Any, np.ndarray, pd.DataFrame, float]:
                t0 = time.perf_counter()
                model = self.fit(ms, total, it, warm_start)
                rng = np.random.default_rng([cfg.seed, 7])
                codes = uncompress_codes(np.asarray(model.sample(n, rng), dtype=np.int32),
                                         ctx.domain, ctx.maps, rng)
                return model, codes, decode(codes, ctx.schema, rng), time.perf_counter() - t0

            compile_s = None
            if warm is not None and cfg.stream.compare_full:
                # both refits timed hot: the engine's one-off compilation of the new
                # cliques (JAX, for mbi) is paid here, untimed in either
                t0 = time.perf_counter()
                await asyncio.to_thread(self.fit, ms, total, 1, warm)
                compile_s = time.perf_counter() - t0
            model, codes, frame, fit_s = await asyncio.to_thread(fit_and_sample, warm, iters)
            full: dict[str, Any] | None = None
            if warm is not None and cfg.stream.compare_full:  # the baseline: from scratch
                _, fcodes, _, full_s = await asyncio.to_thread(fit_and_sample, None,
                                                               cfg.engine.iters)
                full = {"fit_s": full_s, "codes": fcodes, "iters": default_iters(ctx),
                        "compile_s": compile_s}
            atomic_write_csv(ctx.out / "synthetic.csv", frame)
            np.save(ctx.stages_dir / "synthetic_codes.npy", codes)
            meta, arrays = model_state(model)
            atomic_save_npz(ctx.store.dir / "model.npz", **arrays)
            # the compression the model was fitted on: what synth.saved needs to sample
            ctx.store.doc["model"] = {
                "file": "model.npz", "meta": meta,
                "maps": {a: [int(x) for x in v] for a, v in ctx.maps.items()}}
            ctx.mark("synthesis")
            fitted = list(dict.fromkeys(m.clique for m in ms if len(m.clique) > 1))
            fit = {"engine": ctx.engine, "fit_s": fit_s, "rows": n, "total": total,
                   "measurements": len(ms), "cliques": [list(c) for c in fitted],
                   "incremental": warm is not None,
                   "refit": "warm" if warm is not None else "full",
                   "iters": iters or default_iters(ctx)}
            ctx.write("synthesis", fit)
            return frame, {**fit, "codes": codes, "codes_before": before, "full": full}

    async def _gum(self, ms: list[NoisyMarginal], before: np.ndarray, n: int,
                   total: float) -> tuple[pd.DataFrame, dict[str, Any]]:
        """Incremental refit with ``stream.refit = "gum"`` (:mod:`synth.gum`): the
        current synthetic records, on the compressed domain, moved until their marginals
        match the update's new noisy marginals, while every earlier clique that shares an
        attribute with them keeps the marginal the records have now (what the model
        learnt; its noisy answers would pull the records back to their noise). A record
        keeps its original value of an attribute it was not moved in. The saved model is
        left as it is."""
        ctx = self.ctx
        cfg = ctx.cfg
        rng = np.random.default_rng([cfg.seed, 8, ctx.s])

        def update() -> tuple[np.ndarray, pd.DataFrame, float]:
            t0 = time.perf_counter()
            maps = {a: np.asarray(v) for a, v in ctx.maps.items()}
            _, cold = compress_codes(before, ctx.domain, maps)
            new = {frozenset(c) for u in ctx.updates for c in u["missing"]}
            targets = [self._shrunk(m, cold, total) for m in ms if frozenset(m.clique) in new]
            touched = set().union(*new) if new else set()
            keep = dict.fromkeys(m.clique for m in ms if frozenset(m.clique) not in new
                                 and touched.intersection(m.clique))
            targets += [NoisyMarginal(clique=c, values=marginals(cold, ctx.cdomain, [c])[c]
                                      .ravel().astype(np.float64), sigma=1.0) for c in keep]
            cnew = gum_update(cold, ctx.cdomain, targets, passes=cfg.stream.iters or 20,
                              seed=cfg.seed)
            drawn = uncompress_codes(cnew, ctx.domain, maps, rng)
            codes = np.array(before, dtype=np.int32, copy=True)
            moved = cnew != cold
            codes[moved] = drawn[moved]
            return codes, decode(codes, ctx.schema, rng), time.perf_counter() - t0

        codes, frame, fit_s = await asyncio.to_thread(update)
        full: dict[str, Any] | None = None
        if cfg.stream.compare_full:  # the baseline: the engine from scratch

            def refit() -> tuple[np.ndarray, float]:
                t0 = time.perf_counter()
                model = self.fit(ms, total, cfg.engine.iters)
                r = np.random.default_rng([cfg.seed, 7])
                c = uncompress_codes(np.asarray(model.sample(n, r), dtype=np.int32),
                                     ctx.domain, ctx.maps, r)
                return c, time.perf_counter() - t0

            fcodes, full_s = await asyncio.to_thread(refit)
            full = {"fit_s": full_s, "codes": fcodes, "iters": default_iters(ctx),
                    "compile_s": None}
        atomic_write_csv(ctx.out / "synthetic.csv", frame)
        np.save(ctx.stages_dir / "synthetic_codes.npy", codes)
        ctx.mark("synthesis")
        fit = {"engine": ctx.engine, "fit_s": fit_s, "rows": int(codes.shape[0]),
               "total": total, "measurements": len(ms), "incremental": True,
               "refit": "gum", "iters": cfg.stream.iters or 20,
               "cliques": [list(c) for c in dict.fromkeys(m.clique for m in ms
                                                          if len(m.clique) > 1)]}
        ctx.write("synthesis", fit)
        return frame, {**fit, "codes": codes, "codes_before": before, "full": full}

    def _shrunk(self, m: NoisyMarginal, codes: np.ndarray, total: float) -> NoisyMarginal:
        """The target of a new marginal for :mod:`synth.gum`: the noisy counts shrunk
        towards the current records' counts by the empirical-Bayes factor
        ``s² / (s² + σ²)``, where ``s²`` (the records' squared error per cell) is estimated
        as the mean squared difference less the noise variance σ². Where the records
        already agree with the measurement up to its noise, the target stays near them;
        where they are far off, it follows the measurement. Post-processing."""
        n = codes.shape[0]
        cur = marginals(codes, self.ctx.cdomain, [m.clique])[m.clique].ravel().astype(np.float64)
        scale = n / total if total > 0 else 1.0
        y = np.asarray(m.values, dtype=np.float64) * scale
        var = (m.sigma * scale) ** 2
        d = y - cur
        s2 = max(float(np.mean(d * d)) - var, 0.0)
        lam = s2 / (s2 + var) if s2 + var > 0 else 1.0
        return NoisyMarginal(clique=m.clique, values=cur + lam * d, sigma=m.sigma)


__all__ = ["SynthesisStage", "default_iters", "fit_engine"]
