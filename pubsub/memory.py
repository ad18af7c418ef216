"""An in-process bus: :class:`MemoryBroker` (the hub) and :class:`MemoryBus` (its client).

For tests and single-process simulations that want the bus's semantics without
sockets or a broker process. :class:`MemoryBus` has the public surface of
:class:`pubsub.client.Bus` (both satisfy :class:`pubsub.transport.Transport`) and
shares its receive side (:class:`pubsub.receiver.Receiver`): exact and prefix
subscriptions, per-topic bounded buffers with the same :class:`BufferLimits`, FIFO
eviction and counters (:class:`BusStats`), ``next`` deadlines that never lose a
message, ``try_next``/``unget``/``pending``, the ``drop`` and ``block`` overflow
policies, :class:`BusClosed` after an idempotent ``close``.

How it maps the real path:

* **Envelopes are encoded and decoded** with :mod:`pubsub.codec`, so topics, metadata
  and dtypes are validated as on the wire, and ``Message.nbytes`` is the wire size.
* **Payloads are copied once, at publish** (whatever ``copy`` says): every receiver
  decodes read-only views over that one immutable copy, and never aliases the
  publisher's arrays. A receiver must copy before mutating, as with :class:`Bus`.
* **Delivery goes through the event loop**: a publish appends to each matching
  client's inbox (the SUB socket's queue, bounded by ``BusConfig.rcvhwm``) and that
  client drains it in a ``call_soon`` callback (at most ``drain_burst`` per turn), so
  a publisher never runs a receiver's code and ordering per (publisher, topic) holds.
* **The hub** matches subscriptions when a message is published (as the broker's
  XPUB filter does) and drops messages over ``max_message_bytes`` (counted in
  :class:`MemoryBrokerStats`; receivers see the hole as a sequence gap, as with the
  broker). Under ``drop`` a full inbox drops the message (a gap, like a ZeroMQ
  high-water mark); under ``block`` a publisher waits for room in every matching
  inbox (``publish``, up to ``publish_timeout_s``) or gets :class:`PublishWouldBlock`
  (``publish_nowait``).

Not modelled: CURVE and broker policy (``hello`` is None, nothing is forbidden), the
broker keepalive (``broker_ok`` is True until the hub closes), connect timeouts.
Closing the hub closes its clients. All clients of one hub share one event loop.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from pubsub.buffer import BufferLimits
from pubsub.client import BusConfig
from pubsub.codec import encode, topic_frame, validate_topic
from pubsub.errors import (
    BusClosed,
    MessageTooLarge,
    PublishTimeout,
    PublishWouldBlock,
)
from pubsub.threadsafe import ThreadsafePublisher
from pubsub.receiver import _MAX_SEQ_KEYS, Receiver

log = structlog.get_logger(__name__)


@dataclass(slots=True, kw_only=True)
class MemoryBrokerStats:
    """Counters of a :class:`MemoryBroker`.

    Attributes:
        forwarded: messages placed in a client's inbox (one per receiving client).
        rejected: messages over ``max_message_bytes``, dropped at the hub.
        hwm_dropped: messages dropped because a client's inbox was full (``drop``).
        clients: clients attached now.
    """

    forwarded: int = 0
    rejected: int = 0
    hwm_dropped: int = 0
    clients: int = 0


class MemoryBroker:
    """An in-process hub for :class:`MemoryBus` clients.

    Usage::

        async with MemoryBroker() as hub:
            async with hub.connect("a") as a, hub.connect("b") as b:
                await b.subscribe("t")
                await a.publish("t", [np.arange(3)])
                msg = await b.next("t", timeout_s=1.0)

    Args:
        max_message_bytes: larger messages are dropped at the hub and counted, like the
            broker's bound of the same name (bytes, >= 1).

    Raises:
        ValueError: ``max_message_bytes`` < 1.
    """

    def __init__(self, *, max_message_bytes: int = 64 << 20) -> None:
        if max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {max_message_bytes!r}")
        self.max_message_bytes = max_message_bytes
        self._clients: list[MemoryBus] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats = MemoryBrokerStats()
        self._closed = False

    async def __aenter__(self) -> MemoryBroker:
        self._loop = asyncio.get_running_loop()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def connect(self, name: str = "client", *, config: BusConfig | None = None) -> MemoryBus:
        """A new, not yet connected client; use ``async with hub.connect(name) as bus``."""
        return MemoryBus(self, name=name, config=config)

    async def close(self) -> None:
        """Close every client; later connects raise :class:`BusClosed`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for c in list(self._clients):
            await c.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def stats(self) -> MemoryBrokerStats:
        """A snapshot of the hub's counters."""
        st = self._stats
        return MemoryBrokerStats(forwarded=st.forwarded, rejected=st.rejected,
                                 hwm_dropped=st.hwm_dropped, clients=len(self._clients))

    # ----------------------------------------------------------- for MemoryBus
    def _attach(self, bus: MemoryBus) -> None:
        if self._closed:
            raise BusClosed("memory broker")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("all clients of a MemoryBroker must run on one event loop")
        self._clients.append(bus)

    def _detach(self, bus: MemoryBus) -> None:
        for i, c in enumerate(self._clients):
            if c is bus:
                del self._clients[i]
                return

    def _receivers(self, topic: str) -> list[MemoryBus]:
        return [c for c in self._clients if c._wants(topic)]

    def _has_room(self, topic: str) -> bool:
        """``block``: does every client subscribed to ``topic`` have inbox room?"""
        return all(c._inbox_room() for c in self._receivers(topic))

    def _route(self, topic: str, frames: tuple[Any, ...], nbytes: int) -> None:
        """Place one envelope in each subscribed client's inbox (or count its drop)."""
        if nbytes > self.max_message_bytes:
            self._stats.rejected += 1
            log.warning("memory_broker.rejected", topic=topic, nbytes=nbytes,
                        max_message_bytes=self.max_message_bytes)
            return
        st = self._stats
        for c in self._receivers(topic):
            if c._inbox_put(frames):
                st.forwarded += 1
            else:
                st.hwm_dropped += 1


