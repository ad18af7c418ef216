"""parties.algorithms.strategy: each algorithm x role driven by a scripted, synchronous fake
interpreter (no sockets, no asyncio, no torch): action sequences and counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    Publish,
    Pull,
    Push,
    Received,
    TopStep,
    WaitSchedule,
)
from parties.core.errors import ConfigMismatch, PartnerStalled
from parties.algorithms.schedule import pack_ids, split_batch_ids
from parties.algorithms.strategy import (
    SWITCH_CHECK_S,
    AvflPassive,
    ScheduledActive,
    ScheduledPassive,
    StrategyConfig,
    VflpsActive,
    VflpsPassive,
    grad_acceptor,
    make_strategy,
)
from tests.drive import drive


@dataclass
class M:
    """A message as a strategy sees one."""

    meta: dict[str, Any]
    arrays: tuple[Any, ...] = ()


def key(kind: str, channel: int | None, party: str = "") -> tuple[Any, ...]:
    """An inbox key: (kind, channel), with the party where one is named."""
    return (kind, channel, party) if party else (kind, channel)


@dataclass
class Fake:
    """A synchronous interpreter: Gather runs its generators one after another; Await
    and Poll answer from ``inbox`` (per (kind, channel), and party where one is named, in
    order) or time out (the clock then advances by the timeout); Pending answers from the
    inbox."""

    inbox: dict[tuple[Any, ...], list[M]] = field(default_factory=dict)
    t: float = 0.0
    actions: list[Any] = field(default_factory=list)
    #: called on each Publish (e.g. to script the partner's reply)
    on_publish: Callable[[Fake, Publish], None] | None = None

    def put(self, kind: str, channel: int | None, meta: dict[str, Any],
            arrays: tuple[Any, ...] = (), party: str = "") -> None:
        self.inbox.setdefault(key(kind, channel, party), []).append(M(meta, arrays))

    def _take(self, kind: str, channel: int | None, accept: Callable[[Any], int],
              party: str = "") -> Received:
        box = self.inbox.get(key(kind, channel, party), [])
        stale = 0
        while box:
            m = box[0]
            v = accept(m)
            if v < 0:
                return Received(later=True, stale=stale)
            box.pop(0)
            if v == 1:
                return Received(msg=m, stale=stale)
            stale += 1
        return Received(stale=stale)

    def run(self, proc: Any) -> Any:
        return drive(proc, self.handle, self.actions)

    def handle(self, a: Any) -> Any:
        if isinstance(a, Forward):
            return f"h{a.batch}"
        if isinstance(a, TopStep):
            return 0.5
        if isinstance(a, Now):
            return self.t
        if isinstance(a, Await):
            r = self._take(a.kind, a.channel, a.accept, a.party)
            if r.msg is None and not r.later:
                self.t += a.timeout_s
            return r
        if isinstance(a, Poll):
            return self._take(a.kind, a.channel, a.accept, a.party)
        if isinstance(a, Pending):
            return frozenset(c for c in a.channels if self.inbox.get(key(a.kind, c, a.party)))
        if isinstance(a, Gather):
            return [self.run(p) for p in a.procs]
        if isinstance(a, WaitSchedule):
            assert a.ready(), "a sequential fake cannot wait for another worker"
            return None
        if isinstance(a, Publish):
            if self.on_publish is not None:
                return self.on_publish(self, a)
            return None
        assert isinstance(a, (Backward, Discard, Prefetch, JoinPrefetch, NotifySchedule, Log,
                              Push, Pull, Flush)), a
        return None

    def of(self, *types: type) -> list[Any]:
        return [a for a in self.actions if isinstance(a, types)]


def cfg(algo: str, role: str, **kw: Any) -> StrategyConfig:
    base: dict[str, Any] = dict(algo=algo, role=role, workers=1, drops=True, data_wait_s=2.0,
                                max_reassign=1, staleness_bound=2, t_ddl_s=2.0)
    base.update(kw)
    return StrategyConfig(**base)


BATCHES = [np.arange(i * 4, i * 4 + 4) for i in range(4)]


def grad_reply(deliver: Callable[[Publish], dict[str, Any] | None]) -> Callable[[Fake, Publish], None]:
    """The active party's part, scripted: answer an embedding with ``deliver``'s meta (None:
    no gradient)."""

    def on_publish(f: Fake, p: Publish) -> None:
        if p.kind == EMB:
            meta = deliver(p)
            if meta is not None:
                f.put(GRAD, p.channel, meta)

    return on_publish


def echo_grad(p: Publish) -> dict[str, Any]:
    return {"e": p.meta["e"], "b": p.meta["b"], "u": p.meta["u"]}


# ---------------------------------------------------------------------------- factory
@pytest.mark.parametrize(("algo", "role", "kind"), [
    ("pubsub", "passive", ScheduledPassive), ("vfl", "passive", ScheduledPassive),
    ("pubsub", "active", ScheduledActive), ("avfl", "active", ScheduledActive),
    ("avfl-ps", "active", ScheduledActive), ("avfl", "passive", AvflPassive),
    ("avfl-ps", "passive", AvflPassive), ("vfl-ps", "active", VflpsActive),
    ("vfl-ps", "passive", VflpsPassive)])
def test_make_strategy_picks_the_algorithm_and_role(algo: str, role: str, kind: type) -> None:
    assert type(make_strategy(cfg(algo, role))) is kind


def test_config_rejects_bad_values_naming_them() -> None:
    with pytest.raises(ValueError, match="algo"):
        cfg("nope", "active")
    with pytest.raises(ValueError, match="role"):
        cfg("vfl", "both")
    with pytest.raises(ValueError, match="data_wait_s"):
        cfg("vfl", "active", data_wait_s=0.0)


# ---------------------------------------------------------------------------- pubsub passive
def test_passive_embeds_publishes_waits_and_backprops_each_batch() -> None:
    s = make_strategy(cfg("pubsub", "passive"))
    f = Fake(on_publish=grad_reply(echo_grad))
    f.run(s.segment(3, BATCHES, range(2)))
    kinds = [type(a).__name__ for a in f.actions]
    assert kinds == ["Gather"] + ["Forward", "Publish", "Await", "Backward",
                                  "NotifySchedule"] * 2
    pubs = f.of(Publish)
    assert [p.meta for p in pubs] == [{"e": 3, "b": 0, "a": 0, "u": "3.0.0"},
                                      {"e": 3, "b": 1, "a": 0, "u": "3.1.0"}]
    assert pubs[0].arrays == ("h0",) and pubs[0].rows is BATCHES[0]
    assert [a.timeout_s for a in f.of(Await)] == [2.0, 2.0]
    c = s.counters
    assert (c.batches, c.samples, c.dropped, c.reassigned) == (2, 8, 0, 0)


def test_passive_miss_reassigns_then_drops_after_max_reassign() -> None:
    s = make_strategy(cfg("pubsub", "passive", max_reassign=1))
    f = Fake(on_publish=grad_reply(lambda p: None if p.meta["b"] == 0 else echo_grad(p)))
    f.run(s.segment(0, BATCHES, range(2)))
    # batch 0: attempt 0 missed (reassigned), batch 1 done, batch 0 attempt 1 missed (dropped)
    assert [(p.meta["b"], p.meta["a"]) for p in f.of(Publish)] == [(0, 0), (1, 0), (0, 1)]
    assert [(d.worker, d.key) for d in f.of(Discard)] == [(0, 0), (0, 0)]
    logs = f.of(Log)
    assert [(x.event, x.fields["reassigned"]) for x in logs] == [
        ("vfl.batch_dropped", True), ("vfl.batch_dropped", False)]
    c = s.counters
    assert (c.batches, c.dropped, c.reassigned, c.skipped) == (1, 2, 1, 0)
    assert c.untrained == {"grad_missed": 1}  # the batch never trained, and why


def test_passive_skip_notice_drops_the_batch_without_a_miss() -> None:
    s = make_strategy(cfg("pubsub", "passive"))
    f = Fake(on_publish=grad_reply(lambda p: {"e": 0, "b": p.meta["b"], "skip": True}))
    f.run(s.segment(0, BATCHES, range(1)))
    assert len(f.of(Discard)) == 1 and not f.of(Backward)
    c = s.counters
    assert (c.batches, c.dropped, c.skipped, c.reassigned) == (0, 1, 1, 0)
    assert c.untrained == {"active_skipped": 1}


def test_passive_drops_a_reassigned_batch_its_dp_reserve_refuses_and_says_so() -> None:
    # the driver's Publish returns False when the DP ledger refuses a reassigned attempt
    # (a record's dp_reassign_reserve is spent): nothing was published; the batch is
    # dropped for the epoch (no further attempt) and the active party gets a skip notice
    s = make_strategy(cfg("pubsub", "passive", max_reassign=3))

    def on_publish(f: Fake, p: Publish) -> Any:
        if p.kind == EMB and p.arrays and p.meta["a"] > 0:
            return False
        if p.kind == EMB and p.arrays and p.meta["b"] == 1:
            f.put(GRAD, 1, echo_grad(p))
        return None

    f = Fake(on_publish=on_publish)
    f.run(s.segment(0, BATCHES, range(2)))
    pubs = [(p.meta["b"], p.meta.get("a"), p.meta.get("skip", False)) for p in f.of(Publish)]
    # batch 0 missed once, its reassigned attempt refused, then the notice; batch 1 trained
    assert pubs == [(0, 0, False), (1, 0, False), (0, 1, False), (0, None, True)]
    notice = f.of(Publish)[-1]
    assert notice.arrays == () and notice.rows is None and notice.channel == 0
    assert [(d.worker, d.key) for d in f.of(Discard)] == [(0, 0), (0, 0)]
    assert [x.fields["missing"] for x in f.of(Log)] == ["grad", "dp_reserve"]
    c = s.counters
    assert (c.batches, c.dropped, c.reassigned) == (1, 2, 1)
    assert c.untrained == {"dp_reserve": 1}


def test_active_gives_up_a_batch_its_passive_party_skipped() -> None:
    # the passive party's skip notice on the batch's embedding channel: no top step, no
    # reassignment, the batch is dropped and the passive party's gradient wait released
    s = make_strategy(cfg("pubsub", "active", max_reassign=3))
    f = Fake()
    f.put(EMB, 0, {"e": 0, "b": 0, "skip": True})
    f.put(EMB, 1, emb_meta(0, 1))
    f.run(s.segment(0, BATCHES, range(2)))
    assert [t.batch for t in f.of(TopStep)] == [1]
    skips = [p for p in f.of(Publish) if p.meta.get("skip")]
    assert [(p.kind, p.channel) for p in skips] == [(GRAD, 0)]
    c = s.counters
    assert (c.batches, c.dropped, c.skipped, c.reassigned) == (1, 1, 0, 0)
    assert c.untrained == {"partner_skipped": 1}


def test_passive_accepts_an_earlier_attempts_gradient_and_discards_stale_epochs() -> None:
    s = make_strategy(cfg("pubsub", "passive"))
    f = Fake()
    f.put(GRAD, 0, {"e": 4, "b": 0, "u": "4.0.0"})  # a previous epoch's: stale
    f.put(GRAD, 0, {"e": 5, "b": 0, "u": "5.0.7"})  # another attempt's: accepted
    f.run(s.segment(5, BATCHES, range(1)))
    assert len(f.of(Backward)) == 1 and f.of(Backward)[0].msg.meta["u"] == "5.0.7"
    assert s.counters.stale == 1 and s.counters.batches == 1


def test_grad_acceptor_rules() -> None:
    acc = grad_acceptor(2, 7, "2.7.1")
    assert acc(M({"e": 2, "b": 7, "u": "2.7.0"})) == 1
    assert acc(M({"e": 2, "b": 8, "u": "2.7.1"})) == 1
    assert acc(M({"e": 1, "b": 7})) == 0
    assert acc(M({"e": 2, "b": 8})) == 0
    assert acc(M({"e": 3, "b": 7})) == -1


def test_vfl_passive_silence_raises_partner_stalled_after_logging() -> None:
    s = make_strategy(cfg("vfl", "passive", drops=False, data_wait_s=30.0))
    f = Fake()
    with pytest.raises(PartnerStalled) as ei:
        f.run(s.segment(0, BATCHES, range(2)))
    assert ei.value.what == "grad" and ei.value.partner == "active"
    assert ei.value.waited_s == 30.0
    assert [x.event for x in f.of(Log)] == ["vfl.partner_stalled"]
    assert not f.of(Discard)


# ---------------------------------------------------------------------------- active
def emb_meta(e: int, b: int, a: int = 0) -> dict[str, Any]:
    return {"e": e, "b": b, "a": a, "u": f"{e}.{b}.{a}"}


def test_active_prefetches_waits_trains_and_names_the_gradient_after_the_embedding() -> None:
    s = make_strategy(cfg("pubsub", "active", drops=False, data_wait_s=30.0))
    f = Fake()
    for b in range(2):
        f.put(EMB, b, emb_meta(1, b))
    f.run(s.segment(1, BATCHES, range(2)))
    kinds = [type(a).__name__ for a in f.actions]
    step = ["Prefetch", "Now", "Now", "Await", "JoinPrefetch", "TopStep", "NotifySchedule"]
    assert kinds == ["Gather"] + step * 2
    tops = f.of(TopStep)
    assert [(t.grad_channel, t.grad_meta) for t in tops] == [
        (0, {"e": 1, "b": 0, "u": "1.0.0"}), (1, {"e": 1, "b": 1, "u": "1.1.0"})]
    c = s.counters
    assert (c.batches, c.samples, c.loss_n) == (2, 8, 8)
    assert c.loss_sum == pytest.approx(0.5 * 8, abs=1e-12)


def test_active_miss_skips_the_batch_and_tells_the_passive_party() -> None:
    s = make_strategy(cfg("avfl", "active", max_reassign=3))  # AVFL: never reassigned
    f = Fake()
    f.run(s.segment(0, BATCHES, range(1)))
    skip = [p for p in f.of(Publish) if p.kind == GRAD]
    assert [(p.channel, p.meta) for p in skip] == [(0, {"e": 0, "b": 0, "skip": True})]
    assert [(d.worker, d.key) for d in f.of(Discard)] == [(0, 0)]
    c = s.counters
    assert (c.batches, c.dropped, c.reassigned) == (0, 1, 0)
    assert c.untrained == {"emb_missed": 1}


def test_active_message_from_a_later_epoch_ends_the_wait_without_the_full_deadline() -> None:
    s = make_strategy(cfg("pubsub", "active", max_reassign=0, data_wait_s=2.0))
    f = Fake()
    f.put(EMB, 0, emb_meta(6, 0))  # the passive party is an epoch ahead
    f.run(s.segment(5, BATCHES, range(1)))
    assert f.t == 0.0  # no timeout was spent
    assert f.inbox[(EMB, 0)], "the later message is put back"
    assert s.counters.dropped == 1 and s.counters.batches == 0


def test_active_switches_to_a_reassigned_batch_whose_embedding_arrived() -> None:
    s = make_strategy(cfg("pubsub", "active", max_reassign=1, data_wait_s=1.0))
    f = Fake()
    # batch 0 misses once (reassigned); while the worker waits for batch 1, batch 0's
    # second embedding arrives: the worker gives batch 1 back and takes batch 0
    orig = f.handle
    sent = []

    def handle(a: Any) -> Any:
        if isinstance(a, Await) and a.channel == 1 and not sent:
            sent.append(True)
            f.put(EMB, 0, emb_meta(0, 0, 1))
        return orig(a)

    f.handle = handle  # type: ignore[method-assign]
    f.run(s.segment(0, BATCHES, range(2)))
    waits = f.of(Await)
    assert waits[0].channel == 0 and waits[0].timeout_s == pytest.approx(SWITCH_CHECK_S)
    # batch 0 waited out its whole deadline in SWITCH_CHECK_S slices
    assert sum(1 for w in waits if w.channel == 0) >= round(1.0 / SWITCH_CHECK_S)
    assert [p.channels for p in f.of(Pending)][:2] == [(0,), (0,)]
    c = s.counters
    assert c.switched == 1
    # batch 0 (attempt 1) trains after the switch; batch 1 then misses twice (no data)
    assert [t.batch for t in f.of(TopStep)] == [0]
    assert (c.batches, c.reassigned, c.dropped) == (1, 2, 3)
    assert [p.meta for p in f.of(Publish)] == [{"e": 0, "b": 1, "skip": True}]


def test_vfl_active_silence_raises_partner_stalled() -> None:
    s = make_strategy(cfg("vfl", "active", drops=False, data_wait_s=10.0))
    with pytest.raises(PartnerStalled) as ei:
        Fake().run(s.segment(0, BATCHES, range(1)))
    assert ei.value.what == "emb"


# ---------------------------------------------------------------------------- avfl passive
def test_avfl_passive_runs_ahead_to_the_bound_then_waits_for_the_oldest() -> None:
    s = make_strategy(cfg("avfl", "passive", staleness_bound=2))
    replies: list[Publish] = []
    f = Fake(on_publish=lambda ff, p: replies.append(p))  # gradients held back

    orig = f.handle

    def handle(a: Any) -> Any:
        if isinstance(a, Await):  # at the bound: release the oldest's gradient
            p = next(p for p in replies if p.meta["b"] == a.channel)
            f.put(GRAD, a.channel, echo_grad(p))
        return orig(a)

    f.handle = handle  # type: ignore[method-assign]
    f.run(s.segment(0, BATCHES, range(4)))
    seq = [(type(a).__name__, getattr(a, "batch", getattr(a, "channel", None)))
           for a in f.actions if isinstance(a, (Forward, Await, Backward))]
    assert seq == [("Forward", 0), ("Forward", 1), ("Await", 0), ("Backward", None),
                   ("Forward", 2), ("Await", 1), ("Backward", None), ("Forward", 3),
                   ("Await", 2), ("Backward", None), ("Await", 3), ("Backward", None)]
    assert [b.key for b in f.of(Backward)] == [0, 1, 2, 3]
    assert all(fw.snapshot for fw in f.of(Forward))
    assert s.counters.max_staleness == 1 and s.counters.batches == 4


def test_avfl_passive_miss_gives_the_batch_up_without_reassignment() -> None:
    s = make_strategy(cfg("avfl", "passive", staleness_bound=1))
    f = Fake()
    f.run(s.segment(0, BATCHES, range(2)))
    c = s.counters
    assert (c.dropped, c.reassigned, c.batches) == (2, 0, 0)
    assert c.untrained == {"grad_missed": 2}
    assert [d.key for d in f.of(Discard)] == [0, 1]


@settings(max_examples=60, deadline=None)
@given(bound=st.integers(1, 4), n=st.integers(1, 8),
       arrivals=st.lists(st.booleans(), min_size=40, max_size=40),
       fates=st.lists(st.sampled_from(["grad", "skip", "none"]), min_size=8, max_size=8))
def test_avfl_staleness_never_exceeds_the_bound(bound: int, n: int, arrivals: list[bool],
                                                fates: list[str]) -> None:
    """Property: whatever arrives when, every batch is settled exactly once (applied,
    skipped or missed) in publication order and no gradient is staler than bound − 1."""
    s = make_strategy(cfg("avfl", "passive", staleness_bound=bound))
    f = Fake()
    sent: dict[int, Publish] = {}
    f.on_publish = lambda ff, p: sent.__setitem__(p.meta["b"], p)
    tick = iter(arrivals * 10)
    orig = f.handle

    def deliver(b: int) -> None:
        p = sent[b]
        if fates[b] == "grad":
            f.put(GRAD, b, echo_grad(p))
        elif fates[b] == "skip":
            f.put(GRAD, b, {"e": 0, "b": b, "skip": True})

    def handle(a: Any) -> Any:
        if isinstance(a, Poll) and next(tick) and not f.inbox.get((GRAD, a.channel)):
            deliver(a.channel)
        if isinstance(a, Await) and not f.inbox.get((GRAD, a.channel)):
            deliver(a.channel)
        return orig(a)

    f.handle = handle  # type: ignore[method-assign]
    batches = [np.arange(3) for _ in range(n)]
    f.run(s.segment(0, batches, range(n)))
    settled = [a.key for a in f.of(Backward, Discard)]
    assert settled == list(range(n))
    c = s.counters
    assert c.max_staleness <= bound - 1
    assert c.batches == sum(fates[b] == "grad" for b in range(n))
    assert c.skipped == sum(fates[b] == "skip" for b in range(n))
    assert c.dropped == n - c.batches
    assert c.batches + sum(c.untrained.values()) == n  # no batch lost without a cause


# ---------------------------------------------------------------------------- pubsub property
@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 6), max_reassign=st.integers(0, 3),
       fates=st.lists(st.sampled_from(["grad", "skip", "none"]), min_size=30, max_size=30),
       inflight=st.sampled_from([1, 3]))
def test_pubsub_every_batch_completes_or_drops_exactly_once(n: int, max_reassign: int,
                                                            fates: list[str],
                                                            inflight: int) -> None:
    """Property: under any pattern of gradients, skip notices and misses, each batch of the
    epoch ends exactly once (completed or dropped) and misses are reassigned at most
    ``max_reassign`` times; with the synchronous worker and with an in-flight window."""
    s = make_strategy(cfg("pubsub", "passive", max_reassign=max_reassign,
                          inflight_max=inflight, inflight_auto=False))
    fate = iter(fates * 10)

    def deliver(p: Publish) -> dict[str, Any] | None:
        x = next(fate)
        return echo_grad(p) if x == "grad" else (
            {"e": 0, "b": p.meta["b"], "skip": True} if x == "skip" else None)

    f = Fake(on_publish=grad_reply(deliver))
    f.run(s.segment(0, BATCHES * 2, range(n)))
    c = s.counters
    done = [b.key for b in f.of(Backward)]
    assert len(done) == len(set(done)) == c.batches
    ended = c.batches + c.dropped - c.reassigned
    assert ended == n
    assert c.batches + sum(c.untrained.values()) == n  # no batch lost without a cause
    per_batch = [sum(1 for p in f.of(Publish) if p.meta["b"] == b) for b in range(n)]
    assert all(1 <= k <= max_reassign + 1 for k in per_batch)
    assert c.reassigned == sum(per_batch) - n


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), max_reassign=st.integers(0, 2),
       arrive=st.lists(st.booleans(), min_size=40, max_size=40))
def test_pubsub_active_every_batch_trains_or_skips_exactly_once(n: int, max_reassign: int,
                                                                arrive: list[bool]) -> None:
    s = make_strategy(cfg("pubsub", "active", max_reassign=max_reassign, data_wait_s=0.01))
    f = Fake()
    coin = iter(arrive * 10)
    tries: dict[int, int] = {}
    orig = f.handle

    def handle(a: Any) -> Any:
        if isinstance(a, Prefetch):
            tries[a.batch] = tries.get(a.batch, -1) + 1
            if next(coin):
                f.put(EMB, a.batch, emb_meta(0, a.batch, tries[a.batch]))
        return orig(a)

    f.handle = handle  # type: ignore[method-assign]
    f.run(s.segment(0, BATCHES * 2, range(n)))
    c = s.counters
    trained = [t.batch for t in f.of(TopStep)]
    skipped = [p.channel for p in f.of(Publish) if p.meta.get("skip")]
    assert len(trained) == len(set(trained)) == c.batches
    assert sorted(trained + skipped) == list(range(n))
    assert c.dropped - c.reassigned == len(skipped)
    assert c.untrained == ({"emb_missed": len(skipped)} if skipped else {})


# ---------------------------------------------------------------------------- vfl-ps
def test_vflps_active_broadcasts_id_subsets_trains_pairs_then_barrier() -> None:
    s = make_strategy(cfg("vfl-ps", "active", workers=2, drops=False, data_wait_s=9.0))
    f = Fake()
    for k in range(2):
        f.put(EMB, k, {"e": 0, "b": 0, "k": k, "a": 0, "u": f"0.0.{k}"})
    f.run(s.segment(0, BATCHES, range(1)))
    ids = f.of(Publish)[0]
    assert ids.kind == IDS and ids.meta == {"e": 0, "b": 0}
    want = pack_ids(split_batch_ids(BATCHES[0], 2))
    assert all(np.array_equal(x, y) for x, y in zip(ids.arrays, want, strict=True))
    tops = f.of(TopStep)
    assert [(t.worker, t.grad_channel, t.grad_meta["k"], list(t.rows)) for t in tops] == [
        (0, 0, 0, [0, 1]), (1, 1, 1, [2, 3])]
    assert [type(a).__name__ for a in f.actions[-2:]] == ["Push", "Pull"]
    assert s.counters.batches == 1 and s.counters.samples == 4


def test_vflps_passive_embeds_each_subset_on_its_pair_channel() -> None:
    s = make_strategy(cfg("vfl-ps", "passive", workers=2, drops=False, data_wait_s=9.0))
    ids, off = pack_ids(split_batch_ids(BATCHES[1], 2))
    f = Fake(on_publish=grad_reply(lambda p: {"e": 0, "b": 1, "k": p.meta["k"],
                                              "u": p.meta["u"]}))
    f.put(IDS, None, {"e": 0, "b": 0}, (ids, off))  # stale: an earlier batch
    f.put(IDS, None, {"e": 0, "b": 1}, (ids, off))
    f.run(s.segment(0, BATCHES, range(1, 2)))
    fw = f.of(Forward)
    assert [(a.worker, a.key, list(a.rows)) for a in fw] == [(0, 1, [4, 5]), (1, 1, [6, 7])]
    assert [p.channel for p in f.of(Publish)] == [0, 1]
    assert [type(a).__name__ for a in f.actions[-2:]] == ["Push", "Pull"]
    c = s.counters
    assert (c.batches, c.samples, c.stale) == (1, 4, 1)


def test_vflps_passive_rejects_a_different_pair_count() -> None:
    s = make_strategy(cfg("vfl-ps", "passive", workers=2, drops=False, data_wait_s=9.0))
    ids, off = pack_ids(split_batch_ids(BATCHES[0], 3))
    f = Fake()
    f.put(IDS, None, {"e": 0, "b": 0}, (ids, off))
    with pytest.raises(ConfigMismatch):
        f.run(s.segment(0, BATCHES, range(1)))


def test_vflps_passive_silence_raises_partner_stalled() -> None:
    s = make_strategy(cfg("vfl-ps", "passive", workers=2, drops=False, data_wait_s=9.0))
    with pytest.raises(PartnerStalled) as ei:
        Fake().run(s.segment(0, BATCHES, range(1)))
    assert ei.value.what == "ids"


def test_end_segment_flushes() -> None:
    f = Fake()
    f.run(make_strategy(cfg("pubsub", "active")).end_segment(7))
    assert f.actions == [Flush(epoch=7)]


# ---------------------------------------------------------------------------- several passive parties
TWO = ("passive", "passive2")


def test_active_with_two_partners_waits_for_both_and_fuses_them_in_party_order() -> None:
    s = make_strategy(cfg("pubsub", "active", drops=False, data_wait_s=30.0, partners=TWO))
    f = Fake()
    for b in range(2):  # passive2's arrive first: the order of arrival does not matter
        f.put(EMB, b, {**emb_meta(0, b), "u": f"q{b}"}, party="passive2")
        f.put(EMB, b, emb_meta(0, b), party="passive")
    f.run(s.segment(0, BATCHES, range(2)))
    assert [(w.party, w.channel) for w in f.of(Await)] == [
        ("passive", 0), ("passive2", 0), ("passive", 1), ("passive2", 1)]
    tops = f.of(TopStep)
    assert [t.parties for t in tops] == [TWO, TWO]
    assert [[m.meta["u"] for m in t.embs] for t in tops] == [["0.0.0", "q0"], ["0.1.0", "q1"]]
    assert [t.grad_metas for t in tops][0] == ({"e": 0, "b": 0, "u": "0.0.0"},
                                               {"e": 0, "b": 0, "u": "q0"})
    assert s.counters.batches == 2 and not s.counters.missed_by_party


def test_a_partner_missing_its_deadline_drops_the_batch_and_the_retry_keeps_the_others() -> None:
    s = make_strategy(cfg("pubsub", "active", max_reassign=1, data_wait_s=2.0, partners=TWO))
    f = Fake()
    f.put(EMB, 0, emb_meta(0, 0), party="passive")  # passive2's comes only for the retry
    orig = f.handle

    def handle(a: Any) -> Any:
        if isinstance(a, Log) and a.event == "vfl.batch_dropped":
            f.put(EMB, 0, emb_meta(0, 0, 1), party="passive2")
        return orig(a)

    f.handle = handle  # type: ignore[method-assign]
    f.run(s.segment(0, BATCHES, range(1)))
    # attempt 0 took passive's embedding and missed passive2's; attempt 1 waited for
    # passive2's only and trained on passive's held one
    at = next(i for i, x in enumerate(f.actions)
              if isinstance(x, Log) and x.event == "vfl.batch_dropped")
    assert [w.party for w in f.actions[:at] if isinstance(w, Await)][0] == "passive"
    assert {w.party for w in f.actions[at:] if isinstance(w, Await)} == {"passive2"}
    drop = [x for x in f.of(Log) if x.event == "vfl.batch_dropped"]
    assert [x.fields["parties"] for x in drop] == [["passive2"]]
    (top,) = f.of(TopStep)
    assert [m.meta["u"] for m in top.embs] == ["0.0.0", "0.0.1"]
    c = s.counters
    assert (c.batches, c.dropped, c.reassigned) == (1, 1, 1)
    assert c.missed_by_party == {"passive2": 1}
    assert not s._held, "nothing is held once the segment is over"


def test_a_skipped_batch_tells_every_partner() -> None:
    s = make_strategy(cfg("avfl", "active", partners=TWO))  # AVFL: a miss skips the batch
    f = Fake()
    f.put(EMB, 0, emb_meta(0, 0), party="passive2")
    f.run(s.segment(0, BATCHES, range(1)))
    skips = [(p.party, p.channel, p.meta) for p in f.of(Publish) if p.kind == GRAD]
    assert skips == [(p, 0, {"e": 0, "b": 0, "skip": True}) for p in TWO]
    assert s.counters.missed_by_party == {"passive": 1}
    assert not s._held


def test_lockstep_names_the_silent_partner() -> None:
    s = make_strategy(cfg("vfl", "active", drops=False, data_wait_s=10.0, partners=TWO))
    f = Fake()
    f.put(EMB, 0, emb_meta(0, 0), party="passive")
    with pytest.raises(PartnerStalled) as ei:
        f.run(s.segment(0, BATCHES, range(1)))
    assert (ei.value.partner, ei.value.what) == ("passive2", "emb")


def test_vflps_pairs_wait_for_every_partner_on_their_channel() -> None:
    s = make_strategy(cfg("vfl-ps", "active", workers=2, drops=False, data_wait_s=5.0,
                          partners=TWO))
    f = Fake()
    rows = BATCHES[0]
    for k in range(2):
        for p in TWO:
            f.put(EMB, k, {"e": 0, "b": 0, "k": k, "u": f"{p}.{k}"}, party=p)
    f.run(s.segment(0, BATCHES, range(1)))
    tops = f.of(TopStep)
    assert [(t.grad_channel, [m.meta["u"] for m in t.embs]) for t in tops] == [
        (0, ["passive.0", "passive2.0"]), (1, ["passive.1", "passive2.1"])]
    assert sum(t.n_rows for t in tops) == len(rows)


@pytest.mark.parametrize("kw, bad", [
    ({"role": "passive", "partners": TWO}, "only an active party"),
    ({"partners": ("passive", "passive")}, "distinct"),
    ({"partners": ()}, "distinct"),
    ({"partners": ("", "passive2")}, "each named"),
])
def test_strategy_config_rejects_bad_partners(kw: dict[str, Any], bad: str) -> None:
    base: dict[str, Any] = dict(algo="pubsub", role="active", workers=1, drops=True,
                                data_wait_s=1.0)
    with pytest.raises(ValueError, match=bad):
        StrategyConfig(**{**base, **kw})


def test_a_given_up_batch_needs_a_known_cause() -> None:
    c = make_strategy(cfg("pubsub", "active")).counters
    c.give_up("emb_missed")
    with pytest.raises(ValueError, match="cause must be one of"):
        c.give_up("lost")
    assert c.untrained == {"emb_missed": 1}
