"""Serialisable feature encoders of a party (numpy/pandas, no torch, no I/O).

:class:`FittedEncoder` is the plain-data form of the encoder that
:func:`parties.data.encode_party_features` fits on the training rows (scikit-learn's
``ColumnTransformer``): per column, either a numeric column's fill value (the training
median), mean and scale, or a categorical column's sorted categories. Its
:meth:`FittedEncoder.transform` reproduces the fitted transform exactly (same float64
operations, then float32), so a saved model scores new rows as it scored the test split.
With DP on, the passive party's encoder is its public schema instead
(:class:`parties.schema.SchemaEncoder`, saved as the schema's TOML).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

#: ``FittedEncoder.to_dict`` format version.
ENCODER_FORMAT = 1


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
        name: the column.
        kind: ``"numeric"`` (``(fill(x) - mean) / scale``, one output) or
            ``"categorical"`` (one-hot over ``categories``; unknown values give zeros).
        fill / mean / scale: numeric only: the missing-value fill (training median, 0
            for a column without observed values) and the standardisation.
        categories: categorical only: the sorted categories seen in the training rows
            (missing values are the category ``"__missing__"``).
    """

    name: str
    kind: str
    fill: float = 0.0
    mean: float = 0.0
    scale: float = 1.0
    categories: tuple[str, ...] = ()

    @property
    def width(self) -> int:
        return 1 if self.kind == "numeric" else len(self.categories)


@dataclass(frozen=True, slots=True, kw_only=True)
class FittedEncoder:
    """A party's fitted feature encoder as plain data.

    Attributes:
        columns: per raw column, in output order.
        missing: the category of missing values of categorical columns.
    """

    columns: tuple[ColumnCode, ...]
    missing: str = "__missing__"

    @property
    def width(self) -> int:
        """Encoded width ``d``."""
        return sum(c.width for c in self.columns)

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Output names (``c`` for a numeric column, ``c=v`` for a category)."""
        out: list[str] = []
        for c in self.columns:
            out += [c.name] if c.kind == "numeric" else [f"{c.name}={v}" for v in c.categories]
        return tuple(out)

    @classmethod
    def from_column_transformer(cls, ct: Any, columns: Sequence[str],
                                missing: str = "__missing__") -> FittedEncoder:
        """From the fitted ``ColumnTransformer`` of :func:`parties.data.encode_party_features`
        (one transformer per column, in ``columns`` order)."""
        codes: list[ColumnCode] = []
        fitted = {name: step for name, step, _ in ct.transformers_}
        for i, col in enumerate(columns):
            step = fitted[f"c{i}"]
            if hasattr(step, "categories_"):
                codes.append(ColumnCode(name=col, kind="categorical",
                                        categories=tuple(str(v) for v in step.categories_[0])))
            else:
                imp, sc = step.named_steps["impute"], step.named_steps["scale"]
                fill = float(imp.statistics_[0])
                codes.append(ColumnCode(name=col, kind="numeric",
                                        fill=0.0 if np.isnan(fill) else fill,
                                        mean=float(sc.mean_[0]), scale=float(sc.scale_[0])))
        return cls(columns=tuple(codes), missing=missing)

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Encode ``frame``'s columns: ``(len(frame), width)`` float32, C-contiguous.

        Raises:
            parties.data.UnknownColumn: a column is missing from ``frame``.
            parties.data.DataError: a numeric column has infinite values.
        """
        from parties.data import DataError, UnknownColumn

        absent = [c.name for c in self.columns if c.name not in frame.columns]
        if absent:
            raise UnknownColumn(absent, list(frame.columns))
        parts: list[np.ndarray] = []
        for c in self.columns:
            series = frame[c.name]
            if c.kind == "numeric":
                x = series.to_numpy(dtype=np.float64, na_value=np.nan).copy()
                if np.isinf(x).any():
                    raise DataError(f"numeric column {c.name!r} contains infinite values")
                x[np.isnan(x)] = c.fill
                x -= c.mean
                x /= c.scale
                parts.append(x[:, None])
            else:
                values = series.astype(object)
                values = values.where(values.notna(), self.missing).astype(str).to_numpy()
                cats = np.asarray(c.categories, dtype=object)
                parts.append((values[:, None] == cats[None, :]).astype(np.float64))
        out = np.hstack(parts) if parts else np.empty((len(frame), 0))
        return np.ascontiguousarray(out, dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (:meth:`from_dict` reads it back)."""
        cols: list[dict[str, Any]] = []
        for c in self.columns:
            if c.kind == "numeric":
                cols.append({"name": c.name, "kind": "numeric", "fill": c.fill,
                             "mean": c.mean, "scale": c.scale})
            else:
                cols.append({"name": c.name, "kind": "categorical",
                             "categories": list(c.categories)})
        return {"format": ENCODER_FORMAT, "kind": "fitted", "missing": self.missing,
                "columns": cols}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FittedEncoder:
        """Read :meth:`to_dict` output.

        Raises:
            EncoderFormatError: another format version or a malformed entry.
        """
        if data.get("format") != ENCODER_FORMAT or data.get("kind") != "fitted":
            raise EncoderFormatError(f"format {data.get('format')!r} kind "
                                     f"{data.get('kind')!r}, expected {ENCODER_FORMAT} fitted")
        codes = []
        try:
            for c in data["columns"]:
                if c["kind"] == "numeric":
                    codes.append(ColumnCode(name=str(c["name"]), kind="numeric",
                                            fill=float(c["fill"]), mean=float(c["mean"]),
                                            scale=float(c["scale"])))
                elif c["kind"] == "categorical":
                    codes.append(ColumnCode(name=str(c["name"]), kind="categorical",
                                            categories=tuple(str(v) for v in c["categories"])))
                else:
                    raise EncoderFormatError(f"column kind {c['kind']!r}")
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, EncoderFormatError):
                raise
            raise EncoderFormatError(f"malformed column entry ({exc!r})") from None
        return cls(columns=tuple(codes), missing=str(data.get("missing", "__missing__")))


__all__ = ["ENCODER_FORMAT", "ColumnCode", "EncoderFormatError", "FittedEncoder"]
