"""The heterogeneity benchmark: the five algorithms under unequal CPU shares.

For each CPU split of the paper's 64 cores ("50:14", "40:24", "32:32"; active:passive,
scaled to this machine's cores as fractions: 50:14 on 2 cores is 1.5625 : 0.4375), every
algorithm trains ``synthetic`` with the paper's small model through ``psfl sim run``
machinery (:func:`sim.cluster.runner.run_scenario`): broker and parties as processes, each party
in its own cgroup CPU quota.

Balancing. A 10-layer bottom model's hidden layers dominate its cost whatever the input
width, so an even feature split under a 50:14 share leaves the small party far behind.
Each party's bottom width is therefore chosen so that the CPU each party needs per sample
is in the ratio of its cores. For 50:14 and 40:24 the widths are hand-balanced
(:data:`BALANCED`: the passive party keeps 9x128 and the active party is widened, to 9x288
and 9x160), on the CPU each party uses per sample in a run, which for the active party
is well above its profiled compute (the profile's balance at 50:14, 9x352, leaves the
active party the bound). Widening the big party instead of narrowing the small one keeps
the small party's compute large against its fixed per-batch messaging, which at 0.4375
cores otherwise costs it a third of its CPU. Other splits (and ``--small-width`` /
``--big-width`` by hand) aside, :func:`balance` narrows the small party by *profiled*
compute: each candidate width (9 hidden layers of 128, 96, 64, 48, 32) is timed for one
worker step (CPU seconds per sample, :func:`parties.planning.profile.profile_party`) and the
width whose cost ratio to the other party's is closest to the CPU ratio is used.
``--even`` also runs the even split (the same 9x128 model for both parties, ``even``
in the JSON). ``--workers WA+WP`` overrides the pubsub/avfl-ps workers, ``--batch-size
B`` the B of every algorithm but ``pubsub_planned``.

Ceiling and efficiency. The ceiling is measured as ``bench/vfl_table.py`` measures it,
under the run's layout: both parties' single-worker compute profiled at the same time,
each process inside its party's quota (``profile_config(join_groups=...)``), so the
ceiling is min over parties of quota ÷ CPU seconds per sample; it is the mean of two
such profiles (:func:`parties.planning.profile.mean_profile`), one before and one after the
split's runs, because this machine's speed drifts: at 50:14, four profiles in a row
put the passive step at 5.2, 5.7, 6.4 and 5.8 ms, and a fixed step loop alone on the
machine wandered between 4.5 and 7.2 ms from one second to the next (2026-11-30).
Efficiency = training samples/s ÷ ceiling. Because a profile and a run never share their
seconds, every run also reports the *in-run ceiling*: the same min over parties of quota
÷ CPU seconds per sample of the step compute (forward, backward, Adam), measured in that
run by the workers themselves (thread CPU time of their compute calls, minus their PS
syncs), and ``efficiency_inrun`` against it, which the drift cancels out of; and where
each party's CPU went per batch (``cpu_ms_per_batch``: step, sync, the rest, beside the
profiled step). Throughput is over both parties' training (per segment the longer of
their two clocks: :func:`parties.runtime.report.training_window_s`). CPU utilisation = CPU
seconds ÷ (wall seconds × quota) over the party's own training segments (the whole
life's figure, which adds the validation and test scoring, is kept beside it).

Workers: ``vfl`` and ``avfl`` 1 + 1 (by definition); ``vfl-ps`` 2 pairs; ``pubsub`` and
``avfl-ps`` ⌈active cores⌉ active workers (threads, so a 1.5625-core quota can be used)
and :data:`PASSIVE_WORKERS` (8) passive; ``pubsub_planned`` is PubSub-VFL with
(w_active, w_passive, B) from the planner for time to target (``psfl vfl plan``: the
batch-size sweep and cost-model fits, with each party's quota as its cores, times the
samples-to-target model of four pilot runs in one process, :mod:`sim.launch.pilot`; B from
:data:`PLAN_BATCH_SIZES`, and the ceiling of a planned run is profiled at its own B). Time to target: training
seconds (per segment the longer of the two parties' clocks, the throughput's window;
validation scoring excluded, as the runtime's own ``time_to_target_s``) until the first
validation point at or above 0.98 × the final test AUC of ``vfl`` in the same split (and
repeat); ``time_to_target_wall_s`` beside it counts the scorings too, which at
:data:`VAL_PER_EPOCH` (16) points per epoch take about as long as the training and are
the same for every algorithm, so on that clock every ratio is pulled towards 1. Sixteen
points per epoch so that time to target is read finely (``val_points_before_vfl_target``
counts them).

Repeats (``--repeats N``): every algorithm runs N times per split, interleaved (repeat k
of every algorithm before repeat k + 1, so the machine's drift falls on all alike; the
plan is made once). Each repeat's target comes from its own ``vfl`` run; per algorithm
every numeric field is the median over the repeats, ``time_to_target_s`` the median with
a missed target (or a failed run) counted as infinite time, and ``speedup_vs_vfl`` =
median(vfl's time to target) / median(this algorithm's), 0.0 when this one's median is
infinite (:func:`aggregate_repeats`; ``time_to_target_repeats_s``, ``metric_repeats``,
``missed`` beside them).

Usage::

    python bench/hetero.py --quick --json /tmp/hetero.json       # < 10 minutes
    python bench/hetero.py --quick --repeats 3 --json OUT.json   # about 30 minutes
    python bench/hetero.py --even --out runs/hetero               # full, with the even split
    psfl report runs/hetero                                       # plots of the runs

Output: a table per split and, with ``--json``, ``summary[split][algo]`` with
``time_to_target_s``, ``metric``, ``cpu_util_active``, ``cpu_util_passive`` (CPU
seconds ÷ (wall seconds × quota) over the party's own training segments;
``cpu_util_run_*`` is the same over the party's whole life, which adds the
validation and test scoring), ``efficiency`` and
``wait_s_per_epoch`` (the active party's, per worker), plus ``ceiling_inrun``,
``bound_inrun``, ``efficiency_inrun`` and ``cpu_ms_per_batch``, for the balanced model;
``summary_even`` likewise for the even split. An efficiency above 1.05 means the ceiling's profile is wrong: it is listed in ``errors`` and the exit code is 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SPLITS = ("50:14", "40:24", "32:32")
RATIO_OF = 64.0
ALGOS = ("vfl", "vfl-ps", "avfl", "avfl-ps", "pubsub", "pubsub_planned")
WIDTHS = (128, 96, 64, 48, 32)
DEPTH = 9
FEATURES = 500
EFFICIENCY_LIMIT = 1.05
PERIOD_US = 10_000  # the quotas' period (see sim.cluster.scenario.Scenario.cpu_period_us)
#: B values the planner may choose here (16 to 1024). It plans for time to
#: target with the samples-to-target model of pilot runs (:mod:`sim.launch.pilot`); planning
#: for time per epoch alone, B = 1024 won everywhere, and with Adam at lr 1e-3 four
#: epochs at B = 1024 reached test AUC 0.79 against 0.84-0.90 at B = 256 (--quick,
#: 2026-11-30), which is why the grid was 64-256 until the samples model.
PLAN_BATCH_SIZES = (16, 32, 64, 128, 256, 512, 1024)
#: W_max of the plan (per party)
PLAN_W_MAX = 8
#: Hand-balanced bottom widths per split: (party with fewer cores, party with more), 9
#: hidden layers each. Balanced on the CPU the parties use per sample *in a run*: the
#: active party's event loop, messaging and GIL hand-offs cost it more per sample than
#: its profiled compute, so the profile's balance (9x352 at 50:14) leaves the active
#: party the bound. Measured with ``--algos pubsub --workers 2+8`` (--quick,
#: 2026-11-30, before the passive party waited out the active party's scoring), CPU
#: use of the quota in training, active/passive: 50:14 9x256 0.77/0.87 (passive bound), 9x288 0.88/0.89, 9x320 0.89/0.78, 9x352 0.92/0.73 (active bound);
#: 40:24 9x160 0.84/0.87, 9x192 0.89/0.74. Again after the scoring and window fixes
#: (17:00 UTC), 9x320 against 9x288: 0.88/0.93 and efficiency 0.60 (in-run 0.74)
#: against 0.79/0.95 and 0.76 (0.79): the active party turns co-bound.
BALANCED = {"50:14": (128, 288), "40:24": (128, 160)}
#: Passive workers of pubsub and avfl-ps. A passive worker holds its batch from its
#: embedding's publication until the gradient is back, so the passive party keeps w_p
#: batches in flight, and it idles whenever all of them are at the active party. At
#: 50:14 with 9x288 (--quick, 2026-11-30, before that scoring fix): 4 workers
#: 0.84/0.85 of the quotas, 6 0.86/0.85, 8 0.88/0.89. Inline workers cost a model replica each, nothing more.
PASSIVE_WORKERS = 8
#: Hand-set pubsub workers per split where the default (⌈active cores⌉ + 8) is not the
#: faster to target. 40:24, training seconds to target (--quick, --repeats 2, 16 scorings
#: per epoch, 2026-12-03): 2 + 8 0.92 x vfl (3 repeats), 2 + 4 missed 1 of 2, 1 + 4 1.03;
#: at 50:14 2 + 8 1.18 (3 repeats), 2 + 4 0.90, 1 + 4 0.93 (2 repeats each); the full
#: --repeats 3 run after it: 50:14 2 + 8 missed 2 of 3, 40:24 1 + 4 0.92 (CHANGELOG).
PUBSUB_WORKERS = {"40:24": (1, 4)}
#: Validation points per epoch: time to target is read off them, so they must be fine
#: enough (the aim: at least 20 before sync VFL reaches the target).
VAL_PER_EPOCH = 16


def _table() -> Any:
    spec = importlib.util.spec_from_file_location("vfl_table", HERE / "vfl_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vfl_table"] = mod
    spec.loader.exec_module(mod)
    return mod


def base_config(rows: int, epochs: int, batch_size: int | None = None,
                val_per_epoch: int = 0, sync_per_epoch: int = 0,
                overrides: dict[str, Any] | None = None) -> Any:
    """The benchmark's config: synthetic, the paper's small model, B = 256 (or
    ``batch_size``), ``val_per_epoch`` validation points per epoch (0: the default, 4);
    ``overrides``: more keys (dotted or nested, :func:`set_overrides`)."""
    from parties.config import vfl_config
    from pubsub.config import deep_merge, expand_dotted

    t = _table()
    base = {"algo": "pubsub", "dataset": "synthetic", "epochs": epochs,
            "batch_size": batch_size or t.BATCH, "val_per_epoch": val_per_epoch,
            "sync_per_epoch": sync_per_epoch,
            "data": {"synthetic_rows": rows, "synthetic_features": FEATURES},
            "model": {"bottom_hidden": t.BOTTOM_HIDDEN, "embedding_dim": t.EMBEDDING_DIM,
                      "top_hidden": t.TOP_HIDDEN}}
    return vfl_config(deep_merge(base, expand_dotted(overrides or {})))


def balance(cfg: Any, cores: dict[str, float], *, min_time_s: float) -> dict[str, Any]:
    """Pick the bottom width of the party with fewer cores so that the parties' profiled
    CPU seconds per sample are in the ratio of their cores (see the module docstring).

    Returns ``{"role": small party, "width": w, "ratio_target": ..., "candidates": {w:
    ratio}}``; the even model (width 128 for both) when the cores are equal.
    """
    from parties.planning.profile import profile_party
    from parties.data.party import load_party_data

    small = min(cores, key=lambda r: cores[r])
    big = "active" if small == "passive" else "passive"
    target = cores[small] / cores[big]
    if math.isclose(target, 1.0, rel_tol=1e-6):
        return {"role": small, "width": WIDTHS[0], "ratio_target": 1.0, "candidates": {}}
    data = {r: load_party_data(cfg, r) for r in ("active", "passive")}
    # one CPU for every timing (no migrations), and the reference party timed before
    # each candidate: this machine's speed drifts by 10-20 % over seconds, and a single
    # reference put width 64 at 0.21 of the active cost in one run and 0.41 in another
    import torch

    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    threads = torch.get_num_threads()
    if before:
        os.sched_setaffinity(0, {min(before)})
    # one thread on the one CPU: at B = 1024 torch's intra-op pool (one thread per core)
    # spun on a single CPU and a 50-step profile took minutes
    torch.set_num_threads(1)
    try:
        ratios: dict[int, float] = {}
        for w in WIDTHS:
            ref = profile_party(big, cfg, data[big].x_train, data[big].y_train,
                                min_time_s=min_time_s)
            c = dataclasses.replace(cfg, model=dataclasses.replace(
                cfg.model, **{f"{small}_bottom_hidden": (w,) * DEPTH}))
            p = profile_party(small, c, data[small].x_train, data[small].y_train,
                              min_time_s=min_time_s)
            ratios[w] = p.cpu_s_per_sample / ref.cpu_s_per_sample
    finally:
        torch.set_num_threads(threads)
        if before:
            os.sched_setaffinity(0, before)
    best = min(ratios, key=lambda w: abs(math.log(ratios[w] / target)))
    return {"role": small, "width": best, "ratio_target": target,
            "candidates": {str(w): r for w, r in ratios.items()}}


def set_overrides(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as a nested mapping of config overrides (sections as
    tables, ``vfl.`` prefixes allowed), checked by building a config with them.

    Raises:
        ValueError: a malformed item, an unknown key or a bad value (the config's message).
    """
    from pubsub.config import ConfigError, deep_merge, parse_overrides

    try:
        tree = parse_overrides(items)
        over = deep_merge({k: v for k, v in tree.items() if k != "vfl"}, tree.get("vfl", {}))
        base_config(1000, 1, overrides=over)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return over


