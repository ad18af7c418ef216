"""Bounded memory under a flood of 1 MiB messages (short variant always runs; the 60 s
soak is marked ``soak``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "soak_memory.py"


def _run(seconds: float, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    out = tmp_path / "soak.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--seconds", str(seconds), "--json",
                          str(out)], capture_output=True, text=True, timeout=seconds * 2 + 120)
    assert out.exists(), res.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert res.returncode == (0 if doc["summary"]["within_bounds"] else 1)
    return doc


def test_broker_and_client_memory_stay_bounded_short(tmp_path: Path) -> None:
    doc = _run(4, tmp_path)
    s = doc["summary"]
    assert s["within_bounds"], doc
    assert all(r["broker_bytes_in"] > 100 * (1 << 20) for r in doc["runs"])  # a real flood


@pytest.mark.soak
def test_broker_and_client_memory_stay_bounded_60s(tmp_path: Path) -> None:
    assert _run(60, tmp_path)["summary"]["within_bounds"]
