"""The broker's control socket: ``stats`` (the counters), ``ping`` (the clients'
keepalive) and ``hello`` (with CURVE: the caller's identity, role, ports, topic rules and the runs it
is a member of),
one JSON reply per request, whatever the request holds.

Owns: :class:`ControlPlane`. May import :mod:`pubsub`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
import structlog
import zmq

from pubsub.address import BrokerAddress
from pubsub.membership import RunMembership
from pubsub.policy import Policy
from pubsub.security import Certificate, publisher_id

log = structlog.get_logger("broker.proxy")
_MAX_ROUTES = 1 << 16


class ControlPlane:
    """Answers the requests on the broker's control socket (a ROUTER).

    Args:
        config: the broker's :class:`broker.proxy.BrokerConfig`.
        stats: the broker's counters (:class:`broker.proxy.BrokerStats`).
        address: the broker's bound address (``ping`` says it).
        policy: the topic policy with CURVE; None in plaintext.
        by_name: the allow-list's certificates by identity name.
        publishers: client id -> identity, filled by ``hello`` (the forwarding loop's
            check that a message's publisher id is its sender's).
        members: the run membership with CURVE (None: an open broker, or plaintext);
            ``hello`` tells each identity its part (:meth:`RunMembership.view`).
    """

    def __init__(self, *, config: Any, stats: Any, address: BrokerAddress | None,
                 policy: Policy | None, by_name: dict[str, Certificate],
                 publishers: dict[bytes, str], members: RunMembership | None = None) -> None:
        self.config = config
        self.stats = stats
        self.address = address
        self.policy = policy
        self._by_name = by_name
        self._publishers = publishers
        self._members = members

    def serve(self, control: zmq.Socket, burst: int = 64) -> None:
        """Answer up to ``burst`` queued control requests. ``control`` is a ROUTER: a request is
        ``[peer, *envelope, b"", *body]`` (a REQ's envelope); the reply goes back with the
        same envelope. Any body gets a reply (several frames, not JSON, not an object, an
        unknown command: ``ok`` false with the reason); a message without the envelope's
        empty delimiter cannot be answered and is counted as rejected. The socket never
        raises out of the broker's loop."""
        for _ in range(burst):
            try:
                frames = control.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            except zmq.ZMQError as exc:  # pragma: no cover - not expected of a ROUTER
                self.stats.rejected += 1
                log.warning("broker.control_error", error=str(exc))
                return
            delim = next((i for i in range(1, len(frames)) if not len(frames[i])), None)
            if delim is None:  # no REQ envelope: nowhere to send a reply
                self.stats.rejected += 1
                continue
            envelope = [f.bytes for f in frames[:delim + 1]]
            reply = self.reply(frames[delim + 1:])
            try:
                control.send_multipart([*envelope, orjson.dumps(reply)], zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # pragma: no cover - a ROUTER drops to a gone peer
                log.warning("broker.control_reply_dropped", error=str(exc))

    def reply(self, frames: list[Any]) -> dict[str, Any]:
        """The reply to one request body (its frames, without the envelope)."""
        raw = frames[0].bytes if frames else b""
        identity = ""
        if self.policy is not None and frames:
            with contextlib.suppress(zmq.ZMQError):
                identity = frames[0].get("User-Id") or ""
        req: Any = None
        cmd = None
        if len(frames) == 1:
            try:
                req = orjson.loads(raw)
                cmd = req.get("cmd") if isinstance(req, dict) else None
            except orjson.JSONDecodeError:
                req = None
        if cmd == "stats":
            return {"ok": True, "stats": self.stats.as_dict()}
        if cmd == "ping":
            return {"ok": True, "address": str(self.address)}
        if cmd == "hello":
            return self.hello(identity, req)
        self.stats.rejected += 1
        what = (f"{len(frames)} frames" if len(frames) != 1 else repr(raw[:64]))
        return {"ok": False,
                "error": f"unknown request {what}; send one JSON frame with "
                         "cmd=stats|ping|hello"}

    def hello(self, identity: str, req: Any) -> dict[str, Any]:
        """The caller's role, ports (offsets from the base port) and rules."""
        if self.policy is None:
            return {"ok": True, "secure": False, "role": "", "identity": "",
                    "pub_offset": 0, "sub_offset": 1, "rules": None,
                    "max_message_bytes": self.config.max_message_bytes}
        cert = self._by_name.get(identity)
        if cert is None:
            return {"ok": False, "error": f"unknown identity {identity!r}"}
        i = self.policy.index(cert.role)
        client_id = req.get("client_id") if isinstance(req, dict) else None
        if isinstance(client_id, str) and 0 < len(client_id) <= 256:
            if len(self._publishers) >= _MAX_ROUTES:
                self._publishers.clear()
            self._publishers[publisher_id(identity, client_id).encode()] = identity
        log.info("broker.hello", identity=identity, role=cert.role)
        return {"ok": True, "secure": True, "role": cert.role, "identity": identity,
                "pub_offset": 3 + 2 * i, "sub_offset": 4 + 2 * i,
                "rules": self.policy.roles[i].as_dict(),
                "max_subscriptions": self.config.max_subscriptions_per_identity,
                "max_message_bytes": self.config.max_message_bytes,
                "runs": (None if self._members is None
                         else self._members.view(identity).as_dict())}


__all__ = ["ControlPlane"]
