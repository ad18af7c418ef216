"""DP-SGD for the passive party's bottom model (pure logic, torch, no I/O).

Why: every later embedding of every record is a function of the bottom model's
parameters, and the parameters are trained on each record through the cut-layer
gradient the active party sends back for it. Without a per-record bound on that
influence, one record's features can be read off OTHER records' published embeddings.

Mechanism (Abadi et al., CCS 2016, without amplification by subsampling): for a batch
of B rows with inputs ``x_i`` and cut-layer gradients ``g_i`` (``dLoss/d embedding_i``
from the active party), the per-example parameter gradient is ``J_iᵀ (B·g_i)``: the
gradient of ``<clip(h_θ(x_i)), B·g_i>`` in θ, with ``h_θ`` the bottom model and ``clip``
the same row clipping as the published embedding (the active party's loss is a batch
mean, so ``B·g_i`` is the per-example loss gradient). Each per-example gradient is
clipped to L2 norm ``C_g`` (over all parameters), the clipped gradients are summed,
Gaussian noise ``N(0, (σ_g C_g)²)`` is added to every coordinate, and the result is
divided by B. Replacing one record changes the sum by at most ``2 C_g`` (two vectors
of norm ≤ C_g), so one step is ``(2/σ_g)``-GDP for each record of the batch
(:func:`parties.privacy.dp.release_mu`). The optimizer (Adam) and the parameter-server averaging
are post-processing.

Per-example gradients come from ``torch.func`` (``vmap`` over ``grad`` of a
``functional_call``), which needs a bottom model whose forward treats rows
independently: no BatchNorm (its batch statistics mix records) and no other
cross-row operation. :func:`check_dp_compatible` refuses such modules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from parties.privacy.dp import clip_rows

#: Module types whose forward mixes the rows of a batch (refused with DP on).
_CROSS_ROW = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)


class DpIncompatibleModel(ValueError):
    """A module whose forward mixes records (BatchNorm) in a model that DP-SGD trains.

    Attributes:
        module: the offending submodule's qualified name.
        kind: its class name.
    """

    def __init__(self, module: str, kind: str) -> None:
        self.module = module
        self.kind = kind
        super().__init__(f"DP is on, but the passive bottom model's {module or '<root>'!r} is "
                         f"a {kind}, whose batch statistics mix records; use GroupNorm or "
                         f"LayerNorm (per-row) instead")


def check_dp_compatible(model: nn.Module) -> None:
    """Refuse a model that per-example DP-SGD cannot bound (BatchNorm layers).

    Raises:
        DpIncompatibleModel: naming the first offending submodule.
    """
    for name, mod in model.named_modules():
        if isinstance(mod, _CROSS_ROW):
            raise DpIncompatibleModel(name, type(mod).__name__)


def per_example_grads(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                      g: torch.Tensor, clip_norm: float) -> dict[str, torch.Tensor]:
    """Per-example gradients of ``<clip(model(x_i)), g_i>`` in the parameters.

    Args:
        model: the bottom model (its own parameters are not used; ``params`` are).
        params: name → tensor, the parameters to differentiate at (detached).
        x: ``(B, d_in)`` inputs.
        g: ``(B, d_emb)`` per-example output gradients.
        clip_norm: C, the embedding row clip (part of the function, as in the forward).

    Returns:
        name → ``(B, *param.shape)`` per-example gradients.
    """
    names = list(params)

    def one(p: dict[str, torch.Tensor], xi: torch.Tensor, gi: torch.Tensor) -> torch.Tensor:
        h = functional_call(model, p, (xi.unsqueeze(0),))
        return (clip_rows(h, clip_norm) * gi.unsqueeze(0)).sum()

    grads = vmap(grad(one), in_dims=(None, 0, 0))({n: params[n] for n in names}, x, g)
    return dict(grads)


def clip_and_sum(per_example: Mapping[str, torch.Tensor], clip_norm: float
                 ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Clip each example's gradient (over all parameters) to L2 norm ``clip_norm`` and sum.

    Returns:
        ``(sums, norms)``: name → summed clipped gradient (param shape), and the ``(B,)``
        pre-clip norms.
    """
    if not (0.0 < clip_norm < math.inf):
        raise ValueError(f"grad clip norm must be positive and finite, got {clip_norm!r}")
    sq = None
    for t in per_example.values():
        part = t.reshape(t.shape[0], -1).square().sum(dim=1)
        sq = part if sq is None else sq.add_(part)
    assert sq is not None
    norms = sq.sqrt_()
    finite = torch.isfinite(norms)
    factor = torch.where(finite, (clip_norm / norms.clamp_min(1e-12)).clamp(max=1.0),
                         torch.zeros_like(norms))  # a non-finite example contributes 0
    all_finite = bool(finite.all())
    sums = {}
    for n, t in per_example.items():
        if not all_finite:
            t = torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)
        sums[n] = torch.tensordot(factor, t, dims=([0], [0]))
    return sums, norms


