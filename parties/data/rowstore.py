"""Encoded rows on disk, read a batch at a time (numpy + ``os.pread``; no torch needed to
write, torch tensors out).

A streaming party (:mod:`parties.data.stream`) writes its encoded training rows once, in row
order, as raw little-endian ``float32`` (``n x width``) with :class:`RowWriter`; its
workers read them back with :class:`DiskRows`, which a compute object indexes like the
in-memory tensor (``x[rows]``). A batch of the block-shuffled order
(:class:`parties.algorithms.schedule.BlockBatches`) touches a few blocks of the file; each is read
whole with one ``pread`` into a small per-thread cache, so memory stays at
``cache_blocks x block_rows x width x 4`` bytes whatever the file's size (the kernel's
page cache is not the process's memory) and the file is read in large sequential pieces.

One-hot columns are stored packed (:class:`Unpack`): one slot per categorical column
holding the category's index (``-1``: none), expanded to the dense row on read, so the
file holds one float per raw column, not one per category.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_DTYPE = np.dtype("<f4")


class RowStoreError(Exception):
    """A row file is missing, short or does not match its descriptor.

    Attributes:
        path: the file.
        detail: what is wrong.
    """

    def __init__(self, path: str | Path, detail: str) -> None:
        self.path, self.detail = str(path), detail
        super().__init__(f"{self.path}: {detail}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Unpack:
    """How a packed row (one slot per column) expands to the dense encoded row.

    Attributes:
        width: the dense row's width.
        plain: ``(slot, position)`` pairs copied as they are (numeric and hashed outputs).
        onehot: ``(slot, offset, levels)`` per one-hot column: the slot holds the
            category's index ``i`` in ``[0, levels)`` (``-1``: no category, all zeros) and
            the dense row has a 1 at ``offset + i``.
    """

    width: int
    plain: tuple[tuple[int, int], ...]
    onehot: tuple[tuple[int, int, int], ...]

    @property
    def slots(self) -> int:
        """The packed row's width."""
        return len(self.plain) + len(self.onehot)

    def apply(self, packed: np.ndarray) -> np.ndarray:
        """The dense ``(n, width)`` float32 rows of ``packed`` ``(n, slots)``.

        Raises:
            ValueError: a one-hot slot holds an index outside ``[-1, levels)``.
        """
        n = packed.shape[0]
        out = np.zeros((n, self.width), dtype=_DTYPE)
        if self.plain:
            src, dst = (np.fromiter(v, dtype=np.int64) for v in zip(*self.plain, strict=True))
            out[:, dst] = packed[:, src]
        rows = np.arange(n)
        for slot, offset, levels in self.onehot:
            idx = packed[:, slot].astype(np.int64)
            if idx.size and (idx.min() < -1 or idx.max() >= levels):
                raise ValueError(f"packed slot {slot}: category index outside [-1, {levels})")
            hit = idx >= 0
            out[rows[hit], offset + idx[hit]] = 1.0
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "plain": [list(p) for p in self.plain],
                "onehot": [list(o) for o in self.onehot]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Unpack:
        return cls(width=int(d["width"]), plain=tuple((int(a), int(b)) for a, b in d["plain"]),
                   onehot=tuple((int(a), int(b), int(c)) for a, b, c in d["onehot"]))


class RowWriter:
    """Appends ``float32`` rows of a fixed width to a raw file (a context manager)."""

    def __init__(self, path: str | Path, width: int) -> None:
        self.path = Path(path)
        self.width = int(width)
        self.rows = 0
        self._fh: Any = open(self.path, "wb")  # noqa: SIM115 - closed by close()

    def append(self, rows: np.ndarray) -> None:
        arr = np.ascontiguousarray(rows, dtype=_DTYPE)
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.shape[1] != self.width:
            raise ValueError(f"{self.path}: rows of width {arr.shape[1]}, expected {self.width}")
        self._fh.write(memoryview(arr).cast("B"))
        self.rows += arr.shape[0]

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def descriptor(self, *, vector: bool = False) -> dict[str, Any]:
        """What :meth:`DiskRows.from_descriptor` needs."""
        return {"path": str(self.path), "rows": self.rows, "width": self.width,
                "vector": bool(vector)}


