"""Train bank with the paper's large model (PubSub-VFL, Table 7): residual MLP bottoms and top.

    python examples/large_model.py --quick
    python examples/large_model.py --dp-epsilon 8     # with DP (BatchNorm becomes GroupNorm)

The built-in ``resnet`` model is an input projection, ``depth`` residual blocks
``relu(x + f(x))`` with ``f = Linear -> Norm -> ReLU -> (Dropout) -> Linear -> Norm``, and
an output projection (``parties.models.zoo.ResidualMlp``; docs/tutorials/your-own-model.md). Prints
``test_auc <value>``.
"""

from __future__ import annotations

import argparse
import tempfile

from sim.api import VflJob, train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="a smaller model for 1 epoch (CI); default depth 4, width 256, 5 epochs")
    p.add_argument("--dp-epsilon", type=float, default=None,
                   help="protect the passive party's records at this epsilon (delta 1e-5)")
    p.add_argument("--out", help="run directory (default: a temporary one)")
    args = p.parse_args()
    settings = {"model": {"bottom": "resnet", "resnet_depth": 2 if args.quick else 4,
                          "resnet_width": 64 if args.quick else 256, "resnet_norm": "batch"},
                "epochs": 1 if args.quick else 5, "seed": 0}
    if args.dp_epsilon is not None:
        # BatchNorm mixes records, which DP-SGD cannot bound: use GroupNorm in the
        # passive party's bottom instead (the active party keeps BatchNorm)
        settings["dp"] = {"epsilon": args.dp_epsilon, "batchnorm": "groupnorm"}
    out = args.out or tempfile.mkdtemp(prefix="psfl-example-")
    result = train(VflJob(data="bank", config=settings), out, quiet=args.quick)
    print(f"model {result.metrics['model']}")
    if result.metrics.get("dp", {}).get("enabled"):
        print(f"dp epsilon {result.metrics['dp']['epsilon']:.3f} at delta "
              f"{result.metrics['dp']['delta']:g}")
    print(f"test_auc {result.test_auc:.4f}")


if __name__ == "__main__":
    main()
