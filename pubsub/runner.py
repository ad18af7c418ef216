"""Run a coroutine on the chosen event loop (uvloop by default where installed)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], *, event_loop: str = "uvloop") -> T:
    """``asyncio.run`` with a loop factory (Python 3.11 lacks ``asyncio.run(loop_factory=)``).

    Args:
        coro: the main coroutine.
        event_loop: ``"uvloop"`` (falls back to asyncio if uvloop is missing) or ``"asyncio"``.

    Raises:
        ValueError: unknown ``event_loop``.
    """
    if event_loop not in ("uvloop", "asyncio"):
        raise ValueError(f"event_loop must be 'uvloop' or 'asyncio', got {event_loop!r}")
    factory = None
    if event_loop == "uvloop":
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
