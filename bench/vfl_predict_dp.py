"""Prediction under DP: how far the test AUC of a saved DP run's prediction lands from the
run's own test AUC, and what the prediction costs in privacy.

    python bench/vfl_predict_dp.py [--mu 1.0] [--epochs 3] [--repeats 3] [--json OUT]

Trains bank in process with Gaussian DP on the passive party's embeddings (``dp_mu``,
the bundled reviewed schema), then predicts the test split ``--repeats`` times. Each
prediction publishes fresh noisy embeddings (charged to the run's ledger), so its AUC
differs from the run's test AUC by the noise only; the acceptance is a gap within 0.01.
Prints each prediction's AUC, its gap and the ledger's µ after it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sim.api import VflJob, predict, train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mu", type=float, default=1.0, help="dp_mu of the training run")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3, help="predictions of the test split")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="psfl-predict-dp-"))
    t0 = time.perf_counter()
    job = VflJob(data="bank", config={"epochs": args.epochs, "dp.mu": args.mu,
                                      "dp.noise_seed": 0})
    run = train(job, root / "run")
    train_s = time.perf_counter() - t0
    base = float(run.metrics["test_auc"])
    print(f"trained bank with dp.mu={args.mu}: test_auc {base:.6f} "
          f"(ledger mu {run.metrics['dp']['mu']:.4f}, {train_s:.0f} s)")
    rows = []
    for i in range(args.repeats):
        res = predict(run.out, root / f"predict-{i}")
        s = res.summary
        auc = float(s["test_auc"])
        rows.append({"test_auc": auc, "gap": auc - base, "ledger_mu": s["dp"]["mu"],
                     "publications_max_test": s["dp"]["publications_max_test"]})
        print(f"prediction {i + 1}: test_auc {auc:.6f}  gap {auc - base:+.6f}  "
              f"ledger mu {s['dp']['mu']:.4f} (test rows published "
              f"{s['dp']['publications_max_test']}x)")
    worst = max(abs(r["gap"]) for r in rows)
    print(f"max |gap| {worst:.6f} (acceptance: <= 0.01) -> {'PASS' if worst <= 0.01 else 'FAIL'}")
    if args.json:
        args.json.write_text(json.dumps({"mu": args.mu, "epochs": args.epochs,
                                         "run_test_auc": base, "predictions": rows,
                                         "max_abs_gap": worst, "run_dir": str(run.out)},
                                        indent=2))


if __name__ == "__main__":
    main()
