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
        **(split := ctx.wire.split(wire, restarted=restarted)),
        **query_bytes(split["bytes_wire_by_stage"], split["bytes_wire_other"],
                      ctx.naive_by_round, ctx.updates, first_batch=ctx.first_batch),
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


def query_bytes(by_stage: Mapping[str, int] | None, other: int | None,
                naive_by_round: Mapping[str, int],
                updates: list[dict[str, Any]], *,
                first_batch: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """The session's wire bytes by query. A query is one released workload: the
    mechanism's (``release``: its seed batches and rounds) and each workload update
    measured in the session (``wl<n>``: its seed batch and round). The first seed batch
    (``seeds:0``) covers ``first_batch`` = (the mechanism's rounds, the queued updates'
    rounds): each update measured in a round of it (``seeded_ahead``) is charged one
    round's share of its bytes, the release the mechanism's rounds' share, fixed the
    share of rounds no query used. ``fixed`` is what the session pays once whatever the
    number of queries (schema and hellos, keys, the end of the run).
    ``wire_over_naive_per_query`` = (fixed + Σ per-query wire bytes) / Σ per-query naive
    float32 bytes: the session's wire/naive, which for Q queries of equal size is
    (fixed + Σ per-query) / (Q × one query's naive). Nones in process or after a
    restart (as :meth:`synth.coord.meters.WireMeter.split`)."""
    if by_stage is None or other is None:
        return {"bytes_wire_session_fixed": None, "bytes_wire_by_query": None,
                "queries": None, "wire_over_naive_per_query": None}
    names = {str(u["name"]) for u in updates}
    batch_of = {f"seeds:{u['batch']}": str(u["name"]) for u in updates if "batch" in u}
    by_query: dict[str, dict[str, int]] = {}

    def add(query: str, key: str, n: int) -> None:
        by_query.setdefault(query, {"bytes_wire": 0, "bytes_naive": 0})[key] += int(n)

    fixed = int(other)
    mech, ahead = first_batch
    for stage, n in by_stage.items():
        if stage.startswith("round:"):
            add(stage[6:] if stage[6:] in names else "release", "bytes_wire", n)
        elif stage == "seeds:0" and ahead > 0:
            per_round = int(n) / (mech + ahead)
            used = [str(u["name"]) for u in updates if u.get("seeded_ahead")]
            for q in used:
                add(q, "bytes_wire", round(per_round))
            add("release", "bytes_wire", round(per_round * mech))
            fixed += int(n) - round(per_round) * len(used) - round(per_round * mech)
        elif stage.startswith("seeds:"):
            add(batch_of.get(stage, "release"), "bytes_wire", n)
        else:
            fixed += int(n)
    for name, n in naive_by_round.items():
        add(name if name in names else "release", "bytes_naive", n)
    for q in by_query.values():
        q["wire_over_naive"] = (q["bytes_wire"] / q["bytes_naive"]  # type: ignore[assignment]
                                if q["bytes_naive"] else None)
    naive = sum(q["bytes_naive"] for q in by_query.values())
    wire = fixed + sum(q["bytes_wire"] for q in by_query.values())
    return {"bytes_wire_session_fixed": fixed, "bytes_wire_by_query": by_query,
            "queries": len(by_query),
            "wire_over_naive_per_query": wire / naive if naive else None}


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
