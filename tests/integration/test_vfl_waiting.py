"""Waiting does not burn CPU: a party blocked on its partner uses under 5 % of a core.

Real broker and party processes. CPU time is the party process's own (user + system,
children included) from psutil: the least over three consecutive 1.5 s windows while it
waits (start-up work that finishes late on a loaded machine shows in one window; a
spinning wait would show in all of them):

* in the handshake, with no partner at all;
* for embeddings, after its partner was frozen (SIGSTOP) in the middle of training,
  with ``t_ddl_s = 0`` (no deadline: the workers just wait on their channels).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from sim.launch.vfl import spawn_party_cli
from tests.conftest import BrokerProcess

# it measures idleness: under pytest-xdist no other test runs meanwhile (tests/conftest.py)
pytestmark = pytest.mark.exclusive

WINDOW_S = 3.0
MAX_CORES = 0.05


def _cpu_s(pid: int) -> float:
    p = psutil.Process(pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _party(role: str, broker: BrokerProcess, tmp: Path, run_id: str, *sets: str) -> Any:
    """``python -m parties ROLE ...`` as a real process, forked from this test process's
    party fork server (its start-up imports are not what is measured here)."""
    args = [role, "--insecure", "--broker", broker.address, "--run-id", run_id,
            "--out", str(tmp / role), "--events", str(tmp / f"{role}.jsonl"), "--quiet",
            "--set", "dataset=bank", *[x for s in sets for x in ("--set", s)]]
    return spawn_party_cli(args, name=f"idle-{role}")


def _wait_for_event(path: Path, event: str, proc: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:  # its error went to this test's captured stderr
            raise AssertionError(f"party exited early ({proc.returncode})")
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("event") == event:
                        return
                except ValueError:
                    continue
        time.sleep(0.05)
    raise AssertionError(f"no {event!r} in {path} within {timeout_s} s")


def _cores_used(pid: int, window_s: float = WINDOW_S) -> float:
    c0, t0 = _cpu_s(pid), time.perf_counter()
    time.sleep(window_s)
    return (_cpu_s(pid) - c0) / (time.perf_counter() - t0)


def _idle_cores(pid: int, windows: int = 3) -> float:
    """The least CPU over ``windows`` consecutive windows of ``WINDOW_S``/2: start-up work
    still finishing on a loaded machine shows in one window; a spinning wait in all."""
    return min(_cores_used(pid, WINDOW_S / 2) for _ in range(windows))


def _kill(*procs: Any) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(10)


def test_party_waiting_in_the_handshake_is_idle(broker: BrokerProcess, tmp_path: Path) -> None:
    active = _party("active", broker, tmp_path, "idle-hs", "timeouts.handshake_timeout_s=120")
    try:
        _wait_for_event(tmp_path / "active.jsonl", "vfl.data_loaded", active)
        time.sleep(1.0)  # let it finish starting its workers and reach the hello loop
        cores = _idle_cores(active.pid)
        assert active.poll() is None, "the active party gave up instead of waiting"
    finally:
        _kill(active)
    print(f"handshake wait: {cores:.4f} cores")
    assert cores < MAX_CORES, f"waiting in the handshake used {cores:.3f} cores"


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_party_waiting_for_embeddings_is_idle(broker: BrokerProcess, tmp_path: Path) -> None:
    sets = ("epochs=200", "timeouts.t_ddl_s=0", "timeouts.liveness_timeout_s=60", "timeouts.handshake_timeout_s=60")
    passive = _party("passive", broker, tmp_path, "idle-emb", *sets)
    active = _party("active", broker, tmp_path, "idle-emb", *sets)
    try:
        _wait_for_event(tmp_path / "active.jsonl", "vfl.epoch_done", active)
        # control: the same measurement sees the party working while it trains (the most
        # of three windows: on a loaded machine a party may wait out one of them)
        busy = max(_cores_used(active.pid, 1.0) for _ in range(3))
        os.kill(passive.pid, signal.SIGSTOP)  # the partner stalls mid-training
        time.sleep(0.5)  # in-flight steps finish; then only waiting is left
        cores = _idle_cores(active.pid)
        assert active.poll() is None, "the active party stopped instead of waiting"
    finally:
        _kill(active, passive)
    print(f"embedding wait: {cores:.4f} cores (training: {busy:.2f})")
    assert busy > 0.1, f"the party used only {busy:.3f} cores while training"
    assert cores < MAX_CORES, f"waiting for embeddings used {cores:.3f} cores"
