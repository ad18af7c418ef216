"""The many-core check: the paper's 50:14 split scaled to this machine, run for real and
set beside the simulator's prediction, as one prepared script.

Meant for a machine with at least 8 cores (the project's 16-core device: 50:14 of 64
cores becomes 12.5 : 3.5), in at most about 8 minutes. On fewer cores it refuses unless
``--force`` (a plumbing check; the figures then say nothing about many cores).

Steps, each a subprocess with a deadline:

1. **Prediction**: ``python bench/des_validate.py --quick --split-cores N --json
   OUT/des.json``: the discrete-event simulator fitted on *this* machine (batch-size
   sweep, one calibration run, two validation runs), then the paper's four core splits
   scaled to N cores with the feature split balanced to the cores and one process
   worker per started core (``paper_splits`` rows; their ``cores`` are the scaled
   shares).
2. **Measurement**: ``python bench/hetero.py --quick --splits 50:14 --algos
   vfl,avfl,avfl-ps,pubsub --workers WA+WP --set worker_mode=process --json
   OUT/hetero.json``: broker and parties as processes, each party in its own cgroup CPU
   quota of the scaled share, ``pubsub`` and ``avfl-ps`` with one process worker per
   started core (WA = ⌈12.5⌉ = 13, WP = ⌈3.5⌉ = 4 at 16 cores), as the prediction has
   them. The bottom widths are :mod:`bench.hetero`'s hand balance for 50:14 (9x128
   passive, 9x288 active), the prediction's balance is exact: say so when comparing.
3. **Comparison** (:func:`compare`): per algorithm, throughput speedup over ``vfl``
   (training samples/s ratio) predicted and measured, with the relative error; the
   measured time-to-target speedup and CPU use beside them (the simulator predicts
   throughput only).

Usage::

    python bench/many_core.py --json many_core.json            # >= 8 cores, ~8 min
    python bench/many_core.py --force --out /tmp/mc             # plumbing check, 2 cores

Output (``--json``): ``{"machine_cores", "split", "cores", "rows": [{algo,
predicted_speedup, measured_speedup, rel_err, measured_ttt_speedup, cpu_util_active,
cpu_util_passive, ...}], "commands", "step_s", "errors"}``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: The split measured for real (the paper's headline one).
SPLIT = "50:14"
#: The algorithms measured (``vfl-ps`` and ``pubsub_planned`` are left out for time:
#: hetero's ``vfl-ps`` has 2 pairs where the prediction has one worker per core, and the
#: planner's pilots take minutes).
ALGOS = ("vfl", "avfl", "avfl-ps", "pubsub")
#: The fewest cores this check means anything on.
MIN_CORES = 8
#: Deadlines of the two steps, seconds.
DES_TIMEOUT_S = 240
HETERO_TIMEOUT_S = 420


def worker_counts(total_cores: float, split: str = SPLIT) -> tuple[float, float, int, int]:
    """``(active cores, passive cores, w_active, w_passive)`` of ``split`` (of 64 cores)
    scaled to ``total_cores``: one worker per started core.

    Raises:
        ValueError: a malformed split or ``total_cores`` not > 0.
    """
    if not total_cores > 0:
        raise ValueError(f"total_cores must be > 0, got {total_cores!r}")
    try:
        a, p = (float(v) for v in split.split(":"))
    except ValueError:
        raise ValueError(f"split must be 'A:P', got {split!r}") from None
    if not (a > 0 and p > 0):
        raise ValueError(f"split must be 'A:P' with both > 0, got {split!r}")
    ca, cp = total_cores * a / (a + p), total_cores * p / (a + p)
    return ca, cp, math.ceil(ca - 1e-9), math.ceil(cp - 1e-9)


def compare(des_doc: Mapping[str, Any], hetero_doc: Mapping[str, Any],
            split: str = SPLIT) -> list[dict[str, Any]]:
    """Per measured algorithm of ``split``: the simulator's throughput speedup over
    ``vfl`` (``des_doc["paper_splits"]``) beside the measured one (hetero's
    ``summary[split][algo]["train_samples_per_s"]`` over ``vfl``'s) and their relative
    error |pred − meas| / meas, with hetero's measured ``speedup_vs_vfl`` (time to
    target) and CPU use. An algorithm missing on either side gets None where it lacks
    figures."""
    pred = {r["algo"]: r for r in des_doc.get("paper_splits") or [] if r.get("split") == split}
    meas = ((hetero_doc.get("summary") or {}).get(split)) or {}
    base = (meas.get("vfl") or {}).get("train_samples_per_s")
    rows: list[dict[str, Any]] = []
    for algo in ALGOS:
        p, m = pred.get(algo) or {}, meas.get(algo) or {}
        ps = p.get("throughput_speedup_vs_vfl")
        sps = m.get("train_samples_per_s")
        ms = sps / base if sps and base else None
        rows.append({"algo": algo,
                     "workers_predicted": ([p["w_active"], p["w_passive"]]
                                           if "w_active" in p else None),
                     "predicted_speedup": ps, "measured_speedup": ms,
                     "rel_err": abs(ps - ms) / ms if ps is not None and ms else None,
                     "predicted_util_total": p.get("util_total"),
                     "measured_ttt_speedup": m.get("speedup_vs_vfl"),
                     "measured_samples_per_s": sps,
                     "cpu_util_active": m.get("cpu_util_active"),
                     "cpu_util_passive": m.get("cpu_util_passive"),
                     "metric": m.get("metric")})
    return rows


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def print_rows(rows: Sequence[Mapping[str, Any]], cores: tuple[float, float]) -> None:
    print(f"\n{SPLIT} of 64 cores scaled to {cores[0]:g}:{cores[1]:g}; throughput speedup "
          "over vfl predicted (simulator) and measured; time to target measured only")
    print(f"  {'algo':<8} {'pred x vfl':>10} {'meas x vfl':>10} {'err':>7} {'ttt x vfl':>9} "
          f"{'cpu act':>8} {'cpu pas':>8} {'AUC':>7}")
    for r in rows:
        err = r["rel_err"]
        print(f"  {r['algo']:<8} {_f(r['predicted_speedup']):>10} "
              f"{_f(r['measured_speedup']):>10} "
              f"{'n/a' if err is None else f'{100 * err:.1f}%':>7} "
              f"{_f(r['measured_ttt_speedup']):>9} {_f(r['cpu_util_active']):>8} "
              f"{_f(r['cpu_util_passive']):>8} {_f(r['metric'], '.4f'):>7}")


def _run(cmd: list[str], timeout_s: float, errors: list[str]) -> float:
    """Run one step; its wall seconds. A failure or a missed deadline is recorded in
    ``errors`` (the other step still runs)."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        rc = subprocess.run(cmd, timeout=timeout_s, check=False).returncode
        if rc != 0:
            errors.append(f"{cmd[1]} exited {rc}")
    except subprocess.TimeoutExpired:
        errors.append(f"{cmd[1]} ran past its {timeout_s:.0f} s deadline")
    return time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/many_core"),
                    help="where the two steps' JSON go (default runs/many_core)")
    ap.add_argument("--json", type=Path, help="write the comparison here")
    ap.add_argument("--force", action="store_true",
                    help=f"run on fewer than {MIN_CORES} cores (a plumbing check only)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from sim.cluster.cpu import machine_cores

    n = machine_cores()
    if n < MIN_CORES and not args.force:
        print(f"error: this machine has {n} cores; the many-core check needs at least "
              f"{MIN_CORES} (--force runs it anyway as a plumbing check)", file=sys.stderr)
        return 2
    ca, cp, wa, wp = worker_counts(n)
    args.out.mkdir(parents=True, exist_ok=True)
    des_json, het_json = args.out / "des.json", args.out / "hetero.json"
    py = sys.executable
    cmds = [[py, str(HERE / "des_validate.py"), "--quick", "--split-cores", f"{n:g}",
             "--json", str(des_json)],
            [py, str(HERE / "hetero.py"), "--quick", "--splits", SPLIT, "--algos",
             ",".join(ALGOS), "--workers", f"{wa}+{wp}", "--set", "workers.mode=process",
             "--json", str(het_json)]]
    errors: list[str] = []
    t0 = time.perf_counter()
    step_s = [_run(cmds[0], DES_TIMEOUT_S, errors), _run(cmds[1], HETERO_TIMEOUT_S, errors)]
    docs = []
    for path in (des_json, het_json):
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            errors.append(f"{path}: {type(exc).__name__}: {exc}")
            docs.append({})
    rows = compare(docs[0], docs[1])
    print_rows(rows, (ca, cp))
    doc = {"machine_cores": n, "split": SPLIT, "cores": [ca, cp], "workers": [wa, wp],
           "rows": rows, "commands": [" ".join(c) for c in cmds], "step_s": step_s,
           "total_s": time.perf_counter() - t0, "forced": n < MIN_CORES, "errors": errors,
           "note": "prediction: feature split balanced exactly to the cores; measurement: "
                   "bench/hetero.py's hand-set widths for 50:14"}
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2, default=float))
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
