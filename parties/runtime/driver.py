"""The asyncio interpreter of strategy actions (:mod:`parties.algorithms.actions`) over a bus and
the party's workers.

:class:`ActionDriver` runs a strategy generator (:mod:`parties.algorithms.strategy`): it performs
each yielded action with real I/O (a compute call on a :class:`parties.runtime.workers.WorkerHandle`,
a publication or a bounded wait on the transport) and sends the result back. It knows
no algorithm. It uses only the transport surface :class:`pubsub.transport.Transport` (what
:class:`pubsub.Bus` offers), so any transport with that surface can carry a run.

An error raised while performing an action (or a cancellation) is thrown into the
generator at its ``yield``, so the strategy's ``try`` blocks see it where it happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from parties.algorithms.actions import (
    EMB,
    GRAD,
    IDS,
    Await,
    Backward,
    Discard,
    Flush,
    Forward,
    Gather,
    JoinPrefetch,
    Log,
    NotifySchedule,
    Now,
    Pending,
    Poll,
    Prefetch,
    Proc,
    Publish,
    Pull,
    Push,
    Received,
    TopStep,
    WaitSchedule,
)
from parties.core.errors import NonFiniteTraining
from parties.runtime.timeline import COMM, WAIT, Timeline
from parties.algorithms.wire import META_KEY, WireFormatError, decode_rows, encode_message
from pubsub import DeadlineExceeded
from pubsub.transport import Transport

if TYPE_CHECKING:  # (parties.runtime.workers pulls in torch; the driver itself needs none)
    from parties.algorithms.intake import PeerIntake, TensorSpec
    from parties.runtime.workers import WorkerHandle

log = structlog.get_logger(__name__)
#: bounds of the active party's kept gradients (:meth:`ActionDriver.grad_again`): the
#: last gradient of each of this many topics, in at most this many bytes
KEPT_GRADS = 1024
KEPT_GRAD_BYTES = 64 << 20


def _nbytes(frames: tuple[Any, Any]) -> int:
    return sum(int(getattr(a, "nbytes", 0)) for a in frames[0])


class TopicMap(Protocol):
    """Topic names of a run (:class:`parties.runtime.party.Topics`); ``party`` names one of
    several passive parties (``""``: the one partner)."""

    def emb(self, b: int, party: str = "") -> str: ...

    def grad(self, b: int, party: str = "") -> str: ...

    @property
    def ids(self) -> str: ...


class ActionDriver:
    """Interpret strategy generators over ``bus`` and ``handles``.

    Args:
        bus: the transport (:class:`Transport`).
        topics: the run's topic names.
        handles: the party's workers, by index.
        timeline: where waits and publications are recorded as spans.
        record_dp: called with an ``emb`` publication's rows (and ``extra=True`` for a
            reassigned attempt, ``meta["a"] > 0``) before it is published (the DP
            ledger; raises, publishing nothing, past the plan; returns False, publishing
            nothing, when a record's reassignment reserve is spent: the ``Publish``
            action then returns False); None: not recorded.
        inline: the workers compute on the event loop (their compute time during a wait
            is not waiting time).
        logger: a structlog logger for the strategies' :class:`parties.algorithms.actions.Log`.
        on_action: called with every action before it is performed (tracing, tests).
        wire: the resolved ``vfl.wire.dtype`` of the ``emb`` and ``grad`` tensors this
            party publishes (:mod:`parties.algorithms.wire`); what it receives is decoded to
            float32 by the encoding each message names, before the intake judges it.

    Attributes:
        wait_s: seconds spent waiting for partner messages so far (all workers).
    """

    def __init__(self, bus: Transport, *, topics: TopicMap, handles: Sequence[WorkerHandle],
                 timeline: Timeline, record_dp: Callable[..., bool | None] | None = None,
                 inline: bool = False, logger: Any = None,
                 on_action: Callable[[Any], None] | None = None,
                 intake: PeerIntake | None = None,
                 specs: dict[str, TensorSpec] | None = None,
                 wire: str = "float32",
                 ask_again: Callable[[str], None] | None = None,
                 ask_after_s: float = 0.0) -> None:
        self.bus = bus
        #: passive: asks the active party to publish a gradient again (its topic) when a
        #: wait for it has lasted ``ask_after_s`` (lost to a broker restart?)
        self.ask_again = ask_again if ask_after_s > 0 else None
        self.ask_after_s = ask_after_s
        #: active: the last gradients published, by topic (bounded), to publish again
        #: on request: a batch is trained once, so a gradient lost would otherwise make
        #: the passive party reassign the batch until it gives it up
        self.sent_grads: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._sent_bytes = 0
        self.wire = wire
        self.intake = intake
        self.specs = dict(specs or {})
        self.topics = topics
        self.handles = handles
        self.timeline = timeline
        self.record_dp = record_dp
        self.inline = inline
        self.log = logger if logger is not None else log
        self.wait_s = 0.0
        self.on_action = on_action
        self._prefetch: dict[int, asyncio.Task[None]] = {}
        self._cond = asyncio.Condition()
        self._sync: dict[type, Callable[[Any], Any]] = {
            Publish: self._publish, Poll: self._poll, Pending: self._pending, Now: self._now,
            Prefetch: self._start_prefetch, Log: self._log}
        self._async: dict[type, Callable[[Any], Any]] = {
            Forward: self._forward, Backward: self._backward, Discard: self._discard,
            JoinPrefetch: self._join_prefetch, TopStep: self._top_step, Await: self._await,
            WaitSchedule: self._wait_schedule, NotifySchedule: self._notify,
            Gather: self._gather, Push: self._push, Pull: self._pull, Flush: self._flush}

    async def run(self, proc: Proc) -> Any:
        """Run ``proc`` to its end; returns its return value (its exception propagates)."""
        send: Any = None
        exc: BaseException | None = None
        while True:
            try:
                action = proc.send(send) if exc is None else proc.throw(exc)
            except StopIteration as stop:
                return stop.value
            send, exc = None, None
            kind = type(action)
            if self.on_action is not None:
                self.on_action(action)
            try:
                fn = self._sync.get(kind)
                if fn is not None:
                    send = fn(action)
                    continue
                afn = self._async.get(kind)
                if afn is None:
                    raise TypeError(f"not a strategy action: {action!r}")
                send = await afn(action)
            except BaseException as e:  # noqa: BLE001 - thrown into the generator
                exc = e

    # ------------------------------------------------------------------ topics
    def _topic(self, kind: str, channel: int | None, party: str = "") -> str:
        if kind == EMB:
            assert channel is not None
            return self.topics.emb(channel, party)
        if kind == GRAD:
            assert channel is not None
            return self.topics.grad(channel, party)
        if kind == IDS:
            return self.topics.ids
        raise ValueError(f"unknown message kind {kind!r}")

    # ------------------------------------------------------------------ immediate
    def _publish(self, a: Publish) -> bool:
        """Publish; False (nothing published) when the DP ledger refuses a reassigned
        ``emb`` attempt (see ``record_dp``). A notice without arrays (``skip``) discloses
        no rows and is not recorded."""
        topic = self._topic(a.kind, a.channel, a.party)
        if a.kind != EMB or (a.meta.get("skip") is True and not a.arrays):
            self.bus.publish_nowait(topic, list(a.arrays), a.meta)
            return True
        if self.record_dp is not None:
            if int(a.meta.get("a", 0)) > 0:  # a reassigned attempt: an extra publication
                if self.record_dp(a.rows, extra=True) is False:
                    return False
            else:
                self.record_dp(a.rows)
        t0 = time.perf_counter()
        # encoded after the worker's clip and noise (DP post-processing)
        arrays, meta = encode_message(a.arrays, a.meta, self.wire)
        self.bus.publish_nowait(topic, arrays, meta, copy=False)
        self.timeline.record(COMM, a.worker, a.meta["b"], t0, time.perf_counter())
        return True

    def _poll(self, a: Poll) -> Received:
        """A buffered message that ``accept`` takes, without waiting."""
        topic = self._topic(a.kind, a.channel, a.party)
        stale = 0
        while (raw := self.bus.try_next(topic)) is not None:
            if (msg := self._admit(a.kind, raw, a.channel)) is None:
                continue
            verdict = a.accept(msg)
            if verdict == 1:
                return Received(msg=msg, stale=stale)
            if verdict < 0:
                self.bus.unget(msg)
                return Received(later=True, stale=stale)
            stale += 1
        return Received(stale=stale)

    def _pending(self, a: Pending) -> frozenset[int]:
        """The channels with a message buffered. Messages at a buffer's head that the
        intake refuses on their metadata (outside the run's plan, not the partner's) are
        dropped and counted here, so that they never make a channel look ready."""
        ready = []
        for c in a.channels:
            topic = self._topic(a.kind, c, a.party)
            while self.bus.pending(topic) > 0:
                if self.intake is None:
                    ready.append(c)
                    break
                raw = self.bus.try_next(topic)
                if raw is None:
                    break
                if self.intake.admit(raw, None, channel=c):  # metadata only
                    self.bus.unget(raw)
                    ready.append(c)
                    break
        return frozenset(ready)

    @staticmethod
    def _now(_: Now) -> float:
        return asyncio.get_running_loop().time()

    def _start_prefetch(self, a: Prefetch) -> None:
        h = self.handles[a.worker]
        self._prefetch[a.worker] = asyncio.create_task(h.prefetch(a.epoch, a.batch, rows=a.rows))

    def _log(self, a: Log) -> None:
        getattr(self.log, a.level)(a.event, **a.fields)

    # ------------------------------------------------------------------ compute
    async def _forward(self, a: Forward) -> Any:
        kw: dict[str, Any] = {}
        if a.rows is not None:
            kw["rows"] = a.rows
        if a.key is not None:
            kw["key"] = a.key
        if a.snapshot:
            kw["snapshot"] = True
        return await self.handles[a.worker].forward(a.epoch, a.batch, **kw)

    def _admit(self, kind: str, msg: Any, channel: int | None = None) -> Any:
        """The partner message with its tensor decoded to float32 (an ``emb`` or
        ``grad`` sent compressed, :mod:`parties.algorithms.wire`) if the intake admits it (no
        intake: everything); None: dropped (counted by the intake). ``channel``: the
        per-batch channel it came on (the intake checks it, and the message's epoch and
        batch, against the run's plan: a message outside it is dropped, never put back
        as one of a later epoch)."""
        tag = msg.meta.get(META_KEY)
        if tag is not None and kind != IDS and msg.arrays:
            try:
                # decoded, and no longer tagged (a message put back is taken as it is)
                msg = dataclasses.replace(
                    msg, arrays=(decode_rows(msg.arrays, tag),),
                    meta={k: v for k, v in msg.meta.items() if k != META_KEY})
            except WireFormatError as exc:
                if self.intake is None:
                    raise
                self.intake.reject(msg.publisher, str(exc), topic=msg.topic)
                return None
        if self.intake is None or self.intake.admit(msg, self.specs.get(kind),
                                                     channel=channel if kind != IDS else None):
            return msg
        return None

    def _check_rows(self, msg: Any, n_rows: int) -> Any:
        """The message's array, if it has the batch's ``n_rows`` rows (it passed the
        intake, so it came from the partner: a wrong count ends the run)."""
        arr = msg.arrays[0]
        if arr.shape[0] != n_rows and self.intake is not None:
            self.intake.reject(msg.publisher, f"{arr.shape[0]} rows for a batch of {n_rows}",
                               topic=msg.topic, fatal=True)
        return arr

    async def _backward(self, a: Backward) -> None:
        arr = self._check_rows(a.msg, a.n_rows)
        await self.handles[a.worker].backward(a.epoch, a.key, arr)

    async def _discard(self, a: Discard) -> None:
        await self.handles[a.worker].discard(a.key)

    async def _join_prefetch(self, a: JoinPrefetch) -> None:
        task = self._prefetch.pop(a.worker, None)
        if task is not None:
            await task

    async def _top_step(self, a: TopStep) -> float:
        bus, timeline, wire = self.bus, self.timeline, self.wire
        topics = [self.topics.grad(a.grad_channel, party) for party in a.parties]

        def publish(grads: Any) -> None:
            # one gradient (one partner) or one per partner, in a.parties order
            t0 = time.perf_counter()
            metas = a.grad_metas
            if a.held_since is not None:  # the active party's share of the round trip
                h = round(max(0.0, asyncio.get_running_loop().time() - a.held_since), 6)
                metas = tuple({**m, "h": h} for m in metas)
            if len(topics) == 1:
                frames = encode_message([grads], metas[0], wire)
                bus.publish_nowait(topics[0], *frames, copy=False)
                self._keep_grad(topics[0], frames)
            else:
                for topic, grad, meta in zip(topics, grads, metas, strict=True):
                    frames = encode_message([grad], meta, wire)
                    bus.publish_nowait(topic, *frames, copy=False)
                    self._keep_grad(topic, frames)
            timeline.record(COMM, a.worker, a.batch, t0, time.perf_counter())

        arrs = [self._check_rows(m, a.n_rows) for m in a.embs]
        loss, _ = await self.handles[a.worker].step(
            a.epoch, a.batch, arrs[0] if len(arrs) == 1 else arrs, rows=a.rows, on_grad=publish)
        if not math.isfinite(loss):  # never train on, or report, a NaN model
            raise NonFiniteTraining(f"loss of batch {a.batch} in epoch {a.epoch}")
        return loss

    def _keep_grad(self, topic: str, frames: tuple[Any, Any]) -> None:
        """Keep the gradient last published on ``topic`` (at most
        :data:`KEPT_GRADS` topics and :data:`KEPT_GRAD_BYTES` bytes; the oldest go)."""
        kept = self.sent_grads
        old = kept.pop(topic, None)
        if old is not None:
            self._sent_bytes -= _nbytes(old)
        kept[topic] = frames
        self._sent_bytes += _nbytes(frames)
        while kept and (len(kept) > KEPT_GRADS or self._sent_bytes > KEPT_GRAD_BYTES):
            self._sent_bytes -= _nbytes(kept.popitem(last=False)[1])

    def grad_again(self, topic: str) -> bool:
        """Active: publish again the gradient last published on ``topic``, if kept."""
        frames = self.sent_grads.get(topic)
        if frames is None:
            return False
        self.bus.publish_nowait(topic, *frames, copy=False)
        return True

    async def _push(self, _: Push) -> None:
        await asyncio.gather(*(h.push() for h in self.handles))

    async def _pull(self, _: Pull) -> None:
        await asyncio.gather(*(h.pull() for h in self.handles))

    async def _flush(self, _: Flush) -> None:
        await asyncio.gather(*(h.flush() for h in self.handles))

    # ------------------------------------------------------------------ coordination
    async def _await(self, a: Await) -> Received:
        """Wait on the topic for ``a.timeout_s`` for a message ``accept`` returns 1 for
        (0: stale, discarded; -1: from the future, put back, the wait ends ``later``).

        Time spent is counted as waiting time, except, with inline workers, the compute
        that ran on the loop meanwhile (e.g. the active worker's own bottom forward, or
        another worker's step). The wait is recorded as a ``wait`` span of the action's
        worker / batch on the party's timeline."""
        loop = asyncio.get_running_loop()
        topic = self._topic(a.kind, a.channel, a.party)
        t0 = loop.time()
        deadline = t0 + a.timeout_s
        p0 = time.perf_counter()
        busy0 = sum(h.compute_s for h in self.handles) if self.inline else 0.0
        stale = 0
        # a gradient waited for this long is asked for again, once (the active party
        # publishes it again if it was sent: lost to a broker restart)
        ask_at = (t0 + self.ask_after_s if a.kind == GRAD and self.ask_again is not None
                  and self.ask_after_s < a.timeout_s else math.inf)
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return Received(stale=stale)
                try:
                    raw = await self.bus.next(topic, max(0.0, min(deadline, ask_at)
                                                         - loop.time()))
                except DeadlineExceeded:
                    if ask_at < deadline:  # the slice before asking has passed
                        assert self.ask_again is not None
                        self.ask_again(topic)
                        ask_at = math.inf
                        continue
                    return Received(stale=stale)
                if (msg := self._admit(a.kind, raw, a.channel)) is None:
                    continue  # dropped and counted: the wait goes on to its deadline
                verdict = a.accept(msg)
                if verdict == 1:
                    return Received(msg=msg, stale=stale)
                if verdict < 0:
                    self.bus.unget(msg)
                    return Received(later=True, stale=stale)
                stale += 1
        finally:
            busy = sum(h.compute_s for h in self.handles) - busy0 if self.inline else 0.0
            self.wait_s += max(0.0, loop.time() - t0 - busy)
            self.timeline.record(WAIT, a.worker, a.batch, p0, time.perf_counter())

    async def _wait_schedule(self, a: WaitSchedule) -> None:
        await self.wait_until(a.ready)

    async def _notify(self, _: NotifySchedule) -> None:
        await self.wake()

    async def wait_until(self, ready: Callable[[], bool]) -> None:
        """Block until ``ready()`` holds, re-checked after every :class:`NotifySchedule`
        of the strategy (each batch's completion, drop or reassignment) and every
        :meth:`wake`."""
        async with self._cond:
            await self._cond.wait_for(ready)

    async def wake(self) -> None:
        """Re-check every :meth:`wait_until` (something outside the strategy changed)."""
        async with self._cond:
            self._cond.notify_all()

    async def _gather(self, a: Gather) -> list[Any]:
        return list(await asyncio.gather(*(self.run(p) for p in a.procs)))
