"""The I/O side of a two-party VFL party: bus, handshake, heartbeats, workers, evaluation,
metrics, and the specification of the five coordination algorithms (``vfl.algo``).

The algorithms themselves are sans-IO strategies (:mod:`parties.strategy`, one object per
algorithm x role) that yield actions; :class:`Party` runs them through
:class:`parties.driver.ActionDriver` over the bus and its workers, and :mod:`sim.des`
runs the same strategies over a simulated clock.

Protocol (all topics live under the run id, so runs can share a broker):

============================  =========  ================================================
topic                         publisher  payload
============================  =========  ================================================
``emb/<run>/<c>``             passive    (B, d) float32 embedding; meta e, b, a, u (and k;
                                         ``pubsub``: d, a raised deadline)
``grad/<run>/<c>``            active     (B, d) float32 cut-layer gradient; meta e, b, u
                                         (``pubsub``: q, p, h, the pace) (or ``skip``:
                                         the active party gave up on it)
``ids/<run>/subsets``         active     ``vfl-ps``: a batch's ID subsets (ids, offsets)
``eval/<run>/val/<i>``        passive    (n_val, d) embeddings of the validation rows at
                                         validation point i (the active party scores them)
``eval/<run>/test``           passive    (n_test, d) embeddings of the test split, at the end
``ctl/<run>/hello/<r>``       both       handshake for role r (shared-settings digest)
``ctl/<run>/hb/<r>``          both       heartbeat of role r
``ctl/<run>/report``          passive    the passive party's metrics, at the end
``ctl/<run>/done``            active     the run is over
============================  =========  ================================================

Channel ``c`` is the batch id b, except under ``vfl-ps`` where it is the worker pair k.

Common to all algorithms: the same models (:mod:`parties.model`), data, bus and
broker; each party has a parameter server (PS) over its parameters with the update rule
θ ← θ + Δ/w (:class:`parties.model.ParameterServer`); every worker has its own replica and
Adam state; the active party computes its own bottom forward while it waits for the
passive embedding and publishes the cut-layer gradient as soon as the top model's
backward has produced it, so both parties' backward passes run concurrently. Each
epoch is trained in segments (one; four quarters on ``synthetic``); after a segment
every replica syncs with the PS and, on evaluated epochs, the active party scores the
PS model on the validation rows (10 % of the training split, at most 10,000 scored),
which is not counted as training time. The test split is scored once, at the end.
Every wait is bounded: by T_ddl where batches may be dropped, otherwise by the
liveness timeout (:class:`PartnerStalled`); a silent partner fails the run after
``liveness_timeout_s`` (:class:`PartnerLost`) under every algorithm.

Algorithms
----------
``pubsub`` — PubSub-VFL (NeurIPS 2025, arXiv 2510.12494, Sec. 4): ``w``
    worker coroutines per party take batch ids from the party's schedule; a passive
    worker publishes its embedding on the batch's channel and waits for the gradient,
    an active worker waits for the embedding; a miss of T_ddl drops the batch and
    reassigns it (``max_reassign`` times, then it is skipped for the epoch; ``t_ddl_s =
    0`` disables dropping). A passive worker keeps up to a window of batches in flight
    (:class:`parties.schedule.InflightWindow`, at most ``inflight_max``): it embeds and
    publishes the next batch before the earlier ones' gradients are back, sized from
    the round trip the run measures of its own messages (publication of an embedding
    to receipt of its gradient, less the active party's time on the batch, which each
    gradient reports with the active party's pace and whether the embedding queued),
    so 1 on a fast link and more across a slow one; gradients are settled in
    publication order, each batch's deadline counted from its publication. A batch
    embedded while others are in flight runs its forward on a snapshot of the worker's
    parameters and its gradient is back-propagated through that snapshot and applied
    to the current parameters (weight stashing, as in PipeDream): exact for its
    embedding, at most ``inflight_max − 1`` of the worker's own updates stale. Where
    the measured round trip makes T_ddl unmeetable (below
    :data:`parties.schedule.DDL_RTTS` round trips)
    the passive party raises its gradient deadline, logs ``vfl.t_ddl_adjusted``, tells
    the active party (meta ``d`` of its embeddings, which raises its embedding wait
    alike) and records it in ``metrics.json`` (``link.t_ddl``).
    Under a DP target a passive party publishes a reassigned
    batch only if every record of it has an extra publication left in its reserve
    (``dp_reassign_reserve``, :mod:`parties.dp`); otherwise it drops the batch for the
    epoch and sends the active party a skip notice on the batch's channel. Per-batch
    buffers hold at most p embeddings / q gradients.
    Replicas sync with the PS every ΔT_t local steps, ΔT_t = ceil(ΔT0/2·tanh(2t/ΔT0 −
    2) + ΔT0/2) in epoch t (``delta_t0 = 1``: every step).
``vfl`` — synchronous split learning (Vepakomma et al., "Split learning for health",
    2018; the VFL baseline of the PubSub-VFL paper): one worker per party in strict
    lock-step. The passive party embeds batch b, publishes it and waits for its
    gradient before it starts batch b+1; the active party computes its own bottom
    forward while it waits, runs the top model and publishes the gradient, then both
    back-propagate concurrently. No deadline-based dropping.
``vfl-ps`` — the industrial parameter-server setup of FATE (Liu et al., JMLR 2021) and
    PaddleFL: for each batch the active PS splits the batch's IDs into P subsets (P =
    min(w_active, w_passive) worker pairs, :func:`parties.schedule.split_batch_ids`) and
    broadcasts them to the passive PS (``ids`` topic); worker k of each party processes
    subset k with its partner on channel k, so the faster of a pair waits; after every
    iteration (batch) both PSs aggregate: every worker pushes, then every worker pulls
    (θ ← θ + mean Δ_k). No deadline-based dropping.
``avfl`` — asynchronous VFL in the style of VFB² (Zhang et al., "Secure Bilevel
    Asynchronous Vertical Federated Learning with Backward Updating", AAAI 2021): one
    worker per party; the passive party does not wait for gradients before embedding
    its next batch: at most ``staleness_bound`` batches may be outstanding
    (:class:`parties.schedule.StalenessWindow`); gradients are applied in publication
    order when they arrive, to the *current* parameters (each is the gradient at the
    parameters its embedding was computed with, so at most ``staleness_bound − 1``
    updates stale); the active party trains on embeddings computed up to that many
    passive updates ago. At the bound the passive worker waits for the oldest
    gradient; a T_ddl miss on either side drops the batch (no reassignment).
``avfl-ps`` — AVFL with a parameter server and several workers per party (the AVFL-PS
    baseline of the PubSub-VFL paper, after Falcon, Wu et al., VLDB 2023): ``w_active``
    / ``w_passive`` workers each run the AVFL loop above on batches taken from a shared
    queue; every replica pushes to and pulls from its PS after every local step
    (asynchronous PS).

With DP on (``dp_mu`` or ``dp_noise_multiplier``, see :mod:`parties.dp`), every
``emb`` and ``eval`` array is row-clipped and noised by the passive party before it
is published (in its workers for ``emb``, thread or process alike, and in the party
process for ``eval``), and each publication is counted per record in a
:class:`parties.dp.GdpAccountant` before it happens.

The ``emb``, ``eval`` and ``grad`` tensors travel as ``vfl.wire_dtype`` says (float32, or
compressed to float16, bfloat16 or int8 with per-row scales where the link is thin:
:mod:`parties.wire`); the sender encodes after the DP noise, the receiver decodes to
float32 before its intake judges the tensor.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import shutil
import tempfile
from pathlib import Path
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
import torch

from pubsub import Bus, BusConfig, DeadlineExceeded
from pubsub.buffer import BufferLimits
from pubsub.control import request_stats
from pubsub.errors import BusError, PeerLost, RendezvousTimeout, SettingsMismatch
from pubsub.config import ConfigError
from pubsub.security import CurveClient
from pubsub.session import heartbeat, rendezvous, watch
from pubsub.transport import Transport

from parties.config import VflConfig, role_of
from parties.rowstore import DiskRows
from parties.driver import ActionDriver
from parties.wire import META_KEY as WIRE_META, WireFormatError, decode_rows, encode_message
from parties.data import (
    aligned_ids_digest,
    encode_labels,
    encode_regression_labels,
    train_test_indices,
)
from parties.dp import (
    EmbeddingPrivatizer,
    GdpAccountant,
    accountant_for,
    plan_from_config,
    party_noise_secret,
    worker_seeds,
)
from parties.dp import report as dp_report
from parties.preflight import (check_test_labels, encode_features, load_configured_table,
                               resolve_party_columns)
from parties.actions import EMB, GRAD
from parties.errors import (ConfigMismatch, HandshakeTimeout, PartnerLost, PartnerStalled,
                            RunAborted,
                            VflError)
from parties.intake import PeerIntake, TensorSpec
from parties.strategy import StrategyConfig, make_strategy
from parties.fuse import fuse_of
from parties.model import (
    ParameterServer,
    embed,
    flat_params,
    load_flat,
    predict,
)
from parties.zoo import ModelFactory
from parties.schedule import (
    eval_segments,
    first_reaching,
    num_batches,
    overlap_decision,
    validation_split,
)
from parties.sysinfo import CpuMeter, cores_allotted, run_delay_s
from parties.timeline import SEGMENT, Timeline, TimedWorker
from parties.tasks import compute_metric, metric_name
from parties.workers import (
    InlineWorker,
    ProcessWorker,
    ThreadWorker,
    WorkerHandle,
    ensure_forkserver,
)

log = structlog.get_logger(__name__)

ROLES = ("active", "passive")


@dataclass(slots=True)
class _Mark:
    """The counters and clocks at the start of a history entry's span (mutable: reset
    at each validation point scored in flight)."""

    before: tuple[float, ...]
    meter: CpuMeter
    delay0: float | None
    cc0: float
    sc0: float
    t0: float

    @classmethod
    def start(cls, before: tuple[float, ...], cc0: float, sc0: float,
              t0: float) -> _Mark:
        """A mark at ``t0``, its CPU meter started now."""
        meter = CpuMeter()
        meter.start()
        return cls(before=before, meter=meter, delay0=run_delay_s(), cc0=cc0, sc0=sc0, t0=t0)

    def reset(self, other: _Mark) -> None:
        """Take ``other``'s counters and clocks (the next span of the same segment)."""
        self.before, self.meter, self.delay0 = other.before, other.meter, other.delay0
        self.cc0, self.sc0, self.t0 = other.cc0, other.sc0, other.t0


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names of one run.

    ``party`` (per-batch channels of several passive parties, docs/dev/multiparty.md):
    a passive party's own id, so that its ``""`` channels are its own; a two-party run
    leaves it empty and its channels carry no party segment."""

    run_id: str
    party: str = ""

    def emb(self, b: int, party: str = "") -> str:
        p = party or self.party
        return f"emb/{self.run_id}/{p}/{b}" if p else f"emb/{self.run_id}/{b}"

    def grad(self, b: int, party: str = "") -> str:
        p = party or self.party
        return f"grad/{self.run_id}/{p}/{b}" if p else f"grad/{self.run_id}/{b}"

    def val(self, point: int, party: str = "") -> str:
        p = party or self.party
        return f"eval/{self.run_id}/{p}/val/{point}" if p else f"eval/{self.run_id}/val/{point}"

    @property
    def test(self) -> str:
        return self.test_of("")

    def test_of(self, party: str) -> str:
        """The test split's embeddings of ``party`` (``""``: this party's, or the one
        partner's)."""
        p = party or self.party
        return f"eval/{self.run_id}/{p}/test" if p else f"eval/{self.run_id}/test"

    @property
    def ids(self) -> str:
        return f"ids/{self.run_id}/subsets"  # three segments: the broker counts ids/<run>

    def hello(self, role: str) -> str:
        return f"ctl/{self.run_id}/hello/{role}"

    def hb(self, role: str) -> str:
        return f"ctl/{self.run_id}/hb/{role}"

    @property
    def report(self) -> str:
        return self.report_of("")

    def report_of(self, party: str) -> str:
        """A passive party's metrics at the end (``""``: this party's, or the one
        partner's)."""
        p = party or self.party
        return f"ctl/{self.run_id}/report/{p}" if p else f"ctl/{self.run_id}/report"

    @property
    def abort(self) -> str:
        """The active party ended the run because of one of several passive parties."""
        return f"ctl/{self.run_id}/abort"

    @property
    def done(self) -> str:
        return f"ctl/{self.run_id}/done"

    @property
    def scored(self) -> str:
        """The active party has scored a validation point: training may go on."""
        return f"ctl/{self.run_id}/scored"


