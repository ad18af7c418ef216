"""A discrete-event simulation of the five coordination algorithms' schedules.

Pure and deterministic: no sockets, no threads, no clock; an event heap that runs the
algorithms' own sans-IO strategies (:mod:`parties.algorithms.strategy`). Given each party's per-batch step costs (CPU seconds of
one worker at batch size B, e.g. from :mod:`parties.planning.profile` or a fitted cost model), its
cores, the workers per party and the link, :func:`simulate` predicts the epoch wall time,
each party's busy CPU seconds, core utilisation and waiting time, the way
:mod:`parties.runtime.party` schedules the work (it runs the same strategies).

Model
-----
* **CPU**: each party is a processor-sharing server of ``cores`` cores (fractional
  allowed). With k compute tasks running, each progresses at ``min(threads, cores/k)``
  cores (a task is one worker's compute call: it can use at most ``threads`` intra-op
  threads), so its CPU work W (seconds) takes ``W / rate`` of wall time; rates are
  recomputed whenever k changes. w > cores therefore gains nothing and loses nothing,
  w < cores leaves cores idle. Identical workers that start together would stay in phase
  forever; ``jitter`` (seeded, deterministic) perturbs each call's cost to break that, as
  the OS scheduler and the machine's noise do in the runs. Under ``worker_mode = "inline"`` (what ``"auto"`` picks
  for a party with fewer than 2 cores, :meth:`parties.config.WorkersSection.resolved_mode`)
  the party's compute calls run one at a time in arrival order (FIFO, non-preemptive) at
  ``min(threads, cores)``: the event loop itself computes.
* **Link**: a message of n bytes is serialised on its direction's link (FIFO, at
  ``bandwidth_bps`` bytes/s) and arrives ``latency_s`` after it leaves. Embeddings and
  gradients are ``rows · embedding_dim · 4`` bytes; the ``vfl-ps`` ID message is
  ``rows · 8 + (P + 1) · 8`` bytes. Publishing never blocks (``publish_nowait``).
  ``msg_cpu_s`` (default 0) charges each send and receive as background CPU work.
* **Steps** (per worker, one batch of ``rows`` rows; :class:`StepCosts` hold the costs at
  B, other sizes scale as ``(rows / B) ** cost_exponent``): passive forward, then
  backward + Adam step from the cut-layer gradient; active own-bottom forward (run while
  it waits for the passive embedding: ``prefetch``), top forward + loss + top backward
  (the cut-layer gradient is published at its end), then own-bottom backward + Adam step
  (:meth:`parties.models.model.ActiveCompute.top_step`).
* **Parameter-server sync** (:func:`parties.models.compute.sync_mode_for`): a party with one
  worker never syncs per step; otherwise ``pubsub`` replicas sync every ΔT_t local steps
  (:func:`parties.algorithms.schedule.sync_interval` of the epoch index), ``avfl-ps`` after every
  step, ``vfl-ps`` in a barrier after every batch (all push, then all pull: half the
  sync cost each). A sync costs ``sync_s_<party>`` CPU seconds on the worker, added to
  the compute call that triggers it. After every segment of an epoch (``segments``:
  1, or 4 quarters on ``synthetic``) every worker of both parties syncs (``_flush``).

Algorithms
----------
The schedules are not written here: both parties run the strategies of
:mod:`parties.algorithms.strategy` (:func:`parties.algorithms.strategy.make_strategy`, the same objects
:class:`parties.runtime.party.Party` runs over the bus; semantics in :mod:`parties.runtime.party`),
and this module only interprets their actions: a compute action (``Forward``,
``Prefetch``, ``TopStep``, ``Backward``, ``Push`` / ``Pull`` / ``Flush``) becomes a CPU task
of the model above, a ``Publish`` travels the link into the partner's buffer of that
(kind, channel), an ``Await`` blocks until its buffer holds a message the strategy's
acceptor takes, ``Poll`` / ``Pending`` look at the buffers, ``WaitSchedule`` blocks until
the party's next ``NotifySchedule``, ``Gather`` runs generators as concurrent processes.
Each epoch's segments run both parties' ``segment`` then both parties' ``end_segment``.
An active worker's ``Await`` counts as waiting only past its own running prefetch.

Simplifications (what the real runs have and this does not): no shared-top lock (under
``vfl.workers.top_update = "shared"`` the active workers' top steps take turns at the PS, a small
part of the active step here, which the model runs in parallel); no deadline misses
(the strategies run with dropping off and an unbounded data wait: T_ddl is far above a
step, so nothing is dropped or reassigned; for the same reason the
per-batch buffers p and q never fill: each per-batch channel carries one message per
epoch, and they are accepted but unused); no GIL (thread workers of a tiny model
serialise on it in the runs); no broker CPU, event-loop, IPC or serialisation costs
except ``msg_cpu_s``; no parameter-server lock contention; the AVFL parameter snapshot
is part of the passive forward cost; segment ends are a barrier of both parties (in the
runs each party ends its own segment and evaluates; evaluation is not training time
there either); the machine's speed is constant.

CLI: ``python -m sim.cluster.des --json spec.json`` prints one JSON line per (algo, w, B) of the
spec's grid (see :func:`main`).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import sys
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from parties.algorithms.actions import (
    GRAD,
    Await,
    Backward,
    Discard,
    Flush,
    Forward,
    Gather,
    JoinPrefetch,
    Log,
    NotifySchedule,
    Now,
    Pending,
    Poll,
    Prefetch,
    Publish,
    Pull,
    Push,
    Received,
    TopStep,
    WaitSchedule,
)
from parties.algorithms.schedule import ALGOS, effective_workers, eval_segments, num_batches, sync_interval
from parties.algorithms.strategy import StrategyConfig, make_strategy

#: Worker modes (``vfl.workers.mode``); ``inline`` serialises a party's compute calls.
WORKER_MODES = ("thread", "process", "inline", "auto")
#: Span kinds of the timeline.
SPAN_KINDS = ("compute", "wait", "comm")
ROLES = ("active", "passive")


class SimInputError(ValueError):
    """A bad simulation input.

    Attributes:
        field: the offending field's name (``"cores_active"``, ``"costs.passive_fwd_s"``...).
    """

    def __init__(self, field: str, why: str) -> None:
        self.field = field
        super().__init__(f"{field}: {why}")


def _finite_nonneg(name: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
        raise SimInputError(name, f"must be a finite number >= 0, got {v!r}")


def _positive(name: str, v: float, *, finite: bool = True) -> None:
    if not (isinstance(v, (int, float)) and v > 0 and (math.isfinite(v) or not finite)):
        raise SimInputError(name, f"must be a {'finite ' if finite else ''}number > 0, "
                                  f"got {v!r}")


def _int_at_least(name: str, v: int, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise SimInputError(name, f"must be an int >= {lo}, got {v!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCosts:
    """CPU seconds of one worker's compute calls for one batch of B rows (the batch size
    of the :class:`SimInput` they belong to), on an otherwise idle core.

    Attributes:
        passive_fwd_s: passive bottom forward (incl. DP clip + noise, AVFL snapshot).
        passive_bwd_s: passive bottom backward from the cut-layer gradient + Adam step.
        active_fwd_s: the active party's own bottom forward (its ``prefetch``).
        active_top_s: top forward + loss + top backward, up to the cut-layer gradient.
        active_bwd_s: own bottom backward + Adam step of bottom and top.

    Raises:
        SimInputError: a cost that is negative or not finite (field ``costs.<name>``).
    """

    passive_fwd_s: float
    passive_bwd_s: float
    active_fwd_s: float
    active_top_s: float
    active_bwd_s: float

    def __post_init__(self) -> None:
        for f in fields(self):
            _finite_nonneg(f"costs.{f.name}", getattr(self, f.name))

    @property
    def passive_step_s(self) -> float:
        """The passive party's CPU seconds per batch (what a profile's step measures)."""
        return self.passive_fwd_s + self.passive_bwd_s

    @property
    def active_step_s(self) -> float:
        """The active party's CPU seconds per batch."""
        return self.active_fwd_s + self.active_top_s + self.active_bwd_s

    @classmethod
    def from_totals(cls, *, active_step_s: float, passive_step_s: float,
                    passive_fwd_frac: float = 1 / 3, active_fwd_frac: float = 0.3,
                    active_top_frac: float = 0.1) -> StepCosts:
        """Split whole-step costs (e.g. :attr:`parties.planning.profile.PartyProfile.cpu_s_per_step`)
        into the calls. The default fractions are rough (a backward costs about twice its
        forward; the paper's small top model is a minor share); measure them when it
        matters.

        Raises:
            SimInputError: fractions outside [0, 1] or summing above 1 (active).
        """
        for name, v in (("passive_fwd_frac", passive_fwd_frac),
                        ("active_fwd_frac", active_fwd_frac),
                        ("active_top_frac", active_top_frac)):
            if not 0.0 <= v <= 1.0:
                raise SimInputError(name, f"must be in [0, 1], got {v!r}")
        if active_fwd_frac + active_top_frac > 1.0:
            raise SimInputError("active_top_frac", "active fractions sum above 1")
        return cls(passive_fwd_s=passive_step_s * passive_fwd_frac,
                   passive_bwd_s=passive_step_s * (1 - passive_fwd_frac),
                   active_fwd_s=active_step_s * active_fwd_frac,
                   active_top_s=active_step_s * active_top_frac,
                   active_bwd_s=active_step_s * (1 - active_fwd_frac - active_top_frac))

    def scaled(self, factor: float) -> StepCosts:
        """Every cost times ``factor`` (>= 0)."""
        return StepCosts(**{f.name: getattr(self, f.name) * factor for f in fields(self)})


