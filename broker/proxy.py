"""The broker's forwarding loop, control socket and counters.

The data path is one thread polling three sockets (XSUB, XPUB, control ROUTER); each
readable socket is drained in bursts with non-blocking receives, which is
what keeps a Python broker near ``zmq.proxy`` speed (``bench/bus.py`` measures it;
figures in docs/benchmarks.md). No socket is touched by any other thread.

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
from pathlib import Path
from typing import Any

import structlog
import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.backend import Socket as _Backend
from zmq.utils import z85

from pubsub.address import BrokerAddress
from pubsub.codec import _small_bytes, encode, parse_head
from pubsub.errors import KeyFileError, MalformedFrame
from pubsub.config import ConfigError
from pubsub.membership import RunMembership, inline_membership, load_membership
from pubsub.policy import Policy, load_policy
from pubsub.receiver import MAX_GAP_JUMP
from pubsub.security import BROKER_KEY_NAME, Certificate, check_insecure_allowed
from pubsub.security import read_certificate, read_public_directory
from pubsub.control import request_stats  # noqa: F401  (re-exported for callers of broker)
from pubsub.wire import send_envelope

from broker.control import ControlPlane
from broker.identity import SPOOFED, SenderCheck
from broker.subforward import SubscriptionForwarder
from broker.subscriptions import SubscriptionBook

log = structlog.get_logger(__name__)

_CRC = struct.Struct(">I")
_MAX_NAMESPACES = 4096
_MAX_SEQ_KEYS = 1 << 17
_MAX_ROUTES = 1 << 16
#: largest control request accepted (bytes); a longer one closes the sender's connection
CONTROL_MAX_BYTES = 64 * 1024
#: most bytes of one frame a subscriber may send the broker (a subscription is one byte
#: and a topic of at most 255): libzmq closes a connection that sends more, unallocated
SUBSCRIPTION_MAX_BYTES = 4 * 1024
#: slack over ``max_message_bytes`` for one frame on a publisher port (framing; with CURVE
#: the box's overhead), so a legitimate message of exactly the bound still passes
FRAME_SLACK_BYTES = 4 * 1024
#: the policy used with CURVE when ``policy_file`` is empty
DEFAULT_POLICY_FILE = Path(__file__).with_name("default_policy.toml")
#: ZAP domain of the control socket (any allow-listed key may use it)
CONTROL_DOMAIN = "control"
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
        max_message_bytes: larger messages are rejected (counted); a single frame
            larger than this closes its sender's connection before the broker allocates
            it (libzmq's ``ZMQ_MAXMSGSIZE``; not counted). With the HWMs this bounds the
            broker's queued bytes per peer: about ``(sndhwm + rcvhwm) ×
            max_message_bytes`` for one publisher and one subscriber.
        keys_dir: CURVE on: a directory holding the broker's ``broker.key_secret`` and
            the allow-list, one public ``NAME.key`` per client with its ``role``
            (``psfl keys generate``). Each policy role i then publishes to
            ``PORT+3+2i`` and reads from ``PORT+4+2i``; the control socket (``PORT+2``)
            tells an authenticated client its role's ports (``hello``). "" = plaintext
            on ``PORT``/``PORT+1``, allowed on a loopback ``bind`` only.
        policy_file: topic permissions per role (:mod:`pubsub.policy`); "" = the
            packaged ``broker/default_policy.toml``. Used with ``keys_dir`` only.
        members_file: run membership (:mod:`pubsub.membership`): which identities may
            publish in and read which run. Used with ``keys_dir`` only. With CURVE every
            message's publisher id must also be the sender's own (:mod:`broker.identity`).
        runs: run memberships given inline, ``RUN=NAME,NAME,...``
            (:func:`pubsub.membership.inline_membership`: each admits its names to the
            run, its alignment and its predictions); not with ``members_file``.
        open_runs: with CURVE and neither ``members_file`` nor ``runs``: admit any
            identity of a role to that role's topics in every run (runs are then not
            isolated from other keys of the allow-list; the broker says so at start).
            False (the default): such a broker refuses to start, naming the options, so
            a CURVE broker isolates its runs unless told otherwise.
        max_subscriptions_per_identity: with CURVE, most subscriptions one identity (key)
            may hold at once over all its connections; further ones are refused and
            counted (``capped``); 0 = no cap. A VFL party holds one per batch of an
            epoch (plus a few), so a run with more batches per epoch needs more.
        io_threads: libzmq I/O threads of the broker's context. They do the TCP work and,
            with CURVE, the decryption and re-encryption of every message, off the
            forwarding thread. On 2 cores, 2 threads with CURVE measured 287-397 MB/s at
            64 KiB against 292-346 with 1 (``bench/bus.py --broker-set io_threads=N``,
            five runs each way): within this machine's noise, so the default stays 1.
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
    keys_dir: str = ""
    policy_file: str = ""
    members_file: str = ""
    runs: tuple[str, ...] = ()
    open_runs: bool = False
    max_subscriptions_per_identity: int = 65_536
    io_threads: int = 1

    def __post_init__(self) -> None:
        if self.overflow not in ("drop", "block"):
            raise ValueError(f"overflow must be 'drop' or 'block', got {self.overflow!r}")
        addr = BrokerAddress.parse(self.bind)
        if not self.keys_dir:
            check_insecure_allowed(addr, what="broker")
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s!r}")
        if self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {self.max_message_bytes!r}")
        if not 1 <= self.io_threads <= 16:
            raise ValueError(f"io_threads must be in 1..16, got {self.io_threads!r}")
        if self.max_subscriptions_per_identity < 0:
            raise ValueError("max_subscriptions_per_identity must be >= 0, got "
                             f"{self.max_subscriptions_per_identity!r}")
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
        seq_anomalies: jumps of more than ``pubsub.receiver.MAX_GAP_JUMP`` in a
            publisher's sequence (forged, not lost: they do not count as gaps).
        started_at: Unix time the broker started.
        forbidden: with CURVE, messages dropped because the sender's role may not
            publish their topic, by role.
        spoofed: with CURVE, messages dropped because their publisher id is not the
            sender's (another identity's id), by sender identity.
        not_member: with a run membership, messages dropped because the sender's
            identity is not a member of the topic's run, by sender identity.
        not_member_reads: with a run membership, subscriptions refused because they
            reach outside the runs the identity is a member of, by identity.
        capped: with CURVE, subscriptions refused because the identity already held
            ``max_subscriptions_per_identity``, by identity.
        refused_subscriptions: with CURVE, subscriptions not forwarded because the
            role may read no topic they cover, by role (such a role's endpoint never
            forwards those topics anyway).
        auth_denied: CURVE handshakes refused by the ZAP handler (unknown key, or a key
            used on another role's endpoint).
    """

    __slots__ = ("keys", "subscriptions", "subscribe_events", "unsubscribe_events",
                 "rejected", "stalls", "stalled_s", "gaps", "started_at", "forbidden",
                 "refused_subscriptions", "auth_denied", "spoofed", "not_member",
                 "not_member_reads", "capped", "seq_anomalies")

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
        self.forbidden: dict[str, int] = {}
        self.refused_subscriptions: dict[str, int] = {}
        self.auth_denied = 0
        self.spoofed: dict[str, int] = {}
        self.not_member: dict[str, int] = {}
        self.not_member_reads: dict[str, int] = {}
        self.capped: dict[str, int] = {}
        self.seq_anomalies = 0

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
            "forbidden": dict(self.forbidden),
            "refused_subscriptions": dict(self.refused_subscriptions),
            "auth_denied": self.auth_denied,
            "spoofed": dict(self.spoofed),
            "not_member": dict(self.not_member),
            "not_member_reads": dict(self.not_member_reads),
            "capped": dict(self.capped),
            "seq_anomalies": self.seq_anomalies,
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


