"""A run whose output directory is a filesystem too small for it (a tmpfs in a mount
namespace this test creates, as root): it ends with exit 2 and one error line naming
ENOSPC and the file, and every file left in the run directory is whole (JSON parses,
every JSON line parses, nothing cut off under a result's name)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, synth_table

#: run inside the namespace after the job: each file of the run directory, and whether it
#: is whole
CHECK = r"""
import json, os, sys
out = []
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        data = open(os.path.join(d, f), "rb").read()
        whole = True
        try:
            if f.endswith(".json"):
                json.loads(data)
            elif f.endswith(".jsonl"):
                [json.loads(x) for x in data.splitlines()]
                whole = not data or data.endswith(b"\n")
            elif f.endswith(".csv"):
                whole = data.endswith(b"\n")
        except ValueError:
            whole = False
        out.append([os.path.relpath(os.path.join(d, f), sys.argv[1]), whole])
print("FILES " + json.dumps(out))
"""


def _namespace_or_skip() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a tmpfs in a mount namespace")
    p = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"no mount namespace here: {p.stderr.strip()[:200]}")


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind, size", [("vfl", "192k"), ("synth", "96k")])
def test_a_full_disk_ends_in_a_typed_error_and_leaves_only_whole_files(
        tmp_path: Path, kind: str, size: str) -> None:
    _namespace_or_skip()
    mnt = tmp_path / "disk"
    mnt.mkdir()
    run = mnt / "run"
    psfl = [sys.executable, "-m", "sim.cli"]
    if kind == "vfl":
        job = [*psfl, "vfl", "run", "--dataset", "bank", "--set", "epochs=1", "--insecure",
               "--out", str(run)]
    else:
        csv = tmp_path / "table.csv"
        synth_table(n=3000).to_csv(csv, index=False)
        job = [*psfl, "synth", "run", "--dataset", str(csv), "--parties", "3", "--epsilon",
               "5", "--insecure", "--engine", "neural", "--set", "engine.iters=20",
               "--out", str(run)]
    script = (f"mount -t tmpfs -o size={size} tmpfs {_q(str(mnt))} || exit 97; "
              + " ".join(_q(a) for a in job)
              + f"; rc=$?; {_q(sys.executable)} -c {_q(CHECK)} {_q(str(run))}; echo RC=$rc")
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                       timeout=280, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = p.stdout.splitlines()
    rc = next(int(x[3:]) for x in lines if x.startswith("RC="))
    files = json.loads(next(x[6:] for x in lines if x.startswith("FILES ")))
    assert rc == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "ENOSPC" in p.stderr, p.stderr[-3000:]
    assert files, "the run directory should hold what was written before the disk filled"
    assert [f for f, whole in files if not whole] == [], files
