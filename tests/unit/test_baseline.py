"""The active-only baseline (parties.algorithms.baseline) and the warning of a DP run below it."""

from __future__ import annotations

import numpy as np
import pytest

from parties.algorithms.baseline import active_only_baseline, below_baseline_warning


def _planted(informative: bool, n: int = 1500, d: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    if informative:
        logit = 2.5 * x[:, 0] - 2.0 * x[:, 1] * x[:, 2]
    else:  # labels independent of the active columns
        logit = np.zeros(n)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    cut = (int(n * 0.6), int(n * 0.7))
    return (x[:cut[0]], y[:cut[0]], x[cut[0]:cut[1]], y[cut[0]:cut[1]],
            x[cut[1]:], y[cut[1]:])


def test_informative_active_columns_give_a_high_baseline() -> None:
    res = active_only_baseline(*_planted(True))
    assert res is not None
    assert res["model"] in ("gb", "mlp") and res["chosen_by"] == "val_auc"
    # the chosen model is the one with the better validation AUC
    c = res["candidates"]
    assert res["val_metric"] == max(c["gb"]["val_metric"], c["mlp"]["val_metric"])
    assert res["test_metric"] == c[res["model"]]["test_metric"]
    assert res["test_metric"] > 0.8
    assert (res["n_train"], res["n_val"], res["n_test"]) == (900, 150, 450)


def test_noise_active_columns_give_a_baseline_near_one_half() -> None:
    res = active_only_baseline(*_planted(False))
    assert res is not None
    assert abs(res["test_metric"] - 0.5) < 0.08


def test_regression_is_not_covered_and_validation_rows_are_required() -> None:
    parts = _planted(True)
    assert active_only_baseline(*parts, task="regression") is None
    x, y, _, _, xt, yt = parts
    with pytest.raises(ValueError, match="validation"):
        active_only_baseline(x, y, x[:0], y[:0], xt, yt)


def _metrics(metric: float, base: float | None, *, dp: bool = True) -> dict:
    return {"metric_name": "auc", "metric": metric,
            "dp": {"enabled": dp, "target_mu": 8.0 if dp else None, "mu": 7.9 if dp else None},
            "active_only": None if base is None else {"model": "gb", "test_metric": base}}


def test_warning_when_a_dp_run_ends_below_the_baseline() -> None:
    line = below_baseline_warning(_metrics(0.80, 0.83))
    assert line is not None and line.startswith("warning: ")
    assert "mu 8" in line and "0.8000" in line and "0.8300" in line and "gb" in line
    assert "\n" not in line
    for quiet in (_metrics(0.85, 0.83), _metrics(0.80, 0.83, dp=False), _metrics(0.80, None),
                  _metrics(float("nan"), 0.83)):
        assert below_baseline_warning(quiet) is None


def test_psfl_vfl_run_prints_the_warning(capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import _print_active_only

    _print_active_only(_metrics(0.80, 0.83))
    out, err = capsys.readouterr()
    assert "active-only baseline" in out and "-0.0300" in out
    assert err.count("\n") == 1 and err.startswith("warning: ")
    _print_active_only(_metrics(0.86, 0.83))
    out, err = capsys.readouterr()
    assert "+0.0300" in out and err == ""


def test_one_class_in_the_validation_rows_is_skipped() -> None:
    x, y, xv, yv, xt, yt = _planted(True)
    assert active_only_baseline(x, y, xv, np.zeros_like(yv), xt, yt) == {
        "skipped": "one class only in the training or validation rows"}
