"""A per-worker timeline of compute, wait and communicate spans (for Gantt plots and
for finding where a run loses time).

Each party records, per worker, spans ``(kind, worker, batch, t0, t1)``:

* ``compute``: a call into the worker's compute (passive forward / backward, active
  own-bottom forward / top step, replica sync with the parameter server), measured
  where the call is made: for a thread or process worker that includes the hand-off,
  so a span is what the worker coroutine waited for, not the kernel time alone;
* ``wait``: waiting for the partner's data (an embedding or gradient, or a ``vfl-ps``
  ID subset), from the start of the wait to the message or the deadline;
* ``comm``: handing a message to the bus (encode + enqueue on the socket; the bytes then
  travel on ZeroMQ's I/O thread);
* ``segment``: one training segment of the party (worker -1, batch = the segment's
  running index), from its first batch to the parameter-server flush after its last;
  evaluation happens between segments, so time outside these spans is not training.

Times are ``time.perf_counter()`` seconds (CLOCK_MONOTONIC on Linux: one clock for every
process of a host); the file also stores ``anchor_unix_s`` / ``anchor_perf_s``, one pair
of readings taken together, so timelines from different hosts can be aligned on wall
time (to the hosts' clock-sync accuracy).

Storage is bounded: at most ``max_spans`` spans (preallocated numpy columns, so recording
costs one tuple store, no per-span allocation of Python objects beyond it); later spans
are counted in ``overflow`` and logged once, never silently lost.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import structlog

log = structlog.get_logger(__name__)

KINDS = ("compute", "wait", "comm", "segment")
COMPUTE, WAIT, COMM, SEGMENT = 0, 1, 2, 3
#: Default cap on recorded spans per party (5 columns, 26 bytes per span: 2.6 MB).
MAX_SPANS = 100_000


class Timeline:
    """A bounded recorder of one party's worker spans.

    Args:
        role: ``"active"`` or ``"passive"`` (stored in the file).
        max_spans: capacity, spans (>= 1); spans beyond it are counted, not stored.

    Raises:
        ValueError: ``max_spans < 1``.
    """

    __slots__ = ("role", "max_spans", "n", "overflow", "_kind", "_worker", "_batch",
                 "_t0", "_t1", "anchor_unix_s", "anchor_perf_s", "_warned")

    def __init__(self, role: str, *, max_spans: int = MAX_SPANS) -> None:
        if max_spans < 1:
            raise ValueError(f"max_spans must be >= 1, got {max_spans}")
        self.role = role
        self.max_spans = max_spans
        self.n = 0
        self.overflow = 0
        self._kind = np.zeros(max_spans, np.uint8)
        self._worker = np.zeros(max_spans, np.int16)
        self._batch = np.zeros(max_spans, np.int32)
        self._t0 = np.zeros(max_spans, np.float64)
        self._t1 = np.zeros(max_spans, np.float64)
        self.anchor_unix_s = time.time()
        self.anchor_perf_s = time.perf_counter()
        self._warned = False

    def record(self, kind: int, worker: int, batch: int, t0: float, t1: float) -> None:
        """Store one span (``kind`` one of :data:`COMPUTE`, :data:`WAIT`, :data:`COMM`,
        :data:`SEGMENT`;
        ``t0``/``t1`` perf_counter seconds; ``batch`` -1 when it has none)."""
        i = self.n
        if i >= self.max_spans:
            self.overflow += 1
            if not self._warned:
                self._warned = True
                log.warning("timeline.full", role=self.role, max_spans=self.max_spans)
            return
        self._kind[i] = kind
        self._worker[i] = worker
        self._batch[i] = batch
        self._t0[i] = t0
        self._t1[i] = t1
        self.n = i + 1

    def totals(self) -> dict[str, float]:
        """Seconds per kind over the stored spans (summed over workers)."""
        n = self.n
        dur = self._t1[:n] - self._t0[:n]
        return {k: float(dur[self._kind[:n] == i].sum()) for i, k in enumerate(KINDS)}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready columns: ``kind`` names, ``worker``, ``batch``, ``t0_s``/``t1_s``
        (seconds relative to ``anchor_perf_s``), plus the anchors and ``overflow``."""
        n = self.n
        kinds = np.array(KINDS)[self._kind[:n]]
        return {
            "role": self.role,
            "anchor_unix_s": self.anchor_unix_s,
            "anchor_perf_s": self.anchor_perf_s,
            "spans": n,
            "overflow": self.overflow,
            "kind": kinds.tolist(),
            "worker": self._worker[:n].tolist(),
            "batch": self._batch[:n].tolist(),
            "t0_s": np.round(self._t0[:n] - self.anchor_perf_s, 7).tolist(),
            "t1_s": np.round(self._t1[:n] - self.anchor_perf_s, 7).tolist(),
        }

    def write(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path``, whole or not at all
        (:func:`pubsub.outputs.write_atomic`; OutputError names the file)."""
        from pubsub.outputs import write_atomic

        return write_atomic(path, orjson.dumps(self.to_dict()))


def load_timeline(path: str | Path) -> dict[str, Any]:
    """A timeline file's dict (see :meth:`Timeline.to_dict`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a timeline file (missing columns, or columns of unequal length).
    """
    d = orjson.loads(Path(path).read_bytes())
    cols = ("kind", "worker", "batch", "t0_s", "t1_s")
    if not isinstance(d, dict) or any(c not in d for c in cols):
        raise ValueError(f"{path}: not a timeline file (needs columns {cols})")
    if len({len(d[c]) for c in cols}) != 1:
        raise ValueError(f"{path}: timeline columns have unequal lengths")
    return d


class TimedWorker:
    """A worker handle (:class:`parties.runtime.workers.WorkerHandle`) that records a ``compute``
    span on ``timeline`` for every compute call, tagged with worker ``index`` and the
    batch id. Everything else is delegated unchanged.

    For an inline worker the active party's own-bottom ``prefetch`` runs on the event loop
    while the same worker's ``wait`` span is open, so those two spans overlap; plots draw
    compute over wait.
    """

    __slots__ = ("_h", "_tl", "_k")

    def __init__(self, handle: Any, timeline: Timeline, index: int) -> None:
        self._h = handle
        self._tl = timeline
        self._k = index

    @property
    def compute_s(self) -> float:
        return self._h.compute_s

    @property
    def compute_cpu_s(self) -> float:
        return self._h.compute_cpu_s

    @property
    def sync_cpu_s(self) -> float:
        return self._h.sync_cpu_s

    @property
    def inner(self) -> Any:
        """The wrapped handle."""
        return self._h

    async def start(self) -> None:
        await self._h.start()

    async def close(self) -> None:
        await self._h.close()

    async def discard(self, key: int) -> None:
        await self._h.discard(key)

    async def forward(self, epoch: int, b: int, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await self._h.forward(epoch, b, **kw)
        finally:
            self._tl.record(COMPUTE, self._k, b, t0, time.perf_counter())

    async def backward(self, epoch: int, key: int, grad: Any) -> None:
        t0 = time.perf_counter()
        try:
            await self._h.backward(epoch, key, grad)
        finally:
            self._tl.record(COMPUTE, self._k, key, t0, time.perf_counter())

    async def prefetch(self, epoch: int, b: int, **kw: Any) -> None:
        t0 = time.perf_counter()
        try:
            await self._h.prefetch(epoch, b, **kw)
        finally:
            self._tl.record(COMPUTE, self._k, b, t0, time.perf_counter())

    async def step(self, epoch: int, b: int, emb: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await self._h.step(epoch, b, emb, **kw)
        finally:
            self._tl.record(COMPUTE, self._k, b, t0, time.perf_counter())

    async def _sync(self, name: str) -> None:
        t0 = time.perf_counter()
        try:
            await getattr(self._h, name)()
        finally:
            self._tl.record(COMPUTE, self._k, -1, t0, time.perf_counter())

    async def flush(self) -> None:
        await self._sync("flush")

    async def push(self) -> None:
        await self._sync("push")

    async def pull(self) -> None:
        await self._sync("pull")
