"""Rerun the stochastic tests over many seeds and report each bound's margin.

    python tests/seed_sweep.py --seeds 10 --json /tmp/sweep.json [PYTEST ARGS ...]

Every test whose assertion depends on a trained or sampled result carries the
``stochastic`` marker and states its bounds with ``tests/bounds.py``. This runs
``pytest -m stochastic`` once per sweep seed; each run moves every integer seed that the
tests and the processes they start give numpy, ``random`` and torch
(``tests/seedpatch/sitecustomize.py``), alternates torch's intra-op threads over
``--threads`` and turns on ``torch.use_deterministic_algorithms`` on every other seed, so
the runs take other floating-point paths as another CPU would. It prints, for every
bound, its limit, the worst and median value over the seeds and the margin of the worst
(as a fraction of the limit; and the distance from the median to the limit in standard
deviations of the spread), and for every test how many runs passed. Exit 1 when a test
failed in some run or a bound's margin is negative. Extra arguments go to pytest (paths,
``-k``, ``-n 2``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
PATCH = REPO / "tests" / "seedpatch"


def _outcomes(junit: Path) -> dict[str, str]:
    """``{nodeid-ish: "passed" | "failed: message" | "skipped"}`` from a junit file."""
    out: dict[str, str] = {}
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            out[name] = "failed: " + (bad.get("message") or "")[:200]
        elif case.find("skipped") is not None:
            out[name] = "skipped"
        else:
            out[name] = "passed"
    return out


def run_seed(seed: int, threads: int, deterministic: bool, record: Path,
             pytest_args: list[str], timeout_s: float) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PATCH), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(PSFL_SWEEP_SEED=str(seed), PSFL_SWEEP_TORCH_THREADS=str(threads),
               PSFL_SWEEP_DETERMINISTIC="1" if deterministic else "0",
               PSFL_SWEEP_RECORD=str(record))
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "stochastic", "-q", "-p",
               "no:cacheprovider", "-n", "0", "--durations=0", f"--junitxml={junit}",
               # deterministic algorithms on two threads of a loaded machine can take
               # many times a test's usual time: a hang deadline, not a latency bound
               "-o", "timeout=1800",
               *pytest_args]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        outcomes = _outcomes(junit)
    if proc.returncode not in (0, 1) or not outcomes:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    return {"seed": seed, "threads": threads, "deterministic": deterministic,
            "rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
            "outcomes": outcomes}


def margins(records: list[dict]) -> list[dict]:
    """One row per bound: limit, worst and median over the seeds, margin of the worst."""
    by: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        by.setdefault((r["test"], r["what"]), []).append(r)
    rows = []
    for (test, what), rs in sorted(by.items()):
        op, limit = rs[0]["op"], rs[0]["limit"]
        values = [r["value"] for r in rs]
        worst = max(values) if op == "<" else min(values)
        margin = (limit - worst) if op == "<" else (worst - limit)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        med = statistics.median(values)
        rows.append({"test": test, "what": what, "op": op, "limit": limit,
                     "worst": worst, "median": med, "sd": sd,
                     # how many standard deviations of the spread lie between the median
                     # and the limit (None when the value did not vary)
                     "margin_sd": (abs(limit - med) / sd) if sd > 0 else None,
                     "best": min(values) if op == "<" else max(values),
                     "margin": margin,
                     "margin_frac": margin / abs(limit) if limit else None,
                     "n": len(values), "seeds": sorted({r["seed"] for r in rs})})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10, help="sweep seeds 1..N (default 10)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--threads", default="1,2",
                    help="torch intra-op threads, cycled over the seeds (default 1,2)")
    ap.add_argument("--timeout-s", type=float, default=3600, help="per seed's pytest run")
    ap.add_argument("--json", type=Path, help="write the runs and margins here")
    args, pytest_args = ap.parse_known_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t]
    runs, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(range(args.first_seed, args.first_seed + args.seeds)):
            record = Path(tmp) / f"bounds-{seed}.jsonl"
            run = run_seed(seed, threads[i % len(threads)], deterministic=i % 2 == 1,
                           record=record, pytest_args=pytest_args,
                           timeout_s=args.timeout_s)
            runs.append(run)
            failed = [t for t, o in run["outcomes"].items() if o.startswith("failed")]
            print(f"seed {seed:3d} threads {run['threads']} deterministic "
                  f"{int(run['deterministic'])}: {len(run['outcomes'])} tests, "
                  f"{len(failed)} failed, {run['wall_s']} s", flush=True)
            if record.exists():
                records += [orjson.loads(line) for line in record.read_bytes().splitlines()]
            if args.json:  # after every seed, so a sweep stopped early keeps what it ran
                args.json.write_bytes(orjson.dumps({"runs": runs, "margins": margins(records)},
                                                   option=orjson.OPT_INDENT_2))
    rows = margins(records)
    print(f"\n{'test :: bound':78s} {'limit':>8s} {'worst':>8s} {'median':>8s} "
          f"{'margin':>7s} {'sds':>5s}")
    for r in rows:
        name = f"{r['test'].split('/')[-1]} :: {r['what']}"
        frac = "" if r["margin_frac"] is None else f"{100 * r['margin_frac']:6.0f}%"
        sds = "" if r["margin_sd"] is None else f"{r['margin_sd']:5.1f}"
        print(f"{name[-78:]:78s} {r['op']}{r['limit']:7.4g} {r['worst']:8.4g} "
              f"{r['median']:8.4g} {frac:>7s} {sds:>5s}")
    tests: dict[str, list[str]] = {}
    for run in runs:
        for t, o in run["outcomes"].items():
            tests.setdefault(t, []).append(o)
    print(f"\n{'test':90s} passed/runs")
    bad = False
    for t, os_ in sorted(tests.items()):
        n_pass = sum(o == "passed" for o in os_)
        n_run = sum(o != "skipped" for o in os_)
        bad |= n_pass < n_run
        print(f"{t[-90:]:90s} {n_pass}/{n_run}")
        for o in sorted({o for o in os_ if o.startswith("failed")}):
            print(f"    {o}")
    bad |= any(r["margin"] < 0 for r in rows)
    if args.json:
        args.json.write_bytes(orjson.dumps({"runs": runs, "margins": rows},
                                           option=orjson.OPT_INDENT_2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
