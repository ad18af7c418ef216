"""N-way column split (parties.data.default_split_n / validate_split_n) and the fuse modes
(parties.algorithms.fuse): the pure pieces of multi-party VFL (docs/dev/multiparty.md)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parties.data import (
    InvalidSplit,
    UnknownColumn,
    default_split,
    default_split_n,
    validate_split_n,
)
from parties.algorithms.fuse import FUSES, Fuse, FuseError

PARTIES = ["active", "passive", *(f"passive{k}" for k in range(2, 10))]


@settings(max_examples=60, deadline=None)
@given(n_features=st.integers(2, 60), n_parties=st.integers(2, 10), label_at=st.integers(0, 60))
def test_default_split_n_partitions_features_in_order(n_features, n_parties, label_at):
    features = [f"f{i}" for i in range(n_features)]
    columns = list(features)
    columns.insert(min(label_at, n_features), "y")
    parties = PARTIES[:n_parties]
    if n_features < n_parties:
        with pytest.raises(InvalidSplit, match=f"at least {n_parties} feature columns"):
            default_split_n(columns, "y", parties)
        return
    groups = default_split_n(columns, "y", parties)
    assert list(groups) == parties
    # contiguous, in order, every feature exactly once, none empty
    assert [c for p in parties for c in groups[p]] == features
    sizes = [len(groups[p]) for p in parties]
    assert min(sizes) >= 1
    assert max(sizes[1:]) - min(sizes[1:]) <= 1  # passive shares as even as can be
    validate_split_n(columns, "y", groups)


def test_two_party_default_split_is_the_n_way_split():
    cols = [f"c{i}" for i in range(7)] + ["y"]
    a, p = default_split(cols, "y")
    assert default_split_n(cols, "y", ["active", "passive"]) == {"active": a, "passive": p}
    assert (len(a), len(p)) == (4, 3)


def test_default_split_n_errors_name_the_value():
    with pytest.raises(UnknownColumn, match="ghost"):
        default_split_n(["a", "b"], "ghost", ["active", "passive"])
    with pytest.raises(InvalidSplit, match="named more than once: \\['passive'\\]"):
        default_split_n(["a", "b", "c", "y"], "y", ["active", "passive", "passive"])
    with pytest.raises(InvalidSplit, match="active_features = 3"):
        default_split_n(["a", "b", "c", "y"], "y", ["active", "passive", "passive2"],
                        n_active=3)
    with pytest.raises(InvalidSplit, match="at least 2 parties"):
        default_split_n(["a", "y"], "y", ["active"])


def test_validate_split_n_names_both_parties_of_a_shared_column():
    cols = ["a", "b", "c", "d", "y"]
    with pytest.raises(InvalidSplit, match="both the passive and the passive3 party: \\['c'\\]"):
        validate_split_n(cols, "y", {"active": ["a"], "passive": ["b", "c"],
                                     "passive3": ["c", "d"]})
    with pytest.raises(InvalidSplit, match="passive2 party has no feature columns"):
        validate_split_n(cols, "y", {"active": ["a"], "passive": ["b"], "passive2": []})
    with pytest.raises(InvalidSplit, match="used as a feature by the passive2 party"):
        validate_split_n(cols, "y", {"active": ["a"], "passive": ["b"], "passive2": ["y"]})
    with pytest.raises(UnknownColumn, match="ghost"):
        validate_split_n(cols, "y", {"active": ["a"], "passive2": ["ghost"]})


# --------------------------------------------------------------------------- fuse
def _parts(widths, rows=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, w, generator=g, requires_grad=True) for w in widths]


@pytest.mark.parametrize("mode", FUSES)
def test_fuse_gradients_reach_every_part(mode):
    widths = (4, 3, 5) if mode == "concat" else (4, 4, 4)
    fuse = Fuse(mode=mode, widths=widths)
    parts = _parts(widths)
    out = fuse(parts)
    assert out.shape == (5, fuse.out_width)
    weight = torch.arange(fuse.out_width, dtype=torch.float32)
    (out * weight).sum().backward()
    if mode == "concat":
        starts = [0, 4, 7]
        for p, s, w in zip(parts, starts, widths):
            torch.testing.assert_close(p.grad, weight[s:s + w].expand(5, w))
    else:
        scale = 1.0 / 3 if mode == "mean" else 1.0
        for p in parts:
            torch.testing.assert_close(p.grad, (scale * weight).expand(5, 4))


def test_fuse_rejects_bad_settings_and_parts():
    with pytest.raises(FuseError, match="'max'"):
        Fuse(mode="max", widths=(2, 2))
    with pytest.raises(FuseError, match="part 2 is 3 wide, the active party's is 4"):
        Fuse(mode="sum", widths=(4, 4, 3))
    with pytest.raises(FuseError, match="at least one passive"):
        Fuse(mode="concat", widths=(4,))
    with pytest.raises(FuseError, match="part 1 of the fuse has width 0"):
        Fuse(mode="concat", widths=(4, 0))
    fuse = Fuse(mode="concat", widths=(2, 3))
    with pytest.raises(FuseError, match="expected 2 parts, got 1"):
        fuse(_parts((2,)))
    with pytest.raises(FuseError, match="part 1 of the fuse has shape \\(5, 4\\); expected \\(5, 3\\)"):
        fuse(_parts((2, 4)))
