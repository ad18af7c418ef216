"""One schedule, two interpreters: the discrete-event simulator (:mod:`sim.cluster.des`) and the
asyncio :class:`parties.runtime.driver.ActionDriver` (over an in-memory transport and instant
fake workers: no sockets, no processes) run the same strategies, so each worker sees the
same action sequence in both, whatever the costs."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parties.algorithms.actions import (
    Await,
    Backward,
    Discard,
    Flush,
    Forward,
    JoinPrefetch,
    Prefetch,
    Publish,
    Pull,
    Push,
    TopStep,
)
from parties.runtime.driver import ActionDriver
from parties.algorithms.schedule import effective_workers, eval_segments, num_batches
from parties.algorithms.strategy import StrategyConfig, make_strategy
from parties.runtime.timeline import Timeline
from pubsub import DeadlineExceeded, Message
from sim.cluster.des import SimInput, StepCosts, simulate

ROLES = ("active", "passive")


class MemBus:
    """An in-memory transport with the surface the driver uses (both parties share it:
    each topic has one reader)."""

    def __init__(self) -> None:
        self.q: dict[str, deque[Message]] = defaultdict(deque)
        self.cond = asyncio.Condition()
        self.seq = 0

    async def subscribe(self, topic: str, *, limits: Any = None) -> None:
        return None

    async def subscribe_many(self, topics: Sequence[str], *, limits: Any = None) -> None:
        return None

    def publish_nowait(self, topic: str, arrays: Sequence[Any] = (),
                       meta: dict[str, Any] | None = None, *, copy: bool = True) -> int:
        self.seq += 1
        self.q[topic].append(Message(topic=topic, seq=self.seq, publisher="mem",
                                     meta=dict(meta or {}), arrays=tuple(arrays)))
        asyncio.get_running_loop().create_task(self._wake())
        return 0

    async def _wake(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    async def next(self, topic: str, timeout_s: float) -> Message:
        try:
            async with self.cond:
                await asyncio.wait_for(self.cond.wait_for(lambda: bool(self.q[topic])),
                                       timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(topic, timeout_s) from None
        return self.q[topic].popleft()

    def try_next(self, topic: str) -> Message | None:
        return self.q[topic].popleft() if self.q[topic] else None

    def unget(self, msg: Message) -> None:
        self.q[msg.topic].appendleft(msg)

    def pending(self, topic: str) -> int:
        return len(self.q[topic])

    def stats(self) -> Any:
        return None


class InstantWorker:
    """A worker handle whose compute calls take no time (one loop turn each)."""

    compute_s = 0.0
    compute_cpu_s = 0.0
    sync_cpu_s = 0.0

    async def forward(self, epoch: int, b: int, **kw: Any) -> np.ndarray:
        await asyncio.sleep(0)
        return np.zeros((1, 2), np.float32)

    async def step(self, epoch: int, b: int, emb: np.ndarray, **kw: Any) -> tuple[float, Any]:
        await asyncio.sleep(0)
        grad = np.zeros((1, 2), np.float32)
        kw["on_grad"](grad)
        await asyncio.sleep(0)
        return 0.25, grad

    async def _noop(self, *a: Any, **kw: Any) -> None:
        await asyncio.sleep(0)

    prefetch = backward = discard = push = pull = flush = _noop


class RunTopics:
    def emb(self, b: int, party: str = "") -> str:
        return f"emb/t/{b}"

    def grad(self, b: int, party: str = "") -> str:
        return f"grad/t/{b}"

    @property
    def ids(self) -> str:
        return "ids/t/subsets"


def project(a: Any) -> tuple[Any, ...] | None:
    """What must agree between interpreters (no payloads, clocks or timeouts)."""
    rows = None if getattr(a, "rows", None) is None else tuple(int(r) for r in a.rows)
    if isinstance(a, (Forward, Prefetch)):
        return (type(a).__name__, a.epoch, a.batch, a.n_rows, rows)
    if isinstance(a, (Backward, Discard)):
        return (type(a).__name__, a.key)
    if isinstance(a, TopStep):
        return ("TopStep", a.epoch, a.batch, a.n_rows, a.grad_channel,
                tuple(sorted(a.grad_meta.items())), rows)
    if isinstance(a, Publish):
        return ("Publish", a.kind, a.channel, tuple(sorted(a.meta.items())))
    if isinstance(a, Await):
        return ("Await", a.kind, a.channel, a.batch)
    if isinstance(a, (Push, Pull)):
        return (type(a).__name__, a.epoch, a.batch)
    if isinstance(a, Flush):
        return ("Flush", a.epoch)
    if isinstance(a, JoinPrefetch):
        return ("JoinPrefetch",)
    return None


def per_worker(trace: list[tuple[str, Any]]) -> dict[tuple[str, int], list[tuple[Any, ...]]]:
    out: dict[tuple[str, int], list[tuple[Any, ...]]] = defaultdict(list)
    for role, a in trace:
        p = project(a)
        if p is not None:
            out[(role, getattr(a, "worker", -1))].append(p)
    return dict(out)


def run_driver(inp: SimInput) -> list[tuple[str, Any]]:
    """Both parties' strategies through ActionDriver, segment by segment as the DES
    does (both segments, then both end_segments)."""
    trace: list[tuple[str, Any]] = []
    n_b = num_batches(inp.n_rows, inp.batch_size)
    batches = [range(b * inp.batch_size, min(inp.n_rows, (b + 1) * inp.batch_size))
               for b in range(n_b)]

    async def main() -> None:
        bus = MemBus()
        strat, drv = {}, {}
        for r in ROLES:
            w = effective_workers(inp.algo, r, inp.w_active, inp.w_passive)
            strat[r] = make_strategy(StrategyConfig(
                algo=inp.algo, role=r, workers=w, drops=False, data_wait_s=30.0,
                staleness_bound=inp.staleness_bound))
            drv[r] = ActionDriver(bus, topics=RunTopics(),
                                  handles=[InstantWorker() for _ in range(w)],
                                  timeline=Timeline(r),
                                  on_action=lambda a, r=r: trace.append((r, a)))
        for epoch in range(inp.epochs):
            for seg in eval_segments(n_b, inp.segments):
                await asyncio.wait_for(asyncio.gather(
                    *(drv[r].run(strat[r].segment(epoch, batches, seg)) for r in ROLES)), 60)
                await asyncio.gather(*(drv[r].run(strat[r].end_segment(epoch))
                                       for r in ROLES))

    asyncio.run(main())
    return trace


def costs() -> StepCosts:
    return StepCosts(passive_fwd_s=0.003, passive_bwd_s=0.006, active_fwd_s=0.002,
                     active_top_s=0.001, active_bwd_s=0.004)


@pytest.mark.parametrize(("algo", "wa", "wp"), [("vfl", 1, 1), ("pubsub", 1, 1),
                                                ("vfl-ps", 2, 2), ("vfl-ps", 3, 2)])
def test_des_and_driver_give_each_worker_the_same_action_sequence(algo: str, wa: int,
                                                                  wp: int) -> None:
    inp = SimInput(algo=algo, n_rows=9 * 16 + 5, batch_size=16, cores_active=1.0,
                   cores_passive=1.0, costs=costs(), w_active=wa, w_passive=wp,
                   latency_s=0.001, segments=2, epochs=2)
    des_trace: list[tuple[str, Any]] = []
    simulate(inp, on_action=lambda role, a: des_trace.append((role, a)))
    des, real = per_worker(des_trace), per_worker(run_driver(inp))
    assert des.keys() == real.keys()
    for key in des:
        assert des[key] == real[key], key
    # and the sequences are the algorithm's: every batch embedded, trained, back-propagated
    n_b = num_batches(inp.n_rows, inp.batch_size)
    trained = sorted((a.epoch, a.batch) for r, a in des_trace if isinstance(a, TopStep))
    pairs = min(wa, wp) if algo == "vfl-ps" else 1
    assert trained == sorted((e, b) for e in range(2) for b in range(n_b) for _ in range(pairs))


@settings(max_examples=15, deadline=None)
@given(algo=st.sampled_from(["vfl", "pubsub", "vfl-ps"]), wa=st.integers(1, 3),
       wp=st.integers(1, 3), n_rows=st.integers(1, 60), batch=st.integers(1, 16),
       segments=st.integers(1, 3), latency=st.sampled_from([0.0, 0.002]))
def test_des_and_driver_agree_on_random_runs(algo: str, wa: int, wp: int, n_rows: int,
                                             batch: int, segments: int,
                                             latency: float) -> None:
    """Property: per worker, the same action sequence (``pubsub`` with one worker per
    party: with more, which worker takes which batch depends on timing)."""
    if algo == "pubsub":
        wa = wp = 1
    inp = SimInput(algo=algo, n_rows=n_rows, batch_size=batch, cores_active=1.0,
                   cores_passive=1.0, costs=costs(), w_active=wa, w_passive=wp,
                   latency_s=latency, segments=segments)
    des_trace: list[tuple[str, Any]] = []
    simulate(inp, on_action=lambda role, a: des_trace.append((role, a)))
    assert per_worker(des_trace) == per_worker(run_driver(inp))


def test_des_vfl_trace_of_one_batch() -> None:
    inp = SimInput(algo="vfl", n_rows=16, batch_size=16, cores_active=1.0, cores_passive=1.0,
                   costs=costs())
    trace: list[tuple[str, Any]] = []
    simulate(inp, on_action=lambda role, a: trace.append((role, a)))
    seq = per_worker(trace)
    assert seq[("passive", 0)] == [
        ("Forward", 0, 0, 16, None),
        ("Publish", "emb", 0, (("a", 0), ("b", 0), ("e", 0), ("u", "0.0.0"))),
        ("Await", "grad", 0, 0), ("Backward", 0)]
    assert seq[("active", 0)] == [
        ("Prefetch", 0, 0, 16, None), ("Await", "emb", 0, 0), ("JoinPrefetch",),
        ("TopStep", 0, 0, 16, 0, (("b", 0), ("e", 0), ("u", "0.0.0")), None)]


# ---------------------------------------------------------------------------- ActionDriver
def drive(proc: Any, bus: MemBus | None = None, **kw: Any) -> tuple[Any, ActionDriver]:
    async def main() -> tuple[Any, ActionDriver]:
        d = ActionDriver(bus or MemBus(), topics=RunTopics(), handles=[InstantWorker()],
                         timeline=Timeline("active"), **kw)
        return await d.run(proc), d

    return asyncio.run(main())


def test_driver_await_skips_stale_puts_back_a_later_message_and_times_out() -> None:
    def proc() -> Any:
        accept = lambda m: 1 if m.meta["e"] == 2 else (0 if m.meta["e"] < 2 else -1)  # noqa: E731
        r1 = yield Await(kind="emb", channel=0, timeout_s=1.0, accept=accept)
        r2 = yield Await(kind="emb", channel=0, timeout_s=1.0, accept=accept)
        r3 = yield Await(kind="emb", channel=1, timeout_s=0.02, accept=accept)
        return r1, r2, r3

    async def main() -> Any:
        bus = MemBus()
        for e in (1, 2, 3):
            bus.publish_nowait("emb/t/0", (), {"e": e})
        d = ActionDriver(bus, topics=RunTopics(), handles=[InstantWorker()],
                         timeline=Timeline("active"))
        return await d.run(proc()), d, bus

    (r1, r2, r3), d, bus = asyncio.run(main())
    assert r1.msg.meta == {"e": 2} and r1.stale == 1 and not r1.later
    assert r2.msg is None and r2.later
    assert bus.pending("emb/t/0") == 1  # the later message stays for its epoch
    assert r3.msg is None and not r3.later and r3.stale == 0
    assert d.wait_s > 0


def test_driver_counts_dp_before_publishing_and_throws_its_refusal_into_the_strategy() -> None:
    seen: list[Any] = []

    def refuse(rows: Any) -> None:
        seen.append(tuple(rows))
        if len(seen) > 1:
            raise RuntimeError("budget")

    def proc() -> Any:
        yield Publish(kind="emb", channel=3, meta={"b": 3}, arrays=(np.zeros(1),),
                      rows=range(2), worker=0, batch=3)
        try:
            yield Publish(kind="emb", channel=3, meta={"b": 3}, rows=range(1))
        except RuntimeError as exc:
            return str(exc)
        return "published"

    bus = MemBus()
    out, _ = drive(proc(), bus, record_dp=refuse)
    assert out == "budget" and seen == [(0, 1), (0,)]
    assert bus.pending("emb/t/3") == 1  # only the first


def test_driver_joins_the_prefetch_before_a_transport_error_propagates() -> None:
    class Broken(MemBus):
        async def next(self, topic: str, timeout_s: float) -> Message:
            raise RuntimeError("transport down")

    trace: list[Any] = []
    s = make_strategy(StrategyConfig(algo="vfl", role="active", workers=1, drops=False,
                                     data_wait_s=5.0))
    with pytest.raises(RuntimeError, match="transport down"):
        drive(s.segment(0, [range(4)], range(1)), Broken(), on_action=trace.append)
    names = [type(a).__name__ for a in trace]
    assert names[-2:] == ["Await", "JoinPrefetch"]


def test_driver_logs_a_strategy_log_action() -> None:
    events: list[tuple[str, dict[str, Any]]] = []

    class Logger:
        def warning(self, event: str, **kw: Any) -> None:
            events.append((event, kw))

    def proc() -> Any:
        from parties.algorithms.actions import Log
        yield Log(event="vfl.batch_dropped", level="warning", fields={"batch": 1})

    drive(proc(), logger=Logger())
    assert events == [("vfl.batch_dropped", {"batch": 1})]


def test_driver_runs_pubsub_with_several_workers_to_the_end_of_every_epoch() -> None:
    inp = SimInput(algo="pubsub", n_rows=7 * 8, batch_size=8, cores_active=1.0,
                   cores_passive=1.0, costs=costs(), w_active=3, w_passive=2, epochs=2,
                   segments=2)
    trace = run_driver(inp)
    for role in ROLES:
        done = [(a.epoch, a.key) for r, a in trace if r == role and isinstance(a, Backward)]
        tops = [(a.epoch, a.batch) for r, a in trace if r == role and isinstance(a, TopStep)]
        got = sorted(done if role == "passive" else tops)
        assert got == [(e, b) for e in range(2) for b in range(7)], role


def test_driver_asks_the_ledger_for_a_reassigned_attempt_and_publishes_nothing_refused() -> None:
    # the DP ledger (record_dp) sees a reassigned attempt (meta "a" > 0) as an extra
    # publication; False: nothing is published and the Publish action returns False. A
    # skip notice (no arrays) discloses no rows and is not recorded.
    seen: list[tuple[tuple[int, ...], bool]] = []

    def ledger(rows: Any, *, extra: bool = False) -> bool:
        seen.append((tuple(rows), extra))
        return not extra

    def proc() -> Any:
        a = yield Publish(kind="emb", channel=3, meta={"b": 3, "a": 0}, arrays=(np.zeros(1),),
                          rows=range(2), worker=0, batch=3)
        b = yield Publish(kind="emb", channel=3, meta={"b": 3, "a": 1}, arrays=(np.zeros(1),),
                          rows=range(2), worker=0, batch=3)
        c = yield Publish(kind="emb", channel=3, meta={"e": 0, "b": 3, "skip": True})
        return a, b, c

    bus = MemBus()
    out, _ = drive(proc(), bus, record_dp=ledger)
    assert out == (True, False, True)
    assert seen == [((0, 1), False), ((0, 1), True)]
    assert bus.pending("emb/t/3") == 2  # the first attempt and the notice
