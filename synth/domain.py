"""Discrete domains, schema inference, encoding and marginal counts (pure logic, no I/O).

The public-domain path
----------------------
:func:`infer_schema` derives categorical levels and numeric bin edges from a table.
FedForge treats the resulting domain as **public**: no privacy budget is spent on
it, and it is not differentially private. Use it on data whose value sets and
ranges are public (a data dictionary, a public sample, or a schema agreed between
parties), or fix the edges by hand. Every party must hold the same schema; compare
:meth:`Schema.fingerprint` / :meth:`Domain.fingerprint` across parties with
:func:`check_same_domain`.

Column rules
------------
* Categorical: ``object``, ``string``, ``category`` or ``bool`` dtype, or a numeric
  column with at most ``numeric_bins`` distinct values (each value is then its own
  level, which is exact and no coarser than binning it). Levels are the values'
  canonical strings (integral numbers print without ``.0``), sorted as strings for
  text columns and by value for numeric ones. Missing values of a text column
  become the level ``"<missing>"`` (so decoded output never holds None/NaN).
* Numeric: every other int or float column, cut into at most ``numeric_bins`` bins
  by ``binning``: ``"quantile"`` (edges at the quantiles, duplicates dropped) or
  ``"uniform"`` (equal widths). The first and last edges are the column's min and
  max. Integer columns get integer edges, so every bin holds at least one integer.
  Bin ``i`` is ``[edges[i], edges[i+1])``; the last bin also holds ``edges[-1]``.
* Zero-inflated / heavily tied numeric columns (``"quantile"`` only): if, after the
  duplicate edges are dropped, fewer than 2 bins remain, or a single value ``v`` holds
  more than ``1/numeric_bins`` of the rows, every such dominant value (the mode if the
  edges collapsed without one) gets a bin of its own, ``[v, succ(v))`` with
  ``succ(v) = v + 1`` for integer columns (the next float above ``v`` otherwise), so
  it decodes to ``v`` exactly; the next bin starts at ``succ(v)`` and holds the next
  data value. The remaining rows are cut at their own quantiles (``inverted_cdf``:
  edges are data values, so no bin is empty) into at most ``numeric_bins − 1``
  further bins, fewer if needed to keep the total at most ``numeric_bins``. Adult's
  ``capital-gain`` (92 % zeros) becomes ``[0, 1), [1, q1), [q1, q2), …`` where the
  ``q`` are quantiles of the non-zero gains; ``hours-per-week`` gets ``[40, 41)``.
  If the maximum is dominant its closed last bin is ``[max − 0.5, max]`` (integer
  columns; the only non-integer edge made) or ``[prev_float(max), max]``.
* Decoding draws within a bin and never leaves ``[edges[0], edges[-1]]`` (the column's
  min and max for inferred schemas).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

Clique = tuple[str, ...]

MISSING_LEVEL = "<missing>"
#: The catch-all level of a declared (public) categorical column: any value not among the
#: declared levels, missing ones included, encodes to it, so the encoding of one record
#: never depends on which values the other records hold.
OTHER_LEVEL = "__other__"
DEFAULT_MAX_CELLS = 5_000_000
Binning = Literal["quantile", "uniform"]


# ---------------------------------------------------------------------------- errors
class DomainError(ValueError):
    """A column or domain problem.

    Attributes:
        column: the offending column (None if the problem is not one column's; the
            first of ``columns`` when several share the problem).
        columns: every offending column, in table order (``(column,)`` for one, empty
            when the problem is no column's): a NaN check names them all at once.
        reason: what is wrong, naming the offending value.
    """

    def __init__(self, reason: str, *, column: str | None = None,
                 columns: tuple[str, ...] = ()) -> None:
        self.columns = tuple(columns) or ((column,) if column is not None else ())
        self.column = column if column is not None else (self.columns[0] if self.columns
                                                         else None)
        self.reason = reason
        if len(self.columns) > 1:
            super().__init__(f"{len(self.columns)} columns {list(self.columns)!r}: {reason}")
        else:
            super().__init__(f"column {self.column!r}: {reason}" if self.column is not None
                             else reason)


class DomainMismatch(DomainError):
    """Parties hold different domains.

    Attributes:
        groups: fingerprint -> the parties holding it.
        differing: the parties whose fingerprint is not the majority's.
    """

    def __init__(self, reason: str, *, groups: Mapping[str, tuple[str, ...]],
                 differing: tuple[str, ...]) -> None:
        self.groups = dict(groups)
        self.differing = differing
        super().__init__(reason)


class DomainTooLarge(DomainError):
    """A clique's marginal would have more cells than allowed.

    Attributes:
        clique: the clique.
        cells: its number of cells.
        max_cells: the limit.
    """

    def __init__(self, *, clique: Clique, cells: int, max_cells: int) -> None:
        self.clique = clique
        self.cells = cells
        self.max_cells = max_cells
        super().__init__(f"the marginal of clique {clique!r} has {cells:,} cells, more than "
                         f"max_cells={max_cells:,}; coarsen its columns or drop the clique")


# ---------------------------------------------------------------------------- domain
def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Domain:
    """Named discrete attributes and their sizes; attribute ``a`` takes values 0..size-1.

    Raises:
        DomainError: lengths differ, a name is repeated or empty, or a size is < 1.
    """

    attributes: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        attrs, sizes = tuple(self.attributes), tuple(self.sizes)
        if len(attrs) != len(sizes):
            raise DomainError(f"{len(attrs)} attributes but {len(sizes)} sizes")
        seen: set[str] = set()
        for a, s in zip(attrs, sizes, strict=True):
            if not isinstance(a, str) or not a:
                raise DomainError(f"attribute names must be non-empty strings, got {a!r}")
            if a in seen:
                raise DomainError("attribute repeated in the domain", column=a)
            seen.add(a)
            if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1:
                raise DomainError(f"size must be an integer >= 1, got {s!r}", column=a)
        object.__setattr__(self, "attributes", attrs)
        object.__setattr__(self, "sizes", tuple(int(s) for s in sizes))

    def __contains__(self, attr: object) -> bool:
        return attr in self.attributes

    def __len__(self) -> int:
        return len(self.attributes)

    def index(self, attr: str) -> int:
        """Position of ``attr``. Raises DomainError if it is not in the domain."""
        try:
            return self.attributes.index(attr)
        except ValueError:
            raise DomainError(f"not in the domain {self.attributes!r}", column=attr) from None

    def _check_clique(self, clique: Iterable[str]) -> Clique:
        c = tuple(clique)
        if len(set(c)) != len(c):
            raise DomainError(f"clique {c!r} repeats an attribute")
        for a in c:
            self.index(a)
        return c

    def size(self, clique: Iterable[str] | None = None) -> int:
        """Cells of the marginal over ``clique`` (all attributes if None), as a Python int.

        Raises:
            DomainError: an unknown or repeated attribute.
        """
        c = self.attributes if clique is None else self._check_clique(clique)
        return math.prod(self.sizes[self.index(a)] for a in c)

    def shape(self, clique: Iterable[str]) -> tuple[int, ...]:
        """The marginal's array shape: the sizes of ``clique``'s attributes, in its order."""
        c = self._check_clique(clique)
        return tuple(self.sizes[self.index(a)] for a in c)

    def project(self, clique: Iterable[str]) -> Domain:
        """The sub-domain over ``clique``, in the clique's order."""
        c = self._check_clique(clique)
        return Domain(attributes=c, sizes=self.shape(c))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form: ``{"attributes": [...], "sizes": [...]}``."""
        return {"attributes": list(self.attributes), "sizes": list(self.sizes)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Domain:
        """Inverse of :meth:`to_dict`. Raises DomainError on a malformed dict."""
        try:
            return cls(attributes=tuple(d["attributes"]), sizes=tuple(d["sizes"]))
        except (KeyError, TypeError) as e:
            raise DomainError(f"malformed domain dict: {e!r}") from e

    def fingerprint(self) -> str:
        """sha256 hex digest of the canonical JSON of :meth:`to_dict` (stable across runs)."""
        return hashlib.sha256(_canonical_json(self.to_dict()).encode()).hexdigest()


# ---------------------------------------------------------------------------- schema
@dataclass(frozen=True, slots=True, kw_only=True)
class ColumnSpec:
    """How one column maps to a discrete attribute.

    Attributes:
        name: column name.
        kind: ``"categorical"`` or ``"numeric"``.
        levels: categorical levels (canonical strings), in code order.
        edges: numeric bin edges, ``n_bins + 1`` strictly increasing finite floats.
        integer: numeric values (or numeric-valued levels) are integers; decoding keeps them so.
        dtype: the source column's dtype name, used to cast decoded values back
            (``"object"`` for text).
        fill: numeric columns of a declared domain: the value a NaN encodes as (None: a
            NaN is an error).

    Raises:
        DomainError: an inconsistent spec.
    """

    name: str
    kind: Literal["categorical", "numeric"]
    levels: tuple[str, ...] = ()
    edges: tuple[float, ...] = ()
    integer: bool = False
    dtype: str = "object"
    fill: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(str(v) for v in self.levels))
        object.__setattr__(self, "edges", tuple(float(e) for e in self.edges))
        if self.kind == "categorical":
            if len(self.levels) < 1 or self.edges:
                raise DomainError("a categorical column needs levels and no edges",
                                  column=self.name)
            if len(set(self.levels)) != len(self.levels):
                raise DomainError(f"repeated levels {self.levels!r}", column=self.name)
        elif self.kind == "numeric":
            e = self.edges
            if len(e) < 2 or self.levels:
                raise DomainError("a numeric column needs at least two edges and no levels",
                                  column=self.name)
            if not all(math.isfinite(x) for x in e) or any(b <= a for a, b in zip(e[:-1], e[1:], strict=True)):
                raise DomainError(f"edges must be finite and strictly increasing, got {e!r}",
                                  column=self.name)
        else:
            raise DomainError(f"kind must be 'categorical' or 'numeric', got {self.kind!r}",
                              column=self.name)

    @property
    def n_cells(self) -> int:
        """Number of codes: levels, or bins (``len(edges) - 1``)."""
        return len(self.levels) if self.kind == "categorical" else len(self.edges) - 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        out = {"name": self.name, "kind": self.kind, "levels": list(self.levels),
               "edges": list(self.edges), "integer": self.integer, "dtype": self.dtype}
        if self.fill is not None:
            out["fill"] = self.fill
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ColumnSpec:
        """Inverse of :meth:`to_dict`."""
        try:
            fill = d.get("fill")
            return cls(name=d["name"], kind=d["kind"], levels=tuple(d.get("levels", ())),
                       edges=tuple(d.get("edges", ())), integer=bool(d.get("integer", False)),
                       dtype=str(d.get("dtype", "object")),
                       fill=None if fill is None else float(fill))
        except (KeyError, TypeError) as e:
            raise DomainError(f"malformed column spec: {e!r}") from e


@dataclass(frozen=True, slots=True, kw_only=True)
class Schema:
    """The ordered column specs and the :class:`Domain` they imply (``domain``, derived)."""

    columns: tuple[ColumnSpec, ...]
    domain: Domain = field(init=False)

    def __post_init__(self) -> None:
        cols = tuple(self.columns)
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "domain", Domain(attributes=tuple(c.name for c in cols),
                                                  sizes=tuple(c.n_cells for c in cols)))

    @property
    def names(self) -> tuple[str, ...]:
        return self.domain.attributes

    def column(self, name: str) -> ColumnSpec:
        """The spec of ``name``. Raises DomainError if unknown."""
        return self.columns[self.domain.index(name)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form: ``{"columns": [...]}``."""
        return {"columns": [c.to_dict() for c in self.columns]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Schema:
        """Inverse of :meth:`to_dict`."""
        try:
            return cls(columns=tuple(ColumnSpec.from_dict(c) for c in d["columns"]))
        except (KeyError, TypeError) as e:
            raise DomainError(f"malformed schema dict: {e!r}") from e

    def fingerprint(self) -> str:
        """sha256 hex of the canonical JSON of the whole schema (levels and edges included)."""
        return hashlib.sha256(_canonical_json(self.to_dict()).encode()).hexdigest()


# ---------------------------------------------------------------------------- inference
def _is_text(s: pd.Series) -> bool:
    return (pd.api.types.is_object_dtype(s.dtype) or pd.api.types.is_string_dtype(s.dtype)
            or isinstance(s.dtype, pd.CategoricalDtype))


def _level_str(v: Any) -> str:
    """Canonical string of one value: integral numbers without '.0', floats by repr."""
    if isinstance(v, bool | np.bool_):
        return str(bool(v))
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, float | np.floating):
        f = float(v)
        return str(int(f)) if f.is_integer() else repr(f)
    return str(v)


def _text_strings(s: pd.Series) -> pd.Series:
    """Canonical strings of a text column; missing values become MISSING_LEVEL."""
    obj = s.astype(object)
    miss = obj.isna()
    out = obj.map(_level_str)
    out[miss] = MISSING_LEVEL
    return out


def _numeric_edges(x: np.ndarray, bins: int, binning: str, integer: bool) -> tuple[float, ...]:
    lo, hi = float(x.min()), float(x.max())
    if binning == "quantile":
        edges = np.quantile(x.astype(np.float64), np.linspace(0.0, 1.0, bins + 1))
    else:
        edges = np.linspace(lo, hi, bins + 1)
    if integer:
        edges = np.round(edges)
    edges[0], edges[-1] = lo, hi
    out = tuple(float(e) for e in np.unique(edges))
    if binning == "quantile":
        _, counts = np.unique(x, return_counts=True)
        if len(out) < 3 or int(counts.max()) * bins > x.size:
            return _isolating_edges(x.astype(np.float64), bins, integer)
    return out


def _successor(v: float, integer: bool) -> float:
    """The upper edge of a bin that holds ``v`` alone: ``v + 1`` for integer columns (the
    integer decoder then draws ``v`` exactly), else the next float above ``v``."""
    return v + 1.0 if integer else float(np.nextafter(v, np.inf))


def _predecessor(v: float, integer: bool) -> float:
    """The lower edge of a closed last bin ``[p, v]`` that holds the maximum ``v`` alone:
    ``v − 0.5`` for integer columns (the one non-integer edge this module makes; the
    integer decoder draws ``ceil(v − 0.5) = v``), else the next float below ``v``."""
    return v - 0.5 if integer else float(np.nextafter(v, -np.inf))


def _starts_with_isolated(vals: np.ndarray, heavy: np.ndarray, rest: np.ndarray, k: int,
                          integer: bool) -> list[float]:
    """Sorted bin lower edges: ``k`` quantile bins over ``rest`` plus one bin per heavy value.

    Every start is a data value (``inverted_cdf`` quantiles), a heavy value's successor
    (the bin then holds the next data value) or the maximum's predecessor, so no bin is
    empty. ``vals`` are the sorted distinct values, ``heavy`` a boolean mask over them.
    """
    starts: set[float] = set()
    if rest.size:
        q = np.quantile(rest, np.linspace(0.0, 1.0, k + 1)[:-1], method="inverted_cdf")
        starts.update(float(v) for v in q)
    pos = np.flatnonzero(heavy)
    starts.update(float(v) for v in vals[pos])
    for p in pos:
        if p + 1 >= vals.size or heavy[p + 1]:
            continue  # the max, or the next value is a heavy start itself
        # the next value starts a new bin; start it just above the heavy value instead
        # (no data lies in between), so the heavy bin decodes to the value exactly
        starts.discard(float(vals[p + 1]))
        starts.add(_successor(float(vals[p]), integer))
    s = sorted(starts)
    hi = float(vals[-1])
    if s[-1] >= hi:  # the maximum starts a bin: close the bin just below it if the
        # maximum is heavy, else merge it into the bin below (integer edges kept)
        pred = _predecessor(hi, integer)
        if not heavy[-1] or pred >= hi or (len(s) >= 2 and pred <= s[-2]):
            s.pop()
        else:
            s[-1] = pred
    return s


def _isolating_edges(x: np.ndarray, bins: int, integer: bool) -> tuple[float, ...]:
    """Quantile edges that give each dominant value its own bin (see :func:`infer_schema`).

    Heavy values are those holding more than ``1/bins`` of the rows (the mode if none
    does). Each gets a bin ``[v, succ(v))``; the remaining rows get quantile bins,
    as many as keep the total at most ``bins`` (fewer rest bins first, then fewer
    isolated values, least frequent dropped first).
    """
    vals, counts = np.unique(x, return_counts=True)
    n = x.size
    heavy_idx = np.flatnonzero(counts * bins > n)
    if heavy_idx.size == 0:
        heavy_idx = np.array([int(np.argmax(counts))])
    heavy_idx = heavy_idx[np.argsort(-counts[heavy_idx], kind="stable")]
    lo, hi = float(vals[0]), float(vals[-1])
    for m in range(heavy_idx.size, 0, -1):
        heavy = np.zeros(vals.size, dtype=bool)
        heavy[heavy_idx[:m]] = True
        rest = np.repeat(vals[~heavy], counts[~heavy])  # sorted, as vals are
        for k in range(max(1, bins - m), 0, -1):
            starts = _starts_with_isolated(vals, heavy, rest, k, integer)
            if len(starts) <= bins:
                return tuple(starts) + (hi,)
    # bins too small to isolate anything (bins = 2 and an interior mode): split at it
    v = float(vals[heavy_idx[0]])
    mid = v if v > lo else _successor(v, integer)
    if mid >= hi:
        mid = _predecessor(hi, integer)
    return (lo, mid, hi) if lo < mid < hi else (lo, hi)


def infer_schema(df: pd.DataFrame, *, numeric_bins: int = 10, binning: Binning = "quantile",
                 max_levels: int = 100, columns: Sequence[str] | None = None) -> Schema:
    """Infer a public discrete schema from a table (no privacy budget is spent).

    See the module docstring for the column rules. Zero-inflated / heavily tied
    numeric columns (``"quantile"``): compute the quantile edges; if after dropping
    duplicates fewer than 2 bins remain, or a single value ``v`` holds more than
    ``1/numeric_bins`` of the rows, ``v`` (each such value; the mode if the edges
    collapsed) gets its own bin ``[v, v + 1)`` (integer columns; ``[v, next float)``
    otherwise), and the other rows are cut at their own quantiles into at most
    ``numeric_bins − 1`` further bins, never more than ``numeric_bins`` in total. Adult's
    ``capital-gain`` becomes ``[0, 1), [1, q1), [q1, q2), …``: zeros alone in bin 0,
    decoded as exactly 0.

    Args:
        df: the table (one row per record).
        numeric_bins: the most bins of a numeric column (≥ 2); also the most distinct
            values for which a numeric column is made categorical.
        binning: ``"quantile"`` or ``"uniform"``.
        max_levels: the most levels a categorical column may have.
        columns: the columns to use, in order (default all, in table order).

    Returns:
        The :class:`Schema`.

    Raises:
        DomainError: an empty frame, an unknown column, a column with a single distinct
            value, numeric columns containing NaN (or ±inf; every one named in one error,
            :attr:`DomainError.columns`), a categorical column with
            more than ``max_levels`` levels, or an unsupported dtype (datetime, complex).
        ValueError: bad ``numeric_bins``, ``binning`` or ``max_levels``.
    """
    if isinstance(numeric_bins, bool) or not isinstance(numeric_bins, int) or numeric_bins < 2:
        raise ValueError(f"numeric_bins must be an integer >= 2, got {numeric_bins!r}")
    if binning not in ("quantile", "uniform"):
        raise ValueError(f"binning must be 'quantile' or 'uniform', got {binning!r}")
    if isinstance(max_levels, bool) or not isinstance(max_levels, int) or max_levels < 2:
        raise ValueError(f"max_levels must be an integer >= 2, got {max_levels!r}")
    names = list(df.columns) if columns is None else list(columns)
    if len(df) == 0 or not names:
        raise DomainError(f"empty frame ({len(df)} rows, {len(names)} columns)")
    missing = [str(n) for n in names if n not in df.columns]
    if missing:
        raise DomainError("not in the frame", columns=tuple(missing))
    nonfinite = {str(n): c for n in names if (c := _nonfinite_numeric(df[n]))}
    if nonfinite:
        raise DomainError(
            "numeric column(s) with NaN or infinite values: "
            + ", ".join(f"{k!r} ({c} NaN or infinite of {len(df)} rows)"
                        for k, c in nonfinite.items())
            + "; impute or drop them first", columns=tuple(nonfinite))
    specs: list[ColumnSpec] = []
    for name in names:
        specs.append(_infer_column(str(name), df[name], numeric_bins=numeric_bins,
                                   binning=binning, max_levels=max_levels))
    return Schema(columns=tuple(specs))


def _nonfinite_numeric(s: pd.Series) -> int:
    """The NaN / infinite values of a column :func:`_infer_column` reads as numeric
    (0 for any other column)."""
    if _is_text(s) or pd.api.types.is_bool_dtype(s.dtype) or not (
            pd.api.types.is_integer_dtype(s.dtype) or pd.api.types.is_float_dtype(s.dtype)):
        return 0
    return int((~np.isfinite(s.to_numpy(dtype=np.float64, na_value=np.nan))).sum())


def _infer_column(name: str, s: pd.Series, *, numeric_bins: int, binning: str,
                  max_levels: int) -> ColumnSpec:
    if pd.api.types.is_bool_dtype(s.dtype) and not s.isna().any():
        levels = sorted(set(_level_str(v) for v in s.unique()))
        return _categorical(name, levels, max_levels, dtype="bool")
    if _is_text(s) or pd.api.types.is_bool_dtype(s.dtype):
        levels = sorted(set(_text_strings(s).unique()))
        return _categorical(name, levels, max_levels, dtype="object")
    if not (pd.api.types.is_integer_dtype(s.dtype) or pd.api.types.is_float_dtype(s.dtype)):
        raise DomainError(f"unsupported dtype {s.dtype}; convert it to numbers or strings",
                          column=name)
    x = s.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(x)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise DomainError(f"numeric column has {int(bad.sum())} NaN or infinite value(s) of "
                          f"{len(x)} rows (first at row {first}: {float(x[first])!r}); impute or drop "
                          f"them first", column=name)
    integer = bool(pd.api.types.is_integer_dtype(s.dtype) or np.all(x == np.round(x)))
    dtype = "int64" if pd.api.types.is_integer_dtype(s.dtype) else "float64"
    distinct = np.unique(x)
    if distinct.size == 1:
        raise DomainError(f"has a single distinct value {_level_str(distinct[0])!r}; "
                          f"drop it (it carries no information)", column=name)
    if distinct.size <= numeric_bins:
        levels = [_level_str(v) for v in distinct]  # np.unique sorts by value
        spec = _categorical(name, levels, max_levels, dtype=dtype)
        return ColumnSpec(name=name, kind="categorical", levels=spec.levels, integer=integer,
                          dtype=dtype)
    edges = _numeric_edges(x, numeric_bins, binning, integer)
    return ColumnSpec(name=name, kind="numeric", edges=edges, integer=integer, dtype=dtype)


def _categorical(name: str, levels: list[str], max_levels: int, *, dtype: str) -> ColumnSpec:
    if len(levels) == 1:
        raise DomainError(f"has a single distinct value {levels[0]!r}; drop it "
                          f"(it carries no information)", column=name)
    if len(levels) > max_levels:
        raise DomainError(f"categorical column has {len(levels)} levels, more than "
                          f"max_levels={max_levels} (e.g. {levels[:3]!r}); coarsen it, drop it "
                          f"or raise max_levels", column=name)
    return ColumnSpec(name=name, kind="categorical", levels=tuple(levels), dtype=dtype)


# ---------------------------------------------------------------------------- encode / decode
def encode(df: pd.DataFrame, schema: Schema) -> np.ndarray:
    """Map a table onto the schema's codes.

    Args:
        df: a table holding (at least) the schema's columns.
        schema: the shared schema.

    Returns:
        ``(n, d)`` int32 codes, column j in ``[0, schema.domain.sizes[j])``: a categorical
        level's index, or a numeric bin's index (values below the first edge go to bin
        0, values above the last edge to the last bin).

    Raises:
        DomainError: a missing column, a categorical value not among the levels (named),
            or NaN in numeric columns (every such column named, :attr:`DomainError.columns`).
    """
    n = len(df)
    out = np.empty((n, len(schema.columns)), dtype=np.int32)
    absent = tuple(spec.name for spec in schema.columns if spec.name not in df.columns)
    if absent:
        raise DomainError("not in the frame", columns=absent)
    nan_counts: dict[str, int] = {}
    for j, spec in enumerate(schema.columns):
        s = df[spec.name]
        if spec.kind == "categorical":
            strings = (_text_strings(s) if spec.dtype == "object" else s.astype(object).map(
                lambda v: MISSING_LEVEL if pd.isna(v) else _level_str(v)))
            lookup = {lv: i for i, lv in enumerate(spec.levels)}
            codes = strings.map(lookup)
            unseen = codes.isna().to_numpy()
            if unseen.any() and OTHER_LEVEL in lookup:
                codes = codes.fillna(lookup[OTHER_LEVEL])
                unseen = np.zeros(n, dtype=bool)
            if unseen.any():
                vals = sorted(set(strings[unseen]))
                raise DomainError(f"{int(unseen.sum())} value(s) not among the schema's levels, "
                                  f"e.g. {vals[:5]!r}", column=spec.name)
            out[:, j] = codes.to_numpy(dtype=np.int64)
        else:
            try:
                x = s.to_numpy(dtype=np.float64, na_value=np.nan)
            except (TypeError, ValueError) as e:
                raise DomainError(f"values are not numeric: {e}", column=spec.name) from e
            nan = np.isnan(x)
            if nan.any() and spec.fill is not None:
                x = np.where(nan, spec.fill, x)
                nan = np.zeros(n, dtype=bool)
            if nan.any():
                nan_counts[spec.name] = int(nan.sum())
                continue
            edges = np.asarray(spec.edges)
            idx = np.searchsorted(edges, x, side="right") - 1
            out[:, j] = np.clip(idx, 0, spec.n_cells - 1)
    if nan_counts:
        raise DomainError("numeric column(s) with NaN values and no declared fill: "
                          + ", ".join(f"{k!r} ({c} NaN of {n} rows)"
                                      for k, c in nan_counts.items()),
                          columns=tuple(nan_counts))
    return out


def decode(codes: np.ndarray, schema: Schema, rng: np.random.Generator) -> pd.DataFrame:
    """Map codes back to values.

    Categorical codes become their levels (cast back to the source dtype: bool, int,
    float or str). A numeric bin becomes a value drawn uniformly in ``[edge_i, edge_{i+1})``
    (the last bin includes its upper edge); integer columns draw a uniform integer in
    the bin, so ``encode(decode(c)) == c``.

    Args:
        codes: ``(n, d)`` integer codes.
        schema: the schema they were encoded with.
        rng: generator for the within-bin draws.

    Returns:
        A DataFrame with the schema's columns, no missing values.

    Raises:
        DomainError: wrong shape, or a code out of range (the column is named).
    """
    c = np.asarray(codes)
    d = len(schema.columns)
    if c.ndim != 2 or c.shape[1] != d:
        raise DomainError(f"codes must have shape (n, {d}), got {c.shape}")
    if c.size and c.dtype.kind not in "iu":
        raise DomainError(f"codes must be integers, got dtype {c.dtype}")
    cols: dict[str, Any] = {}
    for j, spec in enumerate(schema.columns):
        col = c[:, j].astype(np.int64)
        if col.size and (col.min() < 0 or col.max() >= spec.n_cells):
            bad = col[(col < 0) | (col >= spec.n_cells)][0]
            raise DomainError(f"code {int(bad)} out of range [0, {spec.n_cells})",
                              column=spec.name)
        if spec.kind == "categorical":
            cols[spec.name] = _cast_levels(spec)[col]
        else:
            cols[spec.name] = _draw_in_bins(col, spec, rng)
    return pd.DataFrame(cols)


def _cast_levels(spec: ColumnSpec) -> np.ndarray:
    if spec.dtype == "bool":
        return np.array([lv == "True" for lv in spec.levels], dtype=bool)
    if spec.dtype.startswith(("int", "uint")):
        return np.array([int(lv) for lv in spec.levels], dtype=np.int64)
    if spec.dtype.startswith("float"):
        return np.array([float(lv) for lv in spec.levels], dtype=np.float64)
    return np.array(spec.levels, dtype=object)


def _draw_in_bins(col: np.ndarray, spec: ColumnSpec, rng: np.random.Generator) -> np.ndarray:
    edges = np.asarray(spec.edges)
    lo, hi = edges[col], edges[col + 1]
    last = col == spec.n_cells - 1
    if spec.integer:
        # integers in [ceil(lo), hi) (hi included for the last bin); edges are integers
        # for inferred integer columns (or x.5 below a dominant maximum), so every bin
        # holds at least one
        first = np.ceil(lo)
        stop = np.where(last, np.floor(hi) + 1, np.ceil(hi))
        count = np.maximum(stop - first, 1)
        vals = first + np.floor(rng.random(col.size) * count)
        vals = np.minimum(vals, stop - 1)
        # never leave [min, max] of the column, even for a hand-made bin without integers
        lo_int, hi_int = math.ceil(edges[0]), math.floor(edges[-1])
        if lo_int <= hi_int:
            vals = np.clip(vals, lo_int, hi_int)
        return vals.astype(np.int64) if spec.dtype.startswith(("int", "uint")) else vals
    vals = lo + (hi - lo) * rng.random(col.size)
    # keep the draw strictly below the upper edge (rounding) except in the last bin
    vals = np.where(last, np.minimum(vals, hi), np.minimum(vals, np.nextafter(hi, -np.inf)))
    return np.clip(vals, edges[0], edges[-1])


# ---------------------------------------------------------------------------- parties agree
def check_same_domain(fingerprints: Mapping[str, str]) -> None:
    """Check that every party reports the same domain fingerprint.

    Args:
        fingerprints: party name -> its :meth:`Domain.fingerprint` (or
            :meth:`Schema.fingerprint`).

    Raises:
        DomainMismatch: the fingerprints differ; names the parties that differ from the
            most common fingerprint (ties: the one the first party in the mapping holds).
    """
    groups: dict[str, list[str]] = {}
    for party, fp in fingerprints.items():
        groups.setdefault(fp, []).append(party)
    if len(groups) <= 1:
        return
    counts = Counter({fp: len(ps) for fp, ps in groups.items()})
    top = max(counts.values())
    majority = next(fp for fp in groups if counts[fp] == top)
    differing = tuple(p for fp, ps in groups.items() if fp != majority for p in ps)
    desc = "; ".join(f"{fp[:12]}… held by {', '.join(ps)}" for fp, ps in groups.items())
    raise DomainMismatch(f"parties {', '.join(differing)} hold a different domain from the "
                         f"majority ({', '.join(groups[majority])}): {desc}",
                         groups={fp: tuple(ps) for fp, ps in groups.items()},
                         differing=differing)


# ---------------------------------------------------------------------------- marginals
def check_clique_size(domain: Domain, clique: Iterable[str], *,
                      max_cells: int = DEFAULT_MAX_CELLS) -> int:
    """Refuse a clique whose marginal would be too large, before allocating anything.

    Returns:
        The clique's number of cells.

    Raises:
        DomainTooLarge: more than ``max_cells`` cells.
        DomainError: an unknown or repeated attribute.
    """
    c = tuple(clique)
    cells = domain.size(c)
    if cells > max_cells:
        raise DomainTooLarge(clique=c, cells=cells, max_cells=max_cells)
    return cells


def marginal(codes: np.ndarray, domain: Domain, clique: Iterable[str], *,
             max_cells: int = DEFAULT_MAX_CELLS) -> np.ndarray:
    """Counts of the records in each cell of a clique's marginal.

    Vectorised: ``np.ravel_multi_index`` then ``np.bincount(minlength=cells)``.

    Args:
        codes: ``(n, len(domain))`` integer codes (from :func:`encode`).
        domain: their domain.
        clique: the attributes, in the order of the output's axes.
        max_cells: refuse larger marginals (:func:`check_clique_size`).

    Returns:
        float64 array of shape ``domain.shape(clique)`` summing to n (a 0-d array holding
        n for the empty clique).

    Raises:
        DomainTooLarge: the marginal would exceed ``max_cells``.
        DomainError: bad codes shape, an unknown attribute, or a code out of range.
    """
    c = tuple(clique)
    cells = check_clique_size(domain, c, max_cells=max_cells)
    arr = np.asarray(codes)
    if arr.ndim != 2 or arr.shape[1] != len(domain):
        raise DomainError(f"codes must have shape (n, {len(domain)}), got {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise DomainError(f"codes must be integers, got dtype {arr.dtype}")
    shape = domain.shape(c)
    if not c:
        return np.array(float(arr.shape[0]))
    cols = []
    for a, size in zip(c, shape, strict=True):
        col = arr[:, domain.index(a)]
        if col.size and (col.min() < 0 or col.max() >= size):
            raise DomainError(f"codes out of range [0, {size}): min {int(col.min())}, "
                              f"max {int(col.max())}", column=a)
        cols.append(col)
    flat = np.ravel_multi_index(tuple(cols), shape)
    return np.bincount(flat, minlength=cells).astype(np.float64).reshape(shape)


def marginals(codes: np.ndarray, domain: Domain, cliques: Iterable[Iterable[str]], *,
              max_cells: int = DEFAULT_MAX_CELLS) -> dict[Clique, np.ndarray]:
    """:func:`marginal` of each clique, keyed by the clique tuple.

    Every clique's size is checked before any counting, so a too-large clique fails fast.

    Raises:
        DomainTooLarge, DomainError: as :func:`marginal`.
    """
    cl = [tuple(c) for c in cliques]
    for c in cl:
        check_clique_size(domain, c, max_cells=max_cells)
    return {c: marginal(codes, domain, c, max_cells=max_cells) for c in cl}
