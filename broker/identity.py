"""Who sent a message, checked per message with CURVE (pure; no socket).

libzmq attaches the ZAP User-Id (the sender's identity name) to every message that
arrives on an authenticated connection. Two checks use it:

- **Publisher binding.** A bus client's publisher id (in every envelope, used by
  subscribers to tell senders apart: :meth:`pubsub.client.Bus.accept_only`) is
  ``<identity>/<client id>`` with CURVE. A message whose publisher id does not start
  with the connection's own identity is a forgery (another key claiming a partner's
  publisher id) and is dropped: ``spoofed``.
- **Run membership** (:mod:`pubsub.membership`, optional): a message on a run's topic
  from an identity the run does not list is dropped: ``not_member``.

Both are counted per identity by the broker (:class:`broker.proxy.BrokerStats`).
"""

from __future__ import annotations

from pubsub.membership import RunMembership

_MAX_CACHE = 1 << 16

SPOOFED = "spoofed"
NOT_MEMBER = "not_member"


class SenderCheck:
    """Per-message identity checks with bounded caches.

    Args:
        members: the run membership, or None (any identity of the right role may publish
            in any run; the role policy still applies).
    """

    def __init__(self, members: RunMembership | None = None) -> None:
        self.members = members
        self._prefix: dict[str, bytes] = {}
        self._allowed: dict[tuple[str, bytes], bool] = {}

    def check(self, identity: str, publisher: bytes, topic: bytes) -> str | None:
        """None if ``identity`` may send this envelope, else :data:`SPOOFED` or
        :data:`NOT_MEMBER`."""
        prefix = self._prefix.get(identity)
        if prefix is None:
            if len(self._prefix) >= _MAX_CACHE:
                self._prefix.clear()
            prefix = self._prefix[identity] = identity.encode() + b"/"
        if not publisher.startswith(prefix):
            return SPOOFED
        members = self.members
        if members is None:
            return None
        key = (identity, topic)
        ok = self._allowed.get(key)
        if ok is None:
            if len(self._allowed) >= _MAX_CACHE:
                self._allowed.clear()
            ok = self._allowed[key] = members.allows(identity, topic.decode("utf-8", "replace"))
        return None if ok else NOT_MEMBER

