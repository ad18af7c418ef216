"""Public feature schemas: encode a party's columns from declared metadata, never from rows.

With DP on, the passive party's published embeddings are a function of each record's
encoded features. Encoders *fitted* on the training rows (a median, a mean and standard
deviation, the set of categories seen) make every encoded row depend on every other
record too, which the privacy accounting does not cover: one outlier shifts the scaler
and so every other record's embedding; one record with a unique category value adds a
one-hot column and so changes the input width. A :class:`PublicSchema` removes that
path: each column's encoding is fixed by public metadata that the data owner writes or
reviews, so :class:`SchemaEncoder` maps each row through a function of that row and the
schema alone (no statistics of the rows at all), and the encoded width is a function of
the schema alone.

Encoding of one column
----------------------
``numeric`` (declared ``lo < hi``, ``fill`` in ``[lo, hi]``, optional ``log``, optional
``missing_indicator``):

1. a value that is missing, NaN, ±Inf or not a number becomes ``fill`` (so a non-finite
   input is never published as NaN);
2. the value is clipped into ``[lo, hi]``;
3. with ``log = true`` it becomes ``sign(v)·log1p(|v|)`` (and so do ``lo`` and ``hi``),
   for long-tailed columns (amounts, durations, counts);
4. it is mapped linearly onto ``[-1, 1]``: ``2·(v − lo') / (hi' − lo') − 1``.

The output is bounded (every encoded value lies in ``[-1, 1]``), which suits clipping
in DP-SGD. With ``missing_indicator = true`` a second feature ``"<col>__missing"`` is 1.0
where step 1 applied, else 0.0.

``categorical`` (declared ``categories``, a non-empty list of distinct strings): one-hot
in the declared order, feature names ``"<col>=<category>"``, plus one final slot
``"<col>=__other__"`` for a missing value or any value not declared. A value matches a
category by its text (``str(value)``; a float that is a whole number also matches its
integer text, ``2.0`` matches ``"2"``; booleans match ``"True"``/``"False"``).

``date`` (declared ``parts``, ``year_lo < year_hi`` when ``year`` is a part, ``fill`` a
date, optional ``format``, optional ``missing_indicator``): each value is parsed ON ITS OWN
with the declared ``format`` (``"ISO8601"``, the default, or a ``strftime`` format such as
``"%d/%m/%Y"``; never a format inferred from the rows; a time zone is converted to UTC); a
missing or unparseable value becomes ``fill``. Each part (``year``, ``month``, ``day``,
``dayofweek`` with 0 = Monday, ``hour``, ``minute``, ``second``) is clipped into its range
(``[year_lo, year_hi]``; the others' fixed calendar ranges: 1..12, 1..31, 0..6, 0..23,
0..59, 0..59) and mapped linearly onto ``[-1, 1]``; feature names ``"<col>.<part>"``, plus
``"<col>__missing"`` with ``missing_indicator = true``. A 1,560-value date column is four
bounded numbers, not a 1,560-level category.

``hashed`` (declared ``buckets``, 2 … 4096): a many-level column (a merchant ID) whose
values are not listed: each value's text (as for categories; a missing value is hashed as
``"__missing__"``) is hashed with pandas' SipHash with its fixed key (the same bucket in
every process) into one of ``buckets`` slots, one-hot; feature names ``"<col>#<i>"``. The
schema discloses the bucket count only, no value.

Width: ``sum(1 + missing_indicator)`` over numeric columns plus
``sum(len(categories) + 1)`` over categorical ones, ``len(parts) + missing_indicator`` over
date ones and ``buckets`` over hashed ones, in the schema's column order.

File format (TOML)
------------------
::

    # comments: how each range and category list was derived (provenance)
    version = 1                       # required, must be 1
    dataset = "bank"                  # optional, informational
    description = "..."               # optional, informational

    [columns.duration]                # one table per column, in encoding order
    kind = "numeric"
    lo = 0                            # declared public bounds (numbers, lo < hi)
    hi = 5000
    fill = 0                          # missing/NaN/±Inf/non-numeric -> fill, lo <= fill <= hi
    log = true                        # optional (default false)
    missing_indicator = false         # optional (default false)

    [columns."month"]
    kind = "categorical"
    categories = ["jan", "feb", ...]  # declared order; "__other__" slot is implicit

    [columns.signup_date]
    kind = "date"
    parts = ["year", "month", "day", "dayofweek"]
    year_lo = 2015                    # declared year range (when "year" is a part)
    year_hi = 2030
    fill = "2021-01-01"               # a date in `format`, year in range
    format = "ISO8601"                # optional (default ISO8601), or e.g. "%d/%m/%Y"
    missing_indicator = true          # optional (default false)

    [columns.merchant_id]
    kind = "hashed"
    buckets = 256

Any other key (top level or in a column table) is rejected with :class:`SchemaError`
naming the key and the file; so are wrong types, a missing ``version``/``kind``/``lo``/...
and inconsistent values (``lo >= hi``, ``fill`` outside the range, duplicate categories).
:func:`dump_schema` writes this format; :func:`load_schema` reads it back exactly.

Drafting
--------
:func:`draft_party_schema` (and :func:`draft_schema`) derive a schema from a table: it
READS THE PRIVATE DATA, so its output is not private. It is a starting point for the data
owner to REVIEW (widen the ranges to public bounds, drop rare categories, decide on
``log``) before it is used. It works on a party's own file (no label needed): an ID-like
column (the join key) is left out, dates become ``date`` parts, many-level text ``hashed``,
whole numbers with few distinct values categories. Each drafted column gets a
``# REVIEW: ...`` comment above its table saying what to check (comments: reading the file
ignores them). ``psfl vfl schema`` runs it and says so.

This module does no I/O beyond reading and writing schema files (and the bundled schema
resources of :mod:`parties.datasets`).
"""

