"""build_tree's root_children: how many nodes report to the coordinator."""

from __future__ import annotations

import pytest

from pubsub.config import ConfigError
from synth.config import SecAggSection, SynthConfig
from synth.protocol import ROOT, build_tree


@pytest.mark.parametrize(("k", "fanout", "root_children", "levels", "at_root"), [
    (100, 10, 0, [10], 10),
    (100, 10, 1, [10, 1], 1),
    (500, 10, 0, [50, 5], 5),
    (500, 10, 1, [50, 5, 1], 1),
    (10, 10, 1, [1], 1),
    (30, 4, 2, [8, 2], 2),
])
def test_root_children_bounds_the_root_fan_in(k, fanout, root_children, levels, at_root):
    ids = [f"p{i:03d}" for i in range(k)]
    tree = build_tree(ids, fanout, root_children)
    assert [len(level) for level in tree.levels] == levels
    assert len(tree.children[ROOT]) == at_root
    assert sorted(tree.parties_under(ROOT)) == ids
    assert all(len(c) <= fanout for c in tree.children.values())


def test_root_children_is_checked():
    with pytest.raises(ValueError):
        build_tree(["a", "b", "c"], 2, 3)
    with pytest.raises(ConfigError):
        SynthConfig(secagg=SecAggSection(fanout=4, root_children=5))
    assert SynthConfig(secagg=SecAggSection(fanout=4, root_children=1)).secagg.root_children == 1
