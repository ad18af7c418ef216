"""Entry point of one party process: ``python -m parties {active,passive,passive2,...} ...``
(the party's id: its role, and with several passive parties which one it is).

Exit codes: 0 success, 1 internal failure (a worker process died, or a publication would
have passed the calibrated privacy budget), 2 bad config,
data or run directory, 3 broker unreachable, 4 partner problem (not found,
mismatched, lost), 5 job timeout (``psfl vfl run --timeout-s``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pubsub.cli import add_security_arguments, security_from_args
from pubsub.config import ConfigError
from pubsub.logs import configure_logging
from pubsub.outputs import RunDirLock
from pubsub.runner import run as run_loop

from parties.config import (MAX_PASSIVE_PARTIES, Job, VflConfig, check_run_id, load_job,
                            load_vfl_config, passive_party_ids, role_of)
from parties.runtime.exitcodes import ExitCode, exit_code_for  # noqa: F401 (re-exported)
from parties.runtime.report import format_metric
from parties.runtime.serve import finish_party, metrics_file, write_json  # noqa: F401 (re-exported)


#: every party id ``python -m parties`` accepts
PARTY_IDS = ("active", *passive_party_ids(MAX_PASSIVE_PARTIES))


def add_party_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``python -m parties ROLE`` and ``psfl vfl party``."""
    p.add_argument("--job", help="the job file every organisation holds (job.toml: [job] "
                   "with run_id, broker, join_key; [vfl]); with --data, this party aligns "
                   "its file on the join key with the others' (PSI), then trains")
    p.add_argument("--data", help="with --job: this party's own file (CSV or Parquet) with "
                   "the join key column (the active party's also with the label)")
    p.add_argument("--broker", help="broker base address tcp://HOST:PORT (required without "
                   "--job; with it, the job's)")
    p.add_argument("--config", help="TOML file with a [vfl] table (not with --job)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set epochs=3")
    p.add_argument("--run-id", help="run id, the same on both parties (default vfl; with "
                   "--job the job's)")
    p.add_argument("--out", help="directory for this party's metrics (active: metrics.json)")
    p.add_argument("--events", help="append JSON log lines here (default: OUT/events.jsonl)")
    p.add_argument("--quiet", action="store_true", help="no per-epoch progress lines")
    add_security_arguments(p)


async def _serve(role: str, cfg: VflConfig, args: argparse.Namespace) -> dict[str, Any]:
    from parties.runtime.serve import serve_party

    return await serve_party(role, cfg, run_id=args.run_id,
                             out=Path(args.out) if args.out else None, broker=args.broker,
                             security=args.security, progress=not args.quiet)


def _load(role: str, args: argparse.Namespace) -> tuple[Job | None, VflConfig]:
    """The party's configuration: the job file's (``--job``, with the party's own
    ``--data``) or ``--config``'s; ``args.broker`` and ``args.run_id`` defaulted.

    Raises:
        ConfigError: a bad file or value, options that do not go together, a party id
            that is not one of the run's.
        parties.data.DataError: with ``--job``, this party's own file refused
            (:func:`parties.data.launchcheck.check_own_file`).
    """
    job: Job | None = None
    if getattr(args, "job", None):
        if args.config:
            raise ConfigError("--config", "goes without --job (the job file holds [vfl])")
        if not getattr(args, "data", None):
            raise ConfigError("--data", "with --job, give this party's own file")
        job = load_job(args.job, args.set, data=args.data)
        cfg = job.vfl
        args.broker = args.broker or job.job.broker
        args.run_id = args.run_id or job.job.run_id
    else:
        if getattr(args, "data", None):
            raise ConfigError("--data", "goes with --job (or set dataset in --config)")
        if not args.broker:
            raise ConfigError("--broker", "required (or --job, whose broker it takes)")
        cfg = load_vfl_config(args.config, args.set)
        args.run_id = args.run_id or "vfl"
    if role not in cfg.party_ids:
        raise ConfigError("party", f"{role!r} is not a party of this run (vfl."
                          f"passive_parties = {cfg.passive_parties}: "
                          f"{', '.join(cfg.party_ids)})")
    if job is not None:
        from parties.data.launchcheck import check_own_file

        cols = check_own_file(cfg, role)
        if cfg.dp.enabled and role_of(role) == "passive":  # its public schema, before joining
            if cfg.dp.schema is None:
                raise ConfigError("vfl.dp.schema", "DP is on: this party's features are "
                                  "encoded from its reviewed public schema; draft it with "
                                  f"`psfl vfl schema --job {args.job} --role {role} --data "
                                  f"{args.data} --out schema.toml`, review it, then --set "
                                  "dp.schema=schema.toml")
            if cols:
                from parties.data.schema import dp_schema

                dp_schema(cfg, cols)  # SchemaError: missing file, undeclared column
        if not args.quiet:
            print(f"{job.organisation(role)} ({role}): job {job.job.run_id} (digest "
                  f"{job.digest}), broker {args.broker}, join key {job.job.join_key!r}, "
                  f"own file {args.data}" + (f": {len(cols)} feature columns" if cols else ""),
                  flush=True)
    return job, cfg


