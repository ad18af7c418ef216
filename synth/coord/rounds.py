"""One secure-aggregation measurement round at the coordinator (:class:`RoundRunner`).

A round (stage ``round:<name>``) is planned (each clique's ρ share, S_min, the parties'
Skellam μ, each cell's ring window from the public bounds of earlier releases), written
ahead to the checkpoint, published, and aggregated: the masked sums of the tree's top
level are collected (stage 3), the survivors are told to reveal, the masks are removed at
the root or down the tree (stage 4), and the decoded aggregate is checkpointed with the
survivors (``round_<name>.json`` and ``.npz``). A round finished before a restart is
loaded from the checkpoint; one published before it is published again with the same
plan. A round with fewer than S_min survivors is not released.
"""

from __future__ import annotations

import math
import time

import numpy as np

from pubsub.transport import Transport
from synth.coord.collect import collect
from synth.coord.context import RunContext
from synth.coord.planners import RoundRequest
from synth.coord.types import CoordinatorError, RoundResult
from synth.mechanism import resolve_trust
from synth.netutil import array_to_words
from synth.protocol import (
    ROOT,
    RoundPlan,
    aggregate_sigma,
    cell_upper_bounds,
    cell_windows,
    decode_sum,
    party_sigma2,
)
from synth.secagg import SHARE_BYTES, RevealedShare
from synth.skellam import SkellamAccountingError, party_mu


