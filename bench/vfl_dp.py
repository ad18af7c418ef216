"""Utility of PubSub-VFL under sound DP for the passive party's records: test AUC vs µ.

What is measured
----------------
Test ROC AUC after the last epoch of the real system (``sim.launch.vfl.run_vfl``: broker and
two party processes, ``pubsub``, 2 + 2 thread workers) on the bundled ``bank`` data and
on ``synthetic`` (``SYNTHETIC_ROWS`` x 100, the default generator), for each
µ ∈ {0.5, 1, 2, 4, 8, ∞} of µ-GDP (the shape of PubSub-VFL's Fig. 5). µ = ∞ is DP off
(no clipping, no noise), run in the same invocation, with the default model and
``epochs_inf`` epochs.

The privacy settings are the product's sound accounting (:mod:`parties.privacy.dp`): replace-one
neighbours; embeddings clipped to C and noised (sensitivity 2C); the passive bottom
model trained with DP-SGD (per-example clipping to C_g, noise), both composed exactly
in one per-record µ-GDP ledger, with no amplification by subsampling; encoders from the
public schema; validation and test records with their own noise. The number of epochs
for each budget is :func:`parties.planning.planner.dp_epochs` (a rule measured on bank: fewer
epochs for smaller µ, since every epoch publishes every record again); the model and the
DP settings are the product's defaults.

The table runs with ``max_reassign = 0`` (nothing is ever reassigned, so nothing is
reserved for it). ``summary["8"]["metric_default_config"]`` is the same µ = 8 bank run in
the product's *default* configuration (``max_reassign = 3``, ``dp_reassign_reserve = 1``:
the noise covers ``epochs + 1`` training publications per record), median of the same
repeats: what reassignment costs a user who changes nothing.

Usage::

    python bench/vfl_dp.py --quick --json /tmp/dp.json   # bank only, 1 repeat
    python bench/vfl_dp.py --json /tmp/dp.json           # bank and synthetic, 3 repeats
    python bench/vfl_dp.py --only-default --json /tmp/dp8.json   # bank, µ = 8 only: the
        # default configuration and max_reassign = 0, 3 repeats each (about 3 min)

Beside every DP result the active-only baseline (:mod:`parties.algorithms.baseline`: the stronger,
by validation AUC, of gradient boosting and an MLP on the active party's own columns,
same split; fitted by the active party after each DP run) is recorded, and
``summary.gain_over_active_only[dataset]["8"]`` is the median over the repeats
of test AUC minus it at µ = 8, for ``bank`` (its default split) and ``adult`` with
:data:`DATASET_SPLITS` (active party: ``age``, ``education``, ``occupation``,
``hours-per-week`` and the label; passive party: the other ten columns)::

    python bench/vfl_dp.py --gain-only --json /tmp/gain.json   # only those, 3 repeats

JSON: ``summary`` maps each µ of bank (``"0.5"`` ... ``"8"``, ``"inf"``) to ``metric``
(test AUC, median over repeats), ``epsilon`` (spent ε at δ; null for ``"inf"``) and
``epochs``; ``summary["8"]["metric_default_config"]`` as above; ``summary["synthetic"]``
holds the same for synthetic (absent with ``--quick``, ``--only-default`` and
``--gain-only``); each DP µ's entry also holds ``active_only`` and ``gain``;
``summary["gain_over_active_only"]`` and ``summary["gain_over_active_only_runs"]`` (each
repeat's gain, test AUC and baseline) as above (``--quick``: bank only); ``settings``
and per-run ``runs`` hold the details (``runs["bank_default_config"]``,
``runs["adult"]``: the adult runs at µ = 8).
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

DATASETS = ("bank", "synthetic")
MUS = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)  # inf: the no-DP baseline
DELTA = 1e-5
MAX_REASSIGN = 0
SYNTHETIC_ROWS = 30_000
#: datasets of ``summary.gain_over_active_only`` and the µ it is reported at
GAIN_DATASETS = ("bank", "adult")
GAIN_MUS = (8.0,)
#: each dataset's party split beyond the default even one: adult as in the DP-utility study (the
#: active party holds age, education, occupation, hours-per-week and the label)
DATASET_SPLITS: dict[str, dict[str, Any]] = {
    "adult": {"data.active_columns": ("age", "education", "occupation", "hours-per-week"),
              "data.passive_columns": ("workclass", "fnlwgt", "educational-num", "marital-status",
                                  "relationship", "race", "gender", "capital-gain",
                                  "capital-loss", "native-country")},
}
#: DP settings of the DP runs beyond the target (empty: the product's defaults, C = 1,
#: C_g = 3, half of µ² to the embeddings; see parties/config/privacy.py); dotted keys
DP_SETTINGS: dict[str, Any] = {}


def mu_key(mu: float) -> str:
    """The summary key of a µ: ``"0.1"``, ``"1"``, ``"10"``, ``"inf"``."""
    return f"{mu:g}"


#: The µ of the default-configuration figure.
DEFAULT_CONFIG_MU = 8.0


def run_one(dataset: str, mu: float, epochs: int, timeout_s: float,
            max_reassign: int | None = MAX_REASSIGN) -> dict[str, Any]:
    """One VFL run at ``mu`` (``inf``: DP off); the figures of interest from its metrics.
    ``max_reassign`` None: the product's default (and its default reassignment reserve)."""
    from parties.config import vfl_config
    from sim.launch.vfl import run_vfl

    extra: dict[str, Any] = {} if math.isinf(mu) else {**DP_SETTINGS, "dp.mu": mu}
    if dataset == "synthetic":
        extra["data.synthetic_rows"] = SYNTHETIC_ROWS
    if max_reassign is not None:
        extra["timeouts.max_reassign"] = max_reassign
    extra.update(DATASET_SPLITS.get(dataset, {}))
    cfg = vfl_config({"dataset": dataset, "epochs": epochs, **extra, "dp.delta": DELTA})
    with tempfile.TemporaryDirectory(prefix=f"vfl_dp_{mu_key(mu)}_") as tmp:
        m = run_vfl(cfg, out=tmp, quiet=True, timeout_s=timeout_s).metrics
    dp = m["dp"]
    return {
        "test_auc": m["test_auc"],
        "epochs": epochs,
        "epsilon": dp["epsilon"],  # None without DP
        "mu_spent": dp["mu"],
        "noise_multiplier": dp["noise_multiplier"],
        "sgd_noise_multiplier": dp.get("sgd_noise_multiplier"),
        "publications_max": dp["publications_max"],
        "publications_planned": dp["publications_planned"],
        "max_reassign": m["config"]["timeouts"]["max_reassign"],
        "reassign_reserve": dp.get("reassign_reserve"),
        "reserve_exhausted_batches": dp.get("reserve_exhausted_batches"),
        "dropped_batches": m["dropped_batches"],
        "reassigned_batches": m["reassigned_batches"],
        "train_wall_s": m["train_wall_s"],
        "launch_wall_s": m["wall_s"],
        "history": [{"epoch": h["epoch"], "loss": h["loss"], "val_auc": h.get("val_auc")}
                    for h in m["history"]],
        # the active party's own columns alone, same split (parties.algorithms.baseline; DP runs)
        "active_only": (m.get("active_only") or {}).get("test_metric"),
        "active_only_model": (m.get("active_only") or {}).get("model"),
    }


