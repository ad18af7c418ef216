"""Pure parts of the per-party CPU shares (sim/cluster/cpu.py): no root, no cgroups."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cluster.cpu import (
    MIN_QUOTA_US,
    CgroupMount,
    CpuLimiter,
    CpuLimitUnavailable,
    ShareError,
    _group_dir,
    _sanitize,
    cpu_stat_usage_s,
    cpuacct_usage_s,
    machine_cores,
    parse_cpu_stat,
    parse_mountinfo,
    parse_proc_cgroup,
    quota_for,
    scale_shares,
)

# ------------------------------------------------------------------ scale_shares


def test_scale_shares_paper_ratio_on_two_cores() -> None:
    assert scale_shares("50:14", 2) == (1.5625, 0.4375)


def test_scale_shares_sequence_and_spaces() -> None:
    assert scale_shares([1, 1, 2], 4.0) == (1.0, 1.0, 2.0)
    assert scale_shares(" 3 : 1 ", 2) == (1.5, 0.5)
    assert scale_shares("7", 2) == (2.0,)
    shares = scale_shares("50:14", 64)
    assert shares == (50.0, 14.0)
    assert math.isclose(sum(scale_shares("1:2:3:4", 3.0)), 3.0)


@pytest.mark.parametrize("ratio, bad", [
    ("50:0", "0"), ("50:-14", "-14"), ("abc:1", "abc"), ("1:nan", "nan"), ("1:inf", "inf"),
])
def test_scale_shares_names_the_bad_part(ratio: str, bad: str) -> None:
    with pytest.raises(ShareError) as info:
        scale_shares(ratio, 2)
    assert isinstance(info.value, ValueError)
    assert info.value.value == bad
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("ratio", ["", "  ", "50:", ":14", "50::14"])
def test_scale_shares_malformed(ratio: str) -> None:
    with pytest.raises(ShareError) as info:
        scale_shares(ratio, 2)
    assert info.value.value == ratio


def test_scale_shares_bad_sequence_and_total() -> None:
    with pytest.raises(ShareError):
        scale_shares([], 2)
    with pytest.raises(ShareError) as info:
        scale_shares([1.0, -2.0], 2)
    assert info.value.value == -2.0
    with pytest.raises(ShareError):
        scale_shares("1:1", 0)
    with pytest.raises(ShareError):
        scale_shares("1:1", float("nan"))


def test_machine_cores() -> None:
    assert machine_cores() == len(os.sched_getaffinity(0))


# ------------------------------------------------------------------ quota_for


def test_quota_for() -> None:
    assert quota_for(0.5, 100_000) == 50_000
    assert quota_for(1.5625, 100_000) == 156_250
    assert quota_for(0.4375, 100_000) == 43_750
    assert quota_for(3.0, 1_000_000) == 3_000_000
    assert quota_for(0.001, 100_000) == MIN_QUOTA_US  # 100 µs → kernel minimum 1 ms
    assert quota_for(0.5, 1000) == MIN_QUOTA_US


@pytest.mark.parametrize("period", [999, 1_000_001, 0, -5])
def test_quota_for_period_range(period: int) -> None:
    with pytest.raises(ValueError, match="period_us"):
        quota_for(1.0, period)


def test_quota_for_bad_cores() -> None:
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ShareError):
            quota_for(bad, 100_000)
    with pytest.raises(ValueError):
        quota_for(1.0, 100_000.0)  # type: ignore[arg-type]


# ------------------------------------------------------------------ stat parsing


def test_parse_cpu_stat_v2_and_v1() -> None:
    v2 = ("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n"
          "nr_periods 10\nnr_throttled 3\nthrottled_usec 4000\n")
    assert parse_cpu_stat(v2)["nr_throttled"] == 3
    assert cpu_stat_usage_s(v2) == 1.5
    v1 = "nr_periods 33\nnr_throttled 32\nthrottled_time 1592293067\nnr_bursts 0\n"
    assert parse_cpu_stat(v1) == {"nr_periods": 33, "nr_throttled": 32,
                                  "throttled_time": 1592293067, "nr_bursts": 0}
    with pytest.raises(ValueError, match="usage_usec"):
        cpu_stat_usage_s(v1)
    assert parse_cpu_stat("garbage\nkey notanumber\n\n") == {}


def test_cpuacct_usage() -> None:
    assert cpuacct_usage_s("2500000000\n") == 2.5
    assert cpuacct_usage_s("0") == 0.0
    for bad in ("", "12 13", "-1", "x"):
        with pytest.raises(ValueError):
            cpuacct_usage_s(bad)


HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
22 1 0:20 / /proc rw,nosuid - proc proc rw
"""

