"""A party's own Parquet file, streamed: the encoder fitted from streamed statistics, the
encoded rows written once to an on-disk cache that the workers read batch by batch.

Memory does not grow with the table: the file is read in chunks of ``stream_chunk_rows``
(one file of a directory of shards at a time, :func:`iter_chunks`); what stays in memory
is a training sample for the column treatments (``SAMPLE_ROWS`` rows), the scored
validation and test subsets (capped) and the cache's block buffers
(:class:`parties.data.rowstore.DiskRows`).

Three passes over the file:

1. *Sample*: evenly spaced row groups until ``SAMPLE_ROWS`` training rows: each column's
   treatment (:func:`parties.data.treatments.classify`: datetime parts, ID-like columns
   dropped, one-hot up to ``onehot_max_levels`` levels, hashed above), a numeric
   column's fill (the sample median) and its clipping range (the sample's
   ``[q, 1 − q]`` quantiles, ``q = stream_clip_quantile``).
2. *Moments*: every training row: each numeric output's mean and standard deviation
   after filling and clipping (float64 sums), each one-hot column's levels.
3. *Encode*: every row, encoded by the fitted encoder (:class:`FittedEncoder`, saved
   with the model as for an in-memory run) and routed by :func:`hash_split`: training
   rows to the cache file in row order, scored validation and test rows to memory.

With DP on, the passive party's encoder is its public schema
(:class:`parties.data.schema.SchemaEncoder`) and passes 1 and 2 do not run: nothing is fitted
on its rows.

The row split is a function of the row's position and the seed
(:func:`hash_split`), so every party computes it from its own aligned file; the
epoch's batches follow :class:`parties.algorithms.schedule.BlockBatches`.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from parties.data.errors import DataError, InvalidSplit, UnknownColumn
from parties.data.schema import SchemaEncoder, dp_schema
from parties.data.treatments import policy_of
from parties.data.shards import DatasetInfo, ShardError, inspect, parquet_files  # noqa: F401

#: training rows sampled for the column treatments, fills and clipping ranges
SAMPLE_ROWS = 100_000
_TEST, _VAL, _TRAIN, _UNUSED = 2, 1, 0, 3


def iter_chunks(info: DatasetInfo, columns: Sequence[str], chunk_rows: int
                ) -> Iterator[tuple[int, pd.DataFrame]]:
    """``(first row position, chunk)`` over every file in order, ``columns`` only.

    Raises:
        ShardError: a file fails while being read (naming it), or yields a different
            row count than its footer says.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    start = 0
    for f, n in zip(info.files, info.rows_per_file, strict=True):
        got = 0
        try:
            pf = pq.ParquetFile(f)
            for batch in pf.iter_batches(batch_size=chunk_rows, columns=list(columns)):
                frame = batch.to_pandas()
                yield start + got, frame
                got += len(frame)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ShardError(f, f"read failed near row {got} of {n} ({exc})") from None
        if got != n:
            raise ShardError(f, f"yielded {got} rows, its footer says {n}")
        start += n


