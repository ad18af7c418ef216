"""The bus client: one publisher socket, one subscriber socket, bounded per-topic buffers.

Design (its throughput against raw pyzmq and ``zmq.proxy``: ``bench/bus.py``,
docs/benchmarks.md):

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
import zmq
import zmq.asyncio
from zmq.backend import Socket as _Backend

from pubsub.address import BrokerAddress
from pubsub.buffer import BufferLimits
from pubsub.codec import encode, topic_frame, validate_topic
from pubsub.control import Hello, hello
from pubsub.keepalive import BrokerKeepalive
from pubsub.threadsafe import ThreadsafePublisher
from pubsub.receiver import _MAX_SEQ_KEYS, Receiver
from pubsub.receiver import BusStats as BusStats  # re-exported: its home before receiver.py
from pubsub.membership import subscription_run, topic_run
from pubsub.policy import RoleRules
from pubsub.security import CurveClient, check_insecure_allowed, publisher_id
from pubsub.wire import recv_rest, send_envelope
from pubsub.errors import (
    BrokerUnreachable,
    BusClosed,
    DeadlineExceeded,
    ForbiddenTopic,
    ForkedClient,
    MessageTooLarge,
    NotRunMember,
    PublishTimeout,
    PublishWouldBlock,
    TooManySubscriptions,
)

log = structlog.get_logger(__name__)

#: bumped in every forked child (os.register_at_fork): a client compares it with the value
#: at its creation, so the per-message ownership check needs no getpid() system call
_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

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
        max_message_bytes: a publication larger than this, or than the broker's own
            ``max_message_bytes`` (64 MiB by default; the hello says it), raises
            :class:`pubsub.MessageTooLarge` before anything is sent.
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
    max_message_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {self.max_message_bytes!r}")
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



def _data_sockets(ctx: zmq.asyncio.Context, pub_ep: str, sub_ep: str, cfg: BusConfig,
                  security: CurveClient | None) -> tuple[zmq.Socket, zmq.Socket]:
    """A client's PUB and SUB sockets, configured (LINGER, high-water marks, CURVE) and
    connected to the broker's endpoints for its role."""
    linger_ms = int(cfg.linger_s * 1000)
    pub = zmq.Socket(ctx, zmq.PUB)  # plain socket from the same context
    if security is not None:
        security.apply(pub)
    pub.setsockopt(zmq.LINGER, linger_ms)
    pub.setsockopt(zmq.SNDHWM, cfg.sndhwm)
    pub.setsockopt(zmq.RCVHWM, 0)  # inbound subscriptions: never capped
    if cfg.overflow == "block":
        pub.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue is EAGAIN, not a silent drop
    pub.connect(pub_ep)
    sub = zmq.Socket(ctx, zmq.SUB)
    if security is not None:
        security.apply(sub)
    sub.setsockopt(zmq.LINGER, linger_ms)
    sub.setsockopt(zmq.RCVHWM, cfg.rcvhwm)
    # SNDHWM on a SUB bounds queued *subscriptions*; the default (1000) silently
    # caps how many topics reach the broker. Subscriptions are tiny: no bound.
    sub.setsockopt(zmq.SNDHWM, 0)
    sub.connect(sub_ep)
    return pub, sub


