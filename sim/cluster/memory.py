"""A per-party memory limit for the heterogeneity simulator (cgroup v1 ``memory``
controller, ``memory.limit_in_bytes``; cgroup v2 ``memory.max``).

Where no memory controller is writable the limit is not enforced, and :meth:`describe`
says so (``method = "none"`` with a ``note``): an honest record, never a silent pretence.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_V1 = Path("/sys/fs/cgroup/memory")
_V2 = Path("/sys/fs/cgroup")
_counter = itertools.count()


class MemoryLimit:
    """A memory cgroup holding one party's processes (a sync context manager; ``close()``
    is idempotent).

    Args:
        name: label in the group's name.
        limit_mb: limit, MiB (> 0).

    Raises:
        ValueError: ``limit_mb <= 0``.
    """

    def __init__(self, name: str, limit_mb: float) -> None:
        if not limit_mb > 0:
            raise ValueError(f"limit_mb must be > 0 MiB, got {limit_mb}")
        self.limit_bytes = int(limit_mb * 2**20)
        self.path: Path | None = None
        self.method = "none"
        self.note = ""
        group = f"psfl-mem-{name}-{os.getpid()}-{next(_counter)}"
        try:
            if (_V1 / "memory.limit_in_bytes").exists():
                parent = _V1 / "psfl"
                parent.mkdir(exist_ok=True)
                path = parent / group
                path.mkdir()
                (path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
                self.path, self.method = path, "cgroup-v1"
            elif "memory" in (_V2 / "cgroup.controllers").read_text().split():
                path = _V2 / group
                path.mkdir()
                (path / "memory.max").write_text(str(self.limit_bytes))
                self.path, self.method = path, "cgroup-v2"
            else:
                self.note = "no memory cgroup controller: the limit is not enforced"
        except OSError as exc:
            self.note = f"memory cgroup not writable ({exc.strerror or exc}): not enforced"
            if self.path is None:
                self.method = "none"
        log.info("memory.limit.created", name=name, method=self.method, limit_bytes=self.limit_bytes)

    def preexec(self) -> Callable[[], None]:
        """A ``preexec_fn`` that puts the forked child into the group before it execs."""
        from sim.cluster.cpu import preexec_join

        return preexec_join([str(self.path / "cgroup.procs")] if self.path else [])

    def peak_bytes(self) -> int | None:
        """Peak memory use of the group, bytes (v1 ``memory.max_usage_in_bytes``, v2
        ``memory.peak``), or None where unknown."""
        if self.path is None:
            return None
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            p = self.path / name
            if p.exists():
                try:
                    return int(p.read_text().split()[0])
                except (OSError, ValueError):
                    return None
        return None

    def describe(self) -> dict[str, Any]:
        """JSON-ready: method, limit, path, peak use and the note."""
        return {"method": self.method, "limit_bytes": self.limit_bytes,
                "path": str(self.path) if self.path else None,
                "peak_bytes": self.peak_bytes(), "note": self.note}

    def close(self) -> None:
        """Remove the group (its processes must have exited)."""
        path, self.path = self.path, None
        if path is None:
            return
        try:
            path.rmdir()
        except OSError as exc:
            log.warning("memory.limit.not_removed", path=str(path), error=str(exc))

    def __enter__(self) -> MemoryLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
