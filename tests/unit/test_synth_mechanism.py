"""The discrete Gaussian sampler, per-party noise and the measurement plan."""

from __future__ import annotations

import math

import numpy as np
import pytest

from synth.accounting import gaussian_sigma
from synth.mechanism import (
    PlannedMeasurement,
    discrete_gaussian,
    discrete_gaussian_variance,
    measure_party,
    party_noise_variance,
    plan_measurements,
)

N = 200_000


# ---------------------------------------------------------------------------- sampler
@pytest.mark.parametrize("sigma2", [0.25, 1.0, 4.0, 100.0, 2500.0])
def test_discrete_gaussian_mean_and_variance_match_theory(sigma2: float) -> None:
    rng = np.random.default_rng(20260101)
    x = discrete_gaussian(sigma2, N, rng)
    assert x.dtype == np.int64 and x.shape == (N,)
    var = discrete_gaussian_variance(sigma2)
    # mean: 5 standard errors; variance: 3 % relative (about 6 standard errors at N = 200k)
    assert abs(x.mean()) < 5 * math.sqrt(var / N)
    assert x.var() == pytest.approx(var, rel=0.03)


def test_discrete_gaussian_pmf_matches_theory() -> None:
    sigma2 = 2.0
    x = discrete_gaussian(sigma2, N, np.random.default_rng(7))
    ys = np.arange(-40, 41)
    pmf = np.exp(-ys ** 2 / (2 * sigma2))
    pmf /= pmf.sum()
    freq = np.array([(x == y).mean() for y in ys])
    # each frequency within 5 binomial standard errors (plus a hair for tiny cells)
    se = np.sqrt(pmf * (1 - pmf) / N)
    assert np.all(np.abs(freq - pmf) <= 5 * se + 1e-5)
    assert discrete_gaussian_variance(sigma2) < sigma2  # CKS20: variance below sigma^2


def test_discrete_gaussian_shapes_zero_and_determinism() -> None:
    a = discrete_gaussian(9.0, (3, 4, 5), np.random.default_rng(1))
    b = discrete_gaussian(9.0, (3, 4, 5), np.random.default_rng(1))
    assert a.shape == (3, 4, 5) and a.dtype == np.int64
    np.testing.assert_array_equal(a, b)
    assert not np.all(a == 0)
    np.testing.assert_array_equal(discrete_gaussian(0.0, 7, np.random.default_rng(0)),
                                  np.zeros(7, dtype=np.int64))
    assert discrete_gaussian(4.0, 0, np.random.default_rng(0)).shape == (0,)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_discrete_gaussian_refuses_bad_variance(bad: float) -> None:
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian(bad, 3, np.random.default_rng(0))


# ---------------------------------------------------------------------------- party noise
def test_party_noise_variance_by_model() -> None:
    assert party_noise_variance(100.0, 10, "distributed") == pytest.approx(10.0)
    assert party_noise_variance(100.0, 10, "local") == 100.0
    assert party_noise_variance(100.0, 1, "distributed") == 100.0
    with pytest.raises(ValueError, match="noise model"):
        party_noise_variance(1.0, 2, "central")
    with pytest.raises(ValueError, match="n_parties"):
        party_noise_variance(1.0, 0, "local")


def test_distributed_noise_sums_to_the_central_level_and_local_grows_by_k() -> None:
    k, sigma2, cells = 10, 400.0, 20_000
    counts = np.arange(cells, dtype=np.float64).reshape(100, 200)
    rng = np.random.default_rng(3)
    for model, expected in (("distributed", sigma2), ("local", k * sigma2)):
        total = sum(measure_party(counts, sigma2_central=sigma2, n_parties=k, model=model,
                                  rng=rng) for _ in range(k))
        noise = total - k * counts.astype(np.int64)
        assert total.dtype == np.int64 and total.shape == counts.shape
        # variance estimate over 20k cells: 5 % relative is about 5 standard errors
        assert noise.var() == pytest.approx(expected, rel=0.05)


def test_measure_party_refuses_non_integer_or_negative_counts() -> None:
    rng = np.random.default_rng(0)
    kw = {"sigma2_central": 1.0, "n_parties": 2, "model": "distributed", "rng": rng}
    with pytest.raises(ValueError, match="integer"):
        measure_party(np.array([1.5, 2.0]), **kw)
    with pytest.raises(ValueError, match="non-negative"):
        measure_party(np.array([-1, 2]), **kw)
    with pytest.raises(ValueError, match="finite"):
        measure_party(np.array([np.nan]), **kw)
    out = measure_party(np.array([[3, 4]], dtype=np.int32), **kw)
    assert out.dtype == np.int64 and out.shape == (1, 2)


# ---------------------------------------------------------------------------- plan
def test_plan_splits_rho_and_calibrates_sigma() -> None:
    plan = plan_measurements([("a",), ("b",), ("a", "b")], 0.03, weights=[1, 1, 4])
    assert [p.clique for p in plan] == [("a",), ("b",), ("a", "b")]
    assert math.fsum(p.rho for p in plan) == pytest.approx(0.03, rel=1e-15)
    assert plan[2].rho == pytest.approx(0.02)
    for p in plan:
        assert isinstance(p, PlannedMeasurement)
        assert p.sigma == pytest.approx(gaussian_sigma(p.rho))
        assert p.sigma2 == pytest.approx(1 / (2 * p.rho))
    equal = plan_measurements([["x"], ["y"]], 1.0)
    assert [p.rho for p in equal] == [0.5, 0.5]
    assert equal[0].sigma == pytest.approx(1.0)


def test_plan_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="no cliques"):
        plan_measurements([], 1.0)
    with pytest.raises(ValueError, match="distinct"):
        plan_measurements([("a", "a")], 1.0)
    with pytest.raises(ValueError, match="weights"):
        plan_measurements([("a",)], 1.0, weights=[1, 2])
    with pytest.raises(ValueError, match="weight"):
        plan_measurements([("a",), ("b",)], 1.0, weights=[1, 0])
    with pytest.raises(ValueError, match="rho_total"):
        plan_measurements([("a",)], 0.0)
