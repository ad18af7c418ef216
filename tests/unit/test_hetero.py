"""bench/hetero.py's pure parts: worker counts, the per-split summary (the JSON's shape)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hetero():
    spec = importlib.util.spec_from_file_location("hetero_bench", ROOT / "bench" / "hetero.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["hetero_bench"] = mod
    spec.loader.exec_module(mod)
    return mod


def _history(hist, scoring_s=0.0):
    """(metric, training seconds so far) pairs as a run's history: each segment's
    window_s the training between two points, wall_s adding ``scoring_s`` per point."""
    out, prev = [], 0.0
    for i, (m, t) in enumerate(hist):
        out.append({"metric": m, "window_s": t - prev, "train_s": t - prev,
                    "wall_s": t + (i + 1) * scoring_s})
        prev = t
    return out


def _run(metric, sps, hist, scoring_s=0.0, **kw):
    return {"status": "ok", "metric": metric, "train_samples_per_s": sps,
            "cpu_util": {"active": 0.7, "passive": 0.8},
            "cpu_util_train": {"active": 0.9, "passive": 0.85},
            "wait_s_per_epoch": {"active": 0.01, "passive": 0.2},
            "history": _history(hist, scoring_s),
            "workers": [1, 1], "batch_size": 256, **kw}


def test_time_to_target_is_training_time_scoring_excluded(hetero):
    # the same training trajectories, each scoring 1 s: on the wall clock the ratio is
    # pulled towards 1 (5/4), on the training clock it is the algorithms' own (3/2)
    runs = {"vfl": _run(0.90, 30_000.0, [(0.80, 1.0), (0.85, 2.0), (0.89, 3.0)], 1.0),
            "pubsub": _run(0.91, 45_000.0, [(0.85, 1.0), (0.89, 2.0)], 1.0)}
    a = hetero.summarize(runs, 50_000.0)["algos"]
    assert a["vfl"]["time_to_target_s"] == pytest.approx(3.0)
    assert a["pubsub"]["time_to_target_s"] == pytest.approx(2.0)
    assert a["pubsub"]["speedup_vs_vfl"] == pytest.approx(1.5)
    assert a["vfl"]["time_to_target_wall_s"] == pytest.approx(6.0)
    assert a["pubsub"]["time_to_target_wall_s"] == pytest.approx(4.0)
    # a segment without a scoring (sync_per_epoch) still counts its training
    runs["pubsub"]["history"].insert(0, {"metric": None, "window_s": 0.5, "train_s": 0.4,
                                         "wall_s": 0.5})
    a = hetero.summarize(runs, 50_000.0)["algos"]
    assert a["pubsub"]["time_to_target_s"] == pytest.approx(2.5)


def test_workers(hetero):
    cores = {"active": 1.5625, "passive": 0.4375}
    assert hetero.workers_for("vfl", cores) == (1, 1)
    assert hetero.workers_for("avfl", cores) == (1, 1)
    assert hetero.workers_for("vfl-ps", cores) == (2, 2)
    assert hetero.workers_for("pubsub", cores) == (2, hetero.PASSIVE_WORKERS)
    assert hetero.workers_for("avfl-ps", {"active": 1.0, "passive": 1.0}) \
        == (1, hetero.PASSIVE_WORKERS)
    # hand-set pubsub counts per split; the baselines keep theirs
    cores = {"active": 1.25, "passive": 0.75}
    assert hetero.workers_for("pubsub", cores, "40:24") == hetero.PUBSUB_WORKERS["40:24"]
    assert hetero.workers_for("avfl-ps", cores, "40:24") == (2, hetero.PASSIVE_WORKERS)
    assert hetero.workers_for("pubsub", cores, "32:32") == (2, hetero.PASSIVE_WORKERS)


def test_balanced_widths(hetero):
    cores = {"active": 1.5625, "passive": 0.4375}
    assert hetero.balanced_widths("50:14", cores, small_width=None, big_width=None) \
        == ("passive", *hetero.BALANCED["50:14"])
    # by hand: what is not given is 128
    assert hetero.balanced_widths("50:14", cores, small_width=64, big_width=None) \
        == ("passive", 64, 128)
    assert hetero.balanced_widths("48:16", {"active": 1.5, "passive": 0.5},
                                  small_width=None, big_width=256) == ("passive", 128, 256)
    # no table entry, nothing by hand: profiled balance; equal shares: the same model
    assert hetero.balanced_widths("48:16", {"active": 1.5, "passive": 0.5},
                                  small_width=None, big_width=None) is None
    assert hetero.balanced_widths("32:32", {"active": 1.0, "passive": 1.0},
                                  small_width=64, big_width=256) is None


def test_target_auc_by_hand_needs_no_vfl_run(hetero):
    runs = {"pubsub": _run(0.91, 45_000.0, [(0.85, 1.0), (0.90, 2.0)])}
    assert hetero.summarize(runs, 50_000.0)["target_auc"] is None
    s = hetero.summarize(runs, 50_000.0, None, 0.88)
    assert s["target_auc"] == 0.88 and s["algos"]["pubsub"]["time_to_target_s"] == 2.0
    assert s["algos"]["pubsub"]["speedup_vs_vfl"] is None
    for bad in ("0", "1.5", "x"):
        with pytest.raises(hetero.argparse.ArgumentTypeError, match=repr(bad)):
            hetero._auc(bad)


def test_summary_shape_target_speedup_and_own_ceiling(hetero):
    runs = {
        "vfl": _run(0.90, 30_000.0, [(0.80, 1.0), (0.89, 2.0)]),
        "pubsub": _run(0.91, 45_000.0, [(0.885, 1.0), (0.90, 2.0)]),
        "pubsub_planned": _run(0.85, 60_000.0, [(0.80, 1.0)], ceiling=120_000.0),
        "avfl": {"status": "failed", "error": "boom"},
    }
    s = hetero.summarize(runs, 50_000.0)
    assert s["target_auc"] == pytest.approx(0.98 * 0.90)  # 0.882
    a = s["algos"]
    assert a["vfl"]["time_to_target_s"] == 2.0 and a["pubsub"]["time_to_target_s"] == 1.0
    assert a["pubsub"]["speedup_vs_vfl"] == pytest.approx(2.0)
    assert a["pubsub"]["efficiency"] == pytest.approx(0.9)
    assert a["pubsub_planned"]["efficiency"] == pytest.approx(0.5)  # its own ceiling
    assert a["pubsub_planned"]["time_to_target_s"] is None
    assert a["pubsub_planned"]["speedup_vs_vfl"] is None
    assert a["avfl"] == {"status": "failed", "error": "boom"}
    # the utilisation columns are the training window's; the whole life's beside them
    assert (a["pubsub"]["cpu_util_active"], a["pubsub"]["cpu_util_passive"]) == (0.9, 0.85)
    assert (a["pubsub"]["cpu_util_run_active"], a["pubsub"]["cpu_util_run_passive"]) \
        == (0.7, 0.8)
    for key in ("time_to_target_s", "metric", "cpu_util_active", "cpu_util_passive",
                "efficiency", "wait_s_per_epoch"):
        assert key in a["pubsub"]


@pytest.mark.parametrize("split", ["50:x", "60:14"])
def test_a_bad_split_is_a_usage_error(hetero, split, capsys):
    with pytest.raises(SystemExit) as exc:
        hetero.main(["--splits", split, "--algos", "vfl"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--splits" in err and "Traceback" not in err


def test_inrun_ceiling_is_the_bound_partys_quota_over_its_step_cpu(hetero):
    # passive: 0.4375 cores / 25 µs per sample = 17,500/s; active: 1.5625 / 62.5 µs = 25,000/s
    r = _run(0.9, 14_000.0, [(0.9, 1.0)],
             cores_allotted={"active": 1.5625, "passive": 0.4375},
             step_cpu_s_per_sample={"active": 62.5e-6, "passive": 25e-6},
             sync_cpu_s_per_sample={"active": 1e-6, "passive": 2e-6},
             cpu_s_per_sample_train={"active": 70e-6, "passive": 30e-6})
    value, bound = hetero.inrun_ceiling(r)
    assert bound == "passive" and value == pytest.approx(17_500.0)
    profile = {"parties": {"active": {"cpu_s_per_step": 0.016},
                           "passive": {"cpu_s_per_step": 0.0064}}}
    row = hetero.summarize({"pubsub": r}, 20_000.0, profile)["algos"]["pubsub"]
    assert row["efficiency"] == pytest.approx(0.7)
    assert row["efficiency_inrun"] == pytest.approx(0.8)
    assert row["bound_inrun"] == "passive"
    ms = row["cpu_ms_per_batch"]["passive"]  # B = 256
    assert ms["step"] == pytest.approx(6.4) and ms["sync"] == pytest.approx(0.512)
    assert ms["other"] == pytest.approx(256e3 * (30e-6 - 25e-6 - 2e-6))
    assert ms["profiled_step"] == pytest.approx(6.4)
    assert "6.40 (6.40) + 0.51 + 0.77" in hetero.render("50:14", {
        "cores": {"active": 1.5625, "passive": 0.4375}, "model": "m", "ceiling": 20_000.0},
        {"target_auc": None, "algos": {"pubsub": row}})


def test_no_inrun_ceiling_without_the_step_figures(hetero):
    r = _run(0.9, 14_000.0, [(0.9, 1.0)])  # an older metrics.json: no step CPU
    assert hetero.inrun_ceiling(r) == (None, None)
    row = hetero.summarize({"pubsub": r}, 20_000.0)["algos"]["pubsub"]
    assert row["efficiency_inrun"] is None
    assert row["cpu_ms_per_batch"]["passive"]["step"] is None


def _summ(hetero, vfl_hist, ps_hist, ps_metric=0.91):
    runs = {"vfl": _run(0.90, 30_000.0, vfl_hist),
            "pubsub": _run(ps_metric, 45_000.0, ps_hist)}
    return hetero.summarize(runs, 50_000.0)


def test_validation_points_before_vfl_reaches_the_target(hetero):
    # target 0.882: vfl reaches it at 3.0 s; pubsub has 2 points by then
    s = _summ(hetero, [(0.80, 1.0), (0.85, 2.0), (0.89, 3.0)],
              [(0.85, 1.5), (0.86, 3.0), (0.90, 4.0)])
    a = s["algos"]
    assert a["vfl"]["val_points_before_vfl_target"] == 3
    assert a["pubsub"]["val_points_before_vfl_target"] == 2


def test_repeats_take_medians_and_count_a_miss_as_infinite_time(hetero):
    reps = [
        _summ(hetero, [(0.89, 2.0)], [(0.89, 1.0)]),              # pubsub 1.0, vfl 2.0
        _summ(hetero, [(0.89, 4.0)], [(0.80, 1.0)], 0.80),        # pubsub missed, vfl 4.0
        _summ(hetero, [(0.89, 3.0)], [(0.89, 2.0)]),              # pubsub 2.0, vfl 3.0
    ]
    agg = hetero.aggregate_repeats(reps)
    a = agg["algos"]
    assert a["vfl"]["time_to_target_s"] == 3.0
    # pubsub: 1.0, inf, 2.0 -> median 2.0; speedup 3.0 / 2.0
    assert a["pubsub"]["time_to_target_s"] == 2.0
    assert a["pubsub"]["time_to_target_repeats_s"] == [1.0, None, 2.0]
    assert a["pubsub"]["missed"] == 1 and a["pubsub"]["repeats_ok"] == 3
    assert a["pubsub"]["speedup_vs_vfl"] == pytest.approx(1.5)
    assert a["pubsub"]["metric"] == pytest.approx(0.91)  # median of 0.91, 0.80, 0.91
    assert a["pubsub"]["metric_repeats"] == [0.91, 0.80, 0.91]
    assert agg["targets"] == [pytest.approx(0.882)] * 3
    # two misses of three: the median is infinite, the speedup 0
    reps[2] = _summ(hetero, [(0.89, 3.0)], [(0.80, 2.0)], 0.80)
    a = hetero.aggregate_repeats(reps)["algos"]
    assert a["pubsub"]["time_to_target_s"] is None
    assert a["pubsub"]["speedup_vs_vfl"] == 0.0


def test_one_repeat_aggregates_to_itself(hetero):
    s = _summ(hetero, [(0.80, 1.0), (0.89, 2.0)], [(0.885, 1.0), (0.90, 2.0)])
    a = hetero.aggregate_repeats([s])["algos"]
    for key in ("time_to_target_s", "metric", "efficiency", "speedup_vs_vfl",
                "cpu_util_active", "wait_s_per_epoch"):
        assert a["pubsub"][key] == pytest.approx(s["algos"]["pubsub"][key]), key
    assert a["pubsub"]["workers"] == [1, 1]
    with pytest.raises(ValueError):
        hetero.aggregate_repeats([])


def test_a_failed_repeat_counts_as_a_miss(hetero):
    ok = _summ(hetero, [(0.89, 2.0)], [(0.89, 1.0)])
    failed = hetero.summarize({"vfl": _run(0.90, 30_000.0, [(0.89, 2.0)]),
                               "pubsub": {"status": "failed", "error": "boom"}}, 50_000.0)
    a = hetero.aggregate_repeats([ok, failed, failed])["algos"]
    assert a["pubsub"]["repeats_ok"] == 1 and a["pubsub"]["missed"] == 2
    assert a["pubsub"]["time_to_target_s"] is None
    only_failed = hetero.aggregate_repeats([failed])["algos"]["pubsub"]
    assert only_failed["status"] == "failed" and only_failed["repeats_ok"] == 0


def test_set_overrides_apply_to_every_algorithm_and_are_checked(hetero):
    assert hetero.set_overrides(["vfl.workers.active_torch_threads=2", "lr=2e-3"]) \
        == {"workers": {"active_torch_threads": 2}, "lr": 0.002}
    cfg = hetero.base_config(1000, 1, overrides={"workers": {"active_torch_threads": 2}})
    assert cfg.workers.active_torch_threads == 2
    with pytest.raises(ValueError, match="moved to vfl.workers.active_torch_threads"):
        hetero.set_overrides(["active_torch_threads=2"])
    with pytest.raises(ValueError, match="nope"):
        hetero.set_overrides(["nope=1"])
    with pytest.raises(ValueError, match="active_torch_threads"):
        hetero.set_overrides(["workers.active_torch_threads=-1"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        hetero.set_overrides(["lr"])