def sample_rows(info: DatasetInfo, columns: Sequence[str], keep: Any, max_rows: int, *,
                chunk_rows: int = 65536) -> pd.DataFrame:
    """Up to ``max_rows`` rows for which ``keep(positions)`` is true, from row groups
    spread evenly over the dataset (not only its start: a file sorted by time would
    otherwise sample one period)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    spots: list[tuple[int, int]] = []
    starts: dict[tuple[int, int], int] = {}
    offset = 0
    for fi, sizes in enumerate(info.group_rows):
        for g, n in enumerate(sizes):
            spots.append((fi, g))
            starts[(fi, g)] = offset
            offset += n
    avg = max(1, min(chunk_rows, info.rows // max(1, len(spots))))
    need = max(1, math.ceil(max_rows / avg))
    step = max(1, len(spots) // need)
    parts, got = [], 0
    for fi, g in spots[::step]:
        f = info.files[fi]
        try:  # the row group's first chunk (a huge row group is not read whole)
            batch = next(pq.ParquetFile(f).iter_batches(batch_size=chunk_rows, row_groups=[g],
                                                        columns=list(columns)), None)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise ShardError(f, f"row group {g} unreadable ({exc})") from None
        if batch is None:
            continue
        frame = batch.to_pandas()
        pos = starts[(fi, g)] + np.arange(len(frame), dtype=np.int64)
        frame = frame[keep(pos)]
        parts.append(frame)
        got += len(frame)
        if got >= max_rows:
            break
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    return out.iloc[:max_rows]


# --------------------------------------------------------------------------- split


def _uniform(pos: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """A uniform [0, 1) number per position (splitmix64 of position, seed and salt)."""
    with np.errstate(over="ignore"):
        z = (pos.astype(np.uint64) + np.uint64((seed * 0x9E3779B1 + salt) & (2**64 - 1))
             ) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass(frozen=True, slots=True, kw_only=True)
class HashSplit:
    """Which rows train, which are scored for validation and test, from the position.

    A row is a test row when ``u < test_frac`` (``u`` uniform from its position and the
    seed); the scored test rows are those with ``u < test_frac · test_keep``. Of the
    other rows, ``v < val_frac`` are held out (``v`` a second uniform), the scored
    validation rows those with ``v < val_frac · val_keep``; the rest train. The keeps cap
    the scored subsets at about the configured row counts.
    """

    seed: int
    test_frac: float
    val_frac: float
    test_keep: float = 1.0
    val_keep: float = 1.0

    @classmethod
    def for_rows(cls, n_rows: int, *, seed: int, test_frac: float, val_frac: float,
                 val_max_rows: int, test_max_rows: int) -> HashSplit:
        n_test = n_rows * test_frac
        n_val = (n_rows - n_test) * val_frac
        return cls(seed=seed, test_frac=test_frac, val_frac=val_frac,
                   test_keep=1.0 if not test_max_rows or n_test <= test_max_rows
                   else test_max_rows / n_test,
                   val_keep=1.0 if n_val <= val_max_rows else val_max_rows / max(n_val, 1))

    def __call__(self, pos: np.ndarray) -> np.ndarray:
        """Per position: 0 train, 1 scored validation, 2 scored test, 3 held out unused."""
        u = _uniform(pos, self.seed, 0x7E57)
        v = _uniform(pos, self.seed, 0x7A1)
        out = np.full(pos.shape, _TRAIN, dtype=np.int8)
        test = u < self.test_frac
        val = ~test & (v < self.val_frac)
        out[test] = _UNUSED
        out[test & (u < self.test_frac * self.test_keep)] = _TEST
        out[val] = _UNUSED
        out[val & (v < self.val_frac * self.val_keep)] = _VAL
        return out


def split_for(cfg: Any, n_rows: int) -> HashSplit:
    """The run's :class:`HashSplit` of ``n_rows`` rows (its caps from the config)."""
    from parties.algorithms.schedule import VAL_FRAC, VAL_MAX_ROWS

    return HashSplit.for_rows(n_rows, seed=cfg.seed, test_frac=cfg.data.test_frac,
                              val_frac=VAL_FRAC, val_max_rows=VAL_MAX_ROWS,
                              test_max_rows=cfg.data.stream_eval_max_rows)


