"""pubsub.outputs: result files whole or not at all, JSON lines appended whole, and the
run directory's lock."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import orjson
import pytest

from pubsub import outputs
from pubsub.cli import BAD_INPUT_ERRORS, EXIT_BAD_INPUT, run_guarded
from pubsub.outputs import (LOCK_ENV, OutputError, RunDirBusy, RunDirLock, atomic_output,
                            read_holder, write_atomic, write_json_atomic)

from tests.conftest import REPO


def _only(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


def test_write_atomic_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "metrics.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2, "b": [1, 2]})
    assert orjson.loads(path.read_bytes()) == {"a": 2, "b": [1, 2]}
    assert _only(tmp_path) == ["metrics.json"]
    write_atomic(tmp_path / "config.toml", "[vfl]\n")
    assert (tmp_path / "config.toml").read_text() == "[vfl]\n"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, code):
    path = tmp_path / "synthetic.csv"
    path.write_text("old,whole\n")

    def full_disk(fd):  # the data went to the page cache; the disk says no at fsync
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OutputError) as info:
        with atomic_output(path, text=True) as f:
            f.write("a,b\n" * 50_000)
    monkeypatch.undo()
    err = info.value
    assert err.path == str(path) and err.errno == code
    assert errno.errorcode[code] in str(err) and str(path) in str(err)
    assert isinstance(err, OSError) and isinstance(err, BAD_INPUT_ERRORS)
    assert path.read_text() == "old,whole\n"
    assert _only(tmp_path) == ["synthetic.csv"]


def test_a_write_cut_short_by_the_filesystem_leaves_nothing(tmp_path):
    """A real failure in the middle of the data (a file-size limit: EFBIG, as ENOSPC
    would be on a full disk) in a child process."""
    path = tmp_path / "synthetic.csv"
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from pubsub.outputs import OutputError, atomic_output
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        try:
            with atomic_output({str(path)!r}, text=True) as f:
                for _ in range(20_000):
                    f.write("1.25,abc,0\\n" * 10)
        except OutputError as exc:
            print(exc.errno, exc.path)
            sys.exit(2)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.split() == [str(errno.EFBIG), str(path)]
    assert _only(tmp_path) == []


def test_a_failed_rename_removes_the_temporary_and_nothing_is_under_the_name(
        tmp_path, monkeypatch):
    path = tmp_path / "passive.json"

    def erofs(src, dst):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", erofs)
    with pytest.raises(OutputError) as info:
        write_json_atomic(path, {"x": 1})
    assert info.value.errno == errno.EROFS
    assert _only(tmp_path) == []


def test_the_writers_own_exception_leaves_nothing(tmp_path):
    path = tmp_path / "predictions.csv"
    with pytest.raises(KeyError):
        with atomic_output(path) as f:
            f.write(b"id,p\n")
            raise KeyError("the writer failed")
    assert _only(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_directory_is_an_output_error_naming_the_file(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        with pytest.raises(OutputError) as info:
            write_atomic(d / "metrics.json", b"{}")
        assert info.value.errno == errno.EACCES and info.value.path == str(d / "metrics.json")
        assert list(d.iterdir()) == []
    finally:
        d.chmod(0o755)


def test_run_guarded_reports_an_output_error_in_one_line(tmp_path, capsys):
    def fail() -> int:
        raise OutputError(tmp_path / "metrics.json", errno.ENOSPC, "No space left on device")

    assert run_guarded(fail) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ENOSPC" in err and "metrics.json" in err


def test_append_line_cuts_a_short_write_back_off(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        outputs.append_line(fd, b'{"event":"a"}\n', path)
        real_write = os.write
        monkeypatch.setattr(os, "write", lambda f, data: real_write(f, data[:5]))
        with pytest.raises(OutputError) as info:
            outputs.append_line(fd, b'{"event":"b"}\n', path)
        monkeypatch.undo()
        assert info.value.errno == errno.ENOSPC
        outputs.append_line(fd, b'{"event":"c"}\n', path)
    finally:
        os.close(fd)
    assert path.read_bytes() == b'{"event":"a"}\n{"event":"c"}\n'


def test_the_events_sink_loses_events_whole_and_says_so_once(tmp_path, monkeypatch, capsys):
    from pubsub.logs import _JsonlSink

    path = tmp_path / "events.jsonl"
    sink = _JsonlSink(path, 20)
    try:
        sink(None, "info", {"event": "run.start", "n": 1})
        real_write = os.write

        def full(fd, data):
            if fd == sink.fd:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", full)
        for i in range(3):
            sink(None, "warning", {"event": "run.lost", "i": i})
        monkeypatch.undo()
        sink(None, "info", {"event": "run.end"})
    finally:
        sink.close()
    lines = path.read_bytes().splitlines()
    assert [orjson.loads(x)["event"] for x in lines] == ["run.start", "run.end"]
    assert sink.lost == 3
    assert capsys.readouterr().err.count("events are being lost") == 1


def test_the_lock_refuses_a_second_holder_and_names_the_first(tmp_path):
    out = tmp_path / "run"
    with RunDirLock(out, run_id="r1", command="psfl vfl run"):
        holder = read_holder(out)
        assert holder["pid"] == os.getpid() and holder["run_id"] == "r1"
        assert str(out.resolve()) in os.environ[LOCK_ENV].split(os.pathsep)
        with RunDirLock(out, run_id="r1"):  # re-entered in this process: nothing taken
            pass
        # another holder (a child started without our hold): refused at once
        script = textwrap.dedent(f"""
            import os, sys
            os.environ.pop({LOCK_ENV!r}, None)
            from pubsub.outputs import RunDirBusy, RunDirLock
            try:
                with RunDirLock({str(out)!r}, run_id="r2"):
                    sys.exit(0)
            except RunDirBusy as exc:
                print(exc.holder["pid"], exc.holder["run_id"], exc)
                sys.exit(2)
        """)
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 2, r.stderr
        pid, run_id, msg = r.stdout.split(" ", 2)
        assert int(pid) == os.getpid() and run_id == "r1"
        assert str(out) in msg and "in use by another run" in msg
        # the launcher's own children inherit the hold and take nothing
        r = subprocess.run([sys.executable, "-c", script.replace(
            f"os.environ.pop({LOCK_ENV!r}, None)", "")], capture_output=True, text=True,
            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 0, r.stdout + r.stderr
    assert LOCK_ENV not in os.environ
    assert not out.exists()  # the lock file went with its holder, and the directory it made
    with RunDirLock(out, run_id="r3"):  # free again
        assert read_holder(out)["run_id"] == "r3"
        (out / "metrics.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]  # a run's files stay


def test_a_dead_holders_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    script = (f"import os; from pubsub.outputs import RunDirLock; "
              f"RunDirLock({str(out)!r}, run_id='dead').__enter__(); os._exit(0)")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    assert read_holder(out)["run_id"] == "dead"  # its record stays; its flock went with it
    with RunDirLock(out, run_id="alive"):
        assert read_holder(out)["run_id"] == "alive"


def test_a_lock_file_unlinked_by_its_leaving_holder_is_not_the_lock(tmp_path, monkeypatch):
    """A process that opened ``.lock`` just before its holder removed it and left must
    not hold the removed file while another holds the new one."""
    import fcntl

    out = tmp_path / "run"
    out.mkdir()
    real_flock = fcntl.flock
    swapped = []

    def flock_after_the_holder_left(fd, op):
        if not swapped:  # the file this process opened is removed and a new one locked
            swapped.append(True)
            (out / ".lock").unlink()
            other = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)
            real_flock(other, fcntl.LOCK_EX)
            swapped.append(other)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_holder_left)
    with pytest.raises(RunDirBusy):
        with RunDirLock(out, run_id="late"):
            pass
    os.close(swapped[1])


def test_two_descriptors_in_one_process_conflict_without_the_registry(tmp_path):
    import fcntl

    out = tmp_path / "run"
    with RunDirLock(out, run_id="r1"):
        fd = os.open(out / ".lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    err = RunDirBusy(out, {"pid": 7, "host": "h", "run_id": "x"})
    assert "pid 7" in str(err) and "run_id x" in str(err) and err.path == str(out)


def test_append_to_appends_whole_lines_and_names_the_file_it_cannot(tmp_path):
    path = tmp_path / "events.jsonl"
    outputs.append_to(path, b'{"event":"a"}\n')
    outputs.append_to(path, b'{"event":"b"}\n')
    assert path.read_bytes() == b'{"event":"a"}\n{"event":"b"}\n'
    with pytest.raises(OutputError) as info:
        outputs.append_to(tmp_path / "missing" / "events.jsonl", b"{}\n")
    assert info.value.errno == errno.ENOENT and "missing" in info.value.path


def test_a_file_given_as_the_run_directory_is_named_as_such(tmp_path):
    import pickle

    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(OutputError) as info:
        with RunDirLock(f):
            pass
    err = info.value
    assert str(err) == f"cannot use {f} as the run directory: it is not a directory (EEXIST)"
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.errno == errno.EEXIST and again.path == str(f)
