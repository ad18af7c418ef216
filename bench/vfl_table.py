"""PubSub-VFL against its baselines: accuracy (Table 1), efficiency and ablation (Table 4).

What is measured
----------------
Every run is the real system via ``sim.launch.vfl.run_vfl`` (broker + two party processes,
CurveZMQ-encrypted and authenticated with keys made for the run, as ``psfl vfl run`` does
by default), with the paper's small model: a 10-layer MLP bottom per party (9 hidden layers of 128,
ReLU, 32-d embedding) and a 2-layer MLP top (hidden 64); B = 256, Adam lr 1e-3 (scaled
by the worker count, ``vfl.lr_scaling``), workers: ``pubsub`` and ``avfl-ps`` 1 active
+ 2 passive, ``vfl-ps`` 2 pairs (:data:`MAIN_WORKERS`; ``worker_mode`` auto: inline
compute on each party's one core), ΔT0 = 5, T_ddl
= 10 s, p = q = 5, one torch thread per party, and each party pinned to its own core
(``vfl.workers.active_cpus`` / ``vfl.workers.passive_cpus``: the first two CPUs this process may use;
both parties share the one CPU on a 1-CPU machine). Seeds 0 … n-1 (split, batch order,
initialisation); the ``synthetic`` table itself is fixed
(``synthetic_seed`` 0, 500 features).

(a) accuracy: the final test metric (AUC, or RMSE in the label's units for
    ``california``), mean ± std over seeds, rows datasets, columns algorithms
    ``vfl, vfl-ps, avfl, avfl-ps, pubsub`` (the shape of the paper's Table 1).
(b) efficiency, per dataset and algorithm (means over seeds): training wall time
    (``train_wall_s``: training + per-epoch evaluation), time to target, CPU
    utilisation of each party, waiting time per epoch of each party (per worker),
    bytes published per epoch (both parties, all channels), training samples/s over
    training time only (Σ per-epoch ``train_s``, evaluation excluded), the ceiling, and
    efficiency = samples/s ÷ ceiling. The ceiling comes from ``psfl vfl profile`` on
    the dataset's config (single-worker compute per party at the run's B, threads and
    pinning; see ``parties/planning/profile.py``), run in its own process before and again after
    the dataset's runs; the two are averaged (``parties.planning.profile.mean_profile``), since
    this machine's speed drifts by 10-20 % over seconds to minutes. An efficiency above
    1.05 means the profile is wrong: it is reported as an error and the script exits
    with code 1 (after writing its output).
(c) ablation (the shape of Table 4): full ``pubsub``; without T_ddl (``t_ddl_s = 0``:
    no deadline dropping; the liveness timeout still applies); without the
    semi-async schedule (``delta_t0 = 1``: every worker syncs with its parameter
    server after every step); without pub/sub (= ``avfl-ps``). Ablation rows run at
    least 6 epochs (ΔT_t only exceeds 1 from epoch 4 on) with 2 workers per party, the
    full-system row included (the main table's ``pubsub`` runs 1 + 2 workers).

Time to target: from each run's per-epoch ``history`` (cumulative wall time since
training started, evaluation included, and the test metric after that epoch): the
first epoch whose metric reaches the target. Targets: bank AUC 0.92, adult AUC 0.90,
synthetic 0.98 × the best final AUC that ``vfl`` reaches over the seeds of this
invocation, california 1.02 × the best (lowest) final RMSE of ``vfl``. Without a
``vfl`` result the relative targets use ``pubsub``'s instead (``target_basis`` in the
JSON says which). A mean time to target is given only when every seed reached it.

Algorithms the config rejects (``vfl.algo``) are recorded as "not available" and
skipped; a run that fails is recorded as "failed" with its error. The script works
with any subset of algorithms.

Per-batch honesty check of a baseline (``--lockstep-vs ALGO``, default ``vfl``): when
that algorithm ran, the minimal lock-step split-learning loop of
``bench/vfl_overhead.py`` runs once per dataset with the same config (seed 0) and its
per-batch training time is compared with the algorithm's (evaluation excluded);
ratio <= 1 means the baseline is no slower than the minimal loop (``no_slower`` in the
JSON allows 5 % of noise).

Run time on 2 shared cores (2026-11-29): ``--quick`` 373-419 s (bank and adult about 115 s
each, synthetic 160 s: 9 runs per dataset, i.e. five algorithms, three ablation rows at
2 + 2 workers and the avfl-ps ablation row, plus two profiles and the lock-step check);
``--quick --seeds 3`` 1,029 s. The full mode (3 seeds, 10 epochs, synthetic
200,000 x 500, whose runs take about 1.5-2 min each, mostly generating the table) takes
well over an hour.

Usage::

    python bench/vfl_table.py --quick --json /tmp/t.json   # 1 seed, bank/adult/synthetic
    python bench/vfl_table.py --json table.json            # 3 seeds, + california, 10 epochs
    python bench/vfl_table.py --algo pubsub --dataset bank --seeds 2

JSON: ``summary`` keyed by dataset, then algorithm, each with ``metric`` (final test
metric, mean over seeds), ``time_to_target_s``, ``cpu_util`` (min over the parties,
mean over seeds) and ``efficiency``, plus per dataset ``speedup_vs_vfl`` (vfl's time to
target ÷ pubsub's); null where not available. ``settings``, ``targets``, ``profiles``,
``status``, ``efficiency``, ``ablation``, ``lockstep`` and per-run ``runs`` hold the
details. ``--md PATH`` (default: the JSON path with ``.md``) writes the tables as
Markdown; they are always printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ALGOS = ("vfl", "vfl-ps", "avfl", "avfl-ps", "pubsub")
FULL_DATASETS = ("bank", "adult", "california", "synthetic")
QUICK_DATASETS = ("bank", "adult", "synthetic")
#: ``--quick --model resnet`` (the shape of the paper's Table 7, the large model): bank
#: only and no ablation (table (c) is Table 4's, with the small model): the three quick
#: datasets with the ablation rows took 2,930 s with the resnet (2026-12-01, loaded)
QUICK_LARGE_DATASETS = ("bank",)
FIXED_TARGETS = {"bank": 0.92, "adult": 0.90}  # AUC
REL_TARGET_AUC = 0.98  # synthetic (and any other binary set): × vfl's best final AUC
REL_TARGET_RMSE = 1.02  # regression: × vfl's best final RMSE
BOTTOM_HIDDEN = (128,) * 9  # 10 linear layers with the 32-d output
EMBEDDING_DIM = 32
TOP_HIDDEN = (64,)  # 2 linear layers
BATCH = 256
#: (w_active, w_passive) of the main table's ``pubsub`` and ``avfl-ps`` runs. With one
#: core per party the passive party needs a second worker to keep an embedding in
#: flight while it waits for a gradient; a second active worker on the same core only
#: adds a second model replica (parameters, gradients, Adam state) to the caches.
#: Measured: ``pubsub`` on synthetic 100,000 x 500, 3 epochs, two runs each: 1 + 2
#: workers 43,790 / 43,325 samples/s (test AUC 0.954), 2 + 2 39,368 / 39,414 (0.938).
#: ``vfl-ps`` pairs its workers, so it runs :data:`ABLATION_WORKERS`.
MAIN_WORKERS = (1, 2)
#: Per-dataset exceptions to :data:`MAIN_WORKERS`. On ``synthetic`` (where speed is
#: judged) the two parties' compute per batch is nearly equal (passive 3.9 ms, active 4.3
#: ms CPU here), so two passive workers, each waiting for its gradient, cannot keep an
#: embedding ready for every active step: 60,000 x 500, 6 epochs, three interleaved pairs
#: of runs, the active party waited 0.34 / 0.49 / 0.37 s of about 4.9 s of training with
#: 1 + 2 workers and 0.03 / 0.05 / 0.07 s with 1 + 4 (1 + 3: 0.34 / 0.26 / 0.16 s). On
#: bank the fourth passive replica costs a little accuracy (test AUC over seeds 0-2, 6
#: epochs: 1 + 2 0.9309 / 0.9285 / 0.9288, 1 + 4 0.9259 / 0.9290 / 0.9277), and bank and
#: adult are latency-bound anyway, so they keep 1 + 2. ``avfl-ps`` gets the same counts.
MAIN_WORKERS_BY_DATASET = {"synthetic": (1, 4)}
#: (w_active, w_passive) of the ablation rows: the w/o-ΔT row needs >= 2 per party.
ABLATION_WORKERS = (2, 2)
SYNTHETIC_FEATURES = 500
#: ``synthetic`` rows in ``--quick`` mode: 60,000 x 500 trains 6 epochs in about 5 s,
#: long enough that one noisy second does not decide the efficiency.
QUICK_SYNTHETIC_ROWS = 60_000
ABLATION_MIN_EPOCHS = 6
ABLATIONS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    # (key, label, how: algo or config changes)
    ("full", "PubSub-VFL (all)", {"algo": "pubsub"}),
    ("no_ddl", "w/o T_ddl (timeouts.t_ddl_s=0)", {"algo": "pubsub", "timeouts.t_ddl_s": 0.0}),
    ("no_dt", "w/o ΔT (workers.delta_t0=1)", {"algo": "pubsub", "workers.delta_t0": 1}),
    ("no_pubsub", "w/o PubSub (= avfl-ps)", {"algo": "avfl-ps"}),
)
EFFICIENCY_LIMIT = 1.05
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- configs


def pick_cpus() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """One CPU for each party: the first two this process may use (the same one twice on
    a 1-CPU machine)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return (cpus[0],), (cpus[1] if len(cpus) > 1 else cpus[0],)


