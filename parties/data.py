"""Tabular data layer for two-party vertical federated learning.

In the vertical setting both parties hold the *same rows* (aligned by row
index) but *different columns*: the active party owns the label and some
feature columns, the passive party owns the remaining feature columns and
never sees the label.  This module provides everything either party needs to
turn a table into model-ready arrays:

* :func:`load_table` reads a bundled dataset (``"bank"``) or a user file
  (``.csv``, ``.csv.gz``, ``.parquet``) into a :class:`pandas.DataFrame`.
* :func:`default_split` / :func:`validate_split` decide and check which
  feature columns belong to which party.
* :func:`train_test_indices` produces a seeded, label-free train/test split
  so that both parties can compute the identical split independently.
* :func:`encode_party_features` one-hot encodes categorical columns and
  standardises numeric ones, fitted on the training rows only.
* :func:`encode_labels` turns a binary label column into 0/1 float arrays.

All errors raised on bad input derive from :class:`DataError`, and each one
also derives from the matching built-in exception (``FileNotFoundError``,
``KeyError``, ``ValueError``) so generic handlers keep working.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

__all__ = [
    "BUNDLED",
    "DataError",
    "DatasetNotFound",
    "InvalidLabel",
    "InvalidSplit",
    "PartyFeatures",
    "UnknownColumn",
    "default_split",
    "encode_labels",
    "encode_party_features",
    "load_table",
    "train_test_indices",
    "validate_split",
]

#: Bundled datasets: name -> (resource file name inside ``parties.datasets``, label column).
BUNDLED: dict[str, tuple[str, str]] = {
    "bank": ("bank-full.csv.gz", "y"),
}

_DATASETS_PACKAGE = "parties.datasets"
_MISSING_CATEGORY = "__missing__"
_SUPPORTED_SUFFIXES = (".csv", ".csv.gz", ".parquet")
_MAX_LISTED = 50  # cap on how many available columns an error message lists


# --------------------------------------------------------------------------- errors


class DataError(Exception):
    """Root of data-layer errors."""


class DatasetNotFound(DataError, FileNotFoundError):
    """A dataset file (or bundled resource) does not exist.

    Attributes:
        path: The path (or resource name) that was looked up.
        filename: Same as ``path``, as a string, for ``OSError`` compatibility.
    """

    def __init__(self, path: str | Path, detail: str = "") -> None:
        self.path = str(path)
        message = f"dataset file not found: {self.path}"
        if detail:
            message = f"{message} ({detail})"
        super().__init__(message)
        self.filename = self.path
        self._message = message

    def __str__(self) -> str:
        return self._message


class UnknownColumn(DataError, KeyError):
    """One or more referenced columns are not in the table.

    Attributes:
        columns: The offending column names, in the order given.
        available: The columns the table does have.
    """

    def __init__(self, columns: Sequence[str], available: Sequence[str]) -> None:
        self.columns = tuple(columns)
        self.available = tuple(available)
        names = ", ".join(repr(c) for c in self.columns)
        shown = ", ".join(repr(c) for c in self.available[:_MAX_LISTED])
        if len(self.available) > _MAX_LISTED:
            shown += f", ... ({len(self.available) - _MAX_LISTED} more)"
        noun = "column" if len(self.columns) == 1 else "columns"
        self._message = f"unknown {noun} {names}; available columns: [{shown}]"
        super().__init__(self._message)

    def __str__(self) -> str:  # KeyError would repr-quote the message.
        return self._message


class InvalidSplit(DataError, ValueError):
    """The column split or the train/test split is not usable.

    Raised for overlapping party columns, the label used as a feature, a party
    with no columns, duplicate columns, a ``test_frac`` outside ``(0, 1)`` and
    out-of-range row indices.
    """


class InvalidLabel(DataError, ValueError):
    """The label column cannot be used as a binary target.

    Raised when the label has missing values, more than two classes, or only
    one class among the training rows.
    """


# --------------------------------------------------------------------------- loading


def load_table(dataset: str) -> tuple[pd.DataFrame, str | None]:
    """Load a bundled dataset by name or a user table from a file.

    Args:
        dataset: Either a key of :data:`BUNDLED` (e.g. ``"bank"``) or a path to
            a ``.csv``, ``.csv.gz`` or ``.parquet`` file.

    Returns:
        ``(frame, label)``. For a bundled dataset ``label`` is its label column
        (``"y"`` for ``"bank"``, whose frame is 45,211 rows x 17 columns);
        for a user file ``label`` is ``None`` and the caller names it. Column
        dtypes are whatever pandas infers (``int64``/``float64`` for numbers,
        ``str`` for text under pandas 3).

    Raises:
        DatasetNotFound: The file (or the bundled resource) does not exist.
        DataError: The suffix is not supported, or the file cannot be parsed.
    """
    if dataset in BUNDLED:
        resource_name, label = BUNDLED[dataset]
        resource = resources.files(_DATASETS_PACKAGE).joinpath(resource_name)
        if not resource.is_file():
            raise DatasetNotFound(
                f"{_DATASETS_PACKAGE}/{resource_name}",
                f"bundled dataset {dataset!r} is missing from the installed package",
            )
        with resource.open("rb") as fh:
            frame = pd.read_csv(fh, compression="gzip")
        return frame, label

    path = Path(dataset).expanduser()
    if not path.exists():
        raise DatasetNotFound(path, f"bundled datasets: {', '.join(sorted(BUNDLED))}")
    name = path.name.lower()
    try:
        if name.endswith(".csv") or name.endswith(".csv.gz"):
            frame = pd.read_csv(path)
        elif name.endswith(".parquet"):
            frame = pd.read_parquet(path)
        else:
            raise DataError(
                f"unsupported file type for {str(path)!r}; expected one of "
                f"{', '.join(_SUPPORTED_SUFFIXES)} or a bundled name "
                f"({', '.join(sorted(BUNDLED))})"
            )
    except DataError:
        raise
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot parse {str(path)!r}: {exc}") from exc
    except (OSError, ValueError) as exc:  # e.g. pyarrow.ArrowInvalid, a directory
        raise DataError(f"cannot read {str(path)!r}: {exc}") from exc
    return frame, None


# --------------------------------------------------------------------------- column split


def default_split(columns: Sequence[str], label: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split the feature columns between the two parties.

    Features are all columns except ``label``, in table order; the active
    party gets the first ``ceil(n / 2)`` of them and the passive party the
    rest (for ``bank``: 8 + 8).

    Args:
        columns: All column names of the table, in order.
        label: The label column; it must be one of ``columns``.

    Returns:
        ``(active_columns, passive_columns)``.

    Raises:
        UnknownColumn: ``label`` is not in ``columns``.
        InvalidSplit: Fewer than two feature columns, so a party would be empty.
    """
    columns = list(columns)
    if label not in columns:
        raise UnknownColumn([label], columns)
    features = [c for c in columns if c != label]
    if len(features) < 2:
        raise InvalidSplit(
            f"need at least 2 feature columns to split between two parties, got {features!r}"
        )
    n_active = math.ceil(len(features) / 2)
    return tuple(features[:n_active]), tuple(features[n_active:])


