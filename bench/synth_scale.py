"""FedForge at scale: K parties over the real bus, coordinator cost against K.

What is measured
----------------
For each K, real federated runs (``sim.launch.synth.run_synth``: a broker, the
coordinator, one process hosting every aggregator of the tree as asyncio tasks, and
``ceil(K / parties_per_process)`` party processes, each hosting several parties as asyncio
tasks with a bus connection each), with fan-out ``--fanout`` (default 10) and
``--root-children`` nodes reporting to the coordinator (default 1: one top aggregator
under the root, so the coordinator sums one masked vector and one self-mask vector a
round whatever K; 0: the protocol's default tree, whose root has up to ``fanout``
children: 1 at K = 10, 10 at K = 100, which alone made the coordinator's round CPU grow
about 1.5x between them). Unmasking is hierarchical (``--unmask tree``, the default
here; ``synth.secagg.unmask``): leaf aggregators recover their children's self-mask seeds, the
coordinator removes only dropped parties' pair masks. ``--unmask root`` measures the
protocol's default, where the coordinator unmasks (SecAgg+ as published; linear in K).
The job is
kept cheap where the cost does not depend on K: Adult, MST, the ``mbi`` engine with few
iterations and no extra answers, so that most of a run is the protocol.

Figures per K (the median over ``--repeats`` runs):

* ``coordinator_cpu_s``: the coordinator process's CPU seconds (all threads) in the
  aggregation stage alone: the ``round:*`` stages (plan, collect the top-level masked
  sums, the unmask request, collect the reveals, unmask, decode), summed over the run's
  rounds (MST: 3). Not the session's key and seed stages (once per run; reported apart),
  nor synthesis or quality (independent of K). ``coordinator_cpu_s_per_round`` divides it
  by the rounds.
* ``total_aggregation_cpu_s``: ``coordinator_cpu_s`` plus the CPU of the process hosting
  every inner aggregator, over its life less its start-up (interpreter and imports).
* ``coordinator_peak_rss_bytes``: the coordinator process's peak RSS (``VmHWM``) over the
  whole run (synthesis and quality included: it is the process's peak).
* ``wall_s``: end to end, data preparation and process start-up included.
* ``broker_bytes``: bytes the broker forwarded for the run's namespace (every hop).
* ``avg_tv``: the workload's (all 3-way marginals) average TV distance.

``coordinator_cpu_ratio_100_vs_10`` is ``coordinator_cpu_s`` at K = 100 over K = 10: with
a flat (hierarchical) root it stays below 2.

Usage::

    python bench/synth_scale.py --quick --json /tmp/scale.json   # K = 10, 50, 100
    python bench/synth_scale.py                                  # K = 10, 50, 100, 500
    python bench/synth_scale.py --ks 10,100 --fanout 4 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sim.launch.synth import run_synth  # noqa: E402
from synth.config import (  # noqa: E402
    EngineSection, LaunchSection, MstSection, SecAggSection, SynthConfig, TimeoutsSection)

QUICK_KS = (10, 50, 100)
FULL_KS = (10, 50, 100, 500)
SUMMARY_KEYS = ("coordinator_cpu_s", "coordinator_peak_rss_bytes", "wall_s", "broker_bytes",
                "avg_tv", "total_aggregation_cpu_s", "coordinator_cpu_s_per_round")


def make_config(k: int, args: argparse.Namespace) -> SynthConfig:
    """The run config of one K: cheap synthesis, the protocol at full size."""
    return SynthConfig(
        dataset=args.dataset, parties=k, mechanism="mst", epsilon=args.epsilon, seed=0,
        secagg=SecAggSection(fanout=args.fanout, root_children=args.root_children,
                             unmask=args.unmask),
        launch=LaunchSection(parties_per_process=args.parties_per_process),
        engine=EngineSection(name="mbi", iters=args.engine_iters),
        mst=MstSection(extra_mb=0.0),
        timeouts=TimeoutsSection(round_timeout_s=args.round_timeout_s,
                                 handshake_timeout_s=max(120.0, k * 0.5),
                                 # hundreds of bus connections opening at once on 2 cores
                                 connect_timeout_s=60.0))


def one_run(k: int, rep: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One federated run; its figures (see the module docstring)."""
    cfg = make_config(k, args)
    out = root / f"k{k}_r{rep}"
    t0 = time.perf_counter()
    res = run_synth(cfg, out, quiet=True, insecure=not args.curve, rusage=True,
                    timeout_s=args.run_timeout_s)
    m = res.metrics
    ru = m.get("process_rusage", {})
    agg = ru.get("aggregators", {})
    agg_cpu = (agg["cpu_s"] - agg["startup_cpu_s"]) if agg else math.nan
    coord_cpu = float(m["aggregation_cpu_s"])
    stage_cpu = m.get("stage_cpu_s", {})
    parties_cpu = sum(v["cpu_s"] for n, v in ru.items() if n.startswith("parties"))
    return {
        "k": k, "repeat": rep,
        "coordinator_cpu_s": coord_cpu,
        "coordinator_cpu_s_per_round": m["aggregation_cpu_s_per_round"],
        "coordinator_peak_rss_bytes": m.get("peak_rss_bytes"),
        "wall_s": time.perf_counter() - t0,
        "broker_bytes": m.get("bytes_wire"),
        "avg_tv": m.get("avg_tv"),
        "total_aggregation_cpu_s": coord_cpu + agg_cpu,
        "aggregators_process_cpu_s": agg_cpu,
        "aggregators_process_peak_rss_bytes": agg.get("peak_rss_bytes"),
        "coordinator_keys_seeds_cpu_s": sum(v for n, v in stage_cpu.items()
                                            if n in ("keys", "seeds:0")),
        "coordinator_stage_cpu_s": stage_cpu,
        "coordinator_stage_s": m.get("stage_s"),
        "party_processes": sum(1 for n in ru if n.startswith("parties")),
        "parties_processes_cpu_s": parties_cpu,
        "rounds": {n: {"cells": r["cells"], "survivors": r["survivors"],
                       "seconds": r["seconds"]} for n, r in m["rounds"].items()},
        "tree_levels": m.get("tree_levels"),
        "engine": m.get("engine"),
        "run_dir": str(out),
    }


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None and not
            (isinstance(r[key], float) and math.isnan(r[key]))]
    return statistics.median(vals) if vals else None


