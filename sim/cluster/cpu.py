"""Per-party CPU shares for the heterogeneity simulator.

A party gets a share of this machine's cores, e.g. ``"50:14"`` of a 64-core testbed
scaled to 2 cores here → 1.5625 and 0.4375 cores (:func:`scale_shares`). A
:class:`CpuLimiter` enforces one share on a group of processes:

* ``cgroup-v2``: a child group with ``cpu.max = "<quota_us> <period_us>"``; usage from
  ``cpu.stat`` ``usage_usec``. Needs the ``cpu`` controller in the unified hierarchy and
  the right to enable it in the parent's ``cgroup.subtree_control``.
* ``cgroup-v1``: a child group in the ``cpu`` hierarchy with ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us`` (``cpu.cfs_burst_us`` set to 0 when present), plus a twin group in
  the ``cpuacct`` hierarchy (``cpuacct.usage``, ns) for the usage.

Both cgroup methods also set the group's weight to that of ``cores`` busy tasks
(``cpu.shares = 1024 * cores``, ``cpu.weight = 100 * cores``): the quota is a ceiling,
and on a busy host the weight decides how close to it each group gets.
* ``duty-cycle``: the fallback when cgroups are not writable. A background thread
  SIGCONTs the tracked processes for ``cores / ceil(cores)`` of every period and SIGSTOPs
  them for the rest; their CPU affinity is set to ``ceil(cores)`` CPUs. Usage from psutil.
* ``none``: nothing is enforced; usage is still measured (psutil).

Groups live in a ``psfl`` directory under the creating process's own cgroup and are
named ``psfl-<name>-<pid>-<counter>``; :meth:`CpuLimiter.close` moves remaining tasks
back to the creator's group and removes the group (also at interpreter exit). Groups left
by a dead creator (SIGKILL) are removed by the next :meth:`CpuLimiter.create`.

Typical use with :func:`subprocess.Popen`::

    with CpuLimiter.create("active", 1.5625) as lim:
        proc = subprocess.Popen(args, preexec_fn=lim.preexec())
        ...
"""

from __future__ import annotations

import atexit
import errno
import functools
import itertools
import math
import os
import re
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil
import structlog

log = structlog.get_logger(__name__)

Method = Literal["auto", "cgroup-v2", "cgroup-v1", "duty-cycle", "none"]
METHODS: tuple[str, ...] = ("auto", "cgroup-v2", "cgroup-v1", "duty-cycle", "none")

#: Kernel limits for CFS bandwidth control (kernel/sched/core.c): quota >= 1 ms,
#: 1 ms <= period <= 1 s.
MIN_QUOTA_US = 1000
MIN_PERIOD_US = 1000
MAX_PERIOD_US = 1_000_000

PARENT_DIR = "psfl"
GROUP_PREFIX = "psfl-"

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_MOUNTINFO = Path("/proc/self/mountinfo")
_PROC_CGROUP = Path("/proc/self/cgroup")


# --------------------------------------------------------------------------- errors


class ShareError(ValueError):
    """A CPU share or share ratio is malformed or not positive.

    Attributes:
        value: the offending value (as given).
        reason: what is wrong with it.
    """

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"bad CPU share {value!r}: {reason}")


class CpuLimitUnavailable(RuntimeError):
    """The requested limiting method cannot be used on this machine.

    Attributes:
        method: the method that was requested (``"cgroup-v1"``, ...).
        path: the file or directory that was missing or not writable (or None).
        reason: why.
    """

    def __init__(self, method: str, path: Path | str | None, reason: str) -> None:
        self.method = method
        self.path = None if path is None else Path(path)
        self.reason = reason
        where = f" ({self.path})" if self.path is not None else ""
        super().__init__(f"CPU limiting method {method!r} not available{where}: {reason}")


# --------------------------------------------------------------------------- pure helpers


