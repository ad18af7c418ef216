"""Batch-size sweep of one worker's compute and memory, and the fitted cost models
(PubSub-VFL, arXiv 2510.12494, Sec. 4: system profiling).

Pure measurement: no bus, no broker, no sockets (the communication probe is I/O and
lives in :mod:`parties.planning.commprobe`). For each party and each batch size B of a sweep
this module times one worker's **forward** and **backward** separately and records
the party's **memory**, then fits the paper's cost model with
:mod:`parties.planning.costmodel`:

    T_f(B) = λ_f · B^γ_f · w / C      T_b(B) = λ_b · B^γ_b · w / C      M(B) = M_0 + ρ · B^χ

What "forward" and "backward" are (the compute of :func:`parties.models.compute.make_compute`,
exactly what a worker runs, on the run's real training batches of the run's seed;
the partner's ``(B, d)`` float32 embedding (one per passive party for the active
party) or gradient is random):

* passive: T_f = ``compute.forward(rows)`` (bottom forward; DP clip + noise when on),
  T_b = ``compute.backward(graph, grad, 0)`` (bottom backward from the cut-layer
  gradient, Adam step).
* active: the cut-layer gradient only exists after the top model's forward *and*
  backward, so the active step does not split into the paper's two halves at the cut.
  Here T_f = ``compute.forward_own(rows)`` (own bottom forward) and T_b =
  ``compute.top_step(...)`` (top forward, loss, top backward, own bottom backward, Adam
  step). ``T_f + T_b`` is the whole step either way, which is all the planner uses.

Timing: per B, after untimed warm-up steps, each step's forward and backward are timed
with ``time.process_time`` (CPU seconds of the whole process, so intra-op threads
count: core-seconds) and ``time.perf_counter`` (wall); a point is the **median** over
the timed steps (at least ``min_steps`` steps and ``min_time_s`` CPU seconds per B).
The fits use the CPU medians with ``workers=1, cores=1``: λ·B^γ is core-seconds of
work, which :class:`parties.planning.costmodel.CostModel` divides by the cores a worker has.

Memory: the party's **resident set size** (``/proc/self/statm``, bytes), sampled right
after every timed forward (the activations saved for the backward are alive then) and
after every timed backward (the gradients and Adam moments exist), outside the timed
intervals; a point is the maximum of those samples. Why not ``ru_maxrss``: it is the
process's lifetime peak, and loading the table (pandas parsing the CSV) peaks far
above the steady state, which would hide every batch's memory behind it. Why not a fresh
process per (party, B): 2 × 7 interpreter and torch start-ups (seconds each) for no
gain once freed memory is handed back: before each B, ``malloc_trim(0)`` (glibc)
returns the freed heap to the OS, so the RSS reflects what the step keeps alive (torch's
CPU allocator does not cache). :func:`sweep_config` runs each party in a fresh child
process, so M(B) is the memory of a party process with one worker: interpreter, torch,
the party's table and model (M_0) plus the batch-dependent part (ρ·B^χ). The B values
run in ascending order; memory that a smaller B left resident (heap fragmentation) can
only inflate later points, never hide them. ``rss_baseline_bytes`` is the RSS after
the model is built, before the first step.

PS sync: with one worker nothing syncs; :attr:`PartySweep.sync_s` is the median wall
time of one in-process push + pull (:meth:`parties.models.model.Replica.sync`) of the party's
parameters, the cost a thread or inline worker pays per sync (process workers pay an
IPC hop more, not measured here).

Cores, "the party's actual CPU share" (:func:`party_cores`): a pinned party has
``len(vfl.<role>_cpus)`` cores (several passive parties are all pinned to
``passive_cpus``, so each has its share of them); an unpinned party has the process's
:func:`parties.core.sysinfo.cores_allotted`, shared by every unpinned party (halved when both
parties of a two-party run are unpinned: they then share those cores in a run).

Several passive parties (``vfl.passive_parties`` > 1): every passive party is swept
with its own data (its own columns, so its own input width) and its own model
(:func:`sweep_config` keys the sweeps by party id); its cost model is
``cost_model.<party id>`` of ``profile.json`` (``passive``, ``passive2``, …), beside the
two-party keys ``active`` and ``passive``.

Errors: :class:`BadBatchSizes` (a :class:`SweepError`, itself a
:class:`parties.planning.profile.ProfileError`): batch sizes not distinct positive integers, or
fewer than :data:`MIN_SWEEP_POINTS` of them at most the training rows.
"""

