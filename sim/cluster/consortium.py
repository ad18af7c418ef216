"""The consortium scenario: a FedForge synthesis over K sites of unequal
size, one site on a slow link, one offline for a while, a workload update half way and,
optionally, a coordinator crash; read from one TOML file beside the run's ``[synth]``
table.

Example (``psfl sim run sim/scenarios/consortium.toml --out RUN_DIR``)::

    [consortium]
    name = "five hospitals"
    hours = 48.0               # the simulated length of the synthesis
    seconds_per_hour = 1.0     # time scale: wall seconds per simulated hour

    [[consortium.parties]]     # in party order: p000, p001, ...
    name = "hospital-a"
    rows_equiv = 10000         # the site's size; the table's rows are cut in proportion
    [[consortium.parties]]
    name = "hospital-b"
    rows_equiv = 50000
    link = { latency_s = 0.2, bandwidth_mbps = 1.0 }   # shaped by a relay (sim/cluster/relay.py)

    [consortium.offline]       # SIGSTOP ... SIGCONT of the site's process
    party = "hospital-c"
    start = 12.0               # simulated hours after the synthesis started, or a
    end = 18.0                 # coordinator stage event: "round:aim1 started"

    [consortium.workload_update]
    at = 24.0                  # hours, or a stage event
    marginals = [["age", "gender", "income"]]
    rho_share = 0.5

    [consortium.kill_coordinator]   # optional: kill -9 and restart with --resume
    at = "round:aim3"               # a stage, or STAGE@POINT

    [synth]
    dataset = "adult"
    mechanism = "aim"

Times: a number is simulated hours after the coordinator's ``schema`` stage started (the
synthesis' hour 0), converted to wall seconds with ``seconds_per_hour``; a string
``"STAGE started"`` / ``"STAGE done"`` waits for that event of the coordinator. The
offline window ends at ``end`` (an hour or an event).

Pure: parsing and validation only; :mod:`sim.cluster.consortium_run` does the I/O.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pubsub.config import (ConfigError, _coerce, deep_merge, expand_dotted, from_mapping,
                           parse_overrides)

from sim.cluster.scenario import LinkConfig

#: events a stage trigger may name
TRIGGER_EVENTS = ("started", "done")
OFFLINE_KINDS = ("pause",)

#: a time: simulated hours (float) or a coordinator stage event ("STAGE started|done")
When = float | str


def parse_when(value: Any, key: str) -> When:
    """Check a time: hours >= 0, or ``"STAGE started"`` / ``"STAGE done"``.

    Raises:
        ConfigError: anything else (named by ``key``).
    """
    if isinstance(value, bool):
        raise ConfigError(key, f"expected hours or 'STAGE started|done', got {value!r}")
    if isinstance(value, int | float):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(key, f"hours must be finite and >= 0, got {value}")
        return float(value)
    if isinstance(value, str):
        stage, _, what = value.strip().rpartition(" ")
        if stage and what in TRIGGER_EVENTS:
            return f"{stage} {what}"
    raise ConfigError(key, f"expected hours (a number) or 'STAGE started' / 'STAGE done', "
                           f"got {value!r}")


def when_stage(when: When) -> str | None:
    """The stage a trigger names (None for hours)."""
    return when.rpartition(" ")[0] if isinstance(when, str) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class SiteSpec:
    """One consortium member.

    Attributes:
        name: label (reports); unique.
        rows_equiv: the site's size in the story (e.g. 500000 patients); the table's rows
            are cut in proportion (:func:`synth.split.sized_counts`).
        link: its link to the broker (a relay when shaped).
    """

    name: str
    rows_equiv: float
    link: LinkConfig = field(default_factory=LinkConfig)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("consortium.parties.name", "must not be empty")
        if not (math.isfinite(self.rows_equiv) and self.rows_equiv > 0):
            raise ConfigError("consortium.parties.rows_equiv",
                              f"must be > 0, got {self.rows_equiv}")


@dataclass(frozen=True, slots=True, kw_only=True)
class OfflineSpec:
    """A site that goes away for a while.

    Attributes:
        party: the site's name.
        start / end: when it goes and comes back (:data:`When`).
        kind: ``pause``: its process is stopped (SIGSTOP) and continued (SIGCONT): it
            sends and handles nothing meanwhile, its TCP connections stay open, and
            what the others sent waits in the socket buffers, as for a site whose
            servers are down behind a VPN that keeps the tunnel.
    """

    party: str
    start: When
    end: When
    kind: str = "pause"

    def __post_init__(self) -> None:
        if self.kind not in OFFLINE_KINDS:
            raise ConfigError("consortium.offline.kind",
                              f"must be one of {OFFLINE_KINDS}, got {self.kind!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadUpdateSpec:
    """New queries submitted while the run goes (:func:`synth.workload.submit_workload`).

    Attributes:
        at: when (:data:`When`).
        marginals: the new marginals (lists of column names).
        rho_share: share of the reserved streaming budget this update may spend.
    """

    at: When
    marginals: tuple[tuple[str, ...], ...]
    rho_share: float = 0.5

    def __post_init__(self) -> None:
        if not self.marginals or not all(self.marginals):
            raise ConfigError("consortium.workload_update.marginals",
                              "must list at least one non-empty marginal")
        if not 0 < self.rho_share <= 1:
            raise ConfigError("consortium.workload_update.rho_share",
                              f"must be in (0, 1], got {self.rho_share}")

    def queries(self) -> dict[str, Any]:
        """The ``submit_workload`` payload."""
        return {"marginals": [list(m) for m in self.marginals], "rho_share": self.rho_share}


@dataclass(frozen=True, slots=True, kw_only=True)
class KillSpec:
    """kill -9 of the coordinator and a restart with ``--resume``
    (:func:`sim.launch.synth.run_synth`'s ``kill_coordinator_at``).

    Attributes:
        at: ``STAGE`` (killed when it starts, plus ``delay_s``) or ``STAGE@POINT``.
        delay_s / restart_after_s: seconds.
    """

    at: str
    delay_s: float = 0.0
    restart_after_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.at:
            raise ConfigError("consortium.kill_coordinator.at", "must name a stage")
        for key in ("delay_s", "restart_after_s"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"consortium.kill_coordinator.{key}",
                                  f"must be finite and >= 0 seconds, got {v}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Consortium:
    """The whole scenario.

    Attributes:
        name: label.
        hours: the simulated length of the synthesis (the story's 48 hours).
        seconds_per_hour: wall seconds per simulated hour.
        timeout_s: the whole job's deadline, seconds.
        parties: the sites, in party order (``p000`` is the first).
        offline / workload_update / kill_coordinator: optional events.
    """

    name: str = "consortium"
    hours: float = 48.0
    seconds_per_hour: float = 1.0
    timeout_s: float = 1800.0
    parties: tuple[SiteSpec, ...] = ()
    offline: OfflineSpec | None = None
    workload_update: WorkloadUpdateSpec | None = None
    kill_coordinator: KillSpec | None = None

    def __post_init__(self) -> None:
        for key in ("hours", "seconds_per_hour", "timeout_s"):
            v = getattr(self, key)
            if not (math.isfinite(v) and v > 0):
                raise ConfigError(f"consortium.{key}", f"must be finite and > 0, got {v}")
        if len(self.parties) < 2:
            raise ConfigError("consortium.parties",
                              f"needs at least 2 sites ([[consortium.parties]]), got "
                              f"{len(self.parties)}")
        names = [p.name for p in self.parties]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError("consortium.parties.name", f"duplicate site name {dup[0]!r}")
        off = self.offline
        if off is not None and off.party not in names:
            raise ConfigError("consortium.offline.party",
                              f"unknown site {off.party!r} (sites: {names})")
        if (off is not None and isinstance(off.start, float) and isinstance(off.end, float)
                and not off.end > off.start):
            raise ConfigError("consortium.offline.end",
                              f"must be after start ({off.start} h), got {off.end} h")

    def index(self, name: str) -> int:
        """Party index of the site ``name``."""
        return [p.name for p in self.parties].index(name)

    def wall_s(self, hours: float) -> float:
        """Wall seconds after hour 0 of ``hours`` simulated hours."""
        return hours * self.seconds_per_hour


_SECTIONS = ("consortium", "synth")


def _table(raw: Any, key: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"expected a table, got {type(raw).__name__}")
    return dict(raw)


def _parse_site(raw: Any, i: int) -> SiteSpec:
    key = f"consortium.parties[{i}]"
    t = _table(raw, key)
    link = t.pop("link", {})
    spec = from_mapping(SiteSpec, t, section=key)
    return dataclasses.replace(spec, link=from_mapping(LinkConfig, _table(link, f"{key}.link"),
                                                       section=f"{key}.link"))


def _parse_timed(cls: type, raw: Any, key: str, times: Sequence[str]) -> Any:
    t = _table(raw, key)
    parsed = {k: parse_when(t[k], f"{key}.{k}") for k in times if k in t}
    for k in parsed:
        t[k] = 0.0  # passes from_mapping's type check; replaced below
    obj = from_mapping(cls, t, section=key)
    return dataclasses.replace(obj, **parsed) if parsed else obj


def parse_consortium(table: Mapping[str, Any]) -> Consortium:
    """A :class:`Consortium` from the ``[consortium]`` table.

    Raises:
        ConfigError: an unknown key, or an invalid value (named).
    """
    t = dict(table)
    sites = t.pop("parties", [])
    if not isinstance(sites, list):
        raise ConfigError("consortium.parties",
                          "expected an array of tables ([[consortium.parties]])")
    offline = t.pop("offline", None)
    update = t.pop("workload_update", None)
    kill = t.pop("kill_coordinator", None)
    parties = tuple(_parse_site(s, i) for i, s in enumerate(sites))
    extra: dict[str, Any] = {"parties": parties}
    if offline is not None:
        o = _parse_timed(OfflineSpec, offline, "consortium.offline", ("start", "end"))
        extra["offline"] = OfflineSpec(party=o.party, start=o.start, end=o.end, kind=o.kind)
    if update is not None:
        u = _table(update, "consortium.workload_update")
        marg = u.get("marginals")
        if not (isinstance(marg, list) and all(isinstance(m, list)
                                               and all(isinstance(c, str) for c in m)
                                               for m in marg)):
            raise ConfigError("consortium.workload_update.marginals",
                              f"expected a list of lists of column names, got {marg!r}")
        u["marginals"] = [["x"]]  # placeholder for the type check; the real value below
        w = _parse_timed(WorkloadUpdateSpec, u, "consortium.workload_update", ("at",))
        extra["workload_update"] = WorkloadUpdateSpec(
            at=w.at, marginals=tuple(tuple(m) for m in marg), rho_share=w.rho_share)
    if kill is not None:
        extra["kill_coordinator"] = from_mapping(KillSpec, _table(kill, "consortium.kill_"
                                                                  "coordinator"),
                                                 section="consortium.kill_coordinator")
    tables = {"parties", "offline", "workload_update", "kill_coordinator"}
    known = {f.name for f in dataclasses.fields(Consortium)} - tables
    unknown = sorted(set(t) - known)
    if unknown:
        raise ConfigError(f"consortium.{unknown[0]}",
                          f"unknown key (known keys: {', '.join(sorted(known | tables))})")
    hints = typing.get_type_hints(Consortium)
    scalars = {k: _coerce(f"consortium.{k}", hints[k], v) for k, v in t.items()}
    return Consortium(**scalars, **extra)


def load_consortium(path: str | Path, sets: Sequence[str] = ()
                    ) -> tuple[Consortium, dict[str, Any]]:
    """Read ``[consortium]`` and ``[synth]`` from a TOML file, with ``--set`` overrides
    (``consortium.x=v`` or ``synth.x=v``).

    Returns:
        ``(consortium, synth_table)``: the raw ``[synth]`` mapping; :func:`synth_table`
        adds what the scenario fixes (parties, the ``sizes`` split, one process per party).

    Raises:
        ConfigError: missing file, bad TOML, an unknown section or key, an invalid value.
    """
    data = read_toml(path)
    unknown = sorted(set(data) - set(_SECTIONS))
    if unknown:
        raise ConfigError(unknown[0], "unknown section (expected [consortium] and [synth])")
    over = parse_overrides(sets)
    bad = sorted(set(over) - set(_SECTIONS))
    if bad:
        raise ConfigError(bad[0], "--set keys must start with 'consortium.' or 'synth.'")
    table = deep_merge(dict(data.get("consortium", {})), over.get("consortium", {}))
    cons = parse_consortium(table)
    synth = deep_merge(dict(data.get("synth", {})), over.get("synth", {}))
    return cons, synth


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed TOML file.

    Raises:
        ConfigError: missing file or bad TOML.
    """
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError("", f"scenario file {str(p)!r} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{p}: invalid TOML: {exc}") from None


def scenario_kind(path: str | Path) -> str:
    """``"consortium"`` when the file has a ``[consortium]`` table, else ``"vfl"``."""
    return "consortium" if "consortium" in read_toml(path) else "vfl"


#: keys of [synth] the scenario sets itself (dotted: ``data.split`` is ``[synth.data] split``)
FIXED_SYNTH_KEYS = ("parties", "data.split", "data.party_weights", "launch.parties_per_process")


def synth_table(cons: Consortium, synth: Mapping[str, Any]) -> dict[str, Any]:
    """The ``[synth]`` table with what the scenario fixes: one party per site, the
    ``sizes`` split by ``rows_equiv``, one process per party (each can be stopped and
    linked on its own).

    Raises:
        ConfigError: ``[synth]`` sets one of those keys to something else.
    """
    fixed = {"parties": len(cons.parties), "data.split": "sizes",
             "data.party_weights": [float(p.rows_equiv) for p in cons.parties],
             "launch.parties_per_process": 1}
    table = expand_dotted(synth)
    for k, v in fixed.items():
        node: Any = table
        for part in k.split("."):
            node = node.get(part, _UNSET) if isinstance(node, Mapping) else _UNSET
        if node is not _UNSET and node != v and not (
                k == "data.party_weights" and isinstance(node, list | tuple)
                and list(map(float, node)) == v):
            raise ConfigError(f"synth.{k}", f"is set by the consortium scenario ({v!r}); "
                                            f"remove it from [synth]")
    return deep_merge(table, expand_dotted(fixed))


_UNSET = object()


def describe(cons: Consortium) -> dict[str, Any]:
    """JSON-ready summary of the scenario."""
    def when(w: When | None) -> Any:
        return w

    return {
        "name": cons.name, "hours": cons.hours, "seconds_per_hour": cons.seconds_per_hour,
        "timeout_s": cons.timeout_s,
        "parties": [{"name": p.name, "rows_equiv": p.rows_equiv,
                     "link": dataclasses.asdict(p.link) if p.link.shaped else None}
                    for p in cons.parties],
        "offline": None if cons.offline is None else {
            "party": cons.offline.party, "start": when(cons.offline.start),
            "end": when(cons.offline.end), "kind": cons.offline.kind},
        "workload_update": None if cons.workload_update is None else {
            "at": when(cons.workload_update.at), **cons.workload_update.queries()},
        "kill_coordinator": None if cons.kill_coordinator is None
        else dataclasses.asdict(cons.kill_coordinator),
    }


__all__ = ["Consortium", "KillSpec", "OfflineSpec", "SiteSpec", "WorkloadUpdateSpec",
           "describe", "load_consortium", "parse_consortium", "parse_when", "scenario_kind",
           "synth_table"]
