"""The FedForge cases of bench/dp_audit.py on the Skellam fix: a fast subset is sound, its
positive controls (pre-fix pipeline, fewer survivors than S_min, quartered noise) are
caught, and the product's refusals are recorded as their own outcome."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

#: released by the product (sound), and refused by it (nothing released)
RELEASED = ("ff_central_s1", "ff_k10_s1", "ff_dropout_7of10", "ff_dropout_2of2")
REFUSED = {"ff_k10_s05_refused": "SkellamAccountingError",
           "ff_bits6_s100": "ValueError",
           "ff_dropout_4of10": "SurvivorRefusal",
           "ff_dropout_1of2": "SurvivorRefusal"}


@pytest.fixture(scope="module")
def audit(dp_audit: Any) -> Any:
    return dp_audit


@pytest.fixture(scope="module")
def doc(audit: Any) -> dict[str, Any]:
    names = [*RELEASED, *REFUSED]
    return audit.run(names, quick=True, seed=0, draws=50_000, log=lambda s: None)


def test_fedforge_relation_is_the_products(audit: Any) -> None:
    assert audit.FEDFORGE_RELATION == "replace_one"
    ff = [c for c in audit.REGISTRY.values() if c.group == "fedforge"]
    assert len(ff) >= 12


def test_fast_fedforge_subset_is_sound_and_controls_are_caught(doc: dict[str, Any]) -> None:
    rows = {r["name"]: r for r in doc["cases"]}
    for name, r in rows.items():
        assert r["lb"] <= r["claim"], name
        assert r["exact"] is not None and r["exact"] <= r["claim"] * (1 + 1e-9), name
        assert not r["exact_violation"], name
        assert r["control"]["detected"], name
    s = doc["summary"]
    assert s["exact_violations"] == 0 and s["max_lb_over_claim"] <= 1.0
    assert s["controls_detected"] == s["controls"]


def test_released_cases_record_their_outcome(doc: dict[str, Any]) -> None:
    rows = {r["name"]: r for r in doc["cases"]}
    for name in RELEASED:
        out = rows[name]["outcome"]
        assert out["outcome"] == "released", name
        assert out["survivors"] >= out["min_survivors"], name
        assert out["relation"] == "replace_one"
        assert rows[name]["exact"] > 0.0  # something is released and measured


@pytest.mark.parametrize(("name", "error"), sorted(REFUSED.items()))
def test_refusals_are_an_outcome_with_the_typed_error(doc: dict[str, Any], name: str,
                                                      error: str) -> None:
    r = {r["name"]: r for r in doc["cases"]}[name]
    assert r["outcome"]["outcome"] == "refused"
    assert r["outcome"]["error"] == error
    assert r["exact"] == 0.0 and r["lb"] <= r["claim"]
    # the pre-fix behaviour at the same point is still caught
    assert r["control"]["detected"]
    assert r["control"]["exact"] > r["control"]["claim"]


def test_survivor_threshold_is_where_the_product_refuses(audit: Any) -> None:
    cfg = audit.FfConfig(n_parties=10, sigma2_central=16.0)
    assert cfg.s_min == 7
    assert audit.fedforge_refusal(cfg, 7) is None
    r = audit.fedforge_refusal(cfg, 6)
    assert r is not None and r["error"] == "SurvivorRefusal"


def test_cell_table_is_the_products_released_skellam(audit: Any) -> None:
    """The audit's table of a released cell (survivors' messages convolved, ring, decoded)
    equals the product's released_noise_pmf(mu, S) shifted by the count."""
    from synth.skellam import released_noise_pmf

    cfg = audit.FfConfig(n_parties=10, sigma2_central=10.0)
    plan, _ = audit.fedforge_plan(cfg, 1)
    mu = audit.fedforge_party_mu(plan)
    counts = np.array([[3]] + [[0]] * 9)
    for s in (7, 10):
        t = audit.cell_tables(audit.FF_PRODUCT, cfg, counts, s)[0]
        ref = released_noise_pmf(mu, s, t.support - 3)
        assert np.allclose(t.probs, ref, atol=1e-12)


def test_claim_is_the_plans_epsilon(audit: Any) -> None:
    from synth.protocol import plans_epsilon

    cfg = audit.FfConfig(n_parties=10, sigma2_central=4.0)
    plan, _ = audit.fedforge_plan(cfg, 3)
    assert plan.step == 1.0 and plan.min_survivors == 7
    assert math.isclose(audit.claim_fedforge_cell(cfg.rho), plans_epsilon([plan], 1e-5))


# ---------------------------------------------------------------------------- trust model
def test_collusion_cases_hold_from_min_honest_up_and_are_caught_below(audit: Any) -> None:
    """Exact ε from the tables of every ``fedforge_collusion_h{h}``: at h >= min_honest
    (7 of 10) the released sum keeps the claim; below, the case (a positive control) is
    over it, h = 6 included (3 honest shares: 3/4 of the charged noise)."""
    cfg = audit.FF_TRUST_CFG
    assert cfg.trust.min_honest == 7 and cfg.trust.honest_in_release == 4
    for h in range(1, 11):
        case = audit.REGISTRY[f"fedforge_collusion_h{h}"]
        claim, exact = case.main.claim(), case.main.exact()
        assert case.must_hold == (h >= 7), h
        if h >= 7:
            assert exact <= claim and case.control is not None, h
            assert case.control.exact() > claim, h
        else:
            assert exact > claim * (1 + 1e-9), h
    assert [audit.worst_honest_in_release(10, 7, h) for h in range(1, 11)] == [
        1, 1, 1, 1, 2, 3, 4, 5, 6, 7]


def test_trust_sessions_are_refused_and_the_summary_counts_control_cases(audit: Any) -> None:
    names = ["fedforge_sybil_session", "fedforge_threshold_floor", "fedforge_collusion_h6",
             "fedforge_collusion_h7"]
    doc = audit.run(names, quick=True, seed=0, draws=20_000, log=lambda s: None)
    rows = {r["name"]: r for r in doc["cases"]}
    for name, field in (("fedforge_sybil_session", "parties"),
                        ("fedforge_threshold_floor", "threshold")):
        out = rows[name]["outcome"]
        assert out["outcome"] == "refused" and out["error"] == "SessionRefused"
        assert out["field"] == field and rows[name]["exact"] == 0.0
    assert rows["fedforge_sybil_session"]["control"]["exact"] == pytest.approx(3.66, abs=0.01)
    assert rows["fedforge_sybil_session"]["extra_controls"][0]["exact"] == pytest.approx(
        7.03, abs=0.01)
    assert not rows["fedforge_collusion_h6"]["must_hold"]
    assert rows["fedforge_collusion_h6"]["exact_violation"] is False
    s = doc["summary"]
    assert s["cases_must_hold"] == 3 and s["control_cases"] == 1
    assert s["exact_violations"] == 0 and s["max_lb_over_claim"] <= 1.0
    assert s["controls"] == 1 + 3 + 1 + 1 and s["controls_detected"] == s["controls"]
