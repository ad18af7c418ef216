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
    identities = ["active", "passive", "passive2"]
    owned = ["passive", "passive2"]        # optional

``owned`` (a subset of the run's identities) isolates those members from one another: a
run's topic with a segment after the run naming an owned member (the first such
segment; ``emb/r1/passive2/7``, ``grad/r1/passive2/7``, ``ctl/r1/hb/passive2``) belongs
to that member, and no *other owned* member may publish or read it; members that are
not owned (the active party of a VFL run) may, as the role policy allows. So each of
several passive parties publishes only its own embeddings and reads only its own
gradients. An owned member may hold a prefix subscription in the run only within its
own topics (a prefix with its own name as a whole segment after the run).

Unknown keys are refused (:class:`~pubsub.config.ConfigError`).

A run's *family* (:func:`run_family`) is the run and its derived exchanges, the run ids
``<run>-align``, ``<run>-predict`` and ``<run>-predict-align`` (its ID alignment and its
predictions); a membership given inline (:func:`parse_run_item`, ``psfl broker run
--run r1=active,passive``) admits its names to the whole family.

The broker tells each client, in its hello, the part of the membership that concerns it
(:meth:`RunMembership.view`: the runs it is a member of, with their members), so the
client refuses by name, before the broker would silently, a topic of a run it is not a
member of (:class:`~pubsub.errors.NotRunMember`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pubsub.config import ConfigError
from pubsub.errors import KeyFileError
from pubsub.security import check_name


#: the suffixes of a run's derived exchanges (its ID alignment and its predictions)
DERIVED_SUFFIXES: tuple[str, ...] = ("-align", "-predict", "-predict-align")


def run_family(run: str) -> tuple[str, ...]:
    """The run and its derived exchanges' run ids (:data:`DERIVED_SUFFIXES`)."""
    return (run, *(run + s for s in DERIVED_SUFFIXES))


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
        owned: run id -> its owned members (see the module docstring); absent: none.
    """

    runs: Mapping[str, frozenset[str]]
    owned: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def owner(self, topic: str) -> str | None:
        """The owned member a run's topic belongs to (the first segment after the run
        that names one), or None."""
        run = topic_run(topic)
        owned = self.owned.get(run) if run is not None else None
        if not owned:
            return None
        for seg in topic.split("/")[2:]:
            if seg in owned:
                return seg
        return None

    def allows(self, identity: str, topic: str) -> bool:
        """May ``identity`` publish ``topic``? True for infrastructure topics; for a run's
        topic, only if the run lists ``identity`` and the topic belongs to no other
        owned member when ``identity`` is owned."""
        run = topic_run(topic)
        if run is None:
            return True
        members = self.runs.get(run)
        if members is None or identity not in members:
            return False
        return self._not_anothers(identity, run, topic)

    def _not_anothers(self, identity: str, run: str, topic: str) -> bool:
        owned = self.owned.get(run)
        if not owned or identity not in owned:
            return True
        owner = self.owner(topic)
        return owner is None or owner == identity

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
        if members is None or identity not in members:
            return False
        if exact:
            return self._not_anothers(identity, run, text)
        owned = self.owned.get(run)
        if not owned or identity not in owned:
            return True
        # a prefix: only within the identity's own topics (its name a whole segment)
        full = text.split("/")[2:-1]
        first = next((seg for seg in full if seg in owned), None)
        return first == identity

    def view(self, identity: str) -> RunMembership:
        """The part of the membership that concerns ``identity``: the runs it is a member
        of, with their members and owned members (what the broker's hello tells it)."""
        runs = {r: ids for r, ids in self.runs.items() if identity in ids}
        return RunMembership(runs=runs,
                             owned={r: o for r, o in self.owned.items() if r in runs})

    def as_dict(self) -> dict[str, dict[str, list[str]]]:
        """JSON-ready: run id -> ``{"identities": [...], "owned": [...]}``
        (:func:`membership_from_dict` reads it back)."""
        return {r: {"identities": sorted(ids), "owned": sorted(self.owned.get(r, ()))}
                for r, ids in sorted(self.runs.items())}

    def as_toml(self) -> str:
        """The TOML text :func:`load_membership` reads back."""
        lines = []
        for run, ids in sorted(self.runs.items()):
            lines.append(f"[runs.{_quote(run)}]")
            lines.append("identities = [" + ", ".join(_quote(i) for i in sorted(ids)) + "]")
            if self.owned.get(run):
                lines.append("owned = [" + ", ".join(_quote(i) for i in
                                                     sorted(self.owned[run])) + "]")
            lines.append("")
        return "\n".join(lines)


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def membership(runs: Mapping[str, Iterable[str]],
               owned: Mapping[str, Iterable[str]] | None = None) -> RunMembership:
    """Build and check a membership (run ids non-empty, without ``/``; identity names
    as :func:`pubsub.security.check_name` requires; ``owned``: per run, members isolated
    from one another, see the module docstring).

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
    iso: dict[str, frozenset[str]] = {}
    for run, ids in (owned or {}).items():
        if run not in out:
            raise ConfigError("members", f"owned identities of run {run!r}, which is not "
                              "a run of the membership")
        if isinstance(ids, str) or not isinstance(ids, Iterable):
            raise ConfigError("members", f"run {run!r}: owned must be a list of names")
        names = list(ids)
        stray = [n for n in names if n not in out[run]]
        if stray:
            raise ConfigError("members", f"run {run!r}: owned identity {stray[0]!r} is not "
                              "one of its identities")
        if names:
            iso[run] = frozenset(names)
    return RunMembership(runs=out, owned=iso)


def membership_from_dict(doc: Any) -> RunMembership:
    """Read :meth:`RunMembership.as_dict`'s form back (a broker's hello).

    Raises:
        ConfigError: not that form, or bad names.
    """
    if not isinstance(doc, dict):
        raise ConfigError("members", f"expected a table of runs, got {type(doc).__name__}")
    runs: dict[str, Iterable[str]] = {}
    owned: dict[str, Iterable[str]] = {}
    for run, body in doc.items():
        if not isinstance(body, dict) or not set(body) <= {"identities", "owned"}:
            raise ConfigError("members", f"run {run!r}: expected identities and owned")
        runs[run] = body.get("identities", [])
        owned[run] = body.get("owned", [])
    return membership(runs, owned)


def parse_run_item(item: str) -> tuple[str, list[str]]:
    """One inline membership, ``RUN=NAME,NAME,...`` (``psfl broker run --run``): the run id
    and its identities.

    Raises:
        ConfigError: no ``=``, an empty run id or no names.
    """
    run, sep, names = item.partition("=")
    ids = [n.strip() for n in names.split(",") if n.strip()]
    if not sep or not run.strip() or not ids:
        raise ConfigError("run", f"{item!r}: expected RUN=NAME,NAME,... (the run's "
                          "identities, e.g. r1=active,passive)")
    return run.strip(), ids


def inline_membership(items: Iterable[str], *,
                      owned: Mapping[str, Iterable[str]] | None = None) -> RunMembership:
    """The membership of ``--run`` items (:func:`parse_run_item`): each admits its names
    to its run's family (:func:`run_family`). ``owned`` (run -> names; default none)
    makes those members of the run's family own their topics (see the module docstring;
    several passive parties of a VFL run).

    Raises:
        ConfigError: a malformed item, a run given twice, or bad names.
    """
    runs: dict[str, list[str]] = {}
    iso: dict[str, list[str]] = {}
    for item in items:
        run, ids = parse_run_item(item)
        for r in run_family(run):
            if r in runs:
                raise ConfigError("run", f"run {r!r} given twice")
            runs[r] = ids
            if owned and owned.get(run):
                iso[r] = list(owned[run])
    return membership(runs, iso)


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
    owned: dict[str, Iterable[str]] = {}
    for run, body in runs.items():
        if (not isinstance(body, dict) or "identities" not in body
                or not set(body) <= {"identities", "owned"}):
            raise ConfigError("members", f"{p}: [runs.{run}] must hold identities = [...] "
                              "(and optionally owned = [...])")
        table[run] = body["identities"]
        if "owned" in body:
            owned[run] = body["owned"]
    return membership(table, owned)
