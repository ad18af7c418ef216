"""One schedule, two interpreters: the discrete-event simulator (:mod:`sim.des`) and the
asyncio :class:`parties.driver.ActionDriver` (over an in-memory transport and instant
fake workers: no sockets, no processes) run the same strategies, so each worker sees the
same action sequence in both, whatever the costs."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from parties.actions import (
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
from parties.driver import ActionDriver
from parties.schedule import effective_workers, eval_segments, num_batches
from parties.strategy import StrategyConfig, make_strategy
from parties.timeline import Timeline
from pubsub import DeadlineExceeded, Message
from sim.des import SimInput, StepCosts, simulate

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
    def emb(self, b: int) -> str:
        return f"emb/t/{b}"

    def grad(self, b: int) -> str:
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
