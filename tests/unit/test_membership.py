"""Run membership and the broker's per-message sender check (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.identity import NOT_MEMBER, SPOOFED, SenderCheck
from pubsub.config import ConfigError
from pubsub.membership import (
    RunMembership,
    inline_membership,
    load_membership,
    membership,
    membership_from_dict,
    parse_run_item,
    run_family,
    topic_run,
)
from pubsub.security import publisher_id

NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
RUNS = st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True)


def test_topic_run_is_the_second_segment_except_for_infrastructure() -> None:
    assert topic_run("emb/r1/5") == "r1"
    assert topic_run("ctl/r1/hello/active") == "r1"
    assert topic_run("_bus/probe/x") is None
    assert topic_run("_broker/stats") is None
    assert topic_run("lonely") is None


@given(st.dictionaries(RUNS, st.lists(NAMES, max_size=4), max_size=4))
def test_membership_round_trips_through_its_toml(tmp_path_factory: pytest.TempPathFactory,
                                                 runs: dict[str, list[str]]) -> None:
    m = membership(runs)
    p = tmp_path_factory.mktemp("m") / "members.toml"
    p.write_text(m.as_toml())
    assert load_membership(p) == m


@pytest.mark.parametrize("text, what", [
    ('[runs.r1]\nidentities = ["a"]\nextra = 1\n', "must hold identities"),
    ('[runz.r1]\nidentities = ["a"]\n', "unknown keys"),
    ('[runs.r1]\nidentities = ["-bad"]\n', "'-bad'"),
    ('[runs.r1]\nidentities = "a"\n', "list"),
    ('[runs.r1\n', "members.toml"),
])
def test_a_bad_membership_file_is_refused_naming_the_problem(tmp_path: Path, text: str,
                                                            what: str) -> None:
    p = tmp_path / "members.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=what):
        load_membership(p)


@given(NAMES, NAMES, st.text(max_size=20))
def test_a_publisher_id_passes_only_for_its_own_identity(me: str, other: str,
                                                         client: str) -> None:
    check = SenderCheck()
    pub = publisher_id(me, client).encode()
    assert check.check(me, pub, b"emb/r/1") is None
    if other != me and not me.startswith(other + "/"):
        assert check.check(other, pub, b"emb/r/1") == SPOOFED


def test_membership_is_never_first_come_first_served() -> None:
    check = SenderCheck(RunMembership(runs={"r1": frozenset({"a", "p"})}))
    assert check.check("a", b"a/c1", b"grad/r1/0") is None
    assert check.check("m", b"m/c2", b"emb/r1/0") == NOT_MEMBER
    # an unlisted run has no members, whoever publishes in it first
    assert check.check("a", b"a/c1", b"grad/r2/0") == NOT_MEMBER
    assert check.check("m", b"m/c2", b"_bus/probe/m") is None


def test_subscription_scope_follows_the_run_segment() -> None:
    from pubsub.membership import subscription_run

    assert subscription_run("emb/r1/3", True) == (True, "r1")
    assert subscription_run("ff/r1/all/", False) == (True, "r1")
    assert subscription_run("_bus/", False) == (True, None)
    for spans in ("", "emb/", "emb/r", "e"):
        assert subscription_run(spans, False) == (False, None)
    m = RunMembership(runs={"r1": frozenset({"a"})})
    assert m.may_read("a", "grad/r1/", False) and not m.may_read("b", "grad/r1/", False)
    assert not m.may_read("a", "grad/", False)  # spans runs
    assert m.may_read("b", "_broker/stats", True)


OPS = st.lists(st.tuples(st.sampled_from(["sub", "unsub", "refuse"]), st.integers(0, 1),
                         st.sampled_from(["a", "b", None]),
                         st.sampled_from([b"t1", b"t2", b"t3"])), max_size=80)


@given(OPS, st.integers(0, 4))
def test_the_subscription_book_matches_a_reference_count_model(
        ops: list[tuple[str, int, str | None, bytes]], cap: int) -> None:
    """Upstream sees a topic exactly while someone holds it; no identity holds more than
    the cap; a closed connection's release (no identity) takes a refused request first,
    so a refused subscriber leaving never withdraws a topic another identity holds."""
    from broker.subscriptions import CAPPED, FIRST, LAST, LESS, MORE, UNKNOWN
    from broker.subscriptions import SubscriptionBook

    book = SubscriptionBook(cap)
    held: dict[tuple[int, bytes], dict[str, int]] = {}
    refused: dict[tuple[int, bytes], int] = {}
    for op, ep, who, topic in ops:
        key = (ep, topic)
        if op == "refuse":
            book.refuse(ep, topic)
            refused[key] = refused.get(key, 0) + 1
        elif op == "sub":
            who = who or "a"
            total = sum(h.get(who, 0) for h in held.values())
            v = book.subscribe(ep, who, topic)
            if cap and total >= cap:
                assert v == CAPPED
                refused[key] = refused.get(key, 0) + 1
                continue
            assert v == (FIRST if not held.get(key) else MORE)
            held.setdefault(key, {})[who] = held.get(key, {}).get(who, 0) + 1
        else:
            v = book.unsubscribe(ep, who, topic)
            holders = held.get(key, {})
            if who is None and refused.get(key):
                refused[key] -= 1
                assert v == UNKNOWN
                continue
            if not holders or (who is not None and not holders.get(who)):
                if refused.get(key):
                    refused[key] -= 1
                assert v == UNKNOWN
                continue
            name = who if who is not None else next(iter(holders))
            holders[name] -= 1
            if not holders[name]:
                del holders[name]
            assert v == (LESS if holders else LAST)
            if not holders:
                del held[key]
        assert book.topics == len(held)
        assert book.refused == sum(refused.values())
        for name in ("a", "b"):
            assert book.held_by(name) == sum(h.get(name, 0) for h in held.values())
            if cap:
                assert book.held_by(name) <= cap


def test_a_refused_subscriber_that_leaves_keeps_the_holders_topic() -> None:
    """The failure this order prevents: a non-member asks for a member's channel (refused),
    then disconnects; libzmq's release for it (no identity) must not withdraw the
    member's subscription upstream."""
    from broker.subscriptions import FIRST, LAST, UNKNOWN, SubscriptionBook

    book = SubscriptionBook(0)
    assert book.subscribe(0, "active", b"emb/r/1\0") == FIRST
    book.refuse(0, b"emb/r/1\0")  # the replayer's request
    assert book.unsubscribe(0, None, b"emb/r/1\0") == UNKNOWN  # the replayer left
    assert book.topics == 1 and book.held_by("active") == 1
    assert book.unsubscribe(0, None, b"emb/r/1\0") == LAST  # then the member left