def private_grads(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                  g: torch.Tensor, *, embed_clip_norm: float, grad_clip_norm: float,
                  noise_multiplier: float, generator: torch.Generator
                  ) -> dict[str, torch.Tensor]:
    """One DP-SGD gradient of the passive bottom model for a batch.

    ``(Σ_i clip_{C_g}(J_iᵀ B g_i) + N(0, (σ_g C_g)² I)) / B``.

    Args:
        model: the bottom model (architecture; parameters come from ``params``).
        params: name → parameter tensor at which the forward was computed.
        x: ``(B, d_in)`` the batch's inputs.
        g: ``(B, d_emb)`` the cut-layer gradient the active party sent (of a batch-mean
            loss; scaled here by B to per-example loss gradients).
        embed_clip_norm: C of the published embedding rows (the forward's clip).
        grad_clip_norm: C_g, the per-example gradient bound.
        noise_multiplier: σ_g (noise std σ_g·C_g on the sum).
        generator: the worker's secret noise generator.

    Returns:
        name → gradient (param shape, float32), ready to be set as ``p.grad``.

    Raises:
        ValueError: ``x``/``g`` row counts differ, or a bad clip/noise parameter.
    """
    noise = {n: torch.randn(p.shape, generator=generator, dtype=torch.float32)
             for n, p in params.items()}
    return private_grads_with_noise(model, params, x, g, noise, embed_clip_norm=embed_clip_norm,
                                    grad_clip_norm=grad_clip_norm,
                                    noise_multiplier=noise_multiplier)


def private_grads_with_noise(model: nn.Module, params: Mapping[str, torch.Tensor],
                             x: torch.Tensor, g: torch.Tensor,
                             noise: Mapping[str, torch.Tensor], *, embed_clip_norm: float,
                             grad_clip_norm: float, noise_multiplier: float
                             ) -> dict[str, torch.Tensor]:
    """:func:`private_grads` with the standard normal draws given: ``noise[name]`` has the
    parameter's shape, or ``(n, *shape)`` for n draws at once (the result then has the
    same leading dimension; an auditor batches its draws this way).

    Raises:
        ValueError: ``x``/``g`` row counts differ, or a bad clip/noise parameter.
    """
    if x.shape[0] != g.shape[0]:
        raise ValueError(f"{x.shape[0]} input rows but {g.shape[0]} gradient rows")
    if not (0.0 < noise_multiplier < math.inf):
        raise ValueError(f"noise_multiplier must be positive and finite, got {noise_multiplier!r}")
    b = x.shape[0]
    detached = {n: p.detach() for n, p in params.items()}
    per_ex = per_example_grads(model, detached, x, g * float(b), embed_clip_norm)
    sums, _ = clip_and_sum(per_ex, grad_clip_norm)
    std = noise_multiplier * grad_clip_norm
    return {n: (s + noise[n] * std) / float(b) for n, s in sums.items()}


class DpSgd:
    """A worker's DP-SGD gradient maker with its own secret noise generator.

    Args:
        model: the worker's bottom model (checked with :func:`check_dp_compatible`).
        embed_clip_norm: C of the published embedding rows.
        grad_clip_norm: C_g.
        noise_multiplier: σ_g.
        seed: the generator's seed (secret, like the embedding noise seed).

    Raises:
        DpIncompatibleModel: the model mixes rows (BatchNorm).
    """

    def __init__(self, model: nn.Module, *, embed_clip_norm: float, grad_clip_norm: float,
                 noise_multiplier: float, seed: int) -> None:
        check_dp_compatible(model)
        self.model = model
        self.embed_clip_norm = embed_clip_norm
        self.grad_clip_norm = grad_clip_norm
        self.noise_multiplier = noise_multiplier
        self.generator = torch.Generator().manual_seed(seed)
        self.steps = 0

    def grads(self, params: Mapping[str, torch.Tensor], x: torch.Tensor, g: torch.Tensor
              ) -> dict[str, torch.Tensor]:
        """:func:`private_grads` of one batch with this worker's settings."""
        self.steps += 1
        return private_grads(self.model, params, x, g, embed_clip_norm=self.embed_clip_norm,
                             grad_clip_norm=self.grad_clip_norm,
                             noise_multiplier=self.noise_multiplier, generator=self.generator)


__all__ = ["DpIncompatibleModel", "DpSgd", "check_dp_compatible", "clip_and_sum", "per_example_grads",
           "private_grads", "private_grads_with_noise"]