def stream_split(cfg: Any, n_rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train, scored validation, scored test)`` positions of the hashed split, for an
    in-memory run with ``row_split = "hash"`` (the rows a streamed run uses)."""
    where = split_for(cfg, n_rows)(np.arange(n_rows, dtype=np.int64))
    return tuple(np.flatnonzero(where == k).astype(np.int64)  # type: ignore[return-value]
                 for k in (_TRAIN, _VAL, _TEST))


def hash_split(pos: np.ndarray, *, seed: int, test_frac: float, val_frac: float = 0.1
               ) -> np.ndarray:
    """:class:`HashSplit` without caps: 0 train, 1 validation, 2 test."""
    return HashSplit(seed=seed, test_frac=test_frac, val_frac=val_frac)(pos)


# --------------------------------------------------------------------------- fit


def fit_encoder(info: DatasetInfo, columns: Sequence[str], split: HashSplit, *, policy: Any,
                chunk_rows: int, clip_quantile: float, log: Any = None,
                sample: pd.DataFrame | None = None) -> Any:
    """Passes 1 and 2: the :class:`parties.data.encoders.FittedEncoder` of ``columns``
    (``sample``: the training sample of pass 1 when the caller read it already).

    Raises:
        DataError: an ID-like column refused, every column dropped, a numeric column
            with infinite values (naming it).
    """
    from parties.data.encoders import ColumnCode, FittedEncoder
    from parties.data.treatments import (
        MISSING,
        IdColumnRefused,
        as_strings,
        classify,
        datetime_part,
        parse_datetime,
    )

    if sample is None:
        sample = sample_rows(info, columns, lambda p: split(p) == _TRAIN, SAMPLE_ROWS,
                             chunk_rows=chunk_rows)
    if sample.empty:
        raise InvalidSplit("no training rows: the dataset is empty")
    try:
        treatments = tuple(classify(c, sample[c], policy) for c in columns)
    except IdColumnRefused as exc:
        raise DataError(str(exc)) from None
    for t in treatments:
        if t.kind == "dropped" and log is not None:
            log.warning("vfl.column_dropped", column=t.column, reason=t.reason)
    if all(t.kind == "dropped" for t in treatments):
        raise InvalidSplit(f"every feature column was dropped as ID-like: {list(columns)!r}; "
                           "set vfl.data.id_columns = \"keep\" to keep them")

    # numeric outputs: (name, source, part) with fill and clip range from the sample
    def values(frame: pd.DataFrame, col: str, part: str) -> np.ndarray:
        if part:
            return datetime_part(parse_datetime(frame[col]), part)
        x = frame[col].to_numpy(dtype=np.float64, na_value=np.nan)
        if np.isinf(x).any():
            raise DataError(f"numeric column {col!r} contains infinite values")
        return x

    numeric: list[tuple[str, str, str]] = []
    onehot: dict[str, set[str]] = {}
    for t in treatments:
        if t.kind == "numeric":
            numeric.append((t.column, t.column, ""))
        elif t.kind == "datetime":
            numeric += [(f"{t.column}.{p}", t.column, p) for p in t.parts]
        elif t.kind == "onehot":
            onehot[t.column] = set()
    fills, lo, hi = {}, {}, {}
    for name, col, part in numeric:
        x = values(sample, col, part)
        seen = x[~np.isnan(x)]
        fills[name] = float(np.median(seen)) if seen.size else 0.0
        if clip_quantile > 0 and seen.size:
            lo[name], hi[name] = (float(v) for v in np.quantile(seen, [clip_quantile,
                                                                       1 - clip_quantile]))
        else:
            lo[name], hi[name] = -math.inf, math.inf
    sums = {name: np.zeros(3) for name, _, _ in numeric}  # n, sum, sum of squares
    cap = 4 * policy.onehot_max_levels
    wanted = sorted({col for _, col, _ in numeric} | set(onehot))
    if wanted:
        for start, frame in iter_chunks(info, wanted, chunk_rows):
            frame = frame[split(start + np.arange(len(frame), dtype=np.int64)) == _TRAIN]
            for name, col, part in numeric:
                x = values(frame, col, part)
                x = np.clip(np.where(np.isnan(x), fills[name], x), lo[name], hi[name])
                sums[name] += (x.size, x.sum(), np.square(x).sum())
            for col, levels in onehot.items():
                if len(levels) <= cap:
                    levels.update(as_strings(frame[col]).unique().tolist())
    codes: list[ColumnCode] = []
    by_name = {name: (col, part) for name, col, part in numeric}
    for t in treatments:
        names = ([t.column] if t.kind == "numeric" else
                 [f"{t.column}.{p}" for p in t.parts] if t.kind == "datetime" else [])
        for name in names:
            n, s1, s2 = (float(v) for v in sums[name])
            mean = s1 / n if n else 0.0
            var = max(0.0, s2 / n - mean * mean) if n else 0.0
            col, part = by_name[name]
            codes.append(ColumnCode(name=name, kind="numeric", fill=fills[name], mean=mean,
                                    scale=math.sqrt(var) if var > 0 else 1.0,
                                    source=col if part else "", part=part,
                                    lo=lo[name], hi=hi[name]))
        if t.kind == "onehot":
            levels = onehot[t.column]
            if len(levels) > cap:  # far more levels than the sample showed: the sample's
                levels = set(as_strings(sample[t.column]).unique().tolist())
            codes.append(ColumnCode(name=t.column, kind="categorical",
                                    categories=tuple(sorted(levels))))
    for t in treatments:
        if t.kind == "hashed":
            codes.append(ColumnCode(name=t.column, kind="hashed", buckets=t.buckets))
    return FittedEncoder(columns=tuple(codes), missing=MISSING, treatments=treatments)


# --------------------------------------------------------------------------- cache


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamedRows:
    """Pass 3's output: the training rows on disk, the scored subsets in memory."""

    x_train: Any  # parties.data.rowstore.DiskRows
    y_train: Any  # DiskRows (vector) or None
    x_val: np.ndarray
    x_test: np.ndarray
    y_val: np.ndarray | None
    y_test: np.ndarray | None
    n_rows: int
    cache_dir: Path


