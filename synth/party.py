"""A FedForge data-holding party: a bus participant that never sends records or counts in
the clear, only masked, exact integer noisy marginals.

Once per run it advertises its secure-aggregation keys (:class:`synth.secagg.SecAggClient`)
and, per batch of rounds, Shamir-shares a fresh self-mask seed per round with its
neighbours (see :mod:`synth.protocol`). Per measurement round it:

0. on joining, checks the session against its OWN configuration
   (:func:`synth.plancheck.verify_session`: exactly ``parties`` IDs, a Shamir threshold
   at least its floor); a refused session (:class:`synth.plancheck.SessionRefused`) is
   logged (``synth.session_refused``) and ends the party (exit 2) before it sends keys;
1. checks the plan against the session it joined and its OWN configuration
   (:func:`synth.plancheck.verify_plan`: K, S_min, min_honest, noise model, step, cliques,
   ρ within its remaining budget) and computes its Skellam μ itself (1/d of the charged
   noise, d the honest parties guaranteed in any released sum); a refused plan
   (:class:`synth.plancheck.PlanRefused`) is logged and reported, nothing is released;
2. writes the spend ``len(cliques)·rho`` to its zCDP ledger
   (:class:`synth.accounting.ZCdpAccountant`) before anything leaves;
3. counts its marginals for the plan's cliques (:func:`synth.domain.marginals`), adds
   integer Skellam noise (:func:`synth.mechanism.measure_party`) and reduces the exact
   integers mod 2^w per cell (nothing is rounded);
4. masks each cell in its ring Z_(2^w), sends the packed words to its leaf aggregator,
   and reveals seed shares (and round keys with dropped neighbours) for the unmasking,
   unless fewer than its S_min parties survived (:func:`synth.mechanism.check_survivors`).

Privacy accounting of one round (replace-one, row counts public): each clique's
histogram has L2 sensitivity √2; a sum over S ≥ S_min parties carries Skellam noise
Sk(S·μ) per cell, whose exact RDP is charged as ``rho`` zCDP per clique
(:mod:`synth.skellam`).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pandas as pd
import structlog

from pubsub import DeadlineExceeded, Message
from pubsub.errors import RendezvousTimeout
from pubsub.security import CurveClient
from pubsub.transport import Connect, Transport
from pubsub.session import call_until, wait_any
from synth.accounting import BudgetExceeded, ZCdpAccountant
from synth.config import SynthConfig
from synth.domain import Domain, DomainError, Schema, encode
from synth.mechanism import SurvivorRefusal, check_survivors, resolve_min_survivors
from synth.plancheck import PlanRefused, SessionRefused, verify_plan, verify_session
from synth.skellam import SkellamAccountingError
from synth.netutil import (ParticipantError, bus_config, open_bus, topic_limits,
                            words_to_array)
from synth.protocol import (
    RoundPlan,
    SessionPlan,
    Topics,
    Tree,
    pack_blobs,
    secagg_threshold_floor,
    unpack_blobs,
)
from synth.party_ledger import LedgerFile
from synth.party_release import ReleaseCache, noisy_counts, reveal_messages
from synth.secagg import PartyKeys, SecAggClient, SecAggError
from synth.select import compress_codes


log = structlog.get_logger(__name__)

class SynthParty:
    """One party holding some rows of the table.

    Args:
        party_id: its id (``p000`` ...).
        frame: its rows (any columns; they must match the public schema's names).
        cfg: the run config (the shared settings come from the coordinator's plans).
        broker: broker address ``tcp://HOST:PORT``.
        run_id: topic namespace.
        noise_seed: seed of its noise generator (tests only); None = OS entropy.
        security: CURVE keys for the bus (:class:`pubsub.security.CurveClient`); None =
            plaintext (loopback brokers only).
        ledger_file: where the party keeps its privacy ledger (the accountant's
            ``state_dict``, rewritten atomically before each release); None = memory only.

    A plan for a round this party already released (a restarted coordinator re-publishes
    it) is answered with the same masked vector, without spending budget; the same round
    id with another plan is refused (:class:`synth.party_release.ReleaseCache`).
    """

    def __init__(self, party_id: str, frame: pd.DataFrame, *, cfg: SynthConfig, broker: str,
                 run_id: str, noise_seed: int | None = None,
                 security: CurveClient | None = None,
                 ledger_file: str | None = None, connect: Connect | None = None) -> None:
        self.id = party_id
        self.connect = connect
        self.frame = frame
        self.cfg = cfg
        self.broker = broker
        self.security = security
        self.topics = Topics(run_id)
        self.rng = np.random.default_rng(noise_seed)
        self.accountant = (ZCdpAccountant.from_epsilon(cfg.epsilon, cfg.delta)
                           if cfg.private else None)
        self.codes: np.ndarray | None = None
        self.schema: Schema | None = None
        self.domain: Domain | None = None  # the domain counted in (after compression)
        self.ccodes: np.ndarray | None = None  # codes in that domain
        self.maps_round = -1  # the round whose plan carried that compression
        self.session: SessionPlan | None = None
        self.tree: Tree | None = None
        self.client: SecAggClient | None = None  # None: not (or no longer) in the session
        self.seeded: set[str] = set()  # round ids this party shared seeds for
        self.rounds: list[dict[str, Any]] = []
        self.ledger_file = ledger_file
        self.ledger = (None if ledger_file is None
                       else LedgerFile(ledger_file, party=party_id, run_id=run_id))
        self.run_id = run_id
        # stage ("schema", "keys", "seeds:<b>") -> (topic, arrays, meta) last sent in it
        self.sent: dict[str, tuple[str, list[np.ndarray], dict[str, Any]]] = {}
        # each round's masked vector and the identity of the plan it answered
        self.released = ReleaseCache()
        self.replays = 0
        self.log = log.bind(party=party_id, run_id=run_id)
        if self.ledger is not None and self.accountant is not None:
            # a process started again for the same run continues its ledger
            if self.ledger.restore(self.accountant):
                self.log.info("synth.ledger_restored", rho_spent=self.accountant.spent)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> dict[str, Any]:
        """Take part until the coordinator says done; returns this party's report.

        Raises:
            ParticipantError: bad data, a refused budget, or no coordinator.
        """
        t = self.topics
        async with open_bus(self.cfg, self.id, broker=self.broker,
                            security=self.security, connect=self.connect) as bus:
            await bus.subscribe_prefix(t.to(self.id), limits=topic_limits(self.cfg))
            await bus.subscribe_prefix(t.all(), limits=topic_limits(self.cfg))
            try:
                await self._join(bus)
                await self._keys(bus)
                while True:
                    msg = await wait_any(bus, [t.seeds, t.plan, t.done, t.resume],
                                         self._idle_timeout_s())
                    if msg.topic == t.done:
                        break
                    if msg.topic == t.resume:
                        self._on_resume(bus, msg)
                        continue
                    if msg.topic == t.seeds:
                        await self._seeds(bus, int(msg.meta["batch"]), list(msg.meta["rounds"]))
                        continue
                    plan = RoundPlan.from_message(msg.meta, msg.arrays)
                    if plan.round_id in self.released:
                        await self._replay(bus, plan)
                        continue
                    await self._apply_maps(plan)
                    if self.client is not None and plan.round_id in self.seeded:
                        if await self._closed_while_away(bus, plan):
                            continue
                        await self._round(bus, plan)
                    else:
                        self.rounds.append({"round": plan.round, "name": plan.name,
                                            "status": "not in the session"})
            except ParticipantError as exc:
                # in the run's event log whatever the coordinator manages to record
                self.log.error("synth.party_failed", reason=exc.reason, code=exc.code)
                bus.publish_nowait(t.error, (), {"from": self.id, "reason": exc.reason,
                                                 "code": exc.code})
                await asyncio.sleep(0.2)  # let it leave before the socket closes
                raise
            except DeadlineExceeded as exc:
                raise ParticipantError(self.id, f"the coordinator went silent ({exc})",
                                       code=4) from None
            stats = bus.stats()
        self.log.info("synth.party_done", rounds=self.rounds,
                      rho_spent=self.accountant.spent if self.accountant else 0.0,
                      ledger=list(self.accountant.ledger) if self.accountant else [])
        return {"party": self.id, "rows": int(len(self.frame)), "rounds": self.rounds,
                "replays": self.replays,
                "rho_spent": self.accountant.spent if self.accountant else 0.0,
                "rho_budget": self.accountant.rho_budget if self.accountant else math.inf,
                "bytes_sent": int(sum(stats.sent_bytes.values()))}

    def _send(self, bus: Transport, stage: str, topic: str, arrays: list[np.ndarray],
              meta: dict[str, Any]) -> None:
        """Publish a stage's message and keep it, to repeat when a restarted coordinator
        asks (:meth:`_on_resume`)."""
        self.sent[stage] = (topic, arrays, meta)
        bus.publish_nowait(topic, arrays, meta)

    def _on_resume(self, bus: Transport, msg: Message) -> None:
        """A restarted coordinator lost the messages of ``stage``: send ours again."""
        self._resend(bus, str(msg.meta.get("stage", "")))

    def _resend(self, bus: Transport, stage: str) -> None:
        kept = self.sent.get(stage)
        if kept is not None:
            self.log.info("synth.resume_answered", stage=stage)
            bus.publish_nowait(kept[0], kept[1], kept[2])

    async def _await(self, bus: Transport, topic: str, timeout_s: float) -> Message:
        """The next message on ``topic``, answering resume requests meanwhile.

        Raises:
            DeadlineExceeded: nothing on ``topic`` within ``timeout_s`` seconds.
        """
        t = self.topics
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise DeadlineExceeded(topic, timeout_s)
            msg = await wait_any(bus, [topic, t.resume], remaining)
            if msg.topic != t.resume:
                return msg
            self._on_resume(bus, msg)

    async def _replay(self, bus: Transport, plan: RoundPlan) -> None:
        """A plan for a round already released: the same masked vector again (no budget),
        then the round's unmask stage as usual."""
        if not self.released.matches(plan):
            raise ParticipantError(self.id, f"round {plan.round} ({plan.name}) was planned "
                                   "again with other parameters; measuring it twice under "
                                   "the same masks would reveal the difference", code=1)
        self.replays += 1
        self.log.info("synth.round_replayed", round=plan.round)
        await self._round(bus, plan, replay=self.released.vector(plan.round_id))

    def _idle_timeout_s(self) -> float:
        # the coordinator fits the engine and scores quality between rounds and done
        return self.cfg.timeouts.handshake_timeout_s + 3600.0

    async def _join(self, bus: Transport) -> None:
        """Say hello (repeated until the schema comes back), then encode the rows."""
        t = self.topics
        # (no column list: the party checks its columns against the schema itself and
        # reports a mismatch as an error, with the columns that differ)
        hello = {"from": self.id, "role": "party", "rows": int(len(self.frame))}

        def answer(msg: Message) -> bool:
            if msg.topic == t.resume:  # the coordinator's roll call: hello again
                self._on_resume(bus, msg)
                return False
            return True

        try:
            msg = await call_until(bus, say=lambda: self._send(bus, "schema", t.hello, [], hello),
                                   hear=[t.schema, t.resume], peer="coordinator",
                                   timeout_s=self.cfg.timeouts.handshake_timeout_s, interval_s=1.0,
                                   accept=answer)
        except RendezvousTimeout:
            raise ParticipantError(self.id, "no coordinator answered within "
                                   f"{self.cfg.timeouts.handshake_timeout_s:.0f} s",
                                   code=4) from None
        self.schema = Schema.from_dict(msg.meta["schema"])
        session = SessionPlan.from_meta(msg.meta["session"])
        self._check_session(session)  # before anything else is sent
        self.session = session
        self.tree = Tree.from_dict(self.session.tree)
        names = set(self.schema.names)
        have = set(map(str, self.frame.columns))
        if have != names:
            raise ParticipantError(self.id, "its columns differ from the schema: missing "
                                   f"{sorted(names - have)}, extra {sorted(have - names)}",
                                   code=2)
        try:
            self.codes = await asyncio.to_thread(encode, self.frame[list(self.schema.names)],
                                                 self.schema)
        except DomainError as exc:
            raise ParticipantError(self.id, f"its data does not fit the schema: {exc}",
                                   code=2) from None
        self.log.info("synth.party_joined", rows=len(self.frame))

    def _check_session(self, session: SessionPlan) -> None:
        """The session checked against this party's own configuration
        (:func:`synth.plancheck.verify_session`: exactly ``parties`` IDs, a Shamir threshold
        at least ``secagg.threshold``'s floor) before it sends keys or anything else.

        Raises:
            ParticipantError: (code 2) the session is refused; logged
                (``synth.session_refused``), nothing is sent or released.
        """
        cfg = self.cfg
        floor = secagg_threshold_floor(cfg.parties, cfg.secagg.degree, cfg.secagg.threshold)
        try:
            try:
                t = session.secagg().t
            except (ValueError, SecAggError) as exc:  # e.g. a threshold above degree + 1
                raise SessionRefused("threshold", session.threshold, f">= {floor}",
                                     str(exc)) from None
            verify_session(session_parties=session.party_ids, threshold=t,
                           own_parties=cfg.parties, own_threshold_floor=floor)
        except SessionRefused as exc:
            self.log.error("synth.session_refused", error=str(exc), field=exc.field,
                           got=exc.got, expected=exc.expected)
            raise ParticipantError(self.id, str(exc), code=2) from None

    async def _apply_maps(self, plan: RoundPlan) -> None:
        """A plan that carries a (new) domain compression: map the codes once and keep
        them (plans after it say only which round's compression is in force)."""
        if plan.maps is None:
            return
        assert self.codes is not None and self.schema is not None
        maps = {a: np.asarray(v, dtype=np.int64) for a, v in plan.maps.items()}
        if maps:
            self.domain, self.ccodes = await asyncio.to_thread(
                compress_codes, self.codes, self.schema.domain, maps)
        else:
            self.domain, self.ccodes = self.schema.domain, self.codes
        self.maps_round = plan.round

    # ------------------------------------------------------------------ one round
    async def _closed_while_away(self, bus: Transport, plan: RoundPlan) -> bool:
        """A plan found queued after an outage (e.g. the process was paused) whose round
        is already closed: its ``unmask`` is buffered, or a later plan is. The party
        skips it WITHOUT measuring (no budget spent: the coordinator unmasked the round
        without this party) and records it; it rejoins at the next plan it gets in time.
        """
        await asyncio.sleep(0)  # let the reader buffer what the socket already holds
        t = self.topics
        closed = bus.try_next(t.unmask(plan.round))  # nothing else will read it
        if closed is None and bus.pending(t.plan) == 0:
            return False
        self.log.warning("synth.round_skipped", round=plan.round, name=plan.name,
                         why="unmask buffered" if closed is not None else "a later plan")
        self.rounds.append({"round": plan.round, "name": plan.name,
                            "status": "skipped: round closed while this party was away"})
        return True

    def _measure(self, plan: RoundPlan, mu: float) -> np.ndarray:
        """This party's integer noisy marginals for ``plan`` (its own Skellam ``mu``, from
        :meth:`_verify`), mod 2^w per cell (uint64)."""
        assert self.codes is not None and self.schema is not None
        if self.ccodes is None or self.domain is None or self.maps_round != plan.maps_round:
            raise ParticipantError(self.id, f"round {plan.round} counts in the domain "
                                   f"compression of round {plan.maps_round}, which this "
                                   "party never received", code=1)
        return noisy_counts(self.ccodes, self.domain, plan, mu=mu, rng=self.rng)

    def _verify(self, plan: RoundPlan) -> float:
        """The plan checked against the session and this party's own configuration
        (:func:`synth.plancheck.verify_plan`); returns the μ this party adds.

        Raises:
            ParticipantError: (code 2) the plan is refused; logged, nothing released.
        """
        assert self.session is not None
        dom = self.domain if self.domain is not None else (
            self.schema.domain if self.schema is not None else None)
        shape = ({} if dom is None else
                 dict(zip(dom.attributes, (int(n) for n in dom.sizes), strict=True)))
        try:
            return verify_plan(
                n_parties=plan.n_parties, min_survivors=plan.min_survivors,
                min_honest=plan.min_honest,
                noise_model=plan.noise_model, step=plan.step, rho=plan.rho,
                sigma2_central=plan.sigma2_central, cliques=plan.cliques, sizes=plan.sizes,
                session_parties=self.session.party_ids, domain_shape=shape,
                own_parties=self.cfg.parties, own_min_survivors=self.cfg.secagg.min_survivors,
                own_min_honest=self.cfg.secagg.min_honest,
                own_noise_model=self.cfg.secagg.noise_model, private=self.cfg.private,
                remaining_rho=(self.accountant.remaining if self.accountant is not None
                               else math.inf))
        except (PlanRefused, SkellamAccountingError) as exc:
            self.log.error("synth.plan_refused", round=plan.round, error=str(exc),
                           field=getattr(exc, "field", None))
            raise ParticipantError(self.id, f"round {plan.round} ({plan.name}): {exc}",
                                   code=2) from None

    def _wait_s(self) -> float:
        # each answer comes after a stage of the others
        assert self.session is not None
        return self.session.timeout_s * 3 + 5.0

    async def _keys(self, bus: Transport) -> None:
        """Once per session: advertise keys, receive the neighbours' keys. A party that
        misses the stage sits the session out (the run goes on without it)."""
        assert self.session is not None
        t = self.topics
        if self.id not in self.session.party_ids:
            return
        client = SecAggClient(self.id, self.session.secagg())
        pk = client.public_keys()
        s = self.session.index
        self._send(bus, "keys", t.pk(s),
                   [np.frombuffer(pk.mask_public + pk.enc_public, np.uint8)], {"from": self.id})
        try:
            msg = await self._await(bus, t.nk(s, self.id), self._wait_s())
            client.receive_public_keys(
                {p: PartyKeys(party=p, mask_public=b[:32], enc_public=b[32:])
                 for p, b in unpack_blobs(msg.meta, msg.arrays[0]).items()})
        except (DeadlineExceeded, SecAggError) as exc:
            self.log.warning("synth.keys_missed", error=str(exc))
            return
        self.client = client

    async def _seeds(self, bus: Transport, b: int, rounds: list[str]) -> None:
        """Once per seed batch: share a fresh self-mask seed per round with the neighbours."""
        t = self.topics
        if self.client is None:
            return
        stage = f"seeds:{b}"
        if stage in self.sent:  # a restarted coordinator announced the batch again
            self._resend(bus, stage)
            return
        meta, arr = pack_blobs(self.client.share_seeds(rounds))
        self._send(bus, stage, t.sh(b), [arr], {"from": self.id, **meta})
        try:
            msg = await self._await(bus, t.rs(b, self.id), self._wait_s())
            self.client.receive_seed_shares(rounds, unpack_blobs(msg.meta, msg.arrays[0]))
        except (DeadlineExceeded, SecAggError) as exc:
            self.log.warning("synth.seeds_missed", batch=b, error=str(exc))
            return
        self.seeded.update(rounds)

    async def _round(self, bus: Transport, plan: RoundPlan, *,
                     replay: np.ndarray | None = None) -> None:
        """Measure, mask and send the round's vector (or, with ``replay``, send the one
        released before again), then reveal what the unmask stage asks for."""
        t, r = self.topics, plan.round
        assert self.client is not None and self.tree is not None
        leaf = self.tree.parent[self.id]
        if replay is None:
            mu = await asyncio.to_thread(self._verify, plan)  # before any spend or release
            if self.accountant is not None and plan.rho > 0:
                rho = len(plan.cliques) * plan.rho
                try:
                    self.accountant.spend(rho, what=f"round {r} ({plan.name})")
                except BudgetExceeded as exc:
                    raise ParticipantError(self.id, str(exc), code=1) from None
                if self.ledger is not None:  # before anything is released
                    await asyncio.to_thread(self.ledger.write, self.accountant)
            codes = await asyncio.to_thread(self._measure, plan, mu)
            masked = await asyncio.to_thread(self.client.masked, plan.spec(), codes)
            arr = words_to_array(masked, plan.widths)
            self.released.keep(plan, arr)
        else:
            arr = replay
        up = {"from": self.id, "ids": [self.id]}
        bus.publish_nowait(t.up(r, leaf), [arr], up, copy=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s() * 2
        while True:
            try:
                msg = await wait_any(bus, [t.unmask(r), t.plan, t.resume],
                                     max(deadline - loop.time(), 0.0))
            except DeadlineExceeded as exc:
                self.log.warning("synth.round_missed", round=r, waited=exc.topic)
                self.rounds.append({"round": r, "name": plan.name, "status": "missed"})
                return
            if msg.topic == t.resume:
                self._on_resume(bus, msg)
                continue
            if msg.topic == t.plan:
                again = RoundPlan.from_message(msg.meta, msg.arrays)
                if again.round_id != plan.round_id:  # a later round: this one closed
                    bus.unget(msg)
                    self.rounds.append({"round": r, "name": plan.name, "status": "missed"})
                    return
                # the coordinator restarted during this round: the same vector again
                if not self.released.matches(again):
                    raise ParticipantError(self.id, f"round {r} ({plan.name}) was planned "
                                           "again with other parameters", code=1)
                self.replays += 1
                bus.publish_nowait(t.up(r, leaf), [arr], up, copy=False)
                deadline = loop.time() + self._wait_s() * 2
                continue
            break
        survivors, dropped = msg.meta["survivors"], msg.meta["dropped"]
        if self.id in survivors:
            try:
                check_survivors(len(survivors), resolve_min_survivors(
                    self.cfg.secagg.min_survivors, len(self.session.party_ids)))
            except SurvivorRefusal as exc:  # the sum would carry less noise than charged
                self.log.warning("synth.reveal_refused", round=r, error=str(exc),
                                 survivors=len(survivors), min_survivors=exc.min_survivors)
                self.rounds.append({"round": r, "name": plan.name,
                                    "status": f"reveal refused: {exc}"})
                return
            try:
                shares = self.client.reveal_all(plan.round_id, survivors, dropped)
            except SecAggError as exc:  # e.g. a restarted coordinator's other dropout set
                self.log.warning("synth.reveal_refused", round=r, error=str(exc))
                self.rounds.append({"round": r, "name": plan.name,
                                    "status": f"reveal refused: {exc}"})
                return
            for topic, arrays, meta in reveal_messages(
                    shares, party=self.id, round=r, tree=self.tree, topics=t,
                    unmask=self.cfg.secagg.unmask):
                bus.publish_nowait(topic, arrays, meta)
        self.rounds.append({"round": r, "name": plan.name, "cells": plan.vector_len,
                            "status": "counted" if self.id in survivors else "dropped",
                            **({"replayed": True} if replay is not None else {})})


__all__ = ["SynthParty", "bus_config", "topic_limits"]
