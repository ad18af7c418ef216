"""User model factories for tests of ``vfl.model.bottom = "module:callable"`` (importable as
``tests.unit.zoo_user_models`` with the repository root on ``sys.path``)."""

from __future__ import annotations

from torch import nn


def bottom(d_in: int, d_out: int) -> nn.Module:
    """A two-layer bottom with BatchNorm (running statistics: buffers)."""
    return nn.Sequential(nn.Linear(d_in, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, d_out))


def top(d_in: int, d_out: int) -> nn.Module:
    """A linear top model."""
    return nn.Linear(d_in, d_out)


def wrong_width(d_in: int, d_out: int) -> nn.Module:
    """Ignores ``d_out``: its output is 3 wide."""
    return nn.Linear(d_in, 3)


def raises(d_in: int, d_out: int) -> nn.Module:
    raise RuntimeError("no model today")


def fixed_top(d_in: int, d_out: int) -> nn.Module:
    """Takes 5 inputs whatever ``d_in`` is."""
    return nn.Linear(5, d_out)


NOT_CALLABLE = 3
