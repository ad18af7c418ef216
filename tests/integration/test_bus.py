"""The bus against a real broker process on 127.0.0.1 (ephemeral ports)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from pubsub import Bus, BusConfig, DeadlineExceeded
from pubsub.buffer import BufferLimits
from pubsub.codec import encode
from pubsub.control import request_stats
from pubsub.errors import BrokerUnreachable, BusClosed, MessageTooLarge

from tests.conftest import BrokerProcess, raw_publisher, wait_subscribed


async def test_prefix_collision_emb_1_never_receives_emb_10(broker: BrokerProcess) -> None:
    async with Bus(broker.address, name="pub") as pub, Bus(broker.address, name="sub") as sub:
        await sub.subscribe("emb/1")
        await sub.subscribe("sync/x")
        await wait_subscribed(pub, sub, "sync/x")
        for topic in ("emb/10", "emb/1x", "emb/10/", "emb/1/", "emb/1"):
            await pub.publish(topic, [np.full(4, len(topic), np.float32)], {"t": topic})
        got = await sub.next("emb/1", timeout_s=2.0)
        assert got.meta["t"] == "emb/1"
        await asyncio.sleep(0.2)
        assert sub.pending("emb/1") == 0
        st = sub.stats()
        assert st.recv_msgs.get("emb") == 1 and st.unsolicited == 0


async def test_first_message_after_connect_is_delivered(broker: BrokerProcess) -> None:
    """A subscriber is up; a new publisher connects and immediately publishes once."""
    async with Bus(broker.address, name="sub") as sub:
        await sub.subscribe("first/0")
        await sub.subscribe("first/1")
        # the subscriber's own handshake proves its subscriptions reached the broker
        async with Bus(broker.address, name="sub-probe"):
            pass
        for i in range(2):
            async with Bus(broker.address, name=f"fresh{i}") as pub:
                await pub.publish(f"first/{i}", [np.arange(3)], {"i": i})
                msg = await sub.next(f"first/{i}", timeout_s=2.0)
                assert msg.meta == {"i": i}


async def test_deadline_expiry_raises_typed_error_quickly(broker: BrokerProcess) -> None:
    async with Bus(broker.address, name="d") as bus:
        await bus.subscribe("never/sent")
        t0 = time.perf_counter()
        with pytest.raises(DeadlineExceeded) as ei:
            await bus.next("never/sent", timeout_s=0.2)
        elapsed = time.perf_counter() - t0
        assert ei.value.topic == "never/sent" and ei.value.timeout_s == 0.2
        assert isinstance(ei.value, TimeoutError)
        assert 0.19 <= elapsed < 1.0


async def test_tight_deadlines_lose_no_message(broker: BrokerProcess) -> None:
    async with Bus(broker.address, name="p") as pub, Bus(broker.address, name="s") as sub:
        # a buffer big enough that only a deadline bug (not a slow, loaded consumer) can lose
        await sub.subscribe("stream/1", limits=BufferLimits(max_msgs=1000, max_bytes=1 << 24))
        await wait_subscribed(pub, sub, "stream/1")
        n = 500

        async def produce() -> None:
            for i in range(n):
                await pub.publish("stream/1", [], {"i": i})
                if i % 10 == 0:
                    await asyncio.sleep(0.001)

        task = asyncio.create_task(produce())
        seen: list[int] = []
        deadline = time.monotonic() + 10
        while len(seen) < n and time.monotonic() < deadline:
            try:
                m = await sub.next("stream/1", timeout_s=0.001)
            except DeadlineExceeded:
                continue
            seen.append(m.meta["i"])
        await task
        assert sub.stats().evicted == 0
        assert seen == list(range(n))


async def test_bounded_buffer_evicts_oldest_and_counts(broker: BrokerProcess) -> None:
    async with Bus(broker.address, name="p") as pub, Bus(broker.address, name="s") as sub:
        await sub.subscribe("evict/0", limits=BufferLimits(max_msgs=3, max_bytes=1 << 20))
        await wait_subscribed(pub, sub, "evict/0")
        before = sub.stats().recv_msgs.get("evict", 0)  # probes, late ones included
        for i in range(10):
            await pub.publish("evict/0", [], {"i": i})
        await pub.publish("evict/0", [], {"i": "end"})
        for _ in range(100):
            await asyncio.sleep(0.02)
            if sub.stats().recv_msgs.get("evict", 0) >= before + 11:
                break
        kept = []
        while (m := sub.try_next("evict/0")) is not None:
            kept.append(m.meta["i"])
        assert kept == [8, 9, "end"], (before, sub.stats().recv_msgs, sub.stats().evicted)
        assert sub.stats().evicted >= 8


async def test_byte_bound_limits_buffered_bytes(broker: BrokerProcess) -> None:
    cfg = BusConfig(topic_max_msgs=100, topic_max_bytes=300_000)
    async with Bus(broker.address, name="p") as pub, Bus(broker.address, name="s",
                                                        config=cfg) as sub:
        await sub.subscribe("big/0")
        await wait_subscribed(pub, sub, "big/0")
        for _ in range(6):
            await pub.publish("big/0", [np.zeros(100_000 // 4, np.float32)])
        await asyncio.sleep(0.3)
        assert sub.pending("big/0") == 2  # 2 x ~100 kB fit under 300 kB with the third arriving
        assert sub.stats().evicted == 4


async def test_malformed_frame_is_rejected_and_subscriber_keeps_working(
    raw_broker: BrokerProcess,
) -> None:
    async with Bus(raw_broker.address, name="s") as sub, Bus(raw_broker.address,
                                                             name="p") as pub:
        await sub.subscribe("bad/1")
        await wait_subscribed(pub, sub, "bad/1")
        with raw_publisher(raw_broker.address) as raw:
            good = [bytes(memoryview(f)) for f in encode("bad/1", [np.ones(4, np.float32)])]
            g = good[0]
            bad_frames = [
                [b"bad/1\x00"],  # no head
                [g[:12] + bytes([g[12] ^ 1]) + g[13:]],  # checksum mismatch (seq byte)
                [g[:-2]],  # payload size mismatch
                [g, b"extra"],  # payload frame not in the header
            ]
            before = sub.stats().rejected
            for _ in range(100):  # until the raw PUB has the subscription
                for frames in bad_frames:
                    raw.send_multipart(frames)
                await asyncio.sleep(0.02)
                if sub.stats().rejected - before >= len(bad_frames):
                    break
            assert sub.stats().rejected - before >= len(bad_frames)
            await pub.publish("bad/1", [np.arange(4, dtype=np.float32)], {"ok": True})
            msg = await sub.next("bad/1", timeout_s=2.0)
            while not msg.meta.get("ok"):
                msg = await sub.next("bad/1", timeout_s=2.0)
            np.testing.assert_array_equal(msg.arrays[0], np.arange(4, dtype=np.float32))


async def test_broker_rejects_and_counts_malformed_frames(broker: BrokerProcess) -> None:
    before = request_stats(broker.address)["rejected"]
    # a PUB socket sends only what someone subscribed to
    async with Bus(broker.address, name="s") as sub:
        await sub.subscribe("x/1")
        with raw_publisher(broker.address) as raw:
            for _ in range(50):
                raw.send_multipart([b"x/1\x00", b"\x01nope"])
                await asyncio.sleep(0.02)
                if request_stats(broker.address)["rejected"] > before:
                    break
        assert request_stats(broker.address)["rejected"] > before
        assert sub.stats().recv_msgs.get("x", 0) == 0  # never forwarded


async def test_unreachable_broker_fails_within_timeout() -> None:
    t0 = time.perf_counter()
    with pytest.raises(BrokerUnreachable) as ei:
        async with Bus("tcp://127.0.0.1:9", config=BusConfig(connect_timeout_s=0.5)):
            pass
    assert time.perf_counter() - t0 < 3.0
    assert "tcp://127.0.0.1:9" in str(ei.value)


async def test_close_is_idempotent_and_fails_waiters(broker: BrokerProcess) -> None:
    bus = Bus(broker.address, name="c")
    await bus.connect()
    await bus.subscribe("w/1")
    waiter = asyncio.create_task(bus.next("w/1", timeout_s=5.0))
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    await bus.close()
    await bus.close()
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(BusClosed):
        await waiter
    with pytest.raises(BusClosed):
        await bus.publish("w/1")


async def test_cancelled_waiter_does_not_lose_the_message(broker: BrokerProcess) -> None:
    async with Bus(broker.address, name="p") as pub, Bus(broker.address, name="s") as sub:
        await sub.subscribe("c/1")
        await wait_subscribed(pub, sub, "c/1")
        waiter = asyncio.create_task(sub.next("c/1", timeout_s=5.0))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await pub.publish("c/1", [], {"v": 1})
        with pytest.raises(asyncio.CancelledError):
            await waiter
        msg = await sub.next("c/1", timeout_s=2.0)
        assert msg.meta == {"v": 1}


async def test_broker_counts_bytes_by_channel(broker: BrokerProcess) -> None:
    async with Bus(broker.address, name="p") as pub, Bus(broker.address, name="s") as sub:
        await sub.subscribe_prefix("cnt/runA/")
        await wait_subscribed(pub, sub, "cnt/runA/sync")
        before = request_stats(broker.address)["namespace_bytes"].get("cnt/runA", 0)
        sent = 0
        for b in range(20):
            sent += await pub.publish(f"cnt/runA/{b}", [np.zeros(1000, np.float32)])
        for b in range(20):
            await sub.next(f"cnt/runA/{b}", timeout_s=2.0)
        after = request_stats(broker.address)["namespace_bytes"]["cnt/runA"]
        assert after - before == sent


async def test_broker_counts_sequence_gaps_per_namespace(broker: BrokerProcess) -> None:
    with raw_publisher(broker.address) as raw:
        async with Bus(broker.address, name="s") as sub:
            await sub.subscribe("gap/run/1")
            for _ in range(100):  # until the raw PUB holds the subscription
                raw.send_multipart(encode("gap/run/1", [], {"probe": 1}, seq=1, publisher="g"))
                await asyncio.sleep(0.02)
                if sub.try_next("gap/run/1") is not None:
                    break
            before = request_stats(broker.address)
            for seq in (2, 3, 7, 8, 10):  # 4, 5, 6 and 9 never sent
                raw.send_multipart(encode("gap/run/1", [], {}, seq=seq, publisher="g"))
            for _ in range(5):
                await sub.next("gap/run/1", timeout_s=2.0)
            after = request_stats(broker.address)
            assert after["gaps"] - before["gaps"] == 4
            assert after["namespace_gaps"]["gap/run"] - before["namespace_gaps"].get(
                "gap/run", 0) == 4
            assert sub.stats().gaps == 4


async def _until_received(raw: zmq.Socket, sub: Bus, topic: str, publisher: str) -> None:
    """Send a small valid message on ``raw`` until ``sub`` receives one: the broker's
    subscription has reached this raw socket (before, a PUB socket sends nothing)."""
    probe = encode(topic, [np.zeros(10, np.uint8)], {"probe": publisher}, seq=1,
                   publisher=publisher)
    deadline = time.monotonic() + 20
    while True:
        raw.send_multipart(probe)
        try:
            msg = await sub.next(topic, timeout_s=0.1)
            if msg.meta.get("probe") == publisher:
                return
        except DeadlineExceeded:
            pass
        assert time.monotonic() < deadline, "the raw publisher never got the subscription"


async def test_broker_rejects_messages_over_its_size_bound(tmp_path: Path) -> None:
    """The broker's bound (100,000 bytes here) holds three ways: a bus client learns it
    from the hello and refuses a larger publication itself (MessageTooLarge, nothing
    sent); a raw sender's single frame above it closes that sender's connection (libzmq
    reads the frame's size and disconnects before allocating it); a message whose frames
    are each within it but together above it is received, rejected and counted. The
    broker forwards the rest throughout."""
    b = BrokerProcess(tmp_path, "--set", "max_message_bytes=100000")
    try:
        async with Bus(b.address, name="p") as pub, Bus(b.address, name="s") as sub:
            await sub.subscribe("big/x")
            await wait_subscribed(pub, sub, "big/x")
            with pytest.raises(MessageTooLarge) as err:
                await pub.publish("big/x", [np.zeros(200_000, np.uint8)])
            assert err.value.max_bytes == 100_000 and err.value.size > 200_000
            with raw_publisher(b.address) as big:
                await _until_received(big, sub, "big/x", "raw-big")
                mon = big.get_monitor_socket(zmq.EVENT_DISCONNECTED)
                try:
                    big.send(b"big/x\0" + bytes(200_000))  # one frame above the bound
                    assert mon.poll(10_000), "the broker kept the oversize sender connected"
                    assert recv_monitor_message(mon)["event"] == zmq.EVENT_DISCONNECTED
                finally:
                    big.disable_monitor()
                    mon.close(0)
            frames = encode("big/x", [np.zeros(80_000, np.uint8)] * 2, {"raw": 1}, seq=1,
                            publisher="raw-multi")
            assert len(frames) == 3 and all(len(memoryview(f)) < 100_000 for f in frames)
            with raw_publisher(b.address) as multi:
                await _until_received(multi, sub, "big/x", "raw-multi")
                deadline = time.monotonic() + 10
                multi.send_multipart(frames)  # 160 kB over three frames
                while request_stats(b.address)["rejected"] < 1:
                    assert time.monotonic() < deadline, request_stats(b.address)
                    await asyncio.sleep(0.05)
            await pub.publish("big/x", [np.zeros(10, np.uint8)], {"small": True})
            msg = await sub.next("big/x", timeout_s=2.0)
            while not msg.meta.get("small"):
                assert msg.arrays == () or msg.arrays[0].size < 80_000
                msg = await sub.next("big/x", timeout_s=2.0)
            assert request_stats(b.address)["rejected"] == 1
    finally:
        b.stop()


async def test_mutating_a_published_array_never_corrupts_what_arrives(
    broker: BrokerProcess,
) -> None:
    """Large arrays are copied on publish by default (copy=True), so the owner may reuse
    its buffer at once; with copy=False ownership passes to the bus (zero-copy)."""
    async with Bus(broker.address, name="p") as pub, Bus(broker.address, name="s") as sub:
        await sub.subscribe("zc/1")
        await wait_subscribed(pub, sub, "zc/1")
        buf = np.zeros(1 << 20, np.float32)  # 4 MiB: far above the zero-copy threshold
        # 12 x 4 MiB stays under the subscriber's default 64 MiB per topic: with 20 the
        # oldest were evicted (correctly) whenever the reader drained the socket before
        # the first next(), which a loaded machine made likely
        n = 12
        for i in range(n):
            buf[:] = i
            await pub.publish("zc/1", [buf], {"i": i})
            buf[:] = -1  # the owner scribbles over its buffer right away
        for i in range(n):
            m = await sub.next("zc/1", timeout_s=5.0)
            a = m.arrays[0]
            assert m.meta["i"] == i and a[0] == i and a[-1] == i and (a == i).all()


async def test_an_error_while_handling_a_message_never_stalls_the_reader(
    broker: BrokerProcess,
) -> None:
    """ZMQ_FD is edge-like: an exception escaping the reader callback would leave queued
    messages unread forever. The reader counts the error and goes on."""
    async with Bus(broker.address, name="p") as pub, Bus(broker.address, name="s") as sub:
        await sub.subscribe("boom/1")
        await wait_subscribed(pub, sub, "boom/1")
        real = sub._deliver  # every message passes here (to a waiter or to the buffer)

        def flaky(msg):  # type: ignore[no-untyped-def]
            if msg.meta.get("i") == 1:
                raise RuntimeError("injected")
            real(msg)

        sub._deliver = flaky  # type: ignore[method-assign]
        for i in range(5):
            await pub.publish("boom/1", [], {"i": i})
        got = [(await sub.next("boom/1", timeout_s=2.0)).meta["i"] for _ in range(4)]
        assert got == [0, 2, 3, 4]  # 1 was lost to the injected error, and counted
        assert sub.stats().reader_errors == 1


async def test_oversize_publish_raises_at_the_sender_and_sends_nothing(broker) -> None:
    """80 MB against the 64 MiB default: MessageTooLarge before anything is sent, the
    topic's sequence not advanced (the next message is no gap), the client usable."""
    from pubsub import MessageTooLarge

    async with Bus(broker.address, name="big-pub") as pub, \
            Bus(broker.address, name="big-sub") as sub:
        await sub.subscribe("big/t")
        await wait_subscribed(pub, sub, "big/t")
        huge = np.zeros(20_000_000, np.float32)  # 80 MB
        with pytest.raises(MessageTooLarge) as err:
            await pub.publish("big/t", [huge])
        assert err.value.size > err.value.max_bytes == 64 << 20
        with pytest.raises(MessageTooLarge):
            pub.publish_nowait("big/t", [huge])
        await pub.publish("big/t", [np.ones(4, np.float32)], {"n": 1})
        msg = await sub.next("big/t", 5.0)
        assert msg.meta == {"n": 1} and sub.stats().gaps == 0


async def test_a_forked_child_cannot_use_the_parents_bus_and_a_fresh_one_works(
        broker) -> None:
    """The child's use of the inherited client raises ForkedClient, its close() leaves the
    parent's sockets alone, and a Bus the child creates itself works; the parent's
    reader goes on receiving (it got the child's message)."""
    import os

    from pubsub import ForkedClient

    async with Bus(broker.address, name="parent") as bus:
        await bus.subscribe("fork/t")
        await wait_subscribed(bus, bus, "fork/t")
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                refused = 0
                for call in (lambda: bus.publish_nowait("fork/t", (), {"x": 1}),
                             lambda: bus.try_next("fork/t")):
                    try:
                        call()
                    except ForkedClient:
                        refused += 1

                async def child() -> None:
                    await bus.close()  # only marks it closed here
                    async with Bus(broker.address, name="child") as fresh:
                        for _ in range(50):  # until the parent's subscription sees it
                            fresh.publish_nowait("fork/t", (), {"from": "child"})
                            await asyncio.sleep(0.05)

                asyncio.events._set_running_loop(None)  # the fork was inside the loop
                asyncio.run(child())
                code = 0 if refused == 2 else 2
            finally:
                os._exit(code)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not bus.closed
        msg = await bus.next("fork/t", 10.0)
        assert msg.meta == {"from": "child"}
