"""The single-worker compute profile and the throughput ceiling (parties/planning/profile.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from parties.config import DpSection, ModelSection, VflConfig, WorkersSection
from parties.planning.profile import (
    PROFILE_BLOCKS,
    EfficiencyTooHigh,
    PartyProfile,
    ProfileError,
    ComputeProfile,
    ceiling,
    compute_profile_from_dict,
    efficiency,
    mean_profile,
    profile_party,
)
from parties.planning.profile import _blocks


def _pp(role: str, cpus: tuple[int, ...], s: float) -> PartyProfile:
    return PartyProfile(role=role, cpus=cpus, cores=float(len(cpus)), n_features=4,
                        batch_size=8, steps=10, warmup_steps=1, cpu_s_per_step=8 * s,
                        wall_s_per_step=8 * s, cpu_s_per_sample=s, wall_s_per_sample=s,
                        cpu_iqr_rel=0.0)


def test_ceiling_is_the_slower_party_on_its_own_cores() -> None:
    value, bound = ceiling(_pp("active", (0,), 1e-4), _pp("passive", (1,), 5e-5))
    assert (value, bound) == (pytest.approx(1e4), "active")
    value, bound = ceiling(_pp("active", (0, 1), 1e-4), _pp("passive", (2,), 2e-4))
    assert (value, bound) == (pytest.approx(5e3), "passive")


def test_ceiling_of_parties_sharing_cores_counts_both_shares() -> None:
    # both on the same 2 cores: 2 / (1e-4 + 1e-4) = 1e4 < 2 / 1e-4
    value, bound = ceiling(_pp("active", (0, 1), 1e-4), _pp("passive", (0, 1), 1e-4))
    assert (value, bound) == (pytest.approx(1e4), "shared")


def test_ceiling_and_profile_json_with_several_passive_parties() -> None:
    """Every party bounds the ceiling; passive parties on the same CPU (all are pinned to
    passive_cpus in a run) share it; profile.json keys each by its party id."""
    import dataclasses

    a = _pp("active", (0,), 1e-4)
    p1 = _pp("passive", (1,), 6e-5)
    p2 = dataclasses.replace(_pp("passive", (2,), 5e-5), party="passive2")
    assert ceiling(a, p1, p2) == (pytest.approx(1e4), "active")
    slow = dataclasses.replace(p2, cpu_s_per_sample=2e-4)
    assert ceiling(a, p1, slow) == (pytest.approx(5e3), "passive2")
    on_one = dataclasses.replace(p2, cpus=(1,))  # 1 / (6e-5 + 5e-5) < 1e4
    assert ceiling(a, p1, on_one) == (pytest.approx(1 / 1.1e-4), "shared")
    value, bound = ceiling(a, p1, p2)
    prof = ComputeProfile(active=a, passive=p1, more_passive=(p2,),
                          ceiling_samples_per_s=value, bound_by=bound, basis="cpu",
                          settings={})
    doc = json.loads(json.dumps(prof.to_dict()))
    assert list(doc["parties"]) == ["active", "passive", "passive2"]
    assert doc["parties"]["passive2"]["party"] == "passive2"
    assert "party" not in doc["parties"]["passive"]  # the two-party entries as before
    assert compute_profile_from_dict(doc) == prof
    assert mean_profile([prof, prof]).more_passive[0].party_id == "passive2"
    with pytest.raises(ValueError, match="same parties"):
        mean_profile([prof, dataclasses.replace(prof, more_passive=())])


def test_efficiency_above_limit_is_an_error() -> None:
    assert efficiency(900.0, 1000.0) == pytest.approx(0.9)
    assert efficiency(1040.0, 1000.0) == pytest.approx(1.04)
    with pytest.raises(EfficiencyTooHigh, match="1.100"):
        efficiency(1100.0, 1000.0, what="pubsub on bank")
    assert efficiency(1100.0, 1000.0, check=False) == pytest.approx(1.1)
    with pytest.raises(ValueError):
        efficiency(1.0, 0.0)


@pytest.mark.parametrize("role", ["active", "passive"])
def test_profile_party_times_real_steps(role: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 12)).astype(np.float32)
    y = (rng.random(600) > 0.5).astype(np.float32) if role == "active" else None
    cfg = VflConfig(batch_size=64, epochs=3,
                    model=ModelSection(bottom_hidden=(16,), top_hidden=(8,)))
    p = profile_party(role, cfg, x, y, warmup_steps=2, min_steps=12, min_time_s=0.0)
    assert p.steps == 12 and p.batch_size == 64 and p.n_features == 12
    assert 0 < p.cpu_s_per_sample < 0.01 and p.cpu_s_per_sample == p.cpu_s_per_step / 64
    assert p.cores >= 1 and p.samples_per_s == pytest.approx(p.cores / p.cpu_s_per_sample)
    assert math.isfinite(p.cpu_iqr_rel)


def test_profile_with_dp_and_too_few_rows() -> None:
    x = np.ones((100, 5), dtype=np.float32)
    cfg = VflConfig(batch_size=32, dp=DpSection(mu=1.0), model=ModelSection(bottom_hidden=(8,)))
    assert profile_party("passive", cfg, x, None, warmup_steps=1, min_steps=5,
                         min_time_s=0.0).steps == 5
    with pytest.raises(ProfileError, match="fewer than one batch"):
        profile_party("passive", VflConfig(batch_size=256), x, None)


def test_psfl_vfl_profile_writes_profile_json(tmp_path: Path) -> None:
    from sim.cli import main

    code = main(["vfl", "profile", "--dataset", "bank", "--set", "batch_size=128",
                 "--set", "epochs=2", "--min-time-s", "0.05", "--out", str(tmp_path)])
    assert code == 0
    doc = json.loads((tmp_path / "profile.json").read_text())
    a, p = doc["parties"]["active"], doc["parties"]["passive"]
    assert doc["basis"] == "cpu" and doc["settings"]["batch_size"] == 128
    assert doc["ceiling_samples_per_s"] == pytest.approx(min(a["samples_per_s"],
                                                             p["samples_per_s"]), rel=1e-9) or \
        doc["bound_by"] == "shared"
    assert a["n_features"] > 0 and p["n_features"] > 0


def test_psfl_vfl_profile_rejects_an_unavailable_cpu(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    code = main(["vfl", "profile", "--dataset", "bank", "--set", "workers.passive_cpus=[4096]",
                 "--out", str(tmp_path)])
    assert code == 2 and "vfl.workers.passive_cpus" in capsys.readouterr().err


def test_blocks_partition_the_timed_steps_into_near_equal_consecutive_runs() -> None:
    for n in (1, 2, 4, 5, 7, 40, 41, 206):
        blocks = _blocks(n)
        assert len(blocks) == min(n, PROFILE_BLOCKS)
        assert blocks[0][0] == 0 and blocks[-1][1] == n
        assert all(a < b for a, b in blocks)
        assert all(blocks[j][1] == blocks[j + 1][0] for j in range(len(blocks) - 1))
        sizes = [b - a for a, b in blocks]
        assert max(sizes) - min(sizes) <= 1


def _cp(sa: float, sp: float) -> ComputeProfile:
    a, p = _pp("active", (0,), sa), _pp("passive", (1,), sp)
    value, bound = ceiling(a, p)
    return ComputeProfile(active=a, passive=p, ceiling_samples_per_s=value, bound_by=bound,
                          basis="cpu", settings={"batch_size": 8})


def test_mean_profile_averages_each_party_and_recomputes_the_ceiling() -> None:
    before, after = _cp(1e-4, 5e-5), _cp(3e-4, 5e-5)  # the machine slowed down meanwhile
    m = mean_profile([before, after])
    assert m.active.cpu_s_per_sample == pytest.approx(2e-4)
    assert m.active.cpu_s_per_step == pytest.approx(8 * 2e-4)
    assert m.passive.cpu_s_per_sample == pytest.approx(5e-5)
    assert m.ceiling_samples_per_s == pytest.approx(1 / 2e-4) and m.bound_by == "active"
    assert m.settings["profiles_averaged"] == 2 and m.active.steps == 20
    # profile.json round trip
    back = compute_profile_from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m
    assert m.active.cpu_s_per_step_mean is None  # profiles without it (older ones)
    # the mean CPU per step is averaged like the median
    import dataclasses

    with_means = [dataclasses.replace(p, active=dataclasses.replace(p.active,
                                                                   cpu_s_per_step_mean=v))
                  for p, v in ((before, 1e-3), (after, 3e-3))]
    assert mean_profile(with_means).active.cpu_s_per_step_mean == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="at least one"):
        mean_profile([])
    other = _cp(1e-4, 5e-5)
    moved = ComputeProfile(active=_pp("active", (1,), 1e-4), passive=other.passive,
                           ceiling_samples_per_s=1.0, bound_by="active", basis="cpu",
                           settings={})
    with pytest.raises(ValueError, match="active profiles differ"):
        mean_profile([other, moved])


def test_resolve_layout_follows_the_run_layout() -> None:
    from parties.planning.profile import resolve_layout

    pinned = VflConfig(workers=WorkersSection(active_cpus=(0,), passive_cpus=(1,)))
    assert resolve_layout(pinned) == "concurrent"
    assert resolve_layout(pinned, "alone") == "alone"
    assert resolve_layout(VflConfig()) == "alone"  # not pinned: they share cores
    shared = VflConfig(workers=WorkersSection(active_cpus=(0,), passive_cpus=(0,)))
    assert resolve_layout(shared) == "alone"
    with pytest.raises(ValueError, match="disjoint CPU sets"):
        resolve_layout(shared, "concurrent")
    with pytest.raises(ValueError, match="'sideways'"):
        resolve_layout(pinned, "sideways")


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
@pytest.mark.parametrize("passive_parties", [1, 2])
def test_concurrent_profile_times_both_parties_at_once_in_their_own_processes(
        tmp_path: Path, passive_parties: int) -> None:
    import os

    import pandas as pd

    from parties.planning.profile import profile_config

    # a small table (each child loads it as its party would; the bundled bank table's
    # 45,000 rows only made the children slower to start timing)
    rng = np.random.default_rng(0)
    n = 1500
    table = tmp_path / "t.csv"
    pd.DataFrame({"x1": rng.normal(size=n), "x2": rng.normal(size=n),
                  "x3": rng.integers(0, 50, n), "job": rng.choice(["a", "b", "c"], n),
                  "y": rng.choice(["no", "yes"], n)}).to_csv(table, index=False)
    a, p = sorted(os.sched_getaffinity(0))[:2]
    cfg = VflConfig(dataset=str(table), label="y", batch_size=128, epochs=2,
                    passive_parties=passive_parties,
                    model=ModelSection(bottom_hidden=(16,), top_hidden=(8,)),
                    workers=WorkersSection(active_cpus=(a,), passive_cpus=(p,)))
    before = os.sched_getaffinity(0)
    prof = profile_config(cfg, min_steps=20, min_time_s=0.05)
    assert os.sched_getaffinity(0) == before  # the children pinned themselves, not us
    assert prof.settings["layout"] == "concurrent"
    assert prof.active.cpus == (a,) and prof.passive.cpus == (p,)
    assert prof.active.steps >= 20 and prof.passive.steps >= 20
    if passive_parties == 1:
        assert prof.ceiling_samples_per_s == pytest.approx(
            min(prof.active.samples_per_s, prof.passive.samples_per_s))
        return
    # passive2: its own columns (x3 and job: a wider encoding than passive's x2), on the
    # passive CPU it shares with passive in a run
    (p2,) = prof.more_passive
    assert p2.party_id == "passive2" and p2.cpus == (p,) and p2.steps >= 20
    assert p2.n_features != prof.passive.n_features
    assert prof.ceiling_samples_per_s == pytest.approx(min(
        prof.active.samples_per_s, 1 / (prof.passive.cpu_s_per_sample + p2.cpu_s_per_sample)))


def test_concurrent_profile_reports_a_child_failure() -> None:
    import os

    from parties.data import DataError
    from parties.planning.profile import profile_config

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    a, p = sorted(os.sched_getaffinity(0))[:2]
    cfg = VflConfig(dataset="/nonexistent/table.csv", label="y",
                    workers=WorkersSection(active_cpus=(a,), passive_cpus=(p,)))
    with pytest.raises(DataError, match="nonexistent"):
        profile_config(cfg, min_time_s=0.05)
