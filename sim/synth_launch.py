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

import contextlib
import json
import math
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.launch import LaunchResult, OutDirError, _spawn, _stop, run_security, start_broker
from sim.launch import wait_children

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
        raise ConfigError("synth.drop_columns", f"no column(s) {unknown} in {cfg.dataset!r}")
    frame = frame.drop(columns=list(drop))
    if not cfg.label and named_label:
        cfg = replace(cfg, label=named_label)
    if cfg.label and cfg.label not in frame.columns:
        raise ConfigError("synth.label", f"no column {cfg.label!r} in {cfg.dataset!r} "
                          f"(columns: {', '.join(map(str, frame.columns))})")
    frame = frame.reset_index(drop=True)
    try:
        train_idx, hold_idx = holdout_split(len(frame), cfg.holdout_frac, cfg.seed)
    except ValueError as exc:
        raise ConfigError("synth.holdout_frac", str(exc)) from None
    train, holdout = frame.iloc[train_idx], frame.iloc[hold_idx]
    schema = infer_schema(train, numeric_bins=cfg.numeric_bins, binning=cfg.binning)  # type: ignore[arg-type]
    groups = None
    if cfg.split == "dirichlet":
        col = cfg.split_column or cfg.label
        if not col or col not in train.columns:
            raise ConfigError("synth.split_column", f"unknown split column {col!r}")
        groups = train[col].astype(str).to_numpy()
    try:
        parts = party_split(len(train), cfg.parties, seed=cfg.seed, how=cfg.split,
                            groups=groups, alpha=cfg.dirichlet_alpha)
    except ValueError as exc:
        raise ConfigError("synth.parties", str(exc)) from None
    d = out / "data"
    (d / "parties").mkdir(parents=True, exist_ok=True)
    train.to_parquet(d / "train.parquet", index=False)
    holdout.to_parquet(d / "holdout.parquet", index=False)
    ids = cfg.party_ids()
    for pid, rows in zip(ids, parts, strict=True):
        train.iloc[rows].to_parquet(d / "parties" / f"{pid}.parquet", index=False)
    (out / "schema.json").write_text(json.dumps(schema.to_dict(), indent=1))
    info = {"rows": {p: int(len(r)) for p, r in zip(ids, parts, strict=True)},
            "holdout_rows": int(len(holdout)), "train_rows": int(len(train)),
            "columns": list(schema.names), "domain_sizes": list(schema.domain.sizes)}
    return cfg, info


def run_synth(cfg: SynthConfig, out: str | Path, *, broker: str | None = None,
              run_id: str | None = None, timeout_s: float | None = None,
              quiet: bool = False, keys_dir: str | None = None,
              insecure: bool = False, rusage: bool = False) -> LaunchResult:
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
        rusage: each coordinator, aggregators and parties process writes its CPU
            seconds and peak RSS to ``out/rusage/<process>.json`` when it ends; they are
            copied into ``metrics["process_rusage"]`` (benchmarks).

    Returns:
        :class:`sim.launch.LaunchResult` (``metrics`` as in ``metrics.json``).

    Raises:
        LaunchError: a process failed (its exit code is carried).
        JobTimeout: ``timeout_s`` passed.
        OutDirError: ``out`` cannot be used.
        parties.data.DataError, synth.domain.DomainError, pubsub.config.ConfigError: bad
            data or config (checked before any process starts).
    """
    t0 = time.perf_counter()
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("metrics.json", "synthetic.csv", "broker.addr"):
            (out / stale).unlink(missing_ok=True)
        events = out / "events.jsonl"
        events.write_text("")
    except OSError as exc:
        raise OutDirError(f"cannot use {str(out)!r} as the run directory: "
                          f"{exc.strerror or exc}") from None
    cfg, info = prepare_data(cfg, out)
    (out / "config.toml").write_text(dump_synth_config(cfg))
    run_id = run_id or uuid.uuid4().hex[:8]
    ids = cfg.party_ids()
    tree = build_tree(ids, cfg.fanout, cfg.root_children)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stack = contextlib.ExitStack()
    try:
        sec = stack.enter_context(run_security(SYNTH_IDENTITIES, keys_dir=keys_dir,
                                               insecure=insecure, broker=broker))
        if broker is None:
            procs["broker"], broker = start_broker(out, events, security=sec)
        common = ["--config", str(out / "config.toml"), "--broker", broker,
                  "--run-id", run_id, "--events", str(events), *sec.client_args]
        py = [sys.executable, "-m", "synth"]
        ru_dir = out / "rusage"
        if rusage:
            shutil.rmtree(ru_dir, ignore_errors=True)
            ru_dir.mkdir()

        def ru(name: str) -> list[str]:
            return ["--rusage-out", str(ru_dir / f"{name}.json")] if rusage else []

        procs["coordinator"] = _spawn([*py, "coordinator", *common, "--schema",
                                       str(out / "schema.json"), "--out", str(out),
                                       "--eval-dir", str(out / "data"), *ru("coordinator")],
                                      quiet=quiet)
        procs["aggregators"] = _spawn([*py, "aggregators", *common, "--ids",
                                       ",".join(tree.aggregators), *ru("aggregators")],
                                      quiet=quiet)
        per = cfg.parties_per_process
        for j in range(math.ceil(len(ids) / per)):
            chunk = ids[j * per:(j + 1) * per]
            procs[f"parties{j}"] = _spawn([*py, "parties", *common, "--ids", ",".join(chunk),
                                           "--data-dir", str(out / "data" / "parties"),
                                           *ru(f"parties{j}")], quiet=quiet)
        workers = {k: v for k, v in procs.items() if k != "broker"}
        wait_children(workers, watch={"broker": procs["broker"]} if "broker" in procs else None,
                      timeout_s=timeout_s)
    finally:
        for name in sorted(procs, key=lambda n: n == "broker"):
            _stop(procs[name])
        stack.close()
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["security"] = sec.describe()
    metrics["wall_s"] = time.perf_counter() - t0
    metrics["data"] = info
    if rusage:
        metrics["process_rusage"] = {f.stem: json.loads(f.read_text())
                                     for f in sorted((out / "rusage").glob("*.json"))}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
    return LaunchResult(metrics=metrics, out=out)


__all__ = ["prepare_data", "run_synth"]
