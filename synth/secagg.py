"""Secure aggregation of integer vectors over many rounds: pure protocol logic, no transport.

Implements the masking protocol of Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning" (CCS 2017), with the sparse neighbour graph of
SecAgg+ (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead", CCS 2020), for the semi-honest server model (no signatures on keys), run as
one *session* of many rounds so that keys are agreed once per session rather than once
per round. A bus layer drives the stages; the server learns only each round's sum:

1. **Advertise keys** (once per session). Each party makes two X25519 key pairs: ``c``
   to agree pairwise *mask* keys and ``e`` to encrypt shares in transit, and sends both
   public keys to the server (:meth:`SecAggClient.public_keys`,
   :meth:`SecAggServer.register_keys`), which forwards each party its neighbours' keys
   (:meth:`SecAggServer.keys_for`, :meth:`SecAggClient.receive_public_keys`).
2. **Share seeds** (once per batch of rounds). For each round ``r`` of the batch a party
   draws a private 16-byte (128-bit) self-mask seed ``b_(u,r)``, Shamir-splits it among its
   neighbours and itself (threshold ``t``) and sends each neighbour its shares of the
   whole batch in one ChaCha20-Poly1305 ciphertext under a key agreed from ``e``; the
   server routes the ciphertexts (:meth:`SecAggClient.share_seeds`,
   :meth:`SecAggServer.collect_seed_shares`, :meth:`SecAggServer.seed_shares_for`,
   :meth:`SecAggClient.receive_seed_shares`).
3. **Masked input** (per round). ``y_u = x_u + PRG(b_(u,r)) + Σ_(v ∈ N(u)) s(u, v)
   PRG(k_(uv,r))`` in each cell's ring ``Z_(2^w)``, with ``k_(uv,r) = HKDF(DH(c_u, c_v),
   r)`` and ``s = +1`` when ``u < v`` (lexicographically), ``-1`` otherwise, so the
   pairwise masks cancel in the sum (:meth:`SecAggClient.masked`).
4. **Unmask** (per round). For each party that masked, survivors reveal their share of
   its seed ``b_(u,r)``; for a neighbour that shared seeds but whose masked vector never
   arrived, a survivor reveals its round key ``k_(uv,r)`` with it, so the server can
   remove the dangling pairwise mask (:meth:`SecAggClient.reveal_all`,
   :meth:`SecAggServer.unmask`). An honest party never reveals both for the same owner in
   the same round. Over an aggregation tree the self masks can be removed at the leaves
   instead (:func:`self_mask_sum`, :meth:`SecAggServer.unmask_tree`): survivors send
   seed shares to the owner's leaf aggregator and round keys to the server only, which
   then does ``O(top-level nodes + dropped)`` vector work rather than ``O(K)``.

Why round keys rather than Shamir shares of ``c_sk`` for dropouts (Bonawitz): the mask key
is agreed once per session, and revealing ``c_sk`` would expose the pairwise masks of every
round, so with the self-mask seeds revealed in earlier rounds the server could unmask
those rounds' inputs. A round key ``k_(uv,r)`` is one HKDF output: it exposes that round's
pair mask only, and the dropped party's input of that round, if it arrives, is still hidden
by ``PRG(b_(u,r))``, whose shares are then never revealed. The cost: a survivor that drops
between sending its masked input and the unmask stage while a neighbour of it had dropped
before makes the round unrecoverable (:class:`MissingPairKeys`), where Bonawitz's ``t``-out-
of-``k`` shares of ``c_sk`` would still recover it.

Threat model: honest-but-curious server and parties. Not implemented (needed against an
active server): signatures on advertised keys and Bonawitz's consistency-check round, which
stop a server from claiming different dropout sets to different parties.

Masks are a ChaCha20 keystream under an HKDF-SHA256 key (8 bytes per word, reduced mod
``2^w``); never a non-cryptographic PRNG (Flower's SecAgg+ folds seeds to 32 bits into
NumPy's RandomState). Masked words are uniformly random and cannot be compressed, so a
cell's ring ``w`` should be just wide enough for its sum (:func:`ring_bits`,
:func:`synth.protocol.cell_windows`).
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "PRIME",
    "SEED_BYTES",
    "SHARE_BYTES",
    "cell_modmask",
    "run_key_stages",
    "self_mask_sum",
    "DuplicatePartyError",
    "MissingPairKeys",
    "PartyKeys",
    "ProtocolError",
    "RevealedShare",
    "SecAggClient",
    "SecAggConfig",
    "SecAggError",
    "SecAggServer",
    "RoundSpec",
    "TooFewShares",
    "TooFewSurvivors",
    "VectorError",
    "default_degree",
    "derive_key",
    "mask",
    "neighbours",
    "recover_secret",
    "ring_bits",
    "split_secret",
    "stream_nonce",
]

#: The Shamir field GF(PRIME): the smallest prime above 2^136 (sympy.nextprime), so a
#: 16-byte seed with its 0x01 length-keeping prefix (< 2^129) is a field element and a
#: share travels in 18 bytes. Only self-mask seeds are Shamir-shared (a dropped party's
#: pair masks are removed with round keys, which are revealed whole).
PRIME = (1 << 136) + 85
#: Bytes of one Shamir share (an element of GF(PRIME)): ceil(137 / 8).
SHARE_BYTES = _Y_BYTES = (PRIME.bit_length() + 7) // 8
_MAX_SECRET = 16
#: Bytes of a self-mask seed (128-bit security; HKDF expands it into mask keys).
SEED_BYTES = 16
_INFO_PREFIX = b"fedforge/secagg/v1"


# --------------------------------------------------------------------------- errors


class SecAggError(Exception):
    """Root of the secure-aggregation errors."""


class DuplicatePartyError(SecAggError, ValueError):
    """Party ids are not unique.

    Attributes:
        duplicates: the ids that occur more than once, sorted.
    """

    def __init__(self, duplicates: Sequence[str]) -> None:
        self.duplicates = tuple(sorted(duplicates))
        super().__init__(f"duplicate party ids: {list(self.duplicates)}")


class VectorError(SecAggError, ValueError):
    """A vector has the wrong shape or dtype, or a value outside ``[0, 2^m)``.

    Attributes:
        party: the party whose vector it is ("" when unknown).
        reason: what was wrong.
    """

    def __init__(self, party: str, reason: str) -> None:
        self.party = party
        self.reason = reason
        super().__init__(f"vector of party {party!r}: {reason}")


class TooFewSurvivors(SecAggError, RuntimeError):
    """Fewer parties remain than the reconstruction threshold: the round must abort.

    Attributes:
        stage: the protocol stage ("keys", "shares", "masked", "unmask").
        survivors: how many remain.
        threshold: how many are needed.
    """

    def __init__(self, stage: str, survivors: int, threshold: int) -> None:
        self.stage = stage
        self.survivors = survivors
        self.threshold = threshold
        super().__init__(f"stage {stage}: {survivors} parties remain, threshold is {threshold}")


class TooFewShares(SecAggError, RuntimeError):
    """Fewer Shamir shares than the threshold were given for one secret.

    Attributes:
        owner: whose secret ("" for a bare :func:`recover_secret` call).
        got: distinct shares given.
        threshold: shares needed.
    """

    def __init__(self, owner: str, got: int, threshold: int) -> None:
        self.owner = owner
        self.got = got
        self.threshold = threshold
        super().__init__(f"secret of {owner!r}: {got} shares, threshold is {threshold}")


class MissingPairKeys(SecAggError, RuntimeError):
    """Survivors that paired with a dropped party did not reveal their round key with it,
    so its pairwise masks cannot be removed: the round's sum is lost.

    Attributes:
        dropped: the dropped party.
        holders: the survivors whose round keys with it are missing, sorted.
    """

    def __init__(self, dropped: str, holders: Sequence[str]) -> None:
        self.dropped = dropped
        self.holders = tuple(sorted(holders))
        super().__init__(f"round keys with dropped party {dropped!r} missing from "
                         f"{list(self.holders)}")


class ProtocolError(SecAggError, RuntimeError):
    """A stage was driven out of order, or a message failed to authenticate.

    Attributes:
        party: the party concerned ("" for the server as a whole).
        reason: what happened.
    """

    def __init__(self, party: str, reason: str) -> None:
        self.party = party
        self.reason = reason
        super().__init__(f"secagg protocol error ({party!r}): {reason}")


# --------------------------------------------------------------------------- parameters


def ring_bits(bits: int, n_parties: int, headroom: int = 2) -> int:
    """Masked word width ``m = bits + ceil(log2 K) + headroom``.

    ``K`` values below ``2^bits`` sum to less than ``K * 2^bits <= 2^(bits + ceil(log2 K))``;
    the headroom bits leave room for the signed sums of deltas (one bit) and for rounding
    of discretised noise. Masked words are uniform in ``Z_{2^m}``, so ``m`` is what each
    value costs on the wire after masking.

    Args:
        bits: width of each party's values (the quantiser's ``b``), >= 1.
        n_parties: ``K`` >= 1.
        headroom: extra bits, >= 0 (default 2).

    Returns:
        ``m``, at most 64.

    Raises:
        ValueError: an argument is out of range or ``m > 64``.
    """
    if bits < 1 or n_parties < 1 or headroom < 0:
        raise ValueError(f"need bits >= 1, n_parties >= 1, headroom >= 0; got {bits}, {n_parties}, {headroom}")
    m = bits + math.ceil(math.log2(n_parties)) + headroom if n_parties > 1 else bits + headroom
    if m > 64:
        raise ValueError(f"ring width {m} exceeds 64 bits")
    return m


def _check_unique(party_ids: Sequence[str]) -> list[str]:
    ids = [str(p) for p in party_ids]
    seen: set[str] = set()
    dup: set[str] = set()
    for p in ids:
        if p in seen:
            dup.add(p)
        seen.add(p)
    if dup:
        raise DuplicatePartyError(sorted(dup))
    return ids


def default_degree(n_parties: int) -> int:
    """SecAgg+ default neighbour count: ``min(K - 1, 2 * ceil(log2 K))`` rounded up to even.

    When the result would be ``K - 1`` (or more) the graph is complete.
    """
    if n_parties <= 1:
        return 0
    k = min(n_parties - 1, 2 * math.ceil(math.log2(n_parties)))
    if k < n_parties - 1 and k % 2:
        k += 1
    return k


def neighbours(party_ids: Sequence[str], k: int | None = None, seed: bytes = b"") -> dict[str, tuple[str, ...]]:
    """SecAgg+ sparse symmetric pairing: a Harary graph over a seeded permutation.

    The parties are ordered by ``SHA-256(seed || len || id)`` (a public, deterministic
    permutation); position ``i`` is joined to positions ``i ± 1 .. i ± k/2 (mod K)``.
    With ``k >= K - 1`` the graph is complete. Symmetric by construction: ``a ∈ N(b)``
    iff ``b ∈ N(a)``; every party has exactly ``k`` neighbours (``k`` made even when
    below ``K - 1``).

    Args:
        party_ids: the ``K`` distinct party ids.
        k: degree; None for :func:`default_degree`. Odd ``k < K - 1`` is rounded up.
        seed: public seed (e.g. the round id), the same for all parties and the server.

    Returns:
        ``{party: sorted tuple of neighbour ids}``.

    Raises:
        DuplicatePartyError: repeated ids.
        ValueError: ``k < 0``.
    """
    ids = _check_unique(party_ids)
    n = len(ids)
    if k is None:
        k = default_degree(n)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k >= n - 1:
        return {p: tuple(sorted(q for q in ids if q != p)) for p in ids}
    if k % 2:
        k += 1
    if k >= n - 1:
        return {p: tuple(sorted(q for q in ids if q != p)) for p in ids}

    def rank(p: str) -> bytes:
        b = p.encode()
        return hashlib.sha256(seed + struct.pack(">I", len(b)) + b).digest()

    order = sorted(ids, key=lambda p: (rank(p), p))
    out: dict[str, set[str]] = {p: set() for p in ids}
    for i, p in enumerate(order):
        for j in range(1, k // 2 + 1):
            q = order[(i + j) % n]
            out[p].add(q)
            out[q].add(p)
    return {p: tuple(sorted(s)) for p, s in out.items()}


# --------------------------------------------------------------------------- primitives


def _lp(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def derive_key(shared_secret: bytes, *, purpose: str, round_id: str, ids: Iterable[str]) -> bytes:
    """HKDF-SHA256 a 32-byte key from a shared secret (or a seed).

    The ``info`` binds the protocol version, the purpose ("mask", "enc", "self"), the round
    id and the party ids in sorted order, each length-prefixed.

    Args:
        shared_secret: X25519 shared secret (32 bytes) or a private seed.
        purpose: key purpose label.
        round_id: round identifier.
        ids: party ids (sorted here, so both ends derive the same key).

    Returns:
        32 bytes.
    """
    info = _INFO_PREFIX + _lp(purpose.encode()) + _lp(round_id.encode())
    for p in sorted(ids):
        info += _lp(p.encode())
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared_secret)


def stream_nonce(round_id: str, stream: str = "") -> bytes:
    """16-byte ChaCha20 nonce for a (round, stream): 4 zero counter bytes + 12 hash bytes."""
    h = hashlib.sha256(_INFO_PREFIX + b"/nonce" + _lp(round_id.encode()) + _lp(stream.encode())).digest()
    return b"\x00" * 4 + h[:12]


def mask(key: bytes, n: int, m: int, nonce: bytes) -> np.ndarray:
    """Expand a key into ``n`` uniform words of ``Z_{2^m}`` with the ChaCha20 keystream.

    Reads 8 little-endian bytes of keystream per word and keeps the low ``m`` bits.

    Args:
        key: 32 bytes.
        n: number of words.
        m: ring width, 1..64.
        nonce: 16 bytes (see :func:`stream_nonce`).

    Returns:
        uint64, shape ``(n,)``, values in ``[0, 2^m)``.

    Raises:
        ValueError: bad key/nonce length, ``n < 0`` or ``m`` outside [1, 64].
    """
    if len(key) != 32 or len(nonce) != 16:
        raise ValueError(f"need a 32-byte key and a 16-byte nonce, got {len(key)}, {len(nonce)}")
    if n < 0 or not 1 <= m <= 64:
        raise ValueError(f"need n >= 0 and 1 <= m <= 64, got {n}, {m}")
    enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    stream = enc.update(bytes(8 * n))
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64) & np.uint64((1 << m) - 1)


# --------------------------------------------------------------------------- Shamir


class _RandBelow(Protocol):
    def randbelow(self, n: int, /) -> int: ...


def _eval_poly(coeffs: Sequence[int], x: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % PRIME
    return acc


def split_secret(
    secret: bytes, n_shares: int, threshold: int, rng: Any = secrets
) -> list[tuple[int, int]]:
    """Shamir-split ``secret`` over GF(:data:`PRIME`) into shares at ``x = 1 .. n_shares``.

    The secret is encoded as the integer of ``0x01 || secret`` (so leading zero bytes
    survive) and placed at ``f(0)`` of a random polynomial of degree ``threshold - 1``.
    Any ``threshold`` shares determine it; fewer reveal nothing (Shamir, CACM 1979).

    Args:
        secret: 0..16 bytes (seeds are 16).
        n_shares: number of shares, >= threshold.
        threshold: shares needed to recover, >= 1.
        rng: object with ``randbelow(n)``; the ``secrets`` module by default.

    Returns:
        ``[(x, y), ...]`` with ``x = 1..n_shares`` and ``y`` in the field.

    Raises:
        ValueError: secret too long, or bad ``n_shares`` / ``threshold``.
    """
    if len(secret) > _MAX_SECRET:
        raise ValueError(f"secret of {len(secret)} bytes exceeds {_MAX_SECRET}")
    if not 1 <= threshold <= n_shares:
        raise ValueError(f"need 1 <= threshold <= n_shares, got {threshold}, {n_shares}")
    xs = list(range(1, n_shares + 1))
    return list(zip(xs, _share_at(secret, xs, threshold, rng), strict=True))


def _share_at(secret: bytes, xs: Sequence[int], threshold: int, rng: Any = secrets) -> list[int]:
    s = int.from_bytes(b"\x01" + secret, "big")
    coeffs = [s] + [rng.randbelow(PRIME) for _ in range(threshold - 1)]
    return [_eval_poly(coeffs, x) for x in xs]


def _interpolate_at_zero(shares: Sequence[tuple[int, int]]) -> int:
    total = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, (xj, _) in enumerate(shares):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total


def recover_secret(shares: Iterable[tuple[int, int]], threshold: int, *, owner: str = "") -> bytes:
    """Recover a :func:`split_secret` secret by Lagrange interpolation at 0.

    Uses the first ``threshold`` shares with distinct ``x``.

    Args:
        shares: ``(x, y)`` pairs.
        threshold: the threshold used to split.
        owner: label for errors.

    Returns:
        The secret bytes.

    Raises:
        TooFewShares: fewer than ``threshold`` distinct shares.
        ValueError: the interpolated value is not a valid encoding (inconsistent shares,
            or a threshold smaller than the one used to split).
    """
    distinct: dict[int, int] = {}
    for x, y in shares:
        if x % PRIME == 0:
            raise ValueError("share at x = 0")
        distinct.setdefault(int(x), int(y))
    if len(distinct) < threshold or threshold < 1:
        raise TooFewShares(owner, len(distinct), threshold)
    pts = list(distinct.items())[:threshold]
    value = _interpolate_at_zero(pts)
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    if not raw or raw[0] != 1 or len(raw) > _MAX_SECRET + 1:
        raise ValueError(f"shares of {owner!r} do not interpolate to a valid secret")
    return raw[1:]


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class PartyKeys:
    """Stage-1 advertisement: raw 32-byte X25519 public keys.

    Attributes:
        party: the advertising party.
        mask_public: public key for pairwise mask agreement.
        enc_public: public key for share encryption.
    """

    party: str
    mask_public: bytes
    enc_public: bytes


@dataclass(frozen=True, slots=True)
class RevealedShare:
    """What a survivor reveals about another party at unmask time.

    Attributes:
        owner: whose secret.
        holder: who reveals it.
        kind: ``seed`` (a Shamir share of a survivor's self-mask seed of the round) or
            ``pair`` (the holder's round key with a dropped neighbour, as an integer).
        x: Shamir abscissa (the holder's 1-based index in the sorted party list).
        y: Shamir ordinate (``seed``) or the 32-byte round key as a big-endian integer
            (``pair``).
    """

    owner: str
    holder: str
    kind: Literal["seed", "pair"]
    x: int
    y: int


# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class SecAggConfig:
    """Public parameters of one secure-aggregation session, identical at parties and server.

    Attributes:
        session_id: unique per session; bound into every key, nonce and AAD.
        party_ids: all ``K`` party ids (unique).
        threshold: Shamir threshold ``t``; None for ``floor(k/2) + 1`` where ``k`` is the
            degree (at least 1). Must satisfy ``1 <= t <= k + 1``; a survivor's seed is
            recoverable only when ``t`` of its ``k`` neighbours and itself answer.
        degree: neighbour count ``k``; None for :func:`default_degree`.
        graph_seed: public seed of the neighbour graph (defaults to the session id).

    Raises:
        DuplicatePartyError: repeated ids.
        ValueError: empty party list or a bad threshold.
    """

    session_id: str
    party_ids: tuple[str, ...]
    threshold: int | None = None
    degree: int | None = None
    graph_seed: bytes | None = None
    graph: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    index: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = _check_unique(self.party_ids)
        if not ids:
            raise ValueError("need at least one party")
        seed = self.graph_seed if self.graph_seed is not None else self.session_id.encode()
        graph = neighbours(ids, self.degree, seed)
        k = min(len(v) for v in graph.values())
        t = self.threshold if self.threshold is not None else k // 2 + 1
        if not 1 <= t <= k + 1:
            raise ValueError(f"threshold must be in [1, degree + 1 = {k + 1}], got {t}")
        object.__setattr__(self, "party_ids", tuple(ids))
        object.__setattr__(self, "threshold", t)
        object.__setattr__(self, "graph", graph)
        object.__setattr__(self, "index", {p: i + 1 for i, p in enumerate(sorted(ids))})

    @property
    def t(self) -> int:
        """The resolved threshold."""
        assert self.threshold is not None
        return self.threshold

    def holders(self, owner: str) -> tuple[str, ...]:
        """Parties holding shares of ``owner``'s seeds: its neighbours and itself."""
        return tuple(sorted((*self.graph[owner], owner)))

    def rid(self, round_id: str) -> str:
        """The round's id as bound into keys and nonces: session and round."""
        return f"{self.session_id}/{round_id}"


def cell_modmask(widths: Any) -> np.ndarray:
    """uint64 ``2^w − 1`` for each ring width ``w`` in [1, 64] (any shape)."""
    w = np.asarray(widths).astype(np.uint64)
    full = np.uint64(2**64 - 1)
    return np.where(w >= 64, full, (np.uint64(1) << np.minimum(w, np.uint64(63))) - np.uint64(1))


@dataclass(frozen=True)
class RoundSpec:
    """Public parameters of one round of a session.

    Attributes:
        round_id: unique within the session; it must be in a seed batch the parties shared.
        vector_len: ``n``, length of each party's vector.
        ring_bits: ``m``, the widest ring (see :func:`ring_bits`), 1..64.
        cell_bits: per-cell ring widths (bytes, one per cell, each in [1, m]): cell ``i``
            is masked and summed in ``Z_(2^cell_bits[i])``
            (:func:`synth.protocol.cell_windows`); None: every cell in ``Z_(2^m)``.

    Raises:
        ValueError: bad ``m``, ``n`` or cell widths.
    """

    round_id: str
    vector_len: int
    ring_bits: int
    cell_bits: bytes | None = field(default=None, repr=False)
    modmask: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.ring_bits <= 64:
            raise ValueError(f"ring_bits must be in [1, 64], got {self.ring_bits}")
        if self.vector_len < 0:
            raise ValueError(f"vector_len must be >= 0, got {self.vector_len}")
        if self.cell_bits is None:
            mod: Any = cell_modmask(np.array(self.ring_bits))[()]
        else:
            w = np.frombuffer(self.cell_bits, dtype=np.uint8)
            if w.shape[0] != self.vector_len:
                raise ValueError(f"{w.shape[0]} cell widths for vector_len {self.vector_len}")
            if w.size and (int(w.min()) < 1 or int(w.max()) > self.ring_bits):
                raise ValueError(f"cell widths must lie in [1, ring_bits = {self.ring_bits}], "
                                 f"got {int(w.min())}..{int(w.max())}")
            mod = cell_modmask(w)
        object.__setattr__(self, "modmask", mod)


def _check_vector(party: str, v: Any, spec: RoundSpec) -> np.ndarray:
    n, m = spec.vector_len, spec.ring_bits
    arr = np.asarray(v)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise VectorError(party, f"expected shape ({n},), got {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise VectorError(party, f"expected an integer dtype, got {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise VectorError(party, "values must be non-negative")
    u = arr.astype(np.uint64)
    if arr.size and np.any(u & ~spec.modmask):
        where = "its cell's ring" if spec.cell_bits is not None else f"[0, 2^{m})"
        raise VectorError(party, f"values must lie in {where}")
    return u


def _pair_sign(u: str, v: str) -> int:
    return 1 if u < v else -1


def _enc_aad(session_id: str, batch: Sequence[str], sender: str, receiver: str) -> bytes:
    aad = _INFO_PREFIX + b"/seeds" + _lp(session_id.encode())
    for r in batch:
        aad += _lp(r.encode())
    return aad + b"|" + _lp(sender.encode()) + _lp(receiver.encode())


def _check_batch(round_ids: Sequence[str]) -> tuple[str, ...]:
    batch = tuple(str(r) for r in round_ids)
    if not batch or len(set(batch)) != len(batch):
        raise ValueError(f"a seed batch needs distinct round ids, got {list(batch)}")
    return batch


def _raw_public(sk: X25519PrivateKey) -> bytes:
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _self_mask(seed: bytes, party: str, cfg: SecAggConfig, spec: RoundSpec) -> np.ndarray:
    rid = cfg.rid(spec.round_id)
    key = derive_key(seed, purpose="self", round_id=rid, ids=(party,))
    return mask(key, spec.vector_len, 64, stream_nonce(rid, "self")) & spec.modmask


def _round_key(shared: bytes, u: str, v: str, cfg: SecAggConfig, round_id: str) -> bytes:
    return derive_key(shared, purpose="mask", round_id=cfg.rid(round_id), ids=(u, v))


def _pair_mask(key: bytes, cfg: SecAggConfig, spec: RoundSpec) -> np.ndarray:
    return mask(key, spec.vector_len, 64, stream_nonce(cfg.rid(spec.round_id), "pair")) & spec.modmask


# --------------------------------------------------------------------------- client


class SecAggClient:
    """One party's side of a secure-aggregation session (Bonawitz et al. 2017, SecAgg+).

    Stage order: :meth:`public_keys` → :meth:`receive_public_keys` once; then per batch
    :meth:`share_seeds` → :meth:`receive_seed_shares`; then per round of the batch
    :meth:`masked` → :meth:`reveal_all`. Pairwise masks of a round are applied with the
    neighbours that sent this party seed shares for the round's batch (Bonawitz's ``U2``
    restricted to ``N(u)``); the server uses the same set.

    Args:
        party_id: this party.
        config: the session's public parameters.
        mask_key, enc_key: optional fixed keys, for reproducible tests only; by default
            fresh ``X25519PrivateKey.generate()`` keys.
        rng: object with ``randbelow`` for Shamir coefficients (``secrets`` by default).

    Raises:
        ValueError: ``party_id`` not in the config.
    """

    def __init__(self, party_id: str, config: SecAggConfig, *,
                 mask_key: X25519PrivateKey | None = None,
                 enc_key: X25519PrivateKey | None = None, rng: Any = secrets) -> None:
        if party_id not in config.index:
            raise ValueError(f"party {party_id!r} is not in the session's party list")
        self.party_id = party_id
        self.config = config
        self._mask_sk = mask_key or X25519PrivateKey.generate()
        self._enc_sk = enc_key or X25519PrivateKey.generate()
        self._rng = rng
        self._peer_keys: dict[str, PartyKeys] | None = None
        self._shared: dict[str, bytes] = {}  # peer -> X25519 mask secret
        self._seeds: dict[str, bytes] = {}  # round -> own self-mask seed
        self._batch_of: dict[str, tuple[str, ...]] = {}  # round -> its batch
        self._sent: dict[tuple[str, ...], tuple[str, ...]] = {}  # batch -> receivers
        self._book: dict[str, dict[str, tuple[int, int]]] = {}  # round -> owner -> (x, y)
        self._partners: dict[tuple[str, ...], tuple[str, ...]] = {}  # batch -> partners
        self._masked: set[str] = set()
        self._revealed: dict[tuple[str, str], str] = {}  # (round, owner) -> kind

    @property
    def neighbours(self) -> tuple[str, ...]:
        """This party's neighbours in the session's graph."""
        return self.config.graph[self.party_id]

    def public_keys(self) -> PartyKeys:
        """Stage 1: the two raw X25519 public keys to advertise."""
        return PartyKeys(self.party_id, _raw_public(self._mask_sk), _raw_public(self._enc_sk))

    def receive_public_keys(self, keys: Mapping[str, PartyKeys]) -> None:
        """Stage 1 input: the neighbours' advertised keys (those that advertised).

        Raises:
            ProtocolError: a key from a non-neighbour, a mislabelled advertisement, or a
                second call.
            TooFewSurvivors: fewer than ``t`` holders (neighbours + self) remain.
        """
        if self._peer_keys is not None:
            raise ProtocolError(self.party_id, "receive_public_keys called twice in a session")
        nb = set(self.neighbours)
        got: dict[str, PartyKeys] = {}
        for p, k in keys.items():
            if p == self.party_id:
                continue
            if p not in nb or k.party != p:
                raise ProtocolError(self.party_id, f"unexpected public keys for {p!r}")
            got[p] = k
        if len(got) + 1 < self.config.t:
            raise TooFewSurvivors("keys", len(got) + 1, self.config.t)
        self._peer_keys = got
        self._shared = {p: self._mask_sk.exchange(X25519PublicKey.from_public_bytes(k.mask_public))
                        for p, k in got.items()}

    def _transport_key(self, peer: str) -> bytes:
        assert self._peer_keys is not None
        shared = self._enc_sk.exchange(X25519PublicKey.from_public_bytes(self._peer_keys[peer].enc_public))
        return derive_key(shared, purpose="enc", round_id=self.config.session_id, ids=(self.party_id, peer))

    def share_seeds(self, round_ids: Sequence[str], *,
                    seeds: Mapping[str, bytes] | None = None) -> dict[str, bytes]:
        """Stage 2 output: fresh self-mask seeds for the batch's rounds, Shamir-shared.

        Each neighbour that advertised keys gets one ciphertext: ``nonce(12) ||
        ChaCha20-Poly1305(x u32 || y 33B per round)`` with AAD binding the session, the
        batch's round ids, the sender and the receiver. This party's own shares are kept.

        Args:
            round_ids: the batch (distinct, never used in an earlier batch).
            seeds: fixed 16-byte seeds per round, for reproducible tests only.

        Returns:
            ``{receiver: ciphertext}``.

        Raises:
            ProtocolError: before :meth:`receive_public_keys`, or a round already seeded.
            ValueError: an empty batch or repeated round ids, or a seed not 16 bytes.
        """
        if self._peer_keys is None:
            raise ProtocolError(self.party_id, "share_seeds before receive_public_keys")
        batch = _check_batch(round_ids)
        again = [r for r in batch if r in self._seeds]
        if again:
            raise ProtocolError(self.party_id, f"rounds already seeded: {again}")
        holders = sorted((*self._peer_keys, self.party_id))
        xs = [self.config.index[h] for h in holders]
        ys: list[list[int]] = []
        for r in batch:
            seed = seeds[r] if seeds is not None else secrets.token_bytes(SEED_BYTES)
            if len(seed) != SEED_BYTES:
                raise ValueError(f"a self-mask seed must be {SEED_BYTES} bytes")
            self._seeds[r] = seed
            self._batch_of[r] = batch
            ys.append(_share_at(seed, xs, self.config.t, self._rng))
        out: dict[str, bytes] = {}
        for j, (h, x) in enumerate(zip(holders, xs, strict=True)):
            if h == self.party_id:
                for r, y in zip(batch, ys, strict=True):
                    self._book.setdefault(r, {})[h] = (x, y[j])
                continue
            plain = struct.pack(">I", x) + b"".join(y[j].to_bytes(_Y_BYTES, "big") for y in ys)
            nonce = os.urandom(12)
            aead = ChaCha20Poly1305(self._transport_key(h))
            out[h] = nonce + aead.encrypt(nonce, plain, _enc_aad(self.config.session_id, batch,
                                                                  self.party_id, h))
        self._sent[batch] = tuple(sorted(out))
        return out

    def receive_seed_shares(self, round_ids: Sequence[str], messages: Mapping[str, bytes]) -> None:
        """Stage 2 input: decrypt and store the seed shares neighbours sent for the batch.

        The senders become this party's pairwise-mask partners in the batch's rounds.

        Raises:
            ProtocolError: before :meth:`share_seeds` for this batch, a sender that is not
                a neighbour with keys, or a ciphertext that fails authentication.
            TooFewSurvivors: fewer than ``t`` holders remain.
        """
        batch = _check_batch(round_ids)
        if batch not in self._sent:
            raise ProtocolError(self.party_id, "receive_seed_shares before share_seeds")
        assert self._peer_keys is not None
        partners = []
        for sender, blob in messages.items():
            if sender not in self._peer_keys:
                raise ProtocolError(self.party_id, f"shares from unexpected sender {sender!r}")
            aead = ChaCha20Poly1305(self._transport_key(sender))
            try:
                plain = aead.decrypt(blob[:12], blob[12:], _enc_aad(self.config.session_id, batch,
                                                                    sender, self.party_id))
            except InvalidTag as exc:
                raise ProtocolError(self.party_id, f"share message from {sender!r} fails authentication") from exc
            (x,) = struct.unpack(">I", plain[:4])
            if x != self.config.index[self.party_id] or len(plain) != 4 + _Y_BYTES * len(batch):
                raise ProtocolError(self.party_id, f"malformed share message from {sender!r}")
            for j, r in enumerate(batch):
                y = int.from_bytes(plain[4 + j * _Y_BYTES: 4 + (j + 1) * _Y_BYTES], "big")
                self._book.setdefault(r, {})[sender] = (x, y)
            partners.append(sender)
        if len(partners) + 1 < self.config.t:
            raise TooFewSurvivors("shares", len(partners) + 1, self.config.t)
        # partners: those this party sent shares to and that sent shares back
        self._partners[batch] = tuple(sorted(set(partners) & set(self._sent[batch])))

    def _round_partners(self, round_id: str) -> tuple[str, ...]:
        batch = self._batch_of.get(round_id)
        if batch is None or batch not in self._partners:
            raise ProtocolError(self.party_id, f"round {round_id!r} has no received seed shares")
        return self._partners[batch]

    def masked(self, spec: RoundSpec, vector: Any) -> np.ndarray:
        """Stage 3 output: ``x + PRG(b_r) + Σ ±PRG(k_(uv,r))`` in each cell's ring.

        Args:
            spec: the round.
            vector: shape ``(n,)``, integers in each cell's ring.

        Returns:
            uint64, shape ``(n,)``, in each cell's ring; uniformly distributed to anyone
            without the masks.

        Raises:
            VectorError: wrong length, dtype or a value outside the ring.
            ProtocolError: the round was not seeded, or masked twice.
        """
        x = _check_vector(self.party_id, vector, spec)
        partners = self._round_partners(spec.round_id)
        if spec.round_id in self._masked:
            raise ProtocolError(self.party_id, f"round {spec.round_id!r} masked twice")
        self._masked.add(spec.round_id)
        cfg = self.config
        total = x + _self_mask(self._seeds[spec.round_id], self.party_id, cfg, spec)
        for v in partners:
            pm = _pair_mask(_round_key(self._shared[v], self.party_id, v, cfg, spec.round_id), cfg, spec)
            total = total + pm if _pair_sign(self.party_id, v) > 0 else total - pm
        return total & spec.modmask

    def reveal(self, round_id: str, owner: str, dropped: bool) -> RevealedShare:
        """Stage 4: this party's share of a survivor's seed of the round, or its round key
        with a dropped partner.

        Raises:
            ProtocolError: nothing held for ``owner`` in the round, or the other kind was
                already revealed for it in this round (both would unmask its input).
        """
        kind: Literal["seed", "pair"] = "pair" if dropped else "seed"
        if self._revealed.get((round_id, owner), kind) != kind:
            raise ProtocolError(self.party_id, f"refuses to reveal both a seed share and a round key of {owner!r}")
        x = self.config.index[self.party_id]
        if dropped:
            if owner == self.party_id:
                raise ProtocolError(self.party_id, "cannot be both dropped and revealing")
            if owner not in self._round_partners(round_id):
                raise ProtocolError(self.party_id, f"did not pair with {owner!r} in round {round_id!r}")
            y = int.from_bytes(_round_key(self._shared[owner], self.party_id, owner, self.config, round_id), "big")
        else:
            held = self._book.get(round_id, {})
            if owner not in held:
                raise ProtocolError(self.party_id, f"holds no share of {owner!r} for round {round_id!r}")
            x, y = held[owner]
        self._revealed[(round_id, owner)] = kind
        return RevealedShare(owner, self.party_id, kind, x, y)

    def reveal_all(self, round_id: str, survivors: Iterable[str],
                   dropped: Iterable[str]) -> dict[str, RevealedShare]:
        """Stage 4 for the whole unmask request: a seed share per surviving owner this party
        holds shares of, a round key per dropped partner, sorted by owner.

        Raises:
            TooFewSurvivors: fewer than ``t`` survivors (the round must abort).
            ProtocolError: a party listed both as survivor and dropout, or see :meth:`reveal`.
        """
        surv, drop = set(survivors), set(dropped)
        if surv & drop:
            raise ProtocolError(self.party_id, f"parties both survived and dropped: {sorted(surv & drop)}")
        if len(surv) < self.config.t:
            raise TooFewSurvivors("unmask", len(surv), self.config.t)
        out = {}
        for owner in sorted(self._book.get(round_id, {})):
            if owner in surv:
                out[owner] = self.reveal(round_id, owner, False)
        for owner in self._round_partners(round_id):
            if owner in drop:
                out[owner] = self.reveal(round_id, owner, True)
        return dict(sorted(out.items()))  # by owner: SecAggServer.reveal_layout's order


# --------------------------------------------------------------------------- server


@dataclass
class _RoundState:
    spec: RoundSpec
    masked: dict[str, np.ndarray] = field(default_factory=dict)
    summed: set[str] = field(default_factory=set)
    masked_sum: np.ndarray | None = None
    closed: bool = False


class SecAggServer:
    """The aggregator's side of a session: routes keys and shares, sums masked vectors,
    unmasks each round's sum.

    :meth:`keys_for` closes key registration; :meth:`seed_shares_for` closes a batch's
    share collection; :meth:`unmask_request` closes a round's masked-input collection.
    The bus layer calls them after its stage deadline. The server sees only public keys,
    ciphertexts of shares, masked vectors and, per round, the shares and round keys it
    needs, so it learns only each round's sum over survivors.

    Args:
        config: the session's public parameters.
    """

    def __init__(self, config: SecAggConfig) -> None:
        self.config = config
        self._keys: dict[str, PartyKeys] = {}
        self._keys_closed = False
        self._shares: dict[tuple[str, ...], dict[str, dict[str, bytes]]] = {}  # batch -> sender -> receiver -> blob
        self._batch_closed: set[tuple[str, ...]] = set()
        self._batch_of: dict[str, tuple[str, ...]] = {}
        self._rounds: dict[str, _RoundState] = {}
        self._held_index: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}

    # ---------------------------------------------------------------- keys
    def register_keys(self, keys: PartyKeys) -> None:
        """Stage 1: record a party's advertisement.

        Raises:
            ProtocolError: unknown party, duplicate advertisement, or keys stage closed.
        """
        if self._keys_closed:
            raise ProtocolError(keys.party, "register_keys after the keys stage closed")
        if keys.party not in self.config.index:
            raise ProtocolError(keys.party, "unknown party")
        if keys.party in self._keys:
            raise ProtocolError(keys.party, "advertised keys twice")
        if len(keys.mask_public) != 32 or len(keys.enc_public) != 32:
            raise ProtocolError(keys.party, "public keys must be 32 raw bytes")
        self._keys[keys.party] = keys

    def keys_for(self, party: str) -> dict[str, PartyKeys]:
        """Stage 1: the advertised keys of ``party``'s neighbours (closes registration).

        Raises:
            TooFewSurvivors: fewer than ``t`` parties advertised.
        """
        if not self._keys_closed:
            if len(self._keys) < self.config.t:
                raise TooFewSurvivors("keys", len(self._keys), self.config.t)
            self._keys_closed = True
        return {v: self._keys[v] for v in self.config.graph[party] if v in self._keys}

    @property
    def keyed(self) -> tuple[str, ...]:
        """Parties that advertised keys in this session, sorted."""
        return tuple(sorted(self._keys))

    # ---------------------------------------------------------------- seed batches
    def collect_seed_shares(self, round_ids: Sequence[str], sender: str,
                            messages: Mapping[str, bytes]) -> None:
        """Stage 2: record a party's encrypted seed shares of a batch, for routing.

        Raises:
            ProtocolError: before keys closed, a round already in another batch, a sender
                without keys or sending twice, a receiver that is not an advertised
                neighbour, or the batch closed.
        """
        batch = _check_batch(round_ids)
        if not self._keys_closed:
            raise ProtocolError(sender, "seed shares before the keys stage closed")
        if batch in self._batch_closed:
            raise ProtocolError(sender, "seed shares after the batch closed")
        for r in batch:
            if self._batch_of.get(r, batch) != batch:
                raise ProtocolError(sender, f"round {r!r} is already in another batch")
        if sender not in self._keys or sender in self._shares.get(batch, {}):
            raise ProtocolError(sender, "shares from a party without keys, or twice")
        for rcv in messages:
            if rcv not in self.config.graph[sender] or rcv not in self._keys:
                raise ProtocolError(sender, f"shares addressed to {rcv!r}")
        for r in batch:
            self._batch_of[r] = batch
        self._shares.setdefault(batch, {})[sender] = dict(messages)

    def seed_shares_for(self, round_ids: Sequence[str], receiver: str) -> dict[str, bytes]:
        """Stage 2: ciphertexts of the batch addressed to ``receiver`` (closes the batch).

        Raises:
            TooFewSurvivors: fewer than ``t`` parties sent shares for the batch.
        """
        batch = _check_batch(round_ids)
        book = self._shares.get(batch, {})
        if batch not in self._batch_closed:
            if len(book) < self.config.t:
                raise TooFewSurvivors("shares", len(book), self.config.t)
            self._batch_closed.add(batch)
        return {s: msgs[receiver] for s, msgs in book.items() if receiver in msgs}

    def seeded(self, round_id: str) -> tuple[str, ...]:
        """Parties that shared seeds for the round's batch, sorted (empty if none)."""
        return tuple(sorted(self._shares.get(self._batch_of.get(round_id, ()), {})))

    def _partners(self, round_id: str, u: str) -> tuple[str, ...]:
        """Parties that pair-masked with ``u`` in the round: those ``u`` sent shares to
        that sent shares too."""
        book = self._shares[self._batch_of[round_id]]
        return tuple(v for v in sorted(book.get(u, {})) if v in book)

    def reveal_layout(self, round_id: str, holder: str, survivors: Iterable[str],
                      dropped: Iterable[str]) -> list[tuple[str, Literal["seed", "pair"]]]:
        """What ``holder`` reveals for the round, in the order :meth:`SecAggClient.reveal_all`
        returns it (sorted by owner): a seed share per surviving owner it holds shares of
        (itself and the parties that sent it shares), a round key per dropped partner.
        So a reveal travels as bare bytes, without owner ids."""
        batch = self._batch_of.get(round_id, ())
        book = self._shares.get(batch, {})
        surv, drop = set(survivors), set(dropped)
        held = set(self._held_by(batch).get(holder, ()))
        if holder in book:
            held.add(holder)
        out: dict[str, Literal["seed", "pair"]] = {o: "seed" for o in held if o in surv}
        if holder in book:
            for v in self._partners(round_id, holder):
                if v in drop:
                    out[v] = "pair"
        return sorted(out.items())

    def _held_by(self, batch: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """``{holder: senders that sent it shares}`` of a closed batch, built once per batch
        (a scan of the whole book per holder made the unmask stage O(K^2))."""
        if batch not in self._batch_closed:
            return {r: tuple(s for s, msgs in self._shares.get(batch, {}).items() if r in msgs)
                    for r in self._keys}
        idx = self._held_index.get(batch)
        if idx is None:
            inv: dict[str, list[str]] = {}
            for s, msgs in self._shares.get(batch, {}).items():
                for r in msgs:
                    inv.setdefault(r, []).append(s)
            idx = self._held_index[batch] = {r: tuple(v) for r, v in inv.items()}
        return idx

    # ---------------------------------------------------------------- rounds
    def _round(self, spec_or_id: RoundSpec | str) -> _RoundState:
        rid = spec_or_id if isinstance(spec_or_id, str) else spec_or_id.round_id
        st = self._rounds.get(rid)
        if st is None:
            if isinstance(spec_or_id, str):
                raise ProtocolError("", f"round {rid!r} was never opened")
            batch = self._batch_of.get(rid)
            if batch is None or batch not in self._batch_closed:
                raise ProtocolError("", f"round {rid!r} is not in a closed seed batch")
            st = self._rounds[rid] = _RoundState(spec=spec_or_id,
                                                 masked_sum=np.zeros(spec_or_id.vector_len, np.uint64))
        elif not isinstance(spec_or_id, str) and st.spec != spec_or_id:
            raise ProtocolError("", f"round {rid!r} reopened with other parameters")
        if st.closed:
            raise ProtocolError("", f"round {rid!r} is closed")
        return st

    def collect_masked(self, spec: RoundSpec, party: str, vector: Any) -> None:
        """Stage 3: record a party's masked vector of the round.

        Raises:
            VectorError: wrong length/dtype or outside the cells' rings.
            ProtocolError: a party that did not seed the round, a duplicate, or the round
                closed.
        """
        st = self._round(spec)
        if party not in self.seeded(spec.round_id):
            raise ProtocolError(party, "masked vector from a party that sent no shares")
        if party in st.masked or party in st.summed:
            raise ProtocolError(party, "masked vector sent twice")
        st.masked[party] = _check_vector(party, vector, spec)

    def collect_masked_sum(self, spec: RoundSpec, parties: Iterable[str], vector_sum: Any) -> None:
        """Stage 3, hierarchical aggregation: record the sum (in each cell's ring) of
        several parties' masked vectors, as an aggregator forwards it.

        Raises:
            VectorError: wrong length/dtype or outside the cells' rings.
            ProtocolError: an empty party list, a party that did not seed the round, a
                party already counted, or the round closed.
        """
        st = self._round(spec)
        ps = list(parties)
        if not ps:
            raise ProtocolError("", "a masked sum over no parties")
        seeded = set(self.seeded(spec.round_id))
        for p in ps:
            if p not in seeded:
                raise ProtocolError(p, "masked vector from a party that sent no shares")
            if p in st.masked or p in st.summed or ps.count(p) > 1:
                raise ProtocolError(p, "masked vector sent twice")
        vec = _check_vector(ps[0], vector_sum, spec)
        st.summed.update(ps)
        assert st.masked_sum is not None
        st.masked_sum = (st.masked_sum + vec) & spec.modmask

    def unmask_request(self, round_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Stage 4: close the round's masked-input collection and return
        ``(survivors, dropped)`` to send to survivors.

        ``survivors`` masked a vector; ``dropped`` seeded the round but sent none.

        Raises:
            TooFewSurvivors: fewer than ``t`` masked vectors arrived.
        """
        st = self._round(round_id)
        masked = set(st.masked) | st.summed
        if len(masked) < self.config.t:
            raise TooFewSurvivors("masked", len(masked), self.config.t)
        st.closed = True
        survivors = tuple(sorted(masked))
        dropped = tuple(p for p in self.seeded(round_id) if p not in masked)
        return survivors, dropped

    def _closed_round(self, round_id: str, survivors: Iterable[str], dropped: Iterable[str]
                      ) -> tuple[_RoundState, tuple[str, ...], tuple[str, ...]]:
        """The closed round's state and the sorted survivor and dropout sets, checked
        (shared by :meth:`unmask` and :meth:`unmask_tree`)."""
        st = self._rounds.get(round_id)
        if st is None or not st.closed:
            raise ProtocolError("", f"unmask of round {round_id!r} before unmask_request")
        surv, drop = tuple(sorted(set(survivors))), tuple(sorted(set(dropped)))
        if set(surv) & set(drop):
            raise ProtocolError("", f"parties both survived and dropped: {sorted(set(surv) & set(drop))}")
        if len(surv) < self.config.t:
            raise TooFewSurvivors("unmask", len(surv), self.config.t)
        return st, surv, drop

    @staticmethod
    def _masked_total(st: _RoundState, surv: Sequence[str]) -> np.ndarray:
        """The forwarded masked sums plus the survivors' own masked vectors."""
        assert st.masked_sum is not None
        total = st.masked_sum.copy()
        for u in surv:
            if u in st.masked:
                total += st.masked[u]
        return total

    def _remove_pair_masks(self, total: np.ndarray, round_id: str, surv: Sequence[str],
                           drop: Sequence[str], pair: Mapping[tuple[str, str], bytes]
                           ) -> np.ndarray:
        """``total`` less the pair masks each survivor added with each dropped partner,
        from the revealed round keys ``pair[(survivor, dropped)]``.

        Raises:
            MissingPairKeys: a dropped party's round key with a surviving partner missing.
        """
        cfg, spec = self.config, self._rounds[round_id].spec
        survivor_set = set(surv)
        for u in drop:
            partners = [v for v in self._partners(round_id, u) if v in survivor_set]
            lacking = [v for v in partners if (v, u) not in pair]
            if lacking:
                raise MissingPairKeys(u, lacking)
            for v in partners:
                pm = _pair_mask(pair[(v, u)], cfg, spec)
                # v added s(v, u) * pm; remove it.
                if _pair_sign(v, u) > 0:
                    total -= pm
                else:
                    total += pm
        return total & spec.modmask

    def unmask(self, round_id: str, survivors: Iterable[str], dropped: Iterable[str],
               shares: Mapping[str, Mapping[str, RevealedShare]]) -> np.ndarray:
        """Remove the masks and return the survivors' sum of the round (in each cell's ring).

        Args:
            round_id: the round (closed by :meth:`unmask_request`).
            survivors: parties whose masked vectors are summed.
            dropped: parties that seeded the round but whose masked vectors are excluded.
            shares: ``{holder: {owner: RevealedShare}}`` from the responding survivors.

        Returns:
            uint64, shape ``(n,)``: ``Σ_(u ∈ survivors) x_u`` mod each cell's ``2^w``.

        Raises:
            TooFewSurvivors: fewer than ``t`` survivors.
            TooFewShares: fewer than ``t`` shares of some survivor's seed.
            MissingPairKeys: a dropped party's round keys missing from survivors.
            ProtocolError: inconsistent sets, or a share of the wrong kind/holder.
        """
        cfg = self.config
        st, surv, drop = self._closed_round(round_id, survivors, dropped)
        spec = st.spec
        missing = [u for u in surv if u not in st.masked and u not in st.summed]
        if missing:
            raise ProtocolError("", f"no masked vector from survivors {missing}")
        if not st.summed <= set(surv):
            raise ProtocolError("", "survivors leave out parties of a forwarded masked sum: "
                                f"{sorted(st.summed - set(surv))}")
        seeded = set(self.seeded(round_id))
        if any(u not in seeded for u in drop):
            raise ProtocolError("", "a dropped party never shared seeds")
        unaccounted = sorted(seeded - set(surv) - set(drop))
        if unaccounted:
            raise ProtocolError("", f"parties that shared seeds are neither survivors nor dropped: {unaccounted}")
        seeds: dict[str, list[tuple[int, int]]] = {}
        pair: dict[tuple[str, str], bytes] = {}  # (survivor, dropped) -> round key
        for holder, owned in shares.items():
            if holder not in surv:
                continue  # only survivors answer; ignore anything else
            for owner, sh in owned.items():
                want = "pair" if owner in drop else "seed"
                if sh.owner != owner or sh.holder != holder or sh.kind != want:
                    raise ProtocolError(holder, f"bad share for {owner!r}")
                if sh.x != cfg.index[holder]:
                    raise ProtocolError(holder, f"share for {owner!r} with a wrong abscissa")
                if want == "seed":
                    if holder != owner and holder not in cfg.graph[owner]:
                        raise ProtocolError(holder, f"share for {owner!r} from a non-holder")
                    seeds.setdefault(owner, []).append((sh.x, sh.y))
                else:
                    if holder not in self._partners(round_id, owner):
                        raise ProtocolError(holder, f"round key with {owner!r} from a non-partner")
                    if not 0 <= sh.y < 1 << 256:
                        raise ProtocolError(holder, f"round key with {owner!r} is not 32 bytes")
                    pair[(holder, owner)] = sh.y.to_bytes(32, "big")
        total = self._masked_total(st, surv)
        for u in surv:
            seed = recover_secret(seeds.get(u, []), cfg.t, owner=u)
            total -= _self_mask(seed, u, cfg, spec)
        return self._remove_pair_masks(total, round_id, surv, drop, pair)

    def pair_holders(self, round_id: str, survivors: Iterable[str],
                     dropped: Iterable[str]) -> tuple[str, ...]:
        """Survivors that pair-masked with a dropped party in the round: with hierarchical
        unmasking they alone send the server something (their round keys with it)."""
        surv = set(survivors)
        out = {v for d in set(dropped) for v in self._partners(round_id, d) if v in surv}
        return tuple(sorted(out))

    def unmask_tree(self, round_id: str, survivors: Iterable[str], dropped: Iterable[str],
                    self_masks: Sequence[tuple[Sequence[str], Any]],
                    pair_keys: Mapping[str, Mapping[str, RevealedShare]]) -> np.ndarray:
        """:meth:`unmask` with the self masks removed down the tree (hierarchical unmasking).

        ``self_masks`` are ``(parties, Σ_(u ∈ parties) PRG(b_(u,r)))`` from the tree's top
        level: each leaf aggregator recovered its surviving children's seeds from the
        survivors' shares (:func:`self_mask_sum`) and each level summed them. ``pair_keys``
        are the round keys survivors revealed with dropped partners (``{holder: {dropped
        owner: share}}``, kind ``pair``). The server's work is ``O(top-level nodes × n +
        dropped × k × n)`` rather than ``O(K × n)``, and it receives no seed share.

        Raises:
            TooFewSurvivors, MissingPairKeys: as :meth:`unmask`.
            ProtocolError: inconsistent sets; self masks that do not cover exactly the
                survivors (a leaf could not recover a seed: the uncovered are named); a
                bad round key.
        """
        st, surv, drop = self._closed_round(round_id, survivors, dropped)
        spec = st.spec
        if set(st.masked) | st.summed != set(surv):
            raise ProtocolError("", "survivors are not the parties whose masked vectors came")
        if set(drop) != set(self.seeded(round_id)) - set(surv):
            raise ProtocolError("", "dropped parties are not the seeded non-survivors")
        covered: list[str] = []
        removed = np.zeros(spec.vector_len, np.uint64)
        for ids, vec in self_masks:
            covered += list(ids)
            if ids:
                removed += _check_vector(str(ids[0]), vec, spec)
        if len(set(covered)) != len(covered) or set(covered) != set(surv):
            lacking = sorted(set(surv) - set(covered))
            raise ProtocolError("", f"self masks cover {len(set(covered))} of {len(surv)} "
                                f"survivors (lacking {lacking[:10]}), or some twice")
        total = self._masked_total(st, surv)
        total -= removed
        pair: dict[tuple[str, str], bytes] = {}  # (survivor, dropped) -> round key
        survivor_set = set(surv)
        for u in drop:
            for v in self._partners(round_id, u):
                sh = pair_keys.get(v, {}).get(u) if v in survivor_set else None
                if sh is None:
                    continue
                if (sh.owner != u or sh.holder != v or sh.kind != "pair"
                        or not 0 <= sh.y < 1 << 256):
                    raise ProtocolError(v, f"bad round key with {u!r}")
                pair[(v, u)] = sh.y.to_bytes(32, "big")
        return self._remove_pair_masks(total, round_id, surv, drop, pair)


def self_mask_sum(config: SecAggConfig, spec: RoundSpec,
                  shares: Mapping[str, Iterable[tuple[int, int]]]) -> np.ndarray:
    """``Σ_(u ∈ shares) PRG(b_(u,r))`` in each cell's ring: the self masks of the owners in
    ``shares`` (``{owner: [(x, y), ...]}``), each seed recovered from its Shamir shares.

    A leaf aggregator runs it for its surviving children (hierarchical unmasking, see
    :meth:`SecAggServer.unmask_tree`), so the coordinator's cost does not grow with K.

    Raises:
        TooFewShares: fewer than ``t`` shares of some owner's seed.
        ValueError: shares that do not interpolate to a seed.
    """
    total = np.zeros(spec.vector_len, np.uint64)
    for u, pts in shares.items():
        seed = recover_secret(pts, config.t, owner=u)
        total += _self_mask(seed, u, config, spec)
        total &= spec.modmask
    return total


def run_key_stages(clients: Mapping[str, SecAggClient], server: SecAggServer,
                   round_ids: Sequence[str] = ("r0",)) -> None:
    """Drive the key stage and one seed batch in memory: every client advertises its keys,
    receives its neighbours' keys, shares seeds for ``round_ids`` and receives the shares
    addressed to it. For tests and single-process simulations; the bus layer runs the same
    calls with a deadline per stage (:mod:`synth.coordinator`, :mod:`synth.party`).
    """
    for c in clients.values():
        server.register_keys(c.public_keys())
    for p, c in clients.items():
        c.receive_public_keys(server.keys_for(p))
    for p, c in clients.items():
        server.collect_seed_shares(round_ids, p, c.share_seeds(round_ids))
    for p, c in clients.items():
        c.receive_seed_shares(round_ids, server.seed_shares_for(round_ids, p))
