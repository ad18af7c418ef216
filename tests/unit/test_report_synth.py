"""``psfl report``'s FedForge series (sim/reports/synth.py): pure functions on small
hand-made run directories; no drawing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sim.reports.vfl import ReportError
from sim.reports.synth import (
    PartyBudget,
    StageSpan,
    SynthReportError,
    SynthRun,
    budget_rows,
    classify_run_dirs,
    is_synth_metrics,
    load_synth_run,
    parse_ts,
    run_stage_spans,
    spans_from_durations,
    stage_group,
    stage_rows,
    stage_spans,
    tv_bars,
)

T0 = "2026-12-06T06:55:08.000000Z"


def _ts(s: float) -> str:
    """``T0`` plus ``s`` seconds, as the event log writes it."""
    return f"2026-12-06T06:55:{8 + s:09.6f}Z"


def _ev(event: str, t: float, stage: str | None = None, party: str = "coordinator") -> dict:
    e = {"event": event, "party": party, "timestamp": _ts(t)}
    if stage is not None:
        e["stage"] = stage
    return e


def _metrics(**kw) -> dict:
    rho = 0.015
    m = {"dataset": "/data/adult.csv", "parties": 3, "mechanism": "mst", "engine": "mbi",
         "epsilon": 1.0, "delta": 1e-9, "rho": rho,
         "rho_spent": {"p000": rho, "p001": rho, "p002": rho / 3},
         "epsilon_spent": {"p000": 1.0, "p001": 1.0, "p002": 0.5},
         "rho_planned": {"p000": rho, "p001": rho, "p002": rho / 3},
         "avg_tv": 0.2, "max_tv": 0.3, "workload": "all 3-way marginals",
         "stage_s": {"schema": 0.01, "budget": 0.3, "round:one_way": 0.4, "synthesis": 5.0},
         "wall_s": 13.0}
    m.update(kw)
    return m


def _write_run(d: Path, metrics: dict, events: list[dict] | None = None,
               quality: dict | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.json").write_text(json.dumps(metrics))
    if events is not None:
        (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if quality is not None:
        (d / "stages").mkdir()
        (d / "stages" / "quality.json").write_text(json.dumps(quality))
    return d


# ------------------------------------------------------------------ detection, loading


def test_is_synth_metrics():
    assert is_synth_metrics(_metrics())
    assert not is_synth_metrics({"epsilon": 1.0})  # neither kind
    assert not is_synth_metrics({"history": [], "stage_s": {}, "rho_spent": {}})  # VFL
    assert not is_synth_metrics([1, 2])


def test_classify_run_dirs(tmp_path):
    s = _write_run(tmp_path / "s", _metrics())
    v = _write_run(tmp_path / "v", {"algo": "pubsub", "history": []})
    n = _write_run(tmp_path / "n", {"epsilon": 1.0})
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.json").write_text("{broken")
    synth, vfl, skipped = classify_run_dirs([s, v, n, tmp_path / "b"])
    assert (synth, vfl) == ([s], [v])
    assert len(skipped) == 2
    assert str(n) in skipped[0] and "neither" in skipped[0]
    assert str(tmp_path / "b") in skipped[1] and "unreadable" in skipped[1]


def test_load_synth_run(tmp_path):
    q = {"avg_tv": 0.2, "tv_per_marginal": {"a,b,c": 0.1}}
    d = _write_run(tmp_path / "bench" / "adult", _metrics(),
                   [_ev("stage.started", 0, "schema"), _ev("stage.done", 0.5, "schema")], q)
    with (d / "events.jsonl").open("a") as f:
        f.write('{"event": "stage.started", "cut sh\n')  # a line cut by a kill
    run = load_synth_run(d, tmp_path / "bench")
    assert run.rel == "adult" and run.quality == q and len(run.events) == 2
    assert run.notes == ["events.jsonl: 1 line(s) not JSON, left out"]
    assert run.label == "adult K=3 ε=1 mst/mbi (adult)"
    assert run.stem == "adult"
    # the root run itself: no subdirectory in the label, the directory's name as stem
    (d / "events.jsonl").unlink()
    root_run = load_synth_run(d, d)
    assert root_run.label == "adult K=3 ε=1 mst/mbi" and root_run.stem == "adult"
    assert "no events.jsonl" in root_run.notes[0]


def test_load_synth_run_errors_name_the_directory(tmp_path):
    d = _write_run(tmp_path / "vfl", {"history": []})
    with pytest.raises(SynthReportError, match=str(d)):
        load_synth_run(d, tmp_path)
    (d / "metrics.json").write_text("nope")
    with pytest.raises(SynthReportError, match="unreadable"):
        load_synth_run(d, tmp_path)
    assert issubclass(SynthReportError, ReportError)  # psfl report's exit 2


# ------------------------------------------------------------------ stage timeline


def test_parse_ts():
    assert parse_ts(T0) == pytest.approx(parse_ts("2026-12-06T06:55:08+00:00"))
    assert parse_ts("2026-12-06T06:55:08") == parse_ts(T0)  # naive: UTC
    assert parse_ts(_ts(1.25)) - parse_ts(T0) == pytest.approx(1.25)
    assert parse_ts("yesterday") is None and parse_ts(None) is None


def test_stage_spans_pairs_starts_with_their_ends():
    events = [
        {"event": "broker.bound", "timestamp": _ts(-2.0)},  # before the stages: ignored
        _ev("stage.started", 0.0, "schema"),
        _ev("synth.resume_answered", 0.1, "schema", party="p000"),  # not a stage event
        _ev("stage.done", 0.5, "schema"),
        _ev("stage.started", 0.5, "round:one_way"),
        _ev("stage.failed", 1.5, "round:one_way"),
        _ev("stage.done", 9.0, "never_started"),
    ]
    spans, markers = stage_spans(list(reversed(events)))  # order comes from timestamps
    assert spans == [StageSpan("schema", 0.0, pytest.approx(0.5), "done"),
                     StageSpan("round:one_way", pytest.approx(0.5), pytest.approx(1.5),
                               "failed")]
    assert markers == []


def test_stage_spans_a_killed_coordinator():
    events = [
        _ev("stage.started", 0.0, "round:select"), _ev("stage.done", 2.0, "round:select"),
        _ev("stage.started", 2.0, "round:tree"),
        {"event": "sim.coordinator_killed", "timestamp": _ts(2.5)},
        {"event": "sim.coordinator_restarted", "timestamp": _ts(3.5)},
        _ev("coordinator.resumed", 4.0),
        _ev("stage.started", 4.5, "round:tree"), _ev("stage.done", 6.0, "round:tree"),
        _ev("stage.started", 6.0, "synthesis"),  # killed again, never ended
        {"event": "late", "timestamp": _ts(7.0)},
    ]
    spans, markers = stage_spans(events)
    assert [(s.stage, s.status) for s in spans] == [
        ("round:select", "done"), ("round:tree", "interrupted"), ("round:tree", "done"),
        ("synthesis", "interrupted")]
    assert spans[1].t1 == pytest.approx(2.5)  # cut at the kill
    assert spans[3].t1 == pytest.approx(7.0)  # nothing after it: the last event
    assert [w for _, w in markers] == ["coordinator killed", "coordinator restarted",
                                       "coordinator resumed"]
    assert markers[0][0] == pytest.approx(2.5)
    assert stage_rows(spans) == ["round:select", "round:tree", "synthesis"]


def test_stage_spans_started_twice_without_an_end():
    spans, _ = stage_spans([_ev("stage.started", 0.0, "keys"), _ev("stage.started", 1.0, "x"),
                            _ev("stage.started", 2.0, "keys"), _ev("stage.done", 3.0, "keys")])
    keys = [s for s in spans if s.stage == "keys"]
    assert [(s.t0, s.t1, s.status) for s in keys] == [
        (0.0, pytest.approx(1.0), "interrupted"), (pytest.approx(2.0), pytest.approx(3.0),
                                                   "done")]


def test_stage_spans_without_stage_events():
    assert stage_spans([]) == ([], [])
    assert stage_spans([{"event": "stage.started", "timestamp": "bad"}]) == ([], [])


def test_spans_from_durations_and_the_fallback(tmp_path):
    spans = spans_from_durations({"a": 1.0, "b": "x", "c": 0.5, "d": -1})
    assert spans == [StageSpan("a", 0.0, 1.0, "duration"), StageSpan("c", 1.0, 1.5,
                                                                       "duration")]
    run = SynthRun(tmp_path, ".", _metrics())
    spans, markers, source = run_stage_spans(run)
    assert [s.stage for s in spans] == ["schema", "budget", "round:one_way", "synthesis"]
    assert spans[-1].t1 == pytest.approx(5.71) and markers == [] and "stage_s" in source
    run.events = [_ev("stage.started", 0.0, "schema"), _ev("stage.done", 0.25, "schema")]
    spans, _, source = run_stage_spans(run)
    assert spans == [StageSpan("schema", 0.0, pytest.approx(0.25), "done")]
    assert "events.jsonl" in source


@pytest.mark.parametrize(("stage", "group"), [
    ("schema", "setup"), ("budget", "setup"), ("keys:1", "setup"), ("seeds:0", "setup"),
    ("round:one_way", "round"), ("round:aim3", "round"), ("compress_domain", "select"),
    ("select_tree", "select"), ("select:aim1", "select"), ("synthesis", "synthesis"),
    ("quality", "quality"), ("workload:q1", "workload"), ("mystery", "other")])
def test_stage_group(stage, group):
    assert stage_group(stage) == group


# ------------------------------------------------------------------ TV and budget


def test_tv_bars_worst_first(tmp_path):
    q = {"tv_per_marginal": {"a,b,c": 0.1, "a,b,d": 0.3, "b,c,d": 0.1, "a,c,d": float("nan"),
                             "x,y,z": "bad"}}
    run = SynthRun(tmp_path, ".", _metrics(), quality=q)
    assert tv_bars(run) == [("a,b,d", 0.3), ("a,b,c", 0.1), ("b,c,d", 0.1)]
    # no quality.json: metrics.json's, if any; else nothing
    run = SynthRun(tmp_path, ".", _metrics(tv_per_marginal={"a,b": 0.05}))
    assert tv_bars(run) == [("a,b", 0.05)]
    assert tv_bars(SynthRun(tmp_path, ".", _metrics())) == []
    assert tv_bars(SynthRun(tmp_path, ".", _metrics(), quality={"skipped": "x"})) == []


def test_budget_rows():
    m = _metrics()
    m["rho_spent"]["p010"] = 0.0
    m["epsilon_spent"]["p010"] = 0.0
    rows = budget_rows(m)
    assert [r.party for r in rows] == ["p000", "p001", "p002", "p010"]
    assert rows[2] == PartyBudget("p002", 0.005, 0.005, 0.015, 0.5)
    assert rows[3].rho_planned is None and rows[3].rho_budget == 0.015
    # a party's own ledger budget wins over the run's rho; an exact run's infinite epsilon
    m = _metrics(ledger={"p001": {"rho_budget": 0.02, "rho_spent": 0.015}},
                 epsilon_spent={"p000": math.inf, "p001": 1.0, "p002": 0.5})
    rows = budget_rows(m)
    assert [r.rho_budget for r in rows] == [0.015, 0.02, 0.015]
    assert rows[0].epsilon_spent == math.inf
    assert budget_rows({"rho_spent": {}}) == []
