"""CpuMeter's child enumeration: /proc children files agree with psutil's full scan."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from parties.core import sysinfo


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux only")
def test_child_pids_match_psutil_and_meter_counts_children() -> None:
    code = "import subprocess, time; p = subprocess.Popen(['sleep', '5']); time.sleep(5)"
    kids = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    try:
        me = psutil.Process()
        deadline = time.monotonic() + 5
        def ours() -> set[int]:  # the two children and their grandchildren
            return {k.pid for k in kids} | {g.pid for k in kids
                                            for g in psutil.Process(k.pid).children()}

        while len(ours()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = sysinfo._child_pids(me.pid)
        assert found is not None
        assert sorted(found) == sorted(p.pid for p in me.children(recursive=True))
        # (other tests may leave long-lived children, e.g. multiprocessing's resource tracker)
        assert len(ours()) == 4 and ours() <= set(found)
        meter = sysinfo.CpuMeter()
        meter.start()
        wall, cpu, cores, util = meter.read()
        assert wall >= 0 and cpu >= 0 and cores >= 1 and util >= 0
    finally:
        for k in kids:
            k.kill()
            k.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux only")
def test_run_delay_is_seconds_and_never_decreases() -> None:
    a = sysinfo.run_delay_s()
    assert a is not None and a >= 0.0
    sum(i * i for i in range(200_000))
    b = sysinfo.run_delay_s()
    assert b is not None and b >= a


def test_cores_allotted_takes_a_launchers_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sysinfo.CORES_ENV, raising=False)
    free = sysinfo.cores_allotted()
    monkeypatch.setenv(sysinfo.CORES_ENV, "0.4375")
    assert sysinfo.cores_allotted() == min(free, 0.4375)
    monkeypatch.setenv(sysinfo.CORES_ENV, "1e9")  # never more than the machine gives
    assert sysinfo.cores_allotted() == free
    for bad in ("0", "-1", "nan", "inf", "two"):
        monkeypatch.setenv(sysinfo.CORES_ENV, bad)
        with pytest.raises(ValueError, match=repr(bad)):
            sysinfo.cores_allotted()
