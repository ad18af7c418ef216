"""Client side of the broker's control protocol (REQ to ``PORT+2``, JSON in and out).

Requests are ``{"cmd": "stats"}`` or ``{"cmd": "ping"}``; replies are
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import orjson
import zmq
from zmq.utils.monitor import parse_monitor_message

from pubsub.address import BrokerAddress
from pubsub.errors import AuthenticationFailed, BrokerUnreachable, BusError
from pubsub.policy import RoleRules
from pubsub.security import CurveClient, check_insecure_allowed, classify_handshake


class ControlError(BusError, RuntimeError):
    """The broker answered a control request with an error."""


def control_request(
    address: str | BrokerAddress, cmd: str, *, timeout_s: float = 2.0,
    security: CurveClient | None = None,
) -> dict[str, Any]:
    """Send one control request and return the reply (blocking; a few ms on loopback).

    Args:
        address: broker base address ``tcp://HOST:PORT``.
        cmd: ``"stats"`` or ``"ping"``.
        timeout_s: reply deadline in seconds.
        security: CURVE keys for a secure broker (None: plaintext, loopback only).

    Raises:
        BrokerUnreachable: no reply within ``timeout_s``.
        ControlError: the broker answered ``ok: false``.
        InsecureTransport: plaintext to a non-loopback address.
    """
    addr = address if isinstance(address, BrokerAddress) else BrokerAddress.parse(address)
    addr = addr.for_connect()
    if security is None:
        check_insecure_allowed(addr)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    if security is not None:
        security.apply(sock)
    try:
        sock.connect(addr.control_endpoint)
        sock.send(orjson.dumps({"cmd": cmd}))
        if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            raise BrokerUnreachable(str(addr), timeout_s)
        reply = orjson.loads(sock.recv())
    finally:
        sock.close(0)
        ctx.term()
    if not reply.get("ok"):
        raise ControlError(f"broker at {addr} answered: {reply.get('error')}")
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
    """

    identity: str
    role: str
    pub_offset: int
    sub_offset: int
    rules: RoleRules | None


def _monitor_events(mon: Any, events: list[tuple[int, int]]) -> None:
    """Drain a monitor socket's pending events into ``events`` (non-blocking)."""
    while True:
        try:
            frames = mon.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        if isinstance(frames, Awaitable):  # an asyncio socket would return a future
            raise TypeError("use a plain zmq.Socket for the monitor")
        ev = parse_monitor_message(frames)
        events.append((int(ev["event"]), int(ev["value"])))


async def hello(ctx: zmq.Context[Any], address: BrokerAddress, security: CurveClient,
                *, client_id: str, timeout_s: float) -> Hello:
    """Authenticate to the broker's control socket over CURVE and ask for this client's
    role and endpoints (asyncio; a few ms on loopback).

    The REQ socket's monitor tells the failure cases apart (see
    :func:`pubsub.security.classify_handshake`); a handshake failure raises at once, not
    at the deadline.

    Args:
        ctx: the client's context (asyncio or plain).
        address: broker base address.
        security: the client's keys and the pinned broker key.
        client_id: the publisher id this client puts in its envelopes (the broker
            attributes forbidden publishes to the identity that announced it).
        timeout_s: deadline, seconds.

    Raises:
        AuthenticationFailed: the broker refused this key, or does not hold the pinned key.
        BrokerUnreachable: no TCP connection, or no answer, within ``timeout_s``.
        ControlError: the broker answered ``ok: false``.
    """
    sock = zmq.Socket(ctx, zmq.REQ)  # plain socket, polled without blocking the loop
    sock.setsockopt(zmq.LINGER, 0)
    security.apply(sock)
    mon_addr = f"inproc://hello-mon-{uuid.uuid4().hex}"
    sock.monitor(mon_addr, zmq.EVENT_ALL)
    mon = zmq.Socket(ctx, zmq.PAIR)
    mon.setsockopt(zmq.LINGER, 0)
    mon.connect(mon_addr)
    events: list[tuple[int, int]] = []
    endpoint = address.control_endpoint
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    reply = None
    try:
        sock.connect(endpoint)
        sock.send(orjson.dumps({"cmd": "hello", "client_id": client_id}))
        while True:
            if sock.poll(0, zmq.POLLIN):
                reply = orjson.loads(sock.recv())
                break
            _monitor_events(mon, events)
            verdict = classify_handshake(events)
            if verdict.state == "refused":
                raise AuthenticationFailed(str(address), endpoint, "refused", verdict.status,
                                           f"identity {security.identity!r}")
            if verdict.state == "server_key":
                raise AuthenticationFailed(str(address), endpoint, "server_key", 0,
                                           f"pinned key from {security.server_key_file or '?'}")
            if loop.time() >= deadline:  # no TCP connection, or connected but no answer
                raise BrokerUnreachable(str(address), timeout_s)
            await asyncio.sleep(0.005)
    finally:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
        mon.close(0)
        sock.close(0)
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise ControlError(f"broker at {address} refused hello: "
                           f"{reply.get('error') if isinstance(reply, dict) else reply!r}")
    rules = reply.get("rules")
    return Hello(
        identity=str(reply.get("identity", "")), role=str(reply.get("role", "")),
        pub_offset=int(reply["pub_offset"]), sub_offset=int(reply["sub_offset"]),
        rules=None if not rules else RoleRules(
            name=str(reply.get("role", "")), publish=tuple(rules.get("publish", ())),
            subscribe=tuple(rules.get("subscribe", ()))))
