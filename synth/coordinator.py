"""The FedForge coordinator: runs a synthesis job as a DAG of stages over the bus
(issue 6, item 9), acting as the secure-aggregation server and the tree's root.

Stages, in order; each writes its artifact to ``OUT/stages/`` and logs ``stage.started``
and ``stage.done`` (with seconds) to the run's event log:

* ``schema``: waits for every party's and aggregator's hello and broadcasts the public
  schema (``schema.json``); each party checks its columns and values against it and
  reports a mismatch as an error, which ends the run.
* ``budget``: ρ from (ε, δ) with the tight conversion (:func:`synth.accounting.cdp_rho`),
  split by the mechanism (MST: thirds, ``mst_split``; AIM: ``aim_split``) (``budget.json``).
* ``keys`` and ``seeds:0``: the secure-aggregation session: the parties' public keys are
  exchanged once, and self-mask seed shares once for all the run's rounds
  (``keys.json``, ``seeds_0.json``).
* ``round:one_way``, ``round:select``: all 1-way marginals; MST's domain compression
  (``compress_domain``); all 2-way marginals. Each round is measured by the parties,
  masked, summed up the aggregation tree and unmasked here (``round_<name>.json`` and
  ``.npz``). A plan carries each clique's ρ share and S_min (``min_survivors``); every
  party checks it and computes its Skellam noise itself (:mod:`synth.plancheck`); a
  round with fewer than S_min survivors is not released (the parties refuse to reveal).
* MST: ``select_tree`` (the maximum spanning tree of the noisy 2-way answers, as
  post-processing) and ``round:tree`` (the tree's 2-way marginals); the engine also gets
  the best-scored further 2-way answers that keep the model within ``mst_extra_mb``.
* AIM: per adaptive round ``select:aim<j>`` (fit the model to everything measured so far,
  pick the pairs it explains worst from the noisy 2-way answers) and ``round:aim<j>``.
* ``synthesis``: fits the engine to the noisy aggregate marginals and samples the
  synthetic rows (``synthetic.csv`` in OUT).
* ``quality``: workload TV distance against the pooled real rows and ML utility against
  the real holdout, when the evaluation data is given (simulation; a deployed
  coordinator never sees records) (``quality.json``).

Checkpoints (issue 7, item 2): after every stage, and before every broadcast that
commits the parties to something (a round's plan), the coordinator writes
``OUT/stages/checkpoint.json`` atomically (:mod:`synth.checkpoint`): the stages done,
the rows, the secure-aggregation session's public state, each finished round's decoded
aggregate, the plan of a round in progress, and the ρ each party was charged. A
coordinator killed at any point (kill -9) and started again with ``resume=True`` on the
same run directory skips what is done, re-publishes the plan of the round in progress
(the parties answer a plan they already measured with the same masked vector, without
spending again) and asks the parties to repeat their last message of an unfinished key or
seed stage (``ff/<run>/all/resume``).

``metrics.json`` in OUT holds the figures the issue asks for (``avg_tv``, ``max_tv``,
``workload_error``, ``bytes_wire``, ``bytes_naive``, ``rho_spent`` per party, ``epsilon``,
``delta``, ``wall_s``, ``ml_utility``), the ``dp`` block (the guarantee: protected unit,
replace-one relation, adversary, what is outside; :func:`synth.mechanism.dp_statement`)
and the per-round details, with the dropout
recovery (:mod:`synth.cache`): ``dropout_recovery`` (``cached``: cliques completed with
the absent parties' row share of an earlier release, and how stale it was;
``survivors_only``: survivors' sums rescaled to all rows) and ``rounds[name].coverage_rows``
(the rows the round's survivors hold).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pandas as pd
import structlog

from pubsub import DeadlineExceeded, Message
from pubsub.config import to_mapping
from pubsub.control import control_request
from pubsub.security import CurveClient
from pubsub.transport import Connect, Transport
from pubsub.session import wait_any
from synth.accounting import allocate, cdp_epsilon, cdp_rho
from synth.cache import MarginalCache, Release, recover_round
from synth.checkpoint import (
    atomic_save_npz,
    atomic_write_json,
    load_npz,
    read_json,
)
from synth.config import SynthConfig
from synth.domain import Schema, decode, encode, marginals
from synth.engine import NoisyMarginal, load_warm_start, make_engine, model_state
from synth.mechanism import dp_statement, resolve_min_survivors
from synth.skellam import SkellamAccountingError, party_mu
from synth.netutil import array_to_words, bus_config, open_bus, topic_limits
from synth.protocol import (
    ROOT,
    RoundPlan,
    SessionPlan,
    Topics,
    aggregate_sigma,
    build_tree,
    cell_upper_bounds,
    cell_windows,
    decode_sum,
    pack_blobs,
    unpack_blobs,
    party_sigma2,
    round_id,
    secagg_degree,
    split_marginals,
)
from synth.workload import WorkloadError, WorkloadUpdate, mark_applied, pending_updates
from synth.secagg import (
    SHARE_BYTES,
    PartyKeys,
    RevealedShare,
    SecAggError,
    SecAggServer,
)
from synth.gum import gum_update
from synth.select import (
    candidate_pairs,
    compress_codes,
    compress_domain,
    compress_marginal,
    compress_supports,
    aim_select_batch,
    mst_select,
    pair_scores,
    uncompress_codes,
)

log = structlog.get_logger(__name__)



#: How often a resumed coordinator repeats its resume request while a stage waits, seconds.
RESUME_EVERY_S = 2.0


#: Config keys that may change between a run and its resumption (deadlines, process
#: layout, how an update is refitted); every other key must match the checkpoint.
_OPERATIONAL = frozenset({"round_timeout_s", "handshake_timeout_s", "connect_timeout_s",
                          "parties_per_process", "engine_threads", "stream_iters", "stream_refit",
                          "stream_compare_full"})


def _fingerprint(cfg: SynthConfig, schema: Schema) -> str:
    """What a checkpoint must match to be resumed: the config (but its operational keys)
    and the schema."""
    conf = {k: v for k, v in to_mapping(cfg).items() if k not in _OPERATIONAL}
    doc = json.dumps({"config": conf, "schema": schema.fingerprint()},
                     sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


#: The sigma given to the engine for an exact (epsilon = inf) measurement, in counts.
NOISELESS_SIGMA = 1e-3


class CoordinatorError(RuntimeError):
    """The run cannot complete.

    Attributes:
        reason: what went wrong (also broadcast to every participant with ``done``).
        code: the process exit code (2: bad input, 4: participants missing, 1: other).
    """

    def __init__(self, reason: str, *, code: int = 1) -> None:
        self.reason = reason
        self.code = code
        super().__init__(reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalData:
    """Evaluation-only data for the quality stage (the simulator has it; a deployed
    coordinator does not).

    Attributes:
        train: the pooled rows the parties hold.
        holdout: real rows no party used (the ML-utility test set).
    """

    train: pd.DataFrame
    holdout: pd.DataFrame


@dataclass(slots=True)
class _RoundResult:
    plan: RoundPlan
    values: np.ndarray  # float64 (vector_len,): decoded aggregate
    sigma: float
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    missing: tuple[str, ...]  # planned parties that never advertised keys
    seconds: float


class Coordinator:
    """Runs one FedForge job.

    Args:
        cfg: the run config.
        schema: the public schema (domain) every party must share.
        broker: broker address ``tcp://HOST:PORT``.
        run_id: topic namespace.
        out: the run directory (artifacts, ``synthetic.csv``, ``metrics.json``).
        eval_data: evaluation-only data for the quality stage, or None.
        security: CURVE keys for the bus (:class:`pubsub.security.CurveClient`); None =
            plaintext (loopback brokers only).
        resume: continue the run from ``OUT/stages/checkpoint.json`` (written by an
            earlier coordinator of the same run that died; one that died before its first
            checkpoint had committed nothing, so the run starts afresh, asking the
            participants to say hello again); False starts afresh and replaces any
            checkpoint there.
        connect: the bus connection to use instead of ``broker`` (in process:
            :meth:`pubsub.memory.MemoryBroker.connect`, :mod:`sim.synth_local`).

    Raises:
        CoordinatorError: (code 2) ``resume`` in a directory without a run, or a
            checkpoint of another run id, config or schema.
    """

    def __init__(self, cfg: SynthConfig, schema: Schema, *, broker: str, run_id: str,
                 out: Path, eval_data: EvalData | None = None,
                 security: CurveClient | None = None, resume: bool = False,
                 connect: Connect | None = None,
                 on_point: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.cfg = cfg
        self.connect = connect
        self.on_point = on_point
        self.schema = schema
        self.domain = schema.domain
        self.broker = broker
        self.security = security
        self.run_id = run_id
        self.topics = Topics(run_id)
        self.out = Path(out)
        self.stages_dir = self.out / "stages"
        self.eval_data = eval_data
        self.parties = cfg.party_ids()
        self.tree = build_tree(self.parties, cfg.fanout, cfg.root_children)
        self.rows: dict[str, int] = {}
        self.stage_s: dict[str, float] = {}
        self.stage_cpu_s: dict[str, float] = {}  # process CPU seconds per stage
        self.rho_party: dict[str, float] = dict.fromkeys(self.parties, 0.0)
        self.bytes_naive = 0
        self.bytes_naive_direct = 0
        self.wire_marks: list[tuple[str, int | None]] = []
        self.engine = cfg.resolved_engine()
        self.maps: dict[str, np.ndarray] = {}  # MST's domain compression (after round 1)
        self.cdomain = self.domain
        self.one_way_c: dict[tuple[str, ...], NoisyMarginal] = {}
        # released noisy marginals on the compressed domain, (clique, values, per-cell
        # std): public bounds for the ring windows of later rounds
        self.known: list[tuple[tuple[str, ...], np.ndarray, np.ndarray]] = []
        k = len(self.parties)
        self.session = SessionPlan(
            session_id=f"{run_id}/0", party_ids=self.parties, threshold=None,
            degree=secagg_degree(k, cfg.secagg_degree),
            graph_seed=np.random.default_rng([cfg.seed, 0]).bytes(16).hex(),
            timeout_s=cfg.round_timeout_s, tree=self.tree.to_dict())
        self.server = SecAggServer(self.session.secagg())
        self.never_keyed: tuple[str, ...] = ()
        self._maps_sent = False
        self._maps_round = 0
        # dropout recovery (synth.cache): released aggregates, per round the estimates
        # handed on, and what was recovered how; derived from the round results alone
        self.cache = MarginalCache()
        self._recovered: dict[str, dict[tuple[str, ...], NoisyMarginal]] = {}
        self._one_way_releases: list[Release] = []
        self.recovery: dict[str, list[dict[str, Any]]] = {"cached": [], "survivors_only": []}
        self.log = log.bind(run_id=run_id, party="coordinator")
        self.ckpt_path = self.stages_dir / "checkpoint.json"
        self.ckpt_dir = self.stages_dir / "ckpt"
        self.fingerprint = _fingerprint(cfg, schema)
        self.resumed_from: list[str] = []  # stages done before this coordinator started
        self.ckpt: dict[str, Any] = {
            "version": 1, "run_id": run_id, "fingerprint": self.fingerprint,
            "done": [], "rows": {}, "rho_party": {}, "server": None, "never_keyed": [],
            "results": {}, "pending": {}, "selects": {}, "restarts": 0, "stage_s": {},
            "session": 0, "stream_rho_left": None, "workload": [], "model": None}
        self.s = 0  # the secure-aggregation session (a reopened finished run starts a new one)
        self.reopened = False
        self.weights: dict[tuple[str, ...], float] = {}
        self.updates: list[dict[str, Any]] = []  # this process's applied workload updates
        if resume:
            self._load_checkpoint()
        elif self.ckpt_path.exists():
            self.ckpt_path.unlink()

    # ------------------------------------------------------------------ checkpoints
    def _load_checkpoint(self) -> None:
        doc = read_json(self.ckpt_path)
        if doc is None:
            if (self.out / "config.toml").exists():  # died before its first checkpoint:
                self.log.info("coordinator.resumed", done=[], pending=[], restarts=1)
                self.ckpt["restarts"] = 1  # nothing was committed yet; start afresh
                return
            raise CoordinatorError(f"nothing to resume: no checkpoint at {self.ckpt_path} "
                                   f"and no run in {self.out}", code=2)
        if doc.get("version") != 1:
            raise CoordinatorError(f"checkpoint version {doc.get('version')!r} is not 1",
                                   code=2)
        for key, want in (("run_id", self.run_id), ("fingerprint", self.fingerprint)):
            if doc.get(key) != want:
                raise CoordinatorError(
                    f"the checkpoint in {self.out} belongs to another run ({key} "
                    f"{doc.get(key)!r}, this run has {want!r}); resume with the same run "
                    "id, config and schema, or start afresh without resume", code=2)
        if "synthesis" in doc["done"]:  # a finished run reopened, not a crash restart
            doc["reopened"] = int(doc.get("reopened", 0)) + 1
        else:
            doc["restarts"] = int(doc.get("restarts", 0)) + 1
        self.ckpt = doc
        self.resumed_from = list(doc["done"])
        self.rows = {str(p): int(n) for p, n in doc["rows"].items()}
        self.rho_party.update({str(p): float(v) for p, v in doc["rho_party"].items()})
        self.stage_s.update(doc.get("stage_s", {}))
        self.never_keyed = tuple(doc.get("never_keyed", ()))
        self.weights = {tuple(w["clique"]): float(w["weight"]) for w in doc.get("weights", [])}
        if "synthesis" in doc["done"]:
            # a finished run reopened (a workload update): the participants are new
            # processes with new keys, so a new secure-aggregation session
            self.reopened = True
            self.s = int(doc.get("session", 0)) + 1
            doc["session"] = self.s
            self.session = replace(self.session, session_id=f"{self.run_id}/{self.s}",
                                   graph_seed=np.random.default_rng(
                                       [self.cfg.seed, self.s]).bytes(16).hex())
            self.server = SecAggServer(self.session.secagg())
        elif doc.get("server") is not None:
            self.server.load_state_dict(doc["server"])
        self.bytes_naive, self.bytes_naive_direct = doc.get("bytes_naive", [0, 0])
        self.log.info("coordinator.resumed", done=self.resumed_from,
                      pending=sorted(doc["pending"]), restarts=doc["restarts"])

    def _save(self) -> None:
        """Write the checkpoint (atomically; arrays were written before, under names of
        their own)."""
        self.ckpt["rows"] = self.rows
        self.ckpt["rho_party"] = self.rho_party
        self.ckpt["stage_s"] = self.stage_s
        self.ckpt["never_keyed"] = list(self.never_keyed)
        atomic_write_json(self.ckpt_path, self.ckpt)

    def _done(self, stage: str) -> bool:
        return stage in self.ckpt["done"]

    def _sk(self, stage: str) -> str:
        """A per-session stage's checkpoint name (``keys``, ``keys:1``, ...)."""
        return stage if self.s == 0 else f"{stage}:{self.s}"

    def _mark(self, stage: str, *, server: bool = False) -> None:
        if stage not in self.ckpt["done"]:
            self.ckpt["done"].append(stage)
        if server:
            self.ckpt["server"] = self.server.state_dict()
        self._save()

    async def _crash_point(self, point: str) -> None:
        """A named point of the run reached (``schema@collected``, ``keys@collected``,
        ``keys@marked``, ``seeds:0@collected``, ``seeds:0@marked``,
        ``round:<name>@{planned,collected,unmask,revealed}``: the checkpoint boundaries):
        awaits the ``on_point`` observer, if any.
        The simulator's crash-recovery tests kill the process there
        (:mod:`sim.synth_faults`); the coordinator itself injects nothing."""
        if self.on_point is not None:
            await self.on_point(point)

    def _announce_resume(self, bus: Transport, stage: str) -> None:
        """Ask the participants to repeat their last message of ``stage`` (a resumed
        coordinator lost what arrived before it died)."""
        if self.resumed_from or self.ckpt["restarts"] or stage == "schema":
            # (``schema`` is also a roll call: participants that said hello before this
            # coordinator subscribed say it again now instead of at their next repeat)
            bus.publish_nowait(self.topics.resume, (), {"stage": stage})

    # ------------------------------------------------------------------ helpers
    def _stage(self, name: str) -> _StageTimer:
        return _StageTimer(self, name)

    def _write(self, name: str, doc: dict[str, Any]) -> None:
        self.stages_dir.mkdir(parents=True, exist_ok=True)
        (self.stages_dir / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))

    async def _collect(self, bus: Transport, topic: str, expect: set[str], timeout_s: float,
                       *, resume_stage: str | None = None) -> dict[str, Message]:
        """Messages on ``topic`` from each sender in ``expect`` (meta ``from``), until all
        came or ``timeout_s`` passed; a participant's error message ends the run.

        A resumed coordinator with ``resume_stage`` asks the missing senders to repeat
        that stage's message every :data:`RESUME_EVERY_S` seconds."""
        t = self.topics
        got: dict[str, Message] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        next_resume = loop.time()
        while set(got) != expect:
            if resume_stage is not None and loop.time() >= next_resume:
                self._announce_resume(bus, resume_stage)
                next_resume = loop.time() + RESUME_EVERY_S
            remaining = deadline - loop.time()
            if remaining <= 0:
                err = bus.try_next(t.error)
                if err is None:
                    break
                msg = err
            else:
                try:  # an error first when both are buffered
                    msg = await wait_any(bus, [t.error, topic], min(remaining, 0.25))
                except DeadlineExceeded:
                    continue
            if msg.topic == t.error:
                raise CoordinatorError(f"{msg.meta.get('from')}: {msg.meta.get('reason')}",
                                       code=int(msg.meta.get("code", 1)))
            sender = msg.meta.get("from")
            if sender in expect and sender not in got:
                got[sender] = msg
        return got

    # ------------------------------------------------------------------ the job
    async def run(self) -> dict[str, Any]:
        """Run every stage; returns the metrics (also written to ``OUT/metrics.json``).

        Raises:
            CoordinatorError: a stage failed (participants missing or failing, too few
                survivors for secure aggregation, ...); ``done`` with the reason has been
                broadcast.
        """
        t0 = time.perf_counter()
        t = self.topics
        async with open_bus(self.cfg, "coordinator", broker=self.broker,
                            security=self.security, connect=self.connect) as bus:
            await bus.subscribe_prefix(t.to(ROOT), limits=topic_limits(self.cfg))
            if self.resumed_from:
                self._save()  # the restart count
            try:
                await self._schema_stage(bus)
                rho_total, split = self._budget_stage()
                results = await self._measure(bus, split)
            except (CoordinatorError, SecAggError) as exc:
                reason = exc.reason if isinstance(exc, CoordinatorError) else str(exc)
                bus.publish_nowait(t.done, (), {"ok": False, "reason": reason})
                await asyncio.sleep(0.2)
                if isinstance(exc, CoordinatorError):
                    raise
                raise CoordinatorError(f"secure aggregation failed: {exc}") from exc
            bus.publish_nowait(t.done, (), {"ok": True})
            await asyncio.sleep(0.2)
            wire = self._wire_bytes()
        synthetic, fit = await self._synthesis_stage(results)
        quality = await self._quality_stage(synthetic)
        await self._report_updates(fit)
        metrics = self._metrics(rho_total, results, fit, quality, wire,
                                wall_s=time.perf_counter() - t0)
        (self.out / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
        return metrics

    def _schema_message(self) -> dict[str, Any]:
        return {"schema": self.schema.to_dict(), "session": self.session.to_meta()}

    async def _schema_stage(self, bus: Transport) -> None:
        t = self.topics
        if self._done(self._sk("schema")):
            # participants still saying hello when the last coordinator died get it now
            # (joined ones ignore it); repeated while the new connection settles
            for _ in range(3):
                bus.publish_nowait(t.schema, (), self._schema_message())
                await asyncio.sleep(0.5)
            return
        with self._stage("schema"):
            expect = set(self.parties) | set(self.tree.aggregators)
            got = await self._collect(bus, t.hello, expect, self.cfg.handshake_timeout_s,
                                      resume_stage="schema")
            rows_before = dict(self.rows)
            await self._crash_point("schema@collected")
            missing = sorted(expect - set(got))
            if missing:
                raise CoordinatorError(
                    f"{len(missing)} participant(s) never said hello within "
                    f"{self.cfg.handshake_timeout_s:.0f} s: {missing[:10]}", code=4)
            self.rows = {p: int(got[p].meta["rows"]) for p in self.parties}
            if min(self.rows.values()) < 1:
                empty = sorted(p for p, n in self.rows.items() if n < 1)
                raise CoordinatorError(f"parties without rows: {empty}", code=2)
            if self.reopened and rows_before and rows_before != self.rows:
                raise CoordinatorError("the parties of the reopened run hold other rows "
                                       f"than before: {rows_before} != {self.rows}", code=2)
            self._write("schema", {"schema": self.schema.to_dict(), "rows": self.rows,
                                   "fingerprint": self.schema.fingerprint(),
                                   "tree": self.tree.to_dict()})
            self._mark(self._sk("schema"))
            bus.publish_nowait(t.schema, (), self._schema_message())

    def _budget_stage(self) -> tuple[float, dict[str, float]]:
        with self._stage("budget"):
            cfg = self.cfg
            weights = cfg.mst_split if cfg.mechanism == "mst" else cfg.aim_split
            if cfg.private:
                rho = cdp_rho(cfg.epsilon, cfg.delta)
                r1, r2, r3 = allocate(rho * (1.0 - cfg.stream_rho_frac), list(weights))
                reserve = rho * cfg.stream_rho_frac
            else:
                rho, r1, r2, r3 = math.inf, math.inf, math.inf, math.inf
                reserve = math.inf
            if self.ckpt["stream_rho_left"] is None:
                self.ckpt["stream_rho_left"] = reserve
            split = {"one_way": r1, "select": r2,
                     ("tree" if cfg.mechanism == "mst" else "adaptive"): r3}
            self._write("budget", {"epsilon": cfg.epsilon, "delta": cfg.delta, "rho": rho,
                                   "split": split, "stream_reserve": reserve,
                                   "mechanism": cfg.mechanism,
                                   "conversion": "Canonne-Kamath-Steinke 2020 (tight)"})
            return rho, split

    async def _measure(self, bus: Transport, split: dict[str, float]) -> dict[str, _RoundResult]:
        """The mechanism's rounds, then any queued workload updates' rounds."""
        results = await self._measure_plan(bus, split)
        await self._workload_stage(bus, results)
        return results

    async def _workload_stage(self, bus: Transport, results: dict[str, _RoundResult]) -> None:
        """Apply queued workload updates (:mod:`synth.workload`): measure each update's
        marginals that no round measured yet, in a round of their own, with its share of
        the remaining stream reserve of ρ; weights apply to the fit. Each update is noted
        in the checkpoint before its round (so a restart measures it once)."""
        try:
            queued = pending_updates(self.out, self.schema.names)
        except WorkloadError as exc:
            self.log.warning("workload.refused", error=str(exc))
            queued = []
        if self.reopened:  # new party processes: the next plan carries the compression
            self._maps_sent = False
        for path, up in queued:
            rec = next((w for w in self.ckpt["workload"] if w["file"] == path.name), None)
            if rec is None:
                rec = self._plan_update(path.name, up, results)
                self.ckpt["workload"].append(rec)
                self._save()
            if rec["missing"] and rec["status"] == "planned":
                with self._stage(f"workload:{rec['name']}"):
                    t0 = time.perf_counter()
                    await self._seed_batch(bus, rec["batch"], [rec["round"]])
                    await self._wire_mark(f"seeds:{rec['batch']}")
                    results[rec["name"]] = await self._round(
                        bus, rec["round"], rec["name"], [tuple(c) for c in rec["missing"]],
                        rec["rho"])
                    rec["measure_s"] = time.perf_counter() - t0
            if rec["status"] == "planned":
                rec["status"] = "measured" if rec["missing"] else "nothing to measure"
                left = self.ckpt["stream_rho_left"]
                self.ckpt["stream_rho_left"] = max(0.0, left - rec["rho"])
            for c, w in up.weights.items():
                self.weights[c] = w
            self.ckpt["weights"] = [{"clique": list(c), "weight": w}
                                    for c, w in self.weights.items()]
            self._save()
            self.updates.append({**rec, "path": str(path)})
            self.log.info("workload.measured", update=rec["name"], missing=rec["missing"],
                          already=rec["already_measured"], rho=rec["rho"])

    def _plan_update(self, file: str, up: WorkloadUpdate,
                     results: dict[str, _RoundResult]) -> dict[str, Any]:
        """What an update measures: its marginals that no round measured (as a clique in
        any order), within ``max_cells``, with ``rho_share`` of the remaining reserve."""
        measured = {frozenset(c) for r in results.values() for c in r.plan.cliques}
        missing, already, refused = [], [], []
        for c in up.marginals:
            if frozenset(c) in measured:
                already.append(list(c))
            elif self.cdomain.size(c) > self.cfg.max_cells:
                refused.append({"clique": list(c), "cells": self.cdomain.size(c),
                                "reason": f"more than max_cells={self.cfg.max_cells}"})
            else:
                missing.append(list(c))
        left = float(self.ckpt["stream_rho_left"])
        rho = up.rho_share * left if missing else 0.0
        n = len(self.ckpt["workload"])
        r = 1 + max(res.plan.round for res in results.values())
        rec: dict[str, Any] = {
            "file": file, "name": f"wl{n}", "round": r, "batch": 1 + n + self.s,
            "requested": [list(c) for c in up.marginals], "missing": missing, "already_measured": already, "refused": refused,
            "weights": {",".join(c): w for c, w in up.weights.items()},
            "rho": rho, "rho_share": up.rho_share, "reserve_before": left,
            "status": "planned", "session": self.s}
        if not missing:
            rec["status"] = "nothing to measure" if not up.weights else "weights only"
        elif not rho > 0:
            rec["status"] = "refused"
            rec["reason"] = (
                "no stream reserve of rho: the run was made with synth.stream_rho_frac = 0 "
                "(set it > 0 before the run)" if self.cfg.stream_rho_frac == 0 else
                "the stream reserve of rho is used up by earlier updates")
            self.log.warning("workload.refused", update=rec["name"], reason=rec["reason"])
            rec["missing"] = []
        return rec

    async def _measure_plan(self, bus: Transport, split: dict[str, float]
                            ) -> dict[str, _RoundResult]:
        d = self.domain
        results: dict[str, _RoundResult] = {}
        await self._wire_mark("schema")
        await self._keys_stage(bus)
        await self._wire_mark(self._sk("keys"))
        n_rounds = 3 if self.cfg.mechanism == "mst" else 2 + self.cfg.aim_rounds
        await self._seed_batch(bus, 0, list(range(n_rounds)))  # every round of the run
        await self._wire_mark("seeds:0")
        one_way = [(a,) for a in d.attributes]
        results["one_way"] = await self._round(bus, 0, "one_way", one_way, split["one_way"])
        with self._stage("compress_domain"):
            ow_full = self._noisy(results["one_way"])
            self.maps = compress_supports(list(ow_full.values()))
            self.cdomain = compress_domain(d, self.maps)
            self.one_way_c = {c: NoisyMarginal(clique=c, values=compress_marginal(
                m.values, self.maps[c[0]]) if c[0] in self.maps else m.values, sigma=m.sigma)
                for c, m in ow_full.items()}
            for c, m in self.one_way_c.items():
                # a merged cell sums the noisy counts of the values merged into it
                merged = (np.bincount(self.maps[c[0]], minlength=m.values.shape[0])
                          if c[0] in self.maps else np.ones(m.values.shape[0]))
                self.known.append((c, m.values, m.sigma * np.sqrt(merged)))
            self._write("compress_domain", {
                "rule": "values with noisy 1-way count < 3 sigma merge (MST)",
                "sizes": dict(zip(d.attributes, d.sizes, strict=True)),
                "compressed": dict(zip(d.attributes, self.cdomain.sizes, strict=True)),
                "maps": {a: [int(x) for x in v] for a, v in self.maps.items()}})
        cd = self.cdomain
        pairs = candidate_pairs(cd, max_cells=self.cfg.max_cells)
        if len(pairs) < len(cd.attributes) - 1:
            self.log.warning("synth.pairs_refused", kept=len(pairs),
                             max_cells=self.cfg.max_cells)
        results["select"] = await self._round(bus, 1, "select", pairs, split["select"])
        tw = self._noisy(results["select"])
        self.known += [(c, m.values, np.full(m.values.shape[0], m.sigma))
                       for c, m in tw.items()]
        if self.cfg.mechanism == "aim":
            await self._aim_rounds(bus, results, tw, split["adaptive"])
            return results
        with self._stage("select_tree"):
            tree_pairs = mst_select(cd, {c[0]: m for c, m in self.one_way_c.items()},
                                    {(c[0], c[1]): m for c, m in tw.items()})
            self._write("select_tree", {"pairs": [list(p) for p in tree_pairs]})
        results["tree"] = await self._round(bus, 2, "tree", [tuple(p) for p in tree_pairs],
                                            split["tree"])
        return results

    async def _keys_stage(self, bus: Transport) -> None:
        """Once per session: collect the parties' public keys, send each its neighbours'."""
        t, server, s = self.topics, self.server, self.s
        if self._done(self._sk("keys")):  # the answers may not have left before the crash
            for p in server.keyed:
                meta, arr = pack_blobs({q: v.mask_public + v.enc_public
                                        for q, v in server.keys_for(p).items()})
                bus.publish_nowait(t.nk(s, p), [arr], meta)
            return
        with self._stage(self._sk("keys")):
            got = await self._collect(bus, t.pk(s), set(self.parties), self.cfg.round_timeout_s,
                                      resume_stage="keys")
            for p, msg in got.items():
                raw = np.ascontiguousarray(msg.arrays[0], dtype=np.uint8).tobytes()
                server.register_keys(PartyKeys(party=p, mask_public=raw[:32],
                                               enc_public=raw[32:]))
            answers = {p: pack_blobs({q: v.mask_public + v.enc_public
                                      for q, v in server.keys_for(p).items()})
                       for p in sorted(got)}
            await self._crash_point("keys@collected")
            self.never_keyed = tuple(sorted(set(self.parties) - set(got)))
            self._mark(self._sk("keys"), server=True)
            await self._crash_point("keys@marked")
            for p, (meta, arr) in answers.items():
                bus.publish_nowait(t.nk(s, p), [arr], meta)
            self._write(self._sk("keys").replace(":", "_"),
                        {"session": self.session.to_meta(), "keyed": sorted(got),
                                 "never_advertised": list(self.never_keyed)})
            if self.never_keyed:
                self.log.warning("synth.never_keyed", parties=list(self.never_keyed))

    async def _seed_batch(self, bus: Transport, b: int, rounds: list[int]) -> None:
        """Once per batch of rounds: every keyed party Shamir-shares a fresh self-mask seed
        per round of the batch with its neighbours, through the coordinator."""
        t, server = self.topics, self.server
        ids = [round_id(r) for r in rounds]
        stage = f"seeds:{b}"
        if self._done(stage):  # the answers may not have left before the crash
            for p in server.seeded(ids[0]):
                meta, arr = pack_blobs(server.seed_shares_for(ids, p))
                bus.publish_nowait(t.rs(b, p), [arr], meta)
            return
        with self._stage(stage):
            bus.publish_nowait(t.seeds, (), {"batch": b, "rounds": ids})
            got = await self._collect(bus, t.sh(b), set(server.keyed), self.cfg.round_timeout_s,
                                      resume_stage=stage)
            for p, msg in got.items():
                server.collect_seed_shares(ids, p, unpack_blobs(msg.meta, msg.arrays[0]))
            await self._crash_point(f"{stage}@collected")
            answers = {p: pack_blobs(server.seed_shares_for(ids, p)) for p in sorted(got)}
            self._write(f"seeds_{b}", {"rounds": ids, "seeded": sorted(got)})
            self._mark(stage, server=True)
            await self._crash_point(f"{stage}@marked")
            for p, (meta, arr) in answers.items():
                bus.publish_nowait(t.rs(b, p), [arr], meta)

    def _maps_update(self, r: int) -> dict[str, tuple[int, ...]] | None:
        """The plan's ``maps``: none in round 0, the compression in the first round after
        it, then None (unchanged: the parties keep it)."""
        if r == 0:
            return {}
        if self._maps_sent:
            return None
        self._maps_sent = True
        self._maps_round = r
        return {a: tuple(int(x) for x in v) for a, v in self.maps.items()}

    def _fit(self, ms: list[NoisyMarginal], total: float, iters: int | None,
             warm_start: Any = None) -> Any:
        """The engine fit to ``ms`` on the compressed domain (``iters``: 0/None = the
        engine's default). Workload weights (:mod:`synth.workload`) scale a marginal's
        weight in the fit as a noise std of ``sigma / sqrt(w)`` (weighted least squares);
        ``warm_start`` continues from an earlier model."""
        kw: dict[str, Any] = {}
        if iters:
            kw["iters" if self.engine == "mbi" else "steps"] = iters
        if self.engine in ("neural", "diffusion"):
            import torch

            torch.set_num_threads(self.cfg.engine_threads)
        if self.weights:
            ms = [NoisyMarginal(clique=m.clique, values=m.values,
                                sigma=m.sigma / math.sqrt(self.weights[tuple(sorted(m.clique))]))
                  if tuple(sorted(m.clique)) in self.weights else m for m in ms]
        return make_engine(self.engine, **kw).fit(self.cdomain, ms, total=total,
                                                  seed=self.cfg.seed, warm_start=warm_start)

    def _default_iters(self) -> int:
        return self.cfg.engine_iters or (1000 if self.engine == "mbi" else 1500)

    def _measurements(self, results: dict[str, _RoundResult]) -> list[NoisyMarginal]:
        """Every noisy aggregate marginal the engine gets: the compressed 1-way ones, the
        chosen cliques' (MST: the tree's; AIM: every adaptive round's), and the selection
        round's answers for the chosen cliques (they were measured there too: free extra
        information). MST also gets further all-pairs answers within ``mst_extra_mb``
        (:meth:`_extra_answers`); never all of them: a graphical model over all pairs is
        one clique of every attribute (Adult: 160 GB)."""
        ms = list(self.one_way_c.values())
        chosen: dict[tuple[str, ...], None] = {}
        for name, res in results.items():
            if name in ("one_way", "select"):
                continue
            for c, m in self._noisy(res).items():
                ms.append(m)
                chosen[c] = None
        if "select" in results:
            answers = self._noisy(results["select"])
            ms += [m for c, m in answers.items() if c in chosen]
            if self.cfg.mechanism == "mst" and self.cfg.mst_extra_mb > 0:
                ms += self._extra_answers(answers, list(chosen))
        return ms

    def _extra_answers(self, answers: dict[tuple[str, ...], NoisyMarginal],
                       chosen: list[tuple[str, ...]]) -> list[NoisyMarginal]:
        """MST with ``mst_extra_mb``: the selection round's answers of further pairs, best
        scored first (:func:`synth.select.pair_scores`), as long as the graphical model
        stays within ``mst_extra_mb`` (mbi's ``hypothetical_model_size``). They are paid
        for already, so this is post-processing; the neural engine gets none (its fit
        time grows with every marginal)."""
        if self.engine != "mbi":
            return []
        fits = self._model_size_check(self.cfg.mst_extra_mb)
        scores = pair_scores(self.cdomain, {c[0]: m for c, m in self.one_way_c.items()},
                             {(c[0], c[1]): m for c, m in answers.items()})
        base = list(chosen)
        out: list[NoisyMarginal] = []
        for pair, _ in sorted(scores.items(), key=lambda kv: -kv[1]):
            c = pair if pair in answers else (pair[1], pair[0])
            if c in chosen or c not in answers:
                continue
            if fits(base + [c]):
                base.append(c)
                out.append(answers[c])
        return out

    async def _aim_rounds(self, bus: Transport, results: dict[str, _RoundResult],
                          answers: dict[tuple[str, ...], NoisyMarginal], rho: float) -> None:
        """``aim``: adaptive rounds. Before each, fit the model to everything measured so
        far and pick the ``aim_batch`` pairs it explains worst, scored from the noisy
        all-pairs answers (:func:`synth.select.aim_select_batch`; post-processing, no
        budget); then measure them with this round's share of ρ."""
        cfg, cd = self.cfg, self.cdomain
        batch = cfg.aim_batch or math.ceil(len(cd.attributes) / 2)
        rho_round = rho / cfg.aim_rounds
        # the Gaussian std of the next round's cliques under replace-one (Δ₂ = √2)
        sigma_next = (math.sqrt(batch / rho_round) if math.isfinite(rho_round)
                      else 1.0)
        total = float(sum(self.rows.values()))
        fits = self._model_size_check(cfg.aim_max_model_mb)
        for j in range(cfg.aim_rounds):
            name = f"aim{j}"
            if name in self.ckpt["selects"]:  # chosen before a restart
                picks = [(tuple(c), float(sc)) for c, sc in self.ckpt["selects"][name]]
                if not picks:
                    break
                results[name] = await self._round(bus, 2 + j, name, [c for c, _ in picks],
                                                  rho_round)
                continue
            with self._stage(f"select:{name}"):
                ms = self._measurements(results)
                model = await asyncio.to_thread(self._fit, ms, total, 300)
                measured = [m.clique for m in ms]
                picks = aim_select_batch(
                    cd, list(answers), answers, model.marginal, sigma_next=sigma_next,
                    batch=batch, fits=(lambda extra, base=measured: fits(base + extra)))
                self._write(f"select_{name}", {"picks": [[list(c), sc] for c, sc in picks],
                                               "sigma_next": sigma_next})
                self.ckpt["selects"][name] = [[list(c), float(sc)] for c, sc in picks]
                self._save()
            if not picks:
                self.log.warning("synth.aim_no_candidate", round=name)
                break
            results[name] = await self._round(bus, 2 + j, name, [c for c, _ in picks],
                                              rho_round)

    def _model_size_check(self, limit_mb: float) -> Any:
        """``cliques -> bool``: the graphical model over them stays within ``limit_mb``
        (mbi's ``hypothetical_model_size``); always True for the neural engine, whose size
        does not grow with the cliques."""
        if self.engine != "mbi":
            return lambda cliques: True
        from mbi import Domain as MbiDomain
        from mbi.junction_tree import hypothetical_model_size

        mdom = MbiDomain(tuple(self.cdomain.attributes), tuple(self.cdomain.sizes))
        limit = limit_mb
        return lambda cliques: hypothetical_model_size(mdom, list(cliques)) <= limit

    def _noisy(self, res: _RoundResult) -> dict[tuple[str, ...], NoisyMarginal]:
        """The round's aggregate marginals as the engine gets them: estimates of the sums
        over ALL parties' rows, after dropout recovery (:meth:`_recover`; computed once
        per round, in round order)."""
        got = self._recovered.get(res.plan.name)
        if got is None:
            got = self._recovered[res.plan.name] = self._recover(res)
        return got

    def _recover(self, res: _RoundResult) -> dict[tuple[str, ...], NoisyMarginal]:
        """Dropout recovery of one round (:mod:`synth.cache`). The coordinator only ever
        sees the SUM over the round's survivors; the cache is aggregate-level (nobody may
        hold one party's noisy marginal under distributed noise). A clique whose earlier
        release covered every absent party (dropped or never keyed) gets their row share
        of the latest such release added ("cached"); any other clique of a round with
        absent parties is the survivors' sum rescaled to all rows ("survivors_only").
        Both are recorded in ``self.recovery`` (``metrics.json``: ``dropout_recovery``)
        and logged. The round's releases join the cache afterwards; round 0's 1-way
        releases join once the domain compression is known, compressed to it (the
        cache is keyed by cliques of the compressed domain). The engine gets one sigma
        per marginal: the largest per-cell one."""
        r, name = res.plan.round, res.plan.name
        if r > 0 and self._one_way_releases:
            self.cache = self.cache.add(*(self._compressed(rel)
                                          for rel in self._one_way_releases))
            self._one_way_releases = []
        raw = {c: (v, res.sigma) for c, v in split_marginals(res.values, res.plan).items()}
        rec = recover_round(self.cache, round=r, name=name, marginals=raw,
                            survivors=res.survivors, absent=(*res.dropped, *res.missing),
                            rows=self.rows)
        if r == 0:
            self._one_way_releases = rec.releases
        else:
            self.cache = self.cache.add(*rec.releases)
        self.recovery["cached"] += rec.cached
        self.recovery["survivors_only"] += rec.survivors_only
        if rec.cached or rec.survivors_only:
            self.log.warning("synth.dropout_recovery", round=name,
                             cached=[(e["clique"], e["from_round"], e["staleness_rounds"])
                                     for e in rec.cached],
                             survivors_only=[e["clique"] for e in rec.survivors_only],
                             coverage_rows=rec.coverage_rows, rows=rec.rows)
        # a noiseless run (epsilon = inf) measures exactly (sigma 0); the engines weight
        # measurements by 1/sigma, so exact ones get a tiny common sigma: equal weights
        return {c: NoisyMarginal(clique=c, values=e.values,
                                 sigma=max(float(e.sigma.max()), NOISELESS_SIGMA))
                for c, e in rec.estimates.items()}

    def _compressed(self, rel: Release) -> Release:
        """A round-0 1-way release on the compressed domain (merged cells sum their
        counts and noise variances)."""
        m = self.maps.get(rel.clique[0])
        if m is None:
            return rel
        n = int(m.max()) + 1
        return Release(round=rel.round, name=rel.name, clique=rel.clique,
                       values=compress_marginal(rel.values, m),
                       sigma=np.sqrt(np.bincount(m, weights=rel.sigma ** 2, minlength=n)),
                       parties=rel.parties, rows=rel.rows)

    def _note_maps(self, plan: RoundPlan) -> None:
        """Replay :meth:`_maps_update`'s bookkeeping for a plan from the checkpoint."""
        if plan.round > 0 and plan.maps is not None:
            self._maps_sent, self._maps_round = True, plan.round

    def _plan_from_ckpt(self, doc: dict[str, Any], npz: dict[str, np.ndarray]) -> RoundPlan:
        n = int(doc["n_arrays"])
        plan = RoundPlan.from_message(doc["plan"], [npz[f"a{i}"] for i in range(n)])
        self._note_maps(plan)
        return plan

    def _save_pending(self, name: str, plan: RoundPlan, lo: np.ndarray) -> None:
        """Write-ahead: the plan of a round about to be published (a resumed coordinator
        re-publishes exactly this plan, so no party measures the round twice)."""
        meta, arrays = plan.to_message()
        f = self.ckpt_dir / f"pending_{name}.npz"
        atomic_save_npz(f, lo=lo, **{f"a{i}": a for i, a in enumerate(arrays)})
        self.ckpt["pending"][name] = {"plan": meta, "n_arrays": len(arrays), "file": f.name}
        self._save()

    def _save_result(self, name: str, res: _RoundResult) -> None:
        meta, arrays = res.plan.to_message()
        f = self.ckpt_dir / f"result_{name}.npz"
        atomic_save_npz(f, values=res.values, **{f"a{i}": a for i, a in enumerate(arrays)})
        self.ckpt["results"][name] = {
            "plan": meta, "n_arrays": len(arrays), "file": f.name, "sigma": res.sigma,
            "survivors": list(res.survivors), "dropped": list(res.dropped),
            "missing": list(res.missing), "seconds": res.seconds}
        self.ckpt["pending"].pop(name, None)
        self.ckpt["bytes_naive"] = [self.bytes_naive, self.bytes_naive_direct]
        self._mark(f"round:{name}")

    def _load_result(self, name: str) -> _RoundResult:
        doc = self.ckpt["results"][name]
        npz = load_npz(self.ckpt_dir / doc["file"])
        return _RoundResult(plan=self._plan_from_ckpt(doc, npz), values=npz["values"],
                            sigma=float(doc["sigma"]), survivors=tuple(doc["survivors"]),
                            dropped=tuple(doc["dropped"]), missing=tuple(doc["missing"]),
                            seconds=float(doc["seconds"]))

    async def _round(self, bus: Transport, r: int, name: str, cliques: list[tuple[str, ...]],
                     rho: float) -> _RoundResult:
        res = await self._round_stage(bus, r, name, cliques, rho)
        await self._wire_mark(f"round:{name}")
        return res

    async def _round_stage(self, bus: Transport, r: int, name: str,
                           cliques: list[tuple[str, ...]], rho: float) -> _RoundResult:
        stage = f"round:{name}"
        if name in self.ckpt["results"]:  # finished before a restart
            return self._load_result(name)
        with self._stage(stage):
            cfg = self.cfg
            t0 = time.perf_counter()
            k = len(self.parties)
            server = self.server
            pending = self.ckpt["pending"].get(name)
            if pending is not None:  # published before a restart: the same plan again
                npz = load_npz(self.ckpt_dir / pending["file"])
                plan, lo = self._plan_from_ckpt(pending, npz), npz["lo"]
                self.log.info("coordinator.round_replayed", round=name)
                seeded = server.seeded(plan.round_id)
                return await self._run_round(bus, plan, lo, seeded, t0)
            dom = self.cdomain if r > 0 else self.domain
            sizes = tuple(dom.size(c) for c in cliques)
            k = len(self.session.party_ids)  # the parties of the session (all said hello)
            try:
                s_min = resolve_min_survivors(cfg.min_survivors, k)
                rho_clique = rho / len(cliques) if math.isfinite(rho) else 0.0
                # the noise each party will add by its own rules (synth.plancheck)
                mu = party_mu(rho_clique, s_min, model=cfg.noise_model) if rho_clique else 0.0
            except SkellamAccountingError as exc:
                raise CoordinatorError(f"round {name}: {exc}", code=2) from None
            sigma2 = 2.0 * mu * (1 if cfg.noise_model == "local" else s_min)
            shape = dict(zip(dom.attributes, dom.sizes, strict=True))
            upper = cell_upper_bounds(cliques, shape, self.known if r > 0 else [],
                                      float(sum(self.rows.values())))
            try:
                lo, widths = cell_windows(upper, sigma_sum=math.sqrt(2.0 * mu * k),
                                          uniform=cfg.ring == "uniform", max_bits=cfg.bits)
            except ValueError as exc:
                raise CoordinatorError(f"round {name}: {exc}", code=2) from None
            plan = RoundPlan(round=r, name=name, cliques=tuple(cliques), sizes=sizes,
                             sigma2_central=sigma2, noise_model=cfg.noise_model, n_parties=k,
                             step=1.0, cell_bits=widths.tobytes(),
                             timeout_s=cfg.round_timeout_s,
                             maps=self._maps_update(r), maps_round=self._maps_round,
                             rho=rho_clique, min_survivors=s_min)
            seeded = server.seeded(plan.round_id)
            for p in seeded:  # a party spends len(cliques)·rho when it measures the round
                self.rho_party[p] += len(cliques) * rho_clique
            self._save_pending(name, plan, lo)
            return await self._run_round(bus, plan, lo, seeded, t0)

    async def _run_round(self, bus: Transport, plan: RoundPlan, lo: np.ndarray,
                         seeded: tuple[str, ...], t0: float) -> _RoundResult:
        """Publish ``plan`` and aggregate its round (stages 3-4), then checkpoint it."""
        cfg, t, server, r = self.cfg, self.topics, self.server, plan.round
        name, cliques, sizes = plan.name, plan.cliques, plan.sizes
        sigma2 = plan.sigma2_central
        spec = plan.spec()
        meta, arrays = plan.to_message()
        bus.publish_nowait(t.plan, arrays, meta)
        await self._crash_point(f"round:{name}@planned")
        timeout = cfg.round_timeout_s
        missing = tuple(sorted(set(self.parties) - set(seeded)))
        # stage 3: masked sums from the tree's top level
        top = set(self.tree.children[ROOT])
        wait = (1 + len(self.tree.levels)) * timeout + 10.0
        sums = await self._collect(bus, t.up(r, ROOT), top, wait)
        await self._crash_point(f"round:{name}@collected")
        for msg in sums.values():
            server.collect_masked_sum(spec, msg.meta.get("ids", []), array_to_words(
                msg.arrays[0], plan.widths, plan.vector_len))
        survivors, dropped = server.unmask_request(plan.round_id)
        if len(survivors) < plan.min_survivors:
            # the parties refuse to reveal (synth.mechanism.check_survivors): a smaller sum
            # would carry less noise than they were charged for
            raise CoordinatorError(
                f"round {name}: {len(survivors)} survivor(s) < min_survivors = "
                f"{plan.min_survivors}; the round cannot be released", code=1)
        bus.publish_nowait(t.unmask(r), (), {"survivors": list(survivors),
                                             "dropped": list(dropped)})
        await self._crash_point(f"round:{name}@unmask")
        # stage 4: reveal and unmask
        if cfg.unmask == "tree":
            total = await self._unmask_tree(bus, plan, survivors, dropped)
        else:
            total = await self._unmask_root(bus, plan, survivors, dropped)
        await self._crash_point(f"round:{name}@revealed")
        values = decode_sum(total, lo, plan)
        sigma = aggregate_sigma(plan, len(survivors))
        # naive: the same marginals as float32 over the same tree, without masking,
        # quantisation or key exchange (each party, then each aggregator that forwards)
        alive = set(survivors)
        forwards = sum(1 for a in self.tree.aggregators
                       if alive.intersection(self.tree.parties_under(a)))
        self.bytes_naive += 4 * plan.vector_len * (len(survivors) + forwards)
        self.bytes_naive_direct += 4 * plan.vector_len * len(survivors)
        res = _RoundResult(plan=plan, values=values, sigma=sigma, survivors=survivors,
                           dropped=dropped, missing=missing,
                           seconds=time.perf_counter() - t0)
        self.stages_dir.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(self.stages_dir / f"round_{name}.npz", values=values)
        self._write(f"round_{name}", {
            "round": r, "cliques": [list(c) for c in cliques], "sizes": list(sizes),
            "sigma2_central": sigma2, "sigma_party": math.sqrt(party_sigma2(plan)),
            "aggregate_sigma": sigma, "rho_per_clique": plan.rho,
            "min_survivors": plan.min_survivors,
            "ring_bits_max": plan.ring_bits, "ring_bits_mean": float(plan.widths.mean()),
            "ring": cfg.ring, "degree": self.session.degree,
            "threshold": server.config.t,
            "survivors": list(survivors), "dropped": list(dropped),
            "never_advertised": list(missing), "seconds": res.seconds})
        if dropped or missing:
            self.log.warning("synth.round_dropouts", round=r, dropped=list(dropped),
                             missing=list(missing))
        # a dropped party's masked sum never reached the aggregate: it measured nothing
        # that was released (a party that dies mid-run), so the plan's charge is taken
        # back and the count agrees with its own ledger (which records a release before
        # it is sent; a release lost in transit shows as ledger > count: ledger_agrees)
        for p in dropped:
            self.rho_party[p] -= len(cliques) * plan.rho
        self._save_result(name, res)
        return res

    async def _unmask_root(self, bus: Transport, plan: RoundPlan, survivors: tuple[str, ...],
                           dropped: tuple[str, ...]) -> np.ndarray:
        """Stage 4 at the root (``unmask = "root"``, SecAgg+ as published): every survivor
        sends the coordinator its seed shares of surviving owners and its round keys with
        dropped partners; :meth:`synth.secagg.SecAggServer.unmask`. No aggregator learns
        any seed; the root's work grows with K."""
        t, r, server = self.topics, plan.round, self.server
        got_rv = await self._collect(bus, t.rv(r), set(survivors), self.cfg.round_timeout_s)
        shares: dict[str, dict[str, RevealedShare]] = {}
        for holder, msg in got_rv.items():
            raw = np.ascontiguousarray(msg.arrays[0], dtype=np.uint8).tobytes()
            layout = server.reveal_layout(plan.round_id, holder, survivors, dropped)
            nbytes = [SHARE_BYTES if kind == "seed" else 32 for _, kind in layout]
            if sum(nbytes) != len(raw):
                self.log.warning("synth.bad_reveal", holder=holder, got=len(raw),
                                 expected=sum(nbytes))
                continue  # the others' shares may still suffice
            got: dict[str, RevealedShare] = {}
            at = 0
            for (owner, kind), n in zip(layout, nbytes, strict=True):
                got[owner] = RevealedShare(owner=owner, holder=holder, kind=kind,
                                           x=server.config.index[holder],
                                           y=int.from_bytes(raw[at:at + n], "big"))
                at += n
            shares[holder] = got
        return server.unmask(plan.round_id, survivors, dropped, shares)

    async def _unmask_tree(self, bus: Transport, plan: RoundPlan, survivors: tuple[str, ...],
                           dropped: tuple[str, ...]) -> np.ndarray:
        """Stage 4 at the root: the self-mask sums of the tree's top level (the leaf
        aggregators recovered their children's seeds) and the round keys of the dropped
        parties' surviving partners; :meth:`synth.secagg.SecAggServer.unmask_tree`. The
        root's work grows with the fan-out and the dropouts, not with K."""
        t, r, server, timeout = self.topics, plan.round, self.server, self.cfg.round_timeout_s
        top = set(self.tree.children[ROOT])
        got_sm = await self._collect(bus, t.sm(r, ROOT), top,
                                     (1 + len(self.tree.levels)) * timeout + 10.0)
        self_masks = [(msg.meta.get("ids", []), array_to_words(
            msg.arrays[0], plan.widths, plan.vector_len)) for msg in got_sm.values()]
        holders = set(server.pair_holders(plan.round_id, survivors, dropped))
        got_rv = await self._collect(bus, t.rv(r), holders, timeout) if holders else {}
        keys: dict[str, dict[str, RevealedShare]] = {}
        for holder, msg in got_rv.items():
            raw = np.ascontiguousarray(msg.arrays[0], dtype=np.uint8).tobytes()
            owners = [o for o, kind in server.reveal_layout(plan.round_id, holder, survivors,
                                                            dropped) if kind == "pair"]
            if 32 * len(owners) != len(raw):
                self.log.warning("synth.bad_reveal", holder=holder, got=len(raw),
                                 expected=32 * len(owners))
                continue
            keys[holder] = {o: RevealedShare(owner=o, holder=holder, kind="pair",
                                             x=server.config.index[holder],
                                             y=int.from_bytes(raw[32 * j:32 * j + 32], "big"))
                            for j, o in enumerate(owners)}
        return server.unmask_tree(plan.round_id, survivors, dropped, self_masks, keys)

    async def _wire_mark(self, stage: str) -> None:
        """Note the broker's byte count for this run after ``stage`` (the split of the
        wire bytes into fixed and per-round traffic; nothing in process)."""
        if self.connect is None:
            self.wire_marks.append((stage, await asyncio.to_thread(self._wire_bytes)))

    def _wire_split(self, wire: int | None) -> dict[str, Any]:
        """``bytes_wire_by_stage`` (bytes forwarded between the previous mark and the end
        of each stage), ``bytes_wire_fixed`` (schema and hellos, keys, seed shares: paid
        once per run or batch of rounds), ``bytes_wire_rounds`` (the rounds: plans, masked
        sums, unmasking) and ``bytes_wire_other`` (the rest: the end of the run); Nones
        in process or after a restart (the counts before it are another process's)."""
        none = {"bytes_wire_by_stage": None, "bytes_wire_fixed": None,
                "bytes_wire_rounds": None, "bytes_wire_other": None}
        marks = self.wire_marks
        if (wire is None or not marks or any(b is None for _, b in marks)
                or self.resumed_from or self.ckpt["restarts"]):
            return none
        by: dict[str, int] = {}
        prev = 0
        for stage, b in marks:
            by[stage] = by.get(stage, 0) + int(b) - prev
            prev = int(b)
        rounds = sum(v for k, v in by.items() if k.startswith("round:"))
        fixed = sum(by.values()) - rounds
        return {"bytes_wire_by_stage": by, "bytes_wire_fixed": fixed,
                "bytes_wire_rounds": rounds, "bytes_wire_other": int(wire) - prev}

    def _wire_bytes(self) -> int | None:
        """Bytes the broker forwarded for this run (every hop, every message), or None (in
        process: no broker counts them)."""
        if self.connect is not None:
            return None
        try:
            st = control_request(self.broker, "stats", timeout_s=2.0, security=self.security)
        except Exception as exc:  # noqa: BLE001 - a missing figure, not a failed run
            self.log.warning("synth.no_broker_stats", error=str(exc))
            return None
        stats = st.get("stats", st)
        return int(stats.get("namespace_bytes", {}).get(f"ff/{self.run_id}", 0))

    async def _synthesis_stage(self, results: dict[str, _RoundResult]
                               ) -> tuple[pd.DataFrame, dict[str, Any]]:
        with self._stage("synthesis"):
            cfg = self.cfg
            ms = self._measurements(results)
            total = float(sum(self.rows.values()))  # dropout recovery covers all rows
            n = cfg.synthetic_rows or int(sum(self.rows.values()))
            warm, iters, before = None, cfg.engine_iters, None
            saved = self.ckpt.get("model")
            prev = self.stages_dir / "synthetic_codes.npy"
            incremental = self.reopened and bool(self.updates) and prev.exists()
            if incremental:
                before = np.load(prev)
            if incremental and cfg.stream_refit == "gum":
                return await self._gum_stage(ms, before, n, total)
            if incremental and saved:  # warm: the engine continues from the saved model
                warm = load_warm_start(self.cdomain, saved["meta"],
                                       load_npz(self.ckpt_dir / saved["file"]))
                iters = cfg.stream_iters or max(1, self._default_iters() // 8)

            def fit_and_sample(warm_start: Any, it: int | None
                               ) -> tuple[Any, np.ndarray, pd.DataFrame, float]:
                t0 = time.perf_counter()
                model = self._fit(ms, total, it, warm_start)
                rng = np.random.default_rng([cfg.seed, 7])
                codes = uncompress_codes(np.asarray(model.sample(n, rng), dtype=np.int32),
                                         self.domain, self.maps, rng)
                return model, codes, decode(codes, self.schema, rng), time.perf_counter() - t0

            compile_s = None
            if warm is not None and cfg.stream_compare_full:
                # both refits timed hot: the engine's one-off compilation of the new
                # cliques (JAX, for mbi) is paid here, untimed in either
                t0 = time.perf_counter()
                await asyncio.to_thread(self._fit, ms, total, 1, warm)
                compile_s = time.perf_counter() - t0
            model, codes, frame, fit_s = await asyncio.to_thread(fit_and_sample, warm, iters)
            full: dict[str, Any] | None = None
            if warm is not None and cfg.stream_compare_full:  # the baseline: from scratch
                _, fcodes, _, full_s = await asyncio.to_thread(fit_and_sample, None,
                                                               cfg.engine_iters)
                full = {"fit_s": full_s, "codes": fcodes, "iters": self._default_iters(),
                        "compile_s": compile_s}
            frame.to_csv(self.out / "synthetic.csv", index=False)
            np.save(self.stages_dir / "synthetic_codes.npy", codes)
            meta, arrays = model_state(model)
            atomic_save_npz(self.ckpt_dir / "model.npz", **arrays)
            # the compression the model was fitted on: what synth.saved needs to sample
            self.ckpt["model"] = {"file": "model.npz", "meta": meta,
                                  "maps": {a: [int(x) for x in v] for a, v in self.maps.items()}}
            self._mark("synthesis")
            fitted = list(dict.fromkeys(m.clique for m in ms if len(m.clique) > 1))
            fit = {"engine": self.engine, "fit_s": fit_s, "rows": n, "total": total,
                   "measurements": len(ms), "cliques": [list(c) for c in fitted],
                   "incremental": warm is not None,
                   "refit": "warm" if warm is not None else "full",
                   "iters": iters or self._default_iters()}
            self._write("synthesis", fit)
            return frame, {**fit, "codes": codes, "codes_before": before, "full": full}

    async def _gum_stage(self, ms: list[NoisyMarginal], before: np.ndarray, n: int,
                         total: float) -> tuple[pd.DataFrame, dict[str, Any]]:
        """Incremental refit with ``stream_refit = "gum"`` (:mod:`synth.gum`): the
        current synthetic records, on the compressed domain, moved until their marginals
        match the update's new noisy marginals, while every earlier clique that shares an
        attribute with them keeps the marginal the records have now (what the model
        learnt; its noisy answers would pull the records back to their noise). A record
        keeps its original value of an attribute it was not moved in. The saved model is
        left as it is."""
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, 8, self.s])

        def update() -> tuple[np.ndarray, pd.DataFrame, float]:
            t0 = time.perf_counter()
            maps = {a: np.asarray(v) for a, v in self.maps.items()}
            _, cold = compress_codes(before, self.domain, maps)
            new = {frozenset(c) for u in self.updates for c in u["missing"]}
            targets = [self._shrunk(m, cold, total) for m in ms if frozenset(m.clique) in new]
            touched = set().union(*new) if new else set()
            keep = dict.fromkeys(m.clique for m in ms if frozenset(m.clique) not in new
                                 and touched.intersection(m.clique))
            targets += [NoisyMarginal(clique=c, values=marginals(cold, self.cdomain, [c])[c]
                                      .ravel().astype(np.float64), sigma=1.0) for c in keep]
            cnew = gum_update(cold, self.cdomain, targets, passes=cfg.stream_iters or 20,
                              seed=cfg.seed)
            drawn = uncompress_codes(cnew, self.domain, maps, rng)
            codes = np.array(before, dtype=np.int32, copy=True)
            moved = cnew != cold
            codes[moved] = drawn[moved]
            return codes, decode(codes, self.schema, rng), time.perf_counter() - t0

        codes, frame, fit_s = await asyncio.to_thread(update)
        full: dict[str, Any] | None = None
        if cfg.stream_compare_full:  # the baseline: the engine from scratch

            def refit() -> tuple[np.ndarray, float]:
                t0 = time.perf_counter()
                model = self._fit(ms, total, cfg.engine_iters)
                r = np.random.default_rng([cfg.seed, 7])
                c = uncompress_codes(np.asarray(model.sample(n, r), dtype=np.int32),
                                     self.domain, self.maps, r)
                return c, time.perf_counter() - t0

            fcodes, full_s = await asyncio.to_thread(refit)
            full = {"fit_s": full_s, "codes": fcodes, "iters": self._default_iters(),
                    "compile_s": None}
        frame.to_csv(self.out / "synthetic.csv", index=False)
        np.save(self.stages_dir / "synthetic_codes.npy", codes)
        self._mark("synthesis")
        fit = {"engine": self.engine, "fit_s": fit_s, "rows": int(codes.shape[0]),
               "total": total, "measurements": len(ms), "incremental": True,
               "refit": "gum", "iters": cfg.stream_iters or 20,
               "cliques": [list(c) for c in dict.fromkeys(m.clique for m in ms
                                                          if len(m.clique) > 1)]}
        self._write("synthesis", fit)
        return frame, {**fit, "codes": codes, "codes_before": before, "full": full}

    def _shrunk(self, m: NoisyMarginal, codes: np.ndarray, total: float) -> NoisyMarginal:
        """The target of a new marginal for :mod:`synth.gum`: the noisy counts shrunk
        towards the current records' counts by the empirical-Bayes factor
        ``s² / (s² + σ²)``, where ``s²`` (the records' squared error per cell) is estimated
        as the mean squared difference less the noise variance σ². Where the records
        already agree with the measurement up to its noise, the target stays near them;
        where they are far off, it follows the measurement. Post-processing."""
        n = codes.shape[0]
        cur = marginals(codes, self.cdomain, [m.clique])[m.clique].ravel().astype(np.float64)
        scale = n / total if total > 0 else 1.0
        y = np.asarray(m.values, dtype=np.float64) * scale
        var = (m.sigma * scale) ** 2
        d = y - cur
        s2 = max(float(np.mean(d * d)) - var, 0.0)
        lam = s2 / (s2 + var) if s2 + var > 0 else 1.0
        return NoisyMarginal(clique=m.clique, values=cur + lam * d, sigma=m.sigma)

    async def _report_updates(self, fit: dict[str, Any]) -> None:
        """Per workload update applied by this coordinator: the total variation distance
        on its marginals before (the previous synthetic data) and after (the new), the
        incremental refit's seconds and, with ``stream_compare_full``, a from-scratch
        refit's seconds and distance; the update moves to ``workload/applied/``."""
        if not self.updates:
            return
        from synth.quality import workload_tv

        real = (None if self.eval_data is None else await asyncio.to_thread(
            encode, self.eval_data.train[list(self.schema.names)], self.schema))

        def tv(codes: np.ndarray | None, wl: list[tuple[str, ...]]) -> float | None:
            if codes is None or real is None or not wl:
                return None
            return float(workload_tv(real, codes, self.domain, wl,
                                     max_cells=self.cfg.max_cells)["avg_tv"])

        full = fit.get("full")
        for u in self.updates:
            wl = [tuple(c) for c in u["requested"]]
            report = {
                "name": u["name"], "status": u["status"], "reason": u.get("reason"),
                "requested": u["requested"], "missing": u["missing"],
                "already_measured": u["already_measured"], "refused": u["refused"],
                "rho": u["rho"], "measure_s": u.get("measure_s", 0.0),
                "incremental_refit": bool(fit.get("incremental")),
                "refit": fit.get("refit"),
                "refit_s": fit["fit_s"], "refit_iters": fit["iters"],
                "tv_before": await asyncio.to_thread(tv, fit.get("codes_before"), wl),
                "tv_after": await asyncio.to_thread(tv, fit["codes"], wl),
            }
            if full is not None:
                report["full_refit_s"] = full["fit_s"]
                report["full_refit_iters"] = full["iters"]
                report["compile_s"] = full["compile_s"]
                report["tv_after_full_refit"] = await asyncio.to_thread(tv, full["codes"], wl)
                report["refit_time_ratio"] = fit["fit_s"] / full["fit_s"]
            u["report"] = report
            mark_applied(self.out, Path(u["path"]), report)
            self.log.info("workload.applied", **{k: v for k, v in report.items()
                                                  if k in ("name", "tv_before", "tv_after",
                                                           "refit_s")})

    async def _quality_stage(self, synthetic: pd.DataFrame) -> dict[str, Any]:
        with self._stage("quality"):
            if self.eval_data is None:
                doc: dict[str, Any] = {"skipped": "no evaluation data (deployed coordinator)"}
                self._write("quality", doc)
                return doc
            from synth.quality import all_k_way, ml_utility, workload_tv

            ev, cfg = self.eval_data, self.cfg

            def score() -> dict[str, Any]:
                real = encode(ev.train[list(self.schema.names)], self.schema)
                syn = encode(synthetic[list(self.schema.names)], self.schema)
                wl = all_k_way(self.domain, min(cfg.workload_k, len(self.domain)))
                tv = workload_tv(real, syn, self.domain, wl, max_cells=cfg.max_cells)
                out: dict[str, Any] = {"avg_tv": tv["avg_tv"], "max_tv": tv["max_tv"],
                                       "avg_l1": tv["avg_l1"], "workload_error": tv["avg_l1"],
                                       "n_workload": tv["n_marginals"],
                                       "workload": f"all {cfg.workload_k}-way marginals"}
                if cfg.label and self.reopened:
                    # a workload update adds marginal queries; the classifiers are not
                    # trained again: the figure is the last full synthesis's
                    prev = read_json(self.stages_dir / "quality.json") or {}
                    if prev.get("ml_utility") is not None:
                        out["ml_utility"] = prev["ml_utility"]
                        out["ml_utility_from"] = "the synthesis before the workload update"
                    else:
                        out["ml_utility_skipped"] = prev.get(
                            "ml_utility_skipped", "not computed before the workload update")
                elif cfg.label:
                    try:
                        out["ml_utility"] = ml_utility(ev.train, synthetic, ev.holdout,
                                                       cfg.label, random_state=cfg.seed,
                                                       threads=cfg.engine_threads)
                    except ValueError as exc:  # e.g. a label that is not binary
                        out["ml_utility_skipped"] = str(exc)
                        self.log.warning("synth.ml_utility_skipped", error=str(exc))
                else:
                    out["ml_utility_skipped"] = "no label column (set synth.label)"
                return out

            doc = await asyncio.to_thread(score)
            self._write("quality", doc)
            return doc

    def _metrics(self, rho_total: float, results: dict[str, _RoundResult],
                 fit: dict[str, Any], quality: dict[str, Any], wire: int | None, *,
                 wall_s: float) -> dict[str, Any]:
        cfg = self.cfg
        rounds = {name: {"cells": r.plan.vector_len, "cliques": len(r.plan.cliques),
                         "survivors": len(r.survivors), "dropped": list(r.dropped),
                         "never_advertised": list(r.missing), "aggregate_sigma": r.sigma,
                         "rho_per_clique": r.plan.rho, "min_survivors": r.plan.min_survivors,
                         "ring_bits_max": r.plan.ring_bits,
                         "ring_bits_mean": float(r.plan.widths.mean()),
                         "coverage_rows": sum(self.rows[p] for p in r.survivors),
                         "seconds": r.seconds}
                  for name, r in results.items()}
        spent = {p: v for p, v in self.rho_party.items()}
        eps_spent = {p: (cdp_epsilon(v, cfg.delta) if v > 0 and math.isfinite(v) else
                         (0.0 if v == 0 else math.inf)) for p, v in spent.items()}
        return {
            "dataset": cfg.dataset, "parties": cfg.parties, "mechanism": cfg.mechanism,
            "engine": self.engine, "noise_model": cfg.noise_model,
            "epsilon": cfg.epsilon, "delta": cfg.delta, "rho": rho_total,
            "rho_spent": spent, "epsilon_spent": eps_spent,
            "avg_tv": quality.get("avg_tv"), "max_tv": quality.get("max_tv"),
            "avg_l1": quality.get("avg_l1"), "workload_error": quality.get("workload_error"),
            "n_workload": quality.get("n_workload"), "workload": quality.get("workload"),
            "ml_utility": quality.get("ml_utility"),
            "ml_utility_skipped": quality.get("ml_utility_skipped"),
            "bytes_wire": wire, "bytes_naive": self.bytes_naive,
            "bytes_naive_direct": self.bytes_naive_direct, **self._wire_split(wire),
            "wire_vs_naive": (wire / self.bytes_naive) if wire and self.bytes_naive else None,
            "bits": cfg.bits or "no cap", "ring": cfg.ring,
            "min_survivors": resolve_min_survivors(cfg.min_survivors, len(self.parties)),
            "dp": dp_statement(cfg), "fanout": cfg.fanout, "tree_levels": len(self.tree.levels),
            "compressed_domain": dict(zip(self.domain.attributes, self.cdomain.sizes,
                                          strict=True)),
            "rounds": rounds,
            "dropout_recovery": self.recovery,
            "tree_pairs": ([list(c) for c in results["tree"].plan.cliques]
                           if "tree" in results else None),
            "fitted_cliques": fit.get("cliques"),
            "synthesis": {k: v for k, v in fit.items() if k != "codes"},
            "stage_s": self.stage_s, "wall_s": wall_s, "run_id": self.run_id,
            "restarts": int(self.ckpt["restarts"]),
            "reopened": int(self.ckpt.get("reopened", 0)),
            "session": self.s,
            "stream_rho_left": self.ckpt["stream_rho_left"],
            "workload_updates": [u.get("report", u) for u in self.updates],
            "resumed_after": self.resumed_from,
            "stage_cpu_s": self.stage_cpu_s, **_cpu_figures(self.stage_cpu_s),
            "rows": self.rows, "config": to_mapping(cfg),
        }


