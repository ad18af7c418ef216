"""Gathering one message per participant from the bus, with a deadline.

:func:`collect` waits for a message on a topic from each expected sender; a participant's
error message ends the run (:class:`synth.coord.types.CoordinatorError`). A resumed
coordinator asks the missing senders to repeat their last message of the stage
(:func:`announce_resume`, ``ff/<run>/all/resume``), since what arrived before it died is
lost.
"""

from __future__ import annotations

import asyncio

from pubsub import DeadlineExceeded, Message
from pubsub.session import wait_any
from pubsub.transport import Transport
from synth.coord.context import RunContext
from synth.coord.types import CoordinatorError

#: How often a resumed coordinator repeats its resume request while a stage waits, seconds.
RESUME_EVERY_S = 2.0


def announce_resume(ctx: RunContext, bus: Transport, stage: str) -> None:
    """Ask the participants to repeat their last message of ``stage`` (a resumed
    coordinator lost what arrived before it died)."""
    if ctx.store.resumed_from or ctx.store.restarts or stage == "schema":
        # (``schema`` is also a roll call: participants that said hello before this
        # coordinator subscribed say it again now instead of at their next repeat)
        bus.publish_nowait(ctx.topics.resume, (), {"stage": stage})


async def collect(ctx: RunContext, bus: Transport, topic: str, expect: set[str],
                  timeout_s: float, *, resume_stage: str | None = None
                  ) -> dict[str, Message]:
    """Messages on ``topic`` from each sender in ``expect`` (meta ``from``), until all
    came or ``timeout_s`` passed; a participant's error message ends the run.

    A resumed coordinator with ``resume_stage`` asks the missing senders to repeat
    that stage's message every :data:`RESUME_EVERY_S` seconds.

    Raises:
        CoordinatorError: a participant reported an error (its reason and exit code).
    """
    t = ctx.topics
    got: dict[str, Message] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    next_resume = loop.time()
    while set(got) != expect:
        if resume_stage is not None and loop.time() >= next_resume:
            announce_resume(ctx, bus, resume_stage)
            next_resume = loop.time() + RESUME_EVERY_S
        remaining = deadline - loop.time()
        if remaining <= 0:
            err = bus.try_next(t.error)
            if err is None:
                break
            msg = err
        else:
            try:  # an error first when both are buffered
                msg = await wait_any(bus, [t.error, topic], min(remaining, 0.25))
            except DeadlineExceeded:
                continue
        if msg.topic == t.error:
            raise CoordinatorError(f"{msg.meta.get('from')}: {msg.meta.get('reason')}",
                                   code=int(msg.meta.get("code", 1)))
        sender = msg.meta.get("from")
        if sender in expect and sender not in got:
            got[sender] = msg
    return got


__all__ = ["RESUME_EVERY_S", "announce_resume", "collect"]
