"""Bounds on trained or sampled results, recorded for seed sweeps.

A test whose assertion depends on where an optimiser or a sampler ends states it as
``below(value, limit, "what")`` or ``above(value, limit, "what")`` and carries the
``stochastic`` marker. In an ordinary run these are plain assertions. Under
``tests/seed_sweep.py`` (``PSFL_SWEEP_RECORD`` names a JSON-lines file) each call also
appends the measured value and its limit, so the sweep reports every bound's worst value
over the seeds and its margin.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson


_QUIET = [False]


@contextmanager
def control() -> Iterator[None]:
    """A negative control's checks (expected to fail): not recorded as bounds."""
    _QUIET[0] = True
    try:
        yield
    finally:
        _QUIET[0] = False


def _record(what: str, value: float, limit: float, op: str) -> None:
    out = os.environ.get("PSFL_SWEEP_RECORD")
    if not out or _QUIET[0]:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    line = orjson.dumps({"test": test, "what": what, "value": float(value),
                         "limit": float(limit), "op": op,
                         "seed": int(os.environ.get("PSFL_SWEEP_SEED", "0") or 0)})
    with Path(out).open("ab") as f:
        f.write(line + b"\n")


def below(value: float, limit: float, what: str) -> None:
    """Assert ``value < limit`` (recorded under a sweep)."""
    _record(what, value, limit, "<")
    assert value < limit, f"{what}: {value:.4g} is not below {limit:.4g}"


def above(value: float, limit: float, what: str) -> None:
    """Assert ``value > limit`` (recorded under a sweep)."""
    _record(what, value, limit, ">")
    assert value > limit, f"{what}: {value:.4g} is not above {limit:.4g}"
