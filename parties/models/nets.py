"""The built-in networks, loss and optimizer (torch, no I/O): the Linear/ReLU stacks
of the default ``vfl.model.bottom = "mlp"``, the top model's training loss per task, and the
workers' default optimizer.

Owns: layer stacks and their construction order (which fixes their initialisation from
the torch RNG). May import: torch, and :mod:`parties.config` for types only. Imported by
:mod:`parties.models.zoo` (which model a run builds) and :mod:`parties.models.model` (the parameter
server and the workers' compute).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from parties.config import VflConfig


def mlp(d_in: int, hidden: Sequence[int], d_out: int, *, out_relu: bool) -> nn.Sequential:
    """Linear/ReLU stack ``d_in → hidden… → d_out`` (ReLU after the last layer iff ``out_relu``)."""
    layers: list[nn.Module] = []
    prev = d_in
    for h in hidden:
        layers += [nn.Linear(prev, h), nn.ReLU()]
        prev = h
    layers.append(nn.Linear(prev, d_out))
    if out_relu:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def bottom_model(d_in: int, hidden: Sequence[int], embedding_dim: int, *,
                 out_relu: bool = True) -> nn.Sequential:
    """A party's bottom model: ``(B, d_in) float32 → (B, embedding_dim)`` embedding (ReLU
    after the last layer unless ``out_relu`` is false)."""
    return mlp(d_in, hidden, embedding_dim, out_relu=out_relu)


def party_bottom(cfg: VflConfig, role: str, d_in: int) -> nn.Sequential:
    """``role``'s bottom model for ``cfg``: its own widths; the passive party's under DP
    ends in the linear layer (no ReLU), since its output is clipped and noised anyway: a
    ReLU output would spend half the clip ball on nothing and can die under DP-SGD's
    noise. Measured on bank, µ = 8, 2 epochs, lr 2e-3, four noise seeds (in-process
    sync VFL): test AUC 0.80-0.84 with the ReLU, 0.85-0.86 without."""
    linear_out = role == "passive" and cfg.dp.enabled
    return bottom_model(d_in, cfg.model.bottom_hidden_for(role), cfg.model.embedding_dim,
                        out_relu=not linear_out)


def top_model(embedding_dim: int, hidden: Sequence[int], *, d_in: int | None = None
              ) -> nn.Sequential:
    """The active party's top model: ``(B, d_in) → (B, 1)`` (``d_in`` default
    ``2·embedding_dim``, two parties' concatenated embeddings) logits (binary task)
    or standardised predictions (regression task)."""
    return mlp(2 * embedding_dim if d_in is None else d_in, hidden, 1, out_relu=False)


def loss_function(task: str) -> nn.Module:
    """The top model's training loss for ``task``: mean BCE-with-logits (``"binary"``) or
    mean squared error (``"regression"``).

    Raises:
        ValueError: unknown ``task``.
    """
    if task == "binary":
        return nn.BCEWithLogitsLoss()
    if task == "regression":
        return nn.MSELoss()
    raise ValueError(f"task must be 'binary' or 'regression', got {task!r}")


def make_adam(params: Sequence[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Adam, fused into one kernel where this torch build supports it on the CPU.

    Measured here on the demo's bottom model: 385 µs per step fused vs 443 µs for the
    default per-tensor loop (the model's tensors are small, so per-op overhead dominates).
    """
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


__all__ = ["bottom_model", "loss_function", "make_adam", "mlp", "party_bottom", "top_model"]
