"""The active-only baseline: what the active party reaches on its own columns alone.

VFL under DP pays only if the consortium beats what the active party could train by
itself, without the partner: its own feature columns and its own labels. This module
fits that baseline (pure: arrays in, a dict out, no I/O, no message), on exactly the
run's rows: the training rows fit, the run's validation rows choose, the test rows are
scored once.

Two models are fitted with fixed seeds, each early-stopped on the **validation** rows
(never the test rows):

* gradient boosting, :class:`sklearn.ensemble.HistGradientBoostingClassifier`, grown
  ``GB_STEP`` trees at a time up to ``GB_MAX_ITER`` (stopped after ``GB_PATIENCE_STEPS``
  steps without a better validation AUC); the number of trees kept is the one with the
  best validation AUC (``staged_predict_proba``);
* an MLP, :class:`sklearn.neural_network.MLPClassifier` (``MLP_HIDDEN``, Adam), trained
  epoch by epoch (``partial_fit``) for up to ``MLP_MAX_EPOCHS`` epochs; the epoch with
  the best validation AUC is kept (patience ``MLP_PATIENCE``).

The **stronger of the two is chosen by validation AUC**, and the chosen model's test AUC
is reported (the other's test AUC is recorded too, but never used to choose). Binary
tasks only: for regression :func:`active_only_baseline` returns ``None`` and the caller
records a note instead.

The active party computes it from what it already holds, after training (off the hot
path), so it costs no privacy budget and sends nothing: the passive party's records
play no part in it.
"""

from __future__ import annotations

import itertools
import time
import warnings
from typing import Any

import numpy as np

#: the most boosting iterations; grown GB_STEP at a time and stopped after
#: GB_PATIENCE_STEPS steps without a better validation AUC
GB_MAX_ITER = 300
GB_STEP = 10
GB_PATIENCE_STEPS = 3
#: hidden widths of the MLP baseline
MLP_HIDDEN = (64, 32)
#: the most MLP epochs, and epochs without a better validation AUC before stopping
MLP_MAX_EPOCHS = 30
MLP_PATIENCE = 4
#: rows fitted at most (a seeded subsample beyond; keeps the baseline to seconds)
MAX_FIT_ROWS = 200_000
#: a DP run whose test metric is below the baseline's by more than this is warned about
WARN_MARGIN = 0.0


