"""Property tests of the GDP accountant: calibrate for a target, re-account, stay under it."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parties.privacy.dp import (
    GdpAccountant,
    account,
    calibrate,
    clip_rows,
    compose_mu,
    delta_for_epsilon,
    epsilon_for_delta,
    release_mu,
)

shares = st.floats(min_value=0.01, max_value=0.99)


def _ledger(cal, k: int, v: int) -> GdpAccountant:
    ev = release_mu(cal.eval_noise_multiplier)
    tr = compose_mu([release_mu(cal.embed_noise_multiplier),
                     release_mu(cal.sgd_noise_multiplier)])  # as DpPlan.release_mu
    return GdpAccountant({"train": 3, "val": 2, "test": 1},
                         release_mu={"train": tr, "val": ev, "test": ev},
                         max_publications={"train": k, "val": v, "test": 1})

targets = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=1, max_value=10_000)
deltas = st.floats(min_value=1e-12, max_value=0.5)


@given(target=targets, k=counts, v=st.integers(1, 200), share=shares)
def test_calibrate_then_reaccount_never_exceeds_the_target(target: float, k: int, v: int,
                                                           share: float) -> None:
    """Opacus-style: feed the calibrated σ_e, σ_g into a fresh ledger, publish every
    record as often as the plan allows, and the spent µ is at most the target (and tight
    to float precision for the training records)."""
    cal = calibrate(target, train_publications=k, eval_publications=v, embedding_share=share)
    acct = _ledger(cal, k, v)
    for _ in range(k):
        acct.record("train", np.array([0, 2]))
    for _ in range(v):
        acct.record("val")
    assert acct.publications_max == max(k, v)
    assert acct.mu <= target
    assert acct.group_mu("train") >= target * (1 - 1e-9)
    assert account(k, cal.embed_noise_multiplier, cal.sgd_noise_multiplier, train=True) <= target


@given(target=targets, k=counts, delta=deltas)
def test_epsilon_is_monotone_and_consistent(target: float, k: int, delta: float) -> None:
    cal = calibrate(target, train_publications=k, eval_publications=1, embedding_share=0.5)
    acct = _ledger(cal, k, 1)
    for _ in range(k):
        acct.record("train")
    eps = acct.epsilon(delta)
    assert eps <= epsilon_for_delta(target, delta) * (1 + 1e-9)  # solver precision
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


@settings(max_examples=30)
@given(target=st.floats(min_value=0.1, max_value=100.0), epochs=st.integers(1, 6),
       reserve=st.integers(0, 4), share=shares,
       misses=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=8), min_size=6,
                       max_size=6))
def test_reassignments_within_the_reserve_never_pass_the_target(
        target: float, epochs: int, reserve: int, share: float,
        misses: list[list[int]]) -> None:
    """An adversary that forces any reassignments it likes (``misses[e]``: the batches of
    epoch e whose gradient it withholds, again and again): the passive party publishes a
    reassigned batch only when its reserve admits it, every epoch's first attempts still
    fit the plan, and the spent µ stays within the target calibrated for epochs + reserve."""
    kt = epochs + reserve
    cal = calibrate(target, train_publications=kt, eval_publications=1, embedding_share=share)
    tr = compose_mu([release_mu(cal.embed_noise_multiplier),
                     release_mu(cal.sgd_noise_multiplier)])
    acct = GdpAccountant({"train": 12}, release_mu={"train": tr},
                         max_publications={"train": kt}, reserve={"train": reserve})
    batches = [np.arange(b * 2, b * 2 + 2) for b in range(6)]
    for e in range(epochs):
        for rows in batches:
            acct.record("train", rows)  # the first attempt: never refused
        for b in misses[e]:
            if acct.admits_extra("train", batches[b]):
                acct.record("train", batches[b], extra=True)
    assert acct.group_max("train") <= kt and acct.extra_max("train") <= reserve
    assert acct.mu <= target
