"""CPU pinning of the parties (``vfl.workers.active_cpus`` / ``vfl.workers.passive_cpus``) and
``t_ddl_s = 0`` (no deadline) in a real two-process run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.conftest import psfl_in_process
from tests.bounds import above, below


@pytest.mark.stochastic
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
@pytest.mark.parametrize("worker_mode", ["thread", "process"])
def test_pinned_parties_without_deadline(tmp_path: Path, worker_mode: str,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    a, p = cpus[0], cpus[-1]
    # the launcher in this process; the broker and both parties are processes
    res = psfl_in_process(
        capfd, "vfl", "run", "--dataset", "bank", "--out", str(tmp_path),
        "--set", "epochs=1", "--set", "timeouts.t_ddl_s=0", "--set", f"workers.mode={worker_mode}",
        # each party shares its one pinned CPU with its workers: on a loaded machine its
        # start can take longer than the default 10 s
        "--set", "timeouts.connect_timeout_s=60", "--timeout-s", "120",
        "--set", f"workers.active_cpus=[{a}]", "--set", f"workers.passive_cpus=[{p}]")
    assert res.returncode == 0, res.stderr[-2000:]
    m = orjson.loads((tmp_path / "metrics.json").read_bytes())
    for role in ("active", "passive"):
        assert m["parties"][role]["cores_allotted"] == 1.0
    assert m["dropped_batches"] == 0
    above(m["test_auc"], 0.8, "test AUC")


def test_unavailable_cpu_is_a_config_error(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "parties", "active", "--insecure", "--broker", "tcp://127.0.0.1:9",
         "--set", "workers.active_cpus=[4096]", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert "vfl.workers.active_cpus" in res.stderr and "Traceback" not in res.stderr
