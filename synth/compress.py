"""Adaptive communication for marginal vectors: quantisation, error feedback, deltas, packing.

Pure functions and small stateful codecs, no sockets. A party's noisy marginal vector
(float64 or int, length ``n``) travels as follows::

    x  --ErrorFeedbackQuantizer-->  q in {0..2^b-1}^n            (b-bit quantisation)
       --DeltaEncoder------------>  d = q_t - q_base (signed)     (delta vs the last ack)
       --to_ring(d, m)----------->  d mod 2^m                      (survives additive masks)
       --secagg mask------------->  uniformly random words in Z_{2^m}
       --pack_bits(., m)--------->  ceil(n*m/8) bytes              (the width *is* the saving)
       --compress_bytes---------->  optional lossless stage (useless after masking)

Quantisation is uniform over ``[h_min, h_max]`` with ``2^b - 1`` steps of width
``Δ = (h_max - h_min) / (2^b - 1)``; the maximum reconstruction error for an input inside
the range is ``Δ / 2`` (values outside are clipped first). Error feedback (Seide et al.,
"1-bit SGD", Interspeech 2014; Karimireddy et al., "Error Feedback Fixes SignSGD", ICML
2019) carries the residual into the next transmission, so the *running mean* of the
decoded values converges to ``x`` at rate ``Δ / (2T)`` after ``T`` rounds instead of
staying biased by up to ``Δ / 2``.

Delta encoding and ring helpers are built for additive secure aggregation: the masked
sum of deltas mod ``2^m`` added to the previous aggregate mod ``2^m`` is the new
aggregate, as long as ``m`` leaves room for the signed sum (see
:func:`synth.secagg.ring_bits`; what deltas save is measured in docs/results/fedforge.md).
"""

from __future__ import annotations

import lzma
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CodecUnavailable",
    "DeltaDecoder",
    "DeltaEncoder",
    "DeltaMessage",
    "DeltaStateError",
    "ErrorFeedbackQuantizer",
    "QuantSpec",
    "compress_bytes",
    "pack_varbits",
    "packed_size_var",
    "unpack_varbits",
    "compression_report",
    "decompress_bytes",
    "dequantize",
    "from_ring",
    "pack_bits",
    "packed_size",
    "quantize",
    "to_ring",
    "unpack_bits",
    "wire_size_naive",
]

#: Elements per chunk in :func:`pack_bits` / :func:`unpack_bits` (a multiple of 8, so
#: every chunk ends on a byte boundary). Bounds the temporary (chunk, 64) bit matrix
#: to 64 * 65536 = 4 MiB.
_PACK_CHUNK = 1 << 16


# --------------------------------------------------------------------------- errors


class DeltaStateError(RuntimeError):
    """A delta message does not apply to the receiver's state.

    Attributes:
        stream: the stream id.
        reason: what disagreed (no base version, base version mismatch, length...).
    """

    def __init__(self, stream: str, reason: str) -> None:
        self.stream = stream
        self.reason = reason
        super().__init__(f"delta stream {stream!r}: {reason}")


class CodecUnavailable(ValueError):
    """A lossless codec is unknown or its library is not installed.

    Attributes:
        codec: the requested codec name.
        reason: why it cannot be used.
    """

    def __init__(self, codec: str, reason: str) -> None:
        self.codec = codec
        self.reason = reason
        super().__init__(f"codec {codec!r} unavailable: {reason}")


# --------------------------------------------------------------------------- quantisation


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantSpec:
    """A uniform b-bit quantiser over a clipping range.

    Attributes:
        bits: code width ``b``, 1 <= b <= 30; codes are ``0 .. 2^b - 1``.
        h_min: lower clipping bound (same unit as the vector, e.g. counts).
        h_max: upper clipping bound, ``h_min < h_max``.

    Raises:
        ValueError: bits outside [1, 30], non-finite bounds, or ``h_min >= h_max``.
    """

    bits: int
    h_min: float
    h_max: float

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, (int, np.integer)):
            raise ValueError(f"bits must be an int, got {self.bits!r}")
        if not 1 <= int(self.bits) <= 30:
            raise ValueError(f"bits must be in [1, 30], got {self.bits}")
        if not (math.isfinite(self.h_min) and math.isfinite(self.h_max)):
            raise ValueError(f"h_min and h_max must be finite, got {self.h_min}, {self.h_max}")
        if not self.h_min < self.h_max:
            raise ValueError(f"need h_min < h_max, got {self.h_min} >= {self.h_max}")

    @property
    def levels(self) -> int:
        """Number of codes, ``2^bits``."""
        return 1 << int(self.bits)

    @property
    def step(self) -> float:
        """Quantisation step ``Δ = (h_max - h_min) / (2^b - 1)``; the max error is ``Δ/2``."""
        return (self.h_max - self.h_min) / (self.levels - 1)

    @property
    def max_error(self) -> float:
        """Largest reconstruction error for an input inside ``[h_min, h_max]``: ``Δ / 2``."""
        return self.step / 2


