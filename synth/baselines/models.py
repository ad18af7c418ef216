"""The baselines' networks over the schema's domain codes (one-hot per attribute).

* CTGAN-style GAN (Xu et al., "Modeling Tabular Data using Conditional GAN", NeurIPS
  2019, the ``ctgan`` package's architecture): a generator of residual blocks
  (``Linear → BatchNorm → ReLU``, output concatenated to the input) ending in one
  Gumbel-softmax (τ = 0.2) per attribute, and a discriminator ``Linear → LeakyReLU(0.2) →
  Dropout(0.5)`` ×2 → ``Linear(1)``. As smartnoise's DPCTGAN: pac = 1, no gradient
  penalty (opacus cannot privatise its double backward), the cross-entropy GAN loss.
  CTGAN's conditional vector and training-by-sampling are left out: its sampler reads
  each column's level frequencies from the rows, a path by which records would reach
  the model outside DP-SGD. The attributes are the domain's codes (numeric columns
  already binned by the public schema), so the data transformer is one-hot.
* The multinomial diffusion denoiser of :mod:`synth.diffusion` (same MLP, schedule and
  reverse chain), trained on records by the usual denoising objective: for a record
  ``x_0``, a step ``t ~ U{1..T}`` and ``x_t ~ q(x_t | x_0)``, the cross-entropy of the
  denoiser's ``x̂_0`` logits against ``x_0`` (the x0-parameterisation's simple loss;
  TabDDPM's full loss adds the posterior KL, which this leaves out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def one_hot(codes: np.ndarray, sizes: Sequence[int]) -> Any:
    """``(n, d)`` int codes → ``(n, Σ sizes)`` float32 tensor."""
    import torch

    cols = [torch.nn.functional.one_hot(torch.as_tensor(codes[:, j], dtype=torch.int64), k)
            for j, k in enumerate(sizes)]
    return torch.cat(cols, dim=1).float()


def offsets(sizes: Sequence[int]) -> list[int]:
    return np.concatenate([[0], np.cumsum(list(sizes))]).astype(int).tolist()


def build_generator(sizes: Sequence[int], *, embedding_dim: int = 128,
                    dims: Sequence[int] = (256, 256)) -> Any:
    """CTGAN's generator: residual blocks, then per-attribute logits (concatenated)."""
    import torch

    class Residual(torch.nn.Module):
        def __init__(self, i: int, o: int) -> None:
            super().__init__()
            self.fc, self.bn = torch.nn.Linear(i, o), torch.nn.BatchNorm1d(o)

        def forward(self, x: Any) -> Any:
            return torch.cat([torch.relu(self.bn(self.fc(x))), x], dim=1)

    mods: list[Any] = []
    d = embedding_dim
    for h in dims:
        mods.append(Residual(d, h))
        d += h
    mods.append(torch.nn.Linear(d, int(sum(sizes))))
    return torch.nn.Sequential(*mods)


def build_discriminator(width: int, *, dims: Sequence[int] = (256, 256)) -> Any:
    """CTGAN's discriminator at pac = 1."""
    import torch

    mods: list[Any] = []
    d = width
    for h in dims:
        mods += [torch.nn.Linear(d, h), torch.nn.LeakyReLU(0.2), torch.nn.Dropout(0.5)]
        d = h
    mods.append(torch.nn.Linear(d, 1))
    return torch.nn.Sequential(*mods)


def gumbel_rows(logits: Any, sizes: Sequence[int], *, tau: float = 0.2,
                hard: bool = False) -> Any:
    """Per-attribute Gumbel-softmax of the generator's logits (``hard``: one-hot)."""
    import torch

    off = offsets(sizes)
    parts = [torch.nn.functional.gumbel_softmax(logits[:, off[j]:off[j + 1]], tau=tau,
                                                hard=hard)
             for j in range(len(sizes))]
    return torch.cat(parts, dim=1)


def time_embedding(t: Any, steps: int) -> Any:
    """The sinusoidal embedding of :class:`synth.diffusion._Chain`, one ``t`` per row."""
    import torch

    half = 8
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half) / half)
    arg = (t.float()[:, None] / steps * 1000.0) * freqs[None, :]
    return torch.cat([torch.sin(arg), torch.cos(arg)], dim=1)


def diffusion_loss(net: Any, x0: Any, sizes: Sequence[int], abar: Any, steps: int,
                   gen: Any) -> Any:
    """Per-sample denoising loss ``(B,)`` of one-hot records ``x0`` (module docstring)."""
    import torch

    n = x0.shape[0]
    off = offsets(sizes)
    t = torch.randint(1, steps + 1, (n,), generator=gen)
    ab = abar[t][:, None]
    xt = []
    for j, k in enumerate(sizes):
        p = ab * x0[:, off[j]:off[j + 1]] + (1 - ab) / k
        xt.append(torch.nn.functional.one_hot(torch.multinomial(p, 1, generator=gen)[:, 0],
                                              k).float())
    logits = net(torch.cat([*xt, time_embedding(t, steps)], dim=1))
    loss = torch.zeros(n)
    for j in range(len(sizes)):
        lg = logits[:, off[j]:off[j + 1]]
        loss = loss - (torch.log_softmax(lg, dim=1) * x0[:, off[j]:off[j + 1]]).sum(1)
    return loss


__all__ = ["build_discriminator", "build_generator", "diffusion_loss", "gumbel_rows",
           "offsets", "one_hot", "time_embedding"]