def quota_profile(cfg: Any, cores: dict[str, float], *, min_time_s: float) -> Any:
    """The compute profile under the split's quotas (both parties profiled at once, each
    in its own CPU-share group): a :class:`parties.planning.profile.ComputeProfile` whose
    ``settings["cpu_methods"]`` says how each quota was enforced."""
    from parties.planning.profile import profile_config

    from sim.cluster.cpu import CpuLimiter

    lims = {r: CpuLimiter.create(f"ceiling-{r}", cores[r], period_us=PERIOD_US)
            for r in ("active", "passive")}
    try:
        prof = profile_config(cfg, join_groups={r: lim.join_files() for r, lim in lims.items()},
                              min_time_s=min_time_s)
    finally:
        for lim in lims.values():
            lim.close()
    return dataclasses.replace(prof, settings={
        **prof.settings, "cpu_methods": {r: lim.method for r, lim in lims.items()}})


def quota_ceiling(cfg: Any, cores: dict[str, float], *, min_time_s: float) -> dict[str, Any]:
    """:func:`quota_profile` as its ``profile.json`` dict (``ceiling_samples_per_s``,
    ``bound_by``, ``parties``)."""
    return quota_profile(cfg, cores, min_time_s=min_time_s).to_dict()


def workers_for(algo: str, cores: dict[str, float], split: str | None = None
                ) -> tuple[int, int]:
    """(w_active, w_passive) of ``algo`` (module docstring); ``pubsub`` at a split of
    :data:`PUBSUB_WORKERS` takes that split's hand-set counts."""
    if algo in ("vfl", "avfl"):
        return 1, 1
    if algo == "vfl-ps":
        return 2, 2
    if algo == "pubsub" and split in PUBSUB_WORKERS:
        return PUBSUB_WORKERS[split]
    return max(1, math.ceil(cores["active"] - 1e-9)), PASSIVE_WORKERS


