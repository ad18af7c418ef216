"""One job, two ways to run it: both parties in this process, then a broker and one
process per party (CURVE-secured TCP on loopback), with the same code.

    python examples/same_code_two_transports.py --quick

The in-memory bus (``transport="memory"``) is for notebooks, tests and quick experiments;
the broker (``transport="broker"``) is how parties run on separate hosts. The user model
is a module-level class, so the party processes can rebuild it. Prints one
``test_auc`` line per transport.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import nn

from parties.data import load_table
from sim.api import VflJob, train


class Bottom(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 epoch (CI); default 5")
    args = p.parse_args()
    frame, label = load_table("bank")  # a pandas DataFrame; any DataFrame works
    job = VflJob(data=frame, label=label, bottom=Bottom,
                 config={"epochs": 1 if args.quick else 5, "seed": 0})
    root = Path(tempfile.mkdtemp(prefix="psfl-example-"))
    aucs = {}
    for transport in ("memory", "broker"):
        result = train(job, root / transport, transport=transport)
        aucs[transport] = result.test_auc
        print(f"{transport}: test_auc {result.test_auc:.4f}, job {result.metrics['wall_s']:.1f} s")
    print(f"difference {abs(aucs['memory'] - aucs['broker']):.4f}")


if __name__ == "__main__":
    main()
