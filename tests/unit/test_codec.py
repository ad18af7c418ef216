"""Codec: round trips, exact topic framing, and rejection of malformed frames."""

from __future__ import annotations

import numpy as np
import pytest

from pubsub.codec import INLINE_MAX_BYTES, ZERO_COPY_BYTES, decode, encode, topic_class, topic_frame, validate_topic
from pubsub.errors import InvalidTopic, MalformedFrame


def test_round_trip_arrays_and_meta() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([1, -2], dtype=np.int64)
    frames = encode("emb/r/7", [a, b], {"e": 1, "u": "x"}, seq=5, publisher="p1")
    msg = decode([bytes(memoryview(f)) for f in frames])
    assert msg.topic == "emb/r/7" and msg.seq == 5 and msg.publisher == "p1"
    assert msg.meta == {"e": 1, "u": "x"}
    np.testing.assert_array_equal(msg.arrays[0], a)
    np.testing.assert_array_equal(msg.arrays[1], b)
    assert msg.arrays[0].dtype == np.float32 and msg.arrays[0].shape == (3, 4)


def test_topic_frame_is_nul_terminated_so_prefixes_cannot_collide() -> None:
    assert topic_frame("emb/1") == b"emb/1\x00"
    assert not topic_frame("emb/10").startswith(topic_frame("emb/1"))


@pytest.mark.parametrize("bad", ["", "a\x00b", "tab\there", "x" * 256])
def test_invalid_topics_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidTopic) as ei:
        validate_topic(bad)
    assert ei.value.topic == bad


def test_topic_class() -> None:
    assert topic_class("emb/run/3") == "emb"
    assert topic_class("solo") == "solo"


def test_copy_flag_selects_send_time_copy_or_zero_copy() -> None:
    """copy=True leaves an ndarray that send_envelope copies inside the send call;
    copy=False hands a memoryview over the caller's memory to ZeroMQ (zero-copy)."""
    a = np.ones(ZERO_COPY_BYTES // 4, dtype=np.float32)
    copied = encode("t", [a], copy=True)
    shared = encode("t", [a], copy=False)
    assert type(copied[1]) is np.ndarray and type(shared[1]) is memoryview
    assert np.shares_memory(np.asarray(shared[1]), a)
    snapshot = [bytes(memoryview(f)) for f in copied]  # what the send copies now
    a[:] = 7
    assert float(decode(snapshot).arrays[0][0]) == 1.0


def test_unsupported_dtype_and_meta_raise_type_error() -> None:
    with pytest.raises(TypeError, match="dtype"):
        encode("t", [np.array(["a"])])
    with pytest.raises(TypeError, match="JSON"):
        encode("t", [], {"x": object()})


def _good() -> list[bytes]:
    """An envelope with an inline payload (one frame)."""
    return [bytes(memoryview(f)) for f in encode("t/1", [np.zeros((2, 2), np.float32)], {"k": 1})]


def _good_big() -> list[bytes]:
    """An envelope whose payload travels in its own frame (>= 64 KiB)."""
    a = np.zeros(INLINE_MAX_BYTES // 4, np.float32)
    return [bytes(memoryview(f)) for f in encode("t/1", [a], {"k": 1})]


def _flip(f: bytes, i: int) -> bytes:
    return f[:i] + bytes([f[i] ^ 1]) + f[i + 1:]


_NUL = len(b"t/1")


@pytest.mark.parametrize(
    ("make", "mutate", "reason"),
    [
        (_good, lambda f: [], "no frames"),
        (_good, lambda f: [b"x" * 300], "NUL"),
        (_good, lambda f: [f[0].replace(b"\x00", b"x", 1)], "malformed"),
        (_good, lambda f: [b"t/1\x00\x02"], "too short"),
        (_good, lambda f: [_flip(f[0], _NUL + 1)], "version"),
        (_good, lambda f: [_flip(f[0], _NUL + 12)], "checksum"),  # inside seq
        (_good, lambda f: [f[0][:-1]], "inline payload ends"),
        (_good, lambda f: [f[0] + b"x"], "trailing"),
        (_good, lambda f: [f[0], b"extra"], "payload frames"),
        (_good_big, lambda f: [f[0], f[1][:-1]], "bytes, expected"),
        (_good_big, lambda f: [f[0]], "payload frames"),
        (_good_big, lambda f: [*f, b"extra"], "payload frames"),
        (_good, lambda f: [b"\xff\xfe" + f[0][_NUL:]], "UTF-8"),
    ],
)
def test_malformed_frames_raise_typed_error(make, mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MalformedFrame, match=reason):
        decode(mutate(make()))


def test_small_payload_is_one_aligned_frame_and_large_payload_is_separate() -> None:
    small = encode("emb/r/1", [np.arange(5, dtype=np.int8), np.ones((3, 2), np.float64)])
    assert len(small) == 1
    msg = decode(small)
    assert [a.ctypes.data % 8 for a in msg.arrays][1] == (
        np.frombuffer(small[0], np.uint8).ctypes.data % 8)  # aligned relative to the frame
    np.testing.assert_array_equal(msg.arrays[1], np.ones((3, 2)))
    big = encode("emb/r/1", [np.ones(INLINE_MAX_BYTES, np.uint8)])
    assert len(big) == 2 and len(memoryview(big[1])) == INLINE_MAX_BYTES


def test_seq_and_publisher_out_of_range_raise_value_error() -> None:
    with pytest.raises(ValueError, match="seq"):
        encode("t", seq=-1)
    with pytest.raises(ValueError, match="publisher"):
        encode("t", publisher="p" * 256)