from __future__ import annotations

import math
import re
import textwrap
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from pubsub.config import ConfigError

from parties.data import SYNTHETIC_LABEL, synthetic_columns, synthetic_spec
from parties.data.errors import DataError

if TYPE_CHECKING:
    from parties.config import VflConfig

__all__ = [
    "OTHER",
    "SCHEMA_VERSION",
    "CategoricalColumn",
    "DATE_PARTS",
    "DateColumn",
    "Draft",
    "HashedColumn",
    "NumericColumn",
    "PublicSchema",
    "SchemaEncoder",
    "SchemaError",
    "bundled_schema",
    "dp_schema",
    "bundled_schema_name",
    "draft_schema",
    "draft_party_schema",
    "dump_schema",
    "load_schema",
    "loads_schema",
    "parse_schema",
    "save_schema",
    "synthetic_schema",
]

SCHEMA_VERSION = 1
#: Name of the categorical slot for a missing or undeclared value.
OTHER = "__other__"
#: Suffix of a numeric column's missing-value indicator feature.
MISSING_SUFFIX = "__missing"
_DATASETS_PACKAGE = "parties.datasets"
_TOP_KEYS = ("version", "dataset", "description", "columns")
_NUMERIC_KEYS = ("kind", "lo", "hi", "fill", "log", "missing_indicator")
_CATEGORICAL_KEYS = ("kind", "categories")
_DATE_KEYS = ("kind", "parts", "year_lo", "year_hi", "fill", "format", "missing_indicator")
_HASHED_KEYS = ("kind", "buckets")
_KIND_KEYS = {"numeric": _NUMERIC_KEYS, "categorical": _CATEGORICAL_KEYS, "date": _DATE_KEYS,
              "hashed": _HASHED_KEYS}
#: ``synthetic``: every feature is clipped to [-SYNTHETIC_CLIP, SYNTHETIC_CLIP].
SYNTHETIC_CLIP = 8.0


class SchemaError(DataError, ValueError):
    """A schema (file) is invalid, or does not cover the columns asked of it.

    A :class:`parties.data.DataError` (bad input: ``psfl`` and the party processes exit 2)
    and a :class:`ValueError`.

    Attributes:
        key: the offending key or column ("" if none in particular).
        path: the schema file ("" for a schema not read from a file).
        reason: the message without the location.
    """

    def __init__(self, reason: str, *, key: str = "", path: str = "") -> None:
        self.key = key
        self.path = path
        self.reason = reason
        where = f"schema {path!r}" if path else "schema"
        what = f" key {key!r}" if key else ""
        super().__init__(f"{where}{what}: {reason}")


@dataclass(frozen=True, kw_only=True, slots=True)
class NumericColumn:
    """A numeric column with declared public bounds (see the module docstring).

    Attributes:
        name: column name.
        lo / hi: declared bounds, ``lo < hi``, finite; values are clipped into them.
        fill: the value a missing, NaN, ±Inf or non-numeric entry becomes, in ``[lo, hi]``.
        log: apply ``sign(v)·log1p(|v|)`` after clipping (long tails).
        missing_indicator: add a 0/1 feature ``"<name>__missing"``.
    """

    name: str
    lo: float
    hi: float
    fill: float
    log: bool = False
    missing_indicator: bool = False

    def __post_init__(self) -> None:
        for key in ("lo", "hi", "fill"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise SchemaError(f"must be a finite number, got {v!r}", key=f"{self.name}.{key}")
            object.__setattr__(self, key, float(v))
        if not self.lo < self.hi:
            raise SchemaError(f"lo ({self.lo!r}) must be < hi ({self.hi!r})", key=self.name)
        if not self.lo <= self.fill <= self.hi:
            raise SchemaError(f"fill {self.fill!r} must lie in [lo, hi] = "
                              f"[{self.lo!r}, {self.hi!r}]", key=f"{self.name}.fill")
        for key in ("log", "missing_indicator"):
            if not isinstance(getattr(self, key), bool):
                raise SchemaError(f"must be true or false, got {getattr(self, key)!r}",
                                  key=f"{self.name}.{key}")

    @property
    def kind(self) -> str:
        return "numeric"

    @property
    def width(self) -> int:
        return 1 + int(self.missing_indicator)

    @property
    def feature_names(self) -> tuple[str, ...]:
        if self.missing_indicator:
            return (self.name, self.name + MISSING_SUFFIX)
        return (self.name,)


@dataclass(frozen=True, kw_only=True, slots=True)
class CategoricalColumn:
    """A categorical column with a declared list of categories (one-hot, plus ``__other__``).

    Attributes:
        name: column name.
        categories: distinct, non-empty strings, in encoding order; must not include
            ``"__other__"``.
    """

    name: str
    categories: tuple[str, ...]

    def __post_init__(self) -> None:
        cats = self.categories
        if isinstance(cats, str) or not isinstance(cats, tuple | list):
            raise SchemaError(f"must be a list of strings, got {cats!r}",
                              key=f"{self.name}.categories")
        cats = tuple(cats)
        object.__setattr__(self, "categories", cats)
        if not cats:
            raise SchemaError("needs at least one category", key=f"{self.name}.categories")
        bad = [c for c in cats if not isinstance(c, str)]
        if bad:
            raise SchemaError(f"categories must be strings, got {bad[0]!r}",
                              key=f"{self.name}.categories")
        if len(set(cats)) != len(cats):
            dup = next(c for i, c in enumerate(cats) if c in cats[:i])
            raise SchemaError(f"category {dup!r} is listed twice", key=f"{self.name}.categories")
        if OTHER in cats:
            raise SchemaError(f"{OTHER!r} is the implicit slot for undeclared values; do not "
                              "declare it", key=f"{self.name}.categories")

    @property
    def kind(self) -> str:
        return "categorical"

    @property
    def width(self) -> int:
        return len(self.categories) + 1

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}={c}" for c in self.categories) + (f"{self.name}={OTHER}",)