def _align_job(job: Job, cfg: VflConfig, role: str, args: argparse.Namespace
               ) -> tuple[int, VflConfig]:
    """Align the party's own file (:func:`parties.alignment.own_file.align_own_file`) into
    ``OUT/align``; the configuration with its aligned rows."""
    from parties.alignment.own_file import align_own_file, with_own_rows_file

    if not args.out:
        raise ConfigError("--out", "with --job, give this party's output directory (its "
                          "aligned rows, metrics and model part go there)")
    code, rows = align_own_file(job, role, args.data, Path(args.out) / "align",
                                run_id=f"{args.run_id}-align", security=args.security,
                                quiet=args.quiet)
    return code, (with_own_rows_file(cfg, role, rows) if code == 0 else cfg)


def run_party(role: str, args: argparse.Namespace) -> int:
    """Run one party to completion; map errors to :class:`ExitCode` with a one-line message.

    With ``--out`` the party holds that directory's lock (:class:`pubsub.outputs.RunDirLock`)
    for its run: a second run into it is refused at once (exit 2), unless the launcher
    that started this party holds it."""
    t0 = time.perf_counter()
    out = Path(args.out) if args.out else None
    events = args.events or (str(out / "events.jsonl") if out else None)
    lock = contextlib.ExitStack()
    try:
        if out is not None:
            lock.enter_context(RunDirLock(out, run_id=args.run_id,
                                          command=f"psfl vfl party {role}"))
        return _run_party(role, args, out, events, t0)
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        print(f"error ({role} party): {exc}", file=sys.stderr)
        return code
    finally:
        lock.close()


def _run_party(role: str, args: argparse.Namespace, out: Path | None, events: str | None,
               t0: float) -> int:
    try:
        job, cfg = _load(role, args)
        check_run_id(args.run_id)
        args.security = security_from_args(args, args.broker, identity=role)
        if job is not None:
            code, cfg = _align_job(job, cfg, role, args)
            if code:
                return code
        kind = role_of(role)
        if cfg.workers.cpus(kind):
            from parties.core.sysinfo import pin_process

            try:
                pin_process(cfg.workers.cpus(kind))
            except (ValueError, OSError) as exc:
                raise ConfigError(f"vfl.workers.{kind}_cpus", str(exc)) from None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        if not args.quiet and (kind == "active" or cfg.labels.protected):
            from parties.privacy.labels import PASSIVE_IGNORES, labels_line

            print(labels_line(cfg.labels, cfg.effective_task) if kind == "active"
                  else PASSIVE_IGNORES, file=sys.stderr, flush=True)
        configure_logging(events_path=events, party=role, run_id=args.run_id)
        import torch

        torch.set_num_threads(cfg.workers.threads_for(role))
        result = run_loop(_serve(role, cfg, args), event_loop=cfg.event_loop)
    except KeyboardInterrupt:  # a typed error: run_party's one line and exit code
        print(f"{role} party interrupted", file=sys.stderr)
        return 130
    finish_party(role, cfg, result, out, t0)  # OutputError: run_party's one line, exit 2
    path = metrics_file(out, role) if out is not None else None
    if not args.quiet:
        if role == "active":
            print(f"active party done: test_{result['metric_name']} "
                  f"{format_metric(result.get('metric'))}, "
                  f"{result['train_samples_per_s']:,.0f} samples/s, "
                  + (f"positive class {result['label_positive']!r}, "
                     if result.get("label_positive") else "")
                  + f"party process {result['wall_s']:.1f} s"
                  + (f"; metrics: {path}" if out is not None else ""), flush=True)
            dp = result.get("dp") or {}
            if dp.get("enabled"):
                print(f"dp (the passive parties' records): spent mu "
                      f"{format_metric(dp.get('mu'))}, epsilon {format_metric(dp.get('epsilon'))}"
                      f" at delta {dp.get('delta'):g}", flush=True)
            base = result.get("active_only") or {}
            if isinstance(base.get("test_metric"), float) and isinstance(result.get("metric"),
                                                                         float):
                print(f"active-only baseline (this party's columns alone, {base['model']}, "
                      f"same split): test_{result['metric_name']} {base['test_metric']:.4f}; "
                      f"this run {result['metric'] - base['test_metric']:+.4f}", flush=True)
        else:
            print(f"{role} party done: {result['batches']} batches, cpu_util "
                  f"{result['cpu_util']:.2f}, party process {result['wall_s']:.1f} s", flush=True)
    return ExitCode.OK


