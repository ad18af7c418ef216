"""The Skellam mechanism: pmf, closure under summation, exact RDP accounting, calibration
("calibrate, then re-account"), ring sizing, and the parties' plan checks (pure)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.accounting import cdp_epsilon
from synth.mechanism import claimed_epsilon, measure_party, released_rho
from synth.plancheck import PlanRefused, verify_plan
from synth.protocol import RoundPlan, cell_modmask, cell_windows, decode_sum, quantize_counts
from synth.skellam import (
    ALPHAS,
    SkellamAccountingError,
    akl_rdp_bound,
    calibrate_total,
    party_mu,
    released_noise_pmf,
    skellam_logpmf,
    skellam_noise,
    skellam_rdp,
    skellam_rho,
)


def test_pmf_matches_scipy_and_sums_to_one() -> None:
    from scipy.stats import skellam

    k = np.arange(-60, 61)
    for mu in (0.7, 3.3):
        ours = np.exp(skellam_logpmf(k, mu))
        np.testing.assert_allclose(ours, skellam.pmf(k, mu, mu), rtol=1e-9, atol=1e-300)
    assert np.exp(skellam_logpmf(np.arange(-400, 401), 40.0)).sum() == pytest.approx(1, abs=1e-12)


def test_sum_of_party_skellams_is_skellam_of_the_sum() -> None:
    """Closure: the convolution of S pmfs Sk(mu) equals Sk(S·mu), exactly (numerically), and
    the sampler's sum over S parties matches it (frequencies within 5 standard errors)."""
    mu, s = 1.3, 7
    k = np.arange(-80, 81)
    one = np.exp(skellam_logpmf(k, mu))
    conv = one
    for _ in range(s - 1):
        conv = np.convolve(conv, one)
    kk = np.arange(-80 * s, 80 * s + 1)
    np.testing.assert_allclose(conv, released_noise_pmf(mu, s, kk), atol=1e-15)
    rng = np.random.default_rng(11)
    n = 200_000
    draws = sum(skellam_noise(mu, n, rng) for _ in range(s))
    ys = np.arange(-15, 16)
    pmf = released_noise_pmf(mu, s, ys)
    freq = np.array([(draws == y).mean() for y in ys])
    se = np.sqrt(pmf * (1 - pmf) / n)
    assert np.all(np.abs(freq - pmf) <= 5 * se + 1e-5)


def test_rdp_is_between_the_gaussian_and_the_closed_form_bound() -> None:
    for mu in (1.0, 10.0, 500.0):
        alphas, eps = skellam_rdp(mu)
        var = 2 * mu
        for i in range(0, alphas.size, 50):
            a = alphas[i]
            if float(a).is_integer():
                assert eps[i] <= akl_rdp_bound(a, var) * (1 + 1e-9)
        # integer orders, by monotonicity: eps(a) <= AKL(ceil a)
        assert np.all(eps <= np.array([akl_rdp_bound(a, var) for a in alphas]) * (1 + 1e-9))
        assert np.all(np.diff(eps) >= -1e-12)  # RDP is non-decreasing in the order
    assert skellam_rho(500.0) >= 1 / (2 * 500.0)


def test_too_little_noise_is_refused() -> None:
    with pytest.raises(SkellamAccountingError, match="too little noise"):
        skellam_rho(0.1)
    with pytest.raises(SkellamAccountingError, match="accounts"):
        calibrate_total(10.0)
    with pytest.raises(SkellamAccountingError, match="honest"):
        party_mu(0.01, 0)
    with pytest.raises(SkellamAccountingError):
        party_mu(-1.0, 3)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rho=st.floats(min_value=1e-4, max_value=0.3), s_min=st.integers(1, 30),
       extra=st.integers(0, 5))
