"""Compressed cut-layer tensors on the wire (``vfl.wire.dtype``): pure numpy, no I/O.

The passive party's embeddings (``emb``, and the ``eval`` embeddings it publishes for
scoring) and the active party's cut-layer gradients (``grad``) are ``(B, d)`` float32
arrays. Where the link between the parties is thin they can travel in fewer bytes; the
receiver decodes them back to float32 before anything uses them, so the models, the
intake's checks (:mod:`parties.algorithms.intake`) and the DP accounting see float32 as before.

Encodings (the message's metadata key :data:`META_KEY` names the one used; absent:
float32, the arrays as computed):

* ``float16``: IEEE half precision (2 bytes per value). A message with a value beyond
  float16's range (65,504) is sent as float32 instead, so nothing overflows to
  infinity. Values below 6.1e-5 lose relative precision (subnormals), which cut-layer
  gradients of a batch-mean loss often are: prefer ``bfloat16`` or ``int8`` for them.
* ``bfloat16``: the top 16 bits of each float32, rounded to nearest even (float32's
  range, 8 bits of mantissa); sent as ``uint16`` (numpy has no bfloat16).
* ``int8``: per row, ``scale = max|x| / 127`` and ``q = rint(x / scale)`` in
  ``[-127, 127]``; sent as the ``(B, d)`` int8 array and the ``(B,)`` float32 scales
  (an all-zero row, or one below 1e-30 throughout, has scale 0). Decoding is
  ``q * scale``, so every value is within ``scale / 2`` of the original (plus float32
  rounding of the product): the error is relative to each row's largest value, whatever the row's magnitude, which suits
  gradients. About 3.6x fewer bytes at d = 32 (32 + 4 bytes a row against 128).

Under DP the passive party clips and noises each row first (:mod:`parties.privacy.dp`, in the
workers for ``emb`` and in the party for ``eval``) and the encoding is applied to the
noised rows: a function of the mechanism's output alone (post-processing), so the
accounted µ is unchanged.

``auto`` (:func:`resolve_wire_dtype`): ``int8`` when the run knows the bandwidth of the
path between the parties (``vfl.wire.link_mbps``, which ``psfl sim run`` fills in from the
scenario's links) and that path is bandwidth-bound by this rule: serialising one
float32 batch of cut-layer values (``batch_size x embedding_dim x 4`` bytes) takes at
least :data:`AUTO_MIN_SERIALISE_S` (1 ms): below about 65 Mbit/s at B = 256 and
d = 32. Otherwise (unknown bandwidth, a fast link) ``float32``. Each party decides for
what it sends; the receiver decodes whatever the message says.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: values of ``vfl.wire.dtype``
WIRE_DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")
#: the metadata key that names a message's encoding (absent: float32)
META_KEY = "wd"
#: ``auto`` compresses when one float32 batch takes at least this long to serialise (s)
AUTO_MIN_SERIALISE_S = 1e-3
#: what ``auto`` chooses for a bandwidth-bound path
AUTO_COMPRESSED = "int8"
#: int8: rows whose largest |value| is below this are sent as zeros (scale 0)
INT8_FLUSH = 1e-30
_F16_MAX = float(np.finfo(np.float16).max)
#: the largest float32 that rounds (to nearest even) to a finite bfloat16
_BF16_MAX = float(np.frombuffer(np.uint32(0x7F7F7FFF).tobytes(), np.float32)[0])
_TAGS = {"float16": "f16", "bfloat16": "bf16", "int8": "i8"}
_NAMES = {v: k for k, v in _TAGS.items()}


class WireFormatError(ValueError):
    """An encoded tensor that does not decode (unknown encoding, wrong arrays, dtypes,
    shapes, or scales that are not finite and >= 0)."""


def resolve_wire_dtype(wire_dtype: str, *, link_mbps: float, batch_size: int,
                       embedding_dim: int) -> str:
    """The encoding a party uses for what it sends (module docstring: the ``auto`` rule).

    Args:
        wire_dtype: ``vfl.wire.dtype``; anything but ``auto`` is returned as it is.
        link_mbps: the party-to-party path's bandwidth, Mbit/s (0: unknown).
        batch_size / embedding_dim: the shape of one batch's cut-layer tensor.

    Raises:
        ValueError: ``wire_dtype`` is not one of :data:`WIRE_DTYPES`.
    """
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire dtype must be one of {WIRE_DTYPES}, got {wire_dtype!r}")
    if wire_dtype != "auto":
        return wire_dtype
    if not link_mbps > 0:
        return "float32"
    serialise_s = batch_size * embedding_dim * 4 * 8 / (link_mbps * 1e6)
    return AUTO_COMPRESSED if serialise_s >= AUTO_MIN_SERIALISE_S else "float32"


# ------------------------------------------------------------------------ int8 per row
def int8_encode(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(q, scales)``: ``q`` the ``(n, d)`` int8 codes, ``scales`` the ``(n,)`` float32
    per-row scales (max|row| / 127; 0 for an all-zero row, and for a row whose largest
    |value| is below :data:`INT8_FLUSH`, which decodes to zeros).

    Raises:
        ValueError: ``x`` is not 2-D, or holds a NaN or an infinity.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a (rows, width) array, got shape {x.shape}")
    if x.size and not np.isfinite(x).all():
        raise ValueError("cannot encode values that are not finite (NaN or infinite)")
    amax = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    # a row whose largest value is below INT8_FLUSH goes as zeros (scale 0): its scale
    # would be a float32 subnormal, whose own rounding breaks the half-a-step bound
    scales = np.where(amax >= INT8_FLUSH, amax / np.float32(127.0), 0).astype(np.float32)
    inv = np.divide(np.float32(1.0), scales, out=np.zeros_like(scales), where=scales > 0)
    q = np.rint(x * inv[:, None])
    np.clip(q, -127, 127, out=q)
    return q.astype(np.int8), scales


def int8_decode(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``(n, d)`` float32 ``q * scales[:, None]``."""
    return q.astype(np.float32) * scales.astype(np.float32, copy=False)[:, None]