def balanced_widths(split: str, cores: dict[str, float], *, small_width: int | None,
                    big_width: int | None) -> tuple[str, int, int] | None:
    """``(small_role, small_width, big_width)`` chosen by hand (``--small-width`` /
    ``--big-width``, else :data:`BALANCED`), or None: equal shares (the same model for
    both) or a split with no hand-balanced widths and none given (then
    :func:`balance` chooses by profiled compute)."""
    if math.isclose(cores["active"], cores["passive"]):
        return None
    small = min(cores, key=lambda r: cores[r])
    if small_width is None and big_width is None:
        if split not in BALANCED:
            return None
        small_width, big_width = BALANCED[split]
    return small, small_width or WIDTHS[0], big_width or WIDTHS[0]


def split_config(base: Any, split: str, cores: dict[str, float], *,
                 small_width: int | None = None, big_width: int | None = None
                 ) -> tuple[Any, dict[str, Any], str]:
    """``base`` with the bottom widths of ``split`` (cores per role ``cores``): by hand or
    from :data:`BALANCED` (:func:`balanced_widths`), else the small party's width
    balanced by profiled compute (:func:`balance`, which profiles). Returns ``(cfg, bal,
    model)``: ``bal`` says how (``role``, ``width``, ``big_width``, ``ratio_target``,
    ``candidates``, ``by_hand`` when by hand), ``model`` in words."""
    small_role = min(cores, key=lambda r: cores[r])
    big_role = "active" if small_role == "passive" else "passive"
    hand = balanced_widths(split, cores, small_width=small_width, big_width=big_width)
    if hand is not None:
        _, small_w, big_w = hand
        bal = {"role": small_role, "width": small_w,
               "ratio_target": min(cores.values()) / max(cores.values()),
               "candidates": {}, "by_hand": True}
    else:
        big_w = WIDTHS[0]  # equal shares: the same model for both
        bal = balance(base, cores, min_time_s=0.5)
    bal["big_width"] = big_w
    cfg = dataclasses.replace(base, model=dataclasses.replace(
        base.model, **{f"{bal['role']}_bottom_hidden": (bal["width"],) * DEPTH,
                       f"{big_role}_bottom_hidden": (big_w,) * DEPTH}))
    model = (f"{bal['role']} bottom {DEPTH}x{bal['width']}, {big_role} {DEPTH}x{big_w}"
             if (bal["width"], big_w) != (128, 128) else f"both bottoms {DEPTH}x128")
    return cfg, bal, model