@dataclass(frozen=True, slots=True, kw_only=True)
class PartyData:
    """One party's view of the data after encoding.

    Attributes:
        x_train / x_val / x_test: ``(n, d)`` float32 features of this party's columns:
            the rows that train, the scored validation rows (held out of the training
            split, see :func:`parties.schedule.validation_split`), the test rows.
        y_train / y_val / y_test: ``(n,)`` float32 labels (active party only, else None):
            0/1 (binary task); for regression ``y_train`` is standardised and ``y_val``,
            ``y_test`` are in the label's original units.
        columns: this party's raw feature columns.
        n_rows: rows in the whole (aligned) table.
        dataset: dataset name or path.
        task: ``"binary"`` or ``"regression"``.
        label_mean / label_std: regression only: the training labels' mean and standard
            deviation, original units (standardised prediction p means ``p·std + mean``).
        encoder: the fitted feature encoder (:class:`parties.encoders.FittedEncoder`), or
            None when the features come from the public schema (passive party, DP on).
        label / label_positive: active party only: the label column and (binary task)
            its positive class as a string (saved with the model).
        cache_dir: streaming (``vfl.stream``): the encoded cache; ``x_train`` and
            ``y_train`` are then :class:`parties.rowstore.DiskRows` reading it.
    """

    x_train: np.ndarray
    x_test: np.ndarray
    y_train: np.ndarray | None
    y_test: np.ndarray | None
    x_val: np.ndarray
    y_val: np.ndarray | None
    columns: tuple[str, ...]
    n_rows: int
    dataset: str
    task: str = "binary"
    label_mean: float = 0.0
    label_std: float = 1.0
    encoder: Any = None
    label: str = ""
    label_positive: str = ""
    cache_dir: str = ""