@dataclass(frozen=True, slots=True, kw_only=True)
class SimInput:
    """One simulated training run.

    Attributes:
        algo: one of :data:`parties.algorithms.schedule.ALGOS`.
        n_rows: training rows per epoch (the runs' training split), >= 1.
        batch_size: B, rows per batch, >= 1 (the last batch holds the remainder).
        w_active / w_passive: configured workers per party, >= 1 (the algorithm's
            count is :func:`parties.algorithms.schedule.effective_workers`).
        cores_active / cores_passive: cores of each party, > 0, may be fractional.
        costs: per-batch CPU seconds at B of one worker (:class:`StepCosts`).
        threads: torch intra-op threads per worker: a compute call uses at most this
            many cores, >= 1.
        embedding_dim: d, the cut-layer width (message size B·d·4 bytes), >= 1.
        latency_s: one-way message latency (publish to delivery, via the broker), s.
        bandwidth_bps: link bandwidth per direction, bytes/s (``inf``: no serialisation).
        sync_s_active / sync_s_passive: CPU seconds of one replica's push + pull.
        delta_t0: ΔT0 of the ``pubsub`` sync schedule, >= 1.
        p / q: ``pubsub`` per-batch buffer capacities (never bind without drops; kept
            for completeness), >= 1.
        staleness_bound: ``avfl`` / ``avfl-ps`` outstanding batches per passive worker.
        inflight_max / inflight_auto: ``pubsub``: the passive workers' in-flight window
            (``vfl.workers.inflight_max``, ``vfl.workers.inflight_auto``;
            :class:`parties.algorithms.schedule.InflightWindow`), sized from the simulated round
            trips; 1 (the default here) = the synchronous worker.
        epochs: simulated epochs, >= 1.
        first_epoch: index of the first simulated epoch (ΔT_t depends on it), >= 0.
        segments: training segments per epoch (1; 4 on ``synthetic``), >= 1.
        cost_exponent: γ: a call on r rows costs ``cost · (r/B) ** γ`` (the last batch,
            ``vfl-ps`` subsets), > 0.
        worker_mode: ``"thread"``, ``"process"`` (processor sharing), ``"inline"`` (one
            compute call at a time per party) or ``"auto"`` (inline below 2 cores).
        msg_cpu_s: CPU seconds charged to the sender and to the receiver per message.
        jitter: each compute call's work is multiplied by ``1 + jitter · u``, u uniform
            in [-1, 1] from a ``random.Random(seed)`` (the mean is kept), in [0, 1).
            Without it, identical workers that start together stay in phase forever
            (processor sharing finishes them at the same instant), so a party's workers
            all wait for their partner at the same time; in the runs the OS scheduler's
            time slices and the machine's noise shift them apart. 0 keeps every cost exact
            (hand-checkable); about 0.1 for predictions.
        seed: the jitter's seed (the result is a deterministic function of the input).
        timeline_limit: keep at most this many spans (0: none).

    Raises:
        SimInputError: a bad field (its name is in the message and in ``.field``).
    """

    algo: str
    n_rows: int
    batch_size: int
    cores_active: float
    cores_passive: float
    costs: StepCosts
    w_active: int = 1
    w_passive: int = 1
    threads: int = 1
    embedding_dim: int = 32
    latency_s: float = 0.0
    bandwidth_bps: float = math.inf
    sync_s_active: float = 0.0
    sync_s_passive: float = 0.0
    delta_t0: int = 5
    p: int = 5
    q: int = 5
    staleness_bound: int = 5
    inflight_max: int = 1
    inflight_auto: bool = True
    epochs: int = 1
    first_epoch: int = 0
    segments: int = 1
    cost_exponent: float = 1.0
    worker_mode: str = "thread"
    msg_cpu_s: float = 0.0
    jitter: float = 0.0
    seed: int = 0
    timeline_limit: int = 0

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise SimInputError("algo", f"must be one of {ALGOS}, got {self.algo!r}")
        if not isinstance(self.costs, StepCosts):
            raise SimInputError("costs", f"must be a StepCosts, got {type(self.costs).__name__}")
        for name in ("n_rows", "batch_size", "w_active", "w_passive", "threads",
                     "embedding_dim", "delta_t0", "p", "q", "staleness_bound", "inflight_max",
                     "epochs",
                     "segments"):
            _int_at_least(name, getattr(self, name), 1)
        _int_at_least("first_epoch", self.first_epoch, 0)
        _int_at_least("timeline_limit", self.timeline_limit, 0)
        for name in ("cores_active", "cores_passive", "cost_exponent"):
            _positive(name, getattr(self, name))
        _positive("bandwidth_bps", self.bandwidth_bps, finite=False)
        for name in ("latency_s", "sync_s_active", "sync_s_passive", "msg_cpu_s"):
            _finite_nonneg(name, getattr(self, name))
        if not (isinstance(self.jitter, (int, float)) and 0.0 <= self.jitter < 1.0):
            raise SimInputError("jitter", f"must be in [0, 1), got {self.jitter!r}")
        _int_at_least("seed", self.seed, 0)
        if self.worker_mode not in WORKER_MODES:
            raise SimInputError("worker_mode", f"must be one of {WORKER_MODES}, "
                                               f"got {self.worker_mode!r}")

    def cores(self, role: str) -> float:
        return self.cores_active if role == "active" else self.cores_passive

    def workers(self, role: str) -> int:
        """The workers ``role`` runs under ``algo``."""
        return effective_workers(self.algo, role, self.w_active, self.w_passive)

    def inline(self, role: str) -> bool:
        """True when ``role``'s compute calls run one at a time (inline workers)."""
        if self.worker_mode == "auto":
            return self.cores(role) < 2
        return self.worker_mode == "inline"


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One timeline span of a worker (seconds from the start of the simulation).

    ``kind``: ``"compute"`` (a compute call; ``what`` = fwd/top/bwd/sync), ``"wait"`` (for
    the partner's message) or ``"comm"`` (a message in flight, on the sender's row).
    ``worker`` is -1 for the party's parameter server (``vfl-ps`` IDs, background work).
    """

    party: str
    worker: int
    start_s: float
    end_s: float
    kind: str
    what: str
    epoch: int
    batch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """The simulated run's timing.

    Attributes:
        algo / batch_size / n_batches: as simulated.
        workers_active / workers_passive: the workers each party ran (effective counts).
        epoch_s: mean predicted training wall time per epoch, seconds.
        epoch_times_s: each simulated epoch's wall time, seconds.
        busy_s_active / busy_s_passive: CPU seconds of compute per epoch.
        util_active / util_passive: busy ÷ (cores · epoch wall time), in [0, 1].
        wait_s_active / wait_s_passive: seconds per epoch a worker waited for the
            partner's messages, mean over the party's workers (as the runs' history
            ``wait_s``; an active worker's wait counts only past its own prefetch).
        samples_per_s: training rows per second of training wall time.
        timeline: the first ``timeline_limit`` spans, by start time.
        link: ``pubsub`` with ``inflight_max > 1``: the passive party's measured link and
            in-flight window (:meth:`parties.algorithms.strategy.ScheduledPassive.link_report`), else
            None.
    """

    algo: str
    batch_size: int
    n_batches: int
    workers_active: int
    workers_passive: int
    epoch_s: float
    epoch_times_s: tuple[float, ...]
    busy_s_active: float
    busy_s_passive: float
    util_active: float
    util_passive: float
    wait_s_active: float
    wait_s_passive: float
    samples_per_s: float
    timeline: tuple[Span, ...] = ()
    link: dict[str, Any] | None = None

    def as_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        """Plain dict (JSON-ready); the timeline only when asked."""
        out = asdict(self)
        out["epoch_times_s"] = list(self.epoch_times_s)
        if timeline:
            out["timeline"] = [asdict(s) for s in self.timeline]
        else:
            out.pop("timeline")
        return out


# ---------------------------------------------------------------------------- engine
class _Signal:
    """A one-shot event: fired once (at ``time``), resumes its waiters."""

    __slots__ = ("fired", "time", "waiters")

    def __init__(self) -> None:
        self.fired = False
        self.time = math.nan
        self.waiters: list[_Proc] = []


class _Proc:
    __slots__ = ("gen", "done", "pending")

    def __init__(self, gen: Generator[Any, Any, None]) -> None:
        self.gen = gen
        self.done = _Signal()
        self.pending = 0  # signals still awaited by an ("all", ...) command


class _Cpu:
    """One party's cores: processor sharing (``serial=False``) or one call at a time."""

    def __init__(self, eng: _Engine, role: str, cores: float, threads: int, serial: bool) -> None:
        self.eng = eng
        self.role = role
        self.cores = cores
        self.threads = threads
        self.serial = serial
        self.v = 0.0  # service each running task has received since t=0 (virtual time)
        self.last = 0.0
        self.tasks: list[tuple[float, int, Any]] = []  # (virtual finish, seq, task)
        self.fifo: deque[tuple[float, int, Any]] = deque()  # serial: (work, seq, task)
        self.busy = 0.0

    def _rate(self) -> float:
        if self.serial:
            return float(min(self.threads, self.cores))
        k = len(self.tasks)
        return min(float(self.threads), self.cores / k) if k else 0.0

    def _advance(self, now: float) -> None:
        if self.tasks:
            self.v += self._rate() * (now - self.last)
        self.last = now

    def submit(self, work: float, task: Any) -> None:
        now = self.eng.now
        self._advance(now)
        self.busy += work
        seq = next(self.eng.seq)
        if self.serial:
            if self.tasks:
                self.fifo.append((work, seq, task))
                return
            task.start = now
        heapq.heappush(self.tasks, (self.v + work, seq, task))

    def next_time(self) -> float:
        if not self.tasks:
            return math.inf
        return self.last + max(0.0, self.tasks[0][0] - self.v) / self._rate()

    def complete(self) -> Any:
        """Finish the earliest task (now == :meth:`next_time`); returns it."""
        now = self.eng.now
        vf, _, task = heapq.heappop(self.tasks)
        self.v = vf  # exact, whatever the float drift of the advance
        self.last = now
        if self.serial and self.fifo:
            work, seq, nxt = self.fifo.popleft()
            nxt.start = now
            heapq.heappush(self.tasks, (self.v + work, seq, nxt))
        return task


class _Task:
    __slots__ = ("done", "start", "worker", "what", "epoch", "batch")

    def __init__(self, done: _Signal, start: float, worker: int, what: str, epoch: int,
                 batch: int) -> None:
        self.done = done
        self.start = start
        self.worker = worker
        self.what = what
        self.epoch = epoch
        self.batch = batch


class _Engine:
    """Event heap + processor-sharing CPUs + generator processes.

    A process is a generator that yields commands: ``("wait", signal)`` or
    ``("all", [signals])``; it is resumed (at the simulated time the signal fired) with
    nothing. Compute and messages are started through :class:`_Run` and return signals.
    """

    def __init__(self, timeline_limit: int) -> None:
        self.now = 0.0
        self.seq = itertools.count()
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.cpus: list[_Cpu] = []
        self.spans: list[Span] = []
        self.timeline_limit = timeline_limit

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn))

    def fire(self, sig: _Signal) -> None:
        if sig.fired:
            return
        sig.fired = True
        sig.time = self.now
        waiters, sig.waiters = sig.waiters, []
        for proc in waiters:
            proc.pending -= 1
            if proc.pending == 0:
                self._resume(proc)

    def spawn(self, gen: Generator[Any, Any, None]) -> _Signal:
        proc = _Proc(gen)
        self._resume(proc)
        return proc.done

    def _resume(self, proc: _Proc) -> None:
        while True:
            try:
                cmd, arg = proc.gen.send(None)
            except StopIteration:
                self.fire(proc.done)
                return
            sigs = [arg] if cmd == "wait" else list(arg)
            todo = [s for s in sigs if not s.fired]
            if not todo:
                continue
            proc.pending = len(todo)
            for s in todo:
                s.waiters.append(proc)
            return

    def span(self, **kw: Any) -> None:
        if len(self.spans) < self.timeline_limit:
            self.spans.append(Span(**kw))

    def run(self) -> None:
        while True:
            t_ev = self.heap[0][0] if self.heap else math.inf
            cpu, t_cpu = None, math.inf
            for c in self.cpus:
                t = c.next_time()
                if t < t_cpu:
                    cpu, t_cpu = c, t
            if t_ev == math.inf and cpu is None:
                return
            if t_ev <= t_cpu:
                t, _, fn = heapq.heappop(self.heap)
                self.now = max(self.now, t)
                fn()
            else:
                assert cpu is not None
                self.now = max(self.now, t_cpu)
                task = cpu.complete()
                self.span(party=cpu.role, worker=task.worker, start_s=task.start,
                          end_s=self.now, kind="compute", what=task.what, epoch=task.epoch,
                          batch=task.batch)
                self.fire(task.done)


