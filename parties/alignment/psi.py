"""Private ID alignment (mutual ECDH PSI): the pure part. No sockets, no files.

Two VFL parties hold record IDs (strings). Alignment finds the IDs both hold so that
neither learns the other's non-shared IDs, and both learn the shared ones.

Protocol (mutual ECDH PSI, composed from the primitives of ``openmined-psi`` 2.x,
``private_set_intersection.python``; no elliptic-curve code here). Each party P draws
a fresh key k_P per run (``client.CreateWithNewKey``; ``server.CreateFromKey`` with
the same key bytes gives the matching server object) and:

1. sends ``H(x)^{k_P}`` for each own ID x (``client.CreateRequest``: hash to the
   curve P-256, then multiply by k_P), in input order, chunk by chunk;
2. multiplies each point of the partner's request by k_P (``server.ProcessRequest``,
   same order) and sends the result, ``H(y)^{k_Q k_P}``, back to the partner;
3. now holds its own IDs double-encrypted (received back, own order) and the
   partner's IDs double-encrypted (computed itself). An own ID is shared iff its
   double encryption is among the partner's. Points are compared on a 128-bit slice
   (:data:`KEY_BYTES` bytes after the compressed point's prefix byte, i.e. the top
   128 bits of the x-coordinate): two different points of the pseudo-random
   ``H(.)^{k_P k_Q}`` agree there with probability about 2^-128, so over all pairs the
   chance of any false match is at most ``n_own * n_partner / 2^128`` (about 3e-27 for
   1M x 1M).

What each party learns: the shared IDs, the partner's set size, and nothing about
the partner's other IDs (under the decisional Diffie-Hellman assumption in the
random-oracle model, for semi-honest parties). Each party sends its points in a
secret random order (:func:`shuffle_order`): the partner double-encrypts them in that
order and learns which positions are shared, so without the shuffle it would learn
where each shared ID sits in the party's file (its row order may carry meaning: sign-up
date, say). The output is sorted by ID, so both parties get the same order.

Duplicate IDs within one party's input are rejected (:class:`DuplicateIds`): a
duplicate would give two equal points in the request, which tells the partner that
the party holds a repeated record, and it makes "the row of a shared ID" ambiguous.
Empty IDs are rejected too (:class:`EmptyId`): they almost always mean a missing cell.

Source: the ECDH PSI of Meadows (1986) and Huberman, Franklin, Hogg (1999), as
implemented by OpenMined PSI (github.com/OpenMined/PSI, ``private_set_intersection/
cpp/psi_client.cpp``/``psi_server.cpp``).

Thread safety: the library's client and server objects share an OpenSSL BN_CTX and
crash when one object is used from two threads at once (seen here: a
``BIGNUM_TOO_LONG`` check failure, then SIGSEGV). The library releases the GIL, so
one :class:`PsiSession` must be driven from one thread at a time
(:mod:`parties.alignment.align` runs every call on a single-thread executor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import structlog

from parties.core.errors import VflError

log = structlog.get_logger(__name__)

#: Bytes of a compressed P-256 point as the library encodes it (prefix 0x02/0x03 + x).
POINT_BYTES = 33
#: Bytes of each point compared (after the prefix byte): 128 bits.
KEY_BYTES = 16
#: Default IDs per chunk (a request chunk is 16384 x 33 = 540,672 bytes).
DEFAULT_CHUNK = 16384


class AlignError(VflError):
    """Root of ID-alignment errors."""


class DuplicateIds(AlignError, ValueError):
    """An ID occurs more than once in one party's input.

    The message names the row positions, never the ID itself (it may be shown in
    shared logs).

    Attributes:
        first_row / dup_row: 0-based positions of the first and of the repeated
            occurrence in the input.
        n_duplicates: how many input rows repeat an earlier one.
    """

    def __init__(self, first_row: int, dup_row: int, n_duplicates: int) -> None:
        self.first_row = first_row
        self.dup_row = dup_row
        self.n_duplicates = n_duplicates
        super().__init__(f"duplicate IDs: {n_duplicates} row(s) repeat an earlier ID, first "
                         f"row {dup_row} repeats row {first_row} (0-based); alignment needs "
                         "unique IDs")


class EmptyId(AlignError, ValueError):
    """An ID is empty or not a string.

    Attributes:
        row: its 0-based position in the input.
        type_name: the type found.
    """

    def __init__(self, row: int, type_name: str) -> None:
        self.row = row
        self.type_name = type_name
        super().__init__(f"ID at row {row} (0-based) is empty or not a string "
                         f"({type_name}); every ID must be a non-empty str")


class MalformedPoints(AlignError, ValueError):
    """A chunk of encrypted points from the partner is not what the protocol sends: the
    wrong layout, or (request chunks) a point that does not decode to a point of P-256.

    Attributes:
        what: which chunk (e.g. ``"passive resp chunk 3"``).
        reason: what was wrong.
        sender: the party that sent the chunk (None: not known where raised).
        chunk: the chunk's index in the sender's plan (None: not known).
        point: the 0-based position in the chunk of the first point that does not
            decode (None: a layout error, or not known).
    """

    def __init__(self, what: str, reason: str, *, sender: str | None = None,
                 chunk: int | None = None, point: int | None = None) -> None:
        self.what = what
        self.reason = reason
        self.sender = sender
        self.chunk = chunk
        self.point = point
        src = f" from the {sender} party" if sender is not None else ""
        super().__init__(f"malformed points{src} in {what}: {reason}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkPlan:
    """How ``n`` IDs are cut into chunks of ``chunk_size`` (the last may be shorter).

    Attributes:
        n: number of IDs (>= 0).
        chunk_size: IDs per chunk (>= 1).

    Raises:
        ValueError: negative ``n`` or ``chunk_size`` < 1.
    """

    n: int
    chunk_size: int = DEFAULT_CHUNK

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n!r}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size!r}")

    @property
    def n_chunks(self) -> int:
        """Number of chunks (0 for no IDs)."""
        return math.ceil(self.n / self.chunk_size)

    def bounds(self, i: int) -> tuple[int, int]:
        """``(start, stop)`` row positions of chunk ``i``.

        Raises:
            IndexError: ``i`` outside ``[0, n_chunks)``.
        """
        if not 0 <= i < self.n_chunks:
            raise IndexError(f"chunk {i} outside [0, {self.n_chunks})")
        start = i * self.chunk_size
        return start, min(start + self.chunk_size, self.n)


@dataclass(frozen=True, slots=True, kw_only=True)
class AlignResult:
    """One party's alignment output.

    Attributes:
        ids: the shared IDs, sorted (Python ``str`` order, so both parties agree).
        rows: ``int64`` array of shape ``(len(ids),)``: ``rows[j]`` is the 0-based
            position of ``ids[j]`` in this party's own input.
        n_own: number of own IDs.
        n_partner: number of the partner's IDs.
    """

    ids: tuple[str, ...]
    rows: np.ndarray
    n_own: int
    n_partner: int

    @property
    def n_shared(self) -> int:
        """Number of shared IDs."""
        return len(self.ids)


def check_ids(ids: Sequence[object]) -> list[str]:
    """Validate one party's IDs: non-empty strings, no duplicates.

    Args:
        ids: the IDs in input order.

    Returns:
        The IDs as a list (same order).

    Raises:
        EmptyId: an ID is empty or not a ``str``.
        DuplicateIds: an ID occurs twice.
    """
    out = list(ids)
    for i, x in enumerate(out):
        if type(x) is not str or not x:
            raise EmptyId(i, type(x).__name__)
    if len(set(out)) != len(out):
        first: dict[str, int] = {}
        dup = None
        n_dup = 0
        for i, x in enumerate(out):
            j = first.setdefault(x, i)
            if j != i:
                n_dup += 1
                if dup is None:
                    dup = (j, i)
        assert dup is not None
        raise DuplicateIds(dup[0], dup[1], n_dup)
    return out


def _library():  # noqa: ANN202 - the library module
    import private_set_intersection.python as psi

    return psi


class PsiSession:
    """One party's key and the library objects that use it (one run, one thread at a time).

    The key never leaves this object (it is not sent, logged or written).
    """

    __slots__ = ("_client", "_server", "_psi")

    def __init__(self, key: bytes | None = None) -> None:
        psi = _library()
        self._psi = psi
        self._client = (psi.client.CreateWithNewKey(True) if key is None
                        else psi.client.CreateFromKey(key, True))
        self._server = psi.server.CreateFromKey(self._client.GetPrivateKeyBytes(), True)

    def encrypt(self, ids: Sequence[str]) -> np.ndarray:
        """``H(x)^k`` for each ID, in input order (``client.CreateRequest``).

        Args:
            ids: a chunk of IDs (``str``).

        Returns:
            ``uint8`` array of shape ``(len(ids), 33)``: compressed P-256 points.
        """
        req = self._client.CreateRequest(list(ids))
        return points_from_elements(req.encrypted_elements, "own request")

    def reencrypt(self, points: np.ndarray, what: str = "partner request", *,
                  sender: str | None = None, chunk: int | None = None) -> np.ndarray:
        """Multiply each point by this party's key (``server.ProcessRequest``), same order.

        Every point is decoded by the library, which checks that it lies on P-256 (an
        x-coordinate below the field prime whose ``x^3 - 3x + b`` is a square); the
        library's error for one that does not (``RuntimeError: ECGroup::CreateECPoint``)
        becomes :class:`MalformedPoints` naming the chunk and the first such point.

        Args:
            points: ``uint8`` array ``(m, 33)`` of compressed points (a partner's chunk).
            what: names the chunk in errors.
            sender / chunk: the sending party and the chunk's index, for the error.

        Returns:
            ``uint8`` array ``(m, 33)``.

        Raises:
            MalformedPoints: wrong dtype/shape, a prefix byte other than 2 or 3, or a
                point that is not on the curve.
        """
        check_points(points, what, sender=sender, chunk=chunk)
        try:
            resp = self._process(points)
        except RuntimeError as exc:
            j = self._first_bad(points)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            where = "a point of the chunk" if j is None else f"point {j} of the chunk"
            raise MalformedPoints(
                what, f"{where} is not a point of P-256 (the library: {first})",
                sender=sender, chunk=chunk, point=j) from None
        return points_from_elements(resp.encrypted_elements, what)

    def _process(self, points: np.ndarray):  # noqa: ANN202 - the library's response
        req = self._psi.Request(reveal_intersection=True,
                                encrypted_elements=split_points(points))
        return self._server.ProcessRequest(req)

    def _first_bad(self, points: np.ndarray) -> int | None:
        """The position of the first point the library refuses (bisection: about ``2m``
        point operations, only on the error path); None if none is refused alone."""
        lo, hi = 0, len(points)
        try:
            self._process(points[lo:hi])
            return None
        except RuntimeError:
            pass
        while hi - lo > 1:  # invariant: points[lo:hi] holds a refused point
            mid = (lo + hi) // 2
            try:
                self._process(points[lo:mid])
            except RuntimeError:
                hi = mid
            else:
                lo = mid
        return lo


def check_points(points: np.ndarray, what: str, *, sender: str | None = None,
                 chunk: int | None = None) -> None:
    """Check the layout of a chunk of points (not whether they lie on the curve: the
    library's decoding does that, :meth:`PsiSession.reencrypt`).

    Raises:
        MalformedPoints: not ``uint8`` of shape ``(m, 33)``, or a prefix byte not 2/3.
    """
    kw = {"sender": sender, "chunk": chunk}
    if not isinstance(points, np.ndarray) or points.dtype != np.uint8:
        raise MalformedPoints(what, f"expected a uint8 array, got "
                              f"{getattr(points, 'dtype', type(points).__name__)}", **kw)
    if points.ndim != 2 or points.shape[1] != POINT_BYTES:
        raise MalformedPoints(what, f"expected shape (m, {POINT_BYTES}), got {points.shape}",
                              **kw)
    if len(points):
        bad = np.flatnonzero(~np.isin(points[:, 0], (2, 3)))
        if len(bad):
            raise MalformedPoints(what, f"point {int(bad[0])} of the chunk has prefix byte "
                                  f"{int(points[bad[0], 0])}, not 2 or 3 (not a compressed "
                                  "point)", point=int(bad[0]), **kw)


def split_points(points: np.ndarray) -> list[bytes]:
    """``(m, 33)`` uint8 array -> list of ``m`` 33-byte ``bytes`` (the protobuf's form)."""
    raw = np.ascontiguousarray(points).tobytes()
    return [raw[i:i + POINT_BYTES] for i in range(0, len(raw), POINT_BYTES)]


def points_from_elements(elements: Sequence[bytes], what: str) -> np.ndarray:
    """The library's repeated ``bytes`` -> ``uint8`` array ``(m, 33)``.

    Raises:
        MalformedPoints: an element is not 33 bytes.
    """
    raw = b"".join(elements)
    if len(raw) != len(elements) * POINT_BYTES:
        raise MalformedPoints(what, f"elements are not all {POINT_BYTES} bytes")
    return np.frombuffer(raw, np.uint8).reshape(len(elements), POINT_BYTES)


def compare_keys(points: np.ndarray) -> np.ndarray:
    """The compared slice of each point: bytes 1..16 (after the prefix), as ``S16``.

    Args:
        points: ``uint8`` ``(m, 33)``.

    Returns:
        ``|S16`` array of shape ``(m,)`` (16 bytes each, 16 * m bytes in all). Fixed-width
        ``S`` items compare as whole 16-byte buffers, so equality is exact on the slice.
    """
    sl = np.ascontiguousarray(points[:, 1:1 + KEY_BYTES])
    return sl.view(f"S{KEY_BYTES}").reshape(len(points))


def shared_mask(own: np.ndarray, partner: np.ndarray) -> np.ndarray:
    """Which own double encryptions occur among the partner's.

    Sorting plus ``searchsorted``: O((n + m) log m) time and no memory beyond a sorted
    copy of ``partner`` (16 bytes per ID), against about 100 bytes per ID for a Python
    ``set`` of ``bytes``.

    Args:
        own: ``S16`` ``(n,)``, own IDs double-encrypted, own order.
        partner: ``S16`` ``(m,)``, the partner's IDs double-encrypted, any order.

    Returns:
        ``bool`` array ``(n,)``.
    """
    if len(own) == 0 or len(partner) == 0:
        return np.zeros(len(own), bool)
    srt = np.sort(partner, kind="stable")
    pos = np.searchsorted(srt, own)
    pos[pos == len(srt)] = len(srt) - 1
    return srt[pos] == own


def aligned(ids: Sequence[str], mask: np.ndarray, *, n_partner: int) -> AlignResult:
    """The result from the own IDs and the shared mask: shared IDs sorted, their rows.

    Args:
        ids: own IDs, input order.
        mask: ``bool`` ``(len(ids),)`` from :func:`shared_mask`.
        n_partner: the partner's set size.

    Raises:
        ValueError: ``mask`` has the wrong length.
    """
    if len(mask) != len(ids):
        raise ValueError(f"mask has {len(mask)} entries for {len(ids)} IDs")
    rows = np.flatnonzero(mask)
    order = sorted(range(len(rows)), key=lambda j: ids[rows[j]])
    rows = rows[np.asarray(order, dtype=np.int64)] if len(rows) else rows.astype(np.int64)
    return AlignResult(ids=tuple(ids[r] for r in rows), rows=rows.astype(np.int64),
                       n_own=len(ids), n_partner=n_partner)


class MalformedMask(AlignError, ValueError):
    """The active party's final mask for a passive party does not fit that party's
    pairwise result (N-way alignment).

    Attributes:
        party: the passive party the mask is for.
        reason: what was wrong.
    """

    def __init__(self, party: str, reason: str) -> None:
        self.party = party
        self.reason = reason
        super().__init__(f"malformed final mask for the {party} party: {reason}")


def final_masks(pairwise: Mapping[str, Sequence[str]]
                ) -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
    """The active party's side of N-way alignment, after one PSI per passive party.

    Args:
        pairwise: passive party id -> the IDs the active party shares with it, sorted
            (:attr:`AlignResult.ids` of that pair's session; the passive party holds the
            same list).

    Returns:
        ``(final, masks)``: the IDs in every pairwise list, sorted (Python ``str``
        order), and for each party a ``uint8`` array over its list, 1 where the ID is in
        ``final``. A passive party that applies its mask to its own list
        (:func:`apply_mask`) gets ``final`` in the same order.

    Raises:
        ValueError: no party, or a list that is not sorted and unique.
    """
    if not pairwise:
        raise ValueError("final_masks needs at least one passive party")
    for party, ids in pairwise.items():
        if any(ids[j] >= ids[j + 1] for j in range(len(ids) - 1)):
            raise ValueError(f"the IDs shared with {party!r} are not sorted and unique")
    lists = sorted(pairwise.values(), key=len)
    common = set(lists[0])
    for ids in lists[1:]:
        common.intersection_update(ids)
    final = tuple(x for x in lists[0] if x in common)  # sorted: a sorted list's subsequence
    masks = {party: np.fromiter((x in common for x in ids), np.uint8, len(ids))
             for party, ids in pairwise.items()}
    return final, masks


def apply_mask(result: AlignResult, mask: np.ndarray, *, party: str,
               n_final: int) -> AlignResult:
    """A passive party's final result: its pairwise result restricted to the mask.

    Args:
        result: the party's pairwise result (shared IDs sorted, its rows).
        mask: ``uint8`` ``(result.n_shared,)`` of 0 and 1, from :func:`final_masks`.
        party: the party (names it in errors).
        n_final: the final intersection's size as the active party announced it.

    Returns:
        The final IDs (sorted) and their rows in this party's input; ``n_own`` and
        ``n_partner`` as in ``result``.

    Raises:
        MalformedMask: wrong dtype, length or values, or a count other than ``n_final``.
    """
    if not isinstance(mask, np.ndarray) or mask.dtype != np.uint8 or mask.ndim != 1:
        raise MalformedMask(party, "expected a 1-d uint8 array, got "
                            f"{getattr(mask, 'dtype', type(mask).__name__)} "
                            f"{getattr(mask, 'shape', '')}")
    if len(mask) != result.n_shared:
        raise MalformedMask(party, f"{len(mask)} entries for {result.n_shared} "
                            "pairwise shared IDs")
    if len(mask) and int(mask.max()) > 1:
        raise MalformedMask(party, "entries must be 0 or 1")
    keep = mask.astype(bool)
    if int(keep.sum()) != n_final:
        raise MalformedMask(party, f"{int(keep.sum())} IDs kept, announced {n_final}")
    idx = np.flatnonzero(keep)
    return AlignResult(ids=tuple(result.ids[j] for j in idx),
                       rows=result.rows[idx].astype(np.int64),
                       n_own=result.n_own, n_partner=result.n_partner)


def select_ids(ids: Sequence[str], final: Sequence[str], *, n_partner: int) -> AlignResult:
    """The active party's final result: ``final`` (sorted) and each one's row in its own
    input ``ids``.

    Raises:
        ValueError: an ID of ``final`` is not among ``ids``.
    """
    keep = set(final)
    mask = np.fromiter((x in keep for x in ids), bool, len(ids))
    if int(mask.sum()) != len(keep):
        raise ValueError("an ID of the final intersection is not among the own IDs")
    return aligned(ids, mask, n_partner=n_partner)


def encrypt_chunked(session: PsiSession, ids: Sequence[str], chunk_size: int) -> np.ndarray:
    """All of ``ids`` encrypted, chunk by chunk: ``uint8`` ``(n, 33)`` (in-process helper)."""
    plan = ChunkPlan(n=len(ids), chunk_size=chunk_size)
    parts = [session.encrypt(ids[a:b]) for a, b in map(plan.bounds, range(plan.n_chunks))]
    return np.concatenate(parts) if parts else np.zeros((0, POINT_BYTES), np.uint8)


def reencrypt_chunked(session: PsiSession, points: np.ndarray, chunk_size: int) -> np.ndarray:
    """:meth:`PsiSession.reencrypt` chunk by chunk: ``uint8`` ``(m, 33)``."""
    plan = ChunkPlan(n=len(points), chunk_size=chunk_size)
    parts = [session.reencrypt(points[a:b]) for a, b in map(plan.bounds, range(plan.n_chunks))]
    return np.concatenate(parts) if parts else np.zeros((0, POINT_BYTES), np.uint8)


def mutual_psi_local(ids_a: Sequence[str], ids_b: Sequence[str], *,
                     chunk_size: int = DEFAULT_CHUNK) -> tuple[AlignResult, AlignResult]:
    """Both parties' side of the mutual protocol in this one process, no bus.

    The reference for tests and the benchmark's in-process row; the same calls in the
    same order as :mod:`parties.alignment.align`, without messages.

    Raises:
        EmptyId, DuplicateIds: bad input on either side.
    """
    a, b = check_ids(ids_a), check_ids(ids_b)
    sa, sb = PsiSession(), PsiSession()
    pa, pb = shuffle_order(len(a)), shuffle_order(len(b))
    req_a = encrypt_chunked(sa, [a[i] for i in pa], chunk_size)
    req_b = encrypt_chunked(sb, [b[i] for i in pb], chunk_size)
    dbl_a = reencrypt_chunked(sb, req_a, chunk_size)  # A's IDs, by B: sent back to A
    dbl_b = reencrypt_chunked(sa, req_b, chunk_size)  # B's IDs, by A: sent back to B
    ka, kb = unshuffle(compare_keys(dbl_a), pa), unshuffle(compare_keys(dbl_b), pb)
    return (aligned(a, shared_mask(ka, kb), n_partner=len(b)),
            aligned(b, shared_mask(kb, ka), n_partner=len(a)))


def shuffle_order(n: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """A secret random permutation of ``range(n)``: the order in which a party sends its
    IDs (``sent[j] = ids[perm[j]]``).

    Args:
        n: number of IDs.
        rng: a generator (tests); default: seeded from the OS (``secrets``).

    Returns:
        ``int64`` array ``(n,)``.
    """
    if rng is None:
        import secrets

        rng = np.random.default_rng(secrets.randbits(128))
    return rng.permutation(n).astype(np.int64)


def unshuffle(keys_sent_order: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Keys received in sending order -> input order: ``out[perm[j]] = keys[j]``."""
    out = np.empty_like(keys_sent_order)
    out[perm] = keys_sent_order
    return out


def demo_ids(n: int, overlap: float, seed: int) -> tuple[list[str], list[str]]:
    """Two ID sets of ``n`` IDs each, ``round(n * overlap)`` of them shared, shuffled.

    IDs look like ``cust-00012345-7f3a`` (unique, not sequential in file order).

    Raises:
        ValueError: ``n`` < 0 or ``overlap`` outside [0, 1].
    """
    if n < 0 or not 0.0 <= overlap <= 1.0:
        raise ValueError(f"need n >= 0 and 0 <= overlap <= 1, got n={n!r}, overlap={overlap!r}")
    rng = np.random.default_rng(seed)
    k = round(n * overlap)
    total = 2 * n - k
    nums = rng.choice(10 * max(total, 1), size=total, replace=False)
    tags = rng.integers(0, 1 << 16, size=total)
    pool = [f"cust-{int(v):09d}-{int(t):04x}" for v, t in zip(nums, tags, strict=True)]
    a = pool[:n]
    b = pool[:k] + pool[n:]
    rng.shuffle(a)
    rng.shuffle(b)
    return a, b


__all__ = ["AlignError", "AlignResult", "ChunkPlan", "DEFAULT_CHUNK", "DuplicateIds",
           "EmptyId", "KEY_BYTES", "MalformedMask", "MalformedPoints", "POINT_BYTES",
           "PsiSession", "aligned", "apply_mask", "check_ids", "check_points", "compare_keys",
           "demo_ids", "final_masks", "mutual_psi_local", "select_ids", "shared_mask",
           "shuffle_order", "unshuffle"]
