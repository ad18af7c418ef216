"""The bus client's broker keepalive: a ping on the broker's control socket every
``heartbeat_interval_s``, never on the data path (so backpressure under the ``block``
policy is not mistaken for a dead broker); an outage and a recovery are each logged once
and counted in the client's stats.

Owns: :class:`BrokerKeepalive`. May import :mod:`pubsub` modules only.
"""

from __future__ import annotations

import asyncio
from typing import Any

import zmq
import zmq.asyncio

from pubsub.address import BrokerAddress
from pubsub.receiver import BusStats
from pubsub.security import CurveClient


class BrokerKeepalive:
    """Pings one broker's control socket; :attr:`ok` is False from ``timeout_s`` without
    an answer until the next answer.

    Args:
        ctx: the client's ZeroMQ context.
        address: the broker.
        security: the client's CURVE keys, or None.
        interval_s: seconds between pings.
        timeout_s: seconds without an answer that mark the broker lost.
        stats: the client's counters (``broker_losses``, ``broker_recoveries``).
        log: the client's bound logger (``bus.broker_lost``, ``bus.broker_recovered``).
    """

    def __init__(self, ctx: zmq.asyncio.Context, address: BrokerAddress, *,
                 security: CurveClient | None, interval_s: float, timeout_s: float,
                 stats: BusStats, log: Any) -> None:
        self._ctx = ctx
        self._address = address
        self._security = security
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._stats = stats
        self._log = log
        self.ok = True

    def _socket(self) -> zmq.asyncio.Socket:
        req = self._ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        if self._security is not None:
            self._security.apply(req)
        req.connect(self._address.control_endpoint)
        return req

    async def run(self) -> None:
        """Ping until cancelled."""
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        ping = b'{"cmd":"ping"}'
        req = None
        try:
            while True:
                t0 = loop.time()
                if req is None:  # a fresh REQ socket after any unanswered ping
                    req = self._socket()
                await req.send(ping)
                answered = False
                if await req.poll(int(self._interval_s * 1000), zmq.POLLIN):
                    try:
                        await req.recv(zmq.NOBLOCK)
                        answered = True
                    except zmq.Again:
                        pass
                if not answered:
                    req.close(0)
                    req = None
                if answered:
                    last_ok = loop.time()
                    if not self.ok:
                        self.ok = True
                        self._stats.broker_recoveries += 1
                        self._log.warning("bus.broker_recovered", broker=str(self._address))
                elif self.ok and loop.time() - last_ok > self._timeout_s:
                    self.ok = False
                    self._stats.broker_losses += 1
                    self._log.warning("bus.broker_lost", broker=str(self._address),
                                      silent_s=round(loop.time() - last_ok, 3))
                await asyncio.sleep(max(0.0, self._interval_s - (loop.time() - t0)))
        finally:
            if req is not None:
                req.close(0)


__all__ = ["BrokerKeepalive"]
