"""Dropout recovery of the released rounds (:mod:`synth.cache`), at the coordinator.

The coordinator only ever sees the SUM over a round's survivors; the cache is
aggregate-level (nobody may hold one party's noisy marginal under distributed noise).
:class:`DropoutRecovery` turns each round's survivors' sums into estimates of the sums
over ALL parties' rows, once per round and in round order, and records what was
recovered how (``metrics.json``: ``dropout_recovery``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from synth.cache import MarginalCache, Release, recover_round
from synth.coord.types import NOISELESS_SIGMA, Clique, RoundResult
from synth.engine import NoisyMarginal
from synth.protocol import split_marginals
from synth.select import compress_marginal


class DropoutRecovery:
    """The released aggregates, each round's estimates handed on, and the record.

    Args:
        log: the coordinator's bound logger.

    Attributes:
        cache: the released aggregates (cliques of the compressed domain).
        recovered: round name -> its estimates (clique -> noisy marginal).
        record: ``{"cached": [...], "survivors_only": [...]}``: what each rule recovered.
    """

    def __init__(self, log: Any) -> None:
        self.log = log
        self.cache = MarginalCache()
        self.recovered: dict[str, dict[Clique, NoisyMarginal]] = {}
        self.record: dict[str, list[dict[str, Any]]] = {"cached": [], "survivors_only": []}
        self._one_way_releases: list[Release] = []

    def noisy(self, res: RoundResult, *, rows: Mapping[str, int],
              maps: Mapping[str, np.ndarray]) -> dict[Clique, NoisyMarginal]:
        """The round's aggregate marginals as the engine gets them: estimates of the sums
        over ALL parties' rows (``rows``), after dropout recovery (:meth:`recover`;
        computed once per round, in round order). ``maps``: MST's domain compression
        (known from round 1 on)."""
        got = self.recovered.get(res.plan.name)
        if got is None:
            got = self.recovered[res.plan.name] = self.recover(res, rows=rows, maps=maps)
        return got

    def recover(self, res: RoundResult, *, rows: Mapping[str, int],
                maps: Mapping[str, np.ndarray]) -> dict[Clique, NoisyMarginal]:
        """Dropout recovery of one round. A clique whose earlier release covered every
        absent party (dropped or never keyed) gets their row share of the latest such
        release added ("cached"); any other clique of a round with absent parties is the
        survivors' sum rescaled to all rows ("survivors_only"). Both are recorded in
        :attr:`record` and logged. The round's releases join the cache afterwards; round
        0's 1-way releases join once the domain compression is known, compressed to it
        (the cache is keyed by cliques of the compressed domain). The engine gets one
        sigma per marginal: the largest per-cell one."""
        r, name = res.plan.round, res.plan.name
        if r > 0 and self._one_way_releases:
            self.cache = self.cache.add(*(compressed(rel, maps)
                                          for rel in self._one_way_releases))
            self._one_way_releases = []
        raw = {c: (v, res.sigma) for c, v in split_marginals(res.values, res.plan).items()}
        rec = recover_round(self.cache, round=r, name=name, marginals=raw,
                            survivors=res.survivors, absent=(*res.dropped, *res.missing),
                            rows=rows)
        if r == 0:
            self._one_way_releases = rec.releases
        else:
            self.cache = self.cache.add(*rec.releases)
        self.record["cached"] += rec.cached
        self.record["survivors_only"] += rec.survivors_only
        if rec.cached or rec.survivors_only:
            self.log.warning("synth.dropout_recovery", round=name,
                             cached=[(e["clique"], e["from_round"], e["staleness_rounds"])
                                     for e in rec.cached],
                             survivors_only=[e["clique"] for e in rec.survivors_only],
                             coverage_rows=rec.coverage_rows, rows=rec.rows)
        # a noiseless run (epsilon = inf) measures exactly (sigma 0); the engines weight
        # measurements by 1/sigma, so exact ones get a tiny common sigma: equal weights
        return {c: NoisyMarginal(clique=c, values=e.values,
                                 sigma=max(float(e.sigma.max()), NOISELESS_SIGMA))
                for c, e in rec.estimates.items()}


def compressed(rel: Release, maps: Mapping[str, np.ndarray]) -> Release:
    """A round-0 1-way release on the compressed domain (merged cells sum their counts
    and noise variances)."""
    m = maps.get(rel.clique[0])
    if m is None:
        return rel
    n = int(m.max()) + 1
    return Release(round=rel.round, name=rel.name, clique=rel.clique,
                   values=compress_marginal(rel.values, m),
                   sigma=np.sqrt(np.bincount(m, weights=rel.sigma ** 2, minlength=n)),
                   parties=rel.parties, rows=rel.rows)


__all__ = ["DropoutRecovery", "compressed"]
