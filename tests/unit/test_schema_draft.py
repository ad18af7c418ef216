"""Drafting a public DP schema from a party's own file (no label) and the encodings it
uses for what real tables hold: dates as parts, many-level values hashed, numeric codes as
categories, declared fills; the ID column (the join key) left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from parties.data.schema import (
    HASH_MISSING,
    CategoricalColumn,
    DateColumn,
    HashedColumn,
    NumericColumn,
    PublicSchema,
    SchemaEncoder,
    SchemaError,
    draft_party_schema,
    dump_schema,
    load_schema,
    loads_schema,
)

CHANNELS = ["Card-Present", "e-commerce", "ATM / cash"]


def _partner(n: int = 600, seed: int = 0) -> pd.DataFrame:
    """A passive party's own file: a customer_id join key, no label."""
    rng = np.random.default_rng(seed)
    when = pd.Timestamp("2019-01-01") + pd.to_timedelta(rng.integers(0, 1560, n), unit="D")
    f = pd.DataFrame({
        "customer_id": [f"C{i:07d}" for i in rng.permutation(n)],
        "signup": when.strftime("%Y-%m-%d"),
        "merchant_id": [f"M{k:05d}" for k in rng.integers(0, 300, n)],
        "segment": rng.choice([11, 12, 20, 31, 45], n).astype(float),
        "spend": rng.lognormal(3, 1, n),
        "channel": rng.choice(CHANNELS, n),
    })
    for c in ("signup", "merchant_id", "segment", "spend", "channel"):
        f.loc[rng.random(n) < 0.05, c] = np.nan
    return f


def test_draft_from_a_passive_file_without_a_label() -> None:
    f = _partner()
    d = draft_party_schema(f, min_count=5)
    assert set(d.left_out) == {"customer_id"} and "ID-like" in d.left_out["customer_id"]
    assert d.schema.names == ("signup", "merchant_id", "segment", "spend", "channel")
    date = d.schema.column("signup")
    assert isinstance(date, DateColumn)
    assert date.parts == ("year", "month", "day", "dayofweek")
    assert (date.year_lo, date.year_hi, date.format) == (2019, 2023, "ISO8601")
    assert date.missing_indicator  # 5 % missing
    merchant = d.schema.column("merchant_id")
    assert isinstance(merchant, HashedColumn) and merchant.buckets == 256
    # a 5-value numeric code: categories, their text as in the data ("11", not "11.0")
    assert d.schema.column("segment") == CategoricalColumn(
        name="segment", categories=("11", "12", "20", "31", "45"))
    spend = d.schema.column("spend")
    assert isinstance(spend, NumericColumn) and spend.missing_indicator
    channel = d.schema.column("channel")
    assert isinstance(channel, CategoricalColumn) and sorted(channel.categories) == sorted(CHANNELS)
    assert set(d.notes) == set(d.schema.names)
    text = dump_schema(d.schema, notes=d.notes)
    assert text.count("# REVIEW: ") == 5 and "customer_id" not in text
    assert loads_schema(text) == d.schema  # the review comments do not change the schema
    x = SchemaEncoder(d.schema).transform(f)
    assert x.shape == (len(f), d.schema.width) and np.isfinite(x).all()
    assert x.min() >= -1.0 and x.max() <= 1.0
    names = d.schema.feature_names
    assert names[:5] == ("signup.year", "signup.month", "signup.day", "signup.dayofweek",
                         "signup__missing")
    # a missing date becomes the declared fill's parts, flagged
    miss = f["signup"].isna().to_numpy()
    fill = SchemaEncoder(PublicSchema(columns=(date,))).transform(
        pd.DataFrame({"signup": [date.fill]}))
    assert (x[miss, :4] == fill[0, :4]).all() and (x[miss, 4] == 1).all()
    assert (x[~miss, 4] == 0).all()
    # each row one bucket of the hashed column
    j = names.index("merchant_id#0")
    assert (x[:, j:j + 256].sum(axis=1) == 1).all()


def test_date_and_hashed_encoding_is_row_local_and_bounded_by_the_schema() -> None:
    s = PublicSchema(columns=(
        DateColumn(name="t", parts=("year", "month", "dayofweek", "hour"), year_lo=2000,
                   year_hi=2030, fill="2015-06-15 12:00"),
        HashedColumn(name="m", buckets=8),
    ))
    f = pd.DataFrame({"t": ["2020-01-06 00:00", "1990-12-31 23:00", None, "garbage"],
                      "m": ["a", "b", None, "a"]})
    x = SchemaEncoder(s).transform(f)
    assert x.shape == (4, 4 + 8)
    assert x[0, :4].tolist() == pytest.approx([2 * 20 / 30 - 1, -1.0, -1.0, -1.0])
    assert x[1, 0] == -1.0 and x[1, 1] == 1.0  # 1990 clipped to the declared year_lo
    assert (x[2, :4] == x[3, :4]).all()  # missing and unparseable: the fill
    assert (x[0, 4:] == x[3, 4:]).all() and x[:, 4:].sum() == 4
    # another row changes no row's encoding (no format inferred from the rows)
    g = f.copy()
    g.loc[1, ["t", "m"]] = ["31/12/1999", "zzz"]
    y = SchemaEncoder(s).transform(g)
    keep = [0, 2, 3]
    assert x[keep].tobytes() == y[keep].tobytes()
    assert HASH_MISSING == "__missing__"


