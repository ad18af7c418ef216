"""The coordinator's meters: :class:`StageTimer` logs ``stage.started`` /
``stage.done`` / ``stage.failed`` and keeps each stage's wall and CPU seconds;
:class:`WireMeter` notes the broker's byte count after each stage and splits the run's
wire bytes into fixed and per-round traffic.

Owns: the two meters. May import :mod:`pubsub` only (the broker's ``stats`` request).
Used by :mod:`synth.coord.context` (which holds them) and read by
:mod:`synth.coord.metrics`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pubsub.control import control_request
from pubsub.security import CurveClient


class StageTimer:
    """``with ctx.stage("name"):`` logs ``stage.started`` / ``stage.done`` /
    ``stage.failed`` and records the stage's wall seconds in ``seconds`` and its process
    CPU seconds in ``cpu_seconds`` (both keyed by the stage name)."""

    def __init__(self, name: str, *, log: Any, seconds: dict[str, float],
                 cpu_seconds: dict[str, float]) -> None:
        self.name = name
        self.log = log
        self.seconds = seconds
        self.cpu_seconds = cpu_seconds
        self.t0 = 0.0
        self.c0 = 0.0

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.log.info("stage.started", stage=self.name)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        s = time.perf_counter() - self.t0
        self.seconds[self.name] = s
        self.cpu_seconds[self.name] = time.process_time() - self.c0
        if exc is None:
            self.log.info("stage.done", stage=self.name, seconds=round(s, 3))
        else:
            self.log.warning("stage.failed", stage=self.name, seconds=round(s, 3),
                             error=str(exc))


class WireMeter:
    """The bytes the broker forwarded for a run, noted after each stage.

    Args:
        broker: the broker address (its control socket answers ``stats``).
        security: CURVE keys for the control request, or None.
        in_process: True when the run has no broker (a :mod:`pubsub.memory` bus): every
            count is None.
        run_id: the run (its topics' namespace ``ff/<run_id>``).
        log: the coordinator's bound logger.
    """

    def __init__(self, *, broker: str, security: CurveClient | None, in_process: bool,
                 run_id: str, log: Any) -> None:
        self.broker = broker
        self.security = security
        self.in_process = in_process
        self.run_id = run_id
        self.log = log
        self.marks: list[tuple[str, int | None]] = []

    async def mark(self, stage: str) -> None:
        """Note the broker's byte count for this run after ``stage`` (the split of the
        wire bytes into fixed and per-round traffic; nothing in process)."""
        if not self.in_process:
            self.marks.append((stage, await asyncio.to_thread(self.total)))

    def total(self) -> int | None:
        """Bytes the broker forwarded for this run (every hop, every message), or None (in
        process: no broker counts them)."""
        if self.in_process:
            return None
        try:
            st = control_request(self.broker, "stats", timeout_s=2.0, security=self.security)
        except Exception as exc:  # noqa: BLE001 - a missing figure, not a failed run
            self.log.warning("synth.no_broker_stats", error=str(exc))
            return None
        stats = st.get("stats", st)
        return int(stats.get("namespace_bytes", {}).get(f"ff/{self.run_id}", 0))

    def split(self, wire: int | None, *, restarted: bool) -> dict[str, Any]:
        """``bytes_wire_by_stage`` (bytes forwarded between the previous mark and the end
        of each stage), ``bytes_wire_fixed`` (schema and hellos, keys, seed shares: paid
        once per run or batch of rounds), ``bytes_wire_rounds`` (the rounds: plans, masked
        sums, unmasking) and ``bytes_wire_other`` (the rest: the end of the run); Nones
        in process or after a restart (the counts before it are another process's)."""
        none = {"bytes_wire_by_stage": None, "bytes_wire_fixed": None,
                "bytes_wire_rounds": None, "bytes_wire_other": None}
        marks = self.marks
        if wire is None or not marks or any(b is None for _, b in marks) or restarted:
            return none
        by: dict[str, int] = {}
        prev = 0
        for stage, b in marks:
            by[stage] = by.get(stage, 0) + int(b) - prev  # type: ignore[arg-type]
            prev = int(b)  # type: ignore[arg-type]
        rounds = sum(v for k, v in by.items() if k.startswith("round:"))
        fixed = sum(by.values()) - rounds
        return {"bytes_wire_by_stage": by, "bytes_wire_fixed": fixed,
                "bytes_wire_rounds": rounds, "bytes_wire_other": int(wire) - prev}


__all__ = ["StageTimer", "WireMeter"]
