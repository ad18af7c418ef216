"""The broker's forwarding loop, control socket and counters.

The data path is one thread polling three sockets (XSUB, XPUB, REP); each
readable socket is drained in bursts with non-blocking receives, which is
what keeps a Python broker near ``zmq.proxy`` speed (see
``shared/reference/zeromq.md``). No socket is touched by any other thread.

Per message the broker checks the envelope's structure (at least two frames,
NUL-terminated topic, header version byte, header CRC) and counts it by channel
class (``emb``, ``grad`` ...) and by namespace (the first two topic segments,
``emb/<run>``). Malformed messages are dropped and counted as rejected; they
never reach subscribers and never crash the broker.
"""

from __future__ import annotations

import random
import signal
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
import zmq

from pubsub.address import BrokerAddress
from pubsub.codec import _small_bytes, encode
from pubsub.control import request_stats  # noqa: F401  (re-exported for callers of broker)
from pubsub.wire import recv_envelope, send_envelope

log = structlog.get_logger(__name__)

_CRC = struct.Struct(">I")
_MAX_NAMESPACES = 4096
_MAX_SEQ_KEYS = 1 << 17
STATS_TOPIC = "_broker/stats"


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """Broker settings.

    Attributes:
        bind: base address ``tcp://HOST:PORT``; PORT 0 picks three free consecutive ports.
        sndhwm: XPUB high-water mark per subscriber, messages (libzmq drops beyond it).
        rcvhwm: XSUB high-water mark per publisher, messages.
        linger_s: LINGER on every socket at shutdown, seconds.
        poll_interval_s: poll timeout, seconds (bounds shutdown latency).
        drain_burst: most messages forwarded per readable event before re-polling.
        validate: check envelope structure and header CRC (rejects malformed frames).
        stats_interval_s: period of the stats topic ``_broker/stats``; 0 disables it.
        overflow: ``"drop"``: a subscriber whose queue holds ``sndhwm`` messages loses
            new ones (libzmq drops them; subscribers see sequence gaps). ``"block"``:
            the broker holds the message and stops reading from publishers until every
            matching subscriber has room (XPUB_NODROP), so publishers feel backpressure.
            Subscriptions, control requests and pings are still served while blocked.
        max_message_bytes: larger messages are rejected (counted). With the HWMs this
            bounds the broker's queued bytes per peer: about ``(sndhwm + rcvhwm) ×
            max_message_bytes`` for one publisher and one subscriber.
    """

    bind: str = "tcp://127.0.0.1:5555"
    sndhwm: int = 10_000
    rcvhwm: int = 10_000
    linger_s: float = 0.5
    poll_interval_s: float = 0.1
    drain_burst: int = 1024
    validate: bool = True
    stats_interval_s: float = 1.0
    overflow: str = "drop"
    max_message_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.overflow not in ("drop", "block"):
            raise ValueError(f"overflow must be 'drop' or 'block', got {self.overflow!r}")
        BrokerAddress.parse(self.bind)
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s!r}")
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {self.max_message_bytes!r}")
        if self.drain_burst < 1:
            raise ValueError(f"drain_burst must be >= 1, got {self.drain_burst!r}")


