"""``psfl data convert``: a CSV (or TSV, gzip or not) to Parquet shards, streamed (pyarrow's
CSV reader, one block at a time), optionally one directory per party.

Each party's directory then feeds ``vfl.data.party_datasets`` (and ``vfl.data.stream``): row i of
every party's shards is row i of the source, so the files stay aligned by row order. A
row the CSV reader cannot parse is an error naming the file and the line; nothing is
written to a shard but whole blocks (``.tmp`` then renamed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parties.data import DataError, DatasetNotFound, UnknownColumn


def convert_csv(src: str | Path, out: str | Path, *, parties: Mapping[str, Sequence[str]]
                | None = None, shard_rows: int = 1_000_000, delimiter: str = ",",
                names: Sequence[str] = (), block_mb: int = 16) -> dict[str, Any]:
    """Convert ``src`` to ``out/part-NNNNN.parquet`` (or ``out/<party>/part-NNNNN.parquet``
    per entry of ``parties``: its columns, in that order).

    Args:
        names: the column names when the file has no header row (the Criteo files: label,
            ``I1..I13``, ``C1..C26``).

    Returns:
        ``{"rows": n, "shards": k, "dirs": {party: path}}``.

    Raises:
        DatasetNotFound: no such file.
        UnknownColumn: a party's column is not in the file.
        DataError: a line cannot be parsed (naming the file), ``out`` holds shards.
    """
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    src = Path(src).expanduser()
    if not src.is_file():
        raise DatasetNotFound(src)
    if shard_rows < 1:
        raise DataError(f"shard_rows must be >= 1, got {shard_rows}")
    out = Path(out)
    groups = dict(parties) if parties else {"": ()}
    dirs = {p: (out / p if p else out) for p in groups}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
        if any(d.glob("part-*.parquet")):
            raise DataError(f"{str(d)!r} already holds Parquet shards; convert into an empty "
                            "directory")
    read = pcsv.ReadOptions(block_size=block_mb << 20, column_names=list(names) or None)
    parse = pcsv.ParseOptions(delimiter=delimiter)
    try:
        reader = pcsv.open_csv(src, read_options=read, parse_options=parse)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read {str(src)!r}: {exc}") from None
    columns = reader.schema.names
    for p, cols in groups.items():
        missing = [c for c in cols if c not in columns]
        if missing:
            raise UnknownColumn(missing, columns)
    pending: list[Any] = []
    have, shards, rows = 0, 0, 0

    def flush() -> None:
        nonlocal pending, have, shards
        if not pending:
            return
        table = pa.Table.from_batches(pending)
        for p, cols in groups.items():
            part = table.select(list(cols)) if cols else table
            final = dirs[p] / f"part-{shards:05d}.parquet"
            tmp = final.with_suffix(".tmp")
            pq.write_table(part, tmp, row_group_size=65_536)
            os.replace(tmp, final)
        shards += 1
        pending, have = [], 0

    try:
        for batch in reader:
            pending.append(batch)
            have += batch.num_rows
            rows += batch.num_rows
            if have >= shard_rows:
                flush()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot parse {str(src)!r} after row {rows:,}: {exc}") from None
    flush()
    return {"rows": rows, "shards": shards, "dirs": {p or "all": str(d)
                                                     for p, d in dirs.items()}}


__all__ = ["convert_csv"]