#: date parts with a fixed public range (``year`` has a declared one), in output order
DATE_PART_RANGES: dict[str, tuple[int, int]] = {
    "month": (1, 12), "day": (1, 31), "dayofweek": (0, 6), "hour": (0, 23),
    "minute": (0, 59), "second": (0, 59)}
DATE_PARTS = ("year", *DATE_PART_RANGES)
_DATE_ATTR = {"dayofweek": "day_of_week"}  # pandas' attribute (0 = Monday)
#: the most buckets a hashed column may declare (its encoded width)
MAX_HASH_BUCKETS = 4096
#: the text a hashed column's missing value is hashed as
HASH_MISSING = "__missing__"


def _parse_dates(values: pd.Series, fmt: str) -> pd.Series:
    """``values`` as naive datetimes with the declared format (NaT where one does not
    parse): each value on its own, so the result for a row depends on that row only."""
    if pd.api.types.is_datetime64_any_dtype(values.dtype):
        out = pd.Series(values)
    else:
        text = pd.Series([None if t is None else t for t in
                          (_category_text(v) for v in values.to_numpy(dtype=object))],
                         index=values.index, dtype=object)
        out = pd.to_datetime(text, format=fmt, errors="coerce", utc=True)
    if getattr(out.dt, "tz", None) is not None:
        out = out.dt.tz_convert("UTC").dt.tz_localize(None)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class DateColumn:
    """A date or date-time column encoded as parts over declared ranges (module docstring).

    Attributes:
        name: column name.
        parts: a non-empty subset of :data:`DATE_PARTS`, in any order (output order).
        year_lo / year_hi: the declared year range (integers, ``year_lo < year_hi``); needed
            only when ``parts`` has ``"year"``.
        fill: the date (text in ``format``) a missing or unparseable value becomes.
        format: ``"ISO8601"`` or a ``strftime`` format (``"%d/%m/%Y"``): each value is
            parsed on its own with it.
        missing_indicator: add a 0/1 feature ``"<name>__missing"``.
    """

    name: str
    parts: tuple[str, ...]
    fill: str
    year_lo: int = 0
    year_hi: int = 0
    format: str = "ISO8601"
    missing_indicator: bool = False

    def __post_init__(self) -> None:
        parts = self.parts
        if isinstance(parts, str) or not isinstance(parts, tuple | list) or not parts:
            raise SchemaError(f"must be a non-empty list of {list(DATE_PARTS)!r}, got {parts!r}",
                              key=f"{self.name}.parts")
        parts = tuple(parts)
        object.__setattr__(self, "parts", parts)
        bad = [p for p in parts if p not in DATE_PARTS]
        if bad:
            raise SchemaError(f"unknown part {bad[0]!r} (known: {', '.join(DATE_PARTS)})",
                              key=f"{self.name}.parts")
        if len(set(parts)) != len(parts):
            raise SchemaError("a part is listed twice", key=f"{self.name}.parts")
        for key in ("format", "fill"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise SchemaError(f"must be a non-empty string, got {getattr(self, key)!r}",
                                  key=f"{self.name}.{key}")
        if not isinstance(self.missing_indicator, bool):
            raise SchemaError(f"must be true or false, got {self.missing_indicator!r}",
                              key=f"{self.name}.missing_indicator")
        if "year" in parts:
            for key in ("year_lo", "year_hi"):
                v = getattr(self, key)
                if isinstance(v, bool) or not isinstance(v, int):
                    raise SchemaError(f"must be an integer year, got {v!r}",
                                      key=f"{self.name}.{key}")
            if not self.year_lo < self.year_hi:
                raise SchemaError(f"year_lo ({self.year_lo}) must be < year_hi "
                                  f"({self.year_hi})", key=self.name)
        fill = _parse_dates(pd.Series([self.fill], dtype=object), self.format).iloc[0]
        if pd.isna(fill):
            raise SchemaError(f"{self.fill!r} does not parse with format {self.format!r}",
                              key=f"{self.name}.fill")
        if "year" in parts and not self.year_lo <= fill.year <= self.year_hi:
            raise SchemaError(f"{self.fill!r} lies outside [year_lo, year_hi] = "
                              f"[{self.year_lo}, {self.year_hi}]", key=f"{self.name}.fill")

    @property
    def kind(self) -> str:
        return "date"

    def part_range(self, part: str) -> tuple[int, int]:
        """The declared range of ``part``."""
        return (self.year_lo, self.year_hi) if part == "year" else DATE_PART_RANGES[part]

    @property
    def width(self) -> int:
        return len(self.parts) + int(self.missing_indicator)

    @property
    def feature_names(self) -> tuple[str, ...]:
        names = tuple(f"{self.name}.{p}" for p in self.parts)
        return names + ((self.name + MISSING_SUFFIX,) if self.missing_indicator else ())


@dataclass(frozen=True, kw_only=True, slots=True)
class HashedColumn:
    """A many-level column hashed into a declared number of buckets, one-hot over them.

    Attributes:
        name: column name.
        buckets: 2 … :data:`MAX_HASH_BUCKETS`; the encoded width.
    """

    name: str
    buckets: int

    def __post_init__(self) -> None:
        b = self.buckets
        if isinstance(b, bool) or not isinstance(b, int) or not 2 <= b <= MAX_HASH_BUCKETS:
            raise SchemaError(f"must be an integer in [2, {MAX_HASH_BUCKETS}], got {b!r}",
                              key=f"{self.name}.buckets")

    @property
    def kind(self) -> str:
        return "hashed"

    @property
    def width(self) -> int:
        return self.buckets

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f"{self.name}#{i}" for i in range(self.buckets))


Column = NumericColumn | CategoricalColumn | DateColumn | HashedColumn


