"""Topic permissions per role: who may publish and who may read which topics (pure).

A policy names roles; each role has ``publish`` and ``subscribe`` topic patterns.
Patterns are matched segment by segment (segments split on ``/``): ``*`` matches
exactly one segment, a final ``**`` matches any remaining segments (zero or more),
anything else matches itself. ``emb/**`` covers every ``emb/<run>/<batch>``;
``ctl/*/hello/active`` covers the active party's hello in any run.

The broker (``broker.proxy``) enforces a policy on authenticated connections: each
role connects to its own pair of endpoints, a message from a role that may not publish
its topic is dropped and counted, and a role's endpoint forwards only the topics the
role may read. Clients receive their role's rules in the hello reply and refuse a
forbidden subscription locally with :class:`~pubsub.errors.ForbiddenTopic`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pubsub.config import ConfigError

_ALLOWED_KEYS = {"publish", "subscribe"}


@lru_cache(maxsize=4096)
def _split(pattern: str) -> tuple[tuple[str, ...], bool]:
    segs = pattern.split("/")
    rest = segs[-1] == "**"
    return tuple(segs[:-1] if rest else segs), rest


def check_pattern(pattern: str) -> str:
    """A valid pattern: non-empty, ``**`` only as the whole last segment.

    Raises:
        ConfigError: naming the pattern.
    """
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("policy", f"empty or non-string pattern {pattern!r}")
    segs = pattern.split("/")
    for i, s in enumerate(segs):
        if "**" in s and (s != "**" or i != len(segs) - 1):
            raise ConfigError("policy", f"pattern {pattern!r}: '**' may only be the whole "
                              "last segment")
        if "*" in s and s not in ("*", "**"):
            raise ConfigError("policy", f"pattern {pattern!r}: '*' must be a whole segment")
    return pattern


def topic_matches(pattern: str, topic: str) -> bool:
    """Does ``topic`` match ``pattern`` (see the module docstring)? Pure."""
    fixed, rest = _split(pattern)
    segs = topic.split("/")
    if len(segs) < len(fixed) or (not rest and len(segs) != len(fixed)):
        return False
    return all(p == "*" or p == s for p, s in zip(fixed, segs, strict=False))


def prefix_may_match(pattern: str, prefix: str) -> bool:
    """Could some topic that starts with ``prefix`` match ``pattern``? Pure.

    Used for prefix subscriptions: ``ff/r1/`` may match ``ff/*/all/**``; ``grad/`` cannot
    match ``emb/**``. The empty prefix (subscribe to everything) may match any pattern.
    """
    fixed, rest = _split(pattern)
    segs = prefix.split("/")
    full, partial = segs[:-1], segs[-1]
    for i, s in enumerate(full):
        if i >= len(fixed):
            return rest
        if fixed[i] != "*" and fixed[i] != s:
            return False
    k = len(full)
    if k >= len(fixed):
        return rest  # the prefix reaches past the pattern's last fixed segment
    return fixed[k] == "*" or fixed[k].startswith(partial)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleRules:
    """The topic patterns one role may publish and read.

    Attributes:
        name: the role (``active``, ``passive``, ``coordinator`` ...).
        publish: patterns of topics the role may publish.
        subscribe: patterns of topics the role may read.
    """

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def __post_init__(self) -> None:
        for p in (*self.publish, *self.subscribe):
            check_pattern(p)

    def may_publish(self, topic: str) -> bool:
        """True if some ``publish`` pattern matches ``topic``."""
        return any(topic_matches(p, topic) for p in self.publish)

    def may_read(self, topic: str) -> bool:
        """True if some ``subscribe`` pattern matches ``topic``."""
        return any(topic_matches(p, topic) for p in self.subscribe)

    def may_subscribe_prefix(self, prefix: str) -> bool:
        """True if some topic under ``prefix`` is readable by this role."""
        return any(prefix_may_match(p, prefix) for p in self.subscribe)

    def may_publish_prefix(self, prefix: str) -> bool:
        """True if some topic under ``prefix`` may be published by this role."""
        return any(prefix_may_match(p, prefix) for p in self.publish)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (as sent in the broker's hello reply)."""
        return {"publish": list(self.publish), "subscribe": list(self.subscribe)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """An ordered set of roles (the order fixes each role's broker ports).

    Attributes:
        roles: the roles, names unique.
    """

    roles: tuple[RoleRules, ...]

    def __post_init__(self) -> None:
        names = [r.name for r in self.roles]
        if not names:
            raise ConfigError("policy", "no roles")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError("policy", f"role {sorted(dup)[0]!r} appears twice")

    @property
    def names(self) -> tuple[str, ...]:
        """Role names in order."""
        return tuple(r.name for r in self.roles)

    def index(self, role: str) -> int:
        """Position of ``role``.

        Raises:
            ConfigError: unknown role (naming it and the known ones).
        """
        for i, r in enumerate(self.roles):
            if r.name == role:
                return i
        raise ConfigError("role", f"unknown role {role!r} (policy roles: {', '.join(self.names)})")

    def rules(self, role: str) -> RoleRules:
        """The rules of ``role`` (raises ConfigError if unknown)."""
        return self.roles[self.index(role)]

    def publish_mask(self, topic: str) -> int:
        """Bit i set when role i may publish ``topic``."""
        return sum(1 << i for i, r in enumerate(self.roles) if r.may_publish(topic))

    def read_mask(self, topic: str) -> int:
        """Bit i set when role i may read ``topic``."""
        return sum(1 << i for i, r in enumerate(self.roles) if r.may_read(topic))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "policy") -> Policy:
        """Build from ``{"roles": {NAME: {"publish": [...], "subscribe": [...]}}}``.

        Raises:
            ConfigError: unknown keys, wrong types, bad patterns or duplicate roles.
        """
        unknown = set(data) - {"roles"}
        if unknown:
            raise ConfigError(f"{source}.{sorted(unknown)[0]}", "unknown key (expected [roles.NAME])")
        roles = data.get("roles")
        if not isinstance(roles, Mapping) or not roles:
            raise ConfigError(source, "expected [roles.NAME] tables")
        out = []
        for name, table in roles.items():
            if not isinstance(table, Mapping):
                raise ConfigError(f"{source}.roles.{name}", "expected a table")
            bad = set(table) - _ALLOWED_KEYS
            if bad:
                raise ConfigError(f"{source}.roles.{name}.{sorted(bad)[0]}",
                                  "unknown key (known: publish, subscribe)")
            lists = {}
            for k in ("publish", "subscribe"):
                v = table.get(k, [])
                if not isinstance(v, Sequence) or isinstance(v, str) or not all(
                        isinstance(x, str) for x in v):
                    raise ConfigError(f"{source}.roles.{name}.{k}", f"expected a list of "
                                      f"patterns, got {v!r}")
                lists[k] = tuple(v)
            out.append(RoleRules(name=str(name), **lists))
        return cls(roles=tuple(out))


def load_policy(path: str | Path) -> Policy:
    """Read a policy TOML file (``[roles.NAME] publish = [...] subscribe = [...]``).

    Raises:
        ConfigError: missing file, invalid TOML or an invalid policy.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("", f"policy file {str(p)!r} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{str(p)!r} is not valid TOML: {exc}") from None
    return Policy.from_mapping(data, source=p.name)
