"""bench/wan.py's pure parts: the cells --quick runs, time to target, speedups and the
summary's shape (no run)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wan():
    spec = importlib.util.spec_from_file_location("wan", ROOT / "bench" / "wan.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["wan"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_quick_runs_exactly_the_acceptance_cells(wan) -> None:
    ids = [c.id for c in wan.quick_cells()]
    five = ("vfl", "vfl-ps", "avfl", "avfl-ps", "pubsub")
    want = ([f"wan20/{ds}/{a}" for ds in ("bank", "synthetic") for a in five]
            + ["wan50/bank/vfl", "wan50/bank/pubsub", "lan/bank/vfl", "lan/bank/pubsub",
               "multiparty/N2", "multiparty/N10", "criteo/compressed", "criteo/uncompressed"])
    assert ids == want
    multi = [c for c in wan.quick_cells() if c.group == "multiparty"]
    assert {(c.link, c.dataset, c.algo) for c in multi} == {("wan20", "synthetic", "pubsub")}
    crit = [c for c in wan.quick_cells() if c.group == "criteo"]
    assert {(c.link, c.algo) for c in crit} == {("wan50", "pubsub")}
    full = [c.id for c in wan.full_cells()]
    assert set(ids) <= set(full) and "wan50/criteo/pubsub_tuned" in full
    assert [c.id for c in wan.select(wan.quick_cells(), ["wan20/bank/*"], ["vfl"])] == [
        "wan20/bank/vfl"]
    assert [c.id for c in wan.select(wan.quick_cells(), ["multiparty/*"], ["vfl"])] == [
        "multiparty/N2", "multiparty/N10"]


def test_scenario_shapes_every_passive_link_and_not_the_active_one(wan) -> None:
    scn = wan.scenario_for("wan50", 4, 600.0)
    assert scn.cpu_method == "none"
    assert not scn.active.link.shaped
    for pid in ("passive", "passive2", "passive3"):
        link = scn.party(pid).link
        assert (link.latency_s, link.bandwidth_mbps) == (0.05, 20.0)
    assert not wan.scenario_for("lan", 2, 600.0).passive.link.shaped


def test_time_to_target_and_speedup(wan) -> None:
    hist = [(1.0, 0.5), (2.0, None), (3.0, 0.9), (4.0, 0.95)]
    assert wan.time_to_target(hist, 0.9) == 3.0
    assert wan.time_to_target(hist, 0.96) is None
    assert wan.median_time([3.0, None, 1.0]) == 3.0
    assert math.isinf(wan.median_time([None, None, 1.0]))
    assert wan.speedup(6.0, 2.0) == 3.0
    assert wan.speedup(6.0, math.inf) == 0.0
    assert wan.speedup(math.inf, 2.0) is None


def _run(metric: float, hist: list[tuple[float, float]], sps: float,
         bps: float = 100.0, wall: float = 10.0) -> dict:
    return {"status": "ok", "metric": metric, "history": hist, "samples_per_s": sps,
            "bytes_per_sample": bps, "wire_bytes_per_sample": bps, "cpu_cores": 0.5,
            "train_wall_s": wall, "wire_dtype": {"active": "int8", "passive": "int8"},
            "workers": {"active": 2, "passive": 2}}


def test_summary_shape_targets_and_medians(wan) -> None:
    C = wan.Cell
    vfl_hist = [(2.0, 0.80), (4.0, 0.90), (6.0, 0.92)]
    runs = {
        # vfl's median final metric 0.92: target 0.9016; vfl reaches it at 6 s
        C("grid", "wan20", "bank", "vfl"): [_run(0.92, vfl_hist, 1000.0)] * 3,
        # pubsub: 2 s, 1 s, missed -> median 2 s -> speedup 3
        C("grid", "wan20", "bank", "pubsub"): [
            _run(0.93, [(1.0, 0.85), (2.0, 0.91)], 4000.0),
            _run(0.93, [(1.0, 0.91)], 5000.0),
            _run(0.80, [(1.0, 0.80)], 3000.0)],
        # missed twice: infinite median, speedup 0
        C("grid", "wan20", "bank", "avfl"): [
            _run(0.85, [(1.0, 0.85)], 100.0), {"status": "failed", "error": "x"},
            _run(0.95, [(5.0, 0.95)], 100.0)],
        C("grid", "lan", "bank", "pubsub"): [_run(0.92, [(1.0, 0.92)], 8000.0)] * 3,
        C("grid", "lan", "bank", "vfl"): [_run(0.92, [(1.0, 0.80)], 8000.0)] * 3,
        C("multiparty", "wan20", "synthetic", "pubsub", parties=2): [
            _run(0.90, [], 1.0, wall=10.0)] * 3,
        C("multiparty", "wan20", "synthetic", "pubsub", parties=10): [
            _run(0.89, [], 1.0, wall=15.0)] * 3,
        C("criteo", "wan50", "criteo", "pubsub", wire="compressed"): [
            _run(0.749, [], 1.0, bps=40.0)] * 3,
        C("criteo", "wan50", "criteo", "pubsub", wire="uncompressed"): [
            _run(0.750, [], 1.0, bps=130.0)] * 3,
    }
    s = wan.summarize(runs)
    bank = s["wan20"]["bank"]
    assert bank["target"] == pytest.approx(0.98 * 0.92)
    assert bank["vfl"]["time_to_target_s"] == 6.0 and bank["vfl"]["speedup_vs_vfl"] == 1.0
    assert bank["pubsub"]["time_to_target_s"] == 2.0
    assert bank["pubsub"]["speedup_vs_vfl"] == pytest.approx(3.0)
    assert bank["pubsub"]["missed"] == 1 and bank["pubsub"]["metric"] == 0.93
    assert bank["pubsub"]["samples_per_s"] == 4000.0
    assert bank["pubsub"]["efficiency_vs_lan"] == pytest.approx(0.5)
    assert bank["avfl"]["time_to_target_s"] is None and bank["avfl"]["speedup_vs_vfl"] == 0.0
    assert bank["avfl"]["efficiency_vs_lan"] is None  # no lan run of avfl
    for key in ("time_to_target_s", "speedup_vs_vfl", "metric", "samples_per_s",
                "efficiency_vs_lan", "bytes_per_sample"):
        assert key in bank["pubsub"]
    assert not any(k.startswith("_") for row in bank.values() if isinstance(row, dict)
                   for k in row)
    # on lan vfl never reaches its own target: every cell there is invalid
    lan = s["lan"]["bank"]
    assert lan["pubsub"]["speedup_vs_vfl"] is None and "invalid" in lan["pubsub"]
    mp = s["multiparty"]
    assert mp["time_ratio_10_vs_2"] == pytest.approx(1.5)
    assert (mp["metric_2"], mp["metric_10"]) == (0.90, 0.89)
    cr = s["criteo"]
    assert cr["bytes_ratio"] == pytest.approx(130 / 40)
    assert cr["auc_delta"] == pytest.approx(-0.001)
    assert "_median_s" not in cr["compressed"]
    assert wan.render(s)  # the tables render
