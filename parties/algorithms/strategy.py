"""Sans-IO coordination algorithms of a VFL party: one pure object per algorithm x role.

No asyncio, no bus, no torch: each strategy's :meth:`Strategy.segment` returns a
generator that yields :mod:`parties.algorithms.actions` and receives their results. The asyncio
interpreter (:class:`parties.runtime.driver.ActionDriver`, used by :class:`parties.runtime.party.Party`)
and the discrete-event simulator (:mod:`sim.cluster.des`) both run these same generators, so
the schedules exist once. The algorithms' semantics are specified in the module
docstring of :mod:`parties.runtime.party`.

A strategy object lives for the whole run and owns the party's scheduling state and
counters (:class:`StrategyCounters`); per segment it builds the shared
:class:`parties.algorithms.schedule.EpochSchedule` (or queue) and one generator per worker.

==============================  ============  ==========================================
class                           algo          role
==============================  ============  ==========================================
:class:`ScheduledPassive`       pubsub, vfl   passive
:class:`ScheduledActive`        pubsub, vfl,  active (``avfl*``: no reassignment)
                                avfl, avfl-ps
:class:`AvflPassive`            avfl, avfl-ps passive
:class:`VflpsActive`            vfl-ps        active
:class:`VflpsPassive`           vfl-ps        passive
==============================  ============  ==========================================
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from parties.algorithms.actions import (
    EMB,
    GRAD,
    IDS,
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
    Proc,
    Publish,
    Pull,
    Push,
    Received,
    TopStep,
    WaitSchedule,
)
from parties.core.errors import ConfigMismatch, PartnerStalled
from parties.algorithms.schedule import (
    ALGOS,
    EpochSchedule,
    InflightWindow,
    StalenessWindow,
    pack_ids,
    split_batch_ids,
    unpack_ids,
)

ROLES = ("active", "passive")
#: How often a long wait for partner data checks whether a reassigned batch's data has
#: arrived meanwhile (seconds). Only waits longer than this pay for it.
SWITCH_CHECK_S = 0.05


@dataclass(frozen=True, slots=True)
class Miss:
    """What :meth:`Strategy._active_step` returns when a batch's wait for partner data
    ended without all of it: the embeddings that did arrive (by party; kept for the
    batch's next attempt when there are several partners), the parties still missing,
    and whether the wait was given up for a reassigned batch whose data had arrived
    meanwhile rather than missed, or because a partner skipped the batch."""

    got: dict[str, Any]
    missing: tuple[str, ...]
    switched: bool = False
    #: a partner sent a skip notice for the batch (it dropped the batch for the epoch:
    #: its DP reassignment reserve is spent): give the batch up, do not reassign it
    skipped: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyConfig:
    """What a strategy needs of the run config.

    Attributes:
        algo: one of :data:`parties.algorithms.schedule.ALGOS`.
        role: ``"active"`` or ``"passive"``.
        workers: the workers this party runs (:func:`parties.algorithms.schedule.effective_workers`).
        drops: a missed partner deadline drops the batch (else it raises
            :class:`PartnerStalled`).
        data_wait_s: how long a worker waits for partner data (T_ddl when ``drops``,
            else the liveness timeout), > 0.
        max_reassign: reassignments per missed batch (``pubsub``).
        staleness_bound: outstanding batches per AVFL passive worker, >= 1.
        t_ddl_s: T_ddl as configured (only logged).
        partners: the passive parties an active party trains with, by party id
            (``("",)``: its one partner, every two-party run); a passive party's one
            partner is the active party (``("",)``).
        inflight_max: ``pubsub``: the most batches a passive worker keeps in flight
            (:class:`parties.algorithms.schedule.InflightWindow`); 1 = the synchronous worker (embed,
            publish, wait for the gradient). Above 1 the active party also reports its
            pace with each gradient (meta ``q``, ``p``).
        inflight_auto: size the window from the measured round trip (else always
            ``inflight_max``).
    """

    algo: str
    role: str
    workers: int
    drops: bool
    data_wait_s: float
    max_reassign: int = 0
    staleness_bound: int = 1
    t_ddl_s: float = 0.0
    partners: tuple[str, ...] = ("",)
    inflight_max: int = 1
    inflight_auto: bool = True

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {self.algo!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.workers < 1 or self.staleness_bound < 1 or self.max_reassign < 0 \
                or self.inflight_max < 1:
            raise ValueError(f"bad strategy config: workers={self.workers}, staleness_bound="
                             f"{self.staleness_bound}, max_reassign={self.max_reassign}, "
                             f"inflight_max={self.inflight_max}")
        if not self.data_wait_s > 0:
            raise ValueError(f"data_wait_s must be > 0, got {self.data_wait_s!r}")
        partners = tuple(self.partners)
        if not partners or len(set(partners)) != len(partners):
            raise ValueError(f"partners must be distinct party ids, got {partners!r}")
        if len(partners) > 1 and ("" in partners or self.role != "active"):
            raise ValueError(f"only an active party has several partners, each named; got "
                             f"role {self.role!r}, partners {partners!r}")

    @property
    def partner(self) -> str:
        return "passive" if self.role == "active" else "active"

    def partner_name(self, party: str) -> str:
        """How errors and logs name ``party`` (``""``: the one partner, by role)."""
        return party or self.partner

    @classmethod
    def from_vfl(cls, cfg: Any, role: str, party: str = "") -> StrategyConfig:
        """From a :class:`parties.config.VflConfig`: drops when ``t_ddl_s > 0`` and the
        algorithm may drop (not ``vfl`` / ``vfl-ps``); an active party with several passive
        parties has them as its partners, by party id; the in-flight window
        (``vfl.workers.inflight_max``, ``vfl.workers.inflight_auto``) under ``pubsub`` only. ``party``: the
        party's id (its own worker count, ``vfl.workers.per_passive_party``); "" = ``role``."""
        drops = cfg.timeouts.t_ddl_s > 0 and cfg.algo not in ("vfl", "vfl-ps")
        several = role == "active" and cfg.passive_parties > 1
        return cls(algo=cfg.algo, role=role, workers=cfg.workers_for(party or role),
                   drops=drops,
                   data_wait_s=(cfg.timeouts.t_ddl_s if drops
                                else cfg.timeouts.liveness_timeout_s),
                   max_reassign=cfg.timeouts.max_reassign,
                   staleness_bound=cfg.workers.staleness_bound,
                   t_ddl_s=cfg.timeouts.t_ddl_s,
                   partners=tuple(cfg.party_ids[1:]) if several else ("",),
                   inflight_max=cfg.workers.inflight_max if cfg.algo == "pubsub" else 1,
                   inflight_auto=cfg.workers.inflight_auto)


@dataclass(slots=True)
class StrategyCounters:
    """A party's training counters over the run (the metrics' ``*_batches`` etc.)."""

    dropped: int = 0
    reassigned: int = 0
    skipped: int = 0
    stale: int = 0
    switched: int = 0  # waits given up for a reassigned batch whose data had arrived
    batches: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    loss_n: int = 0
    max_staleness: int = 0
    #: the active party's missed embeddings by passive party id (several passive parties)
    missed_by_party: dict[str, int] = field(default_factory=dict)
    #: batches given up for their epoch (never trained there), by cause (:data:`CAUSES`)
    untrained: dict[str, int] = field(default_factory=dict)

    def give_up(self, cause: str) -> None:
        """Count one batch given up for its epoch because of ``cause``."""
        if cause not in CAUSES:
            raise ValueError(f"cause must be one of {CAUSES}, got {cause!r}")
        self.untrained[cause] = self.untrained.get(cause, 0) + 1


#: why a batch was given up for its epoch (``untrained_batches`` in metrics.json):
#: ``emb_missed`` (active: the embedding missed T_ddl on its last attempt),
#: ``partner_skipped`` (active: a passive party's notice, its DP reassignment reserve),
#: ``grad_missed`` (passive: the gradient missed T_ddl on its last attempt),
#: ``active_skipped`` (passive: the active party's notice that it gave the batch up),
#: ``dp_reserve`` (passive: a record's DP reassignment reserve was spent)
CAUSES = ("emb_missed", "partner_skipped", "grad_missed", "active_skipped", "dp_reserve")


def grad_acceptor(epoch: int, b: int, uid: str) -> Callable[[Any], int]:
    """Accept the gradient of batch ``b`` of ``epoch``, or the active party's notice that
    it skipped the batch; anything from an earlier epoch is stale.

    A gradient of an earlier attempt at the same batch (its ``u`` is not ``uid``) is
    accepted too: the active party trains each batch once, on whichever attempt's
    embedding reached it first, so after a miss on either side that gradient is the only
    one that will come. Applied to the newer attempt's forward graph (the same rows, the
    parameters a few steps on), it is a stale gradient, as AVFL applies routinely;
    waiting for the exact attempt instead made the two parties circle their reassigned
    batches out of phase, each miss costing another T_ddl (a 5 s pause of the passive
    party with T_ddl = 2 s then cost over 80 s).
    """

    def accept(m: Any) -> int:
        e = m.meta.get("e", -1)
        if e == epoch and m.meta.get("b") == b:
            return 1
        if m.meta.get("u") == uid:  # (gradients always carry e and b; kept for safety)
            return 1
        return 0 if e <= epoch else -1

    return accept


def epoch_acceptor(epoch: int) -> Callable[[Any], int]:
    """An embedding of ``epoch`` (on a batch's own channel); earlier ones are stale."""

    def accept(m: Any) -> int:
        e = m.meta.get("e", -1)
        return 1 if e == epoch else (0 if e < epoch else -1)

    return accept


def batch_acceptor(epoch: int, b: int) -> Callable[[Any], int]:
    """``vfl-ps``: the message of ``(epoch, b)``; earlier ones are stale."""

    def accept(m: Any) -> int:
        key = (m.meta.get("e", -1), m.meta.get("b", -1))
        return 1 if key == (epoch, b) else (0 if key < (epoch, b) else -1)

    return accept


class Strategy:
    """Base of the five algorithms' strategies (shared helpers and counters).

    Subclasses implement :meth:`segment`. ``batches[b]`` is batch b's row positions
    (anything with ``len``; ``vfl-ps`` splits it with
    :func:`parties.algorithms.schedule.split_batch_ids`).
    """

    def __init__(self, cfg: StrategyConfig) -> None:
        self.cfg = cfg
        self.counters = StrategyCounters()
        #: (epoch, batch) -> the partner embeddings that arrived for a missed attempt (an
        #: active party with several partners waits only for the rest next time)
        self._held: dict[tuple[int, int], dict[str, Any]] = {}
        #: how long an active worker waits for an embedding: ``data_wait_s``, raised to the
        #: passive party's deadline on the measured link (meta ``d`` of its embeddings)
        self.emb_wait_s = cfg.data_wait_s

    def segment(self, epoch: int, batches: Sequence[Any], seg: range) -> Proc:
        """Train the batches ``seg`` of ``epoch``: the top-level generator."""
        raise NotImplementedError

    def end_segment(self, epoch: int) -> Proc:
        """After a segment: every replica syncs with the PS."""
        yield Flush(epoch=epoch)

    # ------------------------------------------------------------------ helpers
    def _wait(self, kind: str, channel: int | None, timeout_s: float,
              accept: Callable[[Any], int], *, worker: int = -1, batch: int = -1,
              party: str = "") -> Proc:
        r: Received = yield Await(kind=kind, channel=channel, timeout_s=timeout_s,
                                  accept=accept, worker=worker, batch=batch, party=party)
        self.counters.stale += r.stale
        return r

    def _stalled(self, what: str, b: int, epoch: int, party: str = "") -> Proc:
        """Log and return (for the caller to raise) :class:`PartnerStalled` naming the
        partner (``party``: one of several passive parties)."""
        cfg = self.cfg
        name = cfg.partner_name(party)
        yield Log(event="vfl.partner_stalled", level="error",
                  fields={"partner": name, "missing": what, "batch": b, "epoch": epoch,
                          "waited_s": cfg.data_wait_s})
        return PartnerStalled(name, what, cfg.data_wait_s, f"batch {b} of epoch {epoch}")

    def _drop_refused(self, k: int, sched: EpochSchedule, epoch: int, b: int,
                      attempt: int) -> Proc:
        """The DP ledger refused a reassigned attempt (a record of the batch has spent its
        reassignment reserve): drop the batch for the epoch and tell the active party, so
        that it does not wait T_ddl for it."""
        yield Discard(worker=k, key=b)
        sched.drop(b)
        self.counters.dropped += 1
        self.counters.give_up("dp_reserve")
        yield Publish(kind=EMB, channel=b, meta={"e": epoch, "b": b, "skip": True})
        yield Log(event="vfl.batch_dropped", level="warning",
                  fields={"batch": b, "epoch": epoch, "missing": "dp_reserve",
                          "reassigned": False, "attempt": attempt})
        yield NotifySchedule()

    def _close_attempt(self, sched: EpochSchedule, outcome: str, b: int, epoch: int,
                       attempt: int) -> Proc:
        """The schedule after a passive attempt's gradient wait: a miss fails the attempt
        (reassigned or given up), a partner's skip drops the batch, a gradient completes
        it; then the workers waiting on the schedule are woken."""
        if outcome == "missed":
            again = sched.fail(b, attempt)
            if not again:
                self.counters.give_up("grad_missed")
            yield from self._count_miss(again, b, epoch, "grad")
        elif outcome == "skipped":
            sched.drop(b)
            self.counters.give_up("active_skipped")
        else:
            sched.complete(b)
        yield NotifySchedule()

    def _count_miss(self, reassigned: bool, b: int, epoch: int, what: str,
                    parties: tuple[str, ...] = ()) -> Proc:
        c = self.counters
        c.dropped += 1
        if reassigned:
            c.reassigned += 1
        fields: dict[str, Any] = {"batch": b, "epoch": epoch, "missing": what,
                                  "reassigned": reassigned, "t_ddl_s": self.cfg.t_ddl_s}
        named = [p for p in parties if p]
        if named:
            for p in named:
                c.missed_by_party[p] = c.missed_by_party.get(p, 0) + 1
            fields["parties"] = named
        yield Log(event="vfl.batch_dropped", level="warning", fields=fields)

    def _ready(self, kind: str, ids: tuple[int, ...], epoch: int) -> Proc:
        """Which of ``ids`` have every partner's ``kind`` message at hand (buffered, or
        held from an earlier attempt): one :class:`Pending` per partner."""
        ready: frozenset[int] | None = None
        for party in self.cfg.partners:
            have = yield Pending(kind=kind, channels=ids, party=party)
            if self._held:
                have = have | {b for b in ids if party in self._held.get((epoch, b), ())}
            ready = have if ready is None else ready & have
        return ready if ready is not None else frozenset()

    def _settle_grad(self, k: int, epoch: int, b: int, msg: Any, n_rows: int) -> Proc:
        """The passive side's end of one batch, shared by every algorithm: back-propagate
        its gradient (``"applied"``), or discard the batch's forward state because the
        gradient missed its deadline (``"missed"``) or the active party skipped the batch
        (``"skipped"``). The caller updates its own schedule from the outcome.

        Raises:
            PartnerStalled: a missed gradient where nothing may be dropped.
        """
        c = self.counters
        if msg is None:
            if not self.cfg.drops:
                raise (yield from self._stalled("grad", b, epoch))
            yield Discard(worker=k, key=b)
            return "missed"
        if msg.meta.get("skip"):
            yield Discard(worker=k, key=b)
            c.skipped += 1
            c.dropped += 1
            return "skipped"
        yield Backward(worker=k, epoch=epoch, key=b, msg=msg, n_rows=n_rows)
        c.batches += 1
        c.samples += n_rows
        return "applied"

    def _next_task(self, sched: EpochSchedule, kind: str, epoch: int) -> Proc:
        """The next ``(batch_id, attempt)`` of the epoch, waiting while others are in
        flight (they may fail and be reassigned); None when the epoch is over. A
        reassigned batch whose partner data (``kind`` on its channel, from every
        partner) is at hand goes first (:meth:`EpochSchedule.take`)."""
        while True:
            prefer = None
            if sched.retries:
                ready = yield from self._ready(kind, sched.retry_ids(), epoch)
                prefer = ready.__contains__
            task = sched.take(prefer)
            if task is not None or sched.done:
                return task
            yield WaitSchedule(ready=lambda: bool(sched.pending) or sched.done)

    def _active_step(self, k: int, epoch: int, b: int, *, channel: int,
                     accept: Callable[[Any], int], grad_meta: Callable[[Any], dict[str, Any]],
                     n_rows: int, rows: Any = None,
                     switch: Callable[[], Proc] | None = None,
                     probe: dict[str, Any] | None = None) -> Proc:
        """One active step: compute the own bottom forward while waiting for every
        partner's embedding (one deadline for all), then the top step on their fusion;
        each partner's cut-layer gradient is published (on ``channel``) as soon as it
        exists. Returns the embedding messages (a tuple, in partner order), or a
        :class:`Miss` (nothing trained).

        ``switch``: a generator checked every :data:`SWITCH_CHECK_S` of a long wait; when
        it returns True (the partners' data for a reassigned batch has arrived meanwhile)
        the wait is given up early (``Miss.switched``: the caller puts ``b`` back, not
        counted as a miss). With several partners, embeddings held from an earlier
        attempt at ``b`` count as arrived.

        ``probe`` (a dict, filled in): ``"q"``, True when every partner's embedding was
        already buffered as the wait began (it queued for this worker: the round trip
        its gradient closes includes that queue), and ``"t_got"``, the time the wait
        ended (:class:`Now`)."""
        partners = self.cfg.partners
        yield Prefetch(worker=k, epoch=epoch, batch=b, n_rows=n_rows, rows=rows)
        if probe is not None:
            queued = True
            for party in partners:
                have = yield Pending(kind=EMB, channels=(channel,), party=party)
                queued = queued and channel in have
            probe["q"] = queued
        deadline = (yield Now()) + self.emb_wait_s
        got: dict[str, Any] = self._held.pop((epoch, b), {}) if self._held else {}
        switched = skipped = False
        try:
            for party in partners:
                if party in got:
                    continue
                while True:
                    now = yield Now()
                    end = deadline if switch is None else min(deadline, now + SWITCH_CHECK_S)
                    r = yield from self._wait(EMB, channel, end - now, accept, worker=k,
                                              batch=b, party=party)
                    # data, the deadline, or a message from a later epoch. (Not "returned
                    # before end": a timer may fire a fraction of a millisecond early by
                    # the clock, and that once dropped a batch 50 ms into its wait.)
                    if r.msg is not None and r.msg.meta.get("skip") is True:
                        skipped = True  # the partner dropped the batch for the epoch
                        break
                    if r.msg is not None:
                        got[party] = r.msg
                        break
                    if r.later or (yield Now()) >= deadline:
                        break
                    if switch is not None and (yield from switch()):
                        switched = True
                        break
                if party not in got:
                    break
            if len(partners) > 1 and len(got) < len(partners) and not skipped:
                # the wait is over: take (and so hold) what the others have sent by now
                for party in partners:
                    if party not in got:
                        r = yield Poll(kind=EMB, channel=channel, accept=accept, party=party)
                        self.counters.stale += r.stale
                        if r.msg is not None and r.msg.meta.get("skip") is True:
                            skipped = True
                        elif r.msg is not None:
                            got[party] = r.msg
        except GeneratorExit:  # closed unfinished: nothing may be yielded any more
            raise
        except BaseException:  # (an interpreter's error or cancellation, thrown in)
            yield JoinPrefetch(worker=k)
            raise
        if probe is not None:
            probe["t_got"] = yield Now()
        yield JoinPrefetch(worker=k)
        if skipped or len(got) < len(partners):
            yield Discard(worker=k, key=b)
            return Miss(got, tuple(p for p in partners if p not in got), switched, skipped)
        msgs = tuple(got[p] for p in partners)
        loss = yield TopStep(worker=k, epoch=epoch, batch=b, embs=msgs, n_rows=n_rows,
                             grad_channel=channel, grad_metas=tuple(grad_meta(m) for m in msgs),
                             parties=partners, rows=rows,
                             held_since=probe.get("t_got") if probe is not None else None)
        c = self.counters
        c.samples += n_rows
        c.loss_sum += loss * n_rows
        c.loss_n += n_rows
        return msgs

    def _hold(self, epoch: int, b: int, got: dict[str, Any]) -> None:
        """Keep the embeddings that arrived for batch ``b``'s missed attempt (several
        partners only: with one, a miss has none)."""
        if got:
            self._held[(epoch, b)] = got

    def _release_held(self, epoch: int) -> None:
        """Forget what is held for ``epoch`` (its segment is over)."""
        if self._held:
            for key in [key for key in self._held if key[0] == epoch]:
                del self._held[key]


class ScheduledPassive(Strategy):
    """``pubsub`` / ``vfl`` passive: ``w`` workers take batches from the party's
    :class:`EpochSchedule`; each embeds, publishes, waits for the gradient (T_ddl), and
    back-propagates; a miss reassigns the batch (``max_reassign`` times).

    ``pubsub`` with ``inflight_max > 1``: each worker keeps up to the party's
    :class:`parties.algorithms.schedule.InflightWindow` size of batches in flight
    (:meth:`windowed_worker`)."""

    def __init__(self, cfg: StrategyConfig) -> None:
        super().__init__(cfg)
        #: the in-flight window (``pubsub`` with ``inflight_max > 1``), else None
        self.window: InflightWindow | None = None
        if cfg.algo == "pubsub" and cfg.inflight_max > 1:
            self.window = InflightWindow(cfg.inflight_max, cfg.workers, cfg.inflight_auto)
        #: an embedding's attempt id -> when it was published (its gradient's round trip)
        self._sent_at: dict[str, float] = {}
        self._epoch = -1
        #: the gradient deadline used, when the measured link raised it above T_ddl
        self.ddl_adjusted_s: float | None = None

    def segment(self, epoch: int, batches: Sequence[Any], seg: range) -> Proc:
        cfg = self.cfg
        sched = EpochSchedule(len(seg), cfg.max_reassign if cfg.drops else 0, ids=seg)
        if self.window is None:
            yield Gather(procs=tuple(self.worker(k, epoch, batches, sched)
                                     for k in range(cfg.workers)))
            return
        if epoch != self._epoch:
            if self._epoch >= 0:
                self.window.end_epoch(self._epoch)
            self._epoch = epoch
        self._sent_at.clear()  # (the last segment's batches have all settled)
        yield Gather(procs=tuple(self.windowed_worker(k, epoch, batches, sched)
                                 for k in range(cfg.workers)))

    def link_report(self) -> dict[str, Any] | None:
        """What the party measured of its link (:meth:`InflightWindow.report`) and the
        gradient deadline it used; None without a window."""
        win = self.window
        if win is None:
            return None
        if self._epoch >= 0:
            win.end_epoch(self._epoch)
            self._epoch = -1
        out = win.report()
        out["t_ddl"] = {"configured_s": self.cfg.t_ddl_s, "adjusted": self.ddl_adjusted_s
                        is not None, "effective_s": self.ddl_adjusted_s or self.cfg.t_ddl_s}
        return out

    def _grad_wait_s(self) -> Proc:
        """How long after its publication a batch's gradient is waited for: T_ddl, or,
        when the measured link cannot deliver within it, the window's
        :attr:`InflightWindow.deadline_floor_s` (logged once per raise)."""
        wait = self.cfg.data_wait_s
        win = self.window
        if not self.cfg.drops or win is None:
            return wait
        floor = win.deadline_floor_s
        if floor > wait and (self.ddl_adjusted_s is None or floor > 1.5 * self.ddl_adjusted_s):
            self.ddl_adjusted_s = floor
            yield Log(event="vfl.t_ddl_adjusted", level="warning",
                      fields={"side": "passive", "t_ddl_s": self.cfg.t_ddl_s,
                              "effective_s": floor, "rtt_s": win.rtt_all_s})
        return max(wait, self.ddl_adjusted_s or 0.0)

    def windowed_worker(self, k: int, epoch: int, batches: Sequence[Any],
                        sched: EpochSchedule) -> Proc:
        """``pubsub`` with an in-flight window: take a batch and publish its embedding
        while earlier ones await their gradients, up to the window's size; settle
        gradients in publication order as they arrive (a miss of the batch's deadline,
        counted from its publication, reassigns it as in :meth:`worker`).

        A batch published while others are in flight runs its forward on a snapshot of
        the replica's parameters (``Forward(snapshot=True)``, weight stashing as in
        PipeDream): its gradient is back-propagated through the parameters that made its
        embedding and applied to the current ones, so it is exact for that embedding and
        at most ``window - 1`` of the worker's own updates stale."""
        win = self.window
        assert win is not None
        out = StalenessWindow(self.cfg.inflight_max)  # this worker's batches, FIFO
        sent: dict[int, tuple[str, float, int, float]] = {}  # b -> uid, t_pub, attempt, fwd
        c = self.counters

        def settle(b: int, msg: Any) -> Proc:
            uid, t_pub, attempt, fwd_s = sent.pop(b)
            now = yield Now()
            if msg is not None and not msg.meta.get("skip"):
                # the attempt it answers (an earlier one's gradient may come late)
                t_sent = self._sent_at.pop(str(msg.meta.get("u")), t_pub)
                q, h = msg.meta.get("q"), msg.meta.get("h")
                held = float(h) if isinstance(h, (int, float)) and not isinstance(h, bool) \
                    and 0 <= h < now - t_sent else 0.0
                win.observe_rtt(now - t_sent - held,
                                queued=bool(q) if isinstance(q, int) else False)
                p = msg.meta.get("p")
                if isinstance(p, (int, float)) and not isinstance(p, bool):
                    win.observe_partner_period(float(p))
            if msg is not None:
                self._sent_at.pop(uid, None)
            outcome = yield from self._settle_grad(k, epoch, b, msg, len(batches[b]))
            if outcome == "applied":
                out.applied(b)
                win.observe_step(fwd_s + ((yield Now()) - now))
            else:
                out.given_up(b)
            win.settled()
            yield from self._close_attempt(sched, outcome, b, epoch, attempt)

        def wait_oldest() -> Proc:
            b = out.oldest()
            assert b is not None
            wait = yield from self._grad_wait_s()
            left = sent[b][1] + wait - (yield Now())
            r = yield from self._wait(GRAD, b, max(left, 1e-3),
                                      grad_acceptor(epoch, b, sent[b][0]), worker=k, batch=b)
            yield from settle(b, r.msg)

        try:
            while True:
                # settle the gradients already here, oldest first
                while (b_old := out.oldest()) is not None:
                    r = yield Poll(kind=GRAD, channel=b_old,
                                   accept=grad_acceptor(epoch, b_old, sent[b_old][0]))
                    c.stale += r.stale
                    if r.msg is None:
                        break
                    yield from settle(b_old, r.msg)
                out.bound = win.size
                if out.full:
                    yield from wait_oldest()
                    continue
                prefer = None
                if sched.retries:
                    ready = yield from self._ready(GRAD, sched.retry_ids(), epoch)
                    prefer = ready.__contains__
                task = sched.take(prefer)
                if task is None:
                    if out.outstanding:
                        yield from wait_oldest()
                    elif sched.done:
                        break
                    else:
                        yield WaitSchedule(ready=lambda: bool(sched.pending) or sched.done)
                    continue
                b, attempt = task
                rows = batches[b]
                t0 = yield Now()
                h = yield Forward(worker=k, epoch=epoch, batch=b, n_rows=len(rows),
                                  snapshot=bool(out.outstanding))
                t1 = yield Now()
                uid = f"{epoch}.{b}.{attempt}"
                meta: dict[str, Any] = {"e": epoch, "b": b, "a": attempt, "u": uid}
                if self.ddl_adjusted_s is not None:
                    meta["d"] = round(self.ddl_adjusted_s, 4)
                ok = yield Publish(kind=EMB, channel=b, meta=meta, arrays=(h,), rows=rows,
                                   worker=k, batch=b)
                if ok is False:  # the DP ledger refused this reassigned attempt
                    yield from self._drop_refused(k, sched, epoch, b, attempt)
                    continue
                out.issue(b)
                sent[b] = (uid, t1, attempt, t1 - t0)
                self._sent_at[uid] = t1
                win.issued(t1)
        finally:
            c.max_staleness = max(c.max_staleness, out.max_staleness)

    def worker(self, k: int, epoch: int, batches: Sequence[Any], sched: EpochSchedule) -> Proc:
        """Take a batch, publish its embedding, wait for its gradient, back-propagate."""
        while (task := (yield from self._next_task(sched, GRAD, epoch))) is not None:
            b, attempt = task
            rows = batches[b]
            h = yield Forward(worker=k, epoch=epoch, batch=b, n_rows=len(rows))
            uid = f"{epoch}.{b}.{attempt}"
            sent = yield Publish(kind=EMB, channel=b,
                                 meta={"e": epoch, "b": b, "a": attempt, "u": uid},
                                 arrays=(h,), rows=rows, worker=k, batch=b)
            if sent is False:
                yield from self._drop_refused(k, sched, epoch, b, attempt)
                continue
            r = yield from self._wait(GRAD, b, self.cfg.data_wait_s,
                                      grad_acceptor(epoch, b, uid), worker=k, batch=b)
            outcome = yield from self._settle_grad(k, epoch, b, r.msg, len(rows))
            yield from self._close_attempt(sched, outcome, b, epoch, attempt)


class ScheduledActive(Strategy):
    """``pubsub`` / ``vfl`` / ``avfl`` / ``avfl-ps`` active: take a batch, wait for its
    embedding (T_ddl), train, publish the gradient; a miss reassigns the batch
    (``pubsub``) or skips it (after ``max_reassign`` misses, or at once under AVFL) and
    tells the passive party so. Under ``pubsub`` with ``inflight_max > 1`` each gradient
    also reports what the passive party's in-flight window needs (:meth:`_grad_meta`,
    :meth:`_paced`; meta ``h`` is added by the interpreter)."""

    def segment(self, epoch: int, batches: Sequence[Any], seg: range) -> Proc:
        cfg = self.cfg
        # the active side of AVFL: no reassignment; a batch whose embedding misses
        # T_ddl is skipped (and the passive told so)
        again = cfg.max_reassign if cfg.drops and cfg.algo in ("pubsub", "vfl") else 0
        sched = EpochSchedule(len(seg), again, ids=seg)
        self._last_done = None  # (the gap since the last segment is no service time)
        try:
            yield Gather(procs=tuple(self.worker(k, epoch, batches, sched)
                                     for k in range(cfg.workers)))
        finally:
            self._release_held(epoch)

    def worker(self, k: int, epoch: int, batches: Sequence[Any], sched: EpochSchedule) -> Proc:
        accept = epoch_acceptor(epoch)
        drops = self.cfg.drops
        c = self.counters

        def retry_ready() -> Proc:
            ids = sched.retry_ids()
            if not ids:
                return False
            ready = yield from self._ready(EMB, ids, epoch)
            return sched.retry_ready(ready.__contains__)

        paced = self.cfg.inflight_max > 1  # report the pace for the passive windows
        while (task := (yield from self._next_task(sched, EMB, epoch))) is not None:
            b, attempt = task
            probe: dict[str, Any] | None = {} if paced else None
            out = yield from self._active_step(
                k, epoch, b, channel=b, accept=accept, n_rows=len(batches[b]),
                grad_meta=lambda m, b=b, probe=probe: self._grad_meta(epoch, b, m, probe),
                switch=retry_ready if drops else None, probe=probe)
            if probe is not None and not isinstance(out, Miss):
                raised = self._paced(probe, (yield Now()), out)
                if raised is not None:
                    yield Log(event="vfl.t_ddl_adjusted", level="warning",
                              fields={"side": "active", "t_ddl_s": self.cfg.t_ddl_s,
                                      "effective_s": raised, "batch": b, "epoch": epoch})
            if isinstance(out, Miss):
                if out.skipped:
                    # a passive party dropped the batch for the epoch (its DP reserve):
                    # give it up and release the others' wait for its gradient
                    sched.drop(b)
                    c.dropped += 1
                    c.give_up("partner_skipped")
                    yield Log(event="vfl.batch_dropped", level="warning",
                              fields={"batch": b, "epoch": epoch, "missing": "emb",
                                      "reassigned": False, "partner_skipped": True})
                    for party in self.cfg.partners:
                        yield Publish(kind=GRAD, channel=b, party=party,
                                      meta={"e": epoch, "b": b, "skip": True})
                    yield NotifySchedule()
                    continue
                if out.switched:
                    self._hold(epoch, b, out.got)
                    sched.release(b, attempt)  # back to the front; not a miss
                    c.switched += 1
                    continue
                if not drops:
                    raise (yield from self._stalled("emb", b, epoch, out.missing[0]))
                again = sched.fail(b, attempt)
                yield from self._count_miss(again, b, epoch, "emb", out.missing)
                if again:
                    self._hold(epoch, b, out.got)
                else:
                    c.give_up("emb_missed")
                    for party in self.cfg.partners:
                        yield Publish(kind=GRAD, channel=b, party=party,
                                      meta={"e": epoch, "b": b, "skip": True})
            else:
                sched.complete(b)
                c.batches += 1
            yield NotifySchedule()

    def _grad_meta(self, epoch: int, b: int, m: Any, probe: dict[str, Any] | None
                   ) -> dict[str, Any]:
        """A gradient's meta: epoch, batch, the embedding's attempt ``u``; with the pace
        (``probe``): ``q`` 1 when the embedding had queued here, ``p`` the party's
        seconds per batch (:meth:`_paced`)."""
        meta: dict[str, Any] = {"e": epoch, "b": b, "u": m.meta.get("u")}
        if probe is not None:
            meta["q"] = int(bool(probe.get("q")))
            if self._pace_s is not None:
                meta["p"] = round(self._pace_s, 7)
        return meta

    #: EWMA of the seconds between two trained batches of the party while its workers
    #: had embeddings queued (its pace: what it can serve); None before one
    _pace_s: float | None = None
    _last_done: float | None = None

    def _paced(self, probe: dict[str, Any], now: float, msgs: tuple[Any, ...]
               ) -> float | None:
        """After a trained batch: fold the time since the party's previous one into the
        pace (:attr:`_pace_s`) when this batch's embedding had queued (the party was
        busy: the interval is its service time, not the passive party's); when it had
        not (the party waited for it), decay the pace by 3 % (the passive windows then
        grow, and a faster pace shows once embeddings queue again). Take the passive
        party's deadline on the measured link (meta ``d``) as the embedding wait when it
        is the longer (at most 60 s); returns the new wait when it changed (else None)."""
        last, self._last_done = self._last_done, now
        if probe.get("q"):
            if last is not None:
                x = now - last
                self._pace_s = x if self._pace_s is None else self._pace_s + 0.125 * (
                    x - self._pace_s)
        elif self._pace_s is not None:
            self._pace_s *= 0.97
        raised = None
        for m in msgs:
            d = m.meta.get("d")
            if isinstance(d, (int, float)) and not isinstance(d, bool) and d > self.emb_wait_s \
                    and self.cfg.drops and self.emb_wait_s < 60.0:
                self.emb_wait_s = raised = min(float(d), max(60.0, self.cfg.data_wait_s))
        return raised


class AvflPassive(Strategy):
    """``avfl`` / ``avfl-ps`` passive: publish embeddings without waiting for their
    gradients, at most ``staleness_bound`` outstanding per worker; apply the gradients in
    publication order as they arrive (to the current parameters: a stale gradient); at
    the bound, wait for the oldest (T_ddl; a miss gives the batch up)."""

    def segment(self, epoch: int, batches: Sequence[Any], seg: range) -> Proc:
        queue = deque(seg)
        yield Gather(procs=tuple(self.worker(k, epoch, batches, queue)
                                 for k in range(self.cfg.workers)))

    def worker(self, k: int, epoch: int, batches: Sequence[Any], queue: deque[int]) -> Proc:
        win = StalenessWindow(self.cfg.staleness_bound)
        uids: dict[int, str] = {}
        c = self.counters

        def settle(b: int, msg: Any) -> Proc:
            outcome = yield from self._settle_grad(k, epoch, b, msg, len(batches[b]))
            if outcome == "applied":
                win.applied(b)
            else:
                win.given_up(b)
                c.give_up("grad_missed" if outcome == "missed" else "active_skipped")
                if outcome == "missed":
                    yield from self._count_miss(False, b, epoch, "grad")

        def wait_oldest() -> Proc:
            b = win.oldest()
            assert b is not None
            r = yield from self._wait(GRAD, b, self.cfg.data_wait_s,
                                      grad_acceptor(epoch, b, uids[b]), worker=k, batch=b)
            yield from settle(b, r.msg)

        try:
            while True:
                # settle gradients that are already here, oldest first (FIFO keeps
                # every gradient's staleness below the bound)
                while (b_old := win.oldest()) is not None:
                    r = yield Poll(kind=GRAD, channel=b_old,
                                   accept=grad_acceptor(epoch, b_old, uids[b_old]))
                    c.stale += r.stale
                    if r.msg is None:
                        break
                    yield from settle(b_old, r.msg)
                if win.full:
                    yield from wait_oldest()
                    continue
                if not queue:
                    break
                b = queue.popleft()
                rows = batches[b]
                h = yield Forward(worker=k, epoch=epoch, batch=b, n_rows=len(rows),
                                  snapshot=True)
                uids[b] = f"{epoch}.{b}.0"
                yield Publish(kind=EMB, channel=b,
                              meta={"e": epoch, "b": b, "a": 0, "u": uids[b]},
                              arrays=(h,), rows=rows, worker=k, batch=b)
                win.issue(b)
            while win.outstanding:
                yield from wait_oldest()
        finally:
            c.max_staleness = max(c.max_staleness, win.max_staleness)


class VflpsActive(Strategy):
    """``vfl-ps`` active parameter server: split each batch's IDs into one subset per
    worker pair and broadcast them; each worker trains its subset with its paired
    passive worker (channel k); then aggregate (all push, then all pull)."""

    def segment(self, epoch: int, batches: Sequence[Any], seg: range) -> Proc:
        w = self.cfg.workers
        for b in seg:
            parts = split_batch_ids(batches[b], w)
            ids, offsets = pack_ids(parts)
            yield Publish(kind=IDS, channel=None, meta={"e": epoch, "b": b},
                          arrays=(ids, offsets), batch=b)
            yield Gather(procs=tuple(self.pair(k, epoch, b, parts[k])
                                     for k in range(w) if len(parts[k])))
            self.counters.batches += 1
            yield Push(epoch=epoch, batch=b)
            yield Pull(epoch=epoch, batch=b)

    def pair(self, k: int, epoch: int, b: int, rows: Any) -> Proc:
        out = yield from self._active_step(
            k, epoch, b, channel=k, accept=batch_acceptor(epoch, b), n_rows=len(rows),
            grad_meta=lambda m: {"e": epoch, "b": b, "k": k, "u": m.meta.get("u")}, rows=rows)
        if isinstance(out, Miss):
            raise (yield from self._stalled("emb", b, epoch, out.missing[0]))


class VflpsPassive(Strategy):
    """``vfl-ps`` passive parameter server: for each batch, receive the active PS's ID
    subsets, let each paired worker embed its subset and back-propagate its gradient,
    then aggregate (all workers push, then all pull)."""

    def segment(self, epoch: int, batches: Sequence[Any], seg: range) -> Proc:
        w = self.cfg.workers
        for b in seg:
            r = yield from self._wait(IDS, None, self.cfg.data_wait_s,
                                      batch_acceptor(epoch, b), batch=b)
            if r.msg is None:
                raise (yield from self._stalled("ids", b, epoch))
            parts = unpack_ids(r.msg.arrays[0], r.msg.arrays[1])
            if len(parts) != w:
                raise ConfigMismatch({"pairs": w}, {"pairs": len(parts)})
            yield Gather(procs=tuple(self.pair(k, epoch, b, parts[k])
                                     for k in range(w) if len(parts[k])))
            yield Push(epoch=epoch, batch=b)
            yield Pull(epoch=epoch, batch=b)

    def pair(self, k: int, epoch: int, b: int, rows: Any) -> Proc:
        h = yield Forward(worker=k, epoch=epoch, batch=b, n_rows=len(rows), rows=rows, key=b)
        uid = f"{epoch}.{b}.{k}"
        yield Publish(kind=EMB, channel=k, meta={"e": epoch, "b": b, "k": k, "a": 0, "u": uid},
                      arrays=(h,), rows=rows, worker=k, batch=b)
        r = yield from self._wait(GRAD, k, self.cfg.data_wait_s,
                                  lambda m: 1 if m.meta.get("u") == uid else 0,
                                  worker=k, batch=b)
        if r.msg is None:
            raise (yield from self._stalled("grad", b, epoch))
        yield Backward(worker=k, epoch=epoch, key=b, msg=r.msg, n_rows=len(rows))
        self.counters.samples += len(rows)
        if k == 0:
            self.counters.batches += 1


def make_strategy(cfg: StrategyConfig) -> Strategy:
    """The strategy of ``cfg.algo`` x ``cfg.role``."""
    if cfg.algo == "vfl-ps":
        return VflpsActive(cfg) if cfg.role == "active" else VflpsPassive(cfg)
    if cfg.role == "active":
        return ScheduledActive(cfg)
    return ScheduledPassive(cfg) if cfg.algo in ("pubsub", "vfl") else AvflPassive(cfg)
