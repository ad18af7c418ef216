"""Gaussian DP on embeddings: clipping, noise, GDP analysis, the per-record ledger, the plan."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from parties.config import DpSection, TimeoutsSection, VflConfig, vfl_config
from parties.privacy.dp import (
    EmbeddingPrivatizer,
    GdpAccountant,
    PrivacyBudgetExceeded,
    UnmeetableTarget,
    account,
    accountant_for,
    calibrate,
    clip_rows,
    compose_mu,
    delta_for_epsilon,
    epsilon_for_delta,
    gaussian_mu,
    mu_for_epsilon,
    plan_from_config,
    release_mu,
    report,
    worker_seeds,
)
from tests.bounds import above, below


def composed(k: int, sigma: float) -> float:
    """µ of k Gaussian releases of sensitivity 1 and noise σ."""
    return math.sqrt(k) / sigma

# ε at δ = 1e-5 of µ-GDP by DRS Cor. 2.13, solved by bisection in mpmath at 60 digits.
EPS_AT_1E5 = {0.1: 0.340669364684326, 0.5: 1.99309140441512, 1.0: 4.37717809568122,
              2.0: 9.9972561464343, 4.0: 24.3816108831137, 8.0: 65.3192198884867,
              10.0: 91.8172896246637}
# δ(ε) of µ-GDP, the same formula in mpmath at 60 digits: (µ, ε) -> δ
DELTA = {(1.0, 1.0): 0.126936737506644, (0.5, 0.25): 0.110298393748528,
         (2.0, 3.0): 0.183813076544472, (8.0, 40.0): 0.132089945622996}


# ---------------------------------------------------------------------------- clipping, noise
def test_clipping_bounds_every_row_and_keeps_small_rows() -> None:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 16, generator=g) * torch.logspace(-3, 2, 64).unsqueeze(1)
    h[5] = 0.0
    out = clip_rows(h, 1.5)
    norms = torch.linalg.vector_norm(out, dim=1)
    assert torch.all(norms <= 1.5 * (1 + 1e-6))
    small = torch.linalg.vector_norm(h, dim=1) <= 1.5
    assert small.any() and (~small).any()
    torch.testing.assert_close(out[small], h[small])
    # big rows keep their direction and land on the sphere
    torch.testing.assert_close(norms[~small], torch.full_like(norms[~small], 1.5))
    cos = torch.nn.functional.cosine_similarity(out[~small], h[~small], dim=1)
    torch.testing.assert_close(cos, torch.ones_like(cos))
    assert torch.all(out[5] == 0)


def test_gradient_flows_through_the_clipping() -> None:
    h = torch.tensor([[0.3, 0.4], [3.0, 4.0]], requires_grad=True)  # norms 0.5 and 5
    clip_rows(h, 1.0).sum().backward()
    assert h.grad is not None
    torch.testing.assert_close(h.grad[0], torch.ones(2))  # inside the ball: identity
    # clipped (C = 1): d/dh Σ(h/‖h‖) = (I − ĥĥᵀ)·1 / ‖h‖
    u = torch.tensor([0.6, 0.8])
    want = (torch.ones(2) - u * u.sum()) / 5.0
    torch.testing.assert_close(h.grad[1], want)


@pytest.mark.stochastic
def test_privatizer_noise_has_the_calibrated_std_and_is_seeded() -> None:
    h = torch.ones(2000, 32, requires_grad=True)
    priv = EmbeddingPrivatizer(clip_norm=0.5, noise_multiplier=2.0, seed=7)
    clipped, published = priv(h)
    assert clipped.grad_fn is not None and published.grad_fn is None
    assert published.dtype == torch.float32 and published.shape == (2000, 32)
    noise = (published - clipped.detach()).flatten()
    below(abs(float(noise.mean())), 0.01, "noise mean")  # 64,000 draws: sd 0.004
    below(abs(float(noise.std()) - 1.0), 0.01, "noise sd - 1")  # σ·C = 2 · 0.5; sd 0.003
    again = EmbeddingPrivatizer(clip_norm=0.5, noise_multiplier=2.0, seed=7)(h)[1]
    other = EmbeddingPrivatizer(clip_norm=0.5, noise_multiplier=2.0, seed=8)(h)[1]
    torch.testing.assert_close(again, published)
    assert not torch.allclose(other, published)


def test_worker_seeds_are_distinct_and_reproducible_only_when_seeded() -> None:
    a = worker_seeds(3, 4)
    assert a == worker_seeds(3, 4) and len(set(a)) == 4
    assert worker_seeds(None, 4) != worker_seeds(None, 4)
    assert all(0 <= s < 2**64 for s in a)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_privatizer_rejects_bad_parameters(bad: float) -> None:
    with pytest.raises(ValueError):
        EmbeddingPrivatizer(clip_norm=bad, noise_multiplier=1.0, seed=0)
    with pytest.raises(ValueError):
        EmbeddingPrivatizer(clip_norm=1.0, noise_multiplier=bad, seed=0)


# ---------------------------------------------------------------------------- GDP analysis
@pytest.mark.parametrize(("mu", "eps"), sorted(EPS_AT_1E5.items()))
def test_epsilon_matches_high_precision_values(mu: float, eps: float) -> None:
    got = epsilon_for_delta(mu, 1e-5)
    assert got == pytest.approx(eps, rel=1e-9)
    assert delta_for_epsilon(got, mu) <= 1e-5  # rounded up, never below the true ε


@pytest.mark.parametrize(("key", "delta"), sorted(DELTA.items()))
def test_delta_matches_high_precision_values(key: tuple[float, float], delta: float) -> None:
    mu, eps = key
    assert delta_for_epsilon(eps, mu) == pytest.approx(delta, rel=1e-10)


def test_conversion_edges() -> None:
    for mu in (0.05, 1.0, 3.0):
        # δ(0) = Φ(µ/2) − Φ(−µ/2): the total-variation distance of N(0,1) and N(µ,1)
        assert delta_for_epsilon(0.0, mu) == pytest.approx(2 * norm.cdf(mu / 2) - 1, rel=1e-12)
    assert epsilon_for_delta(0.01, 0.5) == 0.0  # δ(0) < 0.5: (0, 0.5)-DP already
    assert epsilon_for_delta(math.inf, 1e-5) == math.inf
    assert epsilon_for_delta(0.0, 1e-5) == 0.0
    # large µ: no overflow, ε grows like µ²/2
    big = epsilon_for_delta(1000.0, 1e-5)
    assert 5e5 < big < 5.1e5 and delta_for_epsilon(big, 1000.0) <= 1e-5
    # ε decreases in δ and increases in µ
    assert epsilon_for_delta(1.0, 1e-3) < epsilon_for_delta(1.0, 1e-5)
    assert epsilon_for_delta(0.9, 1e-5) < epsilon_for_delta(1.0, 1e-5)
    for bad in ((-1.0, 1e-5), (1.0, 0.0), (1.0, 1.0), (math.nan, 1e-5)):
        with pytest.raises(ValueError):
            epsilon_for_delta(*bad)


def test_gdp_matches_an_independent_pld_accountant() -> None:
    """Google's privacy-loss-distribution accountant composing the same Gaussian
    mechanisms (sensitivity 1, noise σ, k times) agrees with sqrt(k)/σ-GDP's exact ε
    (it is pessimistic by its discretisation only)."""
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    for sigma, k in ((10.0, 4), (2.0, 10), (30.0, 40)):
        acct = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        acct.compose(dp_accounting.GaussianDpEvent(sigma), k)
        pld = acct.get_epsilon(1e-5)
        ours = epsilon_for_delta(composed(k, sigma), 1e-5)
        assert ours <= pld * (1 + 1e-6)
        assert pld == pytest.approx(ours, rel=1e-5)


def test_composition() -> None:
    assert gaussian_mu(4.0) == 0.25
    assert compose_mu([0.3, 0.4]) == pytest.approx(0.5)
    assert compose_mu([]) == 0.0
    assert compose_mu([compose_mu([0.1, 0.2]), 0.3]) == pytest.approx(compose_mu([0.1, 0.2, 0.3]))
    assert release_mu(4.0) == 0.5  # replace-one: sensitivity 2C
    for k, se, sg in ((1, 1.0, 2.0), (7, 3.0, 1.5), (40, 0.5, 8.0)):
        assert account(k, se, sg, train=True) == pytest.approx(
            compose_mu([release_mu(se), release_mu(sg)] * k), rel=1e-12)
        assert account(k, se, sg, train=False) == pytest.approx(
            compose_mu([release_mu(se)] * k), rel=1e-12)
    with pytest.raises(ValueError):
        compose_mu([0.1, -0.1])
    with pytest.raises(ValueError):
        gaussian_mu(0.0)


def test_calibration_is_tight() -> None:
    cal = calibrate(1.0, train_publications=10, eval_publications=2, embedding_share=0.5)
    # half of µ²/10 each: µ_e = µ_g = sqrt(0.05), σ = 2/µ
    assert cal.embed_noise_multiplier == pytest.approx(2 / math.sqrt(0.05), rel=1e-12)
    assert cal.sgd_noise_multiplier == pytest.approx(2 / math.sqrt(0.05), rel=1e-12)
    assert account(10, cal.embed_noise_multiplier, cal.sgd_noise_multiplier, train=True) <= 1.0
    # evaluation records are never trained on: their own releases take the whole target
    cal = calibrate(1.0, train_publications=2, eval_publications=40, embedding_share=0.5)
    assert cal.eval_noise_multiplier == pytest.approx(2 * math.sqrt(40), rel=1e-12)
    assert account(40, cal.eval_noise_multiplier, 1.0, train=False) <= 1.0
    assert account(2, cal.embed_noise_multiplier, cal.sgd_noise_multiplier,
                   train=True) == pytest.approx(1.0, rel=1e-9)
    for bad in ((0.0, 1, 1, 0.5), (math.inf, 1, 1, 0.5), (1.0, 0, 1, 0.5), (1.0, 1, 1, 1.0)):
        with pytest.raises(ValueError):
            calibrate(bad[0], train_publications=bad[1], eval_publications=bad[2],
                      embedding_share=bad[3])


def test_mu_for_epsilon_inverts_the_conversion() -> None:
    for mu in (0.1, 0.5, 1.0, 2.0, 8.0):
        eps = EPS_AT_1E5[mu]
        got = mu_for_epsilon(eps, 1e-5)
        assert got <= mu * (1 + 1e-9) and got == pytest.approx(mu, rel=1e-6)
        assert delta_for_epsilon(eps, got) <= 1e-5


# ---------------------------------------------------------------------------- ledger
def test_accountant_counts_each_record_and_takes_the_max() -> None:
    acct = GdpAccountant({"train": 10, "test": 3}, release_mu={"train": 0.5, "test": 0.25})
    assert acct.mu == 0.0 and acct.publications_max == 0
    acct.record("train", np.array([0, 1, 2]))
    acct.record("train", np.array([2, 3]))
    acct.record("test")
    np.testing.assert_array_equal(acct.publications("train"), [1, 1, 2, 1, 0, 0, 0, 0, 0, 0])
    assert acct.publications_max == 2 and acct.group_max("test") == 1
    assert acct.mu == pytest.approx(math.sqrt(2) / 2.0)
    assert acct.group_mu("test") == 0.25
    assert acct.epsilon(1e-5) == epsilon_for_delta(acct.mu, 1e-5)
    assert acct.batches == {"train": 2, "test": 1}


def test_accountant_refuses_past_the_cap_without_counting() -> None:
    acct = GdpAccountant({"train": 4, "test": 2}, release_mu={"train": 1.0, "test": 1.0},
                         max_publications={"train": 2})
    acct.record("train", np.array([0, 1]))
    acct.record("train", np.array([1, 2]))
    before = acct.publications("train")
    with pytest.raises(PrivacyBudgetExceeded) as ei:
        acct.record("train", np.array([3, 1]))
    assert (ei.value.group, ei.value.publications, ei.value.planned) == ("train", 3, 2)
    np.testing.assert_array_equal(acct.publications("train"), before)
    acct.record("train", np.array([3, 0]))  # others still have budget
    assert acct.mu <= math.sqrt(2)


def test_accountant_without_noise_reports_infinite_mu() -> None:
    acct = GdpAccountant({"train": 2, "test": 0}, release_mu=None)
    acct.record("train", np.array([0]))
    assert acct.mu == math.inf and acct.epsilon(1e-5) == math.inf


def test_accountant_state_round_trip_and_mismatch() -> None:
    mus = {"train": 1.5, "test": 0.5}
    acct = GdpAccountant({"train": 5, "test": 2}, release_mu=mus, max_publications={"train": 3})
    acct.record("train", np.array([4, 1]))
    acct.record("test")
    state = acct.state_dict()
    fresh = GdpAccountant({"train": 5, "test": 2}, release_mu=mus, max_publications={"train": 3})
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.publications("train"), acct.publications("train"))
    assert fresh.mu == acct.mu and fresh.batches == acct.batches
    state["counts"]["train"][0] = 99  # the loaded ledger is a copy
    assert fresh.publications("train")[0] == 0
    for other in (GdpAccountant({"train": 5, "test": 2}, release_mu={"train": 2.0, "test": 0.5},
                                max_publications={"train": 3}),
                  GdpAccountant({"train": 6, "test": 2}, release_mu=mus,
                                max_publications={"train": 3}),
                  GdpAccountant({"train": 5, "test": 2}, release_mu=mus)):
        with pytest.raises(ValueError):
            other.load_state_dict(acct.state_dict())
    with pytest.raises(ValueError, match="rdp"):
        fresh.load_state_dict({**acct.state_dict(), "mechanism": "rdp"})


# ---------------------------------------------------------------------------- plan, report
def test_plan_calibrates_for_the_schedules_worst_case() -> None:
    assert plan_from_config(VflConfig()) is None
    assert plan_from_config(VflConfig(dp=DpSection(mu=math.inf))) is None
    # epochs + dp_reassign_reserve (default 1) training publications, whatever
    # max_reassign (a scheduling knob: reassignments are charged when they happen)
    plan = plan_from_config(VflConfig(epochs=5, dp=DpSection(mu=2.0, clip_norm=0.5),
                                      timeouts=TimeoutsSection(max_reassign=3)))
    assert plan is not None and plan.planned == {"train": 6, "val": 5, "test": 1}
    assert plan.reassign_reserve == 1
    assert plan.noise_multiplier == pytest.approx(2 / math.sqrt(0.5 * 4 / 6))
    assert plan.sgd_noise_multiplier == pytest.approx(2 / math.sqrt(0.5 * 4 / 6))
    assert (plan.clip_norm, plan.delta, plan.target_mu) == (0.5, 1e-5, 2.0)
    tight = plan_from_config(VflConfig(epochs=5, dp=DpSection(mu=2.0, reassign_reserve=0)))
    assert tight is not None and tight.planned["train"] == 5 and tight.reassign_reserve == 0
    # the plan reserves no more than the schedule can use
    for unused in ({"timeouts.max_reassign": 0}, {"timeouts.t_ddl_s": 0.0}, {"algo": "vfl"},
                   {"algo": "avfl"}):
        p = plan_from_config(vfl_config({"epochs": 5, **unused, "dp.mu": 2.0}))
        assert p is not None and p.planned["train"] == 5 and p.reassign_reserve == 0
    wide = plan_from_config(VflConfig(epochs=5, dp=DpSection(mu=2.0, reassign_reserve=15)))
    assert wide is not None and wide.planned["train"] == 20
    capped = plan_from_config(VflConfig(epochs=2, dp=DpSection(mu=2.0, reassign_reserve=15),
                                        timeouts=TimeoutsSection(max_reassign=1)))
    assert capped is not None and capped.planned["train"] == 4
    direct = plan_from_config(VflConfig(dp=DpSection(noise_multiplier=3.0, sgd_noise_multiplier=4.0, delta=1e-6)))
    assert direct is not None and direct.noise_multiplier == 3.0
    assert direct.sgd_noise_multiplier == 4.0
    assert direct.target_mu is None and direct.planned_publications is None
    by_eps = plan_from_config(VflConfig(epochs=5,
                                        dp=DpSection(epsilon=4.37717809568122, reassign_reserve=0)))
    assert by_eps is not None and by_eps.target_mu == pytest.approx(1.0, rel=1e-6)


def test_plan_refuses_an_unmeetable_target() -> None:
    with pytest.raises(UnmeetableTarget) as ei:
        plan_from_config(VflConfig(epochs=30, dp=DpSection(mu=0.01)))
    assert ei.value.key == "vfl.dp.mu" and "dp.max_noise_multiplier" in str(ei.value)
    assert "dp.reassign_reserve" in str(ei.value)
    with pytest.raises(UnmeetableTarget) as ei:
        plan_from_config(VflConfig(epochs=10,
                                   dp=DpSection(epsilon=0.05, max_noise_multiplier=50)))
    assert ei.value.key == "vfl.dp.epsilon"


def test_report_with_dp_off_is_explicit() -> None:
    r = report(None, GdpAccountant({"train": 3, "test": 1}, release_mu=None))
    assert r["enabled"] is False and r["mu"] is None and r["epsilon"] is None
    plan = plan_from_config(VflConfig(epochs=2, dp=DpSection(mu=1.0, reassign_reserve=0)))
    acct = accountant_for(plan, {"train": 3, "val": 2, "test": 1})
    acct.record("train", np.arange(3))
    r = report(plan, acct)
    assert r["enabled"] is True and r["mu"] == pytest.approx(1 / math.sqrt(2))
    assert r["epsilon"] == epsilon_for_delta(r["mu"], 1e-5) and r["publications_max"] == 1
    assert r["guarantee"]["neighbouring"].startswith("replace-one")
    assert report(plan, None)["mu"] is None  # ledger missing: spent unknown
    acct.record("train", np.arange(3))
    assert acct.mu == pytest.approx(1.0) and acct.mu <= 1.0
    with pytest.raises(PrivacyBudgetExceeded):
        acct.record("train", np.arange(1))


def test_each_passive_party_gets_its_own_noise_secret_from_one_seed() -> None:
    from parties.privacy.dp import party_noise_secret

    assert party_noise_secret(None, "passive3") is None
    assert party_noise_secret(7, "passive") == 7  # the first party: as in two-party runs
    secrets = {party_noise_secret(7, p) for p in ("passive", "passive2", "passive3")}
    assert len(secrets) == 3 and all(0 <= s < 2**63 for s in secrets)
    assert party_noise_secret(7, "passive2") == party_noise_secret(7, "passive2")


# ---------------------------------------------------------------------------- reassignment reserve
def test_reserve_blocks_a_reassigned_batch_once_a_record_spent_it() -> None:
    # epochs 3, reserve 1: the plan charges 3 + 1 training publications per record
    plan = plan_from_config(VflConfig(epochs=3, dp=DpSection(mu=2.0, reassign_reserve=1)))
    assert plan is not None and plan.planned["train"] == 4 and plan.reassign_reserve == 1
    acct = accountant_for(plan, {"train": 6, "val": 2, "test": 2})
    first, other = np.array([0, 1, 2]), np.array([3, 4, 5])
    acct.record("train", first)
    acct.record("train", other)
    assert acct.admits_extra("train", first)  # a record with its reserve left
    acct.record("train", first, extra=True)  # the reassigned attempt, published
    # record 2 has spent its reserve: a reassigned batch holding it is refused, even
    # next to records that have theirs (and the refusal is counted, nothing recorded)
    before = acct.publications("train").copy()
    assert not acct.admits_extra("train", np.array([2, 3]))
    assert acct.reserve_refusals["train"] == 1
    np.testing.assert_array_equal(acct.publications("train"), before)
    with pytest.raises(PrivacyBudgetExceeded, match="reserve"):
        acct.record("train", np.array([2, 3]), extra=True)
    assert acct.admits_extra("train", np.array([3, 4]))
    # the extras never eat a later epoch's first attempt: epochs 2 and 3 still fit
    for _ in range(2):
        acct.record("train", first)
        acct.record("train", other)
    assert acct.group_max("train") == 4 == plan.planned["train"]
    # calibrate then re-account: the most published record is within the target
    assert acct.group_mu("train") <= 2.0
    assert acct.group_mu("train") == pytest.approx(
        account(4, plan.noise_multiplier, plan.sgd_noise_multiplier, train=True))
    r = report(plan, acct)
    assert (r["reassign_reserve"], r["reassign_reserve_spent_max"],
            r["reserve_exhausted_batches"], r["publications_max_train"]) == (1, 1, 1, 4)
    assert r["publications_planned"]["train"] == 4
    # the ledger (with its extras) round-trips
    fresh = accountant_for(plan, {"train": 6, "val": 2, "test": 2})
    fresh.load_state_dict(acct.state_dict())
    assert not fresh.admits_extra("train", first) and fresh.extra_max("train") == 1
    with pytest.raises(ValueError, match="reserve"):
        GdpAccountant({"train": 6, "val": 2, "test": 2}, release_mu=acct.release_mu,
                      max_publications=acct.max_publications,
                      reserve={"train": 2}).load_state_dict(acct.state_dict())


def test_no_reserve_without_a_target_or_with_dp_off() -> None:
    off = accountant_for(None, {"train": 3, "test": 1})
    assert off.admits_extra("train", np.arange(3)) and off.reserve == {}
    off.record("train", np.arange(3), extra=True)  # counted, never refused
    assert report(None, off)["reassign_reserve"] is None
    direct = plan_from_config(VflConfig(dp=DpSection(noise_multiplier=3.0, sgd_noise_multiplier=3.0)))
    assert direct is not None and direct.reassign_reserve is None
    acct = accountant_for(direct, {"train": 3, "val": 1, "test": 1})
    for _ in range(5):
        assert acct.admits_extra("train", np.arange(3))
        acct.record("train", np.arange(3), extra=True)
