"""bench/synth_table.py against a stub launcher: JSON shape, scoring and the Markdown table."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from synth.domain import decode, encode, infer_schema

#: the neural fits on one torch thread, as the coordinator runs them (conftest)
pytestmark = pytest.mark.usefixtures("torch_one_thread")

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_table(n: int = 600, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 3, n)
    return pd.DataFrame({"age": rng.integers(18, 80, n),
                         "job": np.array(["x", "y", "z"])[a],
                         "gain": np.where(rng.random(n) < 0.9, 0, rng.integers(100, 9000, n)),
                         "y": np.where(rng.random(n) < 0.8, a == 1, a != 1).astype(str)})


def fake_run_synth(cfg, out, *, timeout_s=None, quiet=False):
    out = Path(out)
    df = tiny_table(seed=cfg.seed)
    schema = infer_schema(df)
    (out / "data" / "parties").mkdir(parents=True, exist_ok=True)
    df.to_parquet(out / "data" / "train.parquet", index=False)
    df.iloc[:50].to_parquet(out / "data" / "holdout.parquet", index=False)
    for i, rows in enumerate(np.array_split(np.arange(len(df)), cfg.parties)):
        df.iloc[rows].to_parquet(out / "data" / "parties" / f"p{i:03d}.parquet", index=False)
    (out / "schema.json").write_text(json.dumps(schema.to_dict()))
    rng = np.random.default_rng(cfg.parties)
    codes = encode(df, schema)
    syn = np.stack([rng.permutation(codes[:, j]) for j in range(codes.shape[1])], axis=1)
    decode(syn, schema, rng).to_csv(out / "synthetic.csv", index=False)
    metrics = {"avg_tv": 0.1, "max_tv": 0.2, "bytes_wire": 1000 * cfg.parties,
               "bytes_naive": 4000 * cfg.parties, "wall_s": 1.5, "ml_utility": {}}
    (out / "metrics.json").write_text(json.dumps(metrics))
    return types.SimpleNamespace(metrics=metrics, out=out)


@pytest.fixture()
def table_mod(monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("torch")
    import sim  # noqa: F401 - the package must be importable before faking its submodule

    fake = types.ModuleType("sim.launch.synth")
    fake.run_synth = fake_run_synth  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sim.launch.synth", fake)
    mod = load("synth_table")
    central = load("synth_central")
    real_mst = central.central_mst

    def fast_mst(*a, **kw):
        kw["engine_kw"] = {"rows": 40, "steps": 20}
        return real_mst(*a, **kw)

    real_aim = central.central_aim

    def fast_aim(*a, **kw):
        # 4 rounds: the fewest central AIM accepts for the tiny table's 4 attributes
        # (T > 0.9·d); each round adds a model to fit, so fewer rounds, less time
        kw.update(rounds=4, max_iters=20)
        return real_aim(*a, **kw)

    central.central_mst = fast_mst
    central.central_aim = fast_aim
    monkeypatch.setattr(mod, "load_central_module", lambda relation=None: central)
    return mod


def test_quick_json_follows_the_issue_contract(table_mod, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    rc = table_mod.main(["--quick", "--json", str(out), "--out", str(tmp_path / "runs"),
                         "--engine", "neural", "--datasets", "tiny", "--epsilons", "1,10",
                         "--repeats", "2"])
    assert rc == 0
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert set(s) == {"tiny"} and set(s["tiny"]) == {"1", "10"}
    for row in s["tiny"].values():
        assert set(row) == {"fedforge_k1", "fedforge_k10", "central_mst",
                            "tv_ratio_k10_vs_central"}
        for name in ("fedforge_k1", "fedforge_k10", "central_mst"):
            assert {"avg_tv", "bytes_wire", "bytes_naive", "wall_s"} <= set(row[name])
            assert 0.0 <= row[name]["avg_tv"] <= 1.0
        assert row["central_mst"]["bytes_wire"] == 0 and row["central_mst"]["bytes_naive"] == 0
        assert row["fedforge_k10"]["bytes_wire"] == 10_000
        assert row["tv_ratio_k10_vs_central"] == pytest.approx(
            row["fedforge_k10"]["avg_tv"] / row["central_mst"]["avg_tv"])
        each = row["central_mst"]["avg_tv_each"]
        assert len(each) == 2 and row["central_mst"]["avg_tv"] == pytest.approx(np.mean(each))
    # fedforge rows are re-scored from synthetic.csv, not copied from metrics.json
    assert doc["runs"]["tiny/1/fedforge_k10/r1"]["avg_tv"] != 0.1
    assert doc["settings"]["repeats"] == 2
    md = out.with_suffix(".md").read_text()
    assert "central_mst" in md and "0 (central)" in md and "tv_ratio_k10_vs_central" in md


def test_full_mode_adds_independent_and_aim(table_mod, tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    table_mod.main(["--json", str(out), "--out", str(tmp_path / "runs"), "--engine", "neural",
                    "--datasets", "tiny", "--epsilons", "1", "--repeats", "1"])
    doc = json.loads(out.read_text())
    row = doc["summary"]["tiny"]["1"]
    assert row["independent_k10"]["avg_tv"] is not None
    assert row["fedforge_aim_k10"]["bytes_wire"] == 10_000
    assert row["nonprivate_k10"]["avg_tv"] is not None
    if importlib.util.find_spec("mbi") is not None:
        assert doc["status"]["tiny/1/central_aim"] == "ok"
        assert 0.0 <= row["central_aim"]["avg_tv"] <= 1.0
        assert row["central_aim"]["bytes_wire"] == 0
        assert row["tv_ratio_aim_k10_vs_central_aim"] == pytest.approx(
            row["fedforge_aim_k10"]["avg_tv"] / row["central_aim"]["avg_tv"])
    else:
        assert doc["status"]["tiny/1/central_aim"].startswith("failed")
    assert doc["runs"]["tiny/1/independent_k10"]["parties"] == 10


def test_failed_run_is_recorded_and_exit_code_is_one(table_mod, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **kw):
        raise RuntimeError("launcher exploded")

    monkeypatch.setattr(sys.modules["sim.launch.synth"], "run_synth", boom)
    out = tmp_path / "x.json"
    rc = table_mod.main(["--quick", "--json", str(out), "--out", str(tmp_path / "runs"),
                         "--engine", "neural", "--datasets", "tiny", "--epsilons", "1",
                         "--repeats", "1"])
    assert rc == 1
    doc = json.loads(out.read_text())
    assert "launcher exploded" in doc["status"]["tiny/1/fedforge_k10"]
    assert doc["summary"]["tiny"]["1"]["tv_ratio_k10_vs_central"] is None
    assert doc["status"]["tiny/1/central_mst"].startswith("skipped")


def test_mean_row_averages_ml_auc_over_the_repeats_that_have_it(table_mod) -> None:
    rows = [{"avg_tv": 0.1, "ml_auc": 0.8}, {"avg_tv": 0.3, "ml_auc": None},
            {"avg_tv": 0.2, "ml_auc": 0.9}]
    row = table_mod._mean_row(rows)
    assert row["ml_auc"] == pytest.approx(0.85)
    assert row["avg_tv"] == pytest.approx(0.2)
    assert table_mod._mean_row([{"avg_tv": 0.1}])["ml_auc"] is None
