"""Process exit codes of party and launcher commands, and which expected error maps to
which (the rest propagate as bugs).

Owns: :class:`ExitCode` and :func:`exit_code_for`. May import: :mod:`pubsub.cli` (the
bus's bad-input and broker errors), :mod:`parties.data` and :mod:`parties.core.errors` (the
party's error types). Imported by every command of the package (:mod:`parties.cli`,
:mod:`parties.runtime.predict`, :mod:`parties.runtime.serve`, :mod:`parties.alignment.run`) and by the
launchers in :mod:`sim`.
"""

from __future__ import annotations

import sys
from enum import IntEnum

from pubsub.cli import BAD_INPUT_ERRORS, BROKER_ERRORS

from parties.data import DataError
from parties.core.errors import NonFiniteTraining, PrivacyBudgetExceeded, VflError, WorkerFailed


class ExitCode(IntEnum):
    """Process exit codes of party and launcher commands."""

    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    BROKER_UNREACHABLE = 3
    PARTNER = 4
    TIMEOUT = 5


#: Errors reported as one line, and the exit code each maps to (first match wins).
_EXIT_CODES: tuple[tuple[tuple[type[BaseException], ...], ExitCode], ...] = (
    ((*BAD_INPUT_ERRORS, DataError), ExitCode.BAD_INPUT),
    (BROKER_ERRORS, ExitCode.BROKER_UNREACHABLE),
    ((WorkerFailed, PrivacyBudgetExceeded, NonFiniteTraining), ExitCode.FAILED),
    ((VflError,), ExitCode.PARTNER),
)


def exit_code_for(exc: BaseException) -> ExitCode | None:
    """The exit code for an expected error (bad input, broker, partner, worker); None for
    anything else, which should propagate as a bug."""
    for types, code in _EXIT_CODES:
        if isinstance(exc, types):
            return code
    dpsgd = sys.modules.get("parties.privacy.dpsgd")  # loaded whenever its error can exist
    if dpsgd is not None and isinstance(exc, dpsgd.DpIncompatibleModel):
        return ExitCode.BAD_INPUT  # a model DP-SGD cannot bound (BatchNorm): bad input
    return None


__all__ = ["ExitCode", "exit_code_for"]
