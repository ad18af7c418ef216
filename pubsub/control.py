"""Client side of the broker's control protocol (REQ to ``PORT+2``, JSON in and out).

Requests are ``{"cmd": "stats"}`` or ``{"cmd": "ping"}``; replies are
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import orjson
import zmq
from zmq.utils.monitor import parse_monitor_message

from pubsub.address import BrokerAddress
from pubsub.config import ConfigError
from pubsub.errors import AuthenticationFailed, BrokerUnreachable, BusError
from pubsub.membership import RunMembership, membership_from_dict
from pubsub.policy import RoleRules
from pubsub.security import CurveClient, check_insecure_allowed, classify_handshake


class ControlError(BusError, RuntimeError):
    """The broker answered a control request with an error."""


#: Deadline (seconds) of the plaintext probe that tells a plaintext broker from a broker
#: holding another key (one ZMTP greeting exchange: a round trip).
PLAINTEXT_PROBE_TIMEOUT_S = 1.0


def _broker_speaks_plaintext(ctx: Any, endpoint: str,
                             timeout_s: float = PLAINTEXT_PROBE_TIMEOUT_S) -> bool:
    """Whether a NULL-mechanism (plaintext) ZMTP handshake with ``endpoint`` succeeds.

    Used only after a CURVE client's handshakes failed without a cause: the peer that
    detects a mechanism mismatch may close the connection before the other side reads
    its greeting, so "plaintext broker" and "broker with another key" can look the same
    from the CURVE side. The probe sends no message (only the ZMTP greeting), so nothing
    reaches the broker's control loop. Blocks at most ``timeout_s`` seconds.
    """
    sock = zmq.Socket(ctx, zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    mon_addr = f"inproc://ctl-probe-{uuid.uuid4().hex}"
    sock.monitor(mon_addr, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                 | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    mon = zmq.Socket(ctx, zmq.PAIR)
    mon.setsockopt(zmq.LINGER, 0)
    mon.connect(mon_addr)
    try:
        sock.connect(endpoint)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not mon.poll(int(left * 1000) + 1, zmq.POLLIN):
                return False
            ev = parse_monitor_message(mon.recv_multipart())
            return int(ev["event"]) == int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        return False
    finally:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
        mon.close(0)
        sock.close(0)


def _raise_on_handshake(events: list[tuple[int, int]], address: BrokerAddress, endpoint: str,
                        security: CurveClient | None,
                        probe_plaintext: Callable[[], bool] | None = None) -> str:
    """Raise :class:`AuthenticationFailed` if the monitor events end the handshake;
    else return the verdict's state (``ok``/``pending``/``unreachable``).

    ``probe_plaintext`` (a CURVE client only) is asked before concluding "wrong pinned
    key": if a plaintext handshake succeeds, the broker is plaintext."""
    verdict = classify_handshake(events)
    if verdict.state == "refused":
        raise AuthenticationFailed(str(address), endpoint, "refused", verdict.status,
                                   f"identity {security.identity!r}" if security else "")
    if verdict.state == "mechanism":
        raise AuthenticationFailed(str(address), endpoint,
                                   "plaintext" if security is not None else "curve_required")
    if verdict.state == "server_key":
        if security is None:  # a plaintext client never pins a key
            raise AuthenticationFailed(str(address), endpoint, "curve_required")
        if probe_plaintext is not None and probe_plaintext():
            raise AuthenticationFailed(str(address), endpoint, "plaintext")
        raise AuthenticationFailed(str(address), endpoint, "server_key", 0,
                                   f"pinned key from {security.server_key_file or '?'}")
    return verdict.state


class _Attempt:
    """One control request with a socket monitor (the part shared by the sync
    :func:`control_request` and the asyncio :func:`hello`)."""

    def __init__(self, ctx: Any, address: BrokerAddress, security: CurveClient | None,
                 request: dict[str, Any]) -> None:
        self.address, self.security, self.ctx = address, security, ctx
        self.endpoint = address.control_endpoint
        self.sock = zmq.Socket(ctx, zmq.REQ)  # plain socket, polled without blocking
        self.sock.setsockopt(zmq.LINGER, 0)
        if security is not None:
            security.apply(self.sock)
        mon_addr = f"inproc://ctl-mon-{uuid.uuid4().hex}"
        self.sock.monitor(mon_addr, zmq.EVENT_ALL)
        self.mon = zmq.Socket(ctx, zmq.PAIR)
        self.mon.setsockopt(zmq.LINGER, 0)
        self.mon.connect(mon_addr)
        self.events: list[tuple[int, int]] = []
        self.sock.connect(self.endpoint)
        self.sock.send(orjson.dumps(request))

    def step(self) -> Any:
        """The reply if it is here (decoded JSON), else None; raises on a failed handshake."""
        if self.sock.poll(0, zmq.POLLIN):
            return orjson.loads(self.sock.recv())
        _monitor_events(self.mon, self.events)
        _raise_on_handshake(self.events, self.address, self.endpoint, self.security,
                            lambda: _broker_speaks_plaintext(self.ctx, self.endpoint))
        return None

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self.mon.close(0)
        self.sock.close(0)


