"""Command line of the broker: ``run`` (serve) and ``stats`` (query a running broker)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson
import zmq

from pubsub.cli import INSECURE_WARNING, add_security_arguments, run_guarded, security_from_args
from pubsub.config import ConfigError, deep_merge, from_mapping, load_toml, parse_overrides
from pubsub.logs import configure_logging

from broker.proxy import Broker, BrokerConfig, request_stats


def add_subcommands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``run`` and ``stats`` on an argparse sub-parser group."""
    run = sub.add_parser("run", help="run a broker (control on PORT+2; with --keys one publish "
                         "and one read port per role from PORT+3; --insecure: XSUB on PORT, "
                         "XPUB on PORT+1)")
    run.add_argument("--bind", help="base address tcp://HOST:PORT (PORT 0 = pick free ports)")
    run.add_argument("--config", help="TOML file with a [broker] table")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set broker.sndhwm=1000")
    run.add_argument("--ready-file", help="write the bound address here once listening")
    run.add_argument("--events", help="append JSON log lines to this file")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                     help="least level printed to stderr")
    run.add_argument("--policy", help="topic permissions per role (TOML; default: the packaged "
                     "broker/default_policy.toml)")
    run.add_argument("--members", help="run membership (TOML: [runs.<id>] identities = [...]); "
                     "only a run's members publish in it and read it")
    run.add_argument("--run", action="append", default=[], metavar="RUN=NAME,NAME",
                     help="a run's members inline (repeatable; admits them to the run, its "
                     "alignment and its predictions), e.g. --run r1=active,passive")
    run.add_argument("--open-runs", action="store_true",
                     help="with --keys and no membership: admit any key of the allow-list "
                     "to every run (not isolated; by default such a broker refuses to start)")
    add_security_arguments(run, kind="broker")
    run.set_defaults(func=cmd_run)
    st = sub.add_parser("stats", help="print a running broker's counters as JSON")
    st.add_argument("--broker", default="tcp://127.0.0.1:5555", help="broker base address")
    st.add_argument("--timeout-s", type=float, default=2.0, help="reply deadline, seconds")
    add_security_arguments(st)
    st.set_defaults(func=cmd_stats)


def load_broker_config(path: str | None, sets: Sequence[str], bind: str | None,
                       keys: str | None = None, policy: str | None = None,
                       members: str | None = None, runs: Sequence[str] = (),
                       open_runs: bool = False) -> BrokerConfig:
    """Effective :class:`BrokerConfig` from a TOML file, ``--set`` items, ``--bind``,
    ``--keys``, ``--policy``, ``--members``, ``--run`` and ``--open-runs``.

    Raises:
        ConfigError: unknown keys or bad values.
        InsecureTransport: no keys and a non-loopback ``bind``.
    """
    data = load_toml(path) if path else {}
    unknown = set(data) - {"broker"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown section (expected [broker])")
    over = parse_overrides(sets)
    flat = {k: v for k, v in over.items() if k != "broker"}  # --set sndhwm=... means broker.sndhwm
    table = deep_merge(dict(data.get("broker", {})), over.get("broker", {}))
    table = deep_merge(table, flat)
    if bind:
        table["bind"] = bind
    if keys:
        table["keys_dir"] = keys
    if policy:
        table["policy_file"] = policy
    if members:
        table["members_file"] = members
    if runs:
        table["runs"] = list(runs)
    if open_runs:
        table["open_runs"] = True
    return from_mapping(BrokerConfig, table, section="broker")


def cmd_run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM."""
    configure_logging(events_path=args.events, stderr_level=args.log_level, party="broker")
    if args.keys and args.insecure:
        raise ConfigError("insecure", "give --keys DIR or --insecure, not both")
    cfg = load_broker_config(args.config, args.set, args.bind, args.keys, args.policy,
                             args.members, getattr(args, "run", ()),
                             getattr(args, "open_runs", False))
    if not cfg.keys_dir:
        if not args.insecure:
            raise ConfigError("keys", "transport security is on by default: give --keys DIR "
                              "(see `psfl keys generate broker ...`), or --insecure for "
                              "plaintext on a loopback --bind")
        print(INSECURE_WARNING, file=sys.stderr)
        print("warning: a plaintext broker has no identities: its runs are not isolated "
              "from one another (any client may publish and read any run's topics)",
              file=sys.stderr)
    broker = Broker(cfg)
    try:
        addr = broker.bind()
    except zmq.ZMQError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    broker.install_signal_handlers()
    if args.ready_file:
        tmp = Path(args.ready_file).with_suffix(".tmp")
        tmp.write_text(str(addr))
        os.replace(tmp, args.ready_file)
    if broker.secure:
        print(f"broker listening at {addr} (CURVE; control :{addr.port + 2}, role endpoints "
              f":{addr.port + 3}..:{addr.port + broker.n_ports - 1}; roles "
              f"{', '.join(broker.policy.names) if broker.policy else ''}; "
              f"{len(broker._certs)} allowed keys; {broker.isolation})", flush=True)
        if cfg.open_runs:
            print("warning: --open-runs: any key of the allow-list may read and publish "
                  "its role's topics in every run (runs not isolated)", file=sys.stderr)
    else:
        print(f"broker listening at {addr} (plaintext; publishers :{addr.port}, subscribers "
              f":{addr.port + 1}, control :{addr.port + 2})", flush=True)
    broker.run()
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Print counters of a running broker."""
    if args.keys and not args.identity:
        raise ConfigError("identity", "with --keys, name the key to use: --identity NAME")
    security = security_from_args(args, args.broker, identity=args.identity or "")
    stats = request_stats(args.broker, timeout_s=args.timeout_s, security=security)
    sys.stdout.write(orjson.dumps(stats, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m broker``."""
    parser = argparse.ArgumentParser(prog="python -m broker", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_subcommands(sub)
    args = parser.parse_args(argv)
    return run_guarded(lambda: args.func(args))
