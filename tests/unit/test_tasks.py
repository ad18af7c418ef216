"""Tasks and metrics (parties.core.tasks) and the task-dependent parts of the models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from parties.models.model import bottom_model, loss_function, predict, top_model
from parties.core.tasks import TASKS, compute_metric, metric_name


def test_metric_names() -> None:
    assert TASKS == ("binary", "regression")
    assert (metric_name("binary"), metric_name("regression")) == ("auc", "rmse")
    with pytest.raises(ValueError, match="'ranking'"):
        metric_name("ranking")


def test_rmse_in_label_units() -> None:
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert compute_metric("regression", y, y) == 0.0
    assert compute_metric("regression", y, y + 2.0) == pytest.approx(2.0)
    assert compute_metric("regression", y, np.full(4, y.mean())) == pytest.approx(np.std(y))


def test_auc_and_undefined_cases() -> None:
    assert compute_metric("binary", np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert math.isnan(compute_metric("binary", np.array([1, 1]), np.array([0.2, 0.3])))
    assert math.isnan(compute_metric("regression", np.array([]), np.array([])))
    with pytest.raises(ValueError, match="shape"):
        compute_metric("regression", np.zeros(3), np.zeros(4))


def test_losses_and_predictions_follow_the_task() -> None:
    assert isinstance(loss_function("binary"), torch.nn.BCEWithLogitsLoss)
    assert isinstance(loss_function("regression"), torch.nn.MSELoss)
    with pytest.raises(ValueError, match="'ranking'"):
        loss_function("ranking")
    torch.manual_seed(0)
    bottom, top = bottom_model(3, [4], 2), top_model(2, [4])
    with torch.no_grad():  # push the output far outside (0, 1)
        top[-1].bias.fill_(10.0)
    x, emb = torch.randn(5, 3), np.random.default_rng(0).normal(size=(5, 2)).astype(np.float32)
    probs = predict(bottom, top, x, emb)
    raw = predict(bottom, top, x, emb, task="regression")
    assert probs.shape == raw.shape == (5,) and raw.dtype == np.float32
    assert (raw > 5).all() and ((0 < probs) & (probs <= 1)).all()
    np.testing.assert_allclose(probs, 1 / (1 + np.exp(-raw)), rtol=1e-5)
