"""The coordinator's checkpoint store: ``OUT/stages/checkpoint.json`` and its arrays.

The checkpoint is one JSON document (written atomically by :mod:`synth.checkpoint`) plus
``.npz`` files under ``OUT/stages/ckpt/`` that it names: the stages done, the rows, the
ρ each party was charged, the secure-aggregation session's public state, each finished
round's decoded aggregate (``result_<name>.npz``), the plan of a round in progress
(``pending_<name>.npz``, written before it is published), AIM's picks, the queued
workload updates and the saved model. :class:`CheckpointStore` owns that document; the
stages read and write its keys through it, and :meth:`CheckpointStore.save` adds the run's
live bookkeeping (rows, ρ charged, stage seconds, parties never keyed) before writing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from synth.checkpoint import atomic_save_npz, atomic_write_json, load_npz, read_json
from synth.config import SynthConfig, flat_config
from synth.coord.types import CoordinatorError, RoundResult
from synth.domain import Schema
from synth.protocol import RoundPlan

#: Config keys that may change between a run and its resumption (deadlines, process
#: layout, how an update is refitted); every other key must match the checkpoint. Named
#: as :func:`synth.config.flat_config` names them (the flat layout's names).
OPERATIONAL = frozenset({"round_timeout_s", "handshake_timeout_s", "connect_timeout_s",
                         "parties_per_process", "engine_threads", "stream_iters",
                         "stream_refit", "stream_compare_full"})

#: The checkpoint document's format version.
VERSION = 1


def fingerprint(cfg: SynthConfig, schema: Schema) -> str:
    """What a checkpoint must match to be resumed: the config (but its operational keys)
    and the schema. The config is hashed flat, under the flat layout's key names
    (:func:`synth.config.flat_config`), so a run checkpointed before ``[synth]`` had
    nested tables resumes."""
    conf = {k: v for k, v in flat_config(cfg).items() if k not in OPERATIONAL}
    doc = json.dumps({"config": conf, "schema": schema.fingerprint()},
                     sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


class CheckpointStore:
    """The checkpoint of one run directory.

    Args:
        stages_dir: ``OUT/stages`` (the document is ``checkpoint.json`` there, its arrays
            are under ``ckpt/``).
        run_id: the run id the checkpoint must carry.
        fingerprint: :func:`fingerprint` of the run's config and schema.
        snapshot: returns the run's live bookkeeping (``rows``, ``rho_party``,
            ``stage_s``, ``never_keyed``), copied into the document on every save.
        log: the coordinator's bound logger.

    Attributes:
        doc: the checkpoint document (JSON-safe; the stages read and update its keys).
        resumed_from: the stages done before this coordinator started (empty when fresh).
    """

    def __init__(self, stages_dir: Path, *, run_id: str, fingerprint: str,
                 snapshot: Callable[[], Mapping[str, Any]], log: Any) -> None:
        self.path = stages_dir / "checkpoint.json"
        self.dir = stages_dir / "ckpt"
        self.run_id = run_id
        self.fingerprint = fingerprint
        self._snapshot = snapshot
        self._log = log
        self.resumed_from: list[str] = []
        self.doc: dict[str, Any] = {
            "version": VERSION, "run_id": run_id, "fingerprint": fingerprint,
            "done": [], "rows": {}, "rho_party": {}, "server": None, "never_keyed": [],
            "results": {}, "pending": {}, "selects": {}, "restarts": 0, "stage_s": {},
            "session": 0, "stream_rho_left": None, "workload": [], "model": None}

    # ------------------------------------------------------------------ the document
    def discard(self) -> None:
        """Remove an earlier run's checkpoint (a fresh start in the same directory)."""
        if self.path.exists():
            self.path.unlink()

    def load(self, out: Path) -> dict[str, Any] | None:
        """The checkpoint to resume, checked, with its restart (or reopen) counted.

        Returns:
            The document (now :attr:`doc`), or None when an earlier coordinator of this
            run died before its first checkpoint (nothing was committed: the run starts
            afresh, counted as one restart).

        Raises:
            CoordinatorError: (code 2) no run in ``out``, another format version, or a
                checkpoint of another run id, config or schema.
        """
        doc = read_json(self.path)
        if doc is None:
            if (out / "config.toml").exists():  # died before its first checkpoint:
                self._log.info("coordinator.resumed", done=[], pending=[], restarts=1)
                self.doc["restarts"] = 1  # nothing was committed yet; start afresh
                return None
            raise CoordinatorError(f"nothing to resume: no checkpoint at {self.path} "
                                   f"and no run in {out}", code=2)
        if doc.get("version") != VERSION:
            raise CoordinatorError(f"checkpoint version {doc.get('version')!r} is not 1",
                                   code=2)
        for key, want in (("run_id", self.run_id), ("fingerprint", self.fingerprint)):
            if doc.get(key) != want:
                raise CoordinatorError(
                    f"the checkpoint in {out} belongs to another run ({key} "
                    f"{doc.get(key)!r}, this run has {want!r}); resume with the same run "
                    "id, config and schema, or start afresh without resume", code=2)
        if "synthesis" in doc["done"]:  # a finished run reopened, not a crash restart
            doc["reopened"] = int(doc.get("reopened", 0)) + 1
        else:
            doc["restarts"] = int(doc.get("restarts", 0)) + 1
        self.doc = doc
        self.resumed_from = list(doc["done"])
        return doc

    @property
    def restarts(self) -> int:
        """How many times this run's coordinator was started again after dying."""
        return int(self.doc["restarts"])

    def save(self) -> None:
        """Write the checkpoint (atomically; arrays were written before, under names of
        their own)."""
        self.doc.update(self._snapshot())
        atomic_write_json(self.path, self.doc)

    def done(self, stage: str) -> bool:
        """Whether ``stage`` finished (in this or an earlier coordinator)."""
        return stage in self.doc["done"]

    def mark(self, stage: str, *, server: Mapping[str, Any] | None = None) -> None:
        """Record ``stage`` as done (with the secure-aggregation server's state, when
        given) and save."""
        if stage not in self.doc["done"]:
            self.doc["done"].append(stage)
        if server is not None:
            self.doc["server"] = server
        self.save()

    # ------------------------------------------------------------------ rounds
    def save_pending(self, name: str, plan: RoundPlan, lo: np.ndarray) -> None:
        """Write-ahead: the plan of a round about to be published (a resumed coordinator
        re-publishes exactly this plan, so no party measures the round twice)."""
        meta, arrays = plan.to_message()
        f = self.dir / f"pending_{name}.npz"
        atomic_save_npz(f, lo=lo, **{f"a{i}": a for i, a in enumerate(arrays)})
        self.doc["pending"][name] = {"plan": meta, "n_arrays": len(arrays), "file": f.name}
        self.save()

    def load_pending(self, name: str) -> tuple[RoundPlan, np.ndarray] | None:
        """The plan (and its cells' window floors) of round ``name`` published before a
        restart, or None."""
        pending = self.doc["pending"].get(name)
        if pending is None:
            return None
        npz = load_npz(self.dir / pending["file"])
        return self._plan(pending, npz), npz["lo"]

    def save_result(self, name: str, res: RoundResult, *,
                    bytes_naive: tuple[int, int]) -> None:
        """Record a finished round (its aggregate and survivors; the naive byte counts so
        far) and mark ``round:<name>`` done; the round's pending plan is dropped."""
        meta, arrays = res.plan.to_message()
        f = self.dir / f"result_{name}.npz"
        atomic_save_npz(f, values=res.values, **{f"a{i}": a for i, a in enumerate(arrays)})
        self.doc["results"][name] = {
            "plan": meta, "n_arrays": len(arrays), "file": f.name, "sigma": res.sigma,
            "survivors": list(res.survivors), "dropped": list(res.dropped),
            "missing": list(res.missing), "seconds": res.seconds}
        self.doc["pending"].pop(name, None)
        self.doc["bytes_naive"] = list(bytes_naive)
        self.mark(f"round:{name}")

    def has_result(self, name: str) -> bool:
        """Whether round ``name`` finished before."""
        return name in self.doc["results"]

    def load_result(self, name: str) -> RoundResult:
        """A round finished before (:meth:`save_result`)."""
        doc = self.doc["results"][name]
        npz = load_npz(self.dir / doc["file"])
        return RoundResult(plan=self._plan(doc, npz), values=npz["values"],
                           sigma=float(doc["sigma"]), survivors=tuple(doc["survivors"]),
                           dropped=tuple(doc["dropped"]), missing=tuple(doc["missing"]),
                           seconds=float(doc["seconds"]))

    @staticmethod
    def _plan(doc: Mapping[str, Any], npz: Mapping[str, np.ndarray]) -> RoundPlan:
        n = int(doc["n_arrays"])
        return RoundPlan.from_message(doc["plan"], [npz[f"a{i}"] for i in range(n)])


__all__ = ["OPERATIONAL", "CheckpointStore", "fingerprint"]
