"""Each term of the planner's objective on hand-built cost models (PubSub-VFL Sec. 4)."""

from __future__ import annotations

import json
import math

import pytest

from parties.planning.costmodel import CommFit, CostModel, MemoryFit, PowerFit
from parties.planning.planner import (
    DEFAULT_BATCH_SIZES,
    NoFeasiblePlan,
    PlannerError,
    batch_grid,
    brute_force,
    mean_sync_interval,
    party_terms,
    plan,
)

NO_COMM = CommFit(latency_s=0.0, s_per_byte=0.0)


def _cost(role: str, *, lam: float = 1e-5, gamma: float = 1.0, cores: float = 4.0,
          comm: CommFit = NO_COMM, param_bytes: int = 0, sync_s: float = 0.0,
          sync_comm: CommFit | None = NO_COMM, limit: float | None = None) -> CostModel:
    return CostModel(role=role, forward=PowerFit(lam=lam, gamma=gamma),
                     backward=PowerFit(lam=lam, gamma=gamma),
                     memory=MemoryFit(m0=1e8, rho=1e5, chi=1.0), comm=comm, cores=cores,
                     param_bytes=param_bytes, sync_overhead_s=sync_s, sync_comm=sync_comm,
                     mem_limit_bytes=limit)


def test_the_bare_paper_model_is_flat_in_w_and_picks_one_worker() -> None:
    """threads >= C, no comm, no sync: T = n_b·W/C for every w, so the tie goes to w = 1."""
    a, p = _cost("active"), _cost("passive")
    pl = plan(a, p, n_rows=10_000, embedding_dim=8, threads=4, batch_sizes=(100,))
    assert (pl.w_active, pl.w_passive) == (1, 1)
    assert pl.epoch_s == pytest.approx(100 * 2e-5 * 100 / 4)
    assert [row.t_active_s for row in pl.table] == [pl.epoch_s]


def test_threads_cap_makes_workers_fill_the_cores() -> None:
    """One thread per worker on 4 cores: 4 workers saturate them, more gain nothing."""
    a, p = _cost("active", cores=4.0), _cost("passive", cores=2.0)
    pl = plan(a, p, n_rows=10_000, embedding_dim=8, threads=1, batch_sizes=(100,))
    work = 2e-5 * 100
    # The active party (4 cores) reaches n_b·W/4; the passive party with 2 cores is the
    # bottleneck at n_b·W/2 and the active party only needs 2 workers to keep up.
    assert pl.t_passive_s == pytest.approx(100 * work / 2)
    assert pl.w_passive == 2 and pl.w_active == 2 and pl.bound_by == "both"
    best_a = party_terms(a, p, b=100, w=4, n_rows=10_000, embedding_dim=8)
    assert best_a.epoch_s == pytest.approx(100 * work / 4)
    assert pl.table[0].t_active_s == pytest.approx(best_a.epoch_s)


def test_one_worker_exposes_the_round_trip_and_more_workers_hide_it() -> None:
    comm = CommFit(latency_s=1e-3, s_per_byte=1e-9)
    a = _cost("active", cores=2.0, comm=comm)
    p = _cost("passive", cores=2.0, comm=comm)
    kw = {"n_rows": 1000, "embedding_dim": 16, "threads": 2}
    work = 2e-5 * 100
    rtt = 2 * (1e-3 + 4 * 16 * 100 * 1e-9)
    one = party_terms(a, p, b=100, w=1, **kw)
    assert one.round_trip_s == pytest.approx(rtt)
    assert one.epoch_s == pytest.approx(10 * (work / 2 + rtt))
    two = party_terms(a, p, b=100, w=2, **kw)
    assert two.epoch_s == pytest.approx(10 * max((work / 2 + rtt) / 2, work / 2))
    pl = plan(a, p, batch_sizes=(100,), **kw)
    assert pl.w_active >= 2 and pl.epoch_s < one.epoch_s


def test_sync_costs_only_with_two_or_more_workers() -> None:
    a = _cost("active", cores=1.0, param_bytes=10**6, sync_s=1e-4,
              sync_comm=None, comm=CommFit(latency_s=0.0, s_per_byte=1e-8))
    p = _cost("passive", cores=1.0)
    one = party_terms(a, p, b=64, w=1, n_rows=640, embedding_dim=4, delta_t=2.0)
    two = party_terms(a, p, b=64, w=2, n_rows=640, embedding_dim=4, delta_t=2.0)
    assert one.sync_per_step_s == 0.0
    # (constant + push + pull through the bus comm fit) / ΔT.
    assert two.sync_per_step_s == pytest.approx((1e-4 + 2 * 1e6 * 1e-8) / 2.0)
    # One core, no comm: a second worker only adds sync, so the plan keeps one.
    pl = plan(a, p, n_rows=640, embedding_dim=4, delta_t=2.0, batch_sizes=(64,))
    assert pl.w_active == 1


