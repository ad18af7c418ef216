"""FedForge streaming workload updates against a full re-run.

What is measured
----------------
1. ``base``: a FedForge run (``sim.launch.synth.run_synth``: broker, coordinator,
   aggregators and K party processes) with ``stream.rho_frac`` of ρ held back.
2. ``incremental``: ``sim.launch.synth.add_workload`` on that finished run (and on a copy
   of it with ``stream.refit = "gum"``, the other incremental refit) with a workload
   of ``--new`` 3-way marginals that no round measured (drawn with a fixed seed among the
   3-way cliques within ``max_cells``): the run is reopened (the parties continue their
   ledgers), only those marginals are measured, with the whole stream reserve, and the
   model is refitted warm from the saved one. Wall time from the call to its return.
3. ``full_rerun``: what a user without streaming updates does: the whole job again from
   scratch with the same config and the workload queued before it starts (measured in the
   same extra round with the same reserve, then one fit from scratch). Wall time of
   ``run_synth``.

Reported: the wall-time ratio incremental / full re-run and the total variation distance
of each on the new marginals against the pooled real data (the error the update is for),
with the ratio of the two. The same config, seeds and noise seeds for both.

Usage::

    python bench/synth_stream.py --json /tmp/stream.json       # adult, K=5, eps 1
    python bench/synth_stream.py --quick                       # bank, K=3
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402


def _new_marginals(run_dir: Path, k: int, seed: int, max_cells: int) -> list[list[str]]:
    """``k`` 3-way cliques no round of the run measured, within ``max_cells`` cells of the
    full domain, drawn with ``seed``."""
    from synth.checkpoint import read_json
    from synth.domain import Schema
    from synth.workload import measured_cliques

    schema = Schema.from_dict(read_json(run_dir / "schema.json"))
    dom = schema.domain
    measured = measured_cliques(run_dir)
    cands = [c for c in itertools.combinations(dom.attributes, 3)
             if frozenset(c) not in measured and dom.size(c) <= max_cells]
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(cands), size=min(k, len(cands)), replace=False)
    return [list(cands[i]) for i in sorted(pick)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="bank, K=3 (a few minutes)")
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--parties", type=int, default=None)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--new", type=int, default=5, help="new 3-way marginals (default 5)")
    ap.add_argument("--engine", default="mbi", choices=("mbi", "neural"))
    ap.add_argument("--stream-rho-frac", type=float, default=0.2)
    ap.add_argument("--max-cells", type=int, default=2000,
                    help="largest new marginal (cells of the full domain)")
    ap.add_argument("--out", help="keep the run directories here (default: a temp dir)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    from sim.launch.synth import add_workload, run_synth
    from synth.config import (EngineSection, LaunchSection, SecAggSection, StreamSection,
                              SynthConfig, TimeoutsSection)

    dataset = args.dataset or ("bank" if args.quick else "adult")
    parties = args.parties or (3 if args.quick else 5)
    cfg = SynthConfig(dataset=dataset, parties=parties, epsilon=args.epsilon, seed=1,
                      noise_seed=7, stream=StreamSection(rho_frac=args.stream_rho_frac),
                      engine=EngineSection(name=args.engine),
                      launch=LaunchSection(parties_per_process=parties),
                      secagg=SecAggSection(fanout=4),
                      timeouts=TimeoutsSection(round_timeout_s=30.0))
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="synth-stream-"))
    root.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    base = run_synth(cfg, root / "base", quiet=True, timeout_s=1800).metrics
    base_s = time.perf_counter() - t0
    new = _new_marginals(root / "base", args.new, seed=3, max_cells=args.max_cells)
    queries = {"marginals": new, "rho_share": 1.0}
    print(f"{dataset}, K={parties}, eps {args.epsilon:g}: base run {base_s:.1f} s; "
          f"adding {len(new)} new 3-way marginals: {new}", flush=True)

    import shutil

    shutil.copytree(root / "base", root / "base_gum")
    t0 = time.perf_counter()
    rep = add_workload(root / "base", queries, quiet=True, timeout_s=1800)
    inc_s = time.perf_counter() - t0
    inc_metrics = rep.pop("metrics")
    # the other incremental refit: the records moved towards the new marginals (gum)
    cfg_toml = (root / "base_gum" / "config.toml").read_text()
    (root / "base_gum" / "config.toml").write_text(
        cfg_toml.replace('refit = "warm"', 'refit = "gum"'))  # [synth.stream] refit
    t0 = time.perf_counter()
    rep_gum = add_workload(root / "base_gum", queries, quiet=True, timeout_s=1800)
    gum_s = time.perf_counter() - t0
    rep_gum.pop("metrics")

    t0 = time.perf_counter()
    full = run_synth(cfg, root / "full_rerun", quiet=True, timeout_s=1800,
                     workload=queries).metrics
    full_s = time.perf_counter() - t0
    full_rep = full["workload_updates"][0]

    summary = {
        "update_wall_s": inc_s, "full_rerun_wall_s": full_s, "wall_ratio": inc_s / full_s,
        "tv_new_before": rep.get("tv_before"), "tv_new_incremental": rep.get("tv_after"),
        "tv_new_full_rerun": full_rep.get("tv_after"),
        "tv_ratio": (rep["tv_after"] / full_rep["tv_after"]
                     if rep.get("tv_after") and full_rep.get("tv_after") else None),
        "gum_update_wall_s": gum_s, "gum_wall_ratio": gum_s / full_s,
        "tv_new_gum": rep_gum.get("tv_after"),
        "gum_tv_ratio": (rep_gum["tv_after"] / full_rep["tv_after"]
                         if rep_gum.get("tv_after") and full_rep.get("tv_after") else None),
    }
    detail: dict[str, Any] = {
        "dataset": dataset, "parties": parties, "epsilon": args.epsilon, "engine": args.engine,
        "stream_rho_frac": args.stream_rho_frac, "new_marginals": new,
        "base_wall_s": base_s, "base_avg_tv": base.get("avg_tv"),
        "incremental": {**rep, "stage_s": inc_metrics.get("stage_s")},
        "incremental_gum": rep_gum,
        "full_rerun": {"stage_s": full.get("stage_s"), "avg_tv": full.get("avg_tv"),
                       "update": full_rep},
        "ledger_within_plan": inc_metrics.get("ledger_within_plan"),
    }
    print(f"{'':24}{'wall s':>9}{'TV new':>9}")
    print(f"{'before the update':24}{'':>9}{summary['tv_new_before'] or float('nan'):9.4f}")
    print(f"{'incremental (warm)':24}{inc_s:9.1f}{summary['tv_new_incremental'] or float('nan'):9.4f}")
    print(f"{'incremental (gum)':24}{gum_s:9.1f}{summary['tv_new_gum'] or float('nan'):9.4f}")
    print(f"{'full re-run':24}{full_s:9.1f}{summary['tv_new_full_rerun'] or float('nan'):9.4f}")
    for label, w, tr in (("warm", summary["wall_ratio"], summary["tv_ratio"]),
                         ("gum", summary["gum_wall_ratio"], summary["gum_tv_ratio"])):
        print(f"{label}: wall ratio {w:.2f} (target <= 0.30); TV ratio "
              f"{'n/a' if tr is None else round(tr, 3)} (target <= 1.10)")
    print(f"incremental stages: { {k: round(v, 2) for k, v in (inc_metrics.get('stage_s') or {}).items() if k in ('schema', 'keys:1', 'round:wl0', 'synthesis', 'quality')} }")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "detail": detail},
                                              indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
