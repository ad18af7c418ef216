"""Pure scheduling logic: ΔT_t, batch plans, batch assignment with drop-and-reassign."""

from __future__ import annotations

import numpy as np
import pytest

from parties.algorithms.schedule import (
    EpochSchedule,
    StalenessWindow,
    effective_workers,
    epoch_batches,
    eval_segments,
    first_reaching,
    num_batches,
    pack_ids,
    split_batch_ids,
    sync_interval,
    unpack_ids,
    validation_split,
    worker_lr,
)


def test_sync_interval_matches_the_paper_for_delta_t0_5() -> None:
    assert [sync_interval(t, 5) for t in range(21)] == [1, 1, 1, 1, 2, 3, 4, 5] + [5] * 13


def test_sync_interval_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="t must be"):
        sync_interval(-1, 5)
    with pytest.raises(ValueError, match="delta_t0"):
        sync_interval(0, 0)


def test_epoch_batches_cover_rows_once_and_agree_between_parties() -> None:
    a = epoch_batches(1000, 256, seed=3, epoch=2)
    b = epoch_batches(1000, 256, seed=3, epoch=2)
    assert len(a) == num_batches(1000, 256) == 4
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert sorted(np.concatenate(a).tolist()) == list(range(1000))
    c = epoch_batches(1000, 256, seed=3, epoch=3)
    assert not np.array_equal(a[0], c[0])


def test_schedule_reassigns_then_drops() -> None:
    s = EpochSchedule(2, max_reassign=1)
    assert s.take() == (0, 0)
    assert s.take() == (1, 0)
    s.complete(1)
    assert s.fail(0, 0) is True  # reassigned once
    assert s.take() == (0, 1)
    assert s.fail(0, 1) is False  # dropped
    assert s.done and s.completed == 1 and s.dropped == 1 and s.reassigned == 1


def test_delta_t0_1_syncs_every_step() -> None:
    assert [sync_interval(t, 1) for t in range(50)] == [1] * 50


def test_effective_workers_per_algorithm() -> None:
    assert effective_workers("pubsub", "active", 3, 2) == 3
    assert effective_workers("pubsub", "passive", 3, 2) == 2
    assert effective_workers("avfl-ps", "passive", 3, 2) == 2
    assert effective_workers("vfl", "active", 3, 2) == 1
    assert effective_workers("avfl", "passive", 3, 2) == 1
    assert effective_workers("vfl-ps", "active", 3, 2) == 2  # paired: min of the two
    assert effective_workers("vfl-ps", "passive", 3, 2) == 2
    with pytest.raises(ValueError, match="algo"):
        effective_workers("sync", "active", 1, 1)


def test_worker_lr_scales_only_where_averaged_workers_form_a_larger_batch() -> None:
    # pubsub / avfl-ps: w whole-batch workers averaged = an effective batch of w·B
    assert worker_lr("pubsub", "active", 1e-3, 3, 2) == pytest.approx(3e-3)
    assert worker_lr("pubsub", "passive", 1e-3, 3, 2) == pytest.approx(2e-3)
    assert worker_lr("avfl-ps", "passive", 1e-3, 3, 4, "sqrt") == pytest.approx(2e-3)
    assert worker_lr("pubsub", "active", 1e-3, 3, 2, "none") == 1e-3
    # one worker, or vfl-ps whose pairs split one batch of B rows: the base rate
    for algo in ("vfl", "avfl", "vfl-ps"):
        assert worker_lr(algo, "active", 1e-3, 4, 4) == 1e-3
    assert worker_lr("pubsub", "active", 1e-3, 1, 1) == 1e-3
    with pytest.raises(ValueError, match="'cubic'"):
        worker_lr("pubsub", "active", 1e-3, 2, 2, "cubic")
    with pytest.raises(ValueError, match="lr must be > 0"):
        worker_lr("pubsub", "active", 0.0, 2, 2)


def test_vfl_ps_splits_a_batch_into_paired_subsets_and_round_trips() -> None:
    rows = np.arange(10, 20, dtype=np.int64)
    parts = split_batch_ids(rows, 3)
    assert [len(p) for p in parts] == [4, 3, 3]
    assert np.array_equal(np.concatenate(parts), rows)
    ids, off = pack_ids(parts)
    back = unpack_ids(ids, off)
    assert all(np.array_equal(a, b) for a, b in zip(parts, back, strict=True))
    assert [len(p) for p in split_batch_ids(rows[:2], 3)] == [1, 1, 0]
    with pytest.raises(ValueError, match="offsets"):
        unpack_ids(ids, np.array([0, 5, 3, 10]))
    with pytest.raises(ValueError, match="parts"):
        split_batch_ids(rows, 0)


