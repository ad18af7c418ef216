"""Property tests: MemoryBus agrees with a reference model of bounded FIFO topic buffers.

For random sequences of publishes (random payload sizes, several topics), loop turns and
takes, against random per-topic limits, the memory bus and the model agree on what each
topic holds (in order), on the eviction and overflow counters, and on the bound; at the
end every published message is accounted for: drops = published - taken - buffered.
"""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pubsub import BusConfig, MemoryBroker
from pubsub.buffer import BufferLimits

TOPICS = ("t/0", "t/1", "t/2")

sizes = st.one_of(st.integers(0, 300), st.integers(0, 9000))  # mostly small, some too big
ops = st.lists(
    st.one_of(
        st.tuples(st.just("pub"), st.integers(0, 2), sizes),
        st.tuples(st.just("pub"), st.integers(0, 2), sizes),
        st.tuples(st.just("tick"), st.just(0), st.just(0)),
        st.tuples(st.just("take"), st.integers(0, 2), st.just(0)),
    ),
    min_size=10, max_size=80,
)


class Model:
    """Reference semantics: FIFO eviction, a message over max_bytes is dropped alone."""

    def __init__(self, limits: BufferLimits) -> None:
        self.lim = limits
        self.q: dict[str, deque[tuple[int, int]]] = {t: deque() for t in TOPICS}
        self.in_flight: list[tuple[str, int, int]] = []
        self.evicted = 0
        self.too_large = 0

    def arrive(self) -> None:
        for topic, i, n in self.in_flight:
            q = self.q[topic]
            if n > self.lim.max_bytes:
                self.too_large += 1
                continue
            while q and (len(q) >= self.lim.max_msgs
                         or sum(b for _, b in q) + n > self.lim.max_bytes):
                q.popleft()
                self.evicted += 1
            q.append((i, n))
        self.in_flight.clear()


@given(ops=ops, max_msgs=st.integers(1, 5), max_bytes=st.integers(200, 8000),
       subscribed=st.sets(st.integers(0, 2), min_size=1))
def test_memory_bus_matches_the_buffer_model(ops: list[tuple[str, int, int]], max_msgs: int,
                                             max_bytes: int, subscribed: set[int]) -> None:
    limits = BufferLimits(max_msgs=max_msgs, max_bytes=max_bytes)
    model = Model(limits)

    async def run() -> None:
        async with MemoryBroker() as hub, hub.connect("p") as pub, \
                hub.connect("s", config=BusConfig(drain_burst=1024)) as sub:
            for k in sorted(subscribed):
                await sub.subscribe(TOPICS[k], limits=limits)
            published = taken = 0
            seq = 0
            for op, k, size in ops:
                topic = TOPICS[k]
                if op == "pub":
                    n = pub.publish_nowait(topic, [np.zeros(size, np.uint8)], {"i": seq})
                    if k in subscribed:
                        model.in_flight.append((topic, seq, n))
                        published += 1
                    seq += 1
                elif op == "tick":
                    await asyncio.sleep(0)
                    model.arrive()
                else:
                    got = sub.try_next(topic)
                    want = model.q[topic].popleft() if model.q[topic] else None
                    assert (got.meta["i"] if got else None) == (want[0] if want else None)
                    taken += got is not None
                for t in TOPICS:
                    assert sub.pending(t) == len(model.q[t]) <= limits.max_msgs
                    held = [(m.meta["i"], m.nbytes) for m in _peek_all(sub, t)]
                    assert held == list(model.q[t])
                    assert sum(b for _, b in held) <= limits.max_bytes
                st_ = sub.stats()
                assert st_.evicted == model.evicted
                assert st_.overflow_dropped == model.too_large
            await asyncio.sleep(0)
            model.arrive()
            st_ = sub.stats()
            buffered = sum(sub.pending(t) for t in TOPICS)
            assert st_.evicted + st_.overflow_dropped == published - taken - buffered
            assert st_.gaps == 0 and st_.unsolicited == 0

    asyncio.run(run())


def _peek_all(sub, topic: str) -> list:  # type: ignore[no-untyped-def]
    """Every buffered message of ``topic``, oldest first, left in place (try_next + unget)."""
    out = []
    while (m := sub.try_next(topic)) is not None:
        out.append(m)
    for m in reversed(out):
        sub.unget(m)
    return out


names = st.text(alphabet="ab/", min_size=1, max_size=5)


@given(exact=st.sets(names, max_size=4), prefixes=st.sets(names, max_size=3),
       published=st.lists(names, max_size=20))
def test_memory_bus_routes_exactly_like_the_reference_matcher(
        exact: set[str], prefixes: set[str], published: list[str]) -> None:
    """A message reaches a subscriber iff its topic equals an exact subscription or starts
    with a prefix subscription; per topic in publish order; nothing is unsolicited."""

    async def run() -> dict[str, list[int]]:
        async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
            for t in exact:
                await sub.subscribe(t, limits=BufferLimits(max_msgs=64, max_bytes=1 << 20))
            for p in prefixes:
                await sub.subscribe_prefix(p, limits=BufferLimits(max_msgs=64,
                                                                  max_bytes=1 << 20))
            for i, t in enumerate(published):
                pub.publish_nowait(t, [], {"i": i})
            await asyncio.sleep(0)
            assert sub.stats().unsolicited == 0
            return {t: [m.meta["i"] for m in _peek_all(sub, t)] for t in set(published)}

    got = asyncio.run(run())
    for t in set(published):
        wanted = t in exact or any(t.startswith(p) for p in prefixes)
        want = [i for i, x in enumerate(published) if x == t] if wanted else []
        assert got[t] == want, (t, exact, prefixes)
