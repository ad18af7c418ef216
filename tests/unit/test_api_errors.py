"""Bad input to the Python API (:mod:`sim.api`) is a typed error naming the value, raised
before any party or process starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from parties.data import UnknownColumn
from parties.privacy.dpsgd import DpIncompatibleModel
from parties.runtime.saved import SavedModelMismatch
from parties.models.zoo import ModelSpecError
from pubsub.config import ConfigError
from sim.api import JobError, VflJob, train


def _frame(n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    f = pd.DataFrame(rng.normal(size=(n, 4)), columns=["a", "b", "c", "d"])
    f["y"] = (f["a"] > 0).astype(int)
    return f


def _job(**kw) -> VflJob:  # type: ignore[no-untyped-def]
    base = dict(data=_frame(), label="y", active_columns=["a", "b"], passive_columns=["c", "d"],
                config={"epochs": 1, "model.embedding_dim": 4})
    return VflJob(**{**base, **kw})


def _no_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything would start a party."""
    import sim.launch.local

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a party started")

    monkeypatch.setattr(sim.launch.local, "run_parties_in_memory", boom)


def _raises(*a: int) -> nn.Module:
    raise RuntimeError("no GPU here")


def test_a_data_frame_without_a_named_column_names_it(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _no_start(monkeypatch)
    with pytest.raises(UnknownColumn) as ei:
        train(_job(passive_columns=["c", "zz"]), tmp_path)
    assert ei.value.columns == ("zz",) and "zz" in str(ei.value)
    with pytest.raises(UnknownColumn, match="'label_x'"):
        train(_job(label="label_x"), tmp_path)


@pytest.mark.parametrize("kw, key, words", [
    (dict(bottom=_raises), "model.bottom", "raised RuntimeError: no GPU here"),
    (dict(bottom=lambda d_in, d_out: nn.Linear(d_in, d_out + 1)), "model.bottom", "expected (2, 4)"),
    (dict(top=lambda d_in, d_out: nn.Linear(d_in + 3, d_out)), "model.top", "rejects a (2, 8)"),
    (dict(optimizer=lambda params, lr: "adam"), "optimizer", "not a torch.optim.Optimizer"),
    (dict(loss=lambda task: 3), "loss", "not a torch nn.Module"),
])
def test_a_broken_factory_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               kw, key, words) -> None:  # type: ignore[no-untyped-def]
    _no_start(monkeypatch)
    with pytest.raises(ModelSpecError) as ei:
        train(_job(**kw), tmp_path)
    assert ei.value.key == f"vfl.{key}" and words in str(ei.value)


def test_bad_job_fields_are_job_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_start(monkeypatch)
    cases = [
        (dict(config={"epochz": 3}), "job.config", "epochz"),
        (dict(data=np.zeros(5)), "job.data", "2-D"),
        (dict(data=np.zeros((5, 3)), columns=["a"]), "job.columns", "1 names for 3"),
        (dict(data=[1, 2, 3]), "job.data", "list"),
        (dict(active_columns=()), "job.active_columns", "both"),
        (dict(bottom=3), "job.bottom", "int"),
        (dict(config={"data.active_columns": ["a"], "data.passive_columns": ["b"]}),
         "job.active_columns", "give it once"),
    ]
    for kw, key, words in cases:
        with pytest.raises(JobError) as ei:
            train(_job(**kw), tmp_path)
        assert ei.value.key == key and words in str(ei.value), (kw, str(ei.value))
    with pytest.raises(JobError, match="'memory' or 'broker'"):
        train(_job(), tmp_path, transport="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        train(_job(config={"epochs": 0}), tmp_path)


def test_dp_with_batchnorm_in_the_passive_bottom_is_refused(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _no_start(monkeypatch)
    bn = lambda d_in, d_out: nn.Sequential(nn.Linear(d_in, 8), nn.BatchNorm1d(8),  # noqa: E731
                                           nn.Linear(8, d_out))
    with pytest.raises(DpIncompatibleModel):
        train(VflJob(data="bank", bottom=bn, config={"dp": {"epsilon": 8.0}, "epochs": 1}), tmp_path)


def test_the_optimizer_and_loss_reach_the_workers() -> None:
    """A worker's replica uses the factory's optimizer; the active compute its loss."""
    from parties.config import ModelSection, WorkersSection, VflConfig
    from parties.models.model import ParameterServer, flat_params
    from parties.models.compute import make_compute
    from parties.models.zoo import ModelFactory

    cfg = VflConfig(model=ModelSection(embedding_dim=4), workers=WorkersSection(mode="thread"))
    seen: list[str] = []

    def loss(task: str) -> nn.Module:
        seen.append(task)
        return nn.BCEWithLogitsLoss()

    f = ModelFactory(cfg, optimizer_fn=lambda p, lr: torch.optim.SGD(p, lr=lr), loss_fn=loss)
    mods = f.modules("active", 3)
    c = make_compute("active", cfg, np.zeros((8, 3), np.float32), np.zeros(8, np.float32),
                     ParameterServer(flat_params(mods), workers=1), models=f)
    assert isinstance(c.replica.opt, torch.optim.SGD) and seen == ["binary"]


def test_parts_of_two_runs_are_refused(tmp_path: Path) -> None:
    from sim.launch.predict import check_parts

    for role, run in (("active", "r1"), ("passive", "r2")):
        d = tmp_path / "model" / role
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(f'{{"run_id": "{run}", "config_digest": "x"}}')
    with pytest.raises(SavedModelMismatch, match="r1.*r2|r2.*r1"):
        check_parts(tmp_path)


def test_every_passive_partys_part_is_checked_naming_it(tmp_path: Path) -> None:
    from parties.runtime.saved import SavedModelError
    from sim.launch.predict import check_parts

    def part(party: str, run: str) -> Path:
        d = tmp_path / "model" / party
        d.mkdir(parents=True, exist_ok=True)
        (d / "manifest.json").write_text(f'{{"run_id": "{run}", "config_digest": "x"}}')
        return d

    part("active", "r1").joinpath("config.toml").write_text("[vfl]\npassive_parties = 3\n")
    part("passive", "r1")
    part("passive3", "r1")
    with pytest.raises(SavedModelError, match="passive2"):  # missing
        check_parts(tmp_path)
    part("passive2", "r1")
    assert check_parts(tmp_path) == ("active", "passive", "passive2", "passive3")
    part("passive3", "r9")
    with pytest.raises(SavedModelMismatch, match="the passive3 party's saved model.*'r9'"):
        check_parts(tmp_path)


def test_a_jobs_config_is_checked_against_its_own_data() -> None:
    """A frame's regression job is not checked against the default dataset (bank, a binary
    task); a named dataset's job against that dataset; ``vfl.`` prefixes are accepted as
    on the command line."""
    frame = pd.DataFrame({"a": np.arange(50.0), "b": np.arange(50.0) % 7, "y": np.arange(50.0)})
    job = VflJob(data=frame, label="y", active_columns=["a"], passive_columns=["b"],
                 config={"task": "regression", "vfl.labels.epsilon": None, "vfl.epochs": 2})
    cfg = job._base_config()
    assert cfg.task == "regression" and cfg.epochs == 2
    assert VflJob(data="california", config={"task": "regression"})._base_config().dataset \
        == "california"
    with pytest.raises(ConfigError, match="binary task"):
        VflJob(data="bank", config={"task": "regression"})._base_config()
