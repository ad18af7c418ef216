"""The FedForge paper's baselines: an independent DP-CTGAN ensemble and DP-FedAvg.

* ``indep_ctgan``: each of the K parties trains DP-CTGAN on its own rows; each samples
  rows in proportion to its size and the samples are pooled (output averaging).
* ``dpfedavg_gan`` / ``dpfedavg_diffusion``: FedAvg (McMahan et al. 2017) of the GAN (or
  the diffusion denoiser) across the K parties: each round every party loads the global
  weights, runs ``local_steps`` DP-SGD steps on its rows, and the server takes the
  uniform mean of the K weight sets (uniform, so the party sizes are not used).

Privacy (see :mod:`synth.baselines.dpsgd`): record-level, add/remove one record at one
party; each party's steps are accounted by opacus' RDP accountant; the averaged model and
its samples are post-processing, and a record lives at one party, so the release's ε is
the largest party's. The adversary sees every message (the per-party weights here are
already DP; the secure aggregation FedForge uses would hide them further).

Time budget: ``cap_s`` bounds the whole baseline's training (all parties, in one process,
one after the other). The planned steps per party come from a probe of the step time on
random rows (no record is read by it): ``floor(0.9·cap_s / (K · step_s))``, capped at the
library's default epochs; σ is calibrated for that plan; a run stopped by the cap reports
the ε it actually spent. (In-process: the parties' updates are averaged in memory; over
the bus is not built yet.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from synth.baselines.dpsgd import DPSGDPlan, calibrate, spent_epsilon
from synth.baselines.trainers import (DiffusionSettings, DiffusionTrainer, GanSettings,
                                      GanTrainer)

KINDS = ("indep_ctgan", "dpfedavg_gan", "dpfedavg_diffusion")
#: DPCTGAN's default epochs (smartnoise-synth), the plan's upper bound.
DEFAULT_EPOCHS = 300
#: The fewest rows a party may hold (its batch is at most half its rows).
MIN_ROWS = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class BaselineResult:
    """A baseline's synthetic codes and what it spent.

    Attributes:
        kind: one of :data:`KINDS`.
        codes: ``(n, d)`` int32 synthetic codes.
        epsilon_target / delta: the target (ε may be ``inf``).
        epsilon_spent: the largest party's accounted ε for the steps it ran.
        noise_multiplier: the largest party's σ; sample_rates / steps_planned / steps_run: the plans.
        rounds: FedAvg rounds run (0 for the ensemble).
        train_s / wall_s: training and total wall time.
        settings: the model's settings (dict).
    """

    kind: str
    codes: np.ndarray
    epsilon_target: float
    delta: float
    epsilon_spent: float
    noise_multiplier: float
    sample_rates: tuple[float, ...]
    steps_planned: int
    steps_run: tuple[int, ...]
    rounds: int
    train_s: float
    wall_s: float
    settings: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Everything but the codes (JSON-ready)."""
        return {"kind": self.kind, "epsilon_target": self.epsilon_target,
                "delta": self.delta, "epsilon_spent": self.epsilon_spent,
                "noise_multiplier": self.noise_multiplier,
                "sample_rates": list(self.sample_rates), "steps_planned": self.steps_planned,
                "steps_run": list(self.steps_run), "rounds": self.rounds,
                "train_s": self.train_s, "wall_s": self.wall_s, "settings": self.settings}


def _trainer(kind: str, codes: np.ndarray, sizes: tuple[int, ...], plan: DPSGDPlan,
             seed: int) -> Any:
    if kind == "dpfedavg_diffusion":
        return DiffusionTrainer(codes, sizes, plan, DiffusionSettings(), seed=seed)
    return GanTrainer(codes, sizes, plan, GanSettings(), seed=seed)


def _batch(kind: str) -> int:
    return DiffusionSettings().batch if kind == "dpfedavg_diffusion" else GanSettings().batch


def _probe_step_s(kind: str, sizes: tuple[int, ...], private: bool, seed: int) -> float:
    """Seconds per training step on uniformly random rows (no record read)."""
    rng = np.random.default_rng(seed)
    n = 4 * _batch(kind)
    fake = np.stack([rng.integers(k, size=n) for k in sizes], axis=1)
    # a step's time does not depend on σ: a fixed plan instead of a calibration (an RDP
    # search that costs more than the probe itself)
    plan = DPSGDPlan(epsilon=1.0 if private else float("inf"), delta=1e-5, sample_rate=0.25,
                     steps=10, noise_multiplier=1.0 if private else 0.0, max_grad_norm=1.0)
    tr = _trainer(kind, fake, sizes, plan, seed)
    tr.train(1)
    t0 = time.perf_counter()
    tr.train(3)
    return (time.perf_counter() - t0) / 3


