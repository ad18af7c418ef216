"""Two-party VFL as real processes (broker + passive + active) on a sample of the real data,
and the bad-input paths of the command line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import math

import numpy as np
import orjson
import pandas as pd
import pytest

from parties.data import load_table, train_test_indices
from parties.algorithms.schedule import validation_split
from tests.conftest import psfl_in_process
from tests.bounds import above, below

PSFL = [sys.executable, "-m", "sim.cli"]


def _psfl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PSFL, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bank_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    frame, _ = load_table("bank")
    sample = frame.sample(n=4000, random_state=0)
    path = tmp_path_factory.mktemp("data") / "bank_sample.csv"
    sample.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("worker_mode", ["thread", "process", "inline"])
def test_two_process_vfl_smoke_on_real_data(bank_sample: Path, tmp_path: Path,
                                             worker_mode: str,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "stale.txt").write_text("an existing, non-empty --out directory is fine")
    epochs, d = 3, 16
    args = ("vfl", "run", "--dataset", str(bank_sample), "--out", str(out),
            "--set", "label=y", "--set", f"epochs={epochs}", "--set", f"model.embedding_dim={d}",
            "--set", "batch_size=128", "--set", f"workers.mode={worker_mode}",
            # two workers' updates are averaged (local SGD): a few more steps' worth
            "--set", "lr=3e-3",
            # inline: each validation point ends a segment, and the passive party waits
            # for the score (the others: the default, scored in flight)
            "--set", f"val_overlap={'false' if worker_mode == 'inline' else 'true'}")
    # python -m sim.cli once (its wiring); the launcher in this process for the others
    # (broker and parties still separate processes)
    res = _psfl(*args) if worker_mode == "thread" else psfl_in_process(capfd, *args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    m = orjson.loads((out / "metrics.json").read_bytes())
    for key in ("algo", "dataset", "test_auc", "epochs", "wall_s", "train_samples_per_s",
                "bytes_sent", "broker_bytes", "dropped_batches", "reassigned_batches",
                "time_to_target_s", "target_metric", "history", "eval_s"):
        assert key in m, key
    assert m["epochs"] == epochs and m["algo"] == "pubsub"
    assert m["parties"]["active"]["worker_mode"] == worker_mode
    assert 0.75 < m["test_auc"] <= 1.0
    assert m["dp"]["enabled"] is False and m["dp"]["mu"] is None  # DP off: µ = ∞
    assert m["dp"]["publications_max"] == epochs
    for role in ("active", "passive"):
        p = m["parties"][role]
        assert 0.0 < p["cpu_util"] <= 1.0
        # the training segments' own CPU: part of the whole life's
        assert 0.0 < p["cpu_util_train"] <= 1.05
        assert 0.0 < p["cpu_s_train"] <= p["cpu_s"] + 0.05
        # the workers' compute and its PS syncs, thread CPU time within the segments
        # (the process figure above ticks in 10 ms: a margin of a few ticks)
        assert 0.0 < p["sync_cpu_s_train"] < p["compute_cpu_s_train"] \
            <= p["cpu_s_train"] + 0.05
        assert p["step_cpu_s_per_sample"] == pytest.approx(
            (p["compute_cpu_s_train"] - p["sync_cpu_s_train"]) / p["samples"])
        assert p["wait_s_per_epoch"] >= 0.0
        assert 0.0 <= p["run_delay_s"] <= m["parties"][role]["party_wall_s"] * 64
    # the training really crossed the broker: rows x epochs x width x 4 bytes each way
    n_train = len(validation_split(4000 - round(4000 * 0.3), seed=0)[0])  # 90 %: 10 % val
    expected = n_train * epochs * d * 4
    assert m["dropped_batches"] == 0
    for channel in ("emb", "grad"):
        assert expected <= m["broker_bytes"][channel] <= expected * 1.05, channel
        assert abs(m["bytes_sent"][channel] - m["broker_bytes"][channel]) < 0.01 * expected
    # without the overlap scoring is not training on either side: the passive party
    # starts a segment only after the active party has scored the previous one and
    # started its own (one host: the timelines' perf_counter anchors share a clock); with
    # it, neither waits for the other (one point an epoch: each ends the epoch's segment)
    overlap = worker_mode != "inline"
    for role in ("active", "passive"):
        assert m["parties"][role]["segments"] == epochs
        assert m["parties"][role]["points_in_flight"] == 0
    seg = {}
    for role in ("active", "passive"):
        tl = orjson.loads((out / f"timeline-{role}.json").read_bytes())
        seg[role] = [(tl["anchor_perf_s"] + a, tl["anchor_perf_s"] + b)
                     for k, a, b in zip(tl["kind"], tl["t0_s"], tl["t1_s"], strict=True)
                     if k == "segment"]
    assert len(seg["active"]) == len(seg["passive"]) == epochs
    for k in range(1, epochs):
        for role in ("active", "passive"):
            assert seg[role][k][0] > seg[role][k - 1][1], (role, k)
        if not overlap:
            assert seg["passive"][k][0] >= seg["active"][k][0], k
    assert (out / "config.toml").exists() and (out / "events.jsonl").stat().st_size > 0
    lines = (out / "events.jsonl").read_text().splitlines()
    assert any(orjson.loads(x).get("event") == "vfl.epoch_done" for x in lines)


def _assert_clean_failure(res: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert res.returncode == code, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    for n in needles:
        assert n in res.stderr, (n, res.stderr[-2000:])


def _csv(path: Path, frame: pd.DataFrame) -> Path:
    frame.to_csv(path, index=False)
    return path


def _small_table(n: int = 60, seed: int = 0) -> pd.DataFrame:
    """A small bank-like table (numeric and text features, a yes/no label ``y``, a numeric
    ``balance``) for the validation tests: big enough that both splits hold both classes."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"age": rng.integers(20, 70, n),
                         "job": rng.choice(["admin", "services", "retired"], n),
                         "balance": rng.normal(1000, 300, n).round(1),
                         "y": np.resize(["no", "yes"], n)})


