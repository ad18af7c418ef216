"""What the VFL and FedForge reports share (:mod:`sim.reports.vfl`, :mod:`sim.reports.synth`,
:mod:`sim.reports.synth_plot`): the report's error, figure size, JSON reading, number
cleaning and matplotlib's Agg backend.

Owns: the pieces above. May import nothing of the project (matplotlib lazily).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: Figure size (inches) and resolution: 1600 x 900 pixels.
FIGSIZE = (16.0, 9.0)
DPI = 100


class ReportError(Exception):
    """Bad input for ``psfl report`` (missing directory, no runs, bad window); exit 2."""


def _read_json(path: Path) -> Any:
    with path.open("rb") as f:
        return json.load(f)


def is_vfl_metrics(m: Any) -> bool:
    """True when ``m`` looks like a VFL run's ``metrics.json`` (a dict with a
    ``history`` list or a ``parties`` dict)."""
    return isinstance(m, dict) and (isinstance(m.get("history"), list)
                                    or isinstance(m.get("parties"), dict))


def _num(x: Any) -> float | None:
    """``x`` as a finite float, else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    plt = _pyplot()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


__all__ = ["DPI", "FIGSIZE", "ReportError", "is_vfl_metrics"]
