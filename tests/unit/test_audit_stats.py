"""The privacy audit's statistics (sim/reports/audit.py) and a fast subset of bench/dp_audit.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from sim.reports.audit import (
    IntPmf,
    bonferroni,
    compose_plds,
    convolve_all,
    cp_lower,
    cp_upper,
    discrete_gaussian_pmf,
    eps_from_rates,
    eps_lower_bound,
    exact_epsilon,
    exact_epsilon_product,
    fitted_mu,
    gdp_epsilon,
    gdp_tradeoff,
    hockey_stick,
    pld_from_pmfs,
    point_pmf,
    power,
    projected_eps_lower_bound,
    released_sum_pmf,
    skellam_pmf,
)

REPO = Path(__file__).resolve().parents[2]
DELTA = 1e-5


def discrete_laplace_pmf(t: float, bound: int = 600) -> IntPmf:
    y = np.arange(-bound, bound + 1)
    w = np.exp(-np.abs(y) / t)
    return IntPmf(-bound, w / w.sum())


# ---------------------------------------------------------------------------- Clopper–Pearson
@pytest.mark.parametrize("n", [1, 10, 1000])
def test_cp_upper_at_zero_successes_is_the_closed_form(n: int) -> None:
    # P(Bin(n, p) = 0) = (1 - p)^n = alpha
    assert cp_upper(0, n, 0.05) == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-10)
    assert cp_lower(n, n, 0.05) == pytest.approx(0.05 ** (1 / n), rel=1e-10)


@pytest.mark.parametrize(("k", "n"), [(1, 10), (5, 100), (37, 1000), (999, 1000)])
def test_cp_limits_match_scipy_exact_one_sided_intervals(k: int, n: int) -> None:
    hi = stats.binomtest(k, n, alternative="less").proportion_ci(0.95, method="exact").high
    lo = stats.binomtest(k, n, alternative="greater").proportion_ci(0.95, method="exact").low
    assert cp_upper(k, n, 0.05) == pytest.approx(hi, rel=1e-9)
    assert cp_lower(k, n, 0.05) == pytest.approx(lo, rel=1e-9)


def test_cp_limits_edges_and_arrays() -> None:
    assert cp_upper(10, 10) == 1.0
    assert cp_lower(0, 10) == 0.0
    arr = cp_upper(np.array([0, 1, 2]), 50, 0.01)
    assert arr.shape == (3,) and np.all(np.diff(arr) > 0)
    with pytest.raises(ValueError):
        cp_upper(11, 10)
    with pytest.raises(ValueError):
        cp_upper(1, 10, alpha=1.5)


@pytest.mark.parametrize("p", [0.002, 0.02, 0.2, 0.5])
def test_cp_upper_covers_at_its_level(p: float) -> None:
    """The exact coverage P(cp_upper(K, n) >= p), K ~ Bin(n, p), summed over the pmf (no
    sampling, so no seed to be lucky with): at least 1 - alpha. Control: the normal
    approximation's upper limit, which is known to undercover at small n p, fails it."""
    n = 400
    k = np.arange(n + 1)
    pmf = stats.binom.pmf(k, n, p)
    cover = float(pmf[cp_upper(k, n, 0.05) >= p].sum())
    assert cover >= 0.95 - 1e-12, cover
    if p == 0.002:  # n p = 0.8
        phat = k / n
        wald = phat + stats.norm.ppf(0.95) * np.sqrt(phat * (1 - phat) / n)
        assert float(pmf[wald >= p].sum()) < 0.95


def test_bonferroni() -> None:
    assert bonferroni(0.05, 20) == pytest.approx(0.0025)
    with pytest.raises(ValueError):
        bonferroni(0.05, 0)


# ---------------------------------------------------------------------------- black box
def test_eps_from_rates() -> None:
    assert eps_from_rates(0.01, 0.5, 0.0) == pytest.approx(math.log(50))
    assert eps_from_rates(0.5, 0.01, 0.0) == pytest.approx(math.log(50))
    assert eps_from_rates(0.6, 0.6, 0.0) == 0.0  # nothing significant


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_gaussian_lower_bound_is_below_the_truth_and_close_for_large_n(mu: float) -> None:
    rng = np.random.default_rng(7)
    n = 400_000
    res = eps_lower_bound(rng.normal(0, 1, n), rng.normal(mu, 1, n), delta=DELTA)
    truth = gdp_epsilon(mu, DELTA)
    assert res.eps <= truth
    assert res.eps >= 0.55 * truth  # the split-half test recovers most of it
    assert res.mu_hat == pytest.approx(mu, abs=0.4)


