"""``pubsub`` over a slow link, both parties in this process (:mod:`sim.launch.local`): the passive
party's embeddings reach the hub 40 ms late (a 40 ms round trip), and its in-flight
window grows from the round trips it measures; ``metrics.json`` records them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parties.config import DataSection, TimeoutsSection, VflConfig, WorkersSection
from pubsub.memory import MemoryBroker, MemoryBus
from sim.launch.local import run_vfl_in_process
from tests.bounds import above

DELAY_S = 0.04


class SlowUplink(MemoryBus):
    """A client whose embedding publications reach the hub ``DELAY_S`` late."""

    def publish_nowait(self, topic: str, arrays: Sequence[Any] = (),
                       meta: Any = None, *, copy: bool = True) -> int:
        if not topic.startswith("emb/"):
            return super().publish_nowait(topic, arrays, meta, copy=copy)
        held = [np.array(a, copy=True) for a in arrays]
        assert self._loop is not None
        self._loop.call_later(DELAY_S, lambda: super(SlowUplink, self).publish_nowait(
            topic, held, meta))
        return 0


@pytest.fixture
def slow_uplink(monkeypatch: pytest.MonkeyPatch) -> None:
    """The passive party's in-memory bus client is a :class:`SlowUplink`."""
    plain = MemoryBroker.connect

    def connect(self: MemoryBroker, name: str = "client", *, config: Any = None) -> MemoryBus:
        if name == "passive":
            return SlowUplink(self, name=name, config=config)
        return plain(self, name, config=config)

    monkeypatch.setattr(MemoryBroker, "connect", connect)


@pytest.mark.timeout(240)
def test_window_grows_over_a_slow_uplink_and_metrics_record_the_link(
        tmp_path: Path, slow_uplink: None) -> None:
    cfg = VflConfig(algo="pubsub", dataset="synthetic", epochs=1,
                    data=DataSection(synthetic_rows=8000, synthetic_features=16, synthetic_informative=8),
                    workers=WorkersSection(mode="thread", inflight_max=6),
                    timeouts=TimeoutsSection(heartbeat_interval_s=0.2))
    run_vfl_in_process(cfg, tmp_path / "run", timeout_s=200)
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    link = m["link"]
    assert link is not None and link["rtt_s"]["n"] == m["parties"]["passive"]["batches"]
    rtt = link["rtt_s"]["median"]
    assert rtt >= 0.9 * DELAY_S  # the round trip the window hides
    assert link["inflight"]["by_epoch"] and link["inflight"]["series"]
    assert link["bytes_per_sample"] > 2 * cfg.model.embedding_dim * 4  # embedding + gradient
    assert not link["t_ddl"]["adjusted"] and m["dropped_batches"] == 0
    # the window is 1 + floor(rtt / T), T a worker's period (its step, or the partner's
    # period times the workers): a few ms here, but beside other CPU-bound jobs it has
    # reached the 40 ms round trip (the window then rightly stays at 1)
    period = max(link["step_s"] or 0.0, (link["partner_period_s"] or 0.0) * cfg.workers.passive)
    if period * 1.5 > rtt:
        pytest.skip(f"machine too busy to judge the window: a worker's period "
                    f"{period * 1e3:.0f} ms against a {rtt * 1e3:.0f} ms round trip")
    assert link["inflight"]["size_max"] >= 2 and link["inflight"]["depth_max"] >= 3
    assert m["parties"]["passive"]["max_staleness"] >= 1  # stashed forwards were used


@pytest.mark.stochastic
@pytest.mark.timeout(240)
def test_validation_points_over_a_slow_uplink_do_not_drain_the_pipeline(
        tmp_path: Path, slow_uplink: None) -> None:
    """``vfl.val_overlap`` (the default under ``pubsub`` with 2 + 2 workers): four
    validation points an epoch over the 40 ms uplink are scored while the epoch trains
    (one segment, one drain an epoch, not four); each point is a history entry on both
    sides, in step, with its metric on the active side. (With the overlap off each point
    ends a segment: tests/integration/test_vfl.py's inline smoke run and
    tests/integration/test_vfl_segments.py.)"""
    cfg = VflConfig(algo="pubsub", dataset="synthetic", epochs=2, val_per_epoch=4,
                    data=DataSection(synthetic_rows=6000, synthetic_features=16, synthetic_informative=8),
                    workers=WorkersSection(mode="thread"),
                    timeouts=TimeoutsSection(heartbeat_interval_s=0.2))
    assert cfg.scores_in_flight
    run_vfl_in_process(cfg, tmp_path / "run", timeout_s=200)
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    act, pas = m["parties"]["active"], m["parties"]["passive"]
    assert act["val_overlap"]["on"] and pas["val_overlap"] == act["val_overlap"]
    assert act["segments"] == pas["segments"] == 2
    assert act["points_in_flight"] == pas["points_in_flight"] == 6
    hist = m["history"]
    assert [h["epochs_done"] for h in hist] == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    assert [h["epochs_done"] for h in pas["history"]] == [h["epochs_done"] for h in hist]
    assert all("metric" in h for h in hist)
    assert [h["wall_s"] for h in hist] == sorted(h["wall_s"] for h in hist)
    assert m["dropped_batches"] == 0  # every batch trained
    above(m["metric"], 0.75, "final validation AUC")
    # the clocks: the entries' spans add up to the training clock
    assert sum(h["train_s"] for h in hist) == pytest.approx(act["train_wall_s"], rel=1e-6)


@pytest.mark.timeout(240)
def test_a_party_under_one_core_scores_points_at_segment_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every party says its allotted cores in its hello; with one under a core (here both
    parties see 0.5: they share this process) the active party decides against scoring
    in flight and the passive party follows: each point ends a segment on both sides."""
    import parties.runtime.session

    monkeypatch.setattr(parties.runtime.session, "cores_allotted", lambda: 0.5)
    cfg = VflConfig(algo="pubsub", dataset="synthetic", epochs=1, val_per_epoch=2,
                    data=DataSection(synthetic_rows=4000, synthetic_features=16, synthetic_informative=8),
                    workers=WorkersSection(mode="thread"),
                    timeouts=TimeoutsSection(heartbeat_interval_s=0.2))
    assert cfg.scores_in_flight  # allowed by the configuration, declined by the run
    run_vfl_in_process(cfg, tmp_path / "run", timeout_s=200)
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    act, pas = m["parties"]["active"], m["parties"]["passive"]
    assert act["val_overlap"] == pas["val_overlap"]
    assert act["val_overlap"]["on"] is False and "under 1 core" in act["val_overlap"]["reason"]
    assert act["segments"] == pas["segments"] == 2
    assert act["points_in_flight"] == pas["points_in_flight"] == 0
    assert [h["epochs_done"] for h in m["history"]] == [0.5, 1.0]
    assert m["dropped_batches"] == 0

