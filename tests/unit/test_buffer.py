"""TopicBuffer bounds and FIFO eviction."""

from __future__ import annotations

import pytest

from pubsub.buffer import BufferLimits, TopicBuffer


def test_evicts_oldest_first_when_message_bound_is_hit() -> None:
    buf: TopicBuffer[int] = TopicBuffer(BufferLimits(max_msgs=3, max_bytes=1000))
    for i in range(5):
        buf.put(i, 10)
    assert [buf.pop()[0] for _ in range(len(buf))] == [2, 3, 4]
    assert buf.evicted == 2


def test_byte_bound_evicts_and_oversize_is_rejected() -> None:
    buf: TopicBuffer[str] = TopicBuffer(BufferLimits(max_msgs=10, max_bytes=100))
    buf.put("a", 60)
    assert buf.put("b", 60) == ["a"]
    assert buf.put("huge", 101) == ["huge"]
    assert buf.rejected == 1 and len(buf) == 1 and buf.nbytes == 60


def test_limits_validate() -> None:
    with pytest.raises(ValueError, match="max_msgs"):
        BufferLimits(max_msgs=0)