@dataclass(slots=True, kw_only=True)
class BrokerStats:
    """Broker counters.

    Attributes:
        msgs_in / bytes_in: received from publishers, by channel class.
        msgs_out / bytes_out: forwarded to subscribers, by channel class (a message
            is counted once when handed to XPUB, whatever the number of subscribers).
        namespace_msgs / namespace_bytes: forwarded, by ``class/second-segment``.
        subscriptions: distinct topics currently subscribed (as XPUB reports them).
        subscribe_events / unsubscribe_events: subscription frames seen.
        rejected: malformed messages dropped.
        stalls / stalled_s: under ``block``, episodes (and seconds) spent waiting for a
            slow subscriber.
        gaps / namespace_gaps: messages lost between publishers and the broker, from the
            per-(publisher, topic) sequence numbers in envelope headers; by namespace.
        started_at: Unix time the broker started.
    """

    msgs_in: dict[str, int] = field(default_factory=dict)
    bytes_in: dict[str, int] = field(default_factory=dict)
    msgs_out: dict[str, int] = field(default_factory=dict)
    bytes_out: dict[str, int] = field(default_factory=dict)
    namespace_msgs: dict[str, int] = field(default_factory=dict)
    namespace_bytes: dict[str, int] = field(default_factory=dict)
    subscriptions: int = 0
    subscribe_events: int = 0
    unsubscribe_events: int = 0
    rejected: int = 0
    stalls: int = 0
    stalled_s: float = 0.0
    gaps: int = 0
    namespace_gaps: dict[str, int] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready copy."""
        return {
            "msgs_in": dict(self.msgs_in),
            "bytes_in": dict(self.bytes_in),
            "msgs_out": dict(self.msgs_out),
            "bytes_out": dict(self.bytes_out),
            "namespace_msgs": dict(self.namespace_msgs),
            "namespace_bytes": dict(self.namespace_bytes),
            "subscriptions": self.subscriptions,
            "subscribe_events": self.subscribe_events,
            "unsubscribe_events": self.unsubscribe_events,
            "rejected": self.rejected,
            "stalls": self.stalls,
            "gaps": self.gaps,
            "namespace_gaps": dict(self.namespace_gaps),
            "stalled_s": self.stalled_s,
            "uptime_s": time.time() - self.started_at,
        }


def check_envelope(frames: list[Any]) -> str | None:
    """Structural check of a multipart envelope (pure; frames are ``zmq.Frame`` or bytes).

    Returns:
        None if well-formed, else the reason it is malformed.
    """
    if len(frames) < 2:
        return f"{len(frames)} frame(s), need topic and header"
    tb = _small_bytes(frames[0])
    if len(tb) < 2 or tb[-1] != 0:
        return "topic frame not NUL-terminated"
    hb = _small_bytes(frames[1])
    if len(hb) < 5 or hb[0] != 1:
        return "bad header version or length"
    if zlib.crc32(hb[5:]) != _CRC.unpack_from(hb, 1)[0]:
        return "header checksum mismatch"
    return None


class Broker:
    """An XSUB/XPUB forwarder with counters and a control socket.

    Call :meth:`bind` then :meth:`run` (blocking, in one thread). :meth:`stop`
    may be called from any thread or a signal handler.

    Args:
        config: :class:`BrokerConfig`.

    Raises:
        zmq.ZMQError: from :meth:`bind` if the ports are taken (with the address).
    """

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.config = config or BrokerConfig()
        self.stats = BrokerStats()
        self._stop = threading.Event()
        self._ctx: zmq.Context | None = None
        self._xsub: zmq.Socket | None = None
        self._xpub: zmq.Socket | None = None
        self._rep: zmq.Socket | None = None
        self.address: BrokerAddress | None = None
        self._closed = False
        self._held: tuple[list[Any], str, int, bytes, int] | None = None
        self._seqs: dict[tuple[bytes, bytes], int] = {}
        self._held_since = 0.0

    # ------------------------------------------------------------------ setup
    def bind(self) -> BrokerAddress:
        """Bind the three sockets; returns the actual base address.

        With PORT 0 a random base port in 20000..59999 whose three ports are
        free is chosen (up to 100 tries).

        Raises:
            zmq.ZMQError: the ports are in use (message names the address).
        """
        want = BrokerAddress.parse(self.config.bind)
        self._ctx = zmq.Context()
        if want.port != 0:
            self._bind_at(want.host, want.port)
            self.address = want
        else:
            last: Exception | None = None
            for _ in range(100):
                port = random.randrange(20000, 60000)
                try:
                    self._bind_at(want.host, port)
                except zmq.ZMQError as exc:
                    last = exc
                    self._close_sockets()
                    continue
                self.address = BrokerAddress(host=want.host, port=port)
                break
            else:
                raise zmq.ZMQError(msg=f"no free port triple on {want.host}: {last}")
        log.info("broker.bound", address=str(self.address))
        return self.address

    def _bind_at(self, host: str, port: int) -> None:
        assert self._ctx is not None
        cfg = self.config
        linger = int(cfg.linger_s * 1000)
        addr = BrokerAddress(host=host, port=port)
        xsub = self._ctx.socket(zmq.XSUB)
        xpub = self._ctx.socket(zmq.XPUB)
        rep = self._ctx.socket(zmq.REP)
        self._xsub, self._xpub, self._rep = xsub, xpub, rep
        for s in (xsub, xpub, rep):
            s.setsockopt(zmq.LINGER, linger)
        xsub.setsockopt(zmq.RCVHWM, cfg.rcvhwm)
        xsub.setsockopt(zmq.SNDHWM, 0)  # subscriptions upstream: never capped
        xpub.setsockopt(zmq.SNDHWM, cfg.sndhwm)
        xpub.setsockopt(zmq.RCVHWM, 0)  # subscriptions in: never capped
        if cfg.overflow == "block":
            xpub.setsockopt(zmq.XPUB_NODROP, 1)
        try:
            xsub.bind(addr.pub_endpoint)
            xpub.bind(addr.sub_endpoint)
            rep.bind(addr.control_endpoint)
        except zmq.ZMQError as exc:
            raise zmq.ZMQError(exc.errno, f"cannot bind broker at {addr}: {exc}") from None

    # ------------------------------------------------------------------ loop
    def stop(self) -> None:
        """Ask :meth:`run` to return (thread- and signal-safe)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """Stop cleanly on SIGINT and SIGTERM (main thread only)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stop())

    def run(self) -> None:
        """Forward until :meth:`stop`; then close all sockets (LINGER-bounded)."""
        if self._xsub is None:
            self.bind()
        xsub, xpub, rep = self._xsub, self._xpub, self._rep
        assert xsub is not None and xpub is not None and rep is not None
        cfg = self.config
        poller = zmq.Poller()
        poller.register(xsub, zmq.POLLIN)
        poller.register(xpub, zmq.POLLIN)
        poller.register(rep, zmq.POLLIN)
        timeout_ms = int(cfg.poll_interval_s * 1000)
        burst = cfg.drain_burst
        next_stats = time.monotonic() + cfg.stats_interval_s if cfg.stats_interval_s > 0 else None
        xsub_registered = True
        try:
            while not self._stop.is_set():
                # while a message is held (block policy), poll briefly and do not read
                # publishers: their queues fill and they feel the backpressure
                events = dict(poller.poll(1 if self._held is not None else timeout_ms))
                if xpub in events:
                    self._pump_subscriptions(xpub, xsub, burst)
                if self._held is not None:
                    self._retry_held(xpub)
                if self._held is None and not xsub_registered:
                    poller.register(xsub, zmq.POLLIN)
                    xsub_registered = True
                if xsub in events and self._held is None:
                    self._pump_messages(xsub, xpub, burst)
                if self._held is not None and xsub_registered:
                    poller.unregister(xsub)
                    xsub_registered = False
                if rep in events:
                    self._serve_control(rep)
                if next_stats is not None and time.monotonic() >= next_stats:
                    next_stats = time.monotonic() + cfg.stats_interval_s
                    self._publish_stats(xpub)
        finally:
            self.close()

    def _pump_subscriptions(self, xpub: zmq.Socket, xsub: zmq.Socket, burst: int) -> None:
        st = self.stats
        for _ in range(burst):
            try:
                frame = xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01":
                st.subscribe_events += 1
                st.subscriptions += 1
            elif frame[:1] == b"\x00":
                st.unsubscribe_events += 1
                st.subscriptions = max(0, st.subscriptions - 1)
            else:
                st.rejected += 1
                continue
            xsub.send(frame)

    def _pump_messages(self, xsub: zmq.Socket, xpub: zmq.Socket, burst: int) -> None:
        st = self.stats
        validate = self.config.validate
        msgs_in, bytes_in = st.msgs_in, st.bytes_in
        block = self.config.overflow == "block"
        max_bytes = self.config.max_message_bytes
        seqs = self._seqs
        noblock = int(zmq.NOBLOCK)
        for _ in range(burst):
            try:
                frames = recv_envelope(xsub, noblock)
            except zmq.Again:
                return
            topic = frames[0]
            slash = topic.find(b"/")
            cls = (topic[:slash] if slash > 0 else topic.rstrip(b"\x00")).decode("utf-8", "replace")
            nbytes = 0
            for f in frames:
                nbytes += len(f)
            msgs_in[cls] = msgs_in.get(cls, 0) + 1
            bytes_in[cls] = bytes_in.get(cls, 0) + nbytes
            if nbytes > max_bytes:
                st.rejected += 1
                log.warning("broker.message_too_large", nbytes=nbytes, max_bytes=max_bytes)
                continue
            if validate:
                reason = check_envelope(frames)
                if reason is not None:
                    st.rejected += 1
                    if st.rejected == 1 or st.rejected % 1000 == 0:
                        log.warning("broker.frame_rejected", reason=reason, rejected=st.rejected)
                    continue
                # sequence gaps per (publisher, topic): the header starts {"s":N,"p":"ID"
                hb = frames[1]
                if hb[5:10] == b'{"s":':
                    comma = hb.find(b",", 10)
                    pend = hb.find(b'"', comma + 6)
                    if comma > 0 and pend > 0:
                        key = (hb[comma + 6:pend], topic)
                        seq = int(hb[10:comma])
                        last = seqs.get(key)
                        if last is not None and seq > last + 1:
                            self._count_gap(topic, slash, seq - last - 1)
                        elif last is None and len(seqs) >= _MAX_SEQ_KEYS:
                            seqs.clear()
                        seqs[key] = seq
            if block:
                try:
                    send_envelope(xpub, frames, noblock)
                except zmq.Again:
                    self._held = (frames, cls, nbytes, topic, slash)
                    self._held_since = time.monotonic()
                    st.stalls += 1
                    return
            else:
                send_envelope(xpub, frames)
            self._count_out(frames, cls, nbytes, topic, slash)

    def _count_gap(self, topic: bytes, slash: int, n: int) -> None:
        st = self.stats
        st.gaps += n
        slash2 = topic.find(b"/", slash + 1) if slash > 0 else -1
        ns = topic[:slash2].decode("utf-8", "replace") if slash2 > 0 else "other"
        if ns in st.namespace_gaps or len(st.namespace_gaps) < _MAX_NAMESPACES:
            st.namespace_gaps[ns] = st.namespace_gaps.get(ns, 0) + n

    def _retry_held(self, xpub: zmq.Socket) -> None:
        assert self._held is not None
        frames, cls, nbytes, topic, slash = self._held
        try:
            send_envelope(xpub, frames, zmq.NOBLOCK)
        except zmq.Again:
            return
        self._held = None
        self.stats.stalled_s += time.monotonic() - self._held_since
        self._count_out(frames, cls, nbytes, topic, slash)

    def _count_out(self, frames: list[Any], cls: str, nbytes: int, topic: bytes,
                   slash: int) -> None:
        """Count one forwarded message by channel class and namespace."""
        st = self.stats
        msgs_out, bytes_out = st.msgs_out, st.bytes_out
        ns_msgs, ns_bytes = st.namespace_msgs, st.namespace_bytes
        msgs_out[cls] = msgs_out.get(cls, 0) + 1
        bytes_out[cls] = bytes_out.get(cls, 0) + nbytes
        slash2 = topic.find(b"/", slash + 1) if slash > 0 else -1
        if slash2 > 0:
            ns = topic[:slash2].decode("utf-8", "replace")
            if ns in ns_msgs or len(ns_msgs) < _MAX_NAMESPACES:
                ns_msgs[ns] = ns_msgs.get(ns, 0) + 1
                ns_bytes[ns] = ns_bytes.get(ns, 0) + nbytes

    def _serve_control(self, rep: zmq.Socket) -> None:
        try:
            raw = rep.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            req = orjson.loads(raw)
            cmd = req.get("cmd") if isinstance(req, dict) else None
        except orjson.JSONDecodeError:
            cmd = None
        if cmd == "stats":
            reply: dict[str, Any] = {"ok": True, "stats": self.stats.as_dict()}
        elif cmd == "ping":
            reply = {"ok": True, "address": str(self.address)}
        else:
            reply = {"ok": False, "error": f"unknown request {raw[:64]!r}; use cmd=stats|ping"}
        rep.send(orjson.dumps(reply))

    def _publish_stats(self, xpub: zmq.Socket) -> None:
        frames = encode(STATS_TOPIC, (), self.stats.as_dict(), publisher="broker")
        try:
            xpub.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            pass

    def close(self) -> None:
        """Close sockets and the context; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_sockets()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        log.info("broker.stopped", **{k: v for k, v in self.stats.as_dict().items()
                                      if k in ("rejected", "subscriptions")})

    def _close_sockets(self) -> None:
        for s in (self._xsub, self._xpub, self._rep):
            if s is not None:
                s.close(linger=int(self.config.linger_s * 1000))
        self._xsub = self._xpub = self._rep = None


def serve_in_thread(config: BrokerConfig) -> tuple[Broker, threading.Thread]:
    """Start a broker in a daemon thread (tests, benchmarks). Returns it once bound."""
    broker = Broker(config)
    broker.bind()
    t = threading.Thread(target=broker.run, name="broker", daemon=True)
    t.start()
    return broker, t


