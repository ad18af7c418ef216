"""Streaming end to end: each party reads only its own Parquet shards (a Criteo-shaped
table), trains from its on-disk cache with worker processes, and matches the in-memory
run on the same rows; bad shards and misaligned files are clear errors before training."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from parties.config import load_vfl_config
from parties.data.criteo import CriteoSpec, write_criteo
from sim.launch.local import predict_in_process, run_vfl_in_process
from tests.conftest import psfl_in_process
from tests.bounds import above, below

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def criteo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_criteo(tmp_path_factory.mktemp("criteo"),
                        CriteoSpec(rows=15_000, shard_rows=5_000, row_group_rows=4096,
                                   max_levels=20_000, seed=3))


def _sets(dirs: dict[str, Path], *extra: str) -> list[str]:
    files = ", ".join(f'"{d}"' for d in dirs.values())
    return ["label=label", "epochs=1", "batch_size=128", "model.embedding_dim=8",
            f"data.party_datasets=[{files}]", "data.row_split=hash", "data.shuffle_block_rows=1024",
            "data.shuffle_window_rows=8192", *extra]


@pytest.mark.stochastic
def test_streamed_run_matches_the_in_memory_run(criteo: dict[str, Path],
                                                tmp_path: Path) -> None:
    stream = run_vfl_in_process(load_vfl_config(None, _sets(
        criteo, "data.stream=true", "workers.mode=process")), tmp_path / "s").metrics
    # the saved model scores the same test rows (read in memory) to the same AUC
    pred = predict_in_process(tmp_path / "s", tmp_path / "pred").summary
    assert pred["test_auc"] == pytest.approx(stream["test_auc"], abs=1e-6)
    memory = run_vfl_in_process(load_vfl_config(None, _sets(
        criteo, "data.stream=false", "data.shuffle=full")), tmp_path / "m").metrics
    assert stream["label_positive"] == memory["label_positive"] == "1"
    for m in (stream, memory):
        above(m["test_auc"], 0.55, "test AUC")  # 1 epoch of 10,000 rows: learning, far from converged
    # same rows, same split; only the batch order (blocks vs a full permutation) and the
    # encoder's statistics (streamed, clipped) differ
    below(abs(stream["test_auc"] - memory["test_auc"]), 0.03, "|stream - memory| AUC")
    kinds = {t["treatment"] for t in stream["parties"]["passive"]["treatments"]}
    assert {"numeric", "hashed"} <= kinds
    assert stream["parties"]["active"]["worker_mode"] == "process"
    treat = stream["parties"]["passive"]["treatments"]
    width = sum(t["levels"] if t["treatment"] == "onehot" else 1 for t in treat)
    assert len(treat) == 20 and stream["parties"]["passive"]["n_features"] == width


def _run_cli(capfd: pytest.CaptureFixture[str], dirs: dict[str, Path], out: Path):
    files = ", ".join(f'"{d}"' for d in dirs.values())
    return psfl_in_process(capfd, "vfl", "run", "--out", str(out), "--set", "label=label",
                           "--set", "data.stream=true", "--set", f"data.party_datasets=[{files}]",
                           "--set", "epochs=1", "--timeout-s", "120")


def test_a_bad_shard_stops_the_run_naming_the_file(criteo: dict[str, Path], tmp_path: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "passive"
    shutil.copytree(criteo["passive"], bad)
    pd.DataFrame({"I7": ["not a count"]}).to_parquet(bad / "part-00001.parquet")
    res = _run_cli(capfd, {"active": criteo["active"], "passive": bad}, tmp_path / "run")
    text = res.stdout + res.stderr
    assert res.returncode != 0
    assert "part-00001.parquet" in text and "schema differs" in text
    assert "Traceback" not in text
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_party_with_fewer_rows_is_named(criteo: dict[str, Path], tmp_path: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    short = tmp_path / "passive"
    shutil.copytree(criteo["passive"], short)
    (short / "part-00002.parquet").unlink()
    res = _run_cli(capfd, {"active": criteo["active"], "passive": short}, tmp_path / "run")
    text = res.stdout + res.stderr
    assert res.returncode != 0
    assert str(short) in text and "10,000 rows" in text and "15,000" in text
    assert "Traceback" not in text
    assert not (tmp_path / "run" / "metrics.json").exists()
