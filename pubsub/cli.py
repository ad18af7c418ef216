"""Shared command-line plumbing: map the bus's typed errors to one line and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable

from pubsub.address import InvalidAddress
from pubsub.config import ConfigError
from pubsub.errors import BrokerUnreachable

#: exit code for bad config or input
EXIT_BAD_INPUT = 2
#: exit code when no broker answers
EXIT_BROKER_UNREACHABLE = 3


def run_guarded(fn: Callable[[], int]) -> int:
    """Call ``fn``; print bus/config errors as ``error: ...`` and return their exit code.

    ConfigError and InvalidAddress give 2, BrokerUnreachable 3, Ctrl-C 130; other
    exceptions propagate.
    """
    try:
        return int(fn())
    except (ConfigError, InvalidAddress) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokerUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BROKER_UNREACHABLE
    except KeyboardInterrupt:
        return 130