def _mean_state(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    import torch

    def avg(dicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
        out = {}
        for k, v in dicts[0].items():
            if v.is_floating_point():
                out[k] = torch.stack([d[k] for d in dicts]).mean(0)
            else:  # BatchNorm's batch counter
                out[k] = v.clone()
        return out

    return {part: avg([s[part] for s in states]) for part in states[0]}


def run_baseline(kind: str, parts: Sequence[np.ndarray], sizes: Sequence[int], *,
                 epsilon: float, delta: float, cap_s: float, n_out: int, seed: int = 0,
                 local_steps: int = 10) -> BaselineResult:
    """Train baseline ``kind`` on the K parties' code matrices and sample ``n_out`` rows.

    Raises:
        ValueError: an unknown kind, no party, a party with too few rows for the batch,
            a non-positive ``cap_s`` or ``n_out``.
        NoiseTooLarge: the σ that ε needs exceeds the maximum (nothing is trained).
        BaselineUnavailable: opacus is missing (ε finite).
    """
    import torch

    if kind not in KINDS:
        raise ValueError(f"baseline must be one of {KINDS}, got {kind!r}")
    if not parts:
        raise ValueError("no party")
    if not cap_s > 0 or n_out < 1 or local_steps < 1:
        raise ValueError(f"cap_s, n_out and local_steps must be > 0, got "
                         f"{cap_s!r}, {n_out!r}, {local_steps!r}")
    sizes_t = tuple(int(k) for k in sizes)
    for i, p in enumerate(parts):
        if len(p) < MIN_ROWS:
            raise ValueError(f"party {i} has {len(p)} rows, fewer than the {MIN_ROWS} "
                             f"baseline {kind!r} needs")
    t_start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(kind, parts, sizes_t, epsilon=epsilon, delta=delta, cap_s=cap_s,
                    n_out=n_out, seed=seed, local_steps=local_steps, t_start=t_start)
    finally:
        torch.set_num_threads(threads)


def _run(kind: str, parts: Sequence[np.ndarray], sizes_t: tuple[int, ...], *, epsilon: float,
         delta: float, cap_s: float, n_out: int, seed: int, local_steps: int,
         t_start: float) -> BaselineResult:
    batch = _batch(kind)
    private = epsilon != float("inf")
    step_s = _probe_step_s(kind, sizes_t, private, seed)
    k = len(parts)
    min_rows = min(len(p) for p in parts)
    steps = max(1, min(int(0.9 * cap_s / (k * step_s)),
                       DEFAULT_EPOCHS * max(1, min_rows // batch)))
    if kind != "indep_ctgan":
        steps = max(local_steps, steps // local_steps * local_steps)
    # one calibration per distinct sample rate (parties of equal size share their plan)
    by_rate: dict[float, DPSGDPlan] = {}
    for rate in sorted({min(0.5, batch / len(p)) for p in parts}):
        by_rate[rate] = calibrate(epsilon=epsilon, delta=delta, sample_rate=rate, steps=steps)
    plans = [by_rate[min(0.5, batch / len(p))] for p in parts]
    trainers = [_trainer(kind, p, sizes_t, plan, seed + 1 + i)
                for i, (p, plan) in enumerate(zip(parts, plans, strict=True))]
    t0 = time.perf_counter()
    deadline = t0 + cap_s
    rounds = 0
    if kind == "indep_ctgan":
        per = cap_s / k
        for tr in trainers:
            stop = min(deadline, time.perf_counter() + per)
            while tr.d.steps_run < steps and time.perf_counter() < stop:
                tr.train(min(10, steps - tr.d.steps_run))
    else:
        while rounds * local_steps < steps and time.perf_counter() < deadline:
            for tr in trainers:
                tr.train(local_steps)
            avg = _mean_state([tr.state() for tr in trainers])
            for tr in trainers:
                tr.load(avg)
            rounds += 1
    train_s = time.perf_counter() - t0
    run = [tr.d.steps_run if kind != "dpfedavg_diffusion" else tr.net.steps_run
           for tr in trainers]
    if kind == "indep_ctgan":
        n_rows = np.array([len(p) for p in parts], dtype=float)
        counts = np.floor(n_out * n_rows / n_rows.sum()).astype(int)
        counts[: n_out - counts.sum()] += 1
        codes = np.concatenate([tr.sample(int(c), seed + 100 + i)
                                for i, (tr, c) in enumerate(zip(trainers, counts, strict=True))
                                if c > 0])
    else:
        codes = trainers[0].sample(n_out, seed + 100)
    spent = max(spent_epsilon(pl, r) for pl, r in set(zip(plans, run, strict=True)))
    settings = (DiffusionSettings() if kind == "dpfedavg_diffusion" else GanSettings())
    return BaselineResult(
        kind=kind, codes=codes, epsilon_target=epsilon, delta=delta, epsilon_spent=spent,
        noise_multiplier=max(pl.noise_multiplier for pl in plans),
        sample_rates=tuple(pl.sample_rate for pl in plans), steps_planned=steps,
        steps_run=tuple(run), rounds=rounds, train_s=train_s,
        wall_s=time.perf_counter() - t_start,
        settings={"local_steps": local_steps if kind != "indep_ctgan" else None,
                  **{f: getattr(settings, f) for f in settings.__dataclass_fields__}})


__all__ = ["BaselineResult", "DEFAULT_EPOCHS", "KINDS", "run_baseline"]
