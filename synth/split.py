"""How a table's rows are spread over FedForge's K parties, and the real holdout kept out
of every party (pure).

* ``iid``: a seeded permutation cut into K near-equal parts.
* ``dirichlet``: non-IID label (or column) skew, as in Hsu et al. 2019 ("Measuring the
  effects of non-identical data distribution"): for each value of the split column, the
  parties' shares of its rows are drawn from Dirichlet(α·1_K); small α concentrates each
  value on few parties. Every party is guaranteed at least one row.
* ``sizes``: unequal party sizes, IID within: a seeded permutation cut in proportion to
  the given weights (largest remainder, at least one row each), e.g. hospitals of 10k to
  500k patients scaled down to the table's rows (:func:`sized_counts`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def holdout_split(n_rows: int, holdout_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(train_idx, holdout_idx)``: a seeded split of ``range(n_rows)`` (int64, sorted).

    Raises:
        ValueError: ``n_rows < 2`` or a fraction that leaves either side empty.
    """
    if n_rows < 2:
        raise ValueError(f"need at least 2 rows, got {n_rows}")
    n_hold = int(round(n_rows * holdout_frac))
    if not 1 <= n_hold < n_rows:
        raise ValueError(f"holdout_frac {holdout_frac} leaves no rows on one side of "
                         f"{n_rows}")
    perm = np.random.default_rng([seed, 101]).permutation(n_rows)
    return np.sort(perm[n_hold:]), np.sort(perm[:n_hold])


def sized_counts(n_rows: int, weights: Sequence[float]) -> list[int]:
    """Rows of each party when ``n_rows`` are cut in proportion to ``weights``: the
    largest-remainder rounding of ``n_rows * w / sum(w)``, with at least one row each.

    Raises:
        ValueError: no weights, a weight that is not finite and > 0, or fewer rows than
            parties.
    """
    w = np.asarray(weights, dtype=float)
    if w.size == 0 or not np.all(np.isfinite(w) & (w > 0)):
        raise ValueError(f"weights must be finite and > 0, got {list(weights)}")
    if n_rows < w.size:
        raise ValueError(f"{n_rows} rows cannot give each of {w.size} parties a row")
    exact = n_rows * w / w.sum()
    counts = np.maximum(np.floor(exact).astype(np.int64), 1)
    left = n_rows - int(counts.sum())
    order = np.argsort(-(exact - np.floor(exact)), kind="stable")
    i = 0
    while left != 0:  # hand out the remainder (or take back what the minimum of 1 added)
        k = int(order[i % w.size])
        if left > 0:
            counts[k] += 1
            left -= 1
        elif counts[k] > 1:
            counts[k] -= 1
            left += 1
        i += 1
    return [int(c) for c in counts]


def party_split(n_rows: int, n_parties: int, *, seed: int, how: str = "iid",
                groups: Sequence[object] | np.ndarray | None = None, alpha: float = 1.0,
                weights: Sequence[float] | None = None) -> list[np.ndarray]:
    """Row indices (int64, sorted) of each of ``n_parties`` parties; together a partition of
    ``range(n_rows)``.

    Args:
        n_rows: rows to spread.
        n_parties: K >= 1.
        seed: the split's seed.
        how: ``"iid"``, ``"dirichlet"`` or ``"sizes"``.
        groups: ``(n_rows,)`` values of the split column (``dirichlet`` only).
        alpha: the Dirichlet concentration α > 0.
        weights: ``n_parties`` relative party sizes (``sizes`` only).

    Raises:
        ValueError: fewer rows than parties, an unknown ``how``, missing or misshaped
            ``groups``, α <= 0, or missing or invalid ``weights``.
    """
    if n_parties < 1:
        raise ValueError(f"n_parties must be >= 1, got {n_parties}")
    if n_rows < n_parties:
        raise ValueError(f"{n_rows} rows cannot give each of {n_parties} parties a row")
    rng = np.random.default_rng([seed, 202])
    if how == "iid":
        perm = rng.permutation(n_rows)
        return [np.sort(part) for part in np.array_split(perm, n_parties)]
    if how == "sizes":
        if weights is None or len(weights) != n_parties:
            raise ValueError(f"the sizes split needs {n_parties} weights, got "
                             f"{None if weights is None else len(weights)}")
        perm = rng.permutation(n_rows)
        cuts = np.cumsum(sized_counts(n_rows, weights))[:-1]
        return [np.sort(part) for part in np.split(perm, cuts)]
    if how != "dirichlet":
        raise ValueError(f"split must be 'iid', 'dirichlet' or 'sizes', got {how!r}")
    if groups is None or len(groups) != n_rows:
        raise ValueError("the dirichlet split needs one group value per row")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    _, inverse = np.unique(np.asarray(groups, dtype=str), return_inverse=True)
    owner = np.empty(n_rows, dtype=np.int64)
    for g in range(int(inverse.max()) + 1):
        rows = rng.permutation(np.flatnonzero(inverse == g))
        shares = rng.dirichlet(np.full(n_parties, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(rows)).astype(np.int64)
        for k, part in enumerate(np.split(rows, cuts)):
            owner[part] = k
    # every party gets at least one row: move one from the largest party if needed
    counts = np.bincount(owner, minlength=n_parties)
    for k in np.flatnonzero(counts == 0):
        donor = int(np.argmax(counts))
        row = int(rng.choice(np.flatnonzero(owner == donor)))
        owner[row] = k
        counts[donor] -= 1
        counts[k] += 1
    return [np.flatnonzero(owner == k) for k in range(n_parties)]


__all__ = ["holdout_split", "party_split", "sized_counts"]