def make_config(algo: str, dataset: str, *, seed: int, epochs: int, settings: dict[str, Any],
                **changes: Any) -> tuple[Any, str | None]:
    """The run's VflConfig, or ``(None, reason)`` when the config rejects ``algo``."""
    from parties.config import vfl_config
    from pubsub.config import ConfigError, deep_merge, expand_dotted

    kw: dict[str, Any] = {
        "algo": algo, "dataset": dataset, "seed": seed, "epochs": epochs, "batch_size": BATCH,
        "workers": {"active": ABLATION_WORKERS[0], "passive": ABLATION_WORKERS[1],
                    "active_cpus": tuple(settings["active_cpus"]),
                    "passive_cpus": tuple(settings["passive_cpus"])},
        "model": {"bottom_hidden": BOTTOM_HIDDEN, "embedding_dim": EMBEDDING_DIM,
                  "top_hidden": TOP_HIDDEN, "bottom": settings.get("model", "mlp")},
        "data": {"synthetic_rows": settings["synthetic_rows"],
                 "synthetic_features": SYNTHETIC_FEATURES}}
    kw = deep_merge(kw, expand_dotted(changes))
    try:
        return vfl_config(kw), None
    except ConfigError as exc:
        if exc.key == "vfl.algo":
            return None, str(exc)
        raise


