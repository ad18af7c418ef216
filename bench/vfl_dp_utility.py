"""What moves VFL's test AUC under DP relative to the active-only baseline.

Each variant is a list of ``--set``-style overrides of the product's defaults; every run
is PubSub-VFL in one process over the in-memory bus (``sim.launch.local.run_vfl_in_process``)
at µ = ``--mu`` (default 8), and the active-only baseline (:mod:`parties.algorithms.baseline`: the
stronger of gradient boosting and an MLP on the active party's columns, chosen on the
validation rows) is fitted once per dataset on the same split and reported beside it.

Datasets: ``bank`` (the default even split: ``age`` … ``loan`` with the active party)
and ``adult`` with the issue's split (:data:`ADULT_ACTIVE`: the active party holds
``age``, ``education``, ``occupation``, ``hours-per-week`` and the label, the passive
party the other ten columns).

Usage::

    python bench/vfl_dp_utility.py --quick --json /tmp/u.json        # defaults, 1 repeat
    python bench/vfl_dp_utility.py --dataset adult --variant "" \\
        --variant "model.embedding_dim=4" --variant "epochs=1;dp.embedding_share=0.8" \\
        --repeats 2 --json /tmp/u.json

A variant is ``key=value`` items separated by ``;`` (``epochs`` defaults to
:func:`parties.planning.planner.dp_epochs` of µ). JSON: ``summary[dataset][variant]`` holds the
median ``metric``, the ``active_only`` test AUC and their ``gain``; ``runs`` every run.
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

#: the issue's adult split: the active party's columns (and the label, ``income``)
ADULT_ACTIVE = ("age", "education", "occupation", "hours-per-week")
ADULT_PASSIVE = ("workclass", "fnlwgt", "educational-num", "marital-status", "relationship",
                 "race", "gender", "capital-gain", "capital-loss", "native-country")
DATASETS = ("bank", "adult")


def dataset_settings(dataset: str) -> dict[str, Any]:
    """The config keys that pick a dataset and its party split."""
    if dataset == "adult":
        return {"dataset": "adult", "data.active_columns": ADULT_ACTIVE,
                "data.passive_columns": ADULT_PASSIVE}
    return {"dataset": dataset}


def parse_variant(text: str) -> dict[str, Any]:
    """``"a=1;b=x"`` -> ``{"a": 1, "b": "x"}`` (ints, floats, else strings)."""
    out: dict[str, Any] = {}
    for item in filter(None, (t.strip() for t in text.split(";"))):
        k, _, v = item.partition("=")
        val: Any = v
        for conv in (int, float):
            try:
                val = conv(v)
                break
            except ValueError:
                pass
        out[k.strip()] = val
    return out


class FrozenRandomBottom:
    """A passive bottom not trained on anything: a fixed, seeded random two-layer ReLU
    projection of the public-schema encoding (``d_in -> 64 -> d_out``), data- and
    label-independent (its seed is public). Its one trainable scalar is multiplied by
    zero, so DP-SGD's noised steps change nothing the embeddings show: what a record
    reveals is only its clipped, noised embeddings, a fixed function of its values.
    (The accountant still charges DP-SGD its share; ``dp_embedding_share`` near 1 gives
    the embeddings almost all of µ², as a bottom without DP-SGD could.)"""

    def __new__(cls, d_in: int, d_out: int, hidden: int = 64, seed: int = 0):  # noqa: D102
        import torch
        from torch import nn

        class _Frozen(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                g = torch.Generator().manual_seed(seed)
                self.register_buffer("w1", torch.randn(d_in, hidden, generator=g) / d_in ** 0.5)
                self.register_buffer("w2", torch.randn(hidden, d_out, generator=g)
                                     / hidden ** 0.5)
                self.unused = nn.Parameter(torch.zeros(1))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.relu(x @ self.w1) @ self.w2 + 0.0 * self.unused

        return _Frozen()


def run_once(dataset: str, mu: float, overrides: dict[str, Any], *, baseline: bool,
             timeout_s: float = 900.0) -> dict[str, Any]:
    """One in-process run; the test AUC, the run's DP figures, the baseline if asked."""
    from parties.config import vfl_config
    from parties.planning.planner import dp_epochs

    from sim.launch.local import run_vfl_in_process

    kw: dict[str, Any] = {**dataset_settings(dataset), "dp.delta": 1e-5,
                          "timeouts.max_reassign": 0,
                          "active_only_baseline": "on" if baseline else "off"}
    if not math.isinf(mu):
        kw["dp.mu"] = mu
    overrides = dict(overrides)
    bottom = overrides.pop("passive_bottom", "")
    kw.update(overrides)
    kw.setdefault("epochs", dp_epochs(mu, max_epochs=10))
    cfg = vfl_config(kw)
    models = None
    if bottom == "frozen":
        from parties.models.zoo import ModelFactory

        models = ModelFactory(cfg, passive_bottom_fn=FrozenRandomBottom)
    elif bottom:
        raise ValueError(f"passive_bottom: unknown {bottom!r} (frozen)")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vfl_dp_utility_") as tmp:
        m = run_vfl_in_process(cfg, tmp, quiet=True, timeout_s=timeout_s,
                               models=models).metrics
    dp = m.get("dp") or {}
    return {"test_auc": m["test_auc"], "epochs": cfg.epochs, "mu_spent": dp.get("mu"),
            "noise_multiplier": dp.get("noise_multiplier"),
            "sgd_noise_multiplier": dp.get("sgd_noise_multiplier"),
            "active_only": m.get("active_only"), "run_s": time.perf_counter() - t0,
            "train_wall_s": m["train_wall_s"]}


