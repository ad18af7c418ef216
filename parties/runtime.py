"""The I/O driver of a PubSub-VFL party: bus, handshake, heartbeats, workers, evaluation.

Protocol (all topics live under the run id, so runs can share a broker):

========================  =========  ====================================================
topic                     publisher  payload
========================  =========  ====================================================
``emb/<run>/<b>``         passive    (B, d) float32 embedding of batch b; meta e, b, a, u
``grad/<run>/<b>``        active     (B, d) float32 cut-layer gradient; meta e, b, u
                                     (or ``skip``: the active party gave up on the batch)
``eval/<run>/<e>``        passive    (n_test, d) embeddings of the test split after epoch e
                                     (the active party scores them: test AUC or RMSE)
``ctl/<run>/hello/<r>``   both       handshake for role r (shared-settings digest)
``ctl/<run>/hb/<r>``      both       heartbeat of role r
``ctl/<run>/report``      passive    the passive party's metrics, at the end
``ctl/<run>/done``        active     the run is over
========================  =========  ====================================================

Each party has a parameter server and ``w`` worker coroutines (PubSub-VFL Sec. 4).
A worker takes the next batch id, computes in a thread (torch releases the GIL),
publishes on the batch's channel and waits for its partner's data with the
deadline T_ddl; a miss drops the batch and reassigns it. Per-batch buffers
hold at most p embeddings / q gradients (FIFO eviction, in :class:`pubsub.Bus`).
Epochs end with a barrier inside each party (flush syncs, evaluate); the
parties themselves never wait on each other except through the channels.

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

from parties.config import VflConfig
from parties.data import (
    encode_labels,
    encode_party_features,
    encode_regression_labels,
    train_test_indices,
)
from parties.dp import EmbeddingPrivatizer, GdpAccountant, plan_from_config, worker_seeds
from parties.dp import report as dp_report
from parties.preflight import check_test_labels, load_configured_table, resolve_columns
from parties.errors import ConfigMismatch, HandshakeTimeout, PartnerLost
from parties.model import (
    ParameterServer,
    bottom_model,
    embed,
    flat_params,
    load_flat,
    predict,
    top_model,
)
from parties.schedule import EpochSchedule, epoch_batches, num_batches
from parties.sysinfo import CpuMeter
from parties.tasks import compute_metric, metric_name
from parties.workers import ProcessWorker, ThreadWorker, WorkerHandle, ensure_forkserver

log = structlog.get_logger(__name__)

ROLES = ("active", "passive")


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names of one run."""

    run_id: str

    def emb(self, b: int) -> str:
        return f"emb/{self.run_id}/{b}"

    def grad(self, b: int) -> str:
        return f"grad/{self.run_id}/{b}"

    def eval(self, epoch: int) -> str:
        return f"eval/{self.run_id}/{epoch}"

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


@dataclass(frozen=True, slots=True, kw_only=True)
class PartyData:
    """One party's view of the data after encoding.

    Attributes:
        x_train / x_test: ``(n, d)`` float32 features of this party's columns.
        y_train / y_test: ``(n,)`` float32 labels (active party only, else None): 0/1
            (binary task); for regression ``y_train`` is standardised and ``y_test`` is
            in the label's original units.
        columns: this party's raw feature columns.
        n_rows: rows in the whole (aligned) table.
        dataset: dataset name or path.
        task: ``"binary"`` or ``"regression"``.
        label_mean / label_std: regression only: the training labels' mean and standard
            deviation, original units (standardised prediction p means ``p·std + mean``).
    """

    x_train: np.ndarray
    x_test: np.ndarray
    y_train: np.ndarray | None
    y_test: np.ndarray | None
    columns: tuple[str, ...]
    n_rows: int
    dataset: str
    task: str = "binary"
    label_mean: float = 0.0
    label_std: float = 1.0


