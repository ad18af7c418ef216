"""FedForge party faults for the launcher (``psfl synth run --kill-party ID@STAGE``).

A party killed (SIGKILL) when the coordinator starts a stage: the run must complete with
the survivors (the protocol's dropout recovery), or, below the minimum survivor count,
fail with the coordinator's documented error. The killed party runs alone in its own
process so that the kill takes nobody else with it; its exit is the expected outcome of
the fault, not a failure of the run (:class:`ExpectedKill`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class PartyKill:
    """``ID@STAGE``: kill party ``party`` when the coordinator starts ``stage``."""

    party: str
    stage: str

    @classmethod
    def parse(cls, spec: str, party_ids: Sequence[str], stages: Sequence[str]) -> PartyKill:
        """Parse and check ``ID@STAGE``.

        Raises:
            ValueError: naming the spec, the unknown party or the unknown stage.
        """
        party, sep, stage = spec.partition("@")
        if not sep or not party or not stage:
            raise ValueError(f"--kill-party {spec!r}: expected ID@STAGE, e.g. "
                             f"{party_ids[0] if party_ids else 'p000'}@{stages[-2]}")
        if party not in party_ids:
            raise ValueError(f"--kill-party {spec!r}: no party {party!r} in this run "
                             f"({', '.join(party_ids[:5])}{' ...' if len(party_ids) > 5 else ''})")
        if stage not in stages:
            raise ValueError(f"--kill-party {spec!r}: {stage!r} is not a stage of this run: "
                             f"{list(stages)}")
        return cls(party=party, stage=stage)


def process_layout(ids: Sequence[str], per: int, alone: Sequence[str]) -> list[list[str]]:
    """Party ids per process, in order: ``per`` to a process, except each id in ``alone``,
    which gets a process of its own (so that killing it kills nobody else). With
    ``per = 1`` process ``j`` hosts party ``j``."""
    solo = set(alone)
    chunks: list[list[str]] = []
    cur: list[str] = []
    for i in ids:
        if i in solo:
            if cur:
                chunks.append(cur)
                cur = []
            chunks.append([i])
            continue
        cur.append(i)
        if len(cur) == per:
            chunks.append(cur)
            cur = []
    if cur:
        chunks.append(cur)
    return chunks


class ExpectedKill:
    """A process killed on purpose, behind :func:`sim.launch.vfl.wait_children`'s interface:
    ``poll()`` is None until it has died, then 0 (the fault's outcome; its real exit code
    is ``killed_code``). The launcher wraps a party process that died unplanned the same
    way once it has recorded the death as a dropout (:mod:`sim.launch.synth_deaths`)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.killed_code: int | None = None

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            return None
        self.killed_code = code
        return 0

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def wait(self, timeout: float | None = None) -> int:
        self.proc.wait(timeout)
        return 0


class StageLog:
    """Tails a run's event log for the coordinator's ``stage.started`` events, reading
    only what was appended since the last :meth:`poll`."""

    def __init__(self, events: Path) -> None:
        self.events = events
        self.offset = 0
        self.started: set[str] = set()

    def poll(self) -> set[str]:
        """Every stage started so far."""
        with open(self.events, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for line in chunk[:end].splitlines():
            if b"stage.started" not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "stage.started" and isinstance(ev.get("stage"), str):
                self.started.add(ev["stage"])
        return self.started


class PartyKiller:
    """The launcher's tick (see :func:`sim.launch.vfl.wait_children`): watches the run's event
    log for each kill's ``stage.started`` and kills the process hosting that party;
    ``records`` says what it did (``metrics["faults"]``)."""

    def __init__(self, events: Path, kills: Sequence[PartyKill],
                 procs: Sequence[dict[str, Any]], process_of: dict[str, str], t0: float,
                 log: Callable[[str, dict[str, Any]], None]) -> None:
        self.events, self.kills, self.procs = events, list(kills), procs
        self.process_of, self.t0, self._log = process_of, t0, log
        self.stages = StageLog(events)
        self.records: list[dict[str, Any]] = [
            {"kind": "kill_party", "party": k.party, "stage": k.stage, "killed_at_s": None}
            for k in kills]

    def __call__(self) -> None:
        if all(r["killed_at_s"] is not None for r in self.records):
            return
        started = self.stages.poll()
        for k, rec in zip(self.kills, self.records, strict=True):
            if rec["killed_at_s"] is not None or k.stage not in started:
                continue
            name = self.process_of[k.party]
            proc = self.procs[0][name]
            target = proc.proc if isinstance(proc, ExpectedKill) else proc
            if target.poll() is None:
                target.send_signal(signal.SIGKILL)
                target.wait()
            rec["killed_at_s"] = round(time.perf_counter() - self.t0, 3)
            rec["exit_code"] = target.returncode
            wrapped = proc if isinstance(proc, ExpectedKill) else ExpectedKill(target)
            for table in self.procs:  # the launcher's table and the one being waited on
                table[name] = wrapped
            self._log("sim.party_killed", {"party": k.party, "stage": k.stage})