from __future__ import annotations

import ctypes
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import structlog

from parties.config import MAX_PASSIVE_PARTIES, VflConfig, passive_party_ids, role_of
from parties.planning.costmodel import CommFit, CostModel, MemoryFit, PowerFit, fit_memory, fit_power
from parties.planning.profile import ProfileError

log = structlog.get_logger(__name__)

#: Default sweep: powers of two from 16 to 1024 (capped by the training rows).
DEFAULT_SWEEP_BATCH_SIZES: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
#: ``--quick`` sweep: four B values spanning the same range.
QUICK_SWEEP_BATCH_SIZES: tuple[int, ...] = (16, 64, 256, 1024)
#: Fewest distinct B a sweep needs (the memory fit has three parameters).
MIN_SWEEP_POINTS = 3
#: How long one party's sweep child process may take in all, seconds.
SWEEP_TIMEOUT_S = 900.0


class SweepError(ProfileError):
    """The sweep cannot be taken."""


class BadBatchSizes(SweepError):
    """Batch sizes that are not distinct integers >= 1, or too few of them fit the data.

    Attributes:
        batch_sizes: what was given.
    """

    def __init__(self, batch_sizes: Any, why: str) -> None:
        self.batch_sizes = batch_sizes
        super().__init__(f"bad sweep batch sizes {batch_sizes!r}: {why}")


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``"16,32,64"`` -> ``(16, 32, 64)`` (validated by :func:`check_batch_sizes`).

    Raises:
        BadBatchSizes: an item is not an integer, or the list is invalid.
    """
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise BadBatchSizes(text, "expected comma-separated integers") from None
    return check_batch_sizes(values)


def check_batch_sizes(batch_sizes: Sequence[int], n_train: int | None = None) -> tuple[int, ...]:
    """Sorted, validated batch sizes; with ``n_train``, those ``<= n_train`` only.

    Raises:
        BadBatchSizes: a value is not an integer >= 1, values repeat, or fewer than
            :data:`MIN_SWEEP_POINTS` remain.
    """
    bs = tuple(batch_sizes)
    if any(isinstance(b, bool) or not isinstance(b, int | np.integer) or b < 1 for b in bs):
        raise BadBatchSizes(batch_sizes, "each must be an integer >= 1")
    if len(set(bs)) != len(bs):
        raise BadBatchSizes(batch_sizes, "values repeat")
    out = tuple(sorted(int(b) for b in bs))
    if n_train is not None:
        out = tuple(b for b in out if b <= n_train)
    if len(out) < MIN_SWEEP_POINTS:
        rows = "" if n_train is None else f" at most the {n_train} training rows"
        raise BadBatchSizes(batch_sizes, f"need at least {MIN_SWEEP_POINTS} distinct "
                            f"values{rows}, got {len(out)}")
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepPoint:
    """One batch size of a party's sweep.

    Attributes:
        batch_size: B, rows per step.
        steps: timed steps (after ``warmup_steps`` untimed ones).
        warmup_steps: untimed steps first.
        fwd_cpu_s / bwd_cpu_s: median CPU seconds of the forward / backward
            (``time.process_time``; core-seconds).
        fwd_wall_s / bwd_wall_s: median wall seconds of each.
        rss_bytes: the largest RSS sampled after a timed forward or backward, bytes
            (None: not measured).
    """

    batch_size: int
    steps: int
    warmup_steps: int
    fwd_cpu_s: float
    bwd_cpu_s: float
    fwd_wall_s: float
    bwd_wall_s: float
    rss_bytes: int | None = None

    @property
    def step_cpu_s(self) -> float:
        """``fwd_cpu_s + bwd_cpu_s``: CPU seconds of a whole step."""
        return self.fwd_cpu_s + self.bwd_cpu_s


@dataclass(frozen=True, slots=True, kw_only=True)
class PartySweep:
    """A party's sweep over batch sizes (``profile.json``'s ``sweep.<party id>``).

    Attributes:
        role: ``"active"`` or ``"passive"`` (the party's role; several passive parties'
            sweeps are told apart by the key they are stored under).
        cpus: CPU ids the sweep ran on.
        cores: C, the party's cores in a run (:func:`party_cores`; may be fractional).
        n_features: the party's encoded feature width ``d_in``.
        n_train: training rows (N, rows per epoch).
        torch_threads: intra-op threads during the sweep.
        param_bytes: bytes of the party's parameters (float32; bottom, plus top for the
            active party).
        sync_s: median wall seconds of one in-process PS push + pull.
        rss_baseline_bytes: RSS after the model was built, before any step (None: not
            measured).
        points: one :class:`SweepPoint` per B, ascending.
    """

    role: str
    cpus: tuple[int, ...]
    cores: float
    n_features: int
    n_train: int
    torch_threads: int
    param_bytes: int
    sync_s: float
    rss_baseline_bytes: int | None
    points: tuple[SweepPoint, ...]

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The B values, ascending."""
        return tuple(p.batch_size for p in self.points)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d = asdict(self)
        d["cpus"] = list(self.cpus)
        d["points"] = [asdict(p) for p in self.points]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PartySweep:
        """Inverse of :meth:`to_dict`. Raises ``KeyError``/``TypeError`` on a bad dict."""
        kw = dict(d)
        kw["cpus"] = tuple(kw["cpus"])
        kw["points"] = tuple(SweepPoint(**p) for p in kw["points"])
        return cls(**kw)


