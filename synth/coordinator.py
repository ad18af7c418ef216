"""The FedForge coordinator: runs a synthesis job as a DAG of stages over the bus, acting
as the secure-aggregation server and the tree's root.

Stages, in order; each writes its artifact to ``OUT/stages/`` and logs ``stage.started``
and ``stage.done`` (with seconds) to the run's event log:

* ``schema``: waits for every party's and aggregator's hello and broadcasts the public
  schema (``schema.json``); each party checks its columns and values against it and
  reports a mismatch as an error, which ends the run.
* ``budget``: ρ from (ε, δ) with the tight conversion (:func:`synth.accounting.cdp_rho`),
  split by the mechanism (MST: thirds, ``mst.split``; AIM: ``aim.split``) (``budget.json``).
* ``keys`` and ``seeds:0``: the secure-aggregation session: the parties' public keys are
  exchanged once, and self-mask seed shares once for all the run's rounds
  (``keys.json``, ``seeds_0.json``).
* ``round:one_way``, ``round:select``: all 1-way marginals; MST's domain compression
  (``compress_domain``); all 2-way marginals. Each round is measured by the parties,
  masked, summed up the aggregation tree and unmasked here (``round_<name>.json`` and
  ``.npz``). A plan carries each clique's ρ share and S_min (``secagg.min_survivors``); every
  party checks it and computes its Skellam noise itself (:mod:`synth.plancheck`); a
  round with fewer than S_min survivors is not released (the parties refuse to reveal).
* MST: ``select_tree`` (the maximum spanning tree of the noisy 2-way answers, as
  post-processing) and ``round:tree`` (the tree's 2-way marginals); the engine also gets
  the best-scored further 2-way answers that keep the model within ``mst.extra_mb``.
* AIM: per adaptive round ``select:aim<j>`` (fit the model to everything measured so far,
  pick the pairs it explains worst from the noisy 2-way answers) and ``round:aim<j>``.
* ``workload:wl<n>``: queued workload updates' marginals (:mod:`synth.workload`).
* ``synthesis``: fits the engine to the noisy aggregate marginals and samples the
  synthetic rows (``synthetic.csv`` in OUT).
* ``quality``: workload TV distance against the pooled real rows and ML utility against
  the real holdout, when the evaluation data is given (simulation; a deployed
  coordinator never sees records) (``quality.json``).

Checkpoints: after every stage, and before every broadcast that commits the parties to
something (a round's plan), the coordinator writes ``OUT/stages/checkpoint.json``
atomically (:mod:`synth.checkpoint`): the stages done, the rows, the secure-aggregation
session's public state, each finished round's decoded aggregate, the plan of a round in
progress, and the ρ each party was charged. A coordinator killed at any point (kill -9)
and started again with ``resume=True`` on the same run directory skips what is done,
re-publishes the plan of the round in progress (the parties answer a plan they already
measured with the same masked vector, without spending again) and asks the parties to
repeat their last message of an unfinished key or seed stage (``ff/<run>/all/resume``).

``metrics.json`` in OUT holds the run's figures (``avg_tv``, ``max_tv``,
``workload_error``, ``bytes_wire``, ``bytes_naive``, ``rho_spent`` per party, ``epsilon``,
``delta``, ``wall_s``, ``ml_utility``), the ``dp`` block (the guarantee: protected unit,
replace-one relation, adversary, what is outside; :func:`synth.mechanism.dp_statement`)
and the per-round details, with the dropout recovery (:mod:`synth.cache`):
``dropout_recovery`` (``cached``: cliques completed with the absent parties' row share of
an earlier release, and how stale it was; ``survivors_only``: survivors' sums rescaled to
all rows) and ``rounds[name].coverage_rows`` (the rows the round's survivors hold).

Layout: :class:`Coordinator` is the thin orchestrator. The stages are objects over one
checkpoint store (:mod:`synth.coord.store`) and a shared run context
(:mod:`synth.coord.context`): the session stages (:mod:`synth.coord.session`), the round
runner (:mod:`synth.coord.rounds`) with dropout recovery (:mod:`synth.coord.recovery`),
the mechanism driver (:mod:`synth.coord.driver`) asking MST's or AIM's pure planner
(:mod:`synth.coord.planners`) what to measure, the synthesis, workload-update and quality
stages (:mod:`synth.coord.synthesis`, :mod:`synth.coord.updates`,
:mod:`synth.coord.evaluation`) and the metrics (:mod:`synth.coord.metrics`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from pubsub.security import CurveClient
from pubsub.transport import Connect, Transport
from synth.checkpoint import atomic_write_json
from synth.config import SynthConfig
from synth.coord.collect import RESUME_EVERY_S
from synth.coord.context import RunContext
from synth.coord.driver import MeasurementDriver
from synth.coord.evaluation import QualityStage
from synth.coord.meters import StageTimer, WireMeter
from synth.coord.metrics import build_metrics, cpu_figures
from synth.coord.planners import BudgetSplit, planner_for
from synth.coord.recovery import DropoutRecovery
from synth.coord.rounds import RoundRunner
from synth.coord.session import SessionStages
from synth.coord.store import OPERATIONAL, fingerprint
from synth.coord.synthesis import SynthesisStage, fit_engine
from synth.coord.types import NOISELESS_SIGMA, CoordinatorError, EvalData, RoundResult
from synth.coord.updates import WorkloadStage
from synth.domain import Schema
from synth.engine import NoisyMarginal
from synth.netutil import open_bus, topic_limits
from synth.protocol import ROOT
from synth.secagg import SecAggError

log = structlog.get_logger(__name__)

# the names this module had before its parts moved to synth.coord
_fingerprint = fingerprint
_OPERATIONAL = OPERATIONAL
_RoundResult = RoundResult
_StageTimer = StageTimer
_cpu_figures = cpu_figures


class Coordinator:
    """Runs one FedForge job.

    Args:
        cfg: the run config.
        schema: the public schema (domain) every party must share.
        broker: broker address ``tcp://HOST:PORT``.
        run_id: topic namespace.
        out: the run directory (artifacts, ``synthetic.csv``, ``metrics.json``).
        eval_data: evaluation-only data for the quality stage, or None.
        security: CURVE keys for the bus (:class:`pubsub.security.CurveClient`); None =
            plaintext (loopback brokers only).
        resume: continue the run from ``OUT/stages/checkpoint.json`` (written by an
            earlier coordinator of the same run that died; one that died before its first
            checkpoint had committed nothing, so the run starts afresh, asking the
            participants to say hello again); False starts afresh and replaces any
            checkpoint there.
        connect: the bus connection to use instead of ``broker`` (in process:
            :meth:`pubsub.memory.MemoryBroker.connect`, :mod:`sim.launch.synth_local`).
        on_point: an observer awaited at each named checkpoint point
            (:meth:`_crash_point`), or None.

    Raises:
        CoordinatorError: (code 2) ``resume`` in a directory without a run, or a
            checkpoint of another run id, config or schema.
    """

    def __init__(self, cfg: SynthConfig, schema: Schema, *, broker: str, run_id: str,
                 out: Path, eval_data: EvalData | None = None,
                 security: CurveClient | None = None, resume: bool = False,
                 connect: Connect | None = None,
                 on_point: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.cfg = cfg
        self.schema = schema
        self.broker = broker
        self.security = security
        self.connect = connect
        self.run_id = run_id
        self.eval_data = eval_data
        self.log = log.bind(run_id=run_id, party="coordinator")
        wire = WireMeter(broker=broker, security=security, in_process=connect is not None,
                         run_id=run_id, log=self.log)
        self.ctx = RunContext(cfg, schema, run_id=run_id, out=Path(out), wire=wire,
                              log=self.log, on_point=on_point)
        self.dropout = DropoutRecovery(self.log)
        self.session_stages = SessionStages(self.ctx)
        self.runner = RoundRunner(self.ctx)
        self.driver = MeasurementDriver(self.ctx, self.runner, self.dropout,
                                        fit=functools.partial(fit_engine, self.ctx))
        self.synthesis = SynthesisStage(self.ctx, measurements=self.driver.measurements)
        self.workload = WorkloadStage(self.ctx, seeds=self.session_stages.seed_batch,
                                      runner=self.runner, eval_data=eval_data)
        self.quality = QualityStage(self.ctx, eval_data)
        if resume:
            self.ctx.resume()
        else:
            self.ctx.store.discard()

    # ------------------------------------------------------------------ views
    @property
    def out(self) -> Path:
        """The run directory."""
        return self.ctx.out

    @property
    def on_point(self) -> Callable[[str], Awaitable[None]] | None:
        """The crash-point observer (see :meth:`_crash_point`)."""
        return self.ctx.on_point

    @on_point.setter
    def on_point(self, observer: Callable[[str], Awaitable[None]] | None) -> None:
        self.ctx.on_point = observer

    @property
    def recovery(self) -> dict[str, list[dict[str, Any]]]:
        """What dropout recovery recovered how (``metrics.json``: ``dropout_recovery``)."""
        return self.dropout.record

    @property
    def _recovered(self) -> dict[str, dict[tuple[str, ...], NoisyMarginal]]:
        """Round name -> the all-rows estimates the engine gets (dropout recovery)."""
        return self.dropout.recovered

    async def _crash_point(self, point: str) -> None:
        """A named point of the run reached: awaits the ``on_point`` observer, if any
        (:meth:`synth.coord.context.RunContext.crash_point` lists the points; the stages
        call it there). The coordinator itself injects nothing."""
        await self.ctx.crash_point(point)

    # ------------------------------------------------------------------ the job
    async def run(self) -> dict[str, Any]:
        """Run every stage; returns the metrics (also written to ``OUT/metrics.json``).

        Raises:
            CoordinatorError: a stage failed (participants missing or failing, too few
                survivors for secure aggregation, ...); ``done`` with the reason has been
                broadcast.
        """
        t0 = time.perf_counter()
        ctx = self.ctx
        t = ctx.topics
        async with open_bus(self.cfg, "coordinator", broker=self.broker,
                            security=self.security, connect=self.connect) as bus:
            await bus.subscribe_prefix(t.to(ROOT), limits=topic_limits(self.cfg))
            if ctx.store.resumed_from:
                ctx.save()  # the restart count
            try:
                await self.session_stages.schema(bus)
                budget = self.session_stages.budget()
                results = await self._measure(bus, budget)
            except (CoordinatorError, SecAggError) as exc:
                reason = exc.reason if isinstance(exc, CoordinatorError) else str(exc)
                bus.publish_nowait(t.done, (), {"ok": False, "reason": reason})
                await asyncio.sleep(0.2)
                if isinstance(exc, CoordinatorError):
                    raise
                raise CoordinatorError(f"secure aggregation failed: {exc}") from exc
            bus.publish_nowait(t.done, (), {"ok": True})
            await asyncio.sleep(0.2)
            wire = ctx.wire.total()
        synthetic, fit = await self.synthesis.run(results)
        quality = await self.quality.run(synthetic)
        await self.workload.report(fit)
        metrics = build_metrics(ctx, rho_total=budget.rho, results=results, fit=fit,
                                quality=quality, wire=wire, recovery=self.dropout.record,
                                wall_s=time.perf_counter() - t0)
        atomic_write_json(ctx.out / "metrics.json", metrics)  # whole or not at all
        return metrics

    async def _measure(self, bus: Transport, budget: BudgetSplit
                       ) -> dict[str, RoundResult]:
        """The secure-aggregation session (keys, the first seed batch for every round of
        the mechanism and of the workload updates queued now), the mechanism's rounds,
        then any queued workload updates' rounds."""
        ctx, cfg = self.ctx, self.cfg
        planner = planner_for(mechanism=cfg.mechanism, domain=ctx.domain,
                              shares=budget.shares, max_cells=cfg.data.max_cells,
                              engine=ctx.engine, mst_extra_mb=cfg.mst.extra_mb,
                              aim_rounds=cfg.aim.rounds, aim_batch=cfg.aim.batch,
                              aim_max_model_mb=cfg.aim.max_model_mb)
        await ctx.wire.mark("schema")
        await self.session_stages.keys(bus)
        await ctx.wire.mark(ctx.sk("keys"))
        # the first batch also covers the rounds of the workload updates already queued
        # (one each): a session of many queries shares its seeds in one batch
        ahead = self.workload.rounds_ahead()
        ctx.first_batch = (planner.n_rounds, ahead)
        await self.session_stages.seed_batch(bus, 0, list(range(planner.n_rounds + ahead)))
        await ctx.wire.mark("seeds:0")
        results = await self.driver.run(bus, planner)
        await self.workload.run(bus, results)
        return results


__all__ = ["Coordinator", "CoordinatorError", "EvalData", "NOISELESS_SIGMA",
           "RESUME_EVERY_S"]
