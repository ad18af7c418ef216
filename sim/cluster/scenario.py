"""A heterogeneous-cluster scenario: the parties' CPU shares, memory limits, network links
and a fault schedule, read from one TOML file beside the run's ``[vfl]`` table.

Example (``psfl sim run SCENARIO.toml --out RUN_DIR``)::

    [scenario]
    name = "50:14"
    cpu_ratio = "50:14"      # active:passive, "out of 64 cores" in the paper
    ratio_of = 64            # the ratio is a share of this many cores (default: the sum)
    cpu_method = "auto"      # cgroup-v2 | cgroup-v1 | duty-cycle | none | auto
    timeout_s = 1800

    [scenario.passive.link]  # the passive party's link to the broker
    latency_s = 0.005        # one way
    bandwidth_mbps = 100
    loss = 0.0

    [[scenario.faults]]
    at_s = 8.0               # seconds after both parties found each other
    # after_epochs = 1       # or: at_s after the active party's first epoch
    party = "passive"
    kind = "pause"           # kill | pause | disconnect
    duration_s = 5.0

    [vfl]
    algo = "pubsub"
    dataset = "synthetic"
    timeouts.t_ddl_s = 2.0

The paper's setting is two parties on 64 cores split 50:14, 48:16, 40:24 or 36:28
(PubSub-VFL, arXiv 2510.12494, Sec. 5). A ratio scales to this machine as fractions of
its cores (:func:`party_cores`): "50:14" of 64 on 2 cores is 1.5625 : 0.4375 cores.

Several passive parties (``vfl.passive_parties`` = N - 1): the further parties
(``passive2`` ... ``passive9``) get their own tables, ``[scenario.passive2]``,
``[scenario.passive2.link]`` and so on, and faults may name them. ``cpu_ratio`` is then
either ``"A:P"`` (the passive share split equally among the passive parties) or one
share per party in order (``"40:8:8:8"`` for the active party and three passive ones).

Pure: parsing and validation only; :mod:`sim.cluster.runner` does the I/O.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pubsub.config import ConfigError, deep_merge, from_mapping, parse_overrides

ROLES = ("active", "passive")
#: every party id a scenario may name: the active party, then ``passive``, ``passive2``, …
PARTY_IDS = ("active", "passive", *(f"passive{i}" for i in range(2, 10)))
FAULT_KINDS = ("kill", "pause", "disconnect")
CPU_METHODS = ("auto", "cgroup-v2", "cgroup-v1", "duty-cycle", "none")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkConfig:
    """One party's network link to the broker (shaped by a relay, :mod:`sim.cluster.relay`).

    Attributes:
        latency_s: one-way latency, seconds (each direction).
        bandwidth_mbps: link rate, Mbit/s (0: unlimited).
        loss: probability that a TCP segment is lost (a retransmission timeout).
        seed: seed of the loss draws.
    """

    latency_s: float = 0.0
    bandwidth_mbps: float = 0.0
    loss: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError("link.latency_s", f"must be >= 0 seconds, got {self.latency_s}")
        if not (math.isfinite(self.bandwidth_mbps) and self.bandwidth_mbps >= 0):
            raise ConfigError("link.bandwidth_mbps",
                              f"must be >= 0 Mbit/s (0: unlimited), got {self.bandwidth_mbps}")
        if not 0.0 <= self.loss < 1.0:
            raise ConfigError("link.loss", f"must be in [0, 1), got {self.loss}")

    @property
    def shaped(self) -> bool:
        """True when the link needs a relay (any latency, bandwidth limit or loss)."""
        return self.latency_s > 0 or self.bandwidth_mbps > 0 or self.loss > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PartySpec:
    """One party's resources.

    Attributes:
        cores: CPU cores for the party (fractional allowed); 0 = from ``cpu_ratio``.
        memory_mb: memory limit, MiB (0: none).
        link: its link to the broker.
    """

    cores: float = 0.0
    memory_mb: float = 0.0
    link: LinkConfig = field(default_factory=LinkConfig)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cores) and self.cores >= 0):
            raise ConfigError("cores", f"must be >= 0 (0: from cpu_ratio), got {self.cores}")
        if not (math.isfinite(self.memory_mb) and self.memory_mb >= 0):
            raise ConfigError("memory_mb", f"must be >= 0 MiB (0: no limit), got {self.memory_mb}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSpec:
    """A fault injected at a time.

    Attributes:
        at_s: seconds after the reference point: both parties found each other
            (training starts then), or with ``after_epochs`` the active party's end of
            that epoch.
        after_epochs: 0, or fire ``at_s`` after the active party logged this many
            completed epochs (a fault tied to training progress, not to wall time: a
            faster machine or code cannot finish the run before it fires).
        party: a party id: ``"active"``, ``"passive"``, ``"passive2"`` … ``"passive9"``
            (the run must have that party).
        kind: ``"kill"`` (SIGKILL), ``"pause"`` (SIGSTOP, SIGCONT after ``duration_s``)
            or ``"disconnect"`` (the party's relay drops its connections and refuses new
            ones for ``duration_s``).
        duration_s: length of a pause or disconnect, seconds.
    """

    at_s: float
    party: str
    kind: str
    duration_s: float = 0.0
    after_epochs: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.at_s) and self.at_s >= 0):
            raise ConfigError("faults.at_s", f"must be >= 0 seconds, got {self.at_s}")
        if isinstance(self.after_epochs, bool) or not isinstance(self.after_epochs, int) \
                or self.after_epochs < 0:
            raise ConfigError("faults.after_epochs",
                              f"must be a whole number of epochs >= 0, got {self.after_epochs!r}")
        if self.party not in PARTY_IDS:
            raise ConfigError("faults.party", f"must be 'active', 'passive' or 'passive2' … "
                                              f"'passive9', got {self.party!r}")
        if self.kind not in FAULT_KINDS:
            raise ConfigError("faults.kind", f"must be one of {FAULT_KINDS}, got {self.kind!r}")
        if self.kind != "kill" and not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ConfigError("faults.duration_s",
                              f"a {self.kind} needs duration_s > 0 seconds, got {self.duration_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A heterogeneous cluster of VFL parties on one machine.

    Attributes:
        name: label (reports, plots).
        cpu_ratio: ``"A:P"`` active:passive CPU shares, e.g. ``"50:14"`` (with several
            passive parties, P is split equally among them), or one share per party in
            party order; empty = every party gives ``cores`` itself.
        ratio_of: the ratio is a share of this many cores (0: the sum of its parts), e.g.
            64 for the paper's "50:14 of 64 cores".
        machine_cores: cores the shares are fractions of (0: this machine's usable CPUs).
        cpu_method: how shares are enforced (see :class:`sim.cluster.cpu.CpuLimiter`).
        cpu_period_us: the quota's period, µs (1,000-1,000,000). A share of 0.4375
            cores runs 4.4 ms and then waits 5.6 ms in each 10 ms period; with the
            kernel's usual 100 ms the party would stop for 56 ms at a time, a stall that
            14 dedicated cores of a real cluster never have, and that only very deep
            pipelines hide.
        timeout_s: the whole job's deadline, seconds.
        end_margin_s: after a fatal fault (a kill), how long the survivors may take to
            reach a clear end state beyond ``max(T_ddl, liveness timeout)``, seconds.
        active / passive: the parties' resources.
        more: the further passive parties' resources, ``(party id, spec)`` pairs (TOML:
            ``[scenario.passive2]`` …); a party of the run not named here gets the
            defaults (no limit but its CPU share, an unshaped link).
        faults: the fault schedule.
    """

    name: str = "scenario"
    cpu_ratio: str = ""
    ratio_of: float = 0.0
    machine_cores: float = 0.0
    cpu_method: str = "auto"
    cpu_period_us: int = 10_000
    timeout_s: float = 1800.0
    end_margin_s: float = 10.0
    active: PartySpec = field(default_factory=PartySpec)
    passive: PartySpec = field(default_factory=PartySpec)
    more: tuple[tuple[str, PartySpec], ...] = ()
    faults: tuple[FaultSpec, ...] = ()

    def __post_init__(self) -> None:
        if self.cpu_method not in CPU_METHODS:
            raise ConfigError("scenario.cpu_method",
                              f"must be one of {CPU_METHODS}, got {self.cpu_method!r}")
        if not 1_000 <= self.cpu_period_us <= 1_000_000:
            raise ConfigError("scenario.cpu_period_us",
                              f"must be 1000-1000000 µs, got {self.cpu_period_us}")
        if not self.timeout_s > 0:
            raise ConfigError("scenario.timeout_s", f"must be > 0 seconds, got {self.timeout_s}")
        if self.cpu_ratio:
            parse_ratio(self.cpu_ratio)  # raises ConfigError
        elif not (self.active.cores > 0 and self.passive.cores > 0
                  and all(spec.cores > 0 for _, spec in self.more)):
            raise ConfigError("scenario.cpu_ratio",
                              "give cpu_ratio, or cores for every party")
        for pid, _ in self.more:
            if pid not in PARTY_IDS[2:]:
                raise ConfigError(f"scenario.{pid}", "not a further passive party's id "
                                                     "(passive2 … passive9)")
        if self.ratio_of < 0 or self.machine_cores < 0:
            raise ConfigError("scenario.ratio_of", "ratio_of and machine_cores must be >= 0")

    def party(self, party: str) -> PartySpec:
        """The :class:`PartySpec` of a party id (defaults for a further passive party the
        scenario does not name)."""
        if party not in PARTY_IDS:
            raise ValueError(f"party must be 'active', 'passive' or 'passive2' … 'passive9', "
                             f"got {party!r}")
        if party in ROLES:
            return self.active if party == "active" else self.passive
        return dict(self.more).get(party, PartySpec())