def test_lower_bound_finds_either_direction_and_is_zero_without_signal() -> None:
    rng = np.random.default_rng(3)
    n = 100_000
    up = eps_lower_bound(rng.normal(0, 1, n), rng.normal(2, 1, n), delta=DELTA)
    down = eps_lower_bound(rng.normal(0, 1, n), rng.normal(-2, 1, n), delta=DELTA)
    assert up.direction == 1 and down.direction == -1
    assert up.eps > 3 and down.eps > 3
    same = eps_lower_bound(rng.normal(0, 1, n), rng.normal(0, 1, n), delta=DELTA, alpha=0.01)
    assert same.eps < 0.1


def test_lower_bound_sound_at_the_family_level() -> None:
    # many repetitions at a known mu: the fraction of bounds above the truth stays < alpha
    rng = np.random.default_rng(11)
    truth = gdp_epsilon(1.0, DELTA)
    over = sum(eps_lower_bound(rng.normal(0, 1, 4000), rng.normal(1, 1, 4000),
                               delta=DELTA, alpha=0.05).eps > truth for _ in range(100))
    assert over <= 5


def test_lower_bound_on_discrete_statistic_with_ties() -> None:
    rng = np.random.default_rng(5)
    n = 200_000
    x = rng.binomial(1, 0.1, n)
    y = rng.binomial(1, 0.5, n)
    res = eps_lower_bound(x, y, delta=0.0)
    # the best test is "y == 1": FPR 0.1, FNR 0.5 -> log(0.5/0.1) = log 5 at most
    assert res.eps <= math.log(5) + 1e-9
    assert res.eps > math.log(5) - 0.1


def test_projected_lower_bound_on_vectors() -> None:
    rng = np.random.default_rng(2)
    n, d = 200_000, 16
    shift = np.zeros(d)
    shift[3] = 2.0  # mu = 2 along one unknown axis
    a = rng.normal(size=(n, d))
    b = rng.normal(size=(n, d)) + shift
    res = projected_eps_lower_bound(a, b, delta=DELTA)
    assert 0.5 * gdp_epsilon(2.0, DELTA) < res.eps <= gdp_epsilon(2.0, DELTA)


def test_lower_bound_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        eps_lower_bound(np.zeros(2), np.zeros(10), delta=DELTA)
    with pytest.raises(ValueError):
        eps_lower_bound(np.array([0, 1, np.nan, 2]), np.zeros(10), delta=DELTA)


# ---------------------------------------------------------------------------- exact
@pytest.mark.parametrize("t", [1.0, 3.0, 7.5])
def test_exact_epsilon_of_discrete_laplace_is_one_over_t(t: float) -> None:
    p = discrete_laplace_pmf(t)
    assert exact_epsilon(p, p.shift(1), 1e-12) == pytest.approx(1 / t, abs=1e-8)
    assert hockey_stick(p, p.shift(1), 1 / t) == pytest.approx(0.0, abs=1e-12)
    assert hockey_stick(p, p.shift(1), 0.0) > 0


def test_exact_epsilon_of_a_fine_discrete_gaussian_matches_gdp_and_dp_accounting() -> None:
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    g = discrete_gaussian_pmf(20.0 ** 2)  # shift 20 at sigma 20: mu = 1
    ours = exact_epsilon(g, g.shift(20), DELTA)
    lib = pldlib.from_gaussian_mechanism(standard_deviation=1.0, sensitivity=1.0,
                                         value_discretization_interval=1e-4)
    assert ours == pytest.approx(lib.get_epsilon_for_delta(DELTA), abs=2e-3)
    assert ours == pytest.approx(gdp_epsilon(1.0, DELTA), abs=2e-3)
    # the hockey stick at that eps is the GDP delta (closed form, Dong-Roth-Su Cor. 2.13)
    from parties.privacy.dp import delta_for_epsilon
    assert hockey_stick(g, g.shift(20), 3.0) == pytest.approx(delta_for_epsilon(3.0, 1.0),
                                                              rel=1e-2)


