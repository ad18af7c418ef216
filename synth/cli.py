"""Entry points of FedForge's processes: ``python -m synth {coordinator,aggregators,parties}``.

Each process joins the broker and runs its participants (one coordinator; any number of
aggregators or parties as asyncio tasks, each with its own bus connection), so a
deployment can place them on any hosts that reach the broker over TCP.

Exit codes: 0 success, 1 internal failure (e.g. a refused privacy budget), 2 bad config
or data, 3 broker unreachable, 4 a participant missing or silent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from pubsub.cli import BAD_INPUT_ERRORS, BROKER_ERRORS, add_security_arguments, security_from_args
from pubsub.config import ConfigError
from pubsub.logs import configure_logging
from pubsub.runner import run as run_loop
from synth.config import SynthConfig, load_synth_config
from synth.domain import DomainError

EXIT_BAD_INPUT, EXIT_BROKER, EXIT_PEER, EXIT_FAILED = 2, 3, 4, 1


def read_table(path: str | Path) -> Any:
    """A CSV (optionally gzipped) or Parquet table as a pandas DataFrame.

    Raises:
        ConfigError: the file is missing or not a table.
    """
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise ConfigError("synth.dataset", f"no such file: {str(p)!r}")
    try:
        if p.suffix == ".parquet":
            return pd.read_parquet(p)
        return pd.read_csv(p)
    except Exception as exc:  # noqa: BLE001 - pandas raises many types for bad files
        raise ConfigError("synth.dataset", f"cannot read {str(p)!r}: {exc}") from None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", required=True, help="broker base address tcp://HOST:PORT")
    p.add_argument("--config", help="TOML file with a [synth] table")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--run-id", required=True, help="run id (topic namespace)")
    p.add_argument("--events", help="append JSON log lines here")
    p.add_argument("--rusage-out", help="write this process's CPU seconds and peak RSS "
                   "here (JSON) when it ends (benchmarks)")
    add_security_arguments(p)


def write_rusage(path: str | Path, *, startup_cpu_s: float) -> None:
    """``{"cpu_s", "startup_cpu_s", "peak_rss_bytes"}`` of this process (all threads) as
    JSON: ``cpu_s`` is user + system seconds of its whole life, ``startup_cpu_s`` the part
    spent before its participants started (interpreter, imports, config)."""
    import resource

    from synth.netutil import peak_rss_bytes

    ru = resource.getrusage(resource.RUSAGE_SELF)
    Path(path).write_text(json.dumps({"cpu_s": ru.ru_utime + ru.ru_stime,
                                      "startup_cpu_s": startup_cpu_s,
                                      "peak_rss_bytes": peak_rss_bytes()}))


async def _parties(cfg: SynthConfig, args: argparse.Namespace) -> list[dict[str, Any]]:
    from synth.party import SynthParty

    ids = [i for i in args.ids.split(",") if i]
    if args.data:  # a branch's own file on its own host (CSV or Parquet)
        if len(ids) != 1:
            raise ConfigError("--data", f"is one party's own file: give one id with it, got "
                              f"--ids {args.ids!r} (several parties: --data-dir)")
        frames = [await asyncio.to_thread(read_table, args.data)]
    else:
        frames = [await asyncio.to_thread(read_table, Path(args.data_dir) / f"{i}.parquet")
                  for i in ids]
    seeds = ([None] * len(ids) if cfg.noise_seed is None
             else [cfg.noise_seed * 100_003 + k for k in range(len(ids))])
    ledgers = Path(args.state_dir) if args.state_dir else None
    if ledgers is not None:
        ledgers.mkdir(parents=True, exist_ok=True)
    parties = [SynthParty(i, f, cfg=cfg, broker=args.broker, run_id=args.run_id, noise_seed=s,
                          security=args.security,
                          ledger_file=str(ledgers / f"{i}.ledger.json") if ledgers else None)
               for i, f, s in zip(ids, frames, seeds, strict=True)]
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(p.run()) for p in parties]
    return [t.result() for t in tasks]


async def _aggregators(cfg: SynthConfig, args: argparse.Namespace) -> list[dict[str, Any]]:
    from synth.aggregator import Aggregator

    aggs = [Aggregator(i, cfg=cfg, broker=args.broker, run_id=args.run_id,
                       security=args.security)
            for i in args.ids.split(",") if i]
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(a.run()) for a in aggs]
    return [t.result() for t in tasks]


def _load_engine(cfg: SynthConfig) -> None:
    """Import the synthesis engine's package (torch about 1.1 s, mbi/jax 0.7 s here).

    The coordinator awaits this in a worker thread before its first stage, while the
    parties start, and never while a stage runs: scipy's array-namespace checks look a
    module up in ``sys.modules`` at call time, and a half-imported jax there (an import
    running on another thread while the coordinator plans a round) made them fail with
    ``partially initialized module 'jax' has no attribute 'Array'``."""
    try:
        if cfg.resolved_engine() == "mbi":
            from synth.engine import _import_mbi

            _import_mbi()
        else:
            import torch

            torch.set_num_threads(cfg.engine.threads)
    except ImportError:
        pass  # the fit reports the missing engine with its install hint


async def _coordinator(cfg: SynthConfig, args: argparse.Namespace,
                       on_point: Callable[[str], Awaitable[None]] | None = None
                       ) -> dict[str, Any]:
    from synth.coordinator import Coordinator, EvalData
    from synth.domain import Schema

    await asyncio.to_thread(_load_engine, cfg)

    schema = Schema.from_dict(json.loads(Path(args.schema).read_text()))
    ev = None
    if args.eval_dir:
        d = Path(args.eval_dir)
        ev = EvalData(train=read_table(d / "train.parquet"),
                      holdout=read_table(d / "holdout.parquet"))
    coord = Coordinator(cfg, schema, broker=args.broker, run_id=args.run_id,
                        out=Path(args.out), eval_data=ev, security=args.security,
                        resume=args.resume, on_point=on_point)
    return await coord.run()


def _exit_code(exc: BaseException) -> int | None:
    from synth.coordinator import CoordinatorError
    from synth.netutil import ParticipantError

    if isinstance(exc, BaseExceptionGroup):
        codes = [_exit_code(e) for e in exc.exceptions]
        known = [c for c in codes if c is not None]
        return known[0] if known else None
    if isinstance(exc, (*BAD_INPUT_ERRORS, DomainError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, BROKER_ERRORS):
        return EXIT_BROKER
    if isinstance(exc, CoordinatorError | ParticipantError):
        return exc.code
    return None


def _message(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_message(e) for e in exc.exceptions)
    return str(exc)


def main(argv: Sequence[str] | None = None, *,
         on_point: Callable[[str], Awaitable[None]] | None = None) -> int:
    """``python -m synth ROLE --broker tcp://HOST:PORT --run-id ID [...]``.

    ``on_point``: the coordinator's observer of its named points (see
    :meth:`synth.coordinator.Coordinator._crash_point`); :mod:`sim.faults.synth_party` uses it
    to kill the process there."""
    ap = argparse.ArgumentParser(prog="python -m synth", description="Run FedForge processes.")
    sub = ap.add_subparsers(dest="role", required=True)
    c = sub.add_parser("coordinator", help="the coordinator (one per run)")
    _common(c)
    c.add_argument("--schema", required=True, help="the public schema (schema.json)")
    c.add_argument("--out", required=True, help="run directory (metrics.json, synthetic.csv)")
    c.add_argument("--eval-dir", help="evaluation-only data: train.parquet, holdout.parquet")
    c.add_argument("--resume", action="store_true",
                   help="continue the run from OUT/stages/checkpoint.json (after a crash)")
    a = sub.add_parser("aggregators", help="aggregator nodes (comma-separated ids)")
    _common(a)
    a.add_argument("--ids", required=True)
    p = sub.add_parser("parties", help="data-holding parties (comma-separated ids)")
    _common(p)
    p.add_argument("--ids", required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", help="holds <id>.parquet for each party")
    where.add_argument("--data", help="one party's own table (CSV or Parquet; one id): a "
                       "branch running its party on its own host")
    p.add_argument("--state-dir", help="each party keeps its privacy ledger here "
                   "(<id>.ledger.json, rewritten atomically before each release)")
    args = ap.parse_args(argv)
    try:
        identity = {"coordinator": "coordinator", "aggregators": "aggregator",
                    "parties": "party"}[args.role]
        args.security = security_from_args(args, args.broker, identity=identity)
        # a resumed coordinator reads its run's own config.toml, maybe of the flat layout
        cfg = load_synth_config(args.config, args.set,
                                saved=bool(getattr(args, "resume", False)))
        configure_logging(events_path=args.events, party=args.role, run_id=args.run_id)
        role = {"coordinator": _coordinator, "aggregators": _aggregators,
                "parties": _parties}[args.role]
        startup_cpu_s = time.process_time()
        try:
            coro = (_coordinator(cfg, args, on_point) if args.role == "coordinator"
                    else role(cfg, args))
            result = run_loop(coro, event_loop="uvloop")
        finally:
            if args.rusage_out:
                write_rusage(args.rusage_out, startup_cpu_s=startup_cpu_s)
    except BaseException as exc:  # noqa: BLE001 - mapped to exit codes below
        if isinstance(exc, KeyboardInterrupt):
            return 130
        code = _exit_code(exc)
        if code is None:
            raise
        print(f"error ({args.role}): {_message(exc)}", file=sys.stderr)
        return code
    if args.role == "coordinator":
        tv = result.get("avg_tv")
        print("coordinator done: " + (f"avg_tv {tv:.4f}" if tv is not None else
                                      "quality skipped (no --eval-dir)")
              + f", wall {result['wall_s']:.1f} s", flush=True)
    return 0


__all__ = ["main", "read_table", "write_rusage"]
