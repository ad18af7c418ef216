"""synth.cache: the aggregate-level dropout recovery rules (cached part of the dropped
parties, or the survivors' sum with its coverage)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.cache import MarginalCache, Release, recover_round

ROWS = {"p0": 100, "p1": 300, "p2": 600}  # N = 1000
AB = ("a", "b")
C3 = ("a", "b", "c")


def _release(r: int, name: str, values, sigma, parties, clique=AB) -> Release:
    return Release(round=r, name=name, clique=clique, values=np.asarray(values, float),
                   sigma=sigma, parties=parties, rows=sum(ROWS[p] for p in parties))


def test_no_dropout_is_the_identity_and_every_release_is_kept() -> None:
    v = np.array([10.0, 20.0, 30.0, 940.0])
    rec = recover_round(MarginalCache(), round=0, name="one_way", marginals={AB: (v, 2.0)},
                        survivors=ROWS, absent=(), rows=ROWS)
    est = rec.estimates[AB]
    assert est.case == "complete"
    np.testing.assert_array_equal(est.values, v)
    np.testing.assert_array_equal(est.sigma, np.full(4, 2.0))
    assert rec.cached == [] and rec.survivors_only == []
    assert rec.coverage_rows == rec.rows == 1000
    (rel,) = rec.releases
    assert rel.parties == ("p0", "p1", "p2") and rel.rows == 1000 and rel.round == 0


def test_cached_case_adds_the_row_share_of_the_latest_covering_release() -> None:
    # round 1 covered everyone; round 2 covered only p1, p2 (p0 missing); round 4 drops p0
    full = _release(1, "select", [100.0, 200.0, 300.0, 400.0], 4.0, ("p0", "p1", "p2"))
    part = _release(2, "aim0", [90.0, 180.0, 270.0, 360.0], 3.0, ("p1", "p2"))
    cache = MarginalCache([part, full])
    assert [r.round for r in cache.releases(AB)] == [1, 2]
    y = np.array([80.0, 150.0, 280.0, 390.0])  # survivors p1, p2
    rec = recover_round(cache, round=4, name="aim2", marginals={AB: (y, 5.0)},
                        survivors=("p1", "p2"), absent=("p0",), rows=ROWS)
    est = rec.estimates[AB]
    assert est.case == "cached"
    share = 100 / 1000  # n_D / N_r'
    np.testing.assert_allclose(est.values, y + share * full.values, rtol=0, atol=1e-12)
    np.testing.assert_allclose(est.sigma, np.sqrt(5.0 ** 2 + share ** 2 * 4.0 ** 2),
                               rtol=1e-12)
    assert rec.cached == [{"round": "aim2", "clique": ["a", "b"], "parties": ["p0"],
                           "from_round": "select", "staleness_rounds": 3}]
    assert rec.survivors_only == []
    # what goes into the cache is the release as released, not the estimate
    (rel,) = rec.releases
    np.testing.assert_array_equal(rel.values, y)
    assert rel.parties == ("p1", "p2") and rel.rows == 900 and rel.round == 4


def test_cached_case_prefers_the_most_recent_covering_release_and_keeps_per_cell_sigma() -> None:
    old = _release(0, "r0", [1.0, 1.0], [1.0, 2.0], ("p0", "p1", "p2"))
    new = _release(2, "r2", [10.0, 30.0], [3.0, 6.0], ("p0", "p2"))  # covers p0 too
    rec = recover_round(MarginalCache([old, new]), round=3, name="r3",
                        marginals={AB: (np.array([5.0, 5.0]), np.array([1.0, 1.0]))},
                        survivors=("p1", "p2"), absent=("p0",), rows=ROWS)
    share = 100 / 700
    np.testing.assert_allclose(rec.estimates[AB].values, [5 + 10 * share, 5 + 30 * share])
    np.testing.assert_allclose(rec.estimates[AB].sigma,
                               np.sqrt(1.0 + share ** 2 * np.array([9.0, 36.0])))
    assert rec.cached[0]["from_round"] == "r2" and rec.cached[0]["staleness_rounds"] == 1


def test_a_release_of_the_same_or_a_later_round_is_never_used() -> None:
    same = _release(3, "r3", [1.0, 1.0], 1.0, ("p0", "p1", "p2"))
    rec = recover_round(MarginalCache([same]), round=3, name="r3",
                        marginals={AB: (np.array([5.0, 5.0]), 1.0)},
                        survivors=("p1", "p2"), absent=("p0",), rows=ROWS)
    assert rec.estimates[AB].case == "survivors"


def test_survivors_case_rescales_values_and_sigma_to_all_rows() -> None:
    # the earlier release of the clique does not cover p1: no cached part for it
    prior = _release(1, "select", [1.0, 2.0], 1.0, ("p0", "p2"))
    y = np.array([210.0, 140.0])  # p0 + p2: 700 rows
    rec = recover_round(MarginalCache([prior]), round=2, name="tree",
                        marginals={AB: (y, 2.0), C3: (np.array([7.0]), 1.5)},
                        survivors=("p0", "p2"), absent=("p1",), rows=ROWS)
    scale = 1000 / 700
    for c, v, s in ((AB, y, 2.0), (C3, np.array([7.0]), 1.5)):
        est = rec.estimates[c]
        assert est.case == "survivors"
        np.testing.assert_allclose(est.values, v * scale, rtol=1e-12)
        np.testing.assert_allclose(est.sigma, s * scale, rtol=1e-12)
    assert rec.survivors_only == [
        {"round": "tree", "clique": ["a", "b"], "parties": ["p1"], "coverage_rows": 700,
         "rows": 1000},
        {"round": "tree", "clique": ["a", "b", "c"], "parties": ["p1"],
         "coverage_rows": 700, "rows": 1000}]
    assert rec.coverage_rows == 700 and rec.cached == []


def test_both_cases_in_one_round_and_the_cache_grows_after_it() -> None:
    """An adaptive round: one clique measured before (cached), one new (survivors)."""
    cache = MarginalCache([_release(1, "select", [500.0, 500.0], 2.0, tuple(ROWS))])
    rec = recover_round(cache, round=2, name="aim0",
                        marginals={AB: (np.array([200.0, 200.0]), 2.0),
                                   C3: (np.array([400.0]), 2.0)},
                        survivors=("p0", "p1"), absent=("p2",), rows=ROWS)
    assert rec.estimates[AB].case == "cached" and rec.estimates[C3].case == "survivors"
    np.testing.assert_allclose(rec.estimates[AB].values, [500.0, 500.0])  # 200 + 0.6 * 500
    np.testing.assert_allclose(rec.estimates[C3].values, [1000.0])  # 400 * 1000 / 400
    grown = cache.add(*rec.releases)
    assert len(cache) == 1 and len(grown) == 3 and C3 in grown and C3 not in cache
    # next round drops p2 again: the aim0 release does not cover p2, select still does
    again = recover_round(grown, round=3, name="aim1",
                          marginals={AB: (np.array([0.0, 0.0]), 1.0)},
                          survivors=("p0", "p1"), absent=("p2",), rows=ROWS)
    assert again.cached[0]["from_round"] == "select"
    assert again.cached[0]["staleness_rounds"] == 2


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="both"):
        recover_round(MarginalCache(), round=0, name="x", marginals={}, survivors=("p0",),
                      absent=("p0",), rows=ROWS)
    with pytest.raises(ValueError, match="row count"):
        recover_round(MarginalCache(), round=0, name="x", marginals={}, survivors=("p9",),
                      absent=(), rows=ROWS)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.integers(1, 1000), min_size=2, max_size=6),
       drop_mask=st.integers(1, 2 ** 6 - 2), seed=st.integers(0, 2 ** 16))
def test_noise_free_recovery_is_exact_when_parties_share_one_distribution(
        rows: list[int], drop_mask: int, seed: int) -> None:
    """Without noise and with every party's marginal proportional to its rows (the
    uniform-split limit), both rules give back the all-rows marginal exactly."""
    ids = [f"p{i}" for i in range(len(rows))]
    n = dict(zip(ids, rows, strict=True))
    gone = [p for i, p in enumerate(ids) if drop_mask >> i & 1]
    surv = [p for p in ids if p not in gone]
    if not surv or not gone:
        return
    dist = np.random.default_rng(seed).dirichlet(np.ones(4))
    part = {p: dist * n[p] for p in ids}
    total = sum(part.values())
    y = sum(part[p] for p in surv)
    sig = np.zeros(4)
    prior = Release(round=0, name="r0", clique=AB, values=total, sigma=sig, parties=ids,
                    rows=sum(rows))
    for cache in (MarginalCache(), MarginalCache([prior])):
        rec = recover_round(cache, round=1, name="r1", marginals={AB: (y, sig)},
                            survivors=surv, absent=gone, rows=n)
        np.testing.assert_allclose(rec.estimates[AB].values, total, rtol=1e-9)
