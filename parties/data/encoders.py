"""Serialisable feature encoders of a party (numpy/pandas, no torch, no I/O).

:class:`FittedEncoder` is the plain-data form of the encoder that
:func:`parties.data.encode_party_features` fits on the training rows (scikit-learn's
``ColumnTransformer``): per column, either a numeric column's fill value (the training
median), clipping range (training quantiles), mean and scale, or a categorical column's
sorted categories. Its :meth:`FittedEncoder.transform` reproduces the fitted transform
exactly (same float64 operations, then float32), so a saved model scores new rows as it
scored the test split. With DP on, the passive party's encoder is its public schema
instead (:class:`parties.data.schema.SchemaEncoder`, saved as the schema's TOML).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

#: ``FittedEncoder.to_dict`` format version (2: datetime parts, hashed columns, dropped
#: columns and the treatments; 1 is still read).
ENCODER_FORMAT = 2
_READS = (1, 2)


class EncoderFormatError(ValueError):
    """An encoder dict cannot be read (another format version, or malformed).

    Attributes:
        detail: what is wrong.
    """

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"cannot read the saved encoder: {detail}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ColumnCode:
    """How one raw column is encoded.

    Attributes:
        name: the output name: the raw column, or ``column.part`` for a datetime part.
        kind: ``"numeric"`` (``(fill(x) - mean) / scale``, one output),
            ``"categorical"`` (one-hot over ``categories``; unknown values give zeros) or
            ``"hashed"`` (one output: the value's bucket in ``[0, buckets)``, an exact
            integer in float32, :func:`parties.data.treatments.hash_buckets`).
        fill / mean / scale: numeric only: the missing-value fill (training median, 0
            for a column without observed values) and the standardisation.
        categories: categorical only: the sorted categories seen in the training rows
            (missing values are the category ``"__missing__"``).
        source / part: a datetime part: the raw column and the part
            (:data:`parties.data.treatments.DATETIME_PARTS`); empty otherwise.
        buckets: hashed only: the embedding table's rows.
        lo / hi: numeric only: the range a filled value is clipped to before
            standardising: the ``[q, 1 - q]`` quantiles of the training values (in
            memory, :func:`parties.data.encode_party_features`) or of a training sample
            (streamed, :mod:`parties.data.stream`); infinite: no clipping (an encoder
            saved before in-memory clipping, or ``q = 0``).
    """

    name: str
    kind: str
    fill: float = 0.0
    mean: float = 0.0
    scale: float = 1.0
    categories: tuple[str, ...] = ()
    source: str = ""
    part: str = ""
    buckets: int = 0
    lo: float = -math.inf
    hi: float = math.inf

    @property
    def column(self) -> str:
        """The raw column this code reads."""
        return self.source or self.name

    @property
    def width(self) -> int:
        return len(self.categories) if self.kind == "categorical" else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class FittedEncoder:
    """A party's fitted feature encoder as plain data.

    Attributes:
        columns: per output, in output order: every dense code (numeric, datetime part,
            one-hot), then the hashed columns (:attr:`hashed_buckets`).
        missing: the category of missing values of categorical columns.
        treatments: each raw column's treatment (:class:`parties.data.treatments.Treatment`),
            dropped ID-like columns included.
    """

    columns: tuple[ColumnCode, ...]
    missing: str = "__missing__"
    treatments: tuple[Any, ...] = ()

    @property
    def hashed_buckets(self) -> tuple[int, ...]:
        """The buckets of each hashed column (the last ``len`` outputs), in order."""
        return tuple(c.buckets for c in self.columns if c.kind == "hashed")

    @property
    def dropped(self) -> tuple[str, ...]:
        """Raw columns dropped as ID-like."""
        return tuple(t.column for t in self.treatments if t.kind == "dropped")

    @property
    def width(self) -> int:
        """Encoded width ``d``."""
        return sum(c.width for c in self.columns)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Output names (``c`` for a numeric column, ``c=v`` for a category)."""
        out: list[str] = []
        for c in self.columns:
            if c.kind == "categorical":
                out += [f"{c.name}={v}" for v in c.categories]
            elif c.kind == "hashed":
                out.append(f"{c.name}#hash{c.buckets}")
            else:
                out.append(c.name)
        return tuple(out)

    @classmethod
    def from_column_transformer(cls, ct: Any, columns: Sequence[str],
                                missing: str = "__missing__", *,
                                parts: Mapping[str, tuple[str, str]] | None = None,
                                hashed: Sequence[ColumnCode] = (),
                                treatments: Sequence[Any] = (),
                                bounds: Mapping[str, tuple[float, float]] | None = None,
                                ) -> FittedEncoder:
        """From the fitted ``ColumnTransformer`` of :func:`parties.data.encode_party_features`
        (one transformer per dense output column, in ``columns`` order; ``parts`` maps a
        datetime part's name to its ``(source, part)``, ``bounds`` a numeric output's name
        to the ``(lo, hi)`` its values were clipped to before the fit), then the
        ``hashed`` codes."""
        codes: list[ColumnCode] = []
        fitted = {name: step for name, step, _ in ct.transformers_} if columns else {}
        parts = parts or {}
        bounds = bounds or {}
        for i, col in enumerate(columns):
            step = fitted[f"c{i}"]
            if hasattr(step, "categories_"):
                codes.append(ColumnCode(name=col, kind="categorical",
                                        categories=tuple(str(v) for v in step.categories_[0])))
            else:
                imp, sc = step.named_steps["impute"], step.named_steps["scale"]
                fill = float(imp.statistics_[0])
                source, part = parts.get(col, ("", ""))
                lo, hi = bounds.get(col, (-math.inf, math.inf))
                codes.append(ColumnCode(name=col, kind="numeric",
                                        fill=0.0 if np.isnan(fill) else fill,
                                        mean=float(sc.mean_[0]), scale=float(sc.scale_[0]),
                                        source=source, part=part, lo=lo, hi=hi))
        return cls(columns=tuple(codes) + tuple(hashed), missing=missing,
                   treatments=tuple(treatments))

    def treatments_dict(self) -> list[dict[str, Any]]:
        """Each raw column's treatment, JSON-ready (``metrics.json``)."""
        return [t.to_dict() for t in self.treatments]

    def packing(self) -> Any:
        """How :meth:`transform` ``(packed=True)`` rows expand to the dense rows
        (:class:`parties.data.rowstore.Unpack`; one slot per output column)."""
        from parties.data.rowstore import Unpack

        plain, onehot, pos = [], [], 0
        for slot, c in enumerate(self.columns):
            if c.kind == "categorical":
                onehot.append((slot, pos, len(c.categories)))
            else:
                plain.append((slot, pos))
            pos += c.width
        return Unpack(width=pos, plain=tuple(plain), onehot=tuple(onehot))

    def transform(self, frame: pd.DataFrame, *, packed: bool = False) -> np.ndarray:
        """Encode ``frame``'s columns: ``(len(frame), width)`` float32, C-contiguous.

        ``packed``: one output per column instead, a one-hot column's being the index of
        the row's category (``-1`` for an unknown one); :meth:`packing` expands them to
        exactly the dense rows.

        Raises:
            parties.data.UnknownColumn: a column is missing from ``frame``.
            parties.data.DataError: numeric columns have infinite values (all named).
        """
        from parties.data.errors import DataError, UnknownColumn

        from parties.data.treatments import (MISSING, as_strings, datetime_part, hash_buckets,
                                        parse_datetime)

        absent = sorted({c.column for c in self.columns if c.column not in frame.columns})
        if absent:
            raise UnknownColumn(absent, list(frame.columns))
        parts: list[np.ndarray] = []
        parsed: dict[str, pd.Series] = {}
        infinite: list[str] = []
        for c in self.columns:
            series = frame[c.column]
            if c.kind == "numeric":
                if c.part:
                    if c.source not in parsed:
                        parsed[c.source] = parse_datetime(series)
                    x = datetime_part(parsed[c.source], c.part)
                else:
                    x = series.to_numpy(dtype=np.float64, na_value=np.nan).copy()
                if np.isinf(x).any():
                    infinite.append(c.name)
                    continue
                x[np.isnan(x)] = c.fill
                if c.lo > -math.inf or c.hi < math.inf:
                    np.clip(x, c.lo, c.hi, out=x)
                x -= c.mean
                x /= c.scale
                parts.append(x[:, None])
            elif c.kind == "hashed":
                parts.append(hash_buckets(series, c.buckets).astype(np.float64)[:, None])
            else:
                values = (as_strings(series) if self.missing == MISSING else
                          series.astype(object).where(series.notna(), self.missing)
                          .astype(str)).to_numpy()
                if packed:
                    parts.append(pd.Index(c.categories).get_indexer(values)
                                 .astype(np.float64)[:, None])  # -1: not a category
                else:
                    cats = np.asarray(c.categories, dtype=object)
                    parts.append((values[:, None] == cats[None, :]).astype(np.float64))
        if infinite:
            from parties.data.errors import infinite_values_message

            raise DataError(infinite_values_message(infinite))
        out = np.hstack(parts) if parts else np.empty((len(frame), 0))
        return np.ascontiguousarray(out, dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (:meth:`from_dict` reads it back)."""
        cols: list[dict[str, Any]] = []
        for c in self.columns:
            if c.kind == "numeric":
                d: dict[str, Any] = {"name": c.name, "kind": "numeric", "fill": c.fill,
                                     "mean": c.mean, "scale": c.scale}
                if c.part:
                    d.update(source=c.source, part=c.part)
                if c.lo > -math.inf:
                    d["lo"] = c.lo
                if c.hi < math.inf:
                    d["hi"] = c.hi
                cols.append(d)
            elif c.kind == "hashed":
                cols.append({"name": c.name, "kind": "hashed", "buckets": c.buckets})
            else:
                cols.append({"name": c.name, "kind": "categorical",
                             "categories": list(c.categories)})
        return {"format": ENCODER_FORMAT, "kind": "fitted", "missing": self.missing,
                "columns": cols, "treatments": self.treatments_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FittedEncoder:
        """Read :meth:`to_dict` output (this format or format 1).

        Raises:
            EncoderFormatError: another format version or a malformed entry.
        """
        from parties.data.treatments import DATETIME_PARTS, Treatment

        if data.get("format") not in _READS or data.get("kind") != "fitted":
            raise EncoderFormatError(f"format {data.get('format')!r} kind "
                                     f"{data.get('kind')!r}, expected one of {_READS} fitted")
        codes = []
        try:
            for c in data["columns"]:
                if c["kind"] == "numeric":
                    part = str(c.get("part", ""))
                    if part and part not in DATETIME_PARTS:
                        raise EncoderFormatError(f"datetime part {part!r}")
                    codes.append(ColumnCode(name=str(c["name"]), kind="numeric",
                                            fill=float(c["fill"]), mean=float(c["mean"]),
                                            scale=float(c["scale"]),
                                            source=str(c.get("source", "")), part=part,
                                            lo=float(c.get("lo", -math.inf)),
                                            hi=float(c.get("hi", math.inf))))
                elif c["kind"] == "categorical":
                    codes.append(ColumnCode(name=str(c["name"]), kind="categorical",
                                            categories=tuple(str(v) for v in c["categories"])))
                elif c["kind"] == "hashed":
                    buckets = int(c["buckets"])
                    if buckets < 1:
                        raise EncoderFormatError(f"hashed column with {buckets} buckets")
                    codes.append(ColumnCode(name=str(c["name"]), kind="hashed",
                                            buckets=buckets))
                else:
                    raise EncoderFormatError(f"column kind {c['kind']!r}")
            treatments = tuple(Treatment.from_dict(t) for t in data.get("treatments", ()))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, EncoderFormatError):
                raise
            raise EncoderFormatError(f"malformed column entry ({exc!r})") from None
        kinds = [c.kind for c in codes]
        if "hashed" in kinds and any(k != "hashed" for k in kinds[kinds.index("hashed"):]):
            raise EncoderFormatError("hashed columns must come after every dense column")
        return cls(columns=tuple(codes), missing=str(data.get("missing", "__missing__")),
                   treatments=treatments)


__all__ = ["ENCODER_FORMAT", "ColumnCode", "EncoderFormatError", "FittedEncoder"]
