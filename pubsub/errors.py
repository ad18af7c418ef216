"""Typed errors of the bus.

Every error carries structured fields naming the offending value, so callers can
react without parsing messages. Errors subclass the builtin whose meaning they
share (``DeadlineExceeded`` is a ``TimeoutError``), so generic handlers still work.
"""

from __future__ import annotations


class BusError(Exception):
    """Root of all bus errors."""


class InvalidTopic(BusError, ValueError):
    """A topic string is empty, too long, or contains a forbidden character.

    Attributes:
        topic: the offending topic.
        reason: why it was rejected.
    """

    def __init__(self, topic: str, reason: str) -> None:
        self.topic = topic
        self.reason = reason
        super().__init__(f"invalid topic {topic!r}: {reason}")


class MalformedFrame(BusError, ValueError):
    """A received multipart message does not decode.

    Raised by :func:`pubsub.codec.decode`; the subscriber's reader counts it as
    rejected and keeps running.

    Attributes:
        reason: what was wrong (bad version byte, checksum mismatch, size mismatch...).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"malformed frame: {reason}")


class MessageTooLarge(BusError, ValueError):
    """A message exceeds a configured byte bound.

    Attributes:
        size: message size in bytes.
        max_bytes: the bound in bytes.
    """

    def __init__(self, size: int, max_bytes: int) -> None:
        self.size = size
        self.max_bytes = max_bytes
        super().__init__(f"message of {size} bytes exceeds the bound of {max_bytes} bytes")


class DeadlineExceeded(BusError, TimeoutError):
    """No message arrived on a topic before the deadline.

    Attributes:
        topic: the topic waited on.
        timeout_s: how long the caller waited, in seconds.
    """

    def __init__(self, topic: str, timeout_s: float) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        super().__init__(f"no message on {topic!r} within {timeout_s:.3f} s")


class BrokerUnreachable(BusError, ConnectionError):
    """The broker did not answer the connect handshake in time.

    Attributes:
        address: the broker address tried.
        timeout_s: how long the client tried, in seconds.
    """

    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        super().__init__(
            f"no broker answered at {address} within {timeout_s:.1f} s "
            "(is `psfl broker run` running there, and are its ports reachable: PORT, PORT+1 "
            "and PORT+2, or PORT+2 .. PORT+12 with CURVE?)"
        )


class BusClosed(BusError, RuntimeError):
    """An operation was attempted on a closed bus client."""

    def __init__(self, what: str = "bus") -> None:
        super().__init__(f"{what} is closed")


class ForkedClient(BusError, RuntimeError):
    """A bus client was used in a process other than the one that created it (a forked
    child): its sockets belong to the parent, so the child may not publish, receive or
    close them. Create a fresh client in the child.

    Attributes:
        client_id: the client's id.
        owner_pid / pid: the creating process and the calling one.
    """

    def __init__(self, client_id: str, owner_pid: int, pid: int) -> None:
        self.client_id = client_id
        self.owner_pid = owner_pid
        self.pid = pid
        super().__init__(f"bus client {client_id!r} belongs to process {owner_pid}, not to "
                         f"this process {pid} (forked?): create a new Bus in this process")


class PublishTimeout(BusError, TimeoutError):
    """Under the ``block`` overflow policy, a publish could not be queued in time.

    Attributes:
        topic: the topic.
        timeout_s: how long the publisher waited, seconds.
    """

    def __init__(self, topic: str, timeout_s: float) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        super().__init__(f"publish on {topic!r} blocked for {timeout_s:.3f} s "
                         "(subscribers are not keeping up; overflow policy 'block')")


class PublishWouldBlock(BusError, BlockingIOError):
    """``publish_nowait`` under the ``block`` policy found the send queue full.

    Attributes:
        topic: the topic.
    """

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"send queue full for {topic!r}; await publish() to wait for room")


class KeyFileError(BusError, ValueError):
    """A CURVE key file or name is missing, malformed or too widely readable.

    Attributes:
        path: the offending file, directory or name.
        reason: what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"key file {path!r}: {reason}")


class InsecureTransport(BusError, ValueError):
    """Plaintext (no CURVE) was asked for on a non-loopback address.

    Attributes:
        address: the broker address.
        what: who asked (``client`` or ``broker``).
    """

    def __init__(self, address: str, what: str = "client") -> None:
        self.address = address
        self.what = what
        super().__init__(
            f"{what} at {address}: plaintext is allowed on loopback only; give CURVE keys "
            "(`psfl keys generate`, then --keys DIR) for any other address")


