"""A shaping TCP relay per party link: latency, bandwidth, segment loss and disconnects.

This kernel has no ``netem``, so the heterogeneity simulator shapes a party's link
in user space: the party is given the relay's address instead of the broker's and
never imports ``sim``. A :class:`Relay` listens on one ephemeral port per upstream
(``HOST:PORT`` of the broker's XSUB, XPUB or control socket) and forwards every TCP
connection it accepts to that upstream, byte for byte.

The link model (:class:`LinkClock`)
-----------------------------------
All connections of one relay share ONE link with one clock per direction (up =
party -> broker, down = broker -> party):

* **Bandwidth** is a serialisation clock: a chunk of ``n`` bytes read at time
  ``now`` starts serialising at ``max(now, link_free_at)`` and occupies the link
  for ``n * 8 / bandwidth_bps`` seconds; connections queue FIFO behind each other
  (one bottleneck queue). ``bandwidth_bps`` counts TCP payload bytes only: the
  40-60 bytes of TCP/IP (and Ethernet) headers per segment of a real link are not
  charged, so a real 100 Mbit/s Ethernet carries about 3-5 % less payload than this
  model. A 64 KiB message thus takes 65 536 * 8 / 100e6 = 5.24 ms on 100 Mbit/s
  (plus ZeroMQ's few framing bytes).
* **Latency** ``latency_s`` is one-way and applies in each direction: a byte is
  delivered ``latency_s`` after its segment finished serialising (a round trip is
  ``2 * latency_s`` plus serialisation). The TCP handshakes between party and relay
  and between relay and broker are not delayed (they are local); ZeroMQ's own
  greeting/handshake bytes are, since they travel as data.
* **Loss** cannot drop bytes: ZeroMQ runs over a TCP stream, which would break.
  Instead the relay emulates what TCP does about a lost segment: the data is cut
  into ``mss_bytes`` segments; each transmission of a segment is lost with
  probability ``loss`` (independently, seeded by ``seed``), and each loss costs a
  retransmission timeout, doubling per consecutive loss of the same segment (TCP's
  exponential backoff): ``k`` losses delay the segment by ``rto * (2**k - 1)``.
  Because TCP delivers in order, a delayed segment holds back everything behind it
  on the same connection and direction (head-of-line blocking); other connections
  sharing the link are not held back (they are other TCP streams). Simplifications,
  stated honestly: real TCP often repairs a single loss in about one RTT by fast
  retransmit (three duplicate ACKs / SACK) rather than a full RTO, so this model is
  pessimistic for isolated losses in long transfers and about right for losses at
  the tail of a message (the common case for request/response traffic);
  retransmitted bytes do not consume extra bandwidth; and the congestion window
  does not shrink after a loss. The RTO is ``rto_s`` if given, else
  ``max(min_rto_s, 6 * latency_s)`` (three round trips; Linux' floor is 200 ms).

Timing accuracy: with the default asyncio loop a sleep ends up to ~1 ms late
(epoll timeouts are rounded up to whole milliseconds), so shaped transfers measure
on average ~0.5 ms longer than the model; uvloop's timers (``--loop auto``, the
CLI's default when uvloop is installed) are closer. Measured figures:
``bench/relay_check.py``.

Delivery granularity: the relay reads up to 64 KiB at a time and writes a chunk
when its last byte is due (store and forward per read chunk, split at lost
segments), so the last byte of a message arrives exactly when the model says and
earlier bytes of the same chunk arrive up to one chunk's serialisation late, which
ZeroMQ (whole messages) does not notice.

Buffering is bounded: per connection and direction at most ``buffer_bytes`` (+ one
read chunk) wait in the shaped queue; while it is full the relay stops reading from
the source socket, so TCP flow control pushes back to the sender.

Disconnects: :meth:`Relay.disconnect` aborts every current connection (both sides,
with RST) and, for ``duration_s`` seconds, accepts new connections and closes them
at once (the ports stay bound, so no other process can take them). ZeroMQ
reconnects by itself afterwards; bytes queued in the relay at the abort are lost,
as on a real broken link.

Command line: ``python -m sim.cluster.relay --upstream HOST:PORT ...`` (or ``--broker
tcp://HOST:PORT`` for the three consecutive broker ports); see :func:`main`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson
import structlog

log = structlog.get_logger(__name__)

READ_CHUNK = 65536
"""Largest chunk the relay reads from a socket at once (bytes)."""


class InvalidLinkSpec(ValueError):
    """A :class:`LinkSpec` field has an invalid value.

    Attributes:
        field: the field's name.
        value: the rejected value.
    """

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"invalid LinkSpec.{field}={value!r}: {reason}")


class RelayError(RuntimeError):
    """The relay could not start (no ports) or was used wrongly (unknown upstream)."""


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """The shape of one party's link.

    Attributes:
        latency_s: one-way latency in seconds, applied in each direction (>= 0).
        bandwidth_bps: link rate in bits per second of TCP payload, per direction;
            None = unlimited.
        loss: probability that one transmission of one segment is lost, 0 <= loss < 1.
        mss_bytes: segment size in bytes (default 1448, Ethernet with TCP timestamps).
        seed: seed of the loss draws (None = nondeterministic).
        min_rto_s: floor of the derived retransmission timeout in seconds (default 0.2).
        rto_s: retransmission timeout in seconds; None = ``max(min_rto_s, 6*latency_s)``.

    Raises:
        InvalidLinkSpec: a field is out of range or of the wrong type (names the value).
    """

    latency_s: float = 0.0
    bandwidth_bps: float | None = None
    loss: float = 0.0
    mss_bytes: int = 1448
    seed: int | None = None
    min_rto_s: float = 0.2
    rto_s: float | None = None

    def __post_init__(self) -> None:
        if not _finite(self.latency_s) or self.latency_s < 0:
            raise InvalidLinkSpec("latency_s", self.latency_s, "must be a finite number >= 0")
        if self.bandwidth_bps is not None and (
                not _finite(self.bandwidth_bps) or self.bandwidth_bps <= 0):
            raise InvalidLinkSpec("bandwidth_bps", self.bandwidth_bps,
                                  "must be a finite number > 0 or None (unlimited)")
        if not _finite(self.loss) or not 0 <= self.loss < 1:
            raise InvalidLinkSpec("loss", self.loss, "must be a probability in [0, 1)")
        if not isinstance(self.mss_bytes, int) or isinstance(self.mss_bytes, bool) \
                or self.mss_bytes < 1:
            raise InvalidLinkSpec("mss_bytes", self.mss_bytes, "must be an int >= 1")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise InvalidLinkSpec("seed", self.seed, "must be an int or None")
        if not _finite(self.min_rto_s) or self.min_rto_s <= 0:
            raise InvalidLinkSpec("min_rto_s", self.min_rto_s, "must be a finite number > 0")
        if self.rto_s is not None and (not _finite(self.rto_s) or self.rto_s <= 0):
            raise InvalidLinkSpec("rto_s", self.rto_s, "must be a finite number > 0 or None")

    @property
    def effective_rto_s(self) -> float:
        """Retransmission timeout in seconds: ``rto_s`` or ``max(min_rto_s, 6*latency_s)``."""
        if self.rto_s is not None:
            return float(self.rto_s)
        return max(self.min_rto_s, 6.0 * self.latency_s)

    def transfer_time_s(self, nbytes: int) -> float:
        """Model time in seconds for ``nbytes`` on an idle, lossless link: serialisation + latency."""
        tx = 0.0 if self.bandwidth_bps is None else nbytes * 8.0 / self.bandwidth_bps
        return tx + self.latency_s


class LinkClock:
    """One direction of a shaped link: serialisation clock, latency and loss draws.

    Pure (no I/O, no event loop): the caller passes the current time. Shared by all
    connections of a relay in that direction.

    Args:
        spec: the link shape.
        stream: name mixed into the seed so the two directions draw independently.
    """

    def __init__(self, spec: LinkSpec, *, stream: str = "up") -> None:
        self.spec = spec
        self._free_at = -math.inf
        self._rng = random.Random(None if spec.seed is None else f"{spec.seed}/{stream}")
        self.segments = 0
        self.segments_lost = 0
        self.bytes_scheduled = 0

    @property
    def free_at(self) -> float:
        """Time (seconds, caller's clock) at which the link finishes serialising its queue."""
        return self._free_at

    def _losses(self) -> int:
        k = 0
        while self._rng.random() < self.spec.loss:
            k += 1
        return k

    def schedule(self, nbytes: int, now: float, *,
                 not_before: float = -math.inf) -> list[tuple[float, int]]:
        """Put ``nbytes`` read at time ``now`` on the link.

        Args:
            nbytes: chunk size in bytes (>= 1).
            now: current time in seconds (any monotonic clock, the caller's).
            not_before: delivery floor in seconds (the previous chunk's delivery time
                on the same connection and direction: TCP delivers in order).

        Returns:
            ``[(deliver_at, nbytes), ...]`` pieces in order, whose sizes sum to
            ``nbytes`` and whose times are non-decreasing and >= ``not_before``; one
            piece without loss, split before each lost segment otherwise.

        Raises:
            ValueError: ``nbytes < 1``.
        """
        if nbytes < 1:
            raise ValueError(f"nbytes must be >= 1, got {nbytes}")
        spec = self.spec
        start = max(now, self._free_at)
        per_byte = 0.0 if spec.bandwidth_bps is None else 8.0 / spec.bandwidth_bps
        self._free_at = start + nbytes * per_byte
        self.bytes_scheduled += nbytes
        nseg = -(-nbytes // spec.mss_bytes)
        self.segments += nseg
        if spec.loss == 0.0:
            return [(max(self._free_at + spec.latency_s, not_before), nbytes)]
        rto = spec.effective_rto_s
        pieces: list[tuple[float, int]] = []
        cur_t, cur_n = not_before, 0
        sent = 0
        for _ in range(nseg):
            seg = min(spec.mss_bytes, nbytes - sent)
            sent += seg
            k = self._losses()
            arrival = start + sent * per_byte + spec.latency_s
            if k:
                self.segments_lost += k
                arrival += rto * (2 ** k - 1)
                if cur_n:
                    pieces.append((cur_t, cur_n))
                    cur_n = 0
            cur_t = max(cur_t, arrival)
            cur_n += seg
        pieces.append((cur_t, cur_n))
        return pieces


# ----------------------------------------------------------------------------- relay

def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Abort a transport with RST (SO_LINGER 0) so the peer sees a reset at once."""
    if writer is None:
        return
    if not writer.transport.is_closing():
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, ValueError):  # uvloop: fd may be gone already
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Pipe:
    """One direction of one connection: read -> shape -> bounded queue -> write."""

    def __init__(self, relay: Relay, clock: LinkClock, src: asyncio.StreamReader,
                 dst: asyncio.StreamWriter, direction: str) -> None:
        self.relay = relay
        self.clock = clock
        self.src = src
        self.dst = dst
        self.direction = direction
        self.queue: deque[tuple[float, bytes | None]] = deque()
        self.queued = 0
        self.last_t = -math.inf
        self.has_item = asyncio.Event()
        self.has_space = asyncio.Event()
        self.has_space.set()

    async def pump_in(self) -> None:
        loop = asyncio.get_running_loop()
        limit = self.relay.buffer_bytes
        while True:
            while self.queued >= limit:
                self.has_space.clear()
                await self.has_space.wait()
            data = await self.src.read(READ_CHUNK)
            if not data:
                self.queue.append((self.last_t, None))  # EOF after everything queued
                self.has_item.set()
                return
            view = memoryview(data)
            off = 0
            for t, n in self.clock.schedule(len(data), loop.time(), not_before=self.last_t):
                self.queue.append((t, view[off:off + n]))
                off += n
                self.last_t = t
            self.queued += len(data)
            self.relay._queue_delta(self.direction, len(data))
            self.has_item.set()

    async def pump_out(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.queue:
                self.has_item.clear()
                await self.has_item.wait()
            t, data = self.queue.popleft()
            delay = t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.dst.is_closing():
                raise ConnectionResetError("relay destination closed")
            if data is None:
                if self.dst.can_write_eof():
                    self.dst.write_eof()
                return
            self.dst.write(data)
            n = len(data)
            self.relay._count(self.direction, n)
            self.queued -= n
            self.relay._queue_delta(self.direction, -n)
            self.has_space.set()
            await self.dst.drain()


class Relay:
    """A shaping relay: one listening port per upstream, all sharing one :class:`LinkSpec` link.

    Use as ``async with Relay(routes, spec) as relay:``; give a party
    ``relay.endpoint_for(upstream)`` instead of the upstream's endpoint.

    Args:
        routes: upstreams to relay to, as ``{name: (host, port)}`` or a sequence of
            ``(host, port)`` (then named ``"host:port"``).
        spec: the link shape (one bandwidth budget per direction for all connections).
        listen_host: interface to listen on (default 127.0.0.1).
        contiguous: listen on consecutive ports in route order (needed when the
            party derives PORT+1 and PORT+2 from one broker address; see
            :meth:`for_broker`).
        buffer_bytes: shaped-queue bound per connection and direction in bytes
            (default 1 MiB); reading from the source stops while it is full.
        connect_timeout_s: timeout in seconds for connecting to the upstream.

    Raises:
        RelayError: no routes, or (on start) no free ports.
        InvalidLinkSpec: via ``spec``.
    """

    def __init__(self, routes: Mapping[str, tuple[str, int]] | Sequence[tuple[str, int]],
                 spec: LinkSpec, listen_host: str = "127.0.0.1", *,
                 contiguous: bool = False, buffer_bytes: int = 1 << 20,
                 connect_timeout_s: float = 5.0) -> None:
        if isinstance(routes, Mapping):
            items = [(str(k), (str(h), int(p))) for k, (h, p) in routes.items()]
        else:
            items = [(f"{h}:{int(p)}", (str(h), int(p))) for h, p in routes]
        if not items:
            raise RelayError("a relay needs at least one upstream")
        if buffer_bytes < 1:
            raise RelayError(f"buffer_bytes must be >= 1, got {buffer_bytes}")
        self.routes: dict[str, tuple[str, int]] = dict(items)
        self.spec = spec
        self.listen_host = listen_host
        self.contiguous = contiguous
        self.buffer_bytes = buffer_bytes
        self.connect_timeout_s = connect_timeout_s
        self._up = LinkClock(spec, stream="up")
        self._down_clock = LinkClock(spec, stream="down")
        self._servers: list[asyncio.Server] = []
        self._ports: dict[str, int] = {}
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        self._events: list[dict[str, Any]] = []
        self._bytes = {"up": 0, "down": 0}
        self._queued = {"up": 0, "down": 0}
        self._peak_queued = {"up": 0, "down": 0}
        self._connections = 0
        self._refused = 0
        self._disconnects = 0
        self._epoch = 0
        self._down_until = -math.inf
        self._is_down = False
        self._started = False
        self._closed = False

    @classmethod
    def for_broker(cls, address: str, spec: LinkSpec, listen_host: str = "127.0.0.1",
                   ports: int = 3, **kw: Any) -> Relay:
        """A relay for a whole broker ``tcp://HOST:PORT`` (its PORT .. PORT+ports-1: 3 in
        plaintext; a CURVE broker has two more per policy role).

        The relay listens on as many consecutive ports, so ``relay.broker_address``
        can be handed to a party as its ``--broker``. It relays bytes: CURVE runs end to
        end between the party and the broker.

        Raises:
            RelayError: ``address`` is not ``tcp://HOST:PORT``.
        """
        host, sep, port = address.removeprefix("tcp://").rpartition(":")
        if not address.startswith("tcp://") or not sep or not port.isdigit():
            raise RelayError(f"expected tcp://HOST:PORT, got {address!r}")
        host = host.strip("[]")
        p = int(port)
        if ports < 3:
            raise RelayError(f"a broker has at least 3 ports, got ports={ports}")
        routes = {"pub": (host, p), "sub": (host, p + 1), "control": (host, p + 2)}
        for k in range(3, ports):
            routes[f"port+{k}"] = (host, p + k)
        return cls(routes, spec, listen_host, contiguous=True, **kw)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Relay:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _bind(self) -> list[socket.socket]:
        family, _, _, _, addr = socket.getaddrinfo(
            self.listen_host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        n = len(self.routes)

        def listener(port: int) -> socket.socket:
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((addr[0], port, *addr[2:]))
                s.listen(128)
                s.setblocking(False)
            except OSError:
                s.close()
                raise
            return s

        if not self.contiguous:
            socks: list[socket.socket] = []
            try:
                for _ in range(n):
                    socks.append(listener(0))
            except OSError as e:
                for s in socks:
                    s.close()
                raise RelayError(f"cannot listen on {self.listen_host}: {e}") from e
            return socks
        for _ in range(64):
            first = listener(0)
            base = first.getsockname()[1]
            socks = [first]
            try:
                if base + n - 1 > 65535:
                    raise OSError("port range overflow")
                for i in range(1, n):
                    socks.append(listener(base + i))
                return socks
            except OSError:
                for s in socks:
                    s.close()
        raise RelayError(f"no {n} consecutive free ports on {self.listen_host} after 64 tries")

    async def start(self) -> None:
        """Bind and start listening (idempotent; ``async with`` calls it).

        Raises:
            RelayError: no free ports, or the relay was closed.
        """
        if self._closed:
            raise RelayError("relay is closed")
        if self._started:
            return
        self._started = True
        socks = self._bind()
        for (name, upstream), sock in zip(self.routes.items(), socks, strict=True):
            self._ports[name] = sock.getsockname()[1]

            def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter,
                        _up: tuple[str, int] = upstream) -> None:
                # Run the connection in our own tracked task (not asyncio's callback task:
                # Python 3.11's streams log a spurious error when that one is cancelled).
                self._track(asyncio.get_running_loop().create_task(self._serve(_up, r, w)))

            self._servers.append(await asyncio.start_server(handler, sock=sock))
        log.info("relay.started", endpoints=self.endpoints(), spec=asdict(self.spec))

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop listening, abort all connections and end all background tasks (idempotent).

        Args:
            timeout_s: wait at most this long (seconds) for tasks to finish.
        """
        if self._closed:
            return
        self._closed = True
        for srv in self._servers:
            srv.close()
        for w in list(self._writers):
            _rst(w)
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for srv in self._servers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(srv.wait_closed(), timeout_s)
        log.info("relay.closed", **self.stats())

    # ------------------------------------------------------------------ addresses

    def _key(self, upstream: str | tuple[str, int]) -> str:
        if isinstance(upstream, tuple):
            for name, hp in self.routes.items():
                if hp == (upstream[0], int(upstream[1])):
                    return name
        elif upstream in self.routes:
            return upstream
        else:
            for name, (h, p) in self.routes.items():
                if upstream in (f"{h}:{p}", f"tcp://{h}:{p}"):
                    return name
        raise RelayError(f"unknown upstream {upstream!r}; routes: {sorted(self.routes)}")

    def _fmt(self, port: int) -> str:
        host = self.listen_host
        if ":" in host:
            host = f"[{host}]"
        return f"tcp://{host}:{port}"

    def endpoint_for(self, upstream: str | tuple[str, int]) -> str:
        """The relay's ``tcp://HOST:PORT`` for an upstream.

        Args:
            upstream: a route name, ``(host, port)``, ``"host:port"`` or ``"tcp://host:port"``.

        Raises:
            RelayError: unknown upstream, or the relay is not started.
        """
        key = self._key(upstream)
        if key not in self._ports:
            raise RelayError("relay not started (use `async with` or await start())")
        return self._fmt(self._ports[key])

    def endpoints(self) -> dict[str, str]:
        """``{route name: "tcp://HOST:PORT"}`` for all routes (after start)."""
        return {name: self._fmt(port) for name, port in self._ports.items()}

    @property
    def broker_address(self) -> str:
        """The first route's endpoint; with :meth:`for_broker`, a broker address for a party.

        Raises:
            RelayError: the relay's ports are not consecutive or it is not started.
        """
        if not self.contiguous:
            raise RelayError("broker_address needs contiguous=True (use Relay.for_broker)")
        return self.endpoint_for(next(iter(self.routes)))

    # ------------------------------------------------------------------ data path

    def _count(self, direction: str, n: int) -> None:
        self._bytes[direction] += n

    def _queue_delta(self, direction: str, n: int) -> None:
        q = self._queued[direction] = self._queued[direction] + n
        if q > self._peak_queued[direction]:
            self._peak_queued[direction] = q

    def _track(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, upstream: tuple[str, int], cr: asyncio.StreamReader,
                     cw: asyncio.StreamWriter) -> None:
        if self._closed or self._is_down:
            self._refused += 1
            _rst(cw)
            return
        me = asyncio.current_task()
        if me is not None:
            self._conn_tasks.add(me)
        epoch = self._epoch
        self._writers.add(cw)
        uw: asyncio.StreamWriter | None = None
        try:
            try:
                ur, uw = await asyncio.wait_for(asyncio.open_connection(*upstream),
                                                self.connect_timeout_s)
            except (OSError, TimeoutError) as e:
                log.warning("relay.upstream.unreachable", upstream=f"{upstream[0]}:{upstream[1]}",
                            error=repr(e))
                return
            if epoch != self._epoch or self._closed:
                return
            self._writers.add(uw)
            self._connections += 1
            log.debug("relay.connection.opened", upstream=f"{upstream[0]}:{upstream[1]}",
                      peer=str(cw.get_extra_info("peername")))
            up = _Pipe(self, self._up, cr, uw, "up")
            down = _Pipe(self, self._down_clock, ur, cw, "down")
            async with asyncio.TaskGroup() as tg:
                for coro in (up.pump_in(), up.pump_out(), down.pump_in(), down.pump_out()):
                    tg.create_task(coro)
        except* (OSError, asyncio.IncompleteReadError):
            pass  # a reset or broken pipe ends the connection; both sides are aborted below
        finally:
            _rst(cw)
            _rst(uw)
            self._writers.discard(cw)
            if uw is not None:
                self._writers.discard(uw)
            self._conn_tasks.discard(me)

    # ------------------------------------------------------------------ faults

    async def disconnect(self, duration_s: float) -> None:
        """Break the link: abort all connections now and refuse new ones for ``duration_s``.

        Returns when the outage is over (overlapping calls extend it to the latest
        end). New connections during the outage are accepted and reset at once.
        Records ``disconnect.start`` / ``disconnect.end`` events.

        Args:
            duration_s: outage length in seconds (>= 0; 0 only resets connections).

        Raises:
            ValueError: ``duration_s`` is negative or not finite.
            RelayError: the relay is not started or is closed.
        """
        if not _finite(duration_s) or duration_s < 0:
            raise ValueError(f"duration_s must be a finite number >= 0, got {duration_s!r}")
        if not self._started or self._closed:
            raise RelayError("relay is not running")
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._epoch += 1
        self._disconnects += 1
        aborted = len(self._writers)
        was_down = self._is_down
        self._is_down = True
        self._down_until = max(self._down_until, now + duration_s)
        refused0 = self._refused
        for w in list(self._writers):
            _rst(w)
        for t in list(self._conn_tasks):
            t.cancel()
        ev = {"event": "disconnect.start", "t_wall": time.time(), "t_mono": now,
              "duration_s": float(duration_s), "aborted_sockets": aborted, "extends": was_down}
        self._events.append(ev)
        log.info("relay.disconnect.started", duration_s=float(duration_s),
                 aborted_sockets=aborted, endpoints=self.endpoints())
        while (remaining := self._down_until - loop.time()) > 0:
            await asyncio.sleep(remaining)
        if self._is_down:
            self._is_down = False
            end = {"event": "disconnect.end", "t_wall": time.time(), "t_mono": loop.time(),
                   "refused": self._refused - refused0}
            self._events.append(end)
            log.info("relay.disconnect.ended", refused=end["refused"], endpoints=self.endpoints())

    def disconnect_nowait(self, duration_s: float) -> asyncio.Task[None]:
        """Start :meth:`disconnect` as a tracked background task and return it.

        Raises:
            ValueError, RelayError: as :meth:`disconnect` (raised here, synchronously).
        """
        if not _finite(duration_s) or duration_s < 0:
            raise ValueError(f"duration_s must be a finite number >= 0, got {duration_s!r}")
        if not self._started or self._closed:
            raise RelayError("relay is not running")
        task = asyncio.get_running_loop().create_task(self.disconnect(duration_s))
        self._track(task)
        return task

    # ------------------------------------------------------------------ observation

    def events(self) -> list[dict[str, Any]]:
        """Recorded fault events (copies): ``disconnect.start`` / ``disconnect.end`` with
        ``t_wall`` (Unix seconds) and ``t_mono`` (event-loop seconds)."""
        return [dict(e) for e in self._events]

    def stats(self) -> dict[str, Any]:
        """Counters: ``bytes_up`` / ``bytes_down`` (payload bytes delivered each way),
        ``queued_up`` / ``queued_down`` (bytes now waiting in shaped queues, all
        connections) and their ``peak_`` values, ``connections`` (proxied so far), ``active_sockets``, ``refused`` (during
        outages), ``segments`` / ``segments_lost`` (both directions), ``disconnects``,
        ``down`` (an outage is in progress)."""
        return {
            "bytes_up": self._bytes["up"],
            "bytes_down": self._bytes["down"],
            "queued_up": self._queued["up"],
            "queued_down": self._queued["down"],
            "peak_queued_up": self._peak_queued["up"],
            "peak_queued_down": self._peak_queued["down"],
            "connections": self._connections,
            "active_sockets": len(self._writers),
            "refused": self._refused,
            "segments": self._up.segments + self._down_clock.segments,
            "segments_lost": self._up.segments_lost + self._down_clock.segments_lost,
            "disconnects": self._disconnects,
            "down": self._is_down,
        }


# ----------------------------------------------------------------------------- CLI

def _parse_upstream(text: str) -> tuple[str, int]:
    host, sep, port = text.removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(orjson.dumps(obj, default=repr).decode() + "\n")
    sys.stdout.flush()


async def _stdin_lines(queue: asyncio.Queue[bytes | None]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (ValueError, OSError):  # not a pipe/tty (e.g. a regular file): read in a thread
        import threading

        def pump() -> None:
            for line in sys.stdin.buffer:
                loop.call_soon_threadsafe(queue.put_nowait, line)
            loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=pump, daemon=True).start()
        return
    while True:
        line = await reader.readline()
        await queue.put(line or None)
        if not line:
            return


async def _amain(args: argparse.Namespace) -> int:
    spec = LinkSpec(latency_s=args.latency_s,
                    bandwidth_bps=None if args.bandwidth_mbps is None else args.bandwidth_mbps * 1e6,
                    loss=args.loss, mss_bytes=args.mss_bytes, seed=args.seed,
                    min_rto_s=args.min_rto_s, rto_s=args.rto_s)
    if args.broker:
        relay = Relay.for_broker(args.broker, spec, args.listen_host, ports=args.broker_ports,
                                 buffer_bytes=args.buffer_bytes)
    else:
        relay = Relay(list(args.upstream), spec, args.listen_host, buffer_bytes=args.buffer_bytes)
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[bytes | None] = asyncio.Queue()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lines.put_nowait, f"signal:{sig.name}".encode())
    reason = "eof"
    async with relay:
        ready: dict[str, Any] = {"event": "ready", "endpoints": relay.endpoints(),
                                 "pid": _pid(), "spec": asdict(spec)}
        if args.broker:
            ready["broker_address"] = relay.broker_address
        _emit(ready)
        reader = loop.create_task(_stdin_lines(lines))
        try:
            while True:
                line = await lines.get()
                if line is None:
                    break
                if line.startswith(b"signal:"):
                    reason = line.decode().split(":", 1)[1].lower()
                    break
                if not line.strip():
                    continue
                try:
                    cmd = orjson.loads(line)
                    name = cmd["cmd"]
                    if name == "disconnect":
                        d = float(cmd["duration_s"])
                        relay.disconnect_nowait(d)
                        _emit({"ok": True, "cmd": "disconnect", "duration_s": d})
                    elif name == "stats":
                        _emit({"ok": True, "cmd": "stats", "stats": relay.stats()})
                    elif name == "events":
                        _emit({"ok": True, "cmd": "events", "events": relay.events()})
                    elif name == "stop":
                        _emit({"ok": True, "cmd": "stop"})
                        reason = "stop"
                        break
                    else:
                        _emit({"ok": False, "error": f"unknown cmd {name!r}"})
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, RelayError) as e:
                    _emit({"ok": False, "error": f"{type(e).__name__}: {e}"})
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(reader, 1.0)
    _emit({"event": "stopped", "reason": reason, "stats": relay.stats(), "events": relay.events()})
    return 0


