"""The I/O driver of a two-party VFL party: bus, handshake, heartbeats, workers, evaluation,
and the five coordination algorithms (``vfl.algo``).

Protocol (all topics live under the run id, so runs can share a broker):

============================  =========  ================================================
topic                         publisher  payload
============================  =========  ================================================
``emb/<run>/<c>``             passive    (B, d) float32 embedding; meta e, b, a, u (and k)
``grad/<run>/<c>``            active     (B, d) float32 cut-layer gradient; meta e, b, u
                                         (or ``skip``: the active party gave up on it)
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
    0`` disables dropping). Per-batch buffers hold at most p embeddings / q gradients.
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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
import shutil
import tempfile
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog
import torch

from pubsub import Bus, BusConfig, DeadlineExceeded, Message
from pubsub.buffer import BufferLimits
from pubsub.control import request_stats
from pubsub.errors import BusError
from pubsub.config import ConfigError
from pubsub.security import CurveClient

from parties.config import VflConfig
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
    worker_seeds,
)
from parties.dp import report as dp_report
from parties.preflight import (check_test_labels, encode_features, load_configured_table,
                               resolve_columns)
from parties.errors import ConfigMismatch, HandshakeTimeout, PartnerLost, PartnerStalled
from parties.model import (
    ParameterServer,
    embed,
    flat_params,
    load_flat,
    predict,
)
from parties.zoo import ModelFactory
from parties.schedule import (
    EpochSchedule,
    StalenessWindow,
    epoch_batches,
    eval_segments,
    first_reaching,
    num_batches,
    pack_ids,
    split_batch_ids,
    unpack_ids,
    validation_split,
)
from parties.sysinfo import CpuMeter, cores_allotted, run_delay_s
from parties.timeline import COMM, SEGMENT, WAIT, Timeline, TimedWorker
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
#: How often a long wait for partner data checks whether a reassigned batch's data has
#: arrived meanwhile (seconds). Only waits longer than this pay for it.
SWITCH_CHECK_S = 0.05


class _Switch(Exception):
    """An active worker gave up waiting for one batch to take a reassigned batch whose
    embedding is already here (see :meth:`Party._active_step`)."""


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names of one run."""

    run_id: str

    def emb(self, b: int) -> str:
        return f"emb/{self.run_id}/{b}"

    def grad(self, b: int) -> str:
        return f"grad/{self.run_id}/{b}"

    def val(self, point: int) -> str:
        return f"eval/{self.run_id}/val/{point}"

    @property
    def test(self) -> str:
        return f"eval/{self.run_id}/test"

    @property
    def ids(self) -> str:
        return f"ids/{self.run_id}/subsets"  # three segments: the broker counts ids/<run>

    def hello(self, role: str) -> str:
        return f"ctl/{self.run_id}/hello/{role}"

    def hb(self, role: str) -> str:
        return f"ctl/{self.run_id}/hb/{role}"

    @property
    def report(self) -> str:
        return f"ctl/{self.run_id}/report"

    @property
    def done(self) -> str:
        return f"ctl/{self.run_id}/done"

    @property
    def scored(self) -> str:
        """The active party has scored a validation point: training may go on."""
        return f"ctl/{self.run_id}/scored"


def _grad_acceptor(epoch: int, b: int, uid: str) -> Callable[[Message], int]:
    """Accept the gradient of batch ``b`` of ``epoch``, or the active party's notice that
    it skipped the batch; anything from an earlier epoch is stale.

    A gradient of an earlier attempt at the same batch (its ``u`` is not ``uid``) is
    accepted too: the active party trains each batch once, on whichever attempt's
    embedding reached it first, so after a miss on either side that gradient is the only
    one that will come. Applied to the newer attempt's forward graph (the same rows, the
    parameters a few steps on), it is a stale gradient, as AVFL applies routinely;
    waiting for the exact attempt instead made the two parties circle their reassigned
    batches out of phase, each miss costing another T_ddl (a 5 s pause of the passive
    party with T_ddl = 2 s then cost over 80 s).
    """

    def accept(m: Message) -> int:
        e = m.meta.get("e", -1)
        if e == epoch and m.meta.get("b") == b:
            return 1
        if m.meta.get("u") == uid:  # (gradients always carry e and b; kept for safety)
            return 1
        return 0 if e <= epoch else -1

    return accept


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


def load_party_data(cfg: VflConfig, role: str) -> PartyData:
    """Load and encode this party's columns (and labels, for the active party).

    Raises:
        parties.data.DataError: missing file, unknown column, bad split, a label unfit for
            the task (one class; not numeric or constant for regression).
    """
    task = cfg.effective_task
    frame, default_label = load_configured_table(cfg, role)
    label, active, passive = resolve_columns(cfg, frame, default_label)
    all_train, test_idx = train_test_indices(len(frame), test_frac=cfg.test_frac, seed=cfg.seed)
    fit, val = validation_split(len(all_train), seed=cfg.seed)
    train_idx, val_idx = all_train[fit], all_train[val]
    n_val = len(val_idx)
    held = np.concatenate([val_idx, test_idx])  # encoded with the training rows' statistics
    mine = tuple(active if role == "active" else passive)
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
            y_train, y_held, pos = encode_labels(frame, label, train_idx, held)
        y_val, y_test = y_held[:n_val], y_held[n_val:]
        check_test_labels(y_test, label, task=task)
    log.info("vfl.data_loaded", party=role, dataset=cfg.dataset, task=task, n_rows=len(frame),
             n_train=len(train_idx), n_val=n_val, n_test=len(test_idx), columns=len(mine),
             features=int(feats.x_train.shape[1]))
    return PartyData(
        x_train=feats.x_train, x_test=x_test, y_train=y_train, y_test=y_test,
        x_val=x_val, y_val=y_val,
        columns=mine, n_rows=len(frame), dataset=cfg.dataset, task=task,
        label_mean=mean, label_std=std, encoder=feats.encoder,
        label=label if role == "active" else "", label_positive=pos,
    )