def load_party_data(cfg: VflConfig, role: str) -> PartyData:
    """Load and encode this party's columns (and labels, for the active party).

    Raises:
        parties.data.DataError: missing file, unknown column, bad split, a label unfit for
            the task (one class; not numeric or constant for regression).
    """
    task = cfg.effective_task
    frame, default_label = load_configured_table(cfg)
    label, active, passive = resolve_columns(cfg, frame, default_label)
    train_idx, test_idx = train_test_indices(len(frame), test_frac=cfg.test_frac, seed=cfg.seed)
    mine = tuple(active if role == "active" else passive)
    feats = encode_party_features(frame, mine, train_idx, test_idx)
    y_train = y_test = None
    mean, std = 0.0, 1.0
    if role == "active":
        if task == "regression":
            reg = encode_regression_labels(frame, label, train_idx, test_idx)
            y_train, y_test, mean, std = reg.y_train, reg.y_test, reg.mean, reg.std
        else:
            y_train, y_test, _pos = encode_labels(frame, label, train_idx, test_idx)
        check_test_labels(y_test, label, task=task)
    log.info("vfl.data_loaded", party=role, dataset=cfg.dataset, task=task, n_rows=len(frame),
             n_train=len(train_idx), n_test=len(test_idx), columns=len(mine),
             features=int(feats.x_train.shape[1]))
    return PartyData(
        x_train=feats.x_train, x_test=feats.x_test, y_train=y_train, y_test=y_test,
        columns=mine, n_rows=len(frame), dataset=cfg.dataset, task=task,
        label_mean=mean, label_std=std,
    )


