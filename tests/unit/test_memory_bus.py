"""MemoryBroker / MemoryBus: the in-process bus has Bus's semantics (no sockets)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from pubsub import (
    Bus,
    BusClosed,
    BusConfig,
    DeadlineExceeded,
    InvalidTopic,
    MemoryBroker,
    MemoryBus,
    Transport,
)
from pubsub.buffer import BufferLimits
from pubsub.errors import PublishTimeout, PublishWouldBlock


async def test_exact_topics_never_match_longer_ones() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe("emb/1")
        pub.publish_nowait("emb/10", [], {"x": 10})
        pub.publish_nowait("emb/1", [], {"x": 1})
        msg = await sub.next("emb/1", timeout_s=1.0)
        assert msg.meta == {"x": 1}
        assert sub.pending("emb/10") == 0 and sub.stats().unsolicited == 0


async def test_prefix_subscription_buffers_per_exact_topic() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe_prefix("ff/r/", limits=BufferLimits(max_msgs=2, max_bytes=1 << 20))
        for i in range(3):
            pub.publish_nowait("ff/r/a", [], {"i": i})
        pub.publish_nowait("ff/r/b", [], {"i": 9})
        pub.publish_nowait("ff/x/a", [], {"i": -1})
        await asyncio.sleep(0)
        assert sub.pending("ff/r/a") == 2 and sub.pending("ff/r/b") == 1
        assert sub.pending("ff/x/a") == 0
        assert [sub.try_next("ff/r/a").meta["i"] for _ in range(2)] == [1, 2]
        assert sub.stats().evicted == 1
        await sub.unsubscribe_prefix("ff/r/")
        assert sub.pending("ff/r/b") == 0


async def test_delivery_goes_through_the_loop_not_the_publish_call() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe("t")
        pub.publish_nowait("t", [], {})
        assert sub.pending("t") == 0  # not delivered inside publish
        await asyncio.sleep(0)
        assert sub.pending("t") == 1


async def test_receivers_never_alias_the_publishers_arrays() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe("t")
        big = np.arange(50_000, dtype=np.float64)  # over the inline bound
        small = np.arange(4, dtype=np.int64)
        await pub.publish("t", [big, small], copy=False)
        big[:] = -1
        small[:] = -1
        msg = await sub.next("t", timeout_s=1.0)
        np.testing.assert_array_equal(msg.arrays[0], np.arange(50_000, dtype=np.float64))
        np.testing.assert_array_equal(msg.arrays[1], np.arange(4))
        assert not msg.arrays[0].flags.writeable and not msg.arrays[1].flags.writeable


async def test_two_receivers_get_separate_meta() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, \
            hub.connect("a") as a, hub.connect("b") as b:
        await a.subscribe("t")
        await b.subscribe("t")
        pub.publish_nowait("t", [], {"k": 1})
        ma, mb = await a.next("t", 1.0), await b.next("t", 1.0)
        ma.meta["k"] = 2
        assert mb.meta == {"k": 1}
        assert ma.nbytes == mb.nbytes > 0


async def test_deadline_raises_typed_error_and_never_loses_a_late_message() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe("t")
        with pytest.raises(DeadlineExceeded) as ei:
            await sub.next("t", timeout_s=0.01)
        assert ei.value.topic == "t" and ei.value.timeout_s == 0.01
        # a message published as the deadline fires (both due in the same loop turn) is
        # either returned by the waiter or stays buffered: never lost
        waiter = asyncio.ensure_future(sub.next("t", timeout_s=0.02))
        await asyncio.sleep(0)  # the waiter is registered, its timer armed
        time.sleep(0.03)  # block the loop past the deadline ...
        pub.publish_nowait("t", (), {"late": True})  # ... and deliver in the same turn
        try:
            got = await waiter
        except DeadlineExceeded:
            got = await sub.next("t", timeout_s=1.0)
        assert got.meta == {"late": True} and sub.pending("t") == 0


async def test_cancelled_waiter_puts_a_handed_over_message_back() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe("t")
        waiter = asyncio.ensure_future(sub.next("t", timeout_s=5.0))
        await asyncio.sleep(0)
        pub.publish_nowait("t", [], {"i": 1})
        pub.publish_nowait("t", [], {"i": 2})
        await asyncio.sleep(0)  # the reader hands message 1 to the waiter ...
        waiter.cancel()  # ... whose caller is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert [(await sub.next("t", 1.0)).meta["i"] for _ in range(2)] == [1, 2]


async def test_unget_puts_a_message_at_the_front() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe("t")
        for i in range(3):
            pub.publish_nowait("t", [], {"i": i})
        first = await sub.next("t", 1.0)
        sub.unget(first)
        assert sub.pending("t") == 3
        assert [sub.try_next("t").meta["i"] for _ in range(3)] == [0, 1, 2]
        assert sub.try_next("t") is None


async def test_byte_bound_and_oversized_message_are_counted() -> None:
    cfg = BusConfig(topic_max_msgs=100, topic_max_bytes=300_000)
    async with MemoryBroker() as hub, hub.connect("p") as pub, \
            hub.connect("s", config=cfg) as sub:
        await sub.subscribe("big")
        for _ in range(6):
            pub.publish_nowait("big", [np.zeros(100_000 // 4, np.float32)])
        pub.publish_nowait("big", [np.zeros(400_000 // 4, np.float32)])  # > topic bound
        await asyncio.sleep(0)
        st = sub.stats()
        assert sub.pending("big") == 2 and st.evicted == 4 and st.overflow_dropped == 1


async def test_hub_drops_messages_over_its_size_bound_and_receivers_see_a_gap() -> None:
    async with MemoryBroker(max_message_bytes=10_000) as hub, hub.connect("p") as pub, \
            hub.connect("s") as sub:
        await sub.subscribe("t")
        pub.publish_nowait("t", [np.zeros(100, np.uint8)], {"i": 0})
        pub.publish_nowait("t", [np.zeros(20_000, np.uint8)], {"i": 1})
        pub.publish_nowait("t", [], {"i": 2})
        assert [(await sub.next("t", 1.0)).meta["i"] for _ in range(2)] == [0, 2]
        assert sub.stats().gaps == 1 and hub.stats().rejected == 1


async def test_block_policy_backpressures_the_publisher() -> None:
    cfg = BusConfig(overflow="block", topic_max_msgs=2, rcvhwm=3, publish_timeout_s=0.2)
    async with MemoryBroker() as hub, hub.connect("p", config=cfg) as pub, \
            hub.connect("s", config=cfg) as sub:
        await sub.subscribe("t")
        sent = 0
        with pytest.raises(PublishWouldBlock):
            for _ in range(100):
                pub.publish_nowait("t", [], {"i": sent})
                sent += 1
                await asyncio.sleep(0)
        # 2 buffered + 1 held by the paused reader + 3 in the inbox
        assert sent == 6
        with pytest.raises(PublishTimeout):
            await pub.publish("t", [], {"i": sent})
        got = [(await sub.next("t", 1.0)).meta["i"] for _ in range(sent)]
        assert got == list(range(sent))
        st = sub.stats()
        assert st.evicted == 0 and st.gaps == 0 and st.slow_episodes >= 1


async def test_drop_policy_counts_inbox_overflow_as_gaps() -> None:
    cfg = BusConfig(rcvhwm=4)
    async with MemoryBroker() as hub, hub.connect("p") as pub, \
            hub.connect("s", config=cfg) as sub:
        await sub.subscribe("t")
        for i in range(10):
            pub.publish_nowait("t", [], {"i": i})
        await asyncio.sleep(0)
        got = []
        while (m := sub.try_next("t")) is not None:
            got.append(m.meta["i"])
        pub.publish_nowait("t", [], {"i": 10})
        got.append((await sub.next("t", 1.0)).meta["i"])
        assert got == [0, 1, 2, 3, 10]
        assert sub.stats().gaps == 6 and hub.stats().hwm_dropped == 6


async def test_close_is_idempotent_fails_waiters_and_later_calls() -> None:
    async with MemoryBroker() as hub:
        bus = hub.connect("s")
        async with bus:
            await bus.subscribe("t")
            waiter = asyncio.ensure_future(bus.next("t", timeout_s=5.0))
            await asyncio.sleep(0)
            await bus.close()
            await bus.close()
            with pytest.raises(BusClosed):
                await waiter
        assert bus.closed
        with pytest.raises(BusClosed):
            bus.publish_nowait("t")
        with pytest.raises(BusClosed):
            await bus.subscribe("u")
        with pytest.raises(BusClosed):
            await bus.next("t", 0.1)
        assert hub.stats().clients == 0


async def test_closing_the_hub_closes_its_clients() -> None:
    hub = MemoryBroker()
    async with hub:
        bus = await hub.connect("a").__aenter__()
    assert bus.closed and hub.closed
    with pytest.raises(BusClosed):
        await MemoryBus(hub, name="late").connect()


async def test_bad_topic_and_stats_by_class() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        with pytest.raises(InvalidTopic):
            await sub.subscribe("")
        with pytest.raises(InvalidTopic):
            pub.publish_nowait("a\x00b")
        await sub.subscribe("emb/1")
        n = pub.publish_nowait("emb/1", [np.zeros(8, np.float32)])
        await sub.next("emb/1", 1.0)
        assert pub.stats().sent_msgs == {"emb": 1} and pub.stats().sent_bytes == {"emb": n}
        assert sub.stats().recv_msgs == {"emb": 1} and sub.stats().recv_bytes == {"emb": n}


async def test_publish_threadsafe_arrives_in_order() -> None:
    async with MemoryBroker() as hub, hub.connect("p") as pub, hub.connect("s") as sub:
        await sub.subscribe("t")

        def worker() -> None:
            for i in range(20):
                pub.publish_threadsafe("t", [np.full(3, i)], {"i": i})

        th = threading.Thread(target=worker)
        th.start()
        await asyncio.to_thread(th.join, 5.0)
        got = [(await sub.next("t", 2.0)).meta["i"] for _ in range(20)]
        assert got == list(range(20))


async def test_publish_threadsafe_under_block_waits_for_room_in_order() -> None:
    cfg = BusConfig(overflow="block", topic_max_msgs=1, rcvhwm=2, publish_timeout_s=5.0)
    async with MemoryBroker() as hub, hub.connect("p", config=cfg) as pub, \
            hub.connect("s", config=cfg) as sub:
        await sub.subscribe("t")

        def worker() -> None:
            for i in range(20):
                pub.publish_threadsafe("t", [], {"i": i})

        th = threading.Thread(target=worker)
        th.start()
        await asyncio.to_thread(th.join, 5.0)
        got = [(await sub.next("t", 5.0)).meta["i"] for _ in range(20)]
        assert got == list(range(20)) and sub.stats().evicted == 0


def test_both_clients_satisfy_the_transport_protocol() -> None:
    hub = MemoryBroker()
    assert isinstance(MemoryBus(hub), Transport)
    assert isinstance(Bus("tcp://127.0.0.1:5555"), Transport)


def test_bad_hub_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_message_bytes"):
        MemoryBroker(max_message_bytes=0)


async def test_forged_sequence_numbers_cannot_inflate_the_gap_count() -> None:
    """A message with seq 2**62 from a forger is a seq anomaly, not 2**62 lost messages;
    real losses are counted per publisher."""
    from pubsub.codec import encode
    from pubsub.receiver import MAX_GAP_JUMP

    async with MemoryBroker() as hub, hub.connect("s") as sub:
        await sub.subscribe("t")
        for seq, who in ((1, "alice"), (3, "alice"), (1, "mallory"), (2**62, "mallory"),
                         (MAX_GAP_JUMP + 3, "bob"), (1, "bob")):
            sub._on_frames(encode("t", (), {"seq": seq}, seq=seq, publisher=who))
        st = sub.stats()
        assert st.gaps == 1 and st.gaps_by_publisher == {"alice": 1}
        assert st.seq_anomalies == 1  # mallory's jump; bob's first message starts his count
        assert sub.pending("t") == 6  # every message is still delivered


async def test_accept_only_drops_other_publishers_before_they_take_room() -> None:
    cfg = BusConfig(topic_max_msgs=2)
    async with MemoryBroker() as hub, hub.connect("partner") as partner, \
            hub.connect("mallory") as mallory, hub.connect("s", config=cfg) as sub:
        await sub.subscribe("emb/1")
        await sub.subscribe("other")
        sub.accept_only(partner.client_id, ["emb/1"])
        for i in range(10):  # a flood that would evict the partner's message
            mallory.publish_nowait("emb/1", (), {"i": i})
        partner.publish_nowait("emb/1", (), {"from": "partner"})
        mallory.publish_nowait("other", (), {"i": -1})  # other topics: anyone
        await asyncio.sleep(0)
        assert (await sub.next("emb/1", 1.0)).meta == {"from": "partner"}
        assert sub.pending("emb/1") == 0 and sub.pending("other") == 1
        st = sub.stats()
        assert st.foreign == 10 and st.evicted == 0