def write_cache(info: DatasetInfo, columns: Sequence[str], split: HashSplit, encoder: Any, *,
                label: str = "", encode_label: Any = None, chunk_rows: int,
                cache_dir: str | Path = "") -> StreamedRows:
    """Pass 3: encode every row; training rows (and labels) to ``cache_dir``.

    ``encode_label(series) -> float32 array`` encodes the active party's labels
    (NaN for a row it cannot encode: refused with a DataError naming the position).
    """
    from parties.data.rowstore import DiskRows, RowWriter

    root = Path(cache_dir) if cache_dir else Path(tempfile.mkdtemp(prefix="psfl-stream-"))
    root.mkdir(parents=True, exist_ok=True)
    width = int(encoder.width)
    unpack = encoder.packing() if hasattr(encoder, "packing") else None
    if unpack is not None and not unpack.onehot:
        unpack = None  # nothing to pack: the file holds the dense rows
    read = list(columns) + ([label] if label else [])
    missing = [c for c in read if c not in info.columns]
    if missing:
        raise UnknownColumn(missing, list(info.columns))
    held: dict[int, list[np.ndarray]] = {_VAL: [], _TEST: []}
    held_y: dict[int, list[np.ndarray]] = {_VAL: [], _TEST: []}
    with RowWriter(root / "x_train.f32", unpack.slots if unpack else width) as xw, \
            RowWriter(root / "y_train.f32", 1) as yw:
        for start, frame in iter_chunks(info, read, chunk_rows):
            where = split(start + np.arange(len(frame), dtype=np.int64))
            x = (encoder.transform(frame[list(columns)], packed=True) if unpack else
                 encoder.transform(frame[list(columns)]))
            y = None
            if label:
                y = np.asarray(encode_label(frame[label]), dtype=np.float32)
                bad = np.flatnonzero(np.isnan(y))
                if bad.size:
                    raise DataError(f"label {label!r}: row {start + int(bad[0])} has no "
                                    f"usable value ({frame[label].iloc[int(bad[0])]!r})")
            if not np.isfinite(x).all():
                j = int(np.flatnonzero(~np.isfinite(x).all(axis=0))[0])
                name = encoder.columns[j].name if unpack else encoder.feature_names[j]
                raise DataError(f"feature {name!r} is not finite after encoding near row "
                                f"{start}")
            tr = where == _TRAIN
            xw.append(x[tr])
            if y is not None:
                yw.append(y[tr])
            for k in (_VAL, _TEST):
                sel = where == k
                held[k].append(unpack.apply(x[sel]) if unpack else x[sel])  # held dense
                if y is not None:
                    held_y[k].append(y[sel])
        n_train = xw.rows

    def cat(parts: list[np.ndarray], w: int | None) -> np.ndarray:
        if parts:
            return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)
        return np.empty((0, w) if w is not None else (0,), dtype=np.float32)

    x_train = DiskRows(root / "x_train.f32", n_train, width, unpack=unpack)
    y_train = DiskRows(root / "y_train.f32", n_train, 1, vector=True) if label else None
    return StreamedRows(
        x_train=x_train, y_train=y_train, x_val=cat(held[_VAL], width),
        x_test=cat(held[_TEST], width),
        y_val=cat(held_y[_VAL], None) if label else None,
        y_test=cat(held_y[_TEST], None) if label else None,
        n_rows=info.rows, cache_dir=root)