def parse_ratio(text: str) -> tuple[float, ...]:
    """``"50:14"`` -> ``(50.0, 14.0)``; ``"40:8:8:8"`` -> four shares.

    Raises:
        ConfigError: not 2 to 10 positive finite numbers separated by ``:``.
    """
    parts = text.split(":")
    try:
        vals = tuple(float(p) for p in parts)
    except ValueError:
        vals = ()
    if not 2 <= len(vals) <= len(PARTY_IDS) or not all(math.isfinite(v) and v > 0
                                                       for v in vals):
        raise ConfigError("scenario.cpu_ratio",
                          f"expected 'A:P' (or one share per party, up to {len(PARTY_IDS)}) "
                          f"with positive numbers, got {text!r}")
    return vals


def party_shares(ratio: Sequence[float], party_ids: Sequence[str]) -> list[float]:
    """One share per party (``party_ids``: ``active`` first) from a parsed ``cpu_ratio``:
    the ratio's own shares when it has one per party; from ``"A:P"``, P split equally
    among the passive parties.

    Raises:
        ConfigError: the ratio has neither 2 shares nor one per party.
    """
    n = len(party_ids)
    if len(ratio) == n:
        return list(ratio)
    if len(ratio) == 2:
        return [ratio[0], *([ratio[1] / (n - 1)] * (n - 1))]
    raise ConfigError("scenario.cpu_ratio", f"{len(ratio)} shares for {n} parties "
                                            f"({', '.join(party_ids)}): give 'A:P' or {n}")