def load_party_data(cfg: VflConfig, role: str) -> PartyData:
    """Load and encode this party's columns (and labels, for the active party).

    ``role``: the party's id (``active``, ``passive``, ``passive2`` …; in a two-party run
    the ids are the roles).

    Raises:
        parties.data.DataError: missing file, unknown column, bad split, a label unfit for
            the task (one class; not numeric or constant for regression).
        ValueError: ``role`` is not one of the run's party ids.
    """
    party = role
    cfg.check_party(party)
    role = role_of(party)
    task = cfg.effective_task
    if cfg.stream:
        return _load_streamed(cfg, party)
    frame, default_label = load_configured_table(cfg, party)  # the party's own rows file
    if cfg.party_datasets:  # the party's own file: its columns (and the active's label)
        from parties.stream import own_columns

        label, groups = cfg.label, {party: own_columns(cfg, party, list(frame.columns))}
    else:
        label, groups = resolve_party_columns(cfg, frame, default_label)
    if cfg.effective_row_split == "hash":  # the rows a streamed run would use
        from parties.stream import stream_split

        train_idx, val_idx, test_idx = stream_split(cfg, len(frame))
    else:
        all_train, test_idx = train_test_indices(len(frame), test_frac=cfg.test_frac,
                                                 seed=cfg.seed)
        fit, val = validation_split(len(all_train), seed=cfg.seed)
        train_idx, val_idx = all_train[fit], all_train[val]
    n_val = len(val_idx)
    held = np.concatenate([val_idx, test_idx])  # encoded with the training rows' statistics
    mine = tuple(groups[party])
    # DP on, passive party: public-schema encoding, nothing fitted on the rows
    feats = encode_features(cfg, role, frame, mine, train_idx, held)
    x_val, x_test = feats.x_test[:n_val], feats.x_test[n_val:]
    y_train = y_test = y_val = None
    mean, std = 0.0, 1.0
    pos = ""
    if role == "active":
        if task == "regression":
            reg = encode_regression_labels(frame, label, train_idx, held)
            y_train, y_held, mean, std = reg.y_train, reg.y_test, reg.mean, reg.std
        else:
            y_train, y_held, pos = encode_labels(frame, label, train_idx, held,
                                                 positive=cfg.positive_class)
        y_val, y_test = y_held[:n_val], y_held[n_val:]
        check_test_labels(y_test, label, task=task)
    log.info("vfl.data_loaded", party=party, dataset=cfg.dataset, task=task, n_rows=len(frame),
             n_train=len(train_idx), n_val=n_val, n_test=len(test_idx), columns=len(mine),
             features=int(feats.x_train.shape[1]),
             hashed=len(getattr(feats.encoder, "hashed_buckets", ())),
             dropped=list(getattr(feats.encoder, "dropped", ())))
    if pos:
        log.info("vfl.label_positive", party=party, label=label, positive=pos)
    return PartyData(
        x_train=feats.x_train, x_test=x_test, y_train=y_train, y_test=y_test,
        x_val=x_val, y_val=y_val,
        columns=mine, n_rows=len(frame), dataset=cfg.dataset, task=task,
        label_mean=mean, label_std=std, encoder=feats.encoder,
        label=label if role == "active" else "", label_positive=pos,
    )


def _load_streamed(cfg: VflConfig, party: str) -> PartyData:
    """:func:`load_party_data` with ``vfl.stream``: :func:`parties.stream.load_streamed`
    (the training rows stay on disk, :class:`parties.rowstore.DiskRows`)."""
    from parties.stream import load_streamed

    got = load_streamed(cfg, party, log=log)
    rows, enc = got.rows, got.encoder
    log.info("vfl.data_loaded", party=party, dataset=cfg.dataset_for(party), task="binary",
             n_rows=rows.n_rows, n_train=rows.x_train.n, n_val=len(rows.x_val),
             n_test=len(rows.x_test), columns=len(got.columns), features=int(enc.width),
             hashed=len(getattr(enc, "hashed_buckets", ())),
             dropped=list(getattr(enc, "dropped", ())), streamed=True,
             cache=str(rows.cache_dir))
    if got.positive:
        log.info("vfl.label_positive", party=party, label=got.label, positive=got.positive)
        check_test_labels(rows.y_test, got.label, task="binary")
    return PartyData(
        x_train=rows.x_train, x_test=rows.x_test, y_train=rows.y_train, y_test=rows.y_test,
        x_val=rows.x_val, y_val=rows.y_val, columns=got.columns, n_rows=rows.n_rows,
        dataset=cfg.dataset_for(party), task="binary", encoder=enc, label=got.label,
        label_positive=got.positive, cache_dir=str(rows.cache_dir))


