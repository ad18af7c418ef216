"""The mechanism's rounds over the bus (:class:`MeasurementDriver`).

The driver asks the pure planner (:mod:`synth.coord.planners`) what to measure, runs the
round (:class:`synth.coord.rounds.RoundRunner`), turns the release into all-rows
estimates (:class:`synth.coord.recovery.DropoutRecovery`) and feeds them back:

* ``round:one_way``, then ``compress_domain`` (MST's domain compression,
  ``compress_domain.json``), then ``round:select`` (every candidate pair);
* MST: ``select_tree`` (``select_tree.json``) and ``round:tree``;
* AIM: per adaptive round ``select:aim<j>`` (fit the engine to everything measured so far
  in a worker thread, let the planner pick; ``select_aim<j>.json``, and the picks are
  checkpointed so a restart measures the same) and ``round:aim<j>``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pubsub.transport import Transport
from synth.coord.context import RunContext
from synth.coord.planners import (
    AimPlanner,
    MeasurementPlanner,
    MstPlanner,
    compress,
    known_answers,
)
from synth.coord.recovery import DropoutRecovery
from synth.coord.rounds import RoundRunner
from synth.coord.types import Clique, RoundResult
from synth.engine import NoisyMarginal

#: ``(measurements, total rows, iterations) -> fitted model`` (a model has ``marginal``).
Fit = Callable[[list[NoisyMarginal], float, int | None], Any]


class MeasurementDriver:
    """Runs a planner's rounds and keeps what the engine is fitted to.

    Args:
        ctx: the run's shared state.
        runner: runs one round.
        recovery: the dropout recovery of released rounds.
        fit: fits the engine (AIM's selection fits between rounds).
    """

    def __init__(self, ctx: RunContext, runner: RoundRunner, recovery: DropoutRecovery,
                 fit: Fit) -> None:
        self.ctx = ctx
        self.runner = runner
        self.recovery = recovery
        self.fit = fit
        self.planner: MeasurementPlanner | None = None

    def answers(self, res: RoundResult) -> dict[Clique, NoisyMarginal]:
        """A released round's all-rows estimates (dropout recovery, once per round)."""
        return self.recovery.noisy(res, rows=self.ctx.rows, maps=self.ctx.maps)

    def measurements(self, results: dict[str, RoundResult]) -> list[NoisyMarginal]:
        """Every noisy aggregate marginal the engine gets
        (:meth:`synth.coord.planners.MeasurementPlanner.measurements`)."""
        assert self.planner is not None, "measurements before the mechanism's rounds"
        answers = {name: self.answers(res) for name, res in results.items()}
        return self.planner.measurements(self.ctx.cdomain, self.ctx.one_way_c, answers)

    async def run(self, bus: Transport, planner: MeasurementPlanner
                  ) -> dict[str, RoundResult]:
        """The mechanism's rounds, in order; returns each round's result by name."""
        ctx = self.ctx
        self.planner = planner
        results: dict[str, RoundResult] = {}
        results["one_way"] = await self.runner.round(bus, planner.one_way())
        with ctx.stage("compress_domain"):
            comp = compress(ctx.domain, self.answers(results["one_way"]))
            ctx.maps = dict(comp.maps)
            ctx.cdomain = comp.domain
            ctx.one_way_c = dict(comp.one_way)
            ctx.known.extend(comp.known)
            ctx.write("compress_domain", comp.doc(ctx.domain))
        cd = ctx.cdomain
        req = planner.select(cd)
        if len(req.cliques) < len(cd.attributes) - 1:
            ctx.log.warning("synth.pairs_refused", kept=len(req.cliques),
                            max_cells=ctx.cfg.data.max_cells)
        results["select"] = await self.runner.round(bus, req)
        tw = self.answers(results["select"])
        ctx.known += known_answers(tw)
        if isinstance(planner, AimPlanner):
            await self._aim_rounds(bus, planner, results, tw)
            return results
        assert isinstance(planner, MstPlanner)
        with ctx.stage("select_tree"):
            req = planner.tree(cd, ctx.one_way_c, tw)
            ctx.write("select_tree", {"pairs": [list(p) for p in req.cliques]})
        results["tree"] = await self.runner.round(bus, req)
        return results

    async def _aim_rounds(self, bus: Transport, planner: AimPlanner,
                          results: dict[str, RoundResult],
                          answers: dict[Clique, NoisyMarginal]) -> None:
        """AIM's adaptive rounds. Before each, fit the model to everything measured so
        far and let the planner pick the pairs it explains worst, scored from the noisy
        all-pairs ``answers`` (post-processing, no budget); then measure them with this
        round's share of ρ. Picks made before a restart are reused."""
        ctx = self.ctx
        selects = ctx.store.doc["selects"]
        for j in range(planner.rounds):
            name = planner.round_name(j)
            if name in selects:  # chosen before a restart
                picks = [(tuple(c), float(sc)) for c, sc in selects[name]]
                if not picks:
                    break
                results[name] = await self.runner.round(bus, planner.adaptive(j, picks))
                continue
            with ctx.stage(f"select:{name}"):
                ms = self.measurements(results)
                model = await asyncio.to_thread(self.fit, ms, ctx.total_rows, 300)
                picks = planner.pick(ctx.cdomain, answers, model.marginal,
                                     measured=[m.clique for m in ms])
                ctx.write(f"select_{name}", {"picks": [[list(c), sc] for c, sc in picks],
                                             "sigma_next": planner.sigma_next})
                selects[name] = [[list(c), float(sc)] for c, sc in picks]
                ctx.save()
            if not picks:
                ctx.log.warning("synth.aim_no_candidate", round=name)
                break
            results[name] = await self.runner.round(bus, planner.adaptive(j, picks))


__all__ = ["MeasurementDriver"]