COMOUNTED = """\
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
"""

PURE_V2 = """\
29 23 0:26 /docker/abc /sys/fs/cgroup rw,nosuid,nodev,noexec - cgroup2 cgroup2 rw,nsdelegate
"""


def test_parse_mountinfo_hybrid() -> None:
    mounts = parse_mountinfo(HYBRID)
    assert [(str(m.mount_point), m.version, m.controllers) for m in mounts] == [
        ("/sys/fs/cgroup/cpu", 1, ("cpu",)),
        ("/sys/fs/cgroup/cpuacct", 1, ("cpuacct",)),
        ("/sys/fs/cgroup/systemd", 1, ()),
        ("/sys/fs/cgroup/unified", 2, ()),
    ]


def test_parse_mountinfo_comounted_and_v2() -> None:
    (m,) = parse_mountinfo(COMOUNTED)
    assert m.controllers == ("cpu", "cpuacct")
    assert m.mount_point == Path("/sys/fs/cgroup/cpu,cpuacct")
    (v2,) = parse_mountinfo(PURE_V2)
    assert v2 == CgroupMount(mount_point=Path("/sys/fs/cgroup"), root="/docker/abc",
                             version=2, controllers=())


def test_parse_mountinfo_escapes() -> None:
    line = r"50 31 0:40 / /mnt/cg\040x rw - cgroup2 cgroup2 rw" + "\n"
    (m,) = parse_mountinfo(line)
    assert m.mount_point == Path("/mnt/cg x")


def test_parse_proc_cgroup_and_group_dir() -> None:
    own = parse_proc_cgroup("2:cpuacct:/\n1:cpu:/a/b\n4:memory:/x\n0::/user.slice/s\n")
    assert own == {"cpuacct": "/", "cpu": "/a/b", "memory": "/x", "": "/user.slice/s"}
    top = CgroupMount(mount_point=Path("/sys/fs/cgroup/cpu"), root="/", version=1,
                      controllers=("cpu",))
    assert _group_dir(top, "/") == Path("/sys/fs/cgroup/cpu")
    assert _group_dir(top, "/a/b") == Path("/sys/fs/cgroup/cpu/a/b")
    assert _group_dir(top, None) == Path("/sys/fs/cgroup/cpu")
    ns = CgroupMount(mount_point=Path("/sys/fs/cgroup"), root="/docker/abc", version=2,
                     controllers=())
    assert _group_dir(ns, "/docker/abc") == Path("/sys/fs/cgroup")
    assert _group_dir(ns, "/docker/abc/sub") == Path("/sys/fs/cgroup/sub")
    assert _group_dir(ns, "/elsewhere") == Path("/sys/fs/cgroup")


def test_sanitize_names() -> None:
    assert _sanitize("active") == "active"
    assert _sanitize("party a/../b") == "party_a_.._b"
    assert _sanitize("///") == "group"


# ------------------------------------------------------------------ limiter, no enforcement


def test_errors_are_typed() -> None:
    exc = CpuLimitUnavailable("cgroup-v2", "/sys/fs/cgroup/x", "no cpu controller")
    assert isinstance(exc, RuntimeError)
    assert exc.path == Path("/sys/fs/cgroup/x") and exc.method == "cgroup-v2"
    assert "/sys/fs/cgroup/x" in str(exc) and "no cpu controller" in str(exc)


def test_create_validates() -> None:
    with pytest.raises(ShareError):
        CpuLimiter.create("x", 0, method="none")
    with pytest.raises(ValueError, match="method"):
        CpuLimiter.create("x", 1.0, method="cgroup-v3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="period_us"):
        CpuLimiter.create("x", 1.0, method="none", period_us=10)


@pytest.mark.timeout(600)
def test_none_limiter_tracks_usage_and_closes() -> None:
    with CpuLimiter.create("unit", 0.5, method="none") as lim:
        assert lim.method == "none" and lim.path is None and lim.cores == 0.5
        d = lim.describe()
        assert json.loads(json.dumps(d)) == d
        assert d["method"] == "none" and d["note"]
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time\nt=time.process_time()\n"
             "while time.process_time() - t < 0.3: pass"],
            preexec_fn=lim.preexec())
        assert proc.wait(20) == 0
        # the child reported its pid through the pipe but exited before anything
        # sampled it: psutil tracking cannot see its CPU time (documented limit)
        assert lim.usage_s() >= 0.0
        assert lim.pids() == []
    assert lim.closed
    lim.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        lim.preexec()
    with pytest.raises(RuntimeError, match="closed"):
        lim.add(os.getpid())


