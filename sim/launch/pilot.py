"""Pilot runs that measure the planner's samples-to-target model
(:class:`parties.algorithms.samples.SamplesModel`).

Each pilot trains the real algorithm (``pubsub``) on the run's data and models, both
parties in this process over the in-memory bus (:func:`sim.launch.local.run_vfl_in_process`,
thread workers), and records the training epochs until the validation metric first
reached the target: ``target_frac`` x the reference pilot's (1 + 1 workers, the config's
B) final test metric for AUC, the same ratio the other way for RMSE. The pilots are
(w_active, w_passive, B) = (1, 1, B), (2, 1, B), (1, 4, B) and (1, 1, B/2): the
reference, an extra active worker, extra passive workers, a smaller batch
(:func:`parties.algorithms.samples.fit`). In one process the workers' interleaving is not that of
separate processes under CPU quotas, so the staleness, and with it the model, is an
approximation; the pilots' figures are recorded beside it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from parties.config import VflConfig
from parties.algorithms.samples import SamplesModel, fit

#: (w_active, w_passive, B as a fraction of the config's) of the pilots
PILOTS: tuple[tuple[int, int, float], ...] = ((1, 1, 1.0), (2, 1, 1.0), (1, 4, 1.0), (1, 1, 0.5))
#: the target as a fraction of the reference pilot's final test metric
TARGET_FRAC = 0.98


def epochs_to(history: list[dict[str, Any]], target: float, *, higher_is_better: bool
              ) -> float | None:
    """Training epochs (``epochs_done``) at the first validation point reaching ``target``;
    None if none did."""
    for h in history:
        m = h.get("metric")
        if m is None or not math.isfinite(m):
            continue
        if (m >= target) if higher_is_better else (m <= target):
            return float(h["epochs_done"])
    return None


def pilot_samples_model(cfg: VflConfig, out: Path, *, pilots: tuple[tuple[int, int, float], ...]
                        = PILOTS, target_frac: float = TARGET_FRAC,
                        timeout_s: float = 900.0) -> tuple[SamplesModel, dict[str, Any]]:
    """Run the pilots on ``cfg`` (its data, models and epochs; algorithm ``pubsub``) in
    ``out`` and fit the model. Returns ``(model, doc)``: ``doc`` holds every pilot's
    workers, B, final metric, epochs to target and wall seconds, and the target.

    Raises:
        parties.algorithms.samples.SamplesModelError: the reference pilot did not reach its own
            target (a ``target_frac`` above 1 for AUC, say).
        the errors of :func:`sim.launch.local.run_vfl_in_process`.
    """
    from sim.launch.local import run_vfl_in_process

    b_ref = cfg.batch_size
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for wa, wp, frac in pilots:
        b = max(1, round(b_ref * frac))
        pcfg = dataclasses.replace(cfg, algo="pubsub", batch_size=b,
                                   workers=dataclasses.replace(cfg.workers, active=wa, passive=wp))
        t0 = time.perf_counter()
        res = run_vfl_in_process(pcfg, out / f"pilot-{wa}+{wp}-B{b}", timeout_s=timeout_s)
        m = res.metrics
        runs.append({"w_active": wa, "w_passive": wp, "batch_size": b,
                     "metric_name": m["metric_name"], "metric": m["metric"],
                     "history": m.get("history") or [], "wall_s": time.perf_counter() - t0})
    ref = runs[0]
    higher = ref["metric_name"] == "auc"
    target = ref["metric"] * target_frac if higher else ref["metric"] / target_frac
    samples: dict[tuple[int, int, int], float | None] = {}
    for r in runs:
        r["epochs_to_target"] = epochs_to(r.pop("history"), target, higher_is_better=higher)
        samples[(r["w_active"], r["w_passive"], r["batch_size"])] = r["epochs_to_target"]
    model = fit(samples, budget=float(cfg.epochs), batch_size_ref=b_ref,
                source=f"pilot runs in one process ({len(runs)}), target {target:.4f}")
    return model, {"target": target, "target_frac": target_frac, "pilots": runs,
                   "model": model.to_dict()}
