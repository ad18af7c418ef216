"""Public feature schemas (parties/data/schema.py): nothing is fitted on rows, so one record never
changes another record's encoding, nor the encoded width."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from parties.config import DataSection, DpSection, VflConfig, load_vfl_config
from parties.data import DataError, default_split, load_table, train_test_indices
from parties.data.preflight import dp_schema, encode_features, preflight
from parties.data.schema import (
    OTHER,
    CategoricalColumn,
    NumericColumn,
    PublicSchema,
    SchemaEncoder,
    SchemaError,
    bundled_schema,
    draft_schema,
    dump_schema,
    load_schema,
    loads_schema,
    save_schema,
    synthetic_schema,
)
from pubsub.config import ConfigError

REPO = Path(__file__).resolve().parents[2]

SCHEMA = PublicSchema(columns=(
    NumericColumn(name="amount", lo=0.0, hi=100.0, fill=10.0, missing_indicator=True),
    NumericColumn(name="wait s", lo=-1.0, hi=1000.0, fill=-1.0, log=True),
    CategoricalColumn(name="colour", categories=("red", "green", "blue")),
    CategoricalColumn(name="n", categories=("1", "2", "True")),
), dataset="toy", description='a "toy" schema')


def _frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "amount": rng.uniform(0, 100, n),
        "wait s": rng.integers(-1, 900, n).astype(float),
        "colour": rng.choice(["red", "green", "blue"], n),
        "n": rng.choice([1, 2], n),
        "unused": rng.normal(size=n),
    })


def test_round_trip_through_toml(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    save_schema(SCHEMA, f, header="provenance\nline two")
    text = f.read_text()
    assert text.startswith("# provenance\n# line two\n")
    assert load_schema(f) == SCHEMA
    assert loads_schema(dump_schema(SCHEMA)) == SCHEMA


@pytest.mark.parametrize(("text", "key"), [
    ("version = 1\nbogus = 2\n[columns.a]\nkind='numeric'\nlo=0\nhi=1\nfill=0\n", "bogus"),
    ("version = 1\n[columns.a]\nkind='numeric'\nlo=0\nhi=1\nfill=0\nscale=2\n",
     "columns.a.scale"),
    ("version = 1\n[columns.a]\nkind='categorical'\ncategories=['x']\nlo=0\n", "columns.a.lo"),
    ("version = 1\n[columns.a]\nkind='numeric'\nlo=0\nhi=1\n", "columns.a.fill"),
    ("version = 1\n[columns.a]\nkind='numeric'\nlo=1\nhi=1\nfill=1\n", "columns.a"),
    ("version = 1\n[columns.a]\nkind='numeric'\nlo=0\nhi=1\nfill=2\n", "columns.a.fill"),
    ("version = 1\n[columns.a]\nkind='numeric'\nlo=0\nhi=inf\nfill=0\n", "columns.a.hi"),
    ("version = 1\n[columns.a]\nkind='text'\n", "columns.a.kind"),
    ("version = 1\n[columns.a]\nkind='categorical'\ncategories=['x','x']\n",
     "columns.a.categories"),
    ("version = 1\n[columns.a]\nkind='categorical'\ncategories=['__other__']\n",
     "columns.a.categories"),
    ("version = 2\n[columns.a]\nkind='categorical'\ncategories=['x']\n", "version"),
    ("version = 1\n", "columns"),
])
def test_invalid_files_are_rejected_naming_key_and_file(tmp_path: Path, text: str,
                                                        key: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(SchemaError) as ei:
        load_schema(f)
    assert ei.value.key == key
    assert ei.value.path == str(f)
    assert repr(key) in str(ei.value) and str(f) in str(ei.value)
    assert isinstance(ei.value, DataError)  # exit 2 where the CLI maps errors


def test_missing_file_is_a_schema_error(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="cannot read"):
        load_schema(tmp_path / "nope.toml")


def test_transform_clips_fills_and_encodes() -> None:
    frame = pd.DataFrame({
        "amount": [50.0, -5.0, 500.0, np.nan, np.inf, -np.inf],
        "wait s": [-1.0, 0.0, 1000.0, 1e9, np.nan, 3.0],
        "colour": ["red", "blue", "purple", None, "green", np.nan],
        "n": [1, 2, 3, 2, 1, 1],
    })
    x = SchemaEncoder(SCHEMA).transform(frame)
    assert x.dtype == np.float32 and x.flags.c_contiguous
    assert x.shape == (6, SCHEMA.width) == (6, 2 + 1 + 4 + 4)
    assert np.isfinite(x).all() and np.abs(x).max() <= 1.0
    fill = 2 * 10 / 100 - 1
    np.testing.assert_allclose(x[:, 0], [0.0, -1.0, 1.0, fill, fill, fill], atol=1e-7)
    np.testing.assert_array_equal(x[:, 1], [0, 0, 0, 1, 1, 1])  # missing indicator
    lo, hi = -math.log1p(1), math.log1p(1000)
    enc = lambda v: 2 * (v - lo) / (hi - lo) - 1  # noqa: E731
    np.testing.assert_allclose(x[:, 2], [-1, enc(0.0), 1, 1, -1, enc(math.log1p(3))],
                               atol=1e-6)
    colour = x[:, 3:7]
    np.testing.assert_array_equal(colour.argmax(1), [0, 2, 3, 3, 1, 3])
    np.testing.assert_array_equal(colour.sum(1), 1)
    np.testing.assert_array_equal(x[:, 7:11].argmax(1), [0, 1, 3, 1, 0, 0])
    assert SchemaEncoder(SCHEMA).feature_names == (
        "amount", "amount__missing", "wait s", "colour=red", "colour=green", "colour=blue",
        f"colour={OTHER}", "n=1", "n=2", "n=True", f"n={OTHER}")


def test_one_record_changes_no_other_encoding_nor_the_width() -> None:
    """The audit's property: an outlier, a never-declared category or a NaN in one record
    leaves every other record's encoding byte-identical and the width unchanged."""
    base = _frame(500)
    enc = SchemaEncoder(SCHEMA)
    x0 = enc.transform(base)
    for amount, wait, colour in ((1e12, 1e12, "unique-category"), (np.nan, -np.inf, None),
                                 (-1e300, np.nan, "x" * 100)):
        other = base.copy()
        other.loc[7, ["amount", "wait s", "colour"]] = [amount, wait, colour]
        x1 = enc.transform(other)
        assert x1.shape == x0.shape
        keep = np.arange(len(base)) != 7
        assert x1[keep].tobytes() == x0[keep].tobytes()
        assert np.isfinite(x1[7]).all()
    # removing the record, or encoding rows one at a time, gives the same bytes
    assert enc.transform(base.drop(index=7)).tobytes() == x0[np.arange(500) != 7].tobytes()
    assert enc.transform(base.iloc[[3]]).tobytes() == x0[3:4].tobytes()
    # the width never depends on the data
    assert enc.transform(base.iloc[:0]).shape == (0, SCHEMA.width)


