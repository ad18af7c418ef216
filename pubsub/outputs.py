"""Result files that exist whole or not at all, and a lock on a run directory.

Shared by both applications (:mod:`parties` and :mod:`synth` may not import each other;
both may import :mod:`pubsub`):

* :func:`write_atomic` and :func:`atomic_output`: a result file is written to a
  temporary file in its own directory (``.<name>.<pid>.<random>.tmp``), flushed, fsynced
  and renamed over its name (``os.replace``, atomic on POSIX), then the directory is
  fsynced. A failure (a full disk, a read-only filesystem, an exception of the code
  writing it) removes the temporary file and leaves the previous file, or none, under
  the name; a crash (kill -9, power loss) can leave at most the hidden temporary file.
  Every ``OSError`` of the write becomes an :class:`OutputError` naming the file and its
  ``errno`` (``ENOSPC``, ``EROFS`` ...), which the commands report in one line (exit 2).
* :class:`RunDirLock`: ``fcntl.flock`` on ``<out>/.lock`` for a run's life, the file
  holding who holds it (pid, host, run id, command, start time). A second run into the
  same directory is refused at once with :class:`RunDirBusy` naming the holder; the
  kernel drops the lock when its process dies, so a dead run's lock is taken over
  without any cleaning. Processes that a holder starts into its directory (a launcher's
  parties) inherit the hold through :data:`LOCK_ENV` and do not lock it again. The lock
  file goes with its holder (and the directory, if the holder made it and left it
  empty: a run refused before it wrote anything leaves nothing behind).
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import fcntl
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from pubsub.errors import BusError

#: the lock file of a run directory
LOCK_FILE = ".lock"
#: environment variable naming the run directories (``os.pathsep``-separated, resolved)
#: that this process or its parent launcher holds; a process started by the holder
#: finds its ``--out`` there and does not lock it again
LOCK_ENV = "PSFL_HELD_RUN_DIRS"


class OutputError(BusError, OSError):
    """A result file (or the run directory's lock) cannot be written.

    Nothing partial is left under the file's name (see :func:`write_atomic`).

    Attributes:
        path: the file that could not be written.
        errno: the operating system's error number (``errno.ENOSPC``, ``errno.EROFS`` ...).
        reason: the operating system's message ("No space left on device").
        what: what could not be done with it ("cannot write", "cannot use ... as the run
            directory").
    """

    def __init__(self, path: str | Path, errno: int | None, reason: str, *,
                 what: str = "cannot write {path}") -> None:
        self.path = str(path)
        self.reason = reason
        self.what = what
        name = errno_mod.errorcode.get(errno or 0, "")
        OSError.__init__(self, errno, f"{what.format(path=self.path)}: {reason}"
                         + (f" ({name})" if name else ""))
        # OSError.__init__ sets errno and strerror; keep the fields named above too
        self.errno = errno

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes
        return (_output_error, (self.path, self.errno, self.reason, self.what))


def _output_error(path: str, errno: int | None, reason: str, what: str) -> OutputError:
    return OutputError(path, errno, reason, what=what)


def output_error(path: str | Path, exc: OSError) -> OutputError:
    """``exc`` (an ``OSError`` of writing ``path``) as an :class:`OutputError`."""
    if isinstance(exc, OutputError):
        return exc
    return OutputError(path, exc.errno, exc.strerror or str(exc))


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # some filesystems do not open directories; the rename still holds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def atomic_output(path: str | Path, *, text: bool = False) -> Iterator[IO[Any]]:
    """A file object to write ``path``'s whole content to; on a normal exit of the
    ``with`` the content replaces ``path`` atomically, on an exception (the writer's own,
    or the disk's) the temporary file is removed and ``path`` is left as it was.

    Args:
        path: the result file (its directory must exist).
        text: a text file object (UTF-8, ``newline=""`` as the csv module wants) instead
            of a binary one.

    Raises:
        OutputError: the file cannot be written (disk full, read-only filesystem, no
            permission, no such directory).
    """
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise output_error(path, exc) from None
    try:
        with (os.fdopen(fd, "w", encoding="utf-8", newline="") if text
              else os.fdopen(fd, "wb")) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise output_error(path, exc) from None
        raise
    _fsync_dir(path.parent)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` (``str``: UTF-8) whole, or leave it as it was (see
    :func:`atomic_output`); returns ``path``.

    Raises:
        OutputError: the file cannot be written.
    """
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    with atomic_output(path) as f:
        f.write(raw)
    return path


def write_json_atomic(path: str | Path, doc: Any) -> Path:
    """``doc`` as indented JSON (numpy values allowed), atomically (:func:`write_atomic`)."""
    return write_atomic(path, orjson.dumps(
        doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str))


def append_line(fd: int, line: bytes, path: str | Path = "") -> None:
    """Append ``line`` (a complete line, ending in a newline) to the file open on ``fd``
    (opened with ``O_APPEND``) with one ``os.write``, so lines of several processes never
    interleave. A short write (the disk filled up in the middle) is cut back off the file
    when nobody appended after it, so the file never ends in a broken line.

    Raises:
        OutputError: the line could not be appended (the file is as it was).
    """
    try:
        n = os.write(fd, line)
    except OSError as exc:
        raise output_error(path, exc) from None
    if n == len(line):
        return
    with contextlib.suppress(OSError):
        end = os.lseek(fd, 0, os.SEEK_CUR)
        if os.fstat(fd).st_size == end:
            os.ftruncate(fd, end - n)
    raise OutputError(path, errno_mod.ENOSPC, f"only {n} of {len(line)} bytes of a line "
                      "could be appended (the line was removed)")


def append_to(path: str | Path, line: bytes) -> None:
    """Append one complete line to the file at ``path`` (created if missing) with
    :func:`append_line`: whole beside other processes' lines, or not at all.

    Raises:
        OutputError: it could not be appended (the file is as it was).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise output_error(path, exc) from None
    try:
        append_line(fd, line, path)
    finally:
        os.close(fd)


class RunDirBusy(BusError, RuntimeError):
    """Another run holds the run directory's lock.

    Attributes:
        path: the run directory.
        holder: what the lock file says of its holder (``pid``, ``host``, ``run_id``,
            ``command``, ``started``); empty when it could not be read.
    """

    def __init__(self, path: str | Path, holder: dict[str, Any]) -> None:
        self.path = str(path)
        self.holder = dict(holder)
        who = ", ".join(f"{k} {holder[k]}" for k in ("pid", "host", "run_id", "command",
                                                     "started") if holder.get(k))
        super().__init__(f"the run directory {self.path} is in use by another run "
                         f"({who or 'holder unknown'}); wait for it to end or give "
                         "another --out")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.holder))


_HELD: dict[str, int] = {}  # resolved run directory -> holds in this process
_RECORDS: dict[str, tuple[int, dict[str, Any]]] = {}  # -> (lock fd, holder record)
_HELD_LOCK = threading.Lock()


def _held_paths() -> list[str]:
    return [p for p in os.environ.get(LOCK_ENV, "").split(os.pathsep) if p]


def read_holder(run_dir: str | Path) -> dict[str, Any]:
    """What ``<run_dir>/.lock`` says of its holder (empty when unreadable; the lock itself
    is the ``flock``, not the content)."""
    try:
        doc = orjson.loads((Path(run_dir) / LOCK_FILE).read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _write_record(fd: int, record: dict[str, Any]) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, orjson.dumps(record) + b"\n", 0)


class RunDirLock:
    """An exclusive lock on a run directory for a run's life (a context manager).

    ``with RunDirLock(out, run_id=..., command="psfl vfl run"):`` creates ``out``, takes
    ``flock(LOCK_EX | LOCK_NB)`` on ``out/.lock`` and writes the holder's record there;
    the lock goes with the ``with`` (the file is removed, and ``out`` too when this made
    it and it is empty) or with the process (the file stays, unlocked, and the next run
    takes it over). Re-entering a directory this
    process holds, or one its launcher holds (:data:`LOCK_ENV`), takes nothing.

    Raises (on entry):
        RunDirBusy: another process holds it.
        OutputError: the directory or its lock file cannot be created or written.
    """

    def __init__(self, run_dir: str | Path, *, run_id: str | None = None,
                 command: str = "") -> None:
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.command = command or Path(sys.argv[0]).name
        self._fd: int | None = None
        self._key = ""
        self._mine = False
        self._created = False

    def __enter__(self) -> RunDirLock:
        created = not self.run_dir.exists()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = ("it is not a directory" if isinstance(exc, FileExistsError)
                      else exc.strerror or str(exc))
            raise OutputError(self.run_dir, exc.errno, reason,
                              what="cannot use {path} as the run directory") from None
        self._key = str(self.run_dir.resolve())
        try:
            self._take(created)
        except BaseException:
            if created:  # a refused run leaves no directory behind
                with contextlib.suppress(OSError):
                    self.run_dir.rmdir()
            raise
        return self

    def _take(self, created: bool) -> None:
        with _HELD_LOCK:
            if self._key in _HELD:
                _HELD[self._key] += 1
                fd, record = _RECORDS[self._key]
                if self.run_id and not record.get("run_id"):  # the launcher chose it now
                    record["run_id"] = self.run_id
                    with contextlib.suppress(OSError):
                        _write_record(fd, record)
                return
            if self._key in _held_paths():  # our launcher holds it for us
                return
            path = self.run_dir / LOCK_FILE
            for _ in range(100):  # bounded: each retry means another holder just left
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                except OSError as exc:
                    raise output_error(path, exc) from None
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    raise RunDirBusy(self.run_dir, read_holder(self.run_dir)) from None
                except OSError:  # a filesystem without flock: run unlocked rather than not
                    os.close(fd)
                    return
                # the file locked must still be the one under the name: a holder unlinks
                # it as it leaves, and then the new file is the lock
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
            else:
                raise RunDirBusy(self.run_dir, read_holder(self.run_dir))
            record = {"pid": os.getpid(), "host": socket.gethostname(),
                      "run_id": self.run_id, "command": self.command,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            try:
                _write_record(fd, record)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    path.unlink()
                os.close(fd)
                raise output_error(path, exc) from None
            self._fd = fd
            self._mine = True
            self._created = created
            _HELD[self._key] = 1
            _RECORDS[self._key] = (fd, record)
            os.environ[LOCK_ENV] = os.pathsep.join([*_held_paths(), self._key])

    def __exit__(self, *exc: object) -> None:
        with _HELD_LOCK:
            if self._key not in _HELD:
                return
            _HELD[self._key] -= 1
            if _HELD[self._key] > 0 or not self._mine:
                return
            del _HELD[self._key]
            _RECORDS.pop(self._key, None)
            os.environ[LOCK_ENV] = os.pathsep.join(p for p in _held_paths()
                                                   if p != self._key)
            if not os.environ[LOCK_ENV]:
                del os.environ[LOCK_ENV]
            fd, self._fd = self._fd, None
            if fd is not None:
                # unlinked while still locked: a process that opened it meanwhile finds
                # it is no longer the file under the name (_take) and opens the new one
                with contextlib.suppress(OSError):
                    (self.run_dir / LOCK_FILE).unlink()
                os.close(fd)  # the flock goes with the last descriptor
                if self._created:  # a run refused before it wrote anything: no directory
                    with contextlib.suppress(OSError):
                        self.run_dir.rmdir()


__all__ = ["LOCK_ENV", "LOCK_FILE", "OutputError", "RunDirBusy", "RunDirLock", "append_line",
           "append_to",
           "atomic_output", "output_error", "read_holder", "write_atomic",
           "write_json_atomic"]
