"""Single-worker compute profile of a VFL config, and the throughput ceiling it implies.

The *ceiling* is the training throughput (samples/s) that the parties' allotted cores
allow when compute never waits:

    ceiling = min over parties p of  cores_p / s_p

where ``s_p`` is the measured CPU seconds per training sample of party p's share of one
training step at batch size B:

* passive: bottom forward, (DP clip + noise, when on), bottom backward from a cut-layer
  gradient, Adam step;
* active: its own bottom forward, top forward, loss, backward through top and bottom,
  Adam step.

A single worker has no one to synchronise with, so the profiled step has no
parameter-server sync: the ceiling is the same for every algorithm, and sync, like every
other cost of coordination, counts against an algorithm's efficiency.

When the parties share cores (neither pinned, or overlapping CPU sets) they cannot both
use them at once, so the ceiling is also capped by ``|cores_a ∪ cores_p| / (s_a + s_p)``;
with disjoint pinned sets that cap never binds (it is a mediant of the per-party terms).

How it is measured (:func:`profile_config`): no bus, no broker, no messages. Each
party's process (all its threads) is pinned to that party's configured CPUs
(``vfl.workers.active_cpus`` / ``vfl.workers.passive_cpus``; unpinned parties run on the process's own
CPU set), ``torch.set_num_threads(vfl.workers.torch_threads)``, and the worker compute of
:func:`parties.models.compute.make_compute` (exactly what a worker thread or process runs) is
driven on the run's real training batches (``epoch_batches`` of the run's seed), with
random ``(B, d)`` float32 embeddings / gradients from the partner. With both parties
pinned to disjoint CPU sets (the run's layout, and what ``bench/vfl_table.py`` does) the
two are profiled at the same time in two child processes (layout ``concurrent``), so each
timed step runs beside the other party's compute as it does in a run; otherwise one
after the other in this process (layout ``alone``). After warm-up steps, each step is
timed with ``time.process_time`` (CPU seconds of the whole process, so intra-op threads
count) and ``time.perf_counter`` (wall); the ceiling uses the **median CPU time per step
over all timed steps, ÷ B** (wall is reported alongside; on an idle pinned core the two
agree).

Why concurrent: two compute-heavy processes slow each other down on this machine
(shared L3 cache and memory bandwidth, the hypervisor), with no message between them.
``bench/vfl_bound.py`` measured the issue's synthetic setting (60,000 x 500, B = 256): the
active step took 4.00 ms CPU alone and 4.45 ms while the passive party's loop ran on the
other core, so a profile of one party at a time put the ceiling about 10 % above what
any two-party run can reach, whatever its coordination.

Why the median over a long window (at least 3 CPU seconds per party by default): this
machine's speed drifts by 10-20 % over seconds (the same step loop ran 4.2 ms per step
in one invocation and 5.0 ms in the next), and runs live through those phases. A
representative median is the fair yardstick. The minimum of block medians
(``timeit``'s rule) was tried and picks the fastest phase, about 10 % under what the
runs meet: the run's own step calls took 4.76 ms (median) while that profile said 3.94
ms, and a standalone loop of the same calls 4.6-4.8 ms. A single median over 1 s taken
while the machine was still settling erred the other way: bank's active step 4.8 ms
against 3.9 ms for the wider adult model, and a baseline then ran at 1.11 × the
ceiling. The timed steps are also split into :data:`PROFILE_BLOCKS` consecutive blocks
whose spread (``cpu_block_spread``) shows how much the machine drifted meanwhile;
:func:`mean_profile` averages profiles taken before and after a batch of runs (as
``bench/vfl_table.py`` does), so the ceiling reflects the machine over the runs' period.

Source of the definition: the PubSub-VFL evaluation issue of this project (efficiency
= training samples/s ÷ ceiling; above 1.05 means the profile is wrong).

Several passive parties (``vfl.passive_parties`` > 1): each passive party is profiled
with its own data (its own columns, so its own input width) and model, under its party
id (``parties.passive2`` … of ``profile.json``, beside ``active`` and ``passive``); in
the concurrent layout all parties run at once, the passive parties on the CPUs they
share in a run (``passive_cpus``). The ceiling is the minimum over every party, and the
shared-cores cap applies to each group of parties whose CPU sets overlap.

The profile loads each party's whole training table, ``synthetic`` included: the table's
size matters once both parties run. Beside the passive party's compute, the active
step of the issue's synthetic setting took 4.18 ms CPU with 20,000 rows generated and
4.41 ms with the run's 60,000 (alone: 4.07 and 4.00 ms): the two parties' tables share
the 32 MiB L3 cache, and the batch gathers miss it once they no longer fit.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
import structlog

from parties.config import MAX_PASSIVE_PARTIES, VflConfig, passive_party_ids, role_of
from pubsub.config import ConfigError

log = structlog.get_logger(__name__)

#: Consecutive blocks the timed steps are split into to report the drift
#: (``cpu_block_spread``; see the module docstring).
PROFILE_BLOCKS = 5
#: Efficiency above this means the profile under-states the compute: an error.
EFFICIENCY_LIMIT = 1.05


class ProfileError(RuntimeError):
    """The profile cannot be taken (e.g. fewer training rows than one batch)."""


class EfficiencyTooHigh(ProfileError):
    """A run beat its ceiling by more than :data:`EFFICIENCY_LIMIT`: the profile is wrong.

    Attributes:
        efficiency: the run's samples/s ÷ ceiling.
    """

    def __init__(self, efficiency: float, what: str = "") -> None:
        self.efficiency = efficiency
        super().__init__(f"efficiency {efficiency:.3f} > {EFFICIENCY_LIMIT}"
                         f"{' for ' + what if what else ''}: the single-worker profile "
                         "under-states the compute (the ceiling is too low)")


@dataclass(frozen=True, slots=True, kw_only=True)
class PartyProfile:
    """One party's measured share of a training step.

    Attributes:
        role: ``"active"`` or ``"passive"``.
        cpus: CPU ids the measurement ran on (the party's pinned set, or the process's).
        cores: cores allotted to the party: ``len(cpus)``, or its cgroup CPU quota when
            that is smaller (:func:`parties.core.sysinfo.cores_allotted`).
        n_features: the party's encoded feature width ``d_in``.
        batch_size: B, rows per step.
        steps: timed steps (after ``warmup_steps``).
        warmup_steps: untimed steps first.
        cpu_s_per_step: median CPU seconds per step (``time.process_time``).
        wall_s_per_step: median wall seconds per step (``time.perf_counter``).
        cpu_s_per_sample: ``cpu_s_per_step / batch_size``; the ceiling's input.
        wall_s_per_sample: ``wall_s_per_step / batch_size``.
        cpu_iqr_rel: interquartile range of all timed steps' CPU times ÷ their median.
        cpu_block_spread: (largest − smallest of the :data:`PROFILE_BLOCKS` block medians)
            ÷ smallest: how much the machine drifted during the measurement.
        cpu_s_per_step_mean: mean CPU seconds per step (all timed CPU ÷ steps); None in
            profiles written before it existed.
        party: the party id when it is not the role (``passive2`` …); "" otherwise.
    """

    role: str
    cpus: tuple[int, ...]
    cores: float
    n_features: int
    batch_size: int
    steps: int
    warmup_steps: int
    cpu_s_per_step: float
    wall_s_per_step: float
    cpu_s_per_sample: float
    wall_s_per_sample: float
    cpu_iqr_rel: float
    cpu_block_spread: float = 0.0
    cpu_s_per_step_mean: float | None = None
    party: str = ""

    @property
    def party_id(self) -> str:
        """The party's id: ``party``, else its role."""
        return self.party or self.role

    @property
    def samples_per_s(self) -> float:
        """``cores / cpu_s_per_sample``: this party's own bound, samples/s."""
        return self.cores / self.cpu_s_per_sample


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeProfile:
    """Every party's profile and the throughput ceiling.

    Attributes:
        active / passive: :class:`PartyProfile` of each party (``passive``: the first
            passive party's).
        ceiling_samples_per_s: training samples/s the allotted cores allow at most.
        bound_by: ``"active"``, ``"passive"`` or ``"shared"`` (the shared-cores cap).
        basis: ``"cpu"``: the ceiling uses CPU seconds (wall is reported too).
        settings: the config values the profile depends on.
        more_passive: with several passive parties, the others' profiles (``passive2``
            …, in party order).
    """

    active: PartyProfile
    passive: PartyProfile
    ceiling_samples_per_s: float
    bound_by: str
    basis: str
    settings: dict[str, Any]
    more_passive: tuple[PartyProfile, ...] = ()

    @property
    def parties(self) -> tuple[PartyProfile, ...]:
        """Every party's profile: active, then the passive parties in party order."""
        return (self.active, self.passive, *self.more_passive)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``profile.json``)."""
        out: dict[str, Any] = {
            "ceiling_samples_per_s": self.ceiling_samples_per_s,
            "bound_by": self.bound_by,
            "basis": self.basis,
            "parties": {},
            "settings": self.settings,
        }
        for p in self.parties:
            d = asdict(p)
            if not p.party:
                del d["party"]
            d["cpus"] = list(p.cpus)
            d["samples_per_s"] = p.samples_per_s
            out["parties"][p.party_id] = d
        return out


def party_from_dict(d: Mapping[str, Any]) -> PartyProfile:
    """A :class:`PartyProfile` from its ``profile.json`` form (extra keys ignored).

    Raises:
        KeyError: a field is missing.
    """
    optional = {"cpu_block_spread", "cpu_s_per_step_mean", "party"}  # absent from older ones
    kw = {f.name: d[f.name] for f in fields(PartyProfile)
          if f.name in d or f.name not in optional}
    kw["cpus"] = tuple(kw["cpus"])
    return PartyProfile(**kw)


def mean_profile(profiles: Sequence[ComputeProfile]) -> ComputeProfile:
    """Average several profiles of one config (e.g. taken before and after a batch of
    runs): each party's CPU and wall seconds per step are the means over the profiles,
    its block spread the largest; the ceiling is recomputed from the means.

    Raises:
        ValueError: no profiles, or profiles of different cores or batch sizes.
    """
    if not profiles:
        raise ValueError("mean_profile needs at least one profile")
    ids = [p.party_id for p in profiles[0].parties]
    if any([p.party_id for p in prof.parties] != ids for prof in profiles):
        raise ValueError("mean_profile needs profiles of the same parties")
    parties: dict[str, PartyProfile] = {}
    for k, role in enumerate(ids):
        ps = [prof.parties[k] for prof in profiles]
        if len({(p.cpus, p.batch_size) for p in ps}) != 1:
            raise ValueError(f"{role} profiles differ in CPUs or batch size: "
                             f"{[(p.cpus, p.batch_size) for p in ps]}")
        cpu = statistics.fmean(p.cpu_s_per_step for p in ps)
        wall = statistics.fmean(p.wall_s_per_step for p in ps)
        means = [p.cpu_s_per_step_mean for p in ps]
        parties[role] = replace(
            ps[0], steps=sum(p.steps for p in ps), cpu_s_per_step=cpu, wall_s_per_step=wall,
            cpu_s_per_sample=cpu / ps[0].batch_size, wall_s_per_sample=wall / ps[0].batch_size,
            cpu_s_per_step_mean=(statistics.fmean(means) if None not in means else None),
            cpu_iqr_rel=max(p.cpu_iqr_rel for p in ps),
            cpu_block_spread=max(p.cpu_block_spread for p in ps))
    every = [parties[i] for i in ids]
    value, bound = ceiling(*every)
    return replace(profiles[0], active=every[0], passive=every[1],
                   more_passive=tuple(every[2:]), ceiling_samples_per_s=value, bound_by=bound,
                   settings={**profiles[0].settings, "profiles_averaged": len(profiles)})


def compute_profile_from_dict(d: Mapping[str, Any]) -> ComputeProfile:
    """A :class:`ComputeProfile` from ``profile.json`` (:meth:`ComputeProfile.to_dict`).

    Raises:
        KeyError: a field is missing.
    """
    parties = d["parties"]
    more = []
    for party in passive_party_ids(MAX_PASSIVE_PARTIES)[1:]:
        if party not in parties:
            break
        more.append(party_from_dict(parties[party]))
    return ComputeProfile(active=party_from_dict(parties["active"]),
                          passive=party_from_dict(parties["passive"]),
                          ceiling_samples_per_s=d["ceiling_samples_per_s"],
                          bound_by=d["bound_by"], basis=d["basis"], settings=d["settings"],
                          more_passive=tuple(more))


def ceiling(active: PartyProfile, *passives: PartyProfile) -> tuple[float, str]:
    """The throughput ceiling (samples/s) and what binds it (see the module docstring):
    the party id of the slowest party, or ``"shared"`` when a group of parties whose CPU
    sets overlap cannot all run at their own bound on the union of their CPUs."""
    every = (active, *passives)
    per_party = {p.party_id: p.samples_per_s for p in every}
    role = min(per_party, key=lambda r: per_party[r])
    bound = per_party[role]
    for group in _overlapping(every):
        union = len(set().union(*(p.cpus for p in group)))
        shared = union / sum(p.cpu_s_per_sample for p in group)
        if shared < bound:
            bound, role = shared, "shared"
    return bound, role


def _overlapping(parties: Sequence[PartyProfile]) -> list[list[PartyProfile]]:
    """The groups (two or more parties) whose CPU sets overlap, directly or through
    another party of the group."""
    groups: list[tuple[set[int], list[PartyProfile]]] = []
    for p in parties:
        cpus, members = set(p.cpus), [p]
        for g in [g for g in groups if g[0] & cpus]:
            groups.remove(g)
            cpus |= g[0]
            members = g[1] + members
        groups.append((cpus, members))
    return [m for _, m in groups if len(m) > 1]


def efficiency(train_samples_per_s: float, ceiling_samples_per_s: float, *,
               what: str = "", check: bool = True) -> float:
    """``train_samples_per_s / ceiling_samples_per_s`` (both over training time only).

    Raises:
        EfficiencyTooHigh: with ``check``, the result exceeds :data:`EFFICIENCY_LIMIT`.
        ValueError: the ceiling is not positive.
    """
    if not ceiling_samples_per_s > 0:
        raise ValueError(f"ceiling must be > 0 samples/s, got {ceiling_samples_per_s!r}")
    eff = train_samples_per_s / ceiling_samples_per_s
    if check and eff > EFFICIENCY_LIMIT:
        raise EfficiencyTooHigh(eff, what)
    return eff


def profile_party(role: str, cfg: VflConfig, x_train: np.ndarray, y_train: np.ndarray | None,
                  *, warmup_steps: int = 10, warmup_time_s: float = 0.3, min_steps: int = 40,
                  min_time_s: float = 3.0, max_steps: int = 5000,
                  before_timing: Callable[[], None] | None = None,
                  keep_busy: Callable[[], bool] | None = None) -> PartyProfile:
    """Time one worker's compute for ``role`` in this process (no pinning done here).

    Args:
        role: ``"active"``, ``"passive"`` or another passive party's id (``"passive2"``
            …; its shape is ``x_train``'s).
        cfg: the run's config (B, model, DP, epochs, seed).
        x_train: ``(n_train, d_in)`` float32 features of the party, ``n_train >= B``.
        y_train: ``(n_train,)`` float32 labels (active party only).
        warmup_steps / warmup_time_s: untimed steps first: at least this many, and for
            at least this many CPU seconds (at most ``max_steps``).
        min_steps / min_time_s / max_steps: time at least ``min_steps`` steps and at
            least ``min_time_s`` CPU seconds, at most ``max_steps`` steps.
        before_timing: called after the warm-up, before the first timed step (the
            concurrent layout's start barrier).
        keep_busy: after the timed steps, untimed steps go on while it returns True
            (the concurrent layout: until the other party's timing is done too).

    Returns:
        :class:`PartyProfile` (``cpus``/``cores`` are this process's current CPU set).

    Raises:
        ProfileError: fewer training rows than one batch.
    """
    import torch

    from parties.models.model import ParameterServer, PassiveCompute, flat_params
    from parties.models.model import party_modules
    from parties.algorithms.schedule import epoch_batches
    from parties.models.compute import make_compute

    party = role
    role = role_of(party)
    n_train, d_in = x_train.shape
    B = cfg.batch_size
    if n_train < B:
        raise ProfileError(f"{role}: {n_train} training rows, fewer than one batch (B={B})")
    torch.manual_seed(cfg.seed + (0 if role == "active" else 1))
    mods = party_modules(cfg, role, d_in)
    ps = ParameterServer(flat_params(mods))
    compute = make_compute(role, cfg, x_train, y_train, ps, sync_mode="manual",
                           noise_seed=12345 if cfg.dp.enabled or cfg.labels.protected else None,
                           party=party)
    gen = np.random.default_rng(cfg.seed)
    partner = gen.standard_normal((B, cfg.model.embedding_dim)).astype(np.float32) * 0.01
    # the active party fuses one embedding per passive party
    embs = partner if cfg.passive_parties == 1 else [partner] * cfg.passive_parties

    batches: list[np.ndarray] = []
    epoch = 0
    while len(batches) < min(max_steps, 4096):
        batches += [b for b in epoch_batches(n_train, B, seed=cfg.seed, epoch=epoch)
                    if len(b) == B]
        epoch += 1

    def step(i: int) -> None:  # (the epoch argument only feeds the unused sync schedule)
        rows = batches[i]
        if isinstance(compute, PassiveCompute):
            h, _pub = compute.forward(rows)
            compute.backward(h, partner, 0)
        else:
            compute.top_step(compute.forward_own(rows), embs, rows, 0)

    c0 = time.process_time()
    warmed = 0
    while warmed < warmup_steps or (time.process_time() - c0 < warmup_time_s
                                    and warmed < max_steps):
        step(warmed % len(batches))
        warmed += 1
    if before_timing is not None:
        before_timing()
    cpu: list[float] = []
    wall: list[float] = []
    spent = 0.0
    while len(cpu) < max_steps and (len(cpu) < min_steps or spent < min_time_s):
        c0, w0 = time.process_time(), time.perf_counter()
        step((warmed + len(cpu)) % len(batches))
        c1, w1 = time.process_time(), time.perf_counter()
        cpu.append(c1 - c0)
        wall.append(w1 - w0)
        spent += c1 - c0
    extra = 0
    while keep_busy is not None and keep_busy():
        step((warmed + len(cpu) + extra) % len(batches))
        extra += 1
    blocks = _blocks(len(cpu))
    cpu_meds = [statistics.median(cpu[a:b]) for a, b in blocks]
    cpu_med, wall_med = statistics.median(cpu), statistics.median(wall)
    q = statistics.quantiles(cpu, n=4) if len(cpu) >= 2 else [cpu_med, cpu_med, cpu_med]
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else tuple(
        range(os.cpu_count() or 1))
    from parties.core.sysinfo import cores_allotted

    return PartyProfile(
        role=role, cpus=cpus, cores=cores_allotted(), n_features=int(d_in), batch_size=B,
        steps=len(cpu), warmup_steps=warmed, cpu_s_per_step=cpu_med,
        wall_s_per_step=wall_med, cpu_s_per_sample=cpu_med / B,
        wall_s_per_sample=wall_med / B,
        cpu_iqr_rel=(q[2] - q[0]) / cpu_med if cpu_med > 0 else math.nan,
        cpu_block_spread=((max(cpu_meds) - min(cpu_meds)) / min(cpu_meds)
                          if min(cpu_meds) > 0 else math.nan),
        cpu_s_per_step_mean=statistics.fmean(cpu), party="" if party == role else party,
    )


def _blocks(n: int, blocks: int = PROFILE_BLOCKS) -> list[tuple[int, int]]:
    """``[start, stop)`` of up to ``blocks`` consecutive, near-equal, non-empty blocks of
    ``n >= 1`` timed steps."""
    k = max(1, min(blocks, n))
    edges = [round(j * n / k) for j in range(k + 1)]
    return [(edges[j], edges[j + 1]) for j in range(k)]


#: How long a concurrent-layout profile may take in all (start-up, data, timing), seconds.
CONCURRENT_TIMEOUT_S = 900.0
#: Layouts :func:`profile_config` knows (``auto`` picks one of the other two).
LAYOUTS = ("auto", "concurrent", "alone")


def resolve_layout(cfg: VflConfig, layout: str = "auto", *, grouped: bool = False) -> str:
    """``"concurrent"`` or ``"alone"``: what ``layout`` means for ``cfg``.

    ``auto`` is ``concurrent`` when both parties are pinned (``active_cpus`` and
    ``passive_cpus`` set) to disjoint CPU sets, as a run lays them out, or when each
    party has its own CPU-share group (``grouped``: see ``join_groups`` of
    :func:`profile_config`), else ``alone``.

    Raises:
        ValueError: ``layout`` is not one of :data:`LAYOUTS`, or ``concurrent`` was asked
            for parties that are not pinned to disjoint CPU sets.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"profile layout must be one of {LAYOUTS}, got {layout!r}")
    a, p = set(cfg.workers.active_cpus), set(cfg.workers.passive_cpus)
    disjoint = (bool(a) and bool(p) and not (a & p)) or grouped
    if layout == "auto":
        return "concurrent" if disjoint else "alone"
    if layout == "concurrent" and not disjoint:
        raise ValueError("the concurrent profile layout needs both parties pinned to "
                         f"disjoint CPU sets, got workers.active_cpus={sorted(a)} "
                         f"workers.passive_cpus={sorted(p)}")
    return layout


def _settings(cfg: VflConfig, layout: str) -> dict[str, Any]:
    import torch

    return {
        "dataset": cfg.dataset, "batch_size": cfg.batch_size,
        "bottom_hidden": list(cfg.model.bottom_hidden),
        "active_bottom_hidden": list(cfg.model.bottom_hidden_for("active")),
        "passive_bottom_hidden": list(cfg.model.bottom_hidden_for("passive")), "embedding_dim": cfg.model.embedding_dim,
        "top_hidden": list(cfg.model.top_hidden), "torch_threads": cfg.workers.torch_threads,
        "worker_mode": cfg.workers.mode, "delta_t0": cfg.workers.delta_t0, "epochs": cfg.epochs,
        "dp": cfg.dp.enabled, "active_cpus": list(cfg.workers.active_cpus),
        "passive_cpus": list(cfg.workers.passive_cpus), "torch": torch.__version__,
        "python": platform.python_version(), "machine": platform.machine(),
        "rows_profiled": cfg.data.synthetic_rows if cfg.dataset == "synthetic" else None,
        "layout": layout,
        **({"passive_parties": cfg.passive_parties} if cfg.passive_parties > 1 else {}),
    }


def profile_config(cfg: VflConfig, *, layout: str = "auto",
                   join_groups: Mapping[str, Sequence[str]] | None = None,
                   **timing: Any) -> ComputeProfile:
    """Profile every party of ``cfg`` and compute the ceiling.

    ``join_groups`` (role -> ``cgroup.procs`` files): each party's profile process writes
    its pid into its files first, so it runs under the party's CPU share (a cgroup
    quota, as ``psfl sim run`` gives the party); the layout is then ``concurrent``, and
    the party's ``cores`` is the quota it sees (:func:`parties.core.sysinfo.cores_allotted`).

    Each party's data is loaded as the party would load it (the whole table), its
    process pinned to the party's CPUs, with
    ``cfg.workers.torch_threads`` intra-op threads. ``layout`` (see :func:`resolve_layout`):

    * ``concurrent``: the run's process layout. The two parties are profiled at the
      same time, each in its own child process pinned to its own CPUs; both warm up,
      start timing together, and a party that finishes first keeps computing (untimed)
      until the other is done, so every timed step ran beside the other party's
      compute, as in a run. Compute-heavy neighbours slow each other down on this
      machine (shared caches, memory bandwidth, the hypervisor): the active step of the
      issue's synthetic setting took 4.00 ms CPU alone and 4.45 ms beside the passive
      loop (``bench/vfl_bound.py``), a difference no coordination can win back.
    * ``alone``: one party at a time in this process, the other core idle (the only
      honest choice when the parties share cores; restored afterwards).

    ``timing`` goes to :func:`profile_party`.

    Raises:
        parties.data.DataError: the data cannot be loaded.
        pubsub.config.ConfigError: a configured CPU is not available to this process.
        ProfileError: too few training rows, or a concurrent profile's child failed or
            missed :data:`CONCURRENT_TIMEOUT_S`.
        ValueError: an unknown ``layout``.
    """
    layout = resolve_layout(cfg, layout, grouped=bool(join_groups))
    if layout == "concurrent":
        out = _profile_concurrent(cfg, timing, dict(join_groups or {}))
    else:
        out = _profile_alone(cfg, timing)
    for role, prof in out.items():
        log.info("vfl.profile_party", role=role, cpu_s_per_sample=prof.cpu_s_per_sample,
                 wall_s_per_sample=prof.wall_s_per_sample, cpus=prof.cpus, layout=layout)
    every = [out[p] for p in cfg.party_ids]
    value, bound = ceiling(*every)
    return ComputeProfile(active=every[0], passive=every[1], more_passive=tuple(every[2:]),
                          ceiling_samples_per_s=value, bound_by=bound, basis="cpu",
                          settings=_settings(cfg, layout))


def _profile_alone(cfg: VflConfig, timing: dict[str, Any]
                   ) -> dict[str, PartyProfile]:
    import torch

    from parties.data.party import load_party_data
    from parties.core.sysinfo import pin_process

    threads0 = torch.get_num_threads()
    out: dict[str, PartyProfile] = {}
    try:
        for party in (*cfg.party_ids[1:], "active"):
            data = load_party_data(cfg, party)
            role = role_of(party)
            torch.set_num_threads(cfg.workers.threads_for(role))
            try:
                before = pin_process(cfg.workers.cpus(role)) if cfg.workers.cpus(role) else None
            except (ValueError, OSError) as exc:
                raise ConfigError(f"vfl.workers.{role}_cpus", str(exc)) from None
            try:
                out[party] = profile_party(party, cfg, data.x_train, data.y_train, **timing)
            finally:
                if before is not None:
                    pin_process(before)
    finally:
        torch.set_num_threads(threads0)
    return out


def prepare_child(role: str, cfg: VflConfig, join: Sequence[str] = ()) -> Any:
    """Set up a profiling child process as the party's own process would be: join the
    party's CPU-share group(s) (``join``: ``cgroup.procs`` files), pin to its CPUs, set
    ``torch_threads``, and load its data; returns the
    :class:`parties.data.party.PartyData`. ``role``: the party id (``passive2`` … for
    another passive party: its own columns, pinned to ``passive_cpus``).

    Raises:
        pubsub.config.ConfigError: a configured CPU is not available to this process.
        parties.data.DataError: the data cannot be loaded.
    """
    import torch

    from parties.data.party import load_party_data
    from parties.core.sysinfo import pin_process

    party, role = role, role_of(role)
    for f in join:
        Path(f).write_text(str(os.getpid()))
    if cfg.workers.cpus(role):
        try:
            pin_process(cfg.workers.cpus(role))
        except (ValueError, OSError) as exc:
            raise ConfigError(f"vfl.workers.{role}_cpus", str(exc)) from None
    torch.set_num_threads(cfg.workers.threads_for(role))
    return load_party_data(cfg, party)


def _concurrent_child(role: str, cfg: VflConfig, timing: dict[str, Any],
                      barrier: Any, mine: Any, others: Sequence[Any], results: Any,
                      join: Sequence[str] = ()) -> None:
    """One party's side of a concurrent profile (a child process forked from the party fork server)."""
    try:
        data = prepare_child(role, cfg, join)
        busy_until = [0.0]

        def before() -> None:
            barrier.wait(CONCURRENT_TIMEOUT_S)

        def keep_busy() -> bool:
            if not mine.is_set():
                mine.set()
                busy_until[0] = time.monotonic() + CONCURRENT_TIMEOUT_S
            return (not all(o.is_set() for o in others)
                    and time.monotonic() < busy_until[0])

        prof = profile_party(role, cfg, data.x_train, data.y_train, before_timing=before,
                             keep_busy=keep_busy, **timing)
        results.put((role, prof, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        mine.set()
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        try:
            import pickle

            pickle.dumps(exc)
            results.put((role, None, exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            results.put((role, None, ProfileError(f"{role}: {type(exc).__name__}: {exc}")))


def _profile_concurrent(cfg: VflConfig, timing: dict[str, Any],
                        join_groups: dict[str, Sequence[str]] | None = None
                        ) -> dict[str, PartyProfile]:
    import queue

    from parties.core import zygote

    ctx = zygote.context()  # forked from a server that has imported torch once
    ids = (*cfg.party_ids[1:], "active")  # every party, at once
    barrier = ctx.Barrier(len(ids))
    done = {party: ctx.Event() for party in ids}
    results = ctx.Queue()
    procs = {role: ctx.Process(target=_concurrent_child, name=f"profile-{role}", daemon=True,
                               args=(role, cfg, timing, barrier, done[role],
                                     [done[p] for p in ids if p != role],
                                     results, tuple((join_groups or {}).get(role, ()))))
             for role in ids}
    deadline = time.monotonic() + CONCURRENT_TIMEOUT_S
    out: dict[str, PartyProfile] = {}
    errors: dict[str, BaseException] = {}
    try:
        for p in procs.values():
            p.start()
        while len(out) + len(errors) < len(ids):
            try:
                role, prof, exc = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in procs.items()
                        if r not in out and r not in errors and not p.is_alive()]
                if dead:
                    errors[dead[0]] = ProfileError(
                        f"the {dead[0]} profile process died (exit code "
                        f"{procs[dead[0]].exitcode})")
                elif time.monotonic() > deadline:
                    raise ProfileError(f"the concurrent profile took more than "
                                       f"{CONCURRENT_TIMEOUT_S:.0f} s") from None
                continue
            if exc is not None:
                errors[role] = exc
            else:
                out[role] = prof
        if errors:  # the cause, not the partner's broken barrier
            import threading

            first = sorted(errors.values(),
                           key=lambda e: isinstance(e, threading.BrokenBarrierError))[0]
            raise first
        for p in procs.values():
            p.join(max(1.0, deadline - time.monotonic()))
        return out
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
                p.join(5)


__all__ = ["CONCURRENT_TIMEOUT_S", "EFFICIENCY_LIMIT", "LAYOUTS", "resolve_layout", "PROFILE_BLOCKS", "compute_profile_from_dict", "mean_profile",
           "party_from_dict", "ComputeProfile", "EfficiencyTooHigh",
           "PartyProfile", "ProfileError", "ceiling", "efficiency", "profile_config",
           "profile_party"]
