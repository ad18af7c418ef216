"""Scenario files: parsing, validation, and scaling CPU ratios to this machine."""

from __future__ import annotations

import pytest

from pubsub.config import ConfigError
from sim.cluster.scenario import (FaultSpec, PartySpec, Scenario, load_scenario, parse_ratio,
                          party_cores)

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

    from sim.cluster.scenario import load_scenario

    root = Path(__file__).resolve().parents[2]
    path = root / "sim" / "scenarios" / "vfl_50_14.toml"
    scn, vfl = load_scenario(path)
    assert scn.cpu_ratio == "50:14" and [f.kind for f in scn.faults] == ["pause"]
    assert vfl["algo"] == "pubsub"
    body = "\n".join(line for line in path.read_text().splitlines()
                     if not line.startswith("#"))
    assert body.strip() in (root / "docs" / "how-to" / "scenarios-and-faults.md").read_text()


MULTI = """
[scenario]
cpu_ratio = "40:24"
ratio_of = 64

[scenario.passive2]
memory_mb = 256

[scenario.passive2.link]
latency_s = 0.01

[[scenario.faults]]
at_s = 1.0
party = "passive2"
kind = "pause"
duration_s = 2.0

[vfl]
passive_parties = 2
"""

PARTIES3 = ("active", "passive", "passive2")


def test_several_passive_parties_get_tables_shares_and_faults(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text(MULTI)
    scn, vfl = load_scenario(p)
    assert vfl == {"passive_parties": 2}
    assert scn.party("passive2").link.latency_s == 0.01 and scn.party("passive2").link.shaped
    assert scn.party("passive2").memory_mb == 256
    assert scn.party("passive3").link.shaped is False  # not named: the defaults
    assert [f.party for f in scn.faults] == ["passive2"]
    # "A:P" splits P equally among the passive parties
    assert party_cores(scn, 2, PARTIES3) == pytest.approx(
        {"active": 1.25, "passive": 0.375, "passive2": 0.375})
    # one share per party
    scn4 = Scenario(cpu_ratio="40:8:8:8", ratio_of=64)
    assert party_cores(scn4, 64, ("active", "passive", "passive2", "passive3")) == \
        pytest.approx({"active": 40, "passive": 8, "passive2": 8, "passive3": 8})
    assert party_cores(Scenario(cpu_ratio="50:14", ratio_of=64), 2) == pytest.approx(
        {"active": 1.5625, "passive": 0.4375})  # two parties: as before


@pytest.mark.parametrize("text, key", [
    ('[scenario]\ncpu_ratio = "1:1"\n[scenario.passive12]\ncores = 1\n', "passive12"),
    ('[scenario]\ncpu_ratio = "1:1"\n[scenario.passive2]\nspeed = 1\n', "speed"),
    ('[scenario]\ncpu_ratio = "1:1"\n[[scenario.faults]]\nat_s = 1\nparty = "passive10"\n'
     'kind = "kill"\n', "faults.party"),
    ('[scenario]\ncpu_ratio = "1:1"\nmore = []\n', "scenario.more"),
])
def test_bad_multiparty_scenarios_name_the_key(tmp_path, text, key):
    p = tmp_path / "b.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=key):
        load_scenario(p)


def test_a_ratio_that_fits_no_party_count_or_a_party_without_cores_is_refused():
    with pytest.raises(ConfigError, match="3 shares for 4 parties"):
        party_cores(Scenario(cpu_ratio="4:2:2"), 2,
                    ("active", "passive", "passive2", "passive3"))
    with pytest.raises(ConfigError, match="passive2"):
        party_cores(Scenario(active=PartySpec(cores=0.5), passive=PartySpec(cores=0.5)), 2,
                    PARTIES3)
    with pytest.raises(ConfigError, match="asks for|ask for"):
        party_cores(Scenario(cpu_ratio="1:1:1", machine_cores=1.0, ratio_of=1.0), 2, PARTIES3)


def test_a_fault_on_a_party_the_run_lacks_is_refused_before_anything_starts(tmp_path):
    from parties.config import VflConfig
    from sim.cluster.runner import run_scenario

    scn = Scenario(cpu_ratio="1:1", faults=(FaultSpec(at_s=1.0, party="passive3",
                                                      kind="kill"),))
    with pytest.raises(ConfigError, match="'passive3' is not a party of this run"):
        run_scenario(scn, VflConfig(dataset="bank", passive_parties=2), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_path_mbps_is_the_slowest_limited_link_of_the_run() -> None:
    from sim.cluster.scenario import LinkConfig, path_mbps

    def spec(mbps: float) -> PartySpec:
        return PartySpec(link=LinkConfig(latency_s=0.02, bandwidth_mbps=mbps))

    scn = Scenario(cpu_ratio="1:1", passive=spec(100.0),
                   more=(("passive2", spec(20.0)),))
    assert path_mbps(scn) == 100.0
    assert path_mbps(scn, ("active", "passive", "passive2")) == 20.0
    assert path_mbps(Scenario(cpu_ratio="1:1")) == 0.0  # no limited link: unknown
