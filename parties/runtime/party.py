"""The I/O side of a two-party VFL party: bus, handshake, heartbeats, workers, evaluation,
metrics, and the specification of the five coordination algorithms (``vfl.algo``).

The algorithms themselves are sans-IO strategies (:mod:`parties.algorithms.strategy`, one object per
algorithm x role) that yield actions; :class:`Party` runs them through
:class:`parties.runtime.driver.ActionDriver` over the bus and its workers, and :mod:`sim.cluster.des`
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

Common to all algorithms: the same models (:mod:`parties.models.model`), data, bus and
broker; each party has a parameter server (PS) over its parameters with the update rule
θ ← θ + Δ/w (:class:`parties.models.model.ParameterServer`); every worker has its own replica and
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
    (:class:`parties.algorithms.schedule.InflightWindow`, at most ``inflight_max``): it embeds and
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
    :data:`parties.algorithms.schedule.DDL_RTTS` round trips)
    the passive party raises its gradient deadline, logs ``vfl.t_ddl_adjusted``, tells
    the active party (meta ``d`` of its embeddings, which raises its embedding wait
    alike) and records it in ``metrics.json`` (``link.t_ddl``).
    Under a DP target a passive party publishes a reassigned
    batch only if every record of it has an extra publication left in its reserve
    (``dp_reassign_reserve``, :mod:`parties.privacy.dp`); otherwise it drops the batch for the
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
    min(w_active, w_passive) worker pairs, :func:`parties.algorithms.schedule.split_batch_ids`) and
    broadcasts them to the passive PS (``ids`` topic); worker k of each party processes
    subset k with its partner on channel k, so the faster of a pair waits; after every
    iteration (batch) both PSs aggregate: every worker pushes, then every worker pulls
    (θ ← θ + mean Δ_k). No deadline-based dropping.
``avfl`` — asynchronous VFL in the style of VFB² (Zhang et al., "Secure Bilevel
    Asynchronous Vertical Federated Learning with Backward Updating", AAAI 2021): one
    worker per party; the passive party does not wait for gradients before embedding
    its next batch: at most ``staleness_bound`` batches may be outstanding
    (:class:`parties.algorithms.schedule.StalenessWindow`); gradients are applied in publication
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

With DP on (``dp_mu`` or ``dp_noise_multiplier``, see :mod:`parties.privacy.dp`), every
``emb`` and ``eval`` array is row-clipped and noised by the passive party before it
is published (in its workers for ``emb``, thread or process alike, and in the party
process for ``eval``), and each publication is counted per record in a
:class:`parties.privacy.dp.GdpAccountant` before it happens.

The ``emb``, ``eval`` and ``grad`` tensors travel as ``vfl.wire.dtype`` says (float32, or
compressed to float16, bfloat16 or int8 with per-row scales where the link is thin:
:mod:`parties.algorithms.wire`); the sender encodes after the DP noise, the receiver decodes to
float32 before its intake judges the tensor.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch

from pubsub import Bus, BusConfig
from pubsub.config import ConfigError
from pubsub.control import request_stats
from pubsub.errors import BusError
from pubsub.security import CurveClient
from pubsub.transport import Transport

from parties.algorithms.actions import EMB, GRAD
from parties.algorithms.fuse import fuse_of
from parties.algorithms.intake import PeerIntake, RunPlan, TensorSpec
from parties.algorithms.schedule import eval_segments, first_reaching, num_batches
from parties.algorithms.strategy import StrategyConfig, make_strategy
from parties.config import VflConfig, role_of
from parties.core.errors import VflError
from parties.core.sysinfo import CpuMeter, cores_allotted
from parties.core.tasks import metric_name
from parties.data.party import PartyData
from parties.data.rowstore import DiskRows
from parties.models.compute import party_models
from parties.models.model import load_flat
from parties.models.zoo import ModelFactory
from parties.privacy.dp import report as dp_report
from parties.privacy.labels import labels_report
from parties.privacy.party import party_dp
from parties.runtime.bookkeeping import Mark, RunBook, party_metrics
from parties.runtime.context import PartyContext
from parties.runtime.driver import ActionDriver
from parties.runtime.evaluation import Evaluation
from parties.runtime.session import PartySession
from parties.runtime.timeline import SEGMENT, Timeline, TimedWorker
from parties.runtime.workers import (InlineWorker, ProcessWorker, ThreadWorker, WorkerHandle,
                                     ensure_forkserver)

log = structlog.get_logger(__name__)

ROLES = ("active", "passive")


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

    def resend(self, party: str) -> str:
        """Asks ``party`` to publish again what it last published on a scoring topic (a
        message lost to a broker restart; :class:`parties.runtime.evaluation.Evaluation`)."""
        return f"ctl/{self.run_id}/resend/{party}"


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
        models: the model factory (:class:`parties.models.zoo.ModelFactory`, e.g. with Python
            callables); None = the config's ``vfl.model.bottom`` / ``vfl.model.top``.
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
        self.worker_mode = cfg.workers.resolved_mode(cores_allotted())
        self.metric = metric_name(data.task)
        #: the algorithm x role (sans-IO); its counters are this party's training counters
        self.strategy = make_strategy(StrategyConfig.from_vfl(cfg, role, party))
        self.c = self.strategy.counters
        self._driver: ActionDriver | None = None
        self.bus: Transport | None = None
        self.log = log.bind(party=party, run_id=run_id)
        #: the training clock, CPU figures and history (parties.runtime.bookkeeping)
        self.book = RunBook(role=role, workers=self.workers, epochs=cfg.epochs,
                            metric=self.metric, progress=progress, log=self.log,
                            counters=self.c, wait_s=self._wait_s,
                            compute_cpu_s=self._compute_cpu_s, sync_cpu_s=self._sync_cpu_s)
        channels = max(self.n_batches, self.workers)
        #: what a partner's message may claim: an epoch of the run, a batch id of the
        #: epoch's batch order, the channel of its batch (vfl-ps: of its worker pair)
        self.plan = RunPlan(epochs=cfg.epochs, batches=self.n_batches, channels=channels,
                            channel_is_batch=cfg.algo != "vfl-ps")
        self.intake = PeerIntake(partner=self.partner, max_bad=cfg.timeouts.peer_max_bad_messages,
                                 log=self.log, plan=self.plan)
        torch.manual_seed(cfg.seed + cfg.party_ids.index(party))
        self.models, mods, self.ps = party_models(cfg, party, data, models, self.workers)
        self._bottom = mods[0]
        self._top = mods[1] if role == "active" else None
        self.handles: list[WorkerHandle] = []  # the workers (their compute and sync times)
        #: validation points scored in flight (decided after the handshake) and why
        self.overlap, self.overlap_reason = False, ""
        self.timeline = Timeline(party)
        self._data_dir: Path | None = None
        self.partner_report: dict[str, Any] | None = None
        #: every passive party's report, by party id (active party, after the run)
        self.partner_reports: dict[str, dict[str, Any]] = {}
        dp = party_dp(cfg, party, role, self.workers,
                      {"train": self.n_train, "val": int(data.x_val.shape[0]),
                       "test": int(data.x_test.shape[0])}, log=self.log)
        self.dp_plan, self.dp_acct = dp.plan, dp.acct
        #: the active party's label ledger (None for a passive party)
        self.label_ledger = dp.label_ledger
        self._noise_seeds = list(dp.noise_seeds)
        ctx = PartyContext(cfg=cfg, role=role, party=party, partners=self.partners,
                           multi=self.multi, topics=self.topics, intake=self.intake,
                           log=self.log, run_id=run_id, data=data)
        self.session = PartySession(ctx, channels=channels,
                                    n_val_points=self._n_val_points(), workers=self.workers)
        self.evaluation = Evaluation(
            ctx, ps=self.ps, bottom=self._bottom, top=self._top,
            fuse=fuse_of(cfg) if role == "active" else None, dp_acct=dp.acct,
            eval_privatize=dp.eval_privatize)

    def trained_modules(self) -> list[torch.nn.Module]:
        """This party's models (bottom, then the top model for the active party) loaded with
        the parameter server's current vector (parameters and buffers), in eval mode: after
        :meth:`run`, the trained model (for :mod:`parties.runtime.saved`)."""
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
            self.handles = [kind(self.role, cfg, data.x_train, data.y_train, self.ps,
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
            self.handles = [ProcessWorker(self.role, k, cfg, self._data_dir, self.ps,
                                           noise_seed=self._noise_seeds[k],
                                           models=self.models, party=self.party)
                             for k in range(self.workers)]
            await asyncio.to_thread(ensure_forkserver)
        self.handles = [TimedWorker(h, self.timeline, k) for k, h in enumerate(self.handles)]
        await asyncio.gather(*(h.start() for h in self.handles))
        self.log.info("vfl.workers_started", workers=self.workers, mode=mode)

    async def _stop_workers(self) -> None:
        for h in self.handles:
            with contextlib.suppress(Exception):
                await h.close()
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
        if self.data.cache_dir and not self.cfg.data.stream_cache_dir:  # our temporary cache
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
        bus_cfg = BusConfig(connect_timeout_s=cfg.timeouts.connect_timeout_s,
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
                await self.session.subscribe(bus)
                await self.session.handshake(bus)
                self.overlap, self.overlap_reason = await self.session.agree_overlap(bus)
                self.evaluation.overlap_meta = self.session.overlap_meta
                self.log.info("vfl.val_overlap", on=self.overlap, reason=self.overlap_reason)
                await starting
                batch = TensorSpec(width=cfg.model.embedding_dim, max_rows=cfg.batch_size)
                self._driver = ActionDriver(
                    bus, topics=self.topics, handles=self.handles, timeline=self.timeline,
                    record_dp=self._record_train if self.role == "passive" else None,
                    inline=self.worker_mode == "inline", logger=self.log,
                    intake=self.intake, specs={EMB: batch, GRAD: batch},
                    wire=cfg.effective_wire_dtype,
                    ask_again=(self.evaluation.ask_gradient(bus) if self.role == "passive"
                               else None),
                    ask_after_s=cfg.timeouts.resend_interval_s)
                self.evaluation.grad_again = self._driver.grad_again
                meter = CpuMeter()
                meter.start()
                self.log.info("vfl.phase", phase="training")
                self.book.t0 = time.perf_counter()
                try:
                    async with asyncio.TaskGroup() as tg:
                        hb = tg.create_task(self.session.heartbeat(bus))
                        wd = tg.create_task(self.session.watchdog(bus))
                        an = tg.create_task(self.session.answer_hellos(bus))
                        ab = (tg.create_task(self.session.abort_watch(bus))
                              if self.multi and self.role == "passive" else None)
                        rs = tg.create_task(self.evaluation.serve_resends(bus))
                        if self.role == "active":
                            result = await self._train_active(bus, meter)
                        else:
                            result = await self._train_passive(bus, meter)
                        result["scoring_resends"] = self.evaluation.resend_counts(
                            self.session.asked)
                        hb.cancel()
                        wd.cancel()
                        an.cancel()
                        rs.cancel()
                        if ab is not None:
                            ab.cancel()
                except* VflError as eg:  # the party's own error, not a group (exit codes)
                    err = eg.exceptions[0]
                    if self.multi and self.role == "active":
                        await self.session.announce_abort(bus, err)
                    raise err from None
            if self.role == "active":
                # after the run is done (heartbeats and watchdog stopped): off the
                # training path, and the partner is not kept waiting
                t_base = time.perf_counter()
                result["active_only"] = await asyncio.to_thread(self.evaluation.active_only)
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
                mark = self.book.open_mark()
                seg_t0 = mark.t0
                if go is not None:
                    self.evaluation.publish_scored(bus, go)
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
                self.book.segments += 1
                self.timeline.record(SEGMENT, -1, len(self.book.history), seg_t0, t1)
                entry = self.book.close_mark(mark, epoch, s, len(segs), t1,
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
                    self.log.info("vfl.phase", phase="validation", point=point)
                    last = epoch == cfg.epochs - 1 and s == len(segs) - 1
                    if self.role == "active":
                        value = await self.evaluation.score(bus, "val", point)
                        entry[f"val_{self.metric}"] = value
                        entry["metric"] = value
                        if not last and not overlap:
                            go = point  # published once the next segment's clock runs
                    else:
                        await self.evaluation.publish_embeddings(bus, "val", self.topics.val(point))
                        if not last and not overlap:
                            await self.evaluation.await_scored(bus, point)
                    point += 1
                    self.book.eval_s += time.perf_counter() - t_eval
                self.book.append_entry(entry)

    async def _score_in_flight(self, bus: Transport, epoch: int, n_segs: int, s: int,
                               stops: list[int], point: int, applied0: int,
                               seg_done: asyncio.Event, mark: Mark,
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
                value = await self.evaluation.score(bus, "val", point + i, taken)
            else:
                # woken by the strategy after each batch's completion (NotifySchedule)
                # and at the segment's end (bounded by the segment's own deadlines)
                assert self._driver is not None
                await self._driver.wait_until(
                    lambda stop=stop: self.c.batches - applied0 >= stop or seg_done.is_set())
                await self.evaluation.publish_embeddings(bus, "val", self.topics.val(point + i))
            at = taken[0] if taken else time.perf_counter()
            entry = self.book.close_mark(mark, epoch, s, n_segs, at, fractions[i])
            if self.role == "active":
                entry[f"val_{self.metric}"] = value
                entry["metric"] = value
            self.book.points_in_flight += 1
            self.book.append_entry(entry, at)

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
        self.log.info("vfl.phase", phase="test")
        await self.evaluation.publish_embeddings(bus, "test", self.topics.test)
        self.book.eval_s += time.perf_counter() - t_eval
        metrics = party_metrics(self, meter)
        metrics["dp"] = dp_report(self.dp_plan, self.dp_acct)
        if self.dp_plan is not None:
            self.log.info("dp.spent", mu=metrics["dp"]["mu"], epsilon=metrics["dp"]["epsilon"],
                          delta=self.dp_plan.delta,
                          publications_max=metrics["dp"]["publications_max"])
        self.log.info("vfl.phase", phase="report")
        self.evaluation.publish_kept(bus, self.topics.report, metrics)
        # wait for the active party to finish evaluating (heartbeats keep flowing)
        if not await self.evaluation.await_done(bus):
            self.log.warning("vfl.no_done", waited_s=cfg.timeouts.liveness_timeout_s + cfg.timeouts.t_ddl_s)
        return metrics

    def _record_train(self, rows: np.ndarray, *, extra: bool = False) -> bool:
        """Count one ``emb`` publication of ``rows`` in the DP ledger (before it happens);
        ``extra``: a reassigned attempt, first checked against every record's reserve
        (``dp_reassign_reserve``, this party's own per-record count): False when a record
        of the batch has spent it (nothing counted: the batch must not be published).

        Raises:
            parties.core.errors.PrivacyBudgetExceeded: past the plan (nothing is published).
        """
        assert self.dp_acct is not None
        if extra and not self.dp_acct.admits_extra("train", rows):
            self.log.warning("dp.reserve_exhausted", rows=len(rows),
                             reserve=self.dp_acct.reserve.get("train"))
            return False
        self.dp_acct.record("train", rows, extra=extra)
        return True

    # ------------------------------------------------------------------ active
    async def _train_active(self, bus: Transport, meter: CpuMeter) -> dict[str, Any]:
        cfg = self.cfg
        name = self.metric
        key = f"test_{name}"
        await self._train(bus)
        t_eval = time.perf_counter()
        self.log.info("vfl.phase", phase="test")
        value = await self.evaluation.score(bus, "test")
        self.book.eval_s += time.perf_counter() - t_eval
        metrics = party_metrics(self, meter)
        target = cfg.effective_target
        points = [(h["train_wall_s"], h["metric"]) for h in self.book.history if "metric" in h]
        metrics.update({
            "task": self.data.task, key: value, "metric_name": name, "metric": value,
            "target_metric": target,
            "time_to_target_s": first_reaching(points, target, higher_is_better=name == "auc"),
            "n_val_scored": int(self.data.x_val.shape[0]),
            "labels": labels_report(cfg.labels, self.label_ledger),
        })
        deadline = time.monotonic() + cfg.timeouts.liveness_timeout_s
        self.log.info("vfl.phase", phase="report")
        for party in self.partners:
            rep = await self.evaluation.await_report(
                bus, party, self.topics.report_of(party if self.multi else ""), deadline)
            if rep is not None:
                self.partner_reports[party] = rep
            else:
                self.log.warning("vfl.no_report", partner=party,
                                 waited_s=cfg.timeouts.liveness_timeout_s)
        self.partner_report = self.partner_reports.get(self.partners[0])
        try:
            # in-process (``connect`` given): the caller adds the hub's own statistics
            metrics["broker"] = None if self._connect is not None else await asyncio.to_thread(
                request_stats, self.broker, timeout_s=2.0, security=self.security)
        except BusError as exc:
            self.log.warning("vfl.broker_stats_failed", error=str(exc))
            metrics["broker"] = None
        if not await self.evaluation.end_run(bus):
            self.log.warning("vfl.no_done_ack", missing=sorted(
                set(self.partners) - self.evaluation.done_acked))
        return metrics

    # ------------------------------------------------------------------ metrics
    def _wait_s(self) -> float:
        """Seconds the workers have waited for partner messages so far."""
        return self._driver.wait_s if self._driver is not None else 0.0

    def _compute_cpu_s(self) -> float:
        """CPU seconds the workers' compute calls have taken so far (thread CPU time of
        the thread, or worker process, that ran them)."""
        return sum(h.compute_cpu_s for h in self.handles)

    def _sync_cpu_s(self) -> float:
        """CPU seconds of the workers' parameter-server syncs so far (part of
        :meth:`_compute_cpu_s`)."""
        return sum(h.sync_cpu_s for h in self.handles)
