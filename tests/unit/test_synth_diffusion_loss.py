"""The diffusion engine's one-matrix-product loss (:class:`synth.diffusion._GramLoss`)
against the shared workload-guided loss (:func:`synth.engine.marginal_loss`): the same
gradient for any mix of 1-, 2- and 3-way cliques, either orientation of a pair and
cliques measured more than once (the two differ by a constant only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from synth.diffusion import _GramLoss  # noqa: E402
from synth.engine import marginal_loss  # noqa: E402


@st.composite
def problems(draw: st.DrawFn) -> tuple[list[int], list[list[int]], int]:
    sizes = draw(st.lists(st.integers(2, 5), min_size=2, max_size=5))
    a = len(sizes)
    cliques = draw(st.lists(
        st.one_of(st.lists(st.integers(0, a - 1), min_size=1, max_size=1),
                  st.lists(st.integers(0, a - 1), min_size=2, max_size=2, unique=True),
                  st.lists(st.integers(0, a - 1), min_size=3, max_size=3, unique=True)
                  if a >= 3 else st.lists(st.integers(0, a - 1), min_size=1, max_size=1)),
        min_size=1, max_size=8))
    seed = draw(st.integers(0, 2**31 - 1))
    return sizes, cliques, seed


@settings(max_examples=40, deadline=None)
@given(problems())
def test_gram_loss_has_the_gradient_of_the_marginal_loss(problem) -> None:
    sizes, idxs, seed = problem
    rng = np.random.default_rng(seed)
    targets = []
    for idx in idxs:
        v = rng.random(int(np.prod([sizes[i] for i in idx])))
        targets.append(torch.tensor(v / v.sum(), dtype=torch.float32))
    wts = [float(w) for w in rng.random(len(idxs)) + 0.5]
    gram = _GramLoss(sizes, targets, idxs, wts)
    off = np.concatenate([[0], np.cumsum(sizes)])
    logits = torch.tensor(rng.normal(size=(32, int(off[-1]))), dtype=torch.float32,
                          requires_grad=True)

    def parts() -> list:
        return [torch.softmax(logits[:, off[j]:off[j + 1]], 1) for j in range(len(sizes))]

    (g_ref,) = torch.autograd.grad(marginal_loss(parts(), targets, idxs, wts), logits)
    (g_new,) = torch.autograd.grad(gram(torch.cat(parts(), 1)), logits)
    scale = float(g_ref.abs().max()) + 1e-12
    assert float((g_ref - g_new).abs().max()) <= 1e-4 * scale + 1e-7


def test_gram_loss_is_zero_at_the_targets_of_single_measurements() -> None:
    """One measurement per clique, rows that are exactly the targets' product: 0."""
    sizes = [2, 3]
    p0 = torch.tensor([0.25, 0.75]); p1 = torch.tensor([0.2, 0.3, 0.5])
    targets = [p0, p1, torch.outer(p0, p1).ravel(), torch.outer(p1, p0).ravel()]
    gram = _GramLoss(sizes, targets, [[0], [1], [0, 1], [1, 0]], [1.0, 2.0, 1.0, 1.0])
    rows = torch.cat([p0, p1]).expand(10, -1)
    assert float(gram(rows)) == pytest.approx(0.0, abs=1e-10)
    uniform = torch.cat([torch.full((2,), 0.5), torch.full((3,), 1 / 3)]).expand(10, -1)
    assert float(gram(uniform)) > 1e-3
