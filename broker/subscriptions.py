"""The broker's book of subscriptions under ``XPUB_MANUAL`` (pure; no socket).

With CURVE the broker's XPUB sockets are manual: libzmq hands every subscription and
unsubscription of every connection to the broker, which applies it (or not) itself.
That lets the broker refuse one identity a topic that another identity holds (run
membership for reading, :mod:`pubsub.membership`) and cap how many subscriptions one
identity holds. Upstream (to the publishers' endpoints) a topic is forwarded when its
first subscriber arrives and withdrawn when its last one leaves, as plain XPUB does, so
publishers learn each topic once.

The book counts, per endpoint (the role's XPUB), topic and identity, how many
connections hold the subscription, and per endpoint and topic how many requests were
refused. libzmq keeps every requested subscription of a live connection, refused ones
too, and when the connection closes it hands the broker one unsubscription per request,
without the connection's identity. Such an unsubscription releases a refused request of
the topic first, else one accepted holder: so a refused subscriber that leaves never
withdraws a topic another identity holds (each request is released exactly once, so the
counts stay exact even where the order is a guess).
"""

from __future__ import annotations

#: verdicts of :meth:`SubscriptionBook.subscribe` / :meth:`SubscriptionBook.unsubscribe`
FIRST = "first"  # accepted; the endpoint's first subscriber of the topic: forward upstream
MORE = "more"  # accepted; the topic is already upstream
CAPPED = "capped"  # refused: the identity holds its maximum
LAST = "last"  # withdrawn; the endpoint's last subscriber left: withdraw upstream
LESS = "less"  # withdrawn; others still hold the topic
UNKNOWN = "unknown"  # an unsubscription of something never accepted: ignored


class SubscriptionBook:
    """Reference counts of accepted subscriptions.

    Args:
        max_per_identity: most subscriptions one identity may hold at once, over all
            its connections and endpoints (0: no cap).
    """

    def __init__(self, max_per_identity: int) -> None:
        if max_per_identity < 0:
            raise ValueError(f"max_per_identity must be >= 0, got {max_per_identity}")
        self.max_per_identity = max_per_identity
        #: (endpoint, topic) -> identity -> connections holding it
        self._held: dict[tuple[int, bytes], dict[str, int]] = {}
        self._per_identity: dict[str, int] = {}
        #: (endpoint, topic) -> requests refused and not yet released
        self._refused: dict[tuple[int, bytes], int] = {}

    def refuse(self, endpoint: int, topic: bytes) -> None:
        """Record a request the broker refused (its release will come later)."""
        key = (endpoint, topic)
        self._refused[key] = self._refused.get(key, 0) + 1

    def subscribe(self, endpoint: int, identity: str, topic: bytes) -> str:
        """Record a subscription; :data:`FIRST`, :data:`MORE` or :data:`CAPPED`."""
        n = self._per_identity.get(identity, 0)
        if self.max_per_identity and n >= self.max_per_identity:
            self.refuse(endpoint, topic)
            return CAPPED
        self._per_identity[identity] = n + 1
        holders = self._held.get((endpoint, topic))
        if holders is None:
            self._held[(endpoint, topic)] = {identity: 1}
            return FIRST
        holders[identity] = holders.get(identity, 0) + 1
        return MORE

    def unsubscribe(self, endpoint: int, identity: str | None, topic: bytes) -> str:
        """Record an unsubscription; :data:`LAST`, :data:`LESS` or :data:`UNKNOWN`.

        ``identity`` None: libzmq's own unsubscription for a connection that closed (it
        carries no metadata): a refused request of the topic is released if there is one,
        else one holder of the topic."""
        key = (endpoint, topic)
        holders = self._held.get(key)
        if identity is None:
            if self._release_refused(key) or not holders:
                return UNKNOWN
            identity = next(iter(holders))
        h = holders.get(identity, 0) if holders else 0
        if h == 0:
            self._release_refused(key)
            return UNKNOWN
        assert holders is not None
        if h == 1:
            del holders[identity]
        else:
            holders[identity] = h - 1
        n = self._per_identity[identity] - 1
        if n:
            self._per_identity[identity] = n
        else:
            del self._per_identity[identity]
        if holders:
            return LESS
        del self._held[(endpoint, topic)]
        return LAST

    def _release_refused(self, key: tuple[int, bytes]) -> bool:
        r = self._refused.get(key, 0)
        if r == 0:
            return False
        if r == 1:
            del self._refused[key]
        else:
            self._refused[key] = r - 1
        return True

    @property
    def refused(self) -> int:
        """Refused requests not yet released (their connections are still open)."""
        return sum(self._refused.values())

    def held_by(self, identity: str) -> int:
        """How many subscriptions ``identity`` holds."""
        return self._per_identity.get(identity, 0)

    @property
    def topics(self) -> int:
        """Distinct (endpoint, topic) pairs subscribed."""
        return len(self._held)
