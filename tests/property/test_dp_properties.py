"""Property tests of the GDP accountant: calibrate for a target, re-account, stay under it."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from parties.dp import (
    GdpAccountant,
    calibrate_noise_multiplier,
    clip_rows,
    delta_for_epsilon,
    epsilon_for_delta,
)

targets = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=1, max_value=10_000)
deltas = st.floats(min_value=1e-12, max_value=0.5)


@given(target=targets, k=counts)
def test_calibrate_then_reaccount_never_exceeds_the_target(target: float, k: int) -> None:
    """Opacus-style: feed the calibrated σ into a fresh ledger, publish every record k
    times, and the spent µ is at most the target (and tight to float precision)."""
    sigma = calibrate_noise_multiplier(target, k)
    acct = GdpAccountant({"train": 3, "test": 1}, noise_multiplier=sigma, max_publications=k)
    for _ in range(k):
        acct.record("train", np.array([0, 2]))
    assert acct.publications_max == k
    assert acct.mu <= target
    assert acct.mu >= target * (1 - 1e-12)


@given(target=targets, k=counts, delta=deltas)
def test_epsilon_is_monotone_and_consistent(target: float, k: int, delta: float) -> None:
    sigma = calibrate_noise_multiplier(target, k)
    acct = GdpAccountant({"train": 1, "test": 0}, noise_multiplier=sigma)
    for _ in range(k):
        acct.record("train")
    eps = acct.epsilon(delta)
    assert eps <= epsilon_for_delta(target, delta)
    assert eps >= 0 and math.isfinite(eps)
    assert delta_for_epsilon(eps, acct.mu) <= delta * (1 + 1e-9)


@given(rows=st.integers(1, 40), dim=st.integers(1, 40),
       scale=st.floats(min_value=1e-4, max_value=1e4),
       clip=st.floats(min_value=1e-3, max_value=1e3), seed=st.integers(0, 2**31))
def test_clipped_rows_never_exceed_the_clip_norm(rows: int, dim: int, scale: float, clip: float,
                                                 seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, dim, generator=g) * scale
    norms = torch.linalg.vector_norm(clip_rows(h, clip), dim=1)
    assert bool(torch.all(norms <= clip * (1 + 1e-5)))
