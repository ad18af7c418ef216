"""Topic policy patterns (pure): matching, prefix reachability, the default roles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.proxy import DEFAULT_POLICY_FILE
from pubsub.config import ConfigError
from pubsub.policy import Policy, RoleRules, load_policy, prefix_may_match, topic_matches

SEG = st.sampled_from(["emb", "grad", "ctl", "r1", "r2", "7", "all", "to", "root", ""])


@pytest.mark.parametrize(("pattern", "topic", "ok"), [
    ("emb/**", "emb/r1/7", True),
    ("emb/**", "emb", True),
    ("emb/**", "embx/r1", False),
    ("emb/*", "emb/r1", True),
    ("emb/*", "emb/r1/7", False),
    ("ctl/*/hello/active", "ctl/r1/hello/active", True),
    ("ctl/*/hello/active", "ctl/r1/hello/passive", False),
    ("ff/*/all/**", "ff/r1/all/plan", True),
    ("ff/*/all/**", "ff/r1/to/root/hello", False),
    ("**", "anything/at/all", True),
])
def test_topic_matches(pattern: str, topic: str, ok: bool) -> None:
    assert topic_matches(pattern, topic) is ok


@pytest.mark.parametrize(("pattern", "prefix", "ok"), [
    ("emb/**", "", True),
    ("emb/**", "em", True),
    ("emb/**", "emb/", True),
    ("emb/**", "grad/", False),
    ("ff/*/all/**", "ff/r1/", True),
    ("ff/*/all/**", "ff/r1/to/", False),
    ("ctl/*/hello/active", "ctl/r1/hello/act", True),
    ("ctl/*/hello/active", "ctl/r1/hello/active/x", False),
])
def test_prefix_may_match(pattern: str, prefix: str, ok: bool) -> None:
    assert prefix_may_match(pattern, prefix) is ok


@settings(max_examples=300, deadline=None)
@given(pat=st.lists(st.one_of(SEG, st.just("*")), min_size=1, max_size=4),
       rest=st.booleans(), topic=st.lists(SEG, min_size=1, max_size=6))
def test_every_prefix_of_a_matching_topic_may_match(pat: list[str], rest: bool,
                                                    topic: list[str]) -> None:
    """Soundness of subscription checks: if a topic matches, no prefix of it is refused."""
    pattern = "/".join(pat + (["**"] if rest else []))
    t = "/".join(topic)
    if topic_matches(pattern, t):
        for k in range(len(t) + 1):
            assert prefix_may_match(pattern, t[:k]), (pattern, t, t[:k])


@settings(max_examples=300, deadline=None)
@given(pat=st.lists(st.one_of(SEG, st.just("*")), min_size=1, max_size=4),
       rest=st.booleans(), prefix=st.lists(SEG, min_size=1, max_size=5),
       tail=st.lists(SEG, max_size=4))
def test_a_refused_prefix_covers_no_matching_topic(pat: list[str], rest: bool,
                                                   prefix: list[str], tail: list[str]) -> None:
    """Completeness the other way: when a prefix is refused, no topic under it matches."""
    pattern = "/".join(pat + (["**"] if rest else []))
    p = "/".join(prefix)
    if not prefix_may_match(pattern, p):
        for extra in ("", "/" + "/".join(tail), "x/" + "/".join(tail)):
            assert not topic_matches(pattern, p + extra)


def test_default_policy_separates_the_vfl_parties() -> None:
    pol = load_policy(DEFAULT_POLICY_FILE)
    act, pas = pol.rules("active"), pol.rules("passive")
    assert pas.may_publish("emb/run1/3") and not act.may_publish("emb/run1/3")
    assert act.may_publish("grad/run1/3") and not pas.may_publish("grad/run1/3")
    assert not act.may_read("grad/run1/3") and not pas.may_read("emb/run1/3")
    assert act.may_publish("ctl/run1/hello/passive") and not act.may_publish("ctl/run1/report")
    assert pas.may_publish("ctl/run1/report") and not pas.may_publish("ctl/run1/done")
    coord, party = pol.rules("coordinator"), pol.rules("party")
    assert coord.may_publish("ff/r/all/plan") and not party.may_publish("ff/r/all/plan")
    assert coord.may_publish("wl/r/add") and not party.may_publish("wl/r/add")
    assert party.may_publish("ff/r/to/root/hello")
    assert pol.publish_mask("emb/r/1") == 1 << pol.index("passive")
    assert pol.read_mask("emb/r/1") == 1 << pol.index("active")


def test_a_predictions_topics_are_each_passive_partys_own() -> None:
    """``psfl vfl predict`` with several passive parties: the role policy lets each one
    publish its embeddings and hellos; the launcher's membership keeps them its own."""
    from pubsub.membership import membership
    from sim.launch.vfl import run_members

    pol = load_policy(DEFAULT_POLICY_FILE)
    act, pas = pol.rules("active"), pol.rules("passive")
    parties = ("passive", "passive2", "passive3")
    mk = run_members("p1", ("active", *parties))
    m = membership(mk["members"], mk["owned"])
    assert run_members("p1", ("active", "passive"))["owned"] is None  # two parties: as before
    for p in parties:
        emb, hello = f"eval/p1/{p}/predict", f"ctl/p1/hello/{p}"
        assert pas.may_publish(emb) and m.allows(p, emb)
        assert act.may_read(emb) and m.may_read("active", emb, True)
        assert act.may_publish(hello) and m.allows("active", hello) and m.may_read(p, hello, True)
        assert pas.may_publish("ctl/p1/hello/active") and m.allows(p, "ctl/p1/hello/active")
        assert pas.may_read("ctl/p1/done") and m.may_read(p, "ctl/p1/done", True)
        for other in parties:
            if other != p:
                assert not m.allows(other, emb) and not m.may_read(other, emb, True)
                assert not m.may_read(other, hello, True)


def test_policy_rejects_bad_input_with_the_key_named() -> None:
    with pytest.raises(ConfigError, match="nosuch"):
        Policy.from_mapping({"roles": {"a": {"publish": [], "nosuch": []}}})
    with pytest.raises(ConfigError, match="emb/\\*\\*/x"):
        RoleRules(name="a", publish=("emb/**/x",), subscribe=())
    with pytest.raises(ConfigError, match="whole segment"):
        RoleRules(name="a", publish=("emb*",), subscribe=())
    with pytest.raises(ConfigError, match="twice"):
        Policy(roles=(RoleRules(name="a", publish=(), subscribe=()),) * 2)
    with pytest.raises(ConfigError, match="unknown role 'x'"):
        load_policy(DEFAULT_POLICY_FILE).index("x")
