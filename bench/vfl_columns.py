"""Column treatments on a traffic-shaped table: a 40,000-level date-time column and an ID
column cost no more memory than the table without them (a check of the table generator).

What runs: :func:`parties.data.demo_tables.make_traffic` writes two CSV files with the same rows and
values, one with the ``date_time`` (about 40,600 distinct values in 48,204 rows) and
``record_id`` (unique) columns and one without; ``psfl vfl run`` (broker + two party
processes, the default split, label ``traffic``) trains ``pubsub`` on each for the same
epochs. Read from each run's ``metrics.json``: every party's peak resident set
(``parties.*.peak_rss_mb``, ``ru_maxrss``: loading and encoding included), the test AUC,
the positive class and each column's treatment; from the parties' output, the warning
naming the dropped ID column. The check: the largest party's peak with the two columns
over its peak without them, <= 1.2 (``rss_ratio``).

Before the treatments (one-hot of every categorical), the date-time column alone became
tens of thousands of dense columns and a party died at 13.8 GB; ``--one-hot-everything``
runs that path (``onehot_max_levels`` above the levels, ``id_columns = "keep"``) under a
memory limit of ``--one-hot-limit-mb`` (default 4096) so its failure is shown without
taking the machine down.

Usage: ``python bench/vfl_columns.py [--rows 48204] [--epochs 3] --json OUT.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parties.data.demo_tables import TRAFFIC_LABEL, make_traffic  # noqa: E402


def _run(csv: Path, out: Path, epochs: int, extra: list[str], timeout_s: float,
         mem_limit_mb: float | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "sim.cli", "vfl", "run", "--dataset", str(csv),
           "--out", str(out), "--set", f"label={TRAFFIC_LABEL}", "--set", f"epochs={epochs}",
           "--set", "eval_every=1000", *extra]
    preexec = None
    if mem_limit_mb is not None:
        import resource

        cap = int(mem_limit_mb * 2 ** 20)

        def preexec() -> None:  # the launcher and every process it starts
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          preexec_fn=preexec)
    wall = time.perf_counter() - t0
    rec: dict[str, Any] = {"exit_code": proc.returncode, "wall_s": round(wall, 1)}
    text = proc.stdout + proc.stderr
    rec["id_warning"] = [line.strip() for line in text.splitlines()
                         if "vfl.column_dropped" in line or "dropped as ID-like" in line]
    mpath = out / "metrics.json"
    if proc.returncode != 0 or not mpath.exists():
        rec["error_tail"] = text[-1500:]
        return rec
    m = json.loads(mpath.read_text())
    rec.update(auc=m.get("test_auc"), label_positive=m.get("label_positive"),
               train_samples_per_s=m.get("train_samples_per_s"),
               peak_rss_mb={p: v.get("peak_rss_mb") for p, v in m["parties"].items()},
               n_features={p: v.get("n_features") for p, v in m["parties"].items()},
               treatments={p: v.get("treatments") for p, v in m["parties"].items()})
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=48_204)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--one-hot-everything", action="store_true",
                    help="also run the old treatment (one-hot of every level) under a cap")
    ap.add_argument("--one-hot-limit-mb", type=float, default=4096.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vfl_columns_") as tmp:
        d = Path(tmp)
        full, plain = d / "traffic.csv", d / "traffic_plain.csv"
        make_traffic(args.rows, seed=args.seed).to_csv(full, index=False)
        make_traffic(args.rows, seed=args.seed, time_and_id=False).to_csv(plain, index=False)
        res: dict[str, Any] = {"rows": args.rows, "epochs": args.epochs}
        res["with_time_and_id"] = _run(full, d / "full", args.epochs, [], args.timeout_s)
        res["without"] = _run(plain, d / "plain", args.epochs, [], args.timeout_s)
        if args.one_hot_everything:
            res["one_hot_everything"] = _run(
                full, d / "onehot", args.epochs,
                ["--set", "data.onehot_max_levels=1000000", "--set", "data.id_columns=keep"],
                args.timeout_s, mem_limit_mb=args.one_hot_limit_mb)
    a, b = res["with_time_and_id"], res["without"]
    ok = a["exit_code"] == 0 and b["exit_code"] == 0
    if ok:
        res["peak_rss_mb_with"] = max(a["peak_rss_mb"].values())
        res["peak_rss_mb_without"] = max(b["peak_rss_mb"].values())
        res["rss_ratio"] = round(res["peak_rss_mb_with"] / res["peak_rss_mb_without"], 3)
        res["id_warning_names_the_column"] = any("record_id" in w for w in a["id_warning"])
        ok = res["rss_ratio"] <= 1.2 and res["id_warning_names_the_column"]
    res["pass"] = ok
    text = json.dumps(res, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    for name in ("with_time_and_id", "without", "one_hot_everything"):
        r = res.get(name)
        if r:
            print(f"{name:>18}: exit {r['exit_code']}, auc {r.get('auc')}, peak RSS "
                  f"{r.get('peak_rss_mb')} MiB, features {r.get('n_features')}, "
                  f"{r['wall_s']} s")
    if ok:
        print(f"peak RSS ratio {res['rss_ratio']} (<= 1.2), positive class "
              f"{a['label_positive']!r}, warning: {a['id_warning'][:1]}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
