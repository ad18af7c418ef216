"""Property tests: codec round trip, exact topic matching, buffer bounds."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pubsub.buffer import BufferLimits, TopicBuffer
from pubsub.codec import decode, encode, topic_frame

topics = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x2FF), min_size=1, max_size=40
)
dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.int8, np.uint16, np.bool_])
arrays = dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3,
                                                                   max_side=6)))
metas = st.dictionaries(st.text(max_size=5),
                        st.one_of(st.integers(-10**9, 10**9), st.text(max_size=8), st.booleans(),
                                  st.none()), max_size=4)


@given(topic=topics, arrs=st.lists(arrays, max_size=3), meta=metas,
       seq=st.integers(0, 2**53))
def test_codec_round_trip(topic: str, arrs: list[np.ndarray], meta: dict, seq: int) -> None:  # type: ignore[type-arg]
    frames = encode(topic, arrs, meta, seq=seq, publisher="p")
    msg = decode([bytes(memoryview(f)) for f in frames])
    assert msg.topic == topic and msg.seq == seq and msg.meta == meta
    assert len(msg.arrays) == len(arrs)
    for got, want in zip(msg.arrays, arrs, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@given(sub=topics, pub=topics)
def test_exact_subscription_matches_only_the_same_topic(sub: str, pub: str) -> None:
    """ZeroMQ delivers when the subscription is a byte prefix of frame 0; with the NUL
    terminator that happens exactly when the topics are equal (reference matcher: ==)."""
    zmq_would_deliver = topic_frame(pub).startswith(topic_frame(sub))
    assert zmq_would_deliver == (sub == pub)


@given(st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(1, 8),
       st.integers(1, 600))
def test_buffer_never_exceeds_bounds_and_accounts_for_every_item(
    sizes: list[int], max_msgs: int, max_bytes: int
) -> None:
    buf: TopicBuffer[int] = TopicBuffer(BufferLimits(max_msgs=max_msgs, max_bytes=max_bytes))
    out = 0
    for i, n in enumerate(sizes):
        out += len(buf.put(i, n))
        assert len(buf) <= max_msgs and buf.nbytes <= max_bytes
    assert out + len(buf) == len(sizes)
    assert buf.evicted + buf.rejected == out
    kept = [buf.pop()[0] for _ in range(len(buf))]
    assert kept == sorted(kept)  # FIFO order preserved
