"""Keep a trained model and use it: train, reload each party's saved part, score the test
split again (the same AUC), then score new rows by their ID.

    python examples/predict_saved.py --quick

Each party saved its own part in ``RUN_DIR/model/<role>/`` (docs/reference/saved-models.md): the passive
party its bottom model and encoders, the active party its bottom, the top model and its
encoders. Prediction is joint: each party reads only its own columns of the new rows and
the passive party's embeddings cross the bus, as in training.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from parties.data import load_table
from sim.api import VflJob, predict, train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8,000 rows, 2 epochs (CI)")
    args = p.parse_args()
    frame, label = load_table("bank")
    if args.quick:
        frame = frame.sample(n=8000, random_state=0).reset_index(drop=True)
    frame.insert(0, "id", [f"client-{i:06d}" for i in range(len(frame))])
    features = [c for c in frame.columns if c not in ("id", label)]
    job = VflJob(data=frame, label=label, active_columns=features[:6],
                 passive_columns=features[6:], config={"epochs": 2 if args.quick else 5})
    root = Path(tempfile.mkdtemp(prefix="psfl-example-"))
    result = train(job, root / "run")
    print(f"trained: test_auc {result.test_auc:.6f}")

    part = result.load("active")  # torch modules in eval mode, the encoder, the manifest
    print(f"active part: {type(part.modules[0]).__name__} + {type(part.modules[1]).__name__}, "
          f"columns {list(part.manifest['columns'])}")

    again = predict(result.out, root / "predict-test")
    print(f"predicted the test split: test_auc {again.summary['metric']:.6f}")

    new_rows = frame.sample(n=500, random_state=1)
    new_rows.drop(columns=[label]).to_csv(root / "new.csv", index=False)
    scored = predict(result.out, root / "predict-new", data=root / "new.csv", id_column="id")
    print(f"scored {scored.summary['rows']} new rows: {scored.predictions}")


if __name__ == "__main__":
    main()