def _auc(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if y.size == 0 or np.unique(y).size < 2:
        return float("nan")
    return float(roc_auc_score(y, p))


def _fit_gb(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray,
            xt: np.ndarray, seed: int) -> tuple[float, np.ndarray, int]:
    from sklearn.ensemble import HistGradientBoostingClassifier

    gb = HistGradientBoostingClassifier(max_iter=GB_STEP, learning_rate=0.1,
                                        early_stopping=False, warm_start=True,
                                        random_state=seed)
    val: list[float] = []
    since = 0
    while gb.max_iter <= GB_MAX_ITER:  # GB_STEP trees at a time, stopped on validation
        gb.fit(x, y)
        staged = itertools.islice(gb.staged_predict_proba(xv), len(val), None)
        new = [_auc(yv, p[:, 1]) for p in staged]  # the new trees' stages only
        since = 0 if np.nanmax(new, initial=-1.0) > max(val, default=-1.0) else since + 1
        val += new
        if since >= GB_PATIENCE_STEPS:
            break
        gb.max_iter += GB_STEP
    best = int(np.nanargmax(val)) if np.isfinite(val).any() else len(val) - 1
    for i, p in enumerate(gb.staged_predict_proba(xt)):
        if i == best:
            return val[best], p[:, 1], best + 1
    raise AssertionError("unreachable")  # pragma: no cover


def _fit_mlp(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray,
             xt: np.ndarray, seed: int) -> tuple[float, np.ndarray, int]:
    import copy

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    mlp = MLPClassifier(hidden_layer_sizes=MLP_HIDDEN, learning_rate_init=1e-3,
                        batch_size=256, alpha=1e-4, random_state=seed)
    rng = np.random.default_rng(seed)
    best_auc, best_model, best_epoch, since = -1.0, None, 0, 0
    classes = np.array([0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for epoch in range(1, MLP_MAX_EPOCHS + 1):
            order = rng.permutation(len(y))
            mlp.partial_fit(x[order], y[order], classes=classes)
            auc = _auc(yv, mlp.predict_proba(xv)[:, 1])
            if auc > best_auc:
                best_auc, best_model, best_epoch, since = auc, copy.deepcopy(mlp), epoch, 0
            else:
                since += 1
                if since >= MLP_PATIENCE:
                    break
    assert best_model is not None
    return best_auc, best_model.predict_proba(xt)[:, 1], best_epoch


def active_only_baseline(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray,
                         y_val: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, *,
                         task: str = "binary", seed: int = 0) -> dict[str, Any] | None:
    """The stronger of gradient boosting and an MLP on the active party's own columns.

    Args:
        x_train / y_train: the run's training rows (the active party's encoded features
            and 0/1 labels).
        x_val / y_val: the run's validation rows: they early-stop both models and choose
            between them.
        x_test / y_test: the run's test rows: scored once, for the chosen model (and the
            other, recorded only).
        task: ``"binary"``; anything else returns None (regression is not covered).
        seed: seeds both models and the MLP's epoch order.

    Returns:
        None for a non-binary task; ``{"skipped": reason}`` when the training or the
        validation rows hold one class only; else a JSON-ready dict: ``model`` (``"gb"`` or
        ``"mlp"``, the one with the better validation AUC), ``metric_name`` (``"auc"``),
        ``val_metric`` and ``test_metric`` (the chosen model's), ``chosen_by``
        (``"val_auc"``), ``candidates`` (each model's ``val_metric``, ``test_metric``,
        ``iterations``: trees or epochs kept), ``n_train``, ``n_val``, ``n_test``,
        ``n_features`` and ``fit_s``.

    Raises:
        ValueError: no validation rows, or the arrays' lengths disagree.
    """
    if task != "binary":
        return None
    t0 = time.perf_counter()
    x = np.asarray(x_train, dtype=np.float32)
    y = np.asarray(y_train).astype(np.int64).reshape(-1)
    xv = np.asarray(x_val, dtype=np.float32)
    yv = np.asarray(y_val).astype(np.int64).reshape(-1)
    xt = np.asarray(x_test, dtype=np.float32)
    yt = np.asarray(y_test).astype(np.int64).reshape(-1)
    if len(x) != len(y) or len(xv) != len(yv) or len(xt) != len(yt):
        raise ValueError("features and labels differ in length")
    if len(yv) == 0:
        raise ValueError("the active-only baseline needs validation rows to choose on")
    if np.unique(y).size < 2 or np.unique(yv).size < 2:
        return {"skipped": "one class only in the training or validation rows"}
    if len(y) > MAX_FIT_ROWS:
        keep = np.sort(np.random.default_rng(seed).choice(len(y), MAX_FIT_ROWS, replace=False))
        x, y = x[keep], y[keep]
    # imported before the limit: threadpoolctl limits only the libraries loaded by then
    import sklearn.ensemble  # noqa: F401
    import sklearn.neural_network  # noqa: F401
    from threadpoolctl import threadpool_limits

    cands: dict[str, dict[str, Any]] = {}
    # one thread: it runs beside the party's own work (OpenMP's spinning threads took
    # 40x longer on a loaded 2-core machine)
    with threadpool_limits(limits=1):
        for name, fit in (("gb", _fit_gb), ("mlp", _fit_mlp)):
            val, pred, iters = fit(x, y, xv, yv, xt, seed)
            cands[name] = {"val_metric": val, "test_metric": _auc(yt, pred),
                           "iterations": iters}
    model = max(cands, key=lambda k: (np.nan_to_num(cands[k]["val_metric"], nan=-1.0),
                                      k == "gb"))
    return {
        "model": model,
        "metric_name": "auc",
        "val_metric": cands[model]["val_metric"],
        "test_metric": cands[model]["test_metric"],
        "chosen_by": "val_auc",
        "candidates": cands,
        "n_train": int(len(y)),
        "n_val": int(len(yv)),
        "n_test": int(len(yt)),
        "n_features": int(x.shape[1]) if x.ndim == 2 else 0,
        "fit_s": time.perf_counter() - t0,
    }


def below_baseline_warning(metrics: dict[str, Any]) -> str | None:
    """The one warning line for a private run (feature DP, or the active party's label
    protection) whose test metric ended below the active-only baseline
    (``metrics["active_only"]``), or None (neither on, no baseline, not binary, or not
    below).

    ``metrics`` is a run's ``metrics.json`` dict (``dp.enabled``, ``dp.labels``,
    ``metric_name``, ``metric``, ``active_only``).
    """
    base = metrics.get("active_only") or {}
    dp = metrics.get("dp") or {}
    value, ref = metrics.get("metric"), base.get("test_metric")
    labels_on = isinstance(dp.get("labels"), dict)
    if not (dp.get("enabled") or labels_on) or metrics.get("metric_name") != "auc":
        return None
    if not isinstance(value, float) or not isinstance(ref, float) or value != value \
            or ref != ref or not value < ref - WARN_MARGIN:
        return None
    mu = dp.get("target_mu") if dp.get("target_mu") is not None else dp.get("mu")
    at = f" at mu {mu:g}" if isinstance(mu, (int, float)) and dp.get("enabled") else ""
    what = "DP run" if dp.get("enabled") else "label-protected run"
    return (f"warning: this {what}{at} ended at test AUC {value:.4f}, below the active "
            f"party's own columns alone ({ref:.4f}, {base.get('model')} on the same "
            f"split): the partner's columns did not pay under this protection")


__all__ = ["active_only_baseline", "below_baseline_warning", "GB_MAX_ITER", "MLP_HIDDEN",
           "MLP_MAX_EPOCHS", "MLP_PATIENCE", "MAX_FIT_ROWS", "WARN_MARGIN"]
