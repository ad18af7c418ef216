"""Private ID alignment, pure part (parties/alignment/psi.py) and file helpers (parties/alignment/align.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from parties.alignment.align import AlignConfig, IdFileError, load_ids, partner_of, topics
from parties.alignment.psi import (
    KEY_BYTES,
    POINT_BYTES,
    ChunkPlan,
    DuplicateIds,
    EmptyId,
    MalformedPoints,
    PsiSession,
    aligned,
    check_ids,
    compare_keys,
    demo_ids,
    mutual_psi_local,
    shared_mask,
)
from parties.runtime.exitcodes import ExitCode, exit_code_for

from sim.faults.psi_forge import off_curve_point


def test_chunk_plan_covers_every_row_once() -> None:
    plan = ChunkPlan(n=10, chunk_size=4)
    assert plan.n_chunks == 3
    assert [plan.bounds(i) for i in range(3)] == [(0, 4), (4, 8), (8, 10)]
    assert ChunkPlan(n=0, chunk_size=4).n_chunks == 0
    with pytest.raises(IndexError):
        plan.bounds(3)
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkPlan(n=3, chunk_size=0)


def test_duplicates_are_rejected_naming_rows_not_ids() -> None:
    with pytest.raises(DuplicateIds) as ei:
        check_ids(["a-secret", "b", "a-secret", "b", "c"])
    e = ei.value
    assert (e.first_row, e.dup_row, e.n_duplicates) == (0, 2, 2)
    assert "secret" not in str(e)
    assert isinstance(e, ValueError)


@pytest.mark.parametrize("bad", ["", None, 7, b"x"])
def test_empty_or_non_str_ids_are_rejected(bad: object) -> None:
    with pytest.raises(EmptyId) as ei:
        check_ids(["x", bad])
    assert ei.value.row == 1


def test_compare_keys_are_exact_on_trailing_zero_bytes() -> None:
    pts = np.zeros((4, POINT_BYTES), np.uint8)
    pts[:, 0] = 2
    pts[1, 1] = 7             # differs from row 0 only in the first key byte
    pts[2, KEY_BYTES] = 1     # ... only in the last key byte
    pts[3, KEY_BYTES + 1] = 9  # differs from row 0 only after the compared slice
    k = compare_keys(pts)
    assert k.dtype == np.dtype(f"S{KEY_BYTES}") and k.shape == (4,)
    m = shared_mask(k, k[[0]])
    assert m.tolist() == [True, False, False, True]


def test_shared_mask_empty_sides() -> None:
    k = compare_keys(np.full((3, POINT_BYTES), 2, np.uint8))
    assert shared_mask(k, k[:0]).tolist() == [False] * 3
    assert shared_mask(k[:0], k).shape == (0,)


def test_aligned_sorts_ids_and_keeps_rows() -> None:
    ids = ["z", "b", "q", "a"]
    res = aligned(ids, np.array([True, False, True, True]), n_partner=9)
    assert res.ids == ("a", "q", "z") and res.rows.tolist() == [3, 2, 0]
    assert res.rows.dtype == np.int64 and res.n_shared == 3 and res.n_partner == 9


@pytest.mark.parametrize("a,b", [([], []), (["x"], []), (["x", "y"], ["u", "v"]),
                                 (["x", "y", "z"], ["z", "y", "x"])])
def test_mutual_local_edge_cases(a: list[str], b: list[str]) -> None:
    ra, rb = mutual_psi_local(a, b, chunk_size=2)
    want = tuple(sorted(set(a) & set(b)))
    assert ra.ids == rb.ids == want
    assert [a[r] for r in ra.rows] == list(want) and [b[r] for r in rb.rows] == list(want)


def test_reencrypt_rejects_malformed_points() -> None:
    s = PsiSession()
    with pytest.raises(MalformedPoints, match="shape"):
        s.reencrypt(np.zeros((2, 32), np.uint8), "passive req chunk 0")
    with pytest.raises(MalformedPoints, match="prefix"):
        s.reencrypt(np.zeros((2, POINT_BYTES), np.uint8), "passive req chunk 0")
    with pytest.raises(MalformedPoints, match="uint8"):
        s.reencrypt(np.zeros((2, POINT_BYTES), np.float32))


@pytest.mark.parametrize("kind", ["off-curve", "x>=p"])
def test_reencrypt_turns_a_point_off_the_curve_into_malformed_points(kind: str) -> None:
    s = PsiSession()
    pts = s.encrypt([f"id{i}" for i in range(40)])
    s.reencrypt(pts)  # the honest chunk passes
    bad = pts.copy()
    bad[29] = off_curve_point(kind)
    bad[33] = off_curve_point(kind)
    with pytest.raises(MalformedPoints, match="point 29 of the chunk is not a point of "
                       "P-256") as ei:
        s.reencrypt(bad, "passive req chunk 2", sender="passive", chunk=2)
    e = ei.value
    assert (e.sender, e.chunk, e.point, e.what) == ("passive", 2, 29, "passive req chunk 2")
    assert str(e).startswith("malformed points from the passive party in passive req chunk 2")
    assert exit_code_for(e) is ExitCode.PARTNER
    s.reencrypt(pts)  # the session still works after the refusal


def test_encrypt_keeps_input_order_and_keys_differ_per_session() -> None:
    s = PsiSession()
    ids = [f"id{i}" for i in range(5)]
    pts = s.encrypt(ids)
    assert pts.shape == (5, POINT_BYTES) and set(pts[:, 0]) <= {2, 3}
    assert (s.encrypt([ids[3]])[0] == pts[3]).all()
    assert not (PsiSession().encrypt(ids[:1])[0] == pts[0]).all()


def test_demo_ids_sizes_and_overlap() -> None:
    a, b = demo_ids(1000, 0.3, 1)
    assert len(a) == len(set(a)) == 1000 and len(b) == len(set(b)) == 1000
    assert len(set(a) & set(b)) == 300
    assert demo_ids(1000, 0.3, 1) == (a, b)
    with pytest.raises(ValueError):
        demo_ids(10, 1.5, 0)


def test_load_ids_formats(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "a.csv").write_text("id,x\n007,1\nA b,2\n")
    assert load_ids(tmp_path / "a.csv") == ["007", "A b"]
    (tmp_path / "b.txt").write_text("x1\r\ny2\n")
    assert load_ids(tmp_path / "b.txt") == ["x1", "y2"]
    pd.DataFrame({"cust": [5, 12]}).to_parquet(tmp_path / "c.parquet")
    assert load_ids(tmp_path / "c.parquet", "cust") == ["5", "12"]
    pd.DataFrame({"cust": [5.0, 1.5]}).to_parquet(tmp_path / "d.parquet")
    with pytest.raises(IdFileError, match="floating"):
        load_ids(tmp_path / "d.parquet", "cust")
    with pytest.raises(IdFileError, match="no column 'nope'"):
        load_ids(tmp_path / "a.csv", "nope")
    with pytest.raises(IdFileError) as ei:
        load_ids(tmp_path / "missing.txt")
    assert ei.value.path.endswith("missing.txt")


def test_align_config_and_topics() -> None:
    with pytest.raises(ValueError, match="window"):
        AlignConfig(window=0)
    assert topics("r1", "active")["req"] == "psi/r1/active/req"
    assert partner_of("passive") == "active"
    with pytest.raises(ValueError):
        partner_of("spy")


def test_shuffle_order_round_trip() -> None:
    from parties.alignment.psi import shuffle_order, unshuffle

    perm = shuffle_order(50, np.random.default_rng(0))
    assert sorted(perm.tolist()) == list(range(50))
    keys = np.arange(50)
    sent = keys[perm]
    assert (unshuffle(sent, perm) == keys).all()
    assert not (shuffle_order(50) == shuffle_order(50)).all()  # fresh OS seed each time


def test_a_blank_cell_in_a_one_column_csv_is_an_empty_id_not_a_lost_row(tmp_path) -> None:
    from parties.alignment.align import load_ids
    from parties.alignment.psi import EmptyId, check_ids

    f = tmp_path / "ids.csv"
    f.write_text("id\na\n\nb\n")
    ids = load_ids(str(f), None)
    assert ids == ["a", "", "b"]
    with pytest.raises(EmptyId, match="row 1"):
        check_ids(ids)