# ------------------------------------------------------------------------ bfloat16
def bf16_encode(x: np.ndarray) -> np.ndarray:
    """The top 16 bits of each float32 of ``x``, rounded to nearest even, as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_decode(h: np.ndarray) -> np.ndarray:
    """float32 of bfloat16 bit patterns (uint16)."""
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ------------------------------------------------------------------------ messages
def encode_message(arrays: Sequence[Any], meta: dict[str, Any], wire_dtype: str
                   ) -> tuple[list[Any], dict[str, Any]]:
    """The arrays and metadata to publish for a one-tensor message (``arrays`` =
    ``[x]``) under a resolved ``wire_dtype``: :func:`encode_rows`, its tag added to a
    copy of ``meta``; anything else (float32, no or several arrays) as it is."""
    if wire_dtype == "float32" or len(arrays) != 1:
        return list(arrays), meta
    out, tag = encode_rows(arrays[0], wire_dtype)
    return out, (meta if tag is None else {**meta, META_KEY: tag})


def encode_rows(x: np.ndarray, wire_dtype: str) -> tuple[list[np.ndarray], str | None]:
    """``(arrays, tag)`` to publish for the float32 tensor ``x`` under ``wire_dtype`` (a
    resolved one: not ``auto``); ``tag`` goes in the message's metadata under
    :data:`META_KEY` (None: sent as float32, ``[x]``).

    A tensor the encoding cannot hold (a NaN or an infinity; beyond float16's or
    bfloat16's range) goes as float32, untagged, so the receiver judges it as before.

    Raises:
        ValueError: an unknown dtype.
    """
    if wire_dtype == "float32":
        return [x], None
    if wire_dtype == "int8":
        if x.size and not np.isfinite(x).all():
            return [x], None  # as it is: the receiver's intake rejects it, as ever
        q, scales = int8_encode(x)
        return [q, scales], _TAGS["int8"]
    if wire_dtype == "bfloat16":
        if x.size and not float(np.abs(x).max()) <= _BF16_MAX:
            return [x], None  # would round to infinity (or not finite): as it is
        return [bf16_encode(x)], _TAGS["bfloat16"]
    if wire_dtype == "float16":
        if x.size and not float(np.abs(x).max()) <= _F16_MAX:
            return [x], None  # out of float16's range (or not finite): as it is
        return [x.astype(np.float16)], _TAGS["float16"]
    raise ValueError(f"not a resolved wire dtype: {wire_dtype!r}")


def decode_rows(arrays: Sequence[Any], tag: Any) -> np.ndarray:
    """The float32 tensor of a message's ``arrays`` encoded as ``tag`` (its
    :data:`META_KEY` metadata; None: the one float32 array as it is).

    Raises:
        WireFormatError: the arrays do not fit the encoding.
    """
    if tag is None:
        if len(arrays) != 1:
            raise WireFormatError(f"{len(arrays)} arrays, expected 1")
        return arrays[0]
    name = _NAMES.get(tag) if isinstance(tag, str) else None
    if name is None:
        raise WireFormatError(f"unknown wire encoding {tag!r}")
    want = 2 if name == "int8" else 1
    if len(arrays) != want or not all(isinstance(a, np.ndarray) for a in arrays):
        raise WireFormatError(f"{name}: {len(arrays)} arrays, expected {want}")
    a = arrays[0]
    if a.ndim != 2:
        raise WireFormatError(f"{name}: shape {a.shape}, expected (rows, width)")
    if name == "float16":
        if a.dtype != np.float16:
            raise WireFormatError(f"float16: dtype {a.dtype}")
        return a.astype(np.float32)
    if name == "bfloat16":
        if a.dtype != np.uint16:
            raise WireFormatError(f"bfloat16: dtype {a.dtype}, expected uint16")
        return bf16_decode(a)
    s = arrays[1]
    if a.dtype != np.int8 or s.dtype != np.float32 or s.shape != (a.shape[0],):
        raise WireFormatError(f"int8: arrays {a.dtype}{a.shape} and {s.dtype}{s.shape}, "
                              f"expected int8 (rows, width) and float32 (rows,)")
    if s.size and not (np.isfinite(s).all() and (s >= 0).all()):
        raise WireFormatError("int8: scales that are not finite and >= 0")
    return int8_decode(a, s)


def wire_bytes(rows: int, width: int, wire_dtype: str) -> int:
    """Payload bytes of a ``(rows, width)`` tensor under a resolved ``wire_dtype``
    (framing excluded)."""
    per = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}[wire_dtype]
    return rows * width * per + (4 * rows if wire_dtype == "int8" else 0)
