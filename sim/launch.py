"""Launch a VFL run as separate OS processes: broker, passive party, active party.

The launcher owns the child processes: if any child fails, the others are
terminated and the failure is reported with the child's exit code; every wait
has a deadline; children never outlive the launcher.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from parties.cli import ExitCode, write_json
from parties.config import VflConfig, dump_vfl_config
from parties.preflight import preflight
from pubsub.config import to_mapping
from pubsub.control import control_request


class JobTimeout(RuntimeError):
    """The job ran past ``timeout_s``; every child was stopped.

    Attributes:
        timeout_s: the limit, seconds.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        super().__init__(f"the job was still running after --timeout-s {timeout_s:g} s; "
                         "stopped the broker and both parties")


class OutDirError(OSError):
    """The run directory cannot be created or written."""


class _Terminated(BaseException):
    """SIGTERM arrived: stop the children and exit. A BaseException, like
    KeyboardInterrupt: callers that catch ``Exception`` to go on after a failed run
    (``bench/vfl_table.py``) must not swallow a request to stop."""


class LaunchError(RuntimeError):
    """A child process failed.

    Attributes:
        role: ``"broker"``, ``"active"`` or ``"passive"``.
        code: its exit code (or None on a launcher timeout).
    """

    def __init__(self, role: str, code: int | None, detail: str = "") -> None:
        self.role = role
        self.code = code
        super().__init__(f"{role} exited with code {code}{': ' + detail if detail else ''}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResult:
    """Outcome of :func:`run_vfl`.

    Attributes:
        metrics: the run's metrics (also in ``out/metrics.json``).
        out: the run directory.
    """

    metrics: dict[str, Any]
    out: Path


def _spawn(args: list[str], *, quiet: bool = False) -> subprocess.Popen[bytes]:
    """Start a child process. A ``python -m PKG`` child gets ``-P``: without it the
    current directory comes first on ``sys.path``, so a stray ``synth/`` or ``parties/``
    directory there (an older checkout, say) would run instead of the installed code
    while the launcher runs the installed one."""
    if len(args) > 2 and args[0] == sys.executable and args[1] == "-m":
        args = [args[0], "-P", *args[1:]]
    return subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=None,
        start_new_session=False,
    )


