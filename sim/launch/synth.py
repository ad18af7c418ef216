"""Run a FedForge job on one machine: prepare the parties' data, then start the broker,
the coordinator, the aggregators and the parties as OS processes (``python -m synth``).

The data preparation is the simulator's part: it loads the table (a named dataset via
:func:`parties.data.load_table`, or a file), keeps a seeded real holdout out of every
party, spreads the other rows over K parties (:mod:`synth.split`), and infers the public
schema from those pooled rows (the domain is treated as public, as in the AIM/MST
literature: no budget is spent on it). It writes, under the run directory::

    schema.json                  the public schema (synth.domain.Schema.to_dict())
    data/parties/<id>.parquet    each party's rows (the only data a party process reads)
    data/train.parquet           the pooled rows (evaluation only: the quality stage)
    data/holdout.parquet         the real holdout (evaluation only: ML utility)
"""

from __future__ import annotations

import numpy as np

import contextlib
import json
import math
import shutil
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sim.launch.vfl import LaunchError, LaunchResult, OutDirError, _spawn, _stop, run_security
from sim.launch.vfl import start_broker
from sim.launch.vfl import wait_children
from sim.launch.synth_deaths import PartyDeathWatch
from sim.faults.synth_party import PartyKill, PartyKiller, StageLog, process_layout

from sim.faults.synth_crash import CRASH_POINT_ENV
from pubsub.outputs import OutputError, RunDirLock, append_to, write_atomic
from synth.checkpoint import atomic_write_json, atomic_write_parquet, read_json
from synth.workload import WorkloadError, mark_applied, submit_workload
from synth.config import SynthConfig, dump_synth_config
from synth.protocol import build_tree

#: identities (and roles) of a local FedForge run's ephemeral keys: every party process
#: shares the ``party`` key, every aggregator process the ``aggregator`` key
SYNTH_IDENTITIES = {"coordinator": "coordinator", "aggregator": "aggregator", "party": "party"}


def prepare_data(cfg: SynthConfig, out: Path) -> tuple[SynthConfig, dict[str, Any]]:
    """Split the table into a holdout and K parties' rows and infer the public schema.

    Returns:
        ``(cfg, info)``: ``cfg`` with ``label`` filled in for a named dataset, and
        ``info`` (rows per party, holdout rows, columns).

    Raises:
        parties.data.DataError: the table cannot be loaded.
        synth.domain.DomainError: a column cannot be put in a domain (one value, NaN in a
            numeric column, too many levels).
        pubsub.config.ConfigError: the label or split column is unknown, or there are
            fewer rows than parties.
    """
    from parties.data import load_table
    from pubsub.config import ConfigError
    from synth.domain import infer_schema
    from synth.split import holdout_split, party_split

    frame, named_label = load_table(cfg.dataset)
    drop = cfg.resolved_drop()
    unknown = [c for c in drop if c not in frame.columns]
    if unknown:
        raise ConfigError("synth.data.drop_columns", f"no column(s) {unknown} in {cfg.dataset!r}")
    frame = frame.drop(columns=list(drop))
    if not cfg.label and named_label:
        cfg = replace(cfg, label=named_label)
    if cfg.label and cfg.label not in frame.columns:
        raise ConfigError("synth.label", f"no column {cfg.label!r} in {cfg.dataset!r} "
                          f"(columns: {', '.join(map(str, frame.columns))})")
    frame = frame.reset_index(drop=True)
    try:
        train_idx, hold_idx = holdout_split(len(frame), cfg.data.holdout_frac, cfg.seed)
    except ValueError as exc:
        raise ConfigError("synth.data.holdout_frac", str(exc)) from None
    train, holdout = frame.iloc[train_idx], frame.iloc[hold_idx]
    declared = declared_schema(cfg, list(train.columns))
    if declared is not None:
        schema, domain_source = declared, "declared"
    else:
        schema = infer_schema(train, numeric_bins=cfg.data.numeric_bins, binning=cfg.data.binning)  # type: ignore[arg-type]
        domain_source = "inferred"
    # the coordinator's dp block states it
    cfg = replace(cfg, data=replace(cfg.data, domain=domain_source))
    groups = None
    if cfg.data.split == "dirichlet":
        col = cfg.data.split_column or cfg.label
        if not col or col not in train.columns:
            raise ConfigError("synth.data.split_column", f"unknown split column {col!r}")
        groups = train[col].astype(str).to_numpy()
    try:
        parts = party_split(len(train), cfg.parties, seed=cfg.seed, how=cfg.data.split,
                            groups=groups, alpha=cfg.data.dirichlet_alpha,
                            weights=cfg.data.party_weights or None)
    except ValueError as exc:
        raise ConfigError("synth.parties", str(exc)) from None
    d = out / "data"
    (d / "parties").mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(d / "train.parquet", train)  # OutputError: a full disk, named
    atomic_write_parquet(d / "holdout.parquet", holdout)
    ids = cfg.party_ids()
    for pid, rows in zip(ids, parts, strict=True):
        atomic_write_parquet(d / "parties" / f"{pid}.parquet", train.iloc[rows])
    write_atomic(out / "schema.json", json.dumps(schema.to_dict(), indent=1))
    info = {"rows": {p: int(len(r)) for p, r in zip(ids, parts, strict=True)},
            "holdout_rows": int(len(holdout)), "train_rows": int(len(train)),
            "columns": list(schema.names), "domain_sizes": list(schema.domain.sizes),
            "domain_source": domain_source}
    return cfg, info


