"""Broker address parsing: one ``tcp://HOST:PORT`` names all three broker endpoints."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pubsub.errors import BusError

_ADDR = re.compile(r"^tcp://(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\s]+):(?P<port>\d{1,5})$")


class InvalidAddress(BusError, ValueError):
    """A broker address is not of the form ``tcp://HOST:PORT``."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        super().__init__(f"invalid broker address {address!r}: {reason}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerAddress:
    """A broker's base address.

    A broker at ``tcp://HOST:PORT`` takes publishers on ``PORT`` (its XSUB
    socket), subscribers on ``PORT+1`` (XPUB) and control requests on ``PORT+2``
    (a ROUTER that answers REQ clients).

    Attributes:
        host: host name or IP literal (IPv6 in brackets).
        port: base port, 1..65533 (0 only for binding to ephemeral ports).
    """

    host: str
    port: int

    @classmethod
    def parse(cls, address: str) -> BrokerAddress:
        """Parse ``tcp://HOST:PORT``.

        Raises:
            InvalidAddress: the string is not of that form or the port is out of range.
        """
        m = _ADDR.match(address.strip())
        if m is None:
            raise InvalidAddress(address, "expected tcp://HOST:PORT")
        port = int(m.group("port"))
        if not 0 <= port <= 65533:
            raise InvalidAddress(address, f"port {port} out of range 0..65533 (PORT+2 must fit)")
        return cls(host=m.group("host"), port=port)

    def for_connect(self) -> BrokerAddress:
        """This address, checked as one a client can connect to.

        Raises:
            InvalidAddress: the host is a bind wildcard (``*``) or the port is 0.
        """
        if self.host == "*" or self.port == 0:
            raise InvalidAddress(str(self), "a client needs the broker's real host and port "
                                 "('*' and port 0 are only for binding)")
        return self

    def __str__(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def endpoint(self, offset: int) -> str:
        """``tcp://HOST:PORT+offset`` (with CURVE, role i uses offsets 3+2i and 4+2i)."""
        return f"tcp://{self.host}:{self.port + offset}"

    @property
    def pub_endpoint(self) -> str:
        """Endpoint that publishers connect to (the broker's XSUB), ``tcp://HOST:PORT``."""
        return f"tcp://{self.host}:{self.port}"

    @property
    def sub_endpoint(self) -> str:
        """Endpoint that subscribers connect to (the broker's XPUB), ``tcp://HOST:PORT+1``."""
        return f"tcp://{self.host}:{self.port + 1}"

    @property
    def control_endpoint(self) -> str:
        """The broker's control endpoint (a ROUTER; REQ clients), ``tcp://HOST:PORT+2``."""
        return f"tcp://{self.host}:{self.port + 2}"