def test_memory_bounds_batch_and_workers() -> None:
    # b_max(M̄) = (M̄ − 1e8)/1e5: 300 rows for the passive party.
    a = _cost("active", gamma=0.5)
    p = _cost("passive", gamma=0.5, limit=1e8 + 3e7, cores=8.0)
    pl = plan(a, p, n_rows=100_000, embedding_dim=8, threads=1)
    assert pl.b_max == pytest.approx(300.0)
    assert [r.feasible for r in pl.table] == [b <= 300 for b in DEFAULT_BATCH_SIZES]
    # γ < 1 favours large B, but the shared rule M0 + w·ρ·B <= M̄ allows the passive
    # party 1 worker at B = 256, 2 at 128 and 4 at 64 (one core each): B = 64 wins.
    rows = {r.batch_size: r for r in pl.table}
    assert (rows[256].w_passive, rows[128].w_passive) == (1, 2)
    assert (pl.batch_size, pl.w_passive) == (64, 4)
    assert pl.t_passive_s == pytest.approx(1563 * 2e-5 * 64 ** 0.5 / 4)
    assert pl.epoch_s < min(rows[128].epoch_s, rows[256].epoch_s)
    with pytest.raises(NoFeasiblePlan, match="B_max = 300"):
        plan(a, p, n_rows=100_000, embedding_dim=8, batch_sizes=(512, 1024))
    low = _cost("passive", limit=5e7)
    with pytest.raises(NoFeasiblePlan) as err:
        brute_force(a, low, n_rows=100, embedding_dim=8)
    assert err.value.b_max == 0.0


def test_plan_to_dict_is_json_and_reports_idle_fractions() -> None:
    a, p = _cost("active", lam=3e-5), _cost("passive", cores=4.0)
    pl = plan(a, p, n_rows=5000, embedding_dim=8, w_max=1, batch_sizes=(50,))
    assert pl.bound_by == "active" and pl.idle_active == 0.0
    assert pl.idle_passive == pytest.approx(1 - 1e-5 / 3e-5)
    d = json.loads(json.dumps(pl.to_dict(), allow_nan=False))
    assert d["b_max"] is None and d["w_active"] == 1 and d["table"][0]["batch_size"] == 50
    assert d["active"]["epoch_s"] == pytest.approx(pl.t_active_s)


def test_grid_sync_interval_and_bad_input() -> None:
    assert batch_grid() == DEFAULT_BATCH_SIZES
    assert batch_grid(step=16)[:3] == (16, 32, 48) and batch_grid(step=16)[-1] == 1024
    # ΔT_t for ΔT0 = 5, t = 0..7: 1, 1, 1, 1, 2, 3, 4, 5.
    assert mean_sync_interval(8, 5) == pytest.approx(8 / (4 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5))
    a, p = _cost("active"), _cost("passive")
    for bad in ({"n_rows": 0}, {"threads": 0}, {"w_max": 0}, {"batch_sizes": ()},
                {"batch_sizes": (16, 16)}, {"delta_t": 0.5}, {"delta_t": math.inf},
                {"memory_rule": "pooled"}, {"embedding_dim": 0}):
        kw = {"n_rows": 100, "embedding_dim": 8, **bad}
        with pytest.raises(PlannerError):
            plan(a, p, **kw)
    with pytest.raises(PlannerError, match="roles"):
        plan(p, a, n_rows=100, embedding_dim=8)
    with pytest.raises(ValueError):
        mean_sync_interval(0, 5)


def test_plan_for_config_takes_d_threads_and_mean_sync_interval() -> None:
    from parties.config import ModelSection, WorkersSection, VflConfig
    from parties.planning.planner import plan_for_config

    cfg = VflConfig(epochs=8, model=ModelSection(embedding_dim=16),
                    workers=WorkersSection(torch_threads=2, delta_t0=5))
    comm = CommFit(latency_s=1e-4, s_per_byte=1e-9)
    a = _cost("active", comm=comm, param_bytes=10_000, sync_s=1e-4, sync_comm=None)
    p = _cost("passive", comm=comm, param_bytes=20_000, sync_s=1e-4, sync_comm=None)
    got = plan_for_config(a, p, cfg, 20_000)
    want = plan(a, p, n_rows=20_000, embedding_dim=16, threads=2,
                delta_t=mean_sync_interval(8, 5))
    assert got == want