class _Authenticator(ThreadAuthenticator):
    """ZAP handler (``zmq.auth``'s thread authenticator) for the broker's allow-list.

    A key is admitted on the control socket if it is in the allow-list, and on a role's
    endpoints only if the allow-list gives it that role. The ZAP User-Id is the
    identity's name, so the control socket knows who says hello.
    """

    def __init__(self, ctx: zmq.Context, certs: dict[bytes, Certificate],
                 stats: BrokerStats) -> None:
        super().__init__(ctx)
        self._certs = certs
        self._stats = stats

    def callback(self, domain: str, key: bytes) -> bool:
        """Credentials-provider hook: ``key`` is the client's Z85 public key."""
        cert = self._certs.get(key)
        ok = cert is not None and (domain == CONTROL_DOMAIN or cert.role == domain)
        if not ok:
            self._stats.auth_denied += 1
            log.warning("broker.auth_denied", endpoint=domain, key_prefix=key[:8].decode(),
                        known_key=cert is not None,
                        key_role=cert.role if cert is not None else None)
        return ok

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The identity name of an admitted key (the ZAP User-Id)."""
        cert = self._certs.get(z85.encode(client_public_key))
        return cert.name if cert is not None else "?"


@dataclass(frozen=True, kw_only=True)
class Security:
    """What a CURVE broker loads before it binds: the topic policy, its own key pair, the
    allow-list's certificates and the run membership (None with ``open_runs``)."""

    policy: Policy
    server_keys: tuple[bytes, bytes]
    certs: tuple[Certificate, ...]
    members: RunMembership | None