#: The documented classes of the bundled datasets' labels (UCI), for a declared domain.
DECLARED_LABELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bank": ("y", ("no", "yes")), "adult": ("income", ("<=50K", ">50K"))}


def declared_schema(cfg: SynthConfig, columns: list[str]) -> Any:
    """The public :class:`synth.domain.Schema` of ``columns`` from a declared schema file
    (``data.schema_file``, or the bundled one of ``bank``/``adult``), or None when the domain is
    to be inferred (``data.domain = inferred``, or ``auto`` without a declared schema).

    Categorical columns: the declared categories plus :data:`synth.domain.OTHER_LEVEL`
    (any other value, missing ones included); the label (``cfg.label``) gets exactly its
    declared categories (exhaustive: another value is refused). Numeric columns:
    ``data.numeric_bins`` equal-width bins over ``[lo, hi]`` (in ``sign(v)·log1p(|v|)``
    space for ``log`` columns; integer edges for integer bounds), NaN encoded as the
    declared fill. The label of a bundled dataset gets exactly its documented classes
    (:data:`DECLARED_LABELS`).

    Raises:
        pubsub.config.ConfigError: ``data.domain = declared`` without a schema, or a column the
            schema does not declare.
    """
    from parties.data.schema import (
        CategoricalColumn,
        NumericColumn,
        bundled_schema,
        load_schema,
    )
    from pubsub.config import ConfigError
    from synth.domain import OTHER_LEVEL, ColumnSpec, Schema

    if cfg.data.domain == "inferred":
        return None
    if cfg.data.schema_file:
        public = load_schema(cfg.data.schema_file)
    else:
        public = bundled_schema(cfg.dataset) if cfg.dataset in DECLARED_LABELS else None
    if public is None:
        if cfg.data.domain == "declared":
            raise ConfigError("synth.data.schema_file", f"domain = declared needs a public schema "
                              f"for {cfg.dataset!r}; draft one with psfl vfl schema and "
                              "review it")
        return None
    label = DECLARED_LABELS.get(cfg.dataset)
    declared = {c.name: c for c in public.columns}
    # every column the declared domain cannot take, named in one error
    undeclared = [n for n in columns if n not in declared and n != cfg.label
                  and not (label is not None and n == label[0])]
    unsupported = [f"{n!r} ({declared[n].kind})" for n in columns if n in declared
                   and not isinstance(declared[n], NumericColumn | CategoricalColumn)]
    if undeclared or unsupported:
        raise ConfigError("synth.data.schema_file", "; ".join(filter(None, [
            f"not declared in the public schema: {undeclared} (declare them or drop them: "
            "data.drop_columns)" if undeclared else "",
            f"declared as kinds a FedForge domain does not take: {', '.join(unsupported)} "
            "(numeric and categorical columns only: declare them as one, or drop them: "
            "data.drop_columns; psfl synth schema drafts a schema FedForge takes)"
            if unsupported else ""])))
    specs = []
    for name in columns:
        if label is not None and name == label[0] and name not in declared:
            # the documented classes are exhaustive: no catch-all level
            specs.append(ColumnSpec(name=name, kind="categorical", levels=label[1]))
            continue
        col = declared.get(name)
        if col is None and name == cfg.label:
            raise ConfigError("synth.data.schema_file", f"the label column {name!r} is not "
                              "declared in the public schema; declare it with its classes, e.g. "
                              f'[columns.{name}] kind = "categorical" categories = '
                              '["no", "yes"]')
        if col is None:
            raise ConfigError("synth.data.schema_file", f"column {name!r} is not declared in the "
                              "public schema; declare it or drop it (drop_columns)")
        if isinstance(col, CategoricalColumn):
            # the label's declared classes are exhaustive (a party holding another value
            # is refused), so no synthetic record gets a class the real data cannot have
            other = () if name == cfg.label else (OTHER_LEVEL,)
            specs.append(ColumnSpec(name=name, kind="categorical",
                                    levels=(*col.categories, *other)))
            continue
        if not isinstance(col, NumericColumn):
            raise ConfigError("synth.data.schema_file", f"column {name!r} is declared "
                              f"{col.kind!r}; a declared domain takes numeric and "
                              "categorical columns only: declare it as one, or drop it "
                              "(drop_columns)")
        integer = float(col.lo).is_integer() and float(col.hi).is_integer()
        if col.log:
            t = np.linspace(np.sign(col.lo) * np.log1p(abs(col.lo)),
                            np.sign(col.hi) * np.log1p(abs(col.hi)), cfg.data.numeric_bins + 1)
            edges = np.sign(t) * np.expm1(np.abs(t))
        else:
            edges = np.linspace(col.lo, col.hi, cfg.data.numeric_bins + 1)
        if integer:
            # integer starts; the last bin is closed at hi (the decoder draws up to and
            # including the last edge: hi + 1 there made it emit hi + 1); a start at hi
            # itself moves to hi - 0.5 so that hi keeps a bin of its own
            edges = np.unique(np.ceil(edges[:-1]))
            if len(edges) > 1 and edges[-1] >= col.hi:
                edges[-1] = col.hi - 0.5
            edges = np.append(edges, col.hi)
        specs.append(ColumnSpec(name=name, kind="numeric", edges=tuple(float(e) for e in edges),
                                integer=integer, dtype="int64" if integer else "float64",
                                fill=float(col.fill)))
    return Schema(columns=tuple(specs))


