"""Pure parts of bench/des_validate.py (loaded by path: ``bench`` is not a package); no
real runs, no sweep."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

from parties.planning.costmodel import PowerFit

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dv() -> Any:
    spec = importlib.util.spec_from_file_location("des_validate",
                                                  REPO / "bench" / "des_validate.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pf(lam: float, gamma: float) -> dict[str, Any]:
    return PowerFit(lam=lam, gamma=gamma).to_dict()


COST_MODEL = {
    "active": {"forward": _pf(1e-5, 1.0), "backward": _pf(3e-5, 1.0), "sync_overhead_s": 2e-4},
    "passive": {"forward": _pf(2e-5, 0.5), "backward": _pf(4e-5, 1.0), "sync_overhead_s": 1e-4},
    "comm": {"latency_s": 1e-4, "s_per_byte": 1e-9},
    "n_train": 20_000, "embedding_dim": 32,
}


def test_costs_from_models_with_a_top_fit(dv: Any) -> None:
    c = dv.step_costs_from_models(COST_MODEL, 256, top=_pf(2e-6, 1.0))
    assert c.passive_fwd_s == pytest.approx(2e-5 * 16)
    assert c.passive_bwd_s == pytest.approx(4e-5 * 256)
    assert c.active_fwd_s == pytest.approx(1e-5 * 256)
    assert c.active_top_s == pytest.approx(2e-6 * 256)
    assert c.active_bwd_s == pytest.approx((3e-5 - 2e-6) * 256)
    # the sweep's active backward is split, never changed
    assert c.active_top_s + c.active_bwd_s == pytest.approx(3e-5 * 256)


def test_top_is_clamped_to_the_backward_and_fractions_work(dv: Any) -> None:
    c = dv.step_costs_from_models(COST_MODEL, 100, top=_pf(1.0, 0.0))  # 1 s > backward
    assert c.active_top_s == pytest.approx(3e-3) and c.active_bwd_s == 0.0
    c = dv.step_costs_from_models(COST_MODEL, 100, top=0.25)
    assert c.active_top_s == pytest.approx(0.25 * 3e-3)
    assert c.active_bwd_s == pytest.approx(0.75 * 3e-3)
    with pytest.raises(ValueError):
        dv.step_costs_from_models(COST_MODEL, 100, top=1.5)
    with pytest.raises(ValueError):
        dv.step_costs_from_models(COST_MODEL, 0, top=0.1)


def test_cost_exponent_is_cost_weighted(dv: Any) -> None:
    g = dv.cost_exponent(COST_MODEL, 256)
    w = {"af": 1e-5 * 256, "ab": 3e-5 * 256, "pf": 2e-5 * 16, "pb": 4e-5 * 256}
    want = (w["af"] + w["ab"] + 0.5 * w["pf"] + w["pb"]) / sum(w.values())
    assert g == pytest.approx(want)


def test_errors_and_summary(dv: Any) -> None:
    assert dv.rel_err(1.1, 1.0) == pytest.approx(0.1)
    assert dv.rel_err(0.8, 1.0) == pytest.approx(0.2)
    assert dv.rel_err(0.0, 0.0) == 0.0 and math.isinf(dv.rel_err(1.0, 0.0))
    s = dv.summarize_validation([{"rel_err": 0.05}, {"rel_err": 0.14}])
    assert s == {"max_rel_err": 0.14, "within_15pct": True}
    assert not dv.summarize_validation([{"rel_err": 0.05}, {"rel_err": 0.2}])["within_15pct"]
    failed = dv.summarize_validation([{"rel_err": 0.05}, {"rel_err": None}])
    assert failed == {"max_rel_err": 0.05, "within_15pct": False}
    assert dv.summarize_validation([]) == {"max_rel_err": None, "within_15pct": False}


def test_measured_epoch_from_history(dv: Any) -> None:
    hist = [{"train_s": t} for t in (0.5, 0.2, 0.2, 0.2, 0.2, 0.2, 0.3, 0.2)]
    m = dv.measured_epoch_s(hist, 2)
    assert m["segments"] == 4
    assert m["median_seg"] == pytest.approx(0.8)
    assert m["mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        dv.measured_epoch_s([], 1)


def test_party_msg_cpu(dv: Any) -> None:
    party = {"batches": 100, "cores_allotted": 1.0, "compute_s": 0.8,
             "history": [{"cpu_util": 0.9, "train_s": 0.5}, {"cpu_util": 1.0, "train_s": 0.55}]}
    m = dv.party_msg_cpu_s(party)
    assert m["train_cpu_s"] == pytest.approx(1.0)
    assert m["noncompute_s"] == pytest.approx(0.2)
    assert m["per_batch_s"] == pytest.approx(2e-3)
    assert m["per_msg_s"] == pytest.approx(1e-3)
    party["compute_s"] = 5.0  # wall-clock compute above the CPU measured: floored at 0
    assert dv.party_msg_cpu_s(party)["per_msg_s"] == 0.0
    with pytest.raises(ValueError):
        dv.party_msg_cpu_s({**party, "batches": 0})


def test_sim_base_and_paper_grid(dv: Any) -> None:
    fit = {"cost_model": COST_MODEL, "top_fit": _pf(2e-6, 1.0), "msg_cpu_s": 5e-5,
           "rows": 30_000}
    inp = dv.sim_base(fit, algo="pubsub", b=128, n_rows=2000, epochs=1, w_active=1,
                      w_passive=4, cores=(1.0, 1.0), worker_mode="inline", segments=4)
    assert inp.bandwidth_bps == pytest.approx(1e9) and inp.latency_s == 1e-4
    assert inp.sync_s_active == 2e-4 and inp.msg_cpu_s == 5e-5 and inp.jitter == dv.JITTER
    assert inp.costs.active_top_s == pytest.approx(2e-6 * 128)
    run = {"algo": "pubsub", "w_active": 1, "w_passive": 4, "batch_size": 128, "epochs": 1,
           "worker_mode": {"active": "inline", "passive": "inline"}, "segments": 4,
           "delta_t0": 5, "staleness_bound": 5,
           "measured": {"median_seg": 1.0, "mean": 1.1, "segments": 4},
           "batches": {"active": 157, "passive": 157},
           "compute_s": {"active": 1.0, "passive": 1.0},
           "wait_s_per_epoch": {"active": 0.0, "passive": 0.1}}
    row = dv.predict_run(fit, run)
    assert row["predicted_epoch_s"] > 0
    assert row["rel_err"] == pytest.approx(abs(row["predicted_epoch_s"] - 1.0))
    small = {**fit, "cost_model": {**COST_MODEL, "n_train": 500}, "rows": 100_000}
    rows = dv.paper_predictions(small, epochs=1)
    assert len(rows) == 5 * len(dv.PAPER_WORKERS)
    assert {r["algo"] for r in rows} == set(dv.ALGOS)
    assert all(0 <= r["util_total"] <= 1 + 1e-9 for r in rows)
    assert [r["paper_cpu_util"] for r in rows if r["algo"] == "pubsub"][0] == 0.8742


def test_balanced_costs_put_the_steps_in_the_ratio_of_the_cores(dv: Any) -> None:
    costs = dv.StepCosts(passive_fwd_s=1e-3, passive_bwd_s=2e-3, active_fwd_s=2e-3,
                         active_top_s=1e-3, active_bwd_s=4e-3)
    b = dv.balanced_costs(costs, (50.0, 14.0))
    assert b.passive_step_s / b.active_step_s == pytest.approx(14 / 50)
    assert b.passive_fwd_s / b.passive_bwd_s == pytest.approx(0.5)  # the shape is kept
    assert b.active_step_s == costs.active_step_s


def _hrun(sps: float, points: list[tuple[float, float]]) -> dict[str, Any]:
    return {"status": "ok", "train_samples_per_s": sps,
            "history": [{"window_s": dt, "train_s": dt, "metric": m} for dt, m in points]}


def test_samples_ratios_from_a_hetero_document(dv: Any) -> None:
    # vfl: 1000 samples/s, target at 3 s (3000 samples); pubsub 2000/s at 2 s (4000):
    # ratio 0.75; a missed target 0; a repeat whose vfl missed is left out
    doc = {"splits": {"50:14": {"targets": [0.9, 0.9, 0.9], "runs": [
        {"vfl": _hrun(1000.0, [(1.0, 0.8), (2.0, 0.91)]),
         "pubsub": _hrun(2000.0, [(1.0, 0.85), (1.0, 0.92)])},
        {"vfl": _hrun(1000.0, [(1.0, 0.8), (2.0, 0.91)]),
         "pubsub": _hrun(2000.0, [(1.0, 0.85), (1.0, 0.89)])},
        {"vfl": _hrun(1000.0, [(3.0, 0.8)]), "pubsub": _hrun(2000.0, [(1.0, 0.95)])},
    ]}}}
    r = dv.samples_ratios(doc)["50:14"]
    assert r["vfl"] == 1.0
    assert r["pubsub"] == pytest.approx((0.75 + 0.0) / 2)
    assert dv.samples_ratios(None) == {}


def test_split_table_speedups(dv: Any) -> None:
    fit = {"cost_model": {**COST_MODEL, "n_train": 500}, "top_fit": _pf(2e-6, 1.0),
           "msg_cpu_s": 5e-5, "rows": 100_000}
    rows = dv.split_predictions(fit, {"50:14": {"pubsub": 0.5}}, epochs=1)
    assert len(rows) == len(dv.PAPER_SPLITS) * len(dv.SPLIT_ALGOS)
    by = {(r["split"], r["algo"]): r for r in rows}
    assert by[("50:14", "vfl")]["throughput_speedup_vs_vfl"] == pytest.approx(1.0)
    assert (by[("40:24", "pubsub")]["w_active"], by[("40:24", "pubsub")]["w_passive"]) \
        == (40, 24)
    p = by[("50:14", "pubsub")]
    assert p["time_to_target_speedup_vs_vfl"] == pytest.approx(
        0.5 * p["throughput_speedup_vs_vfl"])
    assert by[("48:16", "pubsub")]["time_to_target_speedup_vs_vfl"] is None
    assert all(0 <= r["util_total"] <= 1 + 1e-9 for r in rows)


def test_split_table_scaled_to_fewer_cores(dv: Any) -> None:
    # 16 cores: 50:14 is 12.5 : 3.5, one worker per started core (13 + 4); keys stay the
    # paper's splits, the scaled shares are in "cores"
    assert dv.scaled_splits(16)[0] == pytest.approx((12.5, 3.5))
    with pytest.raises(ValueError, match="total_cores"):
        dv.scaled_splits(0)
    fit = {"cost_model": {**COST_MODEL, "n_train": 500}, "top_fit": _pf(2e-6, 1.0),
           "msg_cpu_s": 5e-5, "rows": 100_000}
    rows = dv.split_predictions(fit, None, epochs=1, total_cores=16)
    by = {(r["split"], r["algo"]): r for r in rows}
    p = by[("50:14", "pubsub")]
    assert (p["w_active"], p["w_passive"]) == (13, 4)
    assert p["cores"] == pytest.approx([12.5, 3.5])
    assert by[("50:14", "vfl")]["throughput_speedup_vs_vfl"] == pytest.approx(1.0)
    assert all(0 <= r["util_total"] <= 1 + 1e-9 for r in rows)
