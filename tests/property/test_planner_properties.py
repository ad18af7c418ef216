"""The DP planner against brute force on random cost models (PubSub-VFL Sec. 4 planner),
two-party and with two or three passive parties."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from parties.planning.costmodel import CommFit, CostModel, MemoryFit, PowerFit
from parties.planning.planner import DEFAULT_BATCH_SIZES, NoFeasiblePlan, brute_force, plan

EXAMPLES = settings(max_examples=250, deadline=None, derandomize=True)


def _log_uniform(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(min_value=math.log10(lo), max_value=math.log10(hi)).map(lambda x: 10 ** x)


@st.composite
def cost_models(draw: st.DrawFn, role: str) -> CostModel:
    mem = MemoryFit(m0=draw(st.floats(0.0, 1e9)), rho=draw(_log_uniform(1e2, 1e7)),
                    chi=draw(st.floats(0.5, 1.5)))
    limit = None
    if draw(st.booleans()):
        # A budget whose one-worker b_max lands anywhere from 8 to 2048 rows.
        b_target = draw(_log_uniform(8.0, 2048.0))
        limit = mem.m0 + mem.rho * b_target ** mem.chi
    sync = None
    if draw(st.booleans()):
        sync = CommFit(latency_s=draw(st.floats(0.0, 1e-4)),
                       s_per_byte=draw(st.floats(0.0, 1e-9)))
    return CostModel(
        role=role,
        forward=PowerFit(lam=draw(_log_uniform(1e-7, 1e-3)), gamma=draw(st.floats(-0.5, 1.5))),
        backward=PowerFit(lam=draw(_log_uniform(1e-7, 1e-3)), gamma=draw(st.floats(-0.5, 1.5))),
        memory=mem,
        comm=CommFit(latency_s=draw(st.floats(0.0, 1e-3)), s_per_byte=draw(st.floats(0.0, 1e-8))),
        cores=draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0])),
        param_bytes=draw(st.integers(0, 10_000_000)),
        sync_overhead_s=draw(st.floats(0.0, 1e-3)),
        sync_comm=sync,
        mem_limit_bytes=limit,
    )


@st.composite
def problems(draw: st.DrawFn) -> tuple[CostModel, CostModel, dict[str, Any]]:
    grid = list(range(16, 1025, 16))
    batch_sizes = draw(st.one_of(
        st.just(DEFAULT_BATCH_SIZES),
        st.lists(st.sampled_from(grid), min_size=1, max_size=12, unique=True).map(tuple)))
    kw = {"n_rows": draw(st.integers(1, 200_000)), "embedding_dim": draw(st.integers(1, 256)),
          "threads": draw(st.integers(1, 8)), "w_max": draw(st.integers(1, 8)),
          "batch_sizes": batch_sizes, "delta_t": draw(st.floats(1.0, 5.0)),
          "memory_rule": draw(st.sampled_from(["shared", "per_worker"]))}
    return draw(cost_models("active")), draw(cost_models("passive")), kw


def _solve(fn: Any, a: CostModel, p: CostModel | tuple[CostModel, ...],
           kw: dict[str, Any]) -> Any:
    try:
        return fn(a, *(p if isinstance(p, tuple) else (p,)), **kw)
    except NoFeasiblePlan:
        return None


@EXAMPLES
@given(problems())
def test_dp_optimum_equals_brute_force(prob: tuple[CostModel, CostModel, dict[str, Any]]
                                       ) -> None:
    a, p, kw = prob
    dp, bf = _solve(plan, a, p, kw), _solve(brute_force, a, p, kw)
    event("feasible" if dp is not None else "infeasible")
    assert (dp is None) == (bf is None)
    if dp is None:
        return
    assert math.isclose(dp.epoch_s, bf.epoch_s, rel_tol=1e-9)
    # Same lexicographic key (epoch, w_a + w_p, B), so the same plan.
    assert (dp.w_active, dp.w_passive, dp.batch_size) == \
        (bf.w_active, bf.w_passive, bf.batch_size)
    best_row = min(r.epoch_s for r in dp.table)
    assert dp.epoch_s == best_row


@EXAMPLES
@given(problems())
def test_plans_respect_b_max_w_max_and_memory(
        prob: tuple[CostModel, CostModel, dict[str, Any]]) -> None:
    a, p, kw = prob
    dp = _solve(plan, a, p, kw)
    if dp is None:
        return
    assert dp.batch_size in kw["batch_sizes"]
    assert dp.batch_size <= dp.b_max
    assert 1 <= dp.w_active <= kw["w_max"] and 1 <= dp.w_passive <= kw["w_max"]
    for cost, w in ((a, dp.w_active), (p, dp.w_passive)):
        assert cost.memory.fits(dp.batch_size, w, cost.mem_limit_bytes, kw["memory_rule"])
    assert dp.epoch_s == max(dp.t_active_s, dp.t_passive_s)
    assert min(dp.idle_active, dp.idle_passive) == 0.0
    assert 0.0 <= dp.idle_active < 1.0 and 0.0 <= dp.idle_passive < 1.0
    assert 0.0 < dp.util_active <= 1.0 + 1e-12 and 0.0 < dp.util_passive <= 1.0 + 1e-12
    assert [r.batch_size for r in dp.table] == list(kw["batch_sizes"])
    for r in dp.table:
        assert r.feasible == (r.epoch_s < math.inf)
        assert not r.feasible or r.batch_size <= dp.b_max


@EXAMPLES
@given(problems(), st.booleans())
def test_twice_the_cores_never_makes_a_party_slower(
        prob: tuple[CostModel, CostModel, dict[str, Any]], double_active: bool) -> None:
    a, p, kw = prob
    a2 = replace(a, cores=2 * a.cores) if double_active else a
    p2 = p if double_active else replace(p, cores=2 * p.cores)
    before, after = _solve(plan, a, p, kw), _solve(plan, a2, p2, kw)
    assert (before is None) == (after is None)  # memory does not depend on cores
    if before is None:
        return
    assert after.epoch_s <= before.epoch_s * (1 + 1e-12)
    field = "t_active_s" if double_active else "t_passive_s"
    for r0, r1 in zip(before.table, after.table, strict=True):
        assert getattr(r1, field) <= getattr(r0, field) * (1 + 1e-12)
    # At the old plan's own (w, B) the doubled party is no slower either.
    old = brute_force(a2, p2, **{**kw, "batch_sizes": (before.batch_size,)})
    assert old.epoch_s <= before.epoch_s * (1 + 1e-12)


@st.composite
def several_passive_problems(draw: st.DrawFn
                             ) -> tuple[CostModel, tuple[CostModel, ...], dict[str, Any]]:
    """Two or three passive parties on small grids (brute force is W_max^(K+1) per B)."""
    k = draw(st.sampled_from([2, 3]))
    kw = {"n_rows": draw(st.integers(1, 200_000)), "embedding_dim": draw(st.integers(1, 256)),
          "threads": draw(st.integers(1, 8)), "w_max": draw(st.integers(1, 5 if k == 2 else 4)),
          "batch_sizes": tuple(draw(st.lists(st.sampled_from(range(16, 1025, 16)),
                                             min_size=1, max_size=4, unique=True))),
          "delta_t": draw(st.floats(1.0, 5.0)),
          "memory_rule": draw(st.sampled_from(["shared", "per_worker"]))}
    passives = tuple(draw(cost_models("passive")) for _ in range(k))
    if draw(st.booleans()):  # K + 1 budgets: keep the feasible share near the two-party one
        passives = tuple(replace(p, mem_limit_bytes=None) for p in passives)
    return draw(cost_models("active")), passives, kw


@settings(max_examples=120, deadline=None, derandomize=True)
@given(several_passive_problems())
def test_dp_equals_brute_force_with_several_passive_parties(
        prob: tuple[CostModel, tuple[CostModel, ...], dict[str, Any]]) -> None:
    a, ps, kw = prob
    dp, bf = _solve(plan, a, ps, kw), _solve(brute_force, a, ps, kw)
    event("feasible" if dp is not None else "infeasible")
    assert (dp is None) == (bf is None)
    if dp is None:
        return
    assert math.isclose(dp.epoch_s, bf.epoch_s, rel_tol=1e-9)
    # the same key (epoch, Σ w, B): the same workers for every party
    assert (dp.w_active, dp.passive_party_workers, dp.batch_size) == \
        (bf.w_active, bf.passive_party_workers, bf.batch_size)
    assert dp.w_passive == dp.passive_party_workers[0] and len(dp.passive_party_workers) == len(ps)
    assert dp.epoch_s == max(s.epoch_s for s in dp.parties) == min(r.epoch_s for r in dp.table)
    assert min(s.idle for s in dp.parties) == 0.0
    for cost, w in zip((a, *ps), (dp.w_active, *dp.passive_party_workers), strict=True):
        assert 1 <= w <= kw["w_max"]
        assert cost.memory.fits(dp.batch_size, w, cost.mem_limit_bytes, kw["memory_rule"])