def planned_config(cfg: Any, cores: dict[str, float], out: Path, *,
                   sweep_batch_sizes: tuple[int, ...]) -> tuple[Any, dict[str, Any]]:
    """``cfg`` with the planner's (w_active, w_passive, B) for the split's quotas."""
    from parties.cli import write_json

    from sim.launch.sysprofile import apply_plan, plan_doc, plan_from_models, sweep_profile

    from sim.launch.pilot import pilot_samples_model

    out.mkdir(parents=True, exist_ok=True)
    doc, models = sweep_profile(cfg, out, batch_sizes=sweep_batch_sizes, min_time_s=0.3)
    models = dataclasses.replace(
        models, active=dataclasses.replace(models.active, cores=cores["active"]),
        passive=dataclasses.replace(models.passive, cores=cores["passive"]))
    write_json(out / "profile.json", doc)
    samples, pilots = pilot_samples_model(cfg, out / "pilots")
    plan, inputs = plan_from_models(models, cfg, w_max=PLAN_W_MAX,
                                    batch_sizes=PLAN_BATCH_SIZES, samples=samples)
    pdoc = plan_doc(plan, inputs, out / "profile.json")
    pdoc["pilots"] = pilots
    write_json(out / "plan.json", pdoc)
    return apply_plan(cfg, plan), pdoc


