"""N-way private ID alignment: one active party and several passive parties.

The PSI of :mod:`parties.alignment.align` is two-party. With several passive parties, each passive
party runs it with the active party, one session per passive party, each under its own
pair namespace ``psi/<run>/<party>/`` (:func:`pair_run_id`; the run stays the topic's
second segment, and the passive party's id is the next, so the broker's run membership
keeps each pair's topics away from the other passive parties). The active party then
intersects the N - 1 pairwise results (:func:`parties.alignment.psi.final_masks`) and tells each
passive party which of its pairwise-shared IDs are in every party's set:

======================================  ==================================================
``psi/R/<party>/active/final``          ``uint8 (n_shared,)``: 1 for each of the pair's
                                        shared IDs (sorted) in the final intersection;
                                        meta ``{n_shared, n_final}``; repeated every
                                        ``hello_interval_s`` until acknowledged
``psi/R/<party>/passive/final-ack``     meta ``{n_final}`` (the count the party kept)
======================================  ==================================================

What each party learns: a passive party, its intersection with the active party and the
active party's set size (as in the two-party protocol), then which of those IDs are in
every party's set (the final intersection); the active party, each pairwise
intersection and each passive party's set size. No passive party learns anything of
another passive party's IDs beyond the final intersection (the pairs' keys are
independent, and a pair's topics are readable by its two parties only).

Every wait has a deadline (:class:`parties.alignment.align.AlignTimeout` names the missing party
and message). An empty final intersection fails every party with
:class:`EmptyIntersection` (the active party names the passive parties that share no
ID with it), after the masks have been delivered, so nobody waits for nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from pubsub import Transport
from pubsub.errors import DeadlineExceeded
from pubsub.security import CurveClient

from parties.alignment.align import (
    AlignConfig,
    AlignMismatch,
    AlignStats,
    AlignTimeout,
    _next,
    align_over_bus,
    topics,
)
from parties.alignment.psi import (
    AlignError,
    AlignResult,
    MalformedMask,
    apply_mask,
    check_ids,
    final_masks,
    select_ids,
)

log = structlog.get_logger(__name__)

Connect = Callable[[str], AbstractAsyncContextManager[Transport]]


class EmptyIntersection(AlignError, ValueError):
    """No ID is held by every party (N-way alignment).

    Attributes:
        party: the party reporting it.
        no_shared: the passive parties that share no ID with the active party (as far as
            ``party`` knows: the active party knows every pair, a passive party its own).
    """

    def __init__(self, party: str, no_shared: Sequence[str]) -> None:
        self.party = party
        self.no_shared = tuple(no_shared)
        if self.no_shared:
            who = ", ".join(repr(p) for p in self.no_shared)
            why = (f"passive part{'ies' if len(self.no_shared) > 1 else 'y'} {who} "
                   "share(s) no ID with the active party")
        else:
            why = "the pairwise intersections have no ID in common"
        super().__init__(f"no ID is held by every party ({party} party): {why}")


@dataclass(frozen=True, slots=True, kw_only=True)
class NwayResult:
    """One party's N-way alignment output.

    Attributes:
        party: its party id.
        result: the final IDs (sorted) and this party's rows of them.
        pairs: the cost of each pairwise session, by partner (the active party: one per
            passive party; a passive party: ``{"active": ...}``).
        n_pair_shared: by partner, the size of the pairwise intersection.
        seconds: wall time of the whole alignment, seconds.
    """

    party: str
    result: AlignResult
    pairs: Mapping[str, AlignStats]
    n_pair_shared: Mapping[str, int]
    seconds: float

    def summary(self) -> dict[str, Any]:
        """JSON-ready counts, times and bytes (never IDs): ``align-<party>.json``."""
        pairs = {p: s.as_dict() for p, s in self.pairs.items()}
        return {
            "role": "active" if self.party == "active" else "passive", "party": self.party,
            "n_own": self.result.n_own, "n_shared": self.result.n_shared,
            "n_pair_shared": dict(self.n_pair_shared), "seconds": self.seconds,
            "crypto_s": sum(s.crypto_s for s in self.pairs.values()),
            "crypto_cpu_s": sum(s.crypto_cpu_s for s in self.pairs.values()),
            "bytes_sent": sum(s.bytes_sent for s in self.pairs.values()),
            "bytes_received": sum(s.bytes_received for s in self.pairs.values()),
            "loop_lag_max_s": max(s.loop_lag_max_s for s in self.pairs.values()),
            "pairs": pairs,
        }


def pair_run_id(run_id: str, party: str) -> str:
    """The topic namespace of the session between the active party and ``party``:
    ``<run>/<party>`` (topics ``psi/<run>/<party>/<role>/...``)."""
    return f"{run_id}/{party}"


def _final_topics(run_id: str, party: str) -> tuple[str, str]:
    """``(mask topic, ack topic)`` of ``party``'s pair."""
    pair = pair_run_id(run_id, party)
    return topics(pair, "active")["prefix"] + "final", topics(pair, "passive")["prefix"] + \
        "final-ack"