class DiskRows:
    """Read-only ``(n, width)`` float32 rows in a raw file, indexed by row positions.

    ``x[rows]`` (an int64 array or tensor of positions) returns a ``torch`` tensor of
    shape ``(len(rows), width)`` (``(len(rows),)`` when ``vector``). Thread-safe (each
    thread has its own block cache); opened lazily, so it pickles as its descriptor.
    With ``unpack`` the file holds packed rows of ``unpack.slots`` floats, ``width`` is
    the dense width and reads expand them (:class:`Unpack`).

    Raises:
        RowStoreError: the file is missing or its size is not ``n x width x 4`` bytes.
    """

    def __init__(self, path: str | Path, rows: int, width: int, *, vector: bool = False,
                 block_rows: int = 4096, cache_blocks: int = 24,
                 unpack: Unpack | None = None) -> None:
        self.path = str(path)
        self.n, self.width, self.vector = int(rows), int(width), bool(vector)
        self.block_rows, self.cache_blocks = int(block_rows), int(cache_blocks)
        if unpack is not None and unpack.width != self.width:
            raise RowStoreError(self.path, f"unpacks to width {unpack.width}, expected "
                                           f"{self.width}")
        self.unpack = unpack
        self.stored_width = unpack.slots if unpack is not None else self.width
        self._row_bytes = self.stored_width * _DTYPE.itemsize
        try:
            size = os.path.getsize(self.path)
        except OSError as exc:
            raise RowStoreError(self.path, f"cannot open ({exc.strerror})") from None
        if size != self.n * self._row_bytes:
            raise RowStoreError(self.path, f"{size} bytes, expected {self.n} rows x "
                                           f"{self.stored_width} float32 = "
                                           f"{self.n * self._row_bytes}")
        self._local = threading.local()
        self.blocks_read = 0

    @classmethod
    def from_descriptor(cls, desc: dict[str, Any], **kw: Any) -> DiskRows:
        unpack = desc.get("unpack")
        return cls(desc["path"], desc["rows"], desc["width"], vector=desc.get("vector", False),
                   unpack=Unpack.from_dict(unpack) if unpack else None, **kw)

    def descriptor(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "rows": self.n, "width": self.width,
                             "vector": self.vector}
        if self.unpack is not None:
            d["unpack"] = self.unpack.to_dict()
        return d

    def save_descriptor(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.descriptor()))

    @classmethod
    def load_descriptor(cls, path: str | Path, **kw: Any) -> DiskRows:
        return cls.from_descriptor(json.loads(Path(path).read_text()), **kw)

    def __getstate__(self) -> dict[str, Any]:
        return {"desc": self.descriptor(), "block_rows": self.block_rows,
                "cache_blocks": self.cache_blocks}

    def __setstate__(self, state: dict[str, Any]) -> None:
        d = state["desc"]
        unpack = d.get("unpack")
        self.__init__(d["path"], d["rows"], d["width"], vector=d["vector"],  # type: ignore[misc]
                      block_rows=state["block_rows"], cache_blocks=state["cache_blocks"],
                      unpack=Unpack.from_dict(unpack) if unpack else None)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n,) if self.vector else (self.n, self.width)

    def __len__(self) -> int:
        return self.n

    def _state(self) -> tuple[int, OrderedDict[int, np.ndarray]]:
        loc = self._local
        if getattr(loc, "fd", None) is None:
            loc.fd = os.open(self.path, os.O_RDONLY)
            loc.cache = OrderedDict()
        return loc.fd, loc.cache

    def _block(self, fd: int, cache: OrderedDict[int, np.ndarray], k: int) -> np.ndarray:
        arr = cache.get(k)
        if arr is not None:
            cache.move_to_end(k)
            return arr
        start = k * self.block_rows
        count = min(self.block_rows, self.n - start)
        want = count * self._row_bytes
        buf = os.pread(fd, want, start * self._row_bytes)
        if len(buf) != want:
            raise RowStoreError(self.path, f"short read at row {start}: {len(buf)} of "
                                           f"{want} bytes (the file changed)")
        arr = np.frombuffer(buf, dtype=_DTYPE).reshape(count, self.stored_width)
        cache[k] = arr
        self.blocks_read += 1
        while len(cache) > self.cache_blocks:
            cache.popitem(last=False)
        return arr

    def read(self, rows: Any) -> np.ndarray:
        """The rows at ``rows`` (positions) as a new ``(len(rows), width)`` array."""
        pos = np.asarray(rows.numpy() if hasattr(rows, "numpy") else rows, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError(f"{self.path}: rows outside [0, {self.n})")
        fd, cache = self._state()
        out = np.empty((pos.size, self.stored_width), dtype=_DTYPE)
        blocks = pos // self.block_rows
        for k in np.unique(blocks):
            sel = np.flatnonzero(blocks == k)
            out[sel] = self._block(fd, cache, int(k))[pos[sel] - k * self.block_rows]
        return out if self.unpack is None else self.unpack.apply(out)

    def __getitem__(self, rows: Any) -> Any:
        import torch

        out = torch.from_numpy(self.read(rows))
        return out[:, 0] if self.vector else out

    def close(self) -> None:
        fd = getattr(self._local, "fd", None)
        if fd is not None:
            os.close(fd)
            self._local.fd = None


__all__ = ["DiskRows", "RowStoreError", "RowWriter", "Unpack"]
