"""pubsub.session over the in-memory bus: wait_any, rendezvous, call_until, Liveness."""

from __future__ import annotations

import asyncio

import pytest

from pubsub import DeadlineExceeded, MemoryBroker
from pubsub.errors import BusClosed, PeerLost, RendezvousTimeout, SettingsMismatch
from pubsub.session import (Liveness, answer_hellos, call_until, heartbeat, rendezvous,
                            wait_any, watch)


# ------------------------------------------------------------------ wait_any
async def test_wait_any_returns_the_first_and_loses_nothing() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe_many(["a", "b", "c"])
        waiting = asyncio.ensure_future(wait_any(sub, ["a", "b", "c"], 5.0))
        await asyncio.sleep(0)
        for topic, i in (("b", 1), ("a", 2), ("b", 3), ("c", 4)):
            pub.publish_nowait(topic, [], {"i": i})  # all handed over in one loop turn
        first = await waiting
        assert first.topic == "b" and first.meta["i"] == 1
        rest = {t: [m.meta["i"] for m in iter(lambda t=t: sub.try_next(t), None)]
                for t in ("a", "b", "c")}
        assert rest == {"a": [2], "b": [3], "c": [4]}


async def test_wait_any_takes_buffered_first_in_topic_order() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe_many(["a", "b"])
        pub.publish_nowait("b", [], {"i": 1})
        pub.publish_nowait("a", [], {"i": 2})
        await asyncio.sleep(0)
        assert (await wait_any(sub, ["a", "b"], 1.0)).topic == "a"
        assert (await wait_any(sub, ["a", "b"], 1.0)).topic == "b"


async def test_wait_any_deadline_names_every_topic() -> None:
    async with MemoryBroker() as hub, hub.connect("s") as sub:
        await sub.subscribe_many(["a", "b"])
        with pytest.raises(DeadlineExceeded) as ei:
            await wait_any(sub, ["a", "b"], 0.02)
        assert ei.value.topic == "a | b" and ei.value.timeout_s == 0.02
        with pytest.raises(ValueError):
            await wait_any(sub, [], 1.0)
        with pytest.raises(ValueError):
            await wait_any(sub, ["a"], -1.0)


async def test_wait_any_raises_bus_closed() -> None:
    async with MemoryBroker() as hub, hub.connect("s") as sub:
        await sub.subscribe_many(["a", "b"])
        waiting = asyncio.ensure_future(wait_any(sub, ["a", "b"], 5.0))
        await asyncio.sleep(0)
        await sub.close()
        with pytest.raises(BusClosed):
            await waiting


# ------------------------------------------------------------------ rendezvous
async def _pair(hub: MemoryBroker, digests: tuple[str, str], timeout_s: float = 5.0,
                start_b_after_s: float = 0.0) -> tuple[object, object]:
    async def side(me: str, other: str, digest: str, delay: float) -> object:
        await asyncio.sleep(delay)
        async with hub.connect(me) as bus:
            await bus.subscribe(f"hello/{me}")
            try:
                return await rendezvous(bus, me=me, peers=[other], digest=digest,
                                        say=[f"hello/{other}"], hear=[f"hello/{me}"],
                                        timeout_s=timeout_s, interval_s=0.02,
                                        info={"role": me}, mismatch_linger_s=0.1)
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                return exc

    return tuple(await asyncio.gather(side("a", "b", digests[0], 0.0),
                                      side("b", "a", digests[1], start_b_after_s)))


async def test_rendezvous_completes_on_both_sides_with_a_late_joiner() -> None:
    async with MemoryBroker() as hub:
        ra, rb = await _pair(hub, ("d1", "d1"), start_b_after_s=0.1)
    assert isinstance(ra, dict) and isinstance(rb, dict), (ra, rb)
    assert ra["b"]["role"] == "b" and rb["a"]["role"] == "a"
    assert ra["b"]["digest"] == "d1" and "a" in ra["b"]["seen"]


