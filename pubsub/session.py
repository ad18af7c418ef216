"""Session primitives over any :class:`~pubsub.transport.Transport`: meeting peers,
watching that they stay alive, and waiting on several topics at once.

* :func:`wait_any` -- the first message on any of several topics, with a deadline; no
  message is lost (what arrives on the other topics meanwhile stays buffered, in order).
* :func:`rendezvous` -- the hello/seen exchange with a settings digest (the PubSub
  slow-joiner guard): each side repeats its hello until every peer has heard it and it
  has heard every peer; a digest mismatch fails both sides
  (:class:`~pubsub.errors.SettingsMismatch`), a missing peer fails at the deadline
  (:class:`~pubsub.errors.RendezvousTimeout`).
* :func:`answer_hello` / :func:`answer_hellos` -- after a rendezvous, answer a peer's
  late hello with this side's complete one: the last hello of a rendezvous can be lost
  (a broker restart as it ends), and the peer that missed it is still saying hello.
* :func:`call_until` -- repeat an announcement until an answer comes (a participant
  waiting for a coordinator that answers everyone at once).
* :func:`heartbeat` / :func:`watch` -- publish beats; fail with
  :class:`~pubsub.errors.PeerLost` when a peer's beats stop. :class:`Liveness` runs
  both as an async context manager.

Topic names are parameters: this module knows no protocol above the bus. Every wait has
a deadline; the callers subscribe the topics they listen on (with bounded buffers).

Hello wire format (metadata only, no arrays): ``{"from": me, "digest": digest, "seen":
[peers heard so far], **info}``, with ``"done": true`` on a side's final hello (sent
once it has met every peer, and as its answer to a late hello). Heartbeat: ``{"from":
me, "t": unix time}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from pubsub.codec import Message
from pubsub.errors import (
    DeadlineExceeded,
    PeerLost,
    PublishWouldBlock,
    RendezvousTimeout,
    SettingsMismatch,
)
from pubsub.transport import Transport

log = structlog.get_logger(__name__)


def _check_timeout(timeout_s: float, name: str = "timeout_s") -> None:
    if not (timeout_s >= 0 and timeout_s != float("inf")):
        raise ValueError(f"{name} must be finite and >= 0, got {timeout_s!r}")


async def wait_any(bus: Transport, topics: Sequence[str], timeout_s: float) -> Message:
    """The first message on any of ``topics`` (each subscribed), waiting up to ``timeout_s``.

    A message already buffered is returned at once (the first topic in ``topics`` order
    that has one). Otherwise one :meth:`~pubsub.client.Bus.next` waits per topic; the
    message handed over first is returned, the other waits are cancelled, and a message
    one of them had already been handed is put back at the head of its topic's buffer:
    nothing is lost and the order per topic holds.

    Raises:
        DeadlineExceeded: nothing arrived within ``timeout_s`` seconds (``topic`` names
            all of ``topics``, joined by ``" | "``).
        BusClosed: the client closed while waiting.
        ValueError: no topics, or a negative or infinite ``timeout_s``.
    """
    if not topics:
        raise ValueError("wait_any needs at least one topic")
    _check_timeout(timeout_s)
    for t in topics:
        msg = bus.try_next(t)
        if msg is not None:
            return msg
    if len(topics) == 1:
        return await bus.next(topics[0], timeout_s)
    tasks = [asyncio.ensure_future(bus.next(t, timeout_s)) for t in dict.fromkeys(topics)]
    finished: list[asyncio.Future[Message]] = []  # completion order = hand-over order
    for task in tasks:
        task.add_done_callback(finished.append)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    got = [task.result() for task in finished
           if not task.cancelled() and task.exception() is None]
    if got:
        for extra in got[1:]:
            bus.unget(extra)
        return got[0]
    for task in done:
        exc = task.exception() if not task.cancelled() else None
        if exc is not None and not isinstance(exc, DeadlineExceeded):
            raise exc
    raise DeadlineExceeded(" | ".join(topics), timeout_s)


async def rendezvous(
    bus: Transport,
    *,
    me: str,
    peers: Sequence[str],
    digest: str,
    say: Sequence[str],
    hear: Sequence[str],
    timeout_s: float,
    interval_s: float = 0.1,
    info: Mapping[str, Any] | None = None,
    mismatch_linger_s: float = 0.5,
    on_found: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Exchange hellos with ``peers`` until each side has heard the other.

    This side publishes its hello on each topic of ``say`` (``seen`` lists the peers
    heard so far) every ``interval_s`` seconds and at once when it hears a new peer,
    and reads hellos on ``hear`` (which the caller has subscribed; a hello that finds
    the send queue full under the ``block`` policy waits for the next round). A hello
    heard never triggers more than that: hellos are not echoed one for one, so peers
    that answer hellos (:func:`answer_hellos`) cannot feed a storm that starves the
    rendezvous. A peer is done once its hello lists ``me`` as seen. When
    all are, one final hello (all seen) goes out, so a peer that never got a complete
    hello from us completes too.

    Args:
        me: this side's name (the ``from`` of its hellos).
        peers: the names to meet (hellos from anyone else are ignored).
        digest: the settings digest; every peer must send the same.
        say / hear: topics this side's hellos go to / the peers' hellos arrive on.
        timeout_s: overall deadline, seconds.
        interval_s: period of repeated hellos, seconds.
        info: extra hello fields (JSON-ready; not ``from``/``digest``/``seen``).
        mismatch_linger_s: after a mismatch, how long to keep saying hello (every
            ``min(interval_s, 0.05)`` s) so the peer learns of it and fails too.
        on_found: called once per peer with its first hello (e.g. to log it).

    Returns:
        Each peer's last hello metadata, with ``publisher``: the client id of the bus
        client it came from (what later messages of that peer carry).

    Raises:
        SettingsMismatch: a peer's digest differs (after the linger).
        RendezvousTimeout: not every peer completed within ``timeout_s``.
        ValueError: no peers, ``me`` among them, or bad times.
    """
    want = list(dict.fromkeys(peers))
    if not want or me in want:
        raise ValueError(f"peers must be non-empty and exclude me ({me!r}), got {list(peers)!r}")
    _check_timeout(timeout_s)
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    extra = dict(info or {})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    heard: dict[str, dict[str, Any]] = {}
    done: set[str] = set()

    def hello(done: bool = False) -> None:
        meta = {**extra, "from": me, "digest": digest, "seen": sorted(heard)}
        _say_hello(bus, say, {**meta, "done": True} if done else meta)

    next_say = loop.time()  # say hello now, then every interval_s (and at news, below)
    while True:
        now = loop.time()
        if now >= next_say:
            hello()
            next_say = now + interval_s
        remaining = deadline - now
        if remaining <= 0:
            missing = tuple(p for p in want if p not in done)
            raise RendezvousTimeout(missing[0], timeout_s, missing)
        try:
            msg = await wait_any(bus, hear, max(0.0, min(next_say - now, remaining)))
        except DeadlineExceeded:
            continue
        meta = dict(msg.meta)
        peer = meta.get("from")
        if peer not in want:
            continue
        meta["publisher"] = msg.publisher  # the client id it came from (not the sender's say)
        if meta.get("digest") != digest:
            log.warning("session.settings_mismatch", peer=peer, mine=digest,
                        theirs=meta.get("digest"))
            step = min(interval_s, 0.05)
            end = loop.time() + mismatch_linger_s
            heard.setdefault(peer, meta)
            while loop.time() < end:
                hello()
                await asyncio.sleep(step)
            raise SettingsMismatch(peer, digest, meta.get("digest"), meta)
        if peer not in heard:
            if on_found is not None:
                on_found(peer, meta)
            next_say = loop.time()  # news: tell the peers it was heard at once
        heard[peer] = meta
        seen = meta.get("seen")
        if isinstance(seen, list) and me in seen:
            done.add(peer)
        if len(done) == len(want):
            break
    hello(done=True)
    return heard


