"""Private ID alignment over the bus: one party's side of the mutual ECDH PSI.

The cryptography and the comparison are pure (:mod:`parties.alignment.psi`); this module moves
chunks of encrypted points over a :class:`pubsub.Bus` and reads/writes files.

Topics (all under ``psi/<run_id>/``, published by ``<role>``; nothing else is sent,
no side channel):

=================================  =========================================================
``psi/R/<role>/hello``             meta ``{v, n, chunks, chunk_size}`` with the rendezvous
                                   fields ``from, digest, seen`` (:mod:`pubsub.session`): set
                                   size and chunking (repeated until both sides have seen
                                   each other)
``psi/R/<role>/req/<i>``           ``uint8 (m, 33)``: ``H(x)^{k_role}`` for chunk ``i`` of
                                   the own IDs in a secret random order
``psi/R/<role>/resp/<i>``          ``uint8 (m, 33)``: the partner's request chunk ``i``
                                   multiplied by ``k_role``, in the partner's order
``psi/R/<role>/done``              meta ``{n_shared, req_chunks, resp_chunks}`` (counts only)
=================================  =========================================================

Flow control: a party has at most ``window`` request chunks out whose response has not
come back, so the partner buffers at most ``window`` of them and memory stays bounded
(per party: the IDs, 16 bytes per own and per partner ID, plus ``2 * window`` chunks
of ``chunk_size * 33`` bytes in flight). Every wait has a deadline and fails with
:class:`AlignTimeout` naming the missing message.

CPU: every library call runs on one dedicated thread per party (the library releases
the GIL, so the event loop keeps serving the bus meanwhile; its objects are not
thread-safe, hence exactly one thread). Each party is its own process, so the two
parties' cryptography runs on two cores at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import structlog

from pubsub import Bus, BusConfig, Transport
from pubsub.errors import DeadlineExceeded, RendezvousTimeout, SettingsMismatch
from pubsub.security import CurveClient
from pubsub.session import rendezvous

from parties.alignment.psi import (
    DEFAULT_CHUNK,
    KEY_BYTES,
    POINT_BYTES,
    AlignError,
    AlignResult,
    ChunkPlan,
    MalformedPoints,
    PsiSession,
    aligned,
    check_ids,
    check_points,
    compare_keys,
    shared_mask,
    shuffle_order,
    unshuffle,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")
ROLES = ("active", "passive")
PROTOCOL_VERSION = 1
#: Most IDs per chunk: 2^20 points of 33 bytes are 34.6 MB, under the broker's 64 MiB.
MAX_CHUNK = 1 << 20
#: Period of the ``psi.progress`` event while chunks are moving, seconds.
PROGRESS_EVERY_S = 10.0


class AlignTimeout(AlignError, TimeoutError):
    """A message of the alignment did not arrive in time.

    Attributes:
        what: the missing message (e.g. ``"passive resp chunk 3"``).
        topic: its topic.
        timeout_s: the deadline, seconds.
    """

    def __init__(self, what: str, topic: str, timeout_s: float) -> None:
        self.what = what
        self.topic = topic
        self.timeout_s = timeout_s
        super().__init__(f"no {what} on {topic!r} within {timeout_s:g} s (is the partner "
                         "running, with the same --run-id and --broker?)")


class AlignMismatch(AlignError, ValueError):
    """The partner's messages disagree with ours (protocol version, counts, results).

    Attributes:
        what: the field.
        ours / theirs: the two values.
    """

    def __init__(self, what: str, ours: object, theirs: object) -> None:
        self.what = what
        self.ours = ours
        self.theirs = theirs
        super().__init__(f"the parties disagree on {what}: ours {ours!r}, theirs {theirs!r}")


class IdFileError(AlignError, ValueError):
    """An ID file cannot be read.

    Attributes:
        path: the file.
        reason: why.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot read IDs from {path!r}: {reason}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AlignConfig:
    """Settings of one party's alignment. Times in seconds.

    Attributes:
        chunk_size: IDs per request chunk, at most :data:`MAX_CHUNK` (the two parties
            may differ).
        window: most own request chunks whose response is outstanding (>= 1).
        join_timeout_s: how long to wait for the partner's hello.
        chunk_timeout_s: how long any single later wait may take (a partner request
            chunk, a response chunk, the partner's done).
        final_timeout_s: N-way alignment: how long a passive party waits for the active
            party's final mask once its own pair is done (the active party finishes
            every other pair first).
        hello_interval_s: period of repeated hellos until both sides have met.
        bus: the bus client's settings.
    """

    chunk_size: int = DEFAULT_CHUNK
    window: int = 4
    join_timeout_s: float = 60.0
    chunk_timeout_s: float = 120.0
    final_timeout_s: float = 300.0
    hello_interval_s: float = 0.05
    bus: BusConfig = field(default_factory=BusConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_size <= MAX_CHUNK:
            raise ValueError(f"chunk_size must be in [1, {MAX_CHUNK}] (a chunk must stay under "
                             f"the broker's 64 MiB message bound), got {self.chunk_size!r}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window!r}")
        for name in ("join_timeout_s", "chunk_timeout_s", "final_timeout_s",
                     "hello_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AlignStats:
    """What one party's alignment cost (no IDs).

    Attributes:
        role: ``"active"`` or ``"passive"``.
        n_own / n_partner / n_shared: set sizes.
        seconds: wall time from bus connect to the result, seconds.
        crypto_s: wall time of the library calls (on the crypto thread), seconds.
        crypto_cpu_s: CPU time of the crypto thread in them, seconds (below
            ``crypto_s`` when other processes compete for the cores).
        compare_s: time of the comparison and the sorting of the output, seconds.
        bytes_sent / bytes_received: bytes of ``psi/`` messages this party published /
            received (whole envelopes, as counted by the bus).
        chunks_sent / chunks_received: request chunks published / partner request
            chunks received.
        loop_lag_max_s: the largest delay of a 10 ms event-loop tick seen meanwhile
            (how responsive the loop stayed during the cryptography).
    """

    role: str
    n_own: int
    n_partner: int
    n_shared: int
    seconds: float
    crypto_s: float
    crypto_cpu_s: float
    compare_s: float
    bytes_sent: int
    bytes_received: int
    chunks_sent: int
    chunks_received: int
    loop_lag_max_s: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


def open_bus(address: str, name: str, config: BusConfig | None = None,
             security: CurveClient | None = None) -> Bus:
    """The one place alignment creates its bus client.

    Args:
        security: CURVE keys (the party's role key: the broker policy lets the ``active``
            and ``passive`` roles use ``psi/...``); None = plaintext, loopback only.

    Returns:
        An unconnected :class:`Bus`; use ``async with open_bus(...) as bus``.
    """
    return Bus(address, name=name, config=config, security=security)


def topics(run_id: str, role: str) -> dict[str, str]:
    """Topic stems published by ``role`` in run ``run_id`` (``req``/``resp`` take
    ``/<i>``)."""
    base = f"psi/{run_id}/{role}"
    return {"prefix": base + "/", "hello": base + "/hello", "req": base + "/req",
            "resp": base + "/resp", "done": base + "/done"}


def partner_of(role: str) -> str:
    """The other role.

    Raises:
        ValueError: unknown role.
    """
    if role not in ROLES:
        raise ValueError(f"role must be 'active' or 'passive', got {role!r}")
    return "passive" if role == "active" else "active"


class _Crypto:
    """Runs library calls on one dedicated thread and sums their time."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="psi-crypto")
        self.seconds = 0.0
        self.cpu_s = 0.0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        def timed() -> tuple[T, float, float]:
            t0, c0 = time.perf_counter(), time.thread_time()
            out = fn(*args)
            return out, time.perf_counter() - t0, time.thread_time() - c0

        out, dt, dc = await asyncio.get_running_loop().run_in_executor(self._pool, timed)
        self.seconds += dt
        self.cpu_s += dc
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


async def _lag_monitor(box: list[float], period_s: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(period_s)
        box[0] = max(box[0], loop.time() - t0 - period_s)


async def _next(bus: Transport, topic: str, what: str, timeout_s: float) -> Any:
    try:
        return await bus.next(topic, timeout_s=timeout_s)
    except DeadlineExceeded:
        raise AlignTimeout(what, topic, timeout_s) from None


async def _meet(bus: Transport, mine: dict[str, str], theirs: dict[str, str], role: str,
                partner: str, hello: dict[str, Any], cfg: AlignConfig,
                label: str) -> dict[str, Any]:
    """Exchange hellos until both sides know the other receives them
    (:func:`pubsub.session.rendezvous`, the protocol version as the digest); the
    partner's hello.

    Raises:
        AlignTimeout: the partner's hello did not come within ``join_timeout_s``.
        AlignMismatch: the partner speaks another protocol version.
    """
    try:
        got = await rendezvous(bus, me=role, peers=[partner], digest=f"psi/v{PROTOCOL_VERSION}",
                               say=[mine["hello"]], hear=[theirs["hello"]],
                               timeout_s=cfg.join_timeout_s, interval_s=cfg.hello_interval_s,
                               info=hello)
    except RendezvousTimeout:
        raise AlignTimeout(f"{label} hello", theirs["hello"], cfg.join_timeout_s) from None
    except SettingsMismatch as exc:
        raise AlignMismatch("protocol version", PROTOCOL_VERSION, exc.hello.get("v")) from None
    return got[partner]


async def align_over_bus(ids: Sequence[str], *, role: str, broker: str, run_id: str,
                         config: AlignConfig | None = None,
                         security: CurveClient | None = None,
                         connect: Callable[[str], AbstractAsyncContextManager[Transport]]
                         | None = None,
                         partner_name: str | None = None,
                         after: Callable[[Transport, AlignResult], Awaitable[None]]
                         | None = None,
                         ) -> tuple[AlignResult, AlignStats]:
    """Run one party's side of the mutual PSI over the broker at ``broker``.

    Args:
        ids: own IDs, input order (non-empty unique ``str``).
        role: ``"active"`` or ``"passive"`` (the partner takes the other).
        broker: broker base address ``tcp://HOST:PORT``.
        run_id: the run's topic namespace, the same on both parties.
        config: :class:`AlignConfig`.
        security: CURVE keys for the bus (None: plaintext, loopback only).
        connect: instead of a :class:`Bus` to ``broker``, the client this returns for a
            name (e.g. :meth:`pubsub.MemoryBroker.connect` for an in-process run;
            ``broker``, ``security`` and ``config.bus`` then do not apply).
        partner_name: names the partner in errors, logs and the bus client's name
            (default: its role; N-way alignment: the passive party's id).
        after: run on the same bus connection once the result is known, before it
            closes (N-way alignment's final step, :mod:`parties.alignment.nway`); its errors
            propagate and its bytes count in the stats.

    Returns:
        The result (shared IDs sorted, their own rows) and the cost.

    Raises:
        EmptyId, DuplicateIds: bad own IDs (checked before anything is sent).
        AlignTimeout: a message did not arrive in time (names which).
        AlignMismatch: the partner speaks another protocol version or reports another
            intersection size.
        MalformedPoints: a chunk from the partner does not have the expected layout, or
            a point of its request chunk is not on the curve (names the partner, the
            chunk and the point).
        pubsub.errors.BrokerUnreachable: no broker at ``broker``.
    """
    cfg = config or AlignConfig()
    partner = partner_of(role)
    label = partner_name or partner
    own = check_ids(ids)
    perm = shuffle_order(len(own))  # the secret order the points are sent in
    sent = [own[i] for i in perm]
    plan = ChunkPlan(n=len(own), chunk_size=cfg.chunk_size)
    mine, theirs = topics(run_id, role), topics(run_id, partner)
    session = PsiSession()
    crypto = _Crypto()
    lag = [0.0]
    lag_task = asyncio.create_task(_lag_monitor(lag))
    t0 = time.perf_counter()
    blog = log.bind(role=role, run_id=run_id)
    name = f"psi-{role}" if partner_name is None else f"psi-{role}-{label}"
    try:
        client = (open_bus(broker, name, cfg.bus, security) if connect is None
                  else connect(name))
        async with client as bus:
            await bus.subscribe_prefix(theirs["prefix"])
            hello = {"v": PROTOCOL_VERSION, "n": plan.n, "chunks": plan.n_chunks,
                     "chunk_size": plan.chunk_size}
            other = await _meet(bus, mine, theirs, role, partner, hello, cfg, label)
            if other.get("v") != PROTOCOL_VERSION:
                raise AlignMismatch("protocol version", PROTOCOL_VERSION, other.get("v"))
            try:
                pplan = ChunkPlan(n=int(other["n"]), chunk_size=int(other["chunk_size"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise AlignMismatch("hello fields", sorted(hello), repr(exc)) from None
            if other.get("chunks") != pplan.n_chunks:
                raise AlignMismatch(f"the {label} party's chunk count", pplan.n_chunks,
                                    other.get("chunks"))
            blog.info("psi.met", n_own=plan.n, n_partner=pplan.n, chunks=plan.n_chunks,
                      partner_chunks=pplan.n_chunks)
            own_keys = np.empty(plan.n, f"S{KEY_BYTES}")
            partner_keys = np.empty(pplan.n, f"S{KEY_BYTES}")
            credits = asyncio.Semaphore(cfg.window)
            done_chunks = {"answered": 0, "collected": 0}
            done_ids = [0]  # partner IDs answered + own IDs back: the estimate's measure
            t_met = last = time.perf_counter()

            def progress() -> None:
                # the cost is linear in the larger side (about 80 us of one core per own
                # and 60 us per partner ID): a 10^6-ID side takes minutes, so say where it
                # is (at most every PROGRESS_EVERY_S, when a chunk completes)
                nonlocal last
                now = time.perf_counter()
                if now - last < PROGRESS_EVERY_S:
                    return
                last = now
                n_done, total = done_ids[0], plan.n + pplan.n
                blog.info("psi.progress", partner=label,
                          partner_chunks_answered=done_chunks["answered"],
                          partner_chunks=pplan.n_chunks,
                          own_chunks_back=done_chunks["collected"], chunks=plan.n_chunks,
                          elapsed_s=round(now - t_met, 1),
                          eta_s=round((now - t_met) / n_done * (total - n_done), 1)
                          if n_done else None)

            async def send_requests() -> None:
                for i in range(plan.n_chunks):
                    await credits.acquire()
                    a, b = plan.bounds(i)
                    pts = await crypto.run(session.encrypt, sent[a:b])
                    await bus.publish(f"{mine['req']}/{i}", [pts], {"i": i}, copy=False)

            async def answer_partner() -> None:
                for i in range(pplan.n_chunks):
                    what = f"{label} req chunk {i}"
                    msg = await _next(bus, f"{theirs['req']}/{i}", what, cfg.chunk_timeout_s)
                    pts = _chunk_points(msg, pplan, i, what, label)
                    out = await crypto.run(functools.partial(
                        session.reencrypt, pts, what, sender=label, chunk=i))
                    a, b = pplan.bounds(i)
                    partner_keys[a:b] = compare_keys(out)
                    await bus.publish(f"{mine['resp']}/{i}", [out], {"i": i}, copy=False)
                    done_chunks["answered"] += 1
                    done_ids[0] += b - a
                    progress()

            async def collect_responses() -> None:
                for i in range(plan.n_chunks):
                    what = f"{label} resp chunk {i}"
                    msg = await _next(bus, f"{theirs['resp']}/{i}", what, cfg.chunk_timeout_s)
                    pts = _chunk_points(msg, plan, i, what, label)
                    # compared as bytes, never decoded: a response point off the curve
                    # cannot fail the library; it matches no honest point (see the module
                    # docstring)
                    check_points(pts, what, sender=label, chunk=i)
                    a, b = plan.bounds(i)
                    own_keys[a:b] = compare_keys(pts)
                    credits.release()
                    done_chunks["collected"] += 1
                    done_ids[0] += b - a
                    progress()

            tasks = [asyncio.create_task(c()) for c in
                     (send_requests, answer_partner, collect_responses)]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            tc = time.perf_counter()
            # off the loop: sorting 1M keys and 1M IDs takes about a second
            result = await asyncio.to_thread(_finish, own, unshuffle(own_keys, perm),
                                             partner_keys, pplan.n)
            compare_s = time.perf_counter() - tc
            await bus.publish(mine["done"], [], {"n_shared": result.n_shared,
                                                 "req_chunks": plan.n_chunks,
                                                 "resp_chunks": pplan.n_chunks})
            done = await _next(bus, theirs["done"], f"{label} done", cfg.chunk_timeout_s)
            if done.meta.get("n_shared") != result.n_shared:
                raise AlignMismatch("the number of shared IDs", result.n_shared,
                                    done.meta.get("n_shared"))
            if after is not None:
                await after(bus, result)
            st = bus.stats()
    finally:
        lag_task.cancel()
        crypto.close()
    stats = AlignStats(
        role=role, n_own=plan.n, n_partner=pplan.n, n_shared=result.n_shared,
        seconds=time.perf_counter() - t0, crypto_s=crypto.seconds, crypto_cpu_s=crypto.cpu_s,
        compare_s=compare_s,
        bytes_sent=st.sent_bytes.get("psi", 0), bytes_received=st.recv_bytes.get("psi", 0),
        chunks_sent=plan.n_chunks, chunks_received=pplan.n_chunks,
        loop_lag_max_s=lag[0])
    blog.info("psi.done", n_shared=stats.n_shared, seconds=round(stats.seconds, 3),
              crypto_s=round(stats.crypto_s, 3), bytes_sent=stats.bytes_sent,
              bytes_received=stats.bytes_received, loop_lag_max_s=round(stats.loop_lag_max_s, 4))
    return result, stats


def _finish(own: list[str], own_keys: np.ndarray, partner_keys: np.ndarray,
            n_partner: int) -> AlignResult:
    """Compare and build the result (runs off the event loop)."""
    return aligned(own, shared_mask(own_keys, partner_keys), n_partner=n_partner)


def _chunk_points(msg: Any, plan: ChunkPlan, i: int, what: str, sender: str) -> np.ndarray:
    """The points of chunk ``i`` of a message from ``sender``, checked against the plan.

    Raises:
        MalformedPoints: not one ``uint8 (m, 33)`` array with ``m`` the chunk's size.
    """
    if len(msg.arrays) != 1:
        raise MalformedPoints(what, f"expected 1 array, got {len(msg.arrays)}",
                              sender=sender, chunk=i)
    pts = msg.arrays[0]
    a, b = plan.bounds(i)
    if pts.dtype != np.uint8 or pts.shape != (b - a, POINT_BYTES):
        raise MalformedPoints(what, f"expected uint8 {(b - a, POINT_BYTES)}, got "
                              f"{pts.dtype} {pts.shape}", sender=sender, chunk=i)
    return pts


# ---------------------------------------------------------------------------- files
def load_ids(path: str | Path, column: str | None = None) -> list[str]:
    """Read IDs from a file.

    ``.csv``/``.csv.gz``/``.tsv`` (pandas, every cell read as text, so ``007`` stays
    ``007``) and ``.parquet`` take the column ``column`` (default ``id``); any other
    file is plain text, one ID per line (trailing ``\\r``/``\\n`` stripped, a final
    empty line ignored). Parquet integer or string columns are accepted; floats are
    not (``1.0`` vs ``1`` would silently misalign).

    Raises:
        IdFileError: missing file or column, unreadable, or a missing/float value.
    """
    p = Path(path)
    name = p.name.lower()
    col = column or "id"
    try:
        if not name.endswith(".parquet") and p.is_file():
            from parties.data import LineTooLong
            from parties.data.limits import scan_lines

            try:  # a line past the bound is refused before pandas holds it in memory
                scan_lines(p)
            except LineTooLong as exc:
                raise IdFileError(str(p), f"line {exc.line:,} is longer than "
                                  f"{exc.limit:,} bytes: not a file of IDs") from None
        if name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz")):
            import pandas as pd

            sep = "\t" if ".tsv" in name else ","
            try:
                # blank lines kept: a blank ID cell is an error (EmptyId), never a row
                # that silently disappears and shifts every later row number
                df = pd.read_csv(p, sep=sep, usecols=[col], dtype=str, keep_default_na=False,
                                 skip_blank_lines=False)
            except ValueError as exc:
                raise IdFileError(str(p), f"no column {col!r} ({exc})") from None
            return df[col].tolist()
        if name.endswith(".parquet"):
            import pandas as pd

            try:
                df = pd.read_parquet(p, columns=[col])
            except (KeyError, ValueError) as exc:
                raise IdFileError(str(p), f"no column {col!r} ({exc})") from None
            s = df[col]
            if s.isna().any():
                raise IdFileError(str(p), f"column {col!r} has a missing value at row "
                                  f"{int(np.flatnonzero(s.isna().to_numpy())[0])}")
            if s.dtype.kind == "f":
                raise IdFileError(str(p), f"column {col!r} is floating point; store IDs as "
                                  "strings or integers")
            return s.astype(str).tolist()
        if column is not None:
            raise IdFileError(str(p), "--column applies to CSV and Parquet files only")
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise IdFileError(str(p), exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise IdFileError(str(p), f"not UTF-8 text ({exc.reason})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


__all__ = ["AlignConfig", "AlignMismatch", "AlignStats", "AlignTimeout", "IdFileError",
           "align_over_bus", "load_ids", "open_bus", "partner_of", "topics"]
