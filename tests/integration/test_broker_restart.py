"""A broker killed (SIGKILL) mid-run, with real broker and party
processes: restarted on the same port in any phase of a run (training, validation, test
scoring, the report, a prediction), the run completes; left dead past the liveness
timeout, the run ends with the partner code (4) and one line, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.conftest import REPO, BrokerProcess, bank_sample_csv
from tests.bounds import above, below

PSFL = [sys.executable, "-m", "sim.cli"]


@pytest.fixture(scope="module")
def bank_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bank_sample_csv(tmp_path_factory, 3000)


def _launch(broker: BrokerProcess, data: Path, out: Path, run_id: str, epochs: int,
            liveness_s: float, t_ddl_s: float = 5.0,
            extra: list[str] | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sets = [f"dataset={data}", "label=y", "seed=0", f"epochs={epochs}", "batch_size=64",
            "eval_every=1000", f"timeouts.liveness_timeout_s={liveness_s}", f"timeouts.t_ddl_s={t_ddl_s}",
            "timeouts.heartbeat_interval_s=0.25", "timeouts.handshake_timeout_s=60", "timeouts.connect_timeout_s=60",
            *(extra or [])]
    args = [*PSFL, "vfl", "run", "--broker", broker.address, "--insecure", "--run-id", run_id,
            "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _wait_epoch(out: Path, run: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    events = out / "events.jsonl"
    while time.monotonic() < deadline:
        if run.poll() is not None:
            raise AssertionError(f"the run exited early ({run.returncode}): "
                                 + run.communicate()[1][-2000:])
        if events.exists() and '"event":"vfl.epoch_done"' in events.read_text():
            return
        time.sleep(0.05)
    raise AssertionError("no vfl.epoch_done within 120 s")


def _restart_same_port(tmp: Path, broker: BrokerProcess) -> BrokerProcess:
    os.kill(broker.proc.pid, signal.SIGKILL)
    broker.proc.wait(10)
    return BrokerProcess(tmp, "--bind", broker.address)


def _wait_for(out: Path, run: subprocess.Popen[str], needle: str, after: int = 0,
              timeout_s: float = 120.0) -> int:
    """Wait until ``events.jsonl`` holds ``needle`` past byte ``after``; returns the end of
    the line that holds it."""
    deadline = time.monotonic() + timeout_s
    events = out / "events.jsonl"
    while time.monotonic() < deadline:
        if events.exists():
            text = events.read_bytes()
            i = text.find(needle.encode(), after)
            if i >= 0:
                return text.find(b"\n", i) + 1 or len(text)
        if run.poll() is not None:
            raise AssertionError(f"exited ({run.returncode}) before {needle}: "
                                 + run.communicate()[1][-2000:])
        time.sleep(0.02)
    raise AssertionError(f"no {needle} within {timeout_s:.0f} s")


#: where the broker is killed, in the order a run goes through them: each phase's first
#: event in the run's log (the training's first epoch line, then validation, test scoring
#: and the end-of-run report)
PHASES = [("training", '"event":"vfl.epoch_done"'),
          ("validation", '"phase":"validation"'),
          ("test", '"phase":"test"'),
          ("report", '"phase":"report"')]


@pytest.mark.stochastic
@pytest.mark.timeout(600)
def test_a_broker_restarted_in_every_phase_is_survived(bank_small: Path, tmp_path: Path
                                                        ) -> None:
    """One run, its broker killed (SIGKILL) and restarted on the same port as the run
    enters each phase (training, validation, test scoring, the report), then a
    prediction with the saved model whose broker is killed as the parties meet: every
    exchange is retried or resumed, both end 0 with every figure, and no batch is
    left untrained without a counted cause."""
    broker = BrokerProcess(tmp_path)
    out = tmp_path / "run"
    # the batches in flight during an outage are lost and dropped after T_ddl (1 s here);
    # a scoring message lost is asked for again every timeouts.resend_interval_s (1 s)
    run = _launch(broker, bank_small, out, "restart", epochs=5, liveness_s=30.0, t_ddl_s=1.0,
                  extra=["eval_every=1", "timeouts.resend_interval_s=1.0"])
    job: subprocess.Popen[str] | None = None
    try:
        at = 0
        for _, needle in PHASES:
            at = _wait_for(out, run, needle, at)
            broker = _restart_same_port(tmp_path, broker)  # down about 1 s (a new process)
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        m = orjson.loads((out / "metrics.json").read_bytes())
        assert len(m["history"]) == 5
        assert all("metric" in h for h in m["history"])
        above(m["test_auc"], 0.70, "test AUC")
        # the passive party's report survived its phase's restart
        assert m["reports_missing"] == [] and "passive" in m["parties"]
        pred = tmp_path / "pred"
        job = subprocess.Popen([*PSFL, "vfl", "predict", str(out), "--broker", broker.address,
                                "--insecure", "--run-id", "restart-predict", "--out",
                                str(pred), "--wait-s", "60"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        _wait_for(pred, job, '"event":"predict.partner_found"')
        broker = _restart_same_port(tmp_path, broker)
        _, perr = job.communicate(timeout=300)
        assert job.returncode == 0, perr[-3000:]
        assert "Traceback" not in perr, perr[-3000:]
        summary = orjson.loads((pred / "predict.json").read_bytes())
        assert summary["rows"] > 0
        above(summary["test_auc"], 0.70, "prediction AUC")
    finally:
        for proc in (run, job):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=300)
        broker.stop()


@pytest.mark.timeout(600)
def test_a_broker_that_stays_away_ends_the_run_with_the_partner_code(
        bank_small: Path, tmp_path: Path) -> None:
    liveness = 3.0
    broker = BrokerProcess(tmp_path)
    out = tmp_path / "run"
    run = _launch(broker, bank_small, out, "gone", epochs=1000, liveness_s=liveness)
    try:
        _wait_epoch(out, run)
        os.kill(broker.proc.pid, signal.SIGKILL)
        broker.proc.wait(10)
        t_kill = time.monotonic()
        _, err = run.communicate(timeout=liveness + 60)
        elapsed = time.monotonic() - t_kill
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=300)
    assert run.returncode == 4, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # the liveness timeout, then stopping both parties' workers, on a loaded machine
    assert elapsed < liveness + 30, elapsed
