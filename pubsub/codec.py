"""Wire codec for bus envelopes: pure functions, no sockets.

Multipart layout (one ZeroMQ message)::

    frame 0   topic, UTF-8, followed by one NUL byte (b"emb/run/7\\x00")
    frame 1   header: version byte 0x01, CRC-32 of the JSON (4 bytes, big endian),
              then an orjson object {"s": seq, "p": publisher, "m": meta, "a": arrays}
    frame 2+  one raw, C-contiguous buffer per array (zero-copy from 64 KiB up)

The NUL terminator makes ZeroMQ's prefix filtering exact: a subscription to
``b"emb/1\\x00"`` cannot match ``b"emb/10\\x00"``; a *prefix* subscription is the
bare prefix bytes (``b"emb/"``).

``"a"`` lists ``[dtype, shape]`` per array frame; on decode, dtype, shape and the
frame's byte length must agree, and the header's CRC must match, or
:class:`~pubsub.errors.MalformedFrame` is raised.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from pubsub.errors import InvalidTopic, MalformedFrame

VERSION = 1
MAX_TOPIC_BYTES = 255
MAX_HEADER_BYTES = 1 << 20
#: Arrays of this many bytes and more are sent without copying (pyzmq's COPY_THRESHOLD).
ZERO_COPY_BYTES = 65536

_CRC = struct.Struct(">I")
_ALLOWED_DTYPES = frozenset(
    np.dtype(t).str
    for t in (
        "<f2", "<f4", "<f8", "<i1", "<i2", "<i4", "<i8", "<u1", "<u2", "<u4", "<u8", "?",
    )
)


def validate_topic(topic: str) -> bytes:
    """Check a topic and return its UTF-8 bytes (without terminator).

    Topics are non-empty, at most 255 UTF-8 bytes, and contain no control
    characters (so never a NUL, which terminates topics on the wire).

    Raises:
        InvalidTopic: if any rule is broken.
    """
    if not isinstance(topic, str):
        raise InvalidTopic(repr(topic), f"topic must be str, not {type(topic).__name__}")
    if not topic:
        raise InvalidTopic(topic, "empty")
    raw = topic.encode("utf-8")
    if len(raw) > MAX_TOPIC_BYTES:
        raise InvalidTopic(topic, f"{len(raw)} bytes > {MAX_TOPIC_BYTES}")
    if any(b < 0x20 for b in raw):
        raise InvalidTopic(topic, "contains a control character")
    return raw


def topic_frame(topic: str) -> bytes:
    """Wire frame 0 for ``topic``: its bytes plus the NUL terminator. Also the exact subscription."""
    return validate_topic(topic) + b"\x00"


def topic_class(topic: str) -> str:
    """The channel class of a topic: the part before the first ``/`` (``"emb/r/7"`` -> ``"emb"``)."""
    return topic.partition("/")[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """A decoded envelope.

    Attributes:
        topic: the exact topic it was published on.
        seq: the publisher's sequence number for this topic (1, 2, ...).
        publisher: the publishing client's id.
        meta: JSON-compatible metadata (dict).
        arrays: the payload arrays, read-only numpy views over the received
            frames (no copy); copy before mutating.
        nbytes: bytes on the wire (all frames).
    """

    topic: str
    seq: int
    publisher: str
    meta: dict[str, Any] = field(default_factory=dict, repr=False)
    arrays: tuple[np.ndarray, ...] = field(default=(), repr=False)
    nbytes: int = 0


def _as_array(obj: Any) -> np.ndarray:
    arr = np.asarray(obj)
    if arr.dtype.str not in _ALLOWED_DTYPES:
        raise TypeError(f"unsupported array dtype {arr.dtype} (allowed: {sorted(_ALLOWED_DTYPES)})")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    # np.ascontiguousarray would turn a 0-d array into 1-d
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def encode(
    topic: str,
    arrays: Sequence[Any] = (),
    meta: Mapping[str, Any] | None = None,
    *,
    seq: int = 0,
    publisher: str = "",
    copy: bool = True,
) -> list[Any]:
    """Encode an envelope into multipart frames.

    Args:
        topic: exact topic (see :func:`validate_topic`).
        arrays: numpy arrays, or objects ``np.asarray`` accepts (CPU torch
            tensors without grad), of a numeric or bool dtype.
        meta: JSON-serialisable metadata (orjson rules; numpy scalars allowed).
        seq: the publisher's sequence number for this topic.
        publisher: the publisher's id.
        copy: if True (default), arrays of :data:`ZERO_COPY_BYTES` and more are
            copied so that the caller may mutate them right after publishing. If
            False, ownership passes to the bus: the caller must not mutate them
            until ZeroMQ has sent them (zero-copy). Smaller arrays are always
            copied by ZeroMQ at send time.

    Returns:
        A list of frames: ``bytes`` for topic and header, arrays (buffer
        protocol) for the payload.

    Raises:
        InvalidTopic: bad topic.
        TypeError: unsupported array dtype or meta not JSON-serialisable.
    """
    frames: list[Any] = [topic_frame(topic)]
    specs = []
    payload: list[Any] = []
    for obj in arrays:
        arr = _as_array(obj)
        specs.append((arr.dtype.str, arr.shape))
        if copy and arr.nbytes >= ZERO_COPY_BYTES:
            arr = arr.copy()
        payload.append(arr.reshape(-1).view(np.uint8) if arr.ndim != 1 or arr.dtype != np.uint8 else arr)
    try:
        body = orjson.dumps(
            {"s": seq, "p": publisher, "m": dict(meta) if meta else {}, "a": specs},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"meta for topic {topic!r} is not JSON-serialisable: {exc}") from exc
    frames.append(b"\x01" + _CRC.pack(zlib.crc32(body)) + body)
    frames.extend(payload)
    return frames


def _frame_bytes(frame: Any) -> memoryview:
    buf = getattr(frame, "buffer", None)
    if buf is not None:
        return buf  # zmq.Frame
    return memoryview(frame)


def _small_bytes(frame: Any) -> bytes:
    """A small frame (topic, header) as bytes: cheaper to slice and compare than a view."""
    if type(frame) is bytes:
        return frame
    b = getattr(frame, "bytes", None)
    return b if b is not None else bytes(frame)


_DTYPES = {s: np.dtype(s) for s in _ALLOWED_DTYPES}
_crc_of = _CRC.unpack_from


def decode(frames: Sequence[Any]) -> Message:
    """Decode multipart frames (``bytes`` or ``zmq.Frame``) into a :class:`Message`.

    Array payloads become read-only numpy views over the frames (zero-copy).
    This is on every receiver's hot path: the common case does no more than the
    checks listed below.

    Raises:
        MalformedFrame: wrong frame count, missing topic terminator, bad UTF-8,
            unknown version, header checksum mismatch, invalid JSON, unsupported
            dtype, or a frame length that disagrees with dtype x shape.
    """
    n = len(frames)
    if n < 2:
        raise MalformedFrame(f"expected at least 2 frames (topic, header), got {n}")
    t = _small_bytes(frames[0])
    if len(t) < 2 or t[-1] != 0:
        raise MalformedFrame("topic frame is not NUL-terminated")
    try:
        topic = t[:-1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedFrame(f"topic is not UTF-8: {exc}") from None
    h = _small_bytes(frames[1])
    nh = len(h)
    if nh < 5 or nh > MAX_HEADER_BYTES:
        raise MalformedFrame(f"header of {nh} bytes (need 5..{MAX_HEADER_BYTES})")
    if h[0] != VERSION:
        raise MalformedFrame(f"unknown codec version {h[0]} (expected {VERSION})")
    body = h[5:]
    if zlib.crc32(body) != _crc_of(h, 1)[0]:
        raise MalformedFrame(f"header checksum mismatch on topic {topic!r}")
    try:
        hdr = orjson.loads(body)
        seq = hdr["s"]
        publisher = hdr["p"]
        meta = hdr["m"]
        specs = hdr["a"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise MalformedFrame(f"bad header on topic {topic!r}: {exc!r}") from None
    if type(seq) is not int or type(publisher) is not str or type(meta) is not dict \
            or type(specs) is not list:
        raise MalformedFrame(f"header fields of wrong type on topic {topic!r}")
    if len(specs) != n - 2:
        raise MalformedFrame(f"header lists {len(specs)} arrays but {n - 2} payload frames came")
    nbytes = len(t) + nh
    arrays = []
    i = 2
    for spec in specs:
        try:
            dt_str, shape = spec
            dtype = _DTYPES[dt_str]
            count = 1
            for d in shape:
                if type(d) is not int or d < 0:
                    raise ValueError(f"bad shape {shape!r}")
                count *= d
        except KeyError:
            raise MalformedFrame(f"array {i - 2} on topic {topic!r}: dtype not allowed") from None
        except (TypeError, ValueError) as exc:
            raise MalformedFrame(f"array {i - 2} on topic {topic!r}: {exc}") from None
        buf = _frame_bytes(frames[i])
        i += 1
        nb = len(buf)
        if nb != count * dtype.itemsize:
            raise MalformedFrame(
                f"array {i - 3} on topic {topic!r}: {nb} bytes, expected "
                f"{count * dtype.itemsize} for {dt_str}{tuple(shape)}"
            )
        nbytes += nb
        arr = np.frombuffer(buf, dtype=dtype)
        arrays.append(arr if len(shape) == 1 else arr.reshape(shape))
    return Message(
        topic=topic, seq=seq, publisher=publisher, meta=meta, arrays=tuple(arrays), nbytes=nbytes
    )