def load_security(cfg: BrokerConfig) -> Security:
    """Read ``cfg``'s policy, broker key, allow-list and membership, and check that they
    agree (every key's role is a policy role; every member is on the allow-list).

    Raises:
        KeyFileError: a missing or malformed key, or a key whose role the policy lacks.
        ConfigError: an invalid policy or membership file.
    """
    policy = load_policy(cfg.policy_file or DEFAULT_POLICY_FILE)
    own = read_certificate(Path(cfg.keys_dir) / f"{BROKER_KEY_NAME}.key_secret", secret=True)
    assert own.secret_key is not None
    certs = read_public_directory(cfg.keys_dir)
    roles = set(policy.names)
    for c in certs:
        if c.role not in roles:
            raise KeyFileError(c.path, f"role {c.role!r} is not a policy role "
                               f"({', '.join(policy.names)}); regenerate with --role")
    names = {c.name for c in certs}
    members = _membership(cfg)
    if members is not None:
        for run, ids in members.runs.items():
            unknown = sorted(ids - names)
            if unknown:
                raise ConfigError("members", f"run {run!r} lists {unknown}, not in the "
                                  f"allow-list of {cfg.keys_dir}")
    log.info("broker.security", mechanism="CURVE", identities=len(certs),
             roles=list(policy.names), broker_key_prefix=own.public_key[:8].decode())
    return Security(policy=policy, server_keys=(own.public_key, own.secret_key),
                    certs=tuple(certs), members=members)


def _membership(cfg: BrokerConfig) -> RunMembership | None:
    """The run membership ``cfg`` declares (file or inline), or None with ``open_runs``.

    Raises:
        ConfigError: both a file and inline runs, an open broker with a membership, or
            none of the three (a CURVE broker isolates its runs by default).
    """
    if cfg.members_file and cfg.runs:
        raise ConfigError("members", "give the run membership as a file (--members) or "
                          "inline (--run), not both")
    if cfg.open_runs:
        if cfg.members_file or cfg.runs:
            raise ConfigError("open_runs", "an open broker admits any identity to every "
                              "run: not with a run membership (--members, --run, --job)")
        log.warning("broker.runs_not_isolated",
                    detail="open_runs: any key of the allow-list may read and publish its "
                           "role's topics in every run")
        return None
    if cfg.members_file:
        return load_membership(cfg.members_file)
    if cfg.runs:
        return inline_membership(cfg.runs)
    raise ConfigError("members", "a CURVE broker admits to a run only its members: give "
                      "them with --job JOB.toml, --members FILE or --run RUN=NAME,NAME "
                      "(or --open-runs to admit any key of the allow-list to every run, "
                      "not isolated)")


