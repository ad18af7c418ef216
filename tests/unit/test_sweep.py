"""The batch-size sweep, the cost-model fits and ``psfl vfl plan`` (parties/planning/sweep.py,
sim/launch/sysprofile.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from parties.config import ModelSection, VflConfig, WorkersSection
from parties.planning.costmodel import CommFit
from parties.planning.planner import NoFeasiblePlan
from parties.planning.profile import ProfileError
from parties.planning.sweep import (
    BadBatchSizes,
    CostModels,
    PartySweep,
    SweepPoint,
    check_batch_sizes,
    fit_cost_models,
    format_fits,
    parse_batch_sizes,
    party_cores,
    sweep_party,
)

CFG = VflConfig(epochs=2,
                model=ModelSection(bottom_hidden=(16,), top_hidden=(8,), embedding_dim=8))
BS = (8, 16, 32, 64)


def _data(n: int = 400, d: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x, (rng.random(n) > 0.5).astype(np.float32)


@pytest.fixture(scope="module")
def sweeps() -> dict[str, PartySweep]:
    x, y = _data()
    return {role: sweep_party(role, CFG, x, y if role == "active" else None, BS,
                              warmup_steps=1, min_steps=3, min_time_s=0.0, sync_reps=3)
            for role in ("active", "passive")}


def test_sweep_takes_each_party_its_own_bottom_width() -> None:
    """A party's own width (``active_bottom_hidden``) is what is swept: the replica the
    compute loads is built with it (a sweep with the shared width failed to load it)."""
    import dataclasses

    x, y = _data()
    cfg = dataclasses.replace(CFG,
                              model=dataclasses.replace(CFG.model, active_bottom_hidden=(40, 40)))
    wide = sweep_party("active", cfg, x, y, BS[:3], warmup_steps=1, min_steps=2,
                       min_time_s=0.0, sync_reps=1, memory=False)
    narrow = sweep_party("active", CFG, x, y, BS[:3], warmup_steps=1, min_steps=2,
                         min_time_s=0.0, sync_reps=1, memory=False)
    assert wide.param_bytes > narrow.param_bytes


@pytest.mark.parametrize("role", ["active", "passive"])
def test_sweep_times_forward_and_backward_per_batch_size(sweeps: dict[str, PartySweep],
                                                         role: str) -> None:
    s = sweeps[role]
    assert s.role == role and s.batch_sizes == BS and s.n_train == 400 and s.n_features == 6
    for p in s.points:
        assert p.steps == 3 and p.warmup_steps >= 1
        assert p.fwd_cpu_s > 0 and p.bwd_cpu_s > 0 and p.fwd_wall_s > 0 and p.bwd_wall_s > 0
        assert p.rss_bytes is not None and p.rss_bytes > 0
    assert s.param_bytes > 0 and s.sync_s > 0 and s.cores > 0
    if role == "active":  # bottom + top parameters
        assert s.param_bytes > sweeps["passive"].param_bytes


def test_fits_round_trip_through_profile_json(sweeps: dict[str, PartySweep],
                                              tmp_path: Path) -> None:
    comm = CommFit(latency_s=1e-4, s_per_byte=1e-9, r2=0.9, n_points=4)
    models = fit_cost_models(sweeps["active"], sweeps["passive"], comm, embedding_dim=8)
    assert models.n_train == 400 and models.batch_sizes == BS
    for cm in (models.active, models.passive):
        assert cm.forward.lam > 0 and math.isfinite(cm.forward.gamma)
        assert cm.backward.lam > 0 and cm.memory.m0 > 0 and cm.sync_overhead_s > 0
        assert cm.forward.n_points == len(BS)
    err = models.fit_error()
    assert set(err) == {f"{r}.{f}" for r in ("active", "passive")
                        for f in ("forward", "backward", "memory")} | {"comm"}
    assert all(v["rel_err_holdout"] is None or v["rel_err_holdout"] >= 0 for v in err.values())
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"cost_model": models.to_dict(),
                                "sweep": {r: s.to_dict() for r, s in sweeps.items()}}))
    doc = json.loads(path.read_text())
    assert CostModels.from_dict(doc["cost_model"]) == models
    assert PartySweep.from_dict(doc["sweep"]["active"]) == sweeps["active"]
    lines = format_fits(models)
    assert len(lines) == 7 and "γ" in lines[0] and "R²" in lines[0]


def test_fit_recovers_a_known_power_law() -> None:
    b = (16, 32, 64, 128, 256)
    pts = tuple(SweepPoint(batch_size=x, steps=5, warmup_steps=1, fwd_cpu_s=2e-5 * x ** 0.5,
                           bwd_cpu_s=3e-5 * x ** -0.2, fwd_wall_s=1.0, bwd_wall_s=1.0,
                           rss_bytes=int(1e8 + 1000 * x ** 1.1)) for x in b)
    s = PartySweep(role="active", cpus=(0,), cores=1.0, n_features=4, n_train=1000,
                   torch_threads=1, param_bytes=400, sync_s=1e-5, rss_baseline_bytes=10**8,
                   points=pts)
    models = fit_cost_models(s, PartySweep.from_dict({**s.to_dict(), "role": "passive"}),
                             CommFit(latency_s=1e-4, s_per_byte=0.0), embedding_dim=8)
    a = models.active
    assert a.forward.gamma == pytest.approx(0.5) and a.forward.lam == pytest.approx(2e-5)
    assert a.backward.gamma == pytest.approx(-0.2)  # negative exponents are not clipped
    assert a.forward.r2 == pytest.approx(1.0) and a.forward.rel_err_holdout < 1e-9
    assert a.memory.m0 == pytest.approx(1e8, rel=1e-3)


def test_bad_batch_sizes_are_typed_errors() -> None:
    assert check_batch_sizes([64, 16, 32]) == (16, 32, 64)
    assert check_batch_sizes([16, 32, 64, 1024], n_train=100) == (16, 32, 64)
    assert parse_batch_sizes("16, 32,64") == (16, 32, 64)
    for bad in ([0, 16, 32], [16, 16, 32], [16, 32], [16.0, 32, 64], [True, 16, 32]):
        with pytest.raises(BadBatchSizes):
            check_batch_sizes(bad)
    with pytest.raises(BadBatchSizes, match="at most the 50 training rows"):
        check_batch_sizes([16, 32, 64], n_train=50)
    with pytest.raises(BadBatchSizes, match="integers"):
        parse_batch_sizes("16,x,64")
    assert issubclass(BadBatchSizes, ProfileError)
    x, y = _data(n=40)
    with pytest.raises(BadBatchSizes):
        sweep_party("active", CFG, x, y, (16, 32, 64), min_time_s=0.0)


def test_party_cores_is_the_pinned_set_or_a_share() -> None:
    from parties.core.sysinfo import cores_allotted

    assert party_cores(VflConfig(workers=WorkersSection(active_cpus=(0,), passive_cpus=(1,))), "active") == 1.0
    assert party_cores(VflConfig(), "passive") == pytest.approx(cores_allotted() / 2)
    assert party_cores(VflConfig(workers=WorkersSection(active_cpus=(0,))), "passive") == pytest.approx(
        cores_allotted())


def _models(sweeps: dict[str, PartySweep]) -> CostModels:
    return fit_cost_models(sweeps["active"], sweeps["passive"],
                           CommFit(latency_s=1e-4, s_per_byte=1e-9), embedding_dim=8)


def test_plan_from_models_and_the_plan_config(sweeps: dict[str, PartySweep]) -> None:
    from sim.launch.sysprofile import apply_plan, load_plan_config, plan_from_models

    models = _models(sweeps)
    cfg = load_plan_config({"embedding_dim": 8, "epochs": 4}, None, ["epochs=2"])
    assert cfg.model.embedding_dim == 8 and cfg.epochs == 2
    plan, inputs = plan_from_models(models, cfg, w_max=3, batch_sizes=(8, 16, 32, 64, 1024))
    assert plan.batch_size in (8, 16, 32, 64) and 1 <= plan.w_active <= 3
    assert inputs["batch_sizes"] == [8, 16, 32, 64]  # 1024 > the 400 training rows
    assert inputs["extrapolated_batch_sizes"] == []
    new = apply_plan(cfg, plan)
    assert (new.workers.active, new.workers.passive, new.batch_size) == (plan.w_active, plan.w_passive,
                                                              plan.batch_size)
    assert apply_plan(cfg, plan.to_dict()) == new
    with pytest.raises(NoFeasiblePlan):
        plan_from_models(models, cfg, mem_limit_bytes=1.0)


def test_psfl_vfl_plan_on_a_profile_and_its_errors(sweeps: dict[str, PartySweep],
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"cost_model": _models(sweeps).to_dict(),
                                "settings": {"config": {"embedding_dim": 8}}}))
    assert main(["vfl", "plan", "--profile", str(prof), "--w-max", "2",
                 "--out", str(tmp_path / "p")]) == 0
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    # default candidates 16, 32, ..., 1024, capped by the 400 training rows
    assert doc["inputs"]["batch_sizes"] == [16, 32, 64, 128, 256]
    assert doc["batch_size"] in (16, 32, 64, 128, 256) and doc["inputs"]["embedding_dim"] == 8
    assert doc["profile"] == str(prof) and len(doc["table"]) == 5
    out = capsys.readouterr().out
    assert "<- plan" in out and "outside the profiled range" in out
    cases = [
        (["--profile", str(tmp_path / "missing.json")], "cannot read the profile"),
        (["--profile", str(prof), "--batch-sizes", "16,0,32"], "bad sweep batch sizes"),
        (["--profile", str(prof), "--mem-limit-mb", "1"], "no batch size"),
        (["--profile", str(prof), "--w-max", "0"], "w_max"),
        (["--profile", str(prof), "--set", "nope=1"], "nope"),
    ]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"parties": {}}))
    cases.append((["--profile", str(bare)], "no cost_model"))
    for extra, needle in cases:
        assert main(["vfl", "plan", *extra, "--out", str(tmp_path / "e")]) == 2, extra
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (extra, err)


# ------------------------------------------------------------ several passive parties
MULTI = VflConfig(epochs=2, passive_parties=2,
                  model=ModelSection(bottom_hidden=(16,), top_hidden=(8,), embedding_dim=8))


@pytest.fixture(scope="module")
def passive2_sweep() -> PartySweep:
    """``passive2`` swept with its own (narrower) columns."""
    x, _ = _data(d=3)
    return sweep_party("passive2", MULTI, x, None, BS, warmup_steps=1, min_steps=3,
                       min_time_s=0.0, sync_reps=3)


def _multi_models(sweeps: dict[str, PartySweep], passive2: PartySweep) -> CostModels:
    return fit_cost_models(sweeps["active"], sweeps["passive"],
                           CommFit(latency_s=1e-4, s_per_byte=1e-9), embedding_dim=8,
                           more_passive=[passive2])


def test_cost_models_of_several_passive_parties(sweeps: dict[str, PartySweep],
                                                passive2_sweep: PartySweep) -> None:
    s2 = passive2_sweep
    assert s2.role == "passive" and s2.n_features == 3 and s2.batch_sizes == BS
    assert s2.param_bytes < sweeps["passive"].param_bytes  # its own input width
    models = _multi_models(sweeps, s2)
    assert [m.role for m in models.passives] == ["passive", "passive"]
    assert list(models.by_party) == ["active", "passive", "passive2"]
    doc = json.loads(json.dumps(models.to_dict()))
    assert {"active", "passive", "passive2"} <= set(doc)
    assert "passive2.forward" in doc["fit_error"]
    assert CostModels.from_dict(doc) == models
    lines = format_fits(models)
    assert len(lines) == 10 and lines[0].startswith("passive ") and \
        lines[3].startswith("passive2")
    # the two-party form is as before: no key of a second passive party
    two = _models(sweeps).to_dict()
    assert set(two) == {"active", "passive", "comm", "fit_error", "n_train",
                        "embedding_dim", "batch_sizes", "source"}
    assert CostModels.from_dict(two).more_passive == ()


def test_party_cores_with_several_passive_parties() -> None:
    from parties.core.sysinfo import cores_allotted

    pinned = VflConfig(passive_parties=3,
                       workers=WorkersSection(active_cpus=(0,), passive_cpus=(1, 2, 3)))
    assert party_cores(pinned, "active") == 1.0
    assert party_cores(pinned, "passive3") == pytest.approx(1.0)  # 3 share 3 CPUs
    assert party_cores(VflConfig(passive_parties=3), "passive2") == pytest.approx(
        max(cores_allotted() / 4, 1e-3))
    assert party_cores(VflConfig(passive_parties=2, workers=WorkersSection(active_cpus=(0,))), "passive") == \
        pytest.approx(max(cores_allotted() / 2, 1e-3))


def test_plans_of_several_passive_parties_apply_per_party(
        sweeps: dict[str, PartySweep], passive2_sweep: PartySweep) -> None:
    from pubsub.config import ConfigError

    from sim.launch.sysprofile import apply_plan, plan_from_models

    models = _multi_models(sweeps, passive2_sweep)
    plan, inputs = plan_from_models(models, MULTI, w_max=3, batch_sizes=(8, 16, 32, 64))
    assert len(plan.passive_party_workers) == 2 and set(inputs["cores"]) == {
        "active", "passive", "passive2"}
    new = apply_plan(MULTI, plan)
    assert new.passive_workers == plan.passive_party_workers
    assert new.workers.passive == plan.w_passive and new.batch_size == plan.batch_size
    d = {"w_active": 2, "w_passive": 1, "passive_party_workers": [1, 3], "batch_size": 32}
    assert apply_plan(MULTI, d).workers.per_passive_party == (1, 3)
    ps = apply_plan(replace(MULTI, algo="vfl-ps"), d)  # pairs: the fewest, on every party
    assert ps.passive_workers == (1, 1)
    with pytest.raises(ConfigError, match="2 passive parties") as ei:
        apply_plan(CFG, d)
    assert ei.value.key == "vfl.passive_parties"
    legacy = {"w_active": 2, "w_passive": 3, "batch_size": 32}  # a two-party plan.json
    assert (apply_plan(CFG, legacy).workers.passive, apply_plan(CFG, legacy).passive_workers) == \
        (3, (3,))
    with pytest.raises(ConfigError, match="vfl.passive_parties"):
        apply_plan(MULTI, legacy)
    with pytest.raises(ConfigError, match="cost models of 2 passive parties"):
        plan_from_models(models, CFG)


def test_psfl_vfl_plan_with_several_passive_parties(
        sweeps: dict[str, PartySweep], passive2_sweep: PartySweep, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({
        "cost_model": _multi_models(sweeps, passive2_sweep).to_dict(),
        "settings": {"config": {"embedding_dim": 8, "passive_parties": 2}}}))
    assert main(["vfl", "plan", "--profile", str(prof), "--w-max", "3",
                 "--out", str(tmp_path / "p")]) == 0
    doc = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert len(doc["passive_party_workers"]) == 2
    assert doc["w_passive"] == doc["passive_party_workers"][0]
    assert [p["party"] for p in doc["parties"]] == ["active", "passive", "passive2"]
    out = capsys.readouterr().out
    assert "passive_party_workers" in out and "<- plan" in out
    assert main(["vfl", "plan", "--profile", str(prof), "--set", "passive_parties=3",
                 "--out", str(tmp_path / "e")]) == 2
    assert "vfl.passive_parties" in capsys.readouterr().err