# --------------------------------------------------------------------------- a party


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamedParty:
    """What :func:`load_streamed` gives the runtime."""

    rows: StreamedRows
    encoder: Any
    columns: tuple[str, ...]
    label: str
    positive: str


def _label_encoder(sample: pd.DataFrame, label: str, positive: str) -> tuple[Any, str]:
    """The binary label's encoder (classes and the positive class from the training
    ``sample``) for :func:`write_cache`."""
    from parties.data import InvalidLabel, _class_name, encode_labels

    idx = np.arange(len(sample))
    _, _, pos = encode_labels(sample, label, idx, idx[:0], positive=positive)
    classes = list(pd.unique(sample[label]))
    pos_value = next(c for c in classes if _class_name(c) == pos)

    def encode(series: pd.Series) -> np.ndarray:
        known = series.isin(classes).to_numpy()
        if not known.all():
            i = int(np.flatnonzero(~known)[0])
            raise InvalidLabel(f"label column {label!r}: value {series.iloc[i]!r} is neither "
                               f"of the classes {sorted(map(_class_name, classes))} of the "
                               "training sample")
        return (series == pos_value).to_numpy(dtype=np.float32)

    return encode, pos


def load_streamed(cfg: Any, party: str, *, log: Any = None) -> StreamedParty:
    """One party's streamed data (``vfl.data.stream``): its file (``cfg.dataset_for(party)``)
    checked, its encoder fitted (or its public schema, passive party with DP on), its
    rows encoded to the cache.

    Raises:
        ShardError: a bad or mismatched shard (naming the file).
        parties.data.DataError: unknown columns, a bad label, no training rows.
        ConfigError: a regression task (streaming takes binary labels).
    """
    from pubsub.config import ConfigError

    from parties.core.ids import role_of

    if cfg.effective_task != "binary":
        raise ConfigError("vfl.data.stream", "streaming takes a binary label; a regression task "
                                        "runs in memory (vfl.data.stream = false)")
    path = cfg.dataset_for(party)
    info = inspect(path)
    role = role_of(party)
    label = cfg.label if role == "active" else ""
    if role == "active" and not label:
        raise DataError(f"{path!r}: name the label column (vfl.label) to stream it")
    columns = own_columns(cfg, party, info.columns)
    unknown = [c for c in (*columns, *([label] if label else [])) if c not in info.columns]
    if unknown:
        raise UnknownColumn(unknown, list(info.columns))
    if label and label in columns:
        raise InvalidSplit(f"label {label!r} is also a feature column of {party}")
    split = split_for(cfg, info.rows)
    schema_only = role == "passive" and cfg.dp.enabled  # nothing fitted on its rows
    sample = None if schema_only else sample_rows(
        info, [*columns, *([label] if label else [])], lambda p: split(p) == _TRAIN,
        SAMPLE_ROWS, chunk_rows=cfg.data.stream_chunk_rows)  # one read for features and label
    if schema_only:
        encoder: Any = SchemaEncoder(dp_schema(cfg, columns))
    else:
        encoder = fit_encoder(info, columns, split, policy=policy_of(cfg),
                              chunk_rows=cfg.data.stream_chunk_rows,
                              clip_quantile=cfg.data.stream_clip_quantile, log=log, sample=sample)
    encode_label, pos = (None, "")
    if label:
        encode_label, pos = _label_encoder(sample, label, cfg.positive_class)
    rows = write_cache(info, [c for c in columns], split, encoder, label=label,
                       encode_label=encode_label, chunk_rows=cfg.data.stream_chunk_rows,
                       cache_dir=Path(cfg.data.stream_cache_dir) / party if cfg.data.stream_cache_dir
                       else "")  # one directory per party: parties may share a config
    if rows.x_train.n == 0:
        raise InvalidSplit(f"{path!r}: no training rows")
    return StreamedParty(rows=rows, encoder=encoder, columns=columns, label=label,
                         positive=pos)


