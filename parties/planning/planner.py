"""The worker / batch-size planner: minimise the predicted epoch wall time over
``(w_a, w_p, B)`` (PubSub-VFL, arXiv 2510.12494, Sec. 4: system profiling and the
dynamic-programming choice of workers and batch size).

Pure logic: no sockets, no processes. Inputs are the parties'
:class:`parties.planning.costmodel.CostModel` fits: the active party's and one per passive party
(1 to 9 of them; with several, each passive party gets its own worker count, see
"Several passive parties" below).

Why not the bare formula
------------------------
The paper's per-worker step ``T = λ·B^γ·w/C`` makes a party's epoch
``⌈N/B⌉/w · λ·B^γ·w/C = ⌈N/B⌉·λ·B^γ/C``: independent of w, so any per-worker overhead
makes w = 1 optimal. A real party differs in three ways, each a term below.

The objective, per party p ∈ {active, passive} at ``(w, B)``
-------------------------------------------------------------
Notation: N training rows per epoch, d the embedding width, C_p the party's cores,
``threads`` torch intra-op threads per worker, ΔT the steps between a worker's PS syncs.

* ``n_b = ⌈N/B⌉`` batches (the last may be short; counted as a full step, as the
  runtime schedules it).
* ``W_p(B) = λ_f·B^γ_f + λ_b·B^γ_b``: work of one step, core-seconds (forward and
  backward fits, λ per core).
* (a) **threads cap.** A worker cannot use more than ``threads`` cores, so one worker's
  step with the cores it can use is ``s_p = W_p / min(threads, C_p)``, and w workers
  together use at most ``min(C_p, w·threads)`` cores. Under-subscription
  (``w·threads < C``) leaves cores idle; over-subscription time-slices the C cores.
  With no waiting this gives the per-worker step ``W_p / min(threads, C_p/w)`` of the
  brief and a party epoch ``n_b · W_p / min(w·threads, C_p)``.
* (b) **communication.** Each step a worker publishes a ``(B, d)`` float32 embedding
  (passive) or gradient (active) and waits for its partner's: a round trip
  ``r(B) = comm_A(4·d·B) + comm_P(4·d·B)`` seconds (each party's one-way
  :class:`~parties.planning.costmodel.CommFit`). The worker holds no core while it waits; other
  workers can use the cores meanwhile.
* (c) **PS sync.** With w >= 2 workers, each pushes its change and pulls the global
  parameters every ΔT steps: ``y_p = sync_p / ΔT`` seconds per step, where
  ``sync_p = sync_overhead_s + 2·sync_comm(param_bytes)``
  (:meth:`~parties.planning.costmodel.CostModel.sync_time`). With w = 1 the party never syncs on
  its own (:func:`parties.models.compute.sync_mode_for` gives ``"manual"``), so ``y_p = 0``.
  The sync blocks its worker but is counted as waiting, not as core work (an in-process
  copy of a small model; a remote PS is waiting anyway).

The party is a closed system of w workers, each cycling through ``s_p`` of compute and
``r + y_p`` of waiting. Its throughput obeys the asymptotic bounds of a closed queueing
network (Denning & Buzen 1978; Lazowska et al., *Quantitative System Performance*, 1984,
ch. 5): at most ``w / (s_p + r + y_p)`` steps/s (each worker's own cycle), and at most
``C_p / W_p`` (the cores' capacity). Hence

    T_p(w, B) = n_b · max( (s_p + r + y_p) / w ,  W_p / C_p )      seconds per epoch.

With one worker the round trip is fully exposed (``s + r``); with w >= 2 it overlaps
other workers' compute until the cores saturate. (The brief's rule
``max(0, r − (w−1)·step)`` exposed per step has the same two limits; the bound above is
the standard one, and it also covers over-subscription.) It is the optimistic bound: near
the knee real systems run somewhat slower.

* (d) **imbalance.** The parties are two pipeline stages joined by buffered per-batch
  channels (Sec. 4.1), so the epoch takes as long as the slower one and the faster
  party waits:

    epoch(w_a, w_p, B) = max( T_A(w_a, B), T_P(w_p, B) ),
    idle_p = 1 − T_p / epoch     (share of the epoch party p waits for its partner).

Constraints
-----------
* B in a discrete set: by default powers of two ``16, 32, ..., 1024`` (the issue's
  ``{16, 32, …, 1024}`` read as the usual doubling grid; :func:`batch_grid` with
  ``step=16`` gives ``16, 32, 48, ..., 1024`` instead).
* ``1 <= w_a, w_p <= W_max``.
* Memory: party p with w workers at batch B must fit its budget M̄_p
  (:meth:`~parties.planning.costmodel.MemoryFit.fits`). Default rule ``"shared"``:
  ``M_0 + w·ρ·B^χ <= M̄`` (thread workers share the party's baseline: tables, model,
  interpreter; each adds its batch-dependent memory); ``"per_worker"``:
  ``w·M(B) <= M̄`` (process workers, each with its own baseline). Either way
  ``B <= B_max = min_p b_max(M̄_p)`` with w = 1, the paper's bound.

Several passive parties
-----------------------
With passive parties ``P_1 … P_K`` (party ids ``passive``, ``passive2``, …; each its own
cost model: its own columns, so its own input width and step) every party is a stage of
the same pipeline: the active party's step needs every passive embedding of its batch,
and each passive party's needs the active party's gradient. Each passive party's round
trip is ``r_k(B) = comm_A(4·d·B) + comm_k(4·d·B)`` (its embedding out, its gradient
back); the active party's is ``r_A(B) = comm_A(K·4·d·B) + max_k comm_k(4·d·B)`` (its K
gradients leave one after another over its own link: one latency, K times the bytes;
the K embeddings come in parallel over the passive parties' links). For K = 1 both are
the two-party ``r(B)``. The epoch is the slowest stage:

    epoch(w_A, w_1, …, w_K, B) = max( T_A(w_A, B), T_1(w_1, B), …, T_K(w_K, B) ).

Dynamic programme (exact)
-------------------------
T_A depends only on ``(w_a, B)`` and T_P only on ``(w_p, B)`` (r(B) uses both parties'
comm fits but not their worker counts), and ``max`` is monotone in each argument, so
``min_{w_a, w_p} max(T_A, T_P) = max(min_{w_a} T_A, min_{w_p} T_P)``. Stage 1, per party
and B: ``T*_p(B) = min`` over memory-feasible w of ``T_p(w, B)``. Stage 2:
``E(B) = max(T*_A(B), T*_P(B))`` and ``B* = argmin E``. Ties: the plan minimises
``(epoch, w_a + w_p, B)`` lexicographically: for a given B and epoch E the fewest
workers are, separately per party, the smallest w with ``T_p(w, B) <= E`` (the faster
party gets no more workers than it needs to keep up). :func:`brute_force` enumerates all
triples with the same key, so it returns the same plan. Cost: ``O(|B|·W_max)`` against
``O(|B|·W_max²)``. With K passive parties the same argument holds for the max of K + 1
separable terms: ``E(B) = max(T*_A(B), T*_1(B), …, T*_K(B))``, each party's fewest workers
reaching it chosen independently (``O(|B|·(K+1)·W_max)``; brute force
``O(|B|·W_max^(K+1))``; the key is ``(epoch, Σ w, B)``).

The sync interval: ΔT_t grows over epochs (:func:`parties.algorithms.schedule.sync_interval`); the
per-party times are linear in ``1/ΔT``, so :func:`mean_sync_interval` (the harmonic mean
of ΔT_t over the run) gives each party's mean epoch time exactly; the max of means
slightly under-states the mean of maxima when the bottleneck party changes between
epochs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from parties.core.ids import passive_party_ids
from parties.planning.costmodel import MEMORY_RULES, CostModel, MemoryLimitTooSmall
from parties.algorithms.samples import SamplesModel
from parties.algorithms.schedule import sync_interval

#: Default candidate batch sizes: powers of two from 16 to 1024.
DEFAULT_BATCH_SIZES: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
#: Default W_max, the most workers per party.
DEFAULT_W_MAX = 8
#: Bytes of one float32 (embeddings and their gradients).
FLOAT_BYTES = 4


class PlannerError(ValueError):
    """Bad planner input."""


class NoFeasiblePlan(PlannerError):
    """No ``(w_a, w_p, B)`` fits the memory budgets (every B exceeds some party's
    ``b_max``, or a budget is below its baseline M_0).

    Attributes:
        b_max: the smallest of the parties' ``b_max`` (0 if a budget is below M_0).
    """

    def __init__(self, b_max: float, batch_sizes: Sequence[int]) -> None:
        self.b_max = b_max
        super().__init__(f"no batch size in {list(batch_sizes)} fits the memory budgets "
                         f"(B_max = {b_max:.6g})")


def batch_grid(lo: int = 16, hi: int = 1024, *, step: int | None = None) -> tuple[int, ...]:
    """Candidate batch sizes: ``lo, 2·lo, 4·lo, ... <= hi`` (``step`` None), or
    ``lo, lo + step, ... <= hi``.

    Raises:
        PlannerError: ``lo < 1``, ``hi < lo`` or ``step < 1``.
    """
    if lo < 1 or hi < lo or (step is not None and step < 1):
        raise PlannerError(f"bad batch grid: lo={lo!r}, hi={hi!r}, step={step!r}")
    if step is not None:
        return tuple(range(lo, hi + 1, step))
    out, b = [], lo
    while b <= hi:
        out.append(b)
        b *= 2
    return tuple(out)


def mean_sync_interval(epochs: int, delta_t0: int) -> float:
    """Harmonic mean of ΔT_t over epochs ``0 .. epochs−1`` (steps between syncs): the
    ΔT whose per-step sync cost ``sync/ΔT`` equals the run's mean.

    Raises:
        ValueError: ``epochs < 1`` or ``delta_t0 < 1``.
    """
    if epochs < 1:
        raise PlannerError(f"epochs must be >= 1, got {epochs!r}")
    return epochs / sum(1.0 / sync_interval(t, delta_t0) for t in range(epochs))


@dataclass(frozen=True, slots=True, kw_only=True)
class PartyTerms:
    """The terms of one party's predicted epoch at ``(w, B)`` (module docstring).

    Attributes:
        workers / batch_size: w and B.
        batches: n_b = ⌈N/B⌉.
        work_core_s: W(B), core-seconds per step.
        step_s: s = W / min(threads, C), one worker's compute per step, seconds.
        round_trip_s: r(B), seconds per step.
        sync_per_step_s: y = sync / ΔT (0 for w = 1), seconds per step.
        latency_bound_s: n_b · (s + r + y) / w, seconds.
        core_bound_s: n_b · W / C, seconds.
        epoch_s: max of the two bounds, seconds.
        memory_bytes: the party's memory at (w, B) under the memory rule, bytes.
    """

    workers: int
    batch_size: int
    batches: int
    work_core_s: float
    step_s: float
    round_trip_s: float
    sync_per_step_s: float
    latency_bound_s: float
    core_bound_s: float
    epoch_s: float
    memory_bytes: float


Partners = CostModel | Sequence[CostModel]


def _partners(partner: Partners) -> tuple[CostModel, ...]:
    return (partner,) if isinstance(partner, CostModel) else tuple(partner)


def party_terms(cost: CostModel, partner: Partners, *, b: int, w: int, n_rows: int,
                embedding_dim: int, threads: int = 1, delta_t: float = 1.0,
                memory_rule: str = "shared") -> PartyTerms:
    """Every term of ``T_p(w, B)`` for party ``cost``.

    ``partner``: the party it exchanges messages with: for a passive party the active
    party's model; for the active party every passive party's (one model, or a sequence
    of them; see "Several passive parties" in the module docstring).

    Raises:
        PlannerError: bad arguments (see :func:`plan`).
    """
    _check_common(n_rows=n_rows, embedding_dim=embedding_dim, threads=threads,
                  delta_t=delta_t, memory_rule=memory_rule)
    if b < 1 or w < 1:
        raise PlannerError(f"need b >= 1 and w >= 1, got {b!r}, {w!r}")
    partners = _partners(partner)
    if not partners:
        raise PlannerError("a party needs at least one partner")
    n_b = -(-n_rows // b)
    work = cost.work(b)
    step = work / min(float(threads), cost.cores)
    rtt = _round_trip(cost, partners, b, embedding_dim)
    sync = cost.sync_time() / delta_t if w >= 2 else 0.0
    lat = n_b * (step + rtt + sync) / w
    core = n_b * work / cost.cores
    return PartyTerms(workers=w, batch_size=b, batches=n_b, work_core_s=work, step_s=step,
                      round_trip_s=rtt, sync_per_step_s=sync, latency_bound_s=lat,
                      core_bound_s=core, epoch_s=max(lat, core),
                      memory_bytes=cost.memory.party_bytes(b, w, memory_rule))


def _round_trip(cost: CostModel, partners: tuple[CostModel, ...], b: int,
                embedding_dim: int) -> float:
    """r(B): the party's messages out (one per partner, back to back over its own link:
    one latency, the bytes of all) and the slowest partner's message in."""
    nbytes = FLOAT_BYTES * embedding_dim * b
    if len(partners) == 1:  # the two-party fast path (the planner's inner loop)
        return cost.comm.time(nbytes) + partners[0].comm.time(nbytes)
    return (cost.comm.time(len(partners) * nbytes)
            + max(p.comm.time(nbytes) for p in partners))