def _say_hello(bus: Transport, say: Sequence[str], meta: dict[str, Any]) -> None:
    for topic in say:
        with contextlib.suppress(PublishWouldBlock):  # under block: the next round
            bus.publish_nowait(topic, (), meta)


def answer_hello(bus: Transport, msg: Message, *, me: str, peers: Sequence[str],
                 digest: str, say: Sequence[str],
                 info: Mapping[str, Any] | None = None) -> bool:
    """After :func:`rendezvous` returned: if ``msg`` is a hello from one of ``peers`` with
    the same ``digest`` that is not a final one, publish this side's final hello (every
    peer seen) on ``say`` and return True; anything else is ignored (False).

    A peer still saying hello has not heard this side's final hello (it was lost, e.g.
    to a broker restart as the handshake ended) and fails at its deadline unless
    answered; the arguments are those the rendezvous was called with. Final hellos are
    not answered, so two sides that both completed never echo each other.
    """
    meta = msg.meta
    if meta.get("from") not in peers or meta.get("digest") != digest or meta.get("done"):
        return False
    _say_hello(bus, say, {**dict(info or {}), "from": me, "digest": digest,
                          "seen": sorted(set(peers)), "done": True})
    return True


async def answer_hellos(bus: Transport, *, me: str, peers: Sequence[str], digest: str,
                        say: Sequence[str], hear: Sequence[str],
                        info: Mapping[str, Any] | None = None) -> None:
    """:func:`answer_hello` to every message on ``hear`` (the rendezvous's topics, still
    subscribed) until cancelled: a task beside the work that follows a rendezvous."""
    while True:
        try:
            msg = await wait_any(bus, hear, 3600.0)
        except DeadlineExceeded:
            continue
        answer_hello(bus, msg, me=me, peers=peers, digest=digest, say=say, info=info)


