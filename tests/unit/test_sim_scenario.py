"""Scenario files: parsing, validation, and scaling CPU ratios to this machine."""

from __future__ import annotations

import pytest

from pubsub.config import ConfigError
from sim.scenario import Scenario, load_scenario, parse_ratio, party_cores

GOOD = """
[scenario]
name = "t"
cpu_ratio = "50:14"
ratio_of = 64

[scenario.passive]
memory_mb = 512

[scenario.passive.link]
latency_s = 0.005
bandwidth_mbps = 100

[[scenario.faults]]
at_s = 9.0
party = "passive"
kind = "disconnect"
duration_s = 2.0

[[scenario.faults]]
at_s = 3.0
party = "passive"
kind = "pause"
duration_s = 5.0

[vfl]
dataset = "bank"
epochs = 2
"""


def test_load_and_scale(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text(GOOD)
    scn, vfl = load_scenario(p, ["vfl.epochs=3", "scenario.timeout_s=60"])
    assert vfl == {"dataset": "bank", "epochs": 3}
    assert scn.timeout_s == 60
    assert [f.kind for f in scn.faults] == ["pause", "disconnect"]  # sorted by time
    assert scn.passive.link.bandwidth_mbps == 100 and scn.passive.link.shaped
    assert not scn.active.link.shaped
    assert party_cores(scn, 2) == pytest.approx({"active": 1.5625, "passive": 0.4375})
    assert party_cores(scn, 64) == pytest.approx({"active": 50, "passive": 14})


def test_ratio_without_ratio_of_uses_its_sum():
    scn = Scenario(cpu_ratio="1:1")
    assert party_cores(scn, 2) == {"active": 1.0, "passive": 1.0}
    assert parse_ratio("40:24") == (40.0, 24.0)


@pytest.mark.parametrize("text, key", [
    ("[scenario]\ncpu_ratio = '50'\n", "cpu_ratio"),
    ("[scenario]\ncpu_ratio = '0:1'\n", "cpu_ratio"),
    ("[scenario]\ncpu_ratio = '1:1'\nbogus = 1\n", "scenario.bogus"),
    ("[scenario]\ncpu_ratio = '1:1'\n[[scenario.faults]]\nat_s = 1\nparty = 'x'\nkind = 'kill'\n",
     "faults.party"),
    ("[scenario]\ncpu_ratio = '1:1'\n[[scenario.faults]]\nat_s = 1\nparty = 'active'\n"
     "kind = 'pause'\n", "faults.duration_s"),
    ("[scenario]\ncpu_ratio = '1:1'\n[[scenario.faults]]\nat_s = 1\nparty = 'active'\n"
     "kind = 'kill'\nafter_epochs = -1\n", "faults.after_epochs"),
    ("[scenario]\ncpu_ratio = '1:1'\n[[scenario.faults]]\nat_s = 1\nparty = 'active'\n"
     "kind = 'kill'\nafter_epochs = 1.5\n", "after_epochs"),
    ("[scenario]\ncpu_ratio = '1:1'\n[scenario.active.link]\nloss = 1.5\n", "link.loss"),
    ("[scenario]\n", "cpu_ratio"),
    ("[other]\n", "other"),
])
def test_bad_scenarios_name_the_key(tmp_path, text, key):
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_scenario(p)


def test_too_many_cores_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="machine has 2"):
        party_cores(Scenario(cpu_ratio="3:1", ratio_of=2), 2)
    with pytest.raises(ConfigError, match="not found"):
        load_scenario(tmp_path / "nope.toml")


def test_shipped_vfl_scenario_loads_and_matches_the_readme() -> None:
    from pathlib import Path

    from sim.scenario import load_scenario

    root = Path(__file__).resolve().parents[2]
    path = root / "sim" / "scenarios" / "vfl_50_14.toml"
    scn, vfl = load_scenario(path)
    assert scn.cpu_ratio == "50:14" and [f.kind for f in scn.faults] == ["pause"]
    assert vfl["algo"] == "pubsub"
    body = "\n".join(line for line in path.read_text().splitlines()
                     if not line.startswith("#"))
    assert body.strip() in (root / "docs" / "vfl.md").read_text()
