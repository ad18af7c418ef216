"""Dropout recovery for FedForge's aggregate marginals (coordinator side).

A party that misses an aggregation round's deadline is dropped for that round: secure
aggregation's dropout recovery (:mod:`synth.secagg`) unmasks the SUM over the round's
survivors, and that sum covers only the survivors' rows. Fed to the engine as if it
covered every row, it would bias every cell low by the dropped parties' share.

Why the cache is aggregate-level. Under secure aggregation with distributed noise each
party adds only σ²/K of the noise variance, so one party's noisy marginal is not private
on its own: nobody (coordinator, aggregator, another party) may ever hold it, let alone
keep it. A "last released noisy marginal of the dropped party" therefore exists only
inside released aggregates. :class:`MarginalCache` keeps, per clique (a tuple of
attribute names on the compressed domain), every released aggregate with the parties
and rows it covers, and a dropped party's part is estimated from an earlier release
that covered it, as its row share of that release.

Rules, for clique ``c`` measured in round ``r`` whose survivors ``S`` miss the parties
``D`` (dropped during the round, or never in the session); ``n_p`` is party ``p``'s row
count (public: every party announces it in its hello), ``n_D`` the sum over ``D``,
``N`` the sum over all parties, ``N_S`` over ``S``:

* no dropouts: the aggregate is used as it is.
* "cached": the cache holds an earlier release of ``c`` (round ``r' < r``) whose
  coverage includes every party of ``D``; the most recent such release ``Y_r'`` (over
  ``N_r'`` rows) gives ``x̂_D = Y_r' · n_D / N_r'`` and the aggregate is
  ``Y_r(S) + x̂_D``, covering all ``N`` rows, with per-cell variance
  ``σ_r² + (n_D / N_r')² σ_r'²`` (the two noises are independent: different rounds).
  Recorded as ``{"round", "clique", "parties": D, "from_round", "staleness_rounds":
  r − r'}``. The variance counts the noise only: the row-share estimate assumes ``D``'s
  rows are distributed like the rows ``Y_r'`` covers (unbiased for a uniform split,
  biased under a skewed one such as ``data.split = "dirichlet"``).
* "survivors": no such release (a clique measured for the first time, e.g. round 0's
  1-way marginals, the all-pairs round, or a clique refused earlier by ``data.max_cells``):
  the survivors' sum goes to the estimator with its coverage, rescaled to all rows:
  values and σ times ``N / N_S``. Recorded as ``{"round", "clique", "parties": D,
  "coverage_rows": N_S, "rows": N}``.

Every release is added to the cache after its round AS RELEASED: the survivors' sum with
the survivors as coverage (never the estimate: a later round then never compounds two
estimates). The module is pure (no I/O, no bus): :func:`recover_round` returns the
round's estimates, the recorded entries and the releases to add.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Clique = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """One released aggregate marginal of one clique.

    Attributes:
        round: the round's index.
        name: the round's name (``one_way``, ``select``, ``tree``, ``aim0`` ...).
        clique: the attributes.
        values: float64 ``(cells,)``: the noisy sum over ``parties``.
        sigma: float64 ``(cells,)``: the per-cell noise std of ``values``.
        parties: the parties the sum covers (sorted).
        rows: the rows the sum covers (the sum of those parties' row counts).
    """

    round: int
    name: str
    clique: Clique
    values: np.ndarray
    sigma: np.ndarray
    parties: tuple[str, ...]
    rows: int

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.float64).reshape(-1)
        s = np.broadcast_to(np.asarray(self.sigma, dtype=np.float64), v.shape).copy()
        v = v.copy()
        v.flags.writeable = False
        s.flags.writeable = False
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "sigma", s)
        object.__setattr__(self, "clique", tuple(self.clique))
        object.__setattr__(self, "parties", tuple(sorted(self.parties)))
        if self.rows < 0:
            raise ValueError(f"rows must be >= 0, got {self.rows}")


class MarginalCache:
    """Released aggregate marginals per clique, oldest first. Immutable: :meth:`add`
    returns a new cache (the old one stays valid, e.g. for a resumed run).

    Args:
        releases: initial releases (any order; kept per clique in round order).
    """

    __slots__ = ("_by_clique",)

    def __init__(self, releases: Iterable[Release] = ()) -> None:
        by: dict[Clique, list[Release]] = {}
        for rel in releases:
            by.setdefault(rel.clique, []).append(rel)
        self._by_clique: dict[Clique, tuple[Release, ...]] = {
            c: tuple(sorted(rs, key=lambda x: x.round)) for c, rs in by.items()}

    def add(self, *releases: Release) -> MarginalCache:
        """A new cache holding this one's releases and ``releases``."""
        return MarginalCache([*self.all(), *releases])

    def all(self) -> list[Release]:
        """Every release, per clique in round order."""
        return [r for rs in self._by_clique.values() for r in rs]

    def releases(self, clique: Clique) -> tuple[Release, ...]:
        """The releases of ``clique``, oldest first (empty if never released)."""
        return self._by_clique.get(tuple(clique), ())

    def latest_covering(self, clique: Clique, parties: Iterable[str], *, before: int
                        ) -> Release | None:
        """The most recent release of ``clique`` from a round before ``before`` whose
        coverage includes every party of ``parties``, or None."""
        need = set(parties)
        for rel in reversed(self.releases(clique)):
            if rel.round < before and need <= set(rel.parties):
                return rel
        return None

    def __len__(self) -> int:
        return sum(len(rs) for rs in self._by_clique.values())

    def __contains__(self, clique: object) -> bool:
        return clique in self._by_clique


@dataclass(frozen=True, slots=True)
class Estimate:
    """One clique's aggregate as handed to the estimator.

    Attributes:
        clique: the attributes.
        values: float64 ``(cells,)``: the estimate of the sum over all rows.
        sigma: float64 ``(cells,)``: its per-cell noise std.
        case: ``"complete"`` (no dropouts), ``"cached"`` or ``"survivors"``.
    """

    clique: Clique
    values: np.ndarray
    sigma: np.ndarray
    case: str


@dataclass(frozen=True, slots=True)
class RoundRecovery:
    """What :func:`recover_round` returns.

    Attributes:
        estimates: per clique, in the round's order.
        cached: the recorded entries of the "cached" case.
        survivors_only: the recorded entries of the "survivors" case.
        releases: the round's releases to add to the cache (as released).
        coverage_rows: the rows the round's survivors' sum covers (``N_S``).
        rows: all rows (``N``).
    """

    estimates: dict[Clique, Estimate]
    cached: list[dict[str, Any]] = field(default_factory=list)
    survivors_only: list[dict[str, Any]] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    coverage_rows: int = 0
    rows: int = 0


def recover_round(cache: MarginalCache, *, round: int, name: str,
                  marginals: Mapping[Clique, tuple[np.ndarray, np.ndarray | float]],
                  survivors: Iterable[str], absent: Iterable[str],
                  rows: Mapping[str, int]) -> RoundRecovery:
    """Apply the recovery rules (module docstring) to one round.

    Args:
        cache: the releases of earlier rounds.
        round: this round's index (only releases of earlier rounds are used).
        name: this round's name.
        marginals: per clique, ``(values, sigma)`` of the survivors' sum (sigma per cell
            or one float).
        survivors: the parties whose vectors the sum holds.
        absent: the planned parties the sum misses (dropped, or never in the session).
        rows: every party's row count (all planned parties).

    Returns:
        :class:`RoundRecovery`.

    Raises:
        ValueError: a party without a row count, survivors and absent overlapping, or
            survivors covering no rows.
    """
    surv = tuple(sorted(set(survivors)))
    gone = tuple(sorted(set(absent)))
    if set(surv) & set(gone):
        raise ValueError(f"parties both survived and dropped: {sorted(set(surv) & set(gone))}")
    unknown = [p for p in (*surv, *gone) if p not in rows]
    if unknown:
        raise ValueError(f"no row count for {unknown}")
    n_all = int(sum(rows.values()))
    n_s = int(sum(rows[p] for p in surv))
    if n_s <= 0:
        raise ValueError("the survivors cover no rows")
    n_d = int(sum(rows[p] for p in gone))
    out = RoundRecovery(estimates={}, coverage_rows=n_s, rows=n_all)
    for clique, (vals, sig) in marginals.items():
        c = tuple(clique)
        rel = Release(round=round, name=name, clique=c, values=vals, sigma=sig,
                      parties=surv, rows=n_s)
        out.releases.append(rel)
        if not gone:
            out.estimates[c] = Estimate(c, rel.values, rel.sigma, "complete")
            continue
        prev = cache.latest_covering(c, gone, before=round)
        if prev is not None and prev.values.shape == rel.values.shape and prev.rows > 0:
            share = n_d / prev.rows
            values = rel.values + share * prev.values
            sigma = np.sqrt(rel.sigma ** 2 + share ** 2 * prev.sigma ** 2)
            out.estimates[c] = Estimate(c, values, sigma, "cached")
            out.cached.append({"round": name, "clique": list(c), "parties": list(gone),
                               "from_round": prev.name,
                               "staleness_rounds": round - prev.round})
        else:
            scale = n_all / n_s
            out.estimates[c] = Estimate(c, rel.values * scale, rel.sigma * scale, "survivors")
            out.survivors_only.append({"round": name, "clique": list(c),
                                       "parties": list(gone), "coverage_rows": n_s,
                                       "rows": n_all})
    return out


__all__ = ["Estimate", "MarginalCache", "Release", "RoundRecovery", "recover_round"]
