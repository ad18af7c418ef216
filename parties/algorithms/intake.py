"""Checks on what the partner sends before any of it is used (pure logic, no I/O).

Every embedding and gradient a party takes off the bus passes :meth:`PeerIntake.admit`
first: exactly one 2-D float32 array of the agreed width, at most a batch of rows, every
value finite, integer epoch/batch/key metadata, and metadata within the run's plan
(:class:`RunPlan`: an epoch of the run, a batch id of the epoch's batch order, the channel
it came on; a far-future copy must not occupy a channel, nor be waited for as "a message of
a later epoch", which once cost 20 of 336 batches silently). A message that fails is dropped and
counted per sender (its bus client id); a warning is logged on the first of an episode and
then every 100th. Malformed messages from the partner itself (the client id its
handshake came from) end the run after ``max_bad`` of them
(:class:`parties.core.errors.PartnerMisbehaved`, exit code 4); those from any other sender
never do (they cannot stop a run, only be counted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from parties.core.errors import PartnerMisbehaved

#: metadata keys that must be integers when present
INT_META = ("e", "b", "k", "point")
#: senders tracked individually; beyond this, the rest share one counter
MAX_SENDERS = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """What a message of one kind must hold: one ``(rows, width)`` float32 array with
    ``1 <= rows <= max_rows`` (``rows`` exactly, when given)."""

    width: int
    max_rows: int
    rows: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    """The run's schedule: what a partner's message may claim. Reassigned attempts reuse
    their batch's id, so they are within it too.

    Attributes:
        epochs: the run's epochs: ``e`` in ``[0, epochs)``.
        batches: batch ids of every epoch's batch order: ``b`` in ``[0, batches)``.
        channels: per-batch channels subscribed: a channel in ``[0, channels)``.
        channel_is_batch: channel ``c`` carries batch ``c`` (every algorithm but
            ``vfl-ps``, whose channels are worker pairs: there ``k`` must be the channel).
    """

    epochs: int
    batches: int
    channels: int
    channel_is_batch: bool = True

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batches < 1 or self.channels < 1:
            raise ValueError(f"a plan needs epochs, batches and channels >= 1, got "
                             f"{self.epochs}, {self.batches}, {self.channels}")


def check_plan(meta: Mapping[str, Any], plan: RunPlan, channel: int | None = None
               ) -> str | None:
    """None if the message's epoch ``e``, batch ``b`` and pair ``k`` (where present, as
    integers: :func:`check_meta` first) and the ``channel`` it came on (None: not a
    per-batch channel) lie within ``plan``, else the reason."""
    e, b, k = meta.get("e"), meta.get("b"), meta.get("k")
    if isinstance(e, int) and not 0 <= e < plan.epochs:
        return f"epoch {e} outside the run's plan (0..{plan.epochs - 1})"
    if isinstance(b, int) and not 0 <= b < plan.batches:
        return f"batch {b} outside the run's plan (0..{plan.batches - 1})"
    if channel is None:
        return None
    if not 0 <= channel < plan.channels:
        return f"channel {channel} outside the run's plan (0..{plan.channels - 1})"
    if plan.channel_is_batch:
        if isinstance(b, int) and b != channel:
            return f"batch {b} on channel {channel}"
    elif isinstance(k, int) and k != channel:
        return f"pair {k} on channel {channel}"
    return None


def check_meta(meta: Mapping[str, Any]) -> str | None:
    """None if the metadata's integer fields are integers, else the reason."""
    for key in INT_META:
        v = meta.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            return f"meta {key!r} is {type(v).__name__}, expected an integer"
    return None


def is_skip_notice(msg: Any) -> bool:
    """A party's notice that it gave a batch up (``skip`` true, no arrays): the active
    party's on the batch's gradient channel, or the passive party's on its embedding
    channel when its DP reassignment reserve refused a reassigned attempt
    (:class:`parties.algorithms.strategy.ScheduledPassive`): no tensor to check.
    A ``skip`` message that carries arrays is checked like any other."""
    return msg.meta.get("skip") is True and len(msg.arrays) == 0


