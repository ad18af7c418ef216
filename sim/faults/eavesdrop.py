"""An eavesdropper on a VFL run's cut-layer gradients: what a passive party (or anyone
on the wire) receives, recorded for the label-inference audit (``bench/label_audit.py``).

:class:`GradientTap` is a third client of the run's bus that subscribes to a passive
party's gradient topics (``grad/<run>/<b>``, or ``grad/<run>/<party>/<b>`` with several
passive parties), decodes each message as the passive party does
(:func:`parties.algorithms.wire.decode_rows`) and files it under the records of its batch,
which the passive party knows from the public batch order
(:meth:`parties.config.VflConfig.batch_order`). It keeps, per epoch, the last gradient
each record received. It reads only what is published; it changes nothing.

Channels are batch ids under every algorithm but ``vfl-ps`` (whose channels are worker
pairs and whose batches are split by the active party): the tap refuses ``vfl-ps``.

May import :mod:`parties` and :mod:`pubsub`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import numpy as np

from parties.algorithms.wire import META_KEY, decode_rows
from parties.config import VflConfig
from pubsub import BufferLimits


class GradientTap:
    """Records the gradients published to one passive party during a run.

    Args:
        cfg: the run's configuration (the batch order, the party count).
        run_id: the run's topic namespace.
        n_train: the training rows.
        party: the passive party whose gradients are recorded (``passive``,
            ``passive2`` …).

    Raises:
        ValueError: ``vfl-ps`` (channels are not batches), or ``party`` is not a passive
            party of the run.
    """

    def __init__(self, cfg: VflConfig, run_id: str, n_train: int, *,
                 party: str = "passive") -> None:
        if cfg.algo == "vfl-ps":
            raise ValueError("the gradient tap needs batch channels; vfl-ps uses worker pairs")
        if party not in cfg.party_ids[1:]:
            raise ValueError(f"party must be a passive party of the run {cfg.party_ids[1:]}, "
                             f"got {party!r}")
        self.cfg = cfg
        self.n_train = n_train
        self.n_batches = -(-n_train // cfg.batch_size)
        p = party if cfg.passive_parties > 1 else ""
        self.topics = [f"grad/{run_id}/{p}/{b}" if p else f"grad/{run_id}/{b}"
                       for b in range(self.n_batches)]
        #: epoch -> (n_train, d) float32 gradients, NaN for records not received
        self.grads: dict[int, np.ndarray] = {}
        #: epoch -> (n_train,) the batch each record's gradient came in (-1: none)
        self.batches: dict[int, np.ndarray] = {}
        self.messages = 0
        self.skips = 0
        self._orders: dict[int, Any] = {}

    def _record(self, meta: dict[str, Any], arrays: Any) -> None:
        if meta.get("skip"):
            self.skips += 1
            return
        e, b = int(meta["e"]), int(meta["b"])
        g = decode_rows(arrays, meta.get(META_KEY))
        order = self._orders.get(e)
        if order is None:
            order = self._orders[e] = self.cfg.batch_order(self.n_train, e)
        rows = np.asarray(order[b], dtype=np.int64)
        if g.shape[0] != rows.shape[0]:
            return  # not a whole batch's gradient (cannot be filed)
        out = self.grads.get(e)
        if out is None:
            out = self.grads[e] = np.full((self.n_train, g.shape[1]), np.nan, np.float32)
        out[rows] = g
        ids = self.batches.get(e)
        if ids is None:
            ids = self.batches[e] = np.full(self.n_train, -1, np.int64)
        ids[rows] = b
        self.messages += 1

    async def run(self, connect: Any) -> None:
        """Subscribe through ``connect`` (a transport factory, as
        :meth:`pubsub.memory.MemoryBroker.connect`) and record until cancelled."""
        async with connect("eavesdropper") as bus:
            limits = BufferLimits(max_msgs=1024, max_bytes=256 << 20)
            await bus.subscribe_many(self.topics, limits=limits)

            async def drain(topic: str) -> None:
                while True:
                    msg = await bus.next(topic, 3600.0)
                    self._record(dict(msg.meta), msg.arrays)

            tasks = [asyncio.create_task(drain(t)) for t in self.topics]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                for t in tasks:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await t


__all__ = ["GradientTap"]