async def test_rendezvous_mismatch_fails_both_sides() -> None:
    async with MemoryBroker() as hub:
        ra, rb = await _pair(hub, ("d1", "d2"), timeout_s=3.0)
    assert isinstance(ra, SettingsMismatch) and isinstance(rb, SettingsMismatch), (ra, rb)
    assert (ra.peer, ra.mine, ra.theirs) == ("b", "d1", "d2")
    assert (rb.peer, rb.mine, rb.theirs) == ("a", "d2", "d1")
    assert ra.hello["role"] == "b"


async def test_rendezvous_times_out_naming_the_peer() -> None:
    async with MemoryBroker() as hub, hub.connect("a") as bus:
        await bus.subscribe("hello/a")
        with pytest.raises(RendezvousTimeout) as ei:
            await rendezvous(bus, me="a", peers=["b", "c"], digest="d", say=["hello/b"],
                             hear=["hello/a"], timeout_s=0.1, interval_s=0.02)
        assert ei.value.peer == "b" and ei.value.timeout_s == 0.1
        assert ei.value.missing == ("b", "c")
        with pytest.raises(ValueError):
            await rendezvous(bus, me="a", peers=["a"], digest="d", say=[], hear=["x"],
                             timeout_s=1.0)


async def test_rendezvous_of_three_on_one_topic() -> None:
    names = ["a", "b", "c"]
    async with MemoryBroker() as hub:
        async def side(me: str) -> dict:  # type: ignore[type-arg]
            async with hub.connect(me) as bus:
                await bus.subscribe("hello")
                out = await rendezvous(bus, me=me, peers=[n for n in names if n != me],
                                       digest="d", say=["hello"], hear=["hello"],
                                       timeout_s=5.0, interval_s=0.02)
                await asyncio.sleep(0.1)  # keep answering until all are done
                return out

        res = await asyncio.gather(*(side(n) for n in names))
    assert [sorted(r) for r in res] == [["b", "c"], ["a", "c"], ["a", "b"]]


class _LosesFinalHellos:
    """A bus on which this side hears a peer only once the peer lists it as seen, and
    whose hellos that list a peer as seen (the final one among them) are lost while
    ``said`` <= 10,000 -- as to a broker restart as the handshake ends. It counts the
    hellos it publishes. Not ``lossy``: nothing is lost or held back."""

    def __init__(self, bus: object, lossy: bool = True) -> None:
        self._bus = bus
        self.said = 0 if lossy else 10_001
        self.lossy = lossy

    def __getattr__(self, name: str) -> object:
        return getattr(self._bus, name)

    def publish_nowait(self, topic: str, arrays: object, meta: dict,  # type: ignore[type-arg]
                       **kw: object) -> None:
        self.said += 1
        if not meta.get("seen") or self.said > 10_000:
            self._bus.publish_nowait(topic, arrays, meta, **kw)  # type: ignore[attr-defined]

    def try_next(self, topic: str) -> object:
        while (msg := self._bus.try_next(topic)) is not None:  # type: ignore[attr-defined]
            if msg.meta.get("seen") or not self.lossy:
                return msg
        return None

    async def next(self, topic: str, timeout_s: float) -> object:
        end = asyncio.get_running_loop().time() + timeout_s
        while True:
            left = max(0.0, end - asyncio.get_running_loop().time())
            msg = await self._bus.next(topic, left)  # type: ignore[attr-defined]
            if msg.meta.get("seen") or not self.lossy:
                return msg


