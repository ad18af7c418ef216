"""A fault that fires after its party's last training epoch is marked and printed as such."""

from __future__ import annotations

from sim.cluster.runner import format_summary, mark_after_training


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
    cpu = {r: {"quota_cores": 1.0, "method": "none"} for r in ("active", "passive")}
    m = {"sim": {"scenario": {"name": "t"}, "end_state": "completed", "cpu": cpu,
                 "faults": faults, "faults_not_fired": []}}
    lines = format_summary(m).splitlines()
    assert "AFTER TRAINING" not in lines[3] and "at 1 s" in lines[3]
    assert "AFTER TRAINING ENDED" in lines[4] and "at 8 s" in lines[4]


def test_event_tail_marks_a_party_trained_only_at_its_last_epoch(tmp_path) -> None:
    import orjson

    from sim.cluster.runner import _EventTail

    events = tmp_path / "events.jsonl"
    rows = [{"event": "vfl.epoch_done", "party": "passive", "epochs_done": 1.0,
             "timestamp": "2026-11-30T10:00:01Z"},
            {"event": "vfl.epoch_done", "party": "active", "epochs_done": 1.0,
             "timestamp": "2026-11-30T10:00:01Z"},
            {"event": "vfl.epoch_done", "party": "passive", "epochs_done": 2.0,
             "timestamp": "2026-11-30T10:00:02Z"}]
    events.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    tail = _EventTail(events, epochs=2)
    tail.poll()
    assert set(tail.last_epoch_unix) == {"active", "passive"}
    assert list(tail.trained_unix) == ["passive"]  # the active party is not done yet
    # a party killed mid-training never finished: a later fault is not "after training"
    t = tail.trained_unix["passive"]
    faults = [{"at_s": 8.0, "party": "passive", "kind": "pause", "fired_unix": t + 0.5},
              {"at_s": 1.0, "party": "passive", "kind": "pause", "fired_unix": t - 0.5},
              {"at_s": 2.0, "party": "active", "kind": "kill", "fired_unix": t + 0.5}]
    mark_after_training(faults, tail.trained_unix)
    assert [f["after_training"] for f in faults] == [True, False, False]
