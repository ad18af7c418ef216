"""Atomic checkpoint files (synth/checkpoint.py) and the privacy ledger after a restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from synth.accounting import BudgetExceeded, ZCdpAccountant
from synth.checkpoint import (
    CheckpointError,
    atomic_save_npz,
    atomic_write_json,
    load_npz,
    read_json,
)


def test_roundtrip_and_missing(tmp_path: Path) -> None:
    assert read_json(tmp_path / "none.json") is None
    atomic_write_json(tmp_path / "c.json", {"done": ["schema"], "rho": 0.5})
    assert read_json(tmp_path / "c.json") == {"done": ["schema"], "rho": 0.5}
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    atomic_save_npz(tmp_path / "r.npz", values=a, lo=np.zeros(2, np.int64))
    got = load_npz(tmp_path / "r.npz")
    np.testing.assert_array_equal(got["values"], a)
    with pytest.raises(CheckpointError, match="cannot read arrays"):
        load_npz(tmp_path / "absent.npz")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_json(tmp_path / "bad.json")


def test_a_crash_during_the_write_leaves_the_previous_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write fails after the temp file is written but before the rename: the old
    checkpoint is intact and no temp file is left behind."""
    target = tmp_path / "checkpoint.json"
    atomic_write_json(target, {"done": ["schema"]})

    def crash(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="No space"):
        atomic_write_json(target, {"done": ["schema", "keys"], "pad": "x" * 100_000})
    monkeypatch.undo()
    assert read_json(target) == {"done": ["schema"]}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


_WRITER = r"""
import sys
from synth.checkpoint import atomic_write_json
path = sys.argv[1]
i = 1
atomic_write_json(path, {"i": i, "pad": [i] * 200_000})
print("ready", flush=True)
while True:
    i += 1
    atomic_write_json(path, {"i": i, "pad": [i] * 200_000})
"""


@pytest.mark.timeout(600)
def test_kill_9_during_writes_never_leaves_a_torn_checkpoint(tmp_path: Path) -> None:
    """A process rewriting a ~1 MB checkpoint in a loop is killed with SIGKILL at random
    moments; every time, the file reads back as one complete version."""
    target = tmp_path / "checkpoint.json"
    rng = np.random.default_rng(3)
    seen = []
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)],
                                stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        # rewriting for sure (a second version is on disk, however slow this machine),
        # then a random moment amid the rewrites
        deadline = time.monotonic() + 30
        while (read_json(target) or {}).get("i", 0) < 2:
            assert time.monotonic() < deadline, "the writer never rewrote the file"
            time.sleep(0.01)
        time.sleep(float(rng.random()) * 0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        doc = read_json(target)  # raises CheckpointError if torn
        assert doc is not None and doc["pad"] == [doc["i"]] * 200_000
        seen.append(doc["i"])
    assert max(seen) > 1  # the kills landed amid rewrites
    # only a killed writer's own hidden temporary file may be left (never under the name)
    assert not [p.name for p in tmp_path.iterdir() if p.name != "checkpoint.json"
                and not (p.name.startswith(".checkpoint.json.") and p.name.endswith(".tmp"))]


def test_the_accountant_after_a_restart_keeps_its_ledger_and_refuses_overspending(
        tmp_path: Path) -> None:
    """A party's ledger file (rewritten before each release) restores an accountant that
    has spent exactly as much, and refuses what would pass the budget."""
    acc = ZCdpAccountant.from_epsilon(1.0, 1e-9)
    third = acc.rho_budget / 3
    acc.spend(third, what="round 0 (one_way)")
    acc.spend(third, what="round 1 (select)")
    atomic_write_json(tmp_path / "p000.ledger.json", {"party": "p000", **acc.state_dict()})
    fresh = ZCdpAccountant.from_epsilon(1.0, 1e-9)
    doc = json.loads((tmp_path / "p000.ledger.json").read_text())
    fresh.load_state_dict(doc)
    assert fresh.spent == pytest.approx(acc.spent, rel=1e-12)
    assert [w for w, _ in fresh.ledger] == ["round 0 (one_way)", "round 1 (select)"]
    fresh.spend(third, what="round 2 (tree)")
    assert fresh.spent == pytest.approx(fresh.rho_budget, rel=1e-9)
    with pytest.raises(BudgetExceeded):
        fresh.spend(third, what="round 2 (tree) again")
    other = ZCdpAccountant.from_epsilon(2.0, 1e-9)
    with pytest.raises(ValueError, match="rho_budget"):
        other.load_state_dict(doc)
