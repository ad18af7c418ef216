"""Workload updates at the coordinator (:mod:`synth.workload`): queued updates measured
after the mechanism's rounds, and reported once the synthesis is refitted.

Each update measures its marginals that no round measured yet, in a round of its own
(stage ``workload:wl<n>``; its self-mask seeds were shared in the session's first batch
when the update was queued before the run started (:meth:`WorkloadStage.rounds_ahead`),
else in a seed batch of its own), with its share of the
remaining stream reserve of ρ; its weights apply to the fit. An update is noted in the
checkpoint before its round, so a restart measures it once. After the synthesis, each
applied update gets a report (TV distance on its marginals before and after, refit
seconds) and moves to ``workload/applied/``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from pubsub.transport import Transport
from synth.coord.context import RunContext
from synth.coord.planners import RoundRequest
from synth.coord.rounds import RoundRunner
from synth.coord.types import EvalData, RoundResult
from synth.domain import encode
from synth.protocol import round_id
from synth.workload import WorkloadError, WorkloadUpdate, mark_applied, pending_updates

#: the most update rounds the session's first seed batch covers ahead
MAX_ROUNDS_AHEAD = 64

#: ``(bus, batch, rounds)``: run a seed batch for those rounds.
SeedBatch = Callable[[Transport, int, list[int]], Awaitable[None]]


class WorkloadStage:
    """Applies queued workload updates and reports them.

    Args:
        ctx: the run's shared state.
        seeds: runs a seed batch (:meth:`synth.coord.session.SessionStages.seed_batch`).
        runner: runs an update's round.
        eval_data: the evaluation-only data (None when deployed): the reports' TV
            distances need its pooled real rows.
    """

    def __init__(self, ctx: RunContext, *, seeds: SeedBatch, runner: RoundRunner,
                 eval_data: EvalData | None = None) -> None:
        self.ctx = ctx
        self.seeds = seeds
        self.runner = runner
        self.eval_data = eval_data

    def rounds_ahead(self) -> int:
        """Rounds the updates queued now will take (one each, at most
        :data:`MAX_ROUNDS_AHEAD`): the session's first seed batch covers them too, so a
        session of many queries pays one batch's per-message costs, not one per query
        (each round still has its own fresh self-mask seed). 0 for a reopened run, whose
        new session seeds each update's round on its own."""
        ctx = self.ctx
        if ctx.reopened:
            return 0
        try:
            queued = pending_updates(ctx.out, ctx.schema.names)
        except WorkloadError:
            return 0  # refused (and reported) when the stage runs
        done = {w["file"] for w in ctx.store.doc["workload"]}
        return min(MAX_ROUNDS_AHEAD, sum(1 for path, up in queued
                                         if path.name not in done and up.marginals))

    async def run(self, bus: Transport, results: dict[str, RoundResult]) -> None:
        """Apply queued workload updates: measure each update's marginals that no round
        measured yet, in a round of their own, with its share of the remaining stream
        reserve of ρ; weights apply to the fit. Each update is noted in the checkpoint
        before its round (so a restart measures it once)."""
        ctx = self.ctx
        doc = ctx.store.doc
        try:
            queued = pending_updates(ctx.out, ctx.schema.names)
        except WorkloadError as exc:
            ctx.log.warning("workload.refused", error=str(exc))
            queued = []
        if ctx.reopened:  # new party processes: the next plan carries the compression
            self.runner.resend_maps()
        for path, up in queued:
            rec = next((w for w in doc["workload"] if w["file"] == path.name), None)
            if rec is None:
                rec = self.plan_update(path.name, up, results)
                doc["workload"].append(rec)
                ctx.save()
            if rec["missing"] and rec["status"] == "planned":
                with ctx.stage(f"workload:{rec['name']}"):
                    t0 = time.perf_counter()
                    if ctx.server.seeded(round_id(rec["round"])):  # shared ahead
                        rec["seeded_ahead"] = True
                    else:
                        await self.seeds(bus, rec["batch"], [rec["round"]])
                        await ctx.wire.mark(f"seeds:{rec['batch']}")
                    results[rec["name"]] = await self.runner.round(bus, RoundRequest(
                        round=rec["round"], name=rec["name"],
                        cliques=tuple(tuple(c) for c in rec["missing"]), rho=rec["rho"]))
                    rec["measure_s"] = time.perf_counter() - t0
            if rec["status"] == "planned":
                rec["status"] = "measured" if rec["missing"] else "nothing to measure"
                left = doc["stream_rho_left"]
                doc["stream_rho_left"] = max(0.0, left - rec["rho"])
            for c, w in up.weights.items():
                ctx.weights[c] = w
            doc["weights"] = [{"clique": list(c), "weight": w} for c, w in ctx.weights.items()]
            ctx.save()
            ctx.updates.append({**rec, "path": str(path)})
            ctx.log.info("workload.measured", update=rec["name"], missing=rec["missing"],
                         already=rec["already_measured"], rho=rec["rho"])

    def plan_update(self, file: str, up: WorkloadUpdate,
                    results: dict[str, RoundResult]) -> dict[str, Any]:
        """What an update measures: its marginals that no round measured (as a clique in
        any order), within ``max_cells``, with ``rho_share`` of the remaining reserve."""
        ctx = self.ctx
        doc = ctx.store.doc
        measured = {frozenset(c) for r in results.values() for c in r.plan.cliques}
        missing, already, refused = [], [], []
        for c in up.marginals:
            if frozenset(c) in measured:
                already.append(list(c))
            elif ctx.cdomain.size(c) > ctx.cfg.data.max_cells:
                refused.append({"clique": list(c), "cells": ctx.cdomain.size(c),
                                "reason": f"more than max_cells={ctx.cfg.data.max_cells}"})
            else:
                missing.append(list(c))
        left = float(doc["stream_rho_left"])
        rho = up.rho_share * left if missing else 0.0
        n = len(doc["workload"])
        r = 1 + max(res.plan.round for res in results.values())
        rec: dict[str, Any] = {
            "file": file, "name": f"wl{n}", "round": r, "batch": 1 + n + ctx.s,
            "requested": [list(c) for c in up.marginals], "missing": missing,
            "already_measured": already, "refused": refused,
            "weights": {",".join(c): w for c, w in up.weights.items()},
            "rho": rho, "rho_share": up.rho_share, "reserve_before": left,
            "status": "planned", "session": ctx.s}
        if not missing:
            rec["status"] = "nothing to measure" if not up.weights else "weights only"
        elif not rho > 0:
            rec["status"] = "refused"
            rec["reason"] = (
                "no stream reserve of rho: the run was made with synth.stream.rho_frac = 0 "
                "(set it > 0 before the run)" if ctx.cfg.stream.rho_frac == 0 else
                "the stream reserve of rho is used up by earlier updates")
            ctx.log.warning("workload.refused", update=rec["name"], reason=rec["reason"])
            rec["missing"] = []
        return rec

    async def report(self, fit: dict[str, Any]) -> None:
        """Per workload update applied by this coordinator: the total variation distance
        on its marginals before (the previous synthetic data) and after (the new), the
        incremental refit's seconds and, with ``stream.compare_full``, a from-scratch
        refit's seconds and distance; the update moves to ``workload/applied/``."""
        ctx = self.ctx
        if not ctx.updates:
            return
        from synth.quality import workload_tv

        real = (None if self.eval_data is None else await asyncio.to_thread(
            encode, self.eval_data.train[list(ctx.schema.names)], ctx.schema))

        def tv(codes: np.ndarray | None, wl: list[tuple[str, ...]]) -> float | None:
            if codes is None or real is None or not wl:
                return None
            return float(workload_tv(real, codes, ctx.domain, wl,
                                     max_cells=ctx.cfg.data.max_cells)["avg_tv"])

        full = fit.get("full")
        for u in ctx.updates:
            wl = [tuple(c) for c in u["requested"]]
            report = {
                "name": u["name"], "status": u["status"], "reason": u.get("reason"),
                "requested": u["requested"], "missing": u["missing"],
                "already_measured": u["already_measured"], "refused": u["refused"],
                "rho": u["rho"], "measure_s": u.get("measure_s", 0.0),
                "incremental_refit": bool(fit.get("incremental")),
                "refit": fit.get("refit"),
                "refit_s": fit["fit_s"], "refit_iters": fit["iters"],
                "tv_before": await asyncio.to_thread(tv, fit.get("codes_before"), wl),
                "tv_after": await asyncio.to_thread(tv, fit["codes"], wl),
            }
            if full is not None:
                report["full_refit_s"] = full["fit_s"]
                report["full_refit_iters"] = full["iters"]
                report["compile_s"] = full["compile_s"]
                report["tv_after_full_refit"] = await asyncio.to_thread(tv, full["codes"], wl)
                report["refit_time_ratio"] = fit["fit_s"] / full["fit_s"]
            u["report"] = report
            mark_applied(ctx.out, Path(u["path"]), report)
            ctx.log.info("workload.applied", **{k: v for k, v in report.items()
                                                 if k in ("name", "tv_before", "tv_after",
                                                          "refit_s")})


__all__ = ["MAX_ROUNDS_AHEAD", "WorkloadStage"]