class RoundRunner:
    """Runs measurement rounds over the bus as the secure-aggregation server.

    Args:
        ctx: the run's shared state (the session's server, the compression, the rows).
    """

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.maps_sent = False
        self.maps_round = 0

    async def round(self, bus: Transport, req: RoundRequest) -> RoundResult:
        """Run (or load, or resume) round ``req`` and note the wire bytes after it."""
        res = await self._stage(bus, req)
        await self.ctx.wire.mark(f"round:{req.name}")
        return res

    def resend_maps(self) -> None:
        """The next plan carries the domain compression again (new party processes)."""
        self.maps_sent = False

    def _maps_update(self, r: int) -> dict[str, tuple[int, ...]] | None:
        """The plan's ``maps``: none in round 0, the compression in the first round after
        it, then None (unchanged: the parties keep it)."""
        if r == 0:
            return {}
        if self.maps_sent:
            return None
        self.maps_sent = True
        self.maps_round = r
        return {a: tuple(int(x) for x in v) for a, v in self.ctx.maps.items()}

    def _note_maps(self, plan: RoundPlan) -> None:
        """Replay :meth:`_maps_update`'s bookkeeping for a plan from the checkpoint."""
        if plan.round > 0 and plan.maps is not None:
            self.maps_sent, self.maps_round = True, plan.round

    async def _stage(self, bus: Transport, req: RoundRequest) -> RoundResult:
        ctx = self.ctx
        r, name, cliques, rho = req.round, req.name, list(req.cliques), req.rho
        if ctx.store.has_result(name):  # finished before a restart
            res = ctx.store.load_result(name)
            self._note_maps(res.plan)
            return res
        with ctx.stage(f"round:{name}"):
            cfg = ctx.cfg
            t0 = time.perf_counter()
            server = ctx.server
            pending = ctx.store.load_pending(name)
            if pending is not None:  # published before a restart: the same plan again
                plan, lo = pending
                self._note_maps(plan)
                ctx.log.info("coordinator.round_replayed", round=name)
                seeded = server.seeded(plan.round_id)
                return await self._run(bus, plan, lo, seeded, t0)
            dom = ctx.cdomain if r > 0 else ctx.domain
            sizes = tuple(dom.size(c) for c in cliques)
            k = len(ctx.session.party_ids)  # the parties of the session (all said hello)
            try:
                trust = resolve_trust(k, cfg.secagg.min_survivors, cfg.secagg.min_honest,
                                      noise_model=cfg.secagg.noise_model)
                s_min = trust.min_survivors
                rho_clique = rho / len(cliques) if math.isfinite(rho) else 0.0
                # the noise each party will add by its own rules (synth.plancheck): 1/d of
                # the total, d the honest parties guaranteed in any released sum
                mu = (party_mu(rho_clique, trust.honest_in_release, model=cfg.secagg.noise_model)
                      if rho_clique else 0.0)
            except SkellamAccountingError as exc:
                raise CoordinatorError(f"round {name}: {exc}", code=2) from None
            sigma2 = 2.0 * mu * (1 if cfg.secagg.noise_model == "local" else s_min)
            shape = dict(zip(dom.attributes, dom.sizes, strict=True))
            upper = cell_upper_bounds(cliques, shape, ctx.known if r > 0 else [],
                                      ctx.total_rows)
            try:
                lo, widths = cell_windows(upper, sigma_sum=math.sqrt(2.0 * mu * k),
                                          uniform=cfg.secagg.ring == "uniform",
                                          max_bits=cfg.secagg.bits)
            except ValueError as exc:
                raise CoordinatorError(f"round {name}: {exc}", code=2) from None
            plan = RoundPlan(round=r, name=name, cliques=tuple(cliques), sizes=sizes,
                             sigma2_central=sigma2, noise_model=cfg.secagg.noise_model, n_parties=k,
                             step=1.0, cell_bits=widths.tobytes(),
                             timeout_s=cfg.timeouts.round_timeout_s,
                             maps=self._maps_update(r), maps_round=self.maps_round,
                             rho=rho_clique, min_survivors=s_min,
                             min_honest=trust.min_honest)
            seeded = server.seeded(plan.round_id)
            for p in seeded:  # a party spends len(cliques)·rho when it measures the round
                ctx.rho_party[p] += len(cliques) * rho_clique
            ctx.store.save_pending(name, plan, lo)
            return await self._run(bus, plan, lo, seeded, t0)

    async def _run(self, bus: Transport, plan: RoundPlan, lo: np.ndarray,
                   seeded: tuple[str, ...], t0: float) -> RoundResult:
        """Publish ``plan`` and aggregate its round (stages 3-4), then checkpoint it."""
        ctx = self.ctx
        cfg, t, server, r, tree = ctx.cfg, ctx.topics, ctx.server, plan.round, ctx.tree
        name, cliques, sizes = plan.name, plan.cliques, plan.sizes
        sigma2 = plan.sigma2_central
        spec = plan.spec()
        meta, arrays = plan.to_message()
        bus.publish_nowait(t.plan, arrays, meta)
        await ctx.crash_point(f"round:{name}@planned")
        timeout = cfg.timeouts.round_timeout_s
        missing = tuple(sorted(set(ctx.parties) - set(seeded)))
        # stage 3: masked sums from the tree's top level
        top = set(tree.children[ROOT])
        wait = (1 + len(tree.levels)) * timeout + 10.0
        sums = await collect(ctx, bus, t.up(r, ROOT), top, wait)
        await ctx.crash_point(f"round:{name}@collected")
        for msg in sums.values():
            server.collect_masked_sum(spec, msg.meta.get("ids", []), array_to_words(
                msg.arrays[0], plan.widths, plan.vector_len))
        survivors, dropped = server.unmask_request(plan.round_id)
        if len(survivors) < plan.min_survivors:
            # the parties refuse to reveal (synth.mechanism.check_survivors): a smaller sum
            # would carry less noise than they were charged for
            raise CoordinatorError(
                f"round {name}: {len(survivors)} survivor(s) < min_survivors = "
                f"{plan.min_survivors}; the round cannot be released", code=1)
        bus.publish_nowait(t.unmask(r), (), {"survivors": list(survivors),
                                             "dropped": list(dropped)})
        await ctx.crash_point(f"round:{name}@unmask")
        # stage 4: reveal and unmask
        if cfg.secagg.unmask == "tree":
            total = await self._unmask_tree(bus, plan, survivors, dropped)
        else:
            total = await self._unmask_root(bus, plan, survivors, dropped)
        await ctx.crash_point(f"round:{name}@revealed")
        values = decode_sum(total, lo, plan)
        sigma = aggregate_sigma(plan, len(survivors))
        # naive: the same marginals as float32 over the same tree, without masking,
        # quantisation or key exchange (each party, then each aggregator that forwards)
        alive = set(survivors)
        forwards = sum(1 for a in tree.aggregators
                       if alive.intersection(tree.parties_under(a)))
        naive = 4 * plan.vector_len * (len(survivors) + forwards)
        ctx.bytes_naive += naive
        ctx.naive_by_round[name] = naive
        ctx.bytes_naive_direct += 4 * plan.vector_len * len(survivors)
        res = RoundResult(plan=plan, values=values, sigma=sigma, survivors=survivors,
                          dropped=dropped, missing=missing,
                          seconds=time.perf_counter() - t0)
        ctx.stages_dir.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(ctx.stages_dir / f"round_{name}.npz", values=values)
        ctx.write(f"round_{name}", {
            "round": r, "cliques": [list(c) for c in cliques], "sizes": list(sizes),
            "sigma2_central": sigma2, "sigma_party": math.sqrt(party_sigma2(plan)),
            "aggregate_sigma": sigma, "rho_per_clique": plan.rho,
            "min_survivors": plan.min_survivors,
            "ring_bits_max": plan.ring_bits, "ring_bits_mean": float(plan.widths.mean()),
            "ring": cfg.secagg.ring, "degree": ctx.session.degree,
            "threshold": server.config.t,
            "survivors": list(survivors), "dropped": list(dropped),
            "never_advertised": list(missing), "seconds": res.seconds})
        if dropped or missing:
            ctx.log.warning("synth.round_dropouts", round=r, dropped=list(dropped),
                            missing=list(missing))
        # a dropped party's masked sum never reached the aggregate: it measured nothing
        # that was released (a party that dies mid-run), so the plan's charge is taken
        # back and the count agrees with its own ledger (which records a release before
        # it is sent; a release lost in transit shows as ledger > count: ledger_agrees)
        for p in dropped:
            ctx.rho_party[p] -= len(cliques) * plan.rho
        ctx.store.save_result(name, res,
                              bytes_naive=(ctx.bytes_naive, ctx.bytes_naive_direct))
        return res

    async def _unmask_root(self, bus: Transport, plan: RoundPlan, survivors: tuple[str, ...],
                           dropped: tuple[str, ...]) -> np.ndarray:
        """Stage 4 at the root (``unmask = "root"``, SecAgg+ as published): every survivor
        sends the coordinator its seed shares of surviving owners and its round keys with
        dropped partners; :meth:`synth.secagg.SecAggServer.unmask`. No aggregator learns
        any seed; the root's work grows with K."""
        ctx = self.ctx
        t, r, server = ctx.topics, plan.round, ctx.server
        got_rv = await collect(ctx, bus, t.rv(r), set(survivors), ctx.cfg.timeouts.round_timeout_s)
        shares: dict[str, dict[str, RevealedShare]] = {}
        for holder, msg in got_rv.items():
            raw = np.ascontiguousarray(msg.arrays[0], dtype=np.uint8).tobytes()
            layout = server.reveal_layout(plan.round_id, holder, survivors, dropped)
            nbytes = [SHARE_BYTES if kind == "seed" else 32 for _, kind in layout]
            if sum(nbytes) != len(raw):
                ctx.log.warning("synth.bad_reveal", holder=holder, got=len(raw),
                                expected=sum(nbytes))
                continue  # the others' shares may still suffice
            got: dict[str, RevealedShare] = {}
            at = 0
            for (owner, kind), n in zip(layout, nbytes, strict=True):
                got[owner] = RevealedShare(owner=owner, holder=holder, kind=kind,
                                           x=server.config.index[holder],
                                           y=int.from_bytes(raw[at:at + n], "big"))
                at += n
            shares[holder] = got
        return server.unmask(plan.round_id, survivors, dropped, shares)

    async def _unmask_tree(self, bus: Transport, plan: RoundPlan, survivors: tuple[str, ...],
                           dropped: tuple[str, ...]) -> np.ndarray:
        """Stage 4 at the root: the self-mask sums of the tree's top level (the leaf
        aggregators recovered their children's seeds) and the round keys of the dropped
        parties' surviving partners; :meth:`synth.secagg.SecAggServer.unmask_tree`. The
        root's work grows with the fan-out and the dropouts, not with K."""
        ctx = self.ctx
        t, r, server, timeout = ctx.topics, plan.round, ctx.server, ctx.cfg.timeouts.round_timeout_s
        top = set(ctx.tree.children[ROOT])
        got_sm = await collect(ctx, bus, t.sm(r, ROOT), top,
                               (1 + len(ctx.tree.levels)) * timeout + 10.0)
        self_masks = [(msg.meta.get("ids", []), array_to_words(
            msg.arrays[0], plan.widths, plan.vector_len)) for msg in got_sm.values()]
        holders = set(server.pair_holders(plan.round_id, survivors, dropped))
        got_rv = await collect(ctx, bus, t.rv(r), holders, timeout) if holders else {}
        keys: dict[str, dict[str, RevealedShare]] = {}
        for holder, msg in got_rv.items():
            raw = np.ascontiguousarray(msg.arrays[0], dtype=np.uint8).tobytes()
            owners = [o for o, kind in server.reveal_layout(plan.round_id, holder, survivors,
                                                            dropped) if kind == "pair"]
            if 32 * len(owners) != len(raw):
                ctx.log.warning("synth.bad_reveal", holder=holder, got=len(raw),
                                expected=32 * len(owners))
                continue
            keys[holder] = {o: RevealedShare(owner=o, holder=holder, kind="pair",
                                             x=server.config.index[holder],
                                             y=int.from_bytes(raw[32 * j:32 * j + 32], "big"))
                            for j, o in enumerate(owners)}
        return server.unmask_tree(plan.round_id, survivors, dropped, self_masks, keys)


__all__ = ["RoundRunner"]