class Bus(Receiver, ThreadsafePublisher):
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
        #: the bound this client enforces: its config's, lowered to the broker's (hello)
        self._max_bytes = self.config.max_message_bytes
        self.name = name
        self._pid = os.getpid()  # the owner: a forked child may not use the sockets
        self._fork_generation = _fork_generation
        self.client_id = f"{name}-{self._pid}-{uuid.uuid4().hex[:8]}"
        #: the id in this client's envelopes: ``client_id`` in plaintext, with CURVE
        #: ``<identity>/<client_id>`` once connected (:func:`pubsub.security.publisher_id`)
        self.publisher_id = self.client_id
        self._init_receiver(
            BufferLimits(max_msgs=self.config.topic_max_msgs,
                         max_bytes=self.config.topic_max_bytes),
            self.config.total_max_bytes)
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket | None = None  # sync socket, loop thread only, NOBLOCK sends
        self._sub: zmq.Socket | None = None  # sync socket, drained by _on_readable
        self._sub_fd: int | None = None  # its ZMQ_FD, watched with loop.add_reader
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pub_seq: dict[str, int] = {}
        self._connected = False
        self._keepalive: BrokerKeepalive | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self._threadsafe_tail: asyncio.Future[None] | None = None
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
        if 0 < self.hello.max_message_bytes < self._max_bytes:
            # the broker's bound is lower: refuse here, by name, what it would refuse
            # (one frame above it would close this client's connection)
            self._max_bytes = self.hello.max_message_bytes
        pub_ep = self.address.endpoint(self.hello.pub_offset)
        sub_ep = self.address.endpoint(self.hello.sub_offset)
        if self.security is not None:
            self._log = self._log.bind(identity=self.hello.identity, role=self.hello.role)
            if self.hello.identity:
                self.publisher_id = publisher_id(self.hello.identity, self.client_id)
        pub, sub = _data_sockets(self._ctx, pub_ep, sub_ep, cfg, self.security)
        self._pub, self._sub = pub, sub
        self._sub_fd = sub.getsockopt(zmq.FD)
        self._loop.add_reader(self._sub_fd, self._on_readable)
        self._schedule_drain()
        try:
            await self._handshake()
        except BaseException:
            await self.close()
            raise
        self._connected = True
        if self.config.heartbeat_interval_s > 0:
            self._keepalive = BrokerKeepalive(
                self._ctx, self.address, security=self.security,
                interval_s=self.config.heartbeat_interval_s,
                timeout_s=self.config.broker_timeout_s, stats=self._stats, log=self._log)
            self._keepalive_task = asyncio.create_task(self._keepalive.run(),
                                                       name=f"bus-keepalive-{self.client_id}")
        self._log.debug("bus.connected", broker=str(self.address))

    async def _handshake(self) -> None:
        cfg = self.config
        probe = f"{PROBE_CLASS}/probe/{self.client_id}"
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

    @property
    def broker_ok(self) -> bool:
        """False while the keepalive sees no ping answered by the broker."""
        return self._keepalive is None or self._keepalive.ok

    async def close(self) -> None:
        """Stop the reader, fail pending waiters with :class:`BusClosed`, close sockets.

        Idempotent; never hangs (LINGER bounds the flush to ``linger_s``).
        """
        if self._closed:
            return
        self._closed = True
        if self._fork_generation != _fork_generation:  # a forked child: the parent's sockets
            self._log.warning("bus.close_in_forked_child", owner_pid=self._pid,
                              pid=os.getpid())
            return
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keepalive_task
        if self._sub_fd is not None and self._loop is not None:
            self._loop.remove_reader(self._sub_fd)  # before the socket (and its fd) goes
            self._sub_fd = None
        self._fail_waiters()
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
            ForbiddenTopic: with CURVE, the role may not read ``topic``;
                :class:`~pubsub.errors.NotRunMember` (a ForbiddenTopic): its run does not
                admit this identity (the broker's run membership).
            TooManySubscriptions: the broker's per-identity limit (from the hello) would
                be exceeded.
            BusClosed: closed client.
        """
        frame = topic_frame(topic)
        sock = self._require_sub()
        if self._rules is not None and not self._rules.may_read(topic):
            raise ForbiddenTopic(topic, self._rules.name, "subscribe")
        self._check_member(topic, exact=True)
        if limits is not None:
            self._topic_limits[topic] = limits
        if topic not in self._exact:
            self._check_subscription_limit(topic)
            self._exact.add(topic)
            sock.setsockopt(zmq.SUBSCRIBE, frame)
            self._schedule_drain()

    def _check_member(self, text: str, *, exact: bool) -> None:
        """Refuse, by name, a subscription the broker's run membership would silently
        refuse (a run this identity is not a member of; told in the hello)."""
        hello = self.hello
        if hello is None or hello.runs is None or hello.runs.may_read(hello.identity, text,
                                                                       exact):
            return
        _, run = subscription_run(text, exact)
        raise NotRunMember(text, run or "", hello.identity, "subscribe",
                           tuple(sorted(hello.runs.runs)))

    def _check_subscription_limit(self, topic: str) -> None:
        """Refuse, before the broker silently would, a subscription past its limit."""
        limit = self.hello.max_subscriptions if self.hello is not None else 0
        if limit and len(self._exact) + len(self._prefixes) >= limit:
            raise TooManySubscriptions(topic, limit)

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
            ForbiddenTopic: with CURVE, the role may read no topic under ``prefix``;
                :class:`~pubsub.errors.NotRunMember`: the prefix spans runs, or its run
                does not admit this identity.
            BusClosed: closed client.
        """
        raw = validate_topic(prefix)
        sock = self._require_sub()
        if self._rules is not None and not self._rules.may_subscribe_prefix(prefix):
            raise ForbiddenTopic(prefix, self._rules.name, "subscribe")
        self._check_member(prefix, exact=False)
        if limits is not None:
            self._prefix_limits[prefix] = limits
        if prefix not in self._prefixes:
            self._check_subscription_limit(prefix)
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

    def _check_owner(self) -> None:
        if self._fork_generation != _fork_generation:
            raise ForkedClient(self.client_id, self._pid, os.getpid())

    def _require_sub(self) -> zmq.Socket:
        self._check_owner()
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
            MessageTooLarge: over ``BusConfig.max_message_bytes`` (nothing was sent).
            ForbiddenTopic: with CURVE, the role may not publish ``topic``;
                :class:`~pubsub.errors.NotRunMember`: its run does not admit this identity.
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

    async def _publish_waiting(self, topic: str, arrays: Sequence[Any],
                               meta: dict[str, Any] | None) -> None:
        await self.publish(topic, arrays, meta, copy=False)

    def _publish_at_once(self, topic: str, arrays: Sequence[Any],
                         meta: dict[str, Any] | None) -> None:
        self._send(topic, arrays, meta, copy=False)

    def _encode(self, topic: str, arrays: Sequence[Any], meta: Mapping[str, Any] | None, *,
                copy: bool) -> tuple[list[Any], int]:
        """Frames and their total size in bytes; advances the topic's sequence number."""
        self._check_owner()
        if self._closed or self._pub is None:
            raise BusClosed(self.client_id)
        if self._rules is not None and not self._may_publish(topic):
            self._refuse_publish(topic)
        pub_seq = self._pub_seq
        seq = pub_seq.get(topic, 0) + 1
        frames = encode(topic, arrays, meta, seq=seq, publisher=self.publisher_id, copy=copy)
        nbytes = len(frames[0])
        for f in frames[1:]:
            nbytes += f.nbytes
        if nbytes > self._max_bytes:  # nothing sent, the seq not used
            raise MessageTooLarge(nbytes, self._max_bytes)
        if seq == 1 and len(pub_seq) >= _MAX_SEQ_KEYS:
            pub_seq.clear()  # bounded; a restarted count is not a gap (seq 1 resets)
        pub_seq[topic] = seq  # a message that is never sent shows as a gap downstream
        return frames, nbytes

    def _may_publish(self, topic: str) -> bool:
        """The role's publish rule and the run membership for ``topic`` (cached per
        topic, bounded)."""
        ok = self._pub_ok.get(topic)
        if ok is None:
            assert self._rules is not None
            hello = self.hello
            ok = self._rules.may_publish(topic) and (
                hello is None or hello.runs is None or hello.runs.allows(hello.identity, topic))
            if len(self._pub_ok) >= _MAX_SEQ_KEYS:
                self._pub_ok.clear()
            self._pub_ok[topic] = ok
        return ok

    def _refuse_publish(self, topic: str) -> None:
        """Raise the error that names why ``topic`` may not be published."""
        assert self._rules is not None
        if not self._rules.may_publish(topic) or self.hello is None or self.hello.runs is None:
            raise ForbiddenTopic(topic, self._rules.name, "publish")
        raise NotRunMember(topic, topic_run(topic) or "", self.hello.identity, "publish",
                           tuple(sorted(self.hello.runs.runs)))

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