def test_owned_members_are_isolated_from_one_another() -> None:
    from pubsub.membership import membership

    m = membership({"r": ["active", "passive", "passive2"]}, {"r": ["passive", "passive2"]})
    # each passive party publishes its own channels, reads its own gradients
    assert m.allows("passive", "emb/r/passive/3") and not m.allows("passive", "emb/r/passive2/3")
    assert m.may_read("passive2", "grad/r/passive2/3", True)
    assert not m.may_read("passive", "grad/r/passive2/3", True)
    # the active party (not owned) publishes to and reads from every one
    assert m.allows("active", "grad/r/passive2/3") and m.may_read("active", "emb/r/passive2/3", True)
    # topics naming no owned member: as before
    assert m.allows("passive", "ctl/r/done") and m.allows("passive2", "emb/r/3")
    # prefixes: only within the member's own topics
    assert m.may_read("passive", "grad/r/passive/", False)
    assert not m.may_read("passive", "grad/r/", False)
    assert not m.may_read("passive", "grad/r/passive2/", False)
    assert m.may_read("active", "emb/r/", False)
    assert m.owner("ctl/r/hb/passive2") == "passive2" and m.owner("ctl/r/done") is None


def test_owned_identities_must_be_members_and_survive_the_file(tmp_path) -> None:
    import pytest

    from pubsub.config import ConfigError
    from pubsub.membership import load_membership, membership

    with pytest.raises(ConfigError, match="'ghost' is not one of its identities"):
        membership({"r": ["active"]}, {"r": ["ghost"]})
    with pytest.raises(ConfigError, match="not a run"):
        membership({"r": ["active"]}, {"q": ["active"]})
    m = membership({"r": ["a", "p", "q"]}, {"r": ["p", "q"]})
    path = tmp_path / "m.toml"
    path.write_text(m.as_toml())
    assert load_membership(path) == m
    path.write_text('[runs.r]\nidentities = ["a"]\nextra = 1\n')
    with pytest.raises(ConfigError, match="identities"):
        load_membership(path)


SEGS = st.sampled_from(["emb", "grad", "ctl", "psi", "_bus"])


@given(st.dictionaries(RUNS, st.lists(NAMES, min_size=1, max_size=4), min_size=1, max_size=4),
       st.data())
def test_an_identitys_view_decides_as_the_whole_membership(
        runs: dict[str, list[str]], data: st.DataObject) -> None:
    """What the hello tells a client (its view) decides its own reads and publishes
    exactly as the broker's whole membership does, for any topic and prefix, and the
    view survives its JSON form."""
    owned = {r: ids[1:] for r, ids in runs.items() if len(ids) > 2}
    m = membership(runs, owned)
    ids = sorted({i for v in runs.values() for i in v} | {"stranger"})
    who = data.draw(st.sampled_from(ids))
    run = data.draw(st.sampled_from(sorted(runs) + ["other"]))
    tail = data.draw(st.lists(st.sampled_from(ids + ["7", "hb"]), max_size=3))
    topic = "/".join([data.draw(SEGS), run, *tail])
    view = m.view(who)
    assert membership_from_dict(view.as_dict()) == view
    assert view.allows(who, topic) == m.allows(who, topic)
    for text, exact in ((topic, True), (topic + "/", False), (topic.split("/")[0] + "/", False)):
        assert view.may_read(who, text, exact) == m.may_read(who, text, exact)
    assert all(who in v for v in view.runs.values())


def test_an_inline_run_admits_its_names_to_its_family() -> None:
    m = inline_membership(["r1=active,passive", "r2 = a , b"])
    assert run_family("r1") == ("r1", "r1-align", "r1-predict", "r1-predict-align")
    for r in run_family("r1"):
        assert m.runs[r] == {"active", "passive"}
    assert m.runs["r2"] == {"a", "b"} and not m.owned
    owned = inline_membership(["j=active,passive,passive2"],
                              owned={"j": ["passive", "passive2"]})
    assert owned.owned["j-align"] == {"passive", "passive2"}


@pytest.mark.parametrize("item, what", [
    ("r1", "RUN=NAME"), ("=a,b", "RUN=NAME"), ("r1=", "RUN=NAME"), ("r1=,", "RUN=NAME"),
    ("r/1=a", "without '/'"), ("r1=-x", "'-x'"),
])
def test_a_bad_inline_run_is_refused_naming_it(item: str, what: str) -> None:
    with pytest.raises(ConfigError, match=what):
        inline_membership([item])
    assert parse_run_item("r1=a,b") == ("r1", ["a", "b"])


def test_a_run_given_twice_inline_is_refused() -> None:
    with pytest.raises(ConfigError, match="'r1-align' given twice"):
        inline_membership(["r1=a,b", "r1-align=a,b"])
