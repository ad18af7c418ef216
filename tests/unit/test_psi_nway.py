"""N-way private ID alignment: the pure parts (final intersection, masks) and the
protocol over the in-process bus (pubsub.MemoryBroker)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub import MemoryBroker

from parties.alignment.align import AlignConfig, AlignTimeout
from parties.alignment.nway import EmptyIntersection, align_active, align_passive, pair_run_id
from parties.alignment.psi import (AlignResult, MalformedMask, aligned, apply_mask, final_masks,
                         select_ids)

ID = st.text(alphabet="abcdefgh0123", min_size=1, max_size=4)


def _pair(own: list[str], other: set[str]) -> AlignResult:
    """The two-party result of ``own`` against ``other`` (what PSI computes)."""
    mask = np.fromiter((x in other for x in own), bool, len(own))
    return aligned(own, mask, n_partner=len(other))


@settings(max_examples=30, deadline=None)
@given(active=st.lists(ID, unique=True, min_size=1, max_size=24),
       passive=st.lists(st.lists(ID, unique=True, min_size=1, max_size=24), min_size=2,
                        max_size=4))
def test_the_nway_result_is_the_set_intersection(active: list[str],
                                                 passive: list[list[str]]) -> None:
    names = ["passive", *(f"passive{k}" for k in range(2, len(passive) + 1))]
    # the active party's pairwise results, and each passive party's (same IDs, own rows)
    act_pairs = {p: _pair(active, set(ids)) for p, ids in zip(names, passive, strict=True)}
    pas_pairs = {p: _pair(ids, set(active)) for p, ids in zip(names, passive, strict=True)}
    final, masks = final_masks({p: r.ids for p, r in act_pairs.items()})
    want = tuple(sorted(set(active).intersection(*map(set, passive))))
    assert final == want
    got_active = select_ids(active, final, n_partner=0)
    assert got_active.ids == want and [active[r] for r in got_active.rows] == list(want)
    for p, ids in zip(names, passive, strict=True):
        assert masks[p].dtype == np.uint8 and len(masks[p]) == act_pairs[p].n_shared
        mine = apply_mask(pas_pairs[p], masks[p], party=p, n_final=len(final))
        assert mine.ids == want and [ids[r] for r in mine.rows] == list(want)
        assert mine.n_own == len(ids)


def test_final_masks_refuses_unsorted_lists_and_no_party() -> None:
    with pytest.raises(ValueError, match="'passive2'"):
        final_masks({"passive": ("a", "b"), "passive2": ("b", "a")})
    with pytest.raises(ValueError):
        final_masks({})


@pytest.mark.parametrize("mask, reason", [
    (np.array([1, 0], np.int64), "uint8"),
    (np.array([1, 0, 1, 1], np.uint8), "4 entries for 3"),
    (np.array([1, 2, 0], np.uint8), "0 or 1"),
    (np.array([1, 1, 0], np.uint8), "2 IDs kept, announced 1"),
])
def test_a_bad_mask_is_a_typed_error_naming_the_party(mask: np.ndarray, reason: str) -> None:
    res = _pair(["a", "b", "c", "d"], {"a", "b", "c"})
    with pytest.raises(MalformedMask, match=reason) as ei:
        apply_mask(res, mask, party="passive3", n_final=1)
    assert ei.value.party == "passive3" and "passive3" in str(ei.value)


def _cfg(**kw: float) -> AlignConfig:
    base = {"chunk_size": 16, "window": 2, "join_timeout_s": 10, "chunk_timeout_s": 10,
            "final_timeout_s": 10}
    return AlignConfig(**{**base, **kw})  # type: ignore[arg-type]


async def test_three_parties_align_over_the_memory_hub() -> None:
    ids_a = [f"c{i:03d}" for i in range(0, 40)]
    ids_p = [f"c{i:03d}" for i in range(10, 60)][::-1]
    ids_q = [f"c{i:03d}" for i in range(0, 100, 2)]
    cfg = _cfg()
    async with MemoryBroker() as hub:
        ra, rp, rq = await asyncio.gather(
            align_active(ids_a, passive=["passive", "passive2"], broker="", run_id="n3",
                         config=cfg, connect=hub.connect),
            align_passive(ids_p, party="passive", broker="", run_id="n3", config=cfg,
                          connect=hub.connect),
            align_passive(ids_q, party="passive2", broker="", run_id="n3", config=cfg,
                          connect=hub.connect))
        assert hub.stats().rejected == 0
    want = tuple(sorted(set(ids_a) & set(ids_p) & set(ids_q)))
    assert len(want) == 15
    for out, ids in ((ra, ids_a), (rp, ids_p), (rq, ids_q)):
        assert out.result.ids == want and [ids[r] for r in out.result.rows] == list(want)
    assert ra.n_pair_shared == {"passive": 30, "passive2": 20}
    assert rp.n_pair_shared == {"active": 30} and rq.n_pair_shared == {"active": 20}
    s = ra.summary()
    assert s["n_shared"] == 15 and set(s["pairs"]) == {"passive", "passive2"}
    assert pair_run_id("n3", "passive2") == "n3/passive2"


async def test_a_party_sharing_nothing_fails_every_party_naming_it() -> None:
    cfg = _cfg()
    async with MemoryBroker() as hub:
        outs = await asyncio.gather(
            align_active(["a", "b", "c"], passive=["passive", "passive2"], broker="",
                         run_id="e", config=cfg, connect=hub.connect),
            align_passive(["b", "c", "d"], party="passive", broker="", run_id="e",
                          config=cfg, connect=hub.connect),
            align_passive(["x", "y"], party="passive2", broker="", run_id="e", config=cfg,
                          connect=hub.connect),
            return_exceptions=True)
    assert all(isinstance(o, EmptyIntersection) for o in outs), outs
    assert outs[0].no_shared == ("passive2",) and "'passive2'" in str(outs[0])
    assert outs[1].party == "passive" and outs[1].no_shared == ()
    assert outs[2].no_shared == ("passive2",)


async def test_a_missing_passive_party_times_out_naming_it() -> None:
    cfg = _cfg(join_timeout_s=0.5, hello_interval_s=0.05)
    async with MemoryBroker() as hub:
        outs = await asyncio.gather(
            align_active(["a", "b"], passive=["passive", "passive2"], broker="", run_id="m",
                         config=cfg, connect=hub.connect),
            align_passive(["a", "b"], party="passive", broker="", run_id="m",
                          config=_cfg(chunk_timeout_s=1.0, final_timeout_s=1.0),
                          connect=hub.connect),
            return_exceptions=True)
    assert isinstance(outs[0], AlignTimeout) and outs[0].what == "passive2 hello", outs
    assert outs[0].topic == "psi/m/passive2/passive/hello"
    # the present party was left waiting (for the rest of its pair, or its mask): its own
    # deadline, naming the active party's message
    assert isinstance(outs[1], AlignTimeout) and outs[1].what.startswith("active "), outs