def validate_split(
    columns: Sequence[str], label: str, active: Sequence[str], passive: Sequence[str]
) -> None:
    """Check a column assignment for the two parties.

    Parties need not use every feature column, but the assignment must be
    consistent with the table.

    Args:
        columns: All column names of the table.
        label: The label column (held by the active party, never a feature).
        active: Feature columns of the active party.
        passive: Feature columns of the passive party.

    Raises:
        UnknownColumn: ``label`` or any party column is not in ``columns``.
        InvalidSplit: A party has no columns, lists a column twice, uses the
            label as a feature, or the two parties share a column.
    """
    available = list(columns)
    known = set(available)
    active, passive = list(active), list(passive)
    for party, cols in (("active", active), ("passive", passive)):
        if not cols:
            raise InvalidSplit(f"the {party} party has no feature columns")
    unknown = [c for c in dict.fromkeys([label, *active, *passive]) if c not in known]
    if unknown:
        raise UnknownColumn(unknown, available)
    for party, cols in (("active", active), ("passive", passive)):
        if label in cols:
            raise InvalidSplit(f"label column {label!r} is used as a feature by the {party} party")
    for party, cols in (("active", active), ("passive", passive)):
        dupes = _duplicates(cols)
        if dupes:
            raise InvalidSplit(f"the {party} party lists columns more than once: {dupes!r}")
    passive_set = set(passive)
    overlap = [c for c in active if c in passive_set]
    if overlap:
        raise InvalidSplit(f"columns assigned to both parties: {overlap!r}")