def coordinator_stages(cfg: SynthConfig) -> list[str]:
    """The coordinator's stages of a run with ``cfg``, in order (the names its
    ``stage.started`` events carry; AIM may stop its adaptive rounds early)."""
    rounds = (["round:one_way", "compress_domain", "round:select"]
              + (["select_tree", "round:tree"] if cfg.mechanism == "mst" else
                 [s for j in range(cfg.aim.rounds) for s in (f"select:aim{j}", f"round:aim{j}")]))
    return ["schema", "keys", "seeds:0", *rounds, "synthesis"]


class _CoordinatorKill:
    """Kills the coordinator (SIGKILL) when its ``stage.started`` event for ``stage``
    appears in the event log (plus ``delay_s``), then starts it again with ``--resume``
    after ``restart_after_s``; records what it did.

    ``stage@point`` instead has the coordinator kill itself at that exact point
    (:data:`sim.faults.synth_crash.CRASH_POINT_ENV` read by ``python -m sim.faults.synth_crash``, for
    the first process only); this then
    waits for its SIGKILL exit and restarts it the same way."""

    def __init__(self, events: Path, stage: str, delay_s: float, restart_after_s: float,
                 procs: list[dict[str, subprocess.Popen[bytes]]], argv: list[str], quiet: bool,
                 t0: float) -> None:
        self.events, self.stage, self.delay_s = events, stage, delay_s
        self.restart_after_s, self.procs, self.argv, self.quiet = restart_after_s, procs, argv, quiet
        self.t0 = t0
        self._stages = StageLog(events)
        self.seen_at: float | None = None
        self.record: dict[str, Any] = {"kind": "kill_coordinator", "stage": stage,
                                       "delay_s": delay_s, "killed_at_s": None,
                                       "restarted_at_s": None}

    def _stage_started(self) -> bool:
        return self.stage in self._stages.poll()

    def __call__(self) -> None:
        if self.record["restarted_at_s"] is not None:
            return
        now = time.monotonic()
        if "@" in self.stage:
            proc = self.procs[0]["coordinator"]
            if proc.poll() is None:
                return
            if proc.returncode != -signal.SIGKILL:  # finished or failed on its own
                self.record["note"] = f"the coordinator exited ({proc.returncode}) first"
                self.record["restarted_at_s"] = -1.0
                return
            self.record["killed_at_s"] = round(time.perf_counter() - self.t0, 3)
            self._restart()
            return
        if self.seen_at is None:
            if self._stage_started():
                self.seen_at = now
            return
        if now - self.seen_at < self.delay_s:
            return
        proc = self.procs[0]["coordinator"]
        if proc.poll() is not None:  # it finished (or failed) first: nothing to kill
            self.record["note"] = f"the coordinator had exited ({proc.returncode}) first"
            self.record["restarted_at_s"] = -1.0
            return
        proc.kill()
        proc.wait()
        self.record["killed_at_s"] = round(time.perf_counter() - self.t0, 3)
        self._restart()

    def _log(self, event: str) -> None:
        _log_event(self.events, event, {"stage": self.stage})

    def _restart(self) -> None:
        self._log("sim.coordinator_killed")
        time.sleep(self.restart_after_s)
        new = _spawn([*self.argv, "--resume"], quiet=self.quiet)
        for d in self.procs:  # the launcher's table and the one being waited on
            d["coordinator"] = new
        self.record["restarted_at_s"] = round(time.perf_counter() - self.t0, 3)
        self._log("sim.coordinator_restarted")