class MemoryBus(Receiver, ThreadsafePublisher):
    """A client of a :class:`MemoryBroker` with the public surface of :class:`Bus`.

    Args:
        hub: the :class:`MemoryBroker`.
        name: client name (logs, publisher id prefix).
        config: :class:`BusConfig`; used: ``topic_max_msgs``, ``topic_max_bytes``,
            ``total_max_bytes``, ``rcvhwm`` (inbox bound, messages; 0: none), ``drain_burst``,
            ``overflow``, ``publish_timeout_s``. The socket and keepalive settings do
            not apply.
    """

    def __init__(self, hub: MemoryBroker, *, name: str = "client",
                 config: BusConfig | None = None) -> None:
        self.hub = hub
        self.config = config or BusConfig()
        self.name = name
        self.client_id = f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        #: the id in this client's envelopes (no identities in memory: the client id)
        self.publisher_id = self.client_id
        #: always None: the memory hub has no CURVE hello
        self.hello = None
        self._init_receiver(BufferLimits(max_msgs=self.config.topic_max_msgs,
                                         max_bytes=self.config.topic_max_bytes),
                            self.config.total_max_bytes)
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._inbox_max = max(1, self.config.rcvhwm) if self.config.rcvhwm else 1 << 62
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pub_seq: dict[str, int] = {}
        self._threadsafe_tail: asyncio.Future[None] | None = None
        self._connected = False
        self._log = log.bind(client=self.client_id)

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> MemoryBus:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Attach to the hub (idempotent).

        Raises:
            BusClosed: this client or the hub is closed.
        """
        if self._closed:
            raise BusClosed(self.client_id)
        if self._connected:
            return
        self._loop = asyncio.get_running_loop()
        self.hub._attach(self)
        self._connected = True
        self._log.debug("bus.connected", broker="memory")

    async def close(self) -> None:
        """Detach, fail pending waiters with :class:`BusClosed`, drop the inbox. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.hub._detach(self)
        self._inbox.clear()
        self._fail_waiters()
        self._log.debug("bus.closed")

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def broker_ok(self) -> bool:
        """True while the hub is open."""
        return not self.hub.closed

    # ---------------------------------------------------------------- subscribe
    async def subscribe(self, topic: str, *, limits: BufferLimits | None = None) -> None:
        """Subscribe to exactly ``topic`` (see :meth:`pubsub.client.Bus.subscribe`)."""
        topic_frame(topic)
        self._require_open()
        if limits is not None:
            self._topic_limits[topic] = limits
        self._exact.add(topic)

    async def subscribe_many(self, topics: Sequence[str], *,
                             limits: BufferLimits | None = None) -> None:
        """Subscribe to each topic exactly."""
        for t in topics:
            await self.subscribe(t, limits=limits)

    async def subscribe_prefix(self, prefix: str, *, limits: BufferLimits | None = None) -> None:
        """Subscribe to every topic starting with ``prefix`` (buffered per exact topic)."""
        raw = validate_topic(prefix)
        self._require_open()
        if limits is not None:
            self._prefix_limits[prefix] = limits
        self._prefixes.setdefault(prefix, len(raw))

    async def unsubscribe(self, topic: str) -> None:
        """Drop an exact subscription; messages still buffered for it are discarded."""
        self._require_open()
        if topic in self._exact:
            self._exact.discard(topic)
            self._topic_limits.pop(topic, None)
            if not self._covered_by_prefix(topic):
                self._drop_buffer(topic)

    async def unsubscribe_prefix(self, prefix: str) -> None:
        """Drop a prefix subscription; buffers of topics no longer covered are discarded."""
        self._require_open()
        self._prefix_limits.pop(prefix, None)
        if self._prefixes.pop(prefix, None) is not None:
            for topic in [t for t in self._buffers if t.startswith(prefix)]:
                if topic not in self._exact and not self._covered_by_prefix(topic):
                    self._drop_buffer(topic)

    def _require_open(self) -> None:
        if self._closed or not self._connected:
            raise BusClosed(self.client_id)

    # ------------------------------------------------------------------ publish
    async def publish(self, topic: str, arrays: Sequence[Any] = (),
                      meta: Mapping[str, Any] | None = None, *, copy: bool = True) -> int:
        """Publish one envelope; returns its wire size in bytes.

        ``copy`` is accepted for compatibility: the payload is always copied once.

        Raises:
            InvalidTopic, TypeError: bad topic, dtype or meta.
            BusClosed: closed client.
            PublishTimeout: under ``block``, no inbox room within ``publish_timeout_s``.
        """
        frames, nbytes = self._encode(topic, arrays, meta)
        hub = self.hub
        if self.config.overflow == "block" and not hub._has_room(topic):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.config.publish_timeout_s
            pause = 0.0002
            while not hub._has_room(topic):
                if loop.time() >= deadline:
                    raise PublishTimeout(topic, self.config.publish_timeout_s)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.01)
                self._require_open()
        hub._route(topic, frames, nbytes)
        return self._account(topic, nbytes)

    def publish_nowait(self, topic: str, arrays: Sequence[Any] = (),
                       meta: Mapping[str, Any] | None = None, *, copy: bool = True) -> int:
        """Synchronous :meth:`publish` (same arguments and errors).

        Raises:
            PublishWouldBlock: under ``block``, a subscriber's inbox is full.
        """
        frames, nbytes = self._encode(topic, arrays, meta)
        if self.config.overflow == "block" and not self.hub._has_room(topic):
            raise PublishWouldBlock(topic)
        self.hub._route(topic, frames, nbytes)
        return self._account(topic, nbytes)

    async def _publish_waiting(self, topic: str, arrays: Sequence[Any],
                               meta: dict[str, Any] | None) -> None:
        await self.publish(topic, arrays, meta)

    def _publish_at_once(self, topic: str, arrays: Sequence[Any],
                         meta: dict[str, Any] | None) -> None:
        self.publish_nowait(topic, arrays, meta)

    def _encode(self, topic: str, arrays: Sequence[Any],
                meta: Mapping[str, Any] | None) -> tuple[tuple[Any, ...], int]:
        """Frames as immutable ``bytes`` (the one copy) and their size; advances the seq."""
        if self._closed or not self._connected:
            raise BusClosed(self.client_id)
        seq = self._pub_seq.get(topic, 0) + 1
        raw = encode(topic, arrays, meta, seq=seq, publisher=self.publisher_id, copy=True)
        nbytes = sum(memoryview(f).nbytes for f in raw)
        if nbytes > self.config.max_message_bytes:  # nothing sent, the seq not used
            raise MessageTooLarge(nbytes, self.config.max_message_bytes)
        frames = tuple(f if type(f) is bytes else bytes(memoryview(f)) for f in raw)
        if seq == 1 and len(self._pub_seq) >= _MAX_SEQ_KEYS:
            self._pub_seq.clear()
        self._pub_seq[topic] = seq
        return frames, nbytes

    # ------------------------------------------------------------------ reader
    def _wants(self, topic: str) -> bool:
        """Does this client's subscription set match ``topic`` (the hub's filter)?"""
        return not self._closed and (topic in self._exact or self._covered_by_prefix(topic))

    def _inbox_room(self) -> bool:
        return len(self._inbox) < self._inbox_max

    def _inbox_put(self, frames: tuple[Any, ...]) -> bool:
        """Queue one envelope for the reader; False (dropped) if the inbox is full."""
        if len(self._inbox) >= self._inbox_max:
            return False
        self._inbox.append(frames)
        self._schedule_drain()
        return True

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled and self._loop is not None and not self._closed:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """The reader: decode and accept up to ``drain_burst`` envelopes per loop turn;
        stops while the ``block`` policy holds a message."""
        self._drain_scheduled = False
        inbox = self._inbox
        for _ in range(self.config.drain_burst):
            if self._closed or self._paused is not None or not inbox:
                return
            try:
                self._on_frames(inbox.popleft())
            except Exception as exc:  # noqa: BLE001 - the reader must outlive any bug
                self._reader_error(exc)
        if inbox:
            self._schedule_drain()


__all__ = ["MemoryBroker", "MemoryBrokerStats", "MemoryBus"]
