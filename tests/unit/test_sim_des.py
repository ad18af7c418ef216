"""sim.cluster.des: the discrete-event simulation of the five algorithms, on hand-computed cases."""

from __future__ import annotations

import json
import math

import pytest

from sim.cluster.des import (
    ALGOS,
    SimInput,
    SimInputError,
    StepCosts,
    input_from_mapping,
    main,
    predict_table,
    simulate,
)

REL = 1e-9  # the simulator is exact arithmetic on these inputs, up to float rounding


def costs(f: float = 0.0, g: float = 0.0, a: float = 0.0, t: float = 0.0,
          h: float = 0.0) -> StepCosts:
    return StepCosts(passive_fwd_s=f, passive_bwd_s=g, active_fwd_s=a, active_top_s=t,
                     active_bwd_s=h)


def sim(**kw: object) -> SimInput:
    base: dict[str, object] = dict(algo="vfl", n_rows=10 * 64, batch_size=64,
                                   cores_active=1.0, cores_passive=1.0, costs=costs(1.0))
    base.update(kw)
    return SimInput(**base)  # type: ignore[arg-type]


def vfl_epoch(n: int, f: float, g: float, a: float, t: float, h: float, c: float) -> float:
    """Lock-step VFL by hand: the first embedding (or own prefetch), n top steps, n-1
    periods of max(passive round trip, active backward + next prefetch), the last
    backwards."""
    return (max(f + c, a) + n * t + (n - 1) * max(2 * c + g + f, h + a) + max(h, c + g))


def test_vfl_passive_bound_matches_the_hand_computed_epoch() -> None:
    # passive backward dominates: period = f + c + t + c + g, the formula
    f, g, a, t, h, c = 1.0, 2.0, 0.5, 0.25, 1.0, 0.1
    r = simulate(sim(costs=costs(f, g, a, t, h), latency_s=c))
    assert r.epoch_s == pytest.approx(vfl_epoch(10, f, g, a, t, h, c), rel=REL)
    assert r.epoch_s == pytest.approx(max(f + c, a) + 9 * (f + c + t + c + g) + t + c + g,
                                      rel=REL)
    assert r.busy_s_passive == pytest.approx(10 * (f + g), rel=REL)
    assert r.busy_s_active == pytest.approx(10 * (a + t + h), rel=REL)
    assert r.util_passive == pytest.approx(10 * (f + g) / r.epoch_s, rel=REL)
    assert r.samples_per_s == pytest.approx(640 / r.epoch_s, rel=REL)


def test_vfl_active_bound_and_bandwidth() -> None:
    # active dominates; comm = latency 0.05 + 64·32·4 bytes at 163,840 B/s = 0.05 + 0.05
    f, g, a, t, h = 0.2, 0.4, 1.0, 0.5, 2.0
    r = simulate(sim(costs=costs(f, g, a, t, h), latency_s=0.05, bandwidth_bps=163_840.0))
    assert r.epoch_s == pytest.approx(vfl_epoch(10, f, g, a, t, h, 0.1), rel=REL)
    # the passive party waits from its publication to the gradient: the first time for
    # the active prefetch, top step and comm, then every period (t + h + a) but its own
    # backward + forward
    assert r.wait_s_passive == pytest.approx((a - f + t + 0.1) + 9 * (t + h + a - g - f),
                                             rel=REL)


def test_last_batch_is_smaller_and_costs_scale_with_gamma() -> None:
    # 2.5 batches: the last one has 32 rows, costing (1/2)^γ of a full batch
    for gamma in (1.0, 0.5):
        r = simulate(sim(n_rows=160, costs=costs(f=1.0), cost_exponent=gamma))
        assert r.n_batches == 3
        assert r.epoch_s == pytest.approx(2 + 0.5 ** gamma, rel=REL)


def test_avfl_with_a_fast_passive_party_is_bound_by_the_active_compute() -> None:
    a, t, h = 1.0, 0.5, 1.5
    fast = costs(f=1e-6, g=1e-6, a=a, t=t, h=h)
    r = simulate(sim(algo="avfl", n_rows=64 * 40, costs=fast, cores_active=2.0))
    assert r.epoch_s == pytest.approx(40 * (a + t + h), rel=1e-4)  # one worker: one core
    assert r.util_active == pytest.approx(0.5, rel=1e-4)
    r4 = simulate(sim(algo="avfl-ps", n_rows=64 * 40, costs=fast, cores_active=2.0,
                      w_active=4, w_passive=4))
    assert r4.epoch_s == pytest.approx(40 * (a + t + h) / 2, rel=1e-3)  # 4 workers, 2 cores
    assert r4.util_active == pytest.approx(1.0, rel=1e-3)
    assert r4.wait_s_active == pytest.approx(0.0, abs=1e-3)


def test_processor_sharing_four_workers_on_two_cores_take_2c_per_round() -> None:
    c, rounds = 1.0, 5
    for w, per_round in ((4, 2 * c), (2, c), (1, c)):
        r = simulate(sim(algo="pubsub", n_rows=64 * w * rounds, costs=costs(f=c),
                         cores_passive=2.0, cores_active=8.0, w_active=w, w_passive=w))
        assert r.epoch_s == pytest.approx(rounds * per_round, rel=REL), w
        # w < C leaves cores idle; w > C gains nothing and loses nothing
        assert r.util_passive == pytest.approx(min(w, 2) / 2, rel=REL), w


