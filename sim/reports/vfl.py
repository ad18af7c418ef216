"""``psfl report RUN_DIR``: PNG plots of one VFL run or a benchmark's runs.

FedForge runs (a ``metrics.json`` with ``stage_s`` and ``rho_spent``) found below the
directory get their own plots (stage timeline, TV per marginal, privacy budget per
party): :mod:`sim.reports.synth` (series) and :mod:`sim.reports.synth_plot` (drawing).

A run directory (written by ``psfl vfl run --out RUN_DIR``) holds ``metrics.json`` (the
active party's metrics, the passive's under ``parties.passive``), ``passive.json`` and,
when the run recorded them, ``timeline-active.json`` / ``timeline-passive.json`` (see
:mod:`parties.runtime.timeline`). A benchmark directory holds several run directories at any
depth; every ``metrics.json`` below the given directory is one run.

Plots written (default into ``RUN_DIR/plots/``):

* ``metric_vs_time.png``: validation metric against cumulative training time (s), one
  line per run, the target metric as a dashed line;
* ``cpu_util.png``: CPU utilisation (% of the party's allotted cores) per party, per
  history segment for one run, grouped bars per run for several;
* ``gantt_<run>.png``: per-worker compute / wait / comm spans of both parties in a
  window (default: the first 40 batches after training starts).

Loading, windowing and series extraction are pure functions (no matplotlib), so they are
testable apart from the drawing; matplotlib is imported only by the ``plot_*`` functions
and uses the Agg backend.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.reports.common import (DPI, FIGSIZE, ReportError, _num, _pyplot,  # noqa: F401
                               _read_json, _save, is_vfl_metrics)

#: Default number of batches the Gantt window shows.
DEFAULT_MAX_BATCHES = 40
#: Colours of the span kinds in Gantt plots.
KIND_COLORS = {"compute": "#1f77b4", "wait": "#ffbb78", "comm": "#d62728"}
#: Files the report writes besides the per-run Gantt plots.
METRIC_PNG = "metric_vs_time.png"
CPU_PNG = "cpu_util.png"
ROLES = ("active", "passive")


@dataclass
class Run:
    """One run found below the report's root.

    Attributes:
        path: the run directory.
        rel: its path relative to the root, POSIX style (``"."`` for the root itself).
        metrics: the parsed ``metrics.json``.
        passive: the parsed ``passive.json``, or None when absent or unreadable.
        timelines: role -> parsed timeline dict, for the timeline files present.
        notes: human-readable notes (missing / unreadable files), for stdout.
        label: the run's label in plots (set by :func:`load_runs`).
    """

    path: Path
    rel: str
    metrics: dict[str, Any]
    passive: dict[str, Any] | None = None
    timelines: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    label: str = ""

    @property
    def algo(self) -> str:
        """The run's algorithm (``metrics["algo"]``, ``"?"`` when missing)."""
        return str(self.metrics.get("algo") or self.metrics.get("config", {}).get("algo") or "?")


@dataclass(frozen=True)
class Window:
    """A Gantt time window, seconds after training start (the first batch span).

    Attributes:
        t0: start, s.
        t1: end, s (> t0).
        description: what the window shows, for the plot title.
    """

    t0: float
    t1: float
    description: str


@dataclass(frozen=True)
class Span:
    """One timeline span on the common clock (seconds after training start)."""

    role: str
    worker: int
    kind: str
    batch: int
    t0: float
    t1: float


# --------------------------------------------------------------------------- discovery


def find_run_dirs(root: str | Path) -> list[Path]:
    """Every directory at or below ``root`` holding a ``metrics.json``, sorted by path.

    Raises:
        ReportError: ``root`` does not exist or is not a directory; no ``metrics.json``
            at or below it.
    """
    root = Path(root)
    if not root.exists():
        raise ReportError(f"run directory {root} does not exist")
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory")
    dirs = sorted({p.parent for p in root.rglob("metrics.json") if p.is_file()},
                  key=lambda p: p.relative_to(root).parts)
    if not dirs:
        raise ReportError(f"no metrics.json found in or below {root} "
                          "(expected a directory written by psfl vfl run --out)")
    return dirs