def test_avfl_staleness_window_bounds_outstanding_batches_and_staleness() -> None:
    w = StalenessWindow(bound=3)
    for b in (0, 1, 2):
        assert not w.full
        w.issue(b)
    assert w.full and w.oldest() == 0
    with pytest.raises(RuntimeError, match="bound 3"):
        w.issue(3)
    assert w.applied(0) == 0  # computed before any update
    w.issue(3)
    with pytest.raises(ValueError, match="oldest"):
        w.applied(2)  # settled in publication order
    w.given_up(1)
    assert w.applied(2) == 1  # one update (batch 0's) since its forward
    assert w.applied(3) == 1  # issued after batch 0's update; batch 2's came since
    assert w.max_staleness == 1 and w.updates == 3 and not w.outstanding
    # staleness never exceeds bound - 1 when the window is respected
    w = StalenessWindow(bound=4)
    for b in range(100):
        if w.full:
            assert w.applied(w.oldest()) <= 3
        w.issue(b)
    with pytest.raises(ValueError, match=">= 1"):
        StalenessWindow(bound=0)


def test_validation_split_is_a_fixed_held_out_subset() -> None:
    fit, val = validation_split(1000, seed=0)
    assert len(val) == 100 and len(fit) == 900
    assert not set(fit.tolist()) & set(val.tolist())
    fit2, val2 = validation_split(1000, seed=0)
    assert np.array_equal(val, val2) and np.array_equal(fit, fit2)
    fit, val = validation_split(200_000, seed=1)
    assert len(val) == 10_000 and len(fit) == 180_000  # capped subsample; rest unused
    fit, val = validation_split(1, seed=0)
    assert len(fit) == 1 and len(val) == 0


def test_eval_segments_cover_the_epoch_in_order() -> None:
    assert eval_segments(10, 1) == [range(0, 10)]
    segs = eval_segments(10, 4)
    assert [list(s) for s in segs] == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]
    assert eval_segments(2, 4) == [range(0, 1), range(1, 2)]


def test_first_reaching_target() -> None:
    pts = [(1.0, 0.8), (2.0, 0.91), (3.0, 0.93)]
    assert first_reaching(pts, 0.9, higher_is_better=True) == 2.0
    assert first_reaching(pts, 0.95, higher_is_better=True) is None
    assert first_reaching(pts, None, higher_is_better=True) is None
    assert first_reaching([(1.0, float("nan")), (2.0, 0.5)], 0.6,
                          higher_is_better=False) == 2.0


def test_schedule_over_a_segment_takes_its_ids() -> None:
    s = EpochSchedule(3, max_reassign=0, ids=range(5, 8))
    assert [s.take(), s.take(), s.take(), s.take()] == [(5, 0), (6, 0), (7, 0), None]


def test_retry_ready_and_release():
    from parties.algorithms.schedule import EpochSchedule

    s = EpochSchedule(4, 2)
    b0, a0 = s.take()
    assert (b0, a0) == (0, 0)
    assert s.fail(0, 0)  # reassigned: (0, 1) at the back
    assert not s.retry_ready(lambda b: b == 3)  # 3 is not a retry
    assert s.retry_ready(lambda b: b == 0)
    b1, a1 = s.take()
    assert (b1, a1) == (1, 0)
    s.release(1, 0)  # back to the front, not a miss
    assert s.reassigned == 1 and s.dropped == 0 and 1 not in s.in_flight
    assert s.take(lambda b: b == 0) == (0, 1)  # the buffered retry first
    assert s.take(lambda b: False) == (1, 0)  # then the released batch
    assert not s.retry_ready(lambda b: True)  # no retries left
    with pytest.raises(KeyError):
        s.release(3, 0)  # not in flight


def test_retry_ids_lists_the_reassigned_pending_batches_back_to_front() -> None:
    s = EpochSchedule(5, max_reassign=2)
    assert s.retries == 0 and s.retry_ids() == ()
    for _ in range(3):
        s.take()  # 0, 1, 2 in flight
    assert s.fail(1, 0) and s.fail(0, 0)  # pending 3, 4, (1, 1), (0, 1)
    assert s.retries == 2 and s.retry_ids() == (0, 1)
    # take(prefer) picks the first of retry_ids that prefer accepts
    assert s.take(lambda b: b in {1, 0}) == (0, 1)
    assert s.retries == 1 and s.retry_ids() == (1,)
    s.release(0, 1)  # back to the front, still a retry
    assert s.retries == 2 and s.retry_ids() == (1, 0)
    s.complete(2)
    assert s.retry_ids() == (1, 0)
