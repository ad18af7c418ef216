"""Pure helpers of bench/vfl_table.py (loaded by path: ``bench`` is not a package)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table() -> Any:
    spec = importlib.util.spec_from_file_location("vfl_table", REPO / "bench" / "vfl_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


HISTORY = [{"epoch": 0, "wall_s": 1.5, "metric": 0.85}, {"epoch": 1, "wall_s": 3.0, "metric": 0.91},
           {"epoch": 2, "wall_s": 4.5, "metric": 0.93}]


def test_time_to_target_reads_the_history(table: Any) -> None:
    assert table.time_to_target(HISTORY, 0.90, False) == 3.0
    assert table.time_to_target(HISTORY, 0.95, False) is None
    assert table.time_to_target([{"wall_s": 1.0, "metric": 0.8},
                                 {"wall_s": 2.0, "metric": 0.6}], 0.7, True) == 2.0
    assert table.time_to_target([{"wall_s": 1.0, "metric": math.nan}], 0.5, False) is None


def test_relative_targets_fall_back_to_pubsub(table: Any) -> None:
    ok = lambda m: {"status": "ok", "metric": m}  # noqa: E731
    runs = {"vfl": [ok(0.95), ok(0.97)], "pubsub": [ok(0.99)]}
    assert table.target_for("bank", "binary", runs) == (0.92, "fixed")
    t, basis = table.target_for("synthetic", "binary", runs)
    assert t == pytest.approx(0.98 * 0.97) and "vfl" in basis
    t, basis = table.target_for("synthetic", "binary", {"vfl": [{"status": "not available"}],
                                                        "pubsub": [ok(0.99)]})
    assert t == pytest.approx(0.98 * 0.99) and "not available" in basis
    t, _ = table.target_for("california", "regression", {"vfl": [ok(0.6), ok(0.5)]})
    assert t == pytest.approx(1.02 * 0.5)


def test_unknown_algorithm_is_not_available(table: Any) -> None:
    settings = {"active_cpus": [0], "passive_cpus": [0], "synthetic_rows": 1000}
    cfg, why = table.make_config("no-such-algo", "bank", seed=0, epochs=1, settings=settings)
    assert cfg is None and "vfl.algo" in why
    cfg, why = table.make_config("pubsub", "bank", seed=1, epochs=2, settings=settings,
                                 **{"timeouts.t_ddl_s": 0.0})
    assert why is None and (cfg.seed, cfg.timeouts.t_ddl_s, cfg.model.bottom_hidden) == (1, 0.0, (128,) * 9)


def test_aggregate_means_and_efficiency(table: Any) -> None:
    def run(m: float, sps: float) -> dict[str, Any]:
        return {"status": "ok", "seed": 0, "metric": m, "history": HISTORY,
                "cpu_util": {"active": 0.8, "passive": 0.6},
                "wait_s_per_epoch": {"active": 0.1, "passive": 0.2}, "bytes_per_epoch": 1e6,
                "train_wall_s": 5.0, "train_samples_per_s": sps, "ms_per_batch": 2.0}

    agg = table.aggregate([run(0.9, 500.0), run(0.92, 700.0)], 0.90, False, 1000.0)
    assert agg["metric"] == pytest.approx(0.91) and agg["time_to_target_s"] == 3.0
    assert agg["cpu_util"] == pytest.approx(0.6) and agg["efficiency"] == pytest.approx(0.6)
    assert table.aggregate([{"status": "not available", "seed": 0}], 0.9, False,
                           None)["status"] == "not available"


def test_a_failed_run_is_recorded_but_a_stop_request_ends_the_table(
        table: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.launch.vfl
    from parties.config import VflConfig

    def fails(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("party died")

    monkeypatch.setattr(sim.launch.vfl, "run_vfl", fails)
    res = table.run_one(VflConfig(), 10.0)
    assert res == {"status": "failed", "error": "RuntimeError: party died"}

    def terminated(*_a: Any, **_k: Any) -> None:
        raise sim.launch.vfl._Terminated

    monkeypatch.setattr(sim.launch.vfl, "run_vfl", terminated)
    with pytest.raises(sim.launch.vfl._Terminated):  # SIGTERM: not swallowed as a failed run
        table.run_one(VflConfig(), 10.0)