def load_run(run_dir: Path, root: Path) -> Run:
    """Load one run directory (metrics, passive report, timelines).

    Missing or unreadable ``passive.json`` / timeline files become notes, not errors.

    Raises:
        ReportError: ``metrics.json`` is unreadable, not JSON, or not a VFL run's metrics.
    """
    from parties.runtime.timeline import load_timeline

    rel = run_dir.relative_to(root).as_posix()
    try:
        metrics = _read_json(run_dir / "metrics.json")
    except (OSError, ValueError) as exc:
        raise ReportError(f"{run_dir / 'metrics.json'}: unreadable ({exc})") from exc
    if not is_vfl_metrics(metrics):
        raise ReportError(f"{run_dir / 'metrics.json'}: not a VFL run's metrics "
                          "(no history or parties)")
    run = Run(path=run_dir, rel=rel, metrics=metrics)
    pj = run_dir / "passive.json"
    if pj.is_file():
        try:
            p = _read_json(pj)
            run.passive = p if isinstance(p, dict) else None
        except (OSError, ValueError) as exc:
            run.notes.append(f"passive.json unreadable ({exc})")
    missing: list[str] = []
    for role in party_order(metrics):
        tf = run_dir / f"timeline-{role}.json"
        if not tf.is_file():
            missing.append(tf.name)
            continue
        try:
            run.timelines[role] = load_timeline(tf)
        except (OSError, ValueError) as exc:
            run.notes.append(f"{tf.name} unreadable ({exc})")
    if missing and len(missing) < len(party_order(metrics)):
        run.notes.append(f"no {' / '.join(missing)}")
    return run


def party_order(metrics: dict[str, Any]) -> list[str]:
    """The run's parties: ``active``, then the passive parties in id order (``passive``,
    ``passive2`` …; a two-party run's are :data:`ROLES`)."""
    named = [p for p in (metrics.get("parties") or {}) if p not in ROLES]
    return [*ROLES, *sorted(named, key=lambda p: (len(p), p))]


def run_labels(runs: Sequence[tuple[str, str]]) -> list[str]:
    """Plot labels for runs given as ``(algo, rel)`` pairs.

    A run is labelled by its algorithm; when two or more runs share an algorithm each
    gets its subdirectory too: ``"algo (rel)"``, where a last path component equal to
    the algorithm is dropped (``bank/pubsub`` -> ``pubsub (bank)``). Labels that are
    still equal get ``#2``, ``#3``, ... suffixes.
    """
    counts: dict[str, int] = {}
    for algo, _ in runs:
        counts[algo] = counts.get(algo, 0) + 1
    labels = []
    for algo, rel in runs:
        if counts[algo] == 1:
            labels.append(algo)
            continue
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if len(parts) > 1 and parts[-1] == algo:
            parts = parts[:-1]
        labels.append(f"{algo} ({'/'.join(parts) or '.'})")
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} #{seen[lab]}")
    return out


def run_file_stem(run: Run) -> str:
    """A filename-safe name of the run (its relative path, ``/`` -> ``_``; the
    directory's own name for the root run)."""
    name = run.path.name if run.rel in ("", ".") else run.rel.replace("/", "_")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "run"


def _outside_skip(root: Path, dirs: Sequence[Path], skip: Path | None) -> list[Path]:
    """``dirs`` less those inside ``skip`` (the output directory), when ``skip`` lies
    strictly inside ``root`` (an output directory equal to the root hides nothing)."""
    skip_r = skip.resolve() if skip is not None else None
    if skip_r is None or skip_r == root.resolve() or not skip_r.is_relative_to(root.resolve()):
        return list(dirs)
    return [d for d in dirs if not d.resolve().is_relative_to(skip_r)]


