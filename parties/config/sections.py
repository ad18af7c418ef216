"""The sections of the VFL run configuration below ``[vfl]``: ``[vfl.data]``,
``[vfl.model]``, ``[vfl.workers]``, ``[vfl.timeouts]``, ``[vfl.wire]`` (``[vfl.dp]`` is
:mod:`parties.config.privacy`). Each is a frozen dataclass that checks its own values;
checks across sections live in :class:`parties.config.vfl.VflConfig`. May import
:mod:`parties.core` and :mod:`parties.algorithms` (the names the values are checked
against).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from parties.algorithms.schedule import PS_UPDATES
from parties.algorithms.wire import WIRE_DTYPES
from parties.core.ids import role_of
from pubsub.config import ConfigError

#: How the active party's workers hold the top model under ``pubsub`` (``workers.top_update``).
TOP_UPDATES = ("replica", "shared")
#: ``vfl.data.id_columns``: what a column that looks like a record ID gets
#: (:mod:`parties.data.treatments`)
ID_COLUMN_MODES = ("drop", "refuse", "keep")
#: Where a party's worker compute runs (``vfl.workers.mode``).
WORKER_MODES = ("auto", "thread", "process", "inline")
#: The widest layer a model setting may name (``vfl.model.embedding_dim``, the hidden
#: widths, ``resnet_width``): a sanity cap; what the machine can hold is checked before
#: launch (:func:`parties.data.limits.check_memory`).
MAX_WIDTH = 1 << 20
#: The most residual blocks ``vfl.model.resnet_depth`` may name (a sanity cap).
MAX_DEPTH = 1024
#: The most workers per party (``vfl.workers.*``), and the most buffered messages or
#: batches in flight (``p``, ``q``, ``inflight_max``, ``staleness_bound``): a sanity cap;
#: the cap for this machine's cores is checked before launch
#: (:func:`parties.data.limits.check_workers`).
MAX_WORKERS = 1024
#: ``vfl.data.max_line_bytes``'s default: 16 MiB.
MAX_LINE_BYTES = 16 << 20
#: ``vfl.data.max_columns``'s default.
MAX_COLUMNS = 20_000
#: The largest ``vfl.data.max_columns`` may be.
MAX_COLUMNS_CAP = 1_000_000


def _bad(section: Any) -> Callable[[str, str], ConfigError]:
    """An error for ``key`` of ``section`` naming its dotted key and its value."""

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{section.SECTION}.{key}", f"{why}, got {getattr(section, key)!r}")

    return bad


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSection:
    """``[vfl.data]``: the table: which file, which columns to whom, the split, the encoders, streaming.

    Attributes:
        active_columns / passive_columns: each party's feature columns (set both or
            neither; default: an even split of all non-label columns in table order, the
            first half, rounded up, to the active party). Written as TOML/JSON lists
            (``'["a","b"]'``) or plain ``a,b``.
        passive_party_columns: with several passive parties, each one's feature
            columns, in party order (with ``data.active_columns``; default: the feature
            columns cut into contiguous groups, :func:`parties.data.default_split_n`).
        synthetic_rows / synthetic_features / synthetic_informative / synthetic_seed:
            size, informative feature count (2 … ``data.synthetic_features``) and generator
            seed of the ``synthetic`` dataset (ignored for other datasets); see
            :func:`parties.data.make_synthetic`.
        test_frac: test share of the rows (seeded, unstratified split).
        active_features: with no explicit column lists, the first this many feature
            columns go to the active party and the rest to the passive party (0, the
            default: an even split); e.g. 50 on ``synthetic`` 500 gives 50:450.
        onehot_max_levels: a categorical column with at most this many levels in the
            training rows is one-hot encoded; one with more is hashed into an embedding
            table inside the bottom model (default 64; :mod:`parties.data.treatments`).
        hash_buckets: the most buckets (embedding rows) a hashed column gets (default
            4096; a column gets the power of two >= 2 x its levels, capped here).
        hash_embedding_dim: the width of a hashed column's embedding (default 8).
        id_columns: an ID-like column (almost every value distinct): ``"drop"`` (the
            default, with a warning naming it), ``"refuse"`` (exit 2 naming it) or
            ``"keep"``.
        categorical_columns: columns treated as categorical although numeric (codes such
            as an industry or occupation code).
        stream: read each party's Parquet file (or directory of shards) in chunks and
            train from an encoded on-disk cache instead of holding the table in memory
            (:mod:`parties.data.stream`; the row split is then per-row hashed,
            :func:`parties.data.stream.hash_split`); binary labels only.
        party_datasets: each party's own file, in party order (active, passive,
            passive2 …; a Parquet file or a directory of shards); () = ``dataset`` for
            every party. The files are aligned by row order (row i is the same record in
            every file), each holds that party's columns (and the active party's the
            label). The launchers (``psfl vfl run``, :mod:`sim.api`) read every file's
            Parquet footers before anything starts, so they refuse a CSV here
            (``psfl data convert`` writes Parquet shards from one).
        shuffle: the epoch's batch order: ``"full"`` (a permutation of every row),
            ``"block"`` (:class:`parties.algorithms.schedule.BlockBatches`: permuted row blocks, rows
            shuffled within a window) or ``""`` (the default: block when streaming).
        shuffle_block_rows / shuffle_window_rows: the block and window of ``"block"``
            (defaults 4096 and 65536 rows).
        stream_chunk_rows: rows per chunk read from the file (default 65536).
        stream_eval_max_rows: streaming: the most test rows scored (a seeded, hashed
            subset; default 100,000; 0 = all; validation has its own cap).
        stream_clip_quantile: ``q``: a numeric column's values (datetime parts
            included) are clipped to its ``[q, 1 - q]`` quantiles before standardising,
            on training, validation, test and new rows alike (default 0.001: the 0.1 %
            and 99.9 % quantiles; 0 = no clipping). Both paths: streaming takes the
            quantiles of a training sample, in memory those of every training row, and a
            saved model keeps the bounds. With DP on, the passive party clips to its
            public schema's declared ranges instead.
        max_line_bytes: the longest line a CSV file may have, in bytes (default
            16 MiB): a longer one is refused naming the file and its line number
            (:class:`parties.data.LineTooLong`), found by a scan in chunks before anything
            starts, without reading the line into memory.
        max_columns: the most columns a file may have (default 20,000; at most
            1,000,000): more are refused naming the count
            (:class:`parties.data.TooManyColumns`) before anything starts.
        stream_cache_dir: where the encoded cache goes, in a subdirectory per party
            (``<dir>/<party>``; "" = a temporary directory, removed at the end).
        row_split: how rows are split into training, validation and test rows:
            ``"permutation"`` (a seeded permutation, :func:`parties.data.train_test_indices`),
            ``"hash"`` (per row, from its position and the seed:
            :class:`parties.data.stream.HashSplit`) or ``""`` (the default: hash when
            streaming, else permutation; streaming needs hash). An in-memory run with
            ``"hash"`` trains and tests on the same rows as a streamed one.
        active_rows_file / passive_rows_file: the party's output of ``psfl vfl align``
            (``aligned-<role>.csv``: the shared IDs sorted and each one's ``row`` in the
            party's table): the party trains on those rows of ``dataset``, in that
            order, so both parties list the same records in the same order. "" = every
            row, matched by position. Set both or neither. Not a shared setting (the row
            count is), but the parties compare a keyed hash of the ordered shared IDs in
            their hello, so rows files that list other records, or the same in another
            order, end the run with exit 4 (``aligned_ids``); the rows used show as
            ``n_rows`` in ``events.jsonl`` (``vfl.data_loaded``). ``data.passive_rows_file``
            is for one passive party.
        join_key: the column that identifies a record in every party's own file (a
            customer ID): never a feature, and the column :func:`parties.cli.run_job_party`
            aligns the parties' files on (private set intersection) before training and
            predicting. A shared setting (part of the handshake's digest). "" = none.
        passive_party_rows_files: with several passive parties, each one's
            ``aligned-<party>.csv`` of an N-way ``psfl vfl align``, in party order (with
            ``data.active_rows_file``; set all or none; ``data.passive_rows_file`` is then
            refused). () = every row.
    """

    SECTION: ClassVar[str] = "vfl.data"

    active_columns: tuple[str, ...] = ()
    passive_columns: tuple[str, ...] = ()
    passive_party_columns: tuple[tuple[str, ...], ...] = ()
    active_features: int = 0
    test_frac: float = 0.3
    row_split: str = ""
    party_datasets: tuple[str, ...] = ()
    active_rows_file: str = ""
    passive_rows_file: str = ""
    passive_party_rows_files: tuple[str, ...] = ()
    join_key: str = ""
    categorical_columns: tuple[str, ...] = ()
    id_columns: str = "drop"
    onehot_max_levels: int = 64
    hash_buckets: int = 4096
    hash_embedding_dim: int = 8
    synthetic_rows: int = 100_000
    synthetic_features: int = 100
    synthetic_informative: int = 20
    synthetic_seed: int = 0
    shuffle: str = ""
    shuffle_block_rows: int = 4096
    shuffle_window_rows: int = 65536
    stream: bool = False
    stream_chunk_rows: int = 65536
    stream_eval_max_rows: int = 100_000
    stream_clip_quantile: float = 0.001
    stream_cache_dir: str = ""
    max_line_bytes: int = MAX_LINE_BYTES
    max_columns: int = MAX_COLUMNS

    def __post_init__(self) -> None:
        bad = _bad(self)
        if self.synthetic_rows < 2:
            raise bad("synthetic_rows", "must be >= 2")
        if self.synthetic_features < 2:
            raise bad("synthetic_features", "must be >= 2")
        if not 2 <= self.synthetic_informative <= self.synthetic_features:
            raise bad("synthetic_informative",
                      f"must be in 2 .. synthetic_features ({self.synthetic_features})")
        if not 0 <= self.synthetic_seed < 2**32:
            raise bad("synthetic_seed", "must be in 0 .. 2**32-1")
        if not 0.0 < self.test_frac < 1.0:
            raise bad("test_frac", "must be in (0, 1)")
        if self.active_features < 0:
            raise bad("active_features", "must be >= 0 (0: an even split)")
        if self.active_features and (self.active_columns or self.passive_columns
                                     or self.passive_party_columns):
            raise bad("active_features", "give either a feature count or column lists, "
                      "not both")
        for key in ("onehot_max_levels", "hash_buckets"):
            if getattr(self, key) < 2:
                raise bad(key, "must be >= 2")
        if self.hash_embedding_dim < 1:
            raise bad("hash_embedding_dim", "must be >= 1")
        if self.id_columns not in ID_COLUMN_MODES:
            raise bad("id_columns", f"must be one of {ID_COLUMN_MODES}")
        if self.row_split not in ("", "permutation", "hash"):
            raise bad("row_split", "must be 'permutation', 'hash' or '' (hash when streaming)")
        if self.stream and self.row_split == "permutation":
            raise bad("row_split", "streaming splits rows by hash ('hash' or '')")
        if self.shuffle not in ("", "full", "block"):
            raise bad("shuffle", "must be 'full', 'block' or '' (block when streaming)")
        for key in ("shuffle_block_rows", "shuffle_window_rows", "stream_chunk_rows"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        if not 1024 <= self.max_line_bytes <= 1 << 40:
            raise bad("max_line_bytes", "must be in 1024 .. 2**40")
        if not 1 <= self.max_columns <= MAX_COLUMNS_CAP:
            raise bad("max_columns", f"must be in 1 .. {MAX_COLUMNS_CAP:,}")
        if self.stream_eval_max_rows < 0:
            raise bad("stream_eval_max_rows", "must be >= 0 (0 = every test row)")
        if not 0.0 <= self.stream_clip_quantile < 0.5:
            raise bad("stream_clip_quantile", "must be in [0, 0.5)")
        for key in ("party_datasets", "passive_party_rows_files"):
            if any(not f for f in getattr(self, key)):
                raise bad(key, "has an empty file name")
        if self.stream and (self.active_rows_file or self.passive_rows_file
                            or self.passive_party_rows_files):
            raise bad("stream", "reads files aligned by row order; the rows files of psfl vfl "
                      "align select rows at random: write aligned files first (psfl data "
                      "convert --rows aligned-<party>.csv)")


    @property
    def effective_row_split(self) -> str:
        """``row_split``, or hash when streaming, else permutation."""
        return self.row_split or ("hash" if self.stream else "permutation")

    @property
    def effective_shuffle(self) -> str:
        """The batch order: ``shuffle``, or block when streaming."""
        return self.shuffle or ("block" if self.stream else "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSection:
    """``[vfl.model]``: the bottom and top models and the cut layer.

    Attributes:
        bottom_hidden: hidden widths of each bottom model.
        active_bottom_hidden / passive_bottom_hidden: that party's own bottom widths
            (empty, the default: ``model.bottom_hidden``). Under unequal CPU shares, balance
            the parties' compute per sample by giving the party with fewer cores the
            smaller model (see :meth:`bottom_hidden_for`).
        embedding_dim: cut-layer width (each party's embedding size). Every width is at
            most 1,048,576 (``resnet_depth`` at most 1,024), and before launch the
            models, their Adam state and replicas must fit this machine's memory
            (:func:`parties.data.limits.check_memory`).
        top_hidden: hidden widths of the top model (``model.top`` ``"mlp"``).
        bottom: the bottom models: ``"mlp"`` (the default: ``model.bottom_hidden`` Linear/ReLU
            stacks), ``"resnet"`` (the paper's large model, residual MLP blocks, see
            ``resnet_*``) or ``"package.module:callable"`` called as
            ``bottom(d_in, d_out) -> nn.Module`` (importable in every process). See
            :mod:`parties.models.zoo` and docs/tutorials/your-own-model.md. ``--model`` on
            ``psfl vfl run`` sets it. A non-default spec is probed before anything starts
            (a typed error, exit 2).
        top: the top model, same forms (called as ``top(d_in, d_out)`` with
            ``d_in = 2·embedding_dim``, ``d_out = 1``); empty (the default): ``"resnet"``
            when ``model.bottom = "resnet"``, else ``"mlp"`` (``model.top_hidden``).
        resnet_depth: residual blocks of a ``resnet`` model (default 4; 0 = input and
            output projections only).
        resnet_width: hidden width of a ``resnet`` model (default 256).
        resnet_norm: normalisation inside each residual block: ``"layer"`` (LayerNorm,
            the default), ``"batch"`` (BatchNorm1d: running statistics live in the
            parameter-server vector, see :mod:`parties.models.model`), ``"group"`` (GroupNorm,
            at most 8 groups) or ``"none"``.
        resnet_dropout: dropout probability inside each residual block, in [0, 1)
            (default 0; refused in the passive bottom with DP on).
    """

    SECTION: ClassVar[str] = "vfl.model"

    bottom: str = "mlp"
    top: str = ""
    bottom_hidden: tuple[int, ...] = (64,)
    active_bottom_hidden: tuple[int, ...] = ()
    passive_bottom_hidden: tuple[int, ...] = ()
    top_hidden: tuple[int, ...] = (32,)
    embedding_dim: int = 32
    resnet_depth: int = 4
    resnet_width: int = 256
    resnet_norm: str = "layer"
    resnet_dropout: float = 0.0

    def __post_init__(self) -> None:
        bad = _bad(self)
        from parties.config.modelspec import check_resnet_settings, check_spec

        check_spec("model.bottom", self.bottom)
        check_spec("model.top", self.top, allow_empty=True)
        wrong = check_resnet_settings(self.resnet_depth, self.resnet_width, self.resnet_norm,
                                      self.resnet_dropout)
        if wrong is not None:
            raise bad(wrong, {"resnet_depth": "must be >= 0",
                              "resnet_width": "must be >= 1",
                              "resnet_norm": "must be 'layer', 'batch', 'group' or 'none'",
                              "resnet_dropout": "must be in [0, 1)"}[wrong])
        for key in ("bottom_hidden", "active_bottom_hidden", "passive_bottom_hidden",
                    "top_hidden"):
            if any(h < 1 for h in getattr(self, key)):
                raise bad(key, "hidden widths must be >= 1")
        for key in ("bottom_hidden", "active_bottom_hidden", "passive_bottom_hidden",
                    "top_hidden"):
            if any(h > MAX_WIDTH for h in getattr(self, key)):
                raise bad(key, f"hidden widths must be <= {MAX_WIDTH:,}")
        if not 1 <= self.embedding_dim <= MAX_WIDTH:
            raise bad("embedding_dim", f"must be in 1 .. {MAX_WIDTH:,}")
        if self.resnet_width > MAX_WIDTH:
            raise bad("resnet_width", f"must be <= {MAX_WIDTH:,}")
        if self.resnet_depth > MAX_DEPTH:
            raise bad("resnet_depth", f"must be <= {MAX_DEPTH:,}")


    def bottom_hidden_for(self, role: str) -> tuple[int, ...]:
        """Hidden widths of ``role``'s bottom model: its own setting, else
        ``bottom_hidden``."""
        if role not in ("active", "passive"):
            raise ValueError(f"role must be 'active' or 'passive', got {role!r}")
        own = self.active_bottom_hidden if role == "active" else self.passive_bottom_hidden
        return own or self.bottom_hidden


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkersSection:
    """``[vfl.workers]``: each party's workers, how they sync with its parameter server, their
    buffers and windows, threads and CPUs.

    Attributes:
        ps_update: how a party's parameter server combines its workers under ``pubsub``
            and ``avfl-ps`` (with two or more workers; the other algorithms average):
            ``"average"`` (each worker trains its own replica with its own optimizer and
            pushes its change, θ ← θ + Δ/w, every ΔT_t steps: local-SGD averaging) or
            ``"gradient"`` (each worker pushes every step's gradient, which the server's
            one optimizer applies at the unscaled ``lr``, and pulls the new parameters:
            asynchronous SGD: a gradient is at most w − 1 of the party's steps stale;
            ``lr_scaling`` and ΔT_t do not apply); works with every ``workers.mode``;
            :class:`parties.models.model.ParameterServer`.
        top_update: how the active party's workers hold the top model under ``pubsub``
            with two or more active workers averaged by their PS: ``"shared"`` (the
            default: one top at the PS, stepped in batch order at the unscaled ``lr``
            under its lock, so no top step is stale, and a batch-norm top's running
            statistics live there too; the workers' bottom replicas are averaged as
            before; process workers send the fused cut-layer input to the party process
            for the top step, one more round trip per step over their socket;
            :meth:`parties.models.model.ParameterServer.share_top`) or
            ``"replica"`` (each worker's replica holds its own top, averaged with the
            bottom). ``avfl-ps`` and ``workers.ps_update = "gradient"`` always use replicas.
        active: the active party's workers (``vfl``, ``avfl``: always 1; ``vfl-ps``:
            min of ``workers.active`` and ``workers.passive``, paired).
        passive: each passive party's workers (``vfl``, ``avfl``: always 1; ``vfl-ps``:
            as ``workers.active``; several passive parties: ``workers.per_passive_party``).
            Every worker count is at most 1,024, and before launch at most 32 per core
            of this machine (:func:`parties.data.limits.check_workers`); the models'
            replicas must fit its memory (:func:`parties.data.limits.check_memory`).
        per_passive_party: with several passive parties, each one's worker count, in
            party-id order (each >= 1); () (the default): every passive party runs
            ``workers.passive``. Each party's learning-rate scaling (``lr_scaling``) follows its
            own count; ``psfl vfl plan`` chooses one per party. ``vfl-ps`` pairs workers
            across all parties, so it takes equal counts only (else exit 2 naming the
            key). Part of the settings digest the parties compare in their handshake. See
            :meth:`workers_for_party`.
        delta_t0: ΔT0 of the semi-async schedule: in epoch t a worker syncs with its PS
            every ΔT_t = ceil(ΔT0/2 · tanh(2t/ΔT0 − 2) + ΔT0/2) local steps (``pubsub``),
            growing to ΔT0; 1 = sync after every step. A party with one worker does not
            sync on its own: the flush after each training segment keeps its PS current.
        p / q: per-batch buffer capacity for embeddings / gradients (messages, FIFO eviction).
        torch_threads: intra-op threads per party process.
        active_torch_threads / passive_torch_threads: that role's own intra-op threads
            (0, the default: ``workers.torch_threads``); party processes only (the in-memory
            transport runs both parties in one process, with ``workers.torch_threads``).
        staleness_bound: ``avfl``/``avfl-ps``: the most batches a passive worker may
            have published without their gradient applied (1 = lock-step); the
            default 5 matches the per-batch buffers p = q = 5 (gradients are then at
            most 4 updates stale).
        inflight_max: ``pubsub``: the most batches one passive worker keeps in flight
            (embedding published, gradient not yet back), >= 1; 1 = each worker waits
            for a batch's gradient before it embeds the next (the behaviour before the
            window). Above 1, a batch embedded while others are in flight runs its
            forward on a snapshot of the worker's parameters and is back-propagated
            through it (weight stashing), so its gradient is at most ``inflight_max − 1``
            of the worker's own updates stale. Default 4.
        inflight_auto: ``pubsub``: size each passive worker's window from the round trip
            the run measures of its own embeddings and gradients (publication to
            gradient), the worker's own compute and the active party's reported pace:
            ``ceil((rtt + step) / max(step, pace·w_passive))`` in ``[1, inflight_max]``,
            so 1 on a fast link and more across a slow one
            (:class:`parties.algorithms.schedule.InflightWindow`); false: always ``workers.inflight_max``.
            The measurements go in ``metrics.json`` (``link``).
        mode: ``"thread"`` (workers are threads of the party process: cheap
            hand-offs; torch kernels release the GIL, so compute-heavy models overlap,
            but tiny ones serialise on it) or ``"process"`` (one child process per
            worker: fully parallel, at the price of an IPC hop per step) or ``"inline"``
            (the compute runs on the party's event-loop thread between its I/O: no
            hand-offs, no parallelism; for a party with one core, see
            :class:`parties.runtime.workers.InlineWorker`), or ``"auto"`` (the default):
            ``"inline"`` when the party has at most one core (pinned to one CPU, or a
            cgroup quota of at most 1), else ``"thread"`` (:meth:`resolved_worker_mode`).
            Measured: 2 threads ran 1.66× the batches/s of 1 for a 250→10×128 MLP, but
            1.0× for the demo's model alone.
        active_cpus / passive_cpus: CPU ids the party's process, its threads and its
            worker processes are pinned to (``os.sched_setaffinity``, Linux) when the
            party starts; empty (the default) = not pinned. Not a shared setting: each
            party reads only its own key. ``cpu_util`` is then relative to these cores.
    """

    SECTION: ClassVar[str] = "vfl.workers"

    active: int = 2
    passive: int = 2
    per_passive_party: tuple[int, ...] = ()
    mode: str = "auto"
    delta_t0: int = 5
    p: int = 5
    q: int = 5
    ps_update: str = "average"
    top_update: str = "shared"
    staleness_bound: int = 5
    inflight_max: int = 4
    inflight_auto: bool = True
    torch_threads: int = 1
    active_torch_threads: int = 0
    passive_torch_threads: int = 0
    active_cpus: tuple[int, ...] = ()
    passive_cpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        bad = _bad(self)
        for key in ("active", "passive", "delta_t0", "p", "q", "torch_threads",
                    "staleness_bound", "inflight_max"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        for key in ("active_torch_threads", "passive_torch_threads"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0 (0: torch_threads)")
        if any(c < 1 for c in self.per_passive_party):
            raise bad("per_passive_party", "worker counts must be >= 1")
        for key in ("active", "passive", "p", "q", "inflight_max", "staleness_bound"):
            if getattr(self, key) > MAX_WORKERS:
                raise bad(key, f"must be <= {MAX_WORKERS:,}")
        if any(c > MAX_WORKERS for c in self.per_passive_party):
            raise bad("per_passive_party", f"worker counts must be <= {MAX_WORKERS:,}")
        if self.ps_update not in PS_UPDATES:
            raise bad("ps_update", f"must be one of {PS_UPDATES}")
        if self.top_update not in TOP_UPDATES:
            raise bad("top_update", f"must be one of {TOP_UPDATES}")
        if self.mode not in WORKER_MODES:
            raise bad("mode", "must be 'auto', 'process', 'thread' or 'inline'")
        for key in ("active_cpus", "passive_cpus"):
            cpus = getattr(self, key)
            if any(c < 0 for c in cpus) or len(set(cpus)) != len(cpus):
                raise bad(key, "must be distinct CPU ids >= 0")


    def resolved_mode(self, cores: float) -> str:
        """``mode`` with ``"auto"`` resolved for a party with ``cores`` allotted cores:
        ``"inline"`` with at most one core (the loop and compute threads would only take
        turns on it: measured on ``synthetic`` 30,000 x 500, the paper's small model, each
        party pinned to one core, efficiency 0.79-0.84 inline vs 0.63-0.72 with thread
        workers), else ``"thread"`` (a cgroup quota of 1.5625 cores, say, needs two
        compute threads to be used)."""
        if self.mode != "auto":
            return self.mode
        return "inline" if cores <= 1 else "thread"

    def threads_for(self, role: str) -> int:
        """Intra-op threads of ``role``'s process (a role or a party id): its own
        setting, else ``torch_threads``."""
        own = (self.active_torch_threads if role_of(role) == "active"
               else self.passive_torch_threads)
        return own or self.torch_threads

    def cpus(self, role: str) -> tuple[int, ...]:
        """The CPU ids ``role`` (``"active"``/``"passive"``) is pinned to; empty: not pinned."""
        if role not in ("active", "passive"):
            raise ValueError(f"role must be 'active' or 'passive', got {role!r}")
        return self.active_cpus if role == "active" else self.passive_cpus


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutsSection:
    """``[vfl.timeouts]``: how long a party waits for its partner, and how much of a late or
    bad partner it tolerates.

    Attributes:
        t_ddl_s: T_ddl, how long a worker waits for its partner's data before the
            batch is dropped and reassigned, seconds; 0 = no deadline-based dropping
            (a wait then fails the run after ``timeouts.liveness_timeout_s``). Used by ``pubsub``,
            ``avfl`` and ``avfl-ps``; ``vfl`` and ``vfl-ps`` never drop.
        max_reassign: how often a dropped batch is reassigned before it is skipped for
            the epoch. With a DP target, the passive party's reassigned attempts are
            also limited per record by ``dp.reassign_reserve`` (the privacy plan does not
            depend on ``timeouts.max_reassign``).
        liveness_timeout_s: partner heartbeats missing this long fail the run, seconds.
        peer_max_bad_messages: malformed embeddings or gradients (wrong shape or dtype,
            values that are not finite, bad metadata, or an epoch, batch id or channel
            outside the run's plan) from the partner that end the run (exit 4); each is
            dropped and counted before (``parties.algorithms.intake``). Those from other
            bus clients are only dropped and counted (``rejected_by_sender``).
        handshake_timeout_s: deadline for both parties to find each other, seconds.
        resend_interval_s: a message of an exchange that happens once (the passive
            party's validation or test embeddings and its end-of-run report, the active
            party's "scored" and "done", a prediction's release; a training gradient
            once, which the active party publishes again if it sent it) not received
            after this long is asked for again, every this long until
            ``timeouts.liveness_timeout_s``: a message lost to a broker restart is
            published again (the same bytes, so under DP the same release: nothing more
            is spent); "done" is acknowledged. Seconds; 0 = never ask.
        heartbeat_interval_s: heartbeat period, seconds.
        connect_timeout_s: broker handshake deadline, seconds.
    """

    SECTION: ClassVar[str] = "vfl.timeouts"

    t_ddl_s: float = 10.0
    max_reassign: int = 3
    liveness_timeout_s: float = 30.0
    handshake_timeout_s: float = 60.0
    heartbeat_interval_s: float = 1.0
    connect_timeout_s: float = 10.0
    peer_max_bad_messages: int = 16
    resend_interval_s: float = 2.0

    def __post_init__(self) -> None:
        bad = _bad(self)
        if not 0.0 <= self.resend_interval_s < math.inf:
            raise bad("resend_interval_s", "must be >= 0 seconds (0: never ask again)")
        if not 0.0 <= self.t_ddl_s < math.inf:
            raise bad("t_ddl_s", "must be >= 0 seconds (0: no deadline-based dropping)")
        if self.max_reassign < 0:
            raise bad("max_reassign", "must be >= 0")
        if self.peer_max_bad_messages < 1:
            raise bad("peer_max_bad_messages", "must be >= 1")
        for key in ("liveness_timeout_s", "handshake_timeout_s",
                    "heartbeat_interval_s", "connect_timeout_s"):
            if not getattr(self, key) > 0:
                raise bad(key, "must be > 0 seconds")



@dataclass(frozen=True, slots=True, kw_only=True)
class WireSection:
    """``[vfl.wire]``: how the cut-layer tensors travel.

    Attributes:
        dtype: how the cut-layer tensors travel: the passive party's embeddings
            (``emb`` and the ``eval`` embeddings for scoring) and the active party's
            gradients (``grad``): ``"float32"`` (as computed), ``"float16"``,
            ``"bfloat16"`` (2 bytes a value), ``"int8"`` (1 byte a value plus a float32
            scale per row: every value within half its row's scale, max|row| / 127) or
            ``"auto"`` (the default: ``int8`` where ``wire.link_mbps`` makes the path
            bandwidth-bound, one float32 batch taking 1 ms or more to serialise, else
            ``float32``). The receiver decodes to float32; under DP the rows are encoded
            after their noise (post-processing: the accounted µ is unchanged). Not a
            shared setting: each party encodes what it sends, the message says how
            (:mod:`parties.algorithms.wire`).
        link_mbps: the bandwidth of the path between the parties, Mbit/s, as far as the
            run knows it (0, the default: unknown); only ``wire.dtype = "auto"`` reads
            it. ``psfl sim run`` sets it from the scenario's links (the slowest shaped
            link of a party of the run) when it is 0.
    """

    SECTION: ClassVar[str] = "vfl.wire"

    dtype: str = "auto"
    link_mbps: float = 0.0

    def __post_init__(self) -> None:
        bad = _bad(self)
        if self.dtype not in WIRE_DTYPES:
            raise bad("dtype", f"must be one of {WIRE_DTYPES}")
        if not (math.isfinite(self.link_mbps) and self.link_mbps >= 0):
            raise bad("link_mbps", "must be >= 0 Mbit/s (0: unknown)")
