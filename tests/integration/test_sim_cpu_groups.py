"""CPU shares enforced on real busy-loop processes (sim/cluster/cpu.py).

cgroup tests need root and a writable cgroup ``cpu`` hierarchy (v1) or a unified
hierarchy with the cpu controller (v2); they skip otherwise. The duty-cycle tests run
anywhere.

Other processes on the machine can take CPU away from the busy loops, so a measured
rate *below* the quota is only a failure when the CPUs the group may use were not busy
with other work. Every window checks the upper bound (quota + 10 %); the lower bound
(quota - 10 %) must hold in one of up to three windows, unless in every window other
processes (or the hypervisor's steal) used more than ``OTHERS_MAX`` cores of those CPUs,
or at least the deficit: then the test is skipped with the numbers, because the limiter
cannot be judged there. (A duty-cycle share of 0.4375 lost 0.07-0.09 cores this way in
one full-suite run, with 0.08-0.12 cores of other work on its CPU.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sim.cluster.cpu import (
    PARENT_DIR,
    CpuLimiter,
    CpuLimitUnavailable,
    measure_rate,
    parse_mountinfo,
    scale_shares,
)

TOLERANCE = 0.10
WINDOW_S = 2.0
OTHERS_MAX = 0.15  # cores used by other processes on our CPUs that still count as quiet

BUSY1 = "while True: pass"
# two busy processes: the child forks after preexec put it in the group, so both are in
BUSY2 = "import os\nos.fork()\nwhile True: pass"

# func_only: the wait for the machine (the exclusive lock, conftest.py) is not the test
pytestmark = [pytest.mark.timeout(180, func_only=True), pytest.mark.exclusive]


def _cgroup_v1_dirs() -> list[Path]:
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    return [m.mount_point for m in mounts
            if m.version == 1 and {"cpu", "cpuacct"} & set(m.controllers)]


def _probe(method: str) -> str | None:
    """None if ``method`` works here, else the reason."""
    if os.geteuid() != 0:
        return "not root"
    try:
        CpuLimiter.create("probe", 1.0, method=method).close()  # type: ignore[arg-type]
    except CpuLimitUnavailable as exc:
        return str(exc)
    return None


def _cgroup_method() -> tuple[str | None, str]:
    reasons = []
    for method in ("cgroup-v2", "cgroup-v1"):
        why = _probe(method)
        if why is None:
            return method, ""
        reasons.append(why)
    return None, "; ".join(reasons)


CGROUP_METHOD, CGROUP_WHY = _cgroup_method()
needs_cgroup = pytest.mark.skipif(CGROUP_METHOD is None,
                                  reason=f"no writable cgroup cpu controller: {CGROUP_WHY}")


def _our_groups() -> list[Path]:
    """Groups created by this test process that still exist."""
    left: list[Path] = []
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    for m in mounts:
        parent = m.mount_point / PARENT_DIR
        if parent.is_dir():
            left += [d for d in parent.iterdir()
                     if d.is_dir() and d.name.startswith("psfl-")
                     and f"-{os.getpid()}-" in d.name]
    return left


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """No cgroup of ours left behind (leaked child processes: conftest's autouse check)."""
    yield
    assert _our_groups() == [], "stale cgroups left behind"


class Busy:
    """A busy-loop child (its own session, so its forked worker is killed with it)."""

    def __init__(self, lim: CpuLimiter | None, code: str = BUSY1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            preexec_fn=None if lim is None else lim.preexec(),
            start_new_session=True)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@pytest.fixture
def busy() -> Iterator[list[Busy]]:
    started: list[Busy] = []
    yield started
    for b in started:
        b.kill()


def _cpu_busy_s(cpus: list[int]) -> float:
    """Busy CPU seconds (all but idle and iowait) of ``cpus`` since boot."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for line in Path("/proc/stat").read_text().splitlines():
        name, *vals = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            v = [int(x) for x in vals[:8]]
            total += sum(v) - v[3] - v[4]
    return total / hz


def _check_rate(lim: CpuLimiter, target: float, cpus: list[int],
                tolerance: float = TOLERANCE) -> float:
    """Measure the group's rate in up to three windows; see the module docstring."""
    time.sleep(0.5)  # let the children start (interpreter start-up) and settle
    seen = []
    for _ in range(3):
        b0 = _cpu_busy_s(cpus)
        t0 = time.monotonic()
        rate = measure_rate(lim, WINDOW_S)
        others = (_cpu_busy_s(cpus) - b0) / (time.monotonic() - t0) - rate
        seen.append((rate, others))
        print(f"{lim.method} cores={lim.cores:g} rate={rate:.4f} others={others:.3f} "
              f"({lim.describe()})")
        assert rate <= target * (1 + tolerance), (rate, target, lim.describe())
        if rate >= target * (1 - tolerance):
            return rate
    lower = target * (1 - tolerance)
    if all(o > OTHERS_MAX or r + o >= lower for r, o in seen):
        # every window's deficit is covered by what other work (or the hypervisor's
        # steal) took from the group's CPUs: the limiter cannot be judged there
        pytest.skip(f"host busy: other processes used {[round(o, 2) for _, o in seen]} cores "
                    f"of CPUs {cpus}; measured {[round(r, 3) for r, _ in seen]} "
                    f"vs quota {target:g} (upper bound held)")
    pytest.fail(f"rate {[round(r, 3) for r, _ in seen]} below quota {target:g} - "
                f"{tolerance:.0%} on a quiet host (others {[round(o, 2) for _, o in seen]}; "
                f"{lim.describe()})")


ALL_CPUS = sorted(os.sched_getaffinity(0))


# ------------------------------------------------------------------ cgroups


@needs_cgroup
@pytest.mark.parametrize("cores, code", [(0.5, BUSY1), (1.5, BUSY2), (0.4375, BUSY1)],
                         ids=["0.5", "1.5", "0.4375"])
def test_cgroup_quota(cores: float, code: str, busy: list[Busy]) -> None:
    if cores > len(ALL_CPUS):
        pytest.skip(f"{cores} cores > {len(ALL_CPUS)} CPUs here")
    with CpuLimiter.create("itest", cores, method="auto") as lim:
        assert lim.method == CGROUP_METHOD and lim.path is not None and lim.path.is_dir()
        assert lim.note is None
        busy.append(Busy(lim, code))
        _check_rate(lim, cores, ALL_CPUS)
        time.sleep(0.1)
        assert len(lim.pids()) == (2 if code == BUSY2 else 1)  # the fork joined too
        busy[-1].kill()


@needs_cgroup
def test_cgroup_paper_shares_side_by_side(busy: list[Busy]) -> None:
    """50:14 of 64 cores on this machine, two groups at once: each gets its share."""
    if len(ALL_CPUS) != 2:
        pytest.skip("written for a 2-CPU machine")
    big, small = scale_shares("50:14", len(ALL_CPUS))
    with CpuLimiter.create("active", big) as a, CpuLimiter.create("passive", small) as p:
        busy.append(Busy(a, BUSY2))
        busy.append(Busy(p, BUSY1))
        time.sleep(0.5)
        u0 = (a.usage_s(), p.usage_s())
        t0 = time.monotonic()
        time.sleep(WINDOW_S)
        dt = time.monotonic() - t0
        ra, rp = (a.usage_s() - u0[0]) / dt, (p.usage_s() - u0[1]) / dt
        print(f"active {ra:.4f}/{big} passive {rp:.4f}/{small}")
        assert ra <= big * 1.1 and rp <= small * 1.1
        # together they ask for the whole machine: only the small one is checked from
        # below (the big one also competes with everything else on the host)
        if rp < small * 0.9:
            pytest.skip(f"host busy: passive got {rp:.3f} of {small}")


@needs_cgroup
def test_cgroup_add_running_process_and_close_moves_it_back(busy: list[Busy]) -> None:
    b = Busy(None)
    busy.append(b)
    lim = CpuLimiter.create("add", 0.25)
    try:
        lim.add(b.proc.pid)
        assert lim.pids() == [b.proc.pid]
        path = lim.path
        assert path is not None
        assert f"/{path.name}" in Path(f"/proc/{b.proc.pid}/cgroup").read_text()
        _check_rate(lim, 0.25, ALL_CPUS)
    finally:
        lim.close()
    # the process is still running, back in our own group; the group is gone
    assert b.proc.poll() is None
    assert not path.exists()
    assert "psfl" not in Path(f"/proc/{b.proc.pid}/cgroup").read_text()
    lim.close()


@needs_cgroup
def test_cgroup_stale_group_of_dead_creator_is_removed() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with CpuLimiter.create("x", 1.0) as lim:
        assert lim.path is not None
        stale = lim.path.parent / f"psfl-old-{dead.pid}-0"
    stale.mkdir()
    try:
        with CpuLimiter.create("y", 1.0):
            assert not stale.exists()
    finally:
        if stale.exists():
            stale.rmdir()


def test_cgroup_v2_unavailable_is_typed() -> None:
    why = _probe("cgroup-v2")
    if why is None:
        pytest.skip("cgroup v2 with the cpu controller works here")
    if os.geteuid() != 0:
        pytest.skip("not root")
    with pytest.raises(CpuLimitUnavailable) as info:
        CpuLimiter.create("v2", 1.0, method="cgroup-v2")
    assert info.value.method == "cgroup-v2" and info.value.path is not None
    assert info.value.reason


# ------------------------------------------------------------------ duty cycle


@pytest.mark.parametrize("cores, code, tolerance", [
    (0.5, BUSY1, TOLERANCE),
    (0.4375, BUSY1, TOLERANCE),
    # both processes must be stopped and continued each period: the signal latency
    # (two SIGCONTs, two SIGSTOPs per 100 ms) costs a few % of the on-time
    (1.5, BUSY2, 0.15),
], ids=["0.5", "0.4375", "1.5"])
def test_duty_cycle_rate(cores: float, code: str, tolerance: float,
                         busy: list[Busy]) -> None:
    if cores > len(ALL_CPUS):
        pytest.skip(f"{cores} cores > {len(ALL_CPUS)} CPUs here")
    with CpuLimiter.create("duty", cores, method="duty-cycle") as lim:
        d = lim.describe()
        assert d["method"] == "duty-cycle" and lim.path is None and "SIGSTOP" in d["note"]
        assert len(d["cpus"]) == -(-cores // 1)
        b = Busy(lim, code)
        busy.append(b)
        time.sleep(0.3)
        assert os.sched_getaffinity(b.proc.pid) == set(d["cpus"])
        _check_rate(lim, cores, d["cpus"], tolerance)
        pids = lim.pids()
        assert len(pids) == (2 if code == BUSY2 else 1)
    # closed: nothing is left stopped
    time.sleep(0.05)
    for pid in pids:
        assert psutil.Process(pid).status() != psutil.STATUS_STOPPED


def test_duty_cycle_reports_its_signals(busy: list[Busy]) -> None:
    with CpuLimiter.create("duty", 0.5, method="duty-cycle", period_us=50_000) as lim:
        b = Busy(lim)
        busy.append(b)
        time.sleep(0.6)
        d = lim.describe()["duty"]
        assert d["thread_alive"] and d["error"] is None
        assert d["periods"] >= 6, d  # 12 periods of 50 ms, minus start-up
        # the child is stopped once and continued once (at least) per period once adopted
        assert d["sigstop_sent"] >= 4 and d["sigcont_sent"] >= 4, d
    d = lim.describe()["duty"]
    assert not d["thread_alive"] and d["error"] is None


def _stopped_samples(pid: int, window_s: float) -> int:
    """How many of the samples (every 5 ms for ``window_s``) saw ``pid`` stopped."""
    n, end = 0, time.monotonic() + window_s
    while time.monotonic() < end:
        n += psutil.Process(pid).status() == psutil.STATUS_STOPPED
        time.sleep(0.005)
    return n


def test_duty_cycle_never_signals_a_reused_pid(busy: list[Busy]) -> None:
    """A tracked process whose pid now names another process (is_running() compares
    the creation time) is dropped, and not stopped or continued any more."""
    with CpuLimiter.create("duty", 0.5, method="duty-cycle", period_us=50_000) as lim:
        b = Busy(lim)
        busy.append(b)
        deadline = time.monotonic() + 5
        while lim.pids() != [b.proc.pid] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lim.pids() == [b.proc.pid]
        # control: while tracked, the process is seen stopped in part of each period
        assert _stopped_samples(b.proc.pid, 0.5) > 0
        tracked = lim._backend._tracked[b.proc.pid]  # type: ignore[attr-defined]
        tracked.proc.is_running = lambda: False  # what a reused pid looks like
        assert lim.pids() == []
        assert lim.describe()["duty"]["processes_dropped"] == 1
        os.kill(b.proc.pid, signal.SIGCONT)  # in case it was in its stopped phase
        time.sleep(0.3)  # six periods: a signalled process would be stopped in three
        # no longer throttled: never seen stopped over ten periods (sampling its state,
        # not its CPU time, which other jobs on the machine would take from it)
        assert _stopped_samples(b.proc.pid, 0.5) == 0


def test_duty_cycle_survives_exits_and_never_leaves_stopped(busy: list[Busy]) -> None:
    with CpuLimiter.create("duty", 0.3, method="duty-cycle", period_us=50_000) as lim:
        keep, gone = Busy(None), Busy(None)
        busy += [keep, gone]
        lim.add(keep.proc.pid)
        lim.add(gone.proc.pid)
        time.sleep(0.4)
        gone.kill()
        u1 = lim.usage_s()
        time.sleep(0.4)
        assert lim.pids() == [keep.proc.pid]
        assert lim.usage_s() >= u1 > 0
        # close while the process is (most likely) in its stopped phase
        deadline = time.monotonic() + 2
        while (psutil.Process(keep.proc.pid).status() != psutil.STATUS_STOPPED
               and time.monotonic() < deadline):
            time.sleep(0.005)
    assert psutil.Process(keep.proc.pid).status() != psutil.STATUS_STOPPED
    t0 = psutil.Process(keep.proc.pid).cpu_times()
    time.sleep(0.3)
    t1 = psutil.Process(keep.proc.pid).cpu_times()
    assert (t1.user + t1.system) - (t0.user + t0.system) > 0.1  # running freely again


def test_measure_rate_over_pids(busy: list[Busy]) -> None:
    b = Busy(None)
    busy.append(b)
    time.sleep(0.3)
    rate = measure_rate([b.proc.pid], 1.0)
    assert 0.0 < rate <= 1.1
    with pytest.raises(ValueError):
        measure_rate([b.proc.pid], 0)


@needs_cgroup
@pytest.mark.timeout(600)
def test_a_party_in_the_group_sees_its_quota_as_its_cores() -> None:
    """parties.core.sysinfo.cores_allotted reads the quota of the process's own group (it picks
    the worker mode and is the denominator of cpu_util)."""
    assert CGROUP_METHOD is not None
    with CpuLimiter.create("seen", 0.4375, method=CGROUP_METHOD) as lim:
        out = subprocess.run(
            [sys.executable, "-c",
             "from parties.core.sysinfo import cores_allotted; print(cores_allotted())"],
            preexec_fn=lim.preexec(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) == pytest.approx(0.4375)