@pytest.mark.parametrize("answering", [True, False])
async def test_a_lost_final_hello_is_answered_after_the_rendezvous(answering: bool) -> None:
    """Side a completes, its hellos that tell b it was heard are lost: b completes only
    if a answers b's later hellos (answer_hellos; the control without it times out)."""
    async with MemoryBroker() as hub:
        async def a() -> None:
            async with hub.connect("a") as raw:
                await raw.subscribe("hello/a")
                bus = _LosesFinalHellos(raw)
                greeting = {"me": "a", "peers": ["b"], "digest": "d", "say": ["hello/b"],
                            "info": {"role": "a"}}
                await rendezvous(bus, **greeting, hear=["hello/a"],  # type: ignore[arg-type]
                                 timeout_s=5.0, interval_s=0.02)
                if answering:
                    bus.said = 10_001  # from now on nothing is lost
                    answer = asyncio.ensure_future(
                        answer_hellos(bus, **greeting, hear=["hello/a"]))  # type: ignore[arg-type]
                await asyncio.sleep(1.0)
                if answering:
                    answer.cancel()

        async def b() -> object:
            await asyncio.sleep(0.05)
            async with hub.connect("b") as bus:
                await bus.subscribe("hello/b")
                try:
                    return await rendezvous(bus, me="b", peers=["a"], digest="d",
                                            say=["hello/a"], hear=["hello/b"],
                                            timeout_s=0.6, interval_s=0.02)
                except RendezvousTimeout as exc:
                    return exc

        _, rb = await asyncio.gather(a(), b())
    if answering:
        assert isinstance(rb, dict) and rb["a"]["done"] is True, rb
    else:
        assert isinstance(rb, RendezvousTimeout) and rb.missing == ("a",), rb


async def test_completed_sides_do_not_echo_each_other() -> None:
    """Both completed and answering: final hellos are not answered, so the exchange
    stops (a few answers at most, not one per round trip)."""
    async with MemoryBroker() as hub:
        async def side(me: str, other: str) -> int:
            async with hub.connect(me) as raw:
                await raw.subscribe(f"hello/{me}")
                bus = _LosesFinalHellos(raw, lossy=False)
                greeting = {"me": me, "peers": [other], "digest": "d",
                            "say": [f"hello/{other}"]}
                await rendezvous(bus, **greeting, hear=[f"hello/{me}"],  # type: ignore[arg-type]
                                 timeout_s=5.0, interval_s=0.02)
                before = bus.said
                answer = asyncio.ensure_future(
                    answer_hellos(bus, **greeting, hear=[f"hello/{me}"]))  # type: ignore[arg-type]
                await asyncio.sleep(0.5)
                answer.cancel()
                return bus.said - before

        answers = await asyncio.gather(side("a", "b"), side("b", "a"))
    assert max(answers) <= 3, answers


async def test_answering_peers_and_a_late_joiner_do_not_make_a_hello_storm() -> None:
    """a meets b (on time) and c (late); b, done, answers a's hellos meanwhile. A hello
    heard must not be echoed one for one (each of a's hellos goes to two peers and
    comes back answered: a storm that starved a real run): a says hello about every
    interval and at news, whatever b answers."""
    interval_s = 0.02
    async with MemoryBroker() as hub:
        async def a() -> tuple[int, float]:
            async with hub.connect("a") as raw:
                await raw.subscribe("hello/a")
                bus = _LosesFinalHellos(raw, lossy=False)
                loop = asyncio.get_running_loop()
                t0, before = loop.time(), bus.said
                await rendezvous(bus, me="a",  # type: ignore[arg-type]
                                 peers=["b", "c"], digest="d",
                                 say=["hello/b", "hello/c"], hear=["hello/a"],
                                 timeout_s=10.0, interval_s=interval_s)
                return bus.said - before, loop.time() - t0

        async def peer(me: str, delay_s: float) -> None:
            await asyncio.sleep(delay_s)
            async with hub.connect(me) as bus:
                await bus.subscribe(f"hello/{me}")
                greeting = {"me": me, "peers": ["a"], "digest": "d", "say": ["hello/a"]}
                await rendezvous(bus, **greeting, hear=[f"hello/{me}"],  # type: ignore[arg-type]
                                 timeout_s=10.0, interval_s=interval_s)
                answer = asyncio.ensure_future(
                    answer_hellos(bus, **greeting, hear=[f"hello/{me}"]))  # type: ignore[arg-type]
                await asyncio.sleep(1.0)
                answer.cancel()

        (said, took_s), _, _ = await asyncio.gather(a(), peer("b", 0.0), peer("c", 0.4))
    rounds = took_s / interval_s + 1  # periodic hellos, each to both peers ...
    assert said <= 2 * (rounds + 3), (said, took_s)  # ... + news of b, of c, the final