def _failure_reason(events: Path) -> str | None:
    """The coordinator's last ``stage.failed`` reason in the run's event log, if any."""
    reason = None
    try:
        lines = events.read_bytes().splitlines()
    except OSError:
        return None
    for line in lines:
        if b"stage.failed" not in line:
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("event") == "stage.failed" and ev.get("party") == "coordinator":
            reason = str(ev.get("error") or "") or None
    return reason


def _log_event(events: Path, event: str, fields: Mapping[str, Any]) -> None:
    """Append one launcher event line to the run's event log."""
    line = json.dumps({"event": event, "party": "sim", "level": "warning", **fields,
                       "timestamp": _utc_now()})
    try:
        append_to(events, line.encode() + b"\n")  # one whole line beside the others
    except OutputError as exc:  # the run's own error says more; this is said, not lost
        print(f"warning: {event} not logged: {exc}", file=sys.stderr)


def _utc_now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def read_ledgers(state_dir: Path) -> dict[str, Any]:
    """The parties' persisted privacy ledgers (``<id>.ledger.json``), by party."""
    out: dict[str, Any] = {}
    for f in sorted(state_dir.glob("*.ledger.json")):
        doc = read_json(f)
        if doc is not None:
            out[str(doc.get("party", f.name.split(".")[0]))] = {
                "rho_spent": float(doc["spent"]), "rho_budget": float(doc["rho_budget"]),
                "entries": [w for w, _ in doc["ledger"]]}
    return out


class LaunchHooks(Protocol):
    """What a scenario (e.g. :mod:`sim.cluster.consortium_run`) adds to :func:`run_synth`."""

    def party_broker(self, index: int, broker: str, ports: int) -> str:
        """The address party process ``index`` is given (``broker``, or a relay in front
        of its ``ports`` ports)."""

    def started(self, procs: dict[str, subprocess.Popen[bytes]], events: Path) -> None:
        """Every process is up (``procs`` is the launcher's live table)."""

    def stopped(self) -> None:
        """The run ended (before its processes are stopped)."""


#: a fault for tests: ``(party_index, start, end)``; ``start`` and ``end`` are seconds
#: (``start`` after the parties were started, ``end`` a duration after ``start``) or a
#: coordinator stage event ``"STAGE started"`` / ``"STAGE done"`` in the run's event log
Pause = tuple[int, float | str, float | str]


class _Pauser(threading.Thread):
    """Pauses (SIGSTOP) and resumes (SIGCONT) one party process per :data:`Pause`."""

    def __init__(self, proc: subprocess.Popen[bytes], pause: Pause, events: Path,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"pause-{pause[0]}")
        self.proc, self.pause, self.events, self.stop = proc, pause, events, stop
        self.t0 = time.monotonic()
        self.record: dict[str, Any] = {"party_index": pause[0], "start": pause[1],
                                       "end": pause[2]}
        self.stopped = False

    def _wait(self, spec: float | str, since: float) -> bool:
        if not isinstance(spec, str):
            return not self.stop.wait(max(0.0, since + float(spec) - time.monotonic()))
        stage, _, what = spec.rpartition(" ")
        want = {"started": "stage.started", "done": "stage.done"}[what]
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                for line in self.events.read_text().splitlines():
                    with contextlib.suppress(ValueError):
                        ev = json.loads(line)
                        if ev.get("event") == want and ev.get("stage") == stage:
                            return True
            self.stop.wait(0.02)
        return False

    def run(self) -> None:
        if not self._wait(self.pause[1], self.t0) or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True
        at = time.monotonic()
        self.record["paused_at_s"] = at - self.t0
        try:
            self._wait(self.pause[2], at)
        finally:
            self.resume()
            self.record["paused_s"] = time.monotonic() - at

    def resume(self) -> None:
        if self.stopped:
            self.stopped = False
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)


