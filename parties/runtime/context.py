"""What every piece of a party reads of it: the run's configuration, the party's role
and id, whom it trains with, the run's topics, the checks of what partners send, its
logger and its data (:class:`PartyContext`), and the base of the pieces that read them
as their own (:class:`PartyPart`: the session, the evaluation).

Owns: the two classes. May import :mod:`parties.config` and :mod:`parties.data`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parties.config import VflConfig
from parties.data.party import PartyData


@dataclass(frozen=True, kw_only=True, slots=True)
class PartyContext:
    """A party's fixed facts for its run.

    Attributes:
        cfg: the run configuration.
        role / party: the party's role and id.
        partners: the parties it trains with (every passive party, or the active).
        multi: several passive parties (topics name the passive party).
        topics: the run's topic names (:class:`parties.runtime.party.Topics`).
        intake: the checks of what partners send (learns their client ids).
        log: the party's bound logger.
        run_id: the run.
        data: the party's data.
    """

    cfg: VflConfig
    role: str
    party: str
    partners: tuple[str, ...]
    multi: bool
    topics: Any
    intake: Any
    log: Any
    run_id: str
    data: PartyData

    @property
    def partner(self) -> str:
        """The partner's role (``passive`` for the active party, else ``active``)."""
        return "passive" if self.role == "active" else "active"


class PartyPart:
    """A piece of a party: its context's fields are the piece's own attributes."""

    def __init__(self, ctx: PartyContext) -> None:
        self.ctx = ctx
        self.cfg, self.role, self.party = ctx.cfg, ctx.role, ctx.party
        self.partners, self.partner, self.multi = ctx.partners, ctx.partner, ctx.multi
        self.topics, self.intake, self.log = ctx.topics, ctx.intake, ctx.log
        self.run_id, self.data = ctx.run_id, ctx.data


__all__ = ["PartyContext", "PartyPart"]