def party_cores(scn: Scenario, machine_cores: float,
                party_ids: Sequence[str] = ROLES) -> dict[str, float]:
    """Cores of each party (``party_ids``, ``active`` first) on a machine with
    ``machine_cores`` usable cores.

    A party's own ``cores`` wins; otherwise its share of ``cpu_ratio``
    (:func:`party_shares`): share ÷ ``ratio_of`` (default the ratio's sum) × the
    machine's cores.

    Raises:
        ConfigError: the parties together ask for more than the machine has; a party
            without cores and no ``cpu_ratio``; a ratio that fits neither form.
    """
    total = scn.machine_cores or machine_cores
    out: dict[str, float] = {}
    ratio = parse_ratio(scn.cpu_ratio) if scn.cpu_ratio else None
    shares = party_shares(ratio, party_ids) if ratio else None
    of = scn.ratio_of or (sum(ratio) if ratio else 0.0)
    for i, party in enumerate(party_ids):
        own = scn.party(party).cores
        if own > 0:
            out[party] = own
        elif shares is None:
            raise ConfigError(f"scenario.{party}.cores",
                              "give cpu_ratio, or cores for every party")
        else:
            out[party] = shares[i] / of * total
    if sum(out.values()) > total * (1 + 1e-9):
        raise ConfigError("scenario.cpu_ratio",
                          f"the parties ask for {sum(out.values()):g} cores; the machine has "
                          f"{total:g}")
    return out


