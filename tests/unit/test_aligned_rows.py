"""Training on the rows ``psfl vfl align`` chose: parties.data.select_rows and the config."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from parties.config import VflConfig
from parties.data import InvalidRows, select_rows
from parties.preflight import load_configured_table


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"x": range(10), "y": [0, 1] * 5})


def test_rows_are_selected_in_the_files_order(tmp_path: Path) -> None:
    f = tmp_path / "aligned-active.csv"
    pd.DataFrame({"id": ["c", "a", "b"], "row": [7, 2, 5]}).to_csv(f, index=False)
    out = select_rows(_frame(), f)
    assert out["x"].tolist() == [7, 2, 5] and out.index.tolist() == [0, 1, 2]


@pytest.mark.parametrize(("rows", "match"), [
    ([1, 10], "line 3 names row 10, outside the table's 10 rows"),
    ([-1], "outside"),
    ([3, 3], "twice"),
    ([], "no rows"),
])
def test_bad_rows_are_typed_errors_naming_the_problem(tmp_path: Path, rows: list[int],
                                                      match: str) -> None:
    f = tmp_path / "a.csv"
    pd.DataFrame({"id": [f"i{k}" for k in range(len(rows))], "row": rows}).to_csv(f, index=False)
    with pytest.raises(InvalidRows, match=match):
        select_rows(_frame(), f)


def test_missing_file_or_column(tmp_path: Path) -> None:
    with pytest.raises(InvalidRows, match="no such file"):
        select_rows(_frame(), tmp_path / "nope.csv")
    f = tmp_path / "b.csv"
    f.write_text("id\nx\n")
    with pytest.raises(InvalidRows, match="'row' column"):
        select_rows(_frame(), f)


def test_each_party_loads_its_own_aligned_rows(tmp_path: Path) -> None:
    data = tmp_path / "t.csv"
    _frame().to_csv(data, index=False)
    fa, fp = tmp_path / "aligned-active.csv", tmp_path / "aligned-passive.csv"
    pd.DataFrame({"id": ["a", "b"], "row": [4, 1]}).to_csv(fa, index=False)
    pd.DataFrame({"id": ["a", "b"], "row": [0, 9]}).to_csv(fp, index=False)
    cfg = VflConfig(dataset=str(data), label="y", active_rows_file=str(fa),
                    passive_rows_file=str(fp))
    assert load_configured_table(cfg, "active")[0]["x"].tolist() == [4, 1]
    assert load_configured_table(cfg, "passive")[0]["x"].tolist() == [0, 9]
    assert len(load_configured_table(cfg)[0]) == 10