def _cores(value: Any) -> float | None:
    """A partner's allotted cores as its hello said them (None: not said, or not a
    finite positive number)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if 0 < v < float("inf") else None


def _peak_rss_mb() -> float:
    import resource

    kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
             resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return round(kb / 1024.0, 1)


class Party:
    """One PubSub-VFL party process: ``await Party(...).run()``.

    Args:
        role: ``"active"`` (labels + top model) or ``"passive"``.
        cfg: the run config (shared settings must match the partner's).
        data: this party's encoded data (:func:`load_party_data`).
        broker: broker base address ``tcp://HOST:PORT``.
        run_id: run id shared by both parties.
        progress: print one line per epoch to stdout (active party).
        security: CURVE keys for the bus (:class:`pubsub.security.CurveClient`); None =
            plaintext (loopback brokers only).
        models: the model factory (:class:`parties.zoo.ModelFactory`, e.g. with Python
            callables); None = the config's ``vfl.model`` / ``vfl.top_model``.
        connect: ``connect(name, config=BusConfig)`` returning an async context manager of
            a :class:`pubsub.transport.Transport`: how this party joins the bus, e.g.
            ``MemoryBroker.connect`` to run both parties in one process
            (:mod:`pubsub.memory`); None = a :class:`pubsub.Bus` to ``broker``.
    """

    def __init__(self, role: str, cfg: VflConfig, data: PartyData, *, broker: str = "",
                 run_id: str, progress: bool = True, security: CurveClient | None = None,
                 models: ModelFactory | None = None,
                 connect: Callable[..., contextlib.AbstractAsyncContextManager[Transport]]
                 | None = None) -> None:
        party = role
        if party not in cfg.party_ids:
            raise ValueError(f"party must be one of this run's {cfg.party_ids}, got {party!r}")
        role = role_of(party)
        if role == "active" and data.y_train is None:
            raise ValueError("the active party needs labels")
        #: this party's id (``active``, ``passive``, ``passive2`` …) and its role
        self.party = party
        self.role = role
        #: the parties this one trains with: every passive party (active), or the active
        self.partners: tuple[str, ...] = cfg.party_ids[1:] if role == "active" else ("active",)
        self.partner = "passive" if role == "active" else "active"
        #: several passive parties: topics name the passive party they belong to
        self.multi = cfg.passive_parties > 1
        self.cfg = cfg
        self.data = data
        if connect is None and not broker:
            raise ValueError("give the broker's address or a connect function")
        self.broker = broker
        self._connect = connect
        self.security = security
        #: how this party's bus connection was secured (set once connected)
        self.security_info: dict[str, str] = {}
        self.run_id = run_id
        self.topics = Topics(run_id, party=party if self.multi and role == "passive" else "")
        self.progress = progress
        self.n_train = data.x_train.shape[0]
        self.n_batches = num_batches(self.n_train, cfg.batch_size)
        self.workers = cfg.workers_for(party)  # a passive party's own count
        # "auto": inline compute on a one-core party (call after pinning, as the CLI does)
        self.worker_mode = cfg.resolved_worker_mode(cores_allotted())
        self.metric = metric_name(data.task)
        self.train_s = 0.0  # training wall time, evaluation excluded
        self.run_delay_s = 0.0  # of it, threads runnable but waiting for a CPU
        self.eval_s = 0.0
        #: training segments run (each ends in a drain and PS sync) and validation
        #: points scored while a segment trained (``vfl.val_overlap``)
        self.segments = 0
        self.points_in_flight = 0
        self.train_cpu_s = 0.0  # CPU seconds of the training segments (scoring excluded)
        self.train_compute_cpu_s = 0.0  # of which in the workers' compute calls
        self.train_sync_cpu_s = 0.0  # of which in their parameter-server syncs
        self.t0 = time.perf_counter()
        #: the algorithm x role (sans-IO); its counters are this party's training counters
        self.strategy = make_strategy(StrategyConfig.from_vfl(cfg, role, party))
        self.c = self.strategy.counters
        self.history: list[dict[str, Any]] = []
        self._driver: ActionDriver | None = None
        self.bus: Transport | None = None
        self._topics_of: dict[str, list[str]] = {}  # what only each partner may send us
        self.log = log.bind(party=party, run_id=run_id)
        self.intake = PeerIntake(partner=self.partner, max_bad=cfg.peer_max_bad_messages,
                                 log=self.log)
        torch.manual_seed(cfg.seed + cfg.party_ids.index(party))
        d_in = data.x_train.shape[1]
        self.models = models if models is not None else ModelFactory(cfg)
        hashed = getattr(data.encoder, "hashed_buckets", ())
        if hashed:  # the encoder's hashed columns: embedding tables inside the bottom
            self.models = self.models.with_hashed(hashed)
        mods = self.models.modules(role, d_in)
        for m in mods:
            m.eval()  # the party's copies only score (workers train their own replicas)
        self._bottom = mods[0]
        self._top = mods[1] if role == "active" else None
        update = cfg.ps_update_for(party)
        self.ps = ParameterServer(
            flat_params(mods), workers=self.workers, update=update,
            **({} if update == "average" else dict(
                n_params=sum(p.numel() for m in mods for p in m.parameters()),
                lr=cfg.worker_lr(party), make_optimizer=self.models.optimizer)))
        if role == "active" and cfg.shares_top():
            # one top at the PS, stepped in batch order at the unscaled rate
            base_lr = cfg.dp_lr if cfg.dp_enabled else cfg.lr
            n_all = sum(p.numel() for m in mods for p in m.parameters())
            self.ps.share_top(self.models.top(), offset=sum(
                p.numel() for p in self._bottom.parameters()), lr=base_lr,
                buffer_offset=n_all + sum(  # θ: all parameters, then all float buffers
                    b.numel() for b in self._bottom.buffers() if b.is_floating_point()),
                make_optimizer=self.models.optimizer)
        self._x_test = torch.from_numpy(np.ascontiguousarray(data.x_test))
        self._x_val = torch.from_numpy(np.ascontiguousarray(data.x_val))
        self._handles: list[WorkerHandle] = []
        self.timeline = Timeline(party)
        self._data_dir: Path | None = None
        self.partner_report: dict[str, Any] | None = None
        #: every passive party's report, by party id (active party, after the run)
        self.partner_reports: dict[str, dict[str, Any]] = {}
        self.fuse = fuse_of(cfg) if role == "active" else None
        #: validation points scored in flight (decided after the handshake) and why
        self.overlap = False
        self.overlap_reason = ""
        self._partner_cores: dict[str, float | None] = {}
        self._init_dp()

    def _init_dp(self) -> None:
        """The passive party's DP plan, per-record ledger and secret noise seeds."""
        cfg = self.cfg
        self.dp_plan = plan_from_config(cfg) if self.role == "passive" else None
        self.dp_acct: GdpAccountant | None = None
        self._noise_seeds: list[int | None] = [None] * self.workers
        self._eval_privatize: dict[str, EmbeddingPrivatizer] | None = None
        if self.role != "passive":
            return
        plan = self.dp_plan
        self.dp_acct = accountant_for(
            plan, {"train": self.n_train, "val": int(self.data.x_val.shape[0]),
                   "test": int(self.data.x_test.shape[0])})
        if plan is None:
            return
        *seeds, eval_seed = worker_seeds(party_noise_secret(cfg.dp_noise_seed, self.party),
                                         self.workers + 1)
        self._noise_seeds = list(seeds)
        self._eval_privatize = {
            g: EmbeddingPrivatizer(clip_norm=plan.clip_norm, noise_multiplier=sigma, seed=seed)
            for (g, sigma), seed in zip(sorted(plan.eval_noise_multipliers.items()),
                                        worker_seeds(eval_seed, 2), strict=True)}
        self.log.info("dp.plan", noise_multiplier=plan.noise_multiplier,
                      sgd_noise_multiplier=plan.sgd_noise_multiplier,
                      grad_clip_norm=plan.grad_clip_norm, clip_norm=plan.clip_norm, target_mu=plan.target_mu, delta=plan.delta,
                      planned_publications=plan.planned_publications,
                      noise_seed="config" if cfg.dp_noise_seed is not None else "os_entropy")

    def trained_modules(self) -> list[torch.nn.Module]:
        """This party's models (bottom, then the top model for the active party) loaded with
        the parameter server's current vector (parameters and buffers), in eval mode: after
        :meth:`run`, the trained model (for :mod:`parties.saved`)."""
        mods = [self._bottom] + ([self._top] if self._top is not None else [])
        load_flat(mods, self.ps.pull())
        for m in mods:
            m.eval()
        return mods

    # ------------------------------------------------------------------ helpers
    async def _start_workers(self) -> None:
        """Create the worker handles (and, in process mode, spawn and await the children)."""
        cfg, data = self.cfg, self.data
        mode = self.worker_mode
        if mode in ("thread", "inline"):
            kind = ThreadWorker if mode == "thread" else InlineWorker
            self._handles = [kind(self.role, cfg, data.x_train, data.y_train, self.ps,
                                  noise_seed=self._noise_seeds[k], models=self.models,
                                  party=self.party)
                             for k in range(self.workers)]
        else:
            self._data_dir = Path(tempfile.mkdtemp(prefix=f"psfl-{self.role}-"))
            for name, arr in (("x_train", data.x_train), ("y_train", data.y_train)):
                if isinstance(arr, DiskRows):  # streamed: the workers read the cache
                    arr.save_descriptor(self._data_dir / f"{name}.rows.json")
                elif arr is not None:
                    np.save(self._data_dir / f"{name}.npy", arr)
            self._handles = [ProcessWorker(self.role, k, cfg, self._data_dir, self.ps,
                                           noise_seed=self._noise_seeds[k],
                                           models=self.models, party=self.party)
                             for k in range(self.workers)]
            await asyncio.to_thread(ensure_forkserver)
        self._handles = [TimedWorker(h, self.timeline, k) for k, h in enumerate(self._handles)]
        await asyncio.gather(*(h.start() for h in self._handles))
        self.log.info("vfl.workers_started", workers=self.workers, mode=mode)

    async def _stop_workers(self) -> None:
        for h in self._handles:
            with contextlib.suppress(Exception):
                await h.close()
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
        if self.data.cache_dir and not self.cfg.stream_cache_dir:  # our temporary cache
            for arr in (self.data.x_train, self.data.y_train):
                if isinstance(arr, DiskRows):
                    arr.close()
            shutil.rmtree(self.data.cache_dir, ignore_errors=True)

    def _n_val_points(self) -> int:
        segs = len(eval_segments(self.n_batches, self.cfg.evals_per_epoch))
        return len(self._eval_epochs()) * segs

    def _eval_epochs(self) -> list[int]:
        cfg = self.cfg
        return [e for e in range(cfg.epochs)
                if (e + 1) % cfg.eval_every == 0 or e == cfg.epochs - 1]

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> dict[str, Any]:
        """Connect, handshake, train all epochs, exchange reports; return this party's metrics.

        Raises:
            pubsub.BrokerUnreachable: no broker at the address.
            HandshakeTimeout: the partner never showed up.
            ConfigMismatch: the partner's shared settings differ.
            PartnerLost: the partner's heartbeats stopped mid-run.
        """
        cfg = self.cfg
        bus_cfg = BusConfig(connect_timeout_s=cfg.connect_timeout_s,
                            topic_max_bytes=max(64 << 20, self.data.x_test.shape[0] * 8 * 64))
        starting = asyncio.create_task(self._start_workers())
        try:
            joined = (self._connect(self.role, config=bus_cfg) if self._connect is not None else
                      Bus(self.broker, name=self.role, config=bus_cfg, security=self.security))
            async with joined as bus:
                self.bus = bus
                hello = bus.hello
                if self.security is not None and hello is not None and hello.role != self.role:
                    raise ConfigError("identity", f"key {hello.identity!r} has broker role "
                                      f"{hello.role!r}, but this is the {self.role} party "
                                      f"(use the {self.role} party's key: --identity)")
                self.security_info = {
                    "transport": "curve" if self.security is not None else "plaintext",
                    "identity": hello.identity if hello is not None else "",
                    "role": hello.role if hello is not None else ""}
                await self._subscribe(bus)
                await self._handshake(bus)
                await self._agree_overlap(bus)
                await starting
                batch = TensorSpec(width=cfg.embedding_dim, max_rows=cfg.batch_size)
                self._driver = ActionDriver(
                    bus, topics=self.topics, handles=self._handles, timeline=self.timeline,
                    record_dp=self._record_train if self.role == "passive" else None,
                    inline=self.worker_mode == "inline", logger=self.log,
                    intake=self.intake, specs={EMB: batch, GRAD: batch},
                    wire=cfg.effective_wire_dtype)
                meter = CpuMeter()
                meter.start()
                self.t0 = time.perf_counter()
                try:
                    async with asyncio.TaskGroup() as tg:
                        hb = tg.create_task(self._heartbeat(bus))
                        wd = tg.create_task(self._watchdog(bus))
                        ab = (tg.create_task(self._abort_watch(bus))
                              if self.multi and self.role == "passive" else None)
                        if self.role == "active":
                            result = await self._train_active(bus, meter)
                        else:
                            result = await self._train_passive(bus, meter)
                        hb.cancel()
                        wd.cancel()
                        if ab is not None:
                            ab.cancel()
                except* VflError as eg:  # the party's own error, not a group (exit codes)
                    err = eg.exceptions[0]
                    if self.multi and self.role == "active":
                        await self._announce_abort(bus, err)
                    raise err from None
            if self.role == "active":
                # after the run is done (heartbeats and watchdog stopped): off the
                # training path, and the partner is not kept waiting
                t_base = time.perf_counter()
                result["active_only"] = await asyncio.to_thread(self._active_only)
                if result["active_only"] is not None:
                    self.log.info("vfl.active_only", model=result["active_only"].get("model"),
                                  test_metric=result["active_only"].get("test_metric"),
                                  fit_s=round(time.perf_counter() - t_base, 2))
            return result
        finally:
            if not starting.done():
                starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            await self._stop_workers()

    async def _subscribe(self, bus: Transport) -> None:
        cfg, t = self.cfg, self.topics
        emb_bytes = cfg.batch_size * cfg.embedding_dim * 4 + 4096
        # per-batch channels; VFL-PS uses one channel per worker pair instead
        channels = range(max(self.n_batches, self.workers))
        # each partner's topics, for accept_only once its client id is known
        self._topics_of: dict[str, list[str]] = {}
        if self.role == "active":
            lim = BufferLimits(max_msgs=cfg.p, max_bytes=cfg.p * emb_bytes)
            for party in self.partners:
                q = party if self.multi else ""
                embs = [t.emb(b, q) for b in channels]
                vals = [t.val(i, q) for i in range(self._n_val_points())]
                self._topics_of[party] = [*embs, *vals, t.test_of(q), t.report_of(q),
                                          t.hb(party)]
                await bus.subscribe_many(embs, limits=lim)
                for n, topics in ((self.data.x_val.shape[0], vals),
                                  (self.data.x_test.shape[0], [t.test_of(q)])):
                    eval_bytes = n * cfg.embedding_dim * 4 + 4096
                    await bus.subscribe_many(topics, limits=BufferLimits(
                        max_msgs=2, max_bytes=2 * eval_bytes))
                await bus.subscribe(t.report_of(q))
        else:
            lim = BufferLimits(max_msgs=cfg.q, max_bytes=cfg.q * emb_bytes)
            grads = [t.grad(b) for b in channels]
            mine = [*grads, t.done, t.scored, t.hb("active")]
            await bus.subscribe_many(grads, limits=lim)
            if cfg.algo == "vfl-ps":
                mine.append(t.ids)
                ids_bytes = cfg.batch_size * 8 + (self.workers + 1) * 8 + 4096
                await bus.subscribe(t.ids, limits=BufferLimits(max_msgs=16,
                                                               max_bytes=16 * ids_bytes))
            await bus.subscribe(t.done)
            await bus.subscribe(t.scored, limits=BufferLimits(max_msgs=4, max_bytes=1 << 14))
            if self.multi:
                mine.append(t.abort)
                await bus.subscribe(t.abort, limits=BufferLimits(max_msgs=4,
                                                                 max_bytes=1 << 14))
            self._topics_of["active"] = mine
        for party in self.partners:
            await bus.subscribe(t.hb(party), limits=BufferLimits(max_msgs=4, max_bytes=1 << 16))
        # subscribed last: a hello from the partner proves all the above reached its publisher
        await bus.subscribe(t.hello(self.party))

    async def _handshake(self, bus: Transport) -> None:
        """Exchange hellos until each side has seen the other (PubSub slow-joiner guard;
        :func:`pubsub.session.rendezvous` over the shared-settings digest): the active
        party meets every passive party, a passive party the active party."""
        cfg, t = self.cfg, self.topics
        rows_file = cfg.rows_file(self.party)
        mine = cfg.shared_settings(self.data.n_rows,
                                   aligned_ids_digest(rows_file) if rows_file else "")
        try:
            heard = await rendezvous(
                bus, me=self.party, peers=list(self.partners), digest=str(mine["digest"]),
                say=[t.hello(p) for p in self.partners], hear=[t.hello(self.party)],
                timeout_s=cfg.handshake_timeout_s, interval_s=0.1,
                info={"role": self.role, "shared": mine,
                      "cores": round(cores_allotted(), 4)}, mismatch_linger_s=0.5,
                on_found=lambda peer, _: self.log.info("vfl.partner_found", partner=peer))
        except RendezvousTimeout as exc:
            raise HandshakeTimeout(", ".join(exc.missing) if self.multi else self.partner,
                                   cfg.handshake_timeout_s, self.run_id) from None
        except SettingsMismatch as exc:
            raise ConfigMismatch(mine, dict(exc.hello.get("shared") or {})) from None
        # from now on only the client each partner's handshake came from is that partner:
        # the bus drops others' messages on its topics before they take room
        ids = {p: str(heard[p]["publisher"]) for p in self.partners}
        self._partner_cores = {p: _cores(heard[p].get("cores")) for p in self.partners}
        self.intake.partners = {pid: p for p, pid in ids.items()}
        for p, pid in ids.items():
            bus.accept_only(pid, self._topics_of[p])

    async def _agree_overlap(self, bus: Transport) -> None:
        """Whether this run scores validation points in flight
        (:func:`parties.schedule.overlap_decision`): the active party decides from every
        party's allotted cores (said in the hellos) and tells the passive parties on the
        ``scored`` topic (point -1) before training starts; each side then runs the same
        segments. Without ``scores_in_flight`` nothing is exchanged.

        Raises:
            HandshakeTimeout: a passive party heard no decision within the handshake
                timeout.
        """
        cfg = self.cfg
        if not cfg.scores_in_flight:
            self.overlap, self.overlap_reason = False, "off in the configuration"
            return
        if self.role == "active":
            cores = {"active": cores_allotted(), **self._partner_cores}
            self.overlap, self.overlap_reason = overlap_decision(True, cores)
            bus.publish_nowait(self.topics.scored, (),
                               {"point": -1, "val_overlap": self.overlap,
                                "reason": self.overlap_reason})
        else:
            deadline = time.monotonic() + cfg.handshake_timeout_s
            while True:
                try:
                    msg = await bus.next(self.topics.scored,
                                         max(0.0, deadline - time.monotonic()))
                except DeadlineExceeded:
                    raise HandshakeTimeout("active", cfg.handshake_timeout_s,
                                           self.run_id) from None
                if "val_overlap" in msg.meta:
                    break
            self.overlap = bool(msg.meta["val_overlap"])
            self.overlap_reason = str(msg.meta.get("reason", ""))[:200]
        self.log.info("vfl.val_overlap", on=self.overlap, reason=self.overlap_reason)

    async def _heartbeat(self, bus: Transport) -> None:
        await heartbeat(bus, self.topics.hb(self.party), me=self.party,
                        interval_s=self.cfg.heartbeat_interval_s)

    async def _watchdog(self, bus: Transport) -> None:
        timeout = self.cfg.liveness_timeout_s
        try:
            await watch(bus, {p: self.topics.hb(p) for p in self.partners}, timeout_s=timeout)
        except PeerLost as exc:
            lost = str(exc.peer) if self.multi else self.partner
            self.log.error("vfl.partner_lost", partner=lost, silent_s=timeout)
            raise PartnerLost(lost, timeout) from None

    async def _abort_watch(self, bus: Transport) -> None:
        """Passive, several passive parties: end this party as soon as the active party
        says it ended the run (:class:`RunAborted`, naming the party that caused it)."""
        while True:
            try:
                msg = await bus.next(self.topics.abort, 3600.0)
            except DeadlineExceeded:
                continue
            party = str(msg.meta.get("party", "?"))[:32]
            reason = str(msg.meta.get("reason", ""))[:300]
            self.log.error("vfl.run_aborted", by="active", party=party, reason=reason)
            raise RunAborted(party, reason)

    async def _announce_abort(self, bus: Transport, err: BaseException) -> None:
        """Active, several passive parties: tell every passive party that the run is over
        because of ``err``'s party (best effort: a lost party cannot hear it)."""
        party = str(getattr(err, "partner", "") or "active")
        with contextlib.suppress(Exception):
            bus.publish_nowait(self.topics.abort, (),
                               {"party": party, "reason": str(err)[:300]})
            await asyncio.sleep(0.1)  # let the message leave before the bus closes

    # ------------------------------------------------------------------ training
    async def _train(self, bus: Transport) -> None:
        """All epochs: each epoch's segments (``segments_per_epoch``: one per scoring, or
        ``sync_per_epoch``) are trained by the configured algorithm and synced to the PS;
        at a scoring segment's end the validation split is scored (active) or embedded
        for it (passive); scoring is not training time. With ``scores_in_flight`` the
        points inside a segment are scored while it trains (:meth:`_score_in_flight`)."""
        cfg = self.cfg
        overlap = self.overlap
        segs = eval_segments(self.n_batches, cfg.sync_per_epoch
                             or (1 if overlap else cfg.evals_per_epoch))
        # the scorings fall on the ends of the scoring segments (sync_per_epoch is a
        # multiple of evals_per_epoch, so these ends are segment ends too), or inside
        # the segments (overlap)
        ends = [r.stop for r in eval_segments(self.n_batches, cfg.evals_per_epoch)]
        score_ends = set(ends)
        point = 0
        go: int | None = None  # active: the scored point the passive party waits for
        for epoch in range(cfg.epochs):
            batches = cfg.batch_order(self.n_train, epoch)
            evaluated = epoch in self._eval_epochs()
            applied0 = self.c.batches
            for s, seg in enumerate(segs):
                mark = self._open_mark()
                seg_t0 = mark.t0
                if go is not None:
                    bus.publish_nowait(self.topics.scored, (), {"point": go})
                    go = None
                inside = sorted(e for e in score_ends if seg.start < e < seg.stop) \
                    if evaluated and overlap else []
                side: asyncio.Task[Any] | None = None
                seg_done = asyncio.Event()
                if inside:
                    side = asyncio.create_task(self._score_in_flight(
                        bus, epoch, len(segs), s, inside, point, applied0, seg_done, mark,
                        [(ends.index(e) + 1) / len(ends) for e in inside]))
                    point += len(inside)
                try:
                    await self._run_segment(epoch, batches, seg)
                    seg_done.set()
                    if side is not None:
                        assert self._driver is not None
                        await self._driver.wake()  # a point still waiting is published now
                        await side
                finally:
                    if side is not None and not side.done():
                        side.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await side
                t1 = time.perf_counter()
                self.segments += 1
                self.timeline.record(SEGMENT, -1, len(self.history), seg_t0, t1)
                entry = self._close_mark(mark, epoch, s, len(segs), t1,
                                         (s + 1) / len(segs))
                if evaluated and seg.stop in score_ends:
                    # Scoring is not training time on either side: the passive party waits
                    # for the active party's "scored", sent when the active party's next
                    # segment has started, so that it does not train while the active
                    # party's clock is stopped (its work there would count for nothing:
                    # at 50:14 the passive party trained 30 % beyond the active's window).
                    # With overlap the passive party trains on at once (the time to
                    # target counts the scoring; the segments' clocks are not compared).
                    t_eval = time.perf_counter()
                    last = epoch == cfg.epochs - 1 and s == len(segs) - 1
                    if self.role == "active":
                        value = await self._score(bus, "val", point)
                        entry[f"val_{self.metric}"] = value
                        entry["metric"] = value
                        if not last and not overlap:
                            go = point  # published once the next segment's clock runs
                    else:
                        await self._publish_embeddings(bus, "val", self.topics.val(point))
                        if not last and not overlap:
                            await self._await_scored(bus, point)
                    point += 1
                    self.eval_s += time.perf_counter() - t_eval
                self._append_entry(entry)

    def _open_mark(self, cc0: float | None = None, sc0: float | None = None,
                   t0: float | None = None) -> _Mark:
        """The counters and clocks at the start of a history entry's span (the CPU
        meters and the clock read now unless given)."""
        c = self.c
        return _Mark.start(
            (c.loss_sum, c.loss_n, c.samples, self._wait_s(), c.dropped, c.reassigned),
            self._compute_cpu_s() if cc0 is None else cc0,
            self._sync_cpu_s() if sc0 is None else sc0,
            time.perf_counter() if t0 is None else t0)

    def _close_mark(self, mark: _Mark, epoch: int, s: int, n_segs: int, t1: float,
                    done: float) -> dict[str, Any]:
        """A history entry for the span from ``mark`` to ``t1`` (training time), ``done``
        of the epoch's ``n_segs`` segments done; ``mark`` is reset to ``t1`` for the next
        span of the same segment."""
        c, before = self.c, mark.before
        dt = t1 - mark.t0
        delay1 = run_delay_s()
        delay = (delay1 - mark.delay0) \
            if mark.delay0 is not None and delay1 is not None else None
        if delay is not None:
            self.run_delay_s += delay
        _, seg_cpu, _, util = mark.meter.read()
        self.train_cpu_s += seg_cpu
        cc1, sc1 = self._compute_cpu_s(), self._sync_cpu_s()
        self.train_compute_cpu_s += cc1 - mark.cc0
        self.train_sync_cpu_s += sc1 - mark.sc0
        self.train_s += dt
        entry: dict[str, Any] = {
            "epoch": epoch, "segment": s,
            "epochs_done": round(epoch + done, 6),
            "train_s": dt, "train_wall_s": self.train_s,
            "samples_per_s": (c.samples - before[2]) / dt if dt > 0 else 0.0,
            "wait_s": (self._wait_s() - before[3]) / self.workers,
            "cpu_util": util, "run_delay_s": delay,
            "dropped": c.dropped - before[4], "reassigned": c.reassigned - before[5],
        }
        if self.role == "active":
            entry["loss"] = (c.loss_sum - before[0]) / max(1, c.loss_n - before[1])
        mark.reset(self._open_mark(cc1, sc1, t1))
        return entry

    def _append_entry(self, entry: dict[str, Any], at: float | None = None) -> None:
        """Record a history entry, ``wall_s`` at ``at`` (``perf_counter``; default now)."""
        entry["wall_s"] = (time.perf_counter() if at is None else at) - self.t0
        self.history.append(entry)
        self.log.info("vfl.epoch_done", **entry)
        if self.progress and self.role == "active":
            key = f"val_{self.metric}"
            shown = f"  {key} {entry[key]:.4f}" if key in entry else ""
            part = f" ({entry['epochs_done'] - entry['epoch']:.2f})" \
                if entry["epochs_done"] - entry["epoch"] < 1 else ""
            print(f"epoch {entry['epoch'] + 1:>3}/{self.cfg.epochs}{part}  loss "
                  f"{entry['loss']:.4f}"
                  f"{shown}  {entry['samples_per_s']:,.0f} samples/s  wait "
                  f"{entry['wait_s']:.2f} s  dropped {entry['dropped']}", flush=True)

    async def _score_in_flight(self, bus: Transport, epoch: int, n_segs: int, s: int,
                               stops: list[int], point: int, applied0: int,
                               seg_done: asyncio.Event, mark: _Mark,
                               fractions: list[float]) -> None:
        """Overlap (``scores_in_flight``): the validation points at batch positions
        ``stops`` of the epoch inside segment ``s``, numbered from ``point``, while the
        segment trains. The passive party publishes its embeddings of the validation
        rows from its PS once it has applied ``stop`` batches of the epoch (its
        workers' progress; any left when the segment ends are published then); the
        active party scores each point as its partners' embeddings arrive. Each point
        is a history entry on both sides (the same count, so the entries match by
        position), its span cut from the segment's; ``fractions``: each point's share of
        the epoch (its ``epochs_done``, as when it ends a segment)."""
        for i, stop in enumerate(stops):
            taken: list[float] = []
            if self.role == "active":
                # the point's time: when the scored parameters were taken, not when the
                # score came back (training went on meanwhile; a drained point's clock
                # instead stands still while it is scored)
                value = await self._score(bus, "val", point + i, taken)
            else:
                # woken by the strategy after each batch's completion (NotifySchedule)
                # and at the segment's end (bounded by the segment's own deadlines)
                assert self._driver is not None
                await self._driver.wait_until(
                    lambda stop=stop: self.c.batches - applied0 >= stop or seg_done.is_set())
                await self._publish_embeddings(bus, "val", self.topics.val(point + i))
            at = taken[0] if taken else time.perf_counter()
            entry = self._close_mark(mark, epoch, s, n_segs, at, fractions[i])
            if self.role == "active":
                entry[f"val_{self.metric}"] = value
                entry["metric"] = value
            self.points_in_flight += 1
            self._append_entry(entry, at)

    async def _await_scored(self, bus: Transport, point: int) -> None:
        """Passive: wait until the active party has scored validation point ``point``.

        Raises:
            PartnerStalled: no word within the liveness timeout plus T_ddl (seconds).
        """
        bound = self.cfg.liveness_timeout_s + self.cfg.t_ddl_s
        deadline = time.monotonic() + bound
        while True:
            try:
                msg = await bus.next(self.topics.scored, max(0.0, deadline - time.monotonic()))
            except DeadlineExceeded:
                raise PartnerStalled("active", "val", bound,
                                     f"validation point {point} never scored") from None
            if int(msg.meta.get("point", -1)) >= point:
                return

    async def _run_segment(self, epoch: int, batches: list[np.ndarray], seg: range) -> None:
        """Train the batches ``seg`` of ``epoch`` with the configured algorithm (the
        strategy's generators, interpreted over the bus and workers), then sync every
        replica with the PS."""
        assert self._driver is not None
        await self._driver.run(self.strategy.segment(epoch, batches, seg))
        await self._driver.run(self.strategy.end_segment(epoch))

    # ------------------------------------------------------------------ passive
    async def _train_passive(self, bus: Transport, meter: CpuMeter) -> dict[str, Any]:
        cfg = self.cfg
        await self._train(bus)
        t_eval = time.perf_counter()
        await self._publish_embeddings(bus, "test", self.topics.test)
        self.eval_s += time.perf_counter() - t_eval
        metrics = self._party_metrics(meter)
        metrics["dp"] = dp_report(self.dp_plan, self.dp_acct)
        if self.dp_plan is not None:
            self.log.info("dp.spent", mu=metrics["dp"]["mu"], epsilon=metrics["dp"]["epsilon"],
                          delta=self.dp_plan.delta,
                          publications_max=metrics["dp"]["publications_max"])
        bus.publish_nowait(self.topics.report, (), metrics)
        # wait for the active party to finish evaluating (heartbeats keep flowing)
        try:
            await bus.next(self.topics.done, cfg.liveness_timeout_s + cfg.t_ddl_s)
        except DeadlineExceeded:
            self.log.warning("vfl.no_done", waited_s=cfg.liveness_timeout_s + cfg.t_ddl_s)
        return metrics

    async def _publish_embeddings(self, bus: Transport, split: str, topic: str) -> None:
        """Publish the embeddings of the ``val`` (scored subsample) or ``test`` split from
        the PS parameters (counted in the DP ledger first)."""
        load_flat([self._bottom], self.ps.pull())
        x = self._x_val if split == "val" else self._x_test
        emb = await asyncio.to_thread(self._embeddings, x, split)
        assert self.dp_acct is not None
        self.dp_acct.record(split)
        # encoded after the clip and noise (DP post-processing, parties.wire)
        bus.publish_nowait(topic, *encode_message([emb], {"split": split},
                                                  self.cfg.effective_wire_dtype), copy=False)

    def _record_train(self, rows: np.ndarray, *, extra: bool = False) -> bool:
        """Count one ``emb`` publication of ``rows`` in the DP ledger (before it happens);
        ``extra``: a reassigned attempt, first checked against every record's reserve
        (``dp_reassign_reserve``, this party's own per-record count): False when a record
        of the batch has spent it (nothing counted: the batch must not be published).

        Raises:
            parties.errors.PrivacyBudgetExceeded: past the plan (nothing is published).
        """
        assert self.dp_acct is not None
        if extra and not self.dp_acct.admits_extra("train", rows):
            self.log.warning("dp.reserve_exhausted", rows=len(rows),
                             reserve=self.dp_acct.reserve.get("train"))
            return False
        self.dp_acct.record("train", rows, extra=extra)
        return True

    def _embeddings(self, x: torch.Tensor, split: str) -> np.ndarray:
        """Embeddings ``(n, d)`` float32 of ``x`` (the ``split`` rows) from the PS
        parameters: clipped and noised with the split's noise when DP is on (a thread's
        work)."""
        emb = embed(self._bottom, x)
        if self._eval_privatize is None:
            return emb
        return self._eval_privatize[split](torch.from_numpy(emb))[1].numpy()

    # ------------------------------------------------------------------ active
    async def _train_active(self, bus: Transport, meter: CpuMeter) -> dict[str, Any]:
        cfg = self.cfg
        name = self.metric
        key = f"test_{name}"
        await self._train(bus)
        t_eval = time.perf_counter()
        value = await self._score(bus, "test")
        self.eval_s += time.perf_counter() - t_eval
        metrics = self._party_metrics(meter)
        target = cfg.effective_target
        points = [(h["train_wall_s"], h["metric"]) for h in self.history if "metric" in h]
        metrics.update({
            "task": self.data.task, key: value, "metric_name": name, "metric": value,
            "target_metric": target,
            "time_to_target_s": first_reaching(points, target, higher_is_better=name == "auc"),
            "n_val_scored": int(self._x_val.shape[0]),
        })
        deadline = time.monotonic() + cfg.liveness_timeout_s
        for party in self.partners:
            try:
                rep = await bus.next(self.topics.report_of(party if self.multi else ""),
                                     max(0.0, deadline - time.monotonic()))
                self.partner_reports[party] = dict(rep.meta)
            except DeadlineExceeded:
                self.log.warning("vfl.no_report", partner=party,
                                 waited_s=cfg.liveness_timeout_s)
        self.partner_report = self.partner_reports.get(self.partners[0])
        try:
            # in-process (``connect`` given): the caller adds the hub's own statistics
            metrics["broker"] = None if self._connect is not None else await asyncio.to_thread(
                request_stats, self.broker, timeout_s=2.0, security=self.security)
        except BusError as exc:
            self.log.warning("vfl.broker_stats_failed", error=str(exc))
            metrics["broker"] = None
        bus.publish_nowait(self.topics.done, (), {"ok": True})
        await asyncio.sleep(0.05)
        return metrics

    def _active_only(self) -> dict[str, Any] | None:
        """The active-only baseline (:func:`parties.baseline.active_only_baseline`) on this
        party's own columns and labels, same rows, after training; None when
        ``vfl.active_only_baseline`` does not ask for it, and a ``skipped`` note where it
        cannot apply (regression, streamed rows, no validation rows)."""
        cfg, data = self.cfg, self.data
        want = cfg.active_only_baseline
        if want == "off" or (want == "auto" and not cfg.dp_enabled):
            return None
        if data.task != "binary":
            return {"skipped": "binary tasks only (regression is not covered)"}
        if data.cache_dir:
            return {"skipped": "streamed rows (vfl.stream) are not covered"}
        if len(data.x_val) == 0:
            return {"skipped": "no validation rows to choose on"}
        from parties.baseline import active_only_baseline

        try:
            return active_only_baseline(data.x_train, data.y_train, data.x_val, data.y_val,
                                        data.x_test, data.y_test, task=data.task,
                                        seed=cfg.seed)
        except Exception as exc:  # noqa: BLE001 - a reference figure never ends a run
            self.log.warning("vfl.active_only_failed", error=f"{type(exc).__name__}: {exc}")
            return {"skipped": f"failed: {type(exc).__name__}: {exc}"}

    async def _score(self, bus: Transport, split: str, point: int = 0,
                     taken: list[float] | None = None) -> float:
        """The metric (AUC, or RMSE in the label's units) of the PS parameters on the
        ``val`` (validation point ``point``) or ``test`` split, with every passive
        party's embeddings of it (waited for up to the liveness timeout in all).
        ``taken`` (a list): the ``perf_counter`` time the scored parameters were taken
        from the PS is appended (the model scored existed then; scoring it took longer)."""
        cfg, data, t = self.cfg, self.data, self.topics
        assert self._top is not None
        x, y = (self._x_val, data.y_val) if split == "val" else (self._x_test, data.y_test)
        assert y is not None
        spec = TensorSpec(width=cfg.embedding_dim, max_rows=len(x), rows=len(x))
        deadline = time.monotonic() + cfg.liveness_timeout_s
        embs = []
        for party in self.partners:
            q = party if self.multi else ""
            topic = t.val(point, q) if split == "val" else t.test_of(q)
            while True:  # the partner's embeddings of the split (others' are dropped)
                try:
                    msg = await bus.next(topic, max(0.0, deadline - time.monotonic()))
                except DeadlineExceeded:
                    raise PartnerStalled(party if self.multi else self.partner, split,
                                         cfg.liveness_timeout_s,
                                         "embeddings for scoring") from None
                tag = msg.meta.get(WIRE_META)
                if tag is not None:  # sent compressed (parties.wire): float32 again
                    try:
                        msg = dataclasses.replace(msg, arrays=(decode_rows(msg.arrays, tag),))
                    except WireFormatError as exc:
                        self.intake.reject(msg.publisher, str(exc), topic=msg.topic,
                                           fatal=True)
                        continue
                # one release per split: a bad one from the partner cannot be waited out
                if self.intake.admit(msg, spec, fatal=True):
                    break
            embs.append(msg.arrays[0])
        load_flat([self._bottom, self._top], self.ps.pull())
        if taken is not None:
            taken.append(time.perf_counter())
        pred = await asyncio.to_thread(predict, self._bottom, self._top, x,
                                       embs[0] if len(embs) == 1 else embs, task=data.task,
                                       fuse=self.fuse)
        if data.task == "regression":
            pred = pred.astype(np.float64) * data.label_std + data.label_mean
        return compute_metric(data.task, y, pred)

    # ------------------------------------------------------------------ metrics
    def _wait_s(self) -> float:
        """Seconds the workers have waited for partner messages so far."""
        return self._driver.wait_s if self._driver is not None else 0.0

    def _compute_cpu_s(self) -> float:
        """CPU seconds the workers' compute calls have taken so far (thread CPU time of
        the thread, or worker process, that ran them)."""
        return sum(h.compute_cpu_s for h in self._handles)

    def _sync_cpu_s(self) -> float:
        """CPU seconds of the workers' parameter-server syncs so far (part of
        :meth:`_compute_cpu_s`)."""
        return sum(h.sync_cpu_s for h in self._handles)

    def _party_metrics(self, meter: CpuMeter) -> dict[str, Any]:
        wall, cpu, cores, util = meter.read()
        assert self.bus is not None
        st = self.bus.stats()
        out = {
            "role": self.role,
            "party": self.party,
            "algo": self.cfg.algo,
            "workers": self.workers,
            "train_wall_s": self.train_s,
            "eval_s": self.eval_s,
            "segments": self.segments,
            "points_in_flight": self.points_in_flight,
            "val_overlap": {"on": self.overlap, "reason": self.overlap_reason},
            "party_wall_s": wall,
            "cpu_s": cpu,
            "cores_allotted": cores,
            "cpu_util": util,
            "cpu_s_train": self.train_cpu_s,
            "cpu_util_train": (self.train_cpu_s / (self.train_s * cores)
                               if self.train_s > 0 else None),
            "security": self.security_info,
            "run_delay_s": self.run_delay_s,
            "wait_s_total": self._wait_s(),
            "wait_s_per_epoch": self._wait_s() / (self.workers * self.cfg.epochs),
            "bytes_sent": dict(st.sent_bytes),
            "msgs_sent": dict(st.sent_msgs),
            # how this party's emb / eval / grad tensors travelled (parties.wire)
            "wire_dtype": self.cfg.effective_wire_dtype,
            "bytes_recv": dict(st.recv_bytes),
            "dropped_batches": self.c.dropped,
            "reassigned_batches": self.c.reassigned,
            "skipped_batches": self.c.skipped,
            "stale_messages": self.c.stale,
            # the partner's malformed embeddings/gradients dropped, by sender (parties.intake)
            "rejected_messages": self.intake.rejected,
            # messages on the partner's topics from other bus clients, dropped on arrival
            "foreign_messages": st.foreign,
            "rejected_by_sender": dict(list(self.intake.bad.items())[:64]),
            "switched_waits": self.c.switched,
            "max_staleness": self.c.max_staleness,
            "bus": {k: v for k, v in st.as_dict().items() if not isinstance(v, dict)},
            "ps_pushes": self.ps.pushes,
            "worker_mode": self.worker_mode,
            "model": self.models.describe(),
            "compute_s": sum(h.compute_s for h in self._handles),
            "compute_cpu_s_train": self.train_compute_cpu_s,
            "sync_cpu_s_train": self.train_sync_cpu_s,
            "step_cpu_s_per_sample": ((self.train_compute_cpu_s - self.train_sync_cpu_s)
                                      / self.c.samples if self.c.samples else None),
            "worker_parallelism": (sum(h.compute_s for h in self._handles) / wall
                                   if wall > 0 else 0.0),
            "batches": self.c.batches,
            "samples": self.c.samples,
            "history": self.history,
            # under DP the passive width is the public schema's (a function of it alone)
            "n_features": int(self.data.x_train.shape[1]),
            "feature_encoding": ("public_schema" if self.role == "passive"
                                 and self.cfg.dp_enabled else "fitted"),
            "columns": list(self.data.columns),
            # each raw column's treatment (numeric, onehot, hashed, datetime, dropped)
            # lifetime peak resident set of this party process (loading included) and
            # of its largest finished worker process, MiB (ru_maxrss)
            "peak_rss_mb": _peak_rss_mb(),
            "treatments": (self.data.encoder.treatments_dict()
                           if hasattr(self.data.encoder, "treatments_dict") else []),
        }
        if self.role == "active" and self.data.task == "binary":
            out["label"] = self.data.label
            out["label_positive"] = self.data.label_positive
        if self.multi and self.role == "active":
            out["missed_by_party"] = dict(self.c.missed_by_party)
        link = getattr(self.strategy, "link_report", None)
        link = link() if link is not None else None
        if link is not None:  # pubsub's passive party: what it measured of its link
            wire = st.sent_bytes.get(EMB, 0) + st.recv_bytes.get(GRAD, 0)
            link["bytes_per_sample"] = wire / self.c.samples if self.c.samples else None
            out["link"] = link
        return out