def test_frame_must_have_the_schema_columns() -> None:
    with pytest.raises(SchemaError) as ei:
        SchemaEncoder(SCHEMA).transform(_frame().drop(columns=["colour"]))
    assert ei.value.key == "colour"


def test_select_orders_and_refuses_undeclared() -> None:
    sub = SCHEMA.select(["colour", "amount"])
    assert sub.names == ("colour", "amount")
    with pytest.raises(SchemaError, match="not declared") as ei:
        SCHEMA.select(["amount", "zzz"])
    assert ei.value.key == "zzz"


def test_draft_reads_the_data_and_round_trips() -> None:
    frame = _frame(300)
    frame.loc[0, "amount"] = np.nan
    frame.loc[1, "colour"] = "rare"
    s = draft_schema(frame, ["amount", "wait s", "colour", "n"], min_count=5)
    assert loads_schema(dump_schema(s)) == s
    amount = s.column("amount")
    assert isinstance(amount, NumericColumn) and amount.missing_indicator
    assert amount.lo <= frame["amount"].min() and amount.hi >= frame["amount"].max()
    colour = s.column("colour")
    assert isinstance(colour, CategoricalColumn) and "rare" not in colour.categories
    assert set(colour.categories) == {"red", "green", "blue"}
    # a whole-number column with few distinct values drafts as codes (categories)
    assert s.column("n") == CategoricalColumn(name="n", categories=("1", "2"))
    x = SchemaEncoder(s).transform(frame)
    assert np.isfinite(x).all()


@pytest.mark.parametrize("name", ["bank", "adult", "california"])
def test_bundled_schemas_cover_the_default_splits(name: str) -> None:
    schema = bundled_schema(name)
    assert schema is not None and schema.dataset == name
    frame, label = load_table(name)
    active, passive = default_split(list(frame.columns), label)
    for cols in (active, passive):
        x = SchemaEncoder(schema.select(cols)).transform(frame)
        assert x.shape == (len(frame), schema.select(cols).width)
        assert np.isfinite(x).all() and np.abs(x).max() <= 1.0
    # every value of the bundled tables lies inside the declared bounds, and every text
    # value is a declared category (UCI's "?" is loaded as missing: the other slot)
    for col in schema.columns:
        s = frame[col.name]
        if isinstance(col, NumericColumn):
            assert col.lo <= s.min() and s.max() <= col.hi, col.name
        else:
            assert set(s.dropna().astype(str)) <= set(col.categories), col.name


def test_bundled_schema_files_are_package_data() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert "datasets/*.schema.toml" in text
    assert bundled_schema("no-such-dataset") is None
    assert bundled_schema("../etc") is None


def test_synthetic_schema_from_the_generator() -> None:
    s = synthetic_schema(["x000", "x001"])
    assert s.width == 2
    x = SchemaEncoder(s).transform(pd.DataFrame({"x000": [0.0, 100.0], "x001": [-8.0, 4.0]}))
    np.testing.assert_allclose(x, [[0, -1], [1, 0.5]])


# --------------------------------------------------------------------------- config


