"""The training window a run's throughput is measured over (parties.runtime.report)."""

from __future__ import annotations

import pytest

from parties.config import VflConfig
from parties.runtime.report import assemble_metrics, training_window_s


def _hist(*train_s: float) -> list[dict[str, float]]:
    return [{"train_s": t} for t in train_s]


def test_each_segment_counts_the_longer_of_the_two_clocks() -> None:
    assert training_window_s(_hist(1.0, 2.0, 3.0), _hist(1.5, 1.0, 3.5)) \
        == pytest.approx(1.5 + 2.0 + 3.5)


def test_without_the_passive_history_the_active_clock_is_used() -> None:
    assert training_window_s(_hist(1.0, 2.0), None) == pytest.approx(3.0)
    # a passive party that reported fewer segments (it failed mid-run)
    assert training_window_s(_hist(1.0, 2.0), _hist(4.0)) == pytest.approx(6.0)


def _party(samples: int, history: list[dict[str, float]], **kw: object) -> dict[str, object]:
    return {"samples": samples, "history": history, "train_wall_s": sum(
        h["train_s"] for h in history), "dropped_batches": 0, "reassigned_batches": 0, **kw}


def test_metrics_throughput_is_over_both_parties_training() -> None:
    active = _party(1000, _hist(1.0, 1.0), task="binary", metric_name="auc", metric=0.9,
                    test_auc=0.9, broker={})
    passive = _party(1000, _hist(1.25, 1.25))
    m = assemble_metrics(VflConfig(), "r1", active, passive)
    assert m["train_wall_s"] == pytest.approx(2.0)  # the active party's own clock
    assert m["train_window_s"] == pytest.approx(2.5)
    assert m["train_samples_per_s"] == pytest.approx(400.0)
    # the passive report never came: the active party's clock
    m = assemble_metrics(VflConfig(), "r1", active, None)
    assert m["train_samples_per_s"] == pytest.approx(500.0)
