"""The ``pubsub`` passive workers' in-flight window: the pure estimator
(:class:`parties.algorithms.schedule.InflightWindow`), the windowed worker of
:class:`parties.algorithms.strategy.ScheduledPassive` on a scripted clock (weight stashing with a
real bottom model; the deadline raised on a link slower than T_ddl), and the window on a
simulated slow link (:mod:`sim.cluster.des`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from parties.algorithms.actions import (
    EMB,
    Await,
    Backward,
    Discard,
    Forward,
    Gather,
    Log,
    NotifySchedule,
    Now,
    Pending,
    Poll,
    Publish,
    Received,
    WaitSchedule,
)
from parties.models.model import ParameterServer, PassiveCompute, bottom_model, flat_params, load_flat
from parties.algorithms.schedule import DDL_RTTS, OVERLAP_MIN_CORES, InflightWindow, overlap_decision
from parties.algorithms.strategy import ScheduledPassive, StrategyConfig
from sim.cluster.des import SimInput, StepCosts, simulate
from tests.drive import drive


# ---------------------------------------------------------------------------- the estimator
def settled(w: InflightWindow, rtt_s: float, n: int = 40, *, queued: bool = False) -> int:
    for _ in range(n):
        w.observe_rtt(rtt_s, queued=queued)
    return w.size


def test_window_is_one_until_measured_then_grows_with_the_round_trip() -> None:
    w = InflightWindow(8, workers=2)
    assert w.size == 1  # nothing measured: the synchronous worker
    w.observe_step(0.002)
    w.observe_partner_period(0.0025)  # T = max(2 ms, 2.5 ms x 2 workers) = 5 ms
    assert w.period_s == pytest.approx(0.005)
    assert settled(w, 0.001) == 1  # a LAN: the round trip is under one period
    assert settled(w, 0.012) == 3  # 1 + floor(12 / 5)
    assert settled(w, 0.032) == 7  # 1 + floor(32 / 5)
    assert settled(w, 0.200) == 8  # bounded by max_per_worker


def test_window_shrinks_when_the_round_trip_falls() -> None:
    w = InflightWindow(8, workers=1)
    w.observe_step(0.004)
    assert settled(w, 0.030) == 8
    sizes = []
    for _ in range(40):
        w.observe_rtt(0.004)
        sizes.append(w.size)
    assert sizes == sorted(sizes, reverse=True)  # monotone down as the EWMA follows
    assert sizes[-1] == 2  # 1 + floor(4.x / 4)
    assert settled(w, 0.0005) == 1


def test_a_queued_round_trip_only_pulls_the_estimate_down() -> None:
    w = InflightWindow(16, workers=1)
    w.observe_step(0.002)
    settled(w, 0.010)
    before = w.rtt_s
    settled(w, 0.100, queued=True)  # the active party's queue: not the link
    assert w.rtt_s == before and w.n_queued == 40
    settled(w, 0.004, queued=True)  # a faster link shows even through a queue
    assert w.rtt_s is not None and w.rtt_s < before
    assert w.rtt_all_s is not None and w.rtt_all_s > w.rtt_s  # every sample counts there


def test_fixed_window_deadline_floor_and_report() -> None:
    assert InflightWindow(3, auto=False).size == 3
    with pytest.raises(ValueError):
        InflightWindow(0)
    w = InflightWindow(4, workers=2)
    assert w.deadline_floor_s == 0.0
    w.observe_rtt(0.05)
    assert w.deadline_floor_s == pytest.approx(DDL_RTTS * 0.05)
    w.observe_step(0.01)
    for t in range(6):
        w.issued(t * 0.1)
    w.settled()
    w.end_epoch(0)
    rep = w.report()
    assert rep["rtt_s"]["median"] == pytest.approx(0.05) and rep["rtt_s"]["n"] == 1
    inflight = rep["inflight"]
    assert inflight["depth_max"] == 6 and w.depth == 5
    assert inflight["by_epoch"][0]["epoch"] == 0 and inflight["by_epoch"][0]["depth_max"] == 6
    assert [p[0] for p in inflight["series"]] == pytest.approx([0.0, 0.3])  # >= 0.25 s apart


# ---------------------------------------------------------------------------- the worker
@dataclass
class Msg:
    meta: dict[str, Any]
    arrays: tuple[Any, ...] = ()


@dataclass
class Clocked:
    """A synchronous interpreter of one passive party on a scripted clock: a published
    embedding's gradient arrives ``delay_s`` later (meta ``h`` = 0: the active party
    answers at once); a wait that its gradient cannot meet times out (the clock then
    advances by the timeout) and the gradient stays buffered. ``compute``: a real
    :class:`PassiveCompute` behind Forward / Backward (None: placeholders)."""

    delay_s: float
    fwd_s: float = 0.001
    bwd_s: float = 0.002
    compute: PassiveCompute | None = None
    grads: dict[int, np.ndarray] = field(default_factory=dict)
    t: float = 0.0
    boxes: dict[int, list[tuple[float, Msg]]] = field(default_factory=dict)
    graphs: dict[int, Any] = field(default_factory=dict)
    actions: list[Any] = field(default_factory=list)
    #: batch -> the replica's parameters at its forward / at its backward
    at_forward: dict[int, torch.Tensor] = field(default_factory=dict)
    at_backward: dict[int, torch.Tensor] = field(default_factory=dict)
    applied: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def run(self, proc: Any) -> Any:
        return drive(proc, self.handle, self.actions)

    def _take(self, channel: int, accept: Any, until: float) -> tuple[Msg | None, int]:
        box, stale = self.boxes.get(channel, []), 0
        while box and box[0][0] <= until:
            _, m = box.pop(0)
            if accept(m) == 1:
                return m, stale
            stale += 1
        return None, stale

    def handle(self, a: Any) -> Any:
        if isinstance(a, Now):
            return self.t
        if isinstance(a, Forward):
            self.t += self.fwd_s
            if self.compute is None:
                return f"h{a.batch}"
            self.at_forward[a.batch] = flat_params([self.compute.bottom]).clone()
            graph, h = self.compute.forward(np.arange(a.batch * 4, a.batch * 4 + 4),
                                            snapshot=a.snapshot)
            self.graphs[a.batch] = graph
            return h
        if isinstance(a, Publish):
            if a.kind == EMB and not a.meta.get("skip"):
                meta = {"e": a.meta["e"], "b": a.meta["b"], "u": a.meta["u"], "h": 0.0}
                g = self.grads.get(a.channel, np.zeros((4, 3), np.float32))
                self.boxes.setdefault(a.channel, []).append((self.t + self.delay_s,
                                                             Msg(meta, (g,))))
            return True
        if isinstance(a, Poll):
            m, stale = self._take(a.channel, a.accept, self.t)
            return Received(msg=m, stale=stale)
        if isinstance(a, Await):
            box = self.boxes.get(a.channel, [])
            due = self.t + a.timeout_s
            if box and box[0][0] <= due:
                self.t = max(self.t, box[0][0])
                m, stale = self._take(a.channel, a.accept, self.t)
                return Received(msg=m, stale=stale)
            self.t = due
            return Received()
        if isinstance(a, Backward):
            self.t += self.bwd_s
            if self.compute is not None:
                self.at_backward[a.key] = flat_params([self.compute.bottom]).clone()
                self.compute.backward(self.graphs.pop(a.key), a.msg.arrays[0], a.epoch)
                self.applied[a.key] = [p.grad.clone() for p in self.compute.replica.params]
            return None
        if isinstance(a, Pending):
            return frozenset(c for c in a.channels
                             if any(t <= self.t for t, _ in self.boxes.get(c, [])))
        if isinstance(a, Gather):
            return [self.run(p) for p in a.procs]
        if isinstance(a, WaitSchedule):
            assert a.ready(), "one worker never waits for another"
            return None
        assert isinstance(a, (Discard, Log, NotifySchedule)), a
        return None


def passive(**kw: Any) -> ScheduledPassive:
    base: dict[str, Any] = dict(algo="pubsub", role="passive", workers=1, drops=True,
                                data_wait_s=2.0, max_reassign=3, t_ddl_s=2.0, inflight_max=4)
    base.update(kw)
    return ScheduledPassive(StrategyConfig(**base))


def test_a_stale_gradient_meets_the_weights_that_made_its_embedding() -> None:
    """Three batches in flight: the second and third forwards run on snapshots; after the
    first batch's update, the second batch's gradient is back-propagated through the
    parameters of its forward (checked against autograd by hand), not the current ones."""
    torch.manual_seed(0)
    x = torch.randn(12, 4)
    ps = ParameterServer(flat_params([bottom_model(4, (8,), 3)]))
    compute = PassiveCompute(x, lambda: bottom_model(4, (8,), 3), ps, lr=0.05, delta_t0=5,
                             sync_mode="manual")
    rng = np.random.default_rng(0)
    grads = {b: rng.standard_normal((4, 3)).astype(np.float32) for b in range(3)}
    f = Clocked(delay_s=0.05, compute=compute, grads=grads)
    s = passive(inflight_max=3, inflight_auto=False)
    f.run(s.segment(0, [np.arange(b * 4, b * 4 + 4) for b in range(3)], range(3)))
    fwd = [a for a in f.actions if isinstance(a, Forward)]
    assert [a.snapshot for a in fwd] == [False, True, True]  # published with others in flight
    pubs = [a.channel for a in f.actions if isinstance(a, Publish)]
    first_bwd = next(i for i, a in enumerate(f.actions) if isinstance(a, Backward))
    assert len([a for a in f.actions[:first_bwd] if isinstance(a, Publish)]) == 3
    assert pubs == [0, 1, 2] and s.counters.batches == 3 and s.counters.max_staleness == 2
    for b in (1, 2):
        # the parameters moved between this batch's forward and its backward ...
        assert not torch.equal(f.at_forward[b], f.at_backward[b])
        # ... and the gradient applied is the one at the forward's parameters
        ref = bottom_model(4, (8,), 3)
        load_flat([ref], f.at_forward[b])
        ref(x[b * 4:b * 4 + 4]).backward(torch.from_numpy(grads[b]))
        for got, want in zip(f.applied[b], [p.grad for p in ref.parameters()], strict=True):
            torch.testing.assert_close(got, want)
        cur = bottom_model(4, (8,), 3)
        load_flat([cur], f.at_backward[b])
        cur(x[b * 4:b * 4 + 4]).backward(torch.from_numpy(grads[b]))
        assert not all(torch.allclose(g, p.grad) for g, p in
                       zip(f.applied[b], cur.parameters(), strict=True))


def test_window_grows_over_a_slow_link_and_every_batch_completes() -> None:
    s = passive(inflight_max=8)
    f = Clocked(delay_s=0.04)  # a 40 ms round trip, a 3 ms step
    f.run(s.segment(0, [np.arange(4)] * 40, range(40)))
    assert s.counters.batches == 40 and s.counters.dropped == 0
    rep = s.link_report()
    assert rep is not None and rep["inflight"]["size_max"] == 8  # 1 + floor(40 / 3), capped
    assert rep["rtt_s"]["median"] == pytest.approx(0.04, abs=0.004)
    assert rep["inflight"]["by_epoch"][0]["depth_max"] == 8
    assert f.t < 40 * 0.04 / 3  # far faster than one round trip per batch
    fast = passive(inflight_max=8)
    g = Clocked(delay_s=0.001)  # a LAN: the round trip is under one step
    g.run(fast.segment(0, [np.arange(4)] * 40, range(40)))
    assert fast.link_report()["inflight"]["size_max"] == 1


def test_a_deadline_below_the_measured_round_trip_is_raised_and_logged() -> None:
    """T_ddl = 10 ms on a 50 ms round trip: the first attempts miss, their late gradients
    measure the link, and the deadline becomes DDL_RTTS round trips (logged once, in the
    link report, and sent with the embeddings as meta ``d``)."""
    s = passive(inflight_max=4, data_wait_s=0.01, t_ddl_s=0.01, max_reassign=3)
    f = Clocked(delay_s=0.05)
    f.run(s.segment(0, [np.arange(4)] * 12, range(12)))
    logs = [a for a in f.actions if isinstance(a, Log) and a.event == "vfl.t_ddl_adjusted"]
    assert len(logs) == 1 and logs[0].fields["t_ddl_s"] == 0.01
    rep = s.link_report()
    assert rep is not None and rep["t_ddl"]["adjusted"]
    assert rep["t_ddl"]["effective_s"] == pytest.approx(logs[0].fields["effective_s"])
    assert rep["t_ddl"]["effective_s"] > 0.05
    assert s.counters.batches == 12  # every batch trained once the deadline fits the link
    late = [a for a in f.actions if isinstance(a, Publish) and "d" in a.meta]
    assert late and all(a.meta["d"] > 0.05 for a in late)


# ---------------------------------------------------------------------------- the DES
COSTS = StepCosts(passive_fwd_s=0.0005, passive_bwd_s=0.001, active_fwd_s=0.0005,
                  active_top_s=0.0005, active_bwd_s=0.001)


def sim(latency_s: float, inflight_max: int) -> Any:
    return simulate(SimInput(algo="pubsub", n_rows=256 * 120, batch_size=256,
                             cores_active=1, cores_passive=1, costs=COSTS, w_active=2,
                             w_passive=2, latency_s=latency_s, bandwidth_bps=math.inf,
                             inflight_max=inflight_max, epochs=2, jitter=0.1))


def test_des_window_hides_a_slow_link_and_stays_synchronous_on_a_fast_one() -> None:
    slow, sync = sim(0.02, 8), sim(0.02, 1)
    assert sync.link is None
    assert slow.link["inflight"]["size_max"] == 8
    assert slow.samples_per_s > 4 * sync.samples_per_s
    lan, lan_sync = sim(0.0, 8), sim(0.0, 1)
    assert lan.link["inflight"]["size_mean"] < 1.2
    assert lan.samples_per_s >= 0.95 * lan_sync.samples_per_s


def test_a_reassigned_batch_the_dp_ledger_refuses_is_dropped_with_a_notice() -> None:
    """With a window, as without: every first attempt misses its deadline, the DP ledger
    refuses every reassigned one (``Publish`` returns False): each batch is dropped once,
    with a skip notice to the active party, and the worker ends."""

    class Refusing(Clocked):
        def handle(self, a: Any) -> Any:
            if isinstance(a, Publish) and a.meta.get("a", 0) > 0:
                return False
            return super().handle(a)

    s = passive(inflight_max=3, data_wait_s=0.01, t_ddl_s=0.01, max_reassign=2)
    f = Refusing(delay_s=10.0)  # no gradient within the run
    f.run(s.segment(0, [np.arange(4)] * 5, range(5)))
    notices = [a for a in f.actions if isinstance(a, Publish) and a.meta.get("skip")]
    assert sorted(a.channel for a in notices) == [0, 1, 2, 3, 4]
    assert s.counters.batches == 0 and s.counters.reassigned == 5
    assert s.counters.dropped == 10  # each batch: its miss, then the refusal
    discards = [a.key for a in f.actions if isinstance(a, Discard)]
    assert sorted(discards) == sorted([0, 1, 2, 3, 4] * 2)


def test_points_are_in_flight_only_where_every_party_has_a_core() -> None:
    """The overlap decision: the configuration must allow it, and a party allotted under
    one core (its training fills its quota) sends the run back to points at segment ends;
    a partner that did not say its cores does not veto it."""
    assert overlap_decision(True, {"active": 2.0, "passive": 1.0}) == (
        True, f"every party allotted {OVERLAP_MIN_CORES:g} core or more")
    on, why = overlap_decision(True, {"active": 1.5625, "passive": 0.4375})
    assert not on and "passive allotted under 1 core" in why
    on, why = overlap_decision(True, {"active": 2.0, "passive": 2.0, "passive3": 0.5,
                                      "passive2": 0.75})
    assert not on and why.startswith("passive2, passive3 allotted under")
    assert overlap_decision(True, {"active": 2.0, "passive": None})[0]
    assert overlap_decision(False, {"active": 4.0, "passive": 4.0})[0] is False