def machine_cores() -> int:
    """Number of CPUs this process may run on (its affinity mask), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _check_cores(cores: float, what: object | None = None) -> float:
    try:
        value = float(cores)
    except (TypeError, ValueError) as exc:
        raise ShareError(cores if what is None else what, "not a number") from exc
    if not math.isfinite(value):
        raise ShareError(cores if what is None else what, "not finite")
    if value <= 0:
        raise ShareError(cores if what is None else what, "must be > 0")
    return value


def scale_shares(ratio: str | Sequence[float], total_cores: float) -> tuple[float, ...]:
    """Scale a share ratio to this machine's cores.

    Args:
        ratio: ``"50:14"`` (parts separated by ``:``, each a positive number) or a
            sequence of positive numbers. Only the proportions matter: ``"50:14"`` of a
            64-core testbed and ``"25:7"`` give the same shares.
        total_cores: the cores to divide (e.g. :func:`machine_cores`), > 0.

    Returns:
        One share per part, in cores; they sum to ``total_cores``
        (``scale_shares("50:14", 2) == (1.5625, 0.4375)``).

    Raises:
        ShareError: a malformed string, an empty ratio, a part that is not a finite
            positive number (the error names the part), or ``total_cores <= 0``.
    """
    total = _check_cores(total_cores)
    if isinstance(ratio, str):
        text = ratio.strip()
        if not text:
            raise ShareError(ratio, "empty ratio; expected e.g. '50:14'")
        pieces = [p.strip() for p in text.split(":")]
        parts: list[float] = []
        for piece in pieces:
            if not piece:
                raise ShareError(ratio, "empty part; expected e.g. '50:14'")
            try:
                parts.append(float(piece))
            except ValueError:
                raise ShareError(piece, f"not a number in ratio {ratio!r}") from None
        labels: Sequence[object] = pieces
    else:
        try:
            parts = [float(p) for p in ratio]
        except (TypeError, ValueError) as exc:
            raise ShareError(ratio, "parts must be numbers") from exc
        labels = list(ratio)
        if not parts:
            raise ShareError(ratio, "empty ratio")
    for label, part in zip(labels, parts, strict=True):
        if not math.isfinite(part):
            raise ShareError(label, "ratio part is not finite")
        if part <= 0:
            raise ShareError(label, "ratio part must be > 0")
    whole = math.fsum(parts)
    return tuple(total * p / whole for p in parts)


def quota_for(cores: float, period_us: int) -> int:
    """CFS quota for ``cores`` CPUs per period.

    Args:
        cores: CPU share in cores (> 0; may exceed the machine's cores).
        period_us: CFS period in µs, 1000..1_000_000.

    Returns:
        Quota in µs per period: ``round(cores * period_us)``, at least 1000 µs (the
        kernel's minimum; a smaller share thus gets slightly more than asked).

    Raises:
        ShareError: ``cores`` not a finite positive number.
        ValueError: ``period_us`` outside the kernel's range.
    """
    c = _check_cores(cores)
    if isinstance(period_us, bool) or not isinstance(period_us, int):
        raise ValueError(f"period_us must be an int, got {period_us!r}")
    if not MIN_PERIOD_US <= period_us <= MAX_PERIOD_US:
        raise ValueError(f"period_us {period_us} outside {MIN_PERIOD_US}..{MAX_PERIOD_US} µs")
    return max(MIN_QUOTA_US, round(c * period_us))


def parse_cpu_stat(text: str) -> dict[str, int]:
    """Parse a ``cpu.stat``-style file (``key value`` lines) into ``{key: int}``.

    Lines that are not ``<word> <integer>`` are ignored.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and re.fullmatch(r"-?\d+", fields[1]):
            out[fields[0]] = int(fields[1])
    return out


def cpu_stat_usage_s(text: str) -> float:
    """CPU seconds from a cgroup-v2 ``cpu.stat`` (``usage_usec``, µs).

    Raises:
        ValueError: no ``usage_usec`` line.
    """
    stat = parse_cpu_stat(text)
    if "usage_usec" not in stat:
        raise ValueError("cpu.stat has no usage_usec line")
    return stat["usage_usec"] / 1e6


def cpuacct_usage_s(text: str) -> float:
    """CPU seconds from a cgroup-v1 ``cpuacct.usage`` (one integer, ns).

    Raises:
        ValueError: not a single non-negative integer.
    """
    stripped = text.strip()
    if not re.fullmatch(r"\d+", stripped):
        raise ValueError(f"cpuacct.usage is not an integer: {stripped[:40]!r}")
    return int(stripped) / 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupMount:
    """One cgroup mount from ``/proc/self/mountinfo``.

    Attributes:
        mount_point: where it is mounted.
        root: the hierarchy path mounted there (``/`` unless namespaced/bind-mounted).
        version: 1 or 2.
        controllers: v1 controllers of this hierarchy (e.g. ``("cpu", "cpuacct")``);
            empty for v2 (see ``cgroup.controllers``).
    """

    mount_point: Path
    root: str
    version: int
    controllers: tuple[str, ...]


_V1_CONTROLLERS = frozenset({
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "blkio",
    "perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc",
})


def _unescape_mount(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup (v1) and cgroup2 mounts listed in a ``/proc/<pid>/mountinfo`` text."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf = left.split()
        rf = right.split()
        if len(lf) < 5 or len(rf) < 1:
            continue
        fstype = rf[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        root, point = _unescape_mount(lf[3]), Path(_unescape_mount(lf[4]))
        if fstype == "cgroup2":
            mounts.append(CgroupMount(mount_point=point, root=root, version=2, controllers=()))
        else:
            opts = rf[2].split(",") if len(rf) > 2 else []
            ctl = tuple(o for o in opts if o in _V1_CONTROLLERS)
            mounts.append(CgroupMount(mount_point=point, root=root, version=1, controllers=ctl))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Parse ``/proc/<pid>/cgroup`` into ``{controller: path}``; the v2 entry is ``""``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctls, path = parts
        if not ctls:
            out[""] = path
        for c in ctls.split(","):
            if c:
                out[c] = path
    return out


def _group_dir(mount: CgroupMount, own_path: str | None) -> Path:
    """The directory of a process's cgroup ``own_path`` inside ``mount``."""
    if own_path is None:
        return mount.mount_point
    root = mount.root.rstrip("/")
    if own_path == mount.root or own_path.startswith(root + "/"):
        rel = own_path[len(root):].lstrip("/")
        return mount.mount_point / rel if rel else mount.mount_point
    return mount.mount_point  # outside our view (namespaced): use the mount's top


# --------------------------------------------------------------------------- file helpers


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def join_groups(procs_files: Sequence[str]) -> None:
    """Write this process's own pid into each of ``procs_files`` (``cgroup.procs`` of
    the groups it joins): plain syscalls only, as a forked child of a threaded parent
    requires."""
    me = str(os.getpid())
    for f in procs_files:
        _write(Path(f), me)


def preexec_join(procs_files: Sequence[str]) -> Callable[[], None]:
    """A ``preexec_fn`` (or a :func:`parties.core.zygote.start` ``setup`` step: it pickles)
    that makes the child join ``procs_files`` (:func:`join_groups`) before it runs."""
    return functools.partial(join_groups, list(procs_files))


def _add_pid(procs_files: Sequence[str], pid: int) -> None:
    """Move the running process ``pid`` into each group.

    Raises:
        ProcessLookupError: no such process.
        OSError: a group cannot be written.
    """
    for f in procs_files:
        try:
            _write(Path(f), str(pid))
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                raise ProcessLookupError(exc.errno, f"no process {pid}") from exc
            raise


def _read_pids(procs_file: Path) -> list[int]:
    try:
        return [int(x) for x in procs_file.read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


_STALE_RE = re.compile(r"^psfl-.*-(\d+)-\d+$")


def _remove_stale(parent: Path) -> None:
    """rmdir groups in ``parent`` whose creator pid is dead (and that are empty)."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        m = _STALE_RE.match(entry.name)
        if not m or not entry.is_dir() or psutil.pid_exists(int(m.group(1))):
            continue
        try:
            entry.rmdir()
            log.info("cpu.limiter.stale_removed", path=str(entry))
        except OSError:
            pass  # still has tasks: leave it


# --------------------------------------------------------------------------- backends


class _Backend:
    method: str = "none"
    path: Path | None = None
    quota_us: int | None = None
    note: str | None = None
    extra: dict[str, Any]

    def preexec(self) -> Callable[[], None]:
        raise NotImplementedError

    def child_setup(self) -> list[Callable[[], None]]:
        """Picklable steps for a child forked from a fork server (cgroups: join)."""
        return [self.preexec()]

    def add(self, pid: int) -> None:
        raise NotImplementedError

    def usage_s(self) -> float:
        raise NotImplementedError

    def pids(self) -> list[int]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def live(self) -> dict[str, Any]:
        """Counters that change while the limiter runs (merged into ``describe()``)."""
        return {}


def _rmdir_group(group: Path, home: Path, timeout_s: float = 5.0) -> bool:
    """Move the tasks of ``group`` to ``home`` and remove ``group``; True if removed."""
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in _read_pids(group / "cgroup.procs"):
            try:
                _write(home / "cgroup.procs", str(pid))
            except OSError:
                pass  # exiting, or not movable: wait for it below
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                log.warning("cpu.limiter.rmdir_failed", path=str(group), error=str(exc),
                            tasks=_read_pids(group / "cgroup.procs"))
                return False
        time.sleep(0.02)


def _make_group(base: Path, name: str, method: str) -> Path:
    """Create ``base/psfl/<name>`` (and ``base/psfl``); return the group dir."""
    parent = base / PARENT_DIR
    for _ in range(5):  # the parent may be removed concurrently by another process
        try:
            parent.mkdir(exist_ok=True)
            group = parent / name
            group.mkdir()
            return group
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise CpuLimitUnavailable(method, parent, f"cannot create a cgroup: {exc}") from exc
    raise CpuLimitUnavailable(method, parent, "cannot create a cgroup: parent keeps vanishing")


class _CgroupV1(_Backend):
    method = "cgroup-v1"

    def __init__(self, name: str, cores: float, period_us: int, mounts: list[CgroupMount],
                 own: dict[str, str]) -> None:
        self.extra = {}
        cpu_m = next((m for m in mounts if m.version == 1 and "cpu" in m.controllers), None)
        if cpu_m is None:
            raise CpuLimitUnavailable(self.method, CGROUP_ROOT, "no cgroup-v1 'cpu' hierarchy")
        acct_m = next((m for m in mounts if m.version == 1 and "cpuacct" in m.controllers),
                      None)
        self._home = _group_dir(cpu_m, own.get("cpu"))
        if not (self._home / "cpu.cfs_quota_us").exists():
            raise CpuLimitUnavailable(self.method, self._home / "cpu.cfs_quota_us",
                                      "no CFS bandwidth control in this kernel")
        if not os.access(self._home, os.W_OK):
            raise CpuLimitUnavailable(self.method, self._home, "not writable")
        _remove_stale(self._home / PARENT_DIR)
        self.quota_us = quota_for(cores, period_us)
        self.path = _make_group(self._home, name, self.method)
        self._groups = [self.path]
        self._homes = [self._home]
        try:
            _write(self.path / "cpu.cfs_period_us", str(period_us))
            _write(self.path / "cpu.cfs_quota_us", str(self.quota_us))
            if (self.path / "cpu.cfs_burst_us").exists():
                _write(self.path / "cpu.cfs_burst_us", "0")
            # Weight like `cores` busy tasks: by default the whole group competes with
            # other processes as ONE task, so under contention it would get less than its
            # quota, and two parties would not keep their ratio.
            shares = min(262_144, max(2, round(1024 * cores)))
            _write(self.path / "cpu.shares", str(shares))
            self.extra["cpu_shares"] = shares
            self._acct: Path | None = None
            if acct_m is not None and acct_m.mount_point == cpu_m.mount_point:
                self._acct = self.path
            elif acct_m is not None:
                acct_home = _group_dir(acct_m, own.get("cpuacct"))
                if os.access(acct_home, os.W_OK):
                    _remove_stale(acct_home / PARENT_DIR)
                    self._acct = _make_group(acct_home, name, self.method)
                    self._groups.append(self._acct)
                    self._homes.append(acct_home)
            if self._acct is None:
                self.note = "no writable cpuacct hierarchy: usage from psutil over group tasks"
                self._seen: dict[int, tuple[float, float]] = {}
            self.extra["cpuacct_path"] = None if self._acct is None else str(self._acct)
        except BaseException:
            self.close()
            raise
        self._procs_files = [str(g / "cgroup.procs") for g in self._groups]

    def preexec(self) -> Callable[[], None]:
        return preexec_join(self._procs_files)

    def add(self, pid: int) -> None:
        _add_pid(self._procs_files, pid)

    def pids(self) -> list[int]:
        return _read_pids(self.path / "cgroup.procs") if self.path else []

    def usage_s(self) -> float:
        if self._acct is not None:
            return cpuacct_usage_s((self._acct / "cpuacct.usage").read_text())
        return _psutil_group_usage(self.pids(), self._seen)

    def close(self) -> None:
        for g, home in zip(getattr(self, "_groups", []), getattr(self, "_homes", []),
                           strict=True):
            _rmdir_group(g, home)


class _CgroupV2(_Backend):
    method = "cgroup-v2"

    def __init__(self, name: str, cores: float, period_us: int, mounts: list[CgroupMount],
                 own: dict[str, str]) -> None:
        self.extra = {}
        m2 = next((m for m in mounts if m.version == 2), None)
        if m2 is None:
            raise CpuLimitUnavailable(self.method, CGROUP_ROOT, "no cgroup2 mount")
        ctl_file = m2.mount_point / "cgroup.controllers"
        try:
            top_ctl = ctl_file.read_text().split()
        except OSError as exc:
            raise CpuLimitUnavailable(self.method, ctl_file, f"unreadable: {exc}") from exc
        if "cpu" not in top_ctl:
            raise CpuLimitUnavailable(
                self.method, ctl_file,
                "the cpu controller is not in the unified hierarchy "
                f"(controllers: {' '.join(top_ctl) or 'none'}; cpu is bound to cgroup v1)")
        self._home = _group_dir(m2, own.get(""))
        home_ctl = self._home / "cgroup.controllers"
        try:
            if "cpu" not in home_ctl.read_text().split():
                raise CpuLimitUnavailable(self.method, home_ctl,
                                          "cpu controller not delegated to this cgroup")
        except OSError as exc:
            raise CpuLimitUnavailable(self.method, home_ctl, f"unreadable: {exc}") from exc
        if not os.access(self._home, os.W_OK):
            raise CpuLimitUnavailable(self.method, self._home, "not writable")
        parent = self._home / PARENT_DIR
        _remove_stale(parent)
        self._enable_cpu(self._home)
        parent.mkdir(exist_ok=True)
        self._enable_cpu(parent)
        self.quota_us = quota_for(cores, period_us)
        self.path = _make_group(self._home, name, self.method)
        self._procs_files = [str(self.path / "cgroup.procs")]
        try:
            _write(self.path / "cpu.max", f"{self.quota_us} {period_us}")
            weight = min(10_000, max(1, round(100 * cores)))  # see cgroup-v1 cpu.shares
            _write(self.path / "cpu.weight", str(weight))
            self.extra["cpu_weight"] = weight
            if (self.path / "cpu.max.burst").exists():
                _write(self.path / "cpu.max.burst", "0")
        except BaseException:
            self.close()
            raise

    def _enable_cpu(self, d: Path) -> None:
        sub = d / "cgroup.subtree_control"
        try:
            if "cpu" in sub.read_text().split():
                return
            _write(sub, "+cpu")
        except OSError as exc:
            why = ("the cgroup has processes of its own (no-internal-process rule)"
                   if exc.errno == errno.EBUSY else str(exc))
            raise CpuLimitUnavailable(self.method, sub, f"cannot enable +cpu: {why}") from exc

    def preexec(self) -> Callable[[], None]:
        return preexec_join(self._procs_files)

    def add(self, pid: int) -> None:
        _add_pid(self._procs_files, pid)

    def pids(self) -> list[int]:
        return _read_pids(self.path / "cgroup.procs") if self.path else []

    def usage_s(self) -> float:
        return cpu_stat_usage_s((self.path / "cpu.stat").read_text())  # type: ignore[operator]

    def close(self) -> None:
        if self.path is not None:
            _rmdir_group(self.path, self._home)


def _cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _psutil_group_usage(pids: Iterable[int], seen: dict[int, tuple[float, float]]) -> float:
    """Sum of CPU seconds of ``pids`` since first seen; ``seen`` maps pid ->
    (create_time, last cpu seconds) and keeps exited processes' last value."""
    for pid in pids:
        try:
            p = psutil.Process(pid)
            ct, cpu = p.create_time(), _cpu_seconds(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        prev = seen.get(pid)
        if prev is not None and prev[0] != ct:  # pid reused: keep the old total aside
            seen[-len(seen) - 1] = prev
        seen[pid] = (ct, cpu)
    return math.fsum(v[1] for v in seen.values())


class _Tracked:
    """A process tracked by the psutil backends, with its CPU seconds at adoption."""

    __slots__ = ("proc", "base", "last")

    def __init__(self, proc: psutil.Process, base: float) -> None:
        self.proc = proc
        self.base = base
        self.last = base


class _ProcessBackend(_Backend):
    """``duty-cycle`` (``duty=True``) or ``none``: psutil-tracked processes."""

    def __init__(self, name: str, cores: float, period_us: int, *, duty: bool,
                 note: str | None) -> None:
        self.extra = {}
        self.method = "duty-cycle" if duty else "none"
        self.note = note
        self._duty = duty
        self._period_s = period_us / 1e6
        self._created = time.time()
        self._lock = threading.RLock()
        self._tracked: dict[int, _Tracked] = {}
        self._gone_s = 0.0  # CPU seconds of tracked processes that exited
        self._rfd, self._wfd = os.pipe()  # preexec children report their pid here
        os.set_blocking(self._rfd, False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # duty-cycle counters: periods run, signals delivered, processes dropped because
        # they exited or their pid now names another process, and the error that ended
        # the thread (None while it runs or after a clean close)
        self._periods = 0
        self._sent = {"SIGSTOP": 0, "SIGCONT": 0}
        self._dropped = 0
        self._error: str | None = None
        allowed = sorted(os.sched_getaffinity(0))
        if duty:
            n = min(len(allowed), math.ceil(cores))
            offset = next(_cpu_rotation) % len(allowed)
            rot = allowed[offset:] + allowed[:offset]
            self._cpus: tuple[int, ...] | None = tuple(sorted(rot[:n]))
            self._fraction = min(1.0, cores / n)
            self.quota_us = round(cores * period_us)
            self.extra.update(cpus=list(self._cpus), duty_fraction=self._fraction)
            self._thread = threading.Thread(target=self._run, name=f"cpu-duty-{name}",
                                            daemon=True)
            self._thread.start()
        else:
            self._cpus = None
            self._fraction = 1.0

    # -- tracking
    def _adopt(self, pid: int, *, from_start: bool) -> None:
        with self._lock:
            if pid in self._tracked:
                return
            p = psutil.Process(pid)
            base = 0.0 if from_start else _cpu_seconds(p)
            if self._cpus is not None:
                try:
                    p.cpu_affinity(list(self._cpus))
                except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                    pass
            self._tracked[pid] = _Tracked(p, base)

    def _drain_pipe(self) -> None:
        try:
            data = os.read(self._rfd, 65536)
        except (BlockingIOError, OSError):
            return
        for chunk in data.split(b"\n"):
            if chunk.strip():
                try:
                    self._adopt(int(chunk), from_start=True)
                except (psutil.NoSuchProcess, ValueError):
                    pass

    def _refresh(self) -> list[psutil.Process]:
        """Drop exited processes, adopt new children; return the live processes."""
        self._drain_pipe()
        with self._lock:
            for pid, t in list(self._tracked.items()):
                # a process that exited may have its pid reused by an unrelated one:
                # is_running() compares the creation time, so that one is never signalled
                if not t.proc.is_running():
                    self._drop(pid)
                    continue
                try:
                    for child in t.proc.children(recursive=True):
                        if child.pid not in self._tracked:
                            try:
                                new = child.create_time() >= self._created
                                self._adopt(child.pid, from_start=new)
                            except psutil.Error:
                                pass
                    t.last = _cpu_seconds(t.proc)
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    self._drop(pid)
                except psutil.AccessDenied:
                    pass
            return [t.proc for t in self._tracked.values()]

    def _drop(self, pid: int) -> None:
        """Stop tracking ``pid`` (exited, or its pid now names another process), keeping
        the CPU seconds it used in the group's total. Caller holds ``_lock``."""
        t = self._tracked.pop(pid)
        self._gone_s += t.last - t.base
        self._dropped += 1

    def _signal_all(self, procs: Iterable[psutil.Process], sig: int) -> None:
        name = signal.Signals(sig).name
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                continue
            if name in self._sent:
                self._sent[name] += 1

    def _run(self) -> None:
        procs: list[psutil.Process] = []
        on = self._period_s * self._fraction
        off = self._period_s - on
        try:
            next_t = time.monotonic()
            while not self._stop.is_set():
                self._periods += 1
                t_cont = time.monotonic()
                # continue first, then look for exited/new processes: the bookkeeping
                # (a /proc scan) must not eat into the on-time
                self._signal_all(procs, signal.SIGCONT)
                known = {p.pid for p in procs}
                procs = self._refresh()
                self._signal_all([p for p in procs if p.pid not in known], signal.SIGCONT)
                next_t += on
                if self._stop.wait(max(0.0, next_t - time.monotonic())):
                    break
                if off > 0:
                    with self._lock:
                        procs = [t.proc for t in self._tracked.values()]
                    self._signal_all(procs, signal.SIGSTOP)
                    # a late stop (this thread woke late: GIL, a loaded host) must not
                    # come out of the off-time, or the rate climbs past the share (0.91
                    # for 0.4375 once): stay stopped in proportion to the time they ran
                    t_stop = time.monotonic()
                    next_t = max(next_t + off,
                                 t_stop + (t_stop - t_cont) * off / on if on > 0 else 0.0)
                    if self._stop.wait(max(0.0, next_t - time.monotonic())):
                        break
                now = time.monotonic()
                if now - next_t > self._period_s:  # fell behind (suspended?): resync
                    next_t = now
        except Exception as exc:  # never leave processes stopped
            self._error = repr(exc)
            log.error("cpu.duty.crashed", error=repr(exc))
        finally:
            self._cont_everything()

    def _cont_everything(self) -> None:
        with self._lock:
            procs = [t.proc for t in self._tracked.values()]
        for p in list(procs):
            try:
                procs.extend(p.children(recursive=True))
            except psutil.Error:
                pass
        self._signal_all(procs, signal.SIGCONT)

    # -- API
    def child_setup(self) -> list[Callable[[], None]]:
        # the pid is reported by add() after the start; the affinity is set here
        return [] if self._cpus is None else [functools.partial(os.sched_setaffinity, 0,
                                                                self._cpus)]

    def preexec(self) -> Callable[[], None]:
        wfd = self._wfd
        cpus = self._cpus

        def _join() -> None:  # runs in the forked child: plain syscalls only
            if cpus is not None:
                os.sched_setaffinity(0, cpus)
            os.write(wfd, f"{os.getpid()}\n".encode())

        return _join

    def add(self, pid: int) -> None:
        try:
            self._adopt(pid, from_start=False)
        except psutil.NoSuchProcess as exc:
            raise ProcessLookupError(errno.ESRCH, f"no process {pid}") from exc

    def pids(self) -> list[int]:
        return [p.pid for p in self._refresh()]

    def live(self) -> dict[str, Any]:
        if not self._duty:
            return {}
        return {"duty": {"periods": self._periods, "sigstop_sent": self._sent["SIGSTOP"],
                         "sigcont_sent": self._sent["SIGCONT"],
                         "processes_dropped": self._dropped,
                         "thread_alive": self._thread is not None and self._thread.is_alive(),
                         "error": self._error}}

    def usage_s(self) -> float:
        self._refresh()
        with self._lock:
            return self._gone_s + math.fsum(t.last - t.base for t in self._tracked.values())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._cont_everything()
        for fd in (self._rfd, self._wfd):
            try:
                os.close(fd)
            except OSError:
                pass


_cpu_rotation = itertools.count()
_group_counter = itertools.count()
_open_limiters: weakref.WeakSet[CpuLimiter] = weakref.WeakSet()


def _sanitize(name: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9_.]+", "_", name).strip("_.")[:40]
    return clean or "group"


# --------------------------------------------------------------------------- limiter


class CpuLimiter:
    """A CPU share (in cores) enforced on a group of processes.

    Build with :meth:`create`. Use as a context manager or call :meth:`close`
    (idempotent; also run at interpreter exit).

    Attributes:
        name: the caller's label.
        method: what is actually enforced: ``"cgroup-v2"``, ``"cgroup-v1"``,
            ``"duty-cycle"`` or ``"none"``.
        cores: the share, cores.
        period_us: the CFS / duty-cycle period, µs.
        path: the cgroup directory (None for duty-cycle / none).
    """

    def __init__(self, *, name: str, cores: float, period_us: int, backend: _Backend) -> None:
        self.name = name
        self.cores = cores
        self.period_us = period_us
        self._backend = backend
        self.method: str = backend.method
        self.path: Path | None = backend.path
        self._closed = False
        _open_limiters.add(self)

    @classmethod
    def create(cls, name: str, cores: float, *, method: Method = "auto",
               period_us: int = 100_000) -> CpuLimiter:
        """Create a limiter (and its cgroup) for ``cores`` CPUs.

        Args:
            name: label used in the group name ``psfl-<name>-<pid>-<counter>``.
            cores: share in cores, > 0 (values above the machine's cores are allowed
                and then do not limit).
            method: ``"auto"`` tries cgroup-v2 (if the unified hierarchy has the cpu
                controller), then cgroup-v1, then falls back to ``"duty-cycle"`` with a
                ``note`` saying why; any other value is used as is or fails.
            period_us: CFS / duty-cycle period in µs (1000..1_000_000). For the duty
                cycle a period of 100 ms (the default) keeps the signalling cost low.

        Raises:
            ShareError: ``cores`` not a finite positive number.
            ValueError: unknown ``method`` or ``period_us`` out of range.
            CpuLimitUnavailable: the requested cgroup method is not usable here
                (names the path and the reason).
        """
        cores = _check_cores(cores)
        if method not in METHODS:
            raise ValueError(f"unknown CPU limiting method {method!r}; one of {METHODS}")
        quota_for(cores, period_us)  # validates period_us
        group = f"{GROUP_PREFIX}{_sanitize(name)}-{os.getpid()}-{next(_group_counter)}"
        reasons: list[str] = []
        backend: _Backend | None = None
        if method in ("auto", "cgroup-v2", "cgroup-v1"):
            try:
                mounts = parse_mountinfo(_PROC_MOUNTINFO.read_text())
                own = parse_proc_cgroup(_PROC_CGROUP.read_text())
            except OSError as exc:
                if method != "auto":
                    raise CpuLimitUnavailable(method, _PROC_MOUNTINFO, str(exc)) from exc
                mounts, own = [], {}
                reasons.append(f"cannot read {_PROC_MOUNTINFO}: {exc}")
            kinds = [_CgroupV2, _CgroupV1] if method == "auto" else (
                [_CgroupV2] if method == "cgroup-v2" else [_CgroupV1])
            for kind in kinds:
                try:
                    backend = kind(group, cores, period_us, mounts, own)
                    break
                except CpuLimitUnavailable as exc:
                    if method != "auto":
                        raise
                    reasons.append(str(exc))
        if backend is None:
            if method in ("auto", "duty-cycle"):
                note = "SIGSTOP/SIGCONT duty cycle on CPU affinity"
                if reasons:
                    note = "cgroups not usable: " + "; ".join(reasons) + " → " + note
                backend = _ProcessBackend(group, cores, period_us, duty=True, note=note)
            else:
                backend = _ProcessBackend(group, cores, period_us, duty=False,
                                          note="nothing enforced (method='none')")
        lim = cls(name=name, cores=cores, period_us=period_us, backend=backend)
        log.info("cpu.limiter.created", **lim.describe())
        return lim

    def preexec(self) -> Callable[[], None]:
        """A ``preexec_fn`` for :class:`subprocess.Popen`: the child joins the group
        before ``exec``, so everything it forks later starts inside the share.

        For the duty cycle the child sets its CPU affinity and reports its pid to the
        limiter's thread, which starts stopping/continuing it within one period.

        Raises:
            RuntimeError: the limiter is closed.
        """
        self._check_open()
        return self._backend.preexec()

    def child_setup(self) -> list[Callable[[], None]]:
        """For a child forked from a fork server (:func:`parties.core.zygote.start`'s
        ``setup``, which pickles them) instead of :meth:`preexec`: cgroups, the child joins
        the group itself before it runs; duty cycle and ``none``, the child sets its
        affinity and the caller must :meth:`add` its pid once it has started
        (:meth:`tracks_pids`).

        Raises:
            RuntimeError: the limiter is closed.
        """
        self._check_open()
        return self._backend.child_setup()

    def tracks_pids(self) -> bool:
        """True for the duty cycle and ``none``, which follow pids (:meth:`add`) rather
        than a group the process joins itself."""
        return not self.join_files()

    def join_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its own pid into to join the share
        (one per hierarchy: v1 ``cpu`` and ``cpuacct`` are separate here); empty for the
        duty cycle and ``none``, which track pids instead (:meth:`add`)."""
        self._check_open()
        return list(getattr(self._backend, "_procs_files", []))

    def add(self, pid: int) -> None:
        """Put an already-running process (all its threads) under the share. Its
        existing children stay where they are (cgroups) / are adopted (duty cycle).

        Raises:
            ProcessLookupError: no such process.
            RuntimeError: the limiter is closed.
            OSError: the cgroup refused the task.
        """
        self._check_open()
        self._backend.add(pid)
        log.debug("cpu.limiter.added", name=self.name, pid=pid, method=self.method)

    def pids(self) -> list[int]:
        """The processes currently under the share."""
        return self._backend.pids()

    def usage_s(self) -> float:
        """CPU seconds used by the group's processes since :meth:`create` (cgroups:
        ``cpuacct.usage`` / ``cpu.stat``, exact; otherwise psutil over the tracked
        processes and their children, sampled every period by the duty-cycle thread and
        at each call: a process keeps its last sampled time after it exits, and one that
        exits before its first sample is not counted)."""
        return self._backend.usage_s()

    @property
    def quota_us(self) -> int | None:
        """CFS quota per period, µs (for the duty cycle: the equivalent CPU time)."""
        return self._backend.quota_us

    @property
    def note(self) -> str | None:
        """Why a fallback is in use (None when the requested method is enforced)."""
        return self._backend.note

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary: name, method, cores, period_us, quota_us, path, note
        (plus, for the duty cycle, ``cpus``, ``duty_fraction`` and ``duty``: the
        periods run, SIGSTOPs and SIGCONTs delivered, processes dropped because they
        exited (or their pid was reused), whether the thread runs, and the error that
        ended it, if any)."""
        d: dict[str, Any] = {
            "name": self.name, "method": self.method, "cores": self.cores,
            "period_us": self.period_us, "quota_us": self.quota_us,
            "path": None if self.path is None else str(self.path), "note": self.note,
        }
        d.update(self._backend.extra)
        d.update(self._backend.live())
        return d

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the share: continue every stopped process (duty cycle), or move the
        remaining tasks back to the creator's cgroup and remove the group (waits up to
        5 s for exiting tasks). Idempotent."""
        if self._closed:
            return
        self._closed = True
        _open_limiters.discard(self)
        self._backend.close()
        log.info("cpu.limiter.closed", name=self.name, method=self.method,
                 path=None if self.path is None else str(self.path))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"CpuLimiter {self.name!r} is closed")

    def __enter__(self) -> CpuLimiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"CpuLimiter(name={self.name!r}, method={self.method!r}, cores={self.cores:g}, "
                f"path={self.path})")


@atexit.register
def _close_all() -> None:
    for lim in list(_open_limiters):
        try:
            lim.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


# --------------------------------------------------------------------------- measuring


def _tree_cpu(pids: Iterable[int]) -> dict[int, tuple[float, float]]:
    """{pid: (create_time, cpu seconds)} for ``pids`` and all their descendants."""
    out: dict[int, tuple[float, float]] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                out[p.pid] = (p.create_time(), _cpu_seconds(p))
            except psutil.Error:
                pass
    return out


def measure_rate(limiter_or_pids: CpuLimiter | Iterable[int], interval_s: float) -> float:
    """CPU seconds per wall second over the next ``interval_s`` seconds (blocks).

    Args:
        limiter_or_pids: a :class:`CpuLimiter` (uses :meth:`CpuLimiter.usage_s`) or
            process ids (psutil: the processes and their descendants; a process that
            exits during the interval loses its last CPU time; one born during it
            counts from zero).
        interval_s: measuring window, seconds, > 0.

    Returns:
        Rate in cores (1.0 = one CPU busy all the time).

    Raises:
        ValueError: ``interval_s <= 0``.
    """
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    if isinstance(limiter_or_pids, CpuLimiter):
        lim = limiter_or_pids
        u0, t0 = lim.usage_s(), time.monotonic()
        time.sleep(interval_s)
        u1, t1 = lim.usage_s(), time.monotonic()
        return (u1 - u0) / (t1 - t0)
    pids = list(limiter_or_pids)
    start_wall = time.time()
    before, t0 = _tree_cpu(pids), time.monotonic()
    time.sleep(interval_s)
    after, t1 = _tree_cpu(pids), time.monotonic()
    used = 0.0
    for pid, (ct, cpu) in after.items():
        prev = before.get(pid)
        if prev is not None and prev[0] == ct:
            used += cpu - prev[1]
        elif ct >= start_wall - 0.01:
            used += cpu
    return used / (t1 - t0)
