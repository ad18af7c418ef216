"""The Python API (:mod:`sim.api`): one job, trained in this process over the in-memory
bus and as broker + party processes, saved, reloaded and used to predict."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from parties.data import load_table
from parties.models.zoo import ResidualMlp
from sim.api import VflJob, predict, train
from tests.bounds import above, below

pytestmark = pytest.mark.timeout(600)

ACTIVE = ["age", "job", "marital", "education", "default", "balance"]
PASSIVE = ["housing", "loan", "contact", "day", "month", "duration", "campaign", "pdays",
           "previous", "poutcome"]
# a bottom with BatchNorm (running statistics synced through the PS) and Dropout
# (train/eval modes); a partial of an importable class, so party processes rebuild it
BOTTOM = functools.partial(ResidualMlp, depth=1, width=32, norm="batch", dropout=0.1)
SETTINGS = {"epochs": 2, "batch_size": 128, "lr": 3e-3, "model.embedding_dim": 8, "seed": 0}


def sgd(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr * 30, momentum=0.9)


@pytest.fixture(scope="module")
def bank_frame() -> pd.DataFrame:
    frame, _ = load_table("bank")
    return frame.sample(n=4000, random_state=0).reset_index(drop=True)


@pytest.fixture(scope="module")
def memory_run(bank_frame: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory):
    job = VflJob(data=bank_frame, label="y", active_columns=ACTIVE, passive_columns=PASSIVE,
                 bottom=BOTTOM, optimizer=sgd, config=SETTINGS)
    return job, train(job, tmp_path_factory.mktemp("api") / "run")


def test_a_job_from_a_data_frame_trains_in_process_and_saves_its_model(memory_run) -> None:
    job, res = memory_run
    assert res.metric_name == "auc" and res.test_auc == res.metric
    assert 0.75 < res.metric <= 1.0
    assert res.metrics["broker"]["transport"] == "memory"
    assert res.metrics["broker"]["forwarded"] > 0
    assert res.metrics["model"]["optimizer"].endswith(":sgd")
    active = res.load("active")
    bn = [m for m in active.modules[0].modules() if isinstance(m, nn.BatchNorm1d)]
    # the running statistics came back from training through the parameter server
    assert bn and not torch.allclose(bn[0].running_mean, torch.zeros_like(bn[0].running_mean))
    assert not active.modules[0].training  # saved parts load in eval mode
    assert tuple(res.load("passive").manifest["columns"]) == tuple(PASSIVE)


def test_prediction_in_process_reproduces_the_test_auc(memory_run, tmp_path: Path) -> None:
    _, res = memory_run
    scored = predict(res.out, tmp_path / "pred", models=res)
    assert abs(scored.summary["metric"] - res.metric) <= 1e-6
    table = pd.read_csv(scored.predictions)
    assert len(table) == scored.summary["rows"] and np.isfinite(table["prediction"]).all()


@pytest.mark.stochastic
def test_the_same_job_through_the_broker_lands_near_the_in_process_auc(
        memory_run, tmp_path: Path) -> None:
    job, mem = memory_run
    res = train(job, tmp_path / "run", transport="broker", timeout_s=400)
    assert res.metrics["security"]["transport"] == "curve"
    assert (res.out / "model" / "passive" / "manifest.json").exists()
    # the semi-asynchronous schedule interleaves differently across processes
    below(abs(res.metric - mem.metric), 0.03, "|broker - memory| AUC")


@pytest.mark.stochastic
def test_a_numpy_array_with_its_own_models_and_loss(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1500, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 4] > 0).astype(np.float32)
    job = VflJob(data=np.column_stack([x, y]), columns=["a", "b", "c", "d", "e", "f", "y"],
                 label="y", active_columns=["a", "b", "c"], passive_columns=["d", "e", "f"],
                 bottom=lambda d_in, d_out: nn.Linear(d_in, d_out),
                 passive_bottom=lambda d_in, d_out: nn.Sequential(nn.Linear(d_in, 16),
                                                                  nn.Tanh(),
                                                                  nn.Linear(16, d_out)),
                 top=lambda d_in, d_out: nn.Linear(d_in, d_out),
                 loss=lambda task: nn.BCEWithLogitsLoss(),
                 config={"epochs": 6, "model.embedding_dim": 4, "batch_size": 64, "lr": 1e-2,
                         "workers.mode": "thread"})
    res = train(job, tmp_path / "run")
    # the label is a function of one column per party: either party's column alone gives
    # 0.832, both 1.0. At 3 epochs a seed reached only 0.870 (median 0.964); at 6, over
    # 10 seeds of tests/seed_sweep.py, 0.987 at the lowest (median 0.996)
    above(res.metric, 0.88, "test AUC")
    assert "passive_model" in res.metrics["model"]
    # each party got its own bottom; the lambdas are rebuilt from the job's factory
    assert any(isinstance(m, nn.Tanh) for m in res.load("passive").modules[0].modules())
    assert isinstance(res.load("active").modules[0], nn.Linear)


@pytest.mark.stochastic
def test_three_parties_from_the_python_api_with_their_own_models(tmp_path: Path) -> None:
    """Two passive parties, each with its own columns and the job's bottom; the top model
    sees the concatenation of three embeddings; every party's part is saved."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1500, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 2] + x[:, 5] > 0).astype(np.float32)
    widths: list[int] = []

    def top(d_in: int, d_out: int) -> nn.Module:
        widths.append(d_in)
        return nn.Linear(d_in, d_out)

    job = VflJob(data=np.column_stack([x, y]), columns=["a", "b", "c", "d", "e", "f", "y"],
                 label="y", active_columns=["a", "b"],
                 passive_party_columns=[["c", "d"], ["e", "f"]],
                 bottom=lambda d_in, d_out: nn.Linear(d_in, d_out), top=top,
                 config={"epochs": 3, "model.embedding_dim": 4, "batch_size": 64, "lr": 1e-2,
                         "workers.mode": "inline"})
    res = train(job, tmp_path / "run")
    above(res.metric, 0.9, "test AUC")  # one informative column per party
    assert set(widths) == {12}  # 3 parties x embedding_dim 4
    assert sorted(res.metrics["parties"]) == ["active", "passive", "passive2"]
    for p in ("active", "passive", "passive2"):
        assert (tmp_path / "run" / "model" / p / "weights.pt").is_file()
    with pytest.raises(Exception, match="passive_party_columns"):
        VflJob(data=np.column_stack([x, y]), columns=["a", "b", "c", "d", "e", "f", "y"],
               label="y", active_columns=["a"], passive_party_columns=["c", "d"]
               ).resolve(tmp_path / "bad")