def test_add_missing_process() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with CpuLimiter.create("unit", 1.0, method="none") as lim, \
            pytest.raises(ProcessLookupError):
        lim.add(dead.pid)


# ------------------------------------------------------------------ fake cgroup trees


def _fake_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mountinfo: str,
               proc_cgroup: str) -> None:
    import sim.cluster.cpu as cpu

    (tmp_path / "mountinfo").write_text(mountinfo)
    (tmp_path / "cgroup").write_text(proc_cgroup)
    monkeypatch.setattr(cpu, "_PROC_MOUNTINFO", tmp_path / "mountinfo")
    monkeypatch.setattr(cpu, "_PROC_CGROUP", tmp_path / "cgroup")


def test_auto_falls_back_to_duty_cycle_with_a_note(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    _fake_proc(monkeypatch, tmp_path, "22 1 0:20 / /proc rw - proc proc rw\n", "0::/\n")
    with CpuLimiter.create("fb", 0.5) as lim:
        assert lim.method == "duty-cycle" and lim.path is None
        note = lim.describe()["note"]
        assert "cgroups not usable" in note and "no cgroup2 mount" in note
        assert "no cgroup-v1 'cpu' hierarchy" in note and "SIGSTOP/SIGCONT" in note
    for method in ("cgroup-v1", "cgroup-v2"):
        with pytest.raises(CpuLimitUnavailable) as info:
            CpuLimiter.create("fb", 0.5, method=method)  # type: ignore[arg-type]
        assert info.value.method == method and info.value.path is not None


@pytest.mark.timeout(600)
def test_cgroup_v2_logic_on_a_fake_tree(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    """cgroup2 is not writable for the cpu controller on every machine: check the file
    protocol (subtree_control, cpu.max, cpu.weight, cgroup.procs, cpu.stat) on a fake
    tree of regular files."""
    import sim.cluster.cpu as cpu

    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("\n")
    (root / "psfl").mkdir()  # a real cgroupfs creates the interface files on mkdir
    (root / "psfl" / "cgroup.subtree_control").write_text("\n")
    _fake_proc(monkeypatch, tmp_path,
               f"29 23 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw\n", "0::/\n")
    real_make = cpu._make_group

    def make_group(base: Path, name: str, method: str) -> Path:
        group = real_make(base, name, method)
        for f in ("cgroup.procs", "cpu.max", "cpu.weight", "cpu.max.burst"):
            (group / f).touch()
        (group / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
        return group

    removed: list[Path] = []

    def rmdir_group(group: Path, home: Path, timeout_s: float = 5.0) -> bool:
        removed.append(group)
        return True

    monkeypatch.setattr(cpu, "_make_group", make_group)
    monkeypatch.setattr(cpu, "_rmdir_group", rmdir_group)
    lim = CpuLimiter.create("v2", 1.5625, method="auto")
    with lim:
        assert lim.method == "cgroup-v2" and lim.path is not None
        assert lim.path.parent == root / "psfl"
        assert lim.path.name.startswith(f"psfl-v2-{os.getpid()}-")
        assert (root / "cgroup.subtree_control").read_text() == "+cpu"
        assert (root / "psfl" / "cgroup.subtree_control").read_text() == "+cpu"
        assert (lim.path / "cpu.max").read_text() == "156250 100000"
        assert (lim.path / "cpu.weight").read_text() == "156"
        assert (lim.path / "cpu.max.burst").read_text() == "0"
        assert lim.usage_s() == 2.5
        assert lim.describe()["quota_us"] == 156250
        child = subprocess.Popen([sys.executable, "-c", "pass"], preexec_fn=lim.preexec())
        child.wait(20)
        assert (lim.path / "cgroup.procs").read_text() == str(child.pid)
    assert removed == [lim.path]


def test_cgroup_v2_without_cpu_controller(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("hugetlb\n")
    _fake_proc(monkeypatch, tmp_path,
               f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n", "0::/\n")
    with pytest.raises(CpuLimitUnavailable) as info:
        CpuLimiter.create("v2", 1.0, method="cgroup-v2")
    assert info.value.path == root / "cgroup.controllers"
    assert "cpu controller" in info.value.reason and "hugetlb" in info.value.reason