def load_scenario(path: str | Path, sets: Sequence[str] = ()) -> tuple[Scenario, dict[str, Any]]:
    """Read ``[scenario]`` and the ``[vfl]`` table from a TOML file, with ``--set``
    overrides (``scenario.x=v`` or ``vfl.x=v``).

    Returns:
        ``(scenario, vfl_table)``: the parsed scenario and the raw ``[vfl]`` mapping
        (the caller builds the :class:`parties.config.VflConfig` from it, so this module
        stays independent of the parties).

    Raises:
        ConfigError: missing file, bad TOML, an unknown section or key, or an invalid value.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError("", f"scenario file {str(p)!r} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{p}: invalid TOML: {exc}") from None
    unknown = sorted(set(data) - {"scenario", "vfl"})
    if unknown:
        raise ConfigError(unknown[0], "unknown section (expected [scenario] and [vfl])")
    over = parse_overrides(sets)
    bad = sorted(set(over) - {"scenario", "vfl"})
    if bad:
        raise ConfigError(bad[0], "--set keys must start with 'scenario.' or 'vfl.'")
    table = deep_merge(dict(data.get("scenario", {})), over.get("scenario", {}))
    more = []
    for pid in PARTY_IDS[2:]:
        if pid in table:
            raw = table.pop(pid)
            if not isinstance(raw, dict):
                raise ConfigError(f"scenario.{pid}", "expected a table")
            more.append((pid, from_mapping(PartySpec, raw, section=f"scenario.{pid}")))
    faults = table.pop("faults", [])
    if not isinstance(faults, list):
        raise ConfigError("scenario.faults", "expected an array of tables ([[scenario.faults]])")
    if "more" in table:
        raise ConfigError("scenario.more", "unknown key (name a further passive party's "
                                           "table [scenario.passive2] … instead)")
    scn = from_mapping(Scenario, table, section="scenario")
    scn = dataclasses.replace(scn, more=tuple(more)) if more else scn
    parsed = tuple(from_mapping(FaultSpec, f, section=f"scenario.faults[{i}]")
                   for i, f in enumerate(faults))
    scn = dataclasses.replace(scn, faults=tuple(sorted(parsed, key=lambda f: (f.after_epochs, f.at_s))))
    vfl = deep_merge(dict(data.get("vfl", {})), over.get("vfl", {}))
    return scn, vfl


def path_mbps(scn: Scenario, party_ids: Sequence[str] = ROLES) -> float:
    """The bandwidth of the slowest bandwidth-limited link among ``party_ids``' links,
    Mbit/s (0: none is limited). Every message between two parties crosses both of their
    links to the broker, so this bounds every party-to-party path of the run; the runner
    gives it to the parties as ``vfl.wire.link_mbps`` (what ``vfl.wire.dtype = "auto"``
    decides on)."""
    rates = [scn.party(p).link.bandwidth_mbps for p in party_ids]
    return min((r for r in rates if r > 0), default=0.0)


def describe(scn: Scenario, cores: Mapping[str, float]) -> dict[str, Any]:
    """JSON-ready summary of the scenario with the resolved cores."""
    return {
        "name": scn.name, "cpu_ratio": scn.cpu_ratio, "ratio_of": scn.ratio_of,
        "cores": dict(cores), "cpu_method": scn.cpu_method,
        "cpu_period_us": scn.cpu_period_us,
        "links": {r: {"latency_s": scn.party(r).link.latency_s,
                      "bandwidth_mbps": scn.party(r).link.bandwidth_mbps,
                      "loss": scn.party(r).link.loss} for r in cores},
        "memory_mb": {r: scn.party(r).memory_mb for r in cores},
        "faults": [{"at_s": f.at_s, "after_epochs": f.after_epochs, "party": f.party,
                    "kind": f.kind, "duration_s": f.duration_s} for f in scn.faults],
    }
