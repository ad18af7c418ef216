"""Process CPU accounting: allotted cores and CPU utilisation (psutil)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil


#: Environment variable by which a launcher that throttles a party without a cgroup
#: (``psfl sim run``'s SIGSTOP/SIGCONT duty cycle) tells it its share, in cores.
CORES_ENV = "PSFL_CORES_ALLOTTED"


def cores_allotted() -> float:
    """Cores this process may use: the smallest of the affinity set size, the cgroup CPU
    quota if one is set, and ``$PSFL_CORES_ALLOTTED`` if set (:data:`CORES_ENV`).

    Reads cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``.

    Raises:
        ValueError: ``$PSFL_CORES_ALLOTTED`` is not a finite number > 0 (names the value).
    """
    affinity = float(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else float(
        os.cpu_count() or 1)
    limits = [affinity]
    quota = _cgroup_quota()
    if quota is not None:
        limits.append(quota)
    text = os.environ.get(CORES_ENV)
    if text is not None:
        try:
            told = float(text)
        except ValueError:
            told = float("nan")
        if not (math.isfinite(told) and told > 0):
            raise ValueError(f"${CORES_ENV} must be a number of cores > 0, got {text!r}")
        limits.append(told)
    return min(limits)


def pin_process(cpus: Iterable[int]) -> set[int]:
    """Pin this process, every thread it has now, and whatever it starts later to ``cpus``.

    ``os.sched_setaffinity(0, ...)`` alone moves only the calling thread; threads that
    already exist (BLAS pools, the asyncio default executor) keep their old affinity, so
    each thread in ``/proc/self/task`` is moved too. New threads and child processes
    inherit the affinity of their creator.

    Args:
        cpus: CPU ids (as ``os.sched_getaffinity`` numbers them), non-empty.

    Returns:
        The affinity set before pinning (pass it back here to undo).

    Raises:
        ValueError: ``cpus`` is empty or names a CPU this process may not use.
        OSError: the platform has no ``sched_setaffinity`` (not Linux).
    """
    want = set(cpus)
    if not hasattr(os, "sched_setaffinity"):
        raise OSError("CPU pinning needs os.sched_setaffinity (Linux)")
    before = set(os.sched_getaffinity(0))
    if not want:
        raise ValueError("pin_process needs at least one CPU id")
    try:
        os.sched_setaffinity(0, want)
    except OSError:
        raise ValueError(f"cannot pin to CPUs {sorted(want)}: this process may use "
                         f"{sorted(before)}") from None
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    for tid in tids:
        try:
            os.sched_setaffinity(tid, want)
        except OSError:
            continue  # the thread ended meanwhile
    return before


def _cgroup_quota() -> float | None:
    """The tightest CPU quota (cores) on this process's cgroup or any of its ancestors:
    cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us / cpu.cfs_period_us`` in the group
    ``/proc/self/cgroup`` names for the ``cpu`` controller; None when there is none."""
    try:
        v2_rel, v1_rel = None, None
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if parts[0] == "0" and parts[1] == "":
                v2_rel = parts[2]
            elif "cpu" in parts[1].split(","):
                v1_rel = parts[2]
        quotas: list[float] = []
        if v1_rel is not None:
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                base = Path("/sys/fs/cgroup") / mount
                if (base / "cpu.cfs_quota_us").exists():
                    quotas += _walk_v1(base, v1_rel)
                    break
        elif v2_rel is not None:
            base = Path("/sys/fs/cgroup")
            rel = Path(v2_rel.lstrip("/"))
            for d in [base / rel, *[base / p for p in rel.parents]]:
                f = d / "cpu.max"
                if f.exists():
                    q, period = f.read_text().split()
                    if q != "max":
                        quotas.append(int(q) / int(period))
        return min(quotas) if quotas else None
    except (OSError, ValueError):
        return None


def _walk_v1(base: Path, rel: str) -> list[float]:
    """v1 quotas (cores) of the group ``rel`` under ``base`` and its ancestors."""
    out: list[float] = []
    r = Path(rel.lstrip("/"))
    for d in [base / r, *[base / p for p in r.parents]]:
        q_file = d / "cpu.cfs_quota_us"
        if q_file.exists():
            q = int(q_file.read_text())
            if q > 0:
                out.append(q / int((d / "cpu.cfs_period_us").read_text()))
    return out


@dataclass(slots=True)
class CpuMeter:
    """CPU seconds of this process and its live child processes (its workers) over an interval.

    Children must exist when :meth:`start` is called and still run at :meth:`read`
    (worker processes do); their CPU time is read directly, not from ``wait()``.
    """

    wall0: float = 0.0
    cpu0: dict[int, float] | None = None

    def start(self) -> None:
        """Start (or restart) the interval."""
        self.wall0 = time.perf_counter()
        self.cpu0 = _cpu_by_pid()

    def read(self) -> tuple[float, float, float, float]:
        """``(wall_s, cpu_s, cores, cpu_util)`` since :meth:`start`; util = cpu / (wall × cores)."""
        wall = time.perf_counter() - self.wall0
        now = _cpu_by_pid()
        base = self.cpu0 or {}
        cpu = sum(v - base.get(pid, 0.0) for pid, v in now.items())
        cores = cores_allotted()
        return wall, cpu, cores, (cpu / (wall * cores) if wall > 0 else 0.0)


def run_delay_s() -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a CPU (summed over
    its live threads, from ``/proc/self/task/*/schedstat``), or None where unavailable.

    On a pinned party this is the CPU time other processes (or the party's own other
    threads) took from it: waiting that is neither compute nor waiting for the partner.
    """
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _child_pids(pid: int) -> list[int] | None:
    """``pid``'s descendants from ``/proc/PID/task/TID/children`` (Linux), or None when that
    file is unavailable. psutil's ``children()`` scans every process in ``/proc`` instead
    (milliseconds; CpuMeter runs twice per training segment)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            if p == pid:
                return None
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except FileNotFoundError:
                if p == pid:
                    return None
                continue
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _cpu_by_pid() -> dict[int, float]:
    me = psutil.Process()
    out: dict[int, float] = {}
    pids = _child_pids(me.pid) if sys.platform.startswith("linux") else None
    if pids is None:
        kids = me.children(recursive=True)
    else:
        kids = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                kids.append(psutil.Process(pid))
    for p in [me, *kids]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = float(t.user + t.system)
    return out


def memory_available() -> tuple[int, str]:
    """Bytes of memory this process's runs may still take, and where the figure comes
    from: the smaller of the machine's available memory (psutil, else ``/proc/meminfo``
    ``MemAvailable``) and the room left under the tightest cgroup memory limit on this
    process's group or an ancestor (v2 ``memory.max`` less ``memory.current``; v1
    ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``)."""
    try:
        free, source = int(psutil.virtual_memory().available), "available memory"
    except (OSError, RuntimeError, AttributeError):  # psutil without /proc access
        free, source = _meminfo_available(), "MemAvailable"
    room = _cgroup_memory_room()
    if room is not None and room < free:
        return max(0, room), "cgroup memory limit"
    return free, source


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62  # unknown: nothing is refused for memory


def _cgroup_memory_room() -> int | None:
    """The least room (limit less usage, bytes) under a cgroup memory limit on this
    process's group or its ancestors; None when none is set."""
    try:
        rooms: list[int] = []
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if parts[0] == "0" and parts[1] == "":
                base, names = Path("/sys/fs/cgroup"), ("memory.max", "memory.current")
            elif "memory" in parts[1].split(","):
                base = Path("/sys/fs/cgroup/memory")
                names = ("memory.limit_in_bytes", "memory.usage_in_bytes")
            else:
                continue
            rel = Path(parts[2].lstrip("/"))
            for d in [base / rel, *[base / p for p in rel.parents]]:
                limit_f, used_f = d / names[0], d / names[1]
                if not limit_f.exists():
                    continue
                text = limit_f.read_text().strip()
                if text == "max" or int(text) >= 1 << 60:  # v1 writes a huge number for none
                    continue
                used = int(used_f.read_text()) if used_f.exists() else 0
                rooms.append(int(text) - used)
        return min(rooms) if rooms else None
    except (OSError, ValueError):
        return None