class Broker:
    """An XSUB/XPUB forwarder with counters, a control socket and, with CURVE, per-role
    endpoints that enforce a topic policy.

    Plaintext (``keys_dir`` empty, loopback only): publishers connect to ``PORT``
    (XSUB), subscribers to ``PORT+1`` (XPUB), control to ``PORT+2`` (a ROUTER that
    answers REQ clients).

    CURVE (``keys_dir`` set): every socket is a CURVE server with the broker's key, and
    ``zmq.auth`` checks each client's key against the allow-list. Role i of the policy
    has its own XSUB on ``PORT+3+2i`` and XPUB on ``PORT+4+2i`` (ZAP domain = the role,
    so only keys of that role get in). A message arriving on role i's XSUB whose topic
    role i may not publish is dropped and counted (``forbidden``); a message is forwarded
    only to the XPUBs of roles that may read its topic, so a forbidden subscription
    never receives data; a subscription no topic of which the role may read is not
    passed upstream (``refused_subscriptions``). Decisions are cached per topic (one
    dict lookup per message). The control socket answers ``hello`` with the caller's
    identity, role, ports and rules.

    Call :meth:`bind` then :meth:`run` (blocking, in one thread). :meth:`stop`
    may be called from any thread or a signal handler.

    Args:
        config: :class:`BrokerConfig`.

    Raises:
        zmq.ZMQError: from :meth:`bind` if the ports are taken (with the address).
        KeyFileError: from :meth:`bind`: missing or malformed keys, or an allow-listed
            key whose role the policy does not know.
        ConfigError: from :meth:`bind`: an invalid policy file.
    """

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.config = config or BrokerConfig()
        self.stats = BrokerStats()
        self._stop = threading.Event()
        self._ctx: zmq.Context | None = None
        self._auth: _Authenticator | None = None
        self._ins: list[zmq.Socket] = []  # XSUB per role (one in plaintext)
        self._outs: list[zmq.Socket] = []  # XPUB per role (one in plaintext)
        self._control: zmq.Socket | None = None
        self.address: BrokerAddress | None = None
        self.policy: Policy | None = None
        self._certs: dict[bytes, Certificate] = {}
        self._by_name: dict[str, Certificate] = {}
        self._server_keys: tuple[bytes, bytes] | None = None
        self._closed = False
        self._held: tuple[list[Any], list[int], int, list[zmq.Socket]] | None = None
        self._seqs: dict[tuple[bytes, bytes], int] = {}
        self._held_since = 0.0
        # topic -> (bitmask of roles that may publish it, XPUBs of roles that may read it)
        self._routes: dict[bytes, tuple[int, tuple[zmq.Socket, ...]]] = {}
        self._publishers: dict[bytes, str] = {}  # client id (from hello) -> identity
        self._forbidden_logged: set[tuple[int, bytes]] = set()
        self._senders: SenderCheck | None = None  # with CURVE (see _load_security)
        self._members: RunMembership | None = None
        self._book: SubscriptionBook | None = None  # with CURVE: XPUB_MANUAL

    @property
    def secure(self) -> bool:
        """True when CURVE and the topic policy are on (``keys_dir`` set)."""
        return bool(self.config.keys_dir)

    @property
    def isolation(self) -> str:
        """How runs are isolated, in words (the start line says it)."""
        if not self.secure:
            return "runs not isolated (plaintext)"
        if self._members is None:
            return "open runs: not isolated"
        n = len(self._members.runs)
        return f"runs isolated: {n} run{'s' if n != 1 else ''} with members"

    @property
    def n_ports(self) -> int:
        """How many consecutive ports from the base the broker uses (3 in plaintext,
        ``3 + 2 × roles`` with CURVE)."""
        return 3 + 2 * len(self.policy.roles) if self.policy is not None else 3

    # ------------------------------------------------------------------ setup
    def _load_security(self) -> None:
        sec = load_security(self.config)
        self.policy, self._server_keys = sec.policy, sec.server_keys
        self._certs = {c.public_key: c for c in sec.certs}
        self._by_name = {c.name: c for c in sec.certs}
        self._members = sec.members
        self._senders = SenderCheck(sec.members)
        self._book = SubscriptionBook(self.config.max_subscriptions_per_identity)

    def bind(self) -> BrokerAddress:
        """Bind the sockets; returns the actual base address.

        With PORT 0 a random base port in 20000..59999 whose ports are all free is
        chosen (up to 100 tries).

        Raises:
            zmq.ZMQError: the ports are in use (message names the address).
            KeyFileError, ConfigError: bad keys or policy (CURVE only).
        """
        want = BrokerAddress.parse(self.config.bind)
        if self.secure and self.policy is None:
            self._load_security()
        self._ctx = zmq.Context(io_threads=self.config.io_threads)
        if self.secure:
            self._auth = _Authenticator(self._ctx, self._certs, self.stats)
            self._auth.start()
            assert self.policy is not None
            for domain in (*self.policy.names, CONTROL_DOMAIN):
                self._auth.configure_curve_callback(domain, self._auth)
        if want.port != 0:
            if want.port + self.n_ports - 1 > 65535:
                raise zmq.ZMQError(msg=f"base port {want.port} + {self.n_ports - 1} exceeds 65535")
            self._bind_at(want.host, want.port)
            self.address = want
        else:
            last: Exception | None = None
            for _ in range(100):
                port = random.randrange(20000, 60000 - self.n_ports)
                try:
                    self._bind_at(want.host, port)
                except zmq.ZMQError as exc:
                    last = exc
                    self._close_sockets()
                    continue
                self.address = BrokerAddress(host=want.host, port=port)
                break
            else:
                raise zmq.ZMQError(msg=f"no {self.n_ports} free consecutive ports on {want.host}: {last}")
        log.info("broker.bound", address=str(self.address), secure=self.secure, ports=self.n_ports)
        return self.address

    def _socket(self, kind: int, domain: str) -> zmq.Socket:
        assert self._ctx is not None
        s = self._ctx.socket(kind)
        s.setsockopt(zmq.LINGER, int(self.config.linger_s * 1000))
        if self._server_keys is not None:
            s.setsockopt(zmq.CURVE_SERVER, 1)
            s.setsockopt(zmq.CURVE_PUBLICKEY, self._server_keys[0])
            s.setsockopt(zmq.CURVE_SECRETKEY, self._server_keys[1])
            s.setsockopt(zmq.ZAP_DOMAIN, domain.encode())
        return s

    def _bind_at(self, host: str, port: int) -> None:
        cfg = self.config
        # a ROUTER that keeps the REQ envelope itself: libzmq's REP stopped delivering
        # requests after a burst of envelope-less DEALER messages from peers that then
        # left (its control socket fell silent for good; 1 run in about 20 of the fuzz
        # test, and within 40 bursts in a loop)
        self._control = self._socket(zmq.ROUTER, CONTROL_DOMAIN)
        self._control.setsockopt(zmq.MAXMSGSIZE, CONTROL_MAX_BYTES)
        roles = self.policy.names if self.policy is not None else ("",)
        for role in roles:
            self._ins.append(self._socket(zmq.XSUB, role))
            self._outs.append(self._socket(zmq.XPUB, role))
        for xsub, xpub in zip(self._ins, self._outs, strict=True):
            xsub.setsockopt(zmq.RCVHWM, cfg.rcvhwm)
            xsub.setsockopt(zmq.SNDHWM, 0)  # subscriptions upstream: never capped
            # a frame above the bound closes its sender's connection before libzmq
            # allocates it (an 80 MB frame would otherwise sit in the broker's memory,
            # twice with CURVE, before _pump_messages could reject it); a message whose
            # frames are each within the bound but together above it is still received
            # and rejected there (counted)
            xsub.setsockopt(zmq.MAXMSGSIZE, cfg.max_message_bytes + FRAME_SLACK_BYTES)
            xpub.setsockopt(zmq.SNDHWM, cfg.sndhwm)
            xpub.setsockopt(zmq.RCVHWM, 0)  # subscriptions in: never capped
            xpub.setsockopt(zmq.MAXMSGSIZE, SUBSCRIPTION_MAX_BYTES)
            if cfg.overflow == "block":
                xpub.setsockopt(zmq.XPUB_NODROP, 1)
            if self.secure:  # the broker applies each connection's subscriptions itself
                xpub.setsockopt(zmq.XPUB_MANUAL, 1)
        addr = BrokerAddress(host=host, port=port)
        try:
            self._control.bind(addr.control_endpoint)
            for i, (xsub, xpub) in enumerate(zip(self._ins, self._outs, strict=True)):
                pub_off, sub_off = (0, 1) if self.policy is None else (3 + 2 * i, 4 + 2 * i)
                xsub.bind(addr.endpoint(pub_off))
                xpub.bind(addr.endpoint(sub_off))
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
        if self._control is None:
            self.bind()
        control = self._control
        assert control is not None
        ins, outs = list(self._ins), list(self._outs)
        cfg = self.config
        poller = zmq.Poller()
        for s in (*ins, *outs, control):
            poller.register(s, zmq.POLLIN)
        timeout_ms = int(cfg.poll_interval_s * 1000)
        burst = cfg.drain_burst
        next_stats = time.monotonic() + cfg.stats_interval_s if cfg.stats_interval_s > 0 else None
        ins_registered = True
        role_of = {s: i for i, s in enumerate(ins)}
        out_index = {s: i for i, s in enumerate(outs)}
        subs = SubscriptionForwarder(stats=self.stats, policy=self.policy, ins=ins,
                                     book=self._book, members=self._members)
        plane = ControlPlane(config=cfg, stats=self.stats, address=self.address,
                             policy=self.policy, by_name=self._by_name,
                             publishers=self._publishers, members=self._members)
        try:
            while not self._stop.is_set():
                # while a message is held (block policy), poll briefly and do not read
                # publishers: their queues fill and they feel the backpressure
                events = dict(poller.poll(1 if self._held is not None else timeout_ms))
                for s in outs:
                    if s in events:
                        subs.pump(s, out_index[s], burst)
                if self._held is not None:
                    self._retry_held()
                if self._held is None and not ins_registered:
                    for s in ins:
                        poller.register(s, zmq.POLLIN)
                    ins_registered = True
                if self._held is None:
                    for s in ins:
                        if s in events:
                            self._pump_messages(s, role_of[s], burst)
                            if self._held is not None:
                                break
                if self._held is not None and ins_registered:
                    for s in ins:
                        poller.unregister(s)
                    ins_registered = False
                if control in events:
                    plane.serve(control)
                if next_stats is not None and time.monotonic() >= next_stats:
                    next_stats = time.monotonic() + cfg.stats_interval_s
                    self._publish_stats()
        finally:
            self.close()

    def _route(self, topic: bytes) -> tuple[int, tuple[zmq.Socket, ...]]:
        """(publisher-role bitmask, reader XPUBs) for ``topic``; cached, bounded."""
        if self.policy is None:
            r = (-1, tuple(self._outs))
        else:
            text = topic.decode("utf-8", "replace")
            rules = self.policy.roles
            r = (self.policy.publish_mask(text),
                 tuple(x for x, rr in zip(self._outs, rules, strict=True) if rr.may_read(text)))
        if len(self._routes) >= _MAX_ROUTES:
            self._routes.clear()
        self._routes[topic] = r
        return r

    def _pump_messages(self, xsub: zmq.Socket, role: int, burst: int) -> None:
        """Forward up to ``burst`` messages from one XSUB: check frame 0, count, route, send.

        The hot path of the broker. Per message: one ``recv`` of frame 0 as bytes
        (plus zero-copy receives of any payload frames), :func:`parse_head` (NUL,
        version, CRC), one counter lookup, one sequence lookup, one route lookup (the
        publish permission and the reader endpoints, cached per topic) and one ``send``
        per reader endpoint (one in plaintext).
        """
        st = self.stats
        counter = st.counter
        counters = st.keys
        validate = self.config.validate
        block = self.config.overflow == "block"
        max_bytes = self.config.max_message_bytes
        seqs = self._seqs
        routes = self._routes
        route = self._route
        bit = 1 << role
        noblock = _NOBLOCK
        recv, get, send = _recv, _get, _send
        senders = self._senders if validate else None
        fr: Any = None
        for _ in range(burst):
            try:
                if senders is None:
                    f = recv(xsub, noblock, True, False)
                else:  # with CURVE: the frame carries the sender's identity (User-Id)
                    fr = recv(xsub, noblock, False, False)
                    f = fr.bytes
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
            topic = f[:nul]
            r = routes.get(topic)
            if r is None:
                r = route(topic)
            if not r[0] & bit:
                self._forbidden(role, topic, f[ps:js] if validate else b"")
                continue
            if senders is not None:
                uid = fr.get("User-Id")
                why = senders.check(uid, f[ps:js], topic)
                if why is not None:
                    self._refused_sender(why, uid, topic, f[ps:js])
                    continue
            if validate:
                # sequence gaps per (publisher, topic)
                sk = (f[ps:js], topic)
                last = seqs.get(sk)
                if last is not None:
                    if seq > last + 1:
                        missing = seq - last - 1
                        if missing > MAX_GAP_JUMP:  # no queue loses this many: forged
                            st.seq_anomalies += 1
                        else:
                            st.gaps += missing
                            c[4] += missing
                elif len(seqs) >= _MAX_SEQ_KEYS:
                    seqs.clear()
                seqs[sk] = seq
            outs = r[1]
            if block:
                if frames is None:
                    frames = [f]
                for i, xpub in enumerate(outs):
                    try:
                        send_envelope(xpub, frames, noblock)
                    except zmq.Again:
                        self._hold(frames, c, nbytes, list(outs[i:]))
                        return
            elif frames is None:
                for xpub in outs:
                    send(xpub, f, 0, True, False)
            else:
                for xpub in outs:
                    send_envelope(xpub, frames)
            c[2] += 1
            c[3] += nbytes

    def _forbidden(self, role: int, topic: bytes, publisher: bytes) -> None:
        """Count and log (once per role and topic class, then every 1000th) a message
        whose topic the sender's role may not publish. The identity is the one that said
        hello with the envelope's publisher id on this role's endpoint ("unverified"
        when the publisher id was never announced)."""
        assert self.policy is not None
        name = self.policy.roles[role].name
        st = self.stats
        n = st.forbidden[name] = st.forbidden.get(name, 0) + 1
        cls = topic.partition(b"/")[0]
        if (role, cls) not in self._forbidden_logged or n % 1000 == 0:
            if len(self._forbidden_logged) < 4096:
                self._forbidden_logged.add((role, cls))
            pub = publisher.decode("utf-8", "replace")
            ident = self._publishers.get(publisher)
            log.warning("broker.publish_forbidden", role=name,
                        identity=ident if ident is not None else "unverified",
                        publisher=pub, topic=topic[:80].decode("utf-8", "replace"), forbidden=n)

    def _refused_sender(self, why: str, identity: str, topic: bytes, publisher: bytes) -> None:
        """Count (by sender identity) and log (once per identity and reason, then every
        1000th) a message refused by :class:`broker.identity.SenderCheck`."""
        counts = self.stats.spoofed if why == SPOOFED else self.stats.not_member
        n = counts[identity] = counts.get(identity, 0) + 1
        if n == 1 or n % 1000 == 0:
            log.warning(f"broker.publish_{why}", identity=identity,
                        publisher=publisher[:80].decode("utf-8", "replace"),
                        topic=topic[:80].decode("utf-8", "replace"), refused=n)

    def _reject(self, reason: str) -> None:
        st = self.stats
        st.rejected += 1
        if st.rejected == 1 or st.rejected % 1000 == 0:
            log.warning("broker.frame_rejected", reason=reason, rejected=st.rejected)

    def _hold(self, frames: list[Any], c: list[int], nbytes: int,
              outs: list[zmq.Socket]) -> None:
        self._held = (frames, c, nbytes, outs)
        self._held_since = time.monotonic()
        self.stats.stalls += 1

    def _retry_held(self) -> None:
        assert self._held is not None
        frames, c, nbytes, outs = self._held
        while outs:
            try:
                send_envelope(outs[0], frames, zmq.NOBLOCK)
            except zmq.Again:
                return
            outs.pop(0)
        self._held = None
        self.stats.stalled_s += time.monotonic() - self._held_since
        c[2] += 1
        c[3] += nbytes

    def _publish_stats(self) -> None:
        frames = encode(STATS_TOPIC, (), self.stats.as_dict(), publisher="broker")
        outs = self._outs if self.policy is None else [
            x for x, rr in zip(self._outs, self.policy.roles, strict=True)
            if rr.may_read(STATS_TOPIC)]
        for xpub in outs:
            try:
                xpub.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                pass

    def close(self) -> None:
        """Close sockets, the ZAP handler and the context; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_sockets()
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        log.info("broker.stopped", **{k: v for k, v in self.stats.as_dict().items()
                                      if k in ("rejected", "subscriptions", "forbidden",
                                               "auth_denied")})

    def _close_sockets(self) -> None:
        linger = int(self.config.linger_s * 1000)
        for s in (*self._ins, *self._outs, self._control):
            if s is not None:
                s.close(linger=linger)
        self._ins, self._outs, self._control = [], [], None
        self._routes.clear()


def serve_in_thread(config: BrokerConfig) -> tuple[Broker, threading.Thread]:
    """Start a broker in a daemon thread (tests, benchmarks). Returns it once bound."""
    broker = Broker(config)
    broker.bind()
    t = threading.Thread(target=broker.run, name="broker", daemon=True)
    t.start()
    return broker, t