def check_tensor(arrays: Any, spec: TensorSpec) -> str | None:
    """None if ``arrays`` is one array meeting ``spec``, else the reason."""
    if len(arrays) != 1:
        return f"{len(arrays)} arrays, expected 1"
    a = arrays[0]
    if not isinstance(a, np.ndarray):
        return f"payload is {type(a).__name__}, expected an array"
    if a.dtype != np.float32:
        return f"dtype {a.dtype}, expected float32"
    if a.ndim != 2 or a.shape[1] != spec.width:
        return f"shape {a.shape}, expected (rows, {spec.width})"
    n = a.shape[0]
    if spec.rows is not None and n != spec.rows:
        return f"{n} rows, expected {spec.rows}"
    if not 1 <= n <= spec.max_rows:
        return f"{n} rows, expected 1..{spec.max_rows}"
    if not np.isfinite(a).all():
        return "values that are not finite (NaN or infinite)"
    return None


class PeerIntake:
    """Judges the partner's messages and counts the bad ones per sender.

    Args:
        partner: the partner's role (for errors).
        max_bad: malformed messages from the partner that end the run.
        log: a structlog logger (``vfl.peer_message_rejected`` warnings).
        plan: the run's schedule (:class:`RunPlan`); messages outside it are malformed
            (None: not checked).

    Attributes:
        partners: the partners' client ids (learned in the handshake) and how errors
            name each (an active party has one per passive party); empty: not known yet,
            every sender is judged as the partner.
        bad: malformed messages by sender (at most :data:`MAX_SENDERS`, the rest "*").
        out_of_plan: of them, those outside the plan (from the partner: another sender's
            are refused first as not the partner's).
    """

    def __init__(self, *, partner: str, max_bad: int, log: Any,
                 plan: RunPlan | None = None) -> None:
        if max_bad < 1:
            raise ValueError(f"max_bad must be >= 1, got {max_bad!r}")
        self.partner = partner
        self.max_bad = max_bad
        self.log = log
        self.partners: dict[str, str] = {}
        self.bad: dict[str, int] = {}
        self.plan = plan
        self.out_of_plan = 0

    @property
    def partner_id(self) -> str | None:
        """The one partner's client id (None: not known yet, or several partners)."""
        return next(iter(self.partners)) if len(self.partners) == 1 else None

    @partner_id.setter
    def partner_id(self, publisher: str | None) -> None:
        self.partners = {} if publisher is None else {publisher: self.partner}

    def admit(self, msg: Any, spec: TensorSpec | None, *, fatal: bool = False,
              channel: int | None = None) -> bool:
        """True if ``msg`` may be used; False: dropped and counted. Once the partner's
        client id is known (:attr:`partner_id`), a message from any other sender is
        dropped whatever it holds; ``spec`` None: no array check (metadata only).
        ``channel``: the per-batch channel it came on (checked against the plan).
        ``fatal``: see :meth:`reject`.

        Raises:
            PartnerMisbehaved: the partner's ``max_bad``-th malformed message, or a
                ``fatal`` one.
        """
        if self.partners and msg.publisher not in self.partners:
            reason: str | None = "not from the partner"
        else:
            reason = check_meta(msg.meta)
            if reason is None and self.plan is not None:
                reason = check_plan(msg.meta, self.plan, channel)
                if reason is not None:
                    self.out_of_plan += 1
            if reason is None and spec is not None and not is_skip_notice(msg):
                reason = check_tensor(msg.arrays, spec)
        if reason is None:
            return True
        self.reject(msg.publisher, reason, topic=msg.topic, fatal=fatal)
        return False

    def reject(self, publisher: str, reason: str, *, topic: str = "",
               fatal: bool = False) -> None:
        """Count one malformed message of ``publisher`` (see :meth:`admit`); ``fatal``:
        the partner's message cannot be dropped without breaking the protocol (it was
        already taken for its batch), so the run ends now.

        Raises:
            PartnerMisbehaved: the partner's ``max_bad``-th malformed message, or a
                ``fatal`` one.
        """
        key = publisher if publisher in self.bad or len(self.bad) < MAX_SENDERS else "*"
        n = self.bad[key] = self.bad.get(key, 0) + 1
        is_partner = not self.partners or publisher in self.partners
        if n == 1 or n % 100 == 0 or fatal:
            self.log.warning("vfl.peer_message_rejected", publisher=publisher[:64],
                             partner=is_partner, topic=topic[:80], reason=reason, count=n)
        if is_partner and (n >= self.max_bad or fatal):
            raise PartnerMisbehaved(self.partners.get(publisher, self.partner), publisher,
                                    reason, n)

    @property
    def rejected(self) -> int:
        """Malformed messages dropped so far, all senders."""
        return sum(self.bad.values())
