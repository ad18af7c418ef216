"""MST selection from noisy aggregate answers: picks planted dependencies, spans the domain."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from synth.accounting import cdp_rho, gaussian_sigma
from synth.domain import Domain, DomainTooLarge, marginal
from synth.engine import NoisyMarginal
from synth.mechanism import discrete_gaussian
from synth.select import (
    aim_scores,
    aim_select_batch,
    aim_select_round,
    candidate_pairs,
    mst_budget,
    mst_select,
    pair_scores,
)

ATTRS = ("a", "b", "c", "d", "e", "f")
SIZES = (3, 4, 2, 5, 3, 4)
DOM = Domain(attributes=ATTRS, sizes=SIZES)
N = 20_000
# planted chain of dependencies; f is independent of everything
PLANTED = {("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")}


def _data(seed: int = 11) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.empty((N, 6), dtype=np.int32)
    x[:, 0] = rng.integers(0, 3, N)
    for j in range(1, 5):  # child = parent (mod size) with prob 0.7, else uniform
        noise = rng.integers(0, SIZES[j], N)
        x[:, j] = np.where(rng.random(N) < 0.7, x[:, j - 1] % SIZES[j], noise)
    x[:, 5] = rng.integers(0, 4, N)
    return x


def _measure(x: np.ndarray, clique: tuple[str, ...], sigma: float,
             rng: np.random.Generator) -> NoisyMarginal:
    counts = marginal(x, DOM, clique).ravel()
    noisy = counts + discrete_gaussian(sigma ** 2, counts.size, rng)
    return NoisyMarginal(clique=clique, values=noisy.astype(np.float64), sigma=sigma)


def _answers(x: np.ndarray, rho: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    r1, r2, _ = mst_budget(rho)
    pairs = candidate_pairs(DOM)
    s1 = gaussian_sigma(r1 / len(ATTRS))
    s2 = gaussian_sigma(r2 / len(pairs))
    one = {a: _measure(x, (a,), s1, rng) for a in ATTRS}
    two = {p: _measure(x, p, s2, rng) for p in pairs}
    return one, two


def test_mst_budget_thirds() -> None:
    r = mst_budget(0.3)
    assert sum(r) == pytest.approx(0.3, rel=1e-15)
    assert all(v == pytest.approx(0.1) for v in r)
    with pytest.raises(ValueError):
        mst_budget(0.0)


def test_candidate_pairs_refuses_large_pairs() -> None:
    assert candidate_pairs(DOM) == list(itertools.combinations(ATTRS, 2))
    small = candidate_pairs(DOM, max_cells=12)
    assert ("a", "b") in small and ("d", "f") not in small  # 20 cells > 12
    assert all(DOM.size(p) <= 12 for p in small)
    with pytest.raises(DomainTooLarge) as e:
        candidate_pairs(DOM, max_cells=12, strict=True)
    assert e.value.cells > 12


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_mst_picks_planted_dependencies(epsilon: float) -> None:
    x = _data()
    one, two = _answers(x, cdp_rho(epsilon, 1e-9))
    tree = mst_select(DOM, one, two)
    assert len(tree) == len(ATTRS) - 1
    nodes = {a for e in tree for a in e}
    assert nodes == set(ATTRS)
    assert PLANTED <= set(tree)
    # spanning tree: d - 1 edges and connected  <=>  no cycle
    parent = {a: a for a in ATTRS}

    def find(a: str) -> str:
        while parent[a] != a:
            a = parent[a]
        return a
    for a, b in tree:
        ra, rb = find(a), find(b)
        assert ra != rb
        parent[ra] = rb


def test_pair_scores_prefer_dependent_pairs_and_accept_either_order() -> None:
    x = _data()
    one, two = _answers(x, 1.0)
    sc = pair_scores(DOM, one, two)
    assert min(sc[p] for p in PLANTED) > max(v for p, v in sc.items() if "f" in p)
    # keyed in the reverse order: same scores
    rev = {(b, a): NoisyMarginal(clique=(b, a),
                                 values=m.values.reshape(DOM.shape((a, b))).T.ravel(),
                                 sigma=m.sigma) for (a, b), m in two.items()}
    sc2 = pair_scores(DOM, one, rev)
    for p in sc:
        assert sc2[p] == pytest.approx(sc[p])


def test_pair_scores_debias_subtracts_expected_noise() -> None:
    x = _data()
    one, two = _answers(x, 1.0)
    raw = pair_scores(DOM, one, two, debias=False)
    deb = pair_scores(DOM, one, two)
    for p, m in two.items():
        assert raw[p] - deb[p] == pytest.approx(math.sqrt(2 / math.pi) * m.sigma * m.values.size)


def test_aim_select_round_picks_the_worst_explained_clique() -> None:
    x = _data()
    rng = np.random.default_rng(2)
    cands = [("a", "b"), ("e", "f"), ("a", "f")]
    answers = {c: _measure(x, c, 5.0, rng) for c in cands}

    def independent(c):  # a model that knows the 1-way marginals only
        ma, mb = marginal(x, DOM, (c[0],)), marginal(x, DOM, (c[1],))
        return np.outer(ma, mb) / N
    best, score = aim_select_round(DOM, cands, answers, independent, sigma_next=5.0)
    assert best == ("a", "b") and score > 0
    with pytest.raises(KeyError):
        aim_select_round(DOM, [("b", "c")], answers, independent, sigma_next=1.0)


def test_aim_select_batch_takes_the_best_that_fit_in_score_order() -> None:
    x = _data()
    rng = np.random.default_rng(2)
    cands = [("a", "b"), ("e", "f"), ("a", "f"), ("c", "d")]
    answers = {c: _measure(x, c, 5.0, rng) for c in cands}

    def independent(c):  # a model that knows the 1-way marginals only
        ma, mb = marginal(x, DOM, (c[0],)), marginal(x, DOM, (c[1],))
        return np.outer(ma, mb) / N
    scores = aim_scores(DOM, cands, answers, independent, sigma_next=5.0)
    order = sorted(scores, key=lambda c: -scores[c])
    picks = aim_select_batch(DOM, cands, answers, independent, sigma_next=5.0, batch=2)
    assert [c for c, _ in picks] == order[:2]
    assert picks[0][0] == aim_select_round(DOM, cands, answers, independent, sigma_next=5.0)[0]
    # a size rule that refuses the best one: the next two in score order
    no_best = aim_select_batch(DOM, cands, answers, independent, sigma_next=5.0, batch=2,
                               fits=lambda cl: order[0] not in cl)
    assert [c for c, _ in no_best] == order[1:3]
    assert aim_select_batch(DOM, cands, answers, independent, sigma_next=5.0, batch=9,
                            fits=lambda cl: False) == []
    with pytest.raises(ValueError, match="batch"):
        aim_select_batch(DOM, cands, answers, independent, sigma_next=5.0, batch=0)