def party_cores(cfg: VflConfig, party: str) -> float:
    """The party's actual CPU share in a run, cores (module docstring).

    ``party``: a party id (``active``, ``passive``, ``passive2`` …) or role.

    Raises:
        ValueError: not a party id.
    """
    from parties.core.sysinfo import cores_allotted

    role = role_of(party)
    mine = cfg.workers.cpus(role)
    if mine:  # every passive party is pinned to passive_cpus: they share them
        return len(mine) / (cfg.passive_parties if role == "passive" else 1)
    unpinned = (0 if cfg.workers.active_cpus else 1) + (0 if cfg.workers.passive_cpus else cfg.passive_parties)
    total = cores_allotted()
    return total if unpinned <= 1 else max(total / unpinned, 1e-3)


def _rss_bytes() -> int | None:
    """Current resident set size of this process, bytes (None where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


_LIBC: Any = None


def _malloc_trim() -> None:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim(0)``; no-op elsewhere)."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL("libc.so.6")
        _LIBC.malloc_trim(0)
    except (OSError, AttributeError):
        _LIBC = False if _LIBC is None else _LIBC


def sweep_party(role: str, cfg: VflConfig, x_train: np.ndarray, y_train: np.ndarray | None,
                batch_sizes: Sequence[int], *, cores: float | None = None,
                warmup_steps: int = 3, warmup_time_s: float = 0.05, min_steps: int = 5,
                min_time_s: float = 0.25, max_steps: int = 500, memory: bool = True,
                sync_reps: int = 20) -> PartySweep:
    """Sweep one worker's compute of ``role`` over ``batch_sizes`` in this process (no
    pinning done here; see the module docstring for what is timed and how).

    Args:
        role: the party: ``"active"``, ``"passive"`` or another passive party's id
            (``"passive2"`` …: its own worker learning rate; its shape is ``x_train``'s).
        cfg: the run's config (model, DP, seed, threads); ``cfg.batch_size`` is ignored.
        x_train: ``(n_train, d_in)`` float32 features of the party.
        y_train: ``(n_train,)`` float32 labels (active party only).
        batch_sizes: B values; those above ``n_train`` are dropped.
        cores: C recorded in the result (None: :func:`party_cores`).
        warmup_steps / warmup_time_s: untimed steps per B: at least this many and for
            at least this many CPU seconds.
        min_steps / min_time_s / max_steps: timed steps per B: at least ``min_steps``
            and ``min_time_s`` CPU seconds (forward + backward), at most ``max_steps``.
        memory: sample the RSS (see the module docstring).
        sync_reps: timed PS push + pull repetitions.

    Returns:
        :class:`PartySweep`.

    Raises:
        BadBatchSizes: invalid B values, or fewer than :data:`MIN_SWEEP_POINTS` fit.
        ValueError: unknown role, or ``y_train`` missing for the active party.
    """
    import torch

    from parties.models.model import ParameterServer, PassiveCompute, flat_params, party_modules
    from parties.algorithms.schedule import epoch_batches
    from parties.models.compute import make_compute

    party = role
    role = role_of(party)  # ValueError: not a party id
    if role == "active" and y_train is None:
        raise ValueError("the active party's sweep needs y_train")
    n_train, d_in = x_train.shape
    bs = check_batch_sizes(batch_sizes, n_train)
    torch.manual_seed(cfg.seed + (0 if role == "active" else 1))
    mods = party_modules(cfg, role, d_in)
    flat = flat_params(mods)
    ps = ParameterServer(flat)
    compute = make_compute(role, cfg, x_train, y_train, ps, sync_mode="manual",
                           noise_seed=12345 if cfg.dp.enabled or cfg.labels.protected else None,
                           party=party)
    passive = isinstance(compute, PassiveCompute)
    gen = np.random.default_rng(cfg.seed)
    _malloc_trim()
    baseline = _rss_bytes() if memory else None
    points: list[SweepPoint] = []

    def fwd(rows: np.ndarray) -> Any:
        return compute.forward(rows)[0] if passive else compute.forward_own(rows)

    def bwd(h: Any, rows: np.ndarray, partner: np.ndarray) -> None:
        if passive:
            compute.backward(h, partner, 0)
        else:
            # one embedding per passive party (the active party fuses them all)
            compute.top_step(h, partner if cfg.passive_parties == 1
                             else [partner] * cfg.passive_parties, rows, 0)

    for b in bs:
        partner = gen.standard_normal((b, cfg.model.embedding_dim)).astype(np.float32) * 0.01
        batches = [r for r in epoch_batches(n_train, b, seed=cfg.seed, epoch=0) if len(r) == b]
        k = 0
        _malloc_trim()
        c0 = time.process_time()
        while k < warmup_steps or (time.process_time() - c0 < warmup_time_s
                                   and k < max_steps):
            rows = batches[k % len(batches)]
            bwd(fwd(rows), rows, partner)
            k += 1
        warm = k
        fc: list[float] = []
        fw: list[float] = []
        bc: list[float] = []
        bw: list[float] = []
        rss = 0
        spent = 0.0
        while len(fc) < max_steps and (len(fc) < min_steps or spent < min_time_s):
            rows = batches[k % len(batches)]
            k += 1
            c0, w0 = time.process_time(), time.perf_counter()
            h = fwd(rows)
            c1, w1 = time.process_time(), time.perf_counter()
            if memory:
                rss = max(rss, _rss_bytes() or 0)
            c2, w2 = time.process_time(), time.perf_counter()
            bwd(h, rows, partner)
            c3, w3 = time.process_time(), time.perf_counter()
            del h
            if memory:
                rss = max(rss, _rss_bytes() or 0)
            fc.append(c1 - c0)
            fw.append(w1 - w0)
            bc.append(c3 - c2)
            bw.append(w3 - w2)
            spent += (c1 - c0) + (c3 - c2)
        # process_time ticks in coarse steps on some kernels: a 0 median would break the
        # log-log fit; floor it at 1 ns (reported as measured otherwise).
        pt = SweepPoint(batch_size=b, steps=len(fc), warmup_steps=warm,
                        fwd_cpu_s=max(statistics.median(fc), 1e-9),
                        bwd_cpu_s=max(statistics.median(bc), 1e-9),
                        fwd_wall_s=statistics.median(fw), bwd_wall_s=statistics.median(bw),
                        rss_bytes=(rss or None) if memory else None)
        log.info("vfl.sweep.point", role=role, batch_size=b, steps=pt.steps,
                 fwd_cpu_s=pt.fwd_cpu_s, bwd_cpu_s=pt.bwd_cpu_s, rss_bytes=pt.rss_bytes)
        points.append(pt)
    sync: list[float] = []
    for _ in range(max(1, sync_reps)):
        w0 = time.perf_counter()
        compute.replica.sync()
        sync.append(time.perf_counter() - w0)
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else tuple(
        range(os.cpu_count() or 1))
    return PartySweep(role=role, cpus=cpus,
                      cores=party_cores(cfg, party) if cores is None else float(cores),
                      n_features=int(d_in), n_train=int(n_train),
                      torch_threads=int(torch.get_num_threads()),
                      param_bytes=int(flat.numel()) * 4, sync_s=statistics.median(sync),
                      rss_baseline_bytes=baseline, points=tuple(points))


# ----------------------------------------------------------------------- child processes
def _sweep_child(role: str, cfg: VflConfig, batch_sizes: tuple[int, ...],
                 timing: dict[str, Any], results: Any) -> None:
    """One party's sweep in a fresh process (forked from the party fork server,
    :mod:`parties.core.zygote`): pinned, ``torch_threads`` set, the party's data loaded as the
    party loads it."""
    try:
        from parties.planning.profile import prepare_child
        from pubsub.logs import configure_logging

        configure_logging(stderr_level="warning")  # the parent reports; children stay quiet
        data = prepare_child(role, cfg)
        out = sweep_party(role, cfg, data.x_train, data.y_train, batch_sizes, **timing)
        results.put((role, out, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        try:
            import pickle

            pickle.dumps(exc)
            results.put((role, None, exc))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            results.put((role, None, SweepError(f"{role}: {type(exc).__name__}: {exc}")))


def sweep_config(cfg: VflConfig, batch_sizes: Sequence[int] = DEFAULT_SWEEP_BATCH_SIZES,
                 **timing: Any) -> dict[str, PartySweep]:
    """Sweep every party of ``cfg`` (the passive parties, then the active party), one
    after the other, each in a fresh child forked from the party fork server, pinned to
    the party's CPUs (so its memory is a party process's own) and loading the party's
    own data (with several passive parties, each its own columns).

    Args:
        cfg: the run's config.
        batch_sizes: B values (capped by each party's training rows).
        timing: keyword arguments of :func:`sweep_party`.

    Returns:
        ``{party id: PartySweep}``: ``passive`` (``passive2`` …) and ``active``.

    Raises:
        BadBatchSizes: invalid B values.
        parties.data.DataError: the data cannot be loaded.
        pubsub.config.ConfigError: a configured CPU is not available.
        SweepError: a child died or took longer than :data:`SWEEP_TIMEOUT_S`.
    """
    import queue

    from parties.core import zygote

    bs = check_batch_sizes(batch_sizes)
    ctx = zygote.context()  # forked from a server that has imported torch once
    out: dict[str, PartySweep] = {}
    for role in (*cfg.party_ids[1:], "active"):  # party ids
        results = ctx.Queue()
        proc = ctx.Process(target=_sweep_child, name=f"sweep-{role}", daemon=True,
                           args=(role, cfg, bs, timing, results))
        deadline = time.monotonic() + SWEEP_TIMEOUT_S
        proc.start()
        try:
            while True:
                try:
                    _, res, exc = results.get(timeout=0.5)
                    break
                except queue.Empty:
                    if not proc.is_alive():
                        raise SweepError(f"the {role} sweep process died (exit code "
                                         f"{proc.exitcode})") from None
                    if time.monotonic() > deadline:
                        raise SweepError(f"the {role} sweep took more than "
                                         f"{SWEEP_TIMEOUT_S:.0f} s") from None
            if exc is not None:
                raise exc
            out[role] = res
            proc.join(10)
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    return out


# ---------------------------------------------------------------------------- the fits
@dataclass(frozen=True, slots=True, kw_only=True)
class CostModels:
    """The parties' fitted cost models (``profile.json``'s ``cost_model``).

    Attributes:
        active / passive: each party's :class:`parties.planning.costmodel.CostModel` (``passive``:
            the first passive party's).
        comm: the one-way message-time fit all use (the same bus).
        n_train: N, training rows per epoch (the active party's).
        embedding_dim: d of the profiled model.
        batch_sizes: the swept B values.
        more_passive: with several passive parties, the others' models (``passive2``,
            …, in party order); () for a two-party run.
    """

    active: CostModel
    passive: CostModel
    comm: CommFit
    n_train: int
    embedding_dim: int
    batch_sizes: tuple[int, ...]
    more_passive: tuple[CostModel, ...] = ()

    @property
    def passives(self) -> tuple[CostModel, ...]:
        """Every passive party's model, in party order."""
        return (self.passive, *self.more_passive)

    @property
    def by_party(self) -> dict[str, CostModel]:
        """Every party's model by party id: ``active``, ``passive``, ``passive2`` …"""
        ids = ("active", *passive_party_ids(len(self.passives)))
        return dict(zip(ids, (self.active, *self.passives), strict=True))

    def fit_error(self) -> dict[str, dict[str, float | None]]:
        """``{"active.forward": {"r2": .., "rel_err_holdout": ..}, ...}`` (None: none held
        out; keys by party id). R² of the power fits is on log data, of memory and comm on
        the values."""
        out: dict[str, dict[str, float | None]] = {}
        for party, cm in self.by_party.items():
            for name in ("forward", "backward", "memory"):
                f = getattr(cm, name)
                out[f"{party}.{name}"] = _err(f.r2, f.rel_err_holdout)
        out["comm"] = _err(self.comm.r2, self.comm.rel_err_holdout)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``active``, ``passive`` (and ``passive2`` … with several
        passive parties), ``comm``, ``fit_error``, ..."""
        out: dict[str, Any] = {party: cm.to_dict() for party, cm in self.by_party.items()}
        out.update({"comm": self.comm.to_dict(), "fit_error": self.fit_error(),
                    "n_train": self.n_train, "embedding_dim": self.embedding_dim,
                    "batch_sizes": list(self.batch_sizes),
                    "source": "PubSub-VFL (arXiv 2510.12494) Sec. 4 cost model; "
                              "parties/planning/sweep.py"})
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CostModels:
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError: a field is missing.
            parties.planning.costmodel.CostModelError: invalid values.
        """
        more = []
        for party in passive_party_ids(MAX_PASSIVE_PARTIES)[1:]:
            if party not in d:
                break
            more.append(CostModel.from_dict(d[party]))
        return cls(active=CostModel.from_dict(d["active"]),
                   passive=CostModel.from_dict(d["passive"]),
                   comm=CommFit.from_dict(d["comm"]), n_train=int(d["n_train"]),
                   embedding_dim=int(d["embedding_dim"]),
                   batch_sizes=tuple(int(b) for b in d["batch_sizes"]),
                   more_passive=tuple(more))


