"""zCDP accounting: tight conversion, Gaussian calibration, the budgeted ledger."""

from __future__ import annotations

import json
import math

import pytest

from synth.accounting import (
    BudgetExceeded,
    ZCdpAccountant,
    allocate,
    cdp_delta,
    cdp_epsilon,
    cdp_rho,
    cdp_rho_simple,
    gaussian_rho,
    gaussian_sigma,
)

# ρ from private-pgm's own cdp_rho/cdp_delta (1000-step bisections, run here verbatim):
# (ε, δ) -> ρ
PGM_RHO = {(1.0, 1e-9): 0.014973057673588523, (0.05, 1e-12): 3.131086169337552e-05,
           (20.0, 1e-3): 7.258777059700876, (0.05, 1e-3): 0.00038284420262273274}


# ---------------------------------------------------------------------------- conversions
def test_tight_rho_at_the_reference_point() -> None:
    assert cdp_rho(1.0, 1e-9) == pytest.approx(0.01497, abs=1e-4)
    assert cdp_rho_simple(1.0, 1e-9) == pytest.approx(0.01178, abs=1e-4)


def test_tight_conversion_gives_about_27_percent_more_budget() -> None:
    gain = cdp_rho(1.0, 1e-9) / cdp_rho_simple(1.0, 1e-9) - 1.0
    assert gain == pytest.approx(0.27, abs=0.01)


@pytest.mark.parametrize(("eps", "delta"), sorted(PGM_RHO))
def test_cdp_rho_matches_private_pgm(eps: float, delta: float) -> None:
    assert cdp_rho(eps, delta) == pytest.approx(PGM_RHO[(eps, delta)], rel=1e-9)


def test_simple_bound_is_its_formula() -> None:
    rho = cdp_rho_simple(2.0, 1e-6)
    assert rho + 2 * math.sqrt(rho * math.log(1e6)) == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("rho", [1e-6, 1e-3, 0.01497, 0.5, 5.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-9, 1e-5])
def test_epsilon_and_delta_are_inverse(rho: float, delta: float) -> None:
    eps = cdp_epsilon(rho, delta)
    assert eps > 0
    assert cdp_delta(rho, eps) == pytest.approx(delta, rel=1e-6)
    # tight is never worse than the simple bound
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-12


def test_rho_round_trip_stays_under_the_target() -> None:
    for eps in (0.05, 0.3, 1.0, 4.0, 20.0):
        rho = cdp_rho(eps, 1e-9)
        assert cdp_epsilon(rho, 1e-9) <= eps
        assert cdp_epsilon(rho, 1e-9) == pytest.approx(eps, rel=1e-9)


def test_epsilon_is_monotone_in_rho() -> None:
    rhos = [10 ** k for k in range(-8, 2)]
    epss = [cdp_epsilon(r, 1e-9) for r in rhos]
    assert epss == sorted(epss)
    assert cdp_epsilon(0.0, 1e-9) == 0.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_epsilon_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="epsilon"):
        cdp_rho(bad, 1e-9)


@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-9, 2.0, math.nan])
def test_bad_delta_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="delta"):
        cdp_rho(1.0, bad)
    with pytest.raises(ValueError, match="delta"):
        ZCdpAccountant(rho_budget=1.0, delta=bad)


# ---------------------------------------------------------------------------- gaussian
def test_gaussian_sigma_and_rho_are_inverse() -> None:
    assert gaussian_sigma(0.5) == pytest.approx(1.0)
    assert gaussian_sigma(0.02, sensitivity=2.0) == pytest.approx(2.0 / math.sqrt(0.04))
    for rho in (1e-4, 0.01497, 3.0):
        assert gaussian_rho(gaussian_sigma(rho)) == pytest.approx(rho, rel=1e-12)
    assert gaussian_rho(10.0, sensitivity=3.0) == pytest.approx(9.0 / 200.0)


@pytest.mark.parametrize("bad", [0.0, -0.1, math.nan, math.inf])
def test_gaussian_refuses_bad_input(bad: float) -> None:
    with pytest.raises(ValueError, match="rho"):
        gaussian_sigma(bad)
    with pytest.raises(ValueError, match="sigma"):
        gaussian_rho(bad)


