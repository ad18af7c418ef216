"""Communication probe: one-way message time over the real bus, per message size
(PubSub-VFL, arXiv 2510.12494, Sec. 4: the communication term of the system profile).

I/O only; the fit is :func:`parties.planning.costmodel.fit_comm`. Two :class:`pubsub.Bus`
clients attached to a running broker (the run's own, or one the caller started on
127.0.0.1) play ping-pong: the pinger publishes a float32 array of n bytes on
``_probe/<token>/ping``; the ponger receives it and publishes the received array back on
``_probe/<token>/pong``. Each round trip covers everything a cut-layer message costs in
a run, twice: encode, the publisher's socket, the broker's forward, the subscriber's
socket and buffer, decode. **One-way time = median round trip / 2**, over ``reps``
timed round trips after ``warmup`` untimed ones.

Both clients share one asyncio loop in this process: a ping-pong is strictly sequential,
so nothing would run in parallel in two processes either; the loop's own scheduling is
part of what each party's loop pays in a run.

Message sizes for the cost model are the cut layer's ``4 · d · B`` bytes (a ``(B, d)``
float32 embedding or gradient) for each swept B.

Errors: :class:`CommProbeError` (a :class:`parties.planning.profile.ProfileError`): a pong did
not come back within ``timeout_s`` (or the subscriptions never propagated);
:class:`pubsub.BrokerUnreachable` from the clients' handshake.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import structlog

from parties.planning.profile import ProfileError
from pubsub import Bus, DeadlineExceeded

log = structlog.get_logger(__name__)


class CommProbeError(ProfileError):
    """The ping-pong failed (no pong within the timeout)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommPoint:
    """One message size of the probe.

    Attributes:
        nbytes: payload bytes per message (the float32 array).
        reps: timed round trips.
        rtt_s: median round-trip seconds.
        rtt_min_s: fastest round trip, seconds.
        one_way_s: ``rtt_s / 2``, seconds.
    """

    nbytes: int
    reps: int
    rtt_s: float
    rtt_min_s: float
    one_way_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CommSweep:
    """The probe's result (``profile.json``'s ``sweep.comm``).

    Attributes:
        address: the broker's base address.
        points: one :class:`CommPoint` per size, ascending.
    """

    address: str
    points: tuple[CommPoint, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"address": self.address, "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CommSweep:
        """Inverse of :meth:`to_dict`."""
        return cls(address=str(d["address"]),
                   points=tuple(CommPoint(**p) for p in d["points"]))

    def fit(self, holdout: str | Sequence[float] = "alternate") -> Any:
        """:func:`parties.planning.costmodel.fit_comm` of the one-way times (a ``CommFit``)."""
        from parties.planning.costmodel import fit_comm

        return fit_comm([p.nbytes for p in self.points], [p.one_way_s for p in self.points],
                        holdout=holdout)


def cut_layer_sizes(batch_sizes: Sequence[int], embedding_dim: int) -> tuple[int, ...]:
    """``4 · d · B`` bytes for each B (one ``(B, d)`` float32 array)."""
    return tuple(4 * embedding_dim * int(b) for b in batch_sizes)


async def _probe(address: str, sizes: Sequence[int], reps: int, warmup: int,
                 timeout_s: float) -> list[CommPoint]:
    token = uuid.uuid4().hex[:8]
    ping, pong = f"_probe/{token}/ping", f"_probe/{token}/pong"
    async with Bus(address, name="probe-a") as a, Bus(address, name="probe-b") as b:
        await b.subscribe(ping)
        await a.subscribe(pong)

        async def ponger() -> None:
            while True:
                msg = await b.next(ping, timeout_s=3600.0)
                await b.publish(pong, list(msg.arrays), msg.meta)

        task = asyncio.create_task(ponger())
        try:
            # until a pong comes back, the subscriptions have not propagated
            deadline = time.monotonic() + timeout_s
            while True:
                await a.publish(ping, [], {"hello": 1})
                try:
                    await a.next(pong, timeout_s=0.05)
                    break
                except DeadlineExceeded:
                    if time.monotonic() > deadline:
                        raise CommProbeError(f"no pong through {address} within "
                                             f"{timeout_s:g} s") from None
            await asyncio.sleep(0.05)
            while a.try_next(pong) is not None:
                pass
            out = []
            for n in sizes:
                arr = np.random.default_rng(n).standard_normal(max(n // 4, 1)).astype(
                    np.float32)
                rtts: list[float] = []
                for i in range(warmup + reps):
                    t0 = time.perf_counter()
                    await a.publish(ping, [arr], {"i": i})
                    try:
                        await a.next(pong, timeout_s=timeout_s)
                    except DeadlineExceeded:
                        raise CommProbeError(f"no pong of a {n}-byte message through "
                                             f"{address} within {timeout_s:g} s") from None
                    if i >= warmup:
                        rtts.append(time.perf_counter() - t0)
                med = statistics.median(rtts)
                out.append(CommPoint(nbytes=int(arr.nbytes), reps=reps, rtt_s=med,
                                     rtt_min_s=min(rtts), one_way_s=med / 2))
                log.info("vfl.commprobe.point", nbytes=int(arr.nbytes), rtt_s=med)
            return out
        finally:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass


def measure_comm(sizes_bytes: Sequence[int], address: str, *, reps: int = 30,
                 warmup: int = 5, timeout_s: float = 5.0) -> CommSweep:
    """Ping-pong float32 arrays of each size (bytes, rounded down to whole floats, at
    least one) through the broker at ``address``; one-way time = median RTT / 2.

    Runs its own event loop (call it from synchronous code, not from a running loop).

    Args:
        sizes_bytes: message sizes, bytes (>= 0).
        address: broker base address ``tcp://HOST:PORT``.
        reps: timed round trips per size (>= 1).
        warmup: untimed round trips first, per size.
        timeout_s: longest wait for one pong (and for the subscriptions), seconds.

    Returns:
        :class:`CommSweep`, sizes ascending.

    Raises:
        CommProbeError: no pong within ``timeout_s``.
        ValueError: ``reps < 1``, ``warmup < 0`` or a negative size.
        pubsub.BrokerUnreachable / pubsub.address.InvalidAddress: the broker.
    """
    if reps < 1 or warmup < 0 or any(n < 0 for n in sizes_bytes):
        raise ValueError(f"need reps >= 1, warmup >= 0 and sizes >= 0, got {reps!r}, "
                         f"{warmup!r}, {list(sizes_bytes)!r}")
    sizes = sorted({int(n) for n in sizes_bytes})
    points = asyncio.run(_probe(address, sizes, reps, warmup, timeout_s))
    return CommSweep(address=address, points=tuple(points))


__all__ = ["CommPoint", "CommProbeError", "CommSweep", "cut_layer_sizes", "measure_comm"]
