"""``psfl report`` end to end on hand-made run directories: PNGs written and valid, and
the exit code 2 paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parties.runtime.timeline import COMM, COMPUTE, WAIT, Timeline

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.timeout(600)


def _psfl(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MPLBACKEND"] = "Agg"
    return subprocess.run([sys.executable, "-m", "sim.cli", "report", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


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


# ---------------------------------------------------------------- FedForge runs

SYNTH_PNGS = ("stage_timeline", "tv_per_marginal", "privacy_budget")


def _fake_synth_run(d: Path, *, marginals: int, kill: bool = False) -> None:
    """A FedForge run directory as ``psfl synth run`` leaves it (the files the report
    reads): metrics.json, events.jsonl, stages/quality.json."""
    d.mkdir(parents=True)
    rho = 0.014973
    parties = [f"p{i:03d}" for i in range(4)]
    stages = [("schema", 0.01), ("budget", 0.3), ("keys", 0.005), ("seeds:0", 0.007),
              ("round:one_way", 0.4), ("compress_domain", 0.001), ("round:select", 0.4),
              ("select_tree", 0.001), ("round:tree", 0.2), ("synthesis", 5.0),
              ("quality", 1.0)]
    events, t = [], 0.0

    def ev(name: str, at: float, **kw: object) -> None:
        s = 8.0 + at
        events.append({"event": name, "party": "coordinator",
                       "timestamp": f"2026-12-06T06:55:{s:09.6f}Z", **kw})

    for stage, secs in stages:
        ev("stage.started", t, stage=stage)
        if kill and stage == "round:tree":
            ev("sim.coordinator_killed", t + 0.05)
            ev("sim.coordinator_restarted", t + 1.05)
            t += 1.5
            ev("stage.started", t, stage=stage)
        t += secs
        ev("stage.done", t, stage=stage, seconds=secs)
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    tv = {f"c{i},c{i + 1},c{i + 2}": 0.02 + 0.3 * ((i * 37) % marginals) / marginals
          for i in range(marginals)}
    spent = {p: rho if p != "p003" else rho / 3 for p in parties}
    metrics = {"dataset": "adult", "parties": 4, "mechanism": "mst", "engine": "mbi",
               "epsilon": 1.0, "delta": 1e-9, "rho": rho, "rho_spent": spent,
               "rho_planned": spent, "epsilon_spent": {p: 1.0 if v == rho else 0.56
                                                       for p, v in spent.items()},
               "avg_tv": sum(tv.values()) / len(tv), "max_tv": max(tv.values()),
               "workload": "all 3-way marginals", "stage_s": dict(stages), "wall_s": t + 5,
               "ledger_agrees": True}
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / "stages").mkdir()
    (d / "stages" / "quality.json").write_text(json.dumps({"tv_per_marginal": tv}))


def test_report_fedforge_bench_dir_with_a_vfl_run(tmp_path, capsys):
    bench = tmp_path / "bench"
    _fake_synth_run(bench / "adult" / "k4", marginals=60, kill=True)  # two TV panels
    _fake_synth_run(bench / "small", marginals=8)
    _fake_run(bench / "vfl" / "pubsub", "pubsub", timelines=False)
    out = tmp_path / "out"
    res = _report_in_process(capsys, str(bench), "--out", str(out))
    assert res.returncode == 0, res.stderr
    names = {p.name for p in out.iterdir()}
    assert names == {"metric_vs_time.png", "cpu_util.png",
                     *(f"{n}_{run}.png" for n in SYNTH_PNGS for run in ("adult_k4", "small"))}
    for n in names:
        _assert_png(out / n)
        assert str(out / n) in res.stdout
    # one FedForge run: the plain names
    res = _report_in_process(capsys, str(bench / "small"))
    assert res.returncode == 0, res.stderr
    assert {p.name for p in (bench / "small" / "plots").iterdir()} == {
        f"{n}.png" for n in SYNTH_PNGS}


def test_report_refuses_a_dir_without_a_readable_run(tmp_path, capsys):
    d = tmp_path / "runs" / "broken"
    d.mkdir(parents=True)
    (d / "metrics.json").write_text('{"stage_s": ')  # a FedForge run cut short
    res = _report_in_process(capsys, str(tmp_path / "runs"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"no VFL or FedForge run found below {tmp_path / 'runs'}" in res.stderr
    assert str(d / "metrics.json") in res.stdout and "unreadable" in res.stdout


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("jax_compile_cache")
def test_report_a_real_fedforge_run(synth_mst_run, tmp_path, capsys):
    # conftest.synth_mst_run: K = 3 on a 5-column table, mbi, epsilon 1 (shared, read-only)
    _, launch = synth_mst_run
    q = json.loads((launch.out / "stages" / "quality.json").read_text())
    per = q["tv_per_marginal"]
    assert len(per) == launch.metrics["n_workload"] == 10
    assert sum(per.values()) / len(per) == pytest.approx(launch.metrics["avg_tv"])
    out = tmp_path / "plots"
    res = _report_in_process(capsys, str(launch.out), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert {p.name for p in out.iterdir()} == {f"{n}.png" for n in SYNTH_PNGS}
    for n in SYNTH_PNGS:
        _assert_png(out / f"{n}.png")
    assert "note:" not in res.stdout  # events and per-marginal TV were both there
