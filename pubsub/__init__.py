"""pubsub: an asyncio-native publish/subscribe bus over ZeroMQ.

The bus connects clients to an XSUB/XPUB broker (see :mod:`broker`). A broker at
``tcp://HOST:PORT`` takes publishers on ``PORT`` (XSUB), subscribers on ``PORT+1``
(XPUB) and control requests on ``PORT+2``.

Public API:

* :class:`Bus` -- one client: a publisher socket, a subscriber socket with one
  reader task, and bounded per-topic buffers.
* :class:`Message` -- a received envelope (topic, header metadata, arrays).
* :mod:`pubsub.codec` -- the pure wire codec.
* :mod:`pubsub.errors` -- typed errors.

This package knows nothing of brokers' internals, parties or synthesis.
"""

from pubsub.address import BrokerAddress
from pubsub.buffer import BufferLimits, TopicBuffer
from pubsub.client import Bus, BusConfig, BusStats
from pubsub.codec import Message, decode, encode
from pubsub.errors import (
    BrokerUnreachable,
    BusClosed,
    BusError,
    DeadlineExceeded,
    MalformedFrame,
    MessageTooLarge,
    InvalidTopic,
)

__all__ = [
    "BrokerAddress",
    "BrokerUnreachable",
    "BufferLimits",
    "Bus",
    "BusClosed",
    "BusConfig",
    "BusError",
    "BusStats",
    "DeadlineExceeded",
    "InvalidTopic",
    "MalformedFrame",
    "Message",
    "MessageTooLarge",
    "TopicBuffer",
    "decode",
    "encode",
]
