"""Codec: round trips, exact topic framing, and rejection of malformed frames."""

from __future__ import annotations

import numpy as np
import pytest

from pubsub.codec import ZERO_COPY_BYTES, decode, encode, topic_class, topic_frame, validate_topic
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


def test_copy_protects_publisher_buffers() -> None:
    a = np.ones(ZERO_COPY_BYTES // 4, dtype=np.float32)
    frames = encode("t", [a], copy=True)
    a[:] = 7
    msg = decode([bytes(memoryview(f)) for f in frames])
    assert float(msg.arrays[0][0]) == 1.0


def test_unsupported_dtype_and_meta_raise_type_error() -> None:
    with pytest.raises(TypeError, match="dtype"):
        encode("t", [np.array(["a"])])
    with pytest.raises(TypeError, match="JSON"):
        encode("t", [], {"x": object()})


def _good() -> list[bytes]:
    return [bytes(memoryview(f)) for f in encode("t/1", [np.zeros((2, 2), np.float32)], {"k": 1})]


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda f: f[:1], "at least 2 frames"),
        (lambda f: [f[0][:-1], *f[1:]], "NUL"),
        (lambda f: [f[0], b"\x02" + f[1][1:], *f[2:]], "version"),
        (lambda f: [f[0], f[1][:8] + bytes([f[1][8] ^ 1]) + f[1][9:], *f[2:]], "checksum"),
        (lambda f: [f[0], f[1], f[2][:-1]], "bytes, expected"),
        (lambda f: [*f, b"extra"], "payload frames"),
        (lambda f: [b"\xff\xfe\x00", *f[1:]], "UTF-8"),
    ],
)
def test_malformed_frames_raise_typed_error(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MalformedFrame, match=reason):
        decode(mutate(_good()))
