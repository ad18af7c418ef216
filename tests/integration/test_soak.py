"""Bounded memory under a flood of 1 MiB messages: a short variant of ``bench/soak_memory.py``
(the 60 s soak is the bench itself: ``python bench/soak_memory.py --seconds 60``)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path


SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "soak_memory.py"


def _bounds() -> tuple[int, int]:
    spec = importlib.util.spec_from_file_location("soak_memory", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.bounds()  # type: ignore[no-any-return]


def _run(seconds: float, min_bytes_in: int, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    """Run the soak script in its own session; whatever happens (a failure, a pytest
    timeout), its broker and subscriber processes are killed with it."""
    out = tmp_path / "soak.json"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--seconds", str(seconds),
                             "--min-bytes-in", str(min_bytes_in), "--json", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:  # a hang bound: two floods of at most seconds + 120 s each, and start-up
        _, err = proc.communicate(timeout=2 * (seconds + 120) + 180)
    finally:  # even after a clean exit: a stray child must not outlive the test
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the script's children too
        except ProcessLookupError:
            pass
        proc.wait(10)
    assert out.exists(), err[-2000:]
    doc = json.loads(out.read_text())
    assert proc.returncode == (0 if doc["summary"]["within_bounds"] else 1)
    return doc


def test_broker_and_client_memory_stay_bounded_short(tmp_path: Path) -> None:
    # at least 2 s per scenario, and on until three times the larger bound reached the
    # broker (quiet: 2-4 GB in 2 s on a 2-core machine; beside other jobs, 0.24 GB once)
    bound = max(_bounds())
    doc = _run(2, 3 * bound, tmp_path)
    s = doc["summary"]
    assert s["within_bounds"], doc
    # a real flood: every scenario pushed more than twice the larger bound through the
    # broker, so a buffer that kept everything could not have stayed within bounds
    assert bound == max(s["broker_bound_bytes"], s["client_bound_bytes"])
    assert all(r["broker_bytes_in"] > 2 * bound for r in doc["runs"]), doc["runs"]