def test_threads_let_one_task_use_several_cores() -> None:
    r = simulate(sim(n_rows=64 * 4, costs=costs(f=2.0), cores_passive=4.0, threads=2))
    assert r.epoch_s == pytest.approx(4 * 1.0, rel=REL)


def test_fractional_cores() -> None:
    r = simulate(sim(n_rows=64 * 4, costs=costs(f=1.0), cores_passive=0.4375))
    assert r.epoch_s == pytest.approx(4 / 0.4375, rel=REL)
    assert r.util_passive == pytest.approx(1.0, rel=REL)


@pytest.mark.parametrize("w,cores", [(4, 2.0), (8, 2.0), (3, 1.5625)])
def test_pubsub_reaches_the_compute_ceiling_without_comm(w: int, cores: float) -> None:
    n = 240
    step = costs(f=1.0, g=2.0, a=0.3, t=0.2, h=0.5)  # passive 3.0/batch, active 1.0/batch
    kw = dict(algo="pubsub", n_rows=64 * n, costs=step, cores_passive=cores,
              cores_active=cores, w_active=w, w_passive=w)
    ceiling = n * step.passive_step_s / cores
    r = simulate(sim(**kw, jitter=0.1))
    assert r.epoch_s == pytest.approx(ceiling, rel=0.01)
    assert r.util_passive > 0.99
    # without jitter the w workers stay in phase: every round of w batches all of them
    # wait out the active top step (w·0.2 CPU s on the active cores) at once
    locked = simulate(sim(**kw))
    rounds = n / w
    assert locked.epoch_s == pytest.approx(ceiling + rounds * w * 0.2 / cores, rel=1e-6)


def test_pubsub_with_as_many_workers_as_cores_leaves_the_waits_uncovered() -> None:
    n, step = 240, costs(f=1.0, g=2.0, a=0.3, t=0.2, h=0.5)
    r = simulate(sim(algo="pubsub", n_rows=64 * n, costs=step, cores_passive=2.0,
                     cores_active=2.0, w_active=2, w_passive=2, jitter=0.1))
    assert r.epoch_s > 1.05 * n * step.passive_step_s / 2


def test_vflps_pairs_split_the_batch_and_barrier_every_iteration() -> None:
    # 2 pairs on 2 cores each, γ = 1: each pair does half a batch; passive path f ≥ a,
    # active backward h ≥ g: period = f/2 + t/2 + h/2 + the active barrier (push + pull)
    f, g, a, t, h, s = 2.0, 1.5, 1.0, 0.5, 2.0, 0.2
    r = simulate(sim(algo="vfl-ps", n_rows=64 * 10, costs=costs(f, g, a, t, h),
                     cores_active=2.0, cores_passive=2.0, w_active=2, w_passive=3,
                     sync_s_active=s))
    assert (r.workers_active, r.workers_passive) == (2, 2)
    # + the flush (one sync per active worker, in parallel)
    assert r.epoch_s == pytest.approx(10 * (f / 2 + t / 2 + h / 2 + s) + s, rel=REL)
    assert r.busy_s_active == pytest.approx(10 * (a + t + h + 2 * s) + 2 * s, rel=REL)


def test_pubsub_syncs_every_delta_t_steps() -> None:
    n, s = 40, 0.01
    kw = dict(algo="pubsub", n_rows=64 * n, costs=costs(f=1.0, g=1.0), cores_passive=2.0,
              cores_active=2.0, w_active=2, w_passive=2, sync_s_passive=s, delta_t0=5)
    # epoch 0: ΔT_0 = 1, a sync after every step, and one flush per worker
    r0 = simulate(sim(**kw))
    assert r0.busy_s_passive == pytest.approx(n * 2.0 + n * s + 2 * s, rel=REL)
    # epoch 8: ΔT_8 = 5; 20 steps per worker: 4 syncs each
    r8 = simulate(sim(**kw, first_epoch=8))
    assert r8.busy_s_passive == pytest.approx(n * 2.0 + 8 * s + 2 * s, rel=REL)
    # one worker never syncs per step ("manual"): only the flush
    r1 = simulate(sim(**{**kw, "w_active": 1, "w_passive": 1}))
    assert r1.busy_s_passive == pytest.approx(n * 2.0 + s, rel=REL)


def test_avfl_staleness_bound_one_is_lock_step() -> None:
    step = costs(f=1.0, g=2.0, a=0.5, t=0.25, h=1.0)
    lock = simulate(sim(algo="vfl", costs=step, latency_s=0.1))
    bound1 = simulate(sim(algo="avfl", costs=step, latency_s=0.1, staleness_bound=1))
    loose = simulate(sim(algo="avfl", costs=step, latency_s=0.1, staleness_bound=5))
    assert bound1.epoch_s == pytest.approx(lock.epoch_s, rel=REL)
    assert loose.epoch_s < lock.epoch_s


