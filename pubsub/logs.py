"""structlog setup for entry points (libraries only call ``structlog.get_logger``).

Processes write JSON lines to an ``events.jsonl`` file (appending, so several
processes may share one run log) and human-readable warnings to stderr. Each line is
appended whole, with one ``os.write`` on an ``O_APPEND`` descriptor
(:func:`pubsub.outputs.append_line`): lines of several processes never interleave, and a
line that does not fit on a full disk is cut back off, so the file never ends in a broken
line; the events lost from then on are said once on stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import structlog

from pubsub.outputs import OutputError, append_line, output_error

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class _JsonlSink:
    """Append one JSON object per event to a file, each line whole with one write.

    Attributes:
        lost: events that could not be appended (a full disk, a read-only filesystem).
    """

    def __init__(self, path: str | Path, level: int) -> None:
        self.path = str(path)
        try:
            self.fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                          | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise output_error(path, exc) from None
        self.level = level
        self.lost = 0

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if _LEVELS.get(method, 20) >= self.level and self.fd is not None:
            try:
                append_line(self.fd, orjson.dumps(event, default=repr) + b"\n", self.path)
            except OutputError as exc:
                self.lost += 1
                if self.lost == 1:  # said once, not per event; the run goes on
                    print(f"warning: events are being lost: {exc}", file=sys.stderr)
        return event

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at write time (not at configure time), so a
    replaced and closed stream (test capture, a redirected CLI) never breaks logging."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(
    *,
    events_path: str | Path | None = None,
    level: str = "info",
    stderr_level: str = "warning",
    **bind: Any,
) -> None:
    """Configure structlog for this process.

    Args:
        events_path: append JSON lines here (e.g. ``RUN_DIR/events.jsonl``); None for none.
        level: least level written to ``events_path``.
        stderr_level: least level printed to stderr (console format).
        **bind: context bound to every event (``run_id``, ``party`` ...).
    """
    if level not in _LEVELS or stderr_level not in _LEVELS:
        raise ValueError(f"log level must be one of {sorted(_LEVELS)}")
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if events_path is not None:
        Path(events_path).parent.mkdir(parents=True, exist_ok=True)
        processors.append(_JsonlSink(events_path, _LEVELS[level]))  # lives for the process
    stderr_min = _LEVELS[stderr_level]

    def _filter(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if _LEVELS.get(method, 20) < stderr_min:
            raise structlog.DropEvent
        return event

    processors += [_filter, structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    if bind:
        structlog.contextvars.bind_contextvars(**bind)


@contextlib.contextmanager
def scoped_logging(**kwargs: Any) -> Iterator[None]:
    """:func:`configure_logging` for the body of a ``with`` only: the previous structlog
    configuration and context come back afterwards and the events file is closed (for
    jobs run inside a host process: a notebook, a test, the Python API)."""
    saved = structlog.get_config()
    context = structlog.contextvars.get_contextvars()
    configure_logging(**kwargs)
    sinks = [p for p in structlog.get_config()["processors"] if isinstance(p, _JsonlSink)]
    try:
        yield
    finally:
        for sink in sinks:
            sink.close()
        structlog.configure(**saved)
        structlog.contextvars.clear_contextvars()
        if context:
            structlog.contextvars.bind_contextvars(**context)
