"""The party fork server (parties.core.zygote): a forked child is its own process with its
own exit code, signals, environment and setup; ``python -m parties`` forked from it keeps
the command line's exit codes."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parties.core import zygote


def _write_and_exit(path: str, code: int) -> None:
    Path(path).write_text(f"{os.getpid()} {os.environ.get('PSFL_ZYGOTE_TEST', '')}")
    sys.exit(code)


def _append(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _sleep_forever() -> None:
    while True:
        time.sleep(1)


def test_a_forked_child_has_its_own_pid_exit_code_env_and_setup(tmp_path: Path) -> None:
    out, log = tmp_path / "out.txt", tmp_path / "setup.txt"
    child = zygote.start(_write_and_exit, args=(str(out), 3), name="t-exit",
                         env={"PSFL_ZYGOTE_TEST": "yes"},
                         setup=[functools.partial(_append, str(log), "a"),
                                functools.partial(_append, str(log), "b")])
    assert child.wait(60) == 3 and child.returncode == 3 and child.poll() == 3
    pid, env = out.read_text().split()
    assert int(pid) == child.pid != os.getpid() and env == "yes"
    assert log.read_text() == "ab"  # setup ran, in order, before the target
    assert "PSFL_ZYGOTE_TEST" not in os.environ  # the launcher's environment is untouched


def _write_env(path: str, key: str) -> None:
    Path(path).write_text(os.environ.get(key, "<unset>"))


def test_a_child_gets_the_callers_environment_as_it_is_now(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # set after the fork server started (conftest starts it at the session's start)
    monkeypatch.setenv("PSFL_ZYGOTE_LATE", "late")
    out = tmp_path / "env.txt"
    assert zygote.start(_write_env, args=(str(out), "PSFL_ZYGOTE_LATE"),
                        name="t-env").wait(60) == 0
    assert out.read_text() == "late"


def test_signals_reach_the_child_and_wait_has_a_deadline() -> None:
    child = zygote.start(_sleep_forever, name="t-sleep")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.2)
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == -signal.SIGTERM
        child.send_signal(signal.SIGTERM)  # an exited child: no error
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)


def test_python_m_parties_forked_keeps_its_exit_codes(tmp_path: Path) -> None:
    from sim.launch.vfl import spawn_party_cli

    # argparse's usage error (2) and an unreadable config (a ConfigError: 2, one line)
    bad_role = spawn_party_cli(["referee"], name="t-usage")
    assert bad_role.wait(60) == 2
    missing = spawn_party_cli(["active", "--config", str(tmp_path / "nope.toml"),
                               "--broker", "tcp://127.0.0.1:1", "--insecure"],
                              name="t-config")
    assert missing.wait(60) == 2


def _say(text: str) -> None:
    print(f"out {text}", flush=True)
    print(f"err {text}", file=sys.stderr, flush=True)


def test_a_child_writes_to_the_callers_current_output(capfd: pytest.CaptureFixture[str]
                                                       ) -> None:
    # the fork server started earlier, with other descriptors as its output (this
    # session's first test's capture, or a terminal): the child writes to ours, now
    capfd.readouterr()
    assert zygote.start(_say, args=("hello",), name="t-say").wait(60) == 0
    out, err = capfd.readouterr()
    assert "out hello" in out and "err hello" in err


def test_a_long_tmpdir_still_starts_the_fork_server(tmp_path: Path) -> None:
    # a Unix socket path is at most 108 bytes; multiprocessing puts its fork server's in
    # the temporary directory (a psfl run under a deep TMPDIR failed: "AF_UNIX path too
    # long")
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    code = ("import tempfile, sys; from parties.core import zygote; zygote.warm(); "
            "c = zygote.start(print, args=('forked',), name='t'); sys.exit(c.wait(60)); ")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TMPDIR": str(deep)})
    assert res.returncode == 0 and "forked" in res.stdout, res.stderr[-2000:]