def table(dataset: str, repeats: int, epochs_inf: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """All µ of one dataset: ``(summary, runs)``."""
    from parties.planning.planner import dp_epochs

    runs: dict[str, list[dict[str, Any]]] = {mu_key(mu): [] for mu in MUS}
    for rep in range(repeats):
        for mu in MUS:
            epochs = dp_epochs(mu, max_epochs=epochs_inf)
            res = run_one(dataset, mu, epochs, 120.0 + 60.0 * epochs)
            res["repeat"] = rep
            runs[mu_key(mu)].append(res)
            print(f"  {dataset} repeat {rep + 1}/{repeats}  mu {mu_key(mu):>4}  epochs {epochs:>2}  "
                  f"auc {res['test_auc']:.4f}  eps "
                  f"{'inf' if res['epsilon'] is None else format(res['epsilon'], '.3f')}",
                  file=sys.stderr, flush=True)
    summary: dict[str, Any] = {}
    for mu in MUS:
        rs = runs[mu_key(mu)]
        eps = [r["epsilon"] for r in rs]
        summary[mu_key(mu)] = {
            "metric": float(statistics.median(r["test_auc"] for r in rs)),
            "epsilon": None if eps[0] is None else max(eps),
            "epochs": rs[0]["epochs"],
        }
    base = summary["inf"]["metric"]
    print(f"\n{dataset}: test AUC vs µ-GDP of the passive party's records, median of "
          f"{repeats} repeat(s), delta {DELTA:g}")
    print(f"{'mu':>6}{'epochs':>7}{'epsilon':>10}{'sigma_e':>9}{'sigma_g':>9}{'mu spent':>10}"
          f"{'test AUC':>10}{'vs no-DP':>10}{'AUC min-max':>16}")
    for mu in MUS:
        rs, s = runs[mu_key(mu)], summary[mu_key(mu)]
        aucs = [r["test_auc"] for r in rs]
        dp_on = not math.isinf(mu)
        eps = f"{s['epsilon']:.3f}" if dp_on else "inf"
        sig = f"{rs[0]['noise_multiplier']:.3f}" if dp_on else "-"
        sgd = f"{rs[0]['sgd_noise_multiplier']:.3f}" if dp_on else "-"
        spent = f"{max(r['mu_spent'] for r in rs):.3f}" if dp_on else "inf"
        print(f"{mu_key(mu):>6}{s['epochs']:>7}{eps:>10}{sig:>9}{sgd:>9}{spent:>10}"
              f"{s['metric']:>10.4f}{s['metric'] / base:>10.3f}{min(aucs):>8.4f}-{max(aucs):.4f}")
    return summary, runs


def default_config(repeats: int, epochs_inf: int, *, baseline: bool = False
                   ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Bank at µ = 8 in the product's default configuration (reassignment on, the
    default reserve), ``repeats`` runs, and with ``baseline`` as many with
    ``max_reassign = 0`` at the same settings: ``(figures, runs)``."""
    from parties.planning.planner import dp_epochs

    mu = DEFAULT_CONFIG_MU
    epochs = dp_epochs(mu, max_epochs=epochs_inf)
    kinds = {"default_config": None, **({"max_reassign_0": 0} if baseline else {})}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for rep in range(repeats):
        for kind, mr in kinds.items():
            res = run_one("bank", mu, epochs, 120.0 + 60.0 * epochs, max_reassign=mr)
            res["repeat"] = rep
            runs[kind].append(res)
            print(f"  bank {kind} repeat {rep + 1}/{repeats}  mu {mu_key(mu)}  epochs {epochs}  "
                  f"auc {res['test_auc']:.4f}  planned {res['publications_planned']}  "
                  f"reassigned {res['reassigned_batches']}  reserve-dropped "
                  f"{res['reserve_exhausted_batches']}", file=sys.stderr, flush=True)
    fig = {f"metric_{k}": float(statistics.median(r["test_auc"] for r in rs))
           for k, rs in runs.items()}
    fig["epsilon_default_config"] = max(r["epsilon"] for r in runs["default_config"])
    fig["publications_planned_default_config"] = runs["default_config"][0]["publications_planned"]
    print(f"\nbank, mu {mu_key(mu)}, {epochs} epochs, median of {repeats}: default "
          f"configuration (max_reassign 3, dp_reassign_reserve 1) "
          f"{fig['metric_default_config']:.4f}"
          + (f"; max_reassign 0 {fig['metric_max_reassign_0']:.4f}" if baseline else ""))
    return fig, runs


def add_active_only(summary: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    """Put the active-only baseline (the stronger of gradient boosting and an MLP on the
    active party's columns, same split, chosen on the validation rows) beside every DP
    result of one dataset's ``summary``: ``active_only`` and ``gain`` (median test AUC
    minus it)."""
    for key, rs in runs.items():
        base = [r["active_only"] for r in rs if r.get("active_only") is not None]
        if key in summary and base:
            ref = float(statistics.median(base))
            summary[key]["active_only"] = ref
            summary[key]["gain"] = summary[key]["metric"] - ref
    gains = [f"{k} {s['gain']:+.4f}" for k, s in summary.items()
             if isinstance(s, dict) and "gain" in s]
    if gains:
        ref = next(s["active_only"] for s in summary.values()
                   if isinstance(s, dict) and "active_only" in s)
        print(f"active-only baseline (the active party's columns alone, same split) {ref:.4f}; "
              f"test AUC minus it at each mu: {', '.join(gains)}")


def gain_table(datasets: tuple[str, ...], repeats: int, epochs_inf: int,
               done: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """``gain_over_active_only``: for each dataset and µ of :data:`GAIN_MUS`, the median
    over ``repeats`` runs of test AUC minus the active-only baseline's (the baseline is
    deterministic: same split, fixed seeds). Runs already in ``done[dataset][mu]`` (from
    the µ table) are reused; the others are run here and added to ``done``."""
    from parties.planning.planner import dp_epochs

    gains: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    for ds in datasets:
        gains[ds], detail[ds] = {}, {}
        for mu in GAIN_MUS:
            key = mu_key(mu)
            rs = done.setdefault(ds, {}).setdefault(key, [])
            epochs = dp_epochs(mu, max_epochs=epochs_inf)
            while len(rs) < repeats:
                res = run_one(ds, mu, epochs, 120.0 + 60.0 * epochs)
                res["repeat"] = len(rs)
                rs.append(res)
                print(f"  {ds} repeat {len(rs)}/{repeats}  mu {key:>4}  epochs {epochs:>2}  "
                      f"auc {res['test_auc']:.4f}  active-only {res['active_only']:.4f}",
                      file=sys.stderr, flush=True)
            use = rs[:repeats]
            per = [r["test_auc"] - r["active_only"] for r in use]
            gains[ds][key] = float(statistics.median(per))
            detail[ds][key] = {"gains": per, "metric": [r["test_auc"] for r in use],
                               "active_only": [r["active_only"] for r in use],
                               "active_only_model": use[0]["active_only_model"],
                               "epochs": epochs}
            print(f"{ds} mu {key}: gain over active-only {gains[ds][key]:+.4f} (median of "
                  f"{repeats}: {', '.join(f'{g:+.4f}' for g in per)}; active-only "
                  f"{use[0]['active_only']:.4f} {use[0]['active_only_model']})")
    return {"gain_over_active_only": gains, "gain_over_active_only_runs": detail}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="bank only, 1 repeat")
    ap.add_argument("--json", metavar="PATH", help="write summary + per-run details (overwrites)")
    ap.add_argument("--epochs-inf", type=int, default=10, metavar="N",
                    help="epochs of the DP-off run and the cap of the DP runs (default 10)")
    ap.add_argument("--repeats", type=int, metavar="N", help="runs per µ (default: 3, --quick: 1)")
    ap.add_argument("--only-default", action="store_true",
                    help="bank at µ = 8 only: the default configuration (reassignment on) "
                         "and max_reassign = 0, --repeats each (default 3)")
    ap.add_argument("--gain-only", action="store_true",
                    help="only summary.gain_over_active_only: bank and adult at µ = 8 "
                         "(the DP-utility figures), without the µ tables")
    args = ap.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if args.epochs_inf < 1 or repeats < 1:
        ap.error("--epochs-inf and --repeats must be >= 1")
    t0 = time.perf_counter()
    all_runs: dict[str, Any] = {}
    if args.only_default:
        if args.repeats is None:
            repeats = 3
        fig, d_runs = default_config(repeats, args.epochs_inf, baseline=True)
        summary: dict[str, Any] = {mu_key(DEFAULT_CONFIG_MU): {
            "metric": fig["metric_max_reassign_0"], "epsilon": fig["epsilon_default_config"],
            **fig}}
        all_runs["bank_default_config"] = d_runs
    elif args.gain_only:
        summary = {}
    else:
        summary, all_runs["bank"] = table("bank", repeats, args.epochs_inf)
        add_active_only(summary, all_runs["bank"])
        fig, d_runs = default_config(repeats, args.epochs_inf)
        summary[mu_key(DEFAULT_CONFIG_MU)].update(fig)
        all_runs["bank_default_config"] = d_runs
        if not args.quick:
            summary["synthetic"], all_runs["synthetic"] = table("synthetic", repeats,
                                                                args.epochs_inf)
            add_active_only(summary["synthetic"], all_runs["synthetic"])
    gain_sets: tuple[str, ...] = ()
    if not args.only_default:
        gain_sets = ("bank",) if args.quick and not args.gain_only else GAIN_DATASETS
        summary.update(gain_table(gain_sets, repeats, args.epochs_inf, all_runs))
    print(f"total {time.perf_counter() - t0:.0f} s; epsilon: spent, at delta; sigma_e / "
          "sigma_g: embedding / DP-SGD noise multipliers")
    if args.json:
        doc = {"summary": summary,
               "settings": {"datasets": ([] if args.gain_only else ["bank"]
                                         if args.quick or args.only_default
                                         else list(DATASETS)),
                            "only_default": args.only_default,
                            "gain_datasets": list(gain_sets),
                            "gain_mus": [mu_key(m) for m in GAIN_MUS],
                            "dataset_splits": DATASET_SPLITS,
                            "repeats": repeats, "epochs_inf": args.epochs_inf,
                            "delta": DELTA, "max_reassign": MAX_REASSIGN,
                            "dp_settings": DP_SETTINGS, "synthetic_rows": SYNTHETIC_ROWS,
                            "mus": [mu_key(m) for m in MUS], "cpu_count": os.cpu_count()},
               "runs": all_runs}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
