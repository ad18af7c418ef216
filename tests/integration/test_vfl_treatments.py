"""Column treatments end to end: a traffic-shaped table with a date-time column, an ID
column and a hashed high-cardinality column trains (worker processes hold the hashed
embedding tables), records each column's treatment and the positive class, reloads for
prediction with the same test AUC, and an ID column refused by option is a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parties.config import load_vfl_config
from parties.data.demo_tables import make_traffic
from sim.launch.local import predict_in_process, run_vfl_in_process
from tests.conftest import psfl_in_process

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def traffic_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = make_traffic(6000, seed=1)
    rng = np.random.default_rng(1)
    t.insert(3, "station", [f"s{x}" for x in rng.integers(0, 300, len(t))])  # > 64 levels
    path = tmp_path_factory.mktemp("data") / "traffic.csv"
    t.to_csv(path, index=False)
    return path


def test_treated_columns_train_record_and_reload(traffic_csv: Path, tmp_path: Path) -> None:
    cfg = load_vfl_config(None, [
        f"dataset={traffic_csv}", "label=traffic", "positive_class=high", "epochs=3",
        "batch_size=128", "lr=3e-3", "model.embedding_dim=8", "workers.mode=process",
        'data.active_columns=["holiday","temp","rain_1h","snow_1h","station"]',
        'data.passive_columns=["clouds_all","weather_main","weather_description","date_time",'
        '"record_id"]'])
    run = tmp_path / "run"
    m = run_vfl_in_process(cfg, run).metrics
    assert m["label_positive"] == "high"
    act = {t["column"]: t for t in m["parties"]["active"]["treatments"]}
    pas = {t["column"]: t for t in m["parties"]["passive"]["treatments"]}
    assert act["station"]["treatment"] == "hashed" and act["station"]["buckets"] == 1024
    assert pas["date_time"]["treatment"] == "datetime" and "hour" in pas["date_time"]["parts"]
    assert pas["record_id"]["treatment"] == "dropped"
    # holiday one-hot, temp / rain / snow, and the one bucket column last
    assert m["parties"]["active"]["n_features"] == act["holiday"]["levels"] + 3 + 1
    assert m["model"]["hashed"]["buckets"] == [1024]
    assert m["test_auc"] > 0.85  # the hour, from the date-time parts, carries the label
    s = predict_in_process(run, tmp_path / "pred").summary
    assert s["test_auc"] == pytest.approx(m["test_auc"], abs=1e-6)


def test_a_refused_id_column_is_a_clear_error_before_training(
        traffic_csv: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    res = psfl_in_process(capfd, "vfl", "run", "--dataset", str(traffic_csv), "--out",
                          str(tmp_path / "run"), "--set", "label=traffic", "--set",
                          "data.id_columns=refuse", "--set", "epochs=1", "--timeout-s", "120")
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert "'record_id' looks like an ID" in text and "Traceback" not in text
    assert not (tmp_path / "run" / "model").exists()
