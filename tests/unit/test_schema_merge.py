"""Merging several holders' public schemas of one table (pure)."""

from __future__ import annotations

import pytest

from parties.data.schema import (CategoricalColumn, DateColumn, HashedColumn, NumericColumn,
                                 PublicSchema, loads_schema, dump_schema)
from parties.data.schema_merge import SchemaMergeError, merge_schemas


def _a() -> PublicSchema:
    return PublicSchema(columns=(
        NumericColumn(name="age", lo=18, hi=80, fill=40),
        CategoricalColumn(name="job", categories=("admin", "nurse")),
        DateColumn(name="opened", parts=("year", "month"), year_lo=2010, year_hi=2020,
                   fill="2015-01-01"),
        HashedColumn(name="merchant", buckets=64)))


def _b() -> PublicSchema:
    return PublicSchema(columns=(
        NumericColumn(name="age", lo=16, hi=70, fill=35, missing_indicator=True),
        CategoricalColumn(name="job", categories=("nurse", "pilot")),
        DateColumn(name="opened", parts=("year", "dayofweek"), year_lo=2005, year_hi=2018,
                   fill="2012-01-01"),
        HashedColumn(name="merchant", buckets=256),
        CategoricalColumn(name="y", categories=("no", "yes"))))


def test_the_merge_takes_each_columns_widest_declaration() -> None:
    merged, notes = merge_schemas([("a.toml", _a()), ("b.toml", _b())])
    age = merged.column("age")
    assert (age.lo, age.hi, age.fill, age.missing_indicator) == (16, 80, 40, True)
    assert merged.column("job").categories == ("admin", "nurse", "pilot")
    opened = merged.column("opened")
    assert opened.parts == ("year", "month", "dayofweek")
    assert (opened.year_lo, opened.year_hi, opened.fill) == (2005, 2020, "2015-01-01")
    assert merged.column("merchant").buckets == 256
    assert merged.names == ("age", "job", "opened", "merchant", "y")
    assert "not declared by a.toml" in notes["y"] and "union" in notes["job"]
    # a merge of equal schemas changes nothing and notes nothing
    same, none = merge_schemas([("a", _a()), ("a2", _a())])
    assert same.columns == _a().columns and none == {}
    # the merged file reads back to the same schema
    assert loads_schema(dump_schema(merged, notes=notes)).columns == merged.columns


def test_a_column_declared_two_ways_is_refused_naming_it() -> None:
    other = PublicSchema(columns=(CategoricalColumn(name="age", categories=("young",)),))
    with pytest.raises(SchemaMergeError) as ei:
        merge_schemas([("a.toml", _a()), ("c.toml", other)])
    assert ei.value.column == "age" and "a.toml: numeric" in str(ei.value)
    fmt = PublicSchema(columns=(DateColumn(name="opened", parts=("month",), fill="01/01/2015",
                                           format="%d/%m/%Y"),))
    with pytest.raises(SchemaMergeError, match="date formats"):
        merge_schemas([("a.toml", _a()), ("d.toml", fmt)])
