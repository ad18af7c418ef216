"""synth.coord.metrics.query_bytes: a session's wire bytes split into fixed and per-query
bytes, each query beside its naive float32 bytes."""

from __future__ import annotations

import pytest

from synth.coord.metrics import query_bytes

STAGES = {"schema": 700, "keys": 500, "seeds:0": 1200, "round:one_way": 300,
          "round:select": 900, "round:tree": 600, "seeds:5": 150, "round:wl1": 400}
NAIVE = {"one_way": 400, "select": 1200, "tree": 800, "wl1": 500}


def test_stages_go_to_their_query_and_the_rest_is_fixed() -> None:
    """The release gets its seed batch and rounds, an update its own batch and round;
    schema, keys and the end of the run are fixed; the ratio is the session's whole."""
    got = query_bytes(STAGES, 50, NAIVE, [{"name": "wl1", "batch": 5}])
    assert got["bytes_wire_session_fixed"] == 700 + 500 + 50
    assert got["bytes_wire_by_query"]["release"]["bytes_wire"] == 1200 + 300 + 900 + 600
    assert got["bytes_wire_by_query"]["release"]["bytes_naive"] == 2400
    assert got["bytes_wire_by_query"]["wl1"] == {"bytes_wire": 550, "bytes_naive": 500,
                                                 "wire_over_naive": pytest.approx(1.1)}
    assert got["queries"] == 2
    assert got["wire_over_naive_per_query"] == pytest.approx((sum(STAGES.values()) + 50) / 2900)


def test_a_first_batch_seeded_ahead_is_shared_by_rounds() -> None:
    """seeds:0 covering 3 mechanism rounds and 3 update rounds, 2 of them used: each used
    update pays a sixth, the release a half, the unused sixth is fixed; nothing is lost."""
    stages = {k: v for k, v in STAGES.items() if k != "seeds:5"}
    stages["round:wl2"] = 250
    updates = [{"name": "wl1", "batch": 5, "seeded_ahead": True},
               {"name": "wl2", "batch": 6, "seeded_ahead": True}]
    got = query_bytes(stages, 0, {**NAIVE, "wl2": 300}, updates, first_batch=(3, 3))
    q = got["bytes_wire_by_query"]
    assert q["wl1"]["bytes_wire"] == 400 + 200 and q["wl2"]["bytes_wire"] == 250 + 200
    assert q["release"]["bytes_wire"] == 600 + 1800
    assert got["bytes_wire_session_fixed"] == 700 + 500 + 200
    assert got["bytes_wire_session_fixed"] + sum(v["bytes_wire"] for v in q.values()) \
        == sum(stages.values())


def test_no_counts_give_nones() -> None:
    got = query_bytes(None, None, NAIVE, [])
    assert got == {"bytes_wire_session_fixed": None, "bytes_wire_by_query": None,
                   "queries": None, "wire_over_naive_per_query": None}
