"""Pure scheduling logic of PubSub-VFL: batch plans, the ΔT_t schedule, batch assignment.

Nothing here touches sockets, threads or torch.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np


def sync_interval(t: int, delta_t0: int) -> int:
    """ΔT_t, local steps between a worker's syncs with its parameter server.

    ΔT_t = ceil(ΔT0/2 · tanh(2t/ΔT0 − 2) + ΔT0/2)  (PubSub-VFL, Sec. 4.2).

    Args:
        t: epoch index, from 0.
        delta_t0: ΔT0 >= 1.

    Returns:
        An int in [1, ΔT0]; for ΔT0 = 5 and t = 0..8: 1, 1, 1, 1, 2, 3, 4, 5, 5.

    Raises:
        ValueError: t < 0 or delta_t0 < 1.
    """
    if t < 0:
        raise ValueError(f"epoch index t must be >= 0, got {t}")
    if delta_t0 < 1:
        raise ValueError(f"delta_t0 must be >= 1, got {delta_t0}")
    half = delta_t0 / 2.0
    value = math.ceil(half * math.tanh(2.0 * t / delta_t0 - 2.0) + half)
    return max(1, min(delta_t0, value))


def num_batches(n_rows: int, batch_size: int) -> int:
    """⌈n/B⌉: number of batches, and of per-batch channels (Sec. 4.1)."""
    if n_rows < 1 or batch_size < 1:
        raise ValueError(f"need n_rows >= 1 and batch_size >= 1, got {n_rows}, {batch_size}")
    return -(-n_rows // batch_size)


def epoch_batches(n_rows: int, batch_size: int, *, seed: int, epoch: int) -> list[np.ndarray]:
    """Row positions (into the training split) of each batch of one epoch.

    Both parties call this with the same arguments and get the same batches:
    a seeded permutation per epoch, cut into ⌈n/B⌉ batches (the last may be
    smaller). Batch ``b`` of any epoch travels on channel ``b``.

    Returns:
        A list of int64 arrays; batch b is ``out[b]``.
    """
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    perm = rng.permutation(n_rows)
    return [perm[i : i + batch_size] for i in range(0, n_rows, batch_size)]


@dataclass(slots=True)
class EpochSchedule:
    """Assignment of one epoch's batches to a party's workers.

    Workers :meth:`take` batch ids in order; a batch that misses T_ddl is
    :meth:`fail`-ed and goes to the back of the queue (reassigned) until it
    has failed ``max_reassign + 1`` times, then it is dropped for the epoch.
    The epoch is over when every batch is completed or dropped.

    Attributes:
        n_batches: batches in the epoch.
        max_reassign: reassignments allowed per batch.
        completed / dropped / reassigned: counters.
    """

    n_batches: int
    max_reassign: int
    pending: deque[tuple[int, int]] = field(default_factory=deque)
    in_flight: set[int] = field(default_factory=set)
    completed: int = 0
    dropped: int = 0
    reassigned: int = 0

    def __post_init__(self) -> None:
        if not self.pending:
            self.pending.extend((b, 0) for b in range(self.n_batches))

    def take(self) -> tuple[int, int] | None:
        """Next ``(batch_id, attempt)`` or None if nothing is pending right now."""
        if not self.pending:
            return None
        b, attempt = self.pending.popleft()
        self.in_flight.add(b)
        return b, attempt

    def complete(self, batch_id: int) -> None:
        """Mark a batch done.

        Raises:
            KeyError: the batch was not in flight.
        """
        self.in_flight.remove(batch_id)
        self.completed += 1

    def fail(self, batch_id: int, attempt: int) -> bool:
        """Record a missed deadline; returns True if reassigned, False if dropped.

        Raises:
            KeyError: the batch was not in flight.
        """
        self.in_flight.remove(batch_id)
        if attempt < self.max_reassign:
            self.pending.append((batch_id, attempt + 1))
            self.reassigned += 1
            return True
        self.dropped += 1
        return False

    def drop(self, batch_id: int) -> None:
        """Drop an in-flight batch without reassigning it (the partner skipped it)."""
        self.in_flight.remove(batch_id)
        self.dropped += 1

    @property
    def done(self) -> bool:
        """True when every batch is completed or dropped."""
        return not self.pending and not self.in_flight