def test_product_of_coordinates_composes_like_gaussians() -> None:
    from dp_accounting.pld import privacy_loss_distribution as pldlib

    g = discrete_gaussian_pmf(10.0 ** 2)
    two = exact_epsilon_product([(g, g.shift(10)), (g.shift(10), g)], DELTA)
    lib = pldlib.from_gaussian_mechanism(standard_deviation=1.0, sensitivity=1.0,
                                         value_discretization_interval=1e-4)
    assert two == pytest.approx(lib.compose(lib).get_epsilon_for_delta(DELTA), abs=5e-3)
    assert two == pytest.approx(gdp_epsilon(math.sqrt(2), DELTA), abs=5e-3)


def test_composed_pld_overstates_by_at_most_the_grid() -> None:
    p = discrete_laplace_pmf(2.0)
    single = pld_from_pmfs(p, p.shift(1))
    comp = compose_plds([single, single], grid=1e-3)
    # pure DP composes: 2 * 1/t, rounded up by at most 2 grid steps
    eps = exact_epsilon_product([(p, p.shift(1)), (p, p.shift(1))], 1e-12, grid=1e-3)
    assert 1.0 - 1e-9 <= eps <= 1.0 + 2e-3
    assert comp.delta(1.0 + 2e-3) == pytest.approx(0.0, abs=1e-12)


def test_deterministic_disclosure_is_infinite() -> None:
    assert exact_epsilon(point_pmf(100), point_pmf(101), DELTA) == math.inf
    g = discrete_gaussian_pmf(4.0)
    assert exact_epsilon_product([(g, g.shift(1)), (point_pmf(5), point_pmf(6))], DELTA) == math.inf
    assert exact_epsilon_product([(g, g.shift(1)), (point_pmf(5), point_pmf(5))], DELTA) == \
        pytest.approx(exact_epsilon(g, g.shift(1), DELTA), abs=1e-3)


# ---------------------------------------------------------------------------- tables
def test_discrete_gaussian_table_matches_the_product_sampler() -> None:
    from synth.mechanism import discrete_gaussian, discrete_gaussian_variance

    rng = np.random.default_rng(0)
    for s2 in (0.1, 2.0):
        table = discrete_gaussian_pmf(s2)
        assert float((table.probs * table.support ** 2).sum()) == pytest.approx(
            discrete_gaussian_variance(s2), rel=1e-9)
        draws = discrete_gaussian(s2, 200_000, rng)
        vals, counts = np.unique(draws, return_counts=True)
        expected = np.exp(table.log_prob(vals)) * draws.size
        keep = expected > 20
        chi2 = float(np.sum((counts[keep] - expected[keep]) ** 2 / expected[keep]))
        assert stats.chi2.sf(chi2, keep.sum() - 1) > 1e-4


def test_sum_of_discrete_gaussians_is_not_a_discrete_gaussian_but_skellam_is_closed() -> None:
    k = 10
    total = power(discrete_gaussian_pmf(0.1), k)
    var = float((total.probs * total.support ** 2).sum())
    assert var < 0.2  # K * Var(N_Z(0, 0.1)) ~ 0.13, far from 1
    sk = power(skellam_pmf(0.5 / k), k)
    ref = skellam_pmf(0.5)
    a = sk.probs[ref.offset - sk.offset: ref.offset - sk.offset + ref.probs.size]
    np.testing.assert_allclose(a, ref.probs, atol=1e-12)


def test_power_equals_repeated_convolution() -> None:
    p = IntPmf(-1, np.array([0.2, 0.5, 0.3]))
    a, b = power(p, 7), convolve_all([p] * 7)
    assert a.offset == b.offset
    np.testing.assert_allclose(a.probs, b.probs, atol=1e-15)