def run_synth(cfg: SynthConfig, out: str | Path, *, broker: str | None = None,
              run_id: str | None = None, timeout_s: float | None = None,
              quiet: bool = False, keys_dir: str | None = None,
              insecure: bool = False, kill_coordinator_at: str | None = None,
              kill_delay_s: float = 0.0, restart_after_s: float = 1.0,
              pauses: list[Pause] | None = None,
              kill_parties: Sequence[str] = (),
              workload: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
              reopen: bool = False, rusage: bool = False,
              hooks: LaunchHooks | None = None,
              prepared: Mapping[str, Any] | None = None) -> LaunchResult:
    """Run a FedForge job as processes and collect ``out/metrics.json``.

    Args:
        cfg: the run config (written to ``out/config.toml``).
        out: the run directory (created; files of an earlier run there are replaced).
        broker: use this running broker instead of starting one.
        run_id: topic namespace (default: random).
        timeout_s: kill everything after this long (None: the participants' own
            deadlines only).
        quiet: no output from the party and aggregator processes.
        keys_dir: CURVE keys holding ``coordinator``, ``aggregator`` and ``party``
            (``psfl keys generate``); default: ephemeral keys made for this run.
        insecure: plaintext on loopback instead (prints a warning).
        kill_coordinator_at: kill -9 the coordinator when it starts this stage (a name
            from :func:`coordinator_stages`) plus ``kill_delay_s``, and start it again with
            ``--resume`` after ``restart_after_s`` seconds (crash recovery);
            ``STAGE@POINT`` (e.g. ``round:select@unmask``) has it kill itself at that exact
            point of the stage (``python -m sim.faults.synth_crash``).
            ``metrics["faults"]`` records it.
        kill_delay_s / restart_after_s: see ``kill_coordinator_at``, seconds.
        kill_parties: faults ``ID@STAGE`` (:class:`sim.faults.synth_party.PartyKill`): kill -9
            party ID when the coordinator starts STAGE (a name from
            :func:`coordinator_stages`); the party runs alone in its own process. The run
            completes with the survivors, or fails as the coordinator does when fewer
            than ``secagg.min_survivors`` remain. ``metrics["faults"]`` records each kill.
            An unplanned death (a party process that exits non-zero or by a signal while
            the coordinator runs, e.g. killed from outside) is a dropout of every party
            it hosted (:mod:`sim.launch.synth_deaths`): reported on stderr, as a
            ``sim.party_died`` event and in ``metrics["party_deaths"]``; the run goes on
            while at least ``secagg.min_survivors`` parties remain, else it ends with
            :class:`sim.launch.synth_deaths.TooFewSurvivors` naming the dead parties.
        pauses: faults for tests (:data:`Pause`): the process hosting that party is
            paused with SIGSTOP and resumed with SIGCONT (needs
            ``launch.parties_per_process = 1``); ``metrics["pauses"]`` says when.
        hooks: a scenario's hooks (:class:`LaunchHooks`): the address each party process
            is given (a shaping relay's), and a start/stop around the run.

        workload: a workload update (:mod:`synth.workload`), or several, queued before
            the job starts, so the coordinator measures them after its own rounds, in
            order, in the same secure-aggregation session (a full run with the update,
            the baseline of an incremental ``add_workload``; several: a consortium
            session of queries whose keys are set up once, ``metrics["bytes_wire_by_query"]``).
        reopen: start the processes again for the finished run in ``out`` (its data,
            config, run id, checkpoint and the parties' ledgers) to apply queued
            workload updates; used by :func:`add_workload`.
        prepared: the data is already in ``out`` (``data/parties/<id>.parquet``,
            ``schema.json``, optionally ``data/train.parquet`` and ``data/holdout.parquet``
            for the quality stage; :func:`sim.fedforge.write_parties`), and this is its
            ``info``; None: :func:`prepare_data` splits ``cfg.dataset``.
        rusage: each coordinator, aggregators and parties process writes its CPU
            seconds and peak RSS to ``out/rusage/<process>.json`` when it ends; they are
            copied into ``metrics["process_rusage"]`` (benchmarks).

    Each party keeps its privacy ledger in ``out/state/<id>.ledger.json``;
    ``metrics["ledger"]`` holds them, and ``metrics["ledger_within_plan"]`` says whether
    every party spent at most the planned ρ.

    Returns:
        :class:`sim.launch.vfl.LaunchResult` (``metrics`` as in ``metrics.json``).

    Raises:
        LaunchError: a process failed (its exit code is carried).
        JobTimeout: ``timeout_s`` passed.
        OutDirError: ``out`` cannot be used.
        parties.data.DataError, synth.domain.DomainError, pubsub.config.ConfigError: bad
            data or config (checked before any process starts).
    """
    t0 = time.perf_counter()
    out = Path(out)
    if pauses and cfg.launch.parties_per_process != 1:
        raise ValueError("pauses need parties_per_process = 1 (one process per party)")
    kills = [PartyKill.parse(k, cfg.party_ids(), coordinator_stages(cfg))
             for k in kill_parties]
    if kill_coordinator_at is not None:
        stage, _, point = kill_coordinator_at.partition("@")
        if stage not in coordinator_stages(cfg):
            raise ValueError(f"kill_coordinator_at={kill_coordinator_at!r} is not a stage of "
                             f"this run: {coordinator_stages(cfg)}")
        points = CRASH_POINTS_ROUND if stage.startswith("round:") else CRASH_POINTS.get(
            stage.split(":")[0], ())
        if point and point not in points:
            raise ValueError(f"kill_coordinator_at={kill_coordinator_at!r}: the points of "
                             f"{stage!r} are {list(points) or 'none (use the stage alone)'}")
    with RunDirLock(out, run_id=run_id, command="psfl synth run"):  # the run's life
        events = out / "events.jsonl"
        try:
            out.mkdir(parents=True, exist_ok=True)
            if not reopen:
                for stale in ("metrics.json", "synthetic.csv", "broker.addr"):
                    (out / stale).unlink(missing_ok=True)
                for stale_dir in ("stages", "state", "workload"):  # an earlier run's
                    if (out / stale_dir).is_dir():
                        shutil.rmtree(out / stale_dir)
                events.write_text("")
        except OSError as exc:
            raise OutDirError(f"cannot use {str(out)!r} as the run directory: "
                              f"{exc.strerror or exc}") from None
        before: dict[str, Any] = {}
        if reopen:
            before = json.loads((out / "metrics.json").read_text())
            info = before.get("data", {})
            ckpt = read_json(out / "stages" / "checkpoint.json") or {}
            run_id = str(ckpt.get("run_id") or run_id)
            write_atomic(out / "config.toml", dump_synth_config(cfg))
        else:
            if prepared is None:
                cfg, info = prepare_data(cfg, out)
            else:
                info = dict(prepared)
            write_atomic(out / "config.toml", dump_synth_config(cfg))
            updates = [workload] if isinstance(workload, Mapping) else list(workload or ())
            for i, update in enumerate(updates):
                try:
                    submit_workload(out, update)
                except WorkloadError as exc:
                    if len(updates) == 1:
                        raise
                    raise WorkloadError(f"update {i + 1} of {len(updates)}: "
                                        f"{exc.reason}") from None
        run_id = run_id or uuid.uuid4().hex[:8]
        ids = cfg.party_ids()
        tree = build_tree(ids, cfg.secagg.fanout, cfg.secagg.root_children)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        faults: list[dict[str, Any]] = []
        stack = contextlib.ExitStack()
        pausers: list[_Pauser] = []
        stop_pauses = threading.Event()
        (out / RUN_LOCK).write_text(str(os.getpid()))  # removed in the finally below
        try:
            sec = stack.enter_context(run_security(SYNTH_IDENTITIES, keys_dir=keys_dir,
                                                   insecure=insecure, broker=broker))
            if broker is None:
                procs["broker"], broker = start_broker(
                    out, events, security=sec, members={run_id: list(SYNTH_IDENTITIES)})
            common = ["--config", str(out / "config.toml"), "--broker", broker,
                      "--run-id", run_id, "--events", str(events), *sec.client_args]
            py = [sys.executable, "-m", "synth"]
            ru_dir = out / "rusage"
            if rusage:
                shutil.rmtree(ru_dir, ignore_errors=True)
                ru_dir.mkdir()

            def ru(name: str) -> list[str]:
                return ["--rusage-out", str(ru_dir / f"{name}.json")] if rusage else []

            crash_here = bool(kill_coordinator_at and "@" in kill_coordinator_at)
            coord_py = [sys.executable, "-m", "sim.faults.synth_crash"] if crash_here else py
            coord_argv = [*coord_py, "coordinator", *common, "--schema", str(out / "schema.json"),
                          "--out", str(out),
                          *(["--eval-dir", str(out / "data")]
                            if (out / "data" / "holdout.parquet").is_file() else []),
                          *(["--resume"] if reopen else []), *ru("coordinator")]
            procs["coordinator"] = _spawn(
                coord_argv, quiet=quiet,
                env={CRASH_POINT_ENV: str(kill_coordinator_at)} if crash_here else None)
            procs["aggregators"] = _spawn([*py, "aggregators", *common, "--ids",
                                           ",".join(tree.aggregators), *ru("aggregators")],
                                          quiet=quiet)
            process_of: dict[str, str] = {}
            for j, chunk in enumerate(process_layout(ids, cfg.launch.parties_per_process,
                                                     [k.party for k in kills])):
                process_of.update({p: f"parties{j}" for p in chunk})
                argv = [*py, "parties", *common, "--ids", ",".join(chunk)]
                if hooks is not None:
                    argv[argv.index("--broker") + 1] = hooks.party_broker(j, broker, sec.n_ports)
                procs[f"parties{j}"] = _spawn([*argv,
                                               "--data-dir", str(out / "data" / "parties"),
                                               "--state-dir", str(out / "state"),
                                               *ru(f"parties{j}")], quiet=quiet)
            for pause in pauses or []:
                pausers.append(_Pauser(procs[f"parties{pause[0]}"], pause, events, stop_pauses))
                pausers[-1].start()
            if hooks is not None:
                hooks.started(procs, events)
            workers = {k: v for k, v in procs.items() if k != "broker"}
            ticks: list[Callable[[], None]] = []
            if kill_coordinator_at is not None:
                kill = _CoordinatorKill(events, kill_coordinator_at, kill_delay_s, restart_after_s,
                                        [workers, procs], coord_argv, quiet, t0)
                faults.append(kill.record)
                ticks.append(kill)
            if kills:
                killer = PartyKiller(events, kills, [workers, procs], process_of, t0,
                                     lambda ev, kv: _log_event(events, ev, kv))
                faults.extend(killer.records)
                ticks.append(killer)

            from synth.mechanism import resolve_min_survivors

            groups: dict[str, list[str]] = {}
            for pid, name in process_of.items():
                groups.setdefault(name, []).append(pid)
            # after the planned faults: a process they killed is theirs to record
            deaths = PartyDeathWatch(
                [workers, procs], groups,
                min_survivors=resolve_min_survivors(cfg.secagg.min_survivors, len(ids)),
                stage_order=coordinator_stages(cfg), events=events, t0=t0,
                log=lambda ev, kv: _log_event(events, ev, kv))
            ticks.append(deaths)

            def tick() -> None:
                for t in ticks:
                    t()

            try:
                wait_children(workers,
                              watch={"broker": procs["broker"]} if "broker" in procs else None,
                              timeout_s=timeout_s, tick=tick)
            except LaunchError as exc:
                if exc.role != "coordinator":
                    raise
                reason = deaths.annotate(_failure_reason(events))
                if reason is None:
                    raise
                raise LaunchError(exc.role, exc.code, reason) from None
        finally:
            if hooks is not None:
                hooks.stopped()
            stop_pauses.set()
            for p in pausers:
                p.join(5.0)
                p.resume()
            for name in sorted(procs, key=lambda n: n == "broker"):
                _stop(procs[name])
            stack.close()
            (out / RUN_LOCK).unlink(missing_ok=True)
        metrics = json.loads((out / "metrics.json").read_text())
        metrics["security"] = sec.describe()
        metrics["wall_s"] = time.perf_counter() - t0
        metrics["data"] = info
        metrics["faults"] = faults
        metrics["party_deaths"] = [d.to_dict() for d in deaths.deaths]
        add_ledgers(metrics, out / "state")
        if pausers:
            metrics["pauses"] = [p.record for p in pausers]
        if reopen:  # a workload update: what the first run recorded stays
            metrics = _merge_reopened(before, metrics)
        if rusage:
            metrics["process_rusage"] = {f.stem: json.loads(f.read_text())
                                         for f in sorted((out / "rusage").glob("*.json"))}
        atomic_write_json(out / "metrics.json", metrics)
        return LaunchResult(metrics=metrics, out=out)


