"""A second run into a run directory that another run holds is refused at once (exit 2,
one line naming the holder, nothing of the first run touched): ``psfl vfl run``,
``psfl synth run`` and ``psfl vfl party --out``, against a holder process that keeps the
directory's lock (:class:`pubsub.outputs.RunDirLock`) the way a running job does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

_HOLDER = """
import sys
from pathlib import Path
from pubsub.outputs import RunDirLock
out = Path(sys.argv[1])
with RunDirLock(out, run_id="first", command="psfl vfl run"):
    (out / "metrics.json").write_text('{"first": true}')
    print("held", flush=True)
    sys.stdin.readline()  # until the test closes our stdin (or its deadline kills us)
"""

#: ``psfl ARGS`` (sim.cli.main), saying whether torch was imported on the way
_PSFL = """
import sys
from sim.cli import main
try:
    code = main(sys.argv[1:])
finally:
    print("imported torch:", "torch" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture
def held(tmp_path: Path):  # type: ignore[no-untyped-def]
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PSFL_HELD_RUN_DIRS", None)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], cwd=REPO, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield out, holder.pid, env
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        try:
            holder.wait(30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait(30)
    assert not (out / ".lock").exists()  # the holder's lock went with it


def _refused(args: list[str], out: Path, pid: int, env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert f"pid {pid}" in r.stderr and "run_id first" in r.stderr
    assert str(out) in r.stderr and "in use by another run" in r.stderr
    assert (out / "metrics.json").read_text() == '{"first": true}'  # untouched
    assert sorted(p.name for p in out.iterdir()) == [".lock", "metrics.json"]
    return r.stderr


def test_a_second_vfl_run_into_a_held_directory_is_refused_at_once(held) -> None:  # type: ignore[no-untyped-def]
    out, pid, env = held
    err = _refused(["-c", _PSFL, "vfl", "run", "--dataset", "bank", "--set", "epochs=1",
                    "--out", str(out), "--timeout-s", "60"], out, pid, env)
    assert "imported torch: False" in err  # before the data checks and the training stack
    _refused(["-c", _PSFL, "synth", "run", "--dataset", "bank", "--out", str(out),
              "--timeout-s", "60"], out, pid, env)


def test_a_party_with_out_into_a_held_directory_is_refused(held) -> None:  # type: ignore[no-untyped-def]
    out, pid, env = held
    _refused(["-m", "parties", "active", "--broker", "tcp://127.0.0.1:9", "--run-id", "second",
              "--out", str(out), "--insecure"], out, pid, env)
