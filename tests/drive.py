"""Drive a strategy's generator by hand in unit tests: each yielded action is recorded and
answered by the test's fake grid."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any


def drive(proc: Generator[Any, Any, Any], handle: Callable[[Any], Any],
          actions: list[Any]) -> Any:
    """Run ``proc`` to its end, appending each action to ``actions`` and sending back
    ``handle(action)``; returns the generator's return value."""
    send: Any = None
    while True:
        try:
            a = proc.send(send)
        except StopIteration as stop:
            return stop.value
        actions.append(a)
        send = handle(a)
