"""Pure parts of bench/many_core.py (loaded by path: ``bench`` is not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mc() -> Any:
    spec = importlib.util.spec_from_file_location("many_core", REPO / "bench" / "many_core.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_worker_counts_scale_the_split(mc: Any) -> None:
    assert mc.worker_counts(16) == pytest.approx((12.5, 3.5, 13, 4))
    assert mc.worker_counts(64) == pytest.approx((50.0, 14.0, 50, 14))
    assert mc.worker_counts(2)[2:] == (2, 1)
    for bad in ("50-14", "50:0", "x:y"):
        with pytest.raises(ValueError, match="split"):
            mc.worker_counts(16, bad)
    with pytest.raises(ValueError, match="total_cores"):
        mc.worker_counts(0)


def test_compare_predicted_and_measured(mc: Any) -> None:
    des = {"paper_splits": [
        {"split": "50:14", "algo": "vfl", "w_active": 1, "w_passive": 1,
         "throughput_speedup_vs_vfl": 1.0, "util_total": 0.1},
        {"split": "50:14", "algo": "pubsub", "w_active": 13, "w_passive": 4,
         "throughput_speedup_vs_vfl": 3.0, "util_total": 0.8},
        {"split": "40:24", "algo": "pubsub", "w_active": 10, "w_passive": 6,
         "throughput_speedup_vs_vfl": 9.0, "util_total": 0.8}]}
    het = {"summary": {"50:14": {
        "vfl": {"train_samples_per_s": 1000.0, "speedup_vs_vfl": 1.0, "metric": 0.91},
        "pubsub": {"train_samples_per_s": 2500.0, "speedup_vs_vfl": 1.8,
                   "cpu_util_active": 0.7, "cpu_util_passive": 0.9, "metric": 0.905}}}}
    rows = {r["algo"]: r for r in mc.compare(des, het)}
    assert set(rows) == set(mc.ALGOS)
    p = rows["pubsub"]
    assert p["predicted_speedup"] == 3.0 and p["measured_speedup"] == pytest.approx(2.5)
    assert p["rel_err"] == pytest.approx(0.2)
    assert p["workers_predicted"] == [13, 4] and p["measured_ttt_speedup"] == 1.8
    assert rows["vfl"]["rel_err"] == pytest.approx(0.0)
    # measured nowhere: no figures, no error
    assert rows["avfl"]["measured_speedup"] is None and rows["avfl"]["rel_err"] is None
    assert all(r["rel_err"] is None for r in mc.compare({}, {}))


def test_refuses_a_small_machine(mc: Any, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    import sim.cluster.cpu
    monkeypatch.setattr(sim.cluster.cpu, "machine_cores", lambda: 2)
    assert mc.main(["--out", "unused"]) == 2
    assert "needs at least 8" in capsys.readouterr().err
