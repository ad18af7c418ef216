"""The launcher's watch over FedForge party processes (sim.launch.synth_deaths): an
unplanned death is a dropout of every party the process hosted; below S_min (before the
synthesis) the run ends with TooFewSurvivors naming the dead parties."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.faults.synth_party import ExpectedKill
from sim.launch.synth_deaths import (
    PartyDeathWatch,
    TooFewSurvivors,
    describe_exit,
    should_refuse,
)
from sim.launch.vfl import LaunchError, wait_children

STAGES = ["schema", "keys", "round:one_way", "round:select", "round:tree", "synthesis"]


class FakeProc:
    """A child process as the launcher polls it: running (None) or exited with ``code``."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        pass

    def kill(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode


def _setup(tmp_path: Path, min_survivors: int, stages: tuple[str, ...] = ("round:select",)
           ) -> tuple[dict[str, Any], PartyDeathWatch, list[tuple[str, dict[str, Any]]],
                      list[str]]:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"event": "stage.started", "stage": s,
                                          "party": "coordinator"}) + "\n"
                              for s in ("schema", "keys", *stages)))
    procs: dict[str, Any] = {"coordinator": FakeProc(1), "parties0": FakeProc(2),
                             "parties1": FakeProc(3), "parties2": FakeProc(4)}
    logged: list[tuple[str, dict[str, Any]]] = []
    said: list[str] = []
    watch = PartyDeathWatch([procs], {"parties0": ["p000", "p001"], "parties1": ["p002", "p003"],
                                      "parties2": ["p004"]},
                            min_survivors=min_survivors, stage_order=STAGES, events=events,
                            t0=0.0, log=lambda ev, kv: logged.append((ev, kv)), say=said.append)
    return procs, watch, logged, said


def test_a_dead_group_process_is_a_dropout_of_each_of_its_parties(tmp_path: Path) -> None:
    procs, watch, logged, said = _setup(tmp_path, min_survivors=3)
    watch()
    assert watch.deaths == [] and logged == [] and said == []
    procs["parties1"].returncode = -9
    watch()
    (d,) = watch.deaths
    assert (d.process, d.parties, d.exit_code, d.signal, d.stage) == (
        "parties1", ("p002", "p003"), -9, "SIGKILL", "round:select")
    # the wait goes on: the dead process now polls as finished
    assert isinstance(procs["parties1"], ExpectedKill) and procs["parties1"].poll() == 0
    assert [ev for ev, _ in logged] == ["sim.party_died"]
    assert logged[0][1]["parties"] == ["p002", "p003"] and logged[0][1]["signal"] == "SIGKILL"
    (line,) = said
    assert "parties1 (p002, p003; signal SIGKILL)" in line
    assert "3 of 5 parties remain (min_survivors = 3)" in line
    watch()  # seen once only
    assert len(watch.deaths) == 1 and len(said) == 1
    assert watch.annotate("round tree: boom").endswith("dead parties: p002, p003")


def test_below_min_survivors_the_run_is_refused_naming_the_dead(tmp_path: Path) -> None:
    procs, watch, _, said = _setup(tmp_path, min_survivors=4)
    procs["parties2"].returncode = 3  # a non-zero exit, not only a signal
    watch()
    assert watch.deaths[0].signal is None and "exit code 3" in said[0]
    procs["parties0"].returncode = -15
    with pytest.raises(TooFewSurvivors) as info:
        watch()
    err = info.value
    assert isinstance(err, LaunchError) and err.code == 1 and err.role == "parties"
    assert err.dead == ("p000", "p001", "p004") and err.survivors == 2
    assert err.min_survivors == 4
    assert "2 survivor(s) < min_survivors = 4" in str(err)
    assert "parties0 (p000, p001; signal SIGTERM)" in str(err)
    assert "dead parties: p000, p001, p004" in str(err)


def test_what_is_not_a_death_during_the_run(tmp_path: Path) -> None:
    # after the coordinator's synthesis no party is needed: no refusal
    procs, watch, _, _ = _setup(tmp_path, min_survivors=5, stages=("round:tree", "synthesis"))
    procs["parties2"].returncode = -9
    watch()
    assert watch.deaths[0].stage == "synthesis"
    # a clean exit is not a death; once the coordinator has ended, exits are judged as
    # they are (wait_children fails on a non-zero one)
    procs, watch, _, _ = _setup(tmp_path, min_survivors=3)
    procs["parties0"].returncode = 0
    watch()
    procs["coordinator"].returncode = 0
    procs["parties1"].returncode = 1
    watch()
    assert watch.deaths == []
    with pytest.raises(LaunchError, match="parties1 exited with code 1"):
        wait_children(procs, poll_s=0.0, tick=watch)


def test_a_planned_kill_counts_among_the_dropped_but_is_not_recorded(tmp_path: Path) -> None:
    procs, watch, _, _ = _setup(tmp_path, min_survivors=3)
    procs["parties2"].returncode = -9
    procs["parties2"] = ExpectedKill(procs["parties2"])  # --kill-party's wrapper
    watch()
    assert watch.deaths == [] and watch.dead_parties() == ["p004"]
    procs["parties1"].returncode = -9
    with pytest.raises(TooFewSurvivors, match="dead parties: p002, p003, p004"):
        watch()


def test_every_party_refusing_keeps_its_exit_code(tmp_path: Path) -> None:
    # every party process exits 2 (a refused session): the run ends with 2, not 1
    procs, watch, _, _ = _setup(tmp_path, min_survivors=3)
    for name in ("parties0", "parties1", "parties2"):
        procs[name].returncode = 2
    with pytest.raises(TooFewSurvivors) as info:
        watch()
    assert info.value.code == 2 and info.value.survivors == 0
    assert "parties exited with code 2" in str(info.value)
    # mixed codes or a signal: 1
    procs, watch, _, _ = _setup(tmp_path, min_survivors=5)
    procs["parties0"].returncode, procs["parties1"].returncode = 2, -9
    with pytest.raises(TooFewSurvivors) as info:
        watch()
    assert info.value.code == 1


def test_exits_are_described() -> None:
    assert describe_exit(-9) == "signal SIGKILL" and describe_exit(2) == "exit code 2"
    assert should_refuse(5, 2, 4, {"round:tree"}) and not should_refuse(5, 1, 4, set())
    assert not should_refuse(5, 4, 4, {"synthesis"})
