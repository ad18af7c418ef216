"""Training on the rows ``psfl vfl align`` chose: parties.data.select_rows and the config."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from parties.config import DataSection, VflConfig
from parties.data import InvalidRows, select_rows
from parties.data.preflight import load_configured_table


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
    cfg = VflConfig(dataset=str(data), label="y",
                    data=DataSection(active_rows_file=str(fa), passive_rows_file=str(fp)))
    assert load_configured_table(cfg, "active")[0]["x"].tolist() == [4, 1]
    assert load_configured_table(cfg, "passive")[0]["x"].tolist() == [0, 9]
    assert len(load_configured_table(cfg)[0]) == 10


def test_the_aligned_ids_digest_tells_order_and_content_apart(tmp_path: Path) -> None:
    from parties.data import aligned_ids_digest

    def write(name: str, ids: list[str], rows: list[int]) -> Path:
        f = tmp_path / name
        pd.DataFrame({"id": ids, "row": rows}).to_csv(f, index=False)
        return f

    a = write("a.csv", ["007", "x", "y"], [5, 1, 2])
    same_ids_other_rows = write("b.csv", ["007", "x", "y"], [0, 9, 3])
    other_order = write("c.csv", ["x", "007", "y"], [1, 5, 2])
    other_ids = write("d.csv", ["7", "x", "y"], [5, 1, 2])
    d = aligned_ids_digest(a)
    assert d == aligned_ids_digest(same_ids_other_rows)  # rows are each party's own
    assert d != aligned_ids_digest(other_order) and d != aligned_ids_digest(other_ids)
    import hashlib
    assert d not in {hashlib.sha256(i.encode()).hexdigest()[:16] for i in ("007", "x", "y")}
    cfg = VflConfig(dataset="bank", data=DataSection(active_rows_file=str(a)))
    assert cfg.shared_settings(3, d)["digest"] != cfg.shared_settings(3)["digest"]


def test_one_rows_file_without_the_other_is_refused_before_launch(tmp_path: Path) -> None:
    from parties.data import DataError
    from parties.data.preflight import preflight

    f = tmp_path / "a.csv"
    pd.DataFrame({"id": ["a"], "row": [0]}).to_csv(f, index=False)
    with pytest.raises(DataError, match="set both vfl.data.active_rows_file and vfl.data.passive_rows_file"):
        preflight(VflConfig(dataset="bank", data=DataSection(active_rows_file=str(f))))


def test_several_passive_parties_each_load_their_own_rows_file(tmp_path: Path) -> None:
    from parties.data.party import load_party_data

    data = tmp_path / "t.csv"
    pd.DataFrame({"x": range(40), "z": range(40), "w": range(40),
                  "y": [0, 1] * 20}).to_csv(data, index=False)
    files = []
    for name, rows in (("active", range(0, 20)), ("passive", range(20, 40)),
                       ("passive2", range(39, 19, -1))):
        f = tmp_path / f"aligned-{name}.csv"
        pd.DataFrame({"id": [f"i{k:02d}" for k in range(20)], "row": list(rows)}).to_csv(
            f, index=False)
        files.append(str(f))
    cfg = VflConfig(dataset=str(data), label="y", passive_parties=2,
                    data=DataSection(active_rows_file=files[0], passive_party_rows_files=tuple(files[1:])))
    assert cfg.rows_files == dict(zip(("active", "passive", "passive2"), files, strict=True))
    assert load_configured_table(cfg, "passive2")[0]["x"].tolist() == list(range(39, 19, -1))
    assert load_configured_table(cfg, "passive")[0]["x"].tolist() == list(range(20, 40))
    assert load_party_data(cfg, "passive2").n_rows == 20
    with pytest.raises(ValueError, match="'passive3' is not in this run"):
        cfg.rows_file("passive3")


def test_rows_files_for_several_passive_parties_are_checked(tmp_path: Path) -> None:
    from parties.data import DataError
    from parties.data.preflight import preflight
    from pubsub.config import ConfigError

    with pytest.raises(ConfigError, match="vfl.data.passive_rows_file.*passive_party_rows_files"):
        VflConfig(passive_parties=2, data=DataSection(passive_rows_file="p.csv"))
    with pytest.raises(ConfigError, match="one rows file per passive party \\(3\\)"):
        VflConfig(passive_parties=3, data=DataSection(passive_party_rows_files=("a", "b")))
    with pytest.raises(ConfigError, match="for several passive parties"):
        VflConfig(data=DataSection(passive_party_rows_files=("a",)))
    f = tmp_path / "a.csv"
    pd.DataFrame({"id": ["a"], "row": [0]}).to_csv(f, index=False)
    with pytest.raises(DataError, match="vfl.data.passive_party_rows_files"):
        preflight(VflConfig(dataset="bank", passive_parties=2,
                            data=DataSection(active_rows_file=str(f))))
