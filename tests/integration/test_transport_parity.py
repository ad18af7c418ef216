"""One scenario against a real broker (Bus) and the memory hub (MemoryBus): the
observable results (what each topic holds and in which order, counters, sizes, deadline
errors, wait_any) are equal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pubsub import Bus, BusConfig, DeadlineExceeded, MemoryBroker, Transport
from pubsub.buffer import BufferLimits
from pubsub.session import wait_any

from tests.conftest import BrokerProcess, wait_subscribed

SUB_CFG = BusConfig(topic_max_msgs=16, topic_max_bytes=200_000)
CLASSES = ("emb", "grad", "ctl")


async def scenario(connect: Callable[[str, BusConfig | None], Any]) -> dict[str, Any]:
    """Publish a fixed sequence and record everything a subscriber can observe."""
    async with connect("pub", None) as pub, connect("sub", SUB_CFG) as sub:
        assert isinstance(pub, Transport) and isinstance(sub, Transport)
        await sub.subscribe("emb/1", limits=BufferLimits(max_msgs=3, max_bytes=1 << 20))
        await sub.subscribe_prefix("grad/", limits=BufferLimits(max_msgs=2, max_bytes=200_000))
        await sub.subscribe("ctl/end")
        await sub.subscribe("sync/0")  # last: once it works, so do the ones above
        await wait_subscribed(pub, sub, "sync/0")
        before = sub.stats()
        sizes = {}
        for i in range(2):
            await pub.publish("emb/10", [np.full(4, i, np.float32)], {"i": i})
        for i in range(6):
            sizes[f"emb{i}"] = await pub.publish("emb/1", [np.full(8, i, np.float32)],
                                                 {"i": i})
        for i in range(3):
            pub.publish_nowait("grad/a", [np.arange(i + 1, dtype=np.int64)], {"i": i})
        pub.publish_nowait("grad/b", [np.zeros(300_000, np.uint8)], {"i": "big"})
        pub.publish_nowait("grad/b", [], {"i": "small"})
        await pub.publish("ctl/end", [], {"end": True})
        end = await sub.next("ctl/end", timeout_s=10.0)  # per-publisher order: all arrived
        obs: dict[str, Any] = {"end": end.meta, "sizes": sizes,
                               "pending": {t: sub.pending(t)
                                           for t in ("emb/1", "emb/10", "grad/a", "grad/b")}}
        first = await wait_any(sub, ["grad/b", "emb/1"], 1.0)
        obs["wait_any"] = (first.topic, first.meta, first.nbytes)
        sub.unget(first)
        held: dict[str, list[Any]] = {}
        for t in ("emb/1", "grad/a", "grad/b"):
            held[t] = []
            while (m := sub.try_next(t)) is not None:
                held[t].append((m.meta["i"], [a.tolist() for a in m.arrays], m.nbytes))
        obs["held"] = held
        try:
            await sub.next("emb/1", timeout_s=0.05)
            obs["deadline"] = None
        except DeadlineExceeded as exc:
            obs["deadline"] = (exc.topic, exc.timeout_s)
        after = sub.stats()
        obs["stats"] = {
            "evicted": after.evicted - before.evicted,
            "overflow_dropped": after.overflow_dropped - before.overflow_dropped,
            "unsolicited": after.unsolicited - before.unsolicited,
            "gaps": after.gaps - before.gaps,
            "recv_msgs": {c: after.recv_msgs.get(c, 0) - before.recv_msgs.get(c, 0)
                          for c in CLASSES},
            "recv_bytes": {c: after.recv_bytes.get(c, 0) - before.recv_bytes.get(c, 0)
                           for c in CLASSES},
        }
        ps = pub.stats()
        obs["sent"] = {c: ps.sent_msgs.get(c, 0) for c in CLASSES}
        return obs


async def test_bus_and_memory_bus_observe_the_same(broker: BrokerProcess) -> None:
    def real(name: str, cfg: BusConfig | None) -> Bus:
        return Bus(broker.address, name=name, config=cfg)

    real_obs = await scenario(real)

    async with MemoryBroker() as hub:
        def memory(name: str, cfg: BusConfig | None) -> Any:
            return hub.connect(name, config=cfg)

        mem_obs = await scenario(memory)

    assert mem_obs == real_obs
    # and the scenario exercised what it claims to
    assert real_obs["pending"] == {"emb/1": 3, "emb/10": 0, "grad/a": 2, "grad/b": 1}
    assert [h[0] for h in real_obs["held"]["emb/1"]] == [3, 4, 5]
    assert real_obs["wait_any"][1] == {"i": "small"}
    assert real_obs["stats"]["evicted"] == 4 and real_obs["stats"]["overflow_dropped"] == 1
    assert real_obs["deadline"] == ("emb/1", 0.05)
