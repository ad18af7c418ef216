"""The consortium scenario file (sim/cluster/consortium.py): parsing, validation (unknown keys
rejected, bad values named), the [synth] keys it fixes, and CLI dispatch on the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsub.config import ConfigError
from sim.cluster.consortium import (load_consortium, parse_consortium, parse_when, scenario_kind,
                            synth_table)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "sim" / "scenarios" / "consortium.toml"

GOOD = """
[consortium]
name = "t"
hours = 48
seconds_per_hour = 2.5

[[consortium.parties]]
name = "a"
rows_equiv = 10000
[[consortium.parties]]
name = "b"
rows_equiv = 500000
link = { latency_s = 0.2, bandwidth_mbps = 1 }

[consortium.offline]
party = "a"
start = 12
end = "round:aim2 done"

[consortium.workload_update]
at = 24.0
marginals = [["x", "y", "z"]]

[consortium.kill_coordinator]
at = "round:select@unmask"

[synth]
dataset = "adult"
mechanism = "aim"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_good_file_parses(tmp_path: Path) -> None:
    cons, synth = load_consortium(_write(tmp_path, GOOD))
    assert [p.name for p in cons.parties] == ["a", "b"]
    assert cons.parties[1].link.latency_s == 0.2 and cons.parties[1].link.shaped
    assert not cons.parties[0].link.shaped
    assert cons.offline is not None and cons.offline.start == 12.0
    assert cons.offline.end == "round:aim2 done"
    assert cons.workload_update is not None and cons.workload_update.at == 24.0
    assert cons.workload_update.queries() == {"marginals": [["x", "y", "z"]],
                                              "rho_share": 0.5}
    assert cons.kill_coordinator is not None and cons.kill_coordinator.at == "round:select@unmask"
    assert cons.wall_s(6) == 15.0
    assert synth == {"dataset": "adult", "mechanism": "aim"}
    fixed = synth_table(cons, synth)
    assert fixed["parties"] == 2 and fixed["data"]["split"] == "sizes"
    assert fixed["data"]["party_weights"] == [10000.0, 500000.0]
    assert fixed["launch"]["parties_per_process"] == 1
    assert scenario_kind(_write(tmp_path, GOOD)) == "consortium"


def test_set_overrides(tmp_path: Path) -> None:
    cons, synth = load_consortium(_write(tmp_path, GOOD), [
        "consortium.seconds_per_hour=1", 'consortium.offline.start="select:aim1 started"',
        "synth.epsilon=2"])
    assert cons.seconds_per_hour == 1.0 and synth["epsilon"] == 2
    assert cons.offline is not None and cons.offline.start == "select:aim1 started"


