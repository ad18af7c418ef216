"""The receive side shared by bus clients: subscriptions' bookkeeping, bounded per-topic
buffers, waiters with deadlines, the ``block`` policy's held message, and the counters.

:class:`Receiver` holds no socket. A client (:class:`pubsub.client.Bus` over ZeroMQ,
:class:`pubsub.memory.MemoryBus` in process) hands each arriving envelope's frames to
:meth:`Receiver._on_frames` (decode, check, count, deliver); consumers call :meth:`Receiver.next`, ``try_next``, ``unget``
and ``pending``. One implementation for both clients, so they share the semantics
exactly: FIFO eviction and overflow counting, deadlines that never lose a message, the
held message under ``block``.

A client provides ``config`` (``overflow``, ``total_max_bytes``), ``client_id``,
``_log`` and :meth:`Receiver._schedule_drain` (resume reading after the held message was
placed), and calls :meth:`Receiver._init_receiver` in its constructor.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pubsub.buffer import BufferLimits, TopicBuffer
from pubsub.codec import Message, decode
from pubsub.errors import BusClosed, DeadlineExceeded, MalformedFrame


@dataclass(slots=True, kw_only=True)
class BusStats:
    """Counters of one client (a snapshot copy is returned by :meth:`Bus.stats`).

    Attributes:
        sent_msgs / sent_bytes: published, by channel class (``"emb"``, ``"grad"`` ...).
        recv_msgs / recv_bytes: received and routed, by channel class.
        evicted: messages evicted FIFO from full topic buffers.
        overflow_dropped: messages dropped because all buffers together were full,
            or because one message exceeded the per-topic byte bound.
        rejected: malformed frames received (counted, not delivered).
        unsolicited: messages for topics no longer subscribed (dropped).
        foreign: messages dropped on arrival because a publisher other than the one
            :meth:`Receiver.accept_only` named for their topic sent them.
        gaps: messages missing according to per-(publisher, topic) sequence numbers
            (a jump of more than :data:`MAX_GAP_JUMP` counts as a ``seq_anomaly``
            instead: a forged or restarted number cannot inflate the count).
        gaps_by_publisher: ``gaps`` by publisher id (at most :data:`MAX_GAP_SENDERS`
            publishers; the rest under ``"*"``).
        seq_anomalies: sequence jumps too large to be losses.
        broker_losses / broker_recoveries: keepalive outages seen and ended.
        slow_episodes: times a topic buffer filled up (evicting under ``drop``, pausing
            the reader under ``block``); logged once per episode.
        reader_errors: received messages lost to an unexpected error while handling
            them (a bug; logged as ``bus.reader_error``); the reader keeps going.
    """

    sent_msgs: dict[str, int] = field(default_factory=dict)
    sent_bytes: dict[str, int] = field(default_factory=dict)
    recv_msgs: dict[str, int] = field(default_factory=dict)
    recv_bytes: dict[str, int] = field(default_factory=dict)
    evicted: int = 0
    overflow_dropped: int = 0
    rejected: int = 0
    unsolicited: int = 0
    foreign: int = 0
    gaps: int = 0
    gaps_by_publisher: dict[str, int] = field(default_factory=dict)
    seq_anomalies: int = 0
    broker_losses: int = 0
    broker_recoveries: int = 0
    slow_episodes: int = 0
    reader_errors: int = 0

    def copy(self) -> BusStats:
        """A deep copy."""
        return BusStats(
            sent_msgs=dict(self.sent_msgs),
            sent_bytes=dict(self.sent_bytes),
            recv_msgs=dict(self.recv_msgs),
            recv_bytes=dict(self.recv_bytes),
            evicted=self.evicted,
            overflow_dropped=self.overflow_dropped,
            rejected=self.rejected,
            unsolicited=self.unsolicited,
            foreign=self.foreign,
            gaps=self.gaps,
            gaps_by_publisher=dict(self.gaps_by_publisher),
            seq_anomalies=self.seq_anomalies,
            broker_losses=self.broker_losses,
            broker_recoveries=self.broker_recoveries,
            slow_episodes=self.slow_episodes,
            reader_errors=self.reader_errors,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "sent_msgs": dict(self.sent_msgs),
            "sent_bytes": dict(self.sent_bytes),
            "recv_msgs": dict(self.recv_msgs),
            "recv_bytes": dict(self.recv_bytes),
            "evicted": self.evicted,
            "overflow_dropped": self.overflow_dropped,
            "rejected": self.rejected,
            "unsolicited": self.unsolicited,
            "foreign": self.foreign,
            "gaps": self.gaps,
            "gaps_by_publisher": dict(self.gaps_by_publisher),
            "seq_anomalies": self.seq_anomalies,
            "broker_losses": self.broker_losses,
            "broker_recoveries": self.broker_recoveries,
            "slow_episodes": self.slow_episodes,
            "reader_errors": self.reader_errors,
        }


_MAX_SEQ_KEYS = 1 << 16
#: a sequence jump larger than this is not counted as lost messages (``seq_anomalies``)
MAX_GAP_JUMP = 1 << 16
#: publishers with their own entry in ``BusStats.gaps_by_publisher``
MAX_GAP_SENDERS = 256


def _expire(fut: asyncio.Future[Message], topic: str, timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(DeadlineExceeded(topic, timeout_s))


class Receiver:
    """The receive side of a bus client (a mixin; see the module docstring)."""

    def _init_receiver(self, limits: BufferLimits, total_max_bytes: int) -> None:
        """Empty state: default per-topic ``limits``; ``total_max_bytes`` over all buffers."""
        self._limits = limits
        self._exact: set[str] = set()
        self._prefixes: dict[str, int] = {}
        self._buffers: dict[str, TopicBuffer[Message]] = {}
        self._topic_limits: dict[str, BufferLimits] = {}
        self._prefix_limits: dict[str, BufferLimits] = {}
        self._waiters: dict[str, deque[asyncio.Future[Message]]] = {}
        self._buffered_bytes = 0
        self._total_max_bytes = total_max_bytes
        self._recv_seq: dict[tuple[str, str], list[Any]] = {}
        self._recv_counts: dict[str, list[int]] = {}  # class -> [msgs, bytes] received
        self._stats = BusStats()
        self._slow_topics: set[str] = set()  # topics in a slow-consumer episode
        self._overflow_episode = False
        self._reject_episode = False
        self._closed = False
        self._paused: Message | None = None  # block policy: the message the reader holds
        self._only: dict[str, str] = {}  # topic -> the one publisher accepted on it

    def accept_only(self, publisher: str, topics: Iterable[str]) -> None:
        """From now on, keep messages on each of ``topics`` only from ``publisher`` (a
        client id, e.g. a partner's, learned in a handshake); others are dropped on
        arrival, before they take buffer room (counted as ``foreign``). The id is what
        the envelope says: against a sender that forges it, only the broker's checks
        help. Calling it again replaces a topic's publisher."""
        for t in topics:
            self._only[t] = publisher

    def _schedule_drain(self) -> None:  # pragma: no cover - provided by the client
        raise NotImplementedError

    def _fail_waiters(self) -> None:
        """On close: every pending :meth:`next` raises :class:`BusClosed`."""
        for dq in self._waiters.values():
            for fut in dq:
                if not fut.done():
                    fut.set_exception(BusClosed(self.client_id))
        self._waiters.clear()

    def _covered_by_prefix(self, topic: str) -> bool:
        return any(topic.startswith(p) for p in self._prefixes)

    def _drop_buffer(self, topic: str) -> None:
        buf = self._buffers.pop(topic, None)
        if buf is not None:
            self._buffered_bytes -= buf.nbytes
            buf.clear()

    def _account(self, topic: str, nbytes: int) -> int:
        cls = topic[:topic.find("/")] if "/" in topic else topic
        st = self._stats
        sent_msgs = st.sent_msgs
        sent_msgs[cls] = sent_msgs.get(cls, 0) + 1
        st.sent_bytes[cls] = st.sent_bytes.get(cls, 0) + nbytes
        return nbytes

    def _check_owner(self) -> None:
        """Raise if this process may not use the client (see :class:`pubsub.Bus`)."""

    # ------------------------------------------------------------------ receive
    async def next(self, topic: str, timeout_s: float) -> Message:
        """Return the oldest buffered message on exactly ``topic``, waiting up to ``timeout_s``.

        The topic must be subscribed (exactly or by prefix). A deadline never
        loses a message: if one is handed over as the deadline fires, it is
        returned; if the caller is cancelled after the hand-over, it goes back to
        the head of the buffer.

        Raises:
            DeadlineExceeded: nothing arrived within ``timeout_s`` seconds.
            BusClosed: the client closed while waiting.
            ValueError: ``timeout_s`` is negative or not finite.
        """
        self._check_owner()
        if not (timeout_s >= 0 and timeout_s != float("inf")):
            raise ValueError(f"timeout_s must be finite and >= 0, got {timeout_s!r}")
        if self._closed:
            raise BusClosed(self.client_id)
        buf = self._buffers.get(topic)
        if buf is not None and len(buf):
            msg, n = buf.pop()
            self._buffered_bytes -= n
            if not len(buf):
                self._slow_topics.discard(topic)
            if self._paused is not None:
                self._unpause()
            return msg
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Message] = loop.create_future()
        dq = self._waiters.setdefault(topic, deque())
        dq.append(fut)
        if self._paused is not None and self._paused.topic == topic:
            self._unpause()  # block policy: the held message goes straight to this waiter
        # A plain timer resolves the same future the reader resolves: whichever comes
        # first wins, and a message handed over is never dropped by the deadline.
        timer = loop.call_later(timeout_s, _expire, fut, topic, timeout_s)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._requeue_front(fut.result())  # handed over, then the caller was cancelled
            raise
        finally:
            timer.cancel()
            if not fut.done():
                fut.cancel()
            # identity scan: deque.remove would build an error message holding repr(fut)
            # (and so of its payload) when the reader already popped it
            for i, f in enumerate(dq):
                if f is fut:
                    del dq[i]
                    break
            if not dq:
                self._waiters.pop(topic, None)

    def try_next(self, topic: str) -> Message | None:
        """Pop the oldest buffered message on ``topic`` without waiting (None if empty)."""
        self._check_owner()
        buf = self._buffers.get(topic)
        if buf is None or not len(buf):
            return None
        msg, n = buf.pop()
        self._buffered_bytes -= n
        if self._paused is not None:
            self._unpause()
        return msg

    def _unpause(self) -> None:
        """Block policy: place the held message if it fits now, and resume the reader."""
        held = self._paused
        if held is None:
            return
        dq = self._waiters.get(held.topic)
        if not dq and not self._fits(held):
            return
        self._paused = None
        self._deliver(held)
        self._schedule_drain()

    def unget(self, msg: Message) -> None:
        """Put a message taken with :meth:`next` back at the head of its topic's buffer.

        For consumers that looked at a message and found it is not theirs yet.
        """
        self._requeue_front(msg)

    def pending(self, topic: str) -> int:
        """How many messages are buffered on ``topic``."""
        buf = self._buffers.get(topic)
        return 0 if buf is None else len(buf)

    def stats(self) -> BusStats:
        """A snapshot of this client's counters."""
        st = self._stats
        st.recv_msgs = {c: v[0] for c, v in self._recv_counts.items()}
        st.recv_bytes = {c: v[1] for c, v in self._recv_counts.items()}
        return st.copy()

    def _limits_for(self, topic: str) -> BufferLimits:
        lim = self._topic_limits.get(topic)
        if lim is not None:
            return lim
        for prefix, plim in self._prefix_limits.items():
            if topic.startswith(prefix):
                return plim
        return self._limits

    def _requeue_front(self, msg: Message) -> None:
        buf = self._buffers.get(msg.topic)
        if buf is None:
            buf = self._buffers[msg.topic] = TopicBuffer(self._limits_for(msg.topic))
        buf.push_front(msg, msg.nbytes)
        self._buffered_bytes += msg.nbytes

    def _reader_error(self, exc: Exception) -> None:
        """Count (``reader_errors``) and log, once per episode, an error while handling
        one received message; the message is lost and counted, the reader goes on."""
        self._stats.reader_errors += 1
        if self._stats.reader_errors == 1 or self._stats.reader_errors % 1000 == 0:
            with contextlib.suppress(Exception):  # the log sink itself may be the failure
                self._log.error("bus.reader_error", error=repr(exc),
                                reader_errors=self._stats.reader_errors)

    def _on_frames(self, frames: Sequence[Any]) -> None:
        """Decode, check subscription and sequence, count, and deliver one envelope."""
        try:
            msg = decode(frames)
        except MalformedFrame as exc:
            self._stats.rejected += 1
            if not self._reject_episode:
                self._reject_episode = True
                self._log.warning("bus.frame_rejected", reason=exc.reason)
            return
        self._reject_episode = False
        topic = msg.topic
        if topic not in self._exact and not self._covered_by_prefix(topic):
            self._stats.unsolicited += 1
            return
        if self._only and self._only.get(topic, msg.publisher) != msg.publisher:
            self._stats.foreign += 1
            return
        # per-(publisher, topic) state: [last seq, the class's [msgs, bytes] counter]
        key = (msg.publisher, topic)
        state = self._recv_seq.get(key)
        seq = msg.seq
        if state is None:
            state = self._new_recv_state(key, topic)
        elif seq > state[0] + 1:
            self._count_gap(msg.publisher, seq - state[0] - 1)
        state[0] = seq
        counts = state[1]
        counts[0] += 1
        counts[1] += msg.nbytes
        self._deliver(msg)

    def _count_gap(self, publisher: str, missing: int) -> None:
        st = self._stats
        if missing > MAX_GAP_JUMP:  # no buffer loses this many: forged or restarted
            st.seq_anomalies += 1
            return
        st.gaps += missing
        by = st.gaps_by_publisher
        key = publisher if publisher in by or len(by) < MAX_GAP_SENDERS else "*"
        by[key] = by.get(key, 0) + missing

    def _new_recv_state(self, key: tuple[str, str], topic: str) -> list[Any]:
        """Sequence state for a new (publisher, topic), bounded at ``_MAX_SEQ_KEYS``."""
        if len(self._recv_seq) >= _MAX_SEQ_KEYS:
            self._recv_seq.clear()
        cls = topic.partition("/")[0]
        counts = self._recv_counts.get(cls)
        if counts is None:
            counts = self._recv_counts[cls] = [0, 0]
        state = self._recv_seq[key] = [0, counts]
        return state

    def _deliver(self, msg: Message) -> None:
        """Hand ``msg`` to the oldest live waiter on its topic, else buffer it."""
        dq = self._waiters.get(msg.topic)
        if dq:
            while dq:
                fut = dq.popleft()
                if not fut.done():
                    fut.set_result(msg)
                    return
        self._buffer(msg)

    def _fits(self, msg: Message) -> bool:
        """Would ``msg`` enter its topic buffer without evicting (block policy)?"""
        if self._buffered_bytes + msg.nbytes > self.config.total_max_bytes:
            return False
        buf = self._buffers.get(msg.topic)
        if buf is None:
            return True
        lim = buf.limits
        return len(buf) < lim.max_msgs and buf.nbytes + msg.nbytes <= lim.max_bytes

    def _buffer(self, msg: Message) -> None:
        topic = msg.topic
        nb = msg.nbytes
        if self._buffered_bytes + nb <= self._total_max_bytes:
            buf = self._buffers.get(topic)
            if buf is not None and buf.try_append(msg, nb):  # room: the common case
                self._buffered_bytes += nb
                self._overflow_episode = False
                return
        if self.config.overflow == "block" and not self._fits(msg):
            lim = self._limits_for(topic)
            if len(self._buffers.get(topic, ())) or msg.nbytes <= min(
                    lim.max_bytes, self.config.total_max_bytes - self._buffered_bytes):
                # hold it and pause the reader until the consumer makes room
                self._paused = msg
                if topic not in self._slow_topics:
                    self._slow_topics.add(topic)
                    self._stats.slow_episodes += 1
                    self._log.warning("bus.slow_consumer", topic=topic, policy="block")
                return
        if self._buffered_bytes + msg.nbytes > self.config.total_max_bytes:
            self._stats.overflow_dropped += 1
            if not self._overflow_episode:
                self._overflow_episode = True
                self._log.warning(
                    "bus.overflow",
                    topic=topic,
                    buffered_bytes=self._buffered_bytes,
                    total_max_bytes=self.config.total_max_bytes,
                )
            return
        self._overflow_episode = False
        buf = self._buffers.get(topic)
        if buf is None:
            buf = self._buffers[topic] = TopicBuffer(self._limits_for(topic))
        before = buf.nbytes
        out = buf.put(msg, msg.nbytes)
        self._buffered_bytes += buf.nbytes - before
        if out:
            if out[0] is msg:
                self._stats.overflow_dropped += 1
                self._log.warning(
                    "bus.message_too_large", topic=topic, nbytes=msg.nbytes,
                    topic_max_bytes=self._limits.max_bytes,
                )
                return
            self._stats.evicted += len(out)
            if topic not in self._slow_topics:
                self._slow_topics.add(topic)
                self._stats.slow_episodes += 1
                self._log.warning(
                    "bus.slow_consumer", topic=topic, evicted=len(out), buffered=len(buf)
                )
