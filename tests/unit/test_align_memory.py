"""Private ID alignment over the in-process bus (pubsub.MemoryBroker): the same protocol,
rendezvous and all, without a broker process."""

from __future__ import annotations

import asyncio

import pytest

from pubsub import MemoryBroker

from parties.alignment.align import AlignConfig, AlignMismatch, AlignTimeout, align_over_bus
from parties.alignment.psi import demo_ids


async def test_two_parties_align_over_the_memory_hub() -> None:
    a, b = demo_ids(200, 0.3, seed=3)
    cfg = AlignConfig(chunk_size=50, window=2, join_timeout_s=10, chunk_timeout_s=20)
    async with MemoryBroker() as hub:
        (ra, sa), (rb, sb) = await asyncio.gather(
            align_over_bus(a, role="active", broker="", run_id="m1", config=cfg,
                           connect=hub.connect),
            align_over_bus(b, role="passive", broker="", run_id="m1", config=cfg,
                           connect=hub.connect))
        assert hub.stats().rejected == 0 and hub.stats().hwm_dropped == 0
    want = tuple(sorted(set(a) & set(b)))
    assert ra.ids == rb.ids == want and len(want) == 60
    assert [a[r] for r in ra.rows] == list(want) and [b[r] for r in rb.rows] == list(want)
    assert sa.chunks_sent == 4 and sb.n_partner == 200 and sa.bytes_sent > 200 * 33


async def test_a_missing_partner_times_out_naming_its_hello() -> None:
    cfg = AlignConfig(join_timeout_s=0.3, hello_interval_s=0.05)
    async with MemoryBroker() as hub:
        with pytest.raises(AlignTimeout) as ei:
            await align_over_bus(["x", "y"], role="active", broker="", run_id="lonely",
                                 config=cfg, connect=hub.connect)
    assert ei.value.what == "passive hello" and ei.value.topic == "psi/lonely/passive/hello"


async def test_another_protocol_version_is_a_mismatch_on_our_side() -> None:
    cfg = AlignConfig(join_timeout_s=5, hello_interval_s=0.05)
    async with MemoryBroker() as hub, hub.connect("old") as old:
        await old.subscribe("psi/v/active/hello")

        async def old_partner() -> None:  # speaks a future protocol version
            for _ in range(40):
                old.publish_nowait("psi/v/passive/hello", (),
                                   {"from": "passive", "digest": "psi/v9", "v": 9,
                                    "seen": ["active"]})
                await asyncio.sleep(0.05)

        task = asyncio.create_task(old_partner())
        with pytest.raises(AlignMismatch) as ei:
            await align_over_bus(["x", "y"], role="active", broker="", run_id="v", config=cfg,
                                 connect=hub.connect)
        task.cancel()
    assert ei.value.what == "protocol version" and (ei.value.ours, ei.value.theirs) == (1, 9)
