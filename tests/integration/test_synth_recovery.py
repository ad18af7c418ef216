"""FedForge crash recovery end to end: the coordinator is killed with
SIGKILL mid-pipeline and restarted on the same run directory; the run finishes with the
quality of an uninterrupted run and no party spends any round's budget twice."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from synth.config import SynthConfig

#: the mbi runs' coordinators share compiled JAX programs (conftest.jax_compile_cache)
pytestmark = pytest.mark.usefixtures("jax_compile_cache")




@pytest.fixture(scope="module")
def baseline(synth_mst_run: tuple) -> tuple[SynthConfig, dict]:
    """The uninterrupted run of the same config and seeds (conftest.synth_mst_run: K = 3,
    mbi, fixed split and noise seeds), shared with test_synth.py's end-to-end test."""
    cfg, res = synth_mst_run
    return cfg, res.metrics


@pytest.mark.timeout(600)
@pytest.mark.parametrize("point", ["keys@collected", "round:tree@unmask"])
def test_kill_9_of_the_coordinator_then_resume(baseline: tuple[SynthConfig, dict],
                                               point: str, tmp_path: Path) -> None:
    from sim.launch.synth import run_synth

    cfg, base = baseline
    # without the label: it feeds only the quality stage's ML-utility classifiers (not
    # the split, the rounds or the synthesis), whose fits this test does not look at
    cfg = replace(cfg, label="")
    m = run_synth(cfg, tmp_path / "run", timeout_s=240, quiet=True,
                  kill_coordinator_at=point).metrics
    fault = m["faults"][0]
    assert fault["killed_at_s"] is not None and fault["restarted_at_s"] > fault["killed_at_s"]
    assert m["restarts"] == 1
    stage = point.split("@")[0]
    assert stage not in m["resumed_after"]  # it died inside that stage
    # every round measured once by every party; the ledgers hold exactly the plan
    assert all(r["survivors"] == cfg.parties and not r["dropped"]
               for r in m["rounds"].values())
    assert m["ledger_within_plan"] is True and len(m["ledger"]) == cfg.parties == 3
    for led in m["ledger"].values():
        assert led["entries"] == ["round 0 (one_way)", "round 1 (select)", "round 2 (tree)"]
        assert led["rho_spent"] == pytest.approx(m["rho"], rel=1e-9)
    # same seeds: the same noisy answers, so the same quality (10 % tolerance)
    assert m["avg_tv"] == pytest.approx(base["avg_tv"], rel=0.10)
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert '"coordinator.crash_injected"' in events and '"coordinator.resumed"' in events
    if stage.startswith("round:"):
        assert '"coordinator.round_replayed"' in events
