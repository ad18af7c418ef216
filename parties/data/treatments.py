"""How each raw column of a party's table is treated before it reaches the bottom model
(pure: pandas/numpy, no torch, no I/O).

:func:`classify` decides one column's :class:`Treatment` from the training rows:

* ``datetime``: a datetime column, or a string column whose sampled values all look like
  dates or times (``2024-05-01``, ``1/5/24``, ``12:30``) and of which at least 95 % parse,
  becomes
  numeric parts (year, month, day, day of week, hour, minute, second: the ones that vary
  in the training rows), each standardised like a numeric column. A 40,000-level time
  stamp is six numbers, not 40,000 one-hot columns.
* ``dropped``: an ID-like column, dropped with a warning naming it (``id_columns =
  "refuse"`` makes it an error, ``"keep"`` keeps it): at least 50 observed training
  values, at least 95 % of them distinct, and either not numeric, or integer with an
  ID-like name (``id``, ``..._id``, ``uuid``, ``key``) or an almost consecutive range
  (``max - min + 1 <= 2 x distinct``). A float column is never an ID.
* ``onehot``: a non-numeric column (or one named in ``categorical_columns``: numeric
  codes such as an industry code) with at most ``onehot_max_levels`` levels in the
  training rows (missing values are a level).
* ``hashed``: such a column with more levels: each value's string form hashed
  (:func:`hash_buckets`, pandas' SipHash with its fixed key, so every process and every
  party computes the same bucket) into ``buckets = min(hash_buckets, the power of two
  >= 2 x levels)`` buckets; the bottom model looks the bucket up in an embedding table
  (:class:`parties.models.zoo.HashedInput`). A value first seen in the test rows still lands in
  a bucket.
* ``numeric``: everything else (standardised).

With DP on, the passive party's columns are treated by its public schema
(:mod:`parties.data.schema`) and this module is not consulted: no treatment comes from a pass
over its private rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from parties.config import ID_COLUMN_MODES

#: the level of a categorical column's missing values
MISSING = "__missing__"
#: datetime parts, in output order
DATETIME_PARTS = ("year", "month", "day", "dayofweek", "hour", "minute", "second")
KINDS = ("numeric", "onehot", "hashed", "datetime", "dropped")

_ID_NAME = re.compile(r"(^|[_\W])(id|uuid|guid|key)$", re.IGNORECASE)
#: a date (a 4-digit year beside a month, or d/m/y) or a time of day (hh:mm)
_DATE_CHARS = re.compile(r"\d{4}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}|\d{1,2}:\d{2}")
_MIN_ID_ROWS = 50
_ID_DISTINCT = 0.95
_DATE_PARSED = 0.95
_DATE_SAMPLE = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class TreatmentPolicy:
    """The rules :func:`classify` applies (config keys of the same names).

    Attributes:
        onehot_max_levels: a categorical column with at most this many levels is one-hot
            encoded, above it hashed (>= 2).
        hash_buckets: the most buckets a hashed column gets (>= 2).
        id_columns: ``"drop"`` (with a warning), ``"refuse"`` (an error) or ``"keep"``.
        categorical_columns: columns treated as categorical even when numeric.
        clip_quantile: ``q``: a numeric column (or datetime part) is clipped to the
            ``[q, 1 - q]`` quantiles of its observed training values before
            standardising (default 0.001, the 0.1 % and 99.9 % quantiles, as
            ``vfl.data.stream_clip_quantile`` streams; 0 = no clipping; in ``[0, 0.5)``).
    """

    onehot_max_levels: int = 64
    hash_buckets: int = 4096
    id_columns: str = "drop"
    categorical_columns: tuple[str, ...] = ()
    clip_quantile: float = 0.001

    def __post_init__(self) -> None:
        for key in ("onehot_max_levels", "hash_buckets"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise ValueError(f"{key} must be an integer >= 2, got {v!r}")
        if self.id_columns not in ID_COLUMN_MODES:
            raise ValueError(f"id_columns must be one of {ID_COLUMN_MODES}, "
                             f"got {self.id_columns!r}")
        if not 0.0 <= self.clip_quantile < 0.5:
            raise ValueError(f"clip_quantile must be in [0, 0.5), got {self.clip_quantile!r}")


def policy_of(cfg: Any) -> TreatmentPolicy:
    """The column-treatment rules of a run configuration
    (:class:`parties.config.VflConfig`'s keys of the same names)."""
    return TreatmentPolicy(onehot_max_levels=cfg.data.onehot_max_levels,
                           hash_buckets=cfg.data.hash_buckets, id_columns=cfg.data.id_columns,
                           categorical_columns=tuple(cfg.data.categorical_columns),
                           clip_quantile=cfg.data.stream_clip_quantile)


@dataclass(frozen=True, slots=True, kw_only=True)
class Treatment:
    """One column's treatment.

    Attributes:
        column: the raw column.
        kind: one of :data:`KINDS`.
        levels: categorical kinds: distinct values in the training rows (missing
            counted as one).
        buckets: ``hashed`` only: the embedding table's rows.
        parts: ``datetime`` only: the parts kept.
        reason: why (for the record and the warning).
    """

    column: str
    kind: str
    levels: int = 0
    buckets: int = 0
    parts: tuple[str, ...] = ()
    reason: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Treatment:
        """Read :meth:`to_dict` output (KeyError/TypeError/ValueError when malformed)."""
        kind = str(d["treatment"])
        if kind not in KINDS:
            raise ValueError(f"unknown treatment {kind!r}")
        return cls(column=str(d["column"]), kind=kind, levels=int(d.get("levels", 0)),
                   buckets=int(d.get("buckets", 0)),
                   parts=tuple(str(x) for x in d.get("parts", ())),
                   reason=str(d.get("reason", "")))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"column": self.column, "treatment": self.kind}
        if self.kind in ("onehot", "hashed"):
            out["levels"] = self.levels
        if self.kind == "hashed":
            out["buckets"] = self.buckets
        if self.kind == "datetime":
            out["parts"] = list(self.parts)
        if self.reason:
            out["reason"] = self.reason
        return out


