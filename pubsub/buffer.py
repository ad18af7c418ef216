"""Bounded per-topic message buffers (pure, no I/O).

A :class:`TopicBuffer` holds at most ``max_msgs`` messages and ``max_bytes``
bytes. When a new message would break either bound, the *oldest* messages are
evicted first (FIFO eviction, PubSub-VFL Sec. 4.1: "buffers hold at most p
embeddings / q gradients") and every eviction is counted. A single message
larger than ``max_bytes`` is rejected outright (counted, never stored).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferLimits:
    """Bounds of one topic buffer.

    Attributes:
        max_msgs: most messages held (>= 1).
        max_bytes: most bytes held (>= 1).
    """

    max_msgs: int = 64
    max_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.max_msgs < 1:
            raise ValueError(f"max_msgs must be >= 1, got {self.max_msgs}")
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")


class TopicBuffer(Generic[T]):
    """A FIFO of ``(item, nbytes)`` bounded by message count and bytes.

    Counters:
        evicted: items pushed out (oldest first) to make room.
        rejected: items refused because they alone exceed ``max_bytes``.
    """

    __slots__ = ("limits", "_items", "nbytes", "evicted", "rejected")

    def __init__(self, limits: BufferLimits) -> None:
        self.limits = limits
        self._items: deque[tuple[T, int]] = deque()
        self.nbytes = 0
        self.evicted = 0
        self.rejected = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T, nbytes: int) -> list[T]:
        """Append ``item`` of ``nbytes`` bytes, evicting the oldest items as needed.

        Returns:
            The evicted items, oldest first (empty if none). If ``item`` alone
            exceeds ``max_bytes`` it is not stored and is returned as the only
            element (counted in ``rejected``).
        """
        lim = self.limits
        if nbytes > lim.max_bytes:
            self.rejected += 1
            return [item]
        out: list[T] = []
        items = self._items
        while items and (len(items) >= lim.max_msgs or self.nbytes + nbytes > lim.max_bytes):
            old, old_n = items.popleft()
            self.nbytes -= old_n
            out.append(old)
        self.evicted += len(out)
        items.append((item, nbytes))
        self.nbytes += nbytes
        return out

    def try_append(self, item: T, nbytes: int) -> bool:
        """Append ``item`` if it fits without evicting anything; True if appended.

        The reader's fast path; :meth:`put` handles the rest.
        """
        lim = self.limits
        if len(self._items) < lim.max_msgs and self.nbytes + nbytes <= lim.max_bytes:
            self._items.append((item, nbytes))
            self.nbytes += nbytes
            return True
        return False

    def push_front(self, item: T, nbytes: int) -> None:
        """Put ``item`` back at the head (used when a waiter gave up a handed-over item).

        Bounds are not enforced here: the item was already admitted once.
        """
        self._items.appendleft((item, nbytes))
        self.nbytes += nbytes

    def pop(self) -> tuple[T, int]:
        """Remove and return the oldest ``(item, nbytes)``.

        Raises:
            IndexError: if empty.
        """
        item, n = self._items.popleft()
        self.nbytes -= n
        return item, n

    def clear(self) -> int:
        """Drop everything; return how many items were dropped."""
        n = len(self._items)
        self._items.clear()
        self.nbytes = 0
        return n
