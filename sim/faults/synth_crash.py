"""Fault injection for FedForge's crash-recovery tests: a coordinator killed at a point.

``python -m sim.faults.synth_crash coordinator ...`` runs ``python -m synth coordinator ...``
(same arguments) with an observer of the coordinator's named points
(:meth:`synth.coordinator.Coordinator._crash_point`): when the point named by the
environment variable :data:`CRASH_POINT_ENV` is reached, the process kills itself with
SIGKILL (no cleanup, like ``kill -9``), after a short pause so that what was published
before the point leaves. ``sim.launch.synth`` starts the coordinator this way when asked
to kill it at a point (``kill_coordinator_at="round:<name>@collected"``); production
code paths (``python -m synth``, ``sim.fedforge``) never install the observer.

Points: ``schema@collected``, ``keys@collected``, ``keys@marked``, ``seeds:0@collected``,
``seeds:0@marked``, ``round:<name>@planned``, ``round:<name>@collected``,
``round:<name>@unmask``, ``round:<name>@revealed``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

import structlog

#: Environment variable naming the point at which the coordinator kills itself.
CRASH_POINT_ENV = "FEDFORGE_CRASH_POINT"

#: Seconds between reaching the point and SIGKILL (published messages leave).
PAUSE_S = 0.1


def crash_at(point: str | None, *, pause_s: float = PAUSE_S,
             kill: Callable[[], None] | None = None) -> Callable[[str], Awaitable[None]]:
    """An ``on_point`` observer that kills this process when ``point`` is reached
    (``kill``: the action, SIGKILL to this process by default; tests pass their own);
    ``point`` None or empty: an observer that does nothing."""
    def _sigkill() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    act = kill or _sigkill

    async def observe(reached: str) -> None:
        if point and reached == point:
            structlog.get_logger("sim.faults.synth_crash").warning(
                "coordinator.crash_injected", point=reached)
            await asyncio.sleep(pause_s)
            act()

    return observe


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim.faults.synth_crash coordinator ARGS``: the coordinator with
    :func:`crash_at` on ``$FEDFORGE_CRASH_POINT``."""
    from synth.cli import main as synth_main

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "coordinator":
        print("usage: python -m sim.faults.synth_crash coordinator ARGS (as python -m synth)",
              file=sys.stderr)
        return 2
    return synth_main(args, on_point=crash_at(os.environ.get(CRASH_POINT_ENV)))


if __name__ == "__main__":
    raise SystemExit(main())
