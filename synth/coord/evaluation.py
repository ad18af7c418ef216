"""The ``quality`` stage: the synthetic rows scored against real ones (``quality.json``).

Workload TV distance (all ``workload_k``-way marginals; each marginal's own TV under
``tv_per_marginal``; on the run's grid, and on a fixed grid of the original values as
``avg_tv_fixed_grid``, :func:`synth.quality.fixed_grid_tv`) against the pooled real rows and ML utility against the real
holdout, when the evaluation data is given (simulation; a deployed coordinator never
sees records). A finished run reopened for a workload update keeps the last full
synthesis's ML utility (the classifiers are not trained again).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pandas as pd

from synth.checkpoint import read_json
from synth.coord.context import RunContext
from synth.coord.types import EvalData
from synth.domain import encode


class QualityStage:
    """Scores the synthetic rows.

    Args:
        ctx: the run's shared state.
        eval_data: the evaluation-only data, or None (the stage is skipped).
    """

    def __init__(self, ctx: RunContext, eval_data: EvalData | None) -> None:
        self.ctx = ctx
        self.eval_data = eval_data

    async def run(self, synthetic: pd.DataFrame) -> dict[str, Any]:
        """The stage; returns (and writes) the quality figures."""
        ctx = self.ctx
        with ctx.stage("quality"):
            if self.eval_data is None:
                doc: dict[str, Any] = {"skipped": "no evaluation data (deployed coordinator)"}
                ctx.write("quality", doc)
                return doc
            from synth.quality import all_k_way, fixed_grid_tv, ml_utility, workload_tv

            ev, cfg, schema, domain = self.eval_data, ctx.cfg, ctx.schema, ctx.domain

            def score() -> dict[str, Any]:
                real = encode(ev.train[list(schema.names)], schema)
                syn = encode(synthetic[list(schema.names)], schema)
                wl = all_k_way(domain, min(cfg.workload_k, len(domain)))
                tv = workload_tv(real, syn, domain, wl, max_cells=cfg.data.max_cells)
                out: dict[str, Any] = {"avg_tv": tv["avg_tv"], "max_tv": tv["max_tv"],
                                       "avg_l1": tv["avg_l1"], "workload_error": tv["avg_l1"],
                                       "n_workload": tv["n_marginals"],
                                       "workload": f"all {cfg.workload_k}-way marginals",
                                       # "a,b,c" -> that marginal's TV (psfl report's bars)
                                       "tv_per_marginal": tv["per_clique"]}
                # the same workload on a grid of the original values that no run setting
                # changes (numeric_bins, the domain's compression): comparable across runs
                out.update(fixed_grid_tv(ev.train, synthetic, schema,
                                         k=min(cfg.workload_k, len(domain)),
                                         max_cells=cfg.data.max_cells))
                if cfg.label and ctx.reopened:
                    # a workload update adds marginal queries; the classifiers are not
                    # trained again: the figure is the last full synthesis's
                    prev = read_json(ctx.stages_dir / "quality.json") or {}
                    if prev.get("ml_utility") is not None:
                        out["ml_utility"] = prev["ml_utility"]
                        out["ml_utility_from"] = "the synthesis before the workload update"
                    else:
                        out["ml_utility_skipped"] = prev.get(
                            "ml_utility_skipped", "not computed before the workload update")
                elif cfg.label:
                    try:
                        out["ml_utility"] = ml_utility(ev.train, synthetic, ev.holdout,
                                                       cfg.label, random_state=cfg.seed,
                                                       threads=cfg.engine.threads)
                    except ValueError as exc:  # e.g. a label that is not binary
                        out["ml_utility_skipped"] = str(exc)
                        ctx.log.warning("synth.ml_utility_skipped", error=str(exc))
                else:
                    out["ml_utility_skipped"] = ("no label column (set synth.label: "
                                                 "--set label=COLUMN)")
                return out

            doc = await asyncio.to_thread(score)
            ctx.write("quality", doc)
            return doc


__all__ = ["QualityStage"]
