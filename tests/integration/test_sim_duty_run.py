"""`psfl sim run` under the duty-cycle fallback (no cgroup): the parties are told their
shares, so their CPU use is judged against the quota, not the ⌈quota⌉ pinned CPUs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from parties.data import load_table
from tests.conftest import psfl_in_process

SCENARIO = """
[scenario]
name = "duty-cycle shares"
cpu_ratio = "1:3"
ratio_of = 4
cpu_method = "duty-cycle"
timeout_s = 240

[vfl]
algo = "pubsub"
dataset = "{dataset}"
label = "y"
epochs = 1
"""


@pytest.mark.timeout(600)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_duty_cycle_parties_know_their_share(tmp_path: Path,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    # 6,000 rows of bank: the shares are enforced from the parties' start (most of the
    # run is their start-up under the duty cycle), so full bank's epoch adds only time
    data = tmp_path / "bank_sample.csv"
    load_table("bank")[0].sample(n=6000, random_state=0).to_csv(data, index=False)
    scn = tmp_path / "s.toml"
    scn.write_text(SCENARIO.format(dataset=data))
    out = tmp_path / "run"
    # the launcher in this process (its duty-cycle thread here); broker and parties are
    # processes
    proc = psfl_in_process(capfd, "sim", "run", str(scn), "--out", str(out), "--quiet")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    cores = len(os.sched_getaffinity(0))
    quota = {"active": cores * 1 / 4, "passive": cores * 3 / 4}
    for role in ("active", "passive"):
        lim = m["sim"]["cpu_limits"][role]
        assert lim["method"] == "duty-cycle"
        # pinned to ⌈quota⌉ CPUs, but the party's cores are the quota
        assert len(lim["cpus"]) == -(-quota[role] // 1)
        assert m["parties"][role]["cores_allotted"] == pytest.approx(quota[role])
        assert 0 < m["parties"][role]["cpu_util_train"] <= 1.10
        duty = lim["duty"]
        assert duty["error"] is None and duty["thread_alive"]  # described before close
        if quota[role] % 1:  # a fractional share is stopped every period
            assert duty["sigstop_sent"] > 0 and duty["periods"] > 0