def main_workers(algo: str, dataset: str = "") -> tuple[int, int]:
    """``(w_active, w_passive)`` of ``algo`` on ``dataset`` in the main table (see
    :data:`MAIN_WORKERS` and :data:`MAIN_WORKERS_BY_DATASET`)."""
    if algo not in ("pubsub", "avfl-ps"):
        return ABLATION_WORKERS
    return MAIN_WORKERS_BY_DATASET.get(dataset, MAIN_WORKERS)


def run_timeout_s(dataset: str, epochs: int, rows: int) -> float:
    """A generous per-run deadline: start-up + data + per-epoch time, times a margin."""
    base = 180.0 + (rows / 1000.0 if dataset == "synthetic" else 0.0)
    return base + 60.0 * epochs + (epochs * rows / 2000.0 if dataset == "synthetic" else 0.0)


# --------------------------------------------------------------------------- one run


def time_to_target(history: list[dict[str, Any]], target: float, lower_is_better: bool
                   ) -> float | None:
    """Wall seconds since training started at the first evaluation that reaches ``target``."""
    for h in history:
        m = h.get("metric")
        if m is None or (isinstance(m, float) and math.isnan(m)):
            continue
        if (m <= target) if lower_is_better else (m >= target):
            return float(h["wall_s"])
    return None


def _per_sample(act: dict[str, Any], pas: dict[str, Any], key: str
                ) -> dict[str, float | None]:
    """Each party's ``key`` (seconds) ÷ its training samples; None where either is absent."""
    return {role: (p[key] / p["samples"] if p.get(key) is not None and p.get("samples")
                   else None) for role, p in (("active", act), ("passive", pas))}


def summarize_run(m: dict[str, Any]) -> dict[str, Any]:
    """The figures the tables need from one run's ``metrics.json``."""
    from parties.runtime.report import training_window_s

    act = m["parties"]["active"]
    pas = m["parties"].get("passive", {})
    epochs = m["epochs"]
    # both parties' clocks per segment (the longer), as metrics.json's train_window_s
    train_s_sum = training_window_s(m["history"], pas.get("history"))
    samples = act["samples"]
    bytes_total = sum(m["bytes_sent"].values())
    return {
        "metric": m["metric"], "metric_name": m["metric_name"],
        "train_wall_s": m["train_wall_s"], "launch_wall_s": m["wall_s"],
        "train_s_sum": train_s_sum, "samples": samples, "batches": act["batches"],
        "train_samples_per_s": samples / train_s_sum if train_s_sum > 0 else 0.0,
        "ms_per_batch": 1e3 * train_s_sum / act["batches"] if act["batches"] else None,
        "cpu_util": {"active": act["cpu_util"], "passive": pas.get("cpu_util")},
        "cpu_util_train": {"active": act.get("cpu_util_train"),
                           "passive": pas.get("cpu_util_train")},
        "wait_s_per_epoch": {"active": act["wait_s_per_epoch"],
                             "passive": pas.get("wait_s_per_epoch")},
        "cores_allotted": {"active": act.get("cores_allotted"),
                           "passive": pas.get("cores_allotted")},
        # CPU seconds per training sample in the workers' step compute (PS syncs
        # excluded), measured in the run itself: the in-run ceiling's input
        "step_cpu_s_per_sample": {"active": act.get("step_cpu_s_per_sample"),
                                  "passive": pas.get("step_cpu_s_per_sample")},
        "cpu_s_per_sample_train": _per_sample(act, pas, "cpu_s_train"),
        "sync_cpu_s_per_sample": _per_sample(act, pas, "sync_cpu_s_train"),
        "bytes_per_epoch": bytes_total / epochs,
        "bytes_sent": m["bytes_sent"],
        "dropped_batches": m["dropped_batches"],
        # window_s: the segment's training seconds over both parties' clocks (the
        # longer), as train_s_sum sums them
        "history": [{"epoch": h["epoch"], "wall_s": h["wall_s"], "train_s": h["train_s"],
                     "window_s": training_window_s([h], [ph] if ph else None),
                     "metric": h.get("metric"), "loss": h["loss"]}
                    for h, ph in zip(m["history"], _padded(pas.get("history"),
                                                           len(m["history"])))],
    }


