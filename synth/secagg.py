"""Secure aggregation of integer vectors in Z_{2^m}: pure protocol logic, no transport.

Implements the masking protocol of Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning" (CCS 2017), with the sparse neighbour graph of
SecAgg+ (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead", CCS 2020), for the semi-honest server model (no signatures on keys). A bus
layer drives the four stages; the aggregator learns only the sum of the parties' vectors:

1. **Advertise keys.** Each party makes two fresh X25519 key pairs per round: ``c`` to
   agree pairwise *mask* keys and ``e`` to encrypt Shamir shares in transit, plus a
   private 32-byte self-mask seed ``b``. It sends both public keys to the server
   (:meth:`SecAggClient.public_keys`, :meth:`SecAggServer.register_keys`).
2. **Share keys.** The server forwards the neighbours' public keys
   (:meth:`SecAggServer.keys_for`). Each party Shamir-splits ``b`` and its mask private
   key ``c_sk`` among its neighbours and itself (threshold ``t``), encrypts each
   neighbour's shares with ChaCha20-Poly1305 under a key agreed from ``e``, and the server
   routes the ciphertexts (:meth:`SecAggClient.share_messages`,
   :meth:`SecAggServer.collect_shares`, :meth:`SecAggServer.shares_for`).
3. **Masked input.** ``y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u)} s(u, v) PRG(k_uv)  (mod 2^m)``
   with ``s = +1`` when ``u < v`` (lexicographically) and ``-1`` otherwise, so the pairwise
   masks cancel in the sum (:meth:`SecAggClient.masked`).
4. **Unmask.** For each party that masked, survivors reveal their share of its seed
   ``b``; for each party that shared keys but whose masked vector never arrived, they
   reveal their share of its mask key ``c_sk`` so the server can recompute and remove the
   pairwise masks it had with survivors. An honest party never reveals both kinds for the
   same owner (:meth:`SecAggClient.reveal`, :meth:`SecAggServer.unmask`).

Threat model: honest-but-curious server and parties. Not implemented (needed against an
active server): signatures on advertised keys and Bonawitz's consistency-check round, which
stop a server from claiming different dropout sets to different parties.

Choice of shared secret: as in Bonawitz, each party shares its *mask private key*, not the
derived pairwise seeds: 2 secrets x (k + 1) shares per party instead of k secrets x
(k + 1), and the server re-derives every pairwise key of a dropped party from the public
keys. Because a dropped party's key is revealed, key pairs are fresh per round (bound to
``round_id``); never reuse a :class:`SecAggClient` across rounds.

Masks are a ChaCha20 keystream under an HKDF-SHA256 key (8 bytes per word, reduced mod
``2^m``); never a non-cryptographic PRNG (Flower's SecAgg+ folds seeds to 32 bits into
NumPy's RandomState; see ``shared/reference/fedforge.md``). The masked word width ``m``
is :func:`ring_bits`: masked words are uniformly random and cannot be compressed, so
``m`` should be just wide enough for the sum.
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
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

__all__ = [
    "PRIME",
    "run_key_stages",
    "DuplicatePartyError",
    "PartyKeys",
    "ProtocolError",
    "RevealedShare",
    "SecAggClient",
    "SecAggConfig",
    "SecAggError",
    "SecAggServer",
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

#: The Shamir field GF(PRIME): the smallest prime above 2^263 (sympy.nextprime), so a
#: 32-byte secret with its 0x01 length-keeping prefix (< 2^257) is a field element and a
#: share travels in 33 bytes (half of what the Mersenne prime 2^521 - 1 would cost).
PRIME = (1 << 263) + 9
_Y_BYTES = 33  # ceil(264 / 8)
_MAX_SECRET = 32
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
        secret: 0..32 bytes (keys and seeds are 32).
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
    """Round-1 advertisement: raw 32-byte X25519 public keys.

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
    """A survivor's share of another party's secret, sent to the server at unmask time.

    Attributes:
        owner: whose secret.
        holder: who held the share.
        kind: "seed" (self-mask seed of a survivor) or "key" (mask private key of a dropout).
        x: Shamir abscissa (the holder's 1-based index in the sorted party list).
        y: Shamir ordinate.
    """

    owner: str
    holder: str
    kind: Literal["seed", "key"]
    x: int
    y: int