def test_released_sum_rounding_and_ring() -> None:
    noise = [IntPmf(0, np.array([0.5, 0.5]))] * 2  # Bernoulli noise per party
    plain = released_sum_pmf(noise, [3, 4])
    assert plain.offset == 7
    np.testing.assert_allclose(plain.probs, [0.25, 0.5, 0.25])
    # a party's own rounding: codes rint(v / 2) (ties to even), then the sum
    coded = released_sum_pmf(noise, [3, 4], encode=lambda v: np.rint(v / 2))
    got_coded = {s: p for s, p in zip(coded.support.tolist(), coded.probs.tolist(), strict=True) if p > 0}
    assert got_coded == pytest.approx(_brute(noise, [3, 4]))
    # survivors: only party 0's message
    only = released_sum_pmf(noise, [3, 4], survivors=[0])
    assert only.offset == 3
    # ring (lo, w): S comes back as lo + ((S - lo) mod 2^w)
    ring = released_sum_pmf(noise, [3, 4], ring=(0, 3))  # 7, 8, 9 -> 7, 0, 1
    got = dict(zip(ring.support.tolist(), ring.probs.tolist(), strict=True))
    assert got[7] == pytest.approx(0.25) and got[0] == pytest.approx(0.5)
    assert got[1] == pytest.approx(0.25)


