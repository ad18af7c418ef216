"""A fault that fires after its party's last training epoch is marked and printed as such."""

from __future__ import annotations

from sim.runner import format_summary, mark_after_training


def _faults() -> list[dict]:
    return [{"at_s": 1.0, "party": "passive", "kind": "pause", "duration_s": 5.0,
             "fired_unix": 100.0},
            {"at_s": 8.0, "party": "passive", "kind": "pause", "duration_s": 5.0,
             "fired_unix": 107.0},
            {"at_s": 2.0, "party": "active", "kind": "kill", "duration_s": 0.0,
             "fired_unix": 101.0}]


def test_marks_only_faults_after_the_partys_last_epoch() -> None:
    faults = _faults()
    late = mark_after_training(faults, {"passive": 106.0})  # the active party: no epoch
    assert [f["after_training"] for f in faults] == [False, True, False]
    assert late == [faults[1]]


def test_summary_says_after_training() -> None:
    faults = _faults()[:2]
    mark_after_training(faults, {"passive": 106.0})
    m = {"sim": {"scenario": {"name": "t"}, "end_state": "completed", "cpu": {},
                 "faults": faults, "faults_not_fired": []}}
    lines = format_summary(m).splitlines()
    assert "AFTER TRAINING" not in lines[3] and "at 1 s" in lines[3]
    assert "AFTER TRAINING ENDED" in lines[4] and "at 8 s" in lines[4]
