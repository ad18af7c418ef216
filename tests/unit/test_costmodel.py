"""Cost-model fits (PubSub-VFL Sec. 4): power laws, memory, communication, typed errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from parties.planning.costmodel import (
    BadHoldout,
    CommFit,
    CostModel,
    CostModelError,
    MemoryFit,
    MemoryLimitTooSmall,
    NonFiniteValue,
    NonPositiveValue,
    PowerFit,
    ShapeMismatch,
    TooFewPoints,
    fit_comm,
    fit_memory,
    fit_power,
    step_time,
)
from tests.bounds import below

B = np.array([16, 32, 64, 128, 256, 512, 1024], dtype=float)


# ------------------------------------------------------------------------------ power
@pytest.mark.parametrize("lam, gamma", [(2e-5, 0.8), (3e-3, -0.3), (1e-4, 0.0), (5e-7, 1.7)])
def test_power_fit_recovers_noiseless_parameters(lam: float, gamma: float) -> None:
    f = fit_power(B, lam * B ** gamma)
    assert f.lam == pytest.approx(lam, rel=1e-9)
    assert f.gamma == pytest.approx(gamma, abs=1e-9)
    assert f.r2 == pytest.approx(1.0, abs=1e-9)
    assert f.rel_err_holdout < 1e-9
    assert (f.n_points, f.b_lo, f.b_hi) == (7, 16.0, 1024.0)
    assert f.predict(300.0) == pytest.approx(lam * 300.0 ** gamma, rel=1e-9)


def test_power_fit_normalises_lambda_per_core_at_one_worker() -> None:
    """Measured with w workers on C cores: t = λ B^γ w / C, so λ = t C / (w B^γ)."""
    lam, gamma = 4e-5, 0.9
    t = lam * B ** gamma * 3 / 6.0  # w = 3 workers share C = 6 cores
    f = fit_power(B, t, workers=3, cores=6.0)
    assert f.lam == pytest.approx(lam, rel=1e-9)
    assert f.predict(64.0, workers=3, cores=6.0) == pytest.approx(t[2], rel=1e-9)
    # With one intra-op thread, a worker of 3 on 6 cores had 1 core, not 2.
    g = fit_power(B, lam * B ** gamma, workers=3, cores=6.0, threads=1)
    assert g.lam == pytest.approx(lam, rel=1e-9)
    assert g.predict(64.0, workers=3, cores=6.0, threads=1) == pytest.approx(lam * 64 ** gamma)


@pytest.mark.stochastic
def test_power_fit_on_noisy_data_within_tolerance() -> None:
    rng = np.random.default_rng(7)
    b = np.repeat(B, 20)
    lam, gamma = 2e-5, 0.85
    t = lam * b ** gamma * np.exp(rng.normal(0.0, 0.05, b.size))  # 5 % log-normal noise
    f = fit_power(b, t)
    assert f.gamma == pytest.approx(gamma, abs=0.02)
    assert f.lam == pytest.approx(lam, rel=0.10)
    below(1.0 - f.r2, 0.01, "power fit 1 - r2")
    assert f.rel_err_holdout > 0.0
    below(f.rel_err_holdout, 0.08, "power fit holdout error")


def test_default_holdout_is_every_other_b_and_matches_a_manual_refit() -> None:
    rng = np.random.default_rng(1)
    t = 1e-4 * B ** 0.7 * np.exp(rng.normal(0.0, 0.1, B.size))
    f = fit_power(B, t)
    keep = np.isin(B, [16, 64, 256, 1024])
    sub = fit_power(B[keep], t[keep], holdout="none")
    manual = np.mean(np.abs(sub.predict(B[~keep]) - t[~keep]) / t[~keep])
    assert f.rel_err_holdout == pytest.approx(manual, rel=1e-12)
    assert f == fit_power(B, t, holdout=[32, 128, 512])
    assert math.isnan(fit_power(B, t, holdout="none").rel_err_holdout)
    # Parameters are fitted on all points whatever the hold-out.
    assert fit_power(B, t, holdout="none").lam == f.lam


def test_holdout_error_exposes_a_misfit() -> None:
    """A curved log-log relation fits badly off the fitted points."""
    t = 1e-3 + 1e-7 * B ** 2.0
    assert fit_power(B, t).rel_err_holdout > 0.2


def test_holdout_edge_cases() -> None:
    two = fit_power([16, 32], [1.0, 2.0])
    assert math.isnan(two.rel_err_holdout)  # nothing can be held out of 2 distinct B
    three = fit_power([16, 32, 64], [1.0, 2.0, 4.0])
    assert three.rel_err_holdout == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(BadHoldout, match="48"):
        fit_power(B, B, holdout=[48])
    with pytest.raises(BadHoldout):
        fit_power(B, B, holdout="every-third")
    with pytest.raises(TooFewPoints):
        fit_power([16, 32, 64], [1.0, 2.0, 3.0], holdout=[16, 32])


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize("m0, rho, chi", [(5e8, 3e4, 1.1), (0.0, 3e4, 1.1), (2e9, 1e3, 0.9),
                                          (1e8, 5e5, 1.0), (3e8, 2e2, 1.6)])
def test_memory_fit_recovers_noiseless_parameters(m0: float, rho: float, chi: float) -> None:
    f = fit_memory(B, m0 + rho * B ** chi)
    assert f.m0 == pytest.approx(m0, rel=1e-6, abs=1e-3 * rho)
    assert f.rho == pytest.approx(rho, rel=1e-4)
    assert f.chi == pytest.approx(chi, abs=1e-5)
    assert f.r2 == pytest.approx(1.0, abs=1e-9)
    assert f.rel_err_holdout < 1e-6


@pytest.mark.stochastic
def test_memory_fit_on_noisy_data_within_tolerance() -> None:
    rng = np.random.default_rng(3)
    b = np.repeat(B, 5)
    m0, rho, chi = 5e8, 3e6, 1.1
    m = (m0 + rho * b ** chi) * np.exp(rng.normal(0.0, 0.01, b.size))  # 1 % noise
    f = fit_memory(b, m)
    assert f.chi == pytest.approx(chi, abs=0.03)
    assert f.rho == pytest.approx(rho, rel=0.25)
    assert f.m0 == pytest.approx(m0, rel=0.05)
    below(1.0 - f.r2, 0.001, "memory fit 1 - r2")
    assert f.rel_err_holdout > 0.0
    below(f.rel_err_holdout, 0.03, "memory fit holdout error")
    assert f.predict(700.0) == pytest.approx(m0 + rho * 700 ** chi, rel=0.03)


def test_memory_b_max_and_rules() -> None:
    f = MemoryFit(m0=1e8, rho=1e5, chi=1.0)
    assert f.b_max(2e8) == pytest.approx(1000.0)
    assert f.b_max(2e8, 2) == pytest.approx(500.0)  # shared: M0 + 2ρB <= M̄
    assert f.b_max(4e8, 2, "per_worker") == pytest.approx(1000.0)  # 2(M0 + ρB) <= M̄
    assert f.party_bytes(1000, 2) == pytest.approx(3e8)
    assert f.party_bytes(1000, 2, "per_worker") == pytest.approx(4e8)
    assert f.fits(1000, 1, 2e8) and not f.fits(1001, 1, 2e8) and f.fits(10**9, 8, None)
    g = MemoryFit(m0=1e8, rho=4e4, chi=2.0)
    assert g.b_max(1e8 + 4e4 * 50 ** 2) == pytest.approx(50.0)
    with pytest.raises(MemoryLimitTooSmall, match="1e\\+08") as err:
        f.b_max(1e8)
    assert err.value.mem_limit_bytes == 1e8 and isinstance(err.value, ValueError)
    with pytest.raises(MemoryLimitTooSmall):
        f.b_max(3e8, 4, "per_worker")
    assert not f.fits(16, 4, 3e8, "per_worker")
    assert MemoryFit(m0=1e8, rho=1e5, chi=-0.5).b_max(2e8) == math.inf
    with pytest.raises(CostModelError):
        f.b_max(2e8, rule="pooled")


def test_memory_fit_needs_three_distinct_b() -> None:
    with pytest.raises(TooFewPoints) as err:
        fit_memory([16, 16, 32], [1e8, 1e8, 2e8])
    assert (err.value.distinct, err.value.needed) == (2, 3)
    # With 4 distinct B only one can be held out (the fit keeps 3).
    f = fit_memory(B[:4], 1e8 + 1e5 * B[:4])
    assert f.rel_err_holdout < 1e-6


# ------------------------------------------------------------------------------- comm
def test_comm_fit_recovers_latency_and_bandwidth() -> None:
    n = np.array([0, 1e3, 1e4, 1e5, 1e6, 4e6])
    f = fit_comm(n, 1e-4 + n / 1e9)
    assert f.latency_s == pytest.approx(1e-4, rel=1e-9)
    assert f.bandwidth == pytest.approx(1e9, rel=1e-9)
    assert f.time(2e6) == pytest.approx(1e-4 + 2e-3)
    assert f.rel_err_holdout < 1e-9 and f.r2 == pytest.approx(1.0)


@pytest.mark.stochastic
def test_comm_fit_noisy_and_never_negative() -> None:
    rng = np.random.default_rng(5)
    n = np.repeat([1e3, 1e4, 1e5, 1e6], 10)
    f = fit_comm(n, (5e-5 + n / 2e8) * np.exp(rng.normal(0.0, 0.05, n.size)))
    assert f.latency_s == pytest.approx(5e-5, rel=0.2)
    assert f.bandwidth == pytest.approx(2e8, rel=0.05)
    assert f.rel_err_holdout > 0.0
    below(f.rel_err_holdout, 0.1, "comm fit holdout error")
    # Times that fall with size: no negative per-byte cost, bandwidth is infinite.
    g = fit_comm([10, 20, 30], [3e-3, 2e-3, 1e-3])
    assert g.s_per_byte == 0.0 and g.bandwidth == math.inf and g.latency_s > 0


# ----------------------------------------------------------------------------- errors
def test_typed_errors_name_the_offending_value() -> None:
    with pytest.raises(NonFiniteValue) as err:
        fit_power([16, 32, 64], [1.0, math.nan, 3.0])
    assert (err.value.name, err.value.index) == ("t", 1)
    assert "t[1]" in str(err.value)
    with pytest.raises(NonPositiveValue, match=r"b\[0\] = 0.0"):
        fit_power([0, 32], [1.0, 2.0])
    with pytest.raises(NonPositiveValue, match=r"t\[1\] = -2.0"):
        fit_power([16, 32], [1.0, -2.0])
    with pytest.raises(NonPositiveValue, match=r"m_bytes\[2\]"):
        fit_memory([16, 32, 64], [1.0, 2.0, 0.0])
    with pytest.raises(NonFiniteValue, match=r"b\[1\] = inf"):
        fit_memory([16, math.inf, 64], [1.0, 2.0, 3.0])
    with pytest.raises(NonPositiveValue, match="nbytes"):
        fit_comm([-1, 10], [1.0, 2.0])
    with pytest.raises(TooFewPoints) as few:
        fit_power([32, 32, 32], [1.0, 1.1, 0.9])
    assert (few.value.distinct, few.value.needed) == (1, 2)
    with pytest.raises(TooFewPoints):
        fit_comm([100, 100], [1.0, 1.0])
    with pytest.raises(ShapeMismatch):
        fit_power([16, 32], [1.0])
    for cls in (TooFewPoints, NonPositiveValue, NonFiniteValue, ShapeMismatch,
                MemoryLimitTooSmall, BadHoldout):
        assert issubclass(cls, CostModelError) and issubclass(cls, ValueError)


# ------------------------------------------------------------------------------ model
def _model(**kw: object) -> CostModel:
    base: dict[str, object] = {
        "role": "passive", "forward": fit_power(B, 1e-5 * B ** 0.9),
        "backward": PowerFit(lam=2e-5, gamma=0.95), "memory": MemoryFit(m0=1e8, rho=1e5, chi=1.0),
        "comm": CommFit(latency_s=1e-4, s_per_byte=1e-9), "cores": 4.0, "param_bytes": 40_000,
        "sync_overhead_s": 5e-5}
    base.update(kw)
    return CostModel(**base)  # type: ignore[arg-type]


def test_cost_model_round_trips_through_json() -> None:
    for m in (_model(), _model(sync_comm=CommFit(latency_s=1e-6, s_per_byte=1e-10),
                                mem_limit_bytes=2e9)):
        d = json.loads(json.dumps(m.to_dict(), allow_nan=False))  # NaN travels as null
        back = CostModel.from_dict(d)
        assert back.to_dict() == m.to_dict()
        assert back.forward == m.forward and back.comm == m.comm
        assert back.sync_comm == m.sync_comm and back.mem_limit_bytes == m.mem_limit_bytes
        assert math.isnan(back.backward.rel_err_holdout)


def test_step_time_caps_a_worker_at_its_threads() -> None:
    m = _model()
    work = 1e-5 * 64 ** 0.9 + 2e-5 * 64 ** 0.95
    assert m.work(64) == pytest.approx(work)
    assert m.step_time(64, 1, threads=1) == pytest.approx(work)  # 1 thread: 1 of 4 cores
    assert m.step_time(64, 1, threads=8) == pytest.approx(work / 4)  # all 4 cores
    assert m.step_time(64, 2, threads=8) == pytest.approx(work / 2)
    assert m.step_time(64, 8, threads=1) == pytest.approx(work * 2)  # time-sliced
    assert step_time(m, 64, 8, 16.0, 1) == pytest.approx(work)
    assert m.sync_time() == pytest.approx(5e-5 + 2 * (1e-4 + 40_000e-9))
    with pytest.raises(CostModelError):
        m.step_time(64, 0)
    with pytest.raises(CostModelError, match="role"):
        _model(role="server")
    with pytest.raises(CostModelError, match="cores"):
        _model(cores=0.0)
