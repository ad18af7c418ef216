"""A party's dataset as a directory of Parquet shards (or one Parquet file): its files in
row order, their common schema and their row counts, read from the footers only.

Owns: :func:`inspect` and :class:`DatasetInfo`. May import :mod:`parties.data.errors`
only (and pyarrow). Imported by :mod:`parties.data` (loading a directory into memory) and
:mod:`parties.data.stream` (streaming it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parties.data.errors import DataError, DatasetNotFound


class ShardError(DataError):
    """A file of a party's dataset is unreadable or does not match the others.

    Attributes:
        path: the file.
        detail: what is wrong.
    """

    def __init__(self, path: str | Path, detail: str) -> None:
        self.path, self.detail = str(path), detail
        super().__init__(f"{self.path}: {detail}")


# --------------------------------------------------------------------------- files


def parquet_files(path: str | Path) -> list[Path]:
    """The Parquet files of a dataset: the file itself, or a directory's ``*.parquet``
    files (recursively, sorted by path: the row order).

    Raises:
        DatasetNotFound: no such file or directory.
        DataError: a directory without Parquet files, or a file that is not Parquet.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise DatasetNotFound(p)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.parquet") if f.is_file())
        if not files:
            raise DataError(f"{str(p)!r} holds no .parquet files")
        return files
    if not p.name.lower().endswith(".parquet"):
        raise DataError(f"streaming reads Parquet: {str(p)!r} is not a .parquet file or a "
                        "directory of them (psfl data convert writes one from a CSV)")
    return [p]


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetInfo:
    """A checked dataset: its files, their common schema, their row counts."""

    files: tuple[Path, ...]
    columns: tuple[str, ...]
    rows_per_file: tuple[int, ...]
    group_rows: tuple[tuple[int, ...], ...]  # per file, the rows of each row group

    @property
    def rows(self) -> int:
        return sum(self.rows_per_file)


def inspect(path: str | Path) -> DatasetInfo:
    """Read every file's footer: one schema for all, row counts.

    Raises:
        ShardError: a file is not readable Parquet (naming it), or its schema differs
            from the first file's (naming the file and the columns that differ).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = parquet_files(path)
    first: Any = None
    rows, groups = [], []
    for f in files:
        try:
            meta = pq.ParquetFile(f).metadata
            schema = meta.schema.to_arrow_schema()
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ShardError(f, f"not a readable Parquet file ({exc})") from None
        if first is None:
            first = (f, schema)
        elif not schema.equals(first[1]):
            a = {fl.name: str(fl.type) for fl in first[1]}
            b = {fl.name: str(fl.type) for fl in schema}
            diff = sorted(set(a) ^ set(b)) + sorted(k for k in set(a) & set(b) if a[k] != b[k])
            raise ShardError(f, f"schema differs from {first[0].name}'s in column(s) "
                                f"{diff[:5]} ({', '.join(f'{k}: {a.get(k)} vs {b.get(k)}' for k in diff[:3])})")
        rows.append(int(meta.num_rows))
        groups.append(tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups)))
    return DatasetInfo(files=tuple(files), columns=tuple(first[1].names),
                       rows_per_file=tuple(rows), group_rows=tuple(groups))


__all__ = ["DatasetInfo", "ShardError", "inspect", "parquet_files"]