def add_ledgers(metrics: dict[str, Any], state_dir: Path) -> None:
    """Put each party's own ledger (``state_dir/<id>.ledger.json``) into ``metrics``:
    ``ledger``, ``ledger_within_plan``, and ``rho_spent``/``epsilon_spent`` from the
    ledgers (the coordinator's count from its plans kept as ``rho_planned``)."""
    ledger = read_ledgers(state_dir)
    planned = float(metrics.get("rho") or math.inf)
    metrics["ledger"] = ledger
    metrics["ledger_within_plan"] = all(v["rho_spent"] <= planned * (1 + 1e-9)
                                        for v in ledger.values())
    if ledger:
        # one truth: what each party's own ledger (written before each release) says it
        # spent; the coordinator's count from its plans is kept as ``rho_planned``
        from synth.accounting import cdp_epsilon

        metrics["rho_planned"] = metrics.get("rho_spent")
        delta = float(metrics.get("delta") or 1e-9)
        spent = dict(metrics.get("rho_spent") or {})
        spent.update({p: v["rho_spent"] for p, v in ledger.items()})
        metrics["rho_spent"] = spent
        metrics["epsilon_spent"] = {p: cdp_epsilon(v, delta) if 0 < v < math.inf else
                                    (0.0 if v == 0 else math.inf) for p, v in spent.items()}
        metrics["ledger_agrees"] = all(
            abs(ledger[p]["rho_spent"] - float((metrics["rho_planned"] or {}).get(p, 0.0)))
            <= 1e-9 * max(1.0, ledger[p]["rho_spent"]) for p in ledger)