def start_broker(out: Path, events: Path, *, timeout_s: float = 20.0,
                 host: str = "127.0.0.1") -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m broker run`` on free ports; return the process and its address.

    Raises:
        LaunchError: it exited or did not become ready within ``timeout_s``.
    """
    ready = out / "broker.addr"
    ready.unlink(missing_ok=True)
    proc = _spawn([sys.executable, "-m", "broker", "run", "--bind", f"tcp://{host}:0",
                   "--ready-file", str(ready), "--events", str(events),
                   "--log-level", "warning"], quiet=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready.exists():
            return proc, ready.read_text().strip()
        code = proc.poll()
        if code is not None:
            raise LaunchError("broker", code)
        time.sleep(0.02)
    proc.kill()
    raise LaunchError("broker", None, f"not ready within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


def run_vfl(cfg: VflConfig, out: str | Path, *, broker: str | None = None,
            run_id: str | None = None, quiet: bool = False,
            timeout_s: float | None = None) -> LaunchResult:
    """Run a two-party VFL job as three processes and collect ``out/metrics.json``.

    Args:
        cfg: effective config (written to ``out/config.toml``).
        out: run directory (created; an existing one is reused, files overwritten).
        broker: use this running broker instead of starting one.
        run_id: topic namespace (default: random).
        quiet: no per-epoch lines from the active party.
        timeout_s: kill everything after this long (default: no job-level limit;
            the parties' own deadlines still apply).

    Returns:
        :class:`LaunchResult`.

    Raises:
        LaunchError: a child failed (its code is carried; its stderr went to ours).
        JobTimeout: ``timeout_s`` passed.
        OutDirError: ``out`` cannot be created or written.
        pubsub.BrokerUnreachable: ``broker`` was given and does not answer.
        parties.data.DataError: the data or column split is invalid (checked first).
    """
    t0 = time.perf_counter()
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        events = out / "events.jsonl"
        events.write_text("")
        # results of an earlier run in this directory go, so it never mixes two runs
        for stale in ("metrics.json", "passive.json", "broker.addr"):
            (out / stale).unlink(missing_ok=True)
        (out / "config.toml").write_text(dump_vfl_config(cfg))
    except OSError as exc:
        raise OutDirError(f"cannot use {str(out)!r} as the run directory: "
                          f"{exc.strerror or exc}") from None
    run_id = run_id or uuid.uuid4().hex[:8]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    previous = signal.getsignal(signal.SIGTERM)

    def _on_term(*_: Any) -> None:
        raise _Terminated

    if threading_main():
        signal.signal(signal.SIGTERM, _on_term)
    try:
        if broker is None:
            procs["broker"], broker = start_broker(out, events)
        else:
            # fail fast, with one line, if nobody answers there
            control_request(broker, "ping", timeout_s=cfg.connect_timeout_s)
        common = ["--config", str(out / "config.toml"), "--broker", broker, "--run-id", run_id,
                  "--out", str(out), "--events", str(events)]
        for role in ("passive", "active"):
            extra = ["--quiet"] if (quiet or role == "passive") else []
            procs[role] = _spawn([sys.executable, "-m", "parties", role, *common, *extra])
        # Check the data here while the parties start (they import torch meanwhile):
        # a bad file or column is reported once, by us, and the children are stopped.
        preflight(cfg)
        wait_children({r: procs[r] for r in ("active", "passive")},
                      watch={"broker": procs["broker"]} if "broker" in procs else None,
                      timeout_s=timeout_s)
    finally:
        for role in ("active", "passive", "broker"):
            if role in procs:
                _stop(procs[role])
        if threading_main():
            signal.signal(signal.SIGTERM, previous)
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    metrics["wall_s"] = time.perf_counter() - t0
    metrics["config"] = to_mapping(cfg)
    write_json(out / "metrics.json", metrics)
    return LaunchResult(metrics=metrics, out=out)


def wait_children(procs: dict[str, subprocess.Popen[bytes]], *,
                  watch: dict[str, subprocess.Popen[bytes]] | None = None,
                  timeout_s: float | None = None, poll_s: float = 0.05) -> None:
    """Wait until every process in ``procs`` has exited with code 0.

    Args:
        procs: role -> process; all must finish.
        watch: role -> process that must stay alive meanwhile (e.g. the broker).
        timeout_s: overall deadline, seconds (None: no limit).
        poll_s: polling period, seconds.

    Raises:
        LaunchError: a process in ``procs`` exited non-zero, or one in ``watch`` exited.
        JobTimeout: ``timeout_s`` passed first.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending = set(procs)
    while pending:
        for role in sorted(pending):
            code = procs[role].poll()
            if code is None:
                continue
            pending.discard(role)
            if code != 0:
                raise LaunchError(role, code)
        for role, proc in (watch or {}).items():
            if proc.poll() is not None:
                raise LaunchError(role, proc.returncode, "died during the run")
        if deadline is not None and time.monotonic() > deadline:
            assert timeout_s is not None
            raise JobTimeout(timeout_s)
        time.sleep(poll_s)


def threading_main() -> bool:
    """True in the main thread (only there may signal handlers be installed)."""
    import threading

    return threading.current_thread() is threading.main_thread()


def exit_code_of(err: LaunchError) -> int:
    """The launcher's exit code for a child failure (the child's own code when it has one)."""
    if err.code in {int(c) for c in ExitCode}:
        return int(err.code)  # type: ignore[arg-type]
    return int(ExitCode.FAILED)


__all__ = ["JobTimeout", "LaunchError", "LaunchResult", "OutDirError", "exit_code_of", "run_vfl",
           "start_broker", "wait_children"]
