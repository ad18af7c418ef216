"""A party's session with its partners over the bus: the subscriptions it needs (each
topic's buffer bounded), the handshake with every partner (settings digest, the
partner's client id from then on the only one accepted on its topics), heartbeats, the
liveness watchdog and, with several passive parties, the run's abort notice.

Owns: :class:`PartySession`. May import :mod:`pubsub`, :mod:`parties.core`,
:mod:`parties.config` and :mod:`parties.data`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from pubsub import DeadlineExceeded
from pubsub.buffer import BufferLimits
from pubsub.errors import PeerLost, RendezvousTimeout, SettingsMismatch
from pubsub.session import answer_hello, answer_hellos, heartbeat, rendezvous, wait_any, watch
from pubsub.transport import Transport

from parties.algorithms.schedule import overlap_decision
from parties.core.errors import ConfigMismatch, HandshakeTimeout, PartnerLost, RunAborted
from parties.core.sysinfo import cores_allotted
from parties.data import aligned_ids_digest
from parties.runtime.context import PartyContext, PartyPart


class PartySession(PartyPart):
    """What a party says and hears besides the batches.

    Args:
        ctx: the party's context.
        channels: per-batch channels to subscribe (batches per epoch, or workers).
        n_val_points: validation points of the run (their topics).
        workers: the party's workers (the VFL-PS id lists' size).
    """

    def __init__(self, ctx: PartyContext, *, channels: int, n_val_points: int,
                 workers: int) -> None:
        super().__init__(ctx)
        self.channels = channels
        self.n_val_points = n_val_points
        self.workers = workers
        #: each partner's topics, for accept_only once its client id is known
        self._topics_of: dict[str, list[str]] = {}
        #: each partner's allotted cores, as its hello said them (after the handshake)
        self.partner_cores: dict[str, float | None] = {}
        #: active: the decision on scoring in flight as told (asked again if lost)
        self.overlap_meta: dict[str, Any] | None = None
        self.asked = 0  # passive: times it asked for that decision again
        #: this side's hello as the handshake said it (answered to a partner's late hello)
        self._greeting: dict[str, Any] = {}

    async def subscribe(self, bus: Transport) -> None:
        cfg, t = self.cfg, self.topics
        emb_bytes = cfg.batch_size * cfg.model.embedding_dim * 4 + 4096
        # per-batch channels; VFL-PS uses one channel per worker pair instead
        channels = range(self.channels)
        # each partner's topics, for accept_only once its client id is known
        self._topics_of = {}
        if self.role == "active":
            lim = BufferLimits(max_msgs=cfg.workers.p, max_bytes=cfg.workers.p * emb_bytes)
            for party in self.partners:
                q = party if self.multi else ""
                embs = [t.emb(b, q) for b in channels]
                vals = [t.val(i, q) for i in range(self.n_val_points)]
                self._topics_of[party] = [*embs, *vals, t.test_of(q), t.report_of(q),
                                          t.hb(party)]
                await bus.subscribe_many(embs, limits=lim)
                for n, topics in ((self.data.x_val.shape[0], vals),
                                  (self.data.x_test.shape[0], [t.test_of(q)])):
                    eval_bytes = n * cfg.model.embedding_dim * 4 + 4096
                    await bus.subscribe_many(topics, limits=BufferLimits(
                        max_msgs=2, max_bytes=2 * eval_bytes))
                await bus.subscribe(t.report_of(q))
            # any partner may ask again for "scored" (not in a partner's accept-only list)
            await bus.subscribe(t.resend("active"), limits=BufferLimits(
                max_msgs=16, max_bytes=1 << 16))
        else:
            lim = BufferLimits(max_msgs=cfg.workers.q, max_bytes=cfg.workers.q * emb_bytes)
            grads = [t.grad(b) for b in channels]
            mine = [*grads, t.done, t.scored, t.hb("active"), t.resend(self.party)]
            await bus.subscribe_many(grads, limits=lim)
            if cfg.algo == "vfl-ps":
                mine.append(t.ids)
                ids_bytes = cfg.batch_size * 8 + (self.workers + 1) * 8 + 4096
                await bus.subscribe(t.ids, limits=BufferLimits(max_msgs=16,
                                                               max_bytes=16 * ids_bytes))
            await bus.subscribe(t.done)
            await bus.subscribe(t.scored, limits=BufferLimits(max_msgs=4, max_bytes=1 << 14))
            await bus.subscribe(t.resend(self.party), limits=BufferLimits(max_msgs=16,
                                                                         max_bytes=1 << 16))
            if self.multi:
                mine.append(t.abort)
                await bus.subscribe(t.abort, limits=BufferLimits(max_msgs=4,
                                                                 max_bytes=1 << 14))
            self._topics_of["active"] = mine
        for party in self.partners:
            await bus.subscribe(t.hb(party), limits=BufferLimits(max_msgs=4, max_bytes=1 << 16))
        # subscribed last: a hello from the partner proves all the above reached its publisher
        await bus.subscribe(t.hello(self.party))

    async def handshake(self, bus: Transport) -> None:
        """Exchange hellos until each side has seen the other (PubSub slow-joiner guard;
        :func:`pubsub.session.rendezvous` over the shared-settings digest): the active
        party meets every passive party, a passive party the active party."""
        cfg, t = self.cfg, self.topics
        rows_file = cfg.rows_file(self.party)
        mine = cfg.shared_settings(self.data.n_rows,
                                   aligned_ids_digest(rows_file) if rows_file else "")
        self._greeting = {"me": self.party, "peers": list(self.partners),
                          "digest": str(mine["digest"]),
                          "say": [t.hello(p) for p in self.partners],
                          "info": {"role": self.role, "shared": mine,
                                   "cores": round(cores_allotted(), 4)}}
        try:
            heard = await rendezvous(
                bus, **self._greeting, hear=[t.hello(self.party)],
                timeout_s=cfg.timeouts.handshake_timeout_s, interval_s=0.1,
                mismatch_linger_s=0.5,
                on_found=lambda peer, _: self.log.info("vfl.partner_found", partner=peer))
        except RendezvousTimeout as exc:
            raise HandshakeTimeout(", ".join(exc.missing) if self.multi else self.partner,
                                   cfg.timeouts.handshake_timeout_s, self.run_id) from None
        except SettingsMismatch as exc:
            raise ConfigMismatch(mine, dict(exc.hello.get("shared") or {})) from None
        # from now on only the client each partner's handshake came from is that partner:
        # the bus drops others' messages on its topics before they take room
        ids = {p: str(heard[p]["publisher"]) for p in self.partners}
        self.partner_cores = {p: _cores(heard[p].get("cores")) for p in self.partners}
        self.intake.partners = {pid: p for p, pid in ids.items()}
        for p, pid in ids.items():
            bus.accept_only(pid, self._topics_of[p])

    async def agree_overlap(self, bus: Transport) -> tuple[bool, str]:
        """Whether this run scores validation points in flight, and why
        (:func:`parties.algorithms.schedule.overlap_decision`): the active party decides
        from every party's allotted cores (said in the hellos) and tells the passive
        parties on the ``scored`` topic (point -1) before training starts; each side then
        runs the same segments. Without ``scores_in_flight`` nothing is exchanged.

        Raises:
            HandshakeTimeout: a passive party heard no decision within the handshake
                timeout.
        """
        cfg = self.cfg
        if not cfg.scores_in_flight:
            return False, "off in the configuration"
        if self.role == "active":
            on, why = overlap_decision(True, {"active": cores_allotted(), **self.partner_cores})
            self.overlap_meta = {"point": -1, "val_overlap": on, "reason": why}
            bus.publish_nowait(self.topics.scored, (), self.overlap_meta)
            return on, why
        deadline = time.monotonic() + cfg.timeouts.handshake_timeout_s
        every = cfg.timeouts.resend_interval_s
        hear = [self.topics.scored, self.topics.hello(self.party)]
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                msg = await wait_any(bus, hear, min(every, left) if every else left)
                if msg.topic != self.topics.scored:  # the active party missed our last hello
                    answer_hello(bus, msg, **self._greeting)
                    continue
            except DeadlineExceeded:
                if time.monotonic() < deadline:  # lost? ask the active party again
                    self.asked += 1
                    self.log.warning("vfl.scoring_resend_asked", partner="active",
                                     topic=self.topics.scored, point=-1)
                    bus.publish_nowait(self.topics.resend("active"), (),
                                       {"topic": self.topics.scored, "point": -1})
                    continue
                raise HandshakeTimeout("active", cfg.timeouts.handshake_timeout_s, self.run_id) from None
            if "val_overlap" in msg.meta:
                return bool(msg.meta["val_overlap"]), str(msg.meta.get("reason", ""))[:200]

    async def answer_hellos(self, bus: Transport) -> None:
        """Until cancelled: answer a partner still saying hello after the handshake
        (:func:`pubsub.session.answer_hellos`; its last hello from us was lost)."""
        await answer_hellos(bus, **self._greeting, hear=[self.topics.hello(self.party)])

    async def heartbeat(self, bus: Transport) -> None:
        await heartbeat(bus, self.topics.hb(self.party), me=self.party,
                        interval_s=self.cfg.timeouts.heartbeat_interval_s)

    async def watchdog(self, bus: Transport) -> None:
        timeout = self.cfg.timeouts.liveness_timeout_s
        try:
            await watch(bus, {p: self.topics.hb(p) for p in self.partners}, timeout_s=timeout)
        except PeerLost as exc:
            lost = str(exc.peer) if self.multi else self.partner
            self.log.error("vfl.partner_lost", partner=lost, silent_s=timeout)
            raise PartnerLost(lost, timeout) from None

    async def abort_watch(self, bus: Transport) -> None:
        """Passive, several passive parties: end this party as soon as the active party
        says it ended the run (:class:`RunAborted`, naming the party that caused it)."""
        while True:
            try:
                msg = await bus.next(self.topics.abort, 3600.0)
            except DeadlineExceeded:
                continue
            party = str(msg.meta.get("party", "?"))[:32]
            reason = str(msg.meta.get("reason", ""))[:300]
            self.log.error("vfl.run_aborted", by="active", party=party, reason=reason)
            raise RunAborted(party, reason)

    async def announce_abort(self, bus: Transport, err: BaseException) -> None:
        """Active, several passive parties: tell every passive party that the run is over
        because of ``err``'s party (best effort: a lost party cannot hear it)."""
        party = str(getattr(err, "partner", "") or "active")
        with contextlib.suppress(Exception):
            bus.publish_nowait(self.topics.abort, (),
                               {"party": party, "reason": str(err)[:300]})
            await asyncio.sleep(0.1)  # let the message leave before the bus closes


def _cores(value: Any) -> float | None:
    """A partner's allotted cores as its hello said them (None: not said, or not a
    finite positive number)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if 0 < v < float("inf") else None


__all__ = ["PartySession"]