@dataclass(frozen=True)
class SecAggConfig:
    """Public parameters of one secure-aggregation round, identical at parties and server.

    Attributes:
        round_id: unique per round; bound into every key, nonce and AAD.
        party_ids: all ``K`` party ids (unique).
        ring_bits: ``m``, masked word width (see :func:`ring_bits`).
        vector_len: ``n``, length of each party's vector.
        threshold: Shamir threshold ``t``; None for ``floor(k/2) + 1`` where ``k`` is the
            degree (at least 1). Must satisfy ``1 <= t <= k + 1``; a dropout is
            recoverable only when ``t`` of its ``k`` neighbours survive, so ``t <= k``.
        degree: neighbour count ``k``; None for :func:`default_degree`.
        graph_seed: public seed of the neighbour graph (defaults to the round id).

    Raises:
        DuplicatePartyError: repeated ids.
        ValueError: empty party list, bad ``m``, ``n`` or threshold.
    """

    round_id: str
    party_ids: tuple[str, ...]
    ring_bits: int
    vector_len: int
    threshold: int | None = None
    degree: int | None = None
    graph_seed: bytes | None = None
    graph: Mapping[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    index: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = _check_unique(self.party_ids)
        if not ids:
            raise ValueError("need at least one party")
        if not 1 <= self.ring_bits <= 64:
            raise ValueError(f"ring_bits must be in [1, 64], got {self.ring_bits}")
        if self.vector_len < 0:
            raise ValueError(f"vector_len must be >= 0, got {self.vector_len}")
        seed = self.graph_seed if self.graph_seed is not None else self.round_id.encode()
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
        """Parties holding shares of ``owner``'s secrets: its neighbours and itself."""
        return tuple(sorted((*self.graph[owner], owner)))


def _check_vector(party: str, v: Any, n: int, m: int) -> np.ndarray:
    arr = np.asarray(v)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise VectorError(party, f"expected shape ({n},), got {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise VectorError(party, f"expected an integer dtype, got {arr.dtype}")
    if arr.size and (arr.min() < 0 or (m < 64 and int(arr.max()) >= 1 << m)):
        raise VectorError(party, f"values must lie in [0, 2^{m})")
    return arr.astype(np.uint64)


def _pair_sign(u: str, v: str) -> int:
    return 1 if u < v else -1


def _enc_aad(round_id: str, sender: str, receiver: str) -> bytes:
    return _INFO_PREFIX + b"/shares" + _lp(round_id.encode()) + _lp(sender.encode()) + _lp(receiver.encode())


def _raw_private(sk: X25519PrivateKey) -> bytes:
    return sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _raw_public(sk: X25519PrivateKey) -> bytes:
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


# --------------------------------------------------------------------------- client


class SecAggClient:
    """One party's side of a secure-aggregation round (Bonawitz et al. 2017, SecAgg+).

    Stage order: :meth:`public_keys` → :meth:`receive_public_keys` →
    :meth:`share_messages` → :meth:`receive_shares` → :meth:`masked` → :meth:`reveal` /
    :meth:`reveal_all`. Pairwise masks are applied with the neighbours that sent this
    party shares (Bonawitz's ``U2`` restricted to ``N(u)``); the server uses the same set.

    Args:
        party_id: this party.
        config: the round's public parameters.
        mask_key, enc_key, self_seed: optional fixed secrets, for reproducible tests
            only; by default fresh ``X25519PrivateKey.generate()`` keys and a
            ``secrets.token_bytes(32)`` seed.
        rng: object with ``randbelow`` for Shamir coefficients (``secrets`` by default).

    Raises:
        ValueError: ``party_id`` not in the config.
    """

    def __init__(
        self,
        party_id: str,
        config: SecAggConfig,
        *,
        mask_key: X25519PrivateKey | None = None,
        enc_key: X25519PrivateKey | None = None,
        self_seed: bytes | None = None,
        rng: Any = secrets,
    ) -> None:
        if party_id not in config.index:
            raise ValueError(f"party {party_id!r} is not in the round's party list")
        self.party_id = party_id
        self.config = config
        self._mask_sk = mask_key or X25519PrivateKey.generate()
        self._enc_sk = enc_key or X25519PrivateKey.generate()
        self._seed = self_seed if self_seed is not None else secrets.token_bytes(32)
        if len(self._seed) != 32:
            raise ValueError("self_seed must be 32 bytes")
        self._rng = rng
        self._peer_keys: dict[str, PartyKeys] | None = None
        self._share_book: dict[str, tuple[int, int, int]] = {}  # owner -> (x, y_seed, y_key)
        self._partners: tuple[str, ...] | None = None
        self._masked = False
        self._revealed: dict[str, str] = {}  # owner -> kind
        self._outbox: dict[str, bytes] | None = None

    @property
    def neighbours(self) -> tuple[str, ...]:
        """This party's neighbours in the round's graph."""
        return self.config.graph[self.party_id]

    def public_keys(self) -> PartyKeys:
        """Stage 1: the two raw X25519 public keys to advertise."""
        return PartyKeys(self.party_id, _raw_public(self._mask_sk), _raw_public(self._enc_sk))

    def receive_public_keys(self, keys: Mapping[str, PartyKeys]) -> None:
        """Stage 2 input: the neighbours' advertised keys (those that advertised).

        Raises:
            ProtocolError: a key from a non-neighbour, or a mislabelled advertisement.
            TooFewSurvivors: fewer than ``t`` holders (neighbours + self) remain.
        """
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

    def _transport_key(self, peer: str) -> bytes:
        assert self._peer_keys is not None
        shared = self._enc_sk.exchange(X25519PublicKey.from_public_bytes(self._peer_keys[peer].enc_public))
        return derive_key(shared, purpose="enc", round_id=self.config.round_id, ids=(self.party_id, peer))

    def share_messages(self) -> dict[str, bytes]:
        """Stage 2 output: encrypted Shamir shares of (self-mask seed, mask key) per neighbour.

        Shares go to every neighbour that advertised keys and to this party itself (kept
        locally). Each ciphertext is ``nonce(12) || ChaCha20-Poly1305(x u32 || y_seed 33B ||
        y_key 33B)`` with AAD binding the round, sender and receiver.

        Returns:
            ``{receiver: ciphertext}``.

        Raises:
            ProtocolError: called before :meth:`receive_public_keys` or twice.
        """
        if self._peer_keys is None:
            raise ProtocolError(self.party_id, "share_messages before receive_public_keys")
        if self._share_book:
            raise ProtocolError(self.party_id, "share_messages called twice")
        holders = sorted((*self._peer_keys, self.party_id))
        xs = [self.config.index[h] for h in holders]
        y_seed = _share_at(self._seed, xs, self.config.t, self._rng)
        y_key = _share_at(_raw_private(self._mask_sk), xs, self.config.t, self._rng)
        out: dict[str, bytes] = {}
        for h, x, ys, yk in zip(holders, xs, y_seed, y_key, strict=True):
            if h == self.party_id:
                self._share_book[h] = (x, ys, yk)
                continue
            plain = struct.pack(">I", x) + ys.to_bytes(_Y_BYTES, "big") + yk.to_bytes(_Y_BYTES, "big")
            nonce = os.urandom(12)
            aead = ChaCha20Poly1305(self._transport_key(h))
            out[h] = nonce + aead.encrypt(nonce, plain, _enc_aad(self.config.round_id, self.party_id, h))
        self._outbox = out
        return dict(out)

    def shares_for(self, neighbour: str) -> bytes:
        """The encrypted share message for one neighbour (calls :meth:`share_messages` once).

        Raises:
            ProtocolError: ``neighbour`` gets no shares from this party.
        """
        if self._outbox is None:
            self.share_messages()
        assert self._outbox is not None
        if neighbour not in self._outbox:
            raise ProtocolError(self.party_id, f"no shares for {neighbour!r}")
        return self._outbox[neighbour]

    def receive_shares(self, messages: Mapping[str, bytes]) -> None:
        """Stage 3 input: decrypt and store the shares the neighbours sent to this party.

        The senders become this party's pairwise-mask partners.

        Raises:
            ProtocolError: before :meth:`share_messages`, a sender that is not a neighbour
                with keys, or a ciphertext that fails authentication.
            TooFewSurvivors: fewer than ``t`` holders remain.
        """
        if self._peer_keys is None or self.party_id not in self._share_book:
            raise ProtocolError(self.party_id, "receive_shares before share_messages")
        partners = []
        for sender, blob in messages.items():
            if sender not in self._peer_keys:
                raise ProtocolError(self.party_id, f"shares from unexpected sender {sender!r}")
            aead = ChaCha20Poly1305(self._transport_key(sender))
            try:
                plain = aead.decrypt(blob[:12], blob[12:], _enc_aad(self.config.round_id, sender, self.party_id))
            except InvalidTag as exc:
                raise ProtocolError(self.party_id, f"share message from {sender!r} fails authentication") from exc
            (x,) = struct.unpack(">I", plain[:4])
            if x != self.config.index[self.party_id]:
                raise ProtocolError(self.party_id, f"share from {sender!r} has abscissa {x}")
            ys = int.from_bytes(plain[4 : 4 + _Y_BYTES], "big")
            yk = int.from_bytes(plain[4 + _Y_BYTES :], "big")
            self._share_book[sender] = (x, ys, yk)
            partners.append(sender)
        if len(partners) + 1 < self.config.t:
            raise TooFewSurvivors("shares", len(partners) + 1, self.config.t)
        self._partners = tuple(sorted(partners))

    def masked(self, vector: Any) -> np.ndarray:
        """Stage 3 output: ``x + PRG(b) + Σ ±PRG(k_uv) mod 2^m``.

        Args:
            vector: shape ``(n,)``, integers in ``[0, 2^m)`` (e.g. ``to_ring`` of a delta).

        Returns:
            uint64, shape ``(n,)``, in ``[0, 2^m)``; uniformly distributed to anyone
            without the masks.

        Raises:
            VectorError: wrong length, dtype or a value outside the ring.
            ProtocolError: before :meth:`receive_shares`, or called twice in a round.
        """
        cfg = self.config
        x = _check_vector(self.party_id, vector, cfg.vector_len, cfg.ring_bits)
        if self._partners is None:
            raise ProtocolError(self.party_id, "masked before receive_shares")
        if self._masked:
            raise ProtocolError(self.party_id, "masked called twice: use a fresh round")
        self._masked = True
        m, n = cfg.ring_bits, cfg.vector_len
        total = x + _self_mask(self._seed, self.party_id, cfg, n)
        assert self._peer_keys is not None
        for v in self._partners:
            pm = _pair_mask(self._mask_sk, self._peer_keys[v].mask_public, self.party_id, v, cfg, n)
            total = total + pm if _pair_sign(self.party_id, v) > 0 else total - pm
        return total & np.uint64((1 << m) - 1)

    def reveal(self, for_party: str, dropped: bool) -> RevealedShare:
        """Stage 4: this party's share of ``for_party``'s mask key (dropped) or seed (survivor).

        Raises:
            ProtocolError: no share held for ``for_party``, or the other kind was already
                revealed for it (revealing both would unmask its input).
        """
        if for_party not in self._share_book:
            raise ProtocolError(self.party_id, f"holds no share of {for_party!r}")
        kind: Literal["seed", "key"] = "key" if dropped else "seed"
        if self._revealed.get(for_party, kind) != kind:
            raise ProtocolError(self.party_id, f"refuses to reveal both seed and key shares of {for_party!r}")
        if dropped and for_party == self.party_id:
            raise ProtocolError(self.party_id, "cannot be both dropped and revealing")
        self._revealed[for_party] = kind
        x, ys, yk = self._share_book[for_party]
        return RevealedShare(for_party, self.party_id, kind, x, yk if dropped else ys)

    def reveal_all(self, survivors: Iterable[str], dropped: Iterable[str]) -> dict[str, RevealedShare]:
        """Stage 4 for the whole unmask request: one share per owner this party holds.

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
        for owner in sorted(self._share_book):
            if owner in surv or owner in drop:
                out[owner] = self.reveal(owner, owner in drop)
        return out


def _self_mask(seed: bytes, party: str, cfg: SecAggConfig, n: int) -> np.ndarray:
    key = derive_key(seed, purpose="self", round_id=cfg.round_id, ids=(party,))
    return mask(key, n, cfg.ring_bits, stream_nonce(cfg.round_id, "self"))


def _pair_mask(sk: X25519PrivateKey, peer_public: bytes, u: str, v: str, cfg: SecAggConfig, n: int) -> np.ndarray:
    shared = sk.exchange(X25519PublicKey.from_public_bytes(peer_public))
    key = derive_key(shared, purpose="mask", round_id=cfg.round_id, ids=(u, v))
    return mask(key, n, cfg.ring_bits, stream_nonce(cfg.round_id, "pair"))


# --------------------------------------------------------------------------- server


class SecAggServer:
    """The aggregator's side: routes keys and shares, sums masked vectors, unmasks the sum.

    Stage methods close the previous stage: :meth:`keys_for` closes key registration,
    :meth:`shares_for` closes share collection, :meth:`unmask_request` closes masked-input
    collection; the bus layer calls them after its stage deadline. The server sees only
    public keys, ciphertexts of shares, masked vectors and, at the end, the shares it
    needs, so it learns only the sum over survivors.

    Args:
        config: the round's public parameters.
    """

    def __init__(self, config: SecAggConfig) -> None:
        self.config = config
        self._keys: dict[str, PartyKeys] = {}
        self._shares: dict[str, dict[str, bytes]] = {}  # sender -> receiver -> blob
        self._masked: dict[str, np.ndarray] = {}
        self._summed: set[str] = set()  # parties whose masked vectors came pre-summed
        self._masked_sum = np.zeros(config.vector_len, dtype=np.uint64)
        self._stage = "keys"

    def _require(self, stage: str, what: str) -> None:
        if self._stage != stage:
            raise ProtocolError("", f"{what} during stage {self._stage!r}, expected {stage!r}")

    def _advance(self, stage: str, present: int) -> None:
        order = ["keys", "shares", "masked", "unmask"]
        if order.index(self._stage) < order.index(stage):
            if present < self.config.t:
                raise TooFewSurvivors(self._stage, present, self.config.t)
            self._stage = stage

    def register_keys(self, keys: PartyKeys) -> None:
        """Stage 1: record a party's advertisement.

        Raises:
            ProtocolError: unknown party, duplicate advertisement, or keys stage closed.
        """
        self._require("keys", "register_keys")
        if keys.party not in self.config.index:
            raise ProtocolError(keys.party, "unknown party")
        if keys.party in self._keys:
            raise ProtocolError(keys.party, "advertised keys twice")
        if len(keys.mask_public) != 32 or len(keys.enc_public) != 32:
            raise ProtocolError(keys.party, "public keys must be 32 raw bytes")
        self._keys[keys.party] = keys

    def keys_for(self, party: str) -> dict[str, PartyKeys]:
        """Stage 2: the advertised keys of ``party``'s neighbours (closes stage 1).

        Raises:
            TooFewSurvivors: fewer than ``t`` parties advertised.
        """
        self._advance("shares", len(self._keys))
        return {v: self._keys[v] for v in self.config.graph[party] if v in self._keys}

    def collect_shares(self, sender: str, messages: Mapping[str, bytes]) -> None:
        """Stage 2: record a party's encrypted shares for routing.

        Raises:
            ProtocolError: sender without keys, duplicate, a receiver that is not an
                advertised neighbour, or the shares stage closed.
        """
        self._require("shares", "collect_shares")
        if sender not in self._keys or sender in self._shares:
            raise ProtocolError(sender, "shares from a party without keys, or twice")
        for r in messages:
            if r not in self.config.graph[sender] or r not in self._keys:
                raise ProtocolError(sender, f"shares addressed to {r!r}")
        self._shares[sender] = dict(messages)

    def shares_for(self, receiver: str) -> dict[str, bytes]:
        """Stage 3: ciphertexts addressed to ``receiver`` (closes stage 2).

        Raises:
            TooFewSurvivors: fewer than ``t`` parties sent shares.
        """
        self._advance("masked", len(self._shares))
        return {s: msgs[receiver] for s, msgs in self._shares.items() if receiver in msgs}

    def _partners(self, u: str) -> tuple[str, ...]:
        """Parties that pair-masked with ``u``: those ``u`` sent shares to (and which sent shares)."""
        return tuple(v for v in sorted(self._shares.get(u, {})) if v in self._shares)

    def collect_masked(self, party: str, vector: Any) -> None:
        """Stage 3: record a party's masked vector.

        Raises:
            VectorError: wrong length/dtype or outside ``[0, 2^m)``.
            ProtocolError: a party that sent no shares, a duplicate, or stage 3 closed.
        """
        self._require("masked", "collect_masked")
        if party not in self._shares:
            raise ProtocolError(party, "masked vector from a party that sent no shares")
        if party in self._masked:
            raise ProtocolError(party, "masked vector sent twice")
        self._masked[party] = _check_vector(party, vector, self.config.vector_len, self.config.ring_bits)

    def collect_masked_sum(self, parties: Iterable[str], vector_sum: Any) -> None:
        """Stage 3, hierarchical aggregation: record the sum mod ``2^m`` of several
        parties' masked vectors, as an aggregator forwards it.

        The server then never sees those parties' vectors one by one; a party counts as
        masked exactly as if :meth:`collect_masked` had been called for it.

        Raises:
            VectorError: wrong length/dtype or outside ``[0, 2^m)``.
            ProtocolError: an empty party list, a party that sent no shares, a party
                already counted, or stage 3 closed.
        """
        self._require("masked", "collect_masked_sum")
        ps = list(parties)
        if not ps:
            raise ProtocolError("", "a masked sum over no parties")
        for p in ps:
            if p not in self._shares:
                raise ProtocolError(p, "masked vector from a party that sent no shares")
            if p in self._masked or p in self._summed or ps.count(p) > 1:
                raise ProtocolError(p, "masked vector sent twice")
        vec = _check_vector(ps[0], vector_sum, self.config.vector_len, self.config.ring_bits)
        self._summed.update(ps)
        mk = np.uint64((1 << self.config.ring_bits) - 1)
        self._masked_sum = (self._masked_sum + vec) & mk

    def unmask_request(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Stage 4: close stage 3 and return ``(survivors, dropped)`` to send to survivors.

        ``survivors`` masked a vector; ``dropped`` sent shares but no masked vector.

        Raises:
            TooFewSurvivors: fewer than ``t`` masked vectors arrived.
        """
        masked = set(self._masked) | self._summed
        self._advance("unmask", len(masked))
        survivors = tuple(sorted(masked))
        dropped = tuple(sorted(p for p in self._shares if p not in masked))
        return survivors, dropped

    def unmask(
        self,
        survivors: Iterable[str],
        dropped: Iterable[str],
        shares: Mapping[str, Mapping[str, RevealedShare]],
    ) -> np.ndarray:
        """Remove the masks and return the survivors' sum mod ``2^m``.

        Args:
            survivors: parties whose masked vectors are summed (as sent by
                :meth:`unmask_request`).
            dropped: parties that shared keys but whose masked vectors are excluded.
            shares: ``{holder: {owner: RevealedShare}}`` from the responding survivors.

        Returns:
            uint64, shape ``(n,)``: ``Σ_{u ∈ survivors} x_u mod 2^m``.

        Raises:
            TooFewSurvivors: fewer than ``t`` survivors.
            TooFewShares: fewer than ``t`` shares for some owner's secret.
            ProtocolError: inconsistent sets, or a share of the wrong kind/holder.
        """
        cfg = self.config
        surv, drop = tuple(sorted(set(survivors))), tuple(sorted(set(dropped)))
        if set(surv) & set(drop):
            raise ProtocolError("", f"parties both survived and dropped: {sorted(set(surv) & set(drop))}")
        if len(surv) < cfg.t:
            raise TooFewSurvivors("unmask", len(surv), cfg.t)
        missing = [u for u in surv if u not in self._masked and u not in self._summed]
        if missing:
            raise ProtocolError("", f"no masked vector from survivors {missing}")
        if not self._summed <= set(surv):
            raise ProtocolError("", "survivors leave out parties of a forwarded masked sum: "
                                f"{sorted(self._summed - set(surv))}")
        if any(u not in self._shares for u in drop):
            raise ProtocolError("", "a dropped party never shared keys")
        unaccounted = sorted(set(self._shares) - set(surv) - set(drop))
        if unaccounted:
            raise ProtocolError("", f"parties that shared keys are neither survivors nor dropped: {unaccounted}")
        self._stage = "unmask"
        by_owner: dict[str, list[tuple[int, int]]] = {}
        for holder, owned in shares.items():
            if holder not in surv:
                continue  # only survivors answer; ignore anything else
            for owner, sh in owned.items():
                want = "key" if owner in drop else "seed"
                if sh.owner != owner or sh.holder != holder or sh.kind != want:
                    raise ProtocolError(holder, f"bad share for {owner!r}")
                if holder not in cfg.holders(owner) or sh.x != cfg.index[holder]:
                    raise ProtocolError(holder, f"share for {owner!r} from a non-holder")
                by_owner.setdefault(owner, []).append((sh.x, sh.y))
        mk = np.uint64((1 << cfg.ring_bits) - 1)
        n = cfg.vector_len
        total = self._masked_sum.copy()
        for u in surv:
            if u in self._masked:
                total += self._masked[u]
        for u in surv:
            seed = recover_secret(by_owner.get(u, []), cfg.t, owner=u)
            total -= _self_mask(seed, u, cfg, n)
        survivor_set = set(surv)
        for u in drop:
            raw = recover_secret(by_owner.get(u, []), cfg.t, owner=u)
            sk = X25519PrivateKey.from_private_bytes(raw)
            if _raw_public(sk) != self._keys[u].mask_public:
                raise ProtocolError(u, "reconstructed mask key does not match its public key")
            for v in self._partners(u):
                if v not in survivor_set:
                    continue
                pm = _pair_mask(sk, self._keys[v].mask_public, u, v, cfg, n)
                # v added s(v, u) * pm; remove it.
                if _pair_sign(v, u) > 0:
                    total -= pm
                else:
                    total += pm
        return total & mk


def run_key_stages(clients: Mapping[str, SecAggClient], server: SecAggServer) -> None:
    """Drive stages 1-2 in memory: every client advertises its keys, receives its
    neighbours' keys, sends its encrypted shares and receives the ones addressed to it.
    For tests and single-process simulations; the bus layer runs the same calls with a
    deadline per stage (:mod:`synth.coordinator`, :mod:`synth.party`).
    """
    for c in clients.values():
        server.register_keys(c.public_keys())
    for p, c in clients.items():
        c.receive_public_keys(server.keys_for(p))
    for p, c in clients.items():
        server.collect_shares(p, c.share_messages())
    for p, c in clients.items():
        c.receive_shares(server.shares_for(p))