def party_epoch_time(cost: CostModel, partner: Partners, *, b: int, w: int, n_rows: int,
                     embedding_dim: int, threads: int = 1, delta_t: float = 1.0) -> float:
    """``T_p(w, B)``, seconds per epoch (the fast path of :func:`party_terms`; no checks)."""
    n_b = -(-n_rows // b)
    work = cost.work(b)
    step = work / min(float(threads), cost.cores)
    rtt = _round_trip(cost, _partners(partner), b, embedding_dim)
    sync = cost.sync_time() / delta_t if w >= 2 else 0.0
    return max(n_b * (step + rtt + sync) / w, n_b * work / cost.cores)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRow:
    """The best choice at one batch size (a row of :attr:`Plan.table`).

    Attributes:
        batch_size: B.
        feasible: some w of each party fits the memory budgets.
        w_active / w_passive: the fewest workers reaching the row's epoch (0 if
            infeasible); ``w_passive`` is the first passive party's.
        t_active_s / t_passive_s: each party's best ``T*_p(B)``, seconds (inf if no w
            fits); ``t_passive_s`` the first passive party's.
        epoch_s: ``max`` over the parties, seconds (inf if infeasible).
        passive_party_workers / t_passive_party_s: every passive party's, in party order
            (one entry with one passive party).
    """

    batch_size: int
    feasible: bool
    w_active: int
    w_passive: int
    t_active_s: float
    t_passive_s: float
    epoch_s: float
    passive_party_workers: tuple[int, ...] = ()
    t_passive_party_s: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PartyPlan:
    """One party's share of a :class:`Plan`.

    Attributes:
        party: its party id (``active``, ``passive``, ``passive2`` …).
        workers: its planned w.
        epoch_s: its ``T_p`` at that w, seconds.
        idle: ``1 − T_p / epoch``, the share of the epoch it waits for the others.
        util: ``n_b · W_p / (C_p · epoch)``, the share of its cores kept busy.
        cores: C_p.
    """

    party: str
    workers: int
    epoch_s: float
    idle: float
    util: float
    cores: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The planner's choice and its predicted timing.

    Attributes:
        w_active / w_passive / batch_size: the plan (``w_passive``: the first passive
            party's; every passive party's in ``passive_party_workers``).
        epoch_s: predicted epoch wall time, seconds: the max over the parties' ``T_p``.
        t_active_s / t_passive_s: each party's ``T_p`` at its chosen w, seconds (the
            first passive party's).
        idle_active / idle_passive: ``1 − T_p / epoch_s``, the share of the epoch the
            party waits for its partner.
        util_active / util_passive: ``n_b · W_p / (C_p · epoch_s)``, the share of the
            party's cores kept busy.
        bound_by: the slowest party: ``"active"``, ``"passive"`` or ``"both"`` with one
            passive party; with several, the slowest party's id (ids joined by ``+``
            when several tie).
        b_max: B_max = min over parties of ``b_max(M̄_p)`` with one worker (inf: no
            limits).
        w_max: W_max.
        active / passive: :class:`PartyTerms` at the plan (``passive``: the first
            passive party's).
        table: one :class:`PlanRow` per candidate B, in the given order.
        passive_party_workers: every passive party's w, in party order.
        parties: every party's :class:`PartyPlan`, active first.
        passive_terms: every passive party's :class:`PartyTerms`, in party order.
        samples_ratio: with a samples model (:func:`plan` ``samples``), its predicted
            samples to target at the plan over 1 + 1 workers at its reference B; the plan
            then minimises ``epoch_s · samples_ratio`` (time to target, up to the
            reference's epochs to target). 1.0 without one.
        samples_model: that model (:meth:`parties.algorithms.samples.SamplesModel.to_dict`), or None.
    """

    w_active: int
    w_passive: int
    batch_size: int
    epoch_s: float
    t_active_s: float
    t_passive_s: float
    idle_active: float
    idle_passive: float
    util_active: float
    util_passive: float
    bound_by: str
    b_max: float
    w_max: int
    active: PartyTerms
    passive: PartyTerms
    table: tuple[PlanRow, ...]
    passive_party_workers: tuple[int, ...] = ()
    parties: tuple[PartyPlan, ...] = ()
    passive_terms: tuple[PartyTerms, ...] = ()
    samples_ratio: float = 1.0
    samples_model: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (infinities as None)."""
        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list | tuple):
                return [clean(x) for x in v]
            return v

        return clean(asdict(self))


def _check_common(*, n_rows: int, embedding_dim: int, threads: int, delta_t: float,
                  memory_rule: str) -> None:
    if n_rows < 1:
        raise PlannerError(f"n_rows must be >= 1, got {n_rows!r}")
    if embedding_dim < 1:
        raise PlannerError(f"embedding_dim must be >= 1, got {embedding_dim!r}")
    if threads < 1:
        raise PlannerError(f"threads must be >= 1, got {threads!r}")
    if not (math.isfinite(delta_t) and delta_t >= 1):
        raise PlannerError(f"delta_t must be a finite number >= 1, got {delta_t!r}")
    if memory_rule not in MEMORY_RULES:
        raise PlannerError(f"memory_rule must be one of {MEMORY_RULES}, got {memory_rule!r}")


def _check(active: CostModel, passives: tuple[CostModel, ...], batch_sizes: Sequence[int],
           w_max: int, **common: Any) -> tuple[int, ...]:
    if not passives:
        raise PlannerError("give at least one passive party's cost model")
    if active.role != "active" or any(p.role != "passive" for p in passives):
        raise PlannerError(f"expected the active then the passive cost models, got roles "
                           f"{active.role!r}, {', '.join(repr(p.role) for p in passives)}")
    _check_common(**common)
    if w_max < 1:
        raise PlannerError(f"w_max must be >= 1, got {w_max!r}")
    bs = tuple(int(b) for b in batch_sizes)
    if not bs or any(b < 1 for b in bs) or len(set(bs)) != len(bs):
        raise PlannerError(f"batch_sizes must be distinct integers >= 1, got {batch_sizes!r}")
    return bs


def b_max_of(active: CostModel, *passives: CostModel, memory_rule: str = "shared") -> float:
    """B_max = min over parties of ``b_max(M̄_p)`` with one worker (inf without limits,
    0 when a budget is below its party's M_0)."""
    out = math.inf
    for cost in (active, *passives):
        if cost.mem_limit_bytes is None:
            continue
        try:
            out = min(out, cost.memory.b_max(cost.mem_limit_bytes, 1, memory_rule))
        except MemoryLimitTooSmall:
            return 0.0
    return out


def _stages(active: CostModel, passives: tuple[CostModel, ...]
            ) -> list[tuple[CostModel, Partners]]:
    """Each party with the partner(s) its round trip involves: active first."""
    return [(active, passives), *((p, active) for p in passives)]


def _bound_by(ids: Sequence[str], times: Sequence[float]) -> str:
    slowest = [i for i, t in zip(ids, times, strict=True) if t == max(times)]
    if len(ids) == 2:
        return "both" if len(slowest) == 2 else slowest[0]
    return "+".join(slowest)


def _finish(active: CostModel, passives: tuple[CostModel, ...], *, b: int,
            workers: Sequence[int], table: tuple[PlanRow, ...], w_max: int, n_rows: int,
            embedding_dim: int, threads: int, delta_t: float, memory_rule: str) -> Plan:
    kw = {"n_rows": n_rows, "embedding_dim": embedding_dim, "threads": threads,
          "delta_t": delta_t, "memory_rule": memory_rule}
    stages = _stages(active, passives)
    terms = [party_terms(cost, partner, b=b, w=w, **kw)
             for (cost, partner), w in zip(stages, workers, strict=True)]
    epoch = max(t.epoch_s for t in terms)
    ids = ("active", *passive_party_ids(len(passives)))
    shares = [PartyPlan(party=i, workers=t.workers, epoch_s=t.epoch_s,
                        idle=1.0 - t.epoch_s / epoch,
                        util=t.batches * t.work_core_s / (cost.cores * epoch), cores=cost.cores)
              for i, t, (cost, _) in zip(ids, terms, stages, strict=True)]
    a, p = shares[0], shares[1]
    return Plan(w_active=a.workers, w_passive=p.workers, batch_size=b, epoch_s=epoch,
                t_active_s=a.epoch_s, t_passive_s=p.epoch_s, idle_active=a.idle,
                idle_passive=p.idle, util_active=a.util, util_passive=p.util,
                bound_by=_bound_by(ids, [t.epoch_s for t in terms]),
                b_max=b_max_of(active, *passives, memory_rule=memory_rule), w_max=w_max,
                active=terms[0], passive=terms[1], table=table,
                passive_party_workers=tuple(workers[1:]), parties=tuple(shares),
                passive_terms=tuple(terms[1:]))


def plan(active: CostModel, *passives: CostModel, n_rows: int, embedding_dim: int,
         threads: int = 1, w_max: int = DEFAULT_W_MAX,
         batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, delta_t: float = 1.0,
         memory_rule: str = "shared", samples: SamplesModel | None = None) -> Plan:
    """The plan minimising ``(epoch, Σ w, B)`` by the exact two-stage DP (module
    docstring); with ``samples``, the plan minimising predicted time to target,
    ``(epoch · samples.ratio(w, B), Σ w, B)`` (:func:`_plan_to_target`).

    Args:
        active: the active party's cost model (role ``"active"``).
        passives: each passive party's (role ``"passive"``), in party order: one for a
            two-party run, several for several passive parties.
        n_rows: N, training rows per epoch (>= 1).
        embedding_dim: d, the cut-layer width (>= 1).
        threads: torch intra-op threads per worker (``vfl.workers.torch_threads``, >= 1).
        w_max: W_max, most workers per party (>= 1).
        batch_sizes: candidate B values (distinct, >= 1).
        delta_t: steps between a worker's PS syncs (>= 1; e.g. ``vfl.workers.delta_t0`` for the
            steady state, or :func:`mean_sync_interval`).
        memory_rule: ``"shared"`` or ``"per_worker"`` (module docstring).
        samples: a measured samples-to-target model (:class:`parties.algorithms.samples.SamplesModel`);
            None: plan for throughput (epoch time) alone.

    Returns:
        :class:`Plan`.

    Raises:
        NoFeasiblePlan: no B and w fit the memory budgets.
        PlannerError: bad arguments.
    """
    common = {"n_rows": n_rows, "embedding_dim": embedding_dim, "threads": threads,
              "delta_t": delta_t, "memory_rule": memory_rule}
    bs = _check(active, passives, batch_sizes, w_max, **common)
    if samples is not None:
        return _plan_to_target(active, passives, bs, w_max=w_max, samples=samples, **common)
    ekw = {"n_rows": n_rows, "embedding_dim": embedding_dim, "threads": threads,
           "delta_t": delta_t}
    stages = _stages(active, passives)
    rows: list[PlanRow] = []
    best: tuple[tuple[float, int, int], PlanRow] | None = None
    for b in bs:
        # Stage 1: each party's times over its feasible worker counts.
        times = [{w: party_epoch_time(cost, partner, b=b, w=w, **ekw)
                  for w in range(1, w_max + 1)
                  if cost.memory.fits(b, w, cost.mem_limit_bytes, memory_rule)}
                 for cost, partner in stages]
        bests = [min(t.values(), default=math.inf) for t in times]
        if not all(times):
            rows.append(PlanRow(batch_size=b, feasible=False, w_active=0, w_passive=0,
                                t_active_s=bests[0], t_passive_s=bests[1], epoch_s=math.inf,
                                passive_party_workers=(0,) * len(passives),
                                t_passive_party_s=tuple(bests[1:])))
            continue
        # Stage 2: the row's epoch and, per party, the fewest workers reaching it.
        epoch = max(bests)
        ws = [min(w for w, t in party.items() if t <= epoch) for party in times]
        row = PlanRow(batch_size=b, feasible=True, w_active=ws[0], w_passive=ws[1],
                      t_active_s=bests[0], t_passive_s=bests[1], epoch_s=epoch,
                      passive_party_workers=tuple(ws[1:]), t_passive_party_s=tuple(bests[1:]))
        rows.append(row)
        key = (epoch, sum(ws), b)
        if best is None or key < best[0]:
            best = (key, row)
    if best is None:
        raise NoFeasiblePlan(b_max_of(active, *passives, memory_rule=memory_rule), bs)
    row = best[1]
    return _finish(active, passives, b=row.batch_size,
                   workers=(row.w_active, *row.passive_party_workers), table=tuple(rows),
                   w_max=w_max, **common)


def _plan_to_target(active: CostModel, passives: tuple[CostModel, ...], bs: tuple[int, ...],
                    *, w_max: int, samples: SamplesModel, **common: Any) -> Plan:
    """The plan minimising predicted time to target ``epoch(w, B) · samples.ratio(w, B)``.

    The samples factor couples the parties' worker counts (κ_p sums over the passive
    parties), so the two-stage DP does not apply; but for a fixed B, w_a and epoch level
    E every passive party is best off with the fewest workers reaching E (fewer workers
    never raise the samples factor), so it suffices to try each w_a and each E among the
    passive parties' own times: ``O(|B|·W·(K·W)·K·W)``, exact.
    """
    ekw = {k: common[k] for k in ("n_rows", "embedding_dim", "threads", "delta_t")}
    rule = common["memory_rule"]
    stages = _stages(active, passives)
    rows: list[PlanRow] = []
    best: tuple[tuple[float, int, int], PlanRow, float] | None = None
    for b in bs:
        times = [{w: party_epoch_time(cost, partner, b=b, w=w, **ekw)
                  for w in range(1, w_max + 1)
                  if cost.memory.fits(b, w, cost.mem_limit_bytes, rule)}
                 for cost, partner in stages]
        if not all(times):
            bests = [min(t.values(), default=math.inf) for t in times]
            rows.append(PlanRow(batch_size=b, feasible=False, w_active=0, w_passive=0,
                                t_active_s=bests[0], t_passive_s=bests[1], epoch_s=math.inf,
                                passive_party_workers=(0,) * len(passives),
                                t_passive_party_s=tuple(bests[1:])))
            continue
        levels = sorted({t for party in times[1:] for t in party.values()})
        row_best: tuple[tuple[float, int, int], PlanRow, float] | None = None
        for wa, ta in times[0].items():
            for level in levels:
                ws = [min((w for w, t in party.items() if t <= level), default=None)
                      for party in times[1:]]
                if None in ws:
                    continue
                wps = tuple(int(w) for w in ws)  # type: ignore[arg-type]
                epoch = max(ta, *(party[w] for party, w in zip(times[1:], wps, strict=True)))
                ratio = samples.ratio(wa, wps, b)
                key = (epoch * ratio, wa + sum(wps), b)
                if row_best is None or key < row_best[0]:
                    row = PlanRow(batch_size=b, feasible=True, w_active=wa, w_passive=wps[0],
                                  t_active_s=ta, t_passive_s=times[1][wps[0]], epoch_s=epoch,
                                  passive_party_workers=wps,
                                  t_passive_party_s=tuple(p[w] for p, w in
                                                          zip(times[1:], wps, strict=True)))
                    row_best = (key, row, ratio)
        assert row_best is not None
        rows.append(row_best[1])
        if best is None or row_best[0] < best[0]:
            best = row_best
    if best is None:
        raise NoFeasiblePlan(b_max_of(active, *passives, memory_rule=rule), bs)
    _, row, ratio = best
    plan_ = _finish(active, passives, b=row.batch_size,
                    workers=(row.w_active, *row.passive_party_workers), table=tuple(rows),
                    w_max=w_max, **common)
    return dataclasses.replace(plan_, samples_ratio=ratio, samples_model=samples.to_dict())


def brute_force(active: CostModel, *passives: CostModel, n_rows: int, embedding_dim: int,
                threads: int = 1, w_max: int = DEFAULT_W_MAX,
                batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, delta_t: float = 1.0,
                memory_rule: str = "shared") -> Plan:
    """Reference for tests: enumerate every ``(w_a, w_1, …, w_K, B)``, take the max of
    the parties' times (each ``T_p(w, B)`` computed once per B) and keep the
    lexicographic minimum of ``(epoch, Σ w, B)``. Same arguments, result and errors as
    :func:`plan`; its ``table`` is empty. Exponential in the number of parties
    (``W_max^(K+1)`` combinations per B): small grids only."""
    common = {"n_rows": n_rows, "embedding_dim": embedding_dim, "threads": threads,
              "delta_t": delta_t, "memory_rule": memory_rule}
    bs = _check(active, passives, batch_sizes, w_max, **common)
    ekw = {"n_rows": n_rows, "embedding_dim": embedding_dim, "threads": threads,
           "delta_t": delta_t}
    stages = _stages(active, passives)
    best: tuple[float, int, int, tuple[int, ...]] | None = None
    for b in bs:
        times = [{w: party_epoch_time(cost, partner, b=b, w=w, **ekw)
                  for w in range(1, w_max + 1)
                  if cost.memory.fits(b, w, cost.mem_limit_bytes, memory_rule)}
                 for cost, partner in stages]
        for ws in itertools.product(*times):
            epoch = max(t[w] for t, w in zip(times, ws, strict=True))
            key = (epoch, sum(ws), b, ws)
            if best is None or key < best:
                best = key
    if best is None:
        raise NoFeasiblePlan(b_max_of(active, *passives, memory_rule=memory_rule), bs)
    _, _, b, ws = best
    return _finish(active, passives, b=b, workers=ws, table=(), w_max=w_max, **common)


def plan_for_config(active: CostModel, passive: Partners, cfg: Any, n_rows: int, *,
                    w_max: int = DEFAULT_W_MAX,
                    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                    memory_rule: str = "shared", samples: SamplesModel | None = None) -> Plan:
    """:func:`plan` with d, threads and ΔT from a :class:`parties.config.VflConfig`
    (``embedding_dim``, ``torch_threads``, and the harmonic mean of ΔT_t over
    ``epochs`` with ``delta_t0``). ``passive``: the passive party's model, or every
    passive party's in party order. ``samples``: as :func:`plan`.

    Raises:
        NoFeasiblePlan / PlannerError: as :func:`plan`.
    """
    return plan(active, *_partners(passive), n_rows=n_rows, embedding_dim=cfg.model.embedding_dim,
                threads=cfg.workers.torch_threads, w_max=w_max, batch_sizes=batch_sizes,
                delta_t=mean_sync_interval(cfg.epochs, cfg.workers.delta_t0), memory_rule=memory_rule,
                samples=samples)


#: µ per epoch of the DP epoch rule (:func:`dp_epochs`).
DP_MU_PER_EPOCH = 4.0


def dp_epochs(target_mu: float, *, max_epochs: int) -> int:
    """Epochs for a DP run at ``target_mu``: ``clamp(round(µ / 4), 1, max_epochs)``, and
    ``max_epochs`` without DP (µ = ∞).

    Every epoch publishes every training record again, so at a fixed µ more epochs mean
    more noise per publication. The rule is measured on bank with the DP settings of
    ``bench/vfl_dp.py`` (in-process sync VFL, µ = 8: 2 epochs 0.864, 3 epochs lower; µ = 4
    and below: 1 epoch best); it is a starting point, not an optimum for other data.

    Raises:
        ValueError: µ not positive, or ``max_epochs`` < 1.
    """
    if not target_mu > 0:
        raise ValueError(f"target mu must be > 0, got {target_mu!r}")
    if max_epochs < 1:
        raise ValueError(f"max_epochs must be >= 1, got {max_epochs!r}")
    if math.isinf(target_mu):
        return max_epochs
    return max(1, min(max_epochs, round(target_mu / DP_MU_PER_EPOCH)))