def _csv(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    n = 200
    f = tmp_path / "t.csv"
    pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n),
                  "c": rng.choice(["u", "v"], n), "d": rng.normal(size=n),
                  "y": rng.integers(0, 2, n)}).to_csv(f, index=False)
    return f


def test_dp_on_user_file_without_schema_refuses(tmp_path: Path) -> None:
    cfg = VflConfig(dataset=str(_csv(tmp_path)), label="y", dp=DpSection(mu=1.0))
    with pytest.raises(ConfigError) as ei:
        preflight(cfg)
    assert ei.value.key == "vfl.dp.schema"
    # DP off: unchanged, no schema needed
    preflight(VflConfig(dataset=str(_csv(tmp_path)), label="y"))


def test_dp_on_user_file_with_schema(tmp_path: Path) -> None:
    data = _csv(tmp_path)
    sch = tmp_path / "s.toml"
    save_schema(PublicSchema(columns=(
        CategoricalColumn(name="c", categories=("u", "v")),
        NumericColumn(name="d", lo=-5, hi=5, fill=0),
    )), sch)
    cfg = load_vfl_config(None, [f"dataset={data}", "label=y", "dp.mu=1", f"dp.schema={sch}"])
    preflight(cfg)
    frame = pd.read_csv(data)
    tr, te = train_test_indices(len(frame), seed=0)
    feats = encode_features(cfg, "passive", frame, ("c", "d"), tr, te)
    assert feats.feature_names == ("c=u", "c=v", f"c={OTHER}", "d")
    # the active party keeps its fitted encoders; so does the passive one with DP off
    fitted = encode_features(cfg, "active", frame, ("a", "b"), tr, te)
    assert fitted.feature_names == ("a", "b")
    off = VflConfig(dataset=str(data), label="y")
    assert encode_features(off, "passive", frame, ("c", "d"), tr, te).feature_names == (
        "c=u", "c=v", "d")
    # a schema that does not declare a passive column is refused
    bad = load_vfl_config(None, [f"dataset={data}", "label=y", "dp.mu=1", f"dp.schema={sch}",
                                 'data.active_columns=["a","c"]', 'data.passive_columns=["b","d"]'])
    with pytest.raises(SchemaError) as ei:
        preflight(bad)
    assert ei.value.key == "b"


def test_dp_schema_defaults_to_the_bundled_one() -> None:
    cfg = VflConfig(dataset="bank", dp=DpSection(mu=1.0))
    s = dp_schema(cfg, ("contact", "day"))
    assert s.names == ("contact", "day")
    small = VflConfig(dataset="synthetic",
                      data=DataSection(synthetic_features=4, synthetic_informative=2),
                      dp=DpSection(mu=1.0))
    syn = dp_schema(small, ("x002", "x003"))
    assert syn.names == ("x002", "x003")
    preflight(small)


def test_passive_encoding_under_dp_is_row_local_on_bank() -> None:
    """End to end through the party's encoder: an outlier in one training record leaves
    every other encoded row (train and held-out) byte-identical and the width fixed."""
    cfg = VflConfig(dataset="bank", dp=DpSection(mu=1.0))
    frame, label = load_table("bank")
    _, passive = default_split(list(frame.columns), label)
    tr, te = train_test_indices(len(frame), seed=0)
    a = encode_features(cfg, "passive", frame, passive, tr, te)
    other = frame.copy()
    r = int(tr[5])
    other.loc[r, ["duration", "month"]] = [10**9, "smarch"]
    b = encode_features(cfg, "passive", other, passive, tr, te)
    assert a.x_train.shape == b.x_train.shape and a.feature_names == b.feature_names
    keep = np.arange(len(tr)) != 5
    assert a.x_train[keep].tobytes() == b.x_train[keep].tobytes()
    assert a.x_test.tobytes() == b.x_test.tobytes()
    # with DP off the fitted scaler moves every row: the path this closes
    off = VflConfig(dataset="bank")
    fa = encode_features(off, "passive", frame, passive, tr, te)
    fb = encode_features(off, "passive", other, passive, tr, te)
    assert fa.x_test.tobytes() != fb.x_test.tobytes()
    assert fa.x_train.shape[1] != fb.x_train.shape[1]  # the unique month adds a column


def test_cli_refuses_dp_without_schema_exit_2(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # sim.cli.main in this process: the message and exit code are the point (the
    # python -m sim.cli wiring has its subprocess tests in tests/integration/test_vfl.py)
    from sim.cli import main

    data = _csv(tmp_path)
    code = main(["vfl", "run", "--dataset", str(data), "--set", "label=y", "--set", "dp.mu=1",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "vfl.dp.schema" in err


def test_cli_drafts_a_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    out = tmp_path / "draft.toml"
    code = main(["vfl", "schema", "--dataset", str(_csv(tmp_path)), "--set", "label=y",
                 "--role", "passive", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "NOT PRIVATE" in err and "REVIEW" in err
    assert out.read_text().startswith("# DRAFT SCHEMA")
    assert load_schema(out).names == ("c", "d")
    code = main(["vfl", "schema", "--dataset", "bank", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--force" in err
