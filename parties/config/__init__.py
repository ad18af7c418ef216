"""The VFL run configuration: one frozen dataclass, loaded from TOML ``[vfl]`` plus ``--set``;
the model specs' grammar is :mod:`parties.config.modelspec`. May import
:mod:`parties.core`, :mod:`parties.algorithms` (the algorithms' names and schedules) and
:mod:`parties.datasets` (the named datasets' tasks).

Defaults follow PubSub-VFL (arXiv 2510.12494, Sec. 5.1): ΔT0 = 5, p = q = 5,
T_ddl = 10 s, lr = 1e-3. Model sizes default to the minimal split model of the
first slice (bottom in→64→32 per party, top 64→32→1).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from parties.datasets import DATASETS
from parties.core.ids import MAX_PASSIVE_PARTIES, check_run_id, passive_party_ids, role_of
from parties.algorithms.schedule import ALGOS, LR_SCALINGS, PS_UPDATES, effective_workers, worker_lr
from parties.core.tasks import TASKS
from parties.algorithms.wire import WIRE_DTYPES, resolve_wire_dtype
from pubsub.config import ConfigError, dump_toml, load_section, to_mapping

#: Default ``target_metric`` per named dataset (validation AUC); others have none.
DEFAULT_TARGETS: dict[str, float] = {"bank": 0.92, "adult": 0.90}
#: How the active party's workers hold the top model under ``pubsub`` (``top_update``).
TOP_UPDATES = ("replica", "shared")
#: values of ``vfl.active_only_baseline``
ACTIVE_ONLY_BASELINE = ("auto", "on", "off")
#: ``vfl.id_columns``: what a column that looks like a record ID gets
#: (:mod:`parties.data.treatments`)
ID_COLUMN_MODES = ("drop", "refuse", "keep")
#: Where a party's worker compute runs (``vfl.worker_mode``).
WORKER_MODES = ("auto", "thread", "process", "inline")


@dataclass(frozen=True, slots=True, kw_only=True)
class VflConfig:
    """Settings of one two-party VFL run (both parties must agree on the shared ones).

    Attributes:
        algo: coordination algorithm: ``"pubsub"`` (PubSub-VFL), or a baseline
            ``"vfl"``, ``"vfl-ps"``, ``"avfl"``, ``"avfl-ps"`` (semantics and sources in
            :mod:`parties.runtime.party`). All share models, data and the bus.
        dataset: a named dataset (``"bank"``, ``"adult"``, ``"california"``,
            ``"synthetic"``; see :data:`parties.datasets.DATASETS`) or a path to a
            CSV/Parquet file.
        label: label column (default: the named dataset's, required for files).
        positive_class: binary task: the label value counted as positive (its string
            form, e.g. ``"high"``); empty (the default): ``yes`` / ``true`` / ``1``, else
            the larger value. The one used is printed, logged (``vfl.label_positive``) and
            recorded (``label_positive`` in metrics.json, and in the saved model); a value
            that is no class of the label is an error.
        task: ``"binary"`` or ``"regression"``; empty (the default) means the named
            dataset's own task, or ``"binary"`` for a file; contradicting a named
            dataset's task is an error. See :mod:`parties.core.tasks`.
        active_columns / passive_columns: each party's feature columns (set both or
            neither; default: an even split of all non-label columns in table order, the
            first half, rounded up, to the active party). Written as TOML/JSON lists
            (``'["a","b"]'``) or plain ``a,b``.
        passive_parties: how many passive parties train with the active party (1 to
            9; docs/dev/multiparty.md). Their party ids are ``passive``, ``passive2``,
            …; ``w_passive`` (unless ``passive_party_workers``), ``passive_bottom_hidden``
            and ``passive_cpus`` apply to each.
        passive_party_columns: with several passive parties, each one's feature
            columns, in party order (with ``active_columns``; default: the feature
            columns cut into contiguous groups, :func:`parties.data.default_split_n`).
        fuse: how the active party fuses its own bottom output with the passive
            embeddings: ``"concat"`` (the default; the top model's input is
            (1 + ``passive_parties``) × ``embedding_dim`` wide), ``"sum"`` or ``"mean"``
            (``embedding_dim`` wide; :mod:`parties.algorithms.fuse`).
        synthetic_rows / synthetic_features / synthetic_informative / synthetic_seed:
            size, informative feature count (2 … ``synthetic_features``) and generator
            seed of the ``synthetic`` dataset (ignored for other datasets); see
            :func:`parties.data.make_synthetic`.
        test_frac: test share of the rows (seeded, unstratified split).
        seed: seed of the split, the batch order and the model initialisation.
        epochs: training epochs.
        batch_size: B, rows per batch.
        lr: Adam learning rate (of the single worker; see ``lr_scaling``).
        lr_scaling: how a worker's rate follows the worker count under ``pubsub`` and
            ``avfl-ps``, whose averaged workers form an effective batch of w·B:
            ``"linear"`` (lr·w, the default; Goyal et al. 2017), ``"sqrt"`` (lr·√w) or
            ``"none"`` (:func:`parties.algorithms.schedule.worker_lr`). ``vfl-ps`` splits one batch
            across its pairs and keeps lr. Measured on bank, 6 epochs, ``pubsub``: test
            AUC 0.9223 unscaled, 0.9274 linear.
        ps_update: how a party's parameter server combines its workers under ``pubsub``
            and ``avfl-ps`` (with two or more workers; the other algorithms average):
            ``"average"`` (each worker trains its own replica with its own optimizer and
            pushes its change, θ ← θ + Δ/w, every ΔT_t steps: local-SGD averaging) or
            ``"gradient"`` (each worker pushes every step's gradient, which the server's
            one optimizer applies at the unscaled ``lr``, and pulls the new parameters:
            asynchronous SGD: a gradient is at most w − 1 of the party's steps stale;
            ``lr_scaling`` and ΔT_t do not apply); works with every ``worker_mode``;
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
            bottom). ``avfl-ps`` and ``ps_update = "gradient"`` always use replicas.
        w_active: the active party's workers (``vfl``, ``avfl``: always 1; ``vfl-ps``:
            min of ``w_active`` and ``w_passive``, paired).
        w_passive: each passive party's workers (``vfl``, ``avfl``: always 1; ``vfl-ps``:
            as ``w_active``; several passive parties: ``passive_party_workers``).
        passive_party_workers: with several passive parties, each one's worker count, in
            party-id order (each >= 1); () (the default): every passive party runs
            ``w_passive``. Each party's learning-rate scaling (``lr_scaling``) follows its
            own count; ``psfl vfl plan`` chooses one per party. ``vfl-ps`` pairs workers
            across all parties, so it takes equal counts only (else exit 2 naming the
            key). Part of the settings digest the parties compare in their handshake. See
            :meth:`workers_for_party`.
        delta_t0: ΔT0 of the semi-async schedule: in epoch t a worker syncs with its PS
            every ΔT_t = ceil(ΔT0/2 · tanh(2t/ΔT0 − 2) + ΔT0/2) local steps (``pubsub``),
            growing to ΔT0; 1 = sync after every step. A party with one worker does not
            sync on its own: the flush after each training segment keeps its PS current.
        p / q: per-batch buffer capacity for embeddings / gradients (messages, FIFO eviction).
        t_ddl_s: T_ddl, how long a worker waits for its partner's data before the
            batch is dropped and reassigned, seconds; 0 = no deadline-based dropping
            (a wait then fails the run after ``liveness_timeout_s``). Used by ``pubsub``,
            ``avfl`` and ``avfl-ps``; ``vfl`` and ``vfl-ps`` never drop.
        max_reassign: how often a dropped batch is reassigned before it is skipped for
            the epoch. With a DP target, the passive party's reassigned attempts are
            also limited per record by ``dp_reassign_reserve`` (the privacy plan does not
            depend on ``max_reassign``).
        liveness_timeout_s: partner heartbeats missing this long fail the run, seconds.
        peer_max_bad_messages: malformed embeddings or gradients (wrong shape or dtype,
            values that are not finite, bad metadata) from the partner that end the run
            (exit 4); each is dropped and counted before (``parties.algorithms.intake``). Those from
            other bus clients are only dropped and counted (``rejected_by_sender``).
        handshake_timeout_s: deadline for both parties to find each other, seconds.
        heartbeat_interval_s: heartbeat period, seconds.
        wire_dtype: how the cut-layer tensors travel: the passive party's embeddings
            (``emb`` and the ``eval`` embeddings for scoring) and the active party's
            gradients (``grad``): ``"float32"`` (as computed), ``"float16"``,
            ``"bfloat16"`` (2 bytes a value), ``"int8"`` (1 byte a value plus a float32
            scale per row: every value within half its row's scale, max|row| / 127) or
            ``"auto"`` (the default: ``int8`` where ``link_mbps`` makes the path
            bandwidth-bound, one float32 batch taking 1 ms or more to serialise, else
            ``float32``). The receiver decodes to float32; under DP the rows are encoded
            after their noise (post-processing: the accounted µ is unchanged). Not a
            shared setting: each party encodes what it sends, the message says how
            (:mod:`parties.algorithms.wire`).
        link_mbps: the bandwidth of the path between the parties, Mbit/s, as far as the
            run knows it (0, the default: unknown); only ``wire_dtype = "auto"`` reads
            it. ``psfl sim run`` sets it from the scenario's links (the slowest shaped
            link of a party of the run) when it is 0.
        bottom_hidden: hidden widths of each bottom model.
        active_bottom_hidden / passive_bottom_hidden: that party's own bottom widths
            (empty, the default: ``bottom_hidden``). Under unequal CPU shares, balance
            the parties' compute per sample by giving the party with fewer cores the
            smaller model (see :meth:`bottom_hidden_for`).
        active_features: with no explicit column lists, the first this many feature
            columns go to the active party and the rest to the passive party (0, the
            default: an even split); e.g. 50 on ``synthetic`` 500 gives 50:450.
        embedding_dim: cut-layer width (each party's embedding size).
        top_hidden: hidden widths of the top model (``top_model`` ``"mlp"``).
        model: the bottom models: ``"mlp"`` (the default: ``bottom_hidden`` Linear/ReLU
            stacks), ``"resnet"`` (the paper's large model, residual MLP blocks, see
            ``resnet_*``) or ``"package.module:callable"`` called as
            ``bottom(d_in, d_out) -> nn.Module`` (importable in every process). See
            :mod:`parties.models.zoo` and docs/tutorials/your-own-model.md. ``--model`` on
            ``psfl vfl run`` sets it. A non-default spec is probed before anything starts
            (a typed error, exit 2).
        top_model: the top model, same forms (called as ``top(d_in, d_out)`` with
            ``d_in = 2·embedding_dim``, ``d_out = 1``); empty (the default): ``"resnet"``
            when ``model = "resnet"``, else ``"mlp"`` (``top_hidden``).
        resnet_depth: residual blocks of a ``resnet`` model (default 4; 0 = input and
            output projections only).
        resnet_width: hidden width of a ``resnet`` model (default 256).
        resnet_norm: normalisation inside each residual block: ``"layer"`` (LayerNorm,
            the default), ``"batch"`` (BatchNorm1d: running statistics live in the
            parameter-server vector, see :mod:`parties.models.model`), ``"group"`` (GroupNorm,
            at most 8 groups) or ``"none"``.
        resnet_dropout: dropout probability inside each residual block, in [0, 1)
            (default 0; refused in the passive bottom with DP on).
        dp_batchnorm: with DP on, what to do with BatchNorm in the passive bottom model:
            ``"refuse"`` (the default: the run is refused before it starts,
            :class:`parties.privacy.dpsgd.DpIncompatibleModel`) or ``"groupnorm"`` (each
            BatchNorm1d is replaced by a GroupNorm of the same width, whose statistics
            are per row).
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
        stream_clip_quantile: streaming: a numeric column's values are clipped to its
            ``[q, 1 - q]`` quantiles of a training sample before standardising (default
            0.001; 0 = no clipping).
        stream_cache_dir: where the encoded cache goes, in a subdirectory per party
            (``<dir>/<party>``; "" = a temporary directory, removed at the end).
        row_split: how rows are split into training, validation and test rows:
            ``"permutation"`` (a seeded permutation, :func:`parties.data.train_test_indices`),
            ``"hash"`` (per row, from its position and the seed:
            :class:`parties.data.stream.HashSplit`) or ``""`` (the default: hash when
            streaming, else permutation; streaming needs hash). An in-memory run with
            ``"hash"`` trains and tests on the same rows as a streamed one.
        torch_threads: intra-op threads per party process.
        active_torch_threads / passive_torch_threads: that role's own intra-op threads
            (0, the default: ``torch_threads``); party processes only (the in-memory
            transport runs both parties in one process, with ``torch_threads``).
        eval_every: score the validation split every this many epochs (and after the
            last); on ``synthetic`` every quarter of such an epoch. The test split is
            scored once, at the end.
        val_per_epoch: validation scorings per evaluated epoch, each after its share of
            the epoch's batches (finer time-to-target readings; with DP on each is a
            release, planned and charged); 0 (default): 4 on ``synthetic``, else 1.
        sync_per_epoch: training segments per epoch; each ends with the batches in
            flight finished and every worker synced to its PS (a barrier that bounds the
            replicas' drift), and the validation scorings fall on the ends of some of
            them; 0 (default): one segment per scoring. Else a multiple of
            :attr:`evals_per_epoch` (every epoch is segmented, evaluated or not).
        val_overlap: ``pubsub`` with two or more workers on every party (default true):
            a validation point inside a training segment is scored while the segment
            trains, from each party's PS (synced every ΔT_t steps, so current within
            a few steps): the passive party publishes its embeddings of the validation
            rows when it has applied the point's share of the epoch's batches, the
            active party scores them when they arrive, and nothing drains; by default
            an epoch is then one segment (``sync_per_epoch`` still sets more). Only where
            every party is allotted a core or more
            (:func:`parties.algorithms.schedule.overlap_decision`: below one core a party's training
            already fills its quota, and its evaluation work only slows it): the active
            party decides after the handshake and tells the passive parties;
            ``metrics.json`` records it (``parties.*.val_overlap``). Else
            (false, another algorithm, a party with one worker) each point ends a
            segment: the batches in flight finish, the replicas sync, and the passive
            party waits for the active party's score before it trains on (across a
            slow link about two round trips a point). See :attr:`scores_in_flight`.
        target_metric: the validation metric that ``time_to_target_s`` waits for (AUC
            reached from below, RMSE from above, in the label's units); None = the
            dataset's default (bank 0.92, adult 0.90; none for other data).
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
            (:class:`parties.algorithms.schedule.InflightWindow`); false: always ``inflight_max``.
            The measurements go in ``metrics.json`` (``link``).
        event_loop: ``"uvloop"`` or ``"asyncio"``.
        connect_timeout_s: broker handshake deadline, seconds.
        worker_mode: ``"thread"`` (workers are threads of the party process: cheap
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
        dp_mu: target µ of Gaussian differential privacy for each record of the passive
            party (µ-GDP, Dong-Roth-Su 2022, replace-one neighbours; covers its
            embeddings and its bottom model's DP-SGD training); None or ``inf`` = no DP.
            Both noise multipliers are calibrated for ``epochs + dp_reassign_reserve``
            training publications per record (see :mod:`parties.privacy.dp`).
        dp_epsilon: the target as ε at ``dp_delta`` instead of ``dp_mu`` (converted to
            the largest µ that implies it, exactly).
        dp_noise_multiplier / dp_sgd_noise_multiplier: σ_e (embedding noise std σ_e·C)
            and σ_g (DP-SGD noise std σ_g·C_g) given directly instead of a target (both
            or neither); the spent µ is then only reported.
        dp_clip_norm: C, the L2 norm each embedding row is clipped to before noising.
        dp_grad_clip_norm: C_g, the L2 norm each per-example gradient of the passive
            bottom model is clipped to (DP-SGD; the gradient of the per-example loss, i.e.
            B x the cut-layer gradient of the batch-mean loss). Default 3: measured on bank
            at µ = 8 (in-process sync VFL, 2 epochs), C_g = 1 gave test AUC 0.83, 2: 0.85,
            3: 0.86, 5: 0.86, 10: 0.84, 30: 0.77 (clipping bias below, noise above).
        dp_embedding_share: the share of a training record's µ² spent on its embedding
            releases (the rest on DP-SGD), in (0, 1).
        dp_max_noise_multiplier: a target whose calibrated noise multiplier exceeds this
            is refused before anything starts (exit 2).
        dp_lr: the base Adam learning rate of both parties when DP is on, in place of
            ``lr`` (scaled by ``lr_scaling`` the same way). Clipped, noised DP-SGD steps
            move the passive model slowly at the non-private rate: measured on bank,
            µ = 8, 2 epochs, 2 + 2 workers (real runs), lr 1e-3: 0.69 test AUC (median of
            3), 5e-3: 0.81, 1e-2: 0.83 and 0.87, 2e-2: 0.87.
        dp_delta: δ at which the spent budget is also reported as (ε, δ).
        dp_noise_seed: seed of the passive party's noise generators, for reproducible
            tests only (the active party must never know it); None = fresh OS entropy.
        dp_schema: path to the passive party's public feature schema (a TOML file of
            declared ranges and categories, :mod:`parties.data.schema`; draft one with
            ``psfl vfl schema`` and review it). With DP on the passive party's features
            are encoded from it, never from encoders fitted on its rows; None (the
            default) = the bundled reviewed schema of a named dataset. With DP on and no
            schema (a user file without ``dp_schema``) the run refuses to start. Ignored
            with DP off (fitted encoders, as before). Not a shared setting.
        dp_reassign_reserve: with a DP target, the extra (reassigned) training
            publications each passive record may get over the whole run, beyond one per
            epoch; the noise is calibrated for ``epochs + dp_reassign_reserve``
            publications per record. Before publishing a reassigned batch the passive
            party checks its own per-record count: if a record of the batch has spent
            its reserve, the batch is dropped for the epoch instead (the active party is
            told; ``dp.reserve_exhausted_batches`` in ``metrics.json``). Default 1: a
            record may miss one gradient deadline in the whole run and still be trained
            on in that epoch, at the price of ``sqrt((epochs + 1) / epochs)`` more noise
            (1.05x at 10 epochs, 1.22x at 2); 0: no reassignment under DP (a missed
            batch is dropped for the epoch). The plan covers no more than the schedule
            can use: 0 where the passive party never reassigns (``max_reassign = 0``,
            ``t_ddl_s = 0``, or an algorithm other than ``pubsub``), at most ``epochs ×
            max_reassign``. Ignored with DP off or with the noise multipliers given
            directly.
        dp_predict_max_releases: with DP on, the most prediction releases (``psfl vfl
            predict``) of one record by this passive party: a record of a file of new
            rows is identified by its ID (a salted hash of it, in
            ``model/<party>/prediction_ledger.json``), a record of the run's test split
            by its row (the training ledger's ``test`` group; its release at the end of
            training is not counted). Each prediction release costs a record the test
            split's ``µ_test`` (the whole target: ``dp_mu``); ``k`` releases compose to
            ``sqrt(k)·µ_test``. A prediction that would take any record past this is
            refused before anything is released (exit 2, naming this key). Default 1:
            a record's predictions stay within the run's target µ; 0: no predictions
            under DP. Read from the saved model's config (set it when training).
        active_only_baseline: the active-only baseline (:mod:`parties.algorithms.baseline`): after
            training the active party fits gradient boosting and an MLP on its own columns
            and labels (same train/validation/test rows; the stronger by validation AUC),
            records it as ``active_only`` in metrics.json, and ``psfl vfl run`` warns when
            a DP run's test AUC ends below it. ``"auto"`` (the default): with DP on,
            binary tasks; ``"on"``: every binary run; ``"off"``: never. Costs no budget
            and sends nothing. Not a shared setting.
        active_cpus / passive_cpus: CPU ids the party's process, its threads and its
            worker processes are pinned to (``os.sched_setaffinity``, Linux) when the
            party starts; empty (the default) = not pinned. Not a shared setting: each
            party reads only its own key. ``cpu_util`` is then relative to these cores.
        active_rows_file / passive_rows_file: the party's output of ``psfl vfl align``
            (``aligned-<role>.csv``: the shared IDs sorted and each one's ``row`` in the
            party's table): the party trains on those rows of ``dataset``, in that
            order, so both parties list the same records in the same order. "" = every
            row, matched by position. Set both or neither. Not a shared setting (the row
            count is), but the parties compare a keyed hash of the ordered shared IDs in
            their hello, so rows files that list other records, or the same in another
            order, end the run with exit 4 (``aligned_ids``); the rows used show as
            ``n_rows`` in ``events.jsonl`` (``vfl.data_loaded``). ``passive_rows_file``
            is for one passive party.
        passive_party_rows_files: with several passive parties, each one's
            ``aligned-<party>.csv`` of an N-way ``psfl vfl align``, in party order (with
            ``active_rows_file``; set all or none; ``passive_rows_file`` is then
            refused). () = every row.
    """

    algo: str = "pubsub"
    dataset: str = "bank"
    label: str = ""
    positive_class: str = ""
    task: str = ""
    active_columns: tuple[str, ...] = ()
    passive_columns: tuple[str, ...] = ()
    passive_parties: int = 1
    passive_party_columns: tuple[tuple[str, ...], ...] = ()
    fuse: str = "concat"
    synthetic_rows: int = 100_000
    synthetic_features: int = 100
    synthetic_informative: int = 20
    synthetic_seed: int = 0
    test_frac: float = 0.3
    seed: int = 0
    epochs: int = 10
    batch_size: int = 256
    lr: float = 1e-3
    lr_scaling: str = "linear"
    ps_update: str = "average"
    top_update: str = "shared"
    w_active: int = 2
    w_passive: int = 2
    passive_party_workers: tuple[int, ...] = ()
    delta_t0: int = 5
    p: int = 5
    q: int = 5
    t_ddl_s: float = 10.0
    max_reassign: int = 3
    liveness_timeout_s: float = 30.0
    peer_max_bad_messages: int = 16
    handshake_timeout_s: float = 60.0
    heartbeat_interval_s: float = 1.0
    wire_dtype: str = "auto"
    link_mbps: float = 0.0
    bottom_hidden: tuple[int, ...] = (64,)
    active_bottom_hidden: tuple[int, ...] = ()
    passive_bottom_hidden: tuple[int, ...] = ()
    active_features: int = 0
    embedding_dim: int = 32
    top_hidden: tuple[int, ...] = (32,)
    model: str = "mlp"
    top_model: str = ""
    resnet_depth: int = 4
    resnet_width: int = 256
    resnet_norm: str = "layer"
    resnet_dropout: float = 0.0
    dp_batchnorm: str = "refuse"
    onehot_max_levels: int = 64
    hash_buckets: int = 4096
    hash_embedding_dim: int = 8
    id_columns: str = "drop"
    categorical_columns: tuple[str, ...] = ()
    stream: bool = False
    party_datasets: tuple[str, ...] = ()
    shuffle: str = ""
    shuffle_block_rows: int = 4096
    shuffle_window_rows: int = 65536
    stream_chunk_rows: int = 65536
    stream_eval_max_rows: int = 100_000
    stream_clip_quantile: float = 0.001
    stream_cache_dir: str = ""
    row_split: str = ""
    torch_threads: int = 1
    active_torch_threads: int = 0
    passive_torch_threads: int = 0
    eval_every: int = 1
    val_per_epoch: int = 0
    sync_per_epoch: int = 0
    val_overlap: bool = True
    target_metric: float | None = None
    staleness_bound: int = 5
    inflight_max: int = 4
    inflight_auto: bool = True
    event_loop: str = "uvloop"
    connect_timeout_s: float = 10.0
    worker_mode: str = "auto"
    dp_mu: float | None = None
    dp_epsilon: float | None = None
    dp_noise_multiplier: float | None = None
    dp_sgd_noise_multiplier: float | None = None
    dp_clip_norm: float = 1.0
    dp_grad_clip_norm: float = 3.0
    dp_embedding_share: float = 0.5
    dp_max_noise_multiplier: float = 1000.0
    dp_lr: float = 1e-2
    dp_delta: float = 1e-5
    dp_noise_seed: int | None = None
    dp_schema: str | None = None
    dp_reassign_reserve: int = 1
    dp_predict_max_releases: int = 1
    active_only_baseline: str = "auto"
    active_cpus: tuple[int, ...] = ()
    passive_cpus: tuple[int, ...] = ()
    active_rows_file: str = ""
    passive_rows_file: str = ""
    passive_party_rows_files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"vfl.{key}", f"{why}, got {getattr(self, key)!r}")

        if self.algo not in ALGOS:
            raise bad("algo", f"must be one of {ALGOS}")
        if self.task not in ("", *TASKS):
            raise bad("task", f"must be one of {TASKS} (or empty: the dataset's own)")
        named = DATASETS.get(self.dataset)
        if named is not None and self.task and self.task != named.task:
            raise bad("task", f"dataset {self.dataset!r} is a {named.task} task; "
                              f"leave vfl.task empty or set it to {named.task!r}")
        if self.synthetic_rows < 2:
            raise bad("synthetic_rows", "must be >= 2")
        if self.synthetic_features < 2:
            raise bad("synthetic_features", "must be >= 2")
        if not 2 <= self.synthetic_informative <= self.synthetic_features:
            raise bad("synthetic_informative",
                      f"must be in 2 .. synthetic_features ({self.synthetic_features})")
        if not 0 <= self.synthetic_seed < 2**32:
            raise bad("synthetic_seed", "must be in 0 .. 2**32-1")
        for key in ("epochs", "batch_size", "w_active", "w_passive", "delta_t0", "p", "q",
                    "embedding_dim", "torch_threads", "eval_every", "staleness_bound",
                    "inflight_max"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        for key in ("active_torch_threads", "passive_torch_threads"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0 (0: torch_threads)")
        if not 0 <= self.val_per_epoch <= 1000:
            raise bad("val_per_epoch", "must be in 0 .. 1000 (0: the dataset's default)")
        if not 0 <= self.sync_per_epoch <= 10_000:
            raise bad("sync_per_epoch", "must be in 0 .. 10000 (0: one per scoring)")
        if self.sync_per_epoch and self.sync_per_epoch % self.evals_per_epoch:
            raise bad("sync_per_epoch", f"must be a multiple of the scorings per epoch "
                      f"({self.evals_per_epoch}: val_per_epoch, or the dataset's default)")
        if not 0 <= self.seed < 2**31:
            raise bad("seed", "must be in 0 .. 2**31-1")
        if self.max_reassign < 0:
            raise bad("max_reassign", "must be >= 0")
        if not 0.0 < self.test_frac < 1.0:
            raise bad("test_frac", "must be in (0, 1)")
        if not self.lr > 0:
            raise bad("lr", "must be > 0")
        if self.lr_scaling not in LR_SCALINGS:
            raise bad("lr_scaling", f"must be one of {LR_SCALINGS}")
        if self.ps_update not in PS_UPDATES:
            raise bad("ps_update", f"must be one of {PS_UPDATES}")
        if self.top_update not in TOP_UPDATES:
            raise bad("top_update", f"must be one of {TOP_UPDATES}")
        if not 0.0 <= self.t_ddl_s < math.inf:
            raise bad("t_ddl_s", "must be >= 0 seconds (0: no deadline-based dropping)")
        if self.target_metric is not None and not math.isfinite(self.target_metric):
            raise bad("target_metric", "must be a finite number")
        if self.peer_max_bad_messages < 1:
            raise bad("peer_max_bad_messages", "must be >= 1")
        for key in ("liveness_timeout_s", "handshake_timeout_s",
                    "heartbeat_interval_s", "connect_timeout_s"):
            if not getattr(self, key) > 0:
                raise bad(key, "must be > 0 seconds")
        for key in ("active_cpus", "passive_cpus"):
            cpus = getattr(self, key)
            if any(c < 0 for c in cpus) or len(set(cpus)) != len(cpus):
                raise bad(key, "must be distinct CPU ids >= 0")
        for key in ("bottom_hidden", "active_bottom_hidden", "passive_bottom_hidden",
                    "top_hidden"):
            if any(h < 1 for h in getattr(self, key)):
                raise bad(key, "hidden widths must be >= 1")
        if self.active_features < 0:
            raise bad("active_features", "must be >= 0 (0: an even split)")
        if self.active_features and (self.active_columns or self.passive_columns):
            raise bad("active_features", "give either a feature count or column lists, "
                      "not both")
        self._check_parties(bad)
        if self.event_loop not in ("uvloop", "asyncio"):
            raise bad("event_loop", "must be 'uvloop' or 'asyncio'")
        if self.wire_dtype not in WIRE_DTYPES:
            raise bad("wire_dtype", f"must be one of {WIRE_DTYPES}")
        if not (math.isfinite(self.link_mbps) and self.link_mbps >= 0):
            raise bad("link_mbps", "must be >= 0 Mbit/s (0: unknown)")
        if self.worker_mode not in WORKER_MODES:
            raise bad("worker_mode", "must be 'auto', 'process', 'thread' or 'inline'")
        self._check_models(bad)
        self._check_dp(bad)

    def _check_parties(self, bad: Callable[[str, str], ConfigError]) -> None:
        from parties.algorithms.fuse import FUSES

        if not 1 <= self.passive_parties <= MAX_PASSIVE_PARTIES:
            raise bad("passive_parties", f"must be in 1 .. {MAX_PASSIVE_PARTIES}")
        if self.fuse not in FUSES:
            raise bad("fuse", f"must be one of {FUSES}")
        if self.passive_party_columns:
            if self.passive_parties == 1:
                raise bad("passive_party_columns", "is for several passive parties "
                          "(vfl.passive_parties > 1); with one, use vfl.passive_columns")
            if len(self.passive_party_columns) != self.passive_parties:
                raise bad("passive_party_columns", f"needs one column list per passive party "
                          f"({self.passive_parties})")
            if not self.active_columns:
                raise bad("passive_party_columns", "needs vfl.active_columns too")
            if self.active_features:
                raise bad("active_features", "give either a feature count or column lists, "
                          "not both")
        if self.passive_parties > 1:
            if self.passive_columns:
                raise bad("passive_columns", "is for one passive party; with "
                          f"vfl.passive_parties = {self.passive_parties}, list each one's "
                          "columns in vfl.passive_party_columns")
            if self.active_columns and not self.passive_party_columns:
                raise bad("active_columns", "with several passive parties, give "
                          "vfl.passive_party_columns too (or neither)")
            if self.passive_rows_file:
                raise bad("passive_rows_file", "is for one passive party; with "
                          f"vfl.passive_parties = {self.passive_parties}, list each one's "
                          "aligned-<party>.csv in vfl.passive_party_rows_files")
            if (self.passive_party_rows_files
                    and len(self.passive_party_rows_files) != self.passive_parties):
                raise bad("passive_party_rows_files", "needs one rows file per passive party "
                          f"({self.passive_parties}), in party order")
            if any(not f for f in self.passive_party_rows_files):
                raise bad("passive_party_rows_files", "has an empty file name")
        elif self.passive_party_rows_files:
            raise bad("passive_party_rows_files", "is for several passive parties "
                      "(vfl.passive_parties > 1); with one, use vfl.passive_rows_file")
        self._check_party_workers(bad)

    def _check_party_workers(self, bad: Callable[[str, str], ConfigError]) -> None:
        counts = self.passive_party_workers
        if not counts:
            return
        if self.passive_parties == 1:
            raise bad("passive_party_workers", "is for several passive parties "
                      "(vfl.passive_parties > 1); with one, use vfl.w_passive")
        if len(counts) != self.passive_parties:
            raise bad("passive_party_workers", "needs one worker count per passive party "
                      f"({self.passive_parties}), in party order")
        if any(c < 1 for c in counts):
            raise bad("passive_party_workers", "worker counts must be >= 1")
        if self.algo == "vfl-ps" and len(set(counts)) > 1:
            raise bad("passive_party_workers", "vfl-ps pairs each active worker with one "
                      "worker of every passive party, so every passive party needs the "
                      "same count (or set vfl.w_passive)")

    @property
    def party_ids(self) -> tuple[str, ...]:
        """Every party's id: ``active``, then ``passive``, ``passive2``, …"""
        return ("active", *passive_party_ids(self.passive_parties))

    @property
    def top_input_width(self) -> int:
        """The top model's input width: the fused width of the active party's bottom
        output and every passive embedding (``embedding_dim`` each)."""
        parts = 1 + self.passive_parties
        return parts * self.embedding_dim if self.fuse == "concat" else self.embedding_dim

    def _check_models(self, bad: Callable[[str, str], ConfigError]) -> None:
        from parties.config.modelspec import DP_BATCHNORM, check_resnet_settings, check_spec

        check_spec("model", self.model)
        check_spec("top_model", self.top_model, allow_empty=True)
        wrong = check_resnet_settings(self.resnet_depth, self.resnet_width, self.resnet_norm,
                                      self.resnet_dropout)
        if wrong is not None:
            raise bad(wrong, {"resnet_depth": "must be >= 0",
                              "resnet_width": "must be >= 1",
                              "resnet_norm": "must be 'layer', 'batch', 'group' or 'none'",
                              "resnet_dropout": "must be in [0, 1)"}[wrong])
        if self.active_only_baseline not in ACTIVE_ONLY_BASELINE:
            raise bad("active_only_baseline", f"must be one of {ACTIVE_ONLY_BASELINE}")
        if self.dp_batchnorm not in DP_BATCHNORM:
            raise bad("dp_batchnorm", f"must be one of {DP_BATCHNORM}")
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
        if self.stream_eval_max_rows < 0:
            raise bad("stream_eval_max_rows", "must be >= 0 (0 = every test row)")
        if not 0.0 <= self.stream_clip_quantile < 0.5:
            raise bad("stream_clip_quantile", "must be in [0, 0.5)")
        if self.party_datasets and len(self.party_datasets) != 1 + self.passive_parties:
            raise bad("party_datasets", f"needs one file per party "
                      f"({1 + self.passive_parties}: active first, then each passive party)")
        if any(not f for f in self.party_datasets):
            raise bad("party_datasets", "has an empty file name")
        if self.stream and any(self.rows_files.values()):
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

    def batch_order(self, n_train: int, epoch: int) -> Any:
        """One epoch's batches (:func:`parties.algorithms.schedule.batch_order`), the same on every
        party."""
        from parties.algorithms.schedule import batch_order

        return batch_order(n_train, self.batch_size, seed=self.seed, epoch=epoch,
                           shuffle=self.effective_shuffle,
                           block_rows=self.shuffle_block_rows,
                           window_rows=self.shuffle_window_rows)

    def dataset_for(self, party: str) -> str:
        """``party``'s own file (``party_datasets``), else ``dataset``."""
        self.check_party(party)
        if not self.party_datasets:
            return self.dataset
        return self.party_datasets[self.party_ids.index(party)]

    def _check_dp(self, bad: Callable[[str, str], ConfigError]) -> None:
        if self.dp_mu is not None and not self.dp_mu > 0:
            raise bad("dp_mu", "must be > 0 (inf, or leaving it out, turns DP off)")
        if self.dp_epsilon is not None:
            if not 0 < self.dp_epsilon < math.inf:
                raise bad("dp_epsilon", "must be a positive finite number")
            if self.dp_mu is not None:
                raise ConfigError("vfl.dp_epsilon", "set either dp_mu or dp_epsilon (with "
                                  f"dp_delta), not both; got dp_mu={self.dp_mu!r}, "
                                  f"dp_epsilon={self.dp_epsilon!r}")
        for key in ("dp_noise_multiplier", "dp_sgd_noise_multiplier"):
            v = getattr(self, key)
            if v is not None and not 0 < v < math.inf:
                raise bad(key, "must be a positive finite number")
        if self.dp_noise_multiplier is not None and (self.dp_mu is not None
                                                     or self.dp_epsilon is not None):
            raise ConfigError(
                "vfl.dp_noise_multiplier",
                "set either a target (dp_mu or dp_epsilon; the noise multipliers are "
                "calibrated from it) or dp_noise_multiplier, not both; got "
                f"dp_mu={self.dp_mu!r}, dp_epsilon={self.dp_epsilon!r}, "
                f"dp_noise_multiplier={self.dp_noise_multiplier!r}")
        if (self.dp_noise_multiplier is None) != (self.dp_sgd_noise_multiplier is None):
            raise ConfigError("vfl.dp_sgd_noise_multiplier", "give both dp_noise_multiplier "
                              "and dp_sgd_noise_multiplier, or neither; got "
                              f"{self.dp_noise_multiplier!r} and {self.dp_sgd_noise_multiplier!r}")
        for key in ("dp_clip_norm", "dp_grad_clip_norm", "dp_max_noise_multiplier", "dp_lr"):
            if not 0 < getattr(self, key) < math.inf:
                raise bad(key, "must be a positive finite number")
        if not 0 < self.dp_embedding_share < 1:
            raise bad("dp_embedding_share", "must be in (0, 1)")
        if not 0 < self.dp_delta < 1:
            raise bad("dp_delta", "must be in (0, 1)")
        if self.dp_noise_seed is not None and not 0 <= self.dp_noise_seed < 2**63:
            raise bad("dp_noise_seed", "must be in 0 .. 2**63-1")
        for key in ("dp_reassign_reserve", "dp_predict_max_releases"):
            if not 0 <= getattr(self, key) <= 1_000_000:
                raise bad(key, "must be an integer in 0 .. 1000000")
        if self.dp_schema is not None and not self.dp_schema.strip():
            raise bad("dp_schema", "must be a path to a schema TOML file (leave it out for "
                      "a named dataset's bundled schema)")

    @property
    def dp_enabled(self) -> bool:
        """True when the passive party clips and noises its embeddings."""
        return self.dp_noise_multiplier is not None or self.dp_epsilon is not None or (
            self.dp_mu is not None and not math.isinf(self.dp_mu))

    @property
    def effective_wire_dtype(self) -> str:
        """The encoding of the cut-layer tensors this run sends: ``wire_dtype``, with
        ``auto`` resolved from ``link_mbps`` (:func:`parties.algorithms.wire.resolve_wire_dtype`)."""
        return resolve_wire_dtype(self.wire_dtype, link_mbps=self.link_mbps,
                                  batch_size=self.batch_size,
                                  embedding_dim=self.embedding_dim)

    @property
    def effective_target(self) -> float | None:
        """``target_metric`` if set, else the named dataset's default (see
        :data:`DEFAULT_TARGETS`), else None."""
        if self.target_metric is not None:
            return self.target_metric
        return DEFAULT_TARGETS.get(self.dataset)

    @property
    def segments_per_epoch(self) -> int:
        """Training segments per epoch (each ends in a drain and PS sync):
        ``sync_per_epoch``, or by default :attr:`evals_per_epoch` (1 when
        :attr:`scores_in_flight`)."""
        return self.sync_per_epoch or (1 if self.scores_in_flight else self.evals_per_epoch)

    @property
    def scores_in_flight(self) -> bool:
        """Validation points inside a segment are scored while it trains
        (:attr:`val_overlap` under ``pubsub`` with two or more workers on every party:
        each PS is then synced by its workers every ΔT_t steps; a one-worker party's PS
        is current only after a segment's flush)."""
        return (self.val_overlap and self.algo == "pubsub"
                and all(self.workers_for(p) >= 2 for p in self.party_ids))

    @property
    def evals_per_epoch(self) -> int:
        """Validation scorings per evaluated epoch: ``val_per_epoch``, or by default 4
        (quarter epochs) on ``synthetic``, else 1."""
        if self.val_per_epoch:
            return self.val_per_epoch
        return 4 if self.dataset == "synthetic" else 1

    def resolved_worker_mode(self, cores: float) -> str:
        """``worker_mode`` with ``"auto"`` resolved for a party with ``cores`` allotted cores:
        ``"inline"`` with at most one core (the loop and compute threads would only take
        turns on it: measured on ``synthetic`` 30,000 x 500, the paper's small model, each
        party pinned to one core, efficiency 0.79-0.84 inline vs 0.63-0.72 with thread
        workers), else ``"thread"`` (a cgroup quota of 1.5625 cores, say, needs two
        compute threads to be used)."""
        if self.worker_mode != "auto":
            return self.worker_mode
        return "inline" if cores <= 1 else "thread"

    def workers_for_party(self, party: str) -> int:
        """The worker count ``party`` is configured with (before the algorithm's rule of
        :meth:`workers_for`): ``w_active`` for the active party; for a passive party its
        entry of ``passive_party_workers``, else ``w_passive``.

        ``party``: a party id of this run (``active``, ``passive``, ``passive2`` …; the
        role ``passive`` is the first passive party's id).

        Raises:
            ValueError: not a party id of this run.
        """
        self.check_party(party)
        if party == "active":
            return self.w_active
        if not self.passive_party_workers:
            return self.w_passive
        return self.passive_party_workers[self.party_ids.index(party) - 1]

    def check_party(self, party: str) -> None:
        """Raise ValueError naming ``party`` and this run's party ids unless it is one."""
        if party not in self.party_ids:
            raise ValueError(f"party {party!r} is not in this run (its parties: "
                             f"{', '.join(self.party_ids)})")

    @property
    def passive_workers(self) -> tuple[int, ...]:
        """Every passive party's configured worker count, in party order."""
        return tuple(self.workers_for_party(p) for p in self.party_ids[1:])

    def workers_for(self, party: str) -> int:
        """The workers ``party`` (a party id, or a role: ``passive`` is the first
        passive party) runs under ``algo``: its :meth:`workers_for_party` count through
        :func:`parties.algorithms.schedule.effective_workers` (``vfl``/``avfl``: 1; ``vfl-ps``: the
        pairs, the same on every party)."""
        return effective_workers(self.algo, role_of(party), *self._pair(party))

    def ps_update_for(self, party: str) -> str:
        """How ``party``'s parameter server (a party id or role, as :meth:`workers_for`)
        combines its workers: ``ps_update`` under ``pubsub`` and ``avfl-ps`` with two or
        more workers, else ``"average"`` (one worker needs no combining; ``vfl-ps``
        aggregates every batch)."""
        if self.algo in ("pubsub", "avfl-ps") and self.workers_for(party) > 1:
            return self.ps_update
        return "average"

    def shares_top(self) -> bool:
        """Whether the active party's workers share one top model at its PS
        (``top_update = "shared"``): under ``pubsub`` with two or more active workers
        averaged by their PS (``ps_update = "average"``); otherwise each worker's replica
        holds its own top."""
        return (self.top_update == "shared" and self.algo == "pubsub"
                and self.workers_for("active") > 1 and self.ps_update_for("active") == "average")

    def worker_lr(self, party: str) -> float:
        """The Adam learning rate of one of ``party``'s workers (a party id or role, as
        :meth:`workers_for`; ``lr`` scaled by ``lr_scaling`` for the party's own worker
        count; see :func:`parties.algorithms.schedule.worker_lr`; unscaled with gradient push, where
        the server applies every batch's step)."""
        base = self.dp_lr if self.dp_enabled else self.lr
        if self.ps_update_for(party) == "gradient":
            return base
        return worker_lr(self.algo, role_of(party), base, *self._pair(party),
                         self.lr_scaling)

    def _pair(self, party: str) -> tuple[int, int]:
        """``(w_active, w_passive)`` as :mod:`parties.algorithms.schedule` sees them for ``party``:
        a passive party's own count, or for the active party the first passive party's
        (all equal under ``vfl-ps``, the one algorithm that pairs them)."""
        passive = party if party != "active" else self.party_ids[1]
        return self.w_active, self.workers_for_party(passive)

    def bottom_hidden_for(self, role: str) -> tuple[int, ...]:
        """Hidden widths of ``role``'s bottom model: its own setting, else
        ``bottom_hidden``."""
        own = self.active_bottom_hidden if role == "active" else self.passive_bottom_hidden
        if role not in ("active", "passive"):
            raise ValueError(f"role must be 'active' or 'passive', got {role!r}")
        return own or self.bottom_hidden

    def rows_file(self, party: str) -> str:
        """``party``'s aligned-rows file (``psfl vfl align`` output); "" = all rows.

        ``party``: a party id of this run (``active``, ``passive``, ``passive2`` …; with
        one passive party the ids are the roles).

        Raises:
            ValueError: not a party id of this run.
        """
        self.check_party(party)
        if party == "active":
            return self.active_rows_file
        if self.passive_parties == 1:
            return self.passive_rows_file
        if not self.passive_party_rows_files:
            return ""
        return self.passive_party_rows_files[self.party_ids.index(party) - 1]

    @property
    def rows_files(self) -> dict[str, str]:
        """Every party's aligned-rows file by party id ("" = all rows)."""
        return {p: self.rows_file(p) for p in self.party_ids}

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

    @property
    def effective_task(self) -> str:
        """The run's task: ``vfl.task`` if set, else the named dataset's, else ``"binary"``."""
        if self.task:
            return self.task
        named = DATASETS.get(self.dataset)
        return named.task if named is not None else "binary"

    def shared_settings(self, n_rows: int, rows_digest: str = "") -> dict[str, Any]:
        """The settings both parties must agree on, plus the table's row count, and their
        ``digest``. Two parties whose digests differ refuse to train together.

        ``rows_digest``: with aligned rows (``active_rows_file`` and the passive
        parties' files), a
        keyed hash of the ordered shared IDs (:func:`parties.data.aligned_ids_digest`):
        both parties know those IDs, so it reveals nothing new, and two parties whose
        rows files list different records, or the same in another order, refuse to train.

        For the ``synthetic`` dataset, which each party generates itself, they also
        include the generator's parameters and the scikit-learn and NumPy versions
        (the generated table is only guaranteed identical under the same versions).
        """
        shared: dict[str, Any] = {
            "algo": self.algo, "n_rows": n_rows, "test_frac": self.test_frac, "seed": self.seed,
            "epochs": self.epochs, "batch_size": self.batch_size,
            "embedding_dim": self.embedding_dim, "eval_every": self.eval_every,
            "task": self.effective_task,
        }
        if self.val_per_epoch:
            shared["val_per_epoch"] = self.val_per_epoch
        if self.effective_shuffle != "full":
            shared["shuffle"] = [self.effective_shuffle, self.shuffle_block_rows,
                                 self.shuffle_window_rows]
        if self.effective_row_split == "hash":  # and the scored test subset
            shared["row_split"] = {"split": "hash", "eval_max_rows": self.stream_eval_max_rows}
        if self.sync_per_epoch:
            shared["sync_per_epoch"] = self.sync_per_epoch
        if self.scores_in_flight:  # the parties must agree on how a point is scored
            shared["val_overlap"] = True
        if self.algo == "vfl-ps":
            shared["pairs"] = self.workers_for("active")
        if self.passive_parties > 1 or self.fuse != "concat":
            shared["passive_parties"] = self.passive_parties
            shared["fuse"] = self.fuse
        if self.passive_party_workers:
            shared["passive_party_workers"] = list(self.passive_party_workers)
        if rows_digest:
            shared["aligned_ids"] = rows_digest
        if self.dataset == "synthetic":
            shared["synthetic"] = {
                "features": self.synthetic_features,
                "informative": self.synthetic_informative,
                "seed": self.synthetic_seed,
                "generator": f"scikit-learn {_version('scikit-learn')}, numpy {_version('numpy')}",
            }
        shared["digest"] = hashlib.sha256(
            orjson.dumps(shared, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
        return shared


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def load_vfl_config(
    path: str | Path | None = None,
    sets: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> VflConfig:
    """Effective config: defaults, then the TOML file's ``[vfl]`` table, then ``--set`` items.

    ``--set`` keys may be written ``vfl.epochs=3`` or just ``epochs=3``.
    ``extra`` (from dedicated CLI flags) is applied last.

    Raises:
        ConfigError: unknown section or key, wrong type, or an invalid value.
    """
    return load_section(VflConfig, "vfl", path, sets, extra)


def dump_vfl_config(cfg: VflConfig) -> str:
    """The config as TOML text (a ``[vfl]`` table) that :func:`load_vfl_config` reads back."""
    return dump_toml({"vfl": to_mapping(cfg)})


__all__ = ["ALGOS", "DEFAULT_TARGETS", "MAX_PASSIVE_PARTIES", "WORKER_MODES", "VflConfig", "check_run_id", "dump_vfl_config", "load_vfl_config", "passive_party_ids", "replace", "role_of"]
