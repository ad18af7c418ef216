"""pubsub: an asyncio-native publish/subscribe bus over ZeroMQ.

The bus connects clients to an XSUB/XPUB broker (see :mod:`broker`). A broker at
``tcp://HOST:PORT`` takes publishers on ``PORT`` (XSUB), subscribers on ``PORT+1``
(XPUB) and control requests on ``PORT+2``.

Public API:

* :class:`Bus` -- one client: a publisher socket, a subscriber socket with one
  reader task, and bounded per-topic buffers.
* :class:`MemoryBroker` / :class:`MemoryBus` -- an in-process hub and its client with
  the same surface and semantics (tests, single-process simulations).
* :class:`Transport` -- the protocol both clients satisfy.
* :mod:`pubsub.session` -- rendezvous, liveness and multi-topic waits over any Transport.
* :class:`Message` -- a received envelope (topic, header metadata, arrays).
* :mod:`pubsub.codec` -- the pure wire codec.
* :mod:`pubsub.errors` -- typed errors.

This package knows nothing of brokers' internals, parties or synthesis.
"""

from pubsub.address import BrokerAddress
from pubsub.buffer import BufferLimits, TopicBuffer
from pubsub.client import Bus, BusConfig, BusStats
from pubsub.codec import Message, decode, encode
from pubsub.memory import MemoryBroker, MemoryBrokerStats, MemoryBus
from pubsub.transport import Transport
from pubsub.errors import (
    BrokerUnreachable,
    BusClosed,
    BusError,
    DeadlineExceeded,
    MalformedFrame,
    ForkedClient,
    MessageTooLarge,
    InvalidTopic,
    PeerLost,
    RendezvousTimeout,
    SessionError,
    SettingsMismatch,
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
    "MemoryBroker",
    "MemoryBrokerStats",
    "MemoryBus",
    "Message",
    "ForkedClient",
    "MessageTooLarge",
    "PeerLost",
    "RendezvousTimeout",
    "SessionError",
    "SettingsMismatch",
    "TopicBuffer",
    "Transport",
    "decode",
    "encode",
]