class _Replica:
    """A worker replica's sync state (:class:`parties.models.model.Replica`)."""

    __slots__ = ("mode", "delta_t0", "steps")

    def __init__(self, mode: str, delta_t0: int) -> None:
        self.mode = mode
        self.delta_t0 = delta_t0
        self.steps = 0

    def after_step(self, epoch: int) -> bool:
        """Count a local step; True when it triggers a sync."""
        self.steps += 1
        if self.mode == "manual":
            return False
        if self.mode == "step" or self.steps >= sync_interval(epoch, self.delta_t0):
            self.steps = 0
            return True
        return False


def _sync_mode(algo: str, workers: int) -> str:
    """As :func:`parties.models.compute.sync_mode_for` (not imported: it pulls in torch)."""
    if workers == 1:
        return "manual"
    return {"pubsub": "schedule", "avfl-ps": "step"}.get(algo, "manual")


Gen = Generator[tuple[str, Any], None, Any]


@dataclass(frozen=True, slots=True)
class _SimMessage:
    """A simulated message: what a strategy reads (``meta``, ``arrays``)."""

    meta: dict[str, Any]
    arrays: tuple[Any, ...]


class _Blob:
    """A simulated payload array: only its size (bytes on the link)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class _Box:
    """One receiver's buffer of one (kind, channel): messages in arrival order, and the
    signals of the processes waiting for the next arrival."""

    __slots__ = ("msgs", "waiters")

    def __init__(self) -> None:
        self.msgs: deque[_SimMessage] = deque()
        self.waiters: list[_Signal] = []


class _Run:
    """One simulation: both parties' strategies (:mod:`parties.algorithms.strategy`, the same objects
    the runs use) interpreted over an :class:`_Engine`: compute actions become CPU tasks,
    publications travel the link model into the receiver's buffers, waits block on them."""

    def __init__(self, inp: SimInput,
                 on_action: Callable[[str, Any], None] | None = None) -> None:
        self.inp = inp
        self.on_action = on_action
        self.eng = _Engine(inp.timeline_limit)
        self.cpu = {r: _Cpu(self.eng, r, inp.cores(r), inp.threads, inp.inline(r))
                    for r in ROLES}
        self.eng.cpus = [self.cpu["active"], self.cpu["passive"]]
        self.n_batches = num_batches(inp.n_rows, inp.batch_size)
        self.rows = [min(inp.batch_size, inp.n_rows - b * inp.batch_size)
                     for b in range(self.n_batches)]
        # batch b's row positions (only their count and split matter here)
        self.batches = [range(b * inp.batch_size, b * inp.batch_size + n)
                        for b, n in enumerate(self.rows)]
        self.nw = {r: inp.workers(r) for r in ROLES}
        self.replicas = {r: [_Replica(_sync_mode(inp.algo, self.nw[r]), inp.delta_t0)
                             for _ in range(self.nw[r])] for r in ROLES}
        self.sync_s = {"active": inp.sync_s_active, "passive": inp.sync_s_passive}
        # no deadline misses (see the module docstring): waits are unbounded, nothing drops
        self.strategies = {r: make_strategy(StrategyConfig(
            algo=inp.algo, role=r, workers=self.nw[r], drops=False, data_wait_s=math.inf,
            staleness_bound=inp.staleness_bound,
            inflight_max=inp.inflight_max if inp.algo == "pubsub" else 1,
            inflight_auto=inp.inflight_auto)) for r in ROLES}
        self.boxes: dict[tuple[str, str, int | None], _Box] = {}  # (receiver, kind, channel)
        self.prefetches: dict[tuple[str, int], _Signal] = {}
        self.sched_sig = {r: _Signal() for r in ROLES}  # fired (and replaced) on a notify
        self.rng = random.Random(inp.seed)
        self.link_free = {r: 0.0 for r in ROLES}  # by sender
        self.wait = {r: 0.0 for r in ROLES}
        self.epoch_times: list[float] = []
        self.busy: list[dict[str, float]] = []
        self.waits: list[dict[str, float]] = []
        self._epoch = inp.first_epoch  # the epoch being simulated (wait spans' tag)
        self._now_fns: dict[type, Callable[[str, Any], Any]] = {
            Publish: self.do_publish, Poll: self.do_poll, Pending: self.do_pending,
            Now: lambda role, a: self.eng.now, Prefetch: self.do_prefetch,
            Discard: lambda role, a: None, Log: lambda role, a: None,
            NotifySchedule: self.do_notify}
        self._gen_fns: dict[type, Callable[[str, Any], Gen]] = {
            Forward: self.do_forward, Backward: self.do_backward, TopStep: self.do_top_step,
            JoinPrefetch: self.do_join_prefetch, Await: self.do_await,
            WaitSchedule: self.do_wait_schedule, Gather: self.do_gather, Push: self.do_sync,
            Pull: self.do_sync, Flush: self.do_flush}

    # -------------------------------------------------------------- primitives
    def cost(self, base: float, rows: int) -> float:
        b = self.inp.batch_size
        return base if rows == b else base * (rows / b) ** self.inp.cost_exponent

    def compute(self, role: str, worker: int, work: float, what: str, epoch: int,
                batch: int) -> _Signal:
        """Start a compute call of ``work`` CPU seconds; its signal fires when done."""
        done = _Signal()
        if work <= 0.0:
            self.eng.fire(done)
            return done
        if self.inp.jitter:
            work *= 1.0 + self.inp.jitter * (2.0 * self.rng.random() - 1.0)
        self.cpu[role].submit(work, _Task(done, self.eng.now, worker, what, epoch, batch))
        return done

    def step_cost(self, role: str, worker: int, base: float, rows: int, epoch: int) -> float:
        """A training call's cost plus the sync its ``after_step`` may trigger."""
        extra = self.sync_s[role] if self.replicas[role][worker].after_step(epoch) else 0.0
        return self.cost(base, rows) + extra

    def box(self, role: str, kind: str, channel: int | None) -> _Box:
        key = (role, kind, channel)
        b = self.boxes.get(key)
        if b is None:
            b = self.boxes[key] = _Box()
        return b

    def publish(self, role: str, worker: int, kind: str, channel: int | None,
                msg: _SimMessage, epoch: int, batch: int) -> None:
        """Send a message; it lands in the partner's buffer of (kind, channel)."""
        inp, eng = self.inp, self.eng
        other = "passive" if role == "active" else "active"
        nbytes = sum(getattr(a, "nbytes", 0) for a in msg.arrays)
        start = max(eng.now, self.link_free[role])
        sent = start + (nbytes / inp.bandwidth_bps if math.isfinite(inp.bandwidth_bps) else 0.0)
        self.link_free[role] = sent
        arrive = sent + inp.latency_s
        box = self.box(other, kind, channel)
        if inp.msg_cpu_s > 0:
            self.compute(role, -1, inp.msg_cpu_s, "send", epoch, batch)

        def deliver() -> None:
            if inp.msg_cpu_s > 0:
                self.compute(other, -1, inp.msg_cpu_s, "recv", epoch, batch)
            box.msgs.append(msg)
            waiters, box.waiters = box.waiters, []
            for sig in waiters:
                eng.fire(sig)

        eng.span(party=role, worker=worker, start_s=eng.now, end_s=arrive, kind="comm",
                 what=kind, epoch=epoch, batch=batch)
        eng.at(arrive, deliver)

    def emb_bytes(self, rows: int) -> int:
        return rows * self.inp.embedding_dim * 4

    # -------------------------------------------------------------- interpreter
    def interp(self, role: str, proc: Any) -> Gen:
        """An engine process that runs the strategy generator ``proc`` of ``role``."""
        send: Any = None
        now_fns, gen_fns = self._now_fns, self._gen_fns
        while True:
            try:
                action = proc.send(send)
            except StopIteration as stop:
                return stop.value
            if self.on_action is not None:
                self.on_action(role, action)
            fn = now_fns.get(type(action))
            if fn is not None:
                send = fn(role, action)
                continue
            send = yield from gen_fns[type(action)](role, action)

    def do_publish(self, role: str, a: Publish) -> None:
        epoch = int(a.meta.get("e", -1))
        batch = a.batch if a.batch >= 0 else int(a.meta.get("b", -1))
        self.publish(role, a.worker, a.kind, a.channel, _SimMessage(dict(a.meta), a.arrays),
                     epoch, batch)

    def do_poll(self, role: str, a: Poll) -> Received:
        box, stale = self.box(role, a.kind, a.channel), 0
        while box.msgs:
            m = box.msgs.popleft()
            verdict = a.accept(m)
            if verdict == 1:
                return Received(msg=m, stale=stale)
            if verdict < 0:
                box.msgs.appendleft(m)
                return Received(later=True, stale=stale)
            stale += 1
        return Received(stale=stale)

    def do_pending(self, role: str, a: Pending) -> frozenset[int]:
        return frozenset(c for c in a.channels if self.box(role, a.kind, c).msgs)

    def do_prefetch(self, role: str, a: Prefetch) -> None:
        work = self.cost(self.inp.costs.active_fwd_s, a.n_rows)
        self.prefetches[(role, a.worker)] = self.compute(role, a.worker, work, "fwd", a.epoch,
                                                         a.batch)

    def do_notify(self, role: str, a: NotifySchedule) -> None:
        """Wake the party's schedule waiters after the notifier's turn (as asyncio's
        ``notify_all`` does): an immediate action never lets another worker run."""
        sig, self.sched_sig[role] = self.sched_sig[role], _Signal()
        if sig.waiters:
            self.eng.at(self.eng.now, lambda: self.eng.fire(sig))

    def do_forward(self, role: str, a: Forward) -> Gen:
        work = self.cost(self.inp.costs.passive_fwd_s, a.n_rows)
        yield ("wait", self.compute(role, a.worker, work, "fwd", a.epoch, a.batch))
        return _Blob(self.emb_bytes(a.n_rows))

    def do_backward(self, role: str, a: Backward) -> Gen:
        work = self.step_cost(role, a.worker, self.inp.costs.passive_bwd_s, a.n_rows, a.epoch)
        yield ("wait", self.compute(role, a.worker, work, "bwd", a.epoch, a.key))

    def do_top_step(self, role: str, a: TopStep) -> Gen:
        c, k = self.inp.costs, a.worker
        yield ("wait", self.compute(role, k, self.cost(c.active_top_s, a.n_rows), "top",
                                    a.epoch, a.batch))
        meta = dict(a.grad_meta)
        if a.held_since is not None:  # as the runs' interpreter: the active party's hold
            meta["h"] = self.eng.now - a.held_since
        self.publish(role, k, GRAD, a.grad_channel,
                     _SimMessage(meta, (_Blob(self.emb_bytes(a.n_rows)),)),
                     a.epoch, a.batch)
        work = self.step_cost(role, k, c.active_bwd_s, a.n_rows, a.epoch)
        yield ("wait", self.compute(role, k, work, "bwd", a.epoch, a.batch))
        return 0.0

    def do_join_prefetch(self, role: str, a: JoinPrefetch) -> Gen:
        sig = self.prefetches.get((role, a.worker))
        if sig is not None:
            yield ("wait", sig)

    def do_await(self, role: str, a: Await) -> Gen:
        """Wait (no deadline: nothing misses here) for an accepted message. The wait is
        counted from now, or from the end of the worker's running prefetch (an active
        worker's wait counts only past its own bottom forward)."""
        t0 = self.eng.now
        box = self.box(role, a.kind, a.channel)
        while True:
            r = self.do_poll(role, Poll(kind=a.kind, channel=a.channel, accept=a.accept))
            if r.msg is not None or r.later:
                break
            sig = _Signal()
            box.waiters.append(sig)
            yield ("wait", sig)
        pre = self.prefetches.get((role, a.worker)) if a.worker >= 0 else None
        start = t0 if pre is None else (max(t0, pre.time) if pre.fired else math.inf)
        end = self.eng.now
        if end - start > 0:
            self.wait[role] += end - start
            self.eng.span(party=role, worker=a.worker, start_s=start, end_s=end, kind="wait",
                          what="msg", epoch=self._epoch, batch=a.batch)
        return r

    def do_wait_schedule(self, role: str, a: WaitSchedule) -> Gen:
        while not a.ready():
            yield ("wait", self.sched_sig[role])

    def do_gather(self, role: str, a: Gather) -> Gen:
        yield ("all", [self.eng.spawn(self.interp(role, p)) for p in a.procs])
        return [None] * len(a.procs)

    def do_sync(self, role: str, a: Push | Pull) -> Gen:
        """Half of a replica's sync cost on every worker (a barrier's push or pull)."""
        half = self.sync_s[role] / 2
        what = "push" if isinstance(a, Push) else "pull"
        yield ("all", [self.compute(role, k, half, what, a.epoch, a.batch)
                       for k in range(self.nw[role])])

    def do_flush(self, role: str, a: Flush) -> Gen:
        """Every replica syncs after a segment (its step count restarts)."""
        out = []
        for k, rep in enumerate(self.replicas[role]):
            rep.steps = 0
            out.append(self.compute(role, k, self.sync_s[role], "sync", a.epoch, -1))
        yield ("all", out)

    # -------------------------------------------------------------- driver
    def driver(self) -> Gen:
        """Every epoch's segments: both parties' :meth:`Strategy.segment`, then both
        parties' :meth:`Strategy.end_segment` (segment ends are a barrier here)."""
        inp, spawn = self.inp, self.eng.spawn
        segs = eval_segments(self.n_batches, inp.segments)
        for epoch in range(inp.first_epoch, inp.first_epoch + inp.epochs):
            self._epoch = epoch
            t0 = self.eng.now
            busy0 = {r: self.cpu[r].busy for r in ROLES}
            wait0 = dict(self.wait)
            for seg in segs:
                yield ("all", [spawn(self.interp(r, self.strategies[r].segment(
                    epoch, self.batches, seg))) for r in ROLES])
                yield ("all", [spawn(self.interp(r, self.strategies[r].end_segment(epoch)))
                               for r in ROLES])
            self.epoch_times.append(self.eng.now - t0)
            self.busy.append({r: self.cpu[r].busy - busy0[r] for r in ROLES})
            self.waits.append({r: (self.wait[r] - wait0[r]) / self.nw[r] for r in ROLES})

    def result(self) -> SimResult:
        inp = self.inp
        self.eng.spawn(self.driver())
        self.eng.run()
        if len(self.epoch_times) != inp.epochs:  # pragma: no cover - an engine bug
            raise RuntimeError("simulation deadlocked: a process waits for a signal "
                               "nothing fires")
        n = inp.epochs
        wall = sum(self.epoch_times)
        busy = {r: sum(e[r] for e in self.busy) / n for r in ROLES}
        epoch_s = wall / n
        util = {r: busy[r] / (inp.cores(r) * epoch_s) if epoch_s > 0 else 0.0 for r in ROLES}
        waits = {r: sum(e[r] for e in self.waits) / n for r in ROLES}
        spans = tuple(sorted(self.eng.spans, key=lambda s: (s.start_s, s.end_s)))
        return SimResult(
            algo=inp.algo, batch_size=inp.batch_size, n_batches=self.n_batches,
            workers_active=self.nw["active"], workers_passive=self.nw["passive"],
            epoch_s=epoch_s, epoch_times_s=tuple(self.epoch_times),
            busy_s_active=busy["active"], busy_s_passive=busy["passive"],
            util_active=util["active"], util_passive=util["passive"],
            wait_s_active=waits["active"], wait_s_passive=waits["passive"],
            samples_per_s=inp.n_rows * n / wall if wall > 0 else math.inf,
            timeline=spans, link=getattr(self.strategies["passive"], "link_report",
                                         lambda: None)())