# ------------------------------------------------------------------ call_until
async def test_call_until_repeats_and_lets_accept_act_on_others() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as p, hub.connect("c") as c:
        await p.subscribe_many(["answer", "rollcall"])
        await c.subscribe("hello")
        said, rolls = [], []

        async def coordinator() -> None:
            await c.next("hello", 2.0)
            await c.next("hello", 2.0)  # a repeat: the party says hello every interval
            c.publish_nowait("rollcall", [], {})
            await asyncio.sleep(0.01)
            c.publish_nowait("answer", [], {"ok": 1})

        def accept(msg):  # type: ignore[no-untyped-def]
            if msg.topic == "rollcall":
                rolls.append(msg)
                return False
            return True

        task = asyncio.ensure_future(coordinator())
        msg = await call_until(p, say=lambda: said.append(p.publish_nowait("hello")),
                               hear=["answer", "rollcall"], peer="coordinator",
                               timeout_s=5.0, interval_s=0.02, accept=accept)
        await task
        assert msg.meta == {"ok": 1} and len(rolls) == 1 and len(said) >= 2
        with pytest.raises(RendezvousTimeout) as ei:
            await call_until(p, say=lambda: None, hear=["answer"], peer="coordinator",
                             timeout_s=0.05, interval_s=0.02)
        assert ei.value.peer == "coordinator"


# ------------------------------------------------------------------ liveness
async def test_watch_raises_peer_lost_when_beats_stop() -> None:
    async with MemoryBroker() as hub, hub.connect("a") as a, hub.connect("b") as b:
        await a.subscribe("hb/b")
        beat = asyncio.ensure_future(heartbeat(b, "hb/b", me="b", interval_s=0.01))
        watcher = asyncio.ensure_future(watch(a, {"b": "hb/b"}, timeout_s=0.1))
        await asyncio.sleep(0.3)
        assert not watcher.done()  # beats keep it alive
        beat.cancel()
        with pytest.raises(PeerLost) as ei:
            await asyncio.wait_for(watcher, 2.0)
        assert ei.value.peer == "b" and ei.value.silent_s == 0.1


async def test_liveness_guard_cancels_work_when_a_peer_is_lost() -> None:
    async with MemoryBroker() as hub, hub.connect("a") as a, hub.connect("b") as b:
        await a.subscribe("hb/b")
        await b.subscribe("hb/a")
        cancelled = asyncio.Event()

        async def forever() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async with Liveness(b, me="b", beat_topic="hb/b", watch={"a": "hb/a"},
                            interval_s=0.01, timeout_s=1.0):
            async with Liveness(a, me="a", beat_topic="hb/a", watch={"b": "hb/b"},
                                interval_s=0.01, timeout_s=0.1) as live:
                assert await live.guard(asyncio.sleep(0.2, result=7)) == 7  # b alive
                assert live.lost is None
        # b's Liveness has stopped beating: a new watcher on a loses it
        async with Liveness(a, me="a", beat_topic="hb/a", watch={"b": "hb/b"},
                            interval_s=0.01, timeout_s=0.1) as live:
            with pytest.raises(PeerLost) as ei:
                await live.guard(forever())
            assert ei.value.peer == "b" and cancelled.is_set()
            assert (await live.wait_lost()) is live.lost
            with pytest.raises(PeerLost):
                live.check()
        await live.close()  # idempotent
