"""The coordinator's timing, wire-byte accounting and ``metrics.json``.

:class:`StageTimer` logs ``stage.started`` / ``stage.done`` / ``stage.failed`` and keeps
each stage's wall and CPU seconds; :class:`WireMeter` notes the broker's byte count after
each stage and splits the run's wire bytes into fixed and per-round traffic;
:func:`build_metrics` assembles the figures of ``metrics.json``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pubsub.config import to_mapping
from pubsub.control import control_request
from pubsub.security import CurveClient
from synth.accounting import cdp_epsilon
from synth.coord.types import RoundResult
from synth.mechanism import dp_statement, resolve_min_survivors

if TYPE_CHECKING:
    from synth.coord.context import RunContext


class StageTimer:
    """``with ctx.stage("name"):`` logs ``stage.started`` / ``stage.done`` /
    ``stage.failed`` and records the stage's wall seconds in ``seconds`` and its process
    CPU seconds in ``cpu_seconds`` (both keyed by the stage name)."""

    def __init__(self, name: str, *, log: Any, seconds: dict[str, float],
                 cpu_seconds: dict[str, float]) -> None:
        self.name = name
        self.log = log
        self.seconds = seconds
        self.cpu_seconds = cpu_seconds
        self.t0 = 0.0
        self.c0 = 0.0

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.log.info("stage.started", stage=self.name)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = time.perf_counter() - self.t0
        self.seconds[self.name] = s
        self.cpu_seconds[self.name] = time.process_time() - self.c0
        if exc is None:
            self.log.info("stage.done", stage=self.name, seconds=round(s, 3))
        else:
            self.log.warning("stage.failed", stage=self.name, seconds=round(s, 3),
                             error=str(exc))


class WireMeter:
    """The bytes the broker forwarded for a run, noted after each stage.

    Args:
        broker: the broker address (its control socket answers ``stats``).
        security: CURVE keys for the control request, or None.
        in_process: True when the run has no broker (a :mod:`pubsub.memory` bus): every
            count is None.
        run_id: the run (its topics' namespace ``ff/<run_id>``).
        log: the coordinator's bound logger.
    """

    def __init__(self, *, broker: str, security: CurveClient | None, in_process: bool,
                 run_id: str, log: Any) -> None:
        self.broker = broker
        self.security = security
        self.in_process = in_process
        self.run_id = run_id
        self.log = log
        self.marks: list[tuple[str, int | None]] = []

    async def mark(self, stage: str) -> None:
        """Note the broker's byte count for this run after ``stage`` (the split of the
        wire bytes into fixed and per-round traffic; nothing in process)."""
        if not self.in_process:
            self.marks.append((stage, await asyncio.to_thread(self.total)))

    def total(self) -> int | None:
        """Bytes the broker forwarded for this run (every hop, every message), or None (in
        process: no broker counts them)."""
        if self.in_process:
            return None
        try:
            st = control_request(self.broker, "stats", timeout_s=2.0, security=self.security)
        except Exception as exc:  # noqa: BLE001 - a missing figure, not a failed run
            self.log.warning("synth.no_broker_stats", error=str(exc))
            return None
        stats = st.get("stats", st)
        return int(stats.get("namespace_bytes", {}).get(f"ff/{self.run_id}", 0))

    def split(self, wire: int | None, *, restarted: bool) -> dict[str, Any]:
        """``bytes_wire_by_stage`` (bytes forwarded between the previous mark and the end
        of each stage), ``bytes_wire_fixed`` (schema and hellos, keys, seed shares: paid
        once per run or batch of rounds), ``bytes_wire_rounds`` (the rounds: plans, masked
        sums, unmasking) and ``bytes_wire_other`` (the rest: the end of the run); Nones
        in process or after a restart (the counts before it are another process's)."""
        none = {"bytes_wire_by_stage": None, "bytes_wire_fixed": None,
                "bytes_wire_rounds": None, "bytes_wire_other": None}
        marks = self.marks
        if wire is None or not marks or any(b is None for _, b in marks) or restarted:
            return none
        by: dict[str, int] = {}
        prev = 0
        for stage, b in marks:
            by[stage] = by.get(stage, 0) + int(b) - prev  # type: ignore[arg-type]
            prev = int(b)  # type: ignore[arg-type]
        rounds = sum(v for k, v in by.items() if k.startswith("round:"))
        fixed = sum(by.values()) - rounds
        return {"bytes_wire_by_stage": by, "bytes_wire_fixed": fixed,
                "bytes_wire_rounds": rounds, "bytes_wire_other": int(wire) - prev}


def build_metrics(ctx: RunContext, *, rho_total: float, results: Mapping[str, RoundResult],
                  fit: Mapping[str, Any], quality: Mapping[str, Any], wire: int | None,
                  recovery: Mapping[str, Any], wall_s: float) -> dict[str, Any]:
    """The run's ``metrics.json``: the quality figures, the wire and naive bytes, the ρ
    and ε each party spent, the DP statement, per-round details, the dropout recovery
    (``recovery``), the fit, stage timings, restarts and workload updates."""
    cfg, store = ctx.cfg, ctx.store
    rounds = {name: {"cells": r.plan.vector_len, "cliques": len(r.plan.cliques),
                     "survivors": len(r.survivors), "dropped": list(r.dropped),
                     "never_advertised": list(r.missing), "aggregate_sigma": r.sigma,
                     "rho_per_clique": r.plan.rho, "min_survivors": r.plan.min_survivors,
                     "ring_bits_max": r.plan.ring_bits,
                     "ring_bits_mean": float(r.plan.widths.mean()),
                     "coverage_rows": sum(ctx.rows[p] for p in r.survivors),
                     "seconds": r.seconds}
              for name, r in results.items()}
    spent = {p: v for p, v in ctx.rho_party.items()}
    eps_spent = {p: (cdp_epsilon(v, cfg.delta) if v > 0 and math.isfinite(v) else
                     (0.0 if v == 0 else math.inf)) for p, v in spent.items()}
    restarted = bool(store.resumed_from or store.doc["restarts"])
    return {
        "dataset": cfg.dataset, "parties": cfg.parties, "mechanism": cfg.mechanism,
        "engine": ctx.engine, "noise_model": cfg.noise_model,
        "epsilon": cfg.epsilon, "delta": cfg.delta, "rho": rho_total,
        "rho_spent": spent, "epsilon_spent": eps_spent,
        "avg_tv": quality.get("avg_tv"), "max_tv": quality.get("max_tv"),
        "avg_l1": quality.get("avg_l1"), "workload_error": quality.get("workload_error"),
        "n_workload": quality.get("n_workload"), "workload": quality.get("workload"),
        "ml_utility": quality.get("ml_utility"),
        "ml_utility_skipped": quality.get("ml_utility_skipped"),
        "bytes_wire": wire, "bytes_naive": ctx.bytes_naive,
        "bytes_naive_direct": ctx.bytes_naive_direct,
        **ctx.wire.split(wire, restarted=restarted),
        "wire_vs_naive": (wire / ctx.bytes_naive) if wire and ctx.bytes_naive else None,
        "bits": cfg.bits or "no cap", "ring": cfg.ring,
        "min_survivors": resolve_min_survivors(cfg.min_survivors, len(ctx.parties)),
        "dp": dp_statement(cfg), "fanout": cfg.fanout, "tree_levels": len(ctx.tree.levels),
        "compressed_domain": dict(zip(ctx.domain.attributes, ctx.cdomain.sizes,
                                      strict=True)),
        "rounds": rounds,
        "dropout_recovery": recovery,
        "tree_pairs": ([list(c) for c in results["tree"].plan.cliques]
                       if "tree" in results else None),
        "fitted_cliques": fit.get("cliques"),
        "synthesis": {k: v for k, v in fit.items() if k != "codes"},
        "stage_s": ctx.stage_s, "wall_s": wall_s, "run_id": ctx.run_id,
        "restarts": int(store.doc["restarts"]),
        "reopened": int(store.doc.get("reopened", 0)),
        "session": ctx.s,
        "stream_rho_left": store.doc["stream_rho_left"],
        "workload_updates": [u.get("report", u) for u in ctx.updates],
        "resumed_after": store.resumed_from,
        "stage_cpu_s": ctx.stage_cpu_s, **cpu_figures(ctx.stage_cpu_s),
        "rows": ctx.rows, "config": to_mapping(cfg),
    }


def cpu_figures(stage_cpu_s: Mapping[str, float]) -> dict[str, Any]:
    """The coordinator's aggregation-stage CPU (the ``round:*`` stages: plan, collect the
    top-level masked sums and the reveals, unmask, decode; not keys, synthesis or quality),
    per round, and the process's peak RSS so far (bytes)."""
    from synth.netutil import peak_rss_bytes

    rounds = [v for k, v in stage_cpu_s.items() if k.startswith("round:")]
    return {"aggregation_cpu_s": sum(rounds),
            "aggregation_cpu_s_per_round": sum(rounds) / len(rounds) if rounds else None,
            "peak_rss_bytes": peak_rss_bytes()}


__all__ = ["StageTimer", "WireMeter", "build_metrics", "cpu_figures"]
