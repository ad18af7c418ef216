"""The subscription side of the broker's forwarding loop: a subscriber's (un)subscription
frames, checked against its role's rules (and, with CURVE, its run membership and the
per-identity cap, through the :class:`broker.subscriptions.SubscriptionBook`), counted,
and forwarded upstream to the publishers' endpoints that may publish what it covers.

Owns: :class:`SubscriptionForwarder`. May import :mod:`pubsub` and
:mod:`broker.subscriptions`.
"""

from __future__ import annotations

from typing import Any

import structlog
import zmq

from pubsub.membership import RunMembership
from pubsub.policy import Policy

from broker.subscriptions import CAPPED, FIRST, LAST, UNKNOWN, SubscriptionBook

log = structlog.get_logger("broker.proxy")
_MAX_ROUTES = 1 << 16


class SubscriptionForwarder:
    """Pumps the (un)subscriptions of the broker's XPUB sockets upstream.

    Args:
        stats: the broker's counters (:class:`broker.proxy.BrokerStats`).
        policy: the topic policy (None: plaintext, every subscription goes to every
            XSUB).
        ins: the XSUB sockets, one per policy role (one in plaintext).
        book: with CURVE, the subscriptions of every connection (``XPUB_MANUAL``);
            None in plaintext.
        members: the run membership, or None.
    """

    def __init__(self, *, stats: Any, policy: Policy | None, ins: list[zmq.Socket],
                 book: SubscriptionBook | None, members: RunMembership | None) -> None:
        self.stats = stats
        self.policy = policy
        self._ins = ins
        self._book = book
        self._members = members
        self._routes: dict[tuple[int, bytes], tuple[bool, tuple[zmq.Socket, ...]]] = {}

    def pump(self, xpub: zmq.Socket, role: int, burst: int) -> None:
        """Handle up to ``burst`` queued (un)subscriptions of role ``role``'s XPUB."""
        if self._book is not None:
            self._pump_manual(xpub, role, burst)
        else:
            self._pump_plain(xpub, role, burst)

    def route(self, role: int, data: bytes) -> tuple[bool, tuple[zmq.Socket, ...]]:
        """For a (un)subscription frame's body from role ``role``'s XPUB: may the role read
        anything it covers, and which XSUBs (publisher roles) it goes to. Cached."""
        key = (role, data)
        r = self._routes.get(key)
        if r is not None:
            return r
        if self.policy is None:
            r = (True, tuple(self._ins))
        else:
            exact = data.endswith(b"\0")
            text = (data[:-1] if exact else data).decode("utf-8", "replace")
            rules = self.policy.roles
            if exact:
                ok = rules[role].may_read(text)
                pubs = tuple(s for s, rr in zip(self._ins, rules, strict=True)
                             if rr.may_publish(text))
            else:
                ok = rules[role].may_subscribe_prefix(text)
                pubs = tuple(s for s, rr in zip(self._ins, rules, strict=True)
                             if rr.may_publish_prefix(text))
            r = (ok, pubs)
        if len(self._routes) >= _MAX_ROUTES:
            self._routes.clear()
        self._routes[key] = r
        return r

    def _pump_plain(self, xpub: zmq.Socket, role: int, burst: int) -> None:
        st = self.stats
        for _ in range(burst):
            try:
                frame = xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            flag = frame[:1]
            if flag not in (b"\x01", b"\x00"):
                st.rejected += 1
                continue
            ok, pubs = self.route(role, frame[1:])
            if flag == b"\x01":
                st.subscribe_events += 1
                if not ok:
                    self._refused_subscription(role, frame[1:])
                    continue
                st.subscriptions += 1
            else:
                st.unsubscribe_events += 1
                if not ok:
                    continue
                st.subscriptions = max(0, st.subscriptions - 1)
            for xsub in pubs:
                xsub.send(frame)

    def _pump_manual(self, xpub: zmq.Socket, role: int, burst: int) -> None:
        """With CURVE (``XPUB_MANUAL``): every connection's (un)subscription arrives with
        its identity; the broker applies an allowed one to that connection (role rules,
        run membership, the per-identity cap) and forwards a topic upstream when its first
        subscriber arrives and withdraws it when the last one leaves (the book)."""
        st = self.stats
        book = self._book
        assert book is not None and self.policy is not None
        members = self._members
        for _ in range(burst):
            try:
                fr = xpub.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            data = fr.bytes
            flag = data[:1]
            if flag not in (b"\x01", b"\x00"):
                st.rejected += 1
                continue
            body = data[1:]
            try:
                uid: str | None = fr.get("User-Id")
            except zmq.ZMQError:  # libzmq's unsubscription for a closed connection
                uid = None
            ok, pubs = self.route(role, body)
            if flag == b"\x01":
                st.subscribe_events += 1
                if not ok:
                    book.refuse(role, body)
                    self._refused_subscription(role, body)
                    continue
                if uid is None:  # a subscription always comes from a connection
                    book.refuse(role, body)
                    st.rejected += 1
                    continue
                if members is not None:
                    exact = body.endswith(b"\0")
                    text = (body[:-1] if exact else body).decode("utf-8", "replace")
                    if not members.may_read(uid, text, exact):
                        book.refuse(role, body)
                        self._refused_reader(st.not_member_reads, uid, body, "not_member")
                        continue
                verdict = book.subscribe(role, uid, body)
                if verdict == CAPPED:
                    self._refused_reader(st.capped, uid, body, "capped")
                    continue
                xpub.setsockopt(zmq.SUBSCRIBE, body)  # for the connection that asked
                if verdict != FIRST:
                    continue
                st.subscriptions += 1
            else:
                st.unsubscribe_events += 1
                verdict = book.unsubscribe(role, uid, body)
                if verdict == UNKNOWN:
                    continue
                # a live connection's unsubscribe; after a disconnect libzmq has removed
                # the connection itself and this applies to nobody
                xpub.setsockopt(zmq.UNSUBSCRIBE, body)
                if verdict != LAST:
                    continue
                st.subscriptions = max(0, st.subscriptions - 1)
            for xsub in pubs:
                xsub.send(data)

    def _refused_subscription(self, role: int, body: bytes) -> None:
        assert self.policy is not None
        st = self.stats
        name = self.policy.roles[role].name
        n = st.refused_subscriptions[name] = st.refused_subscriptions.get(name, 0) + 1
        if n == 1 or n % 1000 == 0:
            log.warning("broker.subscription_refused", role=name,
                        topic=body[:80].decode("utf-8", "replace").rstrip("\0"), refused=n)

    def _refused_reader(self, counts: dict[str, int], identity: str, body: bytes,
                        why: str) -> None:
        n = counts[identity] = counts.get(identity, 0) + 1
        if n == 1 or n % 1000 == 0:
            log.warning(f"broker.subscription_{why}", identity=identity,
                        topic=body[:80].decode("utf-8", "replace").rstrip("\0"), refused=n)


__all__ = ["SubscriptionForwarder"]
