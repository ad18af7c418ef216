"""The coordinator's aggregation-stage CPU figures and the processes' rusage files."""

from __future__ import annotations

import json

import pytest

from synth.cli import write_rusage
from synth.coordinator import _cpu_figures


def test_aggregation_cpu_counts_round_stages_only() -> None:
    stages = {"schema": 0.5, "keys": 0.25, "seeds:0": 0.125, "round:one_way": 0.01,
              "round:select": 0.02, "select_tree": 1.0, "round:tree": 0.03,
              "synthesis": 9.0, "quality": 3.0}
    fig = _cpu_figures(stages)
    assert fig["aggregation_cpu_s"] == pytest.approx(0.06)
    assert fig["aggregation_cpu_s_per_round"] == pytest.approx(0.02)
    assert fig["peak_rss_bytes"] is None or fig["peak_rss_bytes"] > 0


def test_no_rounds_gives_no_per_round_figure() -> None:
    fig = _cpu_figures({"schema": 0.1})
    assert fig["aggregation_cpu_s"] == 0
    assert fig["aggregation_cpu_s_per_round"] is None


def test_write_rusage(tmp_path) -> None:
    path = tmp_path / "ru.json"
    write_rusage(path, startup_cpu_s=0.5)
    doc = json.loads(path.read_text())
    assert set(doc) == {"cpu_s", "startup_cpu_s", "peak_rss_bytes"}
    assert doc["cpu_s"] > 0 and doc["startup_cpu_s"] == 0.5
