"""Saved models and ``psfl vfl predict``: real runs (broker + two party processes) on a
sample of bank, then prediction over the bus with each party's saved part."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pandas as pd
import pytest

from parties.config import load_vfl_config
from parties.data import load_table
from parties.runtime.predict import PredictionBudgetExceeded, PredictionIdsRequired
from sim.launch.local import predict_in_process, run_vfl_in_process
from tests.conftest import psfl_in_process

PSFL = [sys.executable, "-m", "sim.cli"]
# a prediction through `psfl vfl predict` starts a broker and two party processes (each
# imports torch): about a minute on two shared cores
pytestmark = pytest.mark.timeout(600)


def _psfl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PSFL, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bank_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    frame, _ = load_table("bank")
    sample = frame.sample(n=4000, random_state=0).reset_index(drop=True)
    sample.insert(0, "id", [f"c{i:05d}" for i in range(len(sample))])
    path = tmp_path_factory.mktemp("data") / "bank_sample.csv"
    sample.to_csv(path, index=False)
    return path


def _train(data: Path, out: Path, *sets: str) -> dict:  # type: ignore[type-arg]
    """Train in this process over the in-memory bus (:mod:`sim.launch.local`): what is tested here
    is the saved model and prediction; training through the broker is tested elsewhere."""
    base = [f"dataset={data}", "label=y", "epochs=2", "batch_size=128", "lr=3e-3",
            "model.embedding_dim=8",
            # the ID column is no feature: each party's columns are listed
            'data.active_columns=["age","job","marital","education","default","balance"]',
            'data.passive_columns=["housing","loan","contact","day","month","duration",'
            '"campaign","pdays","previous","poutcome"]']
    return run_vfl_in_process(load_vfl_config(None, [*base, *sets]), out).metrics


def _predict(run: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _psfl("vfl", "predict", str(run), "--out", str(out), "--timeout-s", "200",
                 "--wait-s", "60", *extra)


@pytest.fixture(scope="module")
def mlp_run(bank_sample: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, dict]:  # type: ignore[type-arg]
    run = tmp_path_factory.mktemp("mlp") / "run"
    return run, _train(bank_sample, run)


def test_saved_mlp_reproduces_the_runs_test_auc(mlp_run: tuple[Path, dict],  # type: ignore[type-arg]
                                                tmp_path: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    run, m = mlp_run
    for role in ("active", "passive"):
        man = orjson.loads((run / "model" / role / "manifest.json").read_bytes())
        assert man["run_id"] == m["run_id"] and man["model"]["model"] == "mlp"
    # the launcher in this process, the broker and both parties processes (the refusal
    # below goes through python -m sim.cli)
    res = psfl_in_process(capfd, "vfl", "predict", str(run), "--out", str(tmp_path / "pred"),
                          "--timeout-s", "200", "--wait-s", "60")
    assert res.returncode == 0, res.stderr[-3000:]
    s = orjson.loads((tmp_path / "pred" / "predict.json").read_bytes())
    assert s["source"] == "test_split" and s["dp"]["enabled"] is False
    assert s["test_auc"] == pytest.approx(m["test_auc"], abs=1e-6)
    table = pd.read_csv(tmp_path / "pred" / "predictions.csv")
    assert len(table) == s["rows"] == 1200 and set(table.columns) == {"row", "prediction",
                                                                      "label"}
    assert table["prediction"].between(0, 1).all()


def test_saved_mlp_scores_new_rows_by_id(mlp_run: tuple[Path, dict],  # type: ignore[type-arg]
                                         bank_sample: Path, tmp_path: Path) -> None:
    run, _ = mlp_run
    new = pd.read_csv(bank_sample).sample(n=300, random_state=1)
    new_path = tmp_path / "new.csv"
    new.to_csv(new_path, index=False)
    predict_in_process(run, tmp_path / "pred_new", data=str(new_path))
    t2 = pd.read_csv(tmp_path / "pred_new" / "predictions.csv")
    assert t2["id"].tolist() == new["id"].tolist()
    s2 = orjson.loads((tmp_path / "pred_new" / "predict.json").read_bytes())
    assert s2["source"] == str(new_path) and 0.0 <= s2["data_auc"] <= 1.0


def test_parts_of_different_runs_are_refused_naming_both_ids(
        mlp_run: tuple[Path, dict], tmp_path: Path) -> None:  # type: ignore[type-arg]
    run, m = mlp_run
    other = tmp_path / "other"
    shutil.copytree(run, other)
    mpath = other / "model" / "passive" / "manifest.json"
    man = orjson.loads(mpath.read_bytes())
    mpath.write_bytes(orjson.dumps({**man, "run_id": "someother"}))
    res = _predict(other, tmp_path / "pred_bad")
    assert res.returncode == 4, res.stderr[-2000:]
    assert m["run_id"] in res.stderr and "someother" in res.stderr
    assert not (tmp_path / "pred_bad").exists()  # refused before anything started


def test_resnet_with_batchnorm_in_worker_processes_round_trips(bank_sample: Path,
                                                               tmp_path: Path) -> None:
    run = tmp_path / "run"
    m = _train(bank_sample, run, "model.bottom=resnet", "model.resnet_depth=1", "model.resnet_width=16",
               "model.resnet_norm=batch", "workers.mode=process")
    man = orjson.loads((run / "model" / "active" / "manifest.json").read_bytes())
    assert man["model"] == {"model": "resnet", "top_model": "resnet",
                            "resnet": {"depth": 1, "width": 16, "norm": "batch",
                                       "dropout": 0.0}}
    s = predict_in_process(run, tmp_path / "pred").summary
    assert s["test_auc"] == pytest.approx(m["test_auc"], abs=1e-6)


def test_dp_batchnorm_and_broken_factories_are_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main as psfl  # in process: the refusal comes before any child starts

    base = ["vfl", "run", "--dataset", "bank", "--set", "epochs=1", "--timeout-s", "60"]
    out = tmp_path / "bn"
    code = psfl([*base, "--out", str(out), "--model", "resnet", "--set", "model.resnet_norm=batch",
                 "--set", "dp.mu=8"])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "BatchNorm1d" in err and "Traceback" not in err
    assert not out.exists()  # refused before the run directory, broker or parties
    out = tmp_path / "width"
    code = psfl([*base, "--out", str(out), "--model", "tests.unit.zoo_user_models:wrong_width"])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "tests.unit.zoo_user_models:wrong_width" in err and "expected (2, 32)" in err
    assert not out.exists()


def test_dp_prediction_continues_the_training_ledger(bank_sample: Path,
                                                     tmp_path: Path) -> None:
    run = tmp_path / "run"
    schema = Path(__file__).parents[2] / "parties" / "datasets" / "bank.schema.toml"
    m = _train(bank_sample, run, "dp.mu=8", "dp.noise_seed=3", f'dp.schema="{schema}"',
               "dp.predict_max_releases=2", "model.bottom=resnet",
               "model.resnet_depth=1", "model.resnet_width=16", "model.resnet_norm=batch",
               "dp.batchnorm=groupnorm")
    assert (run / "model" / "passive" / "schema.toml").exists()
    assert m["dp"]["publications_max_test"] == 1
    dp = predict_in_process(run, tmp_path / "pred").summary["dp"]
    assert dp["enabled"] and dp["continues"] == "test"
    assert dp["publications_max_test"] == 2
    assert dp["prediction_mu"] == pytest.approx(2 ** 0.5 * dp["release_mu"], rel=1e-9)
    assert dp["mu"] >= m["dp"]["mu"] - 1e-9
    led = orjson.loads((run / "model" / "passive" / "ledger.json").read_bytes())
    assert len(led["predictions"]) == 1 and max(led["counts"]["test"]) == 2
    res2 = predict_in_process(run, tmp_path / "pred2")
    dp2 = res2.summary["dp"]
    assert dp2["publications_max_test"] == 3 and dp2["prediction_mu"] > dp["prediction_mu"]
    # each release draws its own noise, even under a fixed dp_noise_seed
    first = (tmp_path / "pred" / "predictions.csv").read_text()
    assert (tmp_path / "pred2" / "predictions.csv").read_text() != first
    # a third would give each test record 3 prediction releases: refused before any
    with pytest.raises(PredictionBudgetExceeded, match="dp_predict_max_releases"):
        predict_in_process(run, tmp_path / "pred3")
    assert max(orjson.loads((run / "model" / "passive" / "ledger.json").read_bytes())
               ["counts"]["test"]) == 3
    # new rows: composed by ID across files, whatever the file (rows in another order)
    new = tmp_path / "new.csv"
    rows = pd.read_csv(bank_sample).head(6)
    rows.to_csv(new, index=False)
    d1 = predict_in_process(run, tmp_path / "new1", data=str(new)).summary["dp"]
    assert d1["continues"] == "prediction_ledger" and d1["prediction_releases_max"] == 1
    assert d1["prediction_mu"] == pytest.approx(d1["release_mu"], rel=1e-9)
    rows.iloc[::-1].head(3).to_csv(new, index=False)
    d2 = predict_in_process(run, tmp_path / "new2", data=str(new)).summary["dp"]
    assert d2["prediction_mu"] == pytest.approx(2 ** 0.5 * d2["release_mu"], rel=1e-9)
    assert d2["mu"] == pytest.approx(math.hypot(dp2["mu"], d2["prediction_mu"]), rel=1e-9)
    ledger = (run / "model" / "passive" / "prediction_ledger.json").read_text()
    assert "c0000" not in ledger  # salted hashes, not the IDs
    with pytest.raises(PredictionBudgetExceeded):
        predict_in_process(run, tmp_path / "new3", data=str(new))
    # under DP a file without the ID column is refused
    rows.drop(columns=["id"]).to_csv(new, index=False)
    with pytest.raises(PredictionIdsRequired):
        predict_in_process(run, tmp_path / "new4", data=str(new))