def _as_float_vector(x: Any) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError("vector contains NaN")
    return arr


def quantize(x: Any, spec: QuantSpec) -> np.ndarray:
    """Clip ``x`` to ``[h_min, h_max]`` and round it to the nearest of ``2^b`` levels.

    Args:
        x: shape ``(n,)``, any real dtype (e.g. noisy histogram counts). ``±inf`` is clipped.
        spec: the quantiser.

    Returns:
        Codes, shape ``(n,)``, dtype int64, values in ``[0, 2^b - 1]``. Level ``c`` stands for
        ``h_min + c * Δ``; for inputs inside the range ``|dequantize(quantize(x)) - x| <= Δ/2``.

    Raises:
        ValueError: ``x`` is not 1-D or contains NaN.
    """
    arr = _as_float_vector(x)
    clipped = np.clip(arr, spec.h_min, spec.h_max)
    codes = np.rint((clipped - spec.h_min) / spec.step)
    return np.clip(codes, 0, spec.levels - 1).astype(np.int64)


def dequantize(q: Any, spec: QuantSpec) -> np.ndarray:
    """Map codes back to values: ``h_min + q * Δ``.

    Args:
        q: codes, shape ``(n,)``, integer dtype, values in ``[0, 2^b - 1]``.
        spec: the quantiser that produced them.

    Returns:
        float64 values, shape ``(n,)``, in ``[h_min, h_max]``.

    Raises:
        ValueError: a code is outside ``[0, 2^b - 1]`` or ``q`` is not 1-D.
    """
    codes = np.asarray(q)
    if codes.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() > spec.levels - 1):
        raise ValueError(f"codes must lie in [0, {spec.levels - 1}]")
    return spec.h_min + codes.astype(np.float64) * spec.step


