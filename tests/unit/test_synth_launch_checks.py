"""The FedForge launcher's checks before it starts anything: crash points, workload
updates that would change nothing, and how a reopened run's metrics are merged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.launch.synth import RUN_LOCK, _merge_reopened, _nothing_to_do, run_synth
from synth.config import SynthConfig


@pytest.mark.parametrize(("at", "match"), [
    ("bogus", "is not a stage"),
    ("round:select@nope", r"points of 'round:select' are \['planned'"),
    ("compress_domain@collected", "none"),
    ("keys@unmask", r"\['collected', 'marked'\]"),
])
def test_a_bad_kill_point_is_refused_before_anything_starts(at: str, match: str,
                                                            tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=match):
        run_synth(SynthConfig(dataset="bank"), tmp_path / "run", kill_coordinator_at=at)
    assert not (tmp_path / "run").exists()  # no directory, no lock left behind


def _run_dir(tmp_path: Path, *, left: float, frac: float, flat: bool = False) -> Path:
    d = tmp_path / "run"
    (d / "stages").mkdir(parents=True)
    (d / "schema.json").write_text(json.dumps(
        {"columns": [{"name": c, "kind": "categorical"} for c in ("a", "b", "c")]}))
    (d / "stages" / "round_select.json").write_text(json.dumps(
        {"cliques": [["a", "b"], ["b", "c"]]}))
    (d / "stages" / "checkpoint.json").write_text(json.dumps({"stream_rho_left": left}))
    # a run's metrics.json states its config: nested tables, or the flat layout of older runs
    conf = {"stream_rho_frac": frac} if flat else {"stream": {"rho_frac": frac}}
    (d / "metrics.json").write_text(json.dumps({"config": conf}))
    return d


def test_updates_that_would_change_nothing_are_answered_without_reopening(
        tmp_path: Path) -> None:
    d = _run_dir(tmp_path, left=0.0, frac=0.0)
    assert "measured already" in _nothing_to_do(d, {"marginals": [["b", "a"]]})
    assert "stream.rho_frac = 0" in _nothing_to_do(d, {"marginals": [["a", "b", "c"]]})
    assert _nothing_to_do(d, {"marginals": [["a", "b", "c"]], "weights": {"a,b": 2}}) is None
    d2 = _run_dir(tmp_path / "x", left=0.0, frac=0.2)
    assert "used up" in _nothing_to_do(d2, {"marginals": [["a", "c"]]})
    old = _run_dir(tmp_path / "old", left=0.0, frac=0.2, flat=True)  # a run of the flat layout
    assert "used up" in _nothing_to_do(old, {"marginals": [["a", "c"]]})
    old0 = _run_dir(tmp_path / "old0", left=0.0, frac=0.0, flat=True)
    assert "stream.rho_frac = 0" in _nothing_to_do(old0, {"marginals": [["a", "c"]]})
    d3 = _run_dir(tmp_path / "y", left=0.001, frac=0.2)
    assert _nothing_to_do(d3, {"marginals": [["a", "c"]]}) is None


def test_a_reopened_run_keeps_what_the_first_run_recorded() -> None:
    before = {"wall_s": 50.0, "faults": [{"kind": "kill_coordinator"}], "consortium": {"x": 1},
              "workload_updates": [{"name": "wl0"}], "avg_tv": 0.03, "restarts": 1}
    after = {"wall_s": 20.0, "faults": [], "workload_updates": [{"name": "wl1"}],
             "avg_tv": 0.028, "restarts": 1}
    m = _merge_reopened(before, after)
    assert m["consortium"] == {"x": 1} and m["avg_tv"] == 0.028 and m["restarts"] == 1
    assert [u["name"] for u in m["workload_updates"]] == ["wl0", "wl1"]
    assert m["faults"] == [{"kind": "kill_coordinator"}]
    assert m["wall_s"] == 50.0 and m["reopen_wall_s"] == [20.0]
    assert RUN_LOCK == "run.lock"