def test_a_text_date_in_day_month_year_order_and_a_datetime_with_hours() -> None:
    rng = np.random.default_rng(1)
    n = 200
    when = pd.Timestamp("2021-03-01") + pd.to_timedelta(rng.integers(0, 10**6, n), unit="min")
    f = pd.DataFrame({"d": when.strftime("%d/%m/%Y"), "ts": when})
    d = draft_party_schema(f)
    dmy = d.schema.column("d")
    assert isinstance(dmy, DateColumn) and dmy.format == "%d/%m/%Y"
    ts = d.schema.column("ts")
    assert isinstance(ts, DateColumn) and "hour" in ts.parts and not ts.missing_indicator
    assert loads_schema(dump_schema(d.schema, notes=d.notes)) == d.schema


@pytest.mark.parametrize(("table", "key"), [
    ('kind = "date"\nparts = ["year", "week"]\nyear_lo = 2000\nyear_hi = 2030\n'
     'fill = "2010-01-01"', "columns.t.parts"),
    ('kind = "date"\nparts = ["year"]\nfill = "2010-01-01"', "columns.t.year_lo"),
    ('kind = "date"\nparts = ["month"]\nfill = "not a date"', "columns.t.fill"),
    ('kind = "date"\nparts = ["year"]\nyear_lo = 2000\nyear_hi = 2005\nfill = "2010-01-01"',
     "columns.t.fill"),
    ('kind = "hashed"\nbuckets = 1', "columns.t.buckets"),
    ('kind = "hashed"\nbuckets = 8\ncategories = ["a"]', "columns.t.categories"),
])
def test_invalid_date_and_hashed_columns_are_refused(table: str, key: str) -> None:
    with pytest.raises(SchemaError) as ei:
        loads_schema(f"version = 1\n[columns.t]\n{table}\n", path="s.toml")
    assert ei.value.key == key and ei.value.path == "s.toml"


def test_id_columns_refuse_and_keep() -> None:
    f = _partner(200)
    with pytest.raises(SchemaError) as ei:
        draft_party_schema(f, id_columns="refuse")
    assert ei.value.key == "customer_id"
    kept = draft_party_schema(f, id_columns="keep")
    assert isinstance(kept.schema.column("customer_id"), HashedColumn) and not kept.left_out


def test_cli_drafts_from_the_passive_partys_own_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli import main

    data = tmp_path / "partner.csv"
    _partner(300).to_csv(data, index=False)
    out = tmp_path / "partner.schema.toml"
    code = main(["vfl", "schema", "--dataset", str(data), "--role", "passive", "--out",
                 str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "left out 'customer_id'" in err
    s = load_schema(out)
    assert s.names == ("signup", "merchant_id", "segment", "spend", "channel")
    assert "# REVIEW: " in out.read_text()


def test_a_dp_run_accepts_the_drafted_schema(tmp_path: Path) -> None:
    """Both parties in this process, DP on, the passive party's columns encoded from the
    schema drafted on its own file (a date, a hashed id, a code, NaN)."""
    from parties.config import load_vfl_config
    from parties.data.schema import save_schema
    from sim.launch.local import run_vfl_in_process

    rng = np.random.default_rng(0)
    f = _partner(400)
    f["a1"] = rng.normal(size=len(f))
    f["y"] = (f["a1"] + (f["segment"] > 20) + rng.normal(size=len(f)) > 0.5).astype(int)
    f.to_csv(tmp_path / "all.csv", index=False)
    d = draft_party_schema(f[list(_partner(1).columns)], min_count=5)
    save_schema(d.schema, tmp_path / "s.toml", notes=d.notes)
    passive = ",".join(d.schema.names)
    cfg = load_vfl_config(None, [
        f"dataset={tmp_path / 'all.csv'}", "label=y", "dp.mu=4", f"dp.schema={tmp_path / 's.toml'}",
        "data.active_columns=a1", f"data.passive_columns={passive}", "epochs=1",
        "active_only_baseline=off"])
    m = run_vfl_in_process(cfg, tmp_path / "run").metrics
    p = m["parties"]["passive"]
    assert p["feature_encoding"] == "public_schema" and p["n_features"] == d.schema.width
    assert m["dp"]["enabled"] is True and 0 <= m["test_auc"] <= 1
    saved = load_schema(tmp_path / "run" / "model" / "passive" / "schema.toml")
    assert saved == d.schema
