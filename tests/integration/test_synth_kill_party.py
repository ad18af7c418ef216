"""``psfl synth run --kill-party ID@STAGE``: a party process killed
(SIGKILL) mid-run; the run completes with the survivors and every ledger agrees with
the coordinator, or, below ``min_survivors``, fails with the documented exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import synth_table
from sim.faults.synth_party import PartyKill, process_layout
from synth.config import EngineSection, LaunchSection, SecAggSection, SynthConfig, TimeoutsSection


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kill_data") / "table.csv"
    synth_table().to_csv(path, index=False)
    return path


def _cfg(csv: Path, **kw: object) -> SynthConfig:
    return SynthConfig(dataset=str(csv), label="income", parties=5, epsilon=5.0, seed=1,
                       secagg=SecAggSection(fanout=2),
                       engine=EngineSection(name="neural", iters=60),
                       timeouts=TimeoutsSection(round_timeout_s=3.0, handshake_timeout_s=60.0),
                       **kw)  # type: ignore[arg-type]


def test_kill_specs_are_checked_and_the_victim_runs_alone() -> None:
    ids, stages = ("p000", "p001", "p002"), ("schema", "round:select", "synthesis")
    assert PartyKill.parse("p001@round:select", ids, stages) == PartyKill(
        party="p001", stage="round:select")
    for bad, what in (("p009@round:select", "no party 'p009'"), ("p001@round:x", "not a stage"),
                      ("p001", "ID@STAGE")):
        with pytest.raises(ValueError, match=what):
            PartyKill.parse(bad, ids, stages)
    ids5 = ("a", "b", "c", "d", "e")
    assert process_layout(ids5, 2, ["c"]) == [["a", "b"], ["c"], ["d", "e"]]
    assert process_layout(ids5, 1, ["b"]) == [[i] for i in ids5]
    assert process_layout(ids5, 5, []) == [list(ids5)]


@pytest.mark.timeout(600)
def test_a_killed_party_leaves_a_run_that_completes_with_the_survivors(
        csv: Path, tmp_path: Path) -> None:
    from sim.launch.synth import run_synth

    res = run_synth(_cfg(csv, launch=LaunchSection(parties_per_process=5)), tmp_path / "run",
                    quiet=True,
                    kill_parties=["p003@round:select"], timeout_s=200)
    m = res.metrics
    (kill,) = m["faults"]
    assert kill["kind"] == "kill_party" and kill["party"] == "p003"
    assert kill["killed_at_s"] is not None and kill["exit_code"] == -9
    assert (tmp_path / "run" / "synthetic.csv").exists()
    # the killed party's ledger holds what it released before it died, and agrees with
    # the coordinator's count, as every survivor's does
    assert set(m["ledger"]) == {f"p00{i}" for i in range(5)}
    assert m["ledger_agrees"] is True and m["ledger_within_plan"] is True
    assert m["ledger"]["p003"]["rho_spent"] < m["ledger"]["p000"]["rho_spent"]


@pytest.mark.timeout(600)
def test_too_few_survivors_fail_the_run_with_exit_1(csv: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    code = main(["synth", "run", "--dataset", str(csv), "--parties", "5", "--epsilon", "5",
                 "--out", str(tmp_path / "run"), "--insecure", "--set", "label=income",
                 "--set", "engine.name=neural", "--set", "timeouts.round_timeout_s=3.0",
                 "--set", "secagg.min_survivors=4",
                 "--kill-party", "p001@round:select", "--kill-party", "p002@round:select"])
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    assert "min_survivors" in err and "Traceback" not in err
