"""Client side of the broker's control protocol (REQ to ``PORT+2``, JSON in and out).

Requests are ``{"cmd": "stats"}`` or ``{"cmd": "ping"}``; replies are
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

from typing import Any

import orjson
import zmq

from pubsub.address import BrokerAddress
from pubsub.errors import BrokerUnreachable, BusError


class ControlError(BusError, RuntimeError):
    """The broker answered a control request with an error."""


def control_request(
    address: str | BrokerAddress, cmd: str, *, timeout_s: float = 2.0
) -> dict[str, Any]:
    """Send one control request and return the reply (blocking; a few ms on loopback).

    Args:
        address: broker base address ``tcp://HOST:PORT``.
        cmd: ``"stats"`` or ``"ping"``.
        timeout_s: reply deadline in seconds.

    Raises:
        BrokerUnreachable: no reply within ``timeout_s``.
        ControlError: the broker answered ``ok: false``.
    """
    addr = address if isinstance(address, BrokerAddress) else BrokerAddress.parse(address)
    addr = addr.for_connect()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
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


def request_stats(address: str | BrokerAddress, *, timeout_s: float = 2.0) -> dict[str, Any]:
    """The broker's counters (see ``broker.proxy.BrokerStats.as_dict``).

    Raises:
        BrokerUnreachable: no reply within ``timeout_s``.
        ControlError: the broker refused.
    """
    return control_request(address, "stats", timeout_s=timeout_s)["stats"]