# ---------------------------------------------------------------------------- allocate
def test_allocate_is_proportional_and_sums_to_the_total() -> None:
    shares = allocate(0.01497, [1, 2, 1])
    assert shares[1] == pytest.approx(2 * shares[0], rel=1e-12)
    assert math.fsum(shares) == pytest.approx(0.01497, rel=1e-15)
    assert allocate(1.0, [0, 3]) == [0.0, 1.0]


@pytest.mark.parametrize("weights", [[], [0, 0], [1, -1], [1, math.nan], [math.inf]])
def test_allocate_refuses_bad_weights(weights: list[float]) -> None:
    with pytest.raises(ValueError, match="weights"):
        allocate(1.0, weights)


# ---------------------------------------------------------------------------- accountant
def test_accountant_spends_and_refuses_past_the_budget() -> None:
    acct = ZCdpAccountant(rho_budget=1.0)
    acct.spend(0.4, what="one-way")
    acct.spend(0.6, what="two-way")
    assert acct.spent == pytest.approx(1.0)
    assert acct.remaining == 0.0
    assert acct.ledger == (("one-way", 0.4), ("two-way", 0.6))
    with pytest.raises(BudgetExceeded) as info:
        acct.spend(1e-6, what="extra")
    err = info.value
    assert (err.requested, err.budget, err.what) == (1e-6, 1.0, "extra")
    assert err.spent == pytest.approx(1.0)
    assert "extra" in str(err)
    assert len(acct.ledger) == 2  # the refused spend is not recorded


def test_accountant_allows_float_slack_only() -> None:
    acct = ZCdpAccountant(rho_budget=0.3)
    for _ in range(3):
        acct.spend(0.1, what="m")  # 0.1 * 3 != 0.3 exactly in floats
    with pytest.raises(BudgetExceeded):
        acct.spend(0.3 * 1e-9, what="m")


def test_accountant_epsilon_and_from_epsilon() -> None:
    acct = ZCdpAccountant.from_epsilon(1.0, 1e-9)
    assert acct.rho_budget == pytest.approx(0.01497, abs=1e-4)
    assert acct.epsilon() == 0.0
    acct.spend(acct.rho_budget / 2, what="half")
    assert 0 < acct.epsilon() < 1.0
    acct.spend(acct.remaining, what="rest")
    assert acct.epsilon() <= 1.0 + 1e-9


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_accountant_refuses_bad_rho(bad: float) -> None:
    acct = ZCdpAccountant(rho_budget=1.0)
    with pytest.raises(ValueError, match="rho"):
        acct.spend(bad, what="x")
    with pytest.raises(ValueError, match="rho_budget"):
        ZCdpAccountant(rho_budget=bad)


def test_accountant_state_round_trips_through_json() -> None:
    acct = ZCdpAccountant(rho_budget=0.05, delta=1e-9)
    acct.spend(0.01, what="a")
    acct.spend(0.015, what="b")
    state = json.loads(json.dumps(acct.state_dict()))
    fresh = ZCdpAccountant(rho_budget=0.05, delta=1e-9)
    fresh.load_state_dict(state)
    assert fresh.ledger == acct.ledger
    assert fresh.spent == acct.spent
    assert fresh.remaining == pytest.approx(0.025)
    with pytest.raises(BudgetExceeded):  # the restored spend counts
        fresh.spend(0.03, what="c")


def test_load_state_rejects_another_budget_or_delta() -> None:
    state = ZCdpAccountant(rho_budget=0.05, delta=1e-9).state_dict()
    with pytest.raises(ValueError, match="rho_budget"):
        ZCdpAccountant(rho_budget=0.06, delta=1e-9).load_state_dict(state)
    with pytest.raises(ValueError, match="delta"):
        ZCdpAccountant(rho_budget=0.05, delta=1e-6).load_state_dict(state)
    with pytest.raises(ValueError, match="malformed"):
        ZCdpAccountant(rho_budget=0.05).load_state_dict({"rho_budget": 0.05})
