"""Entry point of one party process: ``python -m parties {active,passive,passive2,...} ...``
(the party's id: its role, and with several passive parties which one it is).

Exit codes: 0 success, 1 internal failure (a worker process died, or a publication would
have passed the calibrated privacy budget), 2 bad config,
data or run directory, 3 broker unreachable, 4 partner problem (not found,
mismatched, lost), 5 job timeout (``psfl vfl run --timeout-s``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pubsub.cli import add_security_arguments, security_from_args
from pubsub.config import ConfigError
from pubsub.logs import configure_logging
from pubsub.runner import run as run_loop

from parties.config import (MAX_PASSIVE_PARTIES, VflConfig, check_run_id, load_vfl_config,
                            passive_party_ids, role_of)
from parties.runtime.exitcodes import ExitCode, exit_code_for  # noqa: F401 (re-exported)
from parties.runtime.report import format_metric
from parties.runtime.serve import finish_party, metrics_file, write_json  # noqa: F401 (re-exported)


#: every party id ``python -m parties`` accepts
PARTY_IDS = ("active", *passive_party_ids(MAX_PASSIVE_PARTIES))


def add_party_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``python -m parties ROLE`` and ``psfl vfl party``."""
    p.add_argument("--broker", required=True, help="broker base address tcp://HOST:PORT")
    p.add_argument("--config", help="TOML file with a [vfl] table")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set epochs=3")
    p.add_argument("--run-id", default="vfl", help="run id, the same on both parties")
    p.add_argument("--out", help="directory for this party's metrics (active: metrics.json)")
    p.add_argument("--events", help="append JSON log lines here (default: OUT/events.jsonl)")
    p.add_argument("--quiet", action="store_true", help="no per-epoch progress lines")
    add_security_arguments(p)


async def _serve(role: str, cfg: VflConfig, args: argparse.Namespace) -> dict[str, Any]:
    from parties.runtime.serve import serve_party

    return await serve_party(role, cfg, run_id=args.run_id,
                             out=Path(args.out) if args.out else None, broker=args.broker,
                             security=args.security, progress=not args.quiet)


def run_party(role: str, args: argparse.Namespace) -> int:
    """Run one party to completion; map errors to :class:`ExitCode` with a one-line message."""
    t0 = time.perf_counter()
    out = Path(args.out) if args.out else None
    events = args.events or (str(out / "events.jsonl") if out else None)
    try:
        check_run_id(args.run_id)
        args.security = security_from_args(args, args.broker, identity=role)
        cfg = load_vfl_config(args.config, args.set)
        if role not in cfg.party_ids:
            raise ConfigError("party", f"{role!r} is not a party of this run (vfl."
                              f"passive_parties = {cfg.passive_parties}: "
                              f"{', '.join(cfg.party_ids)})")
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
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        print(f"error ({role} party): {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print(f"{role} party interrupted", file=sys.stderr)
        return 130
    finish_party(role, cfg, result, out, t0)
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
        else:
            print(f"{role} party done: {result['batches']} batches, cpu_util "
                  f"{result['cpu_util']:.2f}, party process {result['wall_s']:.1f} s", flush=True)
    return ExitCode.OK


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