#: Crash points within a stage (``STAGE@POINT``; see sim.faults.synth_crash).
CRASH_POINTS_ROUND = ("planned", "collected", "unmask", "revealed")
CRASH_POINTS = {"schema": ("collected",), "keys": ("collected", "marked"),
                "seeds": ("collected", "marked")}


def _merge_reopened(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """metrics.json after a reopened run (a workload update): the new figures, with what
    only the earlier runs recorded kept (a scenario's block, faults, pauses), the updates
    accumulated, and the first run's wall time kept beside the reopening's."""
    out = {**{k: v for k, v in before.items() if k not in after}, **after}
    out["faults"] = list(before.get("faults", [])) + list(after.get("faults", []))
    out["party_deaths"] = (list(before.get("party_deaths", []))
                           + list(after.get("party_deaths", [])))
    out["workload_updates"] = (list(before.get("workload_updates", []))
                               + list(after.get("workload_updates", [])))
    out["wall_s"] = before.get("wall_s", after.get("wall_s"))
    out["reopen_wall_s"] = list(before.get("reopen_wall_s", [])) + [after.get("wall_s")]
    return out


def _nothing_to_do(run_dir: Path, queries: Mapping[str, Any]) -> str | None:
    """Why reopening ``run_dir`` for ``queries`` would change nothing (no marginal to
    measure or no reserve to measure it with, and no weights), or None."""
    from synth.workload import measured_cliques, parse_workload

    schema = read_json(run_dir / "schema.json") or {"columns": []}
    up = parse_workload(queries, [str(c["name"]) for c in schema["columns"]])
    if up.weights:
        return None
    measured = measured_cliques(run_dir)
    missing = [c for c in up.marginals if frozenset(c) not in measured]
    if not missing:
        return "every marginal of the update was measured already"
    ckpt = read_json(run_dir / "stages" / "checkpoint.json") or {}
    left = ckpt.get("stream_rho_left")
    if left is not None and not float(left) > 0:
        from synth.config import migrate_synth_table

        metrics = read_json(run_dir / "metrics.json") or {}
        conf = migrate_synth_table(metrics.get("config") or {})  # either layout
        frac = (conf.get("stream") or {}).get("rho_frac", 0)
        return ("no stream reserve of rho: the run was made with synth.stream.rho_frac = 0 "
                "(set it > 0 before the run)" if not frac else
                "the stream reserve of rho is used up by earlier updates")
    return None


#: A run in progress holds this file in its directory (the launcher's pid).
RUN_LOCK = "run.lock"


def run_in_progress(run_dir: Path) -> bool:
    """Whether a launcher process is running the job in ``run_dir``."""
    import psutil

    try:
        pid = int((Path(run_dir) / RUN_LOCK).read_text())
    except (OSError, ValueError):
        return False
    return bool(psutil.pid_exists(pid))


def add_workload(run_dir: str | Path, queries: Mapping[str, Any], *,
                 timeout_s: float | None = None, quiet: bool = False,
                 compare_full: bool = False, wait_s: float = 3600.0,
                 keys_dir: str | None = None, insecure: bool = False) -> dict[str, Any]:
    """``psfl synth add-workload``: queue a workload update for a run and apply it.

    A run in progress gets it through its directory (its coordinator applies queued
    updates after its rounds); if the update is still queued when that run ends, or the
    run had finished already, the run is reopened (:func:`run_synth` with ``reopen``):
    the parties start again with their ledgers, the coordinator resumes from its
    checkpoint, measures only the missing marginals in a new secure-aggregation session and
    refits incrementally from the saved model.

    Args:
        run_dir: a FedForge run directory (``psfl synth run --out``).
        queries: the update (:func:`synth.workload.parse_workload`).
        timeout_s: deadline of the reopened job, seconds.
        compare_full: also refit from scratch and report both (``stream.compare_full``).
        wait_s: how long to wait for a run in progress to end, seconds.

    Returns:
        The update's report (``workload/applied/<file>``'s ``report``) and the run's
        metrics under ``"metrics"``.

    Raises:
        synth.workload.WorkloadError: bad queries, or no run in ``run_dir``.
        LaunchError, JobTimeout: as :func:`run_synth`; TimeoutError: the run in progress
            did not end within ``wait_s``.
    """
    from synth.config import load_synth_config

    run_dir = Path(run_dir)
    path = submit_workload(run_dir, queries)
    deadline = time.monotonic() + wait_s
    while run_in_progress(run_dir):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the run in {run_dir} did not end within {wait_s:.0f} s; "
                               f"the update stays queued as {path}")
        time.sleep(0.5)
    applied = run_dir / "workload" / "applied" / path.name
    if not applied.exists():
        if not (run_dir / "metrics.json").exists():
            raise WorkloadError(f"the run in {run_dir} did not finish (no metrics.json); "
                                f"the update stays queued as {path}")
        why = _nothing_to_do(run_dir, queries)
        if why is not None:  # refused without reopening: the run stays as it is
            status = "refused" if "reserve" in why else "nothing to measure"
            mark_applied(run_dir, path, {"status": status, "reason": why, "reopened": False})
            return {"status": status, "reason": why, "name": path.stem, "reopened": False,
                    "metrics": json.loads((run_dir / "metrics.json").read_text())}
        cfg = load_synth_config(run_dir / "config.toml",  # the run's own: either layout
                                ["stream.compare_full=true"] if compare_full else [],
                                saved=True)
        run_synth(cfg, run_dir, reopen=True, timeout_s=timeout_s, quiet=quiet,
                  keys_dir=keys_dir, insecure=insecure)
    doc = read_json(applied) or {}
    return {**doc.get("report", {}),
            "metrics": json.loads((run_dir / "metrics.json").read_text())}


__all__ = ["LaunchHooks", "RUN_LOCK", "add_ledgers", "add_workload", "coordinator_stages", "prepare_data",
           "read_ledgers", "run_in_progress", "run_synth"]