def test_inline_mode_serialises_a_party_s_compute() -> None:
    # two passive workers, one core: inline runs one call at a time, same total work
    kw = dict(algo="pubsub", n_rows=64 * 8, costs=costs(f=1.0), cores_passive=1.0,
              cores_active=4.0, w_active=2, w_passive=2)
    ps = simulate(sim(**kw, worker_mode="thread"))
    inline = simulate(sim(**kw, worker_mode="inline"))
    auto = simulate(sim(**kw, worker_mode="auto"))
    assert ps.epoch_s == pytest.approx(8.0, rel=REL)
    assert inline.epoch_s == pytest.approx(8.0, rel=REL)
    assert auto == inline


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_is_deterministic_and_accounts_all_work(algo: str) -> None:
    step = costs(f=0.3, g=0.6, a=0.2, t=0.1, h=0.4)
    inp = sim(algo=algo, n_rows=64 * 37 + 5, costs=step, cores_active=1.5625,
              cores_passive=0.4375, w_active=3, w_passive=2, latency_s=0.01,
              bandwidth_bps=1e6, sync_s_active=0.01, sync_s_passive=0.01, epochs=2,
              segments=4, timeline_limit=50, msg_cpu_s=0.001, jitter=0.1, seed=7)
    a, b = simulate(inp), simulate(inp)
    assert a == b
    assert len(a.epoch_times_s) == 2 and a.epoch_s > 0
    assert 0 < a.util_active <= 1 + 1e-9 and 0 < a.util_passive <= 1 + 1e-9
    assert len(a.timeline) == 50
    assert all(s.start_s <= s.end_s and s.kind in ("compute", "wait", "comm")
               for s in a.timeline)
    assert a.busy_s_passive >= 38 * step.passive_step_s * (1 - 1e-9) - 64 * 0.3


@pytest.mark.parametrize("field,kw", [
    ("cores_active", {"cores_active": 0.0}),
    ("cores_passive", {"cores_passive": -1.0}),
    ("batch_size", {"batch_size": 0}),
    ("n_rows", {"n_rows": 0}),
    ("algo", {"algo": "sgd"}),
    ("w_active", {"w_active": 0}),
    ("latency_s", {"latency_s": math.nan}),
    ("bandwidth_bps", {"bandwidth_bps": 0.0}),
    ("worker_mode", {"worker_mode": "gpu"}),
    ("jitter", {"jitter": 1.0}),
])
def test_bad_inputs_raise_a_value_error_naming_the_field(field: str, kw: dict) -> None:
    with pytest.raises(SimInputError, match=field) as info:
        sim(**kw)
    assert isinstance(info.value, ValueError)
    assert info.value.field == field


def test_bad_costs_name_the_cost() -> None:
    with pytest.raises(SimInputError, match=r"costs\.active_top_s"):
        costs(t=-1.0)
    with pytest.raises(SimInputError, match="costs"):
        sim(costs={"passive_fwd_s": 1.0})


def test_from_totals_splits_the_profile_steps() -> None:
    c = StepCosts.from_totals(active_step_s=4.0, passive_step_s=3.0)
    assert c.active_step_s == pytest.approx(4.0) and c.passive_step_s == pytest.approx(3.0)
    assert c.passive_fwd_s == pytest.approx(1.0)


def test_predict_table_covers_the_grid_and_w_beyond_cores_gains_nothing() -> None:
    base = sim(algo="pubsub", n_rows=64 * 200, costs=costs(f=1.0, g=2.0, a=0.3, t=0.2, h=0.5),
               cores_active=50.0, cores_passive=14.0)
    rows = predict_table(base, algos=("pubsub", "vfl"), workers=(4, 16, 32),
                         batch_sizes=(64, 128))
    assert len(rows) == 2 * 2 * 3
    pub = {(r["batch_size"], r["w_active"]): r["epoch_s"] for r in rows
           if r["algo"] == "pubsub"}
    assert pub[(64, 16)] < pub[(64, 4)]
    assert pub[(64, 32)] == pytest.approx(pub[(64, 16)], rel=0.1)  # passive: 14 cores
    assert {r["workers_active"] for r in rows if r["algo"] == "vfl"} == {1}


def test_cli_prints_one_json_line_per_grid_point(tmp_path, capsys) -> None:
    spec = {"n_rows": 6400, "batch_size": 64, "cores_active": 2, "cores_passive": 1,
            "costs": {"active_step_s": 0.004, "passive_step_s": 0.003},
            "grid": {"algos": ["vfl", "pubsub"], "workers": [1, [2, 1]]}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["--json", str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    assert all(json.loads(x)["epoch_s"] > 0 for x in lines)
    path.write_text(json.dumps({**spec, "cores_active": 0}))
    assert main(["--json", str(path)]) == 2
    assert "cores_active" in capsys.readouterr().err


def test_input_from_mapping_rejects_unknown_fields() -> None:
    with pytest.raises(SimInputError, match="colors"):
        input_from_mapping({"colors": 3, "costs": {}})
