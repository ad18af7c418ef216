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
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
import zmq
from zmq.backend import Socket as _Backend

from pubsub.address import BrokerAddress
from pubsub.codec import _small_bytes, encode, parse_head
from pubsub.errors import MalformedFrame
from pubsub.control import request_stats  # noqa: F401  (re-exported for callers of broker)
from pubsub.wire import send_envelope

log = structlog.get_logger(__name__)

_CRC = struct.Struct(">I")
_MAX_NAMESPACES = 4096
_MAX_SEQ_KEYS = 1 << 17
STATS_TOPIC = "_broker/stats"
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_recv = _Backend.recv
_send = _Backend.send
_get = _Backend.get


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


class BrokerStats:
    """Broker counters.

    The data path counts into one small list per *key* (``class/second-segment``
    for topics with two or more ``/``, else the class, e.g. ``ctl``): one dict
    lookup per message. :meth:`as_dict` folds them into the per-class and
    per-namespace views. At most 4,096 keys are tracked; messages on further keys
    are counted under ``(other)``.

    Views (:meth:`as_dict`):
        msgs_in / bytes_in: received from publishers, by channel class.
        msgs_out / bytes_out: forwarded to subscribers, by channel class (a message
            is counted once when handed to XPUB, whatever the number of subscribers).
        namespace_msgs / namespace_bytes: forwarded, by ``class/second-segment``.
        subscriptions: distinct topics currently subscribed (as XPUB reports them).
        subscribe_events / unsubscribe_events: subscription frames seen.
        rejected: malformed or oversized messages dropped.
        stalls / stalled_s: under ``block``, episodes (and seconds) spent waiting for a
            slow subscriber.
        gaps / namespace_gaps: messages lost between publishers and the broker, from the
            per-(publisher, topic) sequence numbers in envelope heads; by namespace.
        started_at: Unix time the broker started.
    """

    __slots__ = ("keys", "subscriptions", "subscribe_events", "unsubscribe_events",
                 "rejected", "stalls", "stalled_s", "gaps", "started_at")

    #: per-key counters: [msgs_in, bytes_in, msgs_out, bytes_out, gaps]
    keys: dict[bytes, list[int]]

    def __init__(self) -> None:
        self.keys = {}
        self.subscriptions = 0
        self.subscribe_events = 0
        self.unsubscribe_events = 0
        self.rejected = 0
        self.stalls = 0
        self.stalled_s = 0.0
        self.gaps = 0
        self.started_at = time.time()

    def counter(self, key: bytes) -> list[int]:
        """The counter list for ``key`` (created on first use; capped at 4,096 keys)."""
        c = self.keys.get(key)
        if c is None:
            if len(self.keys) >= _MAX_NAMESPACES:
                key = b"(other)"
                c = self.keys.get(key)
            if c is None:
                c = self.keys[key] = [0, 0, 0, 0, 0]
        return c

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready copy (see the class docstring for the fields)."""
        views: dict[str, dict[str, int]] = {k: {} for k in (
            "msgs_in", "bytes_in", "msgs_out", "bytes_out",
            "namespace_msgs", "namespace_bytes", "namespace_gaps")}
        for raw, (mi, bi, mo, bo, gp) in list(self.keys.items()):
            key = raw.decode("utf-8", "replace")
            cls = key.partition("/")[0]
            for name, v in (("msgs_in", mi), ("bytes_in", bi), ("msgs_out", mo),
                            ("bytes_out", bo)):
                views[name][cls] = views[name].get(cls, 0) + v
            if "/" in key:
                if mo:
                    views["namespace_msgs"][key] = mo
                    views["namespace_bytes"][key] = bo
                if gp:
                    views["namespace_gaps"][key] = gp
            elif gp:
                views["namespace_gaps"]["other"] = views["namespace_gaps"].get("other", 0) + gp
        return {
            **views,
            "subscriptions": self.subscriptions,
            "subscribe_events": self.subscribe_events,
            "unsubscribe_events": self.unsubscribe_events,
            "rejected": self.rejected,
            "stalls": self.stalls,
            "gaps": self.gaps,
            "stalled_s": self.stalled_s,
            "uptime_s": time.time() - self.started_at,
        }


def check_envelope(frames: list[Any]) -> str | None:
    """Structural check of a multipart envelope, as the broker does it per message
    (pure; frames are ``zmq.Frame`` or bytes): NUL-terminated topic, codec version and
    header CRC in frame 0 (:func:`pubsub.codec.parse_head`). Payloads are checked by
    subscribers (:func:`pubsub.codec.decode`).

    Returns:
        None if well-formed, else the reason it is malformed.
    """
    if not frames:
        return "no frames"
    try:
        parse_head(_small_bytes(frames[0]))
    except MalformedFrame as exc:
        return exc.reason
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
        self._held: tuple[list[Any], list[int], int] | None = None
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
        """Forward up to ``burst`` messages: check frame 0, count, send.

        The hot path of the broker. Per message: one ``recv`` of frame 0 as bytes
        (plus zero-copy receives of any payload frames), :func:`parse_head` (NUL,
        version, CRC), one counter lookup, one sequence lookup and one ``send``.
        """
        st = self.stats
        counter = st.counter
        counters = st.keys
        validate = self.config.validate
        block = self.config.overflow == "block"
        max_bytes = self.config.max_message_bytes
        seqs = self._seqs
        noblock = _NOBLOCK
        recv, get, send = _recv, _get, _send
        for _ in range(burst):
            try:
                f = recv(xsub, noblock, True, False)
            except zmq.Again:
                return
            nbytes = len(f)
            frames = None
            if get(xsub, _RCVMORE):
                frames = [f]
                while get(xsub, _RCVMORE):
                    fr = recv(xsub, 0, False, False)
                    frames.append(fr)
                    nbytes += len(fr)
            if validate:
                try:
                    nul, seq, ps, js, _ = parse_head(f)
                except MalformedFrame as exc:
                    self._reject(exc.reason)
                    continue
            else:
                nul = f.find(0, 0, 256)
                if nul < 1:
                    self._reject("frame 0 has no NUL-terminated topic")
                    continue
            s1 = f.find(47, 0, nul)  # "/": counter key, see BrokerStats
            if s1 < 0:
                key = f[:nul]
            else:
                s2 = f.find(47, s1 + 1, nul)
                key = f[:s2] if s2 > 0 else f[:s1]
            c = counters.get(key)
            if c is None:
                c = counter(key)
            c[0] += 1
            c[1] += nbytes
            if nbytes > max_bytes:
                self._reject(f"{nbytes} bytes > max_message_bytes {max_bytes}")
                continue
            if validate:
                # sequence gaps per (publisher, topic)
                sk = (f[ps:js], f[:nul])
                last = seqs.get(sk)
                if last is not None:
                    if seq > last + 1:
                        st.gaps += seq - last - 1
                        c[4] += seq - last - 1
                elif len(seqs) >= _MAX_SEQ_KEYS:
                    seqs.clear()
                seqs[sk] = seq
            if frames is None:
                if block:
                    try:
                        send(xpub, f, noblock, True, False)
                    except zmq.Again:
                        self._hold([f], c, nbytes)
                        return
                else:
                    send(xpub, f, 0, True, False)
            elif block:
                try:
                    send_envelope(xpub, frames, noblock)
                except zmq.Again:
                    self._hold(frames, c, nbytes)
                    return
            else:
                send_envelope(xpub, frames)
            c[2] += 1
            c[3] += nbytes

    def _reject(self, reason: str) -> None:
        st = self.stats
        st.rejected += 1
        if st.rejected == 1 or st.rejected % 1000 == 0:
            log.warning("broker.frame_rejected", reason=reason, rejected=st.rejected)

    def _hold(self, frames: list[Any], c: list[int], nbytes: int) -> None:
        self._held = (frames, c, nbytes)
        self._held_since = time.monotonic()
        self.stats.stalls += 1

    def _retry_held(self, xpub: zmq.Socket) -> None:
        assert self._held is not None
        frames, c, nbytes = self._held
        try:
            send_envelope(xpub, frames, zmq.NOBLOCK)
        except zmq.Again:
            return
        self._held = None
        self.stats.stalled_s += time.monotonic() - self._held_since
        c[2] += 1
        c[3] += nbytes

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


