"""Utility of PubSub-VFL under Gaussian DP on the passive party's embeddings: test AUC vs µ.

What is measured
----------------
Test ROC AUC on the bundled ``bank`` data (default column split: the passive party
holds ``contact, day, month, duration, campaign, pdays, previous, poutcome``; seed 0,
test_frac 0.3, B = 256, bottom ``d_in -> 64 -> 32`` per party, top ``64 -> 32 -> 1``,
Adam lr 1e-3, 2 + 2 thread workers) after the last epoch, for each
µ ∈ {0.1, 0.5, 1, 2, 4, 8, 10, ∞} of µ-GDP (the values of PubSub-VFL's Fig. 5).
µ = ∞ is the no-DP baseline, run in the same invocation; each row also reports its AUC
as a ratio of the baseline's.

Privacy settings (see ``parties/dp.py`` for the accounting rules): each embedding row
is clipped to L2 norm C = 1 and noised with N(0, (σC)²) per coordinate, σ calibrated
for the target µ; the test embeddings published for evaluation are noised the same
way. ``max_reassign = 0``, so σ is calibrated for exactly one publication per record
per epoch (σ = sqrt(epochs)/µ); with the default ``max_reassign = 3`` the planner
covers 4 publications per epoch and σ doubles. ε is the spent budget at δ = 1e-5 by
the exact GDP conversion (Dong-Roth-Su Cor. 2.13).

Each run is the real system via ``sim.launch.run_vfl`` (broker + two party processes).
Repeats differ only in the DP noise (fresh OS entropy each run); the table shows the
median AUC over repeats.

Usage::

    python bench/vfl_dp.py --quick --json /tmp/dp.json   # 3 epochs, 1 repeat (~2-3 min)
    python bench/vfl_dp.py                               # 10 epochs, 3 repeats

JSON: ``summary`` maps each µ (``"0.1"`` ... ``"10"``, ``"inf"``) to ``metric`` (test
AUC, median over repeats) and ``epsilon`` (spent ε at δ; null for ``"inf"``: no
privacy); ``settings`` and per-run ``runs`` hold the details.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DATASET = "bank"
MUS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, math.inf)  # inf: the no-DP baseline
CLIP_NORM = 1.0
DELTA = 1e-5
MAX_REASSIGN = 0


def mu_key(mu: float) -> str:
    """The summary key of a µ: ``"0.1"``, ``"1"``, ``"10"``, ``"inf"``."""
    return f"{mu:g}"


def run_one(mu: float, epochs: int, timeout_s: float) -> dict[str, Any]:
    """One VFL run at ``mu`` (``inf``: DP off); the figures of interest from its metrics."""
    from parties.config import VflConfig
    from sim.launch import run_vfl

    cfg = VflConfig(dataset=DATASET, epochs=epochs, max_reassign=MAX_REASSIGN,
                    dp_mu=None if math.isinf(mu) else mu, dp_clip_norm=CLIP_NORM,
                    dp_delta=DELTA)
    with tempfile.TemporaryDirectory(prefix=f"vfl_dp_{mu_key(mu)}_") as tmp:
        m = run_vfl(cfg, out=tmp, quiet=True, timeout_s=timeout_s).metrics
    dp = m["dp"]
    return {
        "test_auc": m["test_auc"],
        "epsilon": dp["epsilon"],  # None without DP
        "mu_spent": dp["mu"],
        "noise_multiplier": dp["noise_multiplier"],
        "publications_max": dp["publications_max"],
        "publications_planned": dp["publications_planned"],
        "dropped_batches": m["dropped_batches"],
        "train_wall_s": m["train_wall_s"],
        "launch_wall_s": m["wall_s"],
        "history": [{"epoch": h["epoch"], "loss": h["loss"], "val_auc": h.get("val_auc")}
                    for h in m["history"]],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repeat of 3 epochs (~2-3 min)")
    ap.add_argument("--json", metavar="PATH", help="write summary + per-run details (overwrites)")
    ap.add_argument("--epochs", type=int, metavar="N", help="epochs per run (default: 10, --quick: 3)")
    ap.add_argument("--repeats", type=int, metavar="N", help="runs per µ (default: 3, --quick: 1)")
    args = ap.parse_args(argv)
    epochs = args.epochs if args.epochs is not None else (3 if args.quick else 10)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if epochs < 1 or repeats < 1:
        ap.error("--epochs and --repeats must be >= 1")

    timeout_s = 120.0 + 30.0 * epochs  # start-up + data loading + generous per-epoch time
    runs: dict[str, list[dict[str, Any]]] = {mu_key(mu): [] for mu in MUS}
    t_start = time.perf_counter()
    for rep in range(repeats):
        for mu in MUS:
            res = run_one(mu, epochs, timeout_s)
            res["repeat"] = rep
            runs[mu_key(mu)].append(res)
            print(f"  repeat {rep + 1}/{repeats}  mu {mu_key(mu):>4}  auc {res['test_auc']:.4f}  "
                  f"eps {'inf' if res['epsilon'] is None else format(res['epsilon'], '.3f')}", file=sys.stderr, flush=True)

    summary: dict[str, dict[str, float | None]] = {}
    for mu in MUS:
        rs = runs[mu_key(mu)]
        eps = [r["epsilon"] for r in rs]
        summary[mu_key(mu)] = {
            "metric": float(statistics.median(r["test_auc"] for r in rs)),
            # the same in every repeat (no dropped batch) or the worst one
            "epsilon": None if eps[0] is None else max(eps),
        }
    base = summary["inf"]["metric"]
    assert base is not None

    print(f"\nVFL test AUC vs µ-GDP on the passive party's embeddings: {DATASET}, {epochs} "
          f"epochs, C = {CLIP_NORM:g}, δ = {DELTA:g}, max_reassign = {MAX_REASSIGN}, median "
          f"of {repeats} repeat(s), {time.perf_counter() - t_start:.0f} s total")
    print(f"{'mu':>6}{'epsilon':>10}{'sigma':>9}{'mu spent':>10}{'test AUC':>10}{'vs no-DP':>10}"
          f"{'AUC min-max':>16}")
    for mu in MUS:
        rs, s = runs[mu_key(mu)], summary[mu_key(mu)]
        aucs = [r["test_auc"] for r in rs]
        dp_on = not math.isinf(mu)
        eps = f"{s['epsilon']:.3f}" if dp_on else "inf"
        sigma = f"{rs[0]['noise_multiplier']:.3f}" if dp_on else "-"
        spent = f"{max(r['mu_spent'] for r in rs):.3f}" if dp_on else "inf"
        print(f"{mu_key(mu):>6}{eps:>10}{sigma:>9}{spent:>10}{s['metric']:>10.4f}"
              f"{s['metric'] / base:>10.3f}{min(aucs):>8.4f}-{max(aucs):.4f}")
    print("epsilon: spent, at delta; sigma: noise multiplier (noise std sigma*C per coordinate); "
          "vs no-DP: AUC / AUC at mu = inf")

    if args.json:
        doc = {"summary": summary,
               "settings": {"dataset": DATASET, "epochs": epochs, "repeats": repeats,
                            "clip_norm": CLIP_NORM, "delta": DELTA,
                            "max_reassign": MAX_REASSIGN, "mus": [mu_key(m) for m in MUS],
                            "cpu_count": os.cpu_count()},
               "runs": runs}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