async def call_until(
    bus: Transport,
    *,
    say: Callable[[], object],
    hear: Sequence[str],
    peer: str,
    timeout_s: float,
    interval_s: float = 1.0,
    accept: Callable[[Message], bool] | None = None,
) -> Message:
    """Call ``say()`` now and every ``interval_s`` until a message on ``hear`` is accepted.

    For a participant announcing itself to a peer that answers once everyone is there
    (no seen-handshake). ``accept`` sees each message on ``hear`` and returns True to
    end the wait (default: the first message ends it); it may act on the others (e.g.
    answer a roll call).

    Raises:
        RendezvousTimeout: nothing accepted within ``timeout_s`` (``peer`` names whom).
    """
    _check_timeout(timeout_s)
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        say()
        next_say = min(loop.time() + interval_s, deadline)
        while (left := next_say - loop.time()) > 0:
            try:
                msg = await wait_any(bus, hear, left)
            except DeadlineExceeded:
                break
            if accept is None or accept(msg):
                return msg
        if loop.time() >= deadline:
            raise RendezvousTimeout(peer, timeout_s)


async def heartbeat(bus: Transport, topic: str, *, me: str, interval_s: float) -> None:
    """Publish a beat on ``topic`` every ``interval_s`` seconds, until cancelled.

    A beat that finds the send queue full under the ``block`` policy is skipped (the
    next one tries again): backpressure must not end the run from here.
    """
    if not interval_s > 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    while True:
        with contextlib.suppress(PublishWouldBlock):
            bus.publish_nowait(topic, (), {"from": me, "t": time.time()})
        await asyncio.sleep(interval_s)


async def watch(bus: Transport, topics: Mapping[str, str], *, timeout_s: float) -> None:
    """Consume peers' beats (``topics``: peer -> its beat topic, subscribed by the caller)
    and raise when one is silent for ``timeout_s`` seconds. Runs until cancelled.

    Raises:
        PeerLost: a peer sent nothing for ``timeout_s`` (``silent_s`` = ``timeout_s``;
            with several peers, the one silent longest).
    """
    if not topics:
        raise ValueError("watch needs at least one peer")
    _check_timeout(timeout_s)
    loop = asyncio.get_running_loop()
    by_topic = {t: p for p, t in topics.items()}
    last = {p: loop.time() for p in topics}
    order = list(by_topic)
    while True:
        peer = min(last, key=last.__getitem__)
        left = last[peer] + timeout_s - loop.time()
        if left <= 0:
            raise PeerLost(peer, timeout_s)
        try:
            msg = await wait_any(bus, order, left)
        except DeadlineExceeded:
            continue
        last[by_topic[msg.topic]] = loop.time()


class Liveness:
    """Heartbeats out, peers' heartbeats watched, for the life of an ``async with``.

    Usage::

        async with Liveness(bus, me="a", beat_topic="hb/a", watch={"b": "hb/b"},
                            interval_s=0.5, timeout_s=5.0) as live:
            result = await live.guard(train())   # PeerLost if b goes silent first
        live.lost  # the PeerLost, or None

    Args:
        bus: a connected transport; the caller subscribes the ``watch`` topics.
        me: this side's name.
        beat_topic: where this side's beats go.
        watch: peer -> its beat topic.
        interval_s: beat period, seconds.
        timeout_s: silence after which a peer is lost, seconds.
    """

    def __init__(self, bus: Transport, *, me: str, beat_topic: str,
                 watch: Mapping[str, str], interval_s: float, timeout_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        _check_timeout(timeout_s)
        if not watch:
            raise ValueError("Liveness needs at least one peer to watch")
        self.bus = bus
        self.me = me
        self.beat_topic = beat_topic
        self.watch = dict(watch)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        #: the loss seen, once a peer went silent
        self.lost: PeerLost | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._lost_event = asyncio.Event()
        self._closed = False

    async def __aenter__(self) -> Liveness:
        self._tasks = [
            asyncio.create_task(heartbeat(self.bus, self.beat_topic, me=self.me,
                                          interval_s=self.interval_s), name="liveness-beat"),
            asyncio.create_task(self._watch(), name="liveness-watch"),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _watch(self) -> None:
        try:
            await watch(self.bus, self.watch, timeout_s=self.timeout_s)
        except PeerLost as exc:
            self.lost = exc
            log.error("session.peer_lost", peer=exc.peer, silent_s=exc.silent_s)
            self._lost_event.set()

    def check(self) -> None:
        """Raise the :class:`PeerLost` if a peer was lost."""
        if self.lost is not None:
            raise self.lost

    async def wait_lost(self) -> PeerLost:
        """Wait until a peer is lost; returns the :class:`PeerLost` (does not raise)."""
        await self._lost_event.wait()
        assert self.lost is not None
        return self.lost

    async def guard(self, aw: Any) -> Any:
        """Await ``aw``; if a peer is lost first, cancel it and raise :class:`PeerLost`."""
        self.check()
        work = asyncio.ensure_future(aw)
        lost = asyncio.ensure_future(self._lost_event.wait())
        try:
            await asyncio.wait([work, lost], return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
        if work.done() and not work.cancelled():
            return work.result()
        self.check()
        raise asyncio.CancelledError  # pragma: no cover - work cancelled from outside

    async def close(self) -> None:
        """Stop beating and watching. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


__all__ = ["Liveness", "answer_hello", "answer_hellos", "call_until", "heartbeat", "rendezvous",
           "wait_any", "watch"]
