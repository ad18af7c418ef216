"""An unplanned party death in a local FedForge run is a dropout, not a failure of the run.

The protocol tolerates dropouts (a party that misses a round's deadline is dropped from
it, :mod:`synth.coord.rounds`); a party process that dies while the run goes on (any
signal, any non-zero exit) is one such dropout for every party it hosted. The launcher's
:class:`PartyDeathWatch` (a tick of :func:`sim.launch.vfl.wait_children`) reports it (a
``warning:`` line, a ``sim.party_died`` event, ``metrics["party_deaths"]``) and lets the
run go on while at least S_min (``secagg.min_survivors``) parties remain; below that,
before the coordinator's synthesis stage (after it the parties are no longer needed),
it ends the run with :class:`TooFewSurvivors` (exit code 1) naming the dead parties.

Planned kills (``--kill-party``, :class:`sim.faults.synth_party.PartyKiller`) are
recorded by their injector, not here; they count among the dropped parties, but only an
unplanned death makes the launcher refuse (below S_min with planned kills alone, the
coordinator's own refusal is the documented outcome of that fault).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.faults.synth_party import ExpectedKill, StageLog
from sim.launch.vfl import LaunchError

#: the coordinator's stage after which no party is needed any more
LAST_PARTY_STAGE_AFTER = "synthesis"


def describe_exit(code: int) -> str:
    """``signal SIGKILL`` for a negative (signal) return code, else ``exit code N``."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PartyDeath:
    """One party process that died while the run went on.

    Attributes:
        process: the launcher's name of the process (``parties1``).
        parties: the party ids it hosted (all of them dropped out).
        exit_code: its return code (negative: killed by that signal).
        at_s: seconds since the launcher started when the death was seen.
        stage: the coordinator's latest stage started by then (None before the first).
    """

    process: str
    parties: tuple[str, ...]
    exit_code: int
    at_s: float
    stage: str | None

    @property
    def signal(self) -> str | None:
        """The signal's name (``SIGKILL``) when it was killed by one."""
        if self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return str(-self.exit_code)

    def to_dict(self) -> dict[str, Any]:
        """Its ``metrics["party_deaths"]`` entry (and ``sim.party_died`` event fields)."""
        return {"process": self.process, "parties": list(self.parties),
                "exit_code": self.exit_code, "signal": self.signal,
                "at_s": self.at_s, "stage": self.stage}

    def describe(self) -> str:
        """``parties1 (p002, p003; signal SIGKILL)``."""
        return f"{self.process} ({', '.join(self.parties)}; {describe_exit(self.exit_code)})"


class TooFewSurvivors(LaunchError):
    """Party processes died and fewer than S_min parties remain: the run cannot release
    any further round. Exit code 1, or the dead processes' own code when they all exited
    with the same documented one (:class:`parties.runtime.exitcodes.ExitCode`, e.g. 2 when
    every party refused the session: the cause, not its consequence).

    Attributes:
        dead: the dead parties, in order.
        deaths: the deaths (:class:`PartyDeath`) behind them; planned kills are not here.
        survivors: parties left.
        min_survivors: S_min.
    """

    def __init__(self, *, dead: Sequence[str], deaths: Sequence[PartyDeath], survivors: int,
                 min_survivors: int) -> None:
        self.dead = tuple(dead)
        self.deaths = tuple(deaths)
        self.survivors = survivors
        self.min_survivors = min_survivors
        super().__init__("parties", refusal_code(self.deaths),
                         refusal_detail(self.dead, self.deaths, survivors, min_survivors))


def refusal_code(deaths: Sequence[PartyDeath]) -> int:
    """The refusal's exit code: the dead processes' own when they all exited with the
    same documented code other than 0 and 1, else 1 (a signal, mixed codes)."""
    from parties.runtime.exitcodes import ExitCode

    codes = {d.exit_code for d in deaths}
    if len(codes) == 1:
        (code,) = codes
        if code in {int(c) for c in ExitCode} and code > 1:
            return code
    return int(ExitCode.FAILED)


def refusal_detail(dead: Sequence[str], deaths: Sequence[PartyDeath], survivors: int,
                   min_survivors: int) -> str:
    """The refusal's reason: the survivor count against S_min and the dead parties."""
    return (f"{survivors} survivor(s) < min_survivors = {min_survivors} after party "
            f"process(es) died: {'; '.join(d.describe() for d in deaths)}; dead parties: "
            f"{', '.join(dead)}; the run cannot be released")