def test_missing_data_file_is_a_clear_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    res = psfl_in_process(capsys, "vfl", "run", "--dataset", str(tmp_path / "nope.csv"),
                           "--out", str(tmp_path), "--set", "label=y")
    _assert_clean_failure(res, 2, "nope.csv")


def test_unknown_column_is_a_clear_error(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    table = _csv(tmp_path / "t.csv", _small_table())
    res = psfl_in_process(capsys, "vfl", "run", "--dataset", str(table),
                           "--out", str(tmp_path / "r"),
                           "--set", "label=y", "--set", 'data.active_columns=["age","salary"]',
                           "--set", 'data.passive_columns=["job"]')
    _assert_clean_failure(res, 2, "salary")


def test_one_class_label_is_a_clear_error(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = _csv(tmp_path / "oneclass.csv", _small_table().assign(y="no"))
    res = psfl_in_process(capsys, "vfl", "run", "--dataset", str(path),
                           "--out", str(tmp_path / "r"), "--set", "label=y")
    _assert_clean_failure(res, 2, "single class")


def test_unknown_config_key_is_a_clear_error(tmp_path: Path) -> None:
    # a subprocess on purpose: the exit code of ``python -m sim.cli`` itself on bad input
    res = _psfl("vfl", "run", "--dataset", "bank", "--out", str(tmp_path), "--set", "epoch=3")
    _assert_clean_failure(res, 2, "vfl.epoch")


def test_unreachable_broker_fails_within_the_stated_timeout(tmp_path: Path) -> None:
    # a real party process: its start-up, data loading and connect deadline are the point
    # (a small table: loading the bundled bank data is not what is tested)
    table = _csv(tmp_path / "t.csv", _small_table())
    t0 = time.perf_counter()
    res = _psfl("vfl", "party", "--role", "passive", "--insecure", "--broker", "tcp://127.0.0.1:9",
                "--set", f"dataset={table}", "--set", "label=y",
                "--set", "timeouts.connect_timeout_s=1", "--out", str(tmp_path / "out"), timeout=300)
    elapsed = time.perf_counter() - t0
    _assert_clean_failure(res, 3, "no broker answered at tcp://127.0.0.1:9 within 1.0 s")
    # start-up, data loading and the 1 s connect deadline: seconds on a quiet machine, up
    # to about 30 s with two CPU hogs beside six test workers; a connect that ignored
    # its deadline would hang until the subprocess timeout
    assert elapsed < 120


def test_out_that_is_a_file_is_a_clear_error(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    res = psfl_in_process(capsys, "vfl", "run", "--dataset", "bank", "--out", str(f))
    _assert_clean_failure(res, 2, "run directory")


def test_test_split_with_one_class_is_a_clear_error(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # 12 rows: seed 0 puts rows 2, 4, 7, 9 in the test split (checked here, so the table
    # keeps meaning what it says); the training rows hold both classes, the test rows one
    n = 12
    train, test = train_test_indices(n, test_frac=0.3, seed=0)
    assert sorted(test.tolist()) == [2, 4, 7, 9]
    y = np.full(n, "no", dtype=object)
    y[[0, 5]] = "yes"
    tiny = _csv(tmp_path / "tiny.csv", _small_table(n).assign(y=y))
    res = psfl_in_process(capsys, "vfl", "run", "--dataset", str(tiny), "--set", "label=y",
                           "--out", str(tmp_path / "r"))
    _assert_clean_failure(res, 2, "single class", "test split (4 rows)")


@pytest.mark.parametrize("args", [
    ["broker", "stats", "--insecure", "--broker", "tcp://*:47555"],
    ["vfl", "party", "--role", "active", "--insecure", "--broker", "tcp://*:47555"],
    ["broker", "run", "--bind", "tcp://127.0.0.1:0", "--set", "nosuch=1"],
    ["vfl", "run", "--dataset", "bank", "--out", "x", "--set", "seed=-1"],
])
def test_more_bad_input_is_a_clear_error(args: list[str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = psfl_in_process(capsys, *args)
    _assert_clean_failure(res, 2)
    assert res.stderr.startswith("error"), res.stderr[-2000:]


@pytest.mark.stochastic
def test_regression_run_on_california_reports_rmse(tmp_path: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    # both parties in the launcher's process, this one (the task, not the processes, is
    # tested here)
    res = psfl_in_process(capfd, "vfl", "run", "--dataset", "california", "--out", str(out),
                          "--set", "epochs=3", "--transport", "memory")
    assert res.returncode == 0, res.stderr[-3000:]
    m = orjson.loads((out / "metrics.json").read_bytes())
    assert (m["dataset"], m["task"], m["metric_name"]) == ("california", "regression", "rmse")
    assert "test_auc" not in m
    rmse = m["test_rmse"]
    assert math.isfinite(rmse) and m["metric"] == rmse
    # far better than predicting the training mean, in the label's units ($100,000)
    frame, label = load_table("california")
    train, test = train_test_indices(len(frame), test_frac=0.3, seed=0)
    y = frame[label].to_numpy()
    baseline = float(np.sqrt(np.mean((y[test] - y[train].mean()) ** 2)))
    below(rmse / baseline, 0.75, "RMSE / predict-the-mean RMSE")
    assert [h["metric"] for h in m["history"]] == [h["val_rmse"] for h in m["history"]]
    assert len(m["history"]) == 3
    assert m["target_metric"] is None and m["time_to_target_s"] is None  # no default target
    epoch_lines = [x for x in res.stdout.splitlines() if x.startswith("epoch ")]
    assert len(epoch_lines) == 3 and all("val_rmse" in x for x in epoch_lines), res.stdout
    assert "test_auc" not in res.stdout
    assert f"test_rmse {rmse:.4f}" in res.stdout  # the launcher's and the party's summaries


@pytest.mark.stochastic
def test_adult_run_reaches_the_reference_auc(tmp_path: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    res = psfl_in_process(capfd, "vfl", "run", "--dataset", "adult", "--out", str(out),
                          "--set", "epochs=2", "--transport", "memory")
    assert res.returncode == 0, res.stderr[-3000:]
    m = orjson.loads((out / "metrics.json").read_bytes())
    assert (m["task"], m["metric_name"]) == ("binary", "auc")
    assert m["metric"] == m["test_auc"]
    above(m["test_auc"], 0.85, "test AUC")
    assert m["parties"]["active"]["n_features"] > 7  # one-hot columns, "?" as a category
    assert "test_auc" in res.stdout


def test_task_that_does_not_fit_the_label_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = psfl_in_process(capsys, "vfl", "run", "--dataset", "bank",
                           "--out", str(tmp_path / "a"), "--set", "task=regression")
    _assert_clean_failure(res, 2, "vfl.task", "binary task")
    table = _csv(tmp_path / "t.csv", _small_table())
    res = psfl_in_process(capsys, "vfl", "run", "--dataset", str(table),
                           "--out", str(tmp_path / "b"), "--set", "label=y",
                           "--set", "task=regression")
    _assert_clean_failure(res, 2, "'y'", "must be numeric")
    res = psfl_in_process(capsys, "vfl", "run", "--dataset", str(table),
                           "--out", str(tmp_path / "c"), "--set", "label=balance")
    _assert_clean_failure(res, 2, "vfl.task=regression")


def test_parties_with_different_tasks_refuse_to_train(broker, tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    rng = np.random.default_rng(0)
    pd.DataFrame({"a": rng.normal(size=200), "b": rng.normal(size=200),
                  "y": rng.integers(0, 2, size=200)}).to_csv(table, index=False)
    common = ["vfl", "party", "--insecure", "--broker", broker.address, "--run-id", "taskmix",
              "--set", f"dataset={table}", "--set", "label=y", "--set", "timeouts.handshake_timeout_s=30"]
    procs = {
        role: subprocess.Popen([*PSFL, *common, "--role", role, "--set", f"task={task}",
                                "--out", str(tmp_path / role)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for role, task in (("passive", "binary"), ("active", "regression"))
    }
    for role, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 4, (role, err[-2000:])
        assert "task: ours" in err and "Traceback" not in err, err[-2000:]
