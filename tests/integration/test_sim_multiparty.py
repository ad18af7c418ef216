"""`psfl sim run` with three parties (the active party and two passive ones) as real
processes: per-party CPU shares, a shaped link and a pause of the second passive party
past T_ddl, which the run survives with drops counted against that party."""

from __future__ import annotations

import json

import pytest

from tests.conftest import psfl_in_process
from tests.bounds import above, below

SCENARIO = """
[scenario]
name = "three parties"
cpu_ratio = "1:1"      # the active party 1 core, the two passive parties 0.5 each
cpu_method = "auto"
timeout_s = 240
end_margin_s = 5.0

[scenario.passive2.link]
latency_s = 0.002

[[scenario.faults]]
after_epochs = 1
at_s = 0.0
party = "passive2"
kind = "pause"
duration_s = 4.0

[vfl]
algo = "pubsub"
dataset = "bank"
passive_parties = 2
epochs = 3
timeouts.t_ddl_s = 2.0
timeouts.liveness_timeout_s = 30.0
eval_every = 1000
"""


@pytest.mark.stochastic
@pytest.mark.timeout(600)
def test_three_parties_on_a_simulated_cluster_survive_a_paused_passive_party(tmp_path, capfd):
    scn = tmp_path / "s.toml"
    scn.write_text(SCENARIO)
    out = tmp_path / "run"
    res = psfl_in_process(capfd, "sim", "run", str(scn), "--out", str(out), "--quiet")
    text = res.stdout + res.stderr
    assert res.returncode == 0, text[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    s = m["sim"]
    assert s["end_state"] == "completed", s
    assert s["exit_codes"] == {"active": 0, "passive": 0, "passive2": 0}
    assert [(f["party"], f["kind"]) for f in s["faults"]] == [("passive2", "pause")]
    assert s["faults_not_fired"] == []
    assert sorted(s["cpu"]) == ["active", "passive", "passive2"]
    assert s["cpu"]["active"]["quota_cores"] == pytest.approx(1.0)
    assert s["cpu"]["passive2"]["quota_cores"] == pytest.approx(0.5)
    assert s["relays"]["passive2"]["bytes_up"] > 0 and "passive" not in s["relays"]
    assert s["scenario"]["links"]["passive2"]["latency_s"] == 0.002
    # the pause outlasted T_ddl: batches missed by passive2, not by passive
    missed = m["parties"]["active"]["missed_by_party"]
    assert missed.get("passive2", 0) > 0, missed
    assert missed.get("passive", 0) < missed["passive2"], missed
    assert sorted(m["parties"]) == ["active", "passive", "passive2"]
    above(m["metric"], 0.80, "test AUC")
    assert "passive2" in text  # the summary names every party
