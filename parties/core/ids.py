"""Who takes part in a run: the party ids (``active``, ``passive``, ``passive2`` ...), a
party id's role, and the run id every topic carries.

Owns: :data:`MAX_PASSIVE_PARTIES`, :func:`passive_party_ids`, :func:`role_of`,
:func:`check_run_id`. May import :mod:`pubsub.config` only.
"""

from __future__ import annotations

import re

from pubsub.config import ConfigError

#: at most this many passive parties (the paper's Table 10: 2 to 10 parties in all)
MAX_PASSIVE_PARTIES = 9
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def passive_party_ids(n: int) -> tuple[str, ...]:
    """The ids of ``n`` passive parties: ``passive``, ``passive2``, …, ``passive<n>``."""
    return tuple("passive" if k == 1 else f"passive{k}" for k in range(1, n + 1))


def role_of(party: str) -> str:
    """A party id's role: ``"active"`` or ``"passive"``.

    Raises:
        ValueError: not a party id (``active``, ``passive``, ``passive2`` … ``passive9``).
    """
    if party == "active":
        return "active"
    if party in passive_party_ids(MAX_PASSIVE_PARTIES):
        return "passive"
    raise ValueError(f"not a party id: {party!r} (active, passive, passive2 .. "
                     f"passive{MAX_PASSIVE_PARTIES})")


def check_run_id(run_id: str) -> str:
    """Validate a run id (1-64 of ``[A-Za-z0-9_-]``; it becomes a topic segment).

    Raises:
        ConfigError: invalid run id.
    """
    if not _RUN_ID.match(run_id):
        raise ConfigError("run_id", f"must match [A-Za-z0-9_-]{{1,64}}, got {run_id!r}")
    return run_id


__all__ = ["MAX_PASSIVE_PARTIES", "check_run_id", "passive_party_ids", "role_of"]