async def _deliver_mask(bus: Transport, *, run_id: str, party: str, mask: np.ndarray,
                        n_final: int, cfg: AlignConfig) -> None:
    """Publish ``party``'s mask every ``hello_interval_s`` until it acknowledges.

    Raises:
        AlignTimeout: no acknowledgement within ``chunk_timeout_s``.
        AlignMismatch: the party kept another number of IDs.
    """
    mask_topic, ack_topic = _final_topics(run_id, party)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.chunk_timeout_s
    meta = {"n_shared": len(mask), "n_final": n_final}
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise AlignTimeout(f"{party} final ack", ack_topic, cfg.chunk_timeout_s)
        await bus.publish(mask_topic, [mask], meta)
        try:
            ack = await bus.next(ack_topic, timeout_s=min(cfg.hello_interval_s, left))
        except DeadlineExceeded:
            continue
        if ack.meta.get("n_final") != n_final:
            raise AlignMismatch(f"the final count of the {party} party", n_final,
                                ack.meta.get("n_final"))
        return


async def _first_error(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Wait for every task; at the first failure cancel the rest and raise it."""
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


async def align_active(ids: Sequence[str], *, passive: Sequence[str], broker: str,
                       run_id: str, config: AlignConfig | None = None,
                       security: CurveClient | None = None,
                       connect: Connect | None = None) -> NwayResult:
    """The active party's side of N-way alignment: one PSI per passive party, at once.

    Args:
        ids: own IDs, input order (non-empty unique ``str``).
        passive: the passive parties' ids (``passive``, ``passive2``, ...), at least two.
        broker / run_id / config / security / connect: as
            :func:`parties.alignment.align.align_over_bus` (``run_id`` without the pair suffix).

    Returns:
        The final IDs (in every party's set, sorted) with this party's rows.

    Raises:
        EmptyId, DuplicateIds: bad own IDs (before anything is sent).
        AlignTimeout: a message did not arrive in time (names the party and message).
        AlignMismatch, MalformedPoints: a party disagreed or sent a bad chunk.
        EmptyIntersection: no ID is in every party's set (names the passive parties
            sharing none with this one), raised after every mask was acknowledged.
    """
    cfg = config or AlignConfig()
    if len(passive) < 2 or len(set(passive)) != len(passive):
        raise ValueError(f"N-way alignment needs two or more distinct passive parties, got "
                         f"{list(passive)!r}")
    own = check_ids(ids)
    t0 = time.perf_counter()
    loop = asyncio.get_running_loop()
    pair_results: dict[str, AlignResult] = {}
    stats: dict[str, AlignStats] = {}
    masks_ready: asyncio.Future[tuple[tuple[str, ...], dict[str, np.ndarray]]] = \
        loop.create_future()
    blog = log.bind(role="active", run_id=run_id)

    async def pair(party: str) -> None:
        async def after(bus: Transport, result: AlignResult) -> None:
            pair_results[party] = result
            blog.info("psi.pair_done", partner=party, n_shared=result.n_shared)
            if len(pair_results) == len(passive) and not masks_ready.done():
                try:
                    masks_ready.set_result(await asyncio.to_thread(
                        final_masks, {p: pair_results[p].ids for p in passive}))
                except Exception as exc:  # noqa: BLE001 - handed to every pair's wait
                    masks_ready.set_exception(exc)
            try:
                final, masks = await asyncio.wait_for(asyncio.shield(masks_ready),
                                                      cfg.final_timeout_s)
            except TimeoutError:
                missing = [p for p in passive if p not in pair_results]
                raise AlignTimeout(f"the pairwise result of {', '.join(missing)}",
                                   f"psi/{run_id}/", cfg.final_timeout_s) from None
            await _deliver_mask(bus, run_id=run_id, party=party, mask=masks[party],
                                n_final=len(final), cfg=cfg)

        _, st = await align_over_bus(own, role="active", broker=broker,
                                     run_id=pair_run_id(run_id, party), config=cfg,
                                     security=security, connect=connect,
                                     partner_name=party, after=after)
        stats[party] = st

    tasks = [asyncio.create_task(pair(p)) for p in passive]
    try:
        await _first_error(tasks)
    finally:
        if not masks_ready.done():
            masks_ready.cancel()
        elif not masks_ready.cancelled():
            masks_ready.exception()  # retrieved: no "never retrieved" warning
    final, _ = masks_ready.result()
    n_pair = {p: pair_results[p].n_shared for p in passive}
    blog.info("psi.nway_done", parties=len(passive) + 1, n_final=len(final))
    if not final:
        raise EmptyIntersection("active", [p for p in passive if n_pair[p] == 0])
    result = select_ids(own, final, n_partner=max(r.n_partner for r in pair_results.values()))
    return NwayResult(party="active", result=result, pairs=stats, n_pair_shared=n_pair,
                      seconds=time.perf_counter() - t0)


async def align_passive(ids: Sequence[str], *, party: str, broker: str, run_id: str,
                        config: AlignConfig | None = None,
                        security: CurveClient | None = None,
                        connect: Connect | None = None) -> NwayResult:
    """A passive party's side of N-way alignment: PSI with the active party, then its mask.

    Args:
        ids: own IDs, input order.
        party: this party's id (``passive``, ``passive2``, ...).
        broker / run_id / config / security / connect: as :func:`align_active`.

    Raises:
        EmptyId, DuplicateIds: bad own IDs.
        AlignTimeout: the active party's messages (the mask included, within
            ``final_timeout_s``) did not arrive in time.
        MalformedMask: the mask does not fit this party's pairwise result.
        EmptyIntersection: the final intersection is empty (after acknowledging it).
    """
    cfg = config or AlignConfig()
    t0 = time.perf_counter()
    box: list[AlignResult] = []
    mask_topic, ack_topic = _final_topics(run_id, party)

    async def after(bus: Transport, result: AlignResult) -> None:
        msg = await _next(bus, mask_topic, "active final mask", cfg.final_timeout_s)
        if len(msg.arrays) != 1:
            raise MalformedMask(party, f"expected 1 array, got {len(msg.arrays)}")
        try:
            n_final = int(msg.meta["n_final"])
        except (KeyError, TypeError, ValueError):
            raise MalformedMask(party, "meta has no integer n_final") from None
        final = apply_mask(result, msg.arrays[0], party=party, n_final=n_final)
        await bus.publish(ack_topic, [], {"n_final": final.n_shared})
        box.append(final)
        box.append(result)

    _, st = await align_over_bus(ids, role="passive", broker=broker,
                                 run_id=pair_run_id(run_id, party), config=cfg,
                                 security=security, connect=connect, after=after)
    final, pairwise = box
    log.info("psi.nway_done", role="passive", party=party, run_id=run_id,
             n_final=final.n_shared)
    if not final.n_shared:
        raise EmptyIntersection(party, [party] if pairwise.n_shared == 0 else [])
    return NwayResult(party=party, result=final, pairs={"active": st},
                      n_pair_shared={"active": pairwise.n_shared},
                      seconds=time.perf_counter() - t0)


__all__ = ["EmptyIntersection", "NwayResult", "align_active", "align_passive",
           "pair_run_id"]