def test_calibrate_then_reaccount(rho: float, s_min: int, extra: int) -> None:
    """The noise a party calibrates re-accounts to at most the target for any sum over at
    least S_min parties, and is within 3 % of the smallest Gaussian-equivalent noise."""
    mu = party_mu(rho, s_min)
    assert released_rho(mu, s_min) <= rho
    assert released_rho(mu, s_min + extra) <= rho
    assert 2 * mu * s_min >= 1 / rho  # never below the Gaussian's variance Δ₂²/(2ρ)
    assert 2 * mu * s_min <= 1.1 / rho
    local = party_mu(rho, s_min, model="local")
    assert released_rho(local, 1) <= rho


def _exact_delta(lam: float, eps: float) -> float:
    """Exact δ(ε) of the released pair of cells (replace-one: one cell +1, another −1)
    with noise Sk(lam) per cell, from the probability tables."""
    sd = math.sqrt(2 * lam)
    k = np.arange(-int(60 * sd) - 60, int(60 * sd) + 61)
    lq = skellam_logpmf(k, lam)
    ok = np.isfinite(lq)
    lq = lq[ok]
    # one cell shifted by +1: P(k) = q(k−1); loss ℓ(k) = log q(k−1) − log q(k)
    lp = np.concatenate([[-np.inf], lq[:-1]])
    p = np.exp(lp)
    loss = lp - lq
    m = np.isfinite(loss) & (p > 0)
    p, loss = p[m], loss[m]
    # two independent cells with the same loss distribution (symmetry)
    tot_loss = (loss[:, None] + loss[None, :]).ravel()
    tot_p = (p[:, None] * p[None, :]).ravel()
    return float(np.sum(tot_p * np.clip(1 - np.exp(eps - tot_loss), 0, None)))


def test_exact_privacy_profile_is_within_the_claim() -> None:
    """Exact hockey-stick divergence of the released sum at the claimed ε is at most δ for
    every survivor count >= S_min: the printed figure is true. Controls: at half the ε,
    and for a sum of fewer than S_min parties (what survivor refusal prevents), it is not."""
    rho, s_min, delta = 0.05, 7, 1e-5
    mu = party_mu(rho, s_min)
    lam = mu * s_min
    eps = claimed_epsilon(rho, 1, delta)
    assert _exact_delta(lam, eps) <= delta
    assert _exact_delta(mu * 10, eps) <= delta
    assert _exact_delta(lam, eps / 2) > delta
    assert _exact_delta(mu * 2, eps) > delta
    assert claimed_epsilon(rho, 3, delta) == pytest.approx(cdp_epsilon(3 * rho, delta))
    from synth.protocol import plans_epsilon

    plan = RoundPlan(round=0, name="t", cliques=(("a",), ("b",), ("c",)), sizes=(2, 2, 2),
                     sigma2_central=2 * lam, noise_model="distributed", n_parties=10,
                     step=1.0, cell_bits=bytes([8] * 6), timeout_s=1.0, rho=rho,
                     min_survivors=s_min)
    assert plans_epsilon([plan], delta) == pytest.approx(cdp_epsilon(3 * rho, delta))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 5000), k=st.integers(1, 12), mu=st.floats(0.5, 400.0),
       seed=st.integers(0, 2**31))
def test_ring_sizing_never_wraps(n: int, k: int, mu: float, seed: int) -> None:
    """A ring sized for a public count bound N and 12 std of the full sum's noise decodes
    the exact sum for counts <= N split any way over any survivors."""
    rng = np.random.default_rng(seed)
    upper = np.full(4, float(n))
    lo, widths = cell_windows(upper, sigma_sum=math.sqrt(2 * mu * k))
    plan = RoundPlan(round=0, name="t", cliques=(("a",),), sizes=(4,), sigma2_central=0.0,
                     noise_model="distributed", n_parties=k, step=1.0,
                     cell_bits=widths.tobytes(), timeout_s=1.0)
    true = rng.integers(0, n + 1, 4)
    split = np.stack([rng.multinomial(int(t), np.ones(k) / k) for t in true], axis=1)
    alive = rng.permutation(k)[:rng.integers(1, k + 1)]
    noisy = [measure_party(split[p], mu=mu, rng=rng) for p in alive]
    total = sum(quantize_counts(x, plan) for x in noisy) & cell_modmask(widths)
    np.testing.assert_array_equal(decode_sum(total, lo, plan), sum(noisy))
    # the tail outside the window has negligible probability (exact pmf)
    lam = mu * k
    sd = math.sqrt(2 * lam)
    pad = int(12 * sd)
    tail = 1.0 - released_noise_pmf(mu, k, np.arange(-pad, pad + 1)).sum()
    assert tail < 1e-12


