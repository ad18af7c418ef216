"""The state one run's coordinator stages share (:class:`RunContext`).

The run's fixed settings (config, schema, topics, run directory, aggregation tree), its
checkpointed bookkeeping (rows, ρ charged per party, stage seconds, naive byte counts),
the secure-aggregation session (plan, server, session index), MST's domain compression
once round 0 is released, and the workload weights; with the helpers every stage uses:
the checkpoint store, the stage timer, the artifact writer and the crash-point observer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from synth.checkpoint import atomic_write_json
from synth.config import SynthConfig
from synth.coord.meters import StageTimer, WireMeter
from synth.coord.planners import Known
from synth.coord.store import CheckpointStore, fingerprint
from synth.domain import Schema
from synth.engine import NoisyMarginal
from synth.protocol import SessionPlan, Topics, build_tree, secagg_degree
from synth.secagg import SecAggServer
from synth.secagg_state import restore_server, server_state

class RunContext:
    """What the stages of one run share.

    Args:
        cfg: the run config.
        schema: the public schema.
        run_id: topic namespace.
        out: the run directory.
        wire: the run's wire-byte meter.
        log: the coordinator's bound logger.
        on_point: the crash-point observer, or None.

    Attributes:
        rows: party -> its row count (from the schema stage or the checkpoint).
        rho_party: party -> the ρ it was charged by the plans it measured.
        stage_s, stage_cpu_s: per stage, wall and process-CPU seconds.
        bytes_naive, bytes_naive_direct: the naive float32 bytes of the rounds so far
            (over the tree; straight to the root).
        session, server, s: the secure-aggregation session, its server and its index
            (a finished run reopened for a workload update starts session ``s + 1``).
        never_keyed: the parties that never advertised keys in the session.
        reopened: this coordinator continues a finished run (a workload update).
        maps, cdomain, one_way_c, known: MST's domain compression after round 0 (value
            maps, the compressed domain, the compressed noisy 1-way marginals) and the
            released noisy marginals on it (public bounds for later rounds' ring windows).
        weights: clique -> its workload weight in the fit.
        updates: the workload updates this coordinator applied.
    """

    def __init__(self, cfg: SynthConfig, schema: Schema, *, run_id: str, out: Path,
                 wire: WireMeter, log: Any,
                 on_point: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.cfg = cfg
        self.schema = schema
        self.domain = schema.domain
        self.run_id = run_id
        self.topics = Topics(run_id)
        self.out = Path(out)
        self.stages_dir = self.out / "stages"
        self.parties = cfg.party_ids()
        self.tree = build_tree(self.parties, cfg.secagg.fanout, cfg.secagg.root_children)
        self.engine = cfg.resolved_engine()
        self.wire = wire
        self.log = log
        self.on_point = on_point
        self.rows: dict[str, int] = {}
        self.rho_party: dict[str, float] = dict.fromkeys(self.parties, 0.0)
        self.stage_s: dict[str, float] = {}
        self.stage_cpu_s: dict[str, float] = {}
        self.bytes_naive = 0
        self.bytes_naive_direct = 0
        #: round name -> its naive float32 bytes (this process's rounds; the per-query split)
        self.naive_by_round: dict[str, int] = {}
        #: the first seed batch's rounds: the mechanism's, then those of queued updates
        self.first_batch: tuple[int, int] = (0, 0)
        self.session = SessionPlan(
            session_id=f"{run_id}/0", party_ids=self.parties,
            threshold=cfg.secagg.threshold or None,
            degree=secagg_degree(len(self.parties), cfg.secagg.degree),
            graph_seed=np.random.default_rng([cfg.seed, 0]).bytes(16).hex(),
            timeout_s=cfg.timeouts.round_timeout_s, tree=self.tree.to_dict())
        self.server = SecAggServer(self.session.secagg())
        self.s = 0
        self.never_keyed: tuple[str, ...] = ()
        self.reopened = False
        self.maps: dict[str, np.ndarray] = {}
        self.cdomain = self.domain
        self.one_way_c: dict[tuple[str, ...], NoisyMarginal] = {}
        self.known: list[Known] = []
        self.weights: dict[tuple[str, ...], float] = {}
        self.updates: list[dict[str, Any]] = []
        self.store = CheckpointStore(self.stages_dir, run_id=run_id,
                                     fingerprint=fingerprint(cfg, schema),
                                     snapshot=self._snapshot, log=log)

    def _snapshot(self) -> dict[str, Any]:
        return {"rows": self.rows, "rho_party": self.rho_party, "stage_s": self.stage_s,
                "never_keyed": list(self.never_keyed)}

    def resume(self) -> None:
        """Continue from the checkpoint (:meth:`CheckpointStore.load`): the bookkeeping,
        the secure-aggregation server's state, or, for a finished run reopened, a new
        session.

        Raises:
            CoordinatorError: (code 2) as :meth:`CheckpointStore.load`.
        """
        doc = self.store.load(self.out)
        if doc is None:
            return
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
            restore_server(self.server, doc["server"])
        self.bytes_naive, self.bytes_naive_direct = doc.get("bytes_naive", [0, 0])
        self.log.info("coordinator.resumed", done=self.store.resumed_from,
                      pending=sorted(doc["pending"]), restarts=doc["restarts"])

    # ------------------------------------------------------------------ helpers
    @property
    def total_rows(self) -> float:
        """All parties' rows (dropout recovery estimates sums over all of them)."""
        return float(sum(self.rows.values()))

    def sk(self, stage: str) -> str:
        """A per-session stage's checkpoint name (``keys``, ``keys:1``, ...)."""
        return stage if self.s == 0 else f"{stage}:{self.s}"

    def done(self, stage: str) -> bool:
        """Whether ``stage`` is done according to the checkpoint."""
        return self.store.done(stage)

    def mark(self, stage: str, *, server: bool = False) -> None:
        """Checkpoint ``stage`` as done (with the secure-aggregation server's state)."""
        self.store.mark(stage, server=server_state(self.server) if server else None)

    def save(self) -> None:
        """Write the checkpoint."""
        self.store.save()

    def stage(self, name: str) -> StageTimer:
        """A timer for stage ``name`` (``with ctx.stage(name): ...``)."""
        return StageTimer(name, log=self.log, seconds=self.stage_s,
                          cpu_seconds=self.stage_cpu_s)

    def write(self, name: str, doc: dict[str, Any]) -> None:
        """Write a stage's artifact ``OUT/stages/<name>.json``."""
        atomic_write_json(self.stages_dir / f"{name}.json", doc)  # makes the directory

    async def crash_point(self, point: str) -> None:
        """A named point of the run reached (``schema@collected``, ``keys@collected``,
        ``keys@marked``, ``seeds:0@collected``, ``seeds:0@marked``,
        ``round:<name>@{planned,collected,unmask,revealed}``: the checkpoint boundaries):
        awaits the ``on_point`` observer, if any.
        The simulator's crash-recovery tests kill the process there
        (:mod:`sim.faults.synth_crash`); the coordinator itself injects nothing."""
        if self.on_point is not None:
            await self.on_point(point)


__all__ = ["RunContext"]
