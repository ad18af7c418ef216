"""The actions a sans-IO VFL strategy (:mod:`parties.algorithms.strategy`) yields, and their results.

A strategy is a set of plain Python generators, one per worker (plus, under ``vfl-ps``,
one per parameter server): each ``yield action`` hands one of the frozen dataclasses
below to an *interpreter* and receives the action's result back (``gen.send``). Two
interpreters run the same strategies: :class:`parties.runtime.driver.ActionDriver` over a real
bus and real workers (asyncio), and :mod:`sim.cluster.des` over a simulated clock, CPU and link.

Payloads are opaque to a strategy: what :class:`Forward` returns goes unchanged into a
:class:`Publish`; a received message is only read through its ``meta`` (and, for the
``vfl-ps`` ID subsets, its two int64 arrays). ``n_rows`` on a compute action is the
number of rows it computes on (cost models and counters); ``rows`` an explicit row
subset (``vfl-ps``; None: batch ``batch`` of ``epoch``'s plan); ``key`` names the
worker's kept forward graph (None: ``batch``). ``party`` on a message action names the
passive party whose ``emb``/``grad`` channel it is (an active party with several passive
parties); ``""`` is the party's one partner (every two-party run, and a passive party).

Blocking actions (the interpreter resumes the generator later): :class:`Forward`,
:class:`Backward`, :class:`Discard`, :class:`JoinPrefetch`, :class:`TopStep`,
:class:`Await`, :class:`WaitSchedule`, :class:`Gather`, :class:`Push`, :class:`Pull`,
:class:`Flush`. Immediate ones (no interleaving with other workers between the yield and
the resume): :class:`Prefetch` (it only starts the compute), :class:`Publish`,
:class:`Poll`, :class:`Pending`, :class:`Now`, :class:`NotifySchedule`, :class:`Log`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

#: Message kinds of the training protocol (see :mod:`parties.runtime.party` for the topics).
EMB = "emb"
GRAD = "grad"
IDS = "ids"
KINDS = (EMB, GRAD, IDS)


class MessageLike(Protocol):
    """What a strategy reads of a received message (:class:`pubsub.Message` has it)."""

    meta: dict[str, Any]
    arrays: Any


#: An acceptor's verdict on a message: 1 take it, 0 stale (discard, keep waiting),
#: -1 from the future (put it back and give up).
Acceptor = Callable[[Any], int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward:
    """Passive bottom forward of ``n_rows`` rows; returns the embedding (opaque)."""

    worker: int
    epoch: int
    batch: int
    n_rows: int
    rows: Any = None
    key: int | None = None
    snapshot: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Backward:
    """Passive backward of graph ``key`` from the gradient message ``msg``; Adam step."""

    worker: int
    epoch: int
    key: int
    msg: Any
    n_rows: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Discard:
    """Forget graph ``key`` of ``worker`` (its partner data never came)."""

    worker: int
    key: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Prefetch:
    """Active: *start* the own bottom forward of the batch (runs while the worker waits
    for the passive embedding); returns None at once. :class:`JoinPrefetch` waits for it."""

    worker: int
    epoch: int
    batch: int
    n_rows: int
    rows: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinPrefetch:
    """Wait until ``worker``'s running :class:`Prefetch` has finished (at once if none)."""

    worker: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TopStep:
    """Active: top forward/backward on the fused embeddings ``embs`` (one message per
    passive party, in ``parties`` order); the interpreter publishes each party's
    cut-layer gradient on its ``grad/<grad_channel>`` with that party's entry of
    ``grad_metas`` as soon as it exists, then the own bottom's backward runs. Returns
    the loss (float). ``held_since`` (:class:`Now` time the embeddings were taken; None:
    not reported): the interpreter adds meta ``h``, the seconds from then to the
    gradient's publication (the active party's share of the round trip)."""

    worker: int
    epoch: int
    batch: int
    embs: tuple[Any, ...]
    n_rows: int
    grad_channel: int
    grad_metas: tuple[dict[str, Any], ...]
    parties: tuple[str, ...] = ("",)
    rows: Any = None
    held_since: float | None = None

    @property
    def emb(self) -> Any:
        """The first (in a two-party run, the only) passive party's message."""
        return self.embs[0]

    @property
    def grad_meta(self) -> dict[str, Any]:
        """The first (in a two-party run, the only) passive party's gradient meta."""
        return self.grad_metas[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish:
    """Publish a message of ``kind`` on ``channel`` (None for ``ids``); never blocks.

    ``rows``: for an ``emb`` publication, the rows it discloses (the interpreter counts
    them in the DP ledger first). ``worker`` / ``batch`` tag the timeline."""

    kind: str
    channel: int | None
    meta: dict[str, Any]
    arrays: tuple[Any, ...] = ()
    rows: Any = None
    worker: int = -1
    batch: int = -1
    party: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Await:
    """Wait up to ``timeout_s`` for a message on ``kind``/``channel`` that ``accept``
    takes (stale ones are discarded, a message from the future is put back and ends
    the wait). Returns a :class:`Received`. ``worker`` / ``batch`` tag the wait."""

    kind: str
    channel: int | None
    timeout_s: float
    accept: Acceptor
    worker: int = -1
    batch: int = -1
    party: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Poll:
    """:class:`Await` without waiting: only what is buffered now. Returns a
    :class:`Received`."""

    kind: str
    channel: int | None
    accept: Acceptor
    party: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pending:
    """Which of ``channels`` of ``kind`` hold a buffered message now; returns a frozenset."""

    kind: str
    channels: tuple[int, ...]
    party: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Now:
    """The interpreter's clock (seconds, monotonic); returns a float."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitSchedule:
    """Block until ``ready()`` holds, re-checked after every :class:`NotifySchedule` of
    the party (the party's shared :class:`parties.algorithms.schedule.EpochSchedule` changed)."""

    ready: Callable[[], bool]


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifySchedule:
    """The party's shared schedule changed: wake its :class:`WaitSchedule` waiters."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Gather:
    """Run the generators ``procs`` concurrently (each interpreted like the caller);
    returns their return values in order. The first exception propagates."""

    procs: tuple[Generator[Any, Any, Any], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Push:
    """Every worker pushes its local change to the PS (barrier sync, first half)."""

    epoch: int
    batch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class Pull:
    """Every worker loads the PS parameters (barrier sync, second half)."""

    epoch: int
    batch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class Flush:
    """Every worker pushes any pending update and pulls (after a training segment)."""

    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Log:
    """A structured log event (dotted name) the interpreter may emit; never a payload."""

    event: str
    level: str = "info"
    fields: dict[str, Any] = field(default_factory=dict)


Action = (Forward | Backward | Discard | Prefetch | JoinPrefetch | TopStep | Publish | Await
          | Poll | Pending | Now | WaitSchedule | NotifySchedule | Gather | Push | Pull | Flush
          | Log)


@dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    """The result of :class:`Await` / :class:`Poll`.

    Attributes:
        msg: the accepted message, or None (deadline, nothing buffered, or ``later``).
        later: the wait ended on a message from the future (put back unconsumed).
        stale: stale messages discarded on the way.
    """

    msg: Any = None
    later: bool = False
    stale: int = 0


#: A strategy generator: yields actions, receives their results, returns ``T``.
Proc = Generator[Action, Any, Any]
