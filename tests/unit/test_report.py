"""``psfl report``'s pure helpers: run discovery, labels, series, timeline windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.reports.vfl import (
    ReportError,
    Run,
    Span,
    Window,
    aligned_spans,
    batch_window,
    cpu_segments,
    cpu_summary,
    find_run_dirs,
    gantt_rows,
    load_runs,
    metric_series,
    parse_window_s,
    party_history,
    run_file_stem,
    run_labels,
    spans_in_window,
)


def _metrics(algo: str = "pubsub", **kw) -> dict:
    m = {
        "algo": algo, "dataset": "bank", "metric_name": "auc", "target_metric": 0.9,
        "history": [
            {"epochs_done": 1.0, "train_wall_s": 1.0, "metric": 0.8, "cpu_util": 0.5},
            {"epochs_done": 1.5, "train_wall_s": 1.5, "cpu_util": 0.7},  # not evaluated
            {"epochs_done": 2.0, "train_wall_s": 2.5, "metric": 0.85, "cpu_util": 0.6},
        ],
        "parties": {"active": {"cpu_util": 0.55, "cores_allotted": 2.0},
                    "passive": {"cpu_util": 0.3, "history": [
                        {"train_wall_s": 1.0, "cpu_util": 0.2},
                        {"train_wall_s": 2.0, "cpu_util": 0.4}]}},
    }
    m.update(kw)
    return m


def _write(d: Path, name: str, obj: object) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(json.dumps(obj))


# ---------------------------------------------------------------- discovery and labels


def test_find_run_dirs_any_nesting(tmp_path):
    _write(tmp_path / "bank" / "pubsub", "metrics.json", _metrics())
    _write(tmp_path / "bank" / "deep" / "x" / "vfl", "metrics.json", _metrics("vfl"))
    _write(tmp_path / "adult", "other.json", {})
    dirs = find_run_dirs(tmp_path)
    assert [d.relative_to(tmp_path).as_posix() for d in dirs] == [
        "bank/deep/x/vfl", "bank/pubsub"]
    # the run directory itself
    assert find_run_dirs(tmp_path / "bank" / "pubsub") == [tmp_path / "bank" / "pubsub"]


def test_find_run_dirs_errors(tmp_path):
    with pytest.raises(ReportError, match="does not exist"):
        find_run_dirs(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ReportError, match="not a directory"):
        find_run_dirs(tmp_path / "f")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no metrics.json"):
        find_run_dirs(tmp_path / "empty")


def test_load_runs_skips_bad_and_non_vfl(tmp_path):
    _write(tmp_path / "a", "metrics.json", _metrics())
    _write(tmp_path / "synth", "metrics.json", {"epsilon": 1.0})  # not a VFL run
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.json").write_text("{not json")
    said: list[str] = []
    runs = load_runs(tmp_path, say=said.append)
    assert [r.rel for r in runs] == ["a"]
    assert runs[0].label == "pubsub"
    assert "no timelines" not in " ".join(runs[0].notes)  # both missing: one note later
    assert sum("skipped" in s for s in said) == 2
    only_bad = tmp_path / "only_bad"
    _write(only_bad, "metrics.json", [1, 2])
    with pytest.raises(ReportError, match="no VFL run"):
        load_runs(only_bad, say=said.append)


def test_load_runs_ignores_runs_inside_the_output_dir(tmp_path):
    _write(tmp_path / "r", "metrics.json", _metrics())
    _write(tmp_path / "plots" / "copy", "metrics.json", _metrics())
    assert [r.rel for r in load_runs(tmp_path, skip=tmp_path / "plots", say=print)] == ["r"]
    # an output directory equal to the root hides nothing
    assert len(load_runs(tmp_path, skip=tmp_path, say=print)) == 2


def test_run_labels():
    assert run_labels([("pubsub", "."), ("vfl", "x")]) == ["pubsub", "vfl"]
    assert run_labels([("pubsub", "bank/pubsub"), ("pubsub", "adult/pubsub"),
                       ("vfl", "bank/vfl")]) == ["pubsub (bank)", "pubsub (adult)", "vfl"]
    assert run_labels([("avfl", "s1"), ("avfl", "s2")]) == ["avfl (s1)", "avfl (s2)"]
    # still equal: numbered
    assert run_labels([("a", "x/a"), ("a", "x")]) == ["a (x)", "a (x) #2"]


def test_run_file_stem(tmp_path):
    r = Run(path=tmp_path / "my run", rel=".", metrics={})
    assert run_file_stem(r) == "my_run"
    r = Run(path=tmp_path / "b" / "c", rel="b/c", metrics={})
    assert run_file_stem(r) == "b_c"


# ---------------------------------------------------------------- series


def test_metric_series_skips_unevaluated_and_nonfinite():
    m = _metrics()
    m["history"].append({"train_wall_s": 3.0, "metric": float("nan")})
    m["history"].append({"train_wall_s": None, "metric": 0.9})
    assert metric_series(m) == ([1.0, 2.5], [0.8, 0.85])
    assert metric_series({}) == ([], [])


def test_cpu_segments_and_party_history(tmp_path):
    run = Run(path=tmp_path, rel=".", metrics=_metrics())
    # element-wise approx: pytest 9.2 refuses approx() of nested structures
    assert cpu_segments(party_history(run, "active")) == [pytest.approx(t) for t in
        [(0.0, 1.0, 50.0), (1.0, 1.5, 70.0), (1.5, 2.5, 60.0)]]
    assert cpu_segments(party_history(run, "passive")) == [pytest.approx(t) for t in
        [(0.0, 1.0, 20.0), (1.0, 2.0, 40.0)]]
    assert cpu_summary(run, "active") == pytest.approx((55.0, 50.0, 70.0))
    # a segment without cpu_util still advances the time
    assert cpu_segments([{"train_wall_s": 1.0}, {"train_wall_s": 3.0, "cpu_util": 1.2}]) \
        == [pytest.approx((1.0, 3.0, 120.0))]


def test_cpu_summary_prefers_the_training_window(tmp_path):
    m = _metrics()
    m["parties"]["active"]["cpu_util_train"] = 0.8  # cpu_util (0.55) adds the scoring
    run = Run(path=tmp_path, rel=".", metrics=m, passive=None)
    assert cpu_summary(run, "active") == pytest.approx((80.0, 50.0, 70.0))


def test_passive_history_falls_back_to_passive_json(tmp_path):
    m = _metrics()
    del m["parties"]["passive"]
    run = Run(path=tmp_path, rel=".", metrics=m,
              passive={"cpu_util": 0.25, "history": [{"train_wall_s": 2.0, "cpu_util": 0.25}]})
    assert cpu_segments(party_history(run, "passive")) == [(0.0, 2.0, 25.0)]
    assert cpu_summary(run, "passive") == pytest.approx((25.0, 25.0, 25.0))
    run.passive = None
    assert party_history(run, "passive") == []
    assert cpu_summary(run, "passive") == (None, None, None)


# ---------------------------------------------------------------- timelines


def _tl(anchor: float, rows: list[tuple[str, int, int, float, float]]) -> dict:
    return {"anchor_perf_s": anchor, "kind": [r[0] for r in rows],
            "worker": [r[1] for r in rows], "batch": [r[2] for r in rows],
            "t0_s": [r[3] for r in rows], "t1_s": [r[4] for r in rows]}


def test_aligned_spans_use_the_anchors():
    tls = {
        "active": _tl(100.0, [("wait", 0, 0, 0.5, 1.0), ("compute", 0, -1, 0.1, 0.2)]),
        # passive's anchor 0.3 s earlier: its 0.7 is the active's 0.4
        "passive": _tl(99.7, [("compute", 0, 0, 0.7, 0.9), ("comm", 1, 0, 0.9, 0.95)]),
    }
    spans = aligned_spans(tls)
    # training starts at the earliest batch span (passive compute at 100.4); the
    # batch-less sync span before it gets a negative time
    assert [(s.role, s.kind) for s in spans] == [
        ("active", "compute"), ("passive", "compute"), ("active", "wait"), ("passive", "comm")]
    assert [s.t0 for s in spans] == pytest.approx([-0.3, 0.0, 0.1, 0.2])
    assert spans[1].t1 == pytest.approx(0.2)
    assert aligned_spans({}) == []
    with pytest.raises(ReportError, match="anchor"):
        aligned_spans({"active": {**tls["active"], "anchor_perf_s": None}})


def _epoch_spans(n_batches: int, epochs: int = 1, dt: float = 1.0) -> list[Span]:
    out = []
    t = 0.0
    for _ in range(epochs):
        for b in range(n_batches):
            out.append(Span("active", b % 2, "wait", b, t, t + dt * 3))  # long wait
            out.append(Span("active", b % 2, "compute", b, t, t + dt * 0.5))
            out.append(Span("passive", 0, "comm", b, t + 0.5 * dt, t + 0.6 * dt))
            t += dt
    return out


def test_batch_window_first_n_batches():
    spans = _epoch_spans(10, epochs=2)
    w = batch_window(spans, 4)
    # batch 4 starts at t=4; the window closes there (compute/comm of batches 0-3 ended)
    assert (w.t0, w.t1) == (0.0, 4.0)
    assert "first 4 batches" in w.description
    # ids repeat per epoch: an 11th distinct id never comes, so the whole run is shown
    w = batch_window(spans, 10)
    assert w.t1 == pytest.approx(max(s.t1 for s in spans))
    assert "whole run" in w.description


def test_batch_window_extends_to_the_end_of_included_compute():
    spans = [Span("active", 0, "compute", 0, 0.0, 5.0), Span("active", 1, "compute", 1, 1.0, 1.5),
             Span("active", 1, "wait", 1, 1.0, 50.0), Span("active", 1, "compute", 2, 2.0, 3.0)]
    w = batch_window(spans, 2)
    assert (w.t0, w.t1) == (0.0, 5.0)  # batch 0's compute ends at 5; the wait does not count


def test_batch_window_ignores_batchless_spans_and_errors():
    spans = [Span("active", 0, "compute", -1, -1.0, -0.5), *_epoch_spans(3)]
    w = batch_window(spans, 1)
    # the window starts at training start (the first batch span), not at the earlier sync
    assert w.t0 == 0.0 and w.t1 == pytest.approx(1.0)
    with pytest.raises(ReportError, match="max-batches"):
        batch_window(spans, 0)
    with pytest.raises(ReportError, match="no spans"):
        batch_window([], 5)


def test_parse_window_s():
    assert parse_window_s("2") == (0.0, 2.0)
    assert parse_window_s("0.5:1.5") == (0.5, 1.5)
    assert parse_window_s(":3") == (0.0, 3.0)
    for bad in ("x", "1:2:3", "2:1", "-1:2", "0", "nan"):
        with pytest.raises(ReportError, match="window-s"):
            parse_window_s(bad)


def test_spans_in_window_clips_and_rows():
    spans = [Span("passive", 1, "compute", 0, 0.0, 2.0), Span("active", 1, "wait", 0, 1.0, 9.0),
             Span("active", 0, "comm", 1, 7.0, 8.0)]
    shown = spans_in_window(spans, Window(1.5, 5.0, "w"))
    assert [(s.role, s.t0, s.t1) for s in shown] == [("passive", 1.5, 2.0), ("active", 1.5, 5.0)]
    assert gantt_rows(spans) == [("active", 0), ("active", 1), ("passive", 1)]