class IdColumnRefused(ValueError):
    """``id_columns = "refuse"`` and a column looks like an ID.

    Attributes:
        column: the column.
        reason: why it looks like one.
    """

    def __init__(self, column: str, reason: str) -> None:
        self.column = column
        self.reason = reason
        super().__init__(f"column {column!r} looks like an ID ({reason}); drop it from the "
                         "party's columns, or set vfl.data.id_columns = \"drop\" or \"keep\"")


def _pow2_at_least(n: int) -> int:
    return 1 << max(1, int(n - 1).bit_length())


def categorical_levels(series: pd.Series) -> int:
    """Distinct values of ``series`` as strings, missing counted as one level."""
    return int(as_strings(series).nunique())


def as_strings(series: pd.Series) -> pd.Series:
    """``series`` as strings, missing values :data:`MISSING` (the categorical form)."""
    values = series.astype(object)
    return values.where(values.notna(), MISSING).astype(str)


def _is_categorical_dtype(series: pd.Series) -> bool:
    return pd.api.types.is_bool_dtype(series.dtype) or not pd.api.types.is_numeric_dtype(
        series.dtype)


def looks_like_datetime(series: pd.Series) -> bool:
    """Whether ``series`` is a datetime column or a string column of dates/times (see the
    module docstring: every sampled value looks like one and at least 95 % parse)."""
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        return True
    if not (pd.api.types.is_object_dtype(series.dtype)
            or pd.api.types.is_string_dtype(series.dtype)):
        return False
    observed = series.dropna()
    if observed.empty:
        return False
    sample = observed.iloc[:: max(1, len(observed) // _DATE_SAMPLE)].iloc[:_DATE_SAMPLE]
    text = sample.astype(str)
    if not text.map(lambda s: bool(_DATE_CHARS.search(s))).all():
        return False
    parsed = parse_datetime(text)
    return float(parsed.notna().mean()) >= _DATE_PARSED


def parse_datetime(series: pd.Series) -> pd.Series:
    """``series`` as datetimes (NaT where a value does not parse; time zones dropped)."""
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        out = pd.Series(series)
    else:
        import warnings

        with warnings.catch_warnings():  # "could not infer format": per-element parsing
            warnings.simplefilter("ignore", UserWarning)
            out = pd.to_datetime(series, errors="coerce", utc=True)
    if getattr(out.dt, "tz", None) is not None:
        out = out.dt.tz_localize(None)
    return out


def datetime_part(parsed: pd.Series, part: str) -> np.ndarray:
    """One part of parsed datetimes as a new, writable float64 array (NaN where NaT:
    pandas may hand back a read-only view when a value is missing, and the encoders fill
    and clip in place)."""
    if part not in DATETIME_PARTS:
        raise ValueError(f"unknown datetime part {part!r}, expected one of {DATETIME_PARTS}")
    return np.array(getattr(parsed.dt, part).to_numpy(dtype=np.float64, na_value=np.nan),
                    dtype=np.float64, copy=True)


def id_reason(name: str, series: pd.Series) -> str:
    """Why ``name`` looks like a record ID (the module docstring's rule), "" if it does not."""
    observed = series.dropna()
    n = len(observed)
    if n < _MIN_ID_ROWS:
        return ""
    distinct = int(observed.nunique())
    if distinct < _ID_DISTINCT * n:
        return ""
    share = f"{distinct:,} distinct of {n:,} training values"
    if _is_categorical_dtype(series):
        return share
    if pd.api.types.is_integer_dtype(series.dtype):
        if _ID_NAME.search(name):
            return f"{share}, an ID-like name"
        lo, hi = int(observed.min()), int(observed.max())
        if hi - lo + 1 <= 2 * distinct:
            return f"{share}, almost consecutive integers {lo}..{hi}"
    return ""


def classify(name: str, series: pd.Series, policy: TreatmentPolicy) -> Treatment:
    """``name``'s treatment, decided on ``series`` (its training rows).

    Raises:
        IdColumnRefused: an ID-like column and ``policy.id_columns == "refuse"``.
    """
    forced = name in policy.categorical_columns
    if not forced and looks_like_datetime(series):
        parsed = parse_datetime(series)
        parts = tuple(p for p in DATETIME_PARTS
                      if np.unique(datetime_part(parsed, p)[~parsed.isna().to_numpy()]).size > 1)
        return Treatment(column=name, kind="datetime", parts=parts,
                         reason="parsed as date/time")
    if policy.id_columns != "keep":
        why = id_reason(name, series)
        if why:
            if policy.id_columns == "refuse":
                raise IdColumnRefused(name, why)
            return Treatment(column=name, kind="dropped", reason=f"ID-like: {why}")
    if forced or _is_categorical_dtype(series):
        levels = categorical_levels(series)
        if levels <= policy.onehot_max_levels:
            return Treatment(column=name, kind="onehot", levels=levels)
        buckets = min(policy.hash_buckets, _pow2_at_least(2 * levels))
        return Treatment(column=name, kind="hashed", levels=levels, buckets=buckets,
                         reason=f"{levels:,} levels > onehot_max_levels "
                                f"{policy.onehot_max_levels}")
    return Treatment(column=name, kind="numeric")


def classify_columns(frame: pd.DataFrame, columns: Iterable[str],
                     policy: TreatmentPolicy) -> tuple[Treatment, ...]:
    """:func:`classify` for each of ``columns`` of ``frame`` (its training rows)."""
    return tuple(classify(c, frame[c], policy) for c in columns)


def hash_buckets(series: pd.Series, buckets: int) -> np.ndarray:
    """Each value's bucket in ``[0, buckets)`` (int64): pandas' SipHash (fixed key) of its
    string form, missing values hashed as :data:`MISSING`; the same in every process."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    text = as_strings(series).to_numpy(dtype=object)
    h = pd.util.hash_array(text, categorize=False)
    return (h % np.uint64(buckets)).astype(np.int64)


def encoded_width(treatments: Sequence[Treatment]) -> int:
    """The encoded width of ``treatments``: one per numeric column, datetime part and
    hashed column, one per level of a one-hot column, none for a dropped one."""
    n = 0
    for t in treatments:
        n += {"numeric": 1, "hashed": 1, "dropped": 0}.get(t.kind, 0)
        n += len(t.parts) if t.kind == "datetime" else 0
        n += t.levels if t.kind == "onehot" else 0
    return n


def treatment_summary(treatments: Sequence[Mapping[str, Any]]) -> str:
    """The non-trivial treatments of :meth:`Treatment.to_dict` entries (a party's
    ``treatments`` in ``metrics.json``) in one line, ``""`` when there are none: dates
    split into parts, hashed and dropped columns (numeric and one-hot are the default,
    not listed), e.g. ``when -> year, month, day; merchant hashed into 1024 buckets;
    user_id dropped as ID-like``."""
    said: list[str] = []
    for t in treatments:
        kind, col = t.get("treatment"), t.get("column")
        if kind == "datetime":
            said.append(f"{col} -> {', '.join(t.get('parts', ()))}")
        elif kind == "hashed":
            said.append(f"{col} hashed into {t.get('buckets')} buckets")
        elif kind == "dropped":
            said.append(f"{col} dropped as ID-like")
    return "; ".join(said)


__all__ = ["DATETIME_PARTS", "ID_COLUMN_MODES", "KINDS", "MISSING", "IdColumnRefused",
           "Treatment", "TreatmentPolicy", "as_strings", "categorical_levels", "classify",
           "classify_columns", "datetime_part", "encoded_width", "hash_buckets",
           "id_reason", "looks_like_datetime", "parse_datetime", "policy_of",
           "treatment_summary"]