def simulate(inp: SimInput, *, on_action: Callable[[str, Any], None] | None = None
             ) -> SimResult:
    """Simulate ``inp`` (deterministic: the same input gives the same result).

    ``on_action(role, action)`` (optional) sees every strategy action as it is
    interpreted, in simulated-time order (:mod:`parties.algorithms.actions`).

    Raises:
        SimInputError: only through building ``inp``; a built input always simulates.
    """
    return _Run(inp, on_action).result()


# ---------------------------------------------------------------------------- grid
#: The paper's 64-core setting (PubSub-VFL, Table 2): active:passive cores and workers.
PAPER_CORES = (50.0, 14.0)
PAPER_WORKERS = (4, 8, 16, 32, 50)


def predict_table(base: SimInput, *, algos: Sequence[str] = ALGOS,
                  workers: Iterable[int | tuple[int, int]] = PAPER_WORKERS,
                  batch_sizes: Iterable[int] | None = None,
                  costs_at: Callable[[int], StepCosts] | None = None) -> list[dict[str, Any]]:
    """Predictions for a grid of (algo, w, B), one row each.

    Args:
        base: every other setting (cores, link, costs at ``base.batch_size``, ...).
        algos: algorithms to simulate.
        workers: w (both parties) or ``(w_active, w_passive)`` pairs.
        batch_sizes: B values (default: ``base.batch_size`` only).
        costs_at: per-batch :class:`StepCosts` of one worker at B (e.g. from a fitted
            cost model); default: ``base.costs`` scaled by ``(B / B0) ** cost_exponent``.

    Returns:
        Dicts of :meth:`SimResult.as_dict` plus ``w_active``, ``w_passive``,
        ``cores_active``, ``cores_passive``.

    Raises:
        SimInputError: a bad grid value (the field is named).
    """
    b0 = base.batch_size
    out = []
    for bs in (b0,) if batch_sizes is None else tuple(batch_sizes):
        _int_at_least("batch_size", bs, 1)
        costs = costs_at(bs) if costs_at is not None else \
            base.costs.scaled((bs / b0) ** base.cost_exponent)
        for algo in algos:
            for w in workers:
                wa, wp = (w, w) if isinstance(w, int) else w
                inp = replace(base, algo=algo, batch_size=bs, w_active=wa, w_passive=wp,
                              costs=costs, timeline_limit=0)
                row = simulate(inp).as_dict()
                row.update(w_active=wa, w_passive=wp, cores_active=inp.cores_active,
                           cores_passive=inp.cores_passive)
                out.append(row)
    return out