@dataclass(frozen=True, kw_only=True, slots=True)
class PublicSchema:
    """The public encoding of a set of feature columns, in order.

    Attributes:
        columns: the columns (distinct names), in encoding order.
        dataset: informational name ("" if none).
        description: informational text.
    """

    columns: tuple[Column, ...]
    dataset: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        cols = tuple(self.columns)
        object.__setattr__(self, "columns", cols)
        if not cols:
            raise SchemaError("declares no columns", key="columns")
        names = [c.name for c in cols]
        if len(set(names)) != len(names):
            dup = next(n for i, n in enumerate(names) if n in names[:i])
            raise SchemaError("column declared twice", key=dup)

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in order."""
        return tuple(c.name for c in self.columns)

    @property
    def width(self) -> int:
        """Encoded width: a function of the schema alone."""
        return sum(c.width for c in self.columns)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Encoded feature names, length :attr:`width`."""
        return tuple(n for c in self.columns for n in c.feature_names)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise SchemaError("not declared in the schema", key=name)

    def select(self, columns: Sequence[str]) -> PublicSchema:
        """The sub-schema of ``columns``, in the order given (a party's share of a dataset's
        schema).

        Raises:
            SchemaError: a column is not declared (the message names every missing one).
        """
        missing = [c for c in columns if c not in self.names]
        if missing:
            raise SchemaError(f"columns {missing!r} are not declared in the schema "
                              f"(declared: {list(self.names)!r})", key=missing[0])
        return PublicSchema(columns=tuple(self.column(c) for c in columns),
                            dataset=self.dataset, description=self.description)


# --------------------------------------------------------------------------- encoding


def _category_text(value: Any) -> str | None:
    """The text a value matches categories by; None for a missing value."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        f = float(value)
        if math.isnan(f):
            return None
        if f.is_integer():
            return str(int(f))
        return repr(f)
    if isinstance(value, np.generic):
        return str(value.item())
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)


class SchemaEncoder:
    """Encode a frame's columns with a :class:`PublicSchema`; nothing is fitted on rows.

    ``SchemaEncoder(schema).transform(frame)`` returns a ``float32`` C-contiguous array
    ``(len(frame), schema.width)``; row ``i`` is a function of row ``i`` of ``frame`` and
    the schema only, so changing, adding or removing any other row leaves it
    byte-identical, and every value is finite and in ``[-1, 1]`` (one-hot and indicator
    features in ``{0, 1}``).
    """

    def __init__(self, schema: PublicSchema) -> None:
        if not isinstance(schema, PublicSchema):
            raise TypeError(f"expected a PublicSchema, got {type(schema).__name__}")
        self.schema = schema

    @property
    def width(self) -> int:
        return self.schema.width

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.schema.feature_names

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Encode ``frame`` (which must have every schema column; others are ignored).

        Raises:
            SchemaError: a schema column is missing from ``frame``.
        """
        missing = [n for n in self.schema.names if n not in frame.columns]
        if missing:
            raise SchemaError(f"the table has no columns {missing!r}", key=missing[0])
        n = len(frame)
        out = np.zeros((n, self.schema.width), dtype=np.float32)
        j = 0
        for col in self.schema.columns:
            series = frame[col.name]
            if isinstance(col, NumericColumn):
                values, was_missing = _encode_numeric(col, series)
                out[:, j] = values
                if col.missing_indicator:
                    out[:, j + 1] = was_missing
            elif isinstance(col, DateColumn):
                out[:, j:j + col.width] = _encode_date(col, series)
            elif isinstance(col, HashedColumn):
                out[np.arange(n), j + _hash_slots(col, series)] = 1.0
            else:
                out[np.arange(n), j + _category_slots(col, series)] = 1.0
            j += col.width
        return out

    __call__ = transform


def _signed_log1p(v: np.ndarray | float) -> Any:
    return np.sign(v) * np.log1p(np.abs(v))


