"""The two stages end to end: private ID alignment over the (CURVE) bus, then training on
the aligned rows only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pandas as pd
import pytest

from parties.data import load_table
from tests.conftest import psfl_in_process

PSFL = [sys.executable, "-m", "sim.cli"]


def test_align_then_train_on_the_shared_rows(tmp_path: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    """Both parties hold the same 4,000-row table, but each knows only some customers: the
    active party rows 0..2999, the passive party rows 1000..3999 (the other rows carry
    IDs the partner does not have). PSI finds rows 1000..2999; both train on exactly
    those 2,000 rows, in the same (sorted-ID) order."""
    data = tmp_path / "bank.csv"
    load_table("bank")[0].sample(n=4000, random_state=3).to_csv(data, index=False)
    n = 4000
    active = [f"c{i:05d}" if i < 3000 else f"a{i:05d}" for i in range(n)]
    passive = [f"c{i:05d}" if i >= 1000 else f"p{i:05d}" for i in range(n)]
    (tmp_path / "a.txt").write_text("\n".join(active) + "\n")
    (tmp_path / "p.txt").write_text("\n".join(passive) + "\n")
    al = tmp_path / "align"
    res = subprocess.run([*PSFL, "vfl", "align", "--active-ids", str(tmp_path / "a.txt"),
                          "--passive-ids", str(tmp_path / "p.txt"), "--out", str(al),
                          "--job-timeout-s", "120"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ra = pd.read_csv(al / "aligned-active.csv", dtype={"id": str})
    rp = pd.read_csv(al / "aligned-passive.csv", dtype={"id": str})
    assert ra["id"].tolist() == rp["id"].tolist() == [f"c{i:05d}" for i in range(1000, 3000)]
    assert ra["row"].tolist() == rp["row"].tolist() == list(range(1000, 3000))
    out = tmp_path / "run"
    # the training launcher in this process (broker and parties are processes)
    res = psfl_in_process(capfd, "vfl", "run", "--dataset", str(data), "--set", "label=y",
                          "--set", "epochs=2",
                          "--set", f"data.active_rows_file={al / 'aligned-active.csv'}",
                          "--set", f"data.passive_rows_file={al / 'aligned-passive.csv'}",
                          "--out", str(out), "--timeout-s", "120")
    assert res.returncode == 0, res.stderr[-3000:]
    m = orjson.loads((out / "metrics.json").read_bytes())
    # each party loaded the shared rows only
    loaded = [orjson.loads(x) for x in (out / "events.jsonl").read_bytes().splitlines()
              if b"vfl.data_loaded" in x]
    assert sorted(r["party"] for r in loaded) == ["active", "passive"]
    assert all(r["n_rows"] == 2000 for r in loaded), loaded
    assert m["security"]["transport"] == "curve"
    # no ID of either party is in any file of the training run (saved models included)
    for f in (f for f in out.rglob("*") if f.is_file()):
        text = f.read_text(errors="replace")
        assert "c01000" not in text and "p00000" not in text and "a03000" not in text, f
    # the same rows in another order on one side: the parties refuse to train (exit 4)
    shuffled = al / "shuffled-passive.csv"
    rp.sample(frac=1.0, random_state=0).to_csv(shuffled, index=False)
    res = psfl_in_process(capfd, "vfl", "run", "--dataset", str(data), "--set", "label=y",
                          "--set", "epochs=1",
                          "--set", f"data.active_rows_file={al / 'aligned-active.csv'}",
                          "--set", f"data.passive_rows_file={shuffled}",
                          "--set", "timeouts.handshake_timeout_s=20",
                          "--out", str(tmp_path / "bad"), "--timeout-s", "120")
    assert res.returncode == 4 and "aligned_ids" in res.stderr, res.stderr[-2000:]