def own_columns(cfg: Any, party: str, available: Sequence[str]) -> tuple[str, ...]:
    """``party``'s feature columns in its own file (``vfl.data.party_datasets``, or
    ``dataset`` with ``vfl.data.join_key``): the configured ones, else every column of the
    file but the label and the join key."""
    if party == "active":
        own: Sequence[str] = cfg.data.active_columns
    elif party == "passive":
        own = cfg.data.passive_columns
    else:
        i = cfg.party_ids.index(party) - 1
        own = cfg.data.passive_party_columns[i] if cfg.data.passive_party_columns else ()
    return tuple(own) or tuple(c for c in available
                               if c != cfg.label and c != cfg.data.join_key)


def preflight_streamed(cfg: Any) -> dict[str, DatasetInfo]:
    """Before any process starts: every party's file readable, one schema across its
    shards, its columns present, the label in the active party's file, the same row
    count in every party's file (aligned by row order). Reads footers only.

    Raises:
        ShardError: a bad shard, or a party's file with another row count (naming it).
        parties.data.DataError: unknown columns, no label named, a column of two parties.
    """
    infos = {p: inspect(cfg.dataset_for(p)) for p in cfg.party_ids}
    if not cfg.label:
        raise DataError(f"{cfg.dataset_for('active')!r}: name the label column (vfl.label) "
                        "to stream it")
    seen: dict[str, str] = {}
    for p, info in infos.items():
        cols = own_columns(cfg, p, info.columns)
        need = [*cols, *([cfg.label] if p == "active" else [])]
        unknown = [c for c in need if c not in info.columns]
        if unknown:
            raise UnknownColumn(unknown, list(info.columns))
        if p != "active" and cfg.label in cols:
            raise InvalidSplit(f"{p}'s file {cfg.dataset_for(p)!r} holds the label "
                               f"{cfg.label!r}: only the active party has it")
        for c in cols:
            if c in seen:
                raise InvalidSplit(f"column {c!r} is claimed by both {seen[c]} and {p}")
            seen[c] = p
    n = infos["active"].rows
    for p, info in infos.items():
        if info.rows != n:
            raise ShardError(cfg.dataset_for(p), f"{p}'s data has {info.rows:,} rows, the "
                             f"active party's {cfg.dataset_for('active')!r} {n:,}: the files "
                             "must hold the same records in the same order")
    return infos


def stream_feature_widths(cfg: Any) -> dict[str, int]:
    """Each party's encoded width from a training sample of its file (the treatments of
    :func:`fit_encoder`; a passive party with DP on: its public schema's)."""
    from parties.algorithms.schedule import VAL_FRAC
    from parties.data.treatments import IdColumnRefused, classify_columns, encoded_width

    out = {}
    for p, info in preflight_streamed(cfg).items():
        cols = own_columns(cfg, p, info.columns)
        if p != "active" and cfg.dp.enabled:
            out[p] = dp_schema(cfg, cols).width
            continue
        split = HashSplit(seed=cfg.seed, test_frac=cfg.data.test_frac, val_frac=VAL_FRAC)
        rows = sample_rows(info, cols, lambda q: split(q) == _TRAIN, SAMPLE_ROWS,
                           chunk_rows=cfg.data.stream_chunk_rows)
        try:
            out[p] = encoded_width(classify_columns(rows, cols, policy_of(cfg)))
        except IdColumnRefused as exc:
            raise DataError(str(exc)) from None
    return out


__all__ = ["SAMPLE_ROWS", "StreamedParty", "load_streamed", "own_columns",
           "preflight_streamed", "stream_feature_widths", "load_streamed", "DatasetInfo", "HashSplit", "ShardError", "StreamedRows",
           "fit_encoder", "hash_split", "inspect", "iter_chunks", "parquet_files",
           "sample_rows", "write_cache"]
