"""The partner in private ID alignment, over the in-process bus (pubsub.MemoryBroker): one
that sends malformed points fails the honest party with MalformedPoints naming the sender,
the chunk and the point (exit 4), never with the library's RuntimeError, on either side
of the two-party protocol and in the N-way one; and a long alignment reports its progress
(psi.progress) instead of staying silent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import numpy as np
import pytest
import structlog

from pubsub import MemoryBroker

from parties.alignment import align as align_mod
from parties.alignment.align import AlignConfig, align_over_bus
from parties.alignment.nway import align_active, align_passive
from parties.alignment.psi import MalformedPoints
from parties.runtime.exitcodes import ExitCode, exit_code_for

from sim.faults.psi_forge import forging

IDS_A = [f"c{i:03d}" for i in range(0, 40)]
IDS_B = [f"c{i:03d}" for i in range(10, 60)]
CFG = AlignConfig(chunk_size=16, window=2, join_timeout_s=10, chunk_timeout_s=10,
                  final_timeout_s=10)


async def _honest_fails(honest: Awaitable[Any], *others: Awaitable[Any]) -> MalformedPoints:
    """Run ``honest`` beside ``others``; its error once it fails (the others, left
    waiting for it, are cancelled)."""
    h = asyncio.ensure_future(honest)
    rest = [asyncio.ensure_future(o) for o in others]
    try:
        with pytest.raises(MalformedPoints) as ei:
            await asyncio.wait_for(h, 30)
    finally:
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
    return ei.value


@pytest.mark.parametrize("forger", ["active", "passive"])
async def test_a_forged_request_chunk_fails_the_honest_party_naming_the_sender(
        forger: str) -> None:
    honest = "passive" if forger == "active" else "active"
    ids = {"active": IDS_A, "passive": IDS_B}
    async with MemoryBroker() as hub:
        bad = forging(hub.connect, kind="req", chunk=1, point=5)
        err = await _honest_fails(
            align_over_bus(ids[honest], role=honest, broker="", run_id="f", config=CFG,
                           connect=hub.connect),
            align_over_bus(ids[forger], role=forger, broker="", run_id="f", config=CFG,
                           connect=bad))
    assert (err.sender, err.chunk, err.point) == (forger, 1, 5)
    assert err.what == f"{forger} req chunk 1"
    assert f"from the {forger} party in {forger} req chunk 1: point 5" in str(err)
    assert "not a point of P-256" in str(err)
    assert exit_code_for(err) is ExitCode.PARTNER


async def test_a_response_chunk_that_is_not_compressed_points_is_refused() -> None:
    bad_pt = np.zeros(33, np.uint8)
    bad_pt[0] = 4  # an uncompressed point's prefix, with the wrong length for one
    async with MemoryBroker() as hub:
        err = await _honest_fails(
            align_over_bus(IDS_A, role="active", broker="", run_id="r", config=CFG,
                           connect=hub.connect),
            align_over_bus(IDS_B, role="passive", broker="", run_id="r", config=CFG,
                           connect=forging(hub.connect, kind="resp", chunk=2, point=3,
                                           bad=bad_pt)))
    assert (err.sender, err.chunk, err.point) == ("passive", 2, 3)
    assert "prefix byte 4" in str(err) and "passive resp chunk 2" in str(err)


async def test_n_way_a_forging_passive_party_is_named_by_its_party_id() -> None:
    ids_q = [f"c{i:03d}" for i in range(0, 100, 2)]
    async with MemoryBroker() as hub:
        err = await _honest_fails(
            align_active(IDS_A, passive=["passive", "passive2"], broker="", run_id="n",
                         config=CFG, connect=hub.connect),
            align_passive(IDS_B, party="passive", broker="", run_id="n", config=CFG,
                          connect=hub.connect),
            align_passive(ids_q, party="passive2", broker="", run_id="n", config=CFG,
                          connect=forging(hub.connect, kind="req", chunk=0, point=0)))
    assert (err.sender, err.chunk, err.point) == ("passive2", 0, 0)
    assert "from the passive2 party in passive2 req chunk 0: point 0" in str(err)


async def test_progress_is_reported_per_party_with_counts_and_an_eta(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(align_mod, "PROGRESS_EVERY_S", 0.0)  # every chunk
    async with MemoryBroker() as hub:
        with structlog.testing.capture_logs() as logs:
            (ra, _), (rb, _) = await asyncio.gather(
                align_over_bus(IDS_A, role="active", broker="", run_id="g", config=CFG,
                               connect=hub.connect),
                align_over_bus(IDS_B[:5], role="passive", broker="", run_id="g", config=CFG,
                               connect=hub.connect))
    assert ra.n_shared == rb.n_shared == 5
    ev = [e for e in logs if e["event"] == "psi.progress"]
    mine = [e for e in ev if e["partner"] == "passive"]  # the active party's events
    # 3 own chunks of 16 IDs back, 1 partner chunk answered: one event per chunk
    assert len(mine) == 4, ev
    last = max(mine, key=lambda e: e["partner_chunks_answered"] + e["own_chunks_back"])
    assert (last["partner_chunks_answered"], last["partner_chunks"],
            last["own_chunks_back"], last["chunks"]) == (1, 1, 3, 3)
    assert last["eta_s"] == 0.0
    assert not any(x in repr(ev) for x in IDS_A + IDS_B)  # counts only, never IDs