def _padded(hist: list[dict[str, Any]] | None, n: int) -> list[dict[str, Any] | None]:
    """``hist`` cut or padded with None to ``n`` entries (a passive history that never
    reported, or is shorter, adds nothing to a segment's window)."""
    hist = list(hist or [])[:n]
    return hist + [None] * (n - len(hist))


def training_time_to_target(history: list[dict[str, Any]], target: float,
                            lower_is_better: bool) -> float | None:
    """Training seconds (the segments' ``window_s``, scoring excluded) until the first
    evaluation that reaches ``target``; None if none does."""
    acc = 0.0
    for h in history:
        acc += float(h.get("window_s", h["train_s"]))
        m = h.get("metric")
        if m is None or (isinstance(m, float) and math.isnan(m)):
            continue
        if (m <= target) if lower_is_better else (m >= target):
            return acc
    return None


def run_one(cfg: Any, timeout_s: float) -> dict[str, Any]:
    """One run; ``{"status": "ok", ...figures}`` or ``{"status": "failed", "error": ...}``."""
    from sim.launch.vfl import run_vfl

    with tempfile.TemporaryDirectory(prefix=f"vfl_table_{cfg.algo}_{cfg.dataset}_") as tmp:
        try:
            m = run_vfl(cfg, out=tmp, quiet=True, timeout_s=timeout_s).metrics
        except Exception as exc:  # noqa: BLE001 - one failed run must not end the table
            return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", **summarize_run(m)}


def run_profile(cfg: Any, timeout_s: float = 300.0) -> dict[str, Any] | None:
    """``psfl vfl profile`` of ``cfg`` in a fresh process; its profile.json (None on failure)."""
    from parties.config import dump_vfl_config

    with tempfile.TemporaryDirectory(prefix="vfl_table_profile_") as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(dump_vfl_config(cfg))
        try:
            proc = subprocess.run([sys.executable, "-m", "sim.cli", "vfl", "profile", "--config",
                                   str(path), "--out", tmp], capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"  profile of {cfg.dataset} timed out", file=sys.stderr)
            return None
        if proc.returncode != 0:
            print(f"  profile of {cfg.dataset} failed: {proc.stderr.strip()[-500:]}",
                  file=sys.stderr)
            return None
        return json.loads((Path(tmp) / "profile.json").read_text())


