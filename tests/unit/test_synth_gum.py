"""The record update of incremental refits (synth/gum.py)."""

from __future__ import annotations

import numpy as np
import pytest

from synth.domain import Domain, marginals
from synth.engine import NoisyMarginal
from synth.gum import gum_step, gum_update
from tests.bounds import above, below

D = Domain(attributes=("x", "y", "z", "w"), sizes=(2, 2, 2, 3))


def _tv(a: np.ndarray, b: np.ndarray, c: tuple[str, ...]) -> float:
    pa = marginals(a, D, [c])[c].ravel() / len(a)
    pb = marginals(b, D, [c])[c].ravel() / len(b)
    return 0.5 * float(np.abs(pa - pb).sum())


@pytest.mark.stochastic
def test_records_move_to_a_three_way_interaction_they_lacked() -> None:
    """z = x XOR y: independent records have TV 0.5 on (x, y, z); after the update it is
    small, the pairs the target fixes stay right, and w (in no target) is untouched."""
    rng = np.random.default_rng(0)
    n = 20000
    x, y = rng.integers(0, 2, n), rng.integers(0, 2, n)
    real = np.stack([x, y, x ^ y, rng.integers(0, 3, n)], 1)
    syn = np.stack([rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 2, n),
                    rng.integers(0, 3, n)], 1).astype(np.int32)
    c = ("x", "y", "z")
    target = NoisyMarginal(clique=c, values=marginals(real, D, [c])[c].ravel().astype(float),
                           sigma=1.0)
    above(_tv(real, syn, c), 0.45, "independent records' 3-way TV")
    out = gum_update(syn, D, [target], passes=20, seed=1)
    below(_tv(real, out, c), 0.02, "3-way TV after the update")
    below(_tv(real, out, ("y", "z")), 0.02, "(y, z) TV after the update")
    np.testing.assert_array_equal(out[:, 3], syn[:, 3])  # w never moved
    assert out.shape == syn.shape and out.dtype == np.int32
    assert not np.shares_memory(out, syn)


def test_a_step_moves_only_the_excess_and_keeps_the_count() -> None:
    rng = np.random.default_rng(2)
    codes = np.zeros((100, 4), dtype=np.int64)  # everyone in cell x=0
    m = NoisyMarginal(clique=("x",), values=np.array([50.0, 50.0]), sigma=1.0)
    moved = gum_step(codes, D, m, 1.0, rng)
    assert moved == 50 and np.bincount(codes[:, 0], minlength=2).tolist() == [50, 50]
    assert gum_step(codes, D, m, 1.0, rng) == 0  # already there


@pytest.mark.parametrize(("codes", "kw", "match"), [
    (np.zeros((5, 3), dtype=np.int32), {}, r"must be \(n, 4\)"),
    (np.full((5, 4), 7, dtype=np.int32), {}, "outside the domain"),
    (np.zeros((5, 4), dtype=np.int32), {"passes": 0}, "passes"),
    (np.zeros((5, 4), dtype=np.int32), {"alpha0": 1.5}, "alpha0"),
])
def test_bad_input_is_refused(codes: np.ndarray, kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gum_update(codes, D, [], **kw)
