"""Pure scheduling logic: batch plans, the ΔT_t schedule, batch assignment, the baselines'
worker counts, VFL-PS ID splitting, AVFL's staleness window, ``pubsub``'s in-flight window
(:class:`InflightWindow`), validation and segments.

Nothing here touches sockets, threads or torch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
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


class BlockBatches(Sequence[np.ndarray]):
    """One epoch's batches in a block-shuffled order that an out-of-core reader can follow.

    The training rows ``0 .. n−1`` (positions in each party's aligned file) are cut into
    blocks of ``block_rows``; the full blocks are permuted (seeded by ``seed`` and
    ``epoch``), the short tail block (``n mod block_rows`` rows) goes last. The permuted
    row sequence is cut into windows of ``window_rows`` rows (rounded down to a multiple
    of the batch size ``B``); the rows of a window are shuffled (seeded) and cut into
    batches of ``B``. Every row appears once per epoch, every batch but the last has
    ``B`` rows, there are ⌈n/B⌉ batches as with :func:`epoch_batches`, and a batch reads
    at most ``window_rows / block_rows + 2`` blocks of its party's file. Batch ``b`` is
    computed on demand (one window cached): memory is O(n / block_rows + window_rows),
    not O(n).

    Both parties build it from the same arguments and get the same batches.
    """

    __slots__ = ("n", "batch_size", "block_rows", "window_rows", "_seed", "_blocks",
                 "_per_window", "_window", "_window_rows")

    def __init__(self, n_rows: int, batch_size: int, *, seed: int, epoch: int,
                 block_rows: int, window_rows: int) -> None:
        if n_rows < 1 or batch_size < 1 or block_rows < 1 or window_rows < 1:
            raise ValueError(f"need n_rows, batch_size, block_rows, window_rows >= 1, got "
                             f"{n_rows}, {batch_size}, {block_rows}, {window_rows}")
        # the window: whole batches
        window_rows = max(batch_size, window_rows // batch_size * batch_size)
        self.n, self.batch_size = n_rows, batch_size
        self.block_rows, self.window_rows = block_rows, window_rows
        self._seed = (seed, epoch)
        rng = np.random.default_rng([seed, epoch, 0xB10C])
        self._blocks = rng.permutation(n_rows // block_rows).astype(np.int64)
        self._per_window = window_rows // batch_size
        self._window = -1
        self._window_rows = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def _rows_of_window(self, w: int) -> np.ndarray:
        k = self.block_rows
        pos = np.arange(w * self.window_rows, min(self.n, (w + 1) * self.window_rows),
                        dtype=np.int64)
        full = len(self._blocks) * k  # positions past the full blocks: the tail, in order
        inner = pos < full
        rows = pos.copy()
        rows[inner] = self._blocks[pos[inner] // k] * k + pos[inner] % k
        rng = np.random.default_rng([self._seed[0], self._seed[1], w, 0x5EED])
        return rows[rng.permutation(len(rows))]

    def __getitem__(self, b: int) -> np.ndarray:  # type: ignore[override]
        b = int(b)
        if b < 0:
            b += len(self)
        if not 0 <= b < len(self):
            raise IndexError(f"batch {b} of {len(self)}")
        w, i = divmod(b, self._per_window)
        if w != self._window:
            self._window_rows = self._rows_of_window(w)
            self._window = w
        return self._window_rows[i * self.batch_size:(i + 1) * self.batch_size]


def batch_order(n_rows: int, batch_size: int, *, seed: int, epoch: int, shuffle: str = "full",
                block_rows: int = 4096, window_rows: int = 65536) -> Sequence[np.ndarray]:
    """One epoch's batches: ``shuffle = "full"``: :func:`epoch_batches` (a permutation of
    every row); ``"block"``: :class:`BlockBatches` (for a party that streams its rows
    from disk)."""
    if shuffle == "full":
        return epoch_batches(n_rows, batch_size, seed=seed, epoch=epoch)
    if shuffle == "block":
        return BlockBatches(n_rows, batch_size, seed=seed, epoch=epoch,
                            block_rows=block_rows, window_rows=window_rows)
    raise ValueError(f"shuffle must be 'full' or 'block', got {shuffle!r}")


@dataclass(slots=True)
class EpochSchedule:
    """Assignment of one epoch's batches to a party's workers.

    Workers :meth:`take` batch ids in order; a batch that misses T_ddl is
    :meth:`fail`-ed and goes to the back of the queue (reassigned) until it
    has failed ``max_reassign + 1`` times, then it is dropped for the epoch.
    The epoch is over when every batch is completed or dropped.

    Attributes:
        n_batches: batches in the epoch (or segment).
        max_reassign: reassignments allowed per batch.
        completed / dropped / reassigned: counters.
        ids: the batch ids to schedule, in order (default ``0 .. n_batches−1``; a
            segment of the epoch passes its own ids).
    """

    n_batches: int
    max_reassign: int
    pending: deque[tuple[int, int]] = field(default_factory=deque)
    in_flight: set[int] = field(default_factory=set)
    completed: int = 0
    dropped: int = 0
    reassigned: int = 0

    ids: Sequence[int] | None = None
    _retries: int = 0  # reassigned batches among ``pending``

    def __post_init__(self) -> None:
        if not self.pending:
            ids = range(self.n_batches) if self.ids is None else self.ids
            self.pending.extend((b, 0) for b in ids)

    def take(self, prefer: Callable[[int], bool] | None = None) -> tuple[int, int] | None:
        """Next ``(batch_id, attempt)`` or None if nothing is pending right now.

        Args:
            prefer: ``prefer(batch_id)`` is True when the partner's data for that batch is
                already buffered; a reassigned batch for which it holds is taken first
                (only reassigned batches are scanned, so the common case costs nothing).
                Without it, after a disruption the two parties can circle their
                reassigned batches out of phase, each waiting T_ddl on a batch the other
                has already passed.
        """
        if not self.pending:
            return None
        if prefer is not None and self._retries:
            pending = self.pending
            seen = 0
            for i in range(len(pending) - 1, -1, -1):  # retries sit at the back
                b, attempt = pending[i]
                if attempt == 0:
                    continue
                if prefer(b):
                    del pending[i]
                    self._retries -= 1
                    self.in_flight.add(b)
                    return b, attempt
                seen += 1
                if seen >= self._retries:
                    break
        b, attempt = self.pending.popleft()
        if attempt:
            self._retries -= 1
        self.in_flight.add(b)
        return b, attempt

    def retry_ready(self, prefer: Callable[[int], bool]) -> bool:
        """True when a reassigned pending batch satisfies ``prefer`` (its partner data is
        buffered): :meth:`take` with the same ``prefer`` would pick it."""
        if not self._retries:
            return False
        seen = 0
        for b, attempt in reversed(self.pending):
            if attempt == 0:
                continue
            if prefer(b):
                return True
            seen += 1
            if seen >= self._retries:
                break
        return False

    @property
    def retries(self) -> int:
        """Reassigned batches waiting in the queue."""
        return self._retries

    def retry_ids(self) -> tuple[int, ...]:
        """Ids of the reassigned pending batches, in the order :meth:`take` and
        :meth:`retry_ready` scan them (back to front); empty when there are none."""
        if not self._retries:
            return ()
        out: list[int] = []
        for b, attempt in reversed(self.pending):
            if attempt:
                out.append(b)
                if len(out) >= self._retries:
                    break
        return tuple(out)

    def release(self, batch_id: int, attempt: int) -> None:
        """Give an in-flight batch back unfinished, at the front of the queue, with its
        attempt count unchanged (not a miss: the worker left it for a batch whose data is
        here).

        Raises:
            KeyError: the batch was not in flight.
        """
        self.in_flight.remove(batch_id)
        self.pending.appendleft((batch_id, attempt))
        if attempt:
            self._retries += 1

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
            self._retries += 1
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


# ---------------------------------------------------------------------------- algorithms
#: Coordination algorithms (``vfl.algo``); see :mod:`parties.runtime.party` for their semantics.
ALGOS: tuple[str, ...] = ("pubsub", "vfl", "vfl-ps", "avfl", "avfl-ps")


def effective_workers(algo: str, role: str, w_active: int, w_passive: int) -> int:
    """Workers a party runs under ``algo``.

    ``vfl`` and ``avfl`` have one worker per party; ``vfl-ps`` pairs workers, so both
    parties run ``min(w_active, w_passive)``; ``avfl-ps`` and ``pubsub`` run the
    configured counts.

    Raises:
        ValueError: unknown algo or role, or a count < 1.
    """
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")
    if role not in ("active", "passive"):
        raise ValueError(f"role must be 'active' or 'passive', got {role!r}")
    if w_active < 1 or w_passive < 1:
        raise ValueError(f"worker counts must be >= 1, got {w_active}, {w_passive}")
    if algo in ("vfl", "avfl"):
        return 1
    if algo == "vfl-ps":
        return min(w_active, w_passive)
    return w_active if role == "active" else w_passive


#: How a party's parameter server combines its workers (``vfl.workers.ps_update``; :class:`parties.models.model.ParameterServer`): ``"average"``
#: (each worker trains its replica with its own optimizer and pushes its change, θ ← θ +
#: Δ/w: local-SGD averaging) or ``"gradient"`` (each worker pushes every step's gradient and
#: the server applies it with its one optimizer, then the worker pulls: asynchronous SGD
#: with a staleness of at most w − 1 of the party's steps).
PS_UPDATES = ("average", "gradient")

#: How a worker's learning rate follows the number of workers (``vfl.lr_scaling``).
LR_SCALINGS = ("linear", "sqrt", "none")


def worker_lr(algo: str, role: str, lr: float, w_active: int, w_passive: int,
              scaling: str = "linear") -> float:
    """The Adam learning rate of one of ``role``'s workers under ``algo``.

    Under ``pubsub`` and ``avfl-ps`` each of a party's w workers trains on whole
    batches of B rows and the parameter server averages their updates (θ ← θ + Δ/w,
    :class:`parties.models.model.ParameterServer`), so the party's model takes one averaged
    step per w·B rows: an effective batch of w·B. ``"linear"`` (the default) scales the
    rate by w, the linear scaling rule (Goyal et al., "Accurate, Large Minibatch SGD",
    2017, §2.1); ``"sqrt"`` by √w, the square-root rule suggested for adaptive methods
    (Malladi et al., "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms",
    NeurIPS 2022); ``"none"`` keeps ``lr``. ``vfl`` and ``avfl`` have one worker, and
    ``vfl-ps`` splits each batch of B rows across its worker pairs and aggregates every
    iteration (an effective batch of B), so their rate is always ``lr``.

    Measured here: ``bank`` with the paper's small model, 2 + 2 workers, 6 epochs, test
    AUC of ``pubsub``: lr 1e-3 unscaled 0.9223, linear (2e-3) 0.9274, 3e-3 0.9265;
    ``california`` with the default config (10 epochs): test RMSE 0.595 unscaled, 0.576
    linear.

    Args:
        algo: one of :data:`ALGOS`.
        role: ``"active"`` or ``"passive"``.
        lr: the configured base rate, > 0.
        w_active / w_passive: configured workers per party.
        scaling: one of :data:`LR_SCALINGS`.

    Raises:
        ValueError: unknown ``scaling``, ``algo`` or ``role``, a count < 1 or ``lr <= 0``.
    """
    if scaling not in LR_SCALINGS:
        raise ValueError(f"lr scaling must be one of {LR_SCALINGS}, got {scaling!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    w = effective_workers(algo, role, w_active, w_passive)
    if algo not in ("pubsub", "avfl-ps") or scaling == "none":
        return lr
    return lr * (w if scaling == "linear" else math.sqrt(w))


def split_batch_ids(rows: np.ndarray, parts: int) -> list[np.ndarray]:
    """VFL-PS: the active parameter server's split of one batch's row IDs into ``parts``
    subsets, one per worker pair (contiguous, sizes differ by at most one; a subset is
    empty when the batch has fewer rows than ``parts``).

    Args:
        rows: ``(B,)`` int64 row positions of the batch.
        parts: number of worker pairs, >= 1.

    Returns:
        ``parts`` int64 arrays whose concatenation is ``rows``.

    Raises:
        ValueError: ``parts < 1``.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    return [np.asarray(p, dtype=np.int64) for p in np.array_split(np.asarray(rows), parts)]


