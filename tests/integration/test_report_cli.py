"""``psfl report`` end to end on hand-made run directories: PNGs written and valid, and
the exit code 2 paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parties.timeline import COMM, COMPUTE, WAIT, Timeline

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.timeout(180)


def _psfl(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MPLBACKEND"] = "Agg"
    return subprocess.run([sys.executable, "-m", "sim.cli", "report", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=150)


def _report_in_process(capsys: pytest.CaptureFixture[str], *args: str
                       ) -> subprocess.CompletedProcess[str]:
    """``psfl report ARGS`` through :func:`sim.cli.main` in this process (the report is
    pure file work; a child would spend seconds on imports). :func:`_psfl` keeps the
    ``python -m sim.cli report`` wiring tested once, in :func:`test_report_bad_dirs`."""
    from sim.cli import main

    capsys.readouterr()
    code = main(["report", *args])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["psfl", "report", *args], code, captured.out,
                                       captured.err)


def _history(n: int, dt: float, auc0: float, *, metric: bool) -> list[dict]:
    out = []
    for i in range(n):
        h = {"epoch": i, "segment": 0, "epochs_done": float(i + 1),
             "train_wall_s": dt * (i + 1), "wall_s": dt * (i + 1) + 0.01 * (i + 1),
             "samples_per_s": 1000.0, "wait_s": 0.1, "cpu_util": 0.3 + 0.1 * i}
        if metric:
            h.update(metric=auc0 + 0.01 * i, loss=0.5 - 0.05 * i)
        out.append(h)
    return out


def _timeline(role: str, offset: float, workers: int, batches: int, path: Path) -> None:
    tl = Timeline(role, max_spans=10_000)
    base = tl.anchor_perf_s + offset
    for epoch in range(2):
        for b in range(batches):
            w = b % workers
            t = base + (epoch * batches + b) * 0.01
            tl.record(WAIT, w, b, t, t + 0.004)
            tl.record(COMPUTE, w, b, t + 0.004, t + 0.009)
            tl.record(COMM, w, b, t + 0.009, t + 0.0092)
    tl.write(path)


def _fake_run(d: Path, algo: str, *, timelines: bool, dt: float = 0.5) -> None:
    d.mkdir(parents=True)
    passive = {"role": "passive", "cpu_util": 0.25, "cores_allotted": 1.0,
               "history": _history(3, dt, 0.0, metric=False)}
    metrics = {
        "algo": algo, "dataset": "bank", "metric_name": "auc", "metric": 0.9,
        "target_metric": 0.9, "train_wall_s": 3 * dt,
        "history": _history(3, dt, 0.85, metric=True),
        "parties": {"active": {"role": "active", "cpu_util": 0.4, "cores_allotted": 2.0},
                    "passive": passive},
    }
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / "passive.json").write_text(json.dumps(passive))
    if timelines:
        _timeline("active", 0.0, 2, 60, d / "timeline-active.json")
        _timeline("passive", 0.002, 1, 60, d / "timeline-passive.json")


def _assert_png(p: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    assert p.is_file() and p.stat().st_size > 10_000, p
    assert p.read_bytes()[:8] == PNG_MAGIC
    img = mpimg.imread(p)
    h, w = img.shape[:2]
    assert (w, h) == (1600, 900)
    assert img.std() > 0.01  # not blank


def test_report_single_run(tmp_path, capsys):
    run = tmp_path / "run"
    _fake_run(run, "pubsub", timelines=True)
    res = _report_in_process(capsys, str(run))
    assert res.returncode == 0, res.stderr
    plots = run / "plots"
    names = {"metric_vs_time.png", "cpu_util.png", "gantt_run.png"}
    assert {p.name for p in plots.iterdir()} == names
    for n in names:
        _assert_png(plots / n)
        assert str(plots / n) in res.stdout
    # an explicit time window
    res = _report_in_process(capsys, str(run), "--out", str(tmp_path / "w"),
                             "--window-s", "0.1:0.3")
    assert res.returncode == 0, res.stderr
    _assert_png(tmp_path / "w" / "gantt_run.png")


def test_report_benchmark_dir(tmp_path, capsys):
    bench = tmp_path / "bench"
    _fake_run(bench / "bank" / "pubsub", "pubsub", timelines=True, dt=0.3)
    _fake_run(bench / "bank" / "vfl", "vfl", timelines=True, dt=0.6)
    _fake_run(bench / "bank-seed1" / "pubsub", "pubsub", timelines=False, dt=0.35)
    out = tmp_path / "out"
    res = _report_in_process(capsys, str(bench), "--out", str(out), "--max-batches", "10")
    assert res.returncode == 0, res.stderr
    names = {p.name for p in out.iterdir()}
    assert names == {"metric_vs_time.png", "cpu_util.png", "gantt_bank_pubsub.png",
                     "gantt_bank_vfl.png"}
    for n in names:
        _assert_png(out / n)
    assert "no timelines" in res.stdout and "bank-seed1" in res.stdout


def test_report_bad_dirs(tmp_path, capsys):
    res = _psfl(str(tmp_path / "missing"))  # a child process: the entry point's exit code
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "does not exist" in res.stderr
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    res = _report_in_process(capsys, str(tmp_path / "empty"))
    assert res.returncode == 2 and "no metrics.json" in res.stderr
    assert "Traceback" not in res.stderr
    run = tmp_path / "run"
    _fake_run(run, "pubsub", timelines=False)
    res = _report_in_process(capsys, str(run), "--window-s", "3:1")
    assert res.returncode == 2 and "window-s" in res.stderr