def should_refuse(n_parties: int, dropped: int, min_survivors: int, stages: set[str]) -> bool:
    """Whether the run must end: fewer than ``min_survivors`` of ``n_parties`` remain
    after ``dropped`` dropped out, and the coordinator has not started its synthesis
    (after which it needs no party)."""
    return n_parties - dropped < min_survivors and LAST_PARTY_STAGE_AFTER not in stages


class PartyDeathWatch:
    """The launcher's tick (see :func:`sim.launch.vfl.wait_children`): a party process
    that exits non-zero (or by a signal) while the coordinator runs becomes a dropout of
    each party it hosted; ``deaths`` says what it saw.

    Args:
        procs: the launcher's process tables (``[waited, launcher's]``); a dead process
            is replaced in both by an :class:`~sim.faults.synth_party.ExpectedKill`
            wrapper (its ``poll()`` is 0), so the wait goes on.
        groups: process name -> the party ids it hosts.
        min_survivors: S_min.
        stage_order: the coordinator's stages in order (the latest started is recorded).
        events: the run's event log (the coordinator's ``stage.started`` events).
        t0: the launcher's ``time.perf_counter()`` at its start.
        log: appends a launcher event (``event``, fields) to the event log.
        say: prints the one-line report (default: to stderr).
    """

    def __init__(self, procs: Sequence[dict[str, Any]], groups: Mapping[str, Sequence[str]], *,
                 min_survivors: int, stage_order: Sequence[str], events: Path, t0: float,
                 log: Callable[[str, dict[str, Any]], None],
                 say: Callable[[str], None] | None = None) -> None:
        self.procs, self.groups = procs, {k: tuple(v) for k, v in groups.items()}
        self.n_parties = sum(len(v) for v in self.groups.values())
        self.min_survivors, self.stage_order = min_survivors, list(stage_order)
        self.t0, self._log = t0, log
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.stages = StageLog(events)
        self.deaths: list[PartyDeath] = []
        self._dead_procs: set[str] = set()

    def dead_parties(self) -> list[str]:
        """Every party whose process died, planned kills included, in launch order."""
        dead: list[str] = []
        for name, ids in self.groups.items():
            p = self.procs[0].get(name)
            if name in self._dead_procs or (isinstance(p, ExpectedKill)
                                            and p.proc.poll() is not None):
                dead.extend(ids)
        return dead

    def _latest_stage(self, started: set[str]) -> str | None:
        known = [s for s in self.stage_order if s in started]
        return known[-1] if known else (sorted(started)[-1] if started else None)

    def __call__(self) -> None:
        coord = self.procs[0].get("coordinator")
        if coord is None or coord.poll() is not None:
            return  # the run is over: the exits that follow are judged as they are
        new: list[PartyDeath] = []
        for name, ids in self.groups.items():
            p = self.procs[0].get(name)
            if p is None or isinstance(p, ExpectedKill) or name in self._dead_procs:
                continue
            code = p.poll()
            if code is None or code == 0:
                continue
            started = self.stages.poll()
            death = PartyDeath(process=name, parties=ids, exit_code=int(code),
                               at_s=round(time.perf_counter() - self.t0, 3),
                               stage=self._latest_stage(started))
            self._dead_procs.add(name)
            wrapped = ExpectedKill(p)
            wrapped.poll()
            for table in self.procs:
                if name in table:
                    table[name] = wrapped
            new.append(death)
        if not new:
            return
        self.deaths.extend(new)
        dead = self.dead_parties()
        left = self.n_parties - len(dead)
        for d in new:
            self._log("sim.party_died", d.to_dict())
            self._say(f"warning: party process {d.describe()} died at {d.at_s:.1f} s"
                      f"{' during ' + d.stage if d.stage else ''}: a dropout of "
                      f"{'each of its parties' if len(d.parties) > 1 else 'its party'}; "
                      f"{left} of {self.n_parties} parties remain "
                      f"(min_survivors = {self.min_survivors})")
        if should_refuse(self.n_parties, len(dead), self.min_survivors, self.stages.poll()):
            raise TooFewSurvivors(dead=dead, deaths=self.deaths, survivors=left,
                                  min_survivors=self.min_survivors)

    def annotate(self, detail: str | None) -> str | None:
        """A failure's ``detail`` (the coordinator's reason) with the dead parties added,
        or ``detail`` itself when none died."""
        if not self.deaths:
            return detail
        extra = (f"after party process(es) died: {'; '.join(d.describe() for d in self.deaths)}"
                 f"; dead parties: {', '.join(self.dead_parties())}")
        return f"{detail}; {extra}" if detail else extra


__all__ = ["PartyDeath", "PartyDeathWatch", "TooFewSurvivors", "describe_exit",
           "refusal_code", "refusal_detail", "should_refuse"]