def run_job_predict(role: str, args: argparse.Namespace) -> int:
    """``psfl vfl predict RUN_DIR --job job.toml --role PARTY --data NEW.csv --out OUT``: one
    party's prediction on its own file of new records: align the file on the job's join
    key with the other parties' (namespace ``<run_id>-predict-align``), then predict the
    shared records with the party's saved part in ``RUN_DIR`` (its ``--out`` of training;
    namespace ``<run_id>-predict``). The active party writes ``OUT/predictions.csv`` (the
    join key's values, the prediction, the label when its file holds it) and
    ``OUT/predict.json``. Exit codes as :func:`run_party`'s."""
    from parties.alignment.own_file import align_own_file
    from parties.data.launchcheck import csv_header, parquet_header
    from parties.runtime.predict import PredictParty

    try:
        if not args.data:
            raise ConfigError("--data", "with --job, give this party's file of new records")
        job = load_job(args.job, data=args.data)
        if role not in job.vfl.party_ids:
            raise ConfigError("--role", f"{role!r} is not a party of this job "
                              f"({', '.join(job.vfl.party_ids)})")
        path = Path(args.data).expanduser()
        if not path.is_file():
            from parties.data import DatasetNotFound

            raise DatasetNotFound(path, "this party's file of new records (--data)")
        header = csv_header(path) or (parquet_header(path) or ([], {}))[0]
        if header and job.job.join_key not in header:
            from parties.data import UnknownColumn

            raise UnknownColumn([job.job.join_key], header)
        run_id = args.run_id or f"{job.job.run_id}-predict"
        check_run_id(run_id)
        broker = args.broker or job.job.broker
        security = security_from_args(args, broker, identity=role)
        out = Path(args.out)
        with RunDirLock(out, run_id=run_id, command=f"psfl vfl predict --role {role}"):
            code, rows = align_own_file(job, role, path, out / "align",
                                        run_id=f"{run_id}-align", security=security,
                                        quiet=args.quiet)
            if code:
                return code
            configure_logging(events_path=str(out / "events.jsonl"), party=role,
                              run_id=run_id)
            party = PredictParty(role, args.run_dir, broker=broker, run_id=run_id, out=out,
                                 data=str(path), id_column=job.job.join_key,
                                 security=security, timeout_s=args.wait_s,
                                 rows_file=str(rows))
            result = run_loop(party.run(), event_loop="asyncio")
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        print(f"error ({role} party, predict): {exc}", file=sys.stderr)
        return int(code)
    if not args.quiet:
        if role == "active":
            m = result.get("metric")
            print(f"predicted {result['rows']:,} shared new records: {out / 'predictions.csv'}"
                  + ("" if m is None else f"; {result['metric_name']} {format_metric(m)}"),
                  flush=True)
        else:
            print(f"{role} party: embeddings of {len(party.rows.rows):,} shared new records "
                  "sent", flush=True)
    return int(ExitCode.OK)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m parties {active,passive} --broker tcp://HOST:PORT [...]``, or
    ``python -m parties predict {active,passive} ...`` (:func:`parties.runtime.predict.main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["predict"]:
        from parties.runtime.predict import main as predict_main

        return predict_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m parties",
                                     description="Run one PubSub-VFL party.")
    parser.add_argument("role", choices=PARTY_IDS, metavar="PARTY",
                        help="active, passive, or passive2 .. passive9 (several passive "
                        "parties: vfl.passive_parties)")
    add_party_arguments(parser)
    args = parser.parse_args(argv)
    return int(run_party(args.role, args))


def child_main(argv: Sequence[str]) -> None:
    """``python -m parties ARGV`` in a process forked by a launcher (:mod:`parties.core.zygote`):
    the same command line, exit code and output, without the interpreter start."""
    from pubsub.cli import exit_now

    exit_now(main(argv))