def _encode_numeric(col: NumericColumn, series: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    if pd.api.types.is_bool_dtype(series.dtype):
        raw = series.astype(np.float64).to_numpy()
    elif pd.api.types.is_numeric_dtype(series.dtype):
        raw = series.to_numpy(dtype=np.float64, na_value=np.nan)
    else:  # text, objects: anything unparseable is missing
        raw = pd.to_numeric(series.astype(object), errors="coerce").to_numpy(
            dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(raw)
    v = np.where(bad, col.fill, raw)
    v = np.clip(v, col.lo, col.hi)
    lo, hi = col.lo, col.hi
    if col.log:
        v, lo, hi = _signed_log1p(v), float(_signed_log1p(lo)), float(_signed_log1p(hi))
    enc = 2.0 * (v - lo) / (hi - lo) - 1.0
    enc = np.clip(enc, -1.0, 1.0)  # rounding never leaves the declared range
    return enc.astype(np.float32), bad.astype(np.float32)


def _encode_date(col: DateColumn, series: pd.Series) -> np.ndarray:
    parsed = _parse_dates(series, col.format)
    bad = parsed.isna().to_numpy()
    fill = _parse_dates(pd.Series([col.fill], dtype=object), col.format).iloc[0]
    out = np.zeros((len(series), col.width), dtype=np.float32)
    for k, part in enumerate(col.parts):
        attr = _DATE_ATTR.get(part, part)
        v = getattr(parsed.dt, attr).to_numpy(dtype=np.float64, na_value=np.nan)
        v = np.where(bad, float(getattr(fill, attr)), v)
        lo, hi = col.part_range(part)
        enc = 2.0 * (np.clip(v, lo, hi) - lo) / (hi - lo) - 1.0
        out[:, k] = np.clip(enc, -1.0, 1.0)
    if col.missing_indicator:
        out[:, -1] = bad
    return out


def _hash_slots(col: HashedColumn, series: pd.Series) -> np.ndarray:
    text = np.array([HASH_MISSING if t is None else t for t in
                     (_category_text(v) for v in series.to_numpy(dtype=object))], dtype=object)
    if text.size == 0:
        return np.zeros(0, dtype=np.int64)
    h = pd.util.hash_array(text, categorize=False)  # SipHash, fixed key: same everywhere
    return (h % np.uint64(col.buckets)).astype(np.int64)


def _category_slots(col: CategoricalColumn, series: pd.Series) -> np.ndarray:
    index = {c: i for i, c in enumerate(col.categories)}
    other = len(col.categories)
    return np.fromiter((index.get(_category_text(v), other) for v in series.to_numpy(dtype=object)),
                       dtype=np.int64, count=len(series))


# --------------------------------------------------------------------------- TOML


def _type_name(v: Any) -> str:
    return type(v).__name__


def _column_from_table(name: str, table: Any, path: str) -> Column:
    if not isinstance(table, Mapping):
        raise SchemaError(f"must be a table, got {_type_name(table)}", key=f"columns.{name}",
                          path=path)
    kind = table.get("kind")
    if kind not in _KIND_KEYS:
        raise SchemaError(f"kind must be one of {', '.join(map(repr, _KIND_KEYS))}, got "
                          f"{kind!r}", key=f"columns.{name}.kind", path=path)
    allowed = _KIND_KEYS[kind]
    unknown = [k for k in table if k not in allowed]
    if unknown:
        raise SchemaError(f"unknown key for a {kind} column (known: {', '.join(allowed)})",
                          key=f"columns.{name}.{unknown[0]}", path=path)
    try:
        if kind == "numeric":
            for req in ("lo", "hi", "fill"):
                if req not in table:
                    raise SchemaError("missing (a numeric column declares lo, hi and fill)",
                                      key=f"columns.{name}.{req}", path=path)
            return NumericColumn(name=name, lo=table["lo"], hi=table["hi"], fill=table["fill"],
                                 log=table.get("log", False),
                                 missing_indicator=table.get("missing_indicator", False))
        if kind == "date":
            for req in ("parts", "fill"):
                if req not in table:
                    raise SchemaError("missing (a date column declares parts and fill)",
                                      key=f"columns.{name}.{req}", path=path)
            parts = table["parts"]
            if not isinstance(parts, list):
                raise SchemaError(f"must be a list of strings, got {parts!r}",
                                  key=f"columns.{name}.parts", path=path)
            if "year" in parts:
                for req in ("year_lo", "year_hi"):
                    if req not in table:
                        raise SchemaError("missing (a date column with the year part "
                                          "declares year_lo and year_hi)",
                                          key=f"columns.{name}.{req}", path=path)
            return DateColumn(name=name, parts=tuple(parts), fill=table["fill"],
                              year_lo=table.get("year_lo", 0), year_hi=table.get("year_hi", 0),
                              format=table.get("format", "ISO8601"),
                              missing_indicator=table.get("missing_indicator", False))
        if kind == "hashed":
            if "buckets" not in table:
                raise SchemaError("missing (a hashed column declares its buckets)",
                                  key=f"columns.{name}.buckets", path=path)
            return HashedColumn(name=name, buckets=table["buckets"])
        if "categories" not in table:
            raise SchemaError("missing (a categorical column declares its categories)",
                              key=f"columns.{name}.categories", path=path)
        cats = table["categories"]
        if not isinstance(cats, list):
            raise SchemaError(f"must be a list of strings, got {cats!r}",
                              key=f"columns.{name}.categories", path=path)
        return CategoricalColumn(name=name, categories=tuple(cats))
    except SchemaError as exc:
        if exc.path or not path:
            raise
        raise SchemaError(exc.reason, key=f"columns.{exc.key}", path=path) from None


def parse_schema(data: Mapping[str, Any], *, path: str = "") -> PublicSchema:
    """A :class:`PublicSchema` from a parsed TOML mapping (``path`` only names it in errors).

    Raises:
        SchemaError: unknown key, missing or ill-typed value, inconsistent declaration.
    """
    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise SchemaError(f"unknown key (known: {', '.join(_TOP_KEYS)})", key=unknown[0],
                          path=path)
    version = data.get("version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise SchemaError(f"version must be {SCHEMA_VERSION}, got {version!r}", key="version",
                          path=path)
    for key in ("dataset", "description"):
        if not isinstance(data.get(key, ""), str):
            raise SchemaError(f"must be a string, got {data[key]!r}", key=key, path=path)
    columns = data.get("columns")
    if not isinstance(columns, Mapping) or not columns:
        raise SchemaError("missing or empty: declare each column as [columns.NAME]",
                          key="columns", path=path)
    cols = tuple(_column_from_table(str(n), t, path) for n, t in columns.items())
    try:
        return PublicSchema(columns=cols, dataset=data.get("dataset", ""),
                            description=data.get("description", ""))
    except SchemaError as exc:
        raise SchemaError(exc.reason, key=exc.key, path=path) from None


def load_schema(path: str | Path) -> PublicSchema:
    """Read a schema TOML file (format: the module docstring).

    Raises:
        SchemaError: the file is missing, unreadable, not TOML, or invalid (naming the key
            and the file).
    """
    p = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SchemaError(f"cannot read: {exc.strerror or exc}", path=p) from None
    return loads_schema(text, path=p)


def loads_schema(text: str, *, path: str = "") -> PublicSchema:
    """:func:`load_schema` of TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SchemaError(f"not valid TOML: {exc}", path=path) from None
    return parse_schema(data, path=path)


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_str(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    out = "".join(ch if ord(ch) >= 0x20 and ch != "\x7f" else f"\\u{ord(ch):04x}" for ch in out)
    return f'"{out}"'


def _toml_key(s: str) -> str:
    return s if _BARE.match(s) else _toml_str(s)


def _toml_num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 2**53:
        return str(int(x))
    return repr(float(x))


def dump_schema(schema: PublicSchema, *, header: str = "",
                notes: Mapping[str, str] | None = None) -> str:
    """The schema as TOML text that :func:`loads_schema` reads back to an equal schema.

    ``header``: comment text (each line is prefixed with ``# ``), e.g. the provenance.
    ``notes``: per column, what its owner must review, written as ``# REVIEW: ...``
    comments above its table (comments: reading the file back ignores them).
    """
    notes = notes or {}
    lines = [f"# {ln}".rstrip() for ln in header.splitlines()] if header else []
    if lines:
        lines.append("")
    lines.append(f"version = {SCHEMA_VERSION}")
    if schema.dataset:
        lines.append(f"dataset = {_toml_str(schema.dataset)}")
    if schema.description:
        lines.append(f"description = {_toml_str(schema.description)}")
    for col in schema.columns:
        lines.append("")
        if notes.get(col.name):
            wrapped = textwrap.wrap(notes[col.name], width=84)
            lines.append(f"# REVIEW: {wrapped[0]}")
            lines.extend(f"#   {ln}" for ln in wrapped[1:])
        lines.append(f"[columns.{_toml_key(col.name)}]")
        if isinstance(col, DateColumn):
            lines.append('kind = "date"')
            lines.append(f"parts = [{', '.join(_toml_str(p) for p in col.parts)}]")
            if "year" in col.parts:
                lines.append(f"year_lo = {col.year_lo}")
                lines.append(f"year_hi = {col.year_hi}")
            lines.append(f"fill = {_toml_str(col.fill)}")
            lines.append(f"format = {_toml_str(col.format)}")
            if col.missing_indicator:
                lines.append("missing_indicator = true")
        elif isinstance(col, HashedColumn):
            lines.append('kind = "hashed"')
            lines.append(f"buckets = {col.buckets}")
        elif isinstance(col, NumericColumn):
            lines.append('kind = "numeric"')
            lines.append(f"lo = {_toml_num(col.lo)}")
            lines.append(f"hi = {_toml_num(col.hi)}")
            lines.append(f"fill = {_toml_num(col.fill)}")
            if col.log:
                lines.append("log = true")
            if col.missing_indicator:
                lines.append("missing_indicator = true")
        else:
            lines.append('kind = "categorical"')
            cats = ", ".join(_toml_str(c) for c in col.categories)
            lines.append(f"categories = [{cats}]")
    return "\n".join(lines) + "\n"


def save_schema(schema: PublicSchema, path: str | Path, *, header: str = "",
                notes: Mapping[str, str] | None = None) -> None:
    """Write :func:`dump_schema` to ``path`` (overwrites)."""
    Path(path).write_text(dump_schema(schema, header=header, notes=notes), encoding="utf-8")


# --------------------------------------------------------------------------- bundled


def bundled_schema_name(dataset: str) -> str:
    """File name of a named dataset's bundled schema in :mod:`parties.datasets`."""
    return f"{dataset}.schema.toml"


def bundled_schema(dataset: str, *, synthetic_columns: Sequence[str] = ()) -> PublicSchema | None:
    """The reviewed schema shipped for a named dataset (all its feature columns, so it covers
    either party's split), or None when none ships (a user file).

    ``synthetic`` has no file: its schema follows from the generator
    (:func:`synthetic_schema` of ``synthetic_columns``, the feature columns).

    Raises:
        SchemaError: the bundled file is invalid.
    """
    if dataset == "synthetic":
        return synthetic_schema(synthetic_columns) if synthetic_columns else None
    if not re.fullmatch(r"[a-z0-9_]+", dataset):
        return None
    res = resources.files(_DATASETS_PACKAGE).joinpath(bundled_schema_name(dataset))
    if not res.is_file():
        return None
    return loads_schema(res.read_text(encoding="utf-8"),
                        path=f"{_DATASETS_PACKAGE}/{bundled_schema_name(dataset)}")


def synthetic_schema(columns: Iterable[str], clip: float = SYNTHETIC_CLIP) -> PublicSchema:
    """The public schema of the ``synthetic`` dataset's feature ``columns``.

    Derived from the generator (:func:`parties.data.make_synthetic`, scikit-learn's
    ``make_classification`` with ``class_sep=1``, no shift or scale): a noise feature is
    N(0, 1); an informative one is a Gaussian cluster point (centroid at ±1 per informative
    dimension, unit noise) times a random matrix with entries in [-1, 1], so its scale grows
    with the informative count (about 2-3 standard deviations at 20). Every column is
    clipped to ``[-clip, clip]`` (default 8: in the default table, 100,000 x 100 with 20
    informative features, seed 0, 0.08 % of the values lie beyond it, all in informative
    columns, whose standard deviations reach 3) and mapped linearly to [-1, 1]; fill 0
    (the generator makes no missing values). The clip is a property of the generator's
    parameters, not a statistic of the rows.
    """
    c = float(clip)
    cols = tuple(NumericColumn(name=n, lo=-c, hi=c, fill=0.0) for n in columns)
    return PublicSchema(columns=cols, dataset="synthetic",
                        description=f"make_classification features clipped to [-{c:g}, {c:g}]")


# --------------------------------------------------------------------------- drafting


def _round_out(x: float, down: bool) -> float:
    """``x`` rounded outward (down for a lower bound) to two significant digits."""
    if x == 0 or not math.isfinite(x):
        return 0.0
    step = 10.0 ** (math.floor(math.log10(abs(x))) - 1)
    q = math.floor(x / step) if down else math.ceil(x / step)
    return float(round(q * step, 10))


#: date formats a draft tries, after ISO 8601, on a text date column
DRAFT_DATE_FORMATS = ("%d/%m/%Y", "%m/%d/%Y", "%d.%m.%Y", "%Y/%m/%d", "%d-%m-%Y", "%m-%d-%Y",
                      "%d/%m/%y", "%m/%d/%y", "%Y%m%d")


@dataclass(frozen=True, slots=True)
class Draft:
    """What :func:`draft_party_schema` drafted.

    Attributes:
        schema: the draft schema (its columns in the order given, less those left out).
        notes: per drafted column, what its owner must review (``# REVIEW:`` comments
            of :func:`dump_schema`).
        left_out: per column left out (an ID-like column), why.
    """

    schema: PublicSchema
    notes: dict[str, str]
    left_out: dict[str, str]


def _draft_date(name: str, s: pd.Series) -> tuple[DateColumn, str] | None:
    """A date column's draft (None when it does not parse as dates)."""
    observed = s.dropna()
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        fmt, parsed = "ISO8601", _parse_dates(observed, "ISO8601")
    else:
        best: tuple[float, str, pd.Series] | None = None
        for fmt in ("ISO8601", *DRAFT_DATE_FORMATS):
            try:
                parsed = _parse_dates(observed, fmt)
            except (ValueError, TypeError):
                continue
            share = float(parsed.notna().mean()) if len(parsed) else 0.0
            if best is None or share > best[0]:
                best = (share, fmt, parsed)
            if share >= 0.99:
                break
        if best is None or best[0] < 0.95:
            return None
        _, fmt, parsed = best
    ok = parsed.dropna()
    if ok.empty:
        return None
    timed = bool(((ok.dt.hour != 0) | (ok.dt.minute != 0) | (ok.dt.second != 0)).any())
    parts = ("year", "month", "day", "dayofweek") + (("hour",) if timed else ())
    y_lo, y_hi = int(ok.dt.year.min()), int(ok.dt.year.max())
    if y_lo == y_hi:
        y_hi += 1
    mid = ok.sort_values().iloc[len(ok) // 2]
    fill = mid.strftime("%Y-%m-%d") if fmt == "ISO8601" else mid.strftime(fmt)
    missing = int(len(s) - len(ok))
    col = DateColumn(name=name, parts=parts, year_lo=y_lo, year_hi=y_hi, fill=fill, format=fmt,
                     missing_indicator=missing > 0)
    note = (f"date{'-time' if timed else ''} column ({s.nunique(dropna=True):,} distinct values) "
            f"as parts {', '.join(parts)}; year range [{y_lo}, {y_hi}] is the OBSERVED one: "
            f"widen it to public bounds (e.g. the years the business has existed); format "
            f"{fmt!r}; fill (the median date) for {missing:,} missing or unparseable values: "
            "choose a public neutral date")
    return col, note


def draft_party_schema(frame: pd.DataFrame, columns: Sequence[str] | None = None, *,
                       min_count: int = 10, log_ratio: float = 100.0, dataset: str = "",
                       id_columns: str = "drop", onehot_max_levels: int = 64,
                       max_buckets: int = 256, code_levels: int = 10) -> Draft:
    """A DRAFT schema of ``columns`` (default: every column of ``frame``: a party's own
    file, no label) computed FROM THE DATA in ``frame``, with review notes.

    WARNING: this reads the (private) rows. Its output discloses the observed ranges and
    categories and is therefore NOT private; it is a starting point the data owner must
    REVIEW before use: widen each range to public bounds (documented limits, not the
    observed min/max), check ``fill`` and ``log``, and drop or merge rare categories.

    Each column, in this order of rules:

    * dates and date-times (below) first, as :mod:`parties.data.treatments` does;
    * ID-like (:func:`parties.data.treatments.id_reason`: almost every value distinct, a
      string or an integer with an ID-like name or consecutive values, e.g. a join key
      ``customer_id``): left out (``id_columns = "drop"``, the default; ``"refuse"``
      raises, ``"keep"`` drafts it like any other column);
    * dates and date-times (:func:`parties.data.treatments.looks_like_datetime`: a
      datetime dtype, or text that parses as dates): ``date`` with parts year, month, day, dayofweek (and hour when a
      time of day varies), the observed year range, the format that parses the values
      (ISO 8601 first, then :data:`DRAFT_DATE_FORMATS`), fill the median date;
    * numbers (not booleans): whole numbers with at most ``code_levels`` distinct values
      (codes) become ``categorical`` (each value's text, ``3``); other numbers
      ``numeric``: ``lo``/``hi`` the observed min/max rounded outward to two significant
      digits, ``fill`` the median rounded to two significant digits (clipped into the
      range), ``log = true`` when the range exceeds ``log_ratio`` times the inter-quartile
      range (long tails), ``missing_indicator`` when any value is missing or non-finite;
    * anything else with at most ``onehot_max_levels`` distinct values: ``categorical``,
      the values (their text exactly as in the data) seen at least ``min_count`` times, most
      frequent first; rarer ones and missing values fall into ``__other__``;
    * more levels, or none seen ``min_count`` times: ``hashed`` into the power of two
      at least the number of levels, at most ``max_buckets`` buckets (no value is listed).

    Raises:
        SchemaError: a column is not in ``frame``, a column has no usable value, an
            ID-like column with ``id_columns = "refuse"``, or every column was left out.
    """
    from parties.data.treatments import id_reason, looks_like_datetime

    if columns is None:
        columns = [str(c) for c in frame.columns]
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SchemaError(f"the table has no columns {missing!r}", key=missing[0])
    cols: list[Column] = []
    notes: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for name in columns:
        s = frame[name]
        if looks_like_datetime(s):  # before the ID rule: a time stamp is mostly distinct
            got = _draft_date(name, s)
            if got is not None:
                cols.append(got[0])
                notes[name] = got[1]
                continue
        if id_columns != "keep":
            why = id_reason(name, s)
            if why:
                if id_columns == "refuse":
                    raise SchemaError(f"looks like an ID ({why}); drop it from the party's "
                                      "columns", key=name)
                left_out[name] = f"ID-like ({why}): a join key, not a feature"
                continue
        n_missing = int(s.isna().sum())
        if pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype):
            raw = s.to_numpy(dtype=np.float64, na_value=np.nan)
            ok = raw[np.isfinite(raw)]
            if ok.size == 0:
                raise SchemaError("has no finite value to draft a range from", key=name)
            distinct = np.unique(ok)
            if distinct.size <= code_levels and bool(np.all(distinct == np.round(distinct))):
                cats = tuple(str(int(v)) for v in distinct)
                cols.append(CategoricalColumn(name=name, categories=cats))
                notes[name] = (f"{distinct.size} distinct whole numbers: drafted as codes "
                               f"(categories); if their order or size means something (a "
                               f"count, a rating), declare it numeric instead"
                               + (f"; {n_missing:,} missing values go to __other__"
                                  if n_missing else ""))
                continue
            lo, hi = _round_out(float(ok.min()), True), _round_out(float(ok.max()), False)
            if not lo < hi:
                lo, hi = lo - 1.0, hi + 1.0
            q1, q3 = np.percentile(ok, [25, 75])
            fill = min(max(_round_out(float(np.median(ok)), True), lo), hi)
            cols.append(NumericColumn(name=name, lo=lo, hi=hi, fill=fill,
                                      log=bool((hi - lo) > log_ratio * max(q3 - q1, 1e-12)),
                                      missing_indicator=bool(ok.size < raw.size)))
            notes[name] = ("lo/hi are the OBSERVED extremes rounded outward: widen them to "
                           "public bounds; fill is the observed median"
                           + (f" ({raw.size - ok.size:,} missing or non-finite values)"
                              if ok.size < raw.size else ""))
            continue
        texts = pd.Series([_category_text(v) for v in s.to_numpy(dtype=object)],
                          dtype=object).dropna()
        counts = texts.value_counts()
        keep = [str(c) for c, k in counts.items() if k >= min_count]
        if len(counts) <= onehot_max_levels and keep:
            cols.append(CategoricalColumn(name=name, categories=tuple(keep)))
            rare = len(counts) - len(keep)
            notes[name] = (f"categories seen at least {min_count} times, most frequent first"
                           + (f"; {rare} rarer values go to __other__" if rare else "")
                           + (f"; {n_missing:,} missing values go to __other__"
                              if n_missing else "")
                           + ": check that every listed value may be published")
            continue
        if counts.empty:
            raise SchemaError("has no value to draft from", key=name)
        buckets = min(max_buckets, max(2, 1 << max(1, int(len(counts) - 1).bit_length())))
        cols.append(HashedColumn(name=name, buckets=buckets))
        notes[name] = (f"{len(counts):,} distinct values hashed into {buckets} buckets (no "
                       "value is listed); more buckets separate more values and widen the "
                       "input" + (f"; {n_missing:,} missing values hash as "
                                  f"{HASH_MISSING!r}" if n_missing else ""))
    if not cols:
        raise SchemaError(f"every column was left out ({', '.join(left_out)}): nothing to "
                          "draft", key="columns")
    schema = PublicSchema(columns=tuple(cols), dataset=dataset,
                          description="DRAFT computed from the data: review before use")
    return Draft(schema=schema, notes=notes, left_out=left_out)


def draft_schema(frame: pd.DataFrame, columns: Sequence[str], *, min_count: int = 10,
                 log_ratio: float = 100.0, dataset: str = "") -> PublicSchema:
    """The schema of :func:`draft_party_schema` (its review notes dropped). READS THE
    PRIVATE DATA: review the draft before use.

    Raises:
        SchemaError: as :func:`draft_party_schema`.
    """
    return draft_party_schema(frame, columns, min_count=min_count, log_ratio=log_ratio,
                              dataset=dataset).schema


DRAFT_WARNING = """\
DRAFT SCHEMA, COMPUTED FROM THE DATA: NOT PRIVATE. REVIEW IT BEFORE USE.
The ranges and categories below were read from the rows of the table (observed min/max
rounded outward, observed categories). Publishing or using them unreviewed discloses
facts about individual records (an outlier's value, a rare category). Before use:
widen each lo/hi to public bounds (documented limits, not what the data shows), check
fill and log, drop or merge rare categories, and record how you derived each here."""


def dp_schema(cfg: VflConfig, columns: Sequence[str]) -> PublicSchema:
    """The public schema the passive party encodes ``columns`` with under DP: the file
    ``vfl.dp.schema``, else the bundled reviewed schema of the named dataset (for
    ``synthetic``, the generator's, :func:`parties.data.schema.synthetic_schema`), restricted to
    ``columns`` in that order.

    Raises:
        ConfigError: key ``vfl.dp.schema``: no schema is available (a user file without
            ``vfl.dp.schema``).
        parties.data.schema.SchemaError: the file is missing or invalid, or does not declare
            every one of ``columns`` (both exit 2).
    """
    if cfg.dp.schema is not None:
        schema = load_schema(Path(cfg.dp.schema).expanduser())
    else:
        features: tuple[str, ...] = ()
        if cfg.dataset == "synthetic":
            features = tuple(c for c in synthetic_columns(synthetic_spec(cfg))
                             if c != SYNTHETIC_LABEL)
        schema = bundled_schema(cfg.dataset, synthetic_columns=features)
        if schema is None:
            raise ConfigError(
                "vfl.dp.schema",
                f"DP is on, so the passive party's features must be encoded from a public "
                f"schema (declared ranges and categories), but dataset {cfg.dataset!r} has "
                "no bundled schema: set vfl.dp.schema to a schema file you reviewed "
                "(draft one with `psfl vfl schema --dataset PATH --role passive --out "
                "schema.toml`, then review it)")
    return schema.select(tuple(columns))
