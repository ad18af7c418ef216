"""The DP-SGD baselines: calibrate then re-account, typed errors, a tiny end-to-end run."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("opacus")

from synth.baselines import (KINDS, NoiseTooLarge, calibrate, run_baseline,  # noqa: E402
                             spent_epsilon)


@pytest.mark.parametrize("eps,q,steps", [(1.0, 0.128, 200), (10.0, 0.05, 1000),
                                         (3.0, 0.5, 20)])
def test_calibrate_then_reaccount(eps: float, q: float, steps: int) -> None:
    plan = calibrate(epsilon=eps, delta=1e-9, sample_rate=q, steps=steps)
    assert plan.noise_multiplier > 0
    spent = spent_epsilon(plan, steps)
    assert spent <= eps * 1.0001
    assert spent >= eps * 0.95  # calibrated, not wildly over-noised
    assert spent_epsilon(plan, steps // 2) < spent  # a run cut short spent less
    assert spent_epsilon(plan, 0) == 0.0


def test_infinite_epsilon_plan_has_no_noise() -> None:
    plan = calibrate(epsilon=math.inf, delta=1e-9, sample_rate=0.1, steps=10)
    assert plan.noise_multiplier == 0.0 and not plan.private
    assert spent_epsilon(plan, 10) == math.inf


def test_noise_too_large_is_typed_and_names_the_target() -> None:
    with pytest.raises(NoiseTooLarge) as e:
        calibrate(epsilon=0.01, delta=1e-9, sample_rate=0.5, steps=5000)
    assert e.value.epsilon == 0.01 and e.value.steps == 5000
    assert "0.01" in str(e.value)


@pytest.mark.parametrize("bad", [dict(epsilon=0.0), dict(delta=1.0), dict(sample_rate=0.0),
                                 dict(steps=0), dict(max_grad_norm=-1.0)])
def test_calibrate_rejects_bad_input(bad: dict) -> None:
    kw = dict(epsilon=1.0, delta=1e-9, sample_rate=0.1, steps=10) | bad
    with pytest.raises(ValueError):
        calibrate(**kw)


def _parts(seed: int = 0) -> tuple[list[np.ndarray], tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    sizes = (3, 4, 2)
    a = rng.integers(3, size=1200)
    b = (a + rng.integers(2, size=1200)) % 4  # correlated with a
    c = rng.integers(2, size=1200)
    codes = np.stack([a, b, c], axis=1)
    return [codes[:600], codes[600:]], sizes


@pytest.mark.parametrize("kind", KINDS)
def test_run_baseline_returns_valid_codes_and_accounts(kind: str) -> None:
    parts, sizes = _parts()
    res = run_baseline(kind, parts, sizes, epsilon=5.0, delta=1e-9, cap_s=4.0, n_out=500,
                       seed=1)
    assert res.codes.shape == (500, 3)
    assert (res.codes >= 0).all() and (res.codes < np.array(sizes)).all()
    assert 0 < res.epsilon_spent <= 5.0 * 1.0001
    assert all(r >= 1 for r in res.steps_run)
    assert res.noise_multiplier > 0


def test_run_baseline_rejects_unknown_kind_and_tiny_party() -> None:
    parts, sizes = _parts()
    with pytest.raises(ValueError, match="baseline must be one of"):
        run_baseline("ctgan9", parts, sizes, epsilon=1.0, delta=1e-9, cap_s=1, n_out=10)
    with pytest.raises(ValueError, match="party 1 has 5 rows"):
        run_baseline("indep_ctgan", [parts[0], parts[1][:5]], sizes, epsilon=1.0,
                     delta=1e-9, cap_s=1, n_out=10)


def test_noise_too_large_before_any_training() -> None:
    parts, sizes = _parts()
    with pytest.raises(NoiseTooLarge):
        run_baseline("dpfedavg_gan", parts, sizes, epsilon=1e-4, delta=1e-9, cap_s=2,
                     n_out=10)
