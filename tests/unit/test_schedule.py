"""Pure scheduling logic: ΔT_t, batch plans, batch assignment with drop-and-reassign."""

from __future__ import annotations

import numpy as np
import pytest

from parties.schedule import EpochSchedule, epoch_batches, num_batches, sync_interval


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
