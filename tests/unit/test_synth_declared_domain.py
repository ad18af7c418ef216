"""FedForge's declared (public) domain: built from the reviewed schema, never from rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from parties.data import load_table
from pubsub.config import ConfigError
from sim.launch.synth import declared_schema
from synth.config import DataSection, SynthConfig
from synth.domain import OTHER_LEVEL, encode


def _adult() -> tuple[pd.DataFrame, list[str]]:
    frame, _ = load_table("adult")
    cols = [c for c in frame.columns if c != "education"]
    return frame.iloc[:2000].reset_index(drop=True), cols


def test_declared_domain_does_not_depend_on_the_rows() -> None:
    frame, cols = _adult()
    schema = declared_schema(SynthConfig(dataset="adult"), cols)
    assert schema is not None
    # one record replaced by an outlier with a never-declared category
    other = frame.copy()
    other.loc[0, "age"] = 10_000
    other.loc[0, "workclass"] = "Astronaut"
    other.loc[1, "hours-per-week"] = np.nan
    again = declared_schema(SynthConfig(dataset="adult"), cols)
    assert again == schema and again.fingerprint() == schema.fingerprint()
    a, b = encode(frame[cols], schema), encode(other[cols], schema)
    np.testing.assert_array_equal(a[2:], b[2:])  # every other record encodes the same
    wc = schema.column("workclass")
    assert b[0, cols.index("workclass")] == wc.levels.index(OTHER_LEVEL)
    assert b[0, cols.index("age")] == schema.column("age").n_cells - 1  # clipped to the top bin
    assert schema.column("income").levels == ("<=50K", ">50K")  # documented classes only


def test_inferred_or_refused_when_nothing_is_declared() -> None:
    frame, cols = _adult()
    inferred = SynthConfig(dataset="adult", data=DataSection(domain="inferred"))
    assert declared_schema(inferred, cols) is None
    assert declared_schema(SynthConfig(dataset="my.csv"), ["a", "b"]) is None
    with pytest.raises(ConfigError) as ei:
        declared_schema(SynthConfig(dataset="my.csv", data=DataSection(domain="declared")),
                        ["a", "b"])
    assert ei.value.key == "synth.data.schema_file"
    with pytest.raises(ConfigError, match="not declared"):
        declared_schema(SynthConfig(dataset="adult"), [*cols, "zzz"])


def test_a_date_or_hashed_column_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('version = 1\n[columns.a]\nkind = "categorical"\ncategories = ["x"]\n'
                    '[columns.m]\nkind = "hashed"\nbuckets = 8\n')
    cfg = SynthConfig(dataset="my.csv", data=DataSection(domain="declared",
                                                         schema_file=str(path)))
    assert declared_schema(cfg, ["a"]) is not None
    with pytest.raises(ConfigError, match=r"'m' \(hashed\)") as ei:
        declared_schema(cfg, ["a", "m"])
    assert ei.value.key == "synth.data.schema_file"
    # every column it cannot take, in one error: undeclared ones and other kinds
    with pytest.raises(ConfigError) as ei:
        declared_schema(cfg, ["a", "m", "q", "r"])
    assert "['q', 'r']" in str(ei.value) and "'m' (hashed)" in str(ei.value)
    assert "psfl synth schema" in str(ei.value)