class _StageTimer:
    """``with coordinator._stage("name"):`` logs ``stage.started`` / ``stage.done`` /
    ``stage.failed`` and records the stage's seconds."""

    def __init__(self, owner: Coordinator, name: str) -> None:
        self.owner = owner
        self.name = name
        self.t0 = 0.0
        self.c0 = 0.0

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.owner.log.info("stage.started", stage=self.name)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = time.perf_counter() - self.t0
        self.owner.stage_s[self.name] = s
        self.owner.stage_cpu_s[self.name] = time.process_time() - self.c0
        if exc is None:
            self.owner.log.info("stage.done", stage=self.name, seconds=round(s, 3))
        else:
            self.owner.log.warning("stage.failed", stage=self.name, seconds=round(s, 3),
                                   error=str(exc))


def _cpu_figures(stage_cpu_s: dict[str, float]) -> dict[str, Any]:
    """The coordinator's aggregation-stage CPU (the ``round:*`` stages: plan, collect the
    top-level masked sums and the reveals, unmask, decode; not keys, synthesis or quality),
    per round, and the process's peak RSS so far (bytes)."""
    from synth.netutil import peak_rss_bytes

    rounds = [v for k, v in stage_cpu_s.items() if k.startswith("round:")]
    return {"aggregation_cpu_s": sum(rounds),
            "aggregation_cpu_s_per_round": sum(rounds) / len(rounds) if rounds else None,
            "peak_rss_bytes": peak_rss_bytes()}


__all__ = ["Coordinator", "CoordinatorError", "EvalData"]