def input_from_mapping(spec: Mapping[str, Any]) -> SimInput:
    """A :class:`SimInput` from a JSON-like mapping (``costs`` a mapping of
    :class:`StepCosts` fields, or of ``active_step_s`` / ``passive_step_s`` totals and
    optional fractions for :meth:`StepCosts.from_totals`; ``algo`` defaults to
    ``pubsub``). Unknown keys are errors.

    Raises:
        SimInputError: a missing, unknown or bad field.
    """
    known = {f.name for f in fields(SimInput)}
    extra = sorted(set(spec) - known)
    if extra:
        raise SimInputError(extra[0], f"unknown field (known: {sorted(known)})")
    kw = dict(spec)
    kw.setdefault("algo", "pubsub")
    c = kw.get("costs")
    if not isinstance(c, Mapping):
        raise SimInputError("costs", "must be a mapping of per-batch CPU seconds")
    try:
        kw["costs"] = StepCosts.from_totals(**c) if "active_step_s" in c else StepCosts(**c)
    except TypeError as exc:
        raise SimInputError("costs", str(exc)) from None
    if "bandwidth_bps" in kw and kw["bandwidth_bps"] is None:
        kw["bandwidth_bps"] = math.inf
    try:
        return SimInput(**kw)
    except TypeError as exc:
        raise SimInputError("input", str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim.cluster.des --json SPEC`` — print predictions for a grid, one JSON line each.

    SPEC (a file path, or ``-`` for stdin) is a JSON object: the :class:`SimInput`
    fields (:func:`input_from_mapping`) plus an optional ``grid`` with ``algos``,
    ``workers`` (ints or ``[w_active, w_passive]`` pairs), ``batch_sizes`` (costs scale
    with ``cost_exponent``). Example (the paper's 64-core setting)::

        {"n_rows": 100000, "batch_size": 256, "cores_active": 50, "cores_passive": 14,
         "costs": {"active_step_s": 0.0045, "passive_step_s": 0.0040},
         "grid": {"algos": ["vfl", "pubsub"], "workers": [4, 8, 16, 32, 50]}}

    Returns the exit code: 0, or 2 for a bad spec (one ``error:`` line on stderr).
    """
    ap = argparse.ArgumentParser(prog="python -m sim.cluster.des", description=main.__doc__)
    ap.add_argument("--json", required=True, metavar="SPEC",
                    help="JSON spec file ('-' for stdin)")
    ap.add_argument("--table", action="store_true", help="a text table instead of JSON lines")
    args = ap.parse_args(argv)
    try:
        text = sys.stdin.read() if args.json == "-" else open(args.json).read()  # noqa: SIM115
        spec = json.loads(text)
        if not isinstance(spec, dict):
            raise SimInputError("spec", "must be a JSON object")
        grid = spec.pop("grid", {}) or {}
        base = input_from_mapping(spec)
        rows = predict_table(
            base, algos=grid.get("algos", ALGOS),
            workers=[w if isinstance(w, int) else tuple(w)
                     for w in grid.get("workers", PAPER_WORKERS)],
            batch_sizes=grid.get("batch_sizes"))
    except (OSError, json.JSONDecodeError, SimInputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.table:
        print(f"{'algo':8} {'w_a':>4} {'w_p':>4} {'B':>6} {'epoch_s':>10} {'samples/s':>11} "
              f"{'util_a':>7} {'util_p':>7} {'wait_a':>8} {'wait_p':>8}")
        for r in rows:
            print(f"{r['algo']:8} {r['w_active']:>4} {r['w_passive']:>4} {r['batch_size']:>6} "
                  f"{r['epoch_s']:>10.3f} {r['samples_per_s']:>11,.0f} {r['util_active']:>7.3f} "
                  f"{r['util_passive']:>7.3f} {r['wait_s_active']:>8.3f} "
                  f"{r['wait_s_passive']:>8.3f}")
    else:
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
