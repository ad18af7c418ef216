"""``psfl synth run``: a party process SIGKILLed from outside mid-run (not by the
launcher's ``--kill-party``) is a dropout of every party it hosted: the run is reported
and goes on with the survivors, exits 0 and every ledger stays within the plan."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import synth_table


def _kill_when(events: Path, stage: str, ids_arg: str, done: dict[str, object],
               deadline_s: float = 120.0) -> None:
    """SIGKILL this process's child started with ``--ids ids_arg`` once the
    coordinator's ``stage.started`` for ``stage`` is in ``events`` (gives up after
    ``deadline_s``)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            text = events.read_text()
        except OSError:
            text = ""
        if any(json.loads(line).get("event") == "stage.started"
               and json.loads(line).get("stage") == stage
               for line in text.splitlines() if '"stage.started"' in line):
            break
        time.sleep(0.05)
    else:
        return
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if "--ids" in argv and argv[argv.index("--ids") + 1] == ids_arg and "parties" in argv:
            os.kill(child.pid, signal.SIGKILL)
            done["pid"] = child.pid
            return


@pytest.mark.timeout(300)
def test_a_party_process_killed_from_outside_is_a_dropout_of_its_parties(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    csv = tmp_path / "table.csv"
    synth_table(n=1200).to_csv(csv, index=False)
    out = tmp_path / "run"
    out.mkdir()
    (out / "events.jsonl").write_text("")
    killed: dict[str, object] = {}
    # K = 5 in processes of two: parties0 (p000, p001), parties1 (p002, p003), parties2
    # (p004); killing parties1 drops two parties, leaving 3 = min_survivors
    killer = threading.Thread(target=_kill_when, daemon=True,
                              args=(out / "events.jsonl", "round:select", "p002,p003", killed))
    killer.start()
    code = main(["synth", "run", "--dataset", str(csv), "--parties", "5", "--epsilon", "5",
                 "--out", str(out), "--insecure", "--engine", "neural",
                 "--set", "engine.iters=40", "--set", "timeouts.round_timeout_s=2.0",
                 "--set", "launch.parties_per_process=2", "--set", "secagg.min_survivors=3",
                 "--set", "secagg.fanout=8", "--set", "noise_seed=7"])
    killer.join(5.0)
    cap = capsys.readouterr()
    err = cap.err
    assert "pid" in killed, "the party process was never killed"
    assert code == 0, err[-2000:]
    assert "party process parties1 (p002, p003; signal SIGKILL) died" in err
    assert "3 of 5 parties remain (min_survivors = 3)" in err
    assert "dropout: party process parties1 (p002, p003) died (signal SIGKILL)" in cap.out
    m = json.loads((out / "metrics.json").read_text())
    (death,) = m["party_deaths"]
    assert death["process"] == "parties1" and death["parties"] == ["p002", "p003"]
    assert death["exit_code"] == -signal.SIGKILL and death["signal"] == "SIGKILL"
    # seen within a poll of the kill: in that round, or (had the round closed at once) the next
    assert death["stage"] in ("round:select", "select_tree", "round:tree") and death["at_s"] > 0
    assert m["faults"] == []
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    died = [e for e in events if e.get("event") == "sim.party_died"]
    assert [e["parties"] for e in died] == [["p002", "p003"]]
    assert (out / "synthetic.csv").exists()
    # every ledger (the dead parties' too: what they released before they died) within
    # the plan and agreeing with the coordinator's count; the dead spent less
    assert set(m["ledger"]) == {f"p00{i}" for i in range(5)}
    # the protocol dropped them from the round they died in (or, had their vectors gone
    # out before the kill, from the next one) and from every later one
    assert m["rounds"]["one_way"]["dropped"] == [] and m["rounds"]["tree"]["survivors"] == 3
    assert {"p002", "p003"} <= set(m["rounds"]["select"]["dropped"]) | set(
        m["rounds"]["tree"]["dropped"])
    assert m["ledger_within_plan"] is True and m["ledger_agrees"] is True
    for dead in ("p002", "p003"):
        assert m["ledger"][dead]["rho_spent"] < m["ledger"]["p000"]["rho_spent"]
