"""The bus client: one publisher socket, one subscriber socket, bounded per-topic buffers.

Design (see ``shared/reference/zeromq.md`` for the measurements behind it):

* **One reader callback per subscriber socket.** The SUB socket's ZMQ_FD is
  watched with ``loop.add_reader``; on each wake-up the callback drains the
  socket with non-blocking receives (a burst), decodes each envelope and hands
  it straight to a waiting :meth:`Bus.next` or to the topic's bounded buffer
  (no task hop, no future per message). Waiting with a deadline never cancels a
  socket receive, so deadlines cannot lose messages.
* **Exact topics.** Topic frames end in NUL; an exact subscription is the topic
  plus NUL, so ``emb/1`` never receives ``emb/10``. Prefix subscriptions are
  explicit (:meth:`Bus.subscribe_prefix`), and the reader still routes by exact
  topic.
* **Bounded memory.** Each topic buffer is bounded in messages and bytes with
  FIFO eviction; all buffers together are bounded by ``total_max_bytes``.
  Evictions and overflows are counted and logged once per episode.
* **Ready handshake.** :meth:`Bus.connect` publishes probes on a private topic
  until one comes back through the broker, so the publisher socket is known to
  be attached (and holds the broker's subscriptions) before the first publish:
  no slow-joiner loss. A broker that never answers raises
  :class:`~pubsub.errors.BrokerUnreachable` within ``connect_timeout_s``.
* **Lifecycle.** ``async with Bus(...)``; :meth:`Bus.close` is idempotent, sets
  LINGER on every socket, and returns within ``linger_s`` plus a few ms.

Publishing happens on the event loop thread only (sockets are never shared
across threads); other threads use :meth:`Bus.publish_threadsafe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog
import zmq
import zmq.asyncio
from zmq.backend import Socket as _Backend

from pubsub.address import BrokerAddress
from pubsub.buffer import BufferLimits, TopicBuffer
from pubsub.codec import Message, decode, encode, topic_frame, validate_topic
from pubsub.control import Hello, hello
from pubsub.policy import RoleRules
from pubsub.security import CurveClient, check_insecure_allowed
from pubsub.wire import recv_rest, send_envelope
from pubsub.errors import (
    BrokerUnreachable,
    BusClosed,
    DeadlineExceeded,
    ForbiddenTopic,
    MalformedFrame,
    PublishTimeout,
    PublishWouldBlock,
)

log = structlog.get_logger(__name__)

PROBE_CLASS = "_bus"
_NOBLOCK = int(zmq.NOBLOCK)
_send = _Backend.send
_recv = _Backend.recv
_get = _Backend.get
_RCVMORE = int(zmq.RCVMORE)


@dataclass(frozen=True, slots=True, kw_only=True)
class BusConfig:
    """Client settings. All sizes in bytes, all times in seconds.

    Attributes:
        connect_timeout_s: how long :meth:`Bus.connect` probes the broker before
            raising :class:`BrokerUnreachable`.
        probe_interval_s: interval between handshake probes.
        linger_s: ZeroMQ LINGER on every socket: how long close waits to flush.
        sndhwm: publisher high-water mark (messages queued per peer).
        rcvhwm: subscriber high-water mark (messages queued in libzmq).
        topic_max_msgs: per-topic buffer bound, messages.
        topic_max_bytes: per-topic buffer bound, bytes.
        total_max_bytes: bound over all topic buffers together, bytes.
        drain_burst: most messages drained per wake-up before yielding to the loop.
        heartbeat_interval_s: period of the broker keepalive, a ping on the broker's
            control socket, which never shares the data path (0 disables it).
        broker_timeout_s: no ping answered for this long marks the broker lost
            (``bus.broker_lost`` is logged once; ``bus.broker_recovered`` when pings
            return). ZeroMQ reconnects and re-sends subscriptions by itself; the
            keepalive is how the application learns of the outage and the recovery.
        overflow: what happens when a receiver falls behind.
            ``"drop"``: nothing waits; a full topic buffer evicts its oldest message
            (counted in ``evicted``); messages ZeroMQ drops at a high-water mark on the
            way show up as sequence ``gaps``.
            ``"block"``: backpressure end to end: a full topic buffer pauses this
            client's reader, the broker (run with ``overflow = "block"``) stops
            forwarding, and publishers' :meth:`Bus.publish` waits (up to
            ``publish_timeout_s``). Use the same policy on all clients and the broker.
        publish_timeout_s: under ``block``, the most :meth:`Bus.publish` waits, seconds.
    """

    connect_timeout_s: float = 5.0
    probe_interval_s: float = 0.02
    linger_s: float = 0.5
    sndhwm: int = 10_000
    rcvhwm: int = 10_000
    topic_max_msgs: int = 64
    topic_max_bytes: int = 64 << 20
    total_max_bytes: int = 1 << 30
    drain_burst: int = 512
    heartbeat_interval_s: float = 0.5
    broker_timeout_s: float = 2.0
    overflow: str = "drop"
    publish_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "probe_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.overflow not in ("drop", "block"):
            raise ValueError(f"overflow must be 'drop' or 'block', got {self.overflow!r}")
        if not self.publish_timeout_s > 0:
            raise ValueError(f"publish_timeout_s must be > 0, got {self.publish_timeout_s!r}")
        if self.heartbeat_interval_s < 0 or self.broker_timeout_s <= 0:
            raise ValueError("heartbeat_interval_s must be >= 0 and broker_timeout_s > 0, got "
                             f"{self.heartbeat_interval_s!r}, {self.broker_timeout_s!r}")
        if self.linger_s < 0:
            raise ValueError(f"linger_s must be >= 0, got {self.linger_s!r}")
        if self.total_max_bytes < self.topic_max_bytes:
            raise ValueError(
                f"total_max_bytes ({self.total_max_bytes}) < topic_max_bytes ({self.topic_max_bytes})"
            )
        BufferLimits(max_msgs=self.topic_max_msgs, max_bytes=self.topic_max_bytes)


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
        gaps: messages missing according to per-(publisher, topic) sequence numbers.
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
    gaps: int = 0
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
            gaps=self.gaps,
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
            "gaps": self.gaps,
            "broker_losses": self.broker_losses,
            "broker_recoveries": self.broker_recoveries,
            "slow_episodes": self.slow_episodes,
            "reader_errors": self.reader_errors,
        }


_MAX_SEQ_KEYS = 1 << 16


def _expire(fut: asyncio.Future[Message], topic: str, timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(DeadlineExceeded(topic, timeout_s))


class Bus:
    """An asyncio bus client attached to one broker.

    Usage::

        async with Bus("tcp://127.0.0.1:5555", name="passive") as bus:
            await bus.subscribe("grad/run1/7")
            await bus.publish("emb/run1/7", [embedding])
            msg = await bus.next("grad/run1/7", timeout_s=10.0)

    Args:
        address: broker base address ``tcp://HOST:PORT`` (str or :class:`BrokerAddress`).
        name: client name, used in logs and as the publisher id prefix.
        config: :class:`BusConfig`.
        security: CURVE keys (:class:`~pubsub.security.CurveClient`). With them the
            client first says ``hello`` on the broker's control socket (authenticated;
            a refused key or a wrong pinned broker key raises
            :class:`~pubsub.errors.AuthenticationFailed` within ``connect_timeout_s``),
            learns its role's endpoints and topic rules, and encrypts every socket.
            Publishing or subscribing outside the role's rules raises
            :class:`~pubsub.errors.ForbiddenTopic`. None = plaintext, loopback only.

    Raises:
        pubsub.address.InvalidAddress: malformed address.
        InsecureTransport: ``security`` is None and the broker is not on loopback.
    """

    def __init__(
        self,
        address: str | BrokerAddress,
        *,
        name: str = "client",
        config: BusConfig | None = None,
        security: CurveClient | None = None,
    ) -> None:
        addr = address if isinstance(address, BrokerAddress) else BrokerAddress.parse(address)
        self.address = addr.for_connect()
        if security is None:
            check_insecure_allowed(self.address)
        self.security = security
        #: the broker's hello answer (identity, role, endpoints; role "" in plaintext),
        #: set by :meth:`connect`
        self.hello: Hello | None = None
        self._rules: RoleRules | None = None
        self._pub_ok: dict[str, bool] = {}
        self.config = config or BusConfig()
        self.name = name
        self.client_id = f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._limits = BufferLimits(
            max_msgs=self.config.topic_max_msgs, max_bytes=self.config.topic_max_bytes
        )
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket | None = None  # sync socket, loop thread only, NOBLOCK sends
        self._sub: zmq.Socket | None = None  # sync socket, drained by _on_readable
        self._sub_fd: int | None = None  # its ZMQ_FD, watched with loop.add_reader
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exact: set[str] = set()
        self._prefixes: dict[str, int] = {}
        self._buffers: dict[str, TopicBuffer[Message]] = {}
        self._topic_limits: dict[str, BufferLimits] = {}
        self._prefix_limits: dict[str, BufferLimits] = {}
        self._waiters: dict[str, deque[asyncio.Future[Message]]] = {}
        self._buffered_bytes = 0
        self._total_max_bytes = self.config.total_max_bytes
        self._pub_seq: dict[str, int] = {}
        self._recv_seq: dict[tuple[str, str], list[Any]] = {}
        self._recv_counts: dict[str, list[int]] = {}  # class -> [msgs, bytes] received
        self._stats = BusStats()
        self._slow_topics: set[str] = set()  # topics in a slow-consumer episode
        self._overflow_episode = False
        self._reject_episode = False
        self._closed = False
        self._connected = False
        self._broker_ok = False
        self._keepalive_task: asyncio.Task[None] | None = None
        self._threadsafe_tail: asyncio.Future[None] | None = None
        self._paused: Message | None = None  # block policy: the message the reader holds
        self._log = log.bind(client=self.client_id)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Bus:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open sockets, start the reader and complete the ready handshake.

        Raises:
            BrokerUnreachable: no probe came back within ``connect_timeout_s``.
            AuthenticationFailed: with CURVE, the broker refused this client's key or
                does not hold the pinned broker key.
            BusClosed: the client was closed.
        """
        if self._closed:
            raise BusClosed(self.client_id)
        if self._connected:
            return
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.asyncio.Context()
        # hello first (plaintext too): a handshake failure or a broker that is down is
        # reported before any data socket exists, so nothing queues meanwhile
        try:
            self.hello = await hello(self._ctx, self.address, self.security,
                                     client_id=self.client_id,
                                     timeout_s=cfg.connect_timeout_s)
        except BaseException:
            await self.close()
            raise
        self._rules = self.hello.rules
        pub_ep = self.address.endpoint(self.hello.pub_offset)
        sub_ep = self.address.endpoint(self.hello.sub_offset)
        if self.security is not None:
            self._log = self._log.bind(identity=self.hello.identity, role=self.hello.role)
        linger_ms = int(cfg.linger_s * 1000)
        pub = zmq.Socket(self._ctx, zmq.PUB)  # plain socket from the same context
        if self.security is not None:
            self.security.apply(pub)
        pub.setsockopt(zmq.LINGER, linger_ms)
        pub.setsockopt(zmq.SNDHWM, cfg.sndhwm)
        pub.setsockopt(zmq.RCVHWM, 0)  # inbound subscriptions: never capped
        if cfg.overflow == "block":
            pub.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue is EAGAIN, not a silent drop
        pub.connect(pub_ep)
        self._pub = pub
        sub = zmq.Socket(self._ctx, zmq.SUB)
        if self.security is not None:
            self.security.apply(sub)
        sub.setsockopt(zmq.LINGER, linger_ms)
        sub.setsockopt(zmq.RCVHWM, cfg.rcvhwm)
        # SNDHWM on a SUB bounds queued *subscriptions*; the default (1000) silently
        # caps how many topics reach the broker. Subscriptions are tiny: no bound.
        sub.setsockopt(zmq.SNDHWM, 0)
        sub.connect(sub_ep)
        self._sub = sub
        self._sub_fd = sub.getsockopt(zmq.FD)
        self._loop.add_reader(self._sub_fd, self._on_readable)
        self._schedule_drain()
        try:
            await self._handshake()
        except BaseException:
            await self.close()
            raise
        self._connected = True
        self._broker_ok = True
        if self.config.heartbeat_interval_s > 0:
            self._keepalive_task = asyncio.create_task(self._keepalive(),
                                                       name=f"bus-keepalive-{self.client_id}")
        self._log.debug("bus.connected", broker=str(self.address))

    @property
    def _probe_topic(self) -> str:
        return f"{PROBE_CLASS}/probe/{self.client_id}"

    async def _handshake(self) -> None:
        cfg = self.config
        probe = self._probe_topic
        await self.subscribe(probe, limits=BufferLimits(max_msgs=8, max_bytes=1 << 16))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.connect_timeout_s
        try:
            while True:
                self._send(probe, (), None, copy=True)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise BrokerUnreachable(str(self.address), cfg.connect_timeout_s)
                try:
                    await self.next(probe, timeout_s=min(cfg.probe_interval_s, remaining))
                    break
                except DeadlineExceeded:
                    continue
        finally:
            if not self._closed:
                await self.unsubscribe(probe)

    async def _keepalive(self) -> None:
        """Ping the broker's control socket every ``heartbeat_interval_s``; report outages
        and recoveries. The ping never shares the data path, so backpressure under the
        ``block`` policy is not mistaken for a dead broker."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        ping = b'{"cmd":"ping"}'
        req = None
        try:
            while True:
                t0 = loop.time()
                if req is None:
                    # a fresh REQ socket after any unanswered ping: no stale state machine
                    assert self._ctx is not None
                    req = self._ctx.socket(zmq.REQ)
                    req.setsockopt(zmq.LINGER, 0)
                    if self.security is not None:
                        self.security.apply(req)
                    req.connect(self.address.control_endpoint)
                await req.send(ping)
                answered = False
                if await req.poll(int(cfg.heartbeat_interval_s * 1000), zmq.POLLIN):
                    try:
                        await req.recv(zmq.NOBLOCK)
                        answered = True
                    except zmq.Again:
                        pass
                if not answered:
                    req.close(0)
                    req = None
                if answered:
                    last_ok = loop.time()
                    if not self._broker_ok:
                        self._broker_ok = True
                        self._stats.broker_recoveries += 1
                        self._log.warning("bus.broker_recovered", broker=str(self.address))
                elif self._broker_ok and loop.time() - last_ok > cfg.broker_timeout_s:
                    self._broker_ok = False
                    self._stats.broker_losses += 1
                    self._log.warning("bus.broker_lost", broker=str(self.address),
                                      silent_s=round(loop.time() - last_ok, 3))
                await asyncio.sleep(max(0.0, cfg.heartbeat_interval_s - (loop.time() - t0)))
        finally:
            if req is not None:
                req.close(0)

    @property
    def broker_ok(self) -> bool:
        """False while the keepalive sees no probe come back through the broker."""
        return self._broker_ok

    async def close(self) -> None:
        """Stop the reader, fail pending waiters with :class:`BusClosed`, close sockets.

        Idempotent; never hangs (LINGER bounds the flush to ``linger_s``).
        """
        if self._closed:
            return
        self._closed = True
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keepalive_task
        if self._sub_fd is not None and self._loop is not None:
            self._loop.remove_reader(self._sub_fd)  # before the socket (and its fd) goes
            self._sub_fd = None
        for dq in self._waiters.values():
            for fut in dq:
                if not fut.done():
                    fut.set_exception(BusClosed(self.client_id))
        self._waiters.clear()
        for sock in (self._sub, self._pub):
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.close(linger=int(self.config.linger_s * 1000))
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            await asyncio.to_thread(ctx.term)
        self._log.debug("bus.closed")

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    # ---------------------------------------------------------------- subscribe
    async def subscribe(self, topic: str, *, limits: BufferLimits | None = None) -> None:
        """Subscribe to exactly ``topic`` (no prefix matching).

        Args:
            topic: the exact topic.
            limits: bounds of this topic's buffer (default: from :class:`BusConfig`).

        Raises:
            InvalidTopic: bad topic.
            ForbiddenTopic: with CURVE, the role may not read ``topic``.
            BusClosed: closed client.
        """
        frame = topic_frame(topic)
        sock = self._require_sub()
        if self._rules is not None and not self._rules.may_read(topic):
            raise ForbiddenTopic(topic, self._rules.name, "subscribe")
        if limits is not None:
            self._topic_limits[topic] = limits
        if topic not in self._exact:
            self._exact.add(topic)
            sock.setsockopt(zmq.SUBSCRIBE, frame)
            self._schedule_drain()

    async def subscribe_many(
        self, topics: Sequence[str], *, limits: BufferLimits | None = None
    ) -> None:
        """Subscribe to each topic exactly (see :meth:`subscribe`)."""
        for t in topics:
            await self.subscribe(t, limits=limits)

    async def subscribe_prefix(self, prefix: str, *, limits: BufferLimits | None = None) -> None:
        """Subscribe to every topic that starts with ``prefix``.

        Messages are still buffered and waited for per exact topic; each such
        topic's buffer gets ``limits`` (default: from :class:`BusConfig`).

        Raises:
            InvalidTopic: bad prefix.
            ForbiddenTopic: with CURVE, the role may read no topic under ``prefix``.
            BusClosed: closed client.
        """
        raw = validate_topic(prefix)
        sock = self._require_sub()
        if self._rules is not None and not self._rules.may_subscribe_prefix(prefix):
            raise ForbiddenTopic(prefix, self._rules.name, "subscribe")
        if limits is not None:
            self._prefix_limits[prefix] = limits
        if prefix not in self._prefixes:
            self._prefixes[prefix] = len(raw)
            sock.setsockopt(zmq.SUBSCRIBE, raw)
            self._schedule_drain()

    async def unsubscribe(self, topic: str) -> None:
        """Drop an exact subscription; messages still buffered for it are discarded."""
        sock = self._require_sub()
        if topic in self._exact:
            self._exact.discard(topic)
            self._topic_limits.pop(topic, None)
            sock.setsockopt(zmq.UNSUBSCRIBE, topic_frame(topic))
            self._schedule_drain()
            if not self._covered_by_prefix(topic):
                self._drop_buffer(topic)

    async def unsubscribe_prefix(self, prefix: str) -> None:
        """Drop a prefix subscription; buffers of topics no longer covered are discarded."""
        sock = self._require_sub()
        self._prefix_limits.pop(prefix, None)
        if self._prefixes.pop(prefix, None) is not None:
            sock.setsockopt(zmq.UNSUBSCRIBE, prefix.encode())
            self._schedule_drain()
            for topic in [t for t in self._buffers if t.startswith(prefix)]:
                if topic not in self._exact and not self._covered_by_prefix(topic):
                    self._drop_buffer(topic)

    def _covered_by_prefix(self, topic: str) -> bool:
        return any(topic.startswith(p) for p in self._prefixes)

    def _drop_buffer(self, topic: str) -> None:
        buf = self._buffers.pop(topic, None)
        if buf is not None:
            self._buffered_bytes -= buf.nbytes
            buf.clear()

    def _require_sub(self) -> zmq.Socket:
        if self._closed or self._sub is None:
            raise BusClosed(self.client_id)
        return self._sub

    # ------------------------------------------------------------------ publish
    async def publish(
        self,
        topic: str,
        arrays: Sequence[Any] = (),
        meta: Mapping[str, Any] | None = None,
        *,
        copy: bool = True,
    ) -> int:
        """Publish one envelope; returns its size on the wire in bytes.

        Args:
            topic: exact topic.
            arrays: payload arrays (numpy, or CPU tensors without grad).
            meta: JSON-serialisable metadata.
            copy: see :func:`pubsub.codec.encode`; pass False to hand ownership of
                large arrays to the bus (zero-copy; do not mutate them afterwards).

        Raises:
            InvalidTopic, TypeError: bad topic, dtype or meta.
            ForbiddenTopic: with CURVE, the role may not publish ``topic``.
            BusClosed: closed client.
            PublishTimeout: under the ``block`` policy, no room within ``publish_timeout_s``.
        """
        frames, nbytes = self._encode(topic, arrays, meta, copy=copy)
        if not self._try_send(frames):  # only under the block policy (XPUB_NODROP)
            if copy:  # we send after returning to the loop: own the payload now
                frames = [memoryview(f.copy()) if type(f) is np.ndarray else f for f in frames]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.config.publish_timeout_s
            pause = 0.0002
            while not self._try_send(frames):
                if loop.time() >= deadline:
                    raise PublishTimeout(topic, self.config.publish_timeout_s)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.01)
        return self._account(topic, nbytes)

    def publish_nowait(
        self,
        topic: str,
        arrays: Sequence[Any] = (),
        meta: Mapping[str, Any] | None = None,
        *,
        copy: bool = True,
    ) -> int:
        """Synchronous :meth:`publish` for the event-loop thread (same arguments and errors).

        Raises:
            PublishWouldBlock: under the ``block`` policy, the send queue is full.
        """
        return self._send(topic, arrays, meta, copy=copy)

    def publish_threadsafe(
        self,
        topic: str,
        arrays: Sequence[Any] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Publish from another thread: arrays are copied now, sent on the loop thread.

        Errors raised while sending are logged (``bus.publish_failed``), not raised.
        """
        if self._loop is None or self._closed:
            raise BusClosed(self.client_id)
        validate_topic(topic)
        arrays = [np.array(a, copy=True) for a in arrays]
        meta = dict(meta) if meta else None

        async def _go() -> None:
            try:
                await self.publish(topic, arrays, meta, copy=False)
            except Exception as exc:  # noqa: BLE001 - reported, loop must survive
                self._log.warning("bus.publish_failed", topic=topic, error=repr(exc))

        if self.config.overflow == "block":
            # waits for room in order: the thread's messages are chained on one future
            asyncio.run_coroutine_threadsafe(self._chain_threadsafe(_go), self._loop)
            return

        def _go_now() -> None:
            try:
                self._send(topic, arrays, meta, copy=False)
            except Exception as exc:  # noqa: BLE001 - reported, loop must survive
                self._log.warning("bus.publish_failed", topic=topic, error=repr(exc))

        self._loop.call_soon_threadsafe(_go_now)

    async def _chain_threadsafe(self, go: Any) -> None:
        """Run thread-submitted publishes one after another (keeps their order under block)."""
        prev = self._threadsafe_tail
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._threadsafe_tail = done
        try:
            if prev is not None:
                await prev
            await go()
        finally:
            done.set_result(None)

    def _encode(self, topic: str, arrays: Sequence[Any], meta: Mapping[str, Any] | None, *,
                copy: bool) -> tuple[list[Any], int]:
        """Frames and their total size in bytes; advances the topic's sequence number."""
        if self._closed or self._pub is None:
            raise BusClosed(self.client_id)
        if self._rules is not None and not self._may_publish(topic):
            raise ForbiddenTopic(topic, self._rules.name, "publish")
        pub_seq = self._pub_seq
        seq = pub_seq.get(topic, 0) + 1
        frames = encode(topic, arrays, meta, seq=seq, publisher=self.client_id, copy=copy)
        if seq == 1 and len(pub_seq) >= _MAX_SEQ_KEYS:
            pub_seq.clear()  # bounded; a restarted count is not a gap (seq 1 resets)
        pub_seq[topic] = seq  # a message that is never sent shows as a gap downstream
        nbytes = len(frames[0])
        for f in frames[1:]:
            nbytes += f.nbytes
        return frames, nbytes

    def _may_publish(self, topic: str) -> bool:
        """The role's publish rule for ``topic`` (cached per topic, bounded)."""
        ok = self._pub_ok.get(topic)
        if ok is None:
            assert self._rules is not None
            ok = self._rules.may_publish(topic)
            if len(self._pub_ok) >= _MAX_SEQ_KEYS:
                self._pub_ok.clear()
            self._pub_ok[topic] = ok
        return ok

    def _try_send(self, frames: list[Any]) -> bool:
        pub = self._pub
        if self._closed or pub is None:
            raise BusClosed(self.client_id)
        try:
            if len(frames) == 1:
                _send(pub, frames[0], _NOBLOCK, True, False)
            else:
                send_envelope(pub, frames, _NOBLOCK)
        except zmq.Again:
            return False
        return True

    def _send(
        self, topic: str, arrays: Sequence[Any], meta: Mapping[str, Any] | None, *, copy: bool
    ) -> int:
        frames, nbytes = self._encode(topic, arrays, meta, copy=copy)
        if not self._try_send(frames):
            raise PublishWouldBlock(topic)
        return self._account(topic, nbytes)

    def _account(self, topic: str, nbytes: int) -> int:
        cls = topic[:topic.find("/")] if "/" in topic else topic
        st = self._stats
        sent_msgs = st.sent_msgs
        sent_msgs[cls] = sent_msgs.get(cls, 0) + 1
        st.sent_bytes[cls] = st.sent_bytes.get(cls, 0) + nbytes
        return nbytes

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

    # ------------------------------------------------------------------ reader
    def _schedule_drain(self) -> None:
        """Drain on the next loop iteration (after a burst, a resume, or a socket
        operation that may have consumed the ZMQ_FD edge)."""
        if not self._drain_scheduled and self._loop is not None and not self._closed:
            self._drain_scheduled = True
            self._loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        """The reader: an event-loop callback on the SUB socket's ZMQ_FD.

        ZMQ_FD is edge-like: it signals "something changed", so this drains with
        non-blocking receives until EAGAIN (or ``drain_burst`` messages, then yields
        one loop iteration and continues). No task, no future per message: one
        callback per wake-up, and a waiting :meth:`next` is resolved directly.
        Under the ``block`` policy a held message stops the drain until
        :meth:`_unpause` resumes it.
        """
        self._drain_scheduled = False
        sub = self._sub
        if sub is None or self._closed or self._paused is not None:
            return
        on_frames = self._on_frames
        try:
            for _ in range(self.config.drain_burst):
                try:
                    f = _recv(sub, _NOBLOCK, True, False)  # frame 0 as bytes
                except zmq.Again:
                    return
                try:
                    on_frames(recv_rest(sub, f) if _get(sub, _RCVMORE) else (f,))
                except Exception as exc:  # noqa: BLE001 - the reader must outlive any bug
                    # an exception escaping this callback would leave the socket holding
                    # messages with its edge-like ZMQ_FD already consumed: a silent stall
                    self._reader_error(exc)
                if self._paused is not None:
                    return
            self._schedule_drain()  # burst used up: let waiters run, then go on
        except zmq.ZMQError as exc:
            if not self._closed:
                self._log.error("bus.reader_failed", error=repr(exc))

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
        # per-(publisher, topic) state: [last seq, the class's [msgs, bytes] counter]
        key = (msg.publisher, topic)
        state = self._recv_seq.get(key)
        seq = msg.seq
        if state is None:
            state = self._new_recv_state(key, topic)
        elif seq > state[0] + 1:
            self._stats.gaps += seq - state[0] - 1
        state[0] = seq
        counts = state[1]
        counts[0] += 1
        counts[1] += msg.nbytes
        self._deliver(msg)

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