def _duplicates(cols: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    dupes: dict[str, None] = {}
    for c in cols:
        if c in seen:
            dupes[c] = None
        seen.add(c)
    return list(dupes)


# --------------------------------------------------------------------------- row split


def train_test_indices(
    n_rows: int, *, test_frac: float = 0.3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded, label-free train/test split of ``range(n_rows)``.

    The split is deliberately *not* stratified: the passive party has no
    labels and must reproduce exactly the same split from ``(n_rows,
    test_frac, seed)`` alone. A permutation from
    ``np.random.default_rng(seed)`` is drawn; its first
    ``round(n_rows * test_frac)`` entries are the test rows. For very small
    ``n_rows`` either side may therefore be empty.

    Args:
        n_rows: Number of rows (non-negative integer).
        test_frac: Fraction of rows in the test split, strictly in ``(0, 1)``.
        seed: Seed for :func:`numpy.random.default_rng`.

    Returns:
        ``(train_idx, test_idx)``: sorted, disjoint ``int64`` arrays of shapes
        ``(n_rows - n_test,)`` and ``(n_test,)`` whose union is ``range(n_rows)``.

    Raises:
        InvalidSplit: ``test_frac`` is not in ``(0, 1)`` or ``n_rows`` is negative.
        TypeError: ``n_rows`` is not an integer.
    """
    n_rows = operator.index(n_rows)
    if n_rows < 0:
        raise InvalidSplit(f"n_rows must be non-negative, got {n_rows}")
    test_frac = float(test_frac)
    if not 0.0 < test_frac < 1.0:
        raise InvalidSplit(f"test_frac must be in (0, 1), got {test_frac!r}")
    n_test = round(n_rows * test_frac)
    perm = np.random.default_rng(seed).permutation(n_rows)
    test_idx = np.sort(perm[:n_test]).astype(np.int64, copy=False)
    train_idx = np.sort(perm[n_test:]).astype(np.int64, copy=False)
    return train_idx, test_idx


def _check_indices(name: str, idx: np.ndarray, n_rows: int) -> np.ndarray:
    arr = np.asarray(idx)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise InvalidSplit(f"{name} must be a 1-D integer array, got shape {arr.shape} {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() >= n_rows):
        raise InvalidSplit(
            f"{name} has indices outside [0, {n_rows}): min {arr.min()}, max {arr.max()}"
        )
    return arr


# --------------------------------------------------------------------------- features


@dataclass(frozen=True, kw_only=True, slots=True)
class PartyFeatures:
    """Encoded feature matrices of one party.

    Attributes:
        x_train: ``float32``, C-contiguous, shape ``(n_train, d)``.
        x_test: ``float32``, C-contiguous, shape ``(n_test, d)``.
        feature_names: Length ``d``, after one-hot encoding: a numeric column
            keeps its name, a categorical column ``c`` with value ``v`` becomes
            ``"c=v"``.
    """

    x_train: np.ndarray
    x_test: np.ndarray
    feature_names: tuple[str, ...]

    def __post_init__(self) -> None:
        d = len(self.feature_names)
        for name in ("x_train", "x_test"):
            arr = getattr(self, name)
            if arr.ndim != 2 or arr.shape[1] != d:
                raise ValueError(f"{name} has shape {arr.shape}, expected (n, {d})")


def _is_categorical(series: pd.Series) -> bool:
    return pd.api.types.is_bool_dtype(series.dtype) or not pd.api.types.is_numeric_dtype(
        series.dtype
    )


def encode_party_features(
    frame: pd.DataFrame,
    columns: Sequence[str],
    train_idx: np.ndarray,
    test_idx: np.ndarray,
) -> PartyFeatures:
    """Encode one party's feature columns, fitted on the training rows only.

    Categorical columns (object, string, category, bool; anything non-numeric)
    are one-hot encoded with ``handle_unknown="ignore"``, so a category first
    seen in the test rows encodes as all zeros; missing values form their own
    ``"__missing__"`` category. Numeric columns are standardised with the
    train mean/std after filling missing values with the train median (a
    column with no observed train values is filled with 0). Output columns
    follow the order of ``columns``, each categorical expanded in sorted
    category order.

    Args:
        frame: The full table, ``n_rows`` rows; rows are addressed by position.
        columns: This party's feature columns (non-empty, no duplicates).
        train_idx: 1-D integer positions of training rows, shape ``(n_train,)``,
            non-empty.
        test_idx: 1-D integer positions of test rows, shape ``(n_test,)``.

    Returns:
        A :class:`PartyFeatures` with ``float32`` matrices of shapes
        ``(n_train, d)`` and ``(n_test, d)``.

    Raises:
        UnknownColumn: A column is not in ``frame``.
        InvalidSplit: ``columns`` is empty or has duplicates, ``train_idx`` is
            empty, or an index is out of range / not integer.
        DataError: A numeric column contains infinite values.
    """
    columns = list(columns)
    if not columns:
        raise InvalidSplit("a party needs at least one feature column")
    dupes = _duplicates(columns)
    if dupes:
        raise InvalidSplit(f"columns listed more than once: {dupes!r}")
    unknown = [c for c in columns if c not in frame.columns]
    if unknown:
        raise UnknownColumn(unknown, list(frame.columns))
    n_rows = len(frame)
    train_idx = _check_indices("train_idx", train_idx, n_rows)
    test_idx = _check_indices("test_idx", test_idx, n_rows)
    if train_idx.size == 0:
        raise InvalidSplit("train_idx is empty; cannot fit the encoders")

    # Normalise dtypes so scikit-learn sees plain float64 or string columns.
    prepared: dict[str, pd.Series] = {}
    transformers = []
    for i, col in enumerate(columns):
        series = frame[col]
        if _is_categorical(series):
            values = series.astype(object)
            values = values.where(values.notna(), _MISSING_CATEGORY).astype(str)
            prepared[col] = values
            step = OneHotEncoder(
                handle_unknown="ignore",
                sparse_output=False,
                dtype=np.float32,
                feature_name_combiner=_combine_name,
            )
        else:
            numbers = series.to_numpy(dtype=np.float64, na_value=np.nan)
            if np.isinf(numbers).any():
                raise DataError(f"numeric column {col!r} contains infinite values")
            prepared[col] = pd.Series(numbers, index=series.index, name=col)
            step = Pipeline(
                [
                    ("impute", SimpleImputer(strategy="median", keep_empty_features=True)),
                    ("scale", StandardScaler()),
                ]
            )
        transformers.append((f"c{i}", step, [col]))
    table = pd.DataFrame(prepared, index=frame.index)

    encoder = ColumnTransformer(
        transformers, remainder="drop", sparse_threshold=0.0, verbose_feature_names_out=False
    )
    x_train = encoder.fit_transform(table.iloc[train_idx])
    names = tuple(str(n) for n in encoder.get_feature_names_out())
    if test_idx.size:
        x_test = encoder.transform(table.iloc[test_idx])
    else:
        x_test = np.empty((0, len(names)))
    return PartyFeatures(
        x_train=np.ascontiguousarray(x_train, dtype=np.float32),
        x_test=np.ascontiguousarray(x_test, dtype=np.float32),
        feature_names=names,
    )


def _combine_name(feature: str, category: object) -> str:
    return f"{feature}={category}"


# --------------------------------------------------------------------------- labels


def _positive_class(classes: list[object], numeric: bool) -> object:
    """Pick the positive class among exactly two distinct label values."""
    lowered = {str(c).strip().lower(): c for c in classes}
    if len(lowered) == 2:
        if set(lowered) == {"yes", "no"}:
            return lowered["yes"]
        if set(lowered) == {"true", "false"}:  # bool dtype and "true"/"false" strings
            return lowered["true"]
    if numeric:
        if {float(c) for c in classes} == {0.0, 1.0}:
            return next(c for c in classes if float(c) == 1.0)
        return max(classes, key=float)
    return max(classes, key=str)


def _class_name(value: object) -> str:
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, np.generic):
        return str(value.item())
    return str(value)


def encode_labels(
    frame: pd.DataFrame, label: str, train_idx: np.ndarray, test_idx: np.ndarray
) -> tuple[np.ndarray, np.ndarray, str]:
    """Encode a binary label column as 0/1 targets.

    The positive class is ``"yes"`` for yes/no labels (case-insensitive),
    ``1`` for 0/1 labels, ``True`` / ``"true"`` for booleans, otherwise the
    larger of the two classes (numeric order for numeric labels, lexicographic
    order of their string form otherwise).

    Args:
        frame: The full table; rows are addressed by position.
        label: The label column.
        train_idx: 1-D integer positions of training rows, shape ``(n_train,)``.
        test_idx: 1-D integer positions of test rows, shape ``(n_test,)``.

    Returns:
        ``(y_train, y_test, positive)``: ``float32`` arrays of shapes
        ``(n_train,)`` and ``(n_test,)`` with 1.0 for the positive class, and
        the positive class as a string (e.g. ``"yes"``, ``"1"``, ``"True"``).

    Raises:
        UnknownColumn: ``label`` is not in ``frame``.
        InvalidSplit: An index is out of range or not integer.
        InvalidLabel: The label has missing values in the selected rows, more
            than two classes, or a single class among the training rows.
    """
    if label not in frame.columns:
        raise UnknownColumn([label], list(frame.columns))
    n_rows = len(frame)
    train_idx = _check_indices("train_idx", train_idx, n_rows)
    test_idx = _check_indices("test_idx", test_idx, n_rows)
    series = frame[label]
    y_train_raw = series.iloc[train_idx]
    y_test_raw = series.iloc[test_idx]

    n_missing = int(y_train_raw.isna().sum() + y_test_raw.isna().sum())
    if n_missing:
        raise InvalidLabel(f"label column {label!r} has {n_missing} missing value(s)")

    classes = list(pd.unique(pd.concat([y_train_raw, y_test_raw], ignore_index=True)))
    if len(classes) > 2:
        shown = sorted(map(_class_name, classes))
        head = ", ".join(repr(c) for c in shown[:10]) + (", ..." if len(shown) > 10 else "")
        raise InvalidLabel(
            f"label column {label!r} has {len(classes)} classes, expected 2: [{head}]"
        )
    train_classes = list(pd.unique(y_train_raw))
    if len(train_classes) == 0:
        raise InvalidLabel(f"label column {label!r} has no training rows")
    if len(train_classes) == 1:
        raise InvalidLabel(
            f"label column {label!r} has a single class {_class_name(train_classes[0])!r} "
            f"in the training split; need both classes"
        )

    numeric = pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(
        series.dtype
    )
    positive = _positive_class(classes, numeric)
    y_train = np.ascontiguousarray((y_train_raw == positive).to_numpy(), dtype=np.float32)
    y_test = np.ascontiguousarray((y_test_raw == positive).to_numpy(), dtype=np.float32)
    return y_train, y_test, _class_name(positive)