def _err(r2: float, rel: float) -> dict[str, float | None]:
    return {"r2": r2, "rel_err_holdout": None if math.isnan(rel) else rel}


def fit_party(sweep: PartySweep, comm: CommFit, *, holdout: str | Sequence[float] = "alternate",
              mem_limit_bytes: float | None = None) -> CostModel:
    """The :class:`CostModel` of one party's sweep: forward and backward power laws on
    the CPU medians (core-seconds: ``workers=1, cores=1``), memory ``M_0 + ρ·B^χ`` on the
    sampled RSS, ``comm`` as the party's one-way message fit, ``sync_s`` as the per-sync
    overhead (an in-process PS: ``sync_comm`` is free).

    Raises:
        parties.planning.costmodel.CostModelError: a fit is impossible (too few points, a
            non-positive value); the memory fit also when RSS was not measured.
    """
    from parties.planning.costmodel import CostModelError

    b = [p.batch_size for p in sweep.points]
    fwd = fit_power(b, [p.fwd_cpu_s for p in sweep.points], holdout=holdout)
    bwd = fit_power(b, [p.bwd_cpu_s for p in sweep.points], holdout=holdout)
    rss = [p.rss_bytes for p in sweep.points]
    if any(r is None for r in rss):
        raise CostModelError(f"{sweep.role}: the sweep has no memory measurements")
    mem: MemoryFit = fit_memory(b, [float(r) for r in rss if r is not None], holdout=holdout)
    return CostModel(role=sweep.role, forward=fwd, backward=bwd, memory=mem, comm=comm,
                     cores=sweep.cores, param_bytes=sweep.param_bytes,
                     sync_overhead_s=sweep.sync_s,
                     sync_comm=CommFit(latency_s=0.0, s_per_byte=0.0),
                     mem_limit_bytes=mem_limit_bytes)


