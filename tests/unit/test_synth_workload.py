"""Workload updates (synth/workload.py): validation and the queue in the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.workload import (
    WorkloadError,
    mark_applied,
    parse_workload,
    pending_updates,
    submit_workload,
)

COLS = ["age", "education", "income", "hours"]


def test_parse_normalises_and_keeps_order() -> None:
    up = parse_workload({"marginals": [["age", "income", "hours"], "education,income",
                                       ["age", "income", "hours"]],
                         "weights": {"income,age": 2.0}, "rho_share": 0.5}, COLS)
    assert up.marginals == (("age", "income", "hours"), ("education", "income"))
    assert up.weights == {("age", "income"): 2.0} and up.rho_share == 0.5
    assert parse_workload(up.to_dict(), COLS) == up


@pytest.mark.parametrize(("doc", "match"), [
    ([["age"]], "JSON object"),
    ({"marginals": [["age", "nope"]]}, r"unknown column\(s\) \['nope'\]"),
    ({"marginals": [["age", "age"]]}, "repeated"),
    ({"marginals": [COLS + ["age"]]}, "repeated"),
    ({"marginals": [[]]}, "non-empty"),
    ({"marginals": []}, "at least one"),
    ({"marginals": [["age"]], "rho_share": 0}, r"rho_share must be in \(0, 1\]"),
    ({"marginals": [["age"]], "rho_share": 1.5}, "rho_share"),
    ({"marginals": [["age"]], "weights": {"age": -1}}, "must be a number > 0"),
    ({"marginals": [["age"]], "weights": {"age": True}}, "must be a number > 0"),
    ({"marginals": [["age"]], "budget": 1}, r"unknown key\(s\) \['budget'\]"),
])
def test_bad_updates_name_the_offending_value(doc: object, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        parse_workload(doc, COLS)


def test_too_wide_a_marginal_is_refused() -> None:
    with pytest.raises(WorkloadError, match="5-way"):
        parse_workload({"marginals": [COLS + ["x"]]}, COLS + ["x"])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.sampled_from(COLS), min_size=1, max_size=4, unique=True),
                min_size=1, max_size=6),
       st.floats(min_value=1e-6, max_value=1.0))
def test_roundtrip_property(marginals: list[list[str]], share: float) -> None:
    up = parse_workload({"marginals": marginals, "rho_share": share}, COLS)
    assert parse_workload(json.loads(json.dumps(up.to_dict())), COLS) == up
    assert len(up.marginals) == len({tuple(m) for m in marginals})


def test_queue_in_the_run_directory(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no schema.json"):
        submit_workload(tmp_path, {"marginals": [["age"]]})
    (tmp_path / "schema.json").write_text(json.dumps(
        {"columns": [{"name": c, "kind": "categorical"} for c in COLS]}))
    with pytest.raises(WorkloadError, match="unknown column"):
        submit_workload(tmp_path, {"marginals": [["salary"]]})
    a = submit_workload(tmp_path, {"marginals": [["age", "income"]]})
    b = submit_workload(tmp_path, {"marginals": [["hours"]], "rho_share": 0.25})
    got = pending_updates(tmp_path, COLS)
    assert [p for p, _ in got] == [a, b]  # submission order
    assert got[1][1].rho_share == 0.25
    dest = mark_applied(tmp_path, a, {"tv_after": 0.1})
    assert not a.exists() and json.loads(dest.read_text())["report"] == {"tv_after": 0.1}
    assert [p for p, _ in pending_updates(tmp_path, COLS)] == [b]
    b.write_text("{broken")
    with pytest.raises(WorkloadError, match=b.name):
        pending_updates(tmp_path, COLS)
