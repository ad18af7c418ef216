"""FedForge from Python: three banks each hold some customers' rows (the same columns);
they release one synthetic table under (ε, δ)-DP per bank, without pooling their rows.

    python examples/fedforge_parties.py --quick

Uses the bundled ``bank`` table split into three parties and its reviewed public schema
(``parties/datasets/bank.schema.toml``: no record decides a column's levels or bins), the
label ``y`` declared there as well. Fits with MST and the ``mbi`` engine in this process,
samples 5,000 rows, reloads the saved model from the run directory and samples again.
Prints ``epsilon_spent``, ``avg_tv`` and the ML utility (AUC of a classifier trained on
the synthetic rows, scored on a real holdout no bank holds). ``--quick`` (CI) keeps 8,000
rows and 10 of the 17 columns (a schema may describe more columns than the rows hold).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from parties.data import load_table
from sim.fedforge import FedForge

REPO = Path(__file__).resolve().parents[1]

#: the reviewed public schema of bank's features, plus its documented label classes
SCHEMA_LABEL = '\n[columns.y]\nkind = "categorical"\ncategories = ["no", "yes"]\n'


#: ``--quick`` (CI): 10 of the 17 columns
QUICK_COLUMNS = ["age", "job", "marital", "balance", "housing", "loan", "contact", "duration",
                 "poutcome", "y"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8,000 rows (2,000 of them the holdout), 10 columns, a short fit (CI)")
    p.add_argument("--out", help="run directory (default: a temporary one)")
    args = p.parse_args()
    frame, label = load_table("bank")
    frame = frame.sample(frac=1.0, random_state=0).reset_index(drop=True)
    if args.quick:
        frame = frame.iloc[:8_000][QUICK_COLUMNS]
    holdout, rows = frame.iloc[:2_000], frame.iloc[2_000:]
    banks = [rows.iloc[i::3] for i in range(3)]  # any list of DataFrames or file paths
    with tempfile.TemporaryDirectory() as tmp:
        schema = Path(tmp) / "bank.schema.toml"
        schema.write_text((REPO / "parties/datasets/bank.schema.toml").read_text()
                          + SCHEMA_LABEL)
        out = args.out or str(Path(tmp) / "run")
        ff = FedForge(epsilon=1.0, delta=1e-9, mechanism="mst", engine="mbi",
                      schema=schema, label=label,
                      config={"engine.iters": 200} if args.quick else None)
        synthetic = ff.fit(banks, holdout=holdout, out=out).sample(5_000, seed=0)
        m = ff.metrics
        print(f"rows {len(synthetic)} columns {len(synthetic.columns)}")
        print("epsilon_spent " + " ".join(f"{k}={v:.3f}" for k, v in ff.epsilon_spent.items()))
        print(f"avg_tv {m['avg_tv']:.4f}")
        print(f"ml_auc synthetic {m['ml_utility']['auc_synthetic']:.3f} "
              f"real {m['ml_utility']['auc_real']:.3f}")
        again = FedForge.load(out).sample(5_000, seed=0)
        print(f"reloaded: same rows {again.equals(synthetic)}")


if __name__ == "__main__":
    main()
