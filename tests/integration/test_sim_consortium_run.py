"""A small, fast consortium scenario through ``psfl sim run`` (sim/cluster/consortium_run.py):
three sites of unequal size, one behind a shaped link, one stopped (SIGSTOP) through
AIM's first adaptive round, a workload update; the run finishes, the offline site's round
is recorded as dropped and completed from the cache, the link is measured, the report
and the timeline are written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest


def _table(n: int = 3000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    a = rng.choice(["x", "y", "z"], n, p=[0.5, 0.3, 0.2])
    b = np.where(a == "x", rng.choice(["u", "v"], n, p=[0.9, 0.1]),
                 rng.choice(["u", "v"], n, p=[0.2, 0.8]))
    age = rng.integers(18, 80, n)
    income = (rng.random(n) < np.where(b == "u", 0.7, 0.2)).astype(int)
    return pd.DataFrame({"a": a, "b": b, "age": age, "income": income})


SCENARIO = """
[consortium]
name = "small"
hours = 48.0
seconds_per_hour = 0.5
# a hang bound: about 40 s quiet, 88 s beside two CPU hogs and five other test workers
timeout_s = 300

[[consortium.parties]]
name = "small-site"
rows_equiv = 10000
[[consortium.parties]]
name = "vpn-site"
rows_equiv = 50000
link = {{ latency_s = 0.05, bandwidth_mbps = 5.0 }}
[[consortium.parties]]
name = "offline-site"
rows_equiv = 100000

[consortium.offline]
party = "offline-site"
start = "select:aim0 started"
end = "round:aim0 done"

[consortium.workload_update]
at = "round:aim0 done"
marginals = [["a", "b", "income"]]

[synth]
dataset = "{csv}"
label = "income"
mechanism = "aim"
seed = 3
aim = {{ rounds = 2, batch = 2 }}
engine = {{ name = "neural", iters = 100 }}
timeouts = {{ round_timeout_s = 3.0, handshake_timeout_s = 60.0 }}
stream.rho_frac = 0.2

[synth.secagg]
fanout = 2
# three sites, one offline through a round: its noise is calibrated so that two
# survivors' sum carries the charged noise (the default, ceil(0.7 * 3) = 3, would make
# the survivors refuse to unmask that round)
min_survivors = 2
"""


@pytest.mark.timeout(600)
def test_small_consortium_runs_to_the_end_with_its_events(tmp_path: Path) -> None:
    from sim.cli import main

    csv = tmp_path / "table.csv"
    _table().to_csv(csv, index=False)
    scn = tmp_path / "small.toml"
    scn.write_text(SCENARIO.format(csv=csv))
    out = tmp_path / "run"
    assert main(["sim", "run", str(scn), "--out", str(out), "--quiet"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    c = m["consortium"]
    assert m["avg_tv"] > 0 and (out / "synthetic.csv").stat().st_size > 0
    # sizes: 2,400 training rows cut 1:5:10
    assert [s["rows"] for s in c["sites"]] == [150, 750, 1500]
    assert c["scaling"]["equiv_per_row"] == pytest.approx(160000 / 2400, rel=1e-3)
    # the offline site missed AIM's first adaptive round; it was completed from the cache
    off = c["offline"]
    assert off["fired"] and off["party"] == "p002" and off["rounds_missed"] == ["aim0"]
    assert m["rounds"]["aim0"]["dropped"] == ["p002"]
    assert off["cached_cliques"] == 2 and off["rounds_skipped_by_party"] == ["aim0"]
    assert off["fraction_of_rounds"] == pytest.approx(1 / 5)  # one_way .. aim1, wl0
    assert [(r["round"], r["survivors"]) for r in off["rounds_in_window"]] == [("aim0", 2)]
    assert all(m["rounds"][r]["survivors"] == 3 for r in ("one_way", "select", "aim1"))
    # the shaped link: configured, probed through the same relay model, carried the traffic
    link = c["links"]["vpn-site"]
    assert link["configured"]["latency_s"] == 0.05
    assert 0.045 < link["probe"]["one_way_64B_s"] < 0.2
    assert 3.5 < link["probe"]["goodput_mbps"] < 5.5
    assert link["relay"]["bytes_up"] > 0 and link["relay"]["bytes_down"] > 0
    # the workload update was handed in at the stage and measured within the run
    wu = c["workload_update"]
    assert wu["at"] == "round:aim0 done" and wu["status"] == "submitted" and wu["taken_up"]
    (upd,) = m["workload_updates"]
    assert upd["status"] == "measured" and upd["requested"] == [["a", "b", "income"]]
    # the timeline has the stages and the scenario's events, in order
    names = [e["event"] for e in c["timeline"]]
    for ev in ("sim.offline.start", "sim.offline.end", "sim.workload_update",
               "synth.round_skipped"):
        assert ev in names, ev
    assert names.index("sim.offline.start") < names.index("sim.offline.end")
    hours = [e["hour"] for e in c["timeline"]]
    assert hours == sorted(hours)
    assert m["ledger_within_plan"] is True
    report = (out / "report.md").read_text()
    assert "offline-site" in report and "## Timeline" in report
    assert (out / "timeline.png").stat().st_size > 10_000
