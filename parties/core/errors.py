"""Typed errors of the VFL parties."""

from __future__ import annotations


class VflError(Exception):
    """Root of VFL party errors."""


class PartnerLost(VflError, ConnectionError):
    """The partner party's heartbeats stopped.

    Attributes:
        partner: ``"active"`` or ``"passive"``.
        silent_s: how long nothing was heard, seconds.
    """

    def __init__(self, partner: str, silent_s: float) -> None:
        self.partner = partner
        self.silent_s = silent_s
        super().__init__(
            f"the {partner} party sent no heartbeat for {silent_s:.1f} s "
            "(process died, or its link to the broker is down)"
        )


class HandshakeTimeout(VflError, TimeoutError):
    """The partner party did not appear on the bus in time.

    Attributes:
        partner: the role waited for.
        timeout_s: the deadline, seconds.
    """

    def __init__(self, partner: str, timeout_s: float, run_id: str) -> None:
        self.partner = partner
        self.timeout_s = timeout_s
        super().__init__(
            f"no {partner} party joined run {run_id!r} within {timeout_s:.0f} s "
            "(is it started, with the same --run-id and --broker? or did it refuse before "
            "joining: see its own output)"
        )


class ConfigMismatch(VflError, ValueError):
    """The two parties were started with incompatible shared settings or data.

    Attributes:
        mine / theirs: the two parties' shared-setting digests.
        party: the party id of ``theirs`` (None: not known).
    """

    def __init__(self, mine: dict[str, object], theirs: dict[str, object], *,
                 party: str | None = None) -> None:
        self.mine = mine
        self.theirs = theirs
        self.party = party
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        detail = ", ".join(f"{k}: ours {mine.get(k)!r} vs theirs {theirs.get(k)!r}" for k in diff)
        who = "the parties disagree" if party is None else f"the {party} party disagrees with us"
        super().__init__(f"{who} on shared settings ({detail})")


class WorkerFailed(VflError, RuntimeError):
    """A worker process died or raised.

    Attributes:
        worker: the worker's index.
        detail: what happened.
    """

    def __init__(self, worker: int, detail: str) -> None:
        self.worker = worker
        self.detail = detail
        super().__init__(f"worker {worker} failed: {detail}")


class PrivacyBudgetExceeded(VflError, RuntimeError):
    """A publication would take a record past the number of publications the noise
    multiplier was calibrated for (the target µ would no longer hold); nothing was
    published.

    Attributes:
        group: ``"train"`` or ``"test"``.
        publications: the count the publication would have reached.
        planned: the calibrated maximum.
    """

    def __init__(self, group: str, publications: int, planned: int) -> None:
        self.group = group
        self.publications = publications
        self.planned = planned
        super().__init__(f"publishing would give a {group} record {publications} publications, "
                         f"but the noise was calibrated for at most {planned}: refusing "
                         "(the privacy target would no longer hold)")


class PartnerStalled(VflError, TimeoutError):
    """The partner's data for a step did not come within the wait bound although no
    deadline-based dropping applies (``t_ddl_s = 0``, or an algorithm that never drops:
    ``vfl``, ``vfl-ps``), so the run cannot make progress.

    Attributes:
        partner: ``"active"`` or ``"passive"``.
        what: what was waited for (``"emb"``, ``"grad"``, ``"ids"``, ``"val"``, ``"test"``).
        waited_s: the bound, seconds (the liveness timeout).
    """

    def __init__(self, partner: str, what: str, waited_s: float, detail: str = "") -> None:
        self.partner = partner
        self.what = what
        self.waited_s = waited_s
        super().__init__(f"no {what} data from the {partner} party within {waited_s:.1f} s"
                         + (f" ({detail})" if detail else "")
                         + "; it is stuck or gone")


class RunAborted(VflError, ConnectionError):
    """The active party ended the run because of another party (several passive parties:
    one was lost, stalled or misbehaved), and said so on the run's ``abort`` topic, so
    that the others stop now instead of after their own liveness timeout (exit code 4).

    Attributes:
        party: the party that ended the run (its id).
        reason: the active party's error, one line.
    """

    def __init__(self, party: str, reason: str) -> None:
        self.party = party
        self.partner = party
        self.reason = reason
        super().__init__(f"the active party ended the run because of the {party} party: "
                         f"{reason}")


class PartnerMisbehaved(VflError, ValueError):
    """The partner party sent ``count`` malformed messages (wrong shape or dtype, values
    that are not finite, bad metadata): the run cannot trust it (exit code 4, as for a
    lost partner). Malformed messages from other senders are dropped and counted, never
    this error.

    Attributes:
        partner: ``"active"`` or ``"passive"``.
        publisher: the partner's bus client id.
        reason: what was wrong with the last one.
        count: malformed messages from it so far.
    """

    def __init__(self, partner: str, publisher: str, reason: str, count: int) -> None:
        self.partner = partner
        self.publisher = publisher
        self.reason = reason
        self.count = count
        super().__init__(f"the {partner} party (bus client {publisher!r}) sent {count} "
                         f"malformed messages; the last: {reason}")


class NonFiniteTraining(VflError, FloatingPointError):
    """Training produced a loss or parameters that are not finite (NaN or infinite; e.g.
    values in the data beyond float32's range): the run stops instead of reporting a
    NaN model.

    Attributes:
        where: what was not finite (e.g. ``"loss of batch 3, epoch 0"``).
    """

    def __init__(self, where: str) -> None:
        self.where = where
        super().__init__(f"training diverged: the {where} is not finite (check the data "
                         "for huge values; lower lr)")
