"""Run membership: which identities belong to which runs (pure).

The role policy (:mod:`pubsub.policy`) says what a *role* may publish and read; a run
membership says which *identities* (CURVE keys, by name) take part in which run. With a
membership the broker forwards a message on a run's topic (the second topic segment,
``emb/<run>/<batch>``) only if the sender's identity is a member of that run, and accepts
a subscription only within one run the subscriber is a member of (a prefix that spans
runs, such as ``emb/``, is refused); a run the membership does not list has no members (never first come, first served: an identity
cannot claim a run by publishing in it first). Infrastructure topics (a class starting
with ``_``: ``_bus/...``, ``_probe/...``) belong to no run.

The file is TOML, written by the keys' owner or by the launcher::

    [runs.r1]
    identities = ["active", "passive"]

Unknown keys are refused (:class:`~pubsub.config.ConfigError`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsub.config import ConfigError
from pubsub.errors import KeyFileError
from pubsub.security import check_name


def topic_run(topic: str) -> str | None:
    """The run a topic belongs to (its second segment), or None for an infrastructure
    topic (class starting with ``_``) or a topic of one segment."""
    cls, sep, rest = topic.partition("/")
    if not sep or cls.startswith("_"):
        return None
    return rest.partition("/")[0]


def subscription_run(text: str, exact: bool) -> tuple[bool, str | None]:
    """Which run a subscription can match: ``(scoped, run)``. ``scoped`` is False when a
    prefix can match topics of several runs (``emb/``, ``emb/r``, the empty prefix);
    ``run`` is None for infrastructure topics (class starting with ``_``)."""
    if exact:
        return True, topic_run(text)
    cls, sep, rest = text.partition("/")
    if cls.startswith("_"):
        return True, None
    if not sep:
        return False, None
    run, sep2, _ = rest.partition("/")
    return (True, run) if sep2 else (False, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMembership:
    """Members of each run.

    Attributes:
        runs: run id -> identity names that may publish in it.
    """

    runs: Mapping[str, frozenset[str]]

    def allows(self, identity: str, topic: str) -> bool:
        """May ``identity`` publish ``topic``? True for infrastructure topics; for a run's
        topic, only if the run lists ``identity``."""
        run = topic_run(topic)
        if run is None:
            return True
        members = self.runs.get(run)
        return members is not None and identity in members

    def may_read(self, identity: str, text: str, exact: bool) -> bool:
        """May ``identity`` hold this subscription (an exact topic, or a prefix)? Only
        within one run it is a member of, or on infrastructure topics; a prefix that spans
        runs is refused."""
        scoped, run = subscription_run(text, exact)
        if not scoped:
            return False
        if run is None:
            return True
        members = self.runs.get(run)
        return members is not None and identity in members

    def as_toml(self) -> str:
        """The TOML text :func:`load_membership` reads back."""
        lines = []
        for run, ids in sorted(self.runs.items()):
            lines.append(f"[runs.{_quote(run)}]")
            lines.append("identities = [" + ", ".join(_quote(i) for i in sorted(ids)) + "]")
            lines.append("")
        return "\n".join(lines)


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def membership(runs: Mapping[str, Iterable[str]]) -> RunMembership:
    """Build and check a membership (run ids non-empty, without ``/``; identity names
    as :func:`pubsub.security.check_name` requires).

    Raises:
        ConfigError: naming the offending run or identity.
    """
    out: dict[str, frozenset[str]] = {}
    for run, ids in runs.items():
        if not isinstance(run, str) or not run or "/" in run or "\0" in run:
            raise ConfigError("members", f"run id {run!r} must be non-empty, without '/'")
        if isinstance(ids, str) or not isinstance(ids, Iterable):
            raise ConfigError("members", f"run {run!r}: identities must be a list of names")
        names = list(ids)
        for name in names:
            try:
                check_name(name)
            except KeyFileError:
                raise ConfigError("members", f"run {run!r}: identity {name!r} is not a "
                                  "key name (1-64 of A-Z a-z 0-9 _ . -)") from None
        out[run] = frozenset(names)
    return RunMembership(runs=out)


def load_membership(path: str | Path) -> RunMembership:
    """Read a membership file (see the module docstring).

    Raises:
        ConfigError: unreadable, not TOML, unknown keys, or bad names.
    """
    p = Path(path)
    try:
        doc: dict[str, Any] = tomllib.loads(p.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("members", f"{p}: {exc}") from None
    unknown = set(doc) - {"runs"}
    if unknown:
        raise ConfigError("members", f"{p}: unknown keys {sorted(unknown)} (allowed: runs)")
    runs = doc.get("runs", {})
    if not isinstance(runs, dict):
        raise ConfigError("members", f"{p}: runs must be a table of [runs.<id>] tables")
    table: dict[str, Iterable[str]] = {}
    for run, body in runs.items():
        if not isinstance(body, dict) or set(body) != {"identities"}:
            raise ConfigError("members", f"{p}: [runs.{run}] must hold exactly "
                              "identities = [...]")
        table[run] = body["identities"]
    return membership(table)
