"""The data layer's errors: bad files, columns, splits, rows, labels and synthetic
parameters (each a :class:`DataError`, exit code 2 in every command).

Owns: the error types of :mod:`parties.data`, :mod:`parties.data.encoders`,
:mod:`parties.data.schema`, :mod:`parties.data.shards` and :mod:`parties.data.stream`. May import
nothing of the project. (:mod:`parties.data` re-exports them, their documented home.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

_MAX_LISTED = 50  # cap on how many available columns an error message lists


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


class InvalidRows(DataError, ValueError):
    """An aligned-rows file (``psfl vfl align`` output) cannot select rows of the table.

    Attributes:
        path: the file.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(f"aligned rows {path!r}: {reason}")


class InvalidLabel(DataError, ValueError):
    """The label column cannot be used as the task's target.

    Raised when the label has missing values, more than two classes or only
    one class among the training rows (binary), or is not numeric, infinite or
    constant among the training rows (regression).
    """


class EmptyColumn(DataError, ValueError):
    """A feature column the configuration names has no value in any row (every one
    missing): it would train as a constant.

    Attributes:
        column: the column.
        party: the party whose columns name it.
        path: the file.
    """

    def __init__(self, column: str, party: str, path: str) -> None:
        self.column, self.party, self.path = column, party, path
        super().__init__(f"column {column!r} of the {party} party has no values in "
                         f"{path!r} (every row is missing): drop it from its party's "
                         "columns (vfl.data.*_columns)")


class LineTooLong(DataError, ValueError):
    """A line of a CSV file is longer than ``vfl.data.max_line_bytes``: found by a scan
    in chunks, without the line read into memory.

    Attributes:
        path: the file.
        line: the line's number (1 = the header).
        limit: the bound, in bytes.
    """

    def __init__(self, path: str, line: int, limit: int) -> None:
        self.path, self.line, self.limit = path, line, limit
        super().__init__(f"{path!r}: line {line:,} is longer than {limit:,} bytes (the "
                         "bound vfl.data.max_line_bytes): not a table of rows; check the "
                         "file (a missing newline?) or raise the bound")


class TooManyColumns(DataError, ValueError):
    """A file has more columns than ``vfl.data.max_columns``.

    Attributes:
        path: the file.
        count: its columns.
        limit: the bound.
    """

    def __init__(self, path: str, count: int, limit: int) -> None:
        self.path, self.count, self.limit = path, count, limit
        super().__init__(f"{path!r} has {count:,} columns, more than {limit:,} (the bound "
                         "vfl.data.max_columns): select the columns to train on first, or "
                         "raise the bound")


class InvalidSynthetic(DataError, ValueError):
    """The parameters of the synthetic dataset are out of range."""





def infinite_values_message(columns: Sequence[str]) -> str:
    """The message of a :class:`DataError` for numeric columns holding infinite values,
    every one named."""
    if len(columns) == 1:
        return f"numeric column {columns[0]!r} contains infinite values"
    return (f"{len(columns)} numeric columns contain infinite values: "
            + ", ".join(repr(c) for c in columns))


__all__ = ["DataError", "DatasetNotFound", "EmptyColumn", "InvalidLabel", "InvalidRows", "InvalidSplit",
           "InvalidSynthetic", "LineTooLong", "TooManyColumns", "UnknownColumn",
           "infinite_values_message"]