def _brute(noise: list[IntPmf], counts: list[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for z0, p0 in zip(noise[0].support, noise[0].probs, strict=True):
        for z1, p1 in zip(noise[1].support, noise[1].probs, strict=True):
            s = int(np.rint((counts[0] + z0) / 2) + np.rint((counts[1] + z1) / 2))
            out[s] = out.get(s, 0.0) + p0 * p1
    return out


# ---------------------------------------------------------------------------- GDP
def test_gdp_helpers() -> None:
    assert gdp_tradeoff(0.05, 0.0) == pytest.approx(0.95)
    assert gdp_tradeoff(0.5, 1.0) == pytest.approx(stats.norm.cdf(-1.0))
    assert gdp_epsilon(1.0, DELTA) == pytest.approx(4.3771781, abs=1e-6)
    assert fitted_mu(stats.norm.sf(1.0), stats.norm.cdf(-1.0)) == pytest.approx(2.0)


# ---------------------------------------------------------------------------- fast audit subset


#: Draws per side of the fast VFL cases in the test (default: the case's quick draws).
FAST_DRAWS = {"vfl_preprocess_scaler": 5_000, "vfl_embedding_nan_row": 20_000,
              "vfl_report_n_features": 20_000, "vfl_label_rr_eps1": 10_000}


def test_fast_audit_subset(dp_audit: object) -> None:
    """The audit's fast subset (<= 30 s): every VFL case in it is sound against the
    product's claim (lb <= claim, no exact violation) and every positive control is
    caught by the same test; the FedForge cells (re-pointed separately) keep their
    controls caught and the central reference sound."""
    audit = dp_audit
    reg = audit.REGISTRY  # type: ignore[attr-defined]
    assert len(reg) >= 15
    vfl = [n for n, c in reg.items() if c.fast and c.group.startswith("vfl")]
    ff = [n for n, c in reg.items() if c.fast and c.group == "fedforge"]
    assert {"vfl_embedding_1", "vfl_embedding_nan_row", "vfl_preprocess_scaler",
            "vfl_report_n_features", "vfl_e2e_own_plus_step", "vfl_label_rr_eps1"} <= set(vfl)
    # VFL: each case at its quick-mode draws, at most FAST_DRAWS (the preprocessing case
    # at 5e3: its control's fitted mu is ~2.3, far above the claim's 0.5)
    alpha = bonferroni(0.05, len(vfl))
    rows_v = [audit.run_case(reg[n], n=min(reg[n].draws_quick, FAST_DRAWS.get(n, 10**9)),  # type: ignore[attr-defined]
                             alpha=alpha, seed=0) for n in vfl]
    for r in rows_v:
        assert r["lb"] <= r["claim"], (r["name"], r["lb"], r["claim"])
        assert not r["exact_violation"], r["name"]
        for c in (r["control"], *r["extra_controls"]):
            assert c["detected"], (r["name"], c["what"], c["lb"], c["claim"])
    # FedForge: controls caught, the central discrete Gaussian (K = 1) sound
    doc = audit.run(ff, quick=True, seed=0, draws=200_000,  # type: ignore[attr-defined]
                    log=lambda s: None)
    rows = {r["name"]: r for r in doc["cases"]}
    for r in rows.values():
        assert r["control"]["detected"], r["name"]
    assert rows["ff_central_s1"]["lb"] <= rows["ff_central_s1"]["claim"]
    assert rows["ff_central_s1"]["exact"] <= rows["ff_central_s1"]["claim"]
    assert doc["summary"]["cases"] == len(ff)
    assert set(doc["summary"]) == {"cases", "max_lb_over_claim", "exact_violations",
                                   "controls", "controls_detected", "control_cases",
                                   "cases_must_hold"}


def test_batched_adam_step_is_the_product_optimizer(dp_audit: object) -> None:
    """The audit's batched first Adam step equals ``parties.models.model.make_adam``'s."""
    import torch
    audit = dp_audit
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(3, 4, generator=gen), "b": torch.randn(4, generator=gen)}
    for scale in (1e-12, 1e-3, 10.0):  # linear regime, mixed, sign regime
        grads = {k: scale * torch.randn(v.shape, generator=gen) for k, v in params.items()}
        audit.check_adam_first_step(params, grads, 0.5)  # type: ignore[attr-defined]


def test_repeated_prediction_case_takes_the_products_composed_claim(dp_audit: object) -> None:
    """``vfl_repeated_prediction`` charges its 4 releases through the product's ledger
    (``parties.runtime.predict.charge``): its claim is the composed µ_test·2, its control the
    pre-fix per-file µ_test (the draws are those of ``vfl_embedding_k4``'s mechanism,
    audited at 10^6 draws by ``--quick``)."""
    import math

    from parties.privacy.dp import epsilon_for_delta
    audit = dp_audit
    case = audit.REGISTRY["vfl_repeated_prediction"]  # type: ignore[attr-defined]
    p = audit.vfl_repeated_prediction_product()  # type: ignore[attr-defined]
    assert p["release_mu"] == 2 / p["sigma"] and p["clip"] == 1.0
    assert p["prediction_mu"] == math.sqrt(audit.PREDICTIONS) * p["release_mu"]  # type: ignore[attr-defined]
    assert case.main.claim() == epsilon_for_delta(p["prediction_mu"], 1e-5)
    assert case.control.claim() == epsilon_for_delta(p["release_mu"], 1e-5)
    a, b = case.main.sample(10, np.random.default_rng(0))
    assert a.shape == b.shape == (10, 4 * 4)


def test_label_dp_case_draws_through_the_products_label_protection(dp_audit: object) -> None:
    """``vfl_label_rr_eps1`` claims the label ledger's pure ε (``party_dp`` +
    ``labels_report``, δ = 0) and draws the labels the active worker trains on
    (``label_protection`` + ``ActiveCompute.labels_of``): one randomisation per run, the
    same label in every epoch, flipped at the product's rate; its controls (3ε, and a
    fresh secret per epoch) exceed the claim in their exact ε."""
    from parties.privacy.labels import RandomizedResponse
    audit = dp_audit
    case = audit.REGISTRY["vfl_label_rr_eps1"]  # type: ignore[attr-defined]
    assert case.main.claim() == 1.0
    assert all(c.claim() == 1.0 for c in (case.control, *case.extra_controls))
    assert case.main.exact() <= 1.0
    assert case.control.exact() > 2.9 and case.extra_controls[0].exact() > 1.9
    n, p = 2000, RandomizedResponse(epsilon=1.0).flip_probability
    a, b = case.main.sample(n, np.random.default_rng(0))
    assert a.shape == b.shape == (n, audit.LABEL_EPOCHS)  # type: ignore[attr-defined]
    assert (a == a[:, :1]).all() and (b == b[:, :1]).all()  # the same label every epoch
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(a[:, 0].mean() - p) < 5 * sd  # true label 0: trained as 1 when flipped
    assert abs((1 - b[:, 0]).mean() - p) < 5 * sd
    fa, _ = case.extra_controls[0].sample(n, np.random.default_rng(1))
    assert (fa != fa[:, :1]).any()  # the control re-randomises each epoch
