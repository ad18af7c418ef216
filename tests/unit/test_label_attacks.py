"""The label-inference attacks of the audit (sim.faults.label_attacks) on gradients whose
labels they must find (positive controls) and on gradients that carry none."""

from __future__ import annotations

import numpy as np

from sim.faults.label_attacks import (GRADIENT_ATTACKS, attack_auc, attack_aucs,
                                      known_records, model_completion)


def _epochs(rng: np.random.Generator, n: int, d: int, epochs: int, signal: float
            ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray], np.ndarray]:
    y = (rng.random(n) < 0.15).astype(np.float32)
    w = rng.standard_normal(d)
    grads, batches = {}, {}
    for e in range(epochs):
        scale = np.where(y > 0, -1.0, 0.1) * signal
        # with a signal, the rarer class's gradients also spread more (as BCE's do)
        spread = np.where(y > 0, 0.3, 0.05) if signal else np.full(n, 0.1)
        g = scale[:, None] * w + rng.standard_normal((n, d)) * spread[:, None]
        g[rng.random(n) < 0.01] = np.nan  # records whose batch was dropped
        grads[e] = g.astype(np.float32)
        batches[e] = rng.permutation(n) // 64
    return grads, batches, y


def test_every_gradient_attack_finds_labels_that_leak() -> None:
    rng = np.random.default_rng(0)
    grads, batches, y = _epochs(rng, 3000, 8, 3, signal=1.0)
    known = known_records(y, 200, 0)
    aucs = attack_aucs(grads, batches, y, known)
    assert set(aucs) == set(GRADIENT_ATTACKS)
    for a, v in aucs.items():
        assert v["first"] >= 0.95 and v["last"] >= 0.95, (a, v)


def test_no_attack_finds_labels_that_do_not_leak() -> None:
    rng = np.random.default_rng(1)
    grads, batches, y = _epochs(rng, 3000, 8, 3, signal=0.0)
    aucs = attack_aucs(grads, batches, y, known_records(y, 200, 0))
    for a, v in aucs.items():
        assert v["first"] < 0.56 and v["last"] < 0.56, (a, v)


def test_attack_auc_counts_an_inverted_score_and_skips_what_is_missing() -> None:
    y = np.array([0, 0, 1, 1], np.float32)
    assert attack_auc(y, np.array([1.0, 2.0, 3.0, 4.0])) == 1.0
    assert attack_auc(y, -np.array([1.0, 2.0, 3.0, 4.0])) == 1.0
    assert attack_auc(y, np.array([1.0, np.nan, 3.0, 4.0])) == 1.0
    assert attack_auc(np.zeros(4), np.arange(4.0)) == 0.5  # one class: nothing to rank


def test_known_records_hold_both_classes() -> None:
    y = np.zeros(10_000, np.float32)
    y[:200] = 1
    k = known_records(y, 200, 3)
    assert len(k) == 200 and len(set(k.tolist())) == 200
    assert (y[k] > 0).sum() >= 5 and (y[k] == 0).sum() >= 5


def test_model_completion_against_its_baseline() -> None:
    rng = np.random.default_rng(2)
    n = 4000
    y = (rng.random(n) < 0.3).astype(np.float32)
    informative = rng.standard_normal((n, 4)) + 1.5 * y[:, None]
    noise = rng.standard_normal((n, 4))
    known = known_records(y, 200, 0)
    assert model_completion(informative, y, known) > 0.9
    assert model_completion(noise, y, known) < 0.58
