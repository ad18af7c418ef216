"""The discrete Gaussian sampler (central references), per-party Skellam noise, survivor
refusal and the measurement plan."""

from __future__ import annotations

import math

import numpy as np
import pytest

from synth.accounting import gaussian_sigma
from synth.mechanism import (
    PlannedMeasurement,
    discrete_gaussian,
    discrete_gaussian_variance,
    SurvivorRefusal,
    check_survivors,
    default_min_survivors,
    measure_party,
    plan_measurements,
    resolve_min_survivors,
)
from synth.skellam import SkellamAccountingError

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
def test_skellam_party_noise_sums_exactly_to_the_survivors_total() -> None:
    k, mu, cells = 10, 20.0, 20_000
    counts = np.arange(cells, dtype=np.float64).reshape(100, 200)
    rng = np.random.default_rng(3)
    total = sum(measure_party(counts, mu=mu, rng=rng) for _ in range(k))
    noise = total - k * counts.astype(np.int64)
    assert total.dtype == np.int64 and total.shape == counts.shape
    # Sk(k·mu): variance 2·k·mu; 5 % relative is about 5 standard errors at 20k cells
    assert noise.var() == pytest.approx(2 * k * mu, rel=0.05)
    assert abs(noise.mean()) < 5 * math.sqrt(2 * k * mu / cells)


def test_measure_party_refuses_non_integer_or_negative_counts() -> None:
    kw = {"mu": 1.0, "rng": np.random.default_rng(0)}
    with pytest.raises(ValueError, match="integer"):
        measure_party(np.array([1.5, 2.0]), **kw)
    with pytest.raises(ValueError, match="non-negative"):
        measure_party(np.array([-1, 2]), **kw)
    with pytest.raises(ValueError, match="finite"):
        measure_party(np.array([np.nan]), **kw)
    with pytest.raises(ValueError, match="mu"):
        measure_party(np.array([1]), mu=-1.0, rng=np.random.default_rng(0))
    out = measure_party(np.array([[3, 4]], dtype=np.int32), **kw)
    assert out.dtype == np.int64 and out.shape == (1, 2)
    np.testing.assert_array_equal(measure_party(np.array([3, 4]), mu=0.0,
                                                rng=np.random.default_rng(0)), [3, 4])


def test_min_survivors_default_tolerates_30_percent_and_is_checked() -> None:
    assert default_min_survivors(10) == 7
    assert default_min_survivors(5) == 4
    assert default_min_survivors(1) == 1
    assert resolve_min_survivors(0, 10) == 7
    assert resolve_min_survivors(10, 10) == 10
    with pytest.raises(SkellamAccountingError, match="min_survivors"):
        resolve_min_survivors(11, 10)


def test_parties_refuse_to_unmask_with_too_few_survivors() -> None:
    check_survivors(7, 7)
    with pytest.raises(SurvivorRefusal, match="6 survivor") as e:
        check_survivors(6, 7)
    assert e.value.survivors == 6 and e.value.min_survivors == 7


# ---------------------------------------------------------------------------- plan
def test_plan_splits_rho_and_calibrates_sigma() -> None:
    plan = plan_measurements([("a",), ("b",), ("a", "b")], 0.03, weights=[1, 1, 4])
    assert [p.clique for p in plan] == [("a",), ("b",), ("a", "b")]
    assert math.fsum(p.rho for p in plan) == pytest.approx(0.03, rel=1e-15)
    assert plan[2].rho == pytest.approx(0.02)
    for p in plan:
        assert isinstance(p, PlannedMeasurement)
        # replace-one: L2 sensitivity sqrt(2)
        assert p.sigma == pytest.approx(gaussian_sigma(p.rho, math.sqrt(2)))
        assert p.sigma2 == pytest.approx(1 / p.rho)
    equal = plan_measurements([["x"], ["y"]], 1.0)
    assert [p.rho for p in equal] == [0.5, 0.5]
    assert equal[0].sigma == pytest.approx(math.sqrt(2))


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
