"""broker: a standalone XSUB/XPUB broker for the :mod:`pubsub` bus.

A broker at ``tcp://HOST:PORT`` binds XSUB on PORT (publishers connect here),
XPUB on PORT+1 (subscribers) and a control socket on PORT+2 (ROUTER; REQ clients). It forwards
subscriptions upstream and messages downstream, validates envelope structure,
and counts messages, bytes, subscriptions and rejected frames.

Modules: the forwarding loop, its counters and security loading (``proxy``), the
subscription side of the loop (``subforward``) and its per-connection book under CURVE
(``subscriptions``), the control socket (``control``), the publisher-identity check
(``identity``), the command line (``cli``). Depends only on :mod:`pubsub`.
"""

from broker.proxy import Broker, BrokerConfig, BrokerStats, request_stats

__all__ = ["Broker", "BrokerConfig", "BrokerStats", "request_stats"]