def summarise(by_k: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for k, runs in by_k.items():
        fig = {key: median_of(runs, key) for key in SUMMARY_KEYS}
        for key in ("coordinator_peak_rss_bytes", "broker_bytes"):
            if fig[key] is not None:
                fig[key] = int(fig[key])
        summary[str(k)] = fig
    c10 = summary.get("10", {}).get("coordinator_cpu_s")
    c100 = summary.get("100", {}).get("coordinator_cpu_s")
    summary["coordinator_cpu_ratio_100_vs_10"] = (c100 / c10) if c10 and c100 else None
    return summary


def print_table(summary: dict[str, Any], by_k: dict[int, list[dict[str, Any]]],
                fanout: str) -> None:
    print(f"\nFedForge scale (fan-out {fanout}; medians over repeats)")
    hdr = (f"{'K':>5} {'coord agg CPU s':>16} {'per round s':>12} {'agg total CPU s':>16} "
           f"{'coord peak RSS MB':>18} {'wall s':>8} {'broker MB':>10} {'avg TV':>8}")
    print(hdr)
    print("-" * len(hdr))

    def f(v: Any, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for k in by_k:
        s = summary[str(k)]
        rss = s["coordinator_peak_rss_bytes"]
        mb = s["broker_bytes"]
        print(f"{k:>5} {f(s['coordinator_cpu_s'], '.4f'):>16} "
              f"{f(s['coordinator_cpu_s_per_round'], '.4f'):>12} "
              f"{f(s['total_aggregation_cpu_s'], '.3f'):>16} "
              f"{f(rss / 2**20 if rss else None, '.0f'):>18} {f(s['wall_s'], '.1f'):>8} "
              f"{f(mb / 1e6 if mb else None, '.2f'):>10} {f(s['avg_tv'], '.4f'):>8}")
    ratio = summary["coordinator_cpu_ratio_100_vs_10"]
    if ratio is not None:
        verdict = "flat (< 2x)" if ratio < 2 else "NOT flat (>= 2x)"
        print(f"\ncoordinator aggregation CPU, K=100 / K=10: {ratio:.2f}x  -> {verdict}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"K in {QUICK_KS} (< 10 min)")
    ap.add_argument("--json", metavar="PATH", help="write the results here")
    ap.add_argument("--ks", help="comma-separated K values (overrides --quick)")
    ap.add_argument("--fanout", type=int, default=10, help="children per aggregator")
    ap.add_argument("--root-children", type=int, default=1,
                    help="nodes reporting to the coordinator (1: one top aggregator; "
                         "0: up to the fan-out, the protocol's default tree)")
    ap.add_argument("--unmask", choices=("tree", "root"), default="tree",
                    help="tree: leaf aggregators remove their children's self masks "
                         "(flat coordinator cost); root: the coordinator unmasks (SecAgg+)")
    ap.add_argument("--parties-per-process", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=3, help="runs per K (median reported)")
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--engine-iters", type=int, default=50)
    ap.add_argument("--round-timeout-s", type=float, default=120.0)
    ap.add_argument("--run-timeout-s", type=float, default=900.0)
    ap.add_argument("--curve", action="store_true",
                    help="CURVE keys on the bus (default: plaintext on loopback)")
    ap.add_argument("--out", help="keep the run directories here (default: a temp dir)")
    args = ap.parse_args(argv)
    ks = (tuple(int(x) for x in args.ks.split(",") if x) if args.ks
          else QUICK_KS if args.quick else FULL_KS)
    t_all = time.perf_counter()
    by_k: dict[int, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="synth_scale_") as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        for k in ks:
            by_k[k] = []
            for rep in range(args.repeats):
                r = one_run(k, rep, args, root)
                by_k[k].append(r)
                print(f"K={k:<4} run {rep + 1}/{args.repeats}: coordinator aggregation CPU "
                      f"{r['coordinator_cpu_s']:.4f} s, wall {r['wall_s']:.1f} s, "
                      f"avg TV {r['avg_tv']:.4f}", flush=True)
    summary = summarise(by_k)
    print_table(summary, by_k, f"{args.fanout}, root children "
                f"{args.root_children or 'up to fan-out'}, unmask {args.unmask}")
    total_s = time.perf_counter() - t_all
    print(f"\ntotal {total_s:.0f} s")
    if args.json:
        doc = {"summary": summary,
               "config": {"ks": list(ks), "fanout": args.fanout,
                          "root_children": args.root_children, "unmask": args.unmask,
                          "parties_per_process": args.parties_per_process,
                          "repeats": args.repeats, "dataset": args.dataset,
                          "epsilon": args.epsilon, "engine_iters": args.engine_iters,
                          "mechanism": "mst", "engine": "mbi", "quick": args.quick,
                          "transport": "curve" if args.curve else "plaintext loopback"},
               "runs": {str(k): runs for k, runs in by_k.items()},
               "total_s": total_s}
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
