"""bench/vfl_dp.py's gain over the active-only baseline, with stub runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location("vfl_dp", REPO / "bench" / "vfl_dp.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gain_is_the_median_over_repeats_and_reuses_the_table_runs(
        bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    aucs = iter([0.86, 0.84, 0.90])
    calls: list[tuple[str, float]] = []

    def fake_run(dataset: str, mu: float, epochs: int, timeout_s: float) -> dict[str, Any]:
        calls.append((dataset, mu))
        return {"test_auc": next(aucs), "active_only": 0.83, "active_only_model": "gb"}

    monkeypatch.setattr(bench, "run_one", fake_run)
    done = {"bank": {"8": [{"test_auc": a, "active_only": 0.70, "active_only_model": "mlp"}
                           for a in (0.88, 0.87, 0.89)]}}
    out = bench.gain_table(("bank", "adult"), 3, 10, done)
    assert calls == [("adult", 8.0)] * 3  # bank's µ = 8 runs of the table are reused
    gains = out["gain_over_active_only"]
    assert gains["bank"]["8"] == pytest.approx(0.18)
    assert gains["adult"]["8"] == pytest.approx(0.03)
    assert out["gain_over_active_only_runs"]["adult"]["8"]["gains"] == pytest.approx(
        [0.03, 0.01, 0.07])
    assert len(done["adult"]["8"]) == 3


def test_the_adult_split_is_the_issues(bench: Any) -> None:
    split = bench.DATASET_SPLITS["adult"]
    assert split["data.active_columns"] == ("age", "education", "occupation", "hours-per-week")
    assert len(split["data.passive_columns"]) == 10
    assert not set(split["data.active_columns"]) & set(split["data.passive_columns"])