# ---------------------------------------------------------------------------- plan checks
def _kw(**over: object) -> dict[str, object]:
    base: dict[str, object] = dict(
        n_parties=10, min_survivors=7, min_honest=7, noise_model="distributed", step=1.0,
        rho=1e-3, sigma2_central=0.0, cliques=(("a",), ("a", "b")), sizes=(3, 6),
        session_parties=[f"p{i}" for i in range(10)], domain_shape={"a": 3, "b": 2},
        own_parties=10, own_min_survivors=0, own_min_honest=0,
        own_noise_model="distributed", private=True, remaining_rho=1.0)
    base.update(over)
    return base


def test_a_good_plan_gets_the_partys_own_noise() -> None:
    mu = verify_plan(**_kw())  # type: ignore[arg-type]
    # K = 10, S_min = min_honest = 7 (defaults): d = 7 + 7 - 10 = 4 honest in any release
    assert mu == party_mu(1e-3, 4)
    # a plan assuming more honest parties changes nothing: the noise is the party's own
    assert verify_plan(**_kw(min_honest=10)) == mu  # type: ignore[arg-type]
    assert verify_plan(**_kw(rho=0.0, private=False)) == 0.0  # type: ignore[arg-type]


@pytest.mark.parametrize(("over", "field"), [
    ({"n_parties": 9}, "n_parties"),
    ({"min_survivors": 5}, "min_survivors"),
    ({"min_honest": 6}, "min_honest"),  # assumes fewer honest parties than the party
    ({"min_honest": 0}, "min_honest"),  # a plan that states no trust model
    ({"session_parties": [f"p{i}" for i in range(100)], "n_parties": 100}, "parties"),
    ({"noise_model": "local"}, "noise_model"),
    ({"step": 4.0}, "step"),
    ({"rho": 0.0}, "rho"),
    ({"rho": math.inf}, "rho"),
    ({"remaining_rho": 1e-3}, "rho"),  # 2 cliques x 1e-3 > the remaining budget
    ({"cliques": (("a",), ("a", "z"))}, "cliques"),
    ({"cliques": (("a", "a"),), "sizes": (9,)}, "cliques"),
    ({"sizes": (3, 7)}, "sizes"),
    ({"sigma2_central": 1e9}, "sigma2_central"),
    ({"rho": 1e-3, "private": False}, "rho"),
])
def test_a_plan_that_disagrees_is_refused_naming_the_field(over: dict[str, object],
                                                           field: str) -> None:
    with pytest.raises(PlanRefused) as e:
        verify_plan(**_kw(**over))  # type: ignore[arg-type]
    assert e.value.field == field and field in str(e.value)


def test_min_survivors_beyond_the_session_is_refused() -> None:
    with pytest.raises(SkellamAccountingError, match="min_survivors"):
        verify_plan(**_kw(own_min_survivors=11, min_survivors=11))  # type: ignore[arg-type]


def test_grid_covers_the_orders_the_conversion_uses() -> None:
    assert 1.0 < ALPHAS[0] < 1.001 and ALPHAS[-1] == pytest.approx(1000.0)
    assert np.all(np.diff(ALPHAS) > 0)
    # the charge is within 1 % of the Gaussian's at the same variance for large noise
    assert skellam_rho(1400.0) <= 1.01 / (2 * 1400.0)