def combine_profiles(found: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The mean of the profiles taken (``parties.planning.profile.mean_profile``), as profile.json,
    with the individual ones under ``"taken"``; None when none was."""
    from parties.planning.profile import compute_profile_from_dict, mean_profile

    if not found:
        return None
    out = mean_profile([compute_profile_from_dict(p) for p in found]).to_dict()
    out["taken"] = found
    return out


def load_overhead_module() -> Any:
    """``bench/vfl_overhead.py`` as a module, by path (``bench`` is not a package)."""
    spec = importlib.util.spec_from_file_location("vfl_overhead", HERE / "vfl_overhead.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- aggregation


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(statistics.fmean(xs)) if xs else None


def _std(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(statistics.stdev(xs)) if len(xs) > 1 else (0.0 if xs else None)


def target_for(dataset: str, task: str, runs: dict[str, list[dict[str, Any]]]
               ) -> tuple[float | None, str]:
    """The dataset's target metric and what it is based on."""
    if dataset in FIXED_TARGETS:
        return FIXED_TARGETS[dataset], "fixed"
    for basis in ("vfl", "pubsub"):
        ok = [r["metric"] for r in runs.get(basis, []) if r["status"] == "ok"
              and r["metric"] is not None and not math.isnan(r["metric"])]
        if ok:
            note = basis if basis == "vfl" else "pubsub (vfl not available)"
            if task == "regression":
                return REL_TARGET_RMSE * min(ok), f"{REL_TARGET_RMSE} x best final RMSE of {note}"
            return REL_TARGET_AUC * max(ok), f"{REL_TARGET_AUC} x best final AUC of {note}"
    return None, "no result to base it on"


def aggregate(runs: list[dict[str, Any]], target: float | None, lower: bool,
              ceiling: float | None) -> dict[str, Any]:
    """Means over the seeds of one (dataset, algorithm) cell."""
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return {"status": runs[0]["status"] if runs else "not run",
                "error": runs[0].get("error") if runs else None}
    for r in ok:
        r["time_to_target_s"] = (time_to_target(r["history"], target, lower)
                                 if target is not None else None)
        r["efficiency"] = (r["train_samples_per_s"] / ceiling) if ceiling else None
    ttt = [r["time_to_target_s"] for r in ok]
    cpu_min = [min(v for v in r["cpu_util"].values() if v is not None) for r in ok]
    return {
        "status": "ok" if len(ok) == len(runs) else "partly failed",
        "seeds": len(ok),
        "metric": _mean([r["metric"] for r in ok]),
        "metric_std": _std([r["metric"] for r in ok]),
        "time_to_target_s": _mean(ttt) if all(t is not None for t in ttt) else None,
        "reached_target": sum(t is not None for t in ttt),
        "cpu_util": _mean(cpu_min),
        "cpu_util_active": _mean([r["cpu_util"]["active"] for r in ok]),
        "cpu_util_passive": _mean([r["cpu_util"]["passive"] for r in ok]),
        "wait_s_per_epoch_active": _mean([r["wait_s_per_epoch"]["active"] for r in ok]),
        "wait_s_per_epoch_passive": _mean([r["wait_s_per_epoch"]["passive"] for r in ok]),
        "bytes_per_epoch": _mean([r["bytes_per_epoch"] for r in ok]),
        "train_wall_s": _mean([r["train_wall_s"] for r in ok]),
        "train_samples_per_s": _mean([r["train_samples_per_s"] for r in ok]),
        "ms_per_batch": _mean([r["ms_per_batch"] for r in ok]),
        "ceiling_samples_per_s": ceiling,
        "efficiency": _mean([r["efficiency"] for r in ok]) if ceiling else None,
        "efficiency_max": max((r["efficiency"] for r in ok), default=None) if ceiling else None,
    }


# --------------------------------------------------------------------------- formatting


def _f(x: Any, fmt: str, dash: str = "—") -> str:
    return dash if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _cell_status(agg: dict[str, Any]) -> str | None:
    st = agg.get("status")
    return None if st in ("ok", "partly failed") else ("n/a" if st == "not available"
                                                        else str(st))


def _metric_cell(agg: dict[str, Any]) -> str:
    """An accuracy cell: the status when there is no metric, else mean ± std."""
    return _cell_status(agg) or f"{agg['metric']:.4f} ± {agg['metric_std']:.4f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def render(doc: dict[str, Any]) -> str:
    """The three tables (and the lock-step check) as Markdown."""
    s = doc["settings"]
    algos, datasets = s["algos"], s["datasets"]
    cells, abl = doc["efficiency"], doc["ablation"]
    parts = [f"# PubSub-VFL vs baselines ({'quick' if s['quick'] else 'full'}: "
             f"{s['epochs']} epochs, seeds {s['seeds']}, B={BATCH}, "
             f"bottom {s['bottom']}, top {s['top']}, cpus active {s['active_cpus']} "
             f"passive {s['passive_cpus']}; {doc['total_s']:.0f} s)", ""]

    parts.append("## (a) Test metric (Table 1 shape): mean ± std over seeds")
    rows = []
    for ds in datasets:
        name = doc["targets"][ds]["metric_name"].upper()
        row = [f"{ds} ({name})"]
        row += [_metric_cell(cells[ds][a]) for a in algos]
        rows.append(row)
    parts += [md_table(["dataset", *algos], rows), ""]

    parts.append("## (b) Efficiency (means over seeds; samples/s and efficiency over "
                 "training time only)")
    rows = []
    for ds in datasets:
        t = doc["targets"][ds]
        for a in algos:
            c = cells[ds][a]
            st = _cell_status(c)
            if st:
                rows.append([ds, a, st] + [""] * 10)
                continue
            rows.append([
                ds, a, _f(c["train_wall_s"], ".1f"),
                _f(c["time_to_target_s"], ".1f") + ("" if c["reached_target"] == c["seeds"]
                                                    else f" ({c['reached_target']}/{c['seeds']})"),
                _f(c["cpu_util_active"], ".2f"), _f(c["cpu_util_passive"], ".2f"),
                _f(c["wait_s_per_epoch_active"], ".2f"), _f(c["wait_s_per_epoch_passive"], ".2f"),
                _f(c["bytes_per_epoch"] / 1e6 if c["bytes_per_epoch"] is not None else None,
                   ".1f"),
                _f(c["train_samples_per_s"], ",.0f"), _f(c["ceiling_samples_per_s"], ",.0f"),
                _f(c["efficiency"], ".2f"), _f(t["target"], ".4f"),
            ])
    parts += [md_table(["dataset", "algo", "train wall s", "time to target s", "cpu act",
                        "cpu pas", "wait/ep act s", "wait/ep pas s", "MB/epoch", "samples/s",
                        "ceiling", "efficiency", "target"], rows), ""]
    sp = [f"{ds}: {_f(doc['summary'][ds]['speedup_vs_vfl'], '.2f')}" for ds in datasets]
    parts += ["speedup vs vfl (vfl's time to target ÷ pubsub's): " + ", ".join(sp), ""]

    if s["ablation"]:
        parts.append(f"## (c) Ablation (Table 4 shape, {s['ablation_epochs']} epochs): test "
                     "metric, mean ± std over seeds")
        rows = []
        for key, label, _ in ABLATIONS:
            row = [label]
            row += [_metric_cell(abl[ds][key]) for ds in datasets]
            rows.append(row)
        parts += [md_table(["variant", *datasets], rows), ""]

    lk = doc.get("lockstep") or {}
    if lk:
        parts.append(f"## Per-batch check: `{s['lockstep_vs']}` vs a minimal lock-step loop "
                     "(seed 0, evaluation excluded)")
        rows = [[ds, _f(v.get("algo_ms_per_batch"), ".3f"),
                 _f(v.get("lockstep_ms_per_batch"), ".3f"), _f(v.get("ratio"), ".2f"),
                 v.get("status", "")] for ds, v in lk.items()]
        parts += [md_table(["dataset", f"{s['lockstep_vs']} ms/batch", "lockstep ms/batch",
                            "ratio", "status"], rows), ""]
    if doc["errors"]:
        parts += ["## Errors", *[f"- {e}" for e in doc["errors"]], ""]
    return "\n".join(parts)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="1 seed; bank, adult, synthetic (60,000 rows); 6 epochs; with "
                    "--model resnet: bank only, no ablation (the Table 7 shape)")
    ap.add_argument("--json", metavar="PATH", help="write summary + details (overwrites)")
    ap.add_argument("--md", metavar="PATH", help="write the tables as Markdown "
                    "(default: the --json path with .md)")
    ap.add_argument("--algo", action="append", metavar="NAME",
                    help=f"algorithm (repeatable; default: {', '.join(ALGOS)})")
    ap.add_argument("--dataset", action="append", metavar="NAME",
                    help="dataset (repeatable; default: bank, adult, california, synthetic; "
                    "--quick: bank, adult, synthetic)")
    ap.add_argument("--seeds", type=int, metavar="N", help="seeds 0..N-1 (default 3, quick 1)")
    ap.add_argument("--epochs", type=int, metavar="N", help="epochs (default 10, quick 6)")
    ap.add_argument("--synthetic-rows", type=int, metavar="N",
                    help="rows of synthetic (default 200000, quick 60000)")
    ap.add_argument("--no-ablation", action="store_true", help="skip table (c)")
    ap.add_argument("--model", choices=["mlp", "resnet"], default="mlp",
                    help="bottom/top models (vfl.model.bottom): mlp (default, the small model "
                    "above) or resnet (the paper's large model, parties.models.zoo defaults)")
    ap.add_argument("--lockstep-vs", default="vfl", metavar="ALGO",
                    help="compare this algorithm's per-batch time with the minimal lock-step "
                    "loop of bench/vfl_overhead.py when it ran (default vfl; 'none' to skip)")
    args = ap.parse_args(argv)

    algos = list(dict.fromkeys(args.algo or ALGOS))
    large_quick = args.quick and args.model != "mlp"
    if large_quick:
        args.no_ablation = True  # Table 7 has no ablation rows
    datasets = list(dict.fromkeys(args.dataset or (
        (QUICK_LARGE_DATASETS if large_quick else QUICK_DATASETS) if args.quick
        else FULL_DATASETS)))
    n_seeds = args.seeds if args.seeds is not None else (1 if args.quick else 3)
    epochs = args.epochs if args.epochs is not None else (6 if args.quick else 10)
    rows = args.synthetic_rows or (QUICK_SYNTHETIC_ROWS if args.quick else 200_000)
    if n_seeds < 1 or epochs < 1 or rows < 1000:
        ap.error("--seeds and --epochs must be >= 1, --synthetic-rows >= 1000")
    seeds = list(range(n_seeds))
    ab_epochs = max(ABLATION_MIN_EPOCHS, epochs)
    active_cpus, passive_cpus = pick_cpus()
    settings: dict[str, Any] = {
        "quick": args.quick, "algos": algos, "datasets": datasets, "seeds": seeds,
        "epochs": epochs, "ablation_epochs": ab_epochs, "batch_size": BATCH,
        "bottom": f"d_in→{'→'.join(map(str, BOTTOM_HIDDEN))}→{EMBEDDING_DIM}",
        "top": f"{2 * EMBEDDING_DIM}→{'→'.join(map(str, TOP_HIDDEN))}→1",
        "bottom_hidden": list(BOTTOM_HIDDEN), "embedding_dim": EMBEDDING_DIM,
        "top_hidden": list(TOP_HIDDEN), "synthetic_rows": rows,
        "synthetic_features": SYNTHETIC_FEATURES,
        "workers": (f"pubsub and avfl-ps {MAIN_WORKERS[0]} + {MAIN_WORKERS[1]} ("
                    + ", ".join(f"{d} {a} + {b}" for d, (a, b) in MAIN_WORKERS_BY_DATASET.items())
                    + f"), vfl-ps "
                    f"{ABLATION_WORKERS[0]} pairs, ablation rows {ABLATION_WORKERS[0]} + "
                    f"{ABLATION_WORKERS[1]} (worker_mode auto: inline, one core per party)"),
        "active_cpus": list(active_cpus), "passive_cpus": list(passive_cpus),
        "cpu_count": os.cpu_count(), "lockstep_vs": args.lockstep_vs,
        "ablation": not args.no_ablation,
        "model": args.model,
    }
    if args.model == "resnet":
        from parties.config import VflConfig as _Cfg

        c = _Cfg()
        settings["bottom"] = (f"resnet d_in→{c.model.resnet_width} x {c.model.resnet_depth} blocks "
                              f"({c.model.resnet_norm} norm)→{EMBEDDING_DIM}")
        settings["top"] = (f"resnet {2 * EMBEDDING_DIM}→{c.model.resnet_width} x "
                           f"{c.model.resnet_depth} blocks→1")

    from parties.config import VflConfig
    from parties.datasets import DATASETS

    t_start = time.perf_counter()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    ab_runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    profiles: dict[str, Any] = {}
    lockstep: dict[str, Any] = {}
    errors: list[str] = []
    status: dict[str, dict[str, str]] = {}

    def progress(msg: str) -> None:
        print(f"  [{time.perf_counter() - t_start:6.0f} s] {msg}", file=sys.stderr, flush=True)

    def do(algo: str, ds: str, seed: int, ep: int, main: bool = False,
           **changes: Any) -> dict[str, Any]:
        workers = dict(zip(("workers.active", "workers.passive"), main_workers(algo, ds), strict=True)
                       ) if main else {}
        cfg, why = make_config(algo, ds, seed=seed, epochs=ep, settings=settings,
                               **workers, **changes)
        if cfg is None:
            return {"status": "not available", "error": why, "seed": seed}
        res = run_one(cfg, run_timeout_s(ds, ep, rows))
        res["seed"] = seed
        shown = (f"{res['metric_name']} {res['metric']:.4f}  {res['train_samples_per_s']:,.0f} "
                 f"samples/s" if res["status"] == "ok" else res["error"][:200])
        progress(f"{ds:<10} {algo:<8} seed {seed} {changes or ''} {ep} ep: {shown}")
        return res

    for ds in datasets:
        task = VflConfig(dataset=ds).effective_task
        lower = task == "regression"
        runs[ds] = {a: [] for a in algos}
        # a profile before the dataset's runs (on an idle machine) and one after them;
        # the ceiling averages the two (the machine's speed drifts over minutes)
        pcfg, _ = make_config("pubsub", ds, seed=0, epochs=epochs, settings=settings)
        before = run_profile(pcfg)
        ceil = before["ceiling_samples_per_s"] if before else None
        progress(f"{ds:<10} profile before the runs: ceiling {_f(ceil, ',.0f')} samples/s")
        unavailable: set[str] = set()
        for seed in seeds:
            # rotate the order each seed so no algorithm always runs first
            for k in range(len(algos)):
                a = algos[(seed + k) % len(algos)]
                if a in unavailable:
                    runs[ds][a].append({"status": "not available", "seed": seed})
                    continue
                res = do(a, ds, seed, epochs, main=True)
                if res["status"] == "not available":
                    unavailable.add(a)
                runs[ds][a].append(res)
        ab_runs[ds] = {}
        if not args.no_ablation:
            for key, _label, how in ABLATIONS:
                changes = {k: v for k, v in how.items() if k != "algo"}
                algo = how["algo"]
                same_workers = main_workers(algo, ds) == ABLATION_WORKERS
                if not changes and ab_epochs == epochs and algo in runs[ds] and same_workers:
                    ab_runs[ds][key] = runs[ds][algo]  # the main runs are this row
                    continue
                ab_runs[ds][key] = [do(algo, ds, seed, ab_epochs, **changes) for seed in seeds]
        after = run_profile(pcfg)
        profiles[ds] = combine_profiles([p for p in (before, after) if p is not None])
        if profiles[ds] is None:
            errors.append(f"{ds}: the profile failed; no ceiling or efficiency")
        else:
            progress(f"{ds:<10} profile after the runs: ceiling "
                     f"{_f(after['ceiling_samples_per_s'] if after else None, ',.0f')}, "
                     f"mean {profiles[ds]['ceiling_samples_per_s']:,.0f} samples/s")
        # per-batch check of a baseline against the minimal lock-step loop
        lv = args.lockstep_vs
        if lv != "none" and args.model != "mlp":
            # bench/vfl_overhead.py's lock-step loop builds the MLP only: no like-for-like
            lockstep[ds] = {"status": f"skipped: the lock-step loop has no {args.model} model"}
        elif lv != "none":
            mine = [r for r in runs[ds].get(lv, []) if r["status"] == "ok" and r["seed"] == 0]
            if not mine:
                lockstep[ds] = {"status": f"skipped: {lv} not available or not run"}
            else:
                cfg0, _ = make_config(lv, ds, seed=0, epochs=epochs, settings=settings)
                try:
                    ref = load_overhead_module().run_lockstep(
                        epochs, run_timeout_s(ds, epochs, rows), cfg=cfg0)
                    ratio = mine[0]["ms_per_batch"] / ref["ms_per_batch"]
                    lockstep[ds] = {"status": "ok", "algo": lv,
                                    "algo_ms_per_batch": mine[0]["ms_per_batch"],
                                    "lockstep_ms_per_batch": ref["ms_per_batch"],
                                    "ratio": ratio, "no_slower": ratio <= 1.05,
                                    "lockstep_metric": ref.get("metric"),
                                    "lockstep_train_s": ref["train_s"]}
                    progress(f"{ds:<10} lockstep {ref['ms_per_batch']:.3f} ms/batch, {lv} "
                             f"{mine[0]['ms_per_batch']:.3f} (ratio {ratio:.2f})")
                except Exception as exc:  # noqa: BLE001 - reported, the table goes on
                    lockstep[ds] = {"status": f"failed: {type(exc).__name__}: {exc}"}

    # ------------------------------------------------------------------ aggregate
    targets: dict[str, Any] = {}
    cells: dict[str, dict[str, Any]] = {}
    ablation: dict[str, dict[str, Any]] = {}
    summary: dict[str, dict[str, Any]] = {}
    for ds in datasets:
        task = VflConfig(dataset=ds).effective_task
        lower = task == "regression"
        target, basis = target_for(ds, task, runs[ds])
        targets[ds] = {"target": target, "basis": basis, "task": task,
                       "metric_name": "rmse" if lower else "auc",
                       "lower_is_better": lower, "source": DATASETS[ds].name
                       if ds in DATASETS else ds}
        ceil = profiles[ds]["ceiling_samples_per_s"] if profiles.get(ds) else None
        cells[ds] = {a: aggregate(runs[ds][a], target, lower, ceil) for a in algos}
        ablation[ds] = {key: aggregate(ab_runs[ds].get(key, []), target, lower, None)
                        if ab_runs[ds].get(key) else {"status": "not run"}
                        for key, _l, _h in ABLATIONS}
        status[ds] = {a: cells[ds][a]["status"] for a in algos}
        summary[ds] = {}
        for a in algos:
            c = cells[ds][a]
            ok = c["status"] in ("ok", "partly failed")
            summary[ds][a] = {k: (c.get(k) if ok else None)
                              for k in ("metric", "time_to_target_s", "cpu_util", "efficiency")}
            for r in runs[ds][a]:
                if r.get("efficiency") is not None and r["efficiency"] > EFFICIENCY_LIMIT:
                    errors.append(f"{ds} {a} seed {r['seed']}: efficiency "
                                  f"{r['efficiency']:.3f} > {EFFICIENCY_LIMIT}: the profile "
                                  "under-states the compute")
        t_vfl = (summary[ds].get("vfl") or {}).get("time_to_target_s")
        t_ps = (summary[ds].get("pubsub") or {}).get("time_to_target_s")
        summary[ds]["speedup_vs_vfl"] = (t_vfl / t_ps) if t_vfl and t_ps else None

    doc = {"summary": summary, "settings": settings, "targets": targets, "status": status,
           "profiles": profiles, "efficiency": cells, "ablation": ablation,
           "lockstep": lockstep, "errors": errors,
           "total_s": time.perf_counter() - t_start,
           # ablation rows that reuse the main runs are not repeated here
           "runs": {ds: {"main": runs[ds],
                         "ablation": {k: v for k, v in ab_runs[ds].items()
                                      if all(v is not r for r in runs[ds].values())}}
                    for ds in datasets}}
    text = render(doc)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    md = args.md or (str(Path(args.json).with_suffix(".md")) if args.json else None)
    if md:
        Path(md).write_text(text + "\n")
    if errors:
        print(f"error: {len(errors)} problem(s), see above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
