"""``vfl.sync_per_epoch``: more training segments (each a drain and PS sync) than
validation scorings; the scorings stay where they were, on segment ends."""

from __future__ import annotations

from pathlib import Path

import orjson

from parties.config import DataSection, VflConfig, WorkersSection


def test_sync_segments_apart_from_the_scorings(tmp_path: Path) -> None:
    from sim.launch.local import run_vfl_in_process

    cfg = VflConfig(dataset="synthetic", epochs=2, batch_size=128, algo="pubsub",
                    val_per_epoch=2, sync_per_epoch=6, seed=0,
                    data=DataSection(synthetic_rows=3000),
                    workers=WorkersSection(active=1, passive=2, mode="inline"))
    run_vfl_in_process(cfg, tmp_path)
    m = orjson.loads((tmp_path / "metrics.json").read_bytes())
    hist = m["history"]
    assert len(hist) == 2 * 6  # every segment of both epochs
    scored = [h for h in hist if h.get("metric") is not None]
    assert len(scored) == 2 * 2
    # the scorings end the 3rd and 6th segment of each epoch
    assert [(h["epoch"], h["segment"]) for h in scored] == [(0, 2), (0, 5), (1, 2), (1, 5)]
    assert 0.5 < m["test_auc"] <= 1.0
