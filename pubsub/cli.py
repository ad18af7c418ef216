"""Shared command-line plumbing: map the bus's typed errors to one line and an exit code,
and the security options every client command takes (``--keys``, ``--identity``,
``--insecure``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from pubsub.address import BrokerAddress, InvalidAddress
from pubsub.config import ConfigError
from pubsub.errors import (
    AuthenticationFailed,
    BrokerUnreachable,
    ForbiddenTopic,
    InsecureTransport,
    KeyFileError,
    TooManySubscriptions,
)
from pubsub.outputs import OutputError, RunDirBusy
from pubsub.security import CurveClient, check_insecure_allowed

#: exit code for bad config or input
EXIT_BAD_INPUT = 2
#: exit code when no broker answers (or it refuses our key)
EXIT_BROKER_UNREACHABLE = 3

#: errors that mean bad input (exit 2): a bad config, address, key or topic, and an
#: output directory that cannot be used (a result file cannot be written: disk full,
#: read-only filesystem; another run holds the directory's lock)
BAD_INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, InvalidAddress, KeyFileError, InsecureTransport, ForbiddenTopic,
    TooManySubscriptions, OutputError, RunDirBusy)
#: errors that mean the broker cannot be used (exit 3)
BROKER_ERRORS: tuple[type[BaseException], ...] = (BrokerUnreachable, AuthenticationFailed)

def exit_now(code: object) -> None:
    """End a ``python -m ...`` entry point whose ``main`` returned ``code``: flush logging
    and the standard streams, then ``os._exit``, skipping the interpreter's teardown (with
    torch, scikit-learn and pandas loaded: 1.5-3 s of CPU for a full garbage collection of
    their module graphs and torch's destructors). Only for a ``__main__`` block, after
    ``main`` has closed and written everything it owns; an exception out of ``main``
    takes the normal path."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


INSECURE_WARNING = ("warning: --insecure: plaintext transport without authentication or topic "
                    "permissions (loopback only); use --keys DIR for anything else")


def run_guarded(fn: Callable[[], int]) -> int:
    """Call ``fn``; print bus/config errors as ``error: ...`` and return their exit code.

    Bad input (config, address, key files, plaintext off loopback, a forbidden topic)
    gives 2, an unreachable or refusing broker 3, Ctrl-C 130; other exceptions propagate.
    """
    try:
        return int(fn())
    except BAD_INPUT_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BROKER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BROKER_UNREACHABLE
    except KeyboardInterrupt:
        return 130


_KEYS_HELP = {
    "client": "CURVE keys: DIR/IDENTITY.key_secret and the broker's DIR/broker.key "
              "(`psfl keys generate`); a launcher without it makes keys for the run",
    "broker": "CURVE keys: DIR/broker.key_secret and the allow-list DIR/*.key, one per "
              "client with its role (`psfl keys generate`)",
    "launcher": "CURVE keys from `psfl keys generate broker ...` (default: fresh keys made "
                "for this run and deleted after it)",
}


def add_security_arguments(p: argparse.ArgumentParser, *, kind: str = "client") -> None:
    """``--keys DIR`` (CURVE), ``--identity NAME`` (clients only) and ``--insecure``.

    Args:
        kind: ``"client"`` (a process that connects: also ``--identity``), ``"broker"``
            or ``"launcher"`` (starts a broker and its clients).

    Raises:
        ValueError: unknown ``kind``.
    """
    if kind not in _KEYS_HELP:
        raise ValueError(f"kind must be one of {sorted(_KEYS_HELP)}, got {kind!r}")
    p.add_argument("--keys", metavar="DIR", help=_KEYS_HELP[kind])
    if kind == "client":
        p.add_argument("--identity", help="key name in --keys (default: the role)")
    p.add_argument("--insecure", action="store_true",
                   help="plaintext, no authentication: loopback addresses only (prints a warning)")


def security_from_args(args: argparse.Namespace, address: str | BrokerAddress, *,
                       identity: str) -> CurveClient | None:
    """The client's CURVE keys from ``--keys``/``--identity``, or None for ``--insecure``.

    Security is on by default: one of the two must be given.

    Raises:
        ConfigError: neither or both given.
        KeyFileError: the key files are missing, malformed or too widely readable.
        InsecureTransport: ``--insecure`` with a non-loopback address.
    """
    keys, insecure = getattr(args, "keys", None), getattr(args, "insecure", False)
    if keys and insecure:
        raise ConfigError("insecure", "give --keys DIR or --insecure, not both")
    if keys:
        return CurveClient.from_dir(keys, getattr(args, "identity", None) or identity)
    if insecure:
        check_insecure_allowed(address)
        print(INSECURE_WARNING, file=sys.stderr)
        return None
    raise ConfigError("keys", "transport security is on by default: give --keys DIR "
                      "(see `psfl keys generate`), or --insecure for plaintext on loopback")


def add_keys_subcommands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``generate`` (``psfl keys generate NAME ... --dir DIR``)."""
    gen = sub.add_parser("generate", help="write CURVE keypairs: DIR/NAME.key (public) and "
                         "DIR/NAME.key_secret (mode 0600)")
    gen.add_argument("names", nargs="+", metavar="NAME",
                     help="identities, e.g. broker active passive (the broker's is 'broker')")
    gen.add_argument("--dir", default="keys", help="output directory (created mode 0700)")
    gen.add_argument("--role", help="broker role of the keys (default: the NAME itself, e.g. "
                     "active, passive, coordinator, aggregator, party)")
    gen.add_argument("--force", action="store_true", help="replace existing key files")
    gen.set_defaults(func=cmd_keys_generate)


def cmd_keys_generate(args: argparse.Namespace) -> int:
    """Write keypairs; print the public files and key prefixes (never a secret)."""
    from pubsub.security import BROKER_KEY_NAME, generate_certificate, read_certificate

    for name in args.names:
        role = "" if name == BROKER_KEY_NAME else (args.role or name)
        pub, sec = generate_certificate(args.dir, name, role=role, overwrite=args.force)
        cert = read_certificate(pub)
        print(f"{name}: public {pub} (key {cert.public_key[:8].decode()}...), secret {sec} "
              f"(mode 600){', role ' + role if role else ''}")
    return 0
