"""FedForge's trust model (pure): d = S_min + min_honest − K honest parties in any
released sum, the noise calibrated for it ("calibrate, then re-account"), the config's
checks, and a party's refusal of a session or plan that disagrees with its own
configuration (typed, logged, nothing sent)."""

from __future__ import annotations

import pandas as pd
import pytest
from structlog.testing import capture_logs

from pubsub.config import ConfigError
from synth.config import SecAggSection, SynthConfig
from synth.mechanism import TrustModelError, dp_statement, released_rho, resolve_trust
from synth.plancheck import PlanRefused, SessionRefused, verify_plan, verify_session
from synth.protocol import SessionPlan, secagg_degree, secagg_threshold_floor
from synth.skellam import party_mu


@pytest.mark.parametrize(("k", "s_min", "honest", "d"), [
    (10, 7, 7, 4), (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3), (100, 70, 70, 40)])
def test_defaults_give_d_honest_parties_in_any_release(k: int, s_min: int, honest: int,
                                                      d: int) -> None:
    t = resolve_trust(k)
    assert (t.min_survivors, t.min_honest, t.honest_in_release) == (s_min, honest, d)
    assert t.colluders_tolerated == k - honest
    assert resolve_trust(10, 7, 10).honest_in_release == 7  # no colluder: today's S_min
    assert resolve_trust(10, 8, 9).honest_in_release == 7
    assert resolve_trust(10, 10, 7).honest_in_release == 7


def test_no_honest_party_guaranteed_is_refused_naming_the_keys() -> None:
    with pytest.raises(TrustModelError) as e:
        resolve_trust(10, 7, 3)  # 7 colluders reach S_min on their own
    assert e.value.keys == ("min_survivors", "min_honest", "parties")
    assert e.value.values == (7, 3, 10) and "min_honest" in str(e.value)
    with pytest.raises(TrustModelError, match="min_honest"):
        resolve_trust(10, 7, 11)
    assert resolve_trust(10, 7, 3, noise_model="local").honest_in_release == 0


@pytest.mark.parametrize(("rho", "k", "s_min", "honest"), [
    (4e-3, 10, 7, 7), (0.01, 10, 8, 9), (0.05, 10, 10, 7), (0.2, 5, 4, 4), (0.02, 100, 70, 70)])
def test_calibrate_then_reaccount_over_the_worst_survivor_set(rho: float, k: int, s_min: int,
                                                              honest: int) -> None:
    """The sum over the d honest parties the worst survivor set holds is charged at most
    ρ (the colluders' noise protects nobody); one honest party fewer would exceed it."""
    t = resolve_trust(k, s_min, honest)
    d = t.honest_in_release
    mu = party_mu(rho, d)
    colluders = k - honest
    worst = max(1, s_min - colluders)  # survivors: every colluder + the fewest honest
    assert worst == d
    assert released_rho(mu, d) <= rho
    assert released_rho(mu, k - colluders) <= rho  # no dropouts: more honest, more noise
    if d > 1:
        assert released_rho(mu, d - 1) > rho
    # the party computes the same μ from a plan and its own configuration
    plan_mu = verify_plan(
        n_parties=k, min_survivors=s_min, min_honest=honest, noise_model="distributed",
        step=1.0, rho=rho, sigma2_central=0.0, cliques=(("a",),), sizes=(2,),
        session_parties=[f"p{i}" for i in range(k)], domain_shape={"a": 2},
        own_parties=k, own_min_survivors=s_min, own_min_honest=honest,
        own_noise_model="distributed", private=True, remaining_rho=1.0)
    assert plan_mu == mu


