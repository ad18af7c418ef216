"""Party processes forked from a fork server that has already imported what a party
imports (:mod:`parties.runtime.preload`): the launchers' parties (:mod:`sim.launch.vfl`) and the
profile and sweep children (:mod:`parties.planning.profile`, :mod:`parties.planning.sweep`).

This module itself imports nothing heavy (launchers import it without torch).

A launcher that starts parties as ``python -m parties`` pays each party's imports
(torch, ``torch._dynamo``, pandas, scikit-learn: about 6 s of CPU) once per party; forked
from this server it pays them once per launcher process, and the parties start in
milliseconds. The server is ``multiprocessing``'s fork server: it is itself a fresh
interpreter (never a fork of the launcher, whose threads and sockets it does not share)
that imports :mod:`parties.runtime.preload` and then forks one child per request; each child is a
real, separate process with its own pid, exit code and signals, so everything a launcher
does with a party process (wait, SIGTERM, kill, exit codes) is unchanged.

A child writes to the launcher's standard output and error as they are when it starts
(the descriptors are passed to it) and gets the launcher's environment as it is then, like
a child the launcher would exec.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: modules the fork server imports before it forks any party
PRELOAD = ("parties.runtime.preload", "parties.cli")

_CTX: Any = None


#: most bytes of a Unix socket path (Linux: 108 with the NUL); multiprocessing's fork
#: server listens on ``<temp dir>/pymp-XXXXXXXX/listener-XXXXXXXX``
_MAX_SOCKET_DIR = 60


def short_socket_dir() -> None:
    """Make ``multiprocessing`` keep its sockets in a short directory when the temporary
    directory (``TMPDIR``) is long: a fork server's socket path past 108 bytes fails to
    bind (``OSError: AF_UNIX path too long``). ``multiprocessing`` chooses its directory
    once per process; this makes that choice under ``/tmp`` when needed and leaves
    :mod:`tempfile`'s own default as it was."""
    import tempfile
    from multiprocessing import process, util

    if "tempdir" in process.current_process()._config:  # chosen already
        return
    if len(tempfile.gettempdir()) <= _MAX_SOCKET_DIR or not os.access("/tmp", os.W_OK):
        return
    saved = tempfile.tempdir
    tempfile.tempdir = "/tmp"
    try:
        util.get_temp_dir()
    finally:
        tempfile.tempdir = saved


def context() -> Any:
    """The fork-server context whose server preloads :data:`PRELOAD`.

    ``multiprocessing`` has one fork server per process: if another part of this
    process (:func:`parties.runtime.workers.mp_context`) started it first with a shorter preload,
    parties are still forked from it, and import what it lacks themselves."""
    global _CTX
    if _CTX is None:
        short_socket_dir()
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        _CTX = ctx
    return _CTX


def warm() -> None:
    """Start the fork server now, if it is not running; returns at once (the server
    imports in the background; the first :func:`start` waits for it)."""
    context()
    from multiprocessing import forkserver

    forkserver.ensure_running()


class Child:
    """A forked party behind the part of ``subprocess.Popen``'s interface the launchers
    use (``pid``, ``poll``, ``send_signal``, ``kill``, ``wait``, ``returncode``)."""

    def __init__(self, proc: Any) -> None:
        self._proc = proc

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None and self._proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, sig)

    def kill(self) -> None:
        self._proc.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self._proc.name, timeout or 0.0)
        return self._proc.exitcode


class _ParentFd:
    """The parent's file descriptor ``fd`` as the child receives it (pickled: the fork
    server passes the descriptor itself, as ``multiprocessing`` passes sockets)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return int(dup.detach())


def _child(target: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
           env: Mapping[str, str] | None, setup: Sequence[Callable[[], Any]],
           stdio: Sequence[int]) -> None:
    # standard output and error: the launcher's at this start, as for a child it execs
    # (not the server's, which are the launcher's when the server started)
    for fd, target_fd in zip(stdio, (1, 2), strict=True):
        if fd != target_fd:
            os.dup2(fd, target_fd)
            os.close(fd)
    for fn in setup:
        fn()
    if env is not None:  # the launcher's environment now, not the server's at its start
        os.environ.clear()
        os.environ.update(env)
    target(*args, **kwargs)


def start(target: Callable[..., Any], *, args: Sequence[Any] = (),
          kwargs: Mapping[str, Any] | None = None, name: str,
          env: Mapping[str, str] | None = None,
          setup: Sequence[Callable[[], Any]] = ()) -> Child:
    """Fork ``target(*args, **kwargs)`` from the fork server (started if needed; the
    first call waits for its imports). ``target``, its arguments and ``setup`` are
    pickled: they must be importable (module-level functions, ``functools.partial`` of
    them), as for ``multiprocessing``'s spawn. In the child, standard output and error
    become the caller's current ones, each ``setup`` callable runs (joining a CPU or
    memory group, say), the environment becomes the caller's current one plus ``env``,
    then ``target`` runs."""
    stdio = (_ParentFd(1), _ParentFd(2))
    child_env = {**os.environ, **(env or {})}
    proc = context().Process(target=_child, args=(target, tuple(args), dict(kwargs or {}),
                                                  child_env, tuple(setup), stdio),
                             name=name)
    proc.start()
    return Child(proc)


__all__ = ["Child", "PRELOAD", "context", "start", "warm"]