def run_algo(cfg: Any, split: str, out: Path, timeout_s: float, *,
             plaintext: bool = False) -> dict[str, Any]:
    """One scenario run; the table's summary of its metrics plus the sim section
    (``plaintext``: the bus without CURVE, as ``psfl sim run --insecure``)."""
    from sim.cluster.runner import run_scenario
    from sim.cluster.scenario import Scenario

    t = _table()
    scn = Scenario(name=f"{split} {cfg.algo}", cpu_ratio=split, ratio_of=RATIO_OF,
                   cpu_period_us=PERIOD_US, timeout_s=timeout_s)
    try:
        m = run_scenario(scn, cfg, out, quiet=True, insecure=plaintext)
    except Exception as exc:  # noqa: BLE001 - one failed run must not end the benchmark
        return {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    if m["sim"]["end_state"] != "completed":
        return {"status": "failed", "error": f"end state {m['sim']['end_state']}",
                "sim": m["sim"]}
    s = t.summarize_run(m)
    s["status"] = "ok"
    s["workers"] = [cfg.workers.active, cfg.workers.passive]
    s["batch_size"] = cfg.batch_size
    s["cpu_measured"] = m["sim"]["cpu"]
    return s


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _workers(text: str) -> tuple[int, int]:
    """``"3+4"`` → ``(3, 4)`` (argparse type of ``--workers``)."""
    try:
        wa, wp = (int(x) for x in text.split("+"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WA+WP like 3+4, got {text!r}") from None
    if wa < 1 or wp < 1:
        raise argparse.ArgumentTypeError(f"worker counts must be >= 1, got {text!r}")
    return wa, wp


def _auc(text: str) -> float:
    """argparse type of ``--target-auc``: a float in (0, 1]."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an AUC like 0.89, got {text!r}") from None
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"an AUC is in (0, 1], got {text!r}")
    return v


def _fmt(x: Any, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _pct(x: Any) -> str:
    return _fmt(x, ".1%")


def inrun_ceiling(r: dict[str, Any]) -> tuple[float | None, str | None]:
    """The ceiling measured inside run ``r`` (samples/s, and the bound party): min over
    parties of quota ÷ the CPU seconds per sample of the workers' step compute in that run
    (forward, backward, Adam; PS syncs excluded). The same definition as the profile's
    ceiling, measured over the run's own seconds, so this machine's drift (a fixed step
    loop's speed wanders by ±20 % from one second to the next) cancels out of
    ``efficiency_inrun``; it does not see what replicas cost each other's caches."""
    best: tuple[float | None, str | None] = (None, None)
    for role in ("active", "passive"):
        step = (r.get("step_cpu_s_per_sample") or {}).get(role)
        cores = (r.get("cores_allotted") or {}).get(role)
        if not step or not cores:
            return None, None
        v = cores / step
        if best[0] is None or v < best[0]:
            best = (v, role)
    return best


def _inrun_eff(r: dict[str, Any]) -> float | None:
    c_in, _ = inrun_ceiling(r)
    return r["train_samples_per_s"] / c_in if c_in else None


def summarize(runs: dict[str, dict[str, Any]], ceiling: float | None,
              profile: dict[str, Any] | None = None,
              target_auc: float | None = None) -> dict[str, Any]:
    """``summary[algo]`` of one split (the JSON's shape), with time to target and
    speedup against ``vfl``; ``profile`` (the split's mean profile, ``to_dict`` form)
    gives each run's in-run step CPU against the profiled one. The target is
    ``target_auc`` when given, else ``REL_TARGET_AUC`` × vfl's test AUC (None without
    a vfl run)."""
    t = _table()
    ok_vfl = [runs["vfl"]["metric"]] if runs.get("vfl", {}).get("status") == "ok" else []
    target = target_auc if target_auc is not None else (
        t.REL_TARGET_AUC * max(ok_vfl) if ok_vfl else None)
    out: dict[str, Any] = {}
    for algo, r in runs.items():
        if r.get("status") != "ok":
            out[algo] = {"status": r.get("status"), "error": r.get("error")}
            continue
        ttt = (t.training_time_to_target(r["history"], target, False)
               if target is not None else None)
        out[algo] = {
            "time_to_target_s": ttt, "metric": r["metric"],
            "time_to_target_wall_s": (t.time_to_target(r["history"], target, False)
                                      if target is not None else None),
            "cpu_util_active": r["cpu_util_train"]["active"],
            "cpu_util_passive": r["cpu_util_train"]["passive"],
            "cpu_util_run_active": r["cpu_util"]["active"],
            "cpu_util_run_passive": r["cpu_util"]["passive"],
            "efficiency": (r["train_samples_per_s"] / r.get("ceiling", ceiling))
                          if ceiling else None,
            "wait_s_per_epoch": r["wait_s_per_epoch"]["active"],
            "wait_s_per_epoch_passive": r["wait_s_per_epoch"]["passive"],
            "train_samples_per_s": r["train_samples_per_s"],
            "workers": r["workers"], "batch_size": r["batch_size"],
        }
        row = out[algo]
        row["ceiling_inrun"], row["bound_inrun"] = inrun_ceiling(r)
        row["efficiency_inrun"] = _inrun_eff(r)
        # where each party's CPU went, ms per batch: step compute, PS sync, the rest
        # (messaging, the event loop, bookkeeping)
        B = r["batch_size"]
        row["cpu_ms_per_batch"] = {}
        for role in ("active", "passive"):
            step = (r.get("step_cpu_s_per_sample") or {}).get(role)
            sync = (r.get("sync_cpu_s_per_sample") or {}).get(role)
            tot = (r.get("cpu_s_per_sample_train") or {}).get(role)
            prof = ((profile or {}).get("parties") or {}).get(role) if "ceiling" not in r \
                else None
            row["cpu_ms_per_batch"][role] = {
                "step": 1e3 * B * step if step is not None else None,
                "sync": 1e3 * B * sync if sync is not None else None,
                "other": (1e3 * B * (tot - step - sync)
                          if None not in (tot, step, sync) else None),
                "profiled_step": 1e3 * prof["cpu_s_per_step"] if prof else None,
            }
    base = out.get("vfl", {}).get("time_to_target_s")
    for algo, row in out.items():
        if "metric" not in row:
            continue
        ttt = row.get("time_to_target_s")
        row["speedup_vs_vfl"] = (base / ttt) if base and ttt else None
        # the time-to-target resolution: this run's validation points up to the moment
        # sync VFL reached the target (None without a vfl run that reached it)
        row["val_points_before_vfl_target"] = (
            _points_within(runs[algo]["history"], base) if base else None)
    return {"target_auc": target, "algos": out}


def _points_within(history: list[dict[str, Any]], train_s: float) -> int:
    """Validation points of ``history`` within its first ``train_s`` training seconds
    (the segments' ``window_s``, as time to target counts them)."""
    acc, n = 0.0, 0
    for h in history:
        acc += float(h.get("window_s", h["train_s"]))
        if acc > train_s + 1e-9:
            break
        n += h.get("metric") is not None
    return n


def aggregate_repeats(summs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several repeats of one split (each a :func:`summarize` result, its target from its
    own vfl run) as one: per algorithm the median of every numeric field over the
    repeats that completed; ``time_to_target_s`` the median with a repeat that missed the
    target (or failed) counted as infinite time (None when the median is infinite), and
    ``time_to_target_repeats_s`` every repeat's (None: missed); ``speedup_vs_vfl`` =
    median(vfl's time to target) / median(this algorithm's): 0.0 when this algorithm's
    median is infinite, None when vfl's is; ``val_points_before_vfl_target`` the fewest
    over the repeats; ``metric_repeats``, ``repeats``, ``repeats_ok``, ``missed``."""
    if not summs:
        raise ValueError("no repeats to aggregate")
    algos: list[str] = []
    for s in summs:
        algos += [a for a in s["algos"] if a not in algos]
    targets = [s["target_auc"] for s in summs]
    out: dict[str, Any] = {}
    for algo in algos:
        rows = [s["algos"].get(algo, {"status": "missing"}) for s in summs]
        ok = [r for r in rows if "metric" in r]
        if not ok:
            first = rows[0]
            out[algo] = {"status": first.get("status"), "error": first.get("error"),
                         "repeats": len(rows), "repeats_ok": 0}
            continue
        agg: dict[str, Any] = {}
        for key, val in ok[0].items():
            vals = [r.get(key) for r in ok]
            if all(v == val for v in vals):
                agg[key] = val  # the same in every repeat (B, worker counts): as it is
            elif isinstance(val, (int, float)) and not isinstance(val, bool) \
                    and all(isinstance(v, (int, float)) for v in vals):
                agg[key] = statistics.median([float(v) for v in vals])
            else:
                agg[key] = val  # lists and dicts (workers, cpu_ms_per_batch): the first's
        ttts = [r.get("time_to_target_s") if "metric" in r else None for r in rows]
        med = statistics.median([math.inf if t is None else float(t) for t in ttts])
        agg["time_to_target_s"] = None if math.isinf(med) else med
        agg["time_to_target_repeats_s"] = ttts
        agg["metric_repeats"] = [r.get("metric") for r in rows]
        pts = [r.get("val_points_before_vfl_target") for r in ok]
        agg["val_points_before_vfl_target"] = (min(pts) if pts and None not in pts
                                               else None)
        agg["repeats"], agg["repeats_ok"] = len(rows), len(ok)
        agg["missed"] = sum(1 for t in ttts if t is None)
        out[algo] = agg
    vfl_ttts = [s["algos"].get("vfl", {}).get("time_to_target_s") for s in summs]
    vfl_med = statistics.median([math.inf if t is None else float(t) for t in vfl_ttts])
    for row in out.values():
        if "metric" not in row:
            continue
        ttt = row["time_to_target_s"]
        row["speedup_vs_vfl"] = (None if math.isinf(vfl_med) else
                                 0.0 if ttt is None else vfl_med / ttt)
    finite = [t for t in targets if t is not None]
    return {"target_auc": statistics.median(finite) if finite else None, "targets": targets,
            "algos": out}


def _breakdown(ms: dict[str, Any]) -> str:
    """The passive party's ``cpu_ms_per_batch`` as ``step (profiled) + sync + other``."""
    p = ms.get("passive") or {}
    if p.get("step") is None:
        return "—"
    return (f"{p['step']:.2f} ({_fmt(p.get('profiled_step'), '.2f')}) + "
            f"{_fmt(p.get('sync'), '.2f')} + {_fmt(p.get('other'), '.2f')}")


def render(split: str, info: dict[str, Any], summ: dict[str, Any]) -> str:
    """A markdown table of one split."""
    cores = info["cores"]
    lines = [f"### {split} of {RATIO_OF:g} cores: active {cores['active']:.4g} cores, passive "
             f"{cores['passive']:.4g} cores ({info['model']}); ceiling "
             f"{_fmt(info['ceiling'], ',.0f')} samples/s; target AUC "
             f"{_fmt(summ['target_auc'], '.4f')}"
             + (f" (median of {len(summ['targets'])} repeats' own targets; medians, a missed"
                " target counting as infinite time)" if len(summ.get("targets", [])) > 1
                else ""), "",
             "| algo | w_a+w_p, B | time to target, s | speedup vs vfl | final AUC | CPU util "
             "active (training; run) | CPU util passive (training; run) | efficiency | "
             "efficiency (in-run ceiling) | wait/epoch active, s | passive CPU ms/batch: "
             "step (profiled) + sync + other |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for algo, r in summ["algos"].items():
        if "metric" not in r:
            lines.append(f"| {algo} | {r.get('status')}: {r.get('error')} |||||||||")
            continue
        lines.append(
            f"| {algo} | {r['workers'][0]}+{r['workers'][1]}, {r['batch_size']} | "
            f"{_fmt(r['time_to_target_s'], '.2f')} | {_fmt(r['speedup_vs_vfl'], '.2f')} | "
            f"{r['metric']:.4f} | {_pct(r['cpu_util_active'])}; {_pct(r['cpu_util_run_active'])} | "
            f"{_pct(r['cpu_util_passive'])}; {_pct(r['cpu_util_run_passive'])} | "
            f"{_fmt(r['efficiency'], '.3f')} | {_fmt(r.get('efficiency_inrun'), '.3f')} | "
            f"{r['wait_s_per_epoch']:.3f} | {_breakdown(r.get('cpu_ms_per_batch', {}))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="30,000 rows, 4 epochs: under 10 minutes (with --even about 3 "
                         "minutes more)")
    ap.add_argument("--splits", default=",".join(SPLITS),
                    help="CPU splits, active:passive of 64 cores (default %(default)s)")
    ap.add_argument("--algos", default=",".join(ALGOS),
                    help="algorithms to run (default %(default)s)")
    ap.add_argument("--rows", type=_positive,
                    help="synthetic rows (default 60,000; quick 30,000)")
    ap.add_argument("--epochs", type=_positive, help="epochs (default 6; quick 4)")
    ap.add_argument("--even", action="store_true", help="also run the even split "
                    "(pubsub and avfl-ps with the same model for both parties)")
    ap.add_argument("--batch-size", type=_positive, help="B of every run but pubsub_planned "
                    "(default 256)")
    ap.add_argument("--small-width", type=_positive, help="bottom width of the party with fewer "
                    "cores, by hand (default: BALANCED's for 50:14 and 40:24; other "
                    "splits by profiled compute, see balance())")
    ap.add_argument("--target-auc", type=_auc, default=None, metavar="AUC",
                    help="validation AUC that time to target counts to (default: "
                         "REL_TARGET_AUC x vfl's test AUC in the same split, so none "
                         "when vfl is not in --algos)")
    ap.add_argument("--workers", type=_workers, metavar="WA+WP",
                    help="w_active+w_passive of pubsub and avfl-ps (default: ceil(active "
                         f"cores)+{PASSIVE_WORKERS})")
    ap.add_argument("--big-width", type=_positive, help="bottom width of the party with more "
                    "cores (default: BALANCED's for 50:14 and 40:24, else "
                    f"{WIDTHS[0]}; widen it instead of narrowing the other, so that the small "
                    "party's per-batch messaging is a smaller share)")
    ap.add_argument("--repeats", type=_positive, default=1,
                    help="runs of every algorithm per split, interleaved (repeat k of every "
                         "algorithm before repeat k+1); medians, a missed target counting "
                         "as infinite time (default 1)")
    ap.add_argument("--val-per-epoch", type=_positive, default=VAL_PER_EPOCH,
                    help="validation points per epoch (default %(default)s: at least 20 "
                         "before sync VFL reaches the target)")
    ap.add_argument("--sync-per-epoch", type=int, default=0,
                    help="training segments per epoch, each a drain and PS sync, for every "
                         "algorithm (vfl.sync_per_epoch; a multiple of --val-per-epoch; "
                         "default 0: one per scoring)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a vfl config key for every algorithm alike (baselines included), "
                         "e.g. --set workers.active_torch_threads=2; repeatable")
    ap.add_argument("--out", type=Path, help="keep the run directories here")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--plaintext", action="store_true",
                    help="run the bus without CURVE (default: CURVE, as psfl sim run), to "
                         "see what the encryption costs")
    args = ap.parse_args(argv)
    try:
        overrides = set_overrides(args.set)
    except ValueError as exc:
        ap.error(f"--set: {exc}")
    rows = args.rows or (30_000 if args.quick else 60_000)
    epochs = args.epochs or (4 if args.quick else 6)
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    bad = [a for a in algos if a not in ALGOS]
    if bad:
        ap.error(f"unknown algorithm(s) {bad}; known: {', '.join(ALGOS)}")
    from parties.cli import write_json
    from pubsub.logs import configure_logging

    from parties.planning.profile import mean_profile

    from pubsub.config import ConfigError

    from sim.cluster.cpu import machine_cores
    from sim.cluster.scenario import Scenario, party_cores

    for split in splits:  # a bad split is a usage error before anything runs
        try:
            party_cores(Scenario(cpu_ratio=split, ratio_of=RATIO_OF), machine_cores())
        except (ConfigError, ValueError) as exc:
            ap.error(f"--splits: {exc}")

    configure_logging(stderr_level="error")
    t_start = time.perf_counter()
    keep = args.out
    tmp = None
    if keep is None:
        tmp = tempfile.TemporaryDirectory(prefix="hetero_")
        keep = Path(tmp.name)
    doc: dict[str, Any] = {"settings": {"rows": rows, "epochs": epochs, "features": FEATURES,
                                        "ratio_of": RATIO_OF, "machine_cores": machine_cores(),
                                        "quick": args.quick, "plaintext": args.plaintext,
                                        "repeats": args.repeats,
                                        "val_per_epoch": args.val_per_epoch,
                                        "sync_per_epoch": args.sync_per_epoch,
                                        "set": overrides},
                           "splits": {}, "summary": {}, "summary_even": {}}
    report: list[str] = []

    def progress(msg: str) -> None:
        print(f"  [{time.perf_counter() - t_start:6.0f} s] {msg}", file=sys.stderr, flush=True)

    timeout = 600.0
    try:
        for split in splits:
            cores = party_cores(Scenario(cpu_ratio=split, ratio_of=RATIO_OF), machine_cores())
            base = base_config(rows, epochs, args.batch_size, args.val_per_epoch,
                               args.sync_per_epoch, overrides=overrides)
            cfg, bal, model = split_config(base, split, cores, small_width=args.small_width,
                                           big_width=args.big_width)
            progress(f"{split}: cores {cores}, {model}")
            prof_before = quota_profile(cfg, cores, min_time_s=1.5)
            ceiling = prof_before.ceiling_samples_per_s
            progress(f"{split}: ceiling before the runs {ceiling:,.0f} samples/s (bound by "
                     f"{prof_before.bound_by})")
            plan_doc = None
            configs: dict[str, Any] = {}
            plan_error: dict[str, Any] | None = None
            for algo in algos:  # each algorithm's config, the plan once per split
                if algo == "pubsub_planned":
                    try:
                        configs[algo], plan_doc = planned_config(
                            dataclasses.replace(cfg, algo="pubsub"), cores,
                            keep / split.replace(":", "-") / "plan",
                            sweep_batch_sizes=(64, 256, 1024) if args.quick
                            else (32, 64, 128, 256, 512, 1024))
                    except Exception as exc:  # noqa: BLE001 - reported in the table
                        plan_error = {"status": "failed", "error": f"plan: {exc}"}
                    continue
                wa, wp = workers_for(algo, cores, split)
                if algo in ("pubsub", "avfl-ps") and args.workers:
                    wa, wp = args.workers
                configs[algo] = dataclasses.replace(cfg, algo=algo,
                                                    workers=dataclasses.replace(cfg.workers, active=wa, passive=wp))
            reps: list[dict[str, dict[str, Any]]] = []
            for rep in range(args.repeats):
                runs: dict[str, dict[str, Any]] = {}
                for algo in algos:
                    if algo not in configs:
                        runs[algo] = dict(plan_error or {"status": "failed", "error": "?"})
                        continue
                    rcfg = configs[algo]
                    name = algo if args.repeats == 1 else f"{algo}-r{rep + 1}"
                    out = keep / split.replace(":", "-") / name
                    runs[algo] = run_algo(rcfg, split, out, timeout, plaintext=args.plaintext)
                    r = runs[algo]
                    r_ceiling = ceiling
                    if r["status"] == "ok" and rcfg.batch_size != cfg.batch_size:
                        # the ceiling is the run's: its B changes the compute per sample
                        r["profile"] = quota_ceiling(rcfg, cores, min_time_s=1.5)
                        r_ceiling = r["ceiling"] = r["profile"]["ceiling_samples_per_s"]
                    tag = "" if args.repeats == 1 else f" (repeat {rep + 1})"
                    progress(f"{split} {algo}{tag}: " + (
                        f"AUC {r['metric']:.4f}, {r['train_samples_per_s']:,.0f} samples/s "
                        f"({r['train_samples_per_s'] / r_ceiling:.3f} of the "
                        f"{'run' if 'ceiling' in r else 'first'} profile), cpu util in "
                        f"training {_fmt(r['cpu_util_train']['active'], '.2f')}/"
                        f"{_fmt(r['cpu_util_train']['passive'], '.2f')} (whole run "
                        f"{r['cpu_util']['active']:.2f}/{r['cpu_util']['passive']:.2f}); "
                        f"{_fmt(_inrun_eff(r), '.3f')} of its in-run ceiling"
                        if r["status"] == "ok" else f"{r['status']}: {r.get('error')}"))
                reps.append(runs)
            # this machine's speed drifts by 10-20 % over minutes: the ceiling is the mean
            # of profiles taken before and after the split's runs (mean_profile)
            prof_after = quota_profile(cfg, cores, min_time_s=1.5)
            prof_obj = mean_profile([prof_before, prof_after])
            prof = {**prof_obj.to_dict(), "before": prof_before.to_dict(),
                    "after": prof_after.to_dict()}
            ceiling = prof_obj.ceiling_samples_per_s
            progress(f"{split}: ceiling after the runs {prof_after.ceiling_samples_per_s:,.0f}"
                     f" samples/s; mean {ceiling:,.0f} (bound by {prof_obj.bound_by})")
            # each repeat's target from its own vfl run, then medians over the repeats
            summ = aggregate_repeats([summarize(runs, ceiling, prof, args.target_auc)
                                      for runs in reps])
            info = {"cores": cores, "balance": bal, "model": model, "ceiling": ceiling,
                    "profile": prof, "plan": plan_doc}
            doc["splits"][split] = {**info, "target_auc": summ["target_auc"],
                                    "targets": summ["targets"],
                                    "runs": reps[0] if args.repeats == 1 else reps}
            doc["summary"][split] = summ["algos"]
            report.append(render(split, info, summ))
            if args.even and (bal["width"], bal["big_width"]) != (WIDTHS[0], WIDTHS[0]):
                even_runs: dict[str, dict[str, Any]] = {}
                eprof = quota_ceiling(base, cores, min_time_s=1.5)
                for algo in ("vfl", "avfl-ps", "pubsub"):
                    wa, wp = workers_for(algo, cores)
                    even_runs[algo] = run_algo(
                        dataclasses.replace(base, algo=algo,
                                            workers=dataclasses.replace(base.workers, active=wa, passive=wp)), split,
                        keep / split.replace(":", "-") / f"even-{algo}", timeout,
                        plaintext=args.plaintext)
                esumm = summarize(even_runs, eprof["ceiling_samples_per_s"], eprof,
                                      args.target_auc)
                doc["summary_even"][split] = esumm["algos"]
                doc["splits"][split]["even"] = {"ceiling": eprof["ceiling_samples_per_s"],
                                                "runs": even_runs}
                report.append(render(f"{split} (even split)", {
                    "cores": cores, "model": f"both bottoms {DEPTH}x128",
                    "ceiling": eprof["ceiling_samples_per_s"]}, esumm))
    finally:
        if tmp is not None:
            tmp.cleanup()
    doc["total_s"] = time.perf_counter() - t_start
    # above 1.05 × the ceiling means the profile is wrong (the issue's rule): an error
    doc["errors"] = [f"{key} {split} {algo}: efficiency {row['efficiency']:.3f} > "
                     f"{EFFICIENCY_LIMIT}: the ceiling's profile under-states the compute"
                     for key in ("summary", "summary_even")
                     for split, algos_ in doc[key].items() for algo, row in algos_.items()
                     if (row.get("efficiency") or 0) > EFFICIENCY_LIMIT]
    text = "\n\n".join(report + (["**Errors**", *doc["errors"]] if doc["errors"] else []))
    print(text)
    print(f"\n(total {doc['total_s']:.0f} s; runs kept in {args.out})" if args.out
          else f"\n(total {doc['total_s']:.0f} s)")
    if args.json:
        write_json(args.json, json.loads(json.dumps(doc, default=str)))
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