def pack_ids(subsets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Pack ID subsets into ``(ids, offsets)`` int64 arrays for one bus message;
    :func:`unpack_ids` inverts it. ``offsets`` has ``len(subsets) + 1`` entries."""
    ids = np.concatenate(subsets).astype(np.int64) if subsets else np.zeros(0, np.int64)
    offsets = np.cumsum([0] + [len(s) for s in subsets]).astype(np.int64)
    return ids, offsets


def unpack_ids(ids: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """Inverse of :func:`pack_ids`.

    Raises:
        ValueError: offsets that are not a non-decreasing cover of ``ids``.
    """
    off = np.asarray(offsets, dtype=np.int64)
    if off.ndim != 1 or off.size < 2 or off[0] != 0 or off[-1] != len(ids) \
            or np.any(np.diff(off) < 0):
        raise ValueError(f"bad ID offsets {off.tolist()!r} for {len(ids)} IDs")
    return [np.asarray(ids[a:b], dtype=np.int64) for a, b in zip(off[:-1], off[1:], strict=True)]


@dataclass(slots=True)
class StalenessWindow:
    """AVFL's bounded staleness on the passive side (one per passive worker).

    The passive worker publishes embeddings without waiting for their gradients, but
    at most ``bound`` may be outstanding (published, gradient not yet applied or
    given up). Gradients are applied in publication order (a gradient that arrives
    early waits in its channel's buffer until the older ones are settled). A gradient
    is applied to the worker's *current* parameters, so it is stale by the updates
    made since its embedding was computed; with FIFO application that is at most
    ``bound − 1`` (the bounded-delay assumption of VFB², Zhang et al., AAAI 2021,
    and of SSP, Ho et al., NIPS 2013).

    Attributes:
        bound: the most outstanding batches, >= 1 (1 = synchronous, like ``vfl``).
        outstanding: batch ids in publication order.
        updates: gradients applied so far.
        max_staleness: the largest staleness (updates between an embedding's forward
            and its gradient's application) seen.
    """

    bound: int
    outstanding: deque[int] = field(default_factory=deque)
    issued_at: dict[int, int] = field(default_factory=dict)
    updates: int = 0
    max_staleness: int = 0

    def __post_init__(self) -> None:
        if self.bound < 1:
            raise ValueError(f"staleness bound must be >= 1, got {self.bound}")

    @property
    def full(self) -> bool:
        """True when no further embedding may be published before a gradient returns."""
        return len(self.outstanding) >= self.bound

    def issue(self, b: int) -> None:
        """Record that batch ``b``'s embedding was published.

        Raises:
            RuntimeError: the window is full (the caller must wait first).
            ValueError: ``b`` is already outstanding.
        """
        if self.full:
            raise RuntimeError(f"staleness bound {self.bound} reached: wait for a gradient")
        if b in self.issued_at:
            raise ValueError(f"batch {b} is already outstanding")
        self.outstanding.append(b)
        self.issued_at[b] = self.updates

    def oldest(self) -> int | None:
        """The batch whose gradient to wait for when the window is full (None if empty)."""
        return self.outstanding[0] if self.outstanding else None

    def _check_oldest(self, b: int) -> None:
        if not self.outstanding or self.outstanding[0] != b:
            raise ValueError(f"batch {b} is not the oldest outstanding batch "
                             f"({self.oldest()}); gradients are settled in order")

    def applied(self, b: int) -> int:
        """Record that batch ``b``'s gradient was applied; returns its staleness.

        Raises:
            ValueError: ``b`` is not the oldest outstanding batch.
        """
        self._check_oldest(b)
        staleness = self.updates - self.issued_at.pop(b)
        self.outstanding.remove(b)
        self.updates += 1
        self.max_staleness = max(self.max_staleness, staleness)
        return staleness

    def given_up(self, b: int) -> None:
        """Forget batch ``b`` without an update (its gradient missed the deadline or was
        skipped by the active party).

        Raises:
            ValueError: ``b`` is not the oldest outstanding batch.
        """
        self._check_oldest(b)
        del self.issued_at[b]
        self.outstanding.remove(b)


#: The EWMA weight of a new sample in :class:`InflightWindow` (TCP's SRTT gain, RFC 6298).
INFLIGHT_EWMA = 0.125
#: Round-trip samples an :class:`InflightWindow` keeps for its median / p90 (the latest).
INFLIGHT_KEEP = 8192
#: The window's round trip is the least of this many latest samples (see
#: :class:`InflightWindow`).
INFLIGHT_MIN_OF = 32
#: Points of an :class:`InflightWindow`'s in-flight depth series (at least this many
#: seconds apart: :data:`INFLIGHT_SERIES_S`).
INFLIGHT_SERIES_MAX = 240
INFLIGHT_SERIES_S = 0.25
#: A gradient's deadline is at least this many measured round trips (the EWMA of every
#: sample): a ``t_ddl_s`` below it would drop every batch on the measured link.
DDL_RTTS = 3.0


@dataclass(slots=True)
class InflightWindow:
    """How many batches each ``pubsub`` passive worker keeps in flight (published, its
    gradient not yet back), sized from the round trip the run measures of its own
    messages. One per passive party, shared by its workers; pure (the caller passes the
    times).

    A round-trip sample is the time from the publication of a batch's embedding to the
    receipt of its gradient, less the active party's time on the batch (from taking the
    embedding to publishing the gradient, which it reports as meta ``h``): both link
    directions and the broker, what the window is there to hide. A worker's batch
    occupies the worker for ``step_s`` (forward + backward, measured), and the worker
    can start one every ``T = max(step_s, partner_period_s · workers)`` seconds: its own
    compute, or its share of what the active party serves (``partner_period_s``, the
    active party's measured seconds per batch over all its workers while embeddings
    queued for it, reported with every gradient as meta ``p``). :attr:`size` is
    ``1 + floor(rtt_s / T)``, clamped to ``[1, max_per_worker]``: the batch in compute
    plus the batches whose worker periods the round trip spans, so 1 on a fast link (the
    synchronous worker) and more as the round trip grows; fewer again when it falls.

    ``rtt_s`` is the least of the latest :data:`INFLIGHT_MIN_OF` samples whose embedding
    reached an idle active worker (``queued=False``), as TCP's BBR keeps its minimum
    round trip: a sample is the link's round trip plus whatever waited on the way (the
    party's own event loop or CPU quota noticing the gradient late, a busy broker), and
    only the least of them measures the link; a window sized on a mean would grow on a
    loaded party's own delays, where it buys no throughput and costs staleness. A sample
    whose embedding waited in the active party's buffer (``queued=True``) includes that
    queue, which a larger window would only lengthen, so it counts only where it is
    lower. The minimum forgets after :data:`INFLIGHT_MIN_OF` samples, so a slower link
    shows within that many batches and a faster one at once. A queue on the link itself
    (a bandwidth-bound link) is not told apart: there the window sits at its cap
    (``max_per_worker``), which bounds it. ``rtt_all_s``, an EWMA (weight
    :data:`INFLIGHT_EWMA`) of every sample, sets the deadline floor
    :attr:`deadline_floor_s`.

    Attributes:
        max_per_worker: the most batches a worker may have in flight, >= 1.
        workers: the party's workers, >= 1.
        auto: size from the measurements; False: always ``max_per_worker``.
        rtt_s / rtt_all_s / step_s / partner_period_s: the estimates (None: no sample).
        samples: the latest round trips (at most :data:`INFLIGHT_KEEP`), seconds.
        n_rtt / n_queued: round trips observed, and those flagged queued.
        depth / depth_sum / depth_n / depth_max: batches in flight now, and the sum,
            count and maximum of the depth seen at each publication.
        size_sum / size_max: the same of :attr:`size` at each publication.
        series: ``[t_s, depth, size]`` at most every :data:`INFLIGHT_SERIES_S` seconds
            (at most :data:`INFLIGHT_SERIES_MAX` points, then every other one is dropped
            and the spacing doubles), ``t_s`` from the first publication.
        by_epoch: per epoch, ``{"epoch", "depth_mean", "depth_max", "size_mean",
            "size_max"}`` (see :meth:`end_epoch`).
    """

    max_per_worker: int
    workers: int = 1
    auto: bool = True
    rtt_s: float | None = None
    rtt_all_s: float | None = None
    step_s: float | None = None
    partner_period_s: float | None = None
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=INFLIGHT_KEEP))
    n_rtt: int = 0
    n_queued: int = 0
    depth: int = 0
    depth_sum: int = 0
    depth_n: int = 0
    depth_max: int = 0
    size_sum: int = 0
    size_max: int = 0
    series: list[list[float]] = field(default_factory=list)
    by_epoch: list[dict[str, float]] = field(default_factory=list)
    _recent: deque[float] = field(default_factory=lambda: deque(maxlen=INFLIGHT_MIN_OF))
    _t0: float | None = None
    _spacing: float = INFLIGHT_SERIES_S
    _epoch: list[int] = field(default_factory=lambda: [0, 0, 0, 0, 0])

    def __post_init__(self) -> None:
        if self.max_per_worker < 1 or self.workers < 1:
            raise ValueError(f"need max_per_worker >= 1 and workers >= 1, got "
                             f"{self.max_per_worker}, {self.workers}")

    @staticmethod
    def _ewma(old: float | None, x: float) -> float:
        return x if old is None else old + INFLIGHT_EWMA * (x - old)

    def observe_rtt(self, rtt_s: float, *, queued: bool = False) -> None:
        """A batch's round trip, seconds (publication of its embedding to receipt of its
        gradient); ``queued``: its embedding waited in the active party's buffer."""
        if not (rtt_s >= 0 and math.isfinite(rtt_s)):
            return
        self.n_rtt += 1
        self.samples.append(rtt_s)
        self.rtt_all_s = self._ewma(self.rtt_all_s, rtt_s)
        if queued:
            self.n_queued += 1
            if self.rtt_s is None or rtt_s >= self.rtt_s:
                return
        self._recent.append(rtt_s)
        self.rtt_s = min(self._recent)

    def observe_step(self, step_s: float) -> None:
        """A worker's own compute for one batch (forward + backward), seconds."""
        if step_s >= 0 and math.isfinite(step_s):
            self.step_s = self._ewma(self.step_s, step_s)

    def observe_partner_period(self, period_s: float) -> None:
        """The active party's reported time per batch (all its workers), seconds."""
        if period_s > 0 and math.isfinite(period_s):
            self.partner_period_s = period_s

    @property
    def period_s(self) -> float | None:
        """T: how often one worker can start a batch, seconds (None: no estimate yet)."""
        if self.step_s is None:
            return None
        return max(self.step_s, (self.partner_period_s or 0.0) * self.workers, 1e-9)

    @property
    def size(self) -> int:
        """Batches a worker may have in flight now, in ``[1, max_per_worker]``."""
        if not self.auto:
            return self.max_per_worker
        period = self.period_s
        if self.rtt_s is None or period is None:
            return 1  # nothing measured yet: the synchronous worker
        need = 1 + math.floor(self.rtt_s / period)
        return max(1, min(self.max_per_worker, need))

    @property
    def deadline_floor_s(self) -> float:
        """The shortest gradient deadline the measured link allows: :data:`DDL_RTTS`
        round trips (0 before any sample)."""
        return DDL_RTTS * self.rtt_all_s if self.rtt_all_s is not None else 0.0

    def issued(self, now_s: float) -> None:
        """A worker published an embedding at ``now_s`` (seconds, any monotonic clock):
        count it in flight and sample the depth."""
        self.depth += 1
        size = self.size
        self.depth_sum += self.depth
        self.depth_n += 1
        self.depth_max = max(self.depth_max, self.depth)
        self.size_sum += size
        self.size_max = max(self.size_max, size)
        e = self._epoch
        e[0] += self.depth
        e[1] += 1
        e[2] = max(e[2], self.depth)
        e[3] += size
        e[4] = max(e[4], size)
        if self._t0 is None:
            self._t0 = now_s
        t = now_s - self._t0
        if not self.series or t - self.series[-1][0] >= self._spacing:
            self.series.append([round(t, 4), self.depth, size])
            if len(self.series) > INFLIGHT_SERIES_MAX:
                self.series = self.series[::2]
                self._spacing *= 2

    def settled(self) -> None:
        """A worker's batch left flight (its gradient applied, missed or skipped)."""
        self.depth = max(0, self.depth - 1)

    def end_epoch(self, epoch: int) -> None:
        """Close epoch ``epoch``'s depth statistics (appended to :attr:`by_epoch`)."""
        e = self._epoch
        if e[1]:
            self.by_epoch.append({"epoch": epoch, "depth_mean": e[0] / e[1],
                                  "depth_max": e[2], "size_mean": e[3] / e[1],
                                  "size_max": e[4]})
        self._epoch = [0, 0, 0, 0, 0]

    def report(self) -> dict[str, object]:
        """What the run measured of its link and did with it (``metrics.json``'s
        ``link``, with the runtime's byte counts added)."""
        xs = sorted(self.samples)

        def q(p: float) -> float | None:
            return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None

        return {
            "rtt_s": {"median": q(0.5), "p90": q(0.9), "min": xs[0] if xs else None,
                      "ewma": self.rtt_all_s, "n": self.n_rtt, "n_queued": self.n_queued,
                      "window_min": self.rtt_s},
            "step_s": self.step_s,
            "partner_period_s": self.partner_period_s,
            "inflight": {"max_per_worker": self.max_per_worker, "auto": self.auto,
                         "workers": self.workers,
                         "depth_mean": self.depth_sum / self.depth_n if self.depth_n else None,
                         "depth_max": self.depth_max,
                         "size_mean": self.size_sum / self.depth_n if self.depth_n else None,
                         "size_max": self.size_max,
                         "by_epoch": list(self.by_epoch), "series": list(self.series)},
        }


# ---------------------------------------------------------------------------- evaluation
#: Share of the training rows held out for validation, and the most rows scored.
VAL_FRAC = 0.1
VAL_MAX_ROWS = 10_000


def validation_split(n_train: int, *, seed: int, frac: float = VAL_FRAC,
                     max_rows: int = VAL_MAX_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``round(frac · n_train)`` of the training rows for validation.

    Both parties compute the same split from ``(n_train, seed)``.

    Args:
        n_train: rows of the training split (positions ``0 .. n_train−1``).
        seed: the run seed.
        frac: validation share, in [0, 1).
        max_rows: the scored subsample's size cap (a fixed, seeded subset).

    Returns:
        ``(fit, val)``: sorted int64 positions; ``fit`` trains the models, ``val`` (at
        most ``max_rows`` of the held-out rows) is scored for the validation metric.
        Held-out rows beyond the cap are used neither for training nor for scoring.

    Raises:
        ValueError: ``n_train < 0``, ``frac`` outside [0, 1) or ``max_rows < 0``.
    """
    if n_train < 0 or not 0.0 <= frac < 1.0 or max_rows < 0:
        raise ValueError(f"bad validation split: n_train={n_train}, frac={frac}, "
                         f"max_rows={max_rows}")
    rng = np.random.default_rng([seed, 0x7A1])
    perm = rng.permutation(n_train)
    n_val = int(round(n_train * frac))
    if n_train - n_val < 1:
        n_val = 0
    return np.sort(perm[n_val:]), np.sort(perm[:min(n_val, max_rows)])


def eval_segments(n_batches: int, per_epoch: int) -> list[range]:
    """Batch ids of each segment of an epoch; the validation metric is scored after each.

    Args:
        n_batches: batches per epoch, >= 1.
        per_epoch: evaluations per epoch (1, or 4 for quarter epochs), >= 1; capped
            at ``n_batches``.

    Returns:
        Contiguous, non-empty ranges covering ``0 .. n_batches−1`` in order.

    Raises:
        ValueError: an argument < 1.
    """
    if n_batches < 1 or per_epoch < 1:
        raise ValueError(f"need n_batches >= 1 and per_epoch >= 1, got {n_batches}, "
                         f"{per_epoch}")
    k = min(per_epoch, n_batches)
    edges = [round(i * n_batches / k) for i in range(k + 1)]
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def first_reaching(points: list[tuple[float, float]], target: float | None, *,
                   higher_is_better: bool) -> float | None:
    """time_to_target: the time of the first ``(time, metric)`` point whose metric reaches
    ``target`` (``>=`` for AUC, ``<=`` for RMSE); None if none does, or no target.
    NaN metrics never reach it."""
    if target is None:
        return None
    for t, m in points:
        if m == m and (m >= target if higher_is_better else m <= target):
            return t
    return None


#: a run with a party allotted fewer cores scores its validation points at segment ends
OVERLAP_MIN_CORES = 1.0


def overlap_decision(allowed: bool, cores: Mapping[str, float | None]) -> tuple[bool, str]:
    """Whether a run scores its validation points while it trains (in flight), and why.

    In flight, the passive parties compute their validation embeddings beside their
    training: that pays where the parties have CPU to spare while they wait for their
    partners (a slow link), and costs where a party's quota is below one core, which its
    training already fills (``bench/hetero.py --quick``, 50:14 split, passive party at
    0.44 cores: efficiency 0.73-0.80 with points at segment ends, 0.35-0.40 in flight).
    So points are in flight when the configuration allows it (``allowed``:
    :attr:`parties.config.VflConfig.scores_in_flight`) and every party of ``cores`` (party
    id -> allotted cores; None: not said) has at least :data:`OVERLAP_MIN_CORES`.
    """
    if not allowed:
        return False, "off in the configuration (val_overlap, algo, workers)"
    short = sorted(p for p, c in cores.items() if c is not None and c < OVERLAP_MIN_CORES)
    if short:
        return False, (f"{', '.join(short)} allotted under {OVERLAP_MIN_CORES:g} core: "
                       "points at segment ends")
    return True, f"every party allotted {OVERLAP_MIN_CORES:g} core or more"