# ------------------------------------------------------------ several passive parties
def test_several_passive_parties_get_their_own_workers() -> None:
    """Three passive parties: the one with twice the work per step needs twice the
    workers to keep up with the others; the epoch is the slowest party's."""
    a = _cost("active", cores=8.0)
    p1, p2, p3 = _cost("passive", cores=8.0), _cost("passive", lam=2e-5, cores=8.0), \
        _cost("passive", cores=8.0)
    pl = plan(a, p1, p2, p3, n_rows=10_000, embedding_dim=8, threads=1, w_max=8,
              batch_sizes=(100,))
    # p2's work 4e-3 core-s per step: 8 workers reach n_b·W/8 = 0.05 s; the others, with
    # 2e-3, reach it with 4 workers
    assert pl.epoch_s == pytest.approx(100 * 4e-3 / 8)
    assert pl.passive_party_workers == (4, 8, 4) and pl.w_passive == 4 and pl.w_active == 4
    assert pl.bound_by == "active+passive+passive2+passive3"  # each at its epoch exactly
    assert [s.party for s in pl.parties] == ["active", "passive", "passive2", "passive3"]
    assert [s.workers for s in pl.parties] == [4, 4, 8, 4]
    assert pl.parties[2].idle == 0.0 and pl.parties[1].idle == pytest.approx(0.0)
    assert [t.workers for t in pl.passive_terms] == [4, 8, 4]
    row = pl.table[0]
    assert row.passive_party_workers == (4, 8, 4) and len(row.t_passive_party_s) == 3
    d = json.loads(json.dumps(pl.to_dict(), allow_nan=False))
    assert d["passive_party_workers"] == [4, 8, 4] and d["w_passive"] == 4
    assert [p["party"] for p in d["parties"]] == ["active", "passive", "passive2", "passive3"]
    bf = brute_force(a, p1, p2, p3, n_rows=10_000, embedding_dim=8, w_max=8,
                     batch_sizes=(100,))
    assert (bf.w_active, bf.passive_party_workers, bf.epoch_s) == (4, (4, 8, 4), pl.epoch_s)


def test_the_active_round_trip_sends_one_gradient_per_passive_party() -> None:
    """r_A = comm_A(K·n) + max_k comm_k(n); each passive party's r_k = comm_A(n) +
    comm_k(n); one passive party: the two-party r(B)."""
    ca = CommFit(latency_s=1e-3, s_per_byte=1e-8)
    fast, slow = CommFit(latency_s=1e-4, s_per_byte=1e-9), CommFit(latency_s=2e-3,
                                                                   s_per_byte=1e-9)
    a = _cost("active", comm=ca)
    p1, p2 = _cost("passive", comm=fast), _cost("passive", comm=slow)
    n = 4 * 16 * 100
    kw = {"b": 100, "w": 1, "n_rows": 1000, "embedding_dim": 16}
    assert party_terms(a, (p1, p2), **kw).round_trip_s == pytest.approx(
        1e-3 + 2 * n * 1e-8 + 2e-3 + n * 1e-9)
    assert party_terms(p2, a, **kw).round_trip_s == pytest.approx(
        1e-3 + n * 1e-8 + 2e-3 + n * 1e-9)
    assert party_terms(a, (p1,), **kw) == party_terms(a, p1, **kw)
    # bound_by with ties, and the two-party names kept for one passive party
    pl = plan(a, p1, p1, n_rows=1000, embedding_dim=16, w_max=1, batch_sizes=(100,))
    assert pl.bound_by == "active"
    heavy = _cost("passive", lam=1e-3)
    assert plan(a, heavy, heavy, n_rows=1000, embedding_dim=16, w_max=1,
                batch_sizes=(100,)).bound_by == "passive+passive2"
    even = _cost("passive")
    assert plan(_cost("active"), even, n_rows=1000, embedding_dim=16, w_max=1,
                batch_sizes=(100,)).bound_by == "both"


def test_memory_and_errors_with_several_passive_parties() -> None:
    a = _cost("active")
    tight = _cost("passive", limit=1e8 + 3e7)  # b_max 300
    pl = plan(a, _cost("passive"), tight, n_rows=100_000, embedding_dim=8)
    assert pl.b_max == pytest.approx(300.0) and pl.batch_size <= 300
    rows = {r.batch_size: r for r in pl.table}
    assert not rows[512].feasible and rows[512].passive_party_workers == (0, 0)
    assert rows[512].t_passive_party_s[1] == math.inf
    with pytest.raises(NoFeasiblePlan):
        plan(a, _cost("passive"), tight, n_rows=100_000, embedding_dim=8,
             batch_sizes=(512,))
    with pytest.raises(PlannerError, match="roles"):
        plan(a, _cost("passive"), _cost("active"), n_rows=100, embedding_dim=8)
    with pytest.raises(PlannerError, match="at least one passive"):
        plan(a, n_rows=100, embedding_dim=8)
