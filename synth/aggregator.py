"""A FedForge aggregator: a node of the aggregation tree.

It adds the masked vectors (or masked sums) its children send for a round, each cell in
its ring Z_(2^w) (the plan's width of the cell), and forwards the sum with the list of
parties in it to its parent, up to the coordinator. Masked words are uniformly random, so an aggregator learns nothing about
any party's marginals; pairwise masks cancel only in the total at the coordinator.
By default (``secagg.unmask = "root"``) the coordinator alone unmasks, as in SecAgg+. With
``secagg.unmask = "tree"`` unmasking is hierarchical (:meth:`Aggregator._unmask`): after the
coordinator's unmask request a leaf recovers its surviving children's self-mask seeds of
the round from the survivors' shares and sends the sum of their self masks up; inner
nodes add them; the coordinator removes only the dropped parties' pair masks. A leaf so learns its children's
round seeds: their vectors stay hidden under the pair masks with their neighbours, whose
keys only the coordinator ever gets, and only for dropped partners (an aggregator and the
coordinator colluding know what the flat SecAgg+ server knows). Its work and memory per
round are ``O(children × vector_len)``.

A child that has not reported when the aggregator's deadline passes is left out (the
coordinator then treats its parties as dropouts of the round). Deadline of a level-ℓ
aggregator: ``(1 + ℓ) × timeout_s + 5 s`` after the plan, since parties mask right after
the plan (keys and seeds are agreed before the rounds) and each level below may wait its
own.

A restarted coordinator re-publishes the plan of the round it died in (the parties send
the same masked vectors again): a plan for the round being aggregated extends the
deadline, and one for the last round already forwarded sends that round again, from the
vectors kept (the children's repeats are then duplicates and ignored).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import structlog

from pubsub import DeadlineExceeded, Message
from pubsub.errors import RendezvousTimeout
from pubsub.security import CurveClient
from pubsub.transport import Connect, Transport
from pubsub.session import call_until, wait_any
from synth.config import SynthConfig
from synth.netutil import (ParticipantError, array_to_words, bus_config, open_bus,
                            topic_limits, words_to_array)
from synth.protocol import RoundPlan, SessionPlan, Topics, Tree, cell_modmask
from synth.secagg import SHARE_BYTES, SecAggConfig, SecAggError, self_mask_sum

log = structlog.get_logger(__name__)


def stage_deadline_s(plan: RoundPlan, level: int) -> float:
    """How long a level-``level`` aggregator waits for its children after the plan, seconds."""
    return (1 + level) * plan.timeout_s + 5.0


class Aggregator:
    """One aggregator (``a<level>_<j>``).

    Args:
        node_id: its id in the tree.
        cfg: the run config.
        broker: broker address ``tcp://HOST:PORT``.
        run_id: topic namespace.
        security: CURVE keys for the bus (:class:`pubsub.security.CurveClient`); None =
            plaintext (loopback brokers only).
    """

    def __init__(self, node_id: str, *, cfg: SynthConfig, broker: str, run_id: str,
                 security: CurveClient | None = None, connect: Connect | None = None) -> None:
        self.id = node_id
        self.connect = connect
        self.cfg = cfg
        self.broker = broker
        self.security = security
        self.topics = Topics(run_id)
        self.rounds: list[dict[str, Any]] = []
        # the last round aggregated: (round id, child -> (party ids, ring words))
        self._kept: tuple[str, dict[str, tuple[list[str], np.ndarray]]] | None = None
        self.log = log.bind(aggregator=node_id, run_id=run_id)

    async def run(self) -> dict[str, Any]:
        """Aggregate every round until the coordinator says done; returns a report.

        Raises:
            ParticipantError: no coordinator.
        """
        t = self.topics
        async with open_bus(self.cfg, self.id, broker=self.broker,
                            security=self.security, connect=self.connect) as bus:
            await bus.subscribe_prefix(t.to(self.id), limits=topic_limits(self.cfg))
            await bus.subscribe_prefix(t.all(), limits=topic_limits(self.cfg))
            hello = {"from": self.id, "role": "aggregator"}

            def answer(msg: Message) -> bool:
                if msg.topic == t.resume:  # the coordinator's roll call
                    if msg.meta.get("stage") == "schema":
                        bus.publish_nowait(t.hello, (), hello)
                    return False
                return True

            try:  # hello until the schema shows the coordinator is there
                schema = await call_until(bus, say=lambda: bus.publish_nowait(t.hello, (), hello),
                                          hear=[t.schema, t.resume], peer="coordinator",
                                          timeout_s=self.cfg.timeouts.handshake_timeout_s,
                                          interval_s=1.0, accept=answer)
            except RendezvousTimeout:
                raise ParticipantError(self.id, "no coordinator answered", code=4) from None
            session = SessionPlan.from_meta(schema.meta["session"])
            tree = Tree.from_dict(session.tree)
            secagg = session.secagg()
            while True:
                try:
                    msg = await wait_any(bus, [t.plan, t.done],
                                         self.cfg.timeouts.handshake_timeout_s + 3600.0)
                except DeadlineExceeded:
                    raise ParticipantError(self.id, "the coordinator went silent", code=4) from None
                if msg.topic == t.done:
                    break
                plan = RoundPlan.from_message(msg.meta, msg.arrays)
                if self.id in tree.children:
                    await self._round(bus, plan, tree)
                    if (self.cfg.secagg.unmask == "tree"
                            and not await self._unmask(bus, plan, tree, secagg)):
                        break  # the coordinator said done
            stats = bus.stats()
        return {"aggregator": self.id, "rounds": self.rounds,
                "bytes_sent": int(sum(stats.sent_bytes.values()))}

    async def _round(self, bus: Transport, plan: RoundPlan, tree: Tree) -> None:
        t, r, n = self.topics, plan.round, plan.vector_len
        widths = plan.widths
        kids = set(tree.children[self.id])
        loop = asyncio.get_running_loop()
        wait_s = stage_deadline_s(plan, tree.level_of(self.id))
        deadline = loop.time() + wait_s
        got: dict[str, tuple[list[str], np.ndarray]] = {}
        if self._kept is not None and self._kept[0] == plan.round_id:
            got = dict(self._kept[1])  # a replayed round: what the children sent before
            self.log.info("synth.round_replayed", round=r, kept=len(got))
        self._kept = (plan.round_id, got)
        heard: set[str] = set(got)
        topic = t.up(r, self.id)
        while heard != kids:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                msg = await wait_any(bus, [topic, t.plan], remaining)
            except DeadlineExceeded:
                break
            if msg.topic == t.plan:
                again = RoundPlan.from_message(msg.meta, msg.arrays)
                if again.round_id != plan.round_id:  # a later round: this one is over
                    bus.unget(msg)
                    break
                deadline = loop.time() + wait_s  # the coordinator restarted mid-round
                continue
            sender = msg.meta.get("from")
            if sender not in kids or sender in heard:
                self.log.warning("synth.unexpected_child", sender=sender, round=r)
                continue
            try:
                words = array_to_words(msg.arrays[0], widths, n)
            except (ValueError, IndexError) as exc:
                self.log.warning("synth.bad_vector", sender=sender, round=r, error=str(exc))
                continue
            heard.add(sender)
            got[sender] = (list(msg.meta.get("ids", [])), words)
        mask = cell_modmask(widths)
        total = np.zeros(n, dtype=np.uint64)
        ids: list[str] = []
        for child_ids, words in got.values():
            ids.extend(child_ids)
            total += words
            total &= mask
        missing = sorted(kids - heard)
        if missing:
            self.log.warning("synth.children_missing", round=r, missing=missing)
        if ids:
            bus.publish_nowait(t.up(r, tree.parent[self.id]), [words_to_array(total, widths)],
                               {"from": self.id, "ids": ids}, copy=False)
        self.rounds.append({"round": r, "children": len(kids), "heard": len(heard),
                            "parties": len(ids)})

    async def _unmask(self, bus: Transport, plan: RoundPlan, tree: Tree, secagg: SecAggConfig) -> bool:
        """Hierarchical unmasking of round ``plan.round``: after the coordinator's unmask
        request (survivors, dropped), a leaf recovers each surviving child's self-mask seed
        from the survivors' shares and sends the sum of their self masks up; an inner node
        sums its children's. Returns False when the coordinator said done instead.

        What a leaf learns: the round's self-mask seeds of its surviving children. With
        their masked vectors it holds ``x_u + Σ_v ±PRG(k_(uv,r))`` per child: still hidden
        by the pair masks with u's neighbours, whose keys it never sees (round keys go to
        the coordinator only, and only for dropped partners, never with u's seed share).
        An inner node learns sums of its subtree's self masks (with its masked sum: the
        subtree's inputs under the pair masks that cross the subtree's edge).
        """
        t, r = self.topics, plan.round
        level = tree.level_of(self.id)
        loop = asyncio.get_running_loop()
        try:  # the root waits up to (1 + levels) x timeout + 10 s for the sums
            msg = await wait_any(bus, [t.unmask(r), t.done],
                                 (2 + len(tree.levels)) * plan.timeout_s + 15.0)
        except DeadlineExceeded:
            self.log.warning("synth.no_unmask_request", round=r)
            return True
        if msg.topic == t.done:
            return False
        survivors = set(msg.meta["survivors"])
        kids = tree.children[self.id]
        deadline = loop.time() + (1 + level) * plan.timeout_s + 5.0
        spec = plan.spec()
        ids: list[str] = []
        if level == 0:
            mine = [p for p in kids if p in survivors]
            shares: dict[str, dict[int, int]] = {p: {} for p in mine}
            need = secagg.t
            while any(len(v) < need for v in shares.values()):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    m = await bus.next(t.rvs(r, self.id), remaining)
                except DeadlineExceeded:
                    break
                holder, owners = m.meta.get("from"), m.meta.get("owners", [])
                raw = np.ascontiguousarray(m.arrays[0], dtype=np.uint8).tobytes()
                if holder not in secagg.index or len(raw) != SHARE_BYTES * len(owners):
                    self.log.warning("synth.bad_reveal", holder=holder, round=r)
                    continue
                for j, owner in enumerate(owners):
                    if owner in shares and (holder == owner or holder in secagg.graph[owner]):
                        shares[owner][secagg.index[holder]] = int.from_bytes(
                            raw[j * SHARE_BYTES:(j + 1) * SHARE_BYTES], "big")
            ok = {p: list(v.items()) for p, v in shares.items() if len(v) >= need}
            if len(ok) < len(shares):
                self.log.warning("synth.seeds_unrecoverable", round=r,
                                 parties=sorted(set(shares) - set(ok)))
            try:
                total = await asyncio.to_thread(self_mask_sum, secagg, spec, ok)
                ids = sorted(ok)
            except (SecAggError, ValueError) as exc:
                self.log.warning("synth.self_mask_failed", round=r, error=str(exc))
                total, ids = np.zeros(plan.vector_len, np.uint64), []
        else:
            total = np.zeros(plan.vector_len, np.uint64)
            mask = cell_modmask(plan.widths)
            heard: set[str] = set()
            while heard != set(kids):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    m = await bus.next(t.sm(r, self.id), remaining)
                except DeadlineExceeded:
                    break
                sender = m.meta.get("from")
                if sender not in kids or sender in heard:
                    continue
                try:
                    words = array_to_words(m.arrays[0], plan.widths, plan.vector_len)
                except (ValueError, IndexError) as exc:
                    self.log.warning("synth.bad_vector", sender=sender, round=r, error=str(exc))
                    continue
                heard.add(sender)
                ids.extend(m.meta.get("ids", []))
                total = (total + words) & mask
        # always answer (an empty sum too), so the parent need not wait for its deadline
        bus.publish_nowait(t.sm(r, tree.parent[self.id]), [words_to_array(total, plan.widths)],
                           {"from": self.id, "ids": ids}, copy=False)
        return True


__all__ = ["Aggregator", "stage_deadline_s"]