@pytest.mark.parametrize(("kw", "key"), [
    ({"min_honest": 11}, "synth.secagg.min_honest"),
    ({"min_honest": -1}, "synth.secagg.min_honest"),
    ({"min_honest": 3}, "synth.secagg.min_honest"),  # d = 7 + 3 - 10 = 0
    ({"min_honest": 4, "min_survivors": 6}, "synth.secagg.min_honest"),  # d = 0
    ({"threshold": 8}, "synth.secagg.threshold"),  # degree 6: t <= 7
    ({"threshold": -1}, "synth.secagg.threshold"),
])
def test_config_refuses_a_trust_model_outside_its_range(kw: dict[str, int], key: str) -> None:
    with pytest.raises(ConfigError) as e:
        SynthConfig(secagg=SecAggSection(**kw))  # type: ignore[arg-type]
    assert key in str(e.value)


def test_config_accepts_the_measured_trust_models() -> None:
    for h, s in ((7, 7), (10, 7), (9, 8), (7, 10)):
        SynthConfig(secagg=SecAggSection(min_honest=h, min_survivors=s))
    SynthConfig(secagg=SecAggSection(min_honest=1, noise_model="local"))  # local: no d needed
    SynthConfig(secagg=SecAggSection(threshold=7))


def test_dp_block_states_the_trust_model() -> None:
    dp = dp_statement(SynthConfig())
    assert (dp["min_honest"], dp["colluders_tolerated"], dp["honest_in_any_release"],
            dp["secagg_threshold"], dp["min_survivors"]) == (7, 3, 4, 4, 7)
    assert "3 colluding parties" in dp["adversary"] and "fake dropouts" in dp["dropouts"]
    dp = dp_statement(SynthConfig(secagg=SecAggSection(min_honest=10, threshold=6)))
    assert (dp["colluders_tolerated"], dp["honest_in_any_release"],
            dp["secagg_threshold"]) == (0, 7, 6)


def _session(n: int, threshold: int | None = None) -> SessionPlan:
    return SessionPlan(session_id="t/0", party_ids=tuple(f"p{i:03d}" for i in range(n)),
                       threshold=threshold, degree=secagg_degree(n), graph_seed="00" * 16,
                       timeout_s=1.0, tree={})


@pytest.mark.parametrize(("n", "threshold", "field"), [
    (100, None, "parties"), (11, None, "parties"), (9, None, "parties"),
    (10, 1, "threshold"), (10, 3, "threshold")])
def test_a_session_that_disagrees_is_refused_naming_the_field(n: int, threshold: int | None,
                                                             field: str) -> None:
    s = _session(n, threshold)
    with pytest.raises(SessionRefused) as e:
        verify_session(session_parties=s.party_ids, threshold=s.secagg().t, own_parties=10,
                       own_threshold_floor=secagg_threshold_floor(10))
    assert e.value.field == field and isinstance(e.value, PlanRefused)


def test_the_default_session_and_a_higher_threshold_are_accepted() -> None:
    assert secagg_threshold_floor(10) == 4 == _session(10).secagg().t
    for t in (None, 4, 7):
        s = _session(10, t)
        verify_session(session_parties=s.party_ids, threshold=s.secagg().t, own_parties=10,
                       own_threshold_floor=4)
    assert secagg_threshold_floor(10, configured=6) == 6


def test_a_party_refuses_a_sybil_session_before_sending_anything() -> None:
    """The party's own check (SynthParty._check_session): a typed error with exit code 2,
    a ``synth.session_refused`` event naming the field, and no session taken (no keys
    are made or sent after it)."""
    from synth.netutil import ParticipantError
    from synth.party import SynthParty

    party = SynthParty("p000", pd.DataFrame({"a": [1]}), cfg=SynthConfig(parties=10),
                       broker="tcp://127.0.0.1:1", run_id="t")
    for session, field in ((_session(100), "parties"), (_session(10, 1), "threshold")):
        with capture_logs() as logs, pytest.raises(ParticipantError) as e:
            party._check_session(session)
        assert e.value.code == 2 and field in e.value.reason
        ev = [x for x in logs if x["event"] == "synth.session_refused"]
        assert len(ev) == 1 and ev[0]["field"] == field and ev[0]["log_level"] == "error"
        assert party.session is None and party.client is None and not party.sent
    party._check_session(_session(10))  # its own K and the default threshold
