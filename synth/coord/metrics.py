"""The coordinator's ``metrics.json``: :func:`build_metrics` assembles its figures from
the run's context, the stages' times (:class:`synth.coord.meters.StageTimer`) and the
wire bytes (:class:`synth.coord.meters.WireMeter`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pubsub.config import to_mapping
from synth.accounting import cdp_epsilon
from synth.coord.types import RoundResult
from synth.mechanism import dp_statement, resolve_min_survivors

if TYPE_CHECKING:
    from synth.coord.context import RunContext


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
        "engine": ctx.engine, "noise_model": cfg.secagg.noise_model,
        "epsilon": cfg.epsilon, "delta": cfg.delta, "rho": rho_total,
        "rho_spent": spent, "epsilon_spent": eps_spent,
        "avg_tv": quality.get("avg_tv"), "max_tv": quality.get("max_tv"),
        "avg_tv_fixed_grid": quality.get("avg_tv_fixed_grid"),
        "max_tv_fixed_grid": quality.get("max_tv_fixed_grid"),
        "avg_l1": quality.get("avg_l1"), "workload_error": quality.get("workload_error"),
        "n_workload": quality.get("n_workload"), "workload": quality.get("workload"),
        "ml_utility": quality.get("ml_utility"),
        "ml_utility_skipped": quality.get("ml_utility_skipped"),
        "bytes_wire": wire, "bytes_naive": ctx.bytes_naive,
        "bytes_naive_direct": ctx.bytes_naive_direct,
        **ctx.wire.split(wire, restarted=restarted),
        "wire_vs_naive": (wire / ctx.bytes_naive) if wire and ctx.bytes_naive else None,
        "bits": cfg.secagg.bits or "no cap", "ring": cfg.secagg.ring,
        "min_survivors": resolve_min_survivors(cfg.secagg.min_survivors, len(ctx.parties)),
        "dp": dp_statement(cfg), "fanout": cfg.secagg.fanout, "tree_levels": len(ctx.tree.levels),
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


__all__ = ["build_metrics", "cpu_figures"]
