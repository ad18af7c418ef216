"""``psfl vfl profile --sweep`` -> ``psfl vfl plan`` -> ``psfl vfl run --plan auto`` on
bank (the launcher in the test's process, its children real processes), and the bus probe
against a real broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parties.data import load_table
from tests.conftest import BrokerProcess, psfl_in_process


def test_measure_comm_through_a_real_broker(broker: BrokerProcess) -> None:
    from parties.planning.commprobe import cut_layer_sizes, measure_comm

    sizes = cut_layer_sizes((16, 256, 1024), 32)
    assert sizes == (2048, 32768, 131072)
    sweep = measure_comm(sizes, broker.address, reps=5, warmup=2)
    assert [p.nbytes for p in sweep.points] == list(sizes)
    for p in sweep.points:
        assert 0 < p.rtt_min_s <= p.rtt_s and p.one_way_s == p.rtt_s / 2 and p.reps == 5
    fit = sweep.fit()
    assert fit.latency_s >= 0 and fit.s_per_byte >= 0 and fit.n_points == 3


@pytest.mark.timeout(600)
def test_profile_sweep_then_plan_on_bank(tmp_path: Path,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    prof_dir, plan_dir = tmp_path / "prof", tmp_path / "plan"
    # the launcher in this process: the profile and sweep children, the broker of the
    # communication probe are processes
    res = psfl_in_process(capfd, "vfl", "profile", "--sweep", "--dataset", "bank",
                          "--batch-sizes", "16,64,256,1024", "--min-time-s", "0.05",
                          "--sweep-min-time-s", "0.05", "--out", str(prof_dir))
    assert res.returncode == 0, res.stderr
    assert "γ" in res.stdout and "held-out err" in res.stdout
    doc = json.loads((prof_dir / "profile.json").read_text())
    assert doc["ceiling_samples_per_s"] > 0 and set(doc["parties"]) == {"active", "passive"}
    cm = doc["cost_model"]
    assert cm["batch_sizes"] == [16, 64, 256, 1024] and cm["n_train"] > 1024
    for role in ("active", "passive"):
        m = cm[role]
        assert m["forward"]["lam"] > 0 and m["backward"]["lam"] > 0 and m["cores"] > 0
        assert m["memory"]["m0"] > 0 and m["comm"]["latency_s"] >= 0
        assert cm["fit_error"][f"{role}.forward"]["r2"] is not None
        pts = doc["sweep"][role]["points"]
        assert [p["batch_size"] for p in pts] == [16, 64, 256, 1024]
        assert all(p["fwd_cpu_s"] > 0 and p["bwd_cpu_s"] > 0 and p["rss_bytes"] > 0
                   for p in pts)
    assert len(doc["sweep"]["comm"]["points"]) == 4
    assert doc["settings"]["config"]["dataset"] == "bank"

    res = psfl_in_process(capfd, "vfl", "plan", "--profile", str(prof_dir / "profile.json"),
                          "--w-max", "4", "--out", str(plan_dir))
    assert res.returncode == 0, res.stderr
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert plan["batch_size"] in plan["inputs"]["batch_sizes"]
    assert 1 <= plan["w_active"] <= 4 and 1 <= plan["w_passive"] <= 4
    assert plan["epoch_s"] > 0 and len(plan["table"]) == 7
    assert f"B {plan['batch_size']}" in res.stdout

    res = psfl_in_process(capfd, "vfl", "plan", "--profile", str(prof_dir / "profile.json"),
                          "--mem-limit-mb", "1", "--out", str(plan_dir))
    assert res.returncode == 2 and "no batch size" in res.stderr


@pytest.mark.timeout(600)
def test_run_with_plan_auto_records_the_plan(tmp_path: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    # 6,000 rows of bank (3,780 training rows: every swept B fits): the
    # sweep's children, the plan and the run are the same, on a shorter epoch
    data = tmp_path / "bank_sample.csv"
    load_table("bank")[0].sample(n=6000, random_state=0).to_csv(data, index=False)
    out = tmp_path / "run"
    res = psfl_in_process(capfd, "vfl", "run", "--plan", "auto", "--dataset", str(data),
                          "--set", "vfl.label=y", "--set", "vfl.epochs=1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    m = json.loads((out / "metrics.json").read_text())
    plan = m["plan"]
    assert plan["profile"] == str(out / "plan" / "profile.json")
    assert (out / "plan" / "plan.json").exists() and (out / "plan" / "profile.json").exists()
    cfg = m["config"]
    assert (cfg["workers"]["active"], cfg["workers"]["passive"], cfg["batch_size"]) == (
        plan["w_active"], plan["w_passive"], plan["batch_size"])
    assert m["metric"] is not None


@pytest.mark.timeout(600)
def test_plan_auto_with_pilots_plans_for_time_to_target(tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "bank_sample.csv"
    load_table("bank")[0].sample(n=6000, random_state=0).to_csv(data, index=False)
    out = tmp_path / "run"
    common = ["--dataset", str(data), "--set", "vfl.label=y", "--set", "vfl.epochs=2",
              "--set", "vfl.val_per_epoch=4"]
    res = psfl_in_process(capfd, "vfl", "run", "--plan-pilots", *common, "--out", str(out))
    assert res.returncode == 2 and "--plan auto" in res.stderr
    res = psfl_in_process(capfd, "vfl", "run", "--plan", "auto", "--plan-pilots", *common,
                          "--out", str(out))
    assert res.returncode == 0, res.stderr
    m = json.loads((out / "metrics.json").read_text())
    plan = m["plan"]
    pilots = plan["pilots"]
    assert [(p["w_active"], p["w_passive"]) for p in pilots["pilots"]] == \
        [(1, 1), (2, 1), (1, 4), (1, 1)]
    assert pilots["pilots"][0]["epochs_to_target"] is not None  # the reference reached it
    model = plan["samples_model"]
    assert model == pilots["model"] and model["active_worker_cost"] >= 0
    assert plan["samples_ratio"] >= 1.0 or model["batch_noise"] is not None
    cfg = m["config"]
    assert (cfg["workers"]["active"], cfg["workers"]["passive"], cfg["batch_size"]) == (
        plan["w_active"], plan["w_passive"], plan["batch_size"])
    # the model reused from the plan.json, planned again
    res = psfl_in_process(capfd, "vfl", "plan", "--profile", str(out / "plan" / "profile.json"),
                          "--samples-model", str(out / "plan" / "plan.json"),
                          "--out", str(tmp_path / "again"))
    assert res.returncode == 0, res.stderr
    again = json.loads((tmp_path / "again" / "plan.json").read_text())
    assert again["samples_model"] == model and "time to target" in res.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"kappa": 1}')
    res = psfl_in_process(capfd, "vfl", "plan", "--profile", str(out / "plan" / "profile.json"),
                          "--samples-model", str(bad), "--out", str(tmp_path / "bad"))
    assert res.returncode == 2 and "bad.json" in res.stderr