def load_runs(root: str | Path, *, skip: Path | None = None,
              say: Callable[[str], None] = print,
              dirs: Sequence[Path] | None = None) -> list[Run]:
    """Load every run below ``root`` and label them (:func:`run_labels`).

    Runs whose ``metrics.json`` is unreadable or not a VFL run's are skipped with a
    message through ``say``; so are runs inside ``skip`` (the output directory).
    ``dirs``: the run directories to load (default: :func:`find_run_dirs`).

    Raises:
        ReportError: ``root`` missing, no ``metrics.json`` below it, or no loadable run.
    """
    root = Path(root)
    runs = []
    for d in _outside_skip(root, find_run_dirs(root) if dirs is None else dirs, skip):
        try:
            runs.append(load_run(d, root))
        except ReportError as exc:
            say(f"skipped: {exc}")
    if not runs:
        raise ReportError(f"no VFL run found below {root} (every metrics.json was skipped)")
    for run, lab in zip(runs, run_labels([(r.algo, r.rel) for r in runs]), strict=True):
        run.label = lab
    return runs


# --------------------------------------------------------------------------- series


def metric_series(metrics: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Validation metric against cumulative training time.

    Returns:
        ``(times_s, values)``: ``train_wall_s`` (training seconds, evaluation excluded)
        and ``metric`` of every history segment that was evaluated, in history order.
        Segments without a finite metric or time are left out.
    """
    xs: list[float] = []
    ys: list[float] = []
    for h in metrics.get("history") or []:
        if not isinstance(h, dict):
            continue
        t = _num(h.get("train_wall_s"))
        v = _num(h.get("metric"))
        if t is not None and v is not None:
            xs.append(t)
            ys.append(v)
    return xs, ys


def party_history(run: Run, role: str) -> list[dict[str, Any]]:
    """A party's history segments: the active party's from ``metrics.json``; the
    passive's from ``metrics.json`` ``parties.passive``, else from ``passive.json``."""
    if role == "active":
        h = run.metrics.get("history")
    else:
        h = (run.metrics.get("parties", {}).get("passive") or {}).get("history")
        if not h and run.passive:
            h = run.passive.get("history")
    return [x for x in (h or []) if isinstance(x, dict)]


def party_summary(run: Run, role: str) -> dict[str, Any]:
    """A party's whole-run metrics (``metrics.json`` ``parties.<role>``, the passive's
    falling back to ``passive.json``); ``{}`` when absent."""
    p = run.metrics.get("parties", {}).get(role)
    if not p and role == "passive":
        p = run.passive
    return p if isinstance(p, dict) else {}


def cpu_segments(history: Sequence[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """CPU utilisation per history segment.

    Returns:
        ``(t_start_s, t_end_s, util_pct)`` per segment with a finite ``cpu_util`` and
        ``train_wall_s``: the segment spans from the previous segment's cumulative
        training time (0 for the first) to its own; ``util_pct`` is ``cpu_util`` x 100,
        in % of the party's allotted cores (may exceed 100).
    """
    out = []
    prev = 0.0
    for h in history:
        t = _num(h.get("train_wall_s"))
        u = _num(h.get("cpu_util"))
        if t is None:
            continue
        if u is not None:
            out.append((prev, t, 100.0 * u))
        prev = t
    return out


def cpu_summary(run: Run, role: str) -> tuple[float | None, float | None, float | None]:
    """A party's CPU utilisation over training and the range over its segments, %.

    Returns:
        ``(overall_pct, min_pct, max_pct)``; overall is the party's ``cpu_util_train``
        (all training segments; runs before it existed: ``cpu_util``, the whole life,
        else the mean of the segments); None where nothing is known.
    """
    segs = cpu_segments(party_history(run, role))
    vals = [u for _, _, u in segs]
    summary = party_summary(run, role)
    overall = _num(summary.get("cpu_util_train"))
    if overall is None:
        overall = _num(summary.get("cpu_util"))
    if overall is not None:
        overall *= 100.0
    elif vals:
        overall = sum(vals) / len(vals)
    if not vals:
        return overall, None, None
    return overall, min(vals), max(vals)


# --------------------------------------------------------------------------- timelines


def aligned_spans(timelines: dict[str, dict[str, Any]]) -> list[Span]:
    """Both parties' spans on one clock: seconds after training start.

    Each file's ``t0_s``/``t1_s`` are relative to its ``anchor_perf_s`` (perf_counter,
    one clock for every process of a host), so absolute time is ``anchor + t``;
    training start is the earliest start of a span with a batch (``batch >= 0``) in
    either party (of any span when none has one). Spans are sorted by start.

    Raises:
        ReportError: a timeline without ``anchor_perf_s``.
    """
    raw = []
    for role, tl in timelines.items():
        anchor = _num(tl.get("anchor_perf_s"))
        if anchor is None:
            raise ReportError(f"timeline of the {role} party has no anchor_perf_s")
        for k, w, b, t0, t1 in zip(tl["kind"], tl["worker"], tl["batch"], tl["t0_s"],
                                   tl["t1_s"], strict=True):
            if k == "segment":  # training segments: not a worker's span
                continue
            raw.append((role, int(w), str(k), int(b), anchor + float(t0), anchor + float(t1)))
    if not raw:
        return []
    starts = [r[4] for r in raw if r[3] >= 0] or [r[4] for r in raw]
    zero = min(starts)
    spans = [Span(r, w, k, b, t0 - zero, t1 - zero) for r, w, k, b, t0, t1 in raw]
    spans.sort(key=lambda s: (s.t0, s.t1))
    return spans


def batch_window(spans: Sequence[Span], max_batches: int) -> Window:
    """The window of the first ``max_batches`` batches after training start.

    Walking spans by start time, the window closes where a span of a batch id not yet
    seen starts once ``max_batches`` ids were seen (ids repeat per epoch, so this is the
    first ``max_batches`` batches of the first epoch when an epoch has more); it is
    extended to the end of the last compute / comm span of those batches that started
    before. Spans without a batch (``-1``: replica syncs) do not count. When the run has
    no more batches, the window covers every span.

    Raises:
        ReportError: ``max_batches < 1`` or no spans.
    """
    if max_batches < 1:
        raise ReportError(f"--max-batches must be >= 1, got {max_batches}")
    if not spans:
        raise ReportError("the timelines hold no spans")
    seen: set[int] = set()
    cutoff = None
    for s in spans:
        if s.batch < 0 or s.batch in seen:
            continue
        if len(seen) == max_batches:
            cutoff = s.t0
            break
        seen.add(s.batch)
    t0 = min(0.0, min(s.t0 for s in spans if s.batch >= 0) if seen else spans[0].t0)
    if cutoff is None:
        t1 = max(s.t1 for s in spans)
        desc = f"whole run (all {len(seen)} batch ids)"
    else:
        ends = [s.t1 for s in spans if s.t0 < cutoff and s.batch in seen and s.kind != "wait"]
        t1 = max([cutoff, *ends])
        desc = f"first {max_batches} batches"
    if t1 <= t0:
        t1 = t0 + 1e-3
    return Window(t0, t1, desc)


def parse_window_s(text: str) -> tuple[float, float]:
    """Parse ``--window-s``: ``"A:B"`` (seconds after training start) or ``"B"``
    (meaning ``0:B``).

    Raises:
        ReportError: not numbers, negative start, or end <= start.
    """
    parts = text.split(":")
    try:
        if len(parts) == 1:
            a, b = 0.0, float(parts[0])
        elif len(parts) == 2:
            a, b = float(parts[0] or 0.0), float(parts[1])
        else:
            raise ValueError(text)
    except ValueError as exc:
        raise ReportError(f"--window-s must be START:END or END seconds, got {text!r}") from exc
    if not (math.isfinite(a) and math.isfinite(b)) or a < 0 or b <= a:
        raise ReportError(f"--window-s needs 0 <= START < END, got {text!r}")
    return a, b


def spans_in_window(spans: Sequence[Span], window: Window) -> list[Span]:
    """Spans overlapping the window, clipped to it."""
    out = []
    for s in spans:
        if s.t1 < window.t0 or s.t0 > window.t1:
            continue
        out.append(Span(s.role, s.worker, s.kind, s.batch, max(s.t0, window.t0),
                        min(s.t1, window.t1)))
    return out


def gantt_rows(spans: Sequence[Span]) -> list[tuple[str, int]]:
    """The Gantt rows ``(role, worker)``: active workers first, then passive, by index."""
    order = {r: i for i, r in enumerate(ROLES)}
    return sorted({(s.role, s.worker) for s in spans},
                  key=lambda rw: (order.get(rw[0], len(order)), len(rw[0]), rw[0], rw[1]))


# --------------------------------------------------------------------------- drawing


def _metric_title(name: str) -> str:
    return {"auc": "AUC", "rmse": "RMSE"}.get(name.lower(), name)


def _colors(n: int) -> list[Any]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def plot_metric_vs_time(runs: Sequence[Run], out: Path) -> Path:
    """Draw ``metric_vs_time.png``: validation metric vs cumulative training time (s),
    one line per run, markers at evaluations, dashed target lines; one panel per metric
    name when runs differ (e.g. AUC and RMSE). Returns the written path."""
    plt = _pyplot()
    names = sorted({str(r.metrics.get("metric_name") or "metric") for r in runs})
    fig, axes = plt.subplots(1, len(names), figsize=FIGSIZE, dpi=DPI, squeeze=False)
    colors = _colors(len(runs))
    markers = "osD^v<>ph*"
    for ax, name in zip(axes[0], names, strict=True):
        targets: dict[float, list[str]] = {}
        drawn = 0
        for k, (run, color) in enumerate(zip(runs, colors, strict=True)):
            if str(run.metrics.get("metric_name") or "metric") != name:
                continue
            xs, ys = metric_series(run.metrics)
            if xs:
                ax.plot(xs, ys, marker=markers[k % len(markers)], markersize=7, linewidth=2, color=color,
                        label=run.label)
                drawn += 1
            t = _num(run.metrics.get("target_metric"))
            if t is not None:
                targets.setdefault(t, []).append(run.label)
        for t, labs in sorted(targets.items()):
            who = "" if len(targets) == 1 else f" ({', '.join(labs)})"
            ax.axhline(t, linestyle="--", color="0.35", linewidth=1.5,
                       label=f"target {_metric_title(name)} {t:g}{who}")
        if not drawn:
            ax.text(0.5, 0.5, "no evaluated segments in the history", ha="center",
                    va="center", transform=ax.transAxes)
        ax.set_xlabel("training wall time (s, evaluation excluded)")
        ax.set_ylabel(f"validation {_metric_title(name)}")
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
        better = "lower is better" if name.lower() in ("rmse", "mse", "mae", "loss") \
            else "higher is better"
        ax.margins(y=0.08)
        title = f"Validation {_metric_title(name)} vs training time ({better})"
        if len(names) == 1:
            title = f"{title}\n{_suptitle(runs)}; markers: evaluations"
        ax.set_title(title, fontsize=13)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    if len(names) > 1:
        fig.suptitle(f"{_suptitle(runs)}; markers: evaluations", fontsize=14)
    return _save(fig, out / METRIC_PNG)


def _suptitle(runs: Sequence[Run]) -> str:
    ds = sorted({str(r.metrics.get("dataset", "?")) for r in runs})
    return (f"{len(runs)} run{'s' if len(runs) != 1 else ''}, dataset "
            f"{', '.join(ds)}")


def _cores(run: Run, role: str) -> str:
    c = _num(party_summary(run, role).get("cores_allotted"))
    return "" if c is None else f", {c:g} core{'s' if c != 1 else ''}"


def plot_cpu_util(runs: Sequence[Run], out: Path) -> Path:
    """Draw ``cpu_util.png``: CPU utilisation in % of each party's allotted cores.

    One run: a panel per party, one bar per history segment spanning its training time
    (s), the value over all of training dashed. Several runs: grouped bars per run
    (active, passive: the value over all of training, whiskers over the segments'
    min-max). Returns the path.
    """
    plt = _pyplot()
    if len(runs) == 1:
        run = runs[0]
        fig, axes = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI, sharey=True)
        ymax = 100.0
        for ax, role, color in zip(axes, ROLES, ("#1f77b4", "#ff7f0e"), strict=True):
            segs = cpu_segments(party_history(run, role))
            overall = cpu_summary(run, role)[0]
            if segs:
                ax.bar([a for a, _, _ in segs], [u for _, _, u in segs],
                       width=[b - a for a, b, _ in segs], align="edge", color=color,
                       alpha=0.75, edgecolor="white", linewidth=1.5,
                       label="per history segment")
                ymax = max(ymax, *(u for _, _, u in segs))
                ax.set_xlim(0, max(b for _, b, _ in segs) * 1.02)
            else:
                ax.text(0.5, 0.5, f"no {role} history", ha="center", va="center",
                        transform=ax.transAxes)
            if overall is not None:
                ax.axhline(overall, color="k", linestyle="--", linewidth=1.5,
                           label=f"all of training {overall:.0f}%")
                ymax = max(ymax, overall)
            ax.axhline(100, color="0.5", linestyle=":", linewidth=1.2,
                       label="100% = all allotted cores busy")
            ax.set_title(f"{role} party{_cores(run, role)}")
            ax.set_xlabel("training wall time (s, evaluation excluded)")
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(loc="upper right")
        axes[0].set_ylabel("CPU utilisation (% of allotted cores)")
        axes[0].set_ylim(0, ymax * 1.15)
        fig.suptitle(f"CPU utilisation per party: {run.label}, dataset "
                     f"{run.metrics.get('dataset', '?')}",
                     fontsize=14)
        return _save(fig, out / CPU_PNG)

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    width = 0.38
    ymax = 100.0
    for j, (role, color) in enumerate(zip(ROLES, ("#1f77b4", "#ff7f0e"), strict=True)):
        xs, hs, lo, hi = [], [], [], []
        for i, run in enumerate(runs):
            overall, mn, mx = cpu_summary(run, role)
            if overall is None:
                continue
            xs.append(i + (j - 0.5) * width)
            hs.append(overall)
            lo.append(overall - mn if mn is not None else 0.0)
            hi.append(mx - overall if mx is not None else 0.0)
            ymax = max(ymax, overall, mx or 0.0)
        if xs:
            ax.bar(xs, hs, width=width, color=color, alpha=0.85, label=f"{role} party",
                   yerr=[[max(v, 0.0) for v in lo], [max(v, 0.0) for v in hi]], capsize=5,
                   error_kw={"ecolor": "0.2", "linewidth": 1.2})
            for x, h in zip(xs, hs, strict=True):
                ax.text(x, h / 2, f"{h:.0f}%", ha="center", va="center", fontsize=10,
                        color="white", fontweight="bold")
    ax.axhline(100, color="0.5", linestyle=":", linewidth=1.2,
               label="100% = all allotted cores busy")
    ax.set_xticks(range(len(runs)))
    rot = 0 if len(runs) <= 6 and max(len(r.label) for r in runs) <= 24 else 30
    ax.set_xticklabels([r.label for r in runs], rotation=rot,
                       ha="right" if rot else "center")
    ax.set_xlabel("run")
    ax.set_ylabel("CPU utilisation (% of the party's allotted cores)")
    ax.set_ylim(0, ymax * 1.3)  # room for the legend above the 100% line
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right", title="bar: all of training; whisker: min-max over segments")
    ax.set_title(f"CPU utilisation per party and run ({_suptitle(runs)})", fontsize=14)
    return _save(fig, out / CPU_PNG)


def plot_gantt(run: Run, spans: Sequence[Span], window: Window, out: Path) -> Path:
    """Draw ``gantt_<run>.png``: one row per (party, worker), wait spans under compute
    spans, comm spans on top (drawn at least ~1 pixel wide), within ``window``.

    Raises:
        ReportError: no span in the window.
    """
    plt = _pyplot()
    from matplotlib.patches import Patch

    shown = spans_in_window(spans, window)
    if not shown:
        raise ReportError(f"no timeline span between {window.t0:.3f} and {window.t1:.3f} s")
    rows = gantt_rows(shown)
    index = {rw: i for i, rw in enumerate(rows)}
    width_s = window.t1 - window.t0
    min_w = width_s / 1400.0  # ~1 px of the 1600 px figure's axes
    # in ms, for readable tick labels of short windows
    scale, unit = (1e3, "ms") if width_s < 2.0 else (1.0, "s")
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    style = {"wait": (0.80, 1), "compute": (0.56, 2), "comm": (0.80, 3)}
    for kind in ("wait", "compute", "comm"):
        height, z = style[kind]
        by_row: dict[int, list[tuple[float, float]]] = {}
        for s in shown:
            if s.kind != kind:
                continue
            w = s.t1 - s.t0
            if kind == "comm":
                w = max(w, min_w)
            by_row.setdefault(index[(s.role, s.worker)], []).append((s.t0 * scale, w * scale))
        for i, bars in by_row.items():
            ax.broken_barh(bars, (i - height / 2, height), facecolors=KIND_COLORS[kind],
                           edgecolor="none", zorder=z)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r} worker {w}" for r, w in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(window.t0 * scale, window.t1 * scale)
    for i in range(1, len(rows)):
        if rows[i][0] != rows[i - 1][0]:
            ax.axhline(i - 0.5, color="0.3", linewidth=1.2)
    ax.set_xlabel(f"time after training start ({unit}; training starts at the first batch span)")
    ax.set_ylabel("party and worker")
    ax.grid(True, axis="x", alpha=0.3)
    parties = list(dict.fromkeys(r for r, _ in rows))
    per_role = "+".join(str(sum(1 for r, _ in rows if r == role)) for role in parties)
    ax.set_title(f"Worker timeline: {run.label}, dataset {run.metrics.get('dataset', '?')}, "
                 f"{per_role} workers ({'+'.join(parties)})\nwindow: {window.description}, "
                 f"{window.t0:.3f}-{window.t1:.3f} s after training start "
                 f"({len(shown)} spans)", fontsize=13)
    handles = [Patch(color=KIND_COLORS["compute"], label="compute"),
               Patch(color=KIND_COLORS["wait"], label="wait for partner"),
               Patch(color=KIND_COLORS["comm"], label="comm: hand to bus (>= 1 px wide)")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3,
              frameon=False)
    return _save(fig, out / f"gantt_{run_file_stem(run)}.png")


# --------------------------------------------------------------------------- entry


def make_report(root: str | Path, out: str | Path | None = None, *,
                max_batches: int = DEFAULT_MAX_BATCHES, window_s: str | None = None,
                say: Callable[[str], None] = print) -> list[Path]:
    """Write every plot for the runs below ``root``; return the written paths.

    VFL runs get the plots above, FedForge runs those of
    :func:`sim.reports.synth_plot.make_synth_report`; a directory may hold both kinds.

    Args:
        root: a run directory or a directory of run directories.
        out: output directory (default ``root/plots``), created when missing.
        max_batches: Gantt window, batches after training start (ignored with window_s).
        window_s: Gantt window ``"A:B"`` seconds after training start (see
            :func:`parse_window_s`).
        say: receives one line per written file and per note.

    Raises:
        ReportError: missing root, no runs, bad window arguments.
    """
    root = Path(root)
    out_dir = Path(out) if out is not None else root / "plots"
    if max_batches < 1:
        raise ReportError(f"--max-batches must be >= 1, got {max_batches}")
    fixed = parse_window_s(window_s) if window_s is not None else None
    from sim.reports.synth import classify_run_dirs

    synth_dirs, vfl_dirs, skipped = classify_run_dirs(
        _outside_skip(root, find_run_dirs(root), out_dir))
    for line in skipped:
        say(line)
    written: list[Path] = []
    if synth_dirs:
        from sim.reports.synth_plot import make_synth_report

        written += make_synth_report(root, synth_dirs, out_dir, say=say)
        if not vfl_dirs:
            return written
    if not vfl_dirs:
        raise ReportError(f"no VFL or FedForge run found below {root} (every "
                          "metrics.json was skipped)")
    runs = load_runs(root, skip=out_dir, say=say, dirs=vfl_dirs)
    vfl_written = [plot_metric_vs_time(runs, out_dir), plot_cpu_util(runs, out_dir)]
    written += vfl_written
    for p in vfl_written:
        say(str(p))
    for run in runs:
        for note in run.notes:
            say(f"note: {run.label} ({run.path}): {note}")
        if not run.timelines:
            say(f"note: {run.label} ({run.path}): no timelines, Gantt plot skipped "
                "(metric and CPU plots written)")
            continue
        try:
            spans = aligned_spans(run.timelines)
            if fixed is not None:
                win = Window(fixed[0], fixed[1], "requested --window-s")
            else:
                win = batch_window(spans, max_batches)
            p = plot_gantt(run, spans, win, out_dir)
        except ReportError as exc:
            say(f"note: {run.label} ({run.path}): Gantt plot skipped: {exc}")
            continue
        written.append(p)
        say(str(p))
    return written