def fit_cost_models(active: PartySweep, passive: PartySweep, comm: CommFit, *,
                    embedding_dim: int, holdout: str | Sequence[float] = "alternate",
                    more_passive: Sequence[PartySweep] = ()) -> CostModels:
    """Every party's cost model (:func:`fit_party`): the active party, the (first)
    passive party and, with several passive parties, the others' sweeps in party order
    (``more_passive``), each with the bus's ``comm`` fit.

    Raises:
        parties.planning.costmodel.CostModelError: as :func:`fit_party`.
    """
    models = CostModels(active=fit_party(active, comm, holdout=holdout),
                        passive=fit_party(passive, comm, holdout=holdout), comm=comm,
                        n_train=active.n_train, embedding_dim=embedding_dim,
                        batch_sizes=active.batch_sizes,
                        more_passive=tuple(fit_party(s, comm, holdout=holdout)
                                           for s in more_passive))
    for role, err in models.fit_error().items():
        log.info("vfl.sweep.fit", fit=role, **err)
    return models


def format_fits(models: CostModels) -> list[str]:
    """Readable summary lines: λ, γ, R², held-out relative error per fit."""
    def pct(v: float) -> str:
        return "  n/a" if math.isnan(v) else f"{100 * v:4.1f}%"

    lines = []
    parties = models.by_party
    for party in (*list(parties)[1:], "active"):
        cm = parties[party]
        for name in ("forward", "backward"):
            f: PowerFit = getattr(cm, name)
            lines.append(f"{party:<8} {name:<8} λ {f.lam:10.4g} core-s  γ {f.gamma:+7.4f}  "
                         f"R² {f.r2:6.4f}  held-out err {pct(f.rel_err_holdout)}")
        m = cm.memory
        lines.append(f"{party:<8} memory   M0 {m.m0 / 2**20:8.1f} MiB  ρ {m.rho:10.4g} B  "
                     f"χ {m.chi:+7.4f}  R² {m.r2:6.4f}  held-out err {pct(m.rel_err_holdout)}"
                     f"  (C = {cm.cores:g} cores, sync {cm.sync_overhead_s * 1e6:.0f} µs)")
    c = models.comm
    lines.append(f"comm     one-way  latency {c.latency_s * 1e6:8.1f} µs  bandwidth "
                 f"{c.bandwidth / 1e6:10.1f} MB/s  R² {c.r2:6.4f}  held-out err "
                 f"{pct(c.rel_err_holdout)}")
    return lines


__all__ = ["DEFAULT_SWEEP_BATCH_SIZES", "MIN_SWEEP_POINTS", "QUICK_SWEEP_BATCH_SIZES",
           "SWEEP_TIMEOUT_S", "BadBatchSizes", "CostModels", "PartySweep", "SweepError",
           "SweepPoint", "check_batch_sizes", "fit_cost_models", "fit_party", "format_fits",
           "parse_batch_sizes", "party_cores", "sweep_config", "sweep_party"]