def _pid() -> int:
    import os
    return os.getpid()


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m sim.cluster.relay``: run one relay as a process, driven by JSON lines on stdin.

    Prints ``{"event":"ready","endpoints":{...}}`` once listening, answers each
    command line (``{"cmd":"disconnect","duration_s":S}``, ``{"cmd":"stats"}``,
    ``{"cmd":"events"}``, ``{"cmd":"stop"}``) with one JSON line, and on ``stop``,
    stdin EOF, SIGTERM or SIGINT prints ``{"event":"stopped",...}`` with the final
    stats and exits 0.
    """
    p = argparse.ArgumentParser(prog="python -m sim.cluster.relay", description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--upstream", action="append", type=_parse_upstream, metavar="HOST:PORT",
                   help="relay to this upstream (repeatable)")
    g.add_argument("--broker", metavar="tcp://HOST:PORT",
                   help="relay a whole broker: PORT, PORT+1, PORT+2 on consecutive ports")
    p.add_argument("--broker-ports", type=int, default=3, metavar="N",
                   help="with --broker: relay PORT .. PORT+N-1 (3 plaintext; a CURVE broker "
                   "prints its count)")
    p.add_argument("--listen-host", default="127.0.0.1")
    p.add_argument("--latency-s", type=float, default=0.0, help="one-way latency, seconds")
    p.add_argument("--bandwidth-mbps", type=float, default=None,
                   help="Mbit/s (10^6 bits/s) per direction; default unlimited")
    p.add_argument("--loss", type=float, default=0.0, help="per-segment loss probability")
    p.add_argument("--mss-bytes", type=int, default=1448)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--min-rto-s", type=float, default=0.2)
    p.add_argument("--rto-s", type=float, default=None)
    p.add_argument("--buffer-bytes", type=int, default=1 << 20)
    p.add_argument("--events", default=None, help="append structlog JSON lines here")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto",
                   help="event loop; auto = uvloop if installed (its timers are closer to "
                        "the model than asyncio's, which round sleeps up by up to 1 ms)")
    args = p.parse_args(None if argv is None else list(argv))
    from pubsub.logs import configure_logging  # the repo's structlog setup (stderr + jsonl)

    configure_logging(events_path=args.events, level="info", stderr_level=args.log_level,
                      component="relay")
    try:
        LinkSpec(latency_s=args.latency_s, loss=args.loss, mss_bytes=args.mss_bytes,
                 seed=args.seed, min_rto_s=args.min_rto_s, rto_s=args.rto_s,
                 bandwidth_bps=None if args.bandwidth_mbps is None else args.bandwidth_mbps * 1e6)
    except InvalidLinkSpec as e:
        p.error(str(e))
    if args.loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if args.loop == "uvloop":
                p.error("--loop uvloop: uvloop is not installed")
        else:
            return uvloop.run(_amain(args))
    return asyncio.run(_amain(args))


if __name__ == "__main__":
    sys.exit(main())
