"""Bounds on a run's inputs and settings against what this machine can hold, checked
before any process starts (:func:`parties.data.launchcheck.check_before_launch`,
:func:`parties.data.launchcheck.check_own_file`) and again where a table is read
(:func:`parties.data.load_table`): a CSV line longer than ``vfl.data.max_line_bytes``
(:func:`scan_lines`, in chunks, never the whole line in memory), more columns than
``vfl.data.max_columns`` (:func:`check_columns`), more workers than this machine's
cores can run (:func:`check_workers`), and a configuration whose models, Adam state,
replicas, buffers and table need more memory than this machine has available
(:func:`estimate_memory`, :func:`check_memory`). Needs neither pandas nor torch.

Owns: :class:`LineScan`, :class:`MemoryEstimate` and the functions above. May import
:mod:`parties.data`'s errors, :mod:`parties.config` (its caps) and :mod:`parties.core`.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parties.config.sections import MAX_COLUMNS, MAX_LINE_BYTES
from parties.data.errors import LineTooLong, TooManyColumns
from pubsub.config import ConfigError

#: bytes read per step of :func:`scan_lines` (at most ``max_line_bytes``)
CHUNK_BYTES = 1 << 20
#: one parameter's bytes with its gradient and Adam's two moments (float32 each)
PARAM_STATE_BYTES = 16
#: one float32 value
FLOAT_BYTES = 4
#: a table cell in a party's memory (float64): each party holds pandas' frame of every
#: column and its own encoded feature columns
CELL_BYTES = 8
#: a Python process with torch imported (a party, a worker process, the broker); measured:
#: each party and worker process of a bank run with process workers 2 + 3 held 180-190 MiB
#: (proportional set size), the whole run 1.95 GB against an estimate of 1.69 GB
PROCESS_BYTES = 200 << 20
#: workers one core may run (thread, process or inline workers), for :func:`check_workers`
WORKERS_PER_CORE = 32
#: feature columns assumed per party of a named dataset (its encoded width, generously)
NAMED_DATASET_COLUMNS = 64


def _open_binary(path: Path) -> Any:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb")


@dataclass(frozen=True, slots=True, kw_only=True)
class LineScan:
    """What :func:`scan_lines` found.

    Attributes:
        lines: the file's lines (the header among them; a last line without a newline
            counts).
        size: its bytes (decompressed, for a ``.gz`` file).
    """

    lines: int
    size: int


def scan_lines(path: str | Path, max_line_bytes: int = MAX_LINE_BYTES) -> LineScan:
    """Count the lines of ``path`` (plain or gzipped) in chunks of at most
    ``max_line_bytes``, refusing the first line longer than ``max_line_bytes`` bytes (its
    newline not counted) as soon as the scan has passed the bound: memory stays at one
    chunk whatever the file holds. A line inside one chunk is shorter than a chunk, so
    only a line that spans chunks is measured.

    Raises:
        LineTooLong: naming the file and the line's number (1 = the first line).
        OSError: the file cannot be read.
    """
    p = Path(path).expanduser()
    step = max(1, min(CHUNK_BYTES, max_line_bytes))
    lines = size = run = 0  # run: bytes of the current line so far
    with _open_binary(p) as f:
        while chunk := f.read(step):
            size += len(chunk)
            first = chunk.find(b"\n")
            if first < 0:
                run += len(chunk)
                if run > max_line_bytes:
                    raise LineTooLong(str(path), lines + 1, max_line_bytes)
                continue
            if run + first > max_line_bytes:
                raise LineTooLong(str(path), lines + 1, max_line_bytes)
            lines += chunk.count(b"\n")
            run = len(chunk) - chunk.rfind(b"\n") - 1
    return LineScan(lines=lines + (run > 0), size=size)


def first_line(path: str | Path, max_line_bytes: int = MAX_LINE_BYTES) -> str:
    """The first line of ``path`` (plain or gzipped; a UTF-8 BOM dropped), read up to
    ``max_line_bytes + 1`` bytes and no further.

    Raises:
        LineTooLong: the line is longer (line 1 of the file).
        OSError, UnicodeDecodeError, EOFError: the file cannot be read as UTF-8.
    """
    p = Path(path).expanduser()
    with _open_binary(p) as f:
        raw = f.readline(max_line_bytes + 2)
    body = raw.rstrip(b"\r\n")
    if len(body) > max_line_bytes:
        raise LineTooLong(str(path), 1, max_line_bytes)
    return body.decode("utf-8-sig")


def check_columns(path: str | Path, count: int, max_columns: int = MAX_COLUMNS) -> None:
    """Raises:
        TooManyColumns: ``count`` (the columns of ``path``) is above ``max_columns``."""
    if count > max_columns:
        raise TooManyColumns(str(path), count, max_columns)


def check_csv_shape(path: str | Path, max_line_bytes: int = MAX_LINE_BYTES,
                    max_columns: int = MAX_COLUMNS) -> LineScan:
    """A CSV file's bounds, before anything reads it as a table: its header line within
    ``max_line_bytes`` and at most ``max_columns`` columns (a header this cannot parse is
    left to the reader that follows), then every line within ``max_line_bytes``
    (:func:`scan_lines`). Returns the scan.

    Raises:
        LineTooLong, TooManyColumns: a bound passed.
        OSError: the file cannot be read.
    """
    import csv

    try:
        header = next(csv.reader([first_line(path, max_line_bytes)]), [])
    except (UnicodeDecodeError, csv.Error, EOFError):
        header = []
    check_columns(path, len(header), max_columns)
    return scan_lines(path, max_line_bytes)


def check_workers(cfg: Any, cores: int | None = None,
                  parties: Sequence[str] | None = None) -> None:
    """Refuse a worker count this machine cannot run: more than
    :data:`WORKERS_PER_CORE` per core (``cores``: default ``os.cpu_count()``) for any
    party of ``parties`` (default: every party of ``cfg``).

    Raises:
        ConfigError: naming ``vfl.workers.active``, ``vfl.workers.passive`` or
            ``vfl.workers.per_passive_party``.
    """
    cores = max(1, cores or os.cpu_count() or 1)
    cap = WORKERS_PER_CORE * cores
    for party in parties or cfg.party_ids:
        w = cfg.workers_for(party)
        if w > cap:
            key = ("vfl.workers.active" if party == "active" else
                   "vfl.workers.per_passive_party" if cfg.workers.per_passive_party
                   else "vfl.workers.passive")
            raise ConfigError(key, f"{party} would run {w:,} workers: this machine has "
                              f"{cores} core{'s' if cores != 1 else ''}, so at most "
                              f"{cap:,} ({WORKERS_PER_CORE} per core)")


def mlp_params(widths: Sequence[int]) -> int:
    """Parameters of a Linear stack through ``widths`` (weights and biases)."""
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def resnet_params(d_in: int, d_out: int, *, depth: int, width: int) -> int:
    """Parameters of :class:`parties.models.zoo.ResidualMlp` (its norms counted as two
    vectors per layer, which bounds each kind)."""
    block = 2 * (width * width + width) + 2 * 2 * width
    return d_in * width + width + depth * block + width * d_out + d_out


def model_params(spec: str, d_in: int, d_out: int, hidden: Sequence[int],
                 model: Any) -> int:
    """Parameters of a bottom or top model ``spec`` (``"resnet"``, else counted as the
    ``"mlp"`` through ``hidden``: a custom model's own size is not known before it is
    built)."""
    if spec == "resnet":
        return resnet_params(d_in, d_out, depth=model.resnet_depth, width=model.resnet_width)
    return mlp_params([d_in, *hidden, d_out])


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """The memory a run needs on this machine, in parts, each charged to the setting
    that sizes it.

    Attributes:
        parts: ``(key, bytes, what)`` per part: ``key`` the dotted setting (or ``""``
            for the processes themselves), ``what`` a few words; in this order: the
            models (the widest layer's key), a batch's activations and the buffers
            (``vfl.batch_size``), the table (``vfl.dataset``), the workers' replicas (the
            key of the party with the most workers), the processes.
    """

    parts: tuple[tuple[str, int, str], ...]

    @property
    def total(self) -> int:
        """Bytes, every part together."""
        return sum(b for _, b, _ in self.parts)

    def culprit(self, free: int) -> str:
        """The setting to name when the run needs more than ``free`` bytes: in the order
        of :attr:`parts` (the models' widths, the batch, the table, then the workers, whose
        replicas are copies of the models), the first whose part alone needs more than ``free``;
        else, largest first, the first without which the rest would fit; else the
        largest."""
        named = [(b, k) for k, b, _ in self.parts if k]
        if not named:
            return ""
        for b, k in named:
            if b > free:
                return k
        by_size = sorted(named, reverse=True)
        for b, k in by_size:
            if self.total - b <= free:
                return k
        return by_size[0][1]


def _width_key(model: Any, roles: Sequence[str]) -> str:
    """The model setting with the widest layer: the one to name when models do not fit."""
    cands: list[tuple[int, str]] = [(model.embedding_dim, "vfl.model.embedding_dim")]
    if model.bottom == "resnet" or model.top == "resnet":
        cands.append((model.resnet_width, "vfl.model.resnet_width"))
    for role in ("active", "passive"):
        if role in roles:
            own = f"{role}_bottom_hidden"
            key = own if getattr(model, own) else "bottom_hidden"
            cands.append((max(model.bottom_hidden_for(role), default=0), f"vfl.model.{key}"))
    if "active" in roles:
        cands.append((max(model.top_hidden, default=0), "vfl.model.top_hidden"))
    return max(cands, key=lambda c: c[0])[1]  # ties: the first (embedding_dim)


def estimate_memory(cfg: Any, *, columns: Mapping[str, int], rows: int | Mapping[str, int],
                    table_columns: int | Mapping[str, int], parties: Sequence[str] | None = None,
                    broker: bool = True, table_key: str = "vfl.dataset") -> MemoryEstimate:
    """The memory ``cfg`` needs on this machine, from its settings and its table's shape,
    before anything is built: per party process of ``parties`` (default: every party):
    its bottom model (and the active party's top) from the encoded input width
    (``columns[party]``, its feature columns: one-hot levels and hashed embeddings not
    counted, so this is a floor), each width and ``embedding_dim``, with gradients and
    Adam's moments (:data:`PARAM_STATE_BYTES` a parameter), once at its parameter server
    and once per worker replica, plus the passive workers' in-flight parameter snapshots
    (``inflight_max − 1``); the activations of a batch per worker; the p/q buffers of
    batch × embedding; the table each party reads whole (``rows`` × (``table_columns``
    + its own encoded columns) cells at :data:`CELL_BYTES`; 0 rows for a streamed
    table); and
    :data:`PROCESS_BYTES` per process (the party, its worker processes under
    ``workers.mode = "process"``, the broker when ``broker``). ``rows`` and
    ``table_columns``: the table's, or each party's own (per-party files). ``table_key``: the setting
    the table's part is charged to (``vfl.data.synthetic_rows`` for the generated table).
    """
    model, work = cfg.model, cfg.workers
    parties = tuple(parties or cfg.party_ids)
    roles = sorted({"active" if p == "active" else "passive" for p in parties})
    emb, batch, n = model.embedding_dim, cfg.batch_size, cfg.passive_parties
    top_spec = model.top or ("resnet" if model.bottom == "resnet" else "mlp")
    top_in = emb * (1 + n) if cfg.fuse == "concat" else emb
    base = batches = replicas = table = procs = 0
    worst_w, worst_party = 0, parties[0]
    for party in parties:
        role = "active" if party == "active" else "passive"
        d_in = max(1, columns.get(party, 1))
        hidden = model.bottom_hidden_for(role)
        params = model_params(model.bottom, d_in, emb, hidden, model)
        widths = d_in + sum(hidden) + emb
        if role == "active":
            params += model_params(top_spec, top_in, 1, model.top_hidden, model)
            widths += top_in + sum(model.top_hidden)
        w = cfg.workers_for(party)
        copy = params * PARAM_STATE_BYTES
        acts = 2 * batch * widths * FLOAT_BYTES  # forward values and their gradients
        buffers = (work.p + work.q) * batch * emb * FLOAT_BYTES * (n if role == "active" else 1)
        base += copy
        batches += acts + buffers
        snapshots = (work.inflight_max - 1) * params * FLOAT_BYTES if role == "passive" else 0
        replicas += w * (copy + acts + snapshots)
        procs += PROCESS_BYTES * (1 + (w if work.mode == "process" else 0))
        n_rows = rows.get(party, 0) if isinstance(rows, Mapping) else rows
        n_cols = (table_columns.get(party, 0) if isinstance(table_columns, Mapping)
                  else table_columns)
        table += n_rows * (n_cols + d_in) * CELL_BYTES
        if w > worst_w:
            worst_w, worst_party = w, party
    wkey = ("vfl.workers.active" if worst_party == "active" else
            "vfl.workers.per_passive_party" if work.per_passive_party else "vfl.workers.passive")
    procs += PROCESS_BYTES if broker else 0
    return MemoryEstimate(parts=(
        (_width_key(model, roles), base, "models with gradients and Adam state"),
        ("vfl.batch_size", batches, "a batch's activations and the p/q buffers"),
        (table_key, table, _table_words(rows, table_columns)),
        (wkey, replicas, "the workers' replicas"),
        ("", procs, "the processes"),
    ))


def _table_words(rows: int | Mapping[str, int], columns: int | Mapping[str, int]) -> str:
    if isinstance(rows, Mapping) or isinstance(columns, Mapping):
        return "each party's table"
    return f"the table, {rows:,} rows x {columns:,} columns, in each party"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def check_memory(estimate: MemoryEstimate, available: tuple[int, str] | None = None) -> None:
    """Refuse a run whose :class:`MemoryEstimate` is above what this machine can hold
    (``available``: bytes and their source, default
    :func:`parties.core.sysinfo.memory_available`).

    Raises:
        ConfigError: naming the setting to change (:meth:`MemoryEstimate.culprit`),
            the estimate by part and the memory available.
    """
    if available is None:
        from parties.core.sysinfo import memory_available

        available = memory_available()
    free, source = available
    total = estimate.total
    if total <= free:
        return
    parts = ", ".join(f"{what} {_gib(b)}" for _, b, what in estimate.parts if b)
    raise ConfigError(estimate.culprit(free), f"the run needs about {_gib(total)} of "
                      f"memory ({parts}), more than the {_gib(free)} this machine has "
                      f"({source}): make it smaller")


__all__ = ["CELL_BYTES", "CHUNK_BYTES", "LineScan", "MemoryEstimate", "PARAM_STATE_BYTES",
           "PROCESS_BYTES", "WORKERS_PER_CORE", "check_columns", "check_csv_shape", "check_memory",
           "check_workers", "estimate_memory", "first_line", "mlp_params", "model_params",
           "resnet_params", "scan_lines"]
