"""A party's scoring, apart from its training loop: the passive party's releases of
validation and test embeddings from its parameter server (counted in its DP ledger,
noised under DP, compressed after the noise), the active party's score of a split with
every partner's embeddings, and its active-only baseline.

Owns: :class:`Evaluation`. May import :mod:`pubsub`, :mod:`parties.core`,
:mod:`parties.algorithms`, :mod:`parties.config`, :mod:`parties.privacy`,
:mod:`parties.data` and :mod:`parties.models`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pubsub import DeadlineExceeded
from pubsub.transport import Transport

from parties.algorithms.intake import TensorSpec
from parties.algorithms.wire import META_KEY as WIRE_META, WireFormatError, decode_rows, encode_message
from parties.core.errors import PartnerStalled
from parties.core.tasks import compute_metric
from parties.models.model import ParameterServer, embed, load_flat, predict
from parties.privacy.dp import EmbeddingPrivatizer, GdpAccountant
from parties.runtime.context import PartyContext, PartyPart


class Evaluation(PartyPart):
    """Scores and evaluation releases of one party.

    Args:
        ctx: the party's context.
        ps: the party's parameter server (what is scored).
        bottom / top: the party's scoring copies of its models (top: active party).
        fuse: the active party's fusing of its partners' embeddings, or None.
        dp_acct: the passive party's DP ledger (None for the active party).
        eval_privatize: under DP, the privatizer of each evaluation split's release.
    """

    def __init__(self, ctx: PartyContext, *, ps: ParameterServer, bottom: torch.nn.Module,
                 top: torch.nn.Module | None, fuse: Any, dp_acct: GdpAccountant | None,
                 eval_privatize: dict[str, EmbeddingPrivatizer] | None) -> None:
        super().__init__(ctx)
        self.ps = ps
        self._bottom = bottom
        self._top = top
        self.fuse = fuse
        self.dp_acct = dp_acct
        self._eval_privatize = eval_privatize
        self._x_test = torch.from_numpy(np.ascontiguousarray(ctx.data.x_test))
        self._x_val = torch.from_numpy(np.ascontiguousarray(ctx.data.x_val))
        #: passive: the last scoring releases as sent, by topic, to publish again on
        #: request (the same bytes: under DP the same release, nothing more spent)
        self._sent: dict[str, tuple[Any, ...]] = {}
        #: active: the last validation point scored (what "scored" says), and the
        #: decision on scoring in flight it told the passive parties (point -1)
        self.last_scored: int | None = None
        self.overlap_meta: dict[str, Any] | None = None
        self.asked = 0  # requests this party made for a message again
        self.resent = 0  # messages this party published again on request
        #: active: the end of the run said (``done`` published), and the passive parties
        #: that acknowledged it
        self.done_sent = False
        #: active: publishes a gradient again (the driver's kept ones), or None
        self.grad_again: Callable[[str], bool] | None = None
        self.done_acked: set[str] = set()
        self._acked = asyncio.Event()

    # -------------------------------------------------- lost scoring messages
    # A scoring exchange happens once (a release per split), so a message lost to a
    # broker restart would leave the other side waiting out its deadline. The waiting
    # side asks again (ctl/<run>/resend/<party>) every timeouts.resend_interval_s; the
    # other publishes again what it last sent there.

    @property
    def scoring_wait_s(self) -> float:
        """How long one side waits for the other's word at a scoring point: the liveness
        timeout, plus the time the other may still spend on its last batches of the
        epoch (each reassigned up to ``timeouts.max_reassign`` times, T_ddl each: a
        gradient lost to a broker restart is waited for that long before the batch is
        given up). A partner that is gone is found by the watchdog (its heartbeats)
        within the liveness timeout either way."""
        t = self.cfg.timeouts
        return t.liveness_timeout_s + (t.max_reassign + 1) * t.t_ddl_s

    def _slice(self, deadline: float) -> float:
        """How long the next wait lasts: the rest of ``deadline``, or less when asking
        again is on."""
        left = max(0.0, deadline - time.monotonic())
        every = self.cfg.timeouts.resend_interval_s
        return min(every, left) if every > 0 else left

    def _ask(self, bus: Transport, party: str, topic: str, point: int = -1, *,
             quiet: bool = False) -> None:
        """Ask ``party`` to publish again what it last sent on ``topic`` (``quiet``: no
        warning line; a training gradient's wait may simply be slow)."""
        self.asked += 1
        if not quiet:
            self.log.warning("vfl.scoring_resend_asked", partner=party, topic=topic,
                             asked=self.asked)
        bus.publish_nowait(self.topics.resend(party), (), {"topic": topic, "point": point})

    def ask_gradient(self, bus: Transport) -> Callable[[str], None]:
        """Passive: a function that asks the active party to publish the gradient on a
        topic again (a training wait that has lasted ``timeouts.resend_interval_s``)."""

        return lambda topic: self._ask(bus, "active", topic, quiet=True)

    def publish_scored(self, bus: Transport, point: int) -> None:
        """Active: validation point ``point`` is scored: the passive parties may go on."""
        self.last_scored = point
        bus.publish_nowait(self.topics.scored, (), {"point": point})

    async def serve_resends(self, bus: Transport) -> None:
        """Answer requests to publish a scoring message again, for the run's life: the
        passive party its last embeddings on the asked topic (if it sent them), the
        active party its last "scored" (if it has scored that far)."""
        mine = self.topics.resend("active" if self.role == "active" else self.party)
        while True:
            try:
                msg = await bus.next(mine, 3600.0)
            except DeadlineExceeded:
                continue
            topic = str(msg.meta.get("topic", ""))[:256]
            if self.role == "active":
                if topic.startswith("grad/") and self.grad_again is not None:
                    if self.grad_again(topic):  # sent, then lost? the same bytes again
                        self.resent += 1
                    continue
                if topic == self.topics.done:  # a passive party's ack, or its request
                    if msg.meta.get("ack") is True:
                        self.done_acked.add(str(msg.meta.get("party", ""))[:64])
                        if self.done_acked >= set(self.partners):
                            self._acked.set()
                    elif self.done_sent:
                        bus.publish_nowait(self.topics.done, (), {"ok": True})
                        self.resent += 1
                    continue
                want = msg.meta.get("point", -1)
                if topic != self.topics.scored or not isinstance(want, int):
                    continue
                if want < 0 and self.overlap_meta is not None:  # the decision on overlap
                    bus.publish_nowait(self.topics.scored, (), self.overlap_meta)
                    self.resent += 1
                elif self.last_scored is not None and 0 <= want <= self.last_scored:
                    self.publish_scored(bus, self.last_scored)
                    self.resent += 1
                continue
            frames = self._sent.get(topic)
            if frames is not None:
                bus.publish_nowait(topic, *frames)
                self.resent += 1
                self.log.info("vfl.scoring_resent", topic=topic, resent=self.resent)

    def publish_kept(self, bus: Transport, topic: str, meta: dict[str, Any]) -> None:
        """Passive: publish a message without arrays on ``topic`` (its end-of-run report)
        and keep it, to publish again if the active party asks (lost to a restart)."""
        frames = ((), meta)
        self._keep(topic, frames)
        bus.publish_nowait(topic, *frames)

    def _keep(self, topic: str, frames: tuple[Any, ...]) -> None:
        self._sent[topic] = frames
        while len(self._sent) > 4:  # the last few points, the test split and the report
            del self._sent[next(iter(self._sent))]

    async def await_report(self, bus: Transport, party: str, topic: str,
                           deadline: float) -> dict[str, Any] | None:
        """Active: ``party``'s end-of-run report on ``topic``, asked for again every
        ``timeouts.resend_interval_s`` until ``deadline`` (monotonic); None when it never
        came (the caller warns: the run's own figures stand without it)."""
        while True:
            try:
                rep = await bus.next(topic, self._slice(deadline))
                return dict(rep.meta)
            except DeadlineExceeded:
                if time.monotonic() >= deadline:
                    return None
                self._ask(bus, party, topic)

    async def end_run(self, bus: Transport) -> bool:
        """Active: say the run is over (``done``) and wait until every passive party has
        acknowledged it, saying it again every ``timeouts.resend_interval_s`` (lost to a
        broker restart?), for at most half the liveness timeout (a passive party that is
        gone cannot answer; its watchdog's timeout is not reached). False: some never
        acknowledged (the caller warns; the run's figures stand)."""
        self.done_sent = True
        deadline = time.monotonic() + 0.5 * self.cfg.timeouts.liveness_timeout_s
        while True:
            bus.publish_nowait(self.topics.done, (), {"ok": True})
            try:
                await asyncio.wait_for(self._acked.wait(), self._slice(deadline))
                return True
            except TimeoutError:
                if time.monotonic() >= deadline:
                    return False

    async def await_done(self, bus: Transport) -> bool:
        """Passive: wait for the active party's ``done`` (asking for it again every
        ``timeouts.resend_interval_s``), then acknowledge it; at most the liveness timeout
        plus T_ddl. False: it never came (the caller warns; this party's figures stand)."""
        t = self.topics
        bound = self.cfg.timeouts.liveness_timeout_s + self.cfg.timeouts.t_ddl_s
        deadline = time.monotonic() + bound
        while True:
            try:
                await bus.next(t.done, self._slice(deadline))
                break
            except DeadlineExceeded:
                if time.monotonic() >= deadline:
                    return False
                self._ask(bus, "active", t.done)
        bus.publish_nowait(t.resend("active"), (), {"topic": t.done, "ack": True,
                                                     "party": self.party})
        await asyncio.sleep(0.02)  # let the acknowledgement leave before the bus closes
        return True

    def resend_counts(self, asked_before: int = 0) -> dict[str, int]:
        """``asked``: requests made (``asked_before``: those of the handshake);
        ``resent``: messages published again on request."""
        return {"asked": self.asked + asked_before, "resent": self.resent}

    async def await_scored(self, bus: Transport, point: int) -> None:
        """Passive: wait until the active party has scored validation point ``point``.

        Raises:
            PartnerStalled: no word within :attr:`scoring_wait_s`.
        """
        bound = self.scoring_wait_s
        deadline = time.monotonic() + bound
        while True:
            try:
                msg = await bus.next(self.topics.scored, self._slice(deadline))
            except DeadlineExceeded:
                if time.monotonic() < deadline:  # a slice: ask again (a lost "scored"?)
                    self._ask(bus, "active", self.topics.scored, point)
                    continue
                raise PartnerStalled("active", "val", bound,
                                     f"validation point {point} never scored") from None
            if int(msg.meta.get("point", -1)) >= point:
                return

    async def publish_embeddings(self, bus: Transport, split: str, topic: str) -> None:
        """Publish the embeddings of the ``val`` (scored subsample) or ``test`` split from
        the PS parameters (counted in the DP ledger first)."""
        load_flat([self._bottom], self.ps.pull())
        x = self._x_val if split == "val" else self._x_test
        emb = await asyncio.to_thread(self.embeddings, x, split)
        assert self.dp_acct is not None
        self.dp_acct.record(split)
        # encoded after the clip and noise (DP post-processing, parties.algorithms.wire)
        frames = encode_message([emb], {"split": split}, self.cfg.effective_wire_dtype)
        self._keep(topic, frames)
        bus.publish_nowait(topic, *frames, copy=False)

    def embeddings(self, x: torch.Tensor, split: str) -> np.ndarray:
        """Embeddings ``(n, d)`` float32 of ``x`` (the ``split`` rows) from the PS
        parameters: clipped and noised with the split's noise when DP is on (a thread's
        work)."""
        emb = embed(self._bottom, x)
        if self._eval_privatize is None:
            return emb
        return self._eval_privatize[split](torch.from_numpy(emb))[1].numpy()

    def active_only(self) -> dict[str, Any] | None:
        """The active-only baseline (:func:`parties.algorithms.baseline.active_only_baseline`) on this
        party's own columns and labels, same rows, after training; None when
        ``vfl.active_only_baseline`` does not ask for it, and a ``skipped`` note where it
        cannot apply (regression, streamed rows, no validation rows)."""
        cfg, data = self.cfg, self.data
        want = cfg.active_only_baseline
        if want == "off" or (want == "auto" and not (cfg.dp.enabled or cfg.labels.protected)):
            return None
        if data.task != "binary":
            return {"skipped": "binary tasks only (regression is not covered)"}
        if data.cache_dir:
            return {"skipped": "streamed rows (vfl.data.stream) are not covered"}
        if len(data.x_val) == 0:
            return {"skipped": "no validation rows to choose on"}
        from parties.algorithms.baseline import active_only_baseline

        try:
            return active_only_baseline(data.x_train, data.y_train, data.x_val, data.y_val,
                                        data.x_test, data.y_test, task=data.task,
                                        seed=cfg.seed)
        except Exception as exc:  # noqa: BLE001 - a reference figure never ends a run
            self.log.warning("vfl.active_only_failed", error=f"{type(exc).__name__}: {exc}")
            return {"skipped": f"failed: {type(exc).__name__}: {exc}"}

    async def score(self, bus: Transport, split: str, point: int = 0,
                     taken: list[float] | None = None) -> float:
        """The metric (AUC, or RMSE in the label's units) of the PS parameters on the
        ``val`` (validation point ``point``) or ``test`` split, with every passive
        party's embeddings of it (waited for up to :attr:`scoring_wait_s` in all).
        ``taken`` (a list): the ``perf_counter`` time the scored parameters were taken
        from the PS is appended (the model scored existed then; scoring it took longer)."""
        cfg, data, t = self.cfg, self.data, self.topics
        assert self._top is not None
        x, y = (self._x_val, data.y_val) if split == "val" else (self._x_test, data.y_test)
        assert y is not None
        spec = TensorSpec(width=cfg.model.embedding_dim, max_rows=len(x), rows=len(x))
        deadline = time.monotonic() + self.scoring_wait_s
        embs = []
        for party in self.partners:
            q = party if self.multi else ""
            topic = t.val(point, q) if split == "val" else t.test_of(q)
            while True:  # the partner's embeddings of the split (others' are dropped)
                try:
                    msg = await bus.next(topic, self._slice(deadline))
                except DeadlineExceeded:
                    if time.monotonic() < deadline:  # a slice: ask again (lost?)
                        self._ask(bus, party, topic)
                        continue
                    raise PartnerStalled(party if self.multi else self.partner, split,
                                         self.scoring_wait_s,
                                         "embeddings for scoring") from None
                tag = msg.meta.get(WIRE_META)
                if tag is not None:  # sent compressed (parties.algorithms.wire): float32 again
                    try:
                        msg = dataclasses.replace(msg, arrays=(decode_rows(msg.arrays, tag),))
                    except WireFormatError as exc:
                        self.intake.reject(msg.publisher, str(exc), topic=msg.topic,
                                           fatal=True)
                        continue
                # one release per split: a bad one from the partner cannot be waited out
                if self.intake.admit(msg, spec, fatal=True):
                    break
            embs.append(msg.arrays[0])
        load_flat([self._bottom, self._top], self.ps.pull())
        if taken is not None:
            taken.append(time.perf_counter())
        pred = await asyncio.to_thread(predict, self._bottom, self._top, x,
                                       embs[0] if len(embs) == 1 else embs, task=data.task,
                                       fuse=self.fuse)
        if data.task == "regression":
            pred = pred.astype(np.float64) * data.label_std + data.label_mean
        return compute_metric(data.task, y, pred)


__all__ = ["Evaluation"]
