"""bench/cross_org.py's pure helpers: the generated tables, the extreme row's placement,
the reject cases and the acceptance checks (no subprocess, no training)."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from parties.data import train_test_indices

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location("cross_org", REPO / "bench" / "cross_org.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_generated_tables_are_deterministic(bench: Any) -> None:
    a, b = bench.make_regression_table(), bench.make_regression_table()
    assert a.equals(b) and len(a) == bench.REG_ROWS
    assert not a.equals(bench.make_regression_table(seed=1))
    assert bench.make_synth_table().equals(bench.make_synth_table())
    placed_a, info_a = bench.place_extreme(a)
    placed_b, info_b = bench.place_extreme(b)
    assert placed_a.equals(placed_b) and info_a == info_b


def test_the_extreme_row_is_in_every_seeds_test_split_and_200x_the_training_max(
        bench: Any) -> None:
    clean = bench.make_regression_table()
    table, info = bench.place_extreme(clean)
    row, col = info["row"], info["column"]
    for s in bench.SPLIT_SEEDS:
        tr, te = train_test_indices(len(table), test_frac=bench.TEST_FRAC, seed=s)
        assert row in te and row not in tr
        train_max = table[col].to_numpy()[tr].max()
        assert table[col].iloc[row] >= 200 * train_max * (1 - 1e-9)
        assert info["in_test_split"][str(s)]
    # only that one value changed
    diff = (table.astype(str) != clean.astype(str)).to_numpy()
    assert diff.sum() == 1 and diff[row, table.columns.get_loc(col)]


def test_extreme_row_index_is_the_first_common_test_row(bench: Any) -> None:
    n = 500
    tests = [set(train_test_indices(n, test_frac=0.3, seed=s)[1].tolist()) for s in (0, 1, 2)]
    common = sorted(tests[0] & tests[1] & tests[2])
    assert bench.extreme_row_index(n, (0, 1, 2), 0.3) == common[0]


def test_the_declared_schema_covers_the_synth_table(bench: Any) -> None:
    schema = tomllib.loads(bench.SYNTH_SCHEMA)["columns"]
    table = bench.make_synth_table()
    assert set(schema) == set(table.columns)
    for name, col in schema.items():
        if col["kind"] == "numeric":
            assert col["lo"] <= table[name].min() and table[name].max() <= col["hi"]
        else:
            assert set(table[name].unique()) <= set(col["categories"])


def test_each_reject_case_names_what_it_expects(bench: Any, tmp_path: Path) -> None:
    cases = bench.reject_cases(tmp_path)
    assert [c["case"] for c in cases] == ["job_bad_value", "job_missing_join_key",
                                          "job_label_in_passive_file", "bad_value",
                                          "csv_stream", "nan_column", "unknown_column"]
    for c in cases:
        words = c.get("args") or c["cmd"]
        assert c["expect"] and (any(c["expect"].strip("'").split(".")[-1] in a for a in words)
                                or c["case"].startswith("job_"))
    assert '"customer"' in (tmp_path / "job_other_key.toml").read_text()
    import pandas as pd

    assert pd.read_csv(tmp_path / "with_empty.csv")["empty"].isna().all()


def test_acceptance(bench: Any) -> None:
    ok = {"rmse_spread": 1.01, "max_reject_s": 0.4, "rejects_named": 4, "rejects_exit_2": 4,
          "rejects_total": 4, "synth_tv_one_table": 0.13, "synth_tv_diff": 0.002}
    assert all(bench.acceptance(ok).values()) and len(bench.acceptance(ok)) == 3
    assert not bench.acceptance({**ok, "rmse_spread": 1.2})["rmse_spread"]
    assert not bench.acceptance({**ok, "rejects_named": 3})["max_reject_s"]
    assert not bench.acceptance({**ok, "synth_tv_diff": None})["synth_tv_diff"]
    assert bench.acceptance({}) == {}


def test_the_two_host_acceptance(bench: Any) -> None:
    ok = {"two_hosts_netns": True, "auc_two_hosts": 0.84, "auc_merged": 0.845,
          "auc_dp_two_hosts": 0.64, "auc_active_only": 0.63, "dp_columns_dropped": []}
    assert all(bench.acceptance(ok).values()) and len(bench.acceptance(ok)) == 4
    assert not bench.acceptance({**ok, "auc_merged": 0.86})["auc_two_hosts"]
    assert not bench.acceptance({**ok, "auc_dp_two_hosts": 0.63})["auc_dp_two_hosts"]
    assert not bench.acceptance({**ok, "dp_columns_dropped": ["x"]})["dp_columns_dropped"]
    assert np.isfinite(bench.EXTREME_FACTOR)