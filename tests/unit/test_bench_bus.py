"""Pure helpers of bench/bus.py (loaded by path: ``bench`` is not a package)."""

from __future__ import annotations

import importlib.util
import math
import stat
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bus() -> Any:
    spec = importlib.util.spec_from_file_location("bench_bus", REPO / "bench" / "bus.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _thr_run(rates: dict[str, float], sizes: dict[str, int]) -> dict[str, Any]:
    phases = [{"size": label, "msgs_per_s": r, "mb_per_s": r * sizes[label] / 1e6, "sent": 10,
               "received": 10, "delivered": 1.0, "window_s": 1.0, "timed_out": False}
              for label, r in rates.items()]
    return {"thr_sub": {"phases": phases}, "load": {"foreign_cores": 0.0}}


def test_curve_ratios_in_rows_and_summary_helper(bus: Any) -> None:
    sizes = dict(bus.SIZES)
    rates = {"raw_direct": 1000.0, "raw_proxy": 800.0, "ours_uvloop": 600.0,
             "raw_curve_direct": 500.0, "ours_curve": 200.0}
    thr_runs = {p: [_thr_run({"64KiB": r}, sizes)] for p, r in rates.items()}
    thr, _rtt = bus.aggregate(thr_runs, {}, list(rates))
    # the existing per-row ratio is unchanged
    assert thr["ours_uvloop"]["64KiB"]["ratio_vs_raw_proxy"] == pytest.approx(0.75)
    row = thr["ours_curve"]["64KiB"]
    assert row["ratio_vs_ours_uvloop"] == pytest.approx(200 / 600)
    assert row["ratio_vs_raw_curve_direct"] == pytest.approx(200 / 500)
    assert thr["raw_curve_direct"]["64KiB"]["ratio_vs_raw_direct"] == pytest.approx(0.5)
    r = bus.curve_ratios(thr)
    assert set(r) == {"ours_curve / ours_uvloop", "ours_curve / raw_curve_direct",
                      "raw_curve_direct / raw_direct"}
    assert r["ours_curve / raw_curve_direct"]["64KiB"] == pytest.approx(0.4)
    assert math.isnan(r["ours_curve / ours_uvloop"]["1MiB"])  # size not measured


def test_curve_paths_are_known_and_ordered(bus: Any) -> None:
    for r in (0, 1):
        assert sorted(bus._order(r)) == sorted(bus.PATHS)
    assert set(bus.CURVE_PATHS) <= set(bus.PATHS)
    assert "ours_curve" in bus.OURS_PATHS and "ours_curve" in bus.UVLOOP_PATHS


def test_make_keys_fit_the_default_policy(bus: Any, tmp_path: Path) -> None:
    from pubsub.policy import load_policy
    from pubsub.security import CurveClient, read_certificate

    keys = Path(bus._make_keys(str(tmp_path)))
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    policy = load_policy(str(REPO / "broker" / "default_policy.toml"))
    pub = read_certificate(keys / f"{bus.CURVE_PUB_IDENTITY}.key")
    sub = read_certificate(keys / f"{bus.CURVE_SUB_IDENTITY}.key")
    assert (pub.role, sub.role) == ("passive", "active")
    p, s = policy.rules(pub.role), policy.rules(sub.role)
    assert p.may_publish("emb/bench/data/0") and s.may_read("emb/bench/data/0")
    assert p.may_publish("emb/7") and s.may_read("emb/7")  # round trip: A -> B
    assert s.may_publish("grad/7") and p.may_read("grad/7")  # and back
    assert not s.may_publish("emb/7") and not p.may_read("emb/7")
    CurveClient.from_dir(keys, bus.CURVE_PUB_IDENTITY)  # loads (secret file mode 0600)
