"""Overflow policies against real broker processes, with a deliberately slow consumer.

``block``: backpressure end to end, everything arrives. ``drop``: losses happen and every
one of them is counted: delivered + evicted + overflow-dropped + sequence gaps = sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from pubsub import Bus, BusConfig, DeadlineExceeded
from pubsub.control import request_stats

from tests.conftest import BrokerProcess, wait_subscribed

N = 50_000
SMALL_HWM = ["--set", "sndhwm=1000", "--set", "rcvhwm=1000"]


@pytest.fixture(scope="module")
def blocking_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("bb"), "--set", "overflow=block", *SMALL_HWM)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def dropping_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("db"), *SMALL_HWM)
    yield b
    b.stop()


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _slow_consume(sub: Bus, topic: str, until_idle_s: float) -> list[int]:
    got: list[int] = []
    while True:
        try:
            m = await sub.next(topic, timeout_s=until_idle_s)
        except DeadlineExceeded:
            return got
        got.append(m.seq)
        _spin(20e-6)  # a consumer that needs ~20 µs per message


async def test_block_policy_delivers_every_message(blocking_broker: BrokerProcess) -> None:
    cfg = BusConfig(overflow="block", sndhwm=1000, rcvhwm=1000, publish_timeout_s=60)
    addr = blocking_broker.address
    async with Bus(addr, name="p", config=cfg) as pub, Bus(addr, name="s", config=cfg) as sub, \
            Bus(addr, name="watch") as watcher:
        await sub.subscribe("bp/1")
        await wait_subscribed(pub, sub, "bp/1")

        async def produce() -> None:
            for _ in range(N):
                await pub.publish("bp/1", [], None)

        consumer = asyncio.create_task(_slow_consume(sub, "bp/1", until_idle_s=3.0))
        t0 = time.perf_counter()
        await produce()
        got = await consumer
        elapsed = time.perf_counter() - t0
        assert len(got) == N, f"{N - len(got)} lost under block"
        assert got == sorted(got) and sub.stats().gaps == 0
        assert sub.stats().evicted == 0 and sub.stats().overflow_dropped == 0
        # backpressure really engaged: the reader paused (and the broker may have held)
        assert sub.stats().slow_episodes > 0
        assert request_stats(addr)["rejected"] == 0
        # liveness: control traffic and keepalive never stalled behind the data path
        assert watcher.broker_ok and pub.broker_ok and sub.broker_ok
        assert sub.stats().broker_losses == 0
        assert elapsed < 60


async def test_drop_policy_counts_every_loss(dropping_broker: BrokerProcess) -> None:
    cfg = BusConfig(sndhwm=1000, rcvhwm=1000)
    addr = dropping_broker.address
    async with Bus(addr, name="p", config=cfg) as pub, Bus(addr, name="s", config=cfg) as sub:
        await sub.subscribe("dp/1")
        await wait_subscribed(pub, sub, "dp/1")
        base = sub.stats()
        first_seq = pub._pub_seq["dp/1"] + 1
        consumer = asyncio.create_task(_slow_consume(sub, "dp/1", until_idle_s=2.0))
        for i in range(N):
            await pub.publish("dp/1", [], None)
            if i % 5000 == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(1.0)
        # a last message after the flood reveals any gap at the tail of the stream
        await pub.publish("dp/1", [], {"fin": True})
        got = await consumer
        st = sub.stats()
        sent = N + 1
        delivered = len([s for s in got if s >= first_seq])
        evicted = st.evicted - base.evicted
        dropped = st.overflow_dropped - base.overflow_dropped
        gaps = st.gaps - base.gaps
        assert evicted + dropped + gaps > 0, "the slow consumer should have lost messages"
        assert delivered + evicted + dropped + gaps == sent, (delivered, evicted, dropped, gaps)