@dataclass(slots=True)
class _Counters:
    wait_s: float = 0.0
    dropped: int = 0
    reassigned: int = 0
    skipped: int = 0
    stale: int = 0
    batches: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    loss_n: int = 0
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
    """

    def __init__(self, role: str, cfg: VflConfig, data: PartyData, *, broker: str, run_id: str,
                 progress: bool = True) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if role == "active" and data.y_train is None:
            raise ValueError("the active party needs labels")
        self.role = role
        self.partner = "passive" if role == "active" else "active"
        self.cfg = cfg
        self.data = data
        self.broker = broker
        self.run_id = run_id
        self.topics = Topics(run_id)
        self.progress = progress
        self.n_train = data.x_train.shape[0]
        self.n_batches = num_batches(self.n_train, cfg.batch_size)
        self.workers = cfg.w_active if role == "active" else cfg.w_passive
        self.c = _Counters()
        self.bus: Bus | None = None
        self.log = log.bind(party=role, run_id=run_id)
        torch.manual_seed(cfg.seed + (0 if role == "active" else 1))
        d_in = data.x_train.shape[1]
        self._make_bottom = lambda: bottom_model(d_in, cfg.bottom_hidden, cfg.embedding_dim)
        self._make_top = lambda: top_model(cfg.embedding_dim, cfg.top_hidden)
        self._bottom = self._make_bottom()
        self._top = self._make_top() if role == "active" else None
        mods = [self._bottom] + ([self._top] if self._top is not None else [])
        self.ps = ParameterServer(flat_params(mods), workers=self.workers)
        self._x_test = torch.from_numpy(np.ascontiguousarray(data.x_test))
        self._handles: list[WorkerHandle] = []
        self._data_dir: Path | None = None
        self.partner_report: dict[str, Any] | None = None
        self._init_dp()

    def _init_dp(self) -> None:
        """The passive party's DP plan, per-record ledger and secret noise seeds."""
        cfg = self.cfg
        self.dp_plan = plan_from_config(cfg) if self.role == "passive" else None
        self.dp_acct: GdpAccountant | None = None
        self._noise_seeds: list[int | None] = [None] * self.workers
        self._eval_privatize: EmbeddingPrivatizer | None = None
        if self.role != "passive":
            return
        plan = self.dp_plan
        self.dp_acct = GdpAccountant(
            {"train": self.n_train, "test": int(self.data.x_test.shape[0])},
            noise_multiplier=plan.noise_multiplier if plan else None,
            max_publications=plan.planned_publications if plan else None)
        if plan is None:
            return
        *seeds, eval_seed = worker_seeds(cfg.dp_noise_seed, self.workers + 1)
        self._noise_seeds = list(seeds)
        self._eval_privatize = EmbeddingPrivatizer(
            clip_norm=plan.clip_norm, noise_multiplier=plan.noise_multiplier, seed=eval_seed)
        self.log.info("dp.plan", noise_multiplier=plan.noise_multiplier,
                      clip_norm=plan.clip_norm, target_mu=plan.target_mu, delta=plan.delta,
                      planned_publications=plan.planned_publications,
                      noise_seed="config" if cfg.dp_noise_seed is not None else "os_entropy")

    # ------------------------------------------------------------------ helpers
    async def _start_workers(self) -> None:
        """Create the worker handles (and, in process mode, spawn and await the children)."""
        cfg, data = self.cfg, self.data
        if cfg.worker_mode == "thread":
            self._handles = [ThreadWorker(self.role, cfg, data.x_train, data.y_train, self.ps,
                                          noise_seed=self._noise_seeds[k])
                             for k in range(self.workers)]
        else:
            self._data_dir = Path(tempfile.mkdtemp(prefix=f"psfl-{self.role}-"))
            np.save(self._data_dir / "x_train.npy", data.x_train)
            if data.y_train is not None:
                np.save(self._data_dir / "y_train.npy", data.y_train)
            self._handles = [ProcessWorker(self.role, k, cfg, self._data_dir, self.ps,
                                           noise_seed=self._noise_seeds[k])
                             for k in range(self.workers)]
            await asyncio.to_thread(ensure_forkserver)
        await asyncio.gather(*(h.start() for h in self._handles))
        self.log.info("vfl.workers_started", workers=self.workers, mode=cfg.worker_mode)

    async def _stop_workers(self) -> None:
        for h in self._handles:
            with contextlib.suppress(Exception):
                await h.close()
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)

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
            async with Bus(self.broker, name=self.role, config=bus_cfg) as bus:
                self.bus = bus
                await self._subscribe(bus)
                await self._handshake(bus)
                await starting
                meter = CpuMeter()
                meter.start()
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
        if self.role == "active":
            lim = BufferLimits(max_msgs=cfg.p, max_bytes=cfg.p * emb_bytes)
            await bus.subscribe_many([t.emb(b) for b in range(self.n_batches)], limits=lim)
            eval_bytes = self.data.x_test.shape[0] * cfg.embedding_dim * 4 + 4096
            await bus.subscribe_many([t.eval(e) for e in self._eval_epochs()],
                                     limits=BufferLimits(max_msgs=2, max_bytes=2 * eval_bytes))
            await bus.subscribe(t.report)
        else:
            lim = BufferLimits(max_msgs=cfg.q, max_bytes=cfg.q * emb_bytes)
            await bus.subscribe_many([t.grad(b) for b in range(self.n_batches)], limits=lim)
            await bus.subscribe(t.done)
        await bus.subscribe(t.hb(self.partner), limits=BufferLimits(max_msgs=4, max_bytes=1 << 16))
        # subscribed last: a hello from the partner proves all the above reached its publisher
        await bus.subscribe(t.hello(self.role))

    async def _handshake(self, bus: Bus) -> None:
        """Exchange hellos until each side has seen the other (PubSub slow-joiner guard)."""
        cfg, t = self.cfg, self.topics
        mine = cfg.shared_settings(self.data.n_rows)
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
                    accept: Callable[[Message], int]) -> Message | None:
        """Wait on ``topic`` until ``deadline`` (loop time) for a message ``accept`` returns 1 for.

        ``accept`` returns 1 (take), 0 (stale: discard, keep waiting) or -1 (from
        the future: put back and give up). Time spent is counted as waiting time.
        """
        loop = asyncio.get_running_loop()
        t0 = loop.time()
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
                    return None
                self.c.stale += 1
        finally:
            self.c.wait_s += loop.time() - t0

    # ------------------------------------------------------------------ passive
    async def _train_passive(self, bus: Bus, meter: CpuMeter) -> dict[str, Any]:
        cfg = self.cfg
        for epoch in range(cfg.epochs):
            t_epoch = time.perf_counter()
            batches = epoch_batches(self.n_train, cfg.batch_size, seed=cfg.seed, epoch=epoch)
            sched = EpochSchedule(self.n_batches, cfg.max_reassign)
            cond = asyncio.Condition()
            await asyncio.gather(*(self._passive_worker(bus, k, epoch, batches, sched, cond)
                                   for k in range(self.workers)))
            await self._flush()
            if epoch in self._eval_epochs():
                load_flat([self._bottom], self.ps.pull())
                emb_test = await asyncio.to_thread(self._test_embeddings)
                assert self.dp_acct is not None
                self.dp_acct.record("test")
                bus.publish_nowait(self.topics.eval(epoch), [emb_test], {"e": epoch}, copy=False)
            self.c.history.append({"epoch": epoch, "wall_s": time.perf_counter() - t_epoch,
                                   "dropped": sched.dropped, "reassigned": sched.reassigned})
            self.log.info("vfl.epoch_done", epoch=epoch, dropped=sched.dropped,
                          reassigned=sched.reassigned)
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

    def _test_embeddings(self) -> np.ndarray:
        """The test split's embeddings ``(n_test, d)`` float32 from the PS parameters:
        clipped and noised when DP is on (a thread's work)."""
        emb = embed(self._bottom, self._x_test)
        if self._eval_privatize is None:
            return emb
        return self._eval_privatize(torch.from_numpy(emb))[1].numpy()

    async def _passive_worker(self, bus: Bus, k: int, epoch: int, batches: list[np.ndarray],
                              sched: EpochSchedule, cond: asyncio.Condition) -> None:
        worker = self._handles[k]
        loop = asyncio.get_running_loop()
        while (task := await self._next_task(sched, cond)) is not None:
            b, attempt = task
            rows = batches[b]
            h_np = await worker.forward(epoch, b)
            assert self.dp_acct is not None
            self.dp_acct.record("train", rows)  # raises, publishing nothing, past the plan
            uid = f"{epoch}.{b}.{attempt}"
            bus.publish_nowait(self.topics.emb(b), [h_np],
                               {"e": epoch, "b": b, "a": attempt, "u": uid}, copy=False)

            def accept(m: Message, uid: str = uid, b: int = b) -> int:
                if m.meta.get("u") == uid:
                    return 1
                if m.meta.get("skip") and m.meta.get("e") == epoch and m.meta.get("b") == b:
                    return 1
                return 0

            msg = await self._wait(bus, self.topics.grad(b), loop.time() + self.cfg.t_ddl_s,
                                   accept)
            if msg is None:
                await worker.discard(b)
                again = sched.fail(b, attempt)
                self._count_miss(again, b, epoch, "grad")
            elif msg.meta.get("skip"):
                await worker.discard(b)
                sched.drop(b)
                self.c.skipped += 1
                self.c.dropped += 1
            else:
                await worker.backward(epoch, b, msg.arrays[0])
                sched.complete(b)
                self.c.batches += 1
                self.c.samples += len(rows)
            async with cond:
                cond.notify_all()

    @staticmethod
    async def _next_task(sched: EpochSchedule, cond: asyncio.Condition) -> tuple[int, int] | None:
        """The next ``(batch_id, attempt)`` of the epoch, waiting while others are in flight
        (they may fail and be reassigned); None when the epoch is over."""
        while True:
            task = sched.take()
            if task is not None or sched.done:
                return task
            async with cond:
                await cond.wait_for(lambda: bool(sched.pending) or sched.done)

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
        t_train = time.perf_counter()
        name = metric_name(self.data.task)
        key = f"test_{name}"
        value = float("nan")
        for epoch in range(cfg.epochs):
            t_epoch = time.perf_counter()
            loss0, n0, samples0, wait0 = self.c.loss_sum, self.c.loss_n, self.c.samples, self.c.wait_s
            batches = epoch_batches(self.n_train, cfg.batch_size, seed=cfg.seed, epoch=epoch)
            sched = EpochSchedule(self.n_batches, cfg.max_reassign)
            cond = asyncio.Condition()
            await asyncio.gather(*(self._active_worker(bus, k, epoch, batches, sched, cond)
                                   for k in range(self.workers)))
            await self._flush()
            train_s = time.perf_counter() - t_epoch
            entry: dict[str, Any] = {
                "epoch": epoch,
                "loss": (self.c.loss_sum - loss0) / max(1, self.c.loss_n - n0),
                "train_s": train_s,
                "samples_per_s": (self.c.samples - samples0) / train_s if train_s > 0 else 0.0,
                "wait_s": (self.c.wait_s - wait0) / self.workers,
                "dropped": sched.dropped, "reassigned": sched.reassigned,
            }
            if epoch in self._eval_epochs():
                value = await self._evaluate(bus, epoch)
                entry[key] = value
                entry["metric"] = value
            entry["wall_s"] = time.perf_counter() - t_train
            self.c.history.append(entry)
            self.log.info("vfl.epoch_done", **entry)
            if self.progress:
                shown = f"  {key} {entry[key]:.4f}" if key in entry else ""
                print(f"epoch {epoch + 1:>3}/{cfg.epochs}  loss {entry['loss']:.4f}{shown}  "
                      f"{entry['samples_per_s']:,.0f} samples/s  wait {entry['wait_s']:.2f} s  "
                      f"dropped {sched.dropped}", flush=True)
        metrics = self._party_metrics(meter)
        metrics.update({"task": self.data.task, key: value, "metric_name": name,
                        "metric": value})
        try:
            rep = await bus.next(self.topics.report, cfg.liveness_timeout_s)
            self.partner_report = dict(rep.meta)
        except DeadlineExceeded:
            self.log.warning("vfl.no_report", waited_s=cfg.liveness_timeout_s)
        try:
            metrics["broker"] = await asyncio.to_thread(request_stats, self.broker, timeout_s=2.0)
        except BusError as exc:
            self.log.warning("vfl.broker_stats_failed", error=str(exc))
            metrics["broker"] = None
        bus.publish_nowait(self.topics.done, (), {"ok": True})
        await asyncio.sleep(0.05)
        return metrics

    async def _active_worker(self, bus: Bus, k: int, epoch: int, batches: list[np.ndarray],
                             sched: EpochSchedule, cond: asyncio.Condition) -> None:
        worker = self._handles[k]
        loop = asyncio.get_running_loop()

        def accept(m: Message) -> int:
            e = m.meta.get("e", -1)
            return 1 if e == epoch else (0 if e < epoch else -1)

        while (task := await self._next_task(sched, cond)) is not None:
            b, attempt = task
            rows = batches[b]
            msg = await self._wait(bus, self.topics.emb(b), loop.time() + self.cfg.t_ddl_s,
                                   accept)
            if msg is None:
                again = sched.fail(b, attempt)
                self._count_miss(again, b, epoch, "emb")
                if not again:
                    bus.publish_nowait(self.topics.grad(b), (),
                                       {"e": epoch, "b": b, "skip": True})
            else:
                loss, grad = await worker.step(epoch, b, msg.arrays[0])
                bus.publish_nowait(self.topics.grad(b), [grad],
                                   {"e": epoch, "b": b, "u": msg.meta.get("u")}, copy=False)
                sched.complete(b)
                self.c.batches += 1
                self.c.samples += len(rows)
                self.c.loss_sum += loss
                self.c.loss_n += 1
            async with cond:
                cond.notify_all()

    async def _evaluate(self, bus: Bus, epoch: int) -> float:
        """The test metric after ``epoch`` (AUC, or RMSE in the label's units) from the PS
        parameters and the passive party's test embeddings."""
        cfg, data = self.cfg, self.data
        assert self._top is not None and data.y_test is not None
        t0 = time.perf_counter()
        msg = await bus.next(self.topics.eval(epoch), cfg.liveness_timeout_s)
        self.c.wait_s += time.perf_counter() - t0
        load_flat([self._bottom, self._top], self.ps.pull())
        pred = await asyncio.to_thread(predict, self._bottom, self._top, self._x_test,
                                       msg.arrays[0], task=data.task)
        if data.task == "regression":
            pred = pred.astype(np.float64) * data.label_std + data.label_mean
        return compute_metric(data.task, data.y_test, pred)

    # ------------------------------------------------------------------ metrics
    def _party_metrics(self, meter: CpuMeter) -> dict[str, Any]:
        wall, cpu, cores, util = meter.read()
        assert self.bus is not None
        st = self.bus.stats()
        return {
            "role": self.role,
            "workers": self.workers,
            "train_wall_s": wall,
            "cpu_s": cpu,
            "cores_allotted": cores,
            "cpu_util": util,
            "wait_s_total": self.c.wait_s,
            "wait_s_per_epoch": self.c.wait_s / (self.workers * self.cfg.epochs),
            "bytes_sent": dict(st.sent_bytes),
            "msgs_sent": dict(st.sent_msgs),
            "bytes_recv": dict(st.recv_bytes),
            "dropped_batches": self.c.dropped,
            "reassigned_batches": self.c.reassigned,
            "skipped_batches": self.c.skipped,
            "stale_messages": self.c.stale,
            "bus": {k: v for k, v in st.as_dict().items() if not isinstance(v, dict)},
            "ps_pushes": self.ps.pushes,
            "worker_mode": self.cfg.worker_mode,
            "compute_s": sum(h.compute_s for h in self._handles),
            "worker_parallelism": (sum(h.compute_s for h in self._handles) / wall
                                   if wall > 0 else 0.0),
            "batches": self.c.batches,
            "samples": self.c.samples,
            "history": self.c.history,
            "n_features": int(self.data.x_train.shape[1]),
            "columns": list(self.data.columns),
        }
