"""The surface every bus client offers: :class:`Transport`.

Both :class:`pubsub.client.Bus` (ZeroMQ, through a broker) and
:class:`pubsub.memory.MemoryBus` (in process) satisfy it, so code written against
``Transport`` (e.g. :mod:`pubsub.session`) runs over either. Semantics are those
documented on :class:`~pubsub.client.Bus`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pubsub.buffer import BufferLimits
from pubsub.codec import Message
from pubsub.receiver import BusStats


@runtime_checkable
class Transport(Protocol):
    """A connected bus client (see :class:`pubsub.client.Bus` for each method's contract)."""

    name: str
    client_id: str
    #: the id in this client's envelopes (with CURVE ``<identity>/<client_id>``)
    publisher_id: str

    @property
    def closed(self) -> bool:
        """True once ``close`` was called."""
        ...

    async def subscribe(self, topic: str, *, limits: BufferLimits | None = None) -> None: ...

    async def subscribe_many(self, topics: Sequence[str], *,
                             limits: BufferLimits | None = None) -> None: ...

    async def subscribe_prefix(self, prefix: str, *,
                               limits: BufferLimits | None = None) -> None: ...

    async def unsubscribe(self, topic: str) -> None: ...

    async def unsubscribe_prefix(self, prefix: str) -> None: ...

    async def publish(self, topic: str, arrays: Sequence[Any] = (),
                      meta: Mapping[str, Any] | None = None, *, copy: bool = True) -> int: ...

    def publish_nowait(self, topic: str, arrays: Sequence[Any] = (),
                       meta: Mapping[str, Any] | None = None, *, copy: bool = True) -> int: ...

    def publish_threadsafe(self, topic: str, arrays: Sequence[Any] = (),
                           meta: Mapping[str, Any] | None = None) -> None: ...

    async def next(self, topic: str, timeout_s: float) -> Message: ...

    def try_next(self, topic: str) -> Message | None: ...

    def unget(self, msg: Message) -> None: ...

    def pending(self, topic: str) -> int: ...

    def accept_only(self, publisher: str, topics: Iterable[str]) -> None: ...

    def stats(self) -> BusStats: ...

    async def close(self) -> None: ...


#: ``connect(name, config=BusConfig)`` -> an async context manager of a connected
#: :class:`Transport` (e.g. :meth:`pubsub.memory.MemoryBroker.connect`): how code that can
#: run over either bus is handed its connection instead of a broker address.
Connect = Callable[..., contextlib.AbstractAsyncContextManager[Transport]]

__all__ = ["Connect", "Transport"]
