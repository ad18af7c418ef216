"""Publishing from another thread, shared by bus clients (:class:`pubsub.client.Bus` over
ZeroMQ, :class:`pubsub.memory.MemoryBus` in process).

:class:`ThreadsafePublisher` copies the arrays on the caller's thread and publishes on the
client's loop. Under the ``block`` overflow policy the thread's messages are chained on one
future, so they wait for room in the order they were submitted; under ``drop`` each is
published at the loop's next turn. Errors are logged (``bus.publish_failed``), not raised.

A client provides ``_loop``, ``_closed``, ``client_id``, ``config`` (``overflow``),
``_log``, :meth:`ThreadsafePublisher._publish_waiting` (publish, waiting for room) and
:meth:`ThreadsafePublisher._publish_at_once` (publish now, arrays already copied), and
sets ``_threadsafe_tail = None`` in its constructor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pubsub.codec import validate_topic
from pubsub.errors import BusClosed


class ThreadsafePublisher:
    """Mixin: :meth:`publish_threadsafe` over a client's own publish methods."""

    _loop: asyncio.AbstractEventLoop | None
    _closed: bool
    _threadsafe_tail: asyncio.Future[None] | None
    client_id: str
    config: Any
    _log: Any

    async def _publish_waiting(self, topic: str, arrays: Sequence[Any],
                               meta: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def _publish_at_once(self, topic: str, arrays: Sequence[Any],
                         meta: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def publish_threadsafe(self, topic: str, arrays: Sequence[Any] = (),
                           meta: Mapping[str, Any] | None = None) -> None:
        """Publish from another thread: arrays are copied now, published on the loop thread.

        Errors raised while publishing are logged (``bus.publish_failed``), not raised.

        Raises:
            BusClosed: the client is not connected or is closed.
        """
        loop = self._loop
        if loop is None or self._closed:
            raise BusClosed(self.client_id)
        validate_topic(topic)
        copied = [np.array(a, copy=True) for a in arrays]
        meta_copy = dict(meta) if meta else None

        async def _go() -> None:
            try:
                await self._publish_waiting(topic, copied, meta_copy)
            except Exception as exc:  # noqa: BLE001 - reported, loop must survive
                self._log.warning("bus.publish_failed", topic=topic, error=repr(exc))

        if self.config.overflow == "block":
            # waits for room in order: the thread's messages are chained on one future
            asyncio.run_coroutine_threadsafe(self._chain_threadsafe(_go), loop)
            return

        def _go_now() -> None:
            try:
                self._publish_at_once(topic, copied, meta_copy)
            except Exception as exc:  # noqa: BLE001 - reported, loop must survive
                self._log.warning("bus.publish_failed", topic=topic, error=repr(exc))

        loop.call_soon_threadsafe(_go_now)

    async def _chain_threadsafe(self, go: Any) -> None:
        """Run thread-submitted publishes one after another (keeps their order under block)."""
        prev = self._threadsafe_tail
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._threadsafe_tail = done
        try:
            if prev is not None:
                await prev
            await go()
        finally:
            done.set_result(None)