class ErrorFeedbackQuantizer:
    """b-bit quantisation with per-stream error feedback (residual memory).

    ``encode(x, stream)`` quantises ``y = x + r`` where ``r`` is the stream's residual, then
    stores ``r' = y - dequantize(q)``. Summing over ``T`` rounds gives
    ``Σ deq(q_t) = Σ x_t + r_0 - r_T``, so the decoded running mean is off by
    ``|r_T| / T <= Δ / (2T)`` when no clipping occurs (Seide et al. 2014; Karimireddy
    et al. ICML 2019). Clipping error is fed back too; if ``x`` lies outside the range for
    good, the residual grows, so choose ``[h_min, h_max]`` to cover the signal, or pass
    ``residual_bound`` to clip the residual to ``±residual_bound``.

    Args:
        spec: the quantiser.
        residual_bound: optional bound (same unit as ``x``) on the stored residual.
    """

    def __init__(self, spec: QuantSpec, *, residual_bound: float | None = None) -> None:
        if residual_bound is not None and not (residual_bound > 0 and math.isfinite(residual_bound)):
            raise ValueError(f"residual_bound must be positive and finite, got {residual_bound}")
        self.spec = spec
        self.residual_bound = residual_bound
        self._residual: dict[str, np.ndarray] = {}

    def residual(self, stream: str = "") -> np.ndarray | None:
        """A copy of the stream's residual (float64, shape ``(n,)``), or None before its first encode."""
        r = self._residual.get(stream)
        return None if r is None else r.copy()

    def encode(self, x: Any, stream: str = "") -> np.ndarray:
        """Quantise ``x`` plus the stream's residual and update the residual.

        Args:
            x: shape ``(n,)``, real dtype.
            stream: stream id (e.g. a clique name); residuals are kept per stream.

        Returns:
            int64 codes, shape ``(n,)``, in ``[0, 2^b - 1]``.

        Raises:
            ValueError: ``x`` is not 1-D, has NaN, or its length differs from the stream's
                earlier vectors.
        """
        arr = _as_float_vector(x)
        r = self._residual.get(stream)
        if r is None:
            r = np.zeros_like(arr)
        elif r.shape != arr.shape:
            raise ValueError(f"stream {stream!r}: length {arr.shape[0]} != earlier {r.shape[0]}")
        y = arr + r
        q = quantize(y, self.spec)
        new_r = y - dequantize(q, self.spec)
        if self.residual_bound is not None:
            np.clip(new_r, -self.residual_bound, self.residual_bound, out=new_r)
        self._residual[stream] = new_r
        return q

    def reset(self, stream: str | None = None) -> None:
        """Forget one stream's residual, or all of them when ``stream`` is None."""
        if stream is None:
            self._residual.clear()
        else:
            self._residual.pop(stream, None)

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state: the spec and a copy of every stream's residual (float64)."""
        return {
            "bits": int(self.spec.bits),
            "h_min": float(self.spec.h_min),
            "h_max": float(self.spec.h_max),
            "residual_bound": self.residual_bound,
            "residuals": {k: v.copy() for k, v in self._residual.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore residuals saved by :meth:`state_dict`.

        Raises:
            ValueError: the saved spec differs from this quantiser's spec.
        """
        saved = QuantSpec(bits=int(state["bits"]), h_min=float(state["h_min"]), h_max=float(state["h_max"]))
        if saved != self.spec:
            raise ValueError(f"state was saved with {saved}, this quantiser uses {self.spec}")
        self.residual_bound = state.get("residual_bound", self.residual_bound)
        self._residual = {
            str(k): np.asarray(v, dtype=np.float64).copy() for k, v in state["residuals"].items()
        }


# --------------------------------------------------------------------------- ring helpers


def _check_m(m: int) -> int:
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= int(m) <= 64:
        raise ValueError(f"ring width m must be an int in [1, 64], got {m!r}")
    return int(m)


def _ring_mask(m: int) -> np.uint64:
    return np.uint64((1 << m) - 1)


def to_ring(v: Any, m: int) -> np.ndarray:
    """Map signed integers into ``Z_{2^m}`` (two's complement reduction).

    Args:
        v: shape ``(n,)``, integer dtype (signed or unsigned, at most 64 bits).
        m: ring width in bits, 1..64.

    Returns:
        uint64, shape ``(n,)``, ``v mod 2^m`` in ``[0, 2^m)``.

    Raises:
        ValueError: ``m`` outside [1, 64] or ``v`` not of integer dtype.
    """
    m = _check_m(m)
    arr = np.asarray(v)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"to_ring needs an integer dtype, got {arr.dtype}")
    if arr.dtype.kind == "i":
        arr = arr.astype(np.int64, copy=False).view(np.uint64)
    else:
        arr = arr.astype(np.uint64, copy=False)
    return arr & _ring_mask(m)


def from_ring(v: Any, m: int) -> np.ndarray:
    """Interpret ``Z_{2^m}`` elements as signed integers in ``[-2^(m-1), 2^(m-1))``.

    Args:
        v: shape ``(n,)``, non-negative integers (reduced mod ``2^m`` first).
        m: ring width in bits, 1..64.

    Returns:
        int64, shape ``(n,)``; ``from_ring(to_ring(d, m), m) == d`` whenever
        ``-2^(m-1) <= d < 2^(m-1)``.
    """
    m = _check_m(m)
    arr = np.asarray(v)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"from_ring needs an integer dtype, got {arr.dtype}")
    u = arr.astype(np.uint64, copy=False) if arr.dtype.kind == "u" else arr.astype(np.int64).view(np.uint64)
    shift = np.uint64(64 - m)
    # Sign-extend bit m-1: move it to bit 63, then shift back arithmetically.
    return (u << shift).view(np.int64) >> np.int64(64 - m)


# --------------------------------------------------------------------------- delta encoding


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaMessage:
    """One transmission of a stream.

    Attributes:
        stream: stream id.
        version: the sender's version number of this vector (1, 2, ...).
        base_version: the version the delta is against; 0 means ``full`` (no base).
        full: True when ``payload`` is the whole vector, False when it is a delta.
        payload: int64 signed delta (or the full vector), shape ``(n,)``; uint64 in
            ``Z_{2^m}`` when the encoder works in a ring.
    """

    stream: str
    version: int
    base_version: int
    full: bool
    payload: np.ndarray


class DeltaEncoder:
    """Sender side of delta encoding: transmit ``q_t - q_last_acked`` per stream.

    The sender keeps, per stream, the last vector the receiver acknowledged (via
    :meth:`ack`) and the vectors sent since. Without an acknowledged base it sends the
    full vector with ``full=True``. With ``ring_bits=m`` the payload is reduced mod
    ``2^m`` (uint64), so it can be masked for secure aggregation: the aggregator adds the
    masked sum of deltas to its previous aggregate mod ``2^m``. All parties of one
    secure-aggregation round must then agree on ``full`` (a full vector is the delta
    against zero, so the bus layer can force ``full`` on everyone with :meth:`reset`).

    Args:
        ring_bits: optional ring width ``m`` (1..64) for modular payloads.
        max_pending: unacknowledged versions kept per stream (older ones are dropped).
    """

    def __init__(self, *, ring_bits: int | None = None, max_pending: int = 8) -> None:
        self.ring_bits = None if ring_bits is None else _check_m(ring_bits)
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self._acked: dict[str, tuple[int, np.ndarray]] = {}
        self._pending: dict[str, dict[int, np.ndarray]] = {}
        self._version: dict[str, int] = {}

    def encode(self, q: Any, stream: str = "") -> DeltaMessage:
        """Encode the stream's current integer vector.

        Args:
            q: shape ``(n,)``, integer dtype (e.g. quantiser codes).
            stream: stream id.

        Returns:
            The message; its payload is a delta against the last acknowledged version, or
            the full vector when none is acknowledged.

        Raises:
            ValueError: ``q`` is not a 1-D integer vector, or its length changed.
        """
        cur = np.asarray(q)
        if cur.ndim != 1 or cur.dtype.kind not in "iu":
            raise ValueError(f"expected a 1-D integer vector, got {cur.dtype} {cur.shape}")
        cur = cur.astype(np.int64)
        version = self._version.get(stream, 0) + 1
        self._version[stream] = version
        base = self._acked.get(stream)
        if base is not None and base[1].shape != cur.shape:
            raise ValueError(f"stream {stream!r}: length {cur.shape[0]} != base {base[1].shape[0]}")
        pending = self._pending.setdefault(stream, {})
        pending[version] = cur.copy()
        while len(pending) > self.max_pending:
            del pending[min(pending)]
        if base is None:
            payload, full, base_version = cur, True, 0
        else:
            payload, full, base_version = cur - base[1], False, base[0]
        if self.ring_bits is not None:
            payload = to_ring(payload, self.ring_bits)
        return DeltaMessage(stream=stream, version=version, base_version=base_version, full=full, payload=payload)

    def ack(self, stream: str, version: int) -> None:
        """Record that the receiver now holds ``version`` of ``stream``.

        Raises:
            DeltaStateError: the version was never sent or is no longer pending.
        """
        pending = self._pending.get(stream, {})
        if version not in pending:
            raise DeltaStateError(stream, f"version {version} is not pending")
        self._acked[stream] = (version, pending[version])
        for v in [v for v in pending if v <= version]:
            del pending[v]

    def reset(self, stream: str | None = None) -> None:
        """Forget the acknowledged base (next message is full), for one stream or all."""
        if stream is None:
            self._acked.clear()
            self._pending.clear()
        else:
            self._acked.pop(stream, None)
            self._pending.pop(stream, None)

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state: acknowledged bases and version counters."""
        return {
            "ring_bits": self.ring_bits,
            "acked": {k: (v, a.copy()) for k, (v, a) in self._acked.items()},
            "version": dict(self._version),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (pending versions are not restored)."""
        self.ring_bits = state["ring_bits"]
        self._acked = {str(k): (int(v), np.asarray(a, dtype=np.int64)) for k, (v, a) in state["acked"].items()}
        self._version = {str(k): int(v) for k, v in state["version"].items()}
        self._pending = {}


class DeltaDecoder:
    """Receiver side: apply full vectors or deltas to the last version per stream.

    With ``ring_bits=m`` the state and payloads live in ``Z_{2^m}`` (uint64) and the
    result is ``(last + delta) mod 2^m``; this is what an aggregator does with the
    unmasked *sum* of the parties' deltas.

    Args:
        ring_bits: optional ring width ``m`` (1..64).
    """

    def __init__(self, *, ring_bits: int | None = None) -> None:
        self.ring_bits = None if ring_bits is None else _check_m(ring_bits)
        self._last: dict[str, tuple[int, np.ndarray]] = {}

    def version(self, stream: str = "") -> int:
        """The version held for ``stream`` (0 when none): send it back as the ack."""
        last = self._last.get(stream)
        return 0 if last is None else last[0]

    def current(self, stream: str = "") -> np.ndarray | None:
        """A copy of the vector held for ``stream``, or None."""
        last = self._last.get(stream)
        return None if last is None else last[1].copy()

    def decode(self, msg: DeltaMessage) -> np.ndarray:
        """Apply one message and return the stream's new vector (a copy).

        Returns:
            int64 (or uint64 in ring mode), shape ``(n,)``.

        Raises:
            DeltaStateError: a delta arrives with no base, against another base version,
                or with a different length.
        """
        payload = np.asarray(msg.payload)
        if self.ring_bits is not None:
            payload = to_ring(payload, self.ring_bits)
        else:
            payload = payload.astype(np.int64)
        if msg.full:
            new = payload.copy()
        else:
            last = self._last.get(msg.stream)
            if last is None:
                raise DeltaStateError(msg.stream, "delta received but no base version is held")
            if last[0] != msg.base_version:
                raise DeltaStateError(msg.stream, f"delta against version {msg.base_version}, held {last[0]}")
            if last[1].shape != payload.shape:
                raise DeltaStateError(msg.stream, f"length {payload.shape[0]} != held {last[1].shape[0]}")
            new = last[1] + payload
            if self.ring_bits is not None:
                new &= _ring_mask(self.ring_bits)
        self._last[msg.stream] = (msg.version, new)
        return new.copy()

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state: version and vector per stream."""
        return {"ring_bits": self.ring_bits, "last": {k: (v, a.copy()) for k, (v, a) in self._last.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.ring_bits = state["ring_bits"]
        dtype = np.int64 if self.ring_bits is None else np.uint64
        self._last = {str(k): (int(v), np.asarray(a, dtype=dtype)) for k, (v, a) in state["last"].items()}


# --------------------------------------------------------------------------- bit packing


def packed_size(n: int, bits: int) -> int:
    """Bytes of ``n`` values packed at ``bits`` bits each: ``ceil(n * bits / 8)``."""
    return (n * bits + 7) // 8


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= int(bits) <= 64:
        raise ValueError(f"bits must be an int in [1, 64], got {bits!r}")
    return int(bits)


def pack_bits(values: Any, bits: int) -> bytes:
    """Densely pack unsigned integers of ``bits`` bits each (MSB first, big-endian order).

    Vectorised: each chunk of values is viewed as big-endian 8-byte words, expanded to a
    ``(chunk, 64)`` bit matrix with ``np.unpackbits``, trimmed to its last ``bits``
    columns and re-packed with ``np.packbits``. The last byte is zero-padded.

    Args:
        values: shape ``(n,)``, integer dtype, every value in ``[0, 2^bits)``.
        bits: width, 1..64 (b for quantiser codes, m for masked ring words).

    Returns:
        ``ceil(n * bits / 8)`` bytes.

    Raises:
        ValueError: bits outside [1, 64], a non-integer or non-1-D input, or a value
            that is negative or does not fit in ``bits`` bits.
    """
    bits = _check_bits(bits)
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"expected a 1-D integer vector, got {arr.dtype} {arr.shape}")
    if arr.size == 0:
        return b""
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise ValueError("pack_bits needs non-negative values")
    u = arr.astype(np.uint64, copy=False)
    if bits < 64 and u.max() >> np.uint64(bits):
        raise ValueError(f"a value does not fit in {bits} bits")
    be = u.astype(">u8")
    parts = []
    for start in range(0, be.size, _PACK_CHUNK):
        chunk = be[start : start + _PACK_CHUNK]
        bitmat = np.unpackbits(chunk.view(np.uint8).reshape(-1, 8), axis=1)
        parts.append(np.packbits(bitmat[:, 64 - bits :]).tobytes())
    return b"".join(parts)


def unpack_bits(data: bytes | bytearray | memoryview, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`.

    Args:
        data: exactly ``ceil(n * bits / 8)`` bytes.
        bits: width, 1..64.
        n: number of values.

    Returns:
        uint64, shape ``(n,)``.

    Raises:
        ValueError: the byte length does not match ``n`` and ``bits``.
    """
    bits = _check_bits(bits)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size != packed_size(n, bits):
        raise ValueError(f"expected {packed_size(n, bits)} bytes for {n} x {bits} bits, got {buf.size}")
    out = np.empty(n, dtype=np.uint64)
    chunk_bytes = _PACK_CHUNK * bits // 8
    for i, start in enumerate(range(0, n, _PACK_CHUNK)):
        count = min(_PACK_CHUNK, n - start)
        seg = buf[i * chunk_bytes : i * chunk_bytes + packed_size(count, bits)]
        bitmat = np.unpackbits(seg, count=count * bits).reshape(count, bits)
        full = np.zeros((count, 64), dtype=np.uint8)
        full[:, 64 - bits :] = bitmat
        out[start : start + count] = np.packbits(full, axis=1).view(">u8").reshape(count)
    return out


def _check_widths(widths: Any, n: int | None = None) -> np.ndarray:
    w = np.asarray(widths)
    if w.ndim != 1 or (w.size and w.dtype.kind not in "iu"):
        raise ValueError(f"widths must be a 1-D integer vector, got {w.dtype} {w.shape}")
    if n is not None and w.shape[0] != n:
        raise ValueError(f"{w.shape[0]} widths for {n} values")
    if w.size and (int(w.min()) < 1 or int(w.max()) > 64):
        raise ValueError(f"widths must lie in [1, 64], got {int(w.min())}..{int(w.max())}")
    return w.astype(np.int64)


def packed_size_var(widths: Any) -> int:
    """Bytes of values packed at per-value ``widths`` bits: ``ceil(Σ widths / 8)``."""
    return (int(np.asarray(widths, dtype=np.int64).sum()) + 7) // 8


def pack_varbits(values: Any, widths: Any) -> bytes:
    """Densely pack unsigned integers, value ``i`` in ``widths[i]`` bits (MSB first).

    The per-cell variant of :func:`pack_bits`, for masked words whose ring differs per
    cell (:func:`synth.protocol.cell_windows`). Vectorised in chunks: a ``(chunk, 64)``
    bit matrix per chunk, the low ``widths[i]`` columns of row ``i`` kept.

    Args:
        values: shape ``(n,)``, integer dtype, ``0 <= values[i] < 2^widths[i]``.
        widths: shape ``(n,)``, integers in [1, 64].

    Returns:
        ``ceil(Σ widths / 8)`` bytes (the last one zero-padded).

    Raises:
        ValueError: shapes differ, a width outside [1, 64], or a value that is negative
            or does not fit its width.
    """
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"expected a 1-D integer vector, got {arr.dtype} {arr.shape}")
    w = _check_widths(widths, arr.shape[0])
    if arr.size == 0:
        return b""
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise ValueError("pack_varbits needs non-negative values")
    u = arr.astype(np.uint64, copy=False)
    small = w < 64
    if np.any(u[small] >> w[small].astype(np.uint64)):
        raise ValueError("a value does not fit in its width")
    cols = np.arange(64)
    parts = []
    for start in range(0, arr.shape[0], _PACK_CHUNK):
        seg = u[start:start + _PACK_CHUNK].astype(">u8")
        bitmat = np.unpackbits(seg.view(np.uint8)).reshape(-1, 64)
        keep = cols[None, :] >= (64 - w[start:start + _PACK_CHUNK])[:, None]
        parts.append(bitmat[keep])
    return np.packbits(np.concatenate(parts)).tobytes()


def unpack_varbits(data: bytes | bytearray | memoryview, widths: Any) -> np.ndarray:
    """Inverse of :func:`pack_varbits`.

    Args:
        data: exactly ``ceil(Σ widths / 8)`` bytes.
        widths: shape ``(n,)``, integers in [1, 64].

    Returns:
        uint64, shape ``(n,)``.

    Raises:
        ValueError: a width outside [1, 64], or the byte length does not match.
    """
    w = _check_widths(widths)
    buf = np.frombuffer(data, dtype=np.uint8)
    total = int(w.sum())
    if buf.size != (total + 7) // 8:
        raise ValueError(f"expected {(total + 7) // 8} bytes for {w.shape[0]} values of "
                         f"{total} bits in all, got {buf.size}")
    n = w.shape[0]
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    bits = np.unpackbits(buf, count=total)
    cols = np.arange(64)
    at = 0
    for start in range(0, n, _PACK_CHUNK):
        ww = w[start:start + _PACK_CHUNK]
        keep = cols[None, :] >= (64 - ww)[:, None]
        full = np.zeros((ww.shape[0], 64), dtype=np.uint8)
        used = int(ww.sum())
        full[keep] = bits[at:at + used]
        at += used
        out[start:start + ww.shape[0]] = np.packbits(full, axis=1).view(">u8").reshape(-1)
    return out


# --------------------------------------------------------------------------- lossless stage

try:  # optional: zstandard is not a dependency
    import zstandard as _zstd
except ImportError:  # pragma: no cover - depends on the environment
    _zstd = None

#: Codecs :func:`compress_bytes` accepts. "zstd" needs the ``zstandard`` package.
CODECS = ("none", "zlib", "lzma", "zstd")


def compress_bytes(data: bytes, codec: str = "zlib", level: int | None = None) -> bytes:
    """Lossless stage, with a library codec (zlib, lzma or zstandard).

    Useful on packed quantised codes and deltas (many small values); useless on masked
    words, which are uniformly random.

    Args:
        data: the bytes.
        codec: "zlib" (stdlib, default), "lzma" (stdlib), "zstd" (``zstandard``) or "none".
        level: codec level; None for the codec's default (zlib 6, lzma preset 6, zstd 3).

    Raises:
        CodecUnavailable: unknown codec, or "zstd" without ``zstandard`` installed.
    """
    if codec == "none":
        return bytes(data)
    if codec == "zlib":
        return zlib.compress(data, 6 if level is None else level)
    if codec == "lzma":
        return lzma.compress(data, preset=6 if level is None else level)
    if codec == "zstd":
        if _zstd is None:
            raise CodecUnavailable(codec, "the zstandard package is not installed")
        return _zstd.ZstdCompressor(level=3 if level is None else level).compress(data)
    raise CodecUnavailable(codec, f"unknown codec, expected one of {CODECS}")


def decompress_bytes(data: bytes, codec: str = "zlib") -> bytes:
    """Inverse of :func:`compress_bytes`.

    Raises:
        CodecUnavailable: unknown codec, or "zstd" without ``zstandard`` installed.
    """
    if codec == "none":
        return bytes(data)
    if codec == "zlib":
        return zlib.decompress(data)
    if codec == "lzma":
        return lzma.decompress(data)
    if codec == "zstd":
        if _zstd is None:
            raise CodecUnavailable(codec, "the zstandard package is not installed")
        return _zstd.ZstdDecompressor().decompress(data)
    raise CodecUnavailable(codec, f"unknown codec, expected one of {CODECS}")


# --------------------------------------------------------------------------- accounting


def wire_size_naive(n: int) -> int:
    """Bytes of the naive transmission of ``n`` values as float32: ``4 * n``."""
    return 4 * int(n)


def compression_report(n: int, bytes_wire: int) -> dict[str, float | int]:
    """Bytes on the wire against naive float32 for ``n`` values.

    Returns:
        ``{"n", "bytes_wire", "bytes_naive", "ratio" (wire/naive), "saving" (1 - ratio)}``.
    """
    naive = wire_size_naive(n)
    ratio = bytes_wire / naive if naive else 0.0
    return {"n": int(n), "bytes_wire": int(bytes_wire), "bytes_naive": naive, "ratio": ratio, "saving": 1.0 - ratio}
