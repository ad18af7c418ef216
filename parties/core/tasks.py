"""Learning tasks of a VFL run and their test metrics (no torch, no pandas).

A run is either

* ``"binary"``: a two-class label encoded as 0/1; the top model outputs a logit,
  trained with binary cross-entropy; the test metric is ROC AUC (``"auc"``,
  higher is better), computed on the predicted probabilities;
* ``"regression"``: a numeric label, standardised with the training split's mean
  and standard deviation; the top model outputs the standardised value, trained
  with mean squared error; the test metric is the root mean squared error in the
  label's original units (``"rmse"``, lower is better).
"""

from __future__ import annotations

import math

import numpy as np

TASKS: tuple[str, ...] = ("binary", "regression")

#: Test metric of each task: its short name, used as ``test_<name>`` in metrics.json.
METRICS: dict[str, str] = {"binary": "auc", "regression": "rmse"}


def metric_name(task: str) -> str:
    """The test metric's short name of ``task``: ``"auc"`` or ``"rmse"``.

    Raises:
        ValueError: ``task`` is not one of :data:`TASKS`.
    """
    try:
        return METRICS[task]
    except KeyError:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}") from None


def compute_metric(task: str, y_true: np.ndarray, pred: np.ndarray) -> float:
    """The task's test metric.

    Args:
        task: ``"binary"`` or ``"regression"``.
        y_true: ``(n,)`` labels: 0/1 for binary, original label units for regression.
        pred: ``(n,)`` predictions: positive-class probabilities (or any score that
            orders like them) for binary, values in the label's units for regression.

    Returns:
        ROC AUC in [0, 1] (binary) or RMSE >= 0 in the label's units (regression);
        NaN if ``y_true`` is empty, or (binary) holds a single class.

    Raises:
        ValueError: unknown task, or the arrays' shapes differ.
    """
    name = metric_name(task)
    y = np.asarray(y_true, dtype=np.float64).reshape(-1)
    p = np.asarray(pred, dtype=np.float64).reshape(-1)
    if y.shape != p.shape:
        raise ValueError(f"labels {y.shape} and predictions {p.shape} differ in shape")
    if y.size == 0:
        return math.nan
    if name == "rmse":
        return float(np.sqrt(np.mean((p - y) ** 2)))
    if np.unique(y).size < 2:
        return math.nan
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, p))


__all__ = ["METRICS", "TASKS", "compute_metric", "metric_name"]