class AuthenticationFailed(BusError, PermissionError):
    """The CURVE handshake with the broker failed.

    Attributes:
        address: the broker address.
        endpoint: the endpoint whose handshake failed.
        kind: ``"refused"`` (the broker is up and rejected this client's key: not in its
            allow-list, or not allowed this role), ``"server_key"`` (the broker is up
            but does not hold the pinned public key: wrong ``broker.key``),
            ``"curve_required"`` (a plaintext client, a CURVE broker) or ``"plaintext"``
            (a CURVE client, a plaintext broker).
        status: the ZAP status code for ``refused`` (400), else 0.
        detail: extra text (the pinned key's file, the identity).
    """

    def __init__(self, address: str, endpoint: str, kind: str, status: int = 0,
                 detail: str = "") -> None:
        self.address = address
        self.endpoint = endpoint
        self.kind = kind
        self.status = status
        self.detail = detail
        if kind == "refused":
            what = (f"the broker at {address} is up and refused this client's key "
                    f"(ZAP status {status}: not in its allow-list for this role; give the "
                    "broker's operator NAME.key for its --keys directory, then restart it)")
        elif kind == "curve_required":
            what = (f"the broker at {address} is up and requires CURVE: it refused a "
                    "plaintext handshake (give --keys DIR instead of --insecure)")
        elif kind == "plaintext":
            what = (f"the broker at {address} is up but plaintext (started with --insecure): "
                    "it cannot authenticate a CURVE client (start it with --keys DIR, or "
                    "connect with --insecure on loopback)")
        else:
            what = (f"the broker at {address} is up (TCP connected to {endpoint}) but the CURVE "
                    "handshake failed: it does not hold the pinned server public key")
        super().__init__(what + (f"; {detail}" if detail else ""))


class ForbiddenTopic(BusError, PermissionError):
    """The broker's policy does not let this client's role use a topic.

    Attributes:
        topic: the topic.
        role: the client's role.
        action: ``"publish"`` or ``"subscribe"``.
    """

    def __init__(self, topic: str, role: str, action: str) -> None:
        self.topic = topic
        self.role = role
        self.action = action
        super().__init__(f"role {role!r} may not {action} {topic!r} (broker policy)")


class NotRunMember(ForbiddenTopic):
    """The broker admits this client's identity to a run's topics only if it is one of
    the run's members (its run membership, told in the hello), and it is not: of this
    run, or (several isolated members) of this member's own topics.

    Attributes:
        topic: the topic or prefix.
        run: the run it belongs to ("" for a prefix that spans runs).
        identity: this client's identity.
        runs: the runs the broker admits this identity to.
    """

    def __init__(self, topic: str, run: str, identity: str, action: str,
                 runs: tuple[str, ...]) -> None:
        self.topic = topic
        self.role = ""
        self.action = action
        self.run = run
        self.identity = identity
        self.runs = runs
        where = (f"run {run!r}" if run else "a prefix that spans runs (subscribe within one "
                 "run: CLASS/RUN/...)")
        mine = ", ".join(runs[:8]) + (" ..." if len(runs) > 8 else "") if runs else "none"
        super(ForbiddenTopic, self).__init__(  # ForbiddenTopic's message is per role
            f"identity {identity!r} may not {action} {topic!r}: {where} does not "
            f"admit it (the broker's run membership; its runs: {mine})")


class TooManySubscriptions(BusError, ValueError):
    """The broker lets one identity hold at most ``limit`` subscriptions (its
    ``max_subscriptions_per_identity``, told in the hello); this client would need more.

    Attributes:
        topic: the subscription that would exceed the limit.
        limit: the broker's limit.
    """

    def __init__(self, topic: str, limit: int) -> None:
        self.topic = topic
        self.limit = limit
        super().__init__(f"subscribing {topic!r} would exceed the broker's "
                         f"{limit} subscriptions per identity (broker setting "
                         "max_subscriptions_per_identity)")


class SessionError(BusError):
    """Root of the session primitives' errors (:mod:`pubsub.session`)."""


class RendezvousTimeout(SessionError, TimeoutError):
    """A peer did not complete the hello exchange in time.

    Attributes:
        peer: the first peer (in the order given) that had not completed it.
        timeout_s: the deadline, seconds.
        missing: every peer that had not completed it.
    """

    def __init__(self, peer: str, timeout_s: float, missing: tuple[str, ...] = ()) -> None:
        self.peer = peer
        self.timeout_s = timeout_s
        self.missing = missing or (peer,)
        super().__init__(f"peer {peer!r} did not complete the hello exchange within "
                         f"{timeout_s:g} s" + (f" (missing: {list(self.missing)})"
                                               if len(self.missing) > 1 else ""))


class SettingsMismatch(SessionError, ValueError):
    """A peer's settings digest differs from ours.

    Attributes:
        peer: the peer.
        mine / theirs: the two digests (``theirs`` None if its hello carried none).
        hello: the peer's whole hello metadata (its ``info`` fields too).
    """

    def __init__(self, peer: str, mine: str, theirs: object,
                 hello: dict[str, object] | None = None) -> None:
        self.peer = peer
        self.mine = mine
        self.theirs = theirs
        self.hello = hello or {}
        super().__init__(f"peer {peer!r} has settings digest {theirs!r}, ours is {mine!r}")


class PeerLost(SessionError, ConnectionError):
    """A peer's heartbeats stopped.

    Attributes:
        peer: the peer.
        silent_s: how long nothing was heard from it, seconds.
    """

    def __init__(self, peer: str, silent_s: float) -> None:
        self.peer = peer
        self.silent_s = silent_s
        super().__init__(f"peer {peer!r} sent no heartbeat for {silent_s:.1f} s")
