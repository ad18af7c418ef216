"""The checks of a run's data that need no training, no pandas and no torch: ``psfl vfl
run`` runs them before it prints its start line or starts any process, so a bad file or
column is refused in about a second (:func:`check_before_launch`); the launcher's
:func:`parties.data.preflight.preflight` runs the full checks later.

Owns: :func:`check_before_launch`, :func:`check_own_file`, :func:`csv_header`, :func:`parquet_header`. May import :mod:`parties.data`
(its errors and column split), :mod:`parties.data.shards` (Parquet footers) and
:mod:`parties.data.limits` (the bounds on lines, columns, workers and memory).
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parties.config.sections import MAX_LINE_BYTES
from parties.data import (DATASETS, DataError, DatasetNotFound, EmptyColumn, default_split_n,
                          validate_split_n)
from parties.data.limits import (NAMED_DATASET_COLUMNS, check_columns, check_memory,
                                 check_workers, estimate_memory, first_line, scan_lines)

#: what pandas reads as a missing value (``pandas.read_csv``'s default ``na_values``)
NA_STRINGS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan",
                        "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None",
                        "n/a", "nan", "null"})


def _open_csv(path: Path) -> Any:
    opener: Any = gzip.open if path.name.lower().endswith(".gz") else open
    return opener(path, "rt", newline="", encoding="utf-8-sig")


def csv_header(path: str | Path, max_line_bytes: int = MAX_LINE_BYTES) -> list[str] | None:
    """The column names of a CSV file as pandas would name them, from its first line
    (read up to ``max_line_bytes`` and no further); None when the file is not a plain CSV
    file whose header this can vouch for (missing, unreadable, duplicate or empty names,
    which pandas renames): the full checks then report it.

    Raises:
        parties.data.LineTooLong: the first line is longer than ``max_line_bytes``.
    """
    p = Path(path).expanduser()
    if not p.name.lower().endswith((".csv", ".csv.gz")) or not p.is_file():
        return None
    try:
        header = next(csv.reader([first_line(p, max_line_bytes)]), None)
    except (OSError, UnicodeDecodeError, csv.Error, EOFError):
        return None
    if not header or any(not c for c in header) or len(set(header)) != len(header):
        return None
    return header


def parquet_header(path: str | Path) -> tuple[list[str], dict[str, int]] | None:
    """A Parquet file's column names and, per column, its count of missing values where
    every row group's footer records one (``num_rows`` of them: the column is empty),
    from its footer only; None when this cannot vouch for them (not a plain Parquet
    file, an index column that pandas would not read as a column)."""
    p = Path(path).expanduser()
    if not p.name.lower().endswith(".parquet") or not p.is_file():
        return None
    from parties.data.shards import ShardError, inspect

    try:
        info = inspect(p)
    except ShardError:
        return None  # the full checks name what is wrong with it
    columns = list(info.columns)
    if any(c.startswith("__index_level_") for c in columns) or len(set(columns)) != len(columns):
        return None
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(p).metadata
    nulls: dict[str, int] = {}
    for j in range(meta.num_columns):
        name = meta.schema.column(j).path
        if name not in columns:
            continue  # a nested column's leaf
        counts = []
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(j).statistics
            if stats is None or stats.null_count is None:
                break
            counts.append(stats.null_count)
        else:
            nulls[name] = int(sum(counts))
    return columns, {c: n for c, n in nulls.items() if meta.num_rows and n == meta.num_rows}


def named_columns(cfg: Any) -> dict[str, tuple[str, ...]]:
    """The feature columns the configuration names (``vfl.data.active_columns``,
    ``passive_columns``, ``passive_party_columns``), by party id; empty when it names
    none (the default split)."""
    data = cfg.data
    if cfg.passive_parties > 1 and data.passive_party_columns:
        groups = {"active": tuple(data.active_columns)}
        groups.update(zip(cfg.party_ids[1:], (tuple(c) for c in data.passive_party_columns)))
        return groups
    if cfg.passive_parties == 1 and (data.active_columns or data.passive_columns):
        return {"active": tuple(data.active_columns), "passive": tuple(data.passive_columns)}
    return {}


def check_empty_columns(path: str | Path, columns: Sequence[str],
                        groups: dict[str, tuple[str, ...]],
                        max_line_bytes: int = MAX_LINE_BYTES) -> None:
    """Refuse a named feature column with no value in any row of the CSV file ``path``
    (``columns``: its header). Reads rows until every named column has shown a value:
    usually the first row; the whole file only when a column is empty. A field may be
    as long as a line (``max_line_bytes``, not the csv module's 128 KiB).

    Raises:
        EmptyColumn: the first such column (naming it and its party).
    """
    owner = {c: p for p, cols in groups.items() for c in cols}
    where = {c: i for i, c in enumerate(columns) if c in owner}
    waiting = dict(where)
    before = csv.field_size_limit(max(csv.field_size_limit(), max_line_bytes))
    try:
        with _open_csv(Path(path).expanduser()) as f:
            rows = csv.reader(f)
            next(rows, None)
            for row in rows:
                for c, i in list(waiting.items()):
                    if i < len(row) and row[i] not in NA_STRINGS:
                        del waiting[c]
                if not waiting:
                    return
    except csv.Error as exc:  # a malformed row: the full checks name it
        raise DataError(f"cannot parse {str(path)!r}: {exc}") from None
    finally:
        csv.field_size_limit(before)
    if waiting:
        c = min(waiting, key=where.__getitem__)
        raise EmptyColumn(c, owner[c], str(path))


def check_before_launch(cfg: Any) -> None:
    """The data checks that need no training, cheap enough to run before anything starts:
    streaming (or per-party files): each party's file is Parquet, readable, with its
    columns and the same row count (footers only); a user file: it exists, and in a CSV
    file (its header, and rows until each named column shows a value) or a Parquet file
    (its footer) the configured label and columns exist, the column split is valid, and
    no named feature column is empty. A named dataset and anything this cannot read
    cheaply are left to :func:`parties.data.preflight.preflight`. And the bounds of
    :mod:`parties.data.limits`: every party's workers within this machine's cores, a
    file's columns within ``vfl.data.max_columns``, each line of a CSV file within
    ``vfl.data.max_line_bytes`` (a scan in chunks), and the memory the run needs (its
    models, Adam state, replicas, buffers and table) within what this machine has.

    Raises:
        parties.data.DataError: see :func:`parties.data.stream.preflight_streamed`,
            :func:`parties.data.validate_split_n` and :class:`EmptyColumn`;
            :class:`parties.data.LineTooLong`, :class:`parties.data.TooManyColumns`.
        ConfigError: too many workers for this machine, or more memory than it has
            (naming the setting; :func:`parties.data.limits.check_memory`).
    """
    check_workers(cfg)
    if cfg.data.stream or cfg.data.party_datasets:
        from parties.data.shards import parquet_files

        for p in cfg.party_ids:  # not Parquet (a CSV file): refused before reading anything
            parquet_files(cfg.dataset_for(p))
        from parties.data.stream import preflight_streamed

        preflight_streamed(cfg)
        from parties.data.shards import inspect

        shapes = {p: inspect(cfg.dataset_for(p)) for p in cfg.party_ids}  # footers only
        for p, info in shapes.items():
            check_columns(cfg.dataset_for(p), len(info.columns), cfg.data.max_columns)
        # streamed: chunks in memory, not the table; per-party files: each one whole
        check_memory(estimate_memory(
            cfg, columns={p: len(i.columns) for p, i in shapes.items()},
            rows={p: 0 if cfg.data.stream else i.rows for p, i in shapes.items()},
            table_columns={p: len(i.columns) for p, i in shapes.items()}))
        return
    if cfg.dataset in DATASETS:
        info = DATASETS[cfg.dataset]
        synthetic = info.resource is None
        rows = cfg.data.synthetic_rows if synthetic else info.rows or 0
        width = cfg.data.synthetic_features if synthetic else NAMED_DATASET_COLUMNS
        check_memory(estimate_memory(cfg, columns=dict.fromkeys(cfg.party_ids, width),
                                     rows=rows, table_columns=width,
                                     table_key=("vfl.data.synthetic_rows" if synthetic
                                                else "vfl.dataset")))
        return
    path = Path(cfg.dataset).expanduser()
    if not path.exists():
        raise DatasetNotFound(path, f"named datasets: {', '.join(sorted(DATASETS))}")
    found_table = _table_shape(cfg, path)
    if found_table is None:
        return
    columns, empty, rows = found_table
    if not cfg.label:
        raise DataError(f"dataset {cfg.dataset!r} needs a label column: set vfl.label")
    groups = named_columns(cfg)
    if groups:
        if cfg.passive_parties == 1 and not all(groups.values()):
            raise DataError("set both vfl.data.active_columns and vfl.data.passive_columns, "
                            "or neither")
    else:
        groups = default_split_n([c for c in columns if c != cfg.data.join_key], cfg.label,
                                 cfg.party_ids,
                                 n_active=cfg.data.active_features or None)
    validate_split_n(columns, cfg.label, groups)
    named = named_columns(cfg)
    if named and empty is None:
        check_empty_columns(path, columns, named, cfg.data.max_line_bytes)
    for party, cols in named.items():
        for c in cols:
            if empty and c in empty:
                raise EmptyColumn(c, party, cfg.dataset)
    check_memory(estimate_memory(cfg, columns={p: len(c) for p, c in groups.items()},
                                 rows=rows, table_columns=len(columns)))


def _table_shape(cfg: Any, path: Path) -> tuple[list[str], dict[str, int] | None, int] | None:
    """A user file's columns, its empty columns (Parquet, from the footer; None for a CSV
    file) and its rows, with the bounds on its shape checked: a CSV file's header line
    and every line within ``vfl.data.max_line_bytes`` (a scan in chunks), at most
    ``vfl.data.max_columns`` columns. None when this cannot read it cheaply.

    Raises:
        parties.data.LineTooLong, parties.data.TooManyColumns: a bound passed.
    """
    data = cfg.data
    columns = csv_header(path, data.max_line_bytes)
    if columns is not None:
        check_columns(path, len(columns), data.max_columns)
        return columns, None, max(0, scan_lines(path, data.max_line_bytes).lines - 1)
    found = parquet_header(path)
    if found is None:
        if path.name.lower().endswith((".csv", ".csv.gz")) and path.is_file():
            scan_lines(path, data.max_line_bytes)  # a header this cannot vouch for
        return None
    columns, empty = found
    check_columns(path, len(columns), data.max_columns)
    import pyarrow.parquet as pq

    return columns, empty, int(pq.ParquetFile(path).metadata.num_rows)


def check_own_file(cfg: Any, party: str) -> tuple[str, ...]:
    """One party's own file (``dataset`` with ``vfl.data.join_key``: the cross-organisation
    path, each party holding only its file), before the party joins the bus: the file
    exists, holds the join key, the label when ``party`` is the active party (and not
    when it is a passive one), the configured feature columns, and no feature column
    without a value. Returns the party's feature columns (every column but the join key
    and the label unless configured).

    Raises:
        parties.data.DataError: a named dataset given as one's own file, a missing file,
            a missing join key, label or column (:class:`parties.data.UnknownColumn`,
            naming every missing one), the label in a passive party's file, no feature
            column, a feature column with no value (:class:`EmptyColumn`), a line or
            a column count above its bound (:class:`parties.data.LineTooLong`,
            :class:`parties.data.TooManyColumns`).
        ConfigError: more workers than this host's cores run, or more memory than it
            has (:func:`parties.data.limits.check_memory`, for this party's process).
    """
    from parties.data import InvalidSplit, UnknownColumn

    if cfg.dataset in DATASETS:
        raise DataError(f"{cfg.dataset!r} is a bundled dataset: with a job file each party "
                        "gives its own file (--data FILE, CSV or Parquet)")
    path = Path(cfg.dataset).expanduser()
    if not path.exists():
        raise DatasetNotFound(path, "this party's own file (--data)")
    check_workers(cfg, parties=[party])
    found_table = _table_shape(cfg, path)
    if found_table is None:
        return ()
    columns, empty, rows = found_table
    key, label, active = cfg.data.join_key, cfg.label, party == "active"
    own = named_columns(cfg).get(party, ())
    need = [key, *own, *([label] if active and label else [])]
    missing = [c for c in dict.fromkeys(need) if c not in columns]
    if missing:
        raise UnknownColumn(missing, columns)
    if active and not label:
        raise DataError(f"{str(path)!r}: name the label column (vfl.label in the job file)")
    if not active and label and label in columns:
        raise InvalidSplit(f"{party}'s file {str(path)!r} holds the label {label!r}: only "
                           "the active party has it (leave it out of this file)")
    cols = tuple(own) or tuple(c for c in columns if c not in (key, label))
    if key in cols or (label and label in cols):
        raise InvalidSplit(f"{party}'s feature columns name the join key {key!r} or the "
                           f"label {label!r}")
    if not cols:
        raise InvalidSplit(f"{party}'s file {str(path)!r} has no feature column besides "
                           f"the join key {key!r}" + (" and the label" if active else ""))
    if empty is None:
        check_empty_columns(path, columns, {party: cols}, cfg.data.max_line_bytes)
    else:
        for c in cols:
            if c in empty:
                raise EmptyColumn(c, party, str(path))
    check_memory(estimate_memory(cfg, columns={party: len(cols)}, rows=rows,
                                 table_columns=len(columns), parties=[party], broker=False))
    return cols


__all__ = ["NA_STRINGS", "check_before_launch", "check_own_file", "check_empty_columns", "csv_header",
           "named_columns", "parquet_header"]
