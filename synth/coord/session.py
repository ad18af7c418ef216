"""The coordinator's session stages: ``schema``, ``budget``, ``keys`` and ``seeds:<b>``.

* ``schema``: waits for every party's and aggregator's hello, records the parties' rows
  and broadcasts the public schema with the session plan (``schema.json``).
* ``budget``: ρ and its split among the mechanism's rounds
  (:func:`synth.coord.planners.split_budget`; ``budget.json``).
* ``keys`` (once per secure-aggregation session): collects the parties' public keys and
  sends each its neighbours' (``keys.json``).
* ``seeds:<b>`` (once per batch of rounds): routes the parties' Shamir shares of a fresh
  self-mask seed per round of the batch (``seeds_<b>.json``).

A stage already done before a restart answers again what may not have left (the schema,
the neighbours' keys, the seed shares) instead of collecting anew.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from pubsub.transport import Transport
from synth.coord.collect import collect
from synth.coord.context import RunContext
from synth.coord.planners import BudgetSplit, split_budget
from synth.coord.types import CoordinatorError
from synth.protocol import pack_blobs, round_id, unpack_blobs
from synth.secagg import PartyKeys


class SessionStages:
    """The stages that open a run and its secure-aggregation session.

    Args:
        ctx: the run's shared state.
    """

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def schema_message(self) -> dict[str, Any]:
        """The ``schema`` broadcast: the public schema and the session plan."""
        return {"schema": self.ctx.schema.to_dict(), "session": self.ctx.session.to_meta()}

    async def schema(self, bus: Transport) -> None:
        """Collect every participant's hello (their rows) and broadcast the schema.

        Raises:
            CoordinatorError: participants missing (code 4), a party without rows, or a
                reopened run's parties holding other rows than before (code 2).
        """
        ctx = self.ctx
        t = ctx.topics
        if ctx.done(ctx.sk("schema")):
            # participants still saying hello when the last coordinator died get it now
            # (joined ones ignore it); repeated while the new connection settles
            for _ in range(3):
                bus.publish_nowait(t.schema, (), self.schema_message())
                await asyncio.sleep(0.5)
            return
        with ctx.stage("schema"):
            expect = set(ctx.parties) | set(ctx.tree.aggregators)
            got = await collect(ctx, bus, t.hello, expect, ctx.cfg.timeouts.handshake_timeout_s,
                                resume_stage="schema")
            rows_before = dict(ctx.rows)
            await ctx.crash_point("schema@collected")
            missing = sorted(expect - set(got))
            if missing:
                raise CoordinatorError(
                    f"{len(missing)} participant(s) never said hello within "
                    f"{ctx.cfg.timeouts.handshake_timeout_s:.0f} s: {missing[:10]}", code=4)
            ctx.rows = {p: int(got[p].meta["rows"]) for p in ctx.parties}
            if min(ctx.rows.values()) < 1:
                empty = sorted(p for p, n in ctx.rows.items() if n < 1)
                raise CoordinatorError(f"parties without rows: {empty}", code=2)
            if ctx.reopened and rows_before and rows_before != ctx.rows:
                raise CoordinatorError("the parties of the reopened run hold other rows "
                                       f"than before: {rows_before} != {ctx.rows}", code=2)
            ctx.write("schema", {"schema": ctx.schema.to_dict(), "rows": ctx.rows,
                                 "fingerprint": ctx.schema.fingerprint(),
                                 "tree": ctx.tree.to_dict()})
            ctx.mark(ctx.sk("schema"))
            bus.publish_nowait(t.schema, (), self.schema_message())

    def budget(self) -> BudgetSplit:
        """ρ and its split (the stream reserve is noted in the checkpoint once)."""
        ctx = self.ctx
        with ctx.stage("budget"):
            cfg = ctx.cfg
            weights = cfg.mst.split if cfg.mechanism == "mst" else cfg.aim.split
            split = split_budget(mechanism=cfg.mechanism, epsilon=cfg.epsilon,
                                 delta=cfg.delta, weights=list(weights),
                                 stream_frac=cfg.stream.rho_frac)
            if ctx.store.doc["stream_rho_left"] is None:
                ctx.store.doc["stream_rho_left"] = split.reserve
            ctx.write("budget", {"epsilon": cfg.epsilon, "delta": cfg.delta,
                                 "rho": split.rho, "split": dict(split.shares),
                                 "stream_reserve": split.reserve,
                                 "mechanism": cfg.mechanism,
                                 "conversion": "Canonne-Kamath-Steinke 2020 (tight)"})
            return split

    async def keys(self, bus: Transport) -> None:
        """Once per session: collect the parties' public keys, send each its neighbours'."""
        ctx = self.ctx
        t, server, s = ctx.topics, ctx.server, ctx.s
        if ctx.done(ctx.sk("keys")):  # the answers may not have left before the crash
            for p in server.keyed:
                meta, arr = pack_blobs({q: v.mask_public + v.enc_public
                                        for q, v in server.keys_for(p).items()})
                bus.publish_nowait(t.nk(s, p), [arr], meta)
            return
        with ctx.stage(ctx.sk("keys")):
            got = await collect(ctx, bus, t.pk(s), set(ctx.parties),
                                ctx.cfg.timeouts.round_timeout_s,
                                resume_stage="keys")
            for p, msg in got.items():
                raw = np.ascontiguousarray(msg.arrays[0], dtype=np.uint8).tobytes()
                server.register_keys(PartyKeys(party=p, mask_public=raw[:32],
                                               enc_public=raw[32:]))
            answers = {p: pack_blobs({q: v.mask_public + v.enc_public
                                      for q, v in server.keys_for(p).items()})
                       for p in sorted(got)}
            await ctx.crash_point("keys@collected")
            ctx.never_keyed = tuple(sorted(set(ctx.parties) - set(got)))
            ctx.mark(ctx.sk("keys"), server=True)
            await ctx.crash_point("keys@marked")
            for p, (meta, arr) in answers.items():
                bus.publish_nowait(t.nk(s, p), [arr], meta)
            ctx.write(ctx.sk("keys").replace(":", "_"),
                      {"session": ctx.session.to_meta(), "keyed": sorted(got),
                       "never_advertised": list(ctx.never_keyed)})
            if ctx.never_keyed:
                ctx.log.warning("synth.never_keyed", parties=list(ctx.never_keyed))

    async def seed_batch(self, bus: Transport, b: int, rounds: list[int]) -> None:
        """Once per batch of rounds: every keyed party Shamir-shares a fresh self-mask seed
        per round of the batch with its neighbours, through the coordinator."""
        ctx = self.ctx
        t, server = ctx.topics, ctx.server
        ids = [round_id(r) for r in rounds]
        stage = f"seeds:{b}"
        if ctx.done(stage):  # the answers may not have left before the crash
            for p in server.seeded(ids[0]):
                meta, arr = pack_blobs(server.seed_shares_for(ids, p))
                bus.publish_nowait(t.rs(b, p), [arr], meta)
            return
        with ctx.stage(stage):
            bus.publish_nowait(t.seeds, (), {"batch": b, "rounds": ids})
            got = await collect(ctx, bus, t.sh(b), set(server.keyed),
                                ctx.cfg.timeouts.round_timeout_s,
                                resume_stage=stage)
            for p, msg in got.items():
                server.collect_seed_shares(ids, p, unpack_blobs(msg.meta, msg.arrays[0]))
            await ctx.crash_point(f"{stage}@collected")
            answers = {p: pack_blobs(server.seed_shares_for(ids, p)) for p in sorted(got)}
            ctx.write(f"seeds_{b}", {"rounds": ids, "seeded": sorted(got)})
            ctx.mark(stage, server=True)
            await ctx.crash_point(f"{stage}@marked")
            for p, (meta, arr) in answers.items():
                bus.publish_nowait(t.rs(b, p), [arr], meta)


__all__ = ["SessionStages"]