def study(dataset: str, mu: float, variants: list[str], repeats: int,
          base: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every variant of one dataset, ``repeats`` runs each: ``(summary, runs)``."""
    summary: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    ref = base
    for variant in variants:
        over = parse_variant(variant)
        runs[variant] = []
        for rep in range(repeats):
            r = run_once(dataset, mu, over, baseline=ref is None)
            if ref is None:
                ref = r["active_only"]
            r["repeat"] = rep
            runs[variant].append(r)
            print(f"  {dataset} mu {mu:g} [{variant or 'defaults'}] rep {rep + 1}/{repeats}: "
                  f"auc {r['test_auc']:.4f} (active-only {ref['test_metric']:.4f}) "
                  f"sigma_e {r['noise_multiplier'] or 0:.3g} sigma_g "
                  f"{r['sgd_noise_multiplier'] or 0:.3g} {r['run_s']:.0f} s",
                  file=sys.stderr, flush=True)
        aucs = [r["test_auc"] for r in runs[variant]]
        med = float(statistics.median(aucs))
        summary[variant or "defaults"] = {
            "metric": med, "aucs": aucs, "active_only": ref["test_metric"],
            "gain": med - ref["test_metric"], "epochs": runs[variant][0]["epochs"],
            "run_s": float(statistics.median(r["run_s"] for r in runs[variant]))}
    assert ref is not None
    summary["_active_only"] = ref
    return summary, runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="defaults only, 1 repeat")
    ap.add_argument("--json", metavar="PATH", help="write summary + runs (overwrites)")
    ap.add_argument("--dataset", action="append", choices=DATASETS,
                    help="dataset(s) (default: bank and adult)")
    ap.add_argument("--mu", type=float, default=8.0, help="target µ (default 8)")
    ap.add_argument("--variant", action="append", metavar="K=V;K=V",
                    help="overrides of one variant ('' = the defaults); repeatable")
    ap.add_argument("--repeats", type=int, metavar="N", help="runs per variant (default 2)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 2)
    variants = args.variant if args.variant is not None else [""]
    t0 = time.perf_counter()
    summary: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for ds in args.dataset or list(DATASETS):
        summary[ds], runs[ds] = study(ds, args.mu, variants, repeats)
        print(f"\n{ds} at mu {args.mu:g} (median of {repeats}); active-only "
              f"{summary[ds]['_active_only']['test_metric']:.4f} "
              f"({summary[ds]['_active_only']['model']})")
        for v, s in summary[ds].items():
            if not v.startswith("_"):
                print(f"  {v:<50} auc {s['metric']:.4f}  gain {s['gain']:+.4f}  "
                      f"epochs {s['epochs']}  {s['run_s']:.0f} s/run")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"summary": summary, "settings": {"mu": args.mu, "repeats": repeats,
                                              "variants": variants}, "runs": runs},
            indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
