"""Train bank with your own bottom model (BatchNorm + Dropout), defined in this script.

    python examples/custom_model.py --quick                     # both parties in this process
    python examples/custom_model.py --quick --transport broker  # broker + two party processes

Prints ``test_auc <value>``. The model classes live at module level and the work runs
under ``if __name__ == "__main__":`` so that party and worker processes, which
``multiprocessing`` starts by re-importing this script, can rebuild them.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch import nn

from sim.api import VflJob, train


class BottomNet(nn.Module):
    """A party's bottom model: ``(B, d_in) -> (B, d_out)``."""

    def __init__(self, d_in: int, d_out: int, hidden: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Dropout(dropout), nn.Linear(hidden, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def top(d_in: int, d_out: int) -> nn.Module:
    """The active party's top model over both embeddings: ``(B, 2·emb) -> (B, 1)``."""
    return nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, d_out))


def adamw(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Each worker's optimizer."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 epochs (CI); default 10")
    p.add_argument("--transport", choices=["memory", "broker"], default="memory")
    p.add_argument("--out", help="run directory (default: a temporary one)")
    args = p.parse_args()
    job = VflJob(data="bank", bottom=BottomNet, top=top, optimizer=adamw,
                 config={"epochs": 3 if args.quick else 10, "seed": 0})
    out = args.out or tempfile.mkdtemp(prefix="psfl-example-")
    result = train(job, out, transport=args.transport, quiet=args.quick)
    print(f"run directory {result.out}")
    print(f"test_auc {result.test_auc:.4f}")


if __name__ == "__main__":
    main()