@pytest.mark.parametrize(("edit", "key"), [
    (("seconds_per_hour = 2.5", "seconds_per_hour = 2.5\nspeed = 3"), "consortium.speed"),
    (('rows_equiv = 10000', 'rows_equiv = 10000\nbeds = 3'), "consortium.parties[0].beds"),
    (("latency_s = 0.2,", "latency_ms = 0.2,"), "consortium.parties[1].link.latency_ms"),
    (('end = "round:aim2 done"', 'end = "round:aim2 done"\nwhy = 1'), "consortium.offline.why"),
    (("[synth]", "[vfl]\n[synth]"), "vfl"),
])
def test_unknown_keys_are_rejected(tmp_path: Path, edit: tuple[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_consortium(_write(tmp_path, GOOD.replace(*edit, 1)))
    assert key in str(exc.value)


@pytest.mark.parametrize(("edit", "key", "why"), [
    (("seconds_per_hour = 2.5", "seconds_per_hour = 0"), "consortium.seconds_per_hour", "> 0"),
    (("rows_equiv = 10000", "rows_equiv = -1"), "rows_equiv", "> 0"),
    (("bandwidth_mbps = 1", "bandwidth_mbps = -1"), "bandwidth_mbps", ">= 0"),
    (('party = "a"', 'party = "z"'), "consortium.offline.party", "unknown site 'z'"),
    (('end = "round:aim2 done"', "end = 6"), "consortium.offline.end", "after start"),
    (('end = "round:aim2 done"', 'end = "round:aim2 finished"'), "consortium.offline.end",
     "STAGE done"),
    (("start = 12", "start = -1"), "consortium.offline.start", ">= 0"),
    (('marginals = [["x", "y", "z"]]', "marginals = [[]]"),
     "consortium.workload_update.marginals", "non-empty"),
    (('marginals = [["x", "y", "z"]]', 'marginals = "x"'),
     "consortium.workload_update.marginals", "lists of column names"),
    (('name = "b"', 'name = "a"'), "consortium.parties.name", "duplicate"),
    (('at = "round:select@unmask"', 'at = "round:select"\nrestart_after_s = -1'),
     "restart_after_s", ">= 0"),
])
def test_bad_values_are_named(tmp_path: Path, edit: tuple[str, str], key: str,
                              why: str) -> None:
    text = GOOD.replace(*edit, 1)
    assert text != GOOD
    with pytest.raises(ConfigError) as exc:
        load_consortium(_write(tmp_path, text))
    assert key in str(exc.value) and why in str(exc.value)


def test_one_site_is_not_a_consortium() -> None:
    with pytest.raises(ConfigError, match="at least 2 sites"):
        parse_consortium({"parties": [{"name": "a", "rows_equiv": 1}]})


def test_synth_keys_the_scenario_fixes_are_refused(tmp_path: Path) -> None:
    cons, synth = load_consortium(_write(tmp_path, GOOD.replace("[synth]",
                                                                "[synth]\nparties = 3")))
    with pytest.raises(ConfigError, match="synth.parties"):
        synth_table(cons, synth)
    cons, synth = load_consortium(_write(tmp_path, GOOD.replace(
        "[synth]", "[synth]\ndata.split = \"iid\"")))
    with pytest.raises(ConfigError, match="synth.data.split"):
        synth_table(cons, synth)
    same = GOOD + "[synth.data]\nparty_weights = [10000, 500000]\n"  # what it fixes anyway
    cons, synth = load_consortium(_write(tmp_path, same))
    assert synth_table(cons, synth)["data"]["party_weights"] == [10000.0, 500000.0]


def test_stage_names_are_checked_against_the_run(tmp_path: Path) -> None:
    from sim.cluster.consortium_run import build_config

    cons, synth = load_consortium(_write(tmp_path, GOOD))
    cfg = build_config(cons, synth)
    assert cfg.data.split == "sizes" and cfg.parties == 2
    bad, synth = load_consortium(_write(tmp_path, GOOD.replace("round:aim2", "round:aim9")))
    with pytest.raises(ConfigError, match="round:aim9"):
        build_config(bad, synth)
    bad, synth = load_consortium(_write(tmp_path, GOOD.replace("round:select@", "round:nope@")))
    with pytest.raises(ConfigError, match="kill_coordinator"):
        build_config(bad, synth)


def test_parse_when() -> None:
    assert parse_when(3, "k") == 3.0
    assert parse_when(" keys started ", "k") == "keys started"
    for bad in (True, "keys", float("nan"), [1]):
        with pytest.raises(ConfigError, match="k"):
            parse_when(bad, "k")


def test_the_shipped_scenario_parses() -> None:
    from sim.cluster.consortium_run import build_config

    cons, synth = load_consortium(SHIPPED)
    assert [p.rows_equiv for p in cons.parties] == [10000, 50000, 100000, 250000, 500000]
    vpn = [p for p in cons.parties if p.link.shaped]
    assert len(vpn) == 1 and vpn[0].link.latency_s == 0.2 and vpn[0].link.bandwidth_mbps == 1
    assert cons.offline is not None and cons.wall_s(cons.offline.end) - cons.wall_s(
        cons.offline.start) == 6 * cons.seconds_per_hour
    assert cons.workload_update is not None and cons.workload_update.at == cons.hours / 2
    assert build_config(cons, synth).parties == 5


def test_vfl_scenarios_still_dispatch_to_vfl(tmp_path: Path) -> None:
    p = tmp_path / "v.toml"
    p.write_text('[scenario]\ncpu_ratio = "1:1"\n[vfl]\ndataset = "bank"\n')
    assert scenario_kind(p) == "vfl"