@dataclass(slots=True)
class _Counters:
    wait_s: float = 0.0
    dropped: int = 0
    reassigned: int = 0
    skipped: int = 0
    stale: int = 0
    switched: int = 0  # waits given up for a reassigned batch whose data had arrived
    batches: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    loss_n: int = 0
    max_staleness: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


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
    """

    def __init__(self, role: str, cfg: VflConfig, data: PartyData, *, broker: str, run_id: str,
                 progress: bool = True, security: CurveClient | None = None,
                 models: ModelFactory | None = None) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if role == "active" and data.y_train is None:
            raise ValueError("the active party needs labels")
        self.role = role
        self.partner = "passive" if role == "active" else "active"
        self.cfg = cfg
        self.data = data
        self.broker = broker
        self.security = security
        #: how this party's bus connection was secured (set once connected)
        self.security_info: dict[str, str] = {}
        self.run_id = run_id
        self.topics = Topics(run_id)
        self.progress = progress
        self.n_train = data.x_train.shape[0]
        self.n_batches = num_batches(self.n_train, cfg.batch_size)
        self.workers = cfg.workers_for(role)
        # "auto": inline compute on a one-core party (call after pinning, as the CLI does)
        self.worker_mode = cfg.resolved_worker_mode(cores_allotted())
        self.metric = metric_name(data.task)
        self.train_s = 0.0  # training wall time, evaluation excluded
        self.run_delay_s = 0.0  # of it, threads runnable but waiting for a CPU
        self.eval_s = 0.0
        self.train_cpu_s = 0.0  # CPU seconds of the training segments (scoring excluded)
        self.train_compute_cpu_s = 0.0  # of which in the workers' compute calls
        self.train_sync_cpu_s = 0.0  # of which in their parameter-server syncs
        self.t0 = time.perf_counter()
        self.c = _Counters()
        self.bus: Bus | None = None
        self.log = log.bind(party=role, run_id=run_id)
        torch.manual_seed(cfg.seed + (0 if role == "active" else 1))
        d_in = data.x_train.shape[1]
        self.models = models if models is not None else ModelFactory(cfg)
        mods = self.models.modules(role, d_in)
        for m in mods:
            m.eval()  # the party's copies only score (workers train their own replicas)
        self._bottom = mods[0]
        self._top = mods[1] if role == "active" else None
        self.ps = ParameterServer(flat_params(mods), workers=self.workers)
        self._x_test = torch.from_numpy(np.ascontiguousarray(data.x_test))
        self._x_val = torch.from_numpy(np.ascontiguousarray(data.x_val))
        self._handles: list[WorkerHandle] = []
        self.timeline = Timeline(role)
        self._data_dir: Path | None = None
        self.partner_report: dict[str, Any] | None = None
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
        *seeds, eval_seed = worker_seeds(cfg.dp_noise_seed, self.workers + 1)
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
                                  noise_seed=self._noise_seeds[k], models=self.models)
                             for k in range(self.workers)]
        else:
            self._data_dir = Path(tempfile.mkdtemp(prefix=f"psfl-{self.role}-"))
            np.save(self._data_dir / "x_train.npy", data.x_train)
            if data.y_train is not None:
                np.save(self._data_dir / "y_train.npy", data.y_train)
            self._handles = [ProcessWorker(self.role, k, cfg, self._data_dir, self.ps,
                                           noise_seed=self._noise_seeds[k],
                                           models=self.models)
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
            async with Bus(self.broker, name=self.role, config=bus_cfg,
                           security=self.security) as bus:
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
                await starting
                meter = CpuMeter()
                meter.start()
                self.t0 = time.perf_counter()
                try:
                    async with asyncio.TaskGroup() as tg:
                        hb = tg.create_task(self._heartbeat(bus))
                        wd = tg.create_task(self._watchdog(bus))
                        if self.role == "active":
                            result = await self._train_active(bus, meter)
                        else:
                            result = await self._train_passive(bus, meter)
                        hb.cancel()
                        wd.cancel()
                except* PartnerLost as eg:
                    raise eg.exceptions[0] from None
                return result
        finally:
            if not starting.done():
                starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            await self._stop_workers()

    async def _subscribe(self, bus: Bus) -> None:
        cfg, t = self.cfg, self.topics
        emb_bytes = cfg.batch_size * cfg.embedding_dim * 4 + 4096
        # per-batch channels; VFL-PS uses one channel per worker pair instead
        channels = range(max(self.n_batches, self.workers))
        if self.role == "active":
            lim = BufferLimits(max_msgs=cfg.p, max_bytes=cfg.p * emb_bytes)
            await bus.subscribe_many([t.emb(b) for b in channels], limits=lim)
            for n, topics in ((self.data.x_val.shape[0], [t.val(i) for i in
                                                           range(self._n_val_points())]),
                              (self.data.x_test.shape[0], [t.test])):
                eval_bytes = n * cfg.embedding_dim * 4 + 4096
                await bus.subscribe_many(topics, limits=BufferLimits(
                    max_msgs=2, max_bytes=2 * eval_bytes))
            await bus.subscribe(t.report)
        else:
            lim = BufferLimits(max_msgs=cfg.q, max_bytes=cfg.q * emb_bytes)
            await bus.subscribe_many([t.grad(b) for b in channels], limits=lim)
            if cfg.algo == "vfl-ps":
                ids_bytes = cfg.batch_size * 8 + (self.workers + 1) * 8 + 4096
                await bus.subscribe(t.ids, limits=BufferLimits(max_msgs=16,
                                                               max_bytes=16 * ids_bytes))
            await bus.subscribe(t.done)
            await bus.subscribe(t.scored, limits=BufferLimits(max_msgs=4, max_bytes=1 << 14))
        await bus.subscribe(t.hb(self.partner), limits=BufferLimits(max_msgs=4, max_bytes=1 << 16))
        # subscribed last: a hello from the partner proves all the above reached its publisher
        await bus.subscribe(t.hello(self.role))

    async def _handshake(self, bus: Bus) -> None:
        """Exchange hellos until each side has seen the other (PubSub slow-joiner guard)."""
        cfg, t = self.cfg, self.topics
        rows_file = cfg.rows_file(self.role)
        mine = cfg.shared_settings(self.data.n_rows,
                                   aligned_ids_digest(rows_file) if rows_file else "")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.handshake_timeout_s
        seen = False
        while True:
            bus.publish_nowait(t.hello(self.partner), (), {"role": self.role, "seen": seen,
                                                             "shared": mine})
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise HandshakeTimeout(self.partner, cfg.handshake_timeout_s, self.run_id)
            try:
                msg = await bus.next(t.hello(self.role), min(0.1, remaining))
            except DeadlineExceeded:
                continue
            theirs = msg.meta.get("shared", {})
            if theirs.get("digest") != mine["digest"]:
                # keep saying who we are for a moment, so the partner fails too instead of
                # waiting for its handshake deadline
                for _ in range(10):
                    bus.publish_nowait(t.hello(self.partner), (),
                                       {"role": self.role, "seen": True, "shared": mine})
                    await asyncio.sleep(0.05)
                raise ConfigMismatch(mine, theirs)
            if not seen:
                seen = True
                self.log.info("vfl.partner_found", partner=self.partner)
            if msg.meta.get("seen"):
                break
        # one final hello so the partner completes even if it never got a seen=True from us
        bus.publish_nowait(t.hello(self.partner), (), {"role": self.role, "seen": True,
                                                         "shared": mine})

    async def _heartbeat(self, bus: Bus) -> None:
        topic = self.topics.hb(self.role)
        while True:
            bus.publish_nowait(topic, (), {"t": time.time()})
            await asyncio.sleep(self.cfg.heartbeat_interval_s)

    async def _watchdog(self, bus: Bus) -> None:
        topic = self.topics.hb(self.partner)
        timeout = self.cfg.liveness_timeout_s
        while True:
            try:
                await bus.next(topic, timeout)
            except DeadlineExceeded:
                self.log.error("vfl.partner_lost", partner=self.partner, silent_s=timeout)
                raise PartnerLost(self.partner, timeout) from None

    async def _wait(self, bus: Bus, topic: str, deadline: float,
                    accept: Callable[[Message], int], *, worker: int = -1,
                    batch: int = -1, later: list[bool] | None = None) -> Message | None:
        """Wait on ``topic`` until ``deadline`` (loop time) for a message ``accept`` returns 1 for.

        ``accept`` returns 1 (take), 0 (stale: discard, keep waiting) or -1 (from
        the future: put back and give up; ``True`` is appended to ``later``, so a caller
        can tell this from the deadline: timers may fire a fraction of a millisecond
        before ``deadline`` by the loop's clock). Time spent is counted as waiting time,
        except, with inline workers, the compute that ran on the loop meanwhile (e.g.
        the active worker's own bottom forward, or another worker's step). The wait is
        recorded as a ``wait`` span of ``worker`` / ``batch`` on the party's timeline.
        """
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        p0 = time.perf_counter()
        inline = self.worker_mode == "inline"
        busy0 = sum(h.compute_s for h in self._handles) if inline else 0.0
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    msg = await bus.next(topic, remaining)
                except DeadlineExceeded:
                    return None
                verdict = accept(msg)
                if verdict == 1:
                    return msg
                if verdict < 0:
                    bus.unget(msg)
                    if later is not None:
                        later.append(True)
                    return None
                self.c.stale += 1
        finally:
            busy = sum(h.compute_s for h in self._handles) - busy0 if inline else 0.0
            self.c.wait_s += max(0.0, loop.time() - t0 - busy)
            self.timeline.record(WAIT, worker, batch, p0, time.perf_counter())

    # ------------------------------------------------------------------ training
    @property
    def _drops(self) -> bool:
        """True when a missed partner deadline drops the batch (``pubsub``, ``avfl``,
        ``avfl-ps`` with ``t_ddl_s > 0``); otherwise the wait is bounded by the liveness
        timeout and a miss fails the run (:class:`PartnerStalled`)."""
        return self.cfg.t_ddl_s > 0 and self.cfg.algo not in ("vfl", "vfl-ps")

    def _data_wait_s(self) -> float:
        """How long a worker waits for its partner's data: T_ddl when batches may be
        dropped, else the liveness timeout."""
        return self.cfg.t_ddl_s if self._drops else self.cfg.liveness_timeout_s

    def _stalled(self, what: str, b: int, epoch: int) -> PartnerStalled:
        self.log.error("vfl.partner_stalled", partner=self.partner, missing=what, batch=b,
                       epoch=epoch, waited_s=self._data_wait_s())
        return PartnerStalled(self.partner, what, self._data_wait_s(),
                              f"batch {b} of epoch {epoch}")

    def _poll(self, bus: Bus, topic: str, accept: Callable[[Message], int]) -> Message | None:
        """A buffered message on ``topic`` that ``accept`` takes, without waiting."""
        while (msg := bus.try_next(topic)) is not None:
            verdict = accept(msg)
            if verdict == 1:
                return msg
            if verdict < 0:
                bus.unget(msg)
                return None
            self.c.stale += 1
        return None

    async def _train(self, bus: Bus) -> None:
        """All epochs: each epoch's segments (one, or four quarters on ``synthetic``) are
        trained by the configured algorithm, synced to the PS, then scored on the
        validation split (active) or embedded for it (passive); scoring is not training
        time."""
        cfg = self.cfg
        segs = eval_segments(self.n_batches, cfg.evals_per_epoch)
        point = 0
        go: int | None = None  # active: the scored point the passive party waits for
        for epoch in range(cfg.epochs):
            batches = epoch_batches(self.n_train, cfg.batch_size, seed=cfg.seed, epoch=epoch)
            evaluated = epoch in self._eval_epochs()
            for s, seg in enumerate(segs):
                c = self.c
                before = (c.loss_sum, c.loss_n, c.samples, c.wait_s, c.dropped, c.reassigned)
                seg_meter = CpuMeter()
                seg_meter.start()
                delay0 = run_delay_s()
                cc0, sc0 = self._compute_cpu_s(), self._sync_cpu_s()
                t0 = time.perf_counter()
                if go is not None:
                    bus.publish_nowait(self.topics.scored, (), {"point": go})
                    go = None
                await self._run_segment(bus, epoch, batches, seg)
                await self._flush()
                t1 = time.perf_counter()
                dt = t1 - t0
                self.timeline.record(SEGMENT, -1, len(c.history), t0, t1)
                delay1 = run_delay_s()
                delay = (delay1 - delay0) if delay0 is not None and delay1 is not None else None
                if delay is not None:
                    self.run_delay_s += delay
                _, seg_cpu, _, util = seg_meter.read()
                self.train_cpu_s += seg_cpu
                self.train_compute_cpu_s += self._compute_cpu_s() - cc0
                self.train_sync_cpu_s += self._sync_cpu_s() - sc0
                self.train_s += dt
                entry: dict[str, Any] = {
                    "epoch": epoch, "segment": s,
                    "epochs_done": round(epoch + (s + 1) / len(segs), 6),
                    "train_s": dt, "train_wall_s": self.train_s,
                    "samples_per_s": (c.samples - before[2]) / dt if dt > 0 else 0.0,
                    "wait_s": (c.wait_s - before[3]) / self.workers,
                    "cpu_util": util, "run_delay_s": delay,
                    "dropped": c.dropped - before[4], "reassigned": c.reassigned - before[5],
                }
                if self.role == "active":
                    entry["loss"] = (c.loss_sum - before[0]) / max(1, c.loss_n - before[1])
                if evaluated:
                    # Scoring is not training time on either side: the passive party waits
                    # for the active party's "scored", sent when the active party's next
                    # segment has started, so that it does not train while the active
                    # party's clock is stopped (its work there would count for nothing:
                    # at 50:14 the passive party trained 30 % beyond the active's window).
                    t_eval = time.perf_counter()
                    last = epoch == cfg.epochs - 1 and s == len(segs) - 1
                    if self.role == "active":
                        value = await self._score(bus, self.topics.val(point), "val")
                        entry[f"val_{self.metric}"] = value
                        entry["metric"] = value
                        if not last:
                            go = point  # published once the next segment's clock runs
                    else:
                        await self._publish_embeddings(bus, "val", self.topics.val(point))
                        if not last:
                            await self._await_scored(bus, point)
                    point += 1
                    self.eval_s += time.perf_counter() - t_eval
                entry["wall_s"] = time.perf_counter() - self.t0
                c.history.append(entry)
                self.log.info("vfl.epoch_done", **entry)
                if self.progress and self.role == "active":
                    key = f"val_{self.metric}"
                    shown = f"  {key} {entry[key]:.4f}" if key in entry else ""
                    part = f" ({s + 1}/{len(segs)})" if len(segs) > 1 else ""
                    print(f"epoch {epoch + 1:>3}/{cfg.epochs}{part}  loss {entry['loss']:.4f}"
                          f"{shown}  {entry['samples_per_s']:,.0f} samples/s  wait "
                          f"{entry['wait_s']:.2f} s  dropped {entry['dropped']}", flush=True)

    async def _await_scored(self, bus: Bus, point: int) -> None:
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
                raise PartnerStalled(self.partner, "val", bound,
                                     f"validation point {point} never scored") from None
            if int(msg.meta.get("point", -1)) >= point:
                return

    async def _run_segment(self, bus: Bus, epoch: int, batches: list[np.ndarray],
                           seg: range) -> None:
        """Train the batches ``seg`` of ``epoch`` with the configured algorithm."""
        algo, k = self.cfg.algo, range(self.workers)
        if algo in ("pubsub", "vfl"):
            # vfl is this loop with one worker, no deadline drops and a PS sync per segment
            sched = EpochSchedule(len(seg), self.cfg.max_reassign if self._drops else 0,
                                  ids=seg)
            cond = asyncio.Condition()
            work = self._passive_worker if self.role == "passive" else self._active_worker
            await asyncio.gather(*(work(bus, i, epoch, batches, sched, cond) for i in k))
        elif algo == "vfl-ps":
            if self.role == "passive":
                await self._vflps_passive(bus, epoch, seg)
            else:
                await self._vflps_active(bus, epoch, batches, seg)
        else:  # avfl, avfl-ps
            if self.role == "passive":
                queue = deque(seg)
                await asyncio.gather(*(self._avfl_passive_worker(bus, i, epoch, batches, queue)
                                       for i in k))
            else:
                # the active side of AVFL: no reassignment; a batch whose embedding misses
                # T_ddl is skipped (and the passive told so)
                sched = EpochSchedule(len(seg), 0, ids=seg)
                cond = asyncio.Condition()
                await asyncio.gather(*(self._active_worker(bus, i, epoch, batches, sched, cond)
                                       for i in k))

    # ------------------------------------------------------------------ passive
    async def _train_passive(self, bus: Bus, meter: CpuMeter) -> dict[str, Any]:
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

    async def _publish_embeddings(self, bus: Bus, split: str, topic: str) -> None:
        """Publish the embeddings of the ``val`` (scored subsample) or ``test`` split from
        the PS parameters (counted in the DP ledger first)."""
        load_flat([self._bottom], self.ps.pull())
        x = self._x_val if split == "val" else self._x_test
        emb = await asyncio.to_thread(self._embeddings, x, split)
        assert self.dp_acct is not None
        self.dp_acct.record(split)
        bus.publish_nowait(topic, [emb], {"split": split}, copy=False)

    def _embeddings(self, x: torch.Tensor, split: str) -> np.ndarray:
        """Embeddings ``(n, d)`` float32 of ``x`` (the ``split`` rows) from the PS
        parameters: clipped and noised with the split's noise when DP is on (a thread's
        work)."""
        emb = embed(self._bottom, x)
        if self._eval_privatize is None:
            return emb
        return self._eval_privatize[split](torch.from_numpy(emb))[1].numpy()

    def _publish_emb(self, bus: Bus, topic: str, h_np: np.ndarray, rows: np.ndarray,
                     meta: dict[str, Any], worker: int) -> None:
        assert self.dp_acct is not None
        self.dp_acct.record("train", rows)  # raises, publishing nothing, past the plan
        t0 = time.perf_counter()
        bus.publish_nowait(topic, [h_np], meta, copy=False)
        self.timeline.record(COMM, worker, meta["b"], t0, time.perf_counter())

    async def _passive_worker(self, bus: Bus, k: int, epoch: int, batches: list[np.ndarray],
                              sched: EpochSchedule, cond: asyncio.Condition) -> None:
        """PubSub-VFL (and, with one worker and no drops, VFL) passive worker: take a batch,
        publish its embedding, wait for its gradient (T_ddl), back-propagate."""
        worker = self._handles[k]
        loop = asyncio.get_running_loop()
        topics = self.topics

        def buffered(b: int) -> bool:
            return bus.pending(topics.grad(b)) > 0

        while (task := await self._next_task(sched, cond, buffered)) is not None:
            b, attempt = task
            rows = batches[b]
            h_np = await worker.forward(epoch, b)
            uid = f"{epoch}.{b}.{attempt}"
            self._publish_emb(bus, self.topics.emb(b), h_np, rows,
                              {"e": epoch, "b": b, "a": attempt, "u": uid}, k)

            msg = await self._wait(bus, self.topics.grad(b), loop.time() + self._data_wait_s(),
                                   _grad_acceptor(epoch, b, uid), worker=k, batch=b)
            outcome = await self._settle_grad(worker, epoch, b, msg, len(rows))
            if outcome == "missed":
                self._count_miss(sched.fail(b, attempt), b, epoch, "grad")
            elif outcome == "skipped":
                sched.drop(b)
            else:
                sched.complete(b)
            async with cond:
                cond.notify_all()

    async def _avfl_passive_worker(self, bus: Bus, k: int, epoch: int,
                                   batches: list[np.ndarray], queue: deque[int]) -> None:
        """AVFL / AVFL-PS passive worker: publish embeddings without waiting for their
        gradients, at most ``staleness_bound`` outstanding; apply the gradients in
        publication order as they arrive (to the current parameters: a stale gradient);
        at the bound, wait for the oldest (T_ddl; a miss gives the batch up)."""
        worker = self._handles[k]
        loop = asyncio.get_running_loop()
        win = StalenessWindow(self.cfg.staleness_bound)
        uids: dict[int, str] = {}

        def acceptor(b: int) -> Callable[[Message], int]:
            return _grad_acceptor(epoch, b, uids[b])

        async def settle(b: int, msg: Message | None) -> None:
            outcome = await self._settle_grad(worker, epoch, b, msg, len(batches[b]))
            if outcome == "applied":
                win.applied(b)
            else:
                win.given_up(b)
                if outcome == "missed":
                    self._count_miss(False, b, epoch, "grad")

        async def wait_oldest() -> None:
            b = win.oldest()
            assert b is not None
            msg = await self._wait(bus, self.topics.grad(b), loop.time() + self._data_wait_s(),
                                   acceptor(b), worker=k, batch=b)
            await settle(b, msg)

        try:
            while True:
                # settle gradients that are already here, oldest first (FIFO keeps
                # every gradient's staleness below the bound)
                while (b_old := win.oldest()) is not None:
                    msg = self._poll(bus, self.topics.grad(b_old), acceptor(b_old))
                    if msg is None:
                        break
                    await settle(b_old, msg)
                if win.full:
                    await wait_oldest()
                    continue
                if not queue:
                    break
                b = queue.popleft()
                h_np = await worker.forward(epoch, b, snapshot=True)
                uids[b] = f"{epoch}.{b}.0"
                self._publish_emb(bus, self.topics.emb(b), h_np, batches[b],
                                  {"e": epoch, "b": b, "a": 0, "u": uids[b]}, k)
                win.issue(b)
            while win.outstanding:
                await wait_oldest()
        finally:
            self.c.max_staleness = max(self.c.max_staleness, win.max_staleness)

    async def _vflps_passive(self, bus: Bus, epoch: int, seg: range) -> None:
        """VFL-PS passive parameter server: for each batch, receive the active PS's ID
        subsets, let each paired worker embed its subset and back-propagate its gradient,
        then aggregate (all workers push, then all pull)."""
        loop = asyncio.get_running_loop()
        for b in seg:
            def accept(m: Message, b: int = b) -> int:
                key = (m.meta.get("e", -1), m.meta.get("b", -1))
                return 1 if key == (epoch, b) else (0 if key < (epoch, b) else -1)

            msg = await self._wait(bus, self.topics.ids, loop.time() + self._data_wait_s(),
                                   accept, batch=b)
            if msg is None:
                raise self._stalled("ids", b, epoch)
            parts = unpack_ids(msg.arrays[0], msg.arrays[1])
            if len(parts) != self.workers:
                raise ConfigMismatch({"pairs": self.workers}, {"pairs": len(parts)})
            await asyncio.gather(*(self._vflps_passive_pair(bus, k, epoch, b, parts[k])
                                   for k in range(self.workers) if len(parts[k])))
            await self._barrier_sync()

    async def _vflps_passive_pair(self, bus: Bus, k: int, epoch: int, b: int,
                                  rows: np.ndarray) -> None:
        worker = self._handles[k]
        loop = asyncio.get_running_loop()
        h_np = await worker.forward(epoch, b, rows=rows, key=b)
        uid = f"{epoch}.{b}.{k}"
        self._publish_emb(bus, self.topics.emb(k), h_np, rows,
                          {"e": epoch, "b": b, "k": k, "a": 0, "u": uid}, k)
        msg = await self._wait(bus, self.topics.grad(k), loop.time() + self._data_wait_s(),
                               lambda m: 1 if m.meta.get("u") == uid else 0, worker=k, batch=b)
        if msg is None:
            raise self._stalled("grad", b, epoch)
        await worker.backward(epoch, b, msg.arrays[0])
        self.c.samples += len(rows)
        if k == 0:
            self.c.batches += 1

    async def _barrier_sync(self) -> None:
        """Aggregate every worker's update: all push (θ ← θ + Δ_k/w), then all pull."""
        await asyncio.gather(*(h.push() for h in self._handles))
        await asyncio.gather(*(h.pull() for h in self._handles))

    @staticmethod
    async def _next_task(sched: EpochSchedule, cond: asyncio.Condition,
                         prefer: Callable[[int], bool] | None = None
                         ) -> tuple[int, int] | None:
        """The next ``(batch_id, attempt)`` of the epoch, waiting while others are in flight
        (they may fail and be reassigned); None when the epoch is over. ``prefer``: see
        :meth:`EpochSchedule.take` (a reassigned batch whose partner data is buffered
        goes first)."""
        while True:
            task = sched.take(prefer)
            if task is not None or sched.done:
                return task
            async with cond:
                await cond.wait_for(lambda: bool(sched.pending) or sched.done)

    async def _settle_grad(self, worker: WorkerHandle, epoch: int, b: int,
                           msg: Message | None, n_rows: int) -> str:
        """The passive side's end of one batch, shared by every algorithm: back-propagate
        its gradient (``"applied"``), or discard the batch's forward state because the
        gradient missed its deadline (``"missed"``) or the active party skipped the batch
        (``"skipped"``). The caller updates its own schedule from the outcome.

        Raises:
            PartnerStalled: a missed gradient where nothing may be dropped.
        """
        if msg is None:
            if not self._drops:
                raise self._stalled("grad", b, epoch)
            await worker.discard(b)
            return "missed"
        if msg.meta.get("skip"):
            await worker.discard(b)
            self.c.skipped += 1
            self.c.dropped += 1
            return "skipped"
        await worker.backward(epoch, b, msg.arrays[0])
        self.c.batches += 1
        self.c.samples += n_rows
        return "applied"

    def _count_miss(self, reassigned: bool, b: int, epoch: int, what: str) -> None:
        self.c.dropped += 1
        if reassigned:
            self.c.reassigned += 1
        self.log.warning("vfl.batch_dropped", batch=b, epoch=epoch, missing=what,
                         reassigned=reassigned, t_ddl_s=self.cfg.t_ddl_s)

    async def _flush(self) -> None:
        await asyncio.gather(*(h.flush() for h in self._handles))

    # ------------------------------------------------------------------ active
    async def _train_active(self, bus: Bus, meter: CpuMeter) -> dict[str, Any]:
        cfg = self.cfg
        name = self.metric
        key = f"test_{name}"
        await self._train(bus)
        t_eval = time.perf_counter()
        value = await self._score(bus, self.topics.test, "test")
        self.eval_s += time.perf_counter() - t_eval
        metrics = self._party_metrics(meter)
        target = cfg.effective_target
        points = [(h["train_wall_s"], h["metric"]) for h in self.c.history if "metric" in h]
        metrics.update({
            "task": self.data.task, key: value, "metric_name": name, "metric": value,
            "target_metric": target,
            "time_to_target_s": first_reaching(points, target, higher_is_better=name == "auc"),
            "n_val_scored": int(self._x_val.shape[0]),
        })
        try:
            rep = await bus.next(self.topics.report, cfg.liveness_timeout_s)
            self.partner_report = dict(rep.meta)
        except DeadlineExceeded:
            self.log.warning("vfl.no_report", waited_s=cfg.liveness_timeout_s)
        try:
            metrics["broker"] = await asyncio.to_thread(request_stats, self.broker, timeout_s=2.0,
                                                        security=self.security)
        except BusError as exc:
            self.log.warning("vfl.broker_stats_failed", error=str(exc))
            metrics["broker"] = None
        bus.publish_nowait(self.topics.done, (), {"ok": True})
        await asyncio.sleep(0.05)
        return metrics

    async def _active_step(self, bus: Bus, k: int, epoch: int, b: int, *, emb_topic: str,
                           accept: Callable[[Message], int], grad_topic: str,
                           grad_meta: Callable[[Message], dict[str, Any]],
                           rows: np.ndarray | None = None,
                           switch: Callable[[], bool] | None = None) -> Message | None:
        """One active step: compute the own bottom forward while waiting for the passive
        embedding, then the top step; the cut-layer gradient is published as soon as it
        exists (the own bottom's backward runs meanwhile). Returns the embedding message,
        or None if it missed the wait bound (nothing trained).

        ``switch``: checked every :data:`SWITCH_CHECK_S` of a long wait; when it returns
        True (the partner's data for a reassigned batch has arrived meanwhile) the wait
        is given up early and :class:`_Switch` raised, so the worker takes that batch
        instead (the caller puts ``b`` back, not counted as a miss)."""
        worker = self._handles[k]
        loop = asyncio.get_running_loop()
        pre = asyncio.create_task(worker.prefetch(epoch, b, rows=rows))
        deadline = loop.time() + self._data_wait_s()
        switched = False
        later: list[bool] = []
        try:
            while True:
                end = deadline if switch is None else min(deadline, loop.time() + SWITCH_CHECK_S)
                msg = await self._wait(bus, emb_topic, end, accept, worker=k, batch=b,
                                       later=later)
                # data, the deadline, or a message from a later epoch. (Not "returned
                # before end": a timer may fire a fraction of a millisecond early by the
                # loop's clock, and that once dropped a batch 50 ms into its wait.)
                if msg is not None or later or loop.time() >= deadline:
                    break
                if switch is not None and switch():
                    switched = True
                    break
        finally:
            await pre
        if msg is None:
            await worker.discard(b)
            if switched:
                raise _Switch
            return None
        meta = grad_meta(msg)

        def publish(grad: np.ndarray) -> None:
            t0 = time.perf_counter()
            bus.publish_nowait(grad_topic, [grad], meta, copy=False)
            self.timeline.record(COMM, k, b, t0, time.perf_counter())

        loss, _ = await worker.step(epoch, b, msg.arrays[0], rows=rows, on_grad=publish)
        n = len(rows) if rows is not None else len(msg.arrays[0])
        self.c.samples += n
        self.c.loss_sum += loss * n
        self.c.loss_n += n
        return msg

    async def _active_worker(self, bus: Bus, k: int, epoch: int, batches: list[np.ndarray],
                             sched: EpochSchedule, cond: asyncio.Condition) -> None:
        """PubSub-VFL / VFL / AVFL active worker: take a batch, wait for its embedding
        (T_ddl), train, publish the gradient; a miss reassigns the batch (pubsub) or
        skips it (after ``max_reassign`` misses, or at once under AVFL)."""
        def accept(m: Message) -> int:
            e = m.meta.get("e", -1)
            return 1 if e == epoch else (0 if e < epoch else -1)

        topics = self.topics

        def buffered(b: int) -> bool:
            return bus.pending(topics.emb(b)) > 0

        def retry_ready() -> bool:
            return sched.retry_ready(buffered)

        while (task := await self._next_task(sched, cond, buffered)) is not None:
            b, attempt = task
            try:
                msg = await self._active_step(
                    bus, k, epoch, b, emb_topic=self.topics.emb(b), accept=accept,
                    grad_topic=self.topics.grad(b),
                    grad_meta=lambda m, b=b: {"e": epoch, "b": b, "u": m.meta.get("u")},
                    switch=retry_ready if self._drops else None)
            except _Switch:
                sched.release(b, attempt)  # back to the front; not a miss
                self.c.switched += 1
                continue
            if msg is None:
                if not self._drops:
                    raise self._stalled("emb", b, epoch)
                again = sched.fail(b, attempt)
                self._count_miss(again, b, epoch, "emb")
                if not again:
                    bus.publish_nowait(self.topics.grad(b), (),
                                       {"e": epoch, "b": b, "skip": True})
            else:
                sched.complete(b)
                self.c.batches += 1
            async with cond:
                cond.notify_all()

    async def _vflps_active(self, bus: Bus, epoch: int, batches: list[np.ndarray],
                            seg: range) -> None:
        """VFL-PS active parameter server: split each batch's IDs into one subset per
        worker pair and broadcast them; each worker trains its subset with its paired
        passive worker; then aggregate (all push, then all pull)."""
        for b in seg:
            parts = split_batch_ids(batches[b], self.workers)
            ids, offsets = pack_ids(parts)
            bus.publish_nowait(self.topics.ids, [ids, offsets], {"e": epoch, "b": b})
            await asyncio.gather(*(self._vflps_active_pair(bus, k, epoch, b, parts[k])
                                   for k in range(self.workers) if len(parts[k])))
            self.c.batches += 1
            await self._barrier_sync()

    async def _vflps_active_pair(self, bus: Bus, k: int, epoch: int, b: int,
                                 rows: np.ndarray) -> None:
        def accept(m: Message) -> int:
            key = (m.meta.get("e", -1), m.meta.get("b", -1))
            return 1 if key == (epoch, b) else (0 if key < (epoch, b) else -1)

        msg = await self._active_step(
            bus, k, epoch, b, emb_topic=self.topics.emb(k), accept=accept,
            grad_topic=self.topics.grad(k),
            grad_meta=lambda m: {"e": epoch, "b": b, "k": k, "u": m.meta.get("u")}, rows=rows)
        if msg is None:
            raise self._stalled("emb", b, epoch)

    async def _score(self, bus: Bus, topic: str, split: str) -> float:
        """The metric (AUC, or RMSE in the label's units) of the PS parameters on the
        ``val`` or ``test`` split, with the passive party's embeddings of it (waited for
        up to the liveness timeout)."""
        cfg, data = self.cfg, self.data
        assert self._top is not None
        try:
            msg = await bus.next(topic, cfg.liveness_timeout_s)
        except DeadlineExceeded:
            raise PartnerStalled(self.partner, split, cfg.liveness_timeout_s,
                                 "embeddings for scoring") from None
        load_flat([self._bottom, self._top], self.ps.pull())
        x, y = (self._x_val, data.y_val) if split == "val" else (self._x_test, data.y_test)
        assert y is not None
        pred = await asyncio.to_thread(predict, self._bottom, self._top, x,
                                       msg.arrays[0], task=data.task)
        if data.task == "regression":
            pred = pred.astype(np.float64) * data.label_std + data.label_mean
        return compute_metric(data.task, y, pred)

    # ------------------------------------------------------------------ metrics
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
        return {
            "role": self.role,
            "algo": self.cfg.algo,
            "workers": self.workers,
            "train_wall_s": self.train_s,
            "eval_s": self.eval_s,
            "party_wall_s": wall,
            "cpu_s": cpu,
            "cores_allotted": cores,
            "cpu_util": util,
            "cpu_s_train": self.train_cpu_s,
            "cpu_util_train": (self.train_cpu_s / (self.train_s * cores)
                               if self.train_s > 0 else None),
            "security": self.security_info,
            "run_delay_s": self.run_delay_s,
            "wait_s_total": self.c.wait_s,
            "wait_s_per_epoch": self.c.wait_s / (self.workers * self.cfg.epochs),
            "bytes_sent": dict(st.sent_bytes),
            "msgs_sent": dict(st.sent_msgs),
            "bytes_recv": dict(st.recv_bytes),
            "dropped_batches": self.c.dropped,
            "reassigned_batches": self.c.reassigned,
            "skipped_batches": self.c.skipped,
            "stale_messages": self.c.stale,
            "switched_waits": self.c.switched,
            "max_staleness": self.c.max_staleness,
            "bus": {k: v for k, v in st.as_dict().items() if not isinstance(v, dict)},
            "ps_pushes": self.ps.pushes,
            "worker_mode": self.worker_mode,
            "compute_s": sum(h.compute_s for h in self._handles),
            "compute_cpu_s_train": self.train_compute_cpu_s,
            "sync_cpu_s_train": self.train_sync_cpu_s,
            "step_cpu_s_per_sample": ((self.train_compute_cpu_s - self.train_sync_cpu_s)
                                      / self.c.samples if self.c.samples else None),
            "worker_parallelism": (sum(h.compute_s for h in self._handles) / wall
                                   if wall > 0 else 0.0),
            "batches": self.c.batches,
            "samples": self.c.samples,
            "history": self.c.history,
            # under DP the passive width is the public schema's (a function of it alone)
            "n_features": int(self.data.x_train.shape[1]),
            "feature_encoding": ("public_schema" if self.role == "passive"
                                 and self.cfg.dp_enabled else "fitted"),
            "columns": list(self.data.columns),
        }