def control_request(
    address: str | BrokerAddress, cmd: str, *, timeout_s: float = 2.0,
    security: CurveClient | None = None,
) -> dict[str, Any]:
    """Send one control request and return the reply (blocking; a few ms on loopback).

    Args:
        address: broker base address ``tcp://HOST:PORT``.
        cmd: ``"stats"``, ``"ping"`` or ``"hello"``.
        timeout_s: reply deadline in seconds.
        security: CURVE keys for a secure broker (None: plaintext, loopback only).

    Raises:
        BrokerUnreachable: no reply within ``timeout_s``.
        AuthenticationFailed: the handshake failed (refused key, wrong pinned key, or
            plaintext on one side and CURVE on the other), at once.
        ControlError: the broker answered ``ok: false``.
        InsecureTransport: plaintext to a non-loopback address.
    """
    addr = address if isinstance(address, BrokerAddress) else BrokerAddress.parse(address)
    addr = addr.for_connect()
    if security is None:
        check_insecure_allowed(addr)
    ctx = zmq.Context()
    att = _Attempt(ctx, addr, security, {"cmd": cmd})
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            reply = att.step()
            if reply is not None:
                break
            if time.monotonic() >= deadline:
                raise BrokerUnreachable(str(addr), timeout_s)
            time.sleep(0.002)
    finally:
        att.close()
        ctx.term()
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise ControlError(f"broker at {addr} answered: "
                           f"{reply.get('error') if isinstance(reply, dict) else reply!r}")
    return reply


def request_stats(address: str | BrokerAddress, *, timeout_s: float = 2.0,
                  security: CurveClient | None = None) -> dict[str, Any]:
    """The broker's counters (see ``broker.proxy.BrokerStats.as_dict``).

    Raises:
        BrokerUnreachable: no reply within ``timeout_s``.
        ControlError: the broker refused.
    """
    return control_request(address, "stats", timeout_s=timeout_s, security=security)["stats"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """The broker's answer to ``hello``: who this client is and where it connects.

    Attributes:
        identity: the authenticated identity ("" in plaintext).
        role: its policy role ("" in plaintext).
        pub_offset / sub_offset: the ports to publish to / read from, as offsets from
            the broker's base port (0 and 1 in plaintext).
        rules: the role's topic rules (None in plaintext).
        max_subscriptions: most subscriptions the broker lets this identity hold (0: no
            limit, or an older broker that does not say).
        max_message_bytes: the broker's bound on one message (0: an older broker that
            does not say); a single frame above it closes the sender's connection.
        runs: with CURVE, the runs the broker admits this identity to, with their
            members (:meth:`pubsub.membership.RunMembership.view`); None: every run (an
            open broker, plaintext, or an older broker that does not say).
    """

    identity: str
    role: str
    pub_offset: int
    sub_offset: int
    rules: RoleRules | None
    max_subscriptions: int = 0
    max_message_bytes: int = 0
    runs: RunMembership | None = None


def _monitor_events(mon: Any, events: list[tuple[int, int]]) -> None:
    """Drain a monitor socket's pending events into ``events`` (non-blocking)."""
    while True:
        try:
            frames = mon.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        ev = parse_monitor_message(frames)
        events.append((int(ev["event"]), int(ev["value"])))


async def hello(ctx: zmq.Context[Any], address: BrokerAddress, security: CurveClient | None,
                *, client_id: str, timeout_s: float) -> Hello:
    """Ask the broker's control socket for this client's role and endpoints (asyncio; a few
    ms on loopback). With ``security`` the request is authenticated over CURVE.

    The REQ socket's monitor tells the failure cases apart (see
    :func:`pubsub.security.classify_handshake`); a handshake failure raises at once, not
    at the deadline.

    Args:
        ctx: the client's context (asyncio or plain).
        address: broker base address.
        security: the client's keys and the pinned broker key; None = plaintext.
        client_id: the publisher id this client puts in its envelopes (the broker
            attributes forbidden publishes to the identity that announced it).
        timeout_s: deadline, seconds.

    Raises:
        AuthenticationFailed: the broker refused this key, does not hold the pinned key,
            or speaks CURVE where this client speaks plaintext (or the reverse).
        BrokerUnreachable: no TCP connection, or no answer, within ``timeout_s``.
        ControlError: the broker answered ``ok: false``.
    """
    att = _Attempt(ctx, address, security, {"cmd": "hello", "client_id": client_id})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while True:
            reply = att.step()
            if reply is not None:
                break
            if loop.time() >= deadline:  # no TCP connection, or connected but no answer
                raise BrokerUnreachable(str(address), timeout_s)
            await asyncio.sleep(0.005)
    finally:
        att.close()
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise ControlError(f"broker at {address} refused hello: "
                           f"{reply.get('error') if isinstance(reply, dict) else reply!r}")
    rules = reply.get("rules")
    try:
        runs = None if reply.get("runs") is None else membership_from_dict(reply["runs"])
    except ConfigError as exc:
        raise ControlError(f"broker at {address} sent a malformed run membership: "
                           f"{exc}") from None
    return Hello(
        identity=str(reply.get("identity", "")), role=str(reply.get("role", "")),
        pub_offset=int(reply["pub_offset"]), sub_offset=int(reply["sub_offset"]),
        rules=None if not rules else RoleRules(
            name=str(reply.get("role", "")), publish=tuple(rules.get("publish", ())),
            subscribe=tuple(rules.get("subscribe", ()))),
        max_subscriptions=int(reply.get("max_subscriptions") or 0),
        max_message_bytes=int(reply.get("max_message_bytes") or 0),
        runs=runs)
