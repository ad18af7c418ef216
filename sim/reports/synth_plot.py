"""``psfl report`` for FedForge runs: the drawing (matplotlib, Agg backend).

Per run (the series come from :mod:`sim.reports.synth`):

* ``stage_timeline.png``: the coordinator's stages against wall time, one row per stage,
  coloured by kind, with each row's seconds and the coordinator's kills / restarts;
* ``tv_per_marginal.png``: the TV distance of every workload marginal, sorted, with the
  worst ones named;
* ``privacy_budget.png``: ρ (zCDP) and ε spent per party against the planned budget.

A report over several FedForge runs writes ``<name>_<run>.png`` for each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sim.reports.common import DPI, FIGSIZE, _num, _pyplot, _save
from sim.reports.synth import (
    BUDGET_PNG,
    STAGE_PNG,
    TV_PNG,
    SynthReportError,
    SynthRun,
    budget_rows,
    load_synth_run,
    run_stage_spans,
    stage_group,
    stage_rows,
    tv_bars,
)

#: Colours of the stage kinds (:func:`sim.reports.synth.stage_group`).
GROUP_COLORS = {"setup": "#7f7f7f", "round": "#1f77b4", "select": "#9467bd",
                "synthesis": "#2ca02c", "quality": "#ff7f0e", "workload": "#8c564b",
                "other": "#bcbd22"}
#: Colour and line style of the stage timeline's markers (kills, restarts).
MARKER_STYLE = {"coordinator killed": ("#d62728", "-"),
                "coordinator restarted": ("black", "--"),
                "coordinator resumed": ("black", ":")}
#: Marginals named in the TV plot's right-hand panel (when there are more than this).
TV_NAMED = 25


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1.0 else f"{s:.2f} s"


def plot_stage_timeline(run: SynthRun, path: Path) -> Path:
    """Draw the stage timeline of one run into ``path``: one row per stage (in order of
    first start), a bar per time it ran (at least ~1 px wide), hatched when it failed
    or was cut by a kill; its seconds to the right; kills and restarts as vertical
    lines. Returns ``path``."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    spans, markers, source = run_stage_spans(run)
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    if not spans:
        ax.text(0.5, 0.5, "no stage events and no stage_s in metrics.json", ha="center",
                va="center", transform=ax.transAxes)
        ax.set_axis_off()
        ax.set_title(f"Coordinator stages: {run.label}", fontsize=13)
        return _save(fig, path)
    rows = stage_rows(spans)
    index = {s: i for i, s in enumerate(rows)}
    end = max(s.t1 for s in spans) or 1e-3
    min_w = end / 1400.0
    for s in spans:
        style = {"failed": ("xx", "#d62728"), "interrupted": ("//", "black")}.get(
            s.status, (None, "none"))
        ax.barh(index[s.stage], max(s.t1 - s.t0, min_w), left=s.t0, height=0.7,
                color=GROUP_COLORS[stage_group(s.stage)], hatch=style[0],
                edgecolor=style[1], linewidth=0.8 if style[0] else 0)
    for stage, i in index.items():
        mine = [s for s in spans if s.stage == stage]
        total = sum(s.t1 - s.t0 for s in mine)
        times = f" x{len(mine)}" if len(mine) > 1 else ""
        ax.text(max(s.t1 for s in mine) + end * 0.005, i, f"{_fmt_s(total)}{times}",
                va="center", fontsize=9)
    marker_lines = []
    for t, what in markers:
        color, ls = MARKER_STYLE.get(what, ("black", "-."))
        marker_lines.append(ax.axvline(t, color=color, linestyle=ls, linewidth=1.5,
                                       label=f"{what} at {t:.2f} s"))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim(0, end * 1.12)
    ax.set_xlabel("wall time after the first stage started (s)")
    ax.set_ylabel("coordinator stage")
    ax.grid(True, axis="x", alpha=0.3)
    used = list(dict.fromkeys(stage_group(s) for s in rows))
    handles = [Patch(color=GROUP_COLORS[g], label=g) for g in used]
    if any(s.status == "failed" for s in spans):
        handles.append(Patch(facecolor="white", edgecolor="#d62728", hatch="xx",
                             label="failed"))
    if any(s.status == "interrupted" for s in spans):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                             label="interrupted (no stage.done)"))
    # stages run top-left to bottom-right: the upper right is free
    ax.legend(handles=handles + marker_lines, loc="upper right")
    wall = _num(run.metrics.get("wall_s"))
    wall_txt = f"; run wall {wall:.1f} s with start-up" if wall is not None else ""
    ax.set_title(f"Coordinator stages: {run.label}\nfrom {source}; stages span "
                 f"{end:.2f} s{wall_txt}", fontsize=13)
    return _save(fig, path)


def plot_tv_per_marginal(run: SynthRun, path: Path) -> Path:
    """Draw the per-marginal TV of one run into ``path``: every marginal's TV as sorted
    bars with the mean and max dashed; with more than :data:`TV_NAMED` marginals a
    second panel names the worst :data:`TV_NAMED`. Returns ``path``."""
    plt = _pyplot()
    bars = tv_bars(run)
    m = run.metrics
    avg, mx = _num(m.get("avg_tv")), _num(m.get("max_tv"))
    wl = str(m.get("workload") or (run.quality or {}).get("workload") or "workload")
    title = f"TV distance per marginal ({wl}), worst first: {run.label}"
    if not bars:
        fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
        txt = "no per-marginal TV in stages/quality.json (tv_per_marginal)"
        if avg is not None:
            txt += f"\nmean TV {avg:.4f}" + (f", max {mx:.4f}" if mx is not None else "")
        ax.text(0.5, 0.5, txt, ha="center", va="center", transform=ax.transAxes,
                fontsize=13)
        ax.set_axis_off()
        ax.set_title(title, fontsize=13)
        return _save(fig, path)
    names, vals = [k for k, _ in bars], [v for _, v in bars]
    mean = sum(vals) / len(vals)
    many = len(bars) > TV_NAMED
    if many:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI,
                                      gridspec_kw={"width_ratios": [3, 2]})
    else:
        fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    ax.bar(range(len(vals)), vals, width=0.85 if len(vals) < 200 else 1.0,
           color="#1f77b4")
    ax.axhline(mean, color="k", linestyle="--", linewidth=1.5, label=f"mean {mean:.4f}")
    ax.axhline(vals[0], color="#d62728", linestyle=":", linewidth=1.5,
               label=f"max {vals[0]:.4f}")
    if many:
        ax.set_xlabel(f"marginal, sorted by TV ({len(vals)} marginals)")
        ax.set_xlim(-0.5, len(vals) - 0.5)
        top = list(zip(names, vals, strict=True))[:TV_NAMED]
        ax2.barh(range(len(top)), [v for _, v in top], color="#1f77b4")
        ax2.set_yticks(range(len(top)))
        ax2.set_yticklabels([n.replace(",", ", ") for n, _ in top], fontsize=9)
        ax2.invert_yaxis()
        ax2.axvline(mean, color="k", linestyle="--", linewidth=1.5)
        ax2.set_xlabel("TV distance")
        ax2.set_title(f"the {len(top)} worst marginals", fontsize=12)
        ax2.grid(True, axis="x", alpha=0.3)
    else:
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels([n.replace(",", ", ") for n in names], rotation=35, ha="right",
                           fontsize=10)
        ax.set_xlabel("marginal")
    ax.set_ylabel("TV distance (0.5 x L1 of the normalised marginals; lower is better)")
    ax.set_ylim(0, max(vals) * 1.15 or 1.0)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right")
    fig.suptitle(title, fontsize=14)
    return _save(fig, path)


def _party_ticks(ax: Any, parties: Sequence[str]) -> None:
    step = max(1, math.ceil(len(parties) / 40))
    ax.set_xticks(range(0, len(parties), step))
    ax.set_xticklabels(parties[::step], rotation=0 if len(parties) <= 12 else 60,
                       fontsize=9 if len(parties) > 12 else 11)


def plot_privacy_budget(run: SynthRun, path: Path) -> Path:
    """Draw ρ (zCDP) and ε spent per party against the planned budget into ``path``:
    bars for the ledgers' figures, the coordinator's planned ρ as markers, each party's
    ρ budget and the run's ε as dashed lines. Returns ``path``."""
    plt = _pyplot()
    rows = budget_rows(run.metrics)
    m = run.metrics
    fig, (ax_r, ax_e) = plt.subplots(1, 2, figsize=FIGSIZE, dpi=DPI)
    parties = [r.party for r in rows]
    xs = range(len(rows))
    ymax_r = 0.0
    if rows:
        ax_r.bar(xs, [r.rho_spent or 0.0 for r in rows], color="#1f77b4", alpha=0.85,
                 label="ρ spent (the party's ledger)")
        if len(rows) <= 20:  # each bar's share of the party's budget
            for i, r in enumerate(rows):
                if r.rho_spent is not None and r.rho_budget:
                    ax_r.text(i, r.rho_spent / 2, f"{100 * r.rho_spent / r.rho_budget:.0f}%",
                              ha="center", va="center", color="white", fontweight="bold")
        ymax_r = max([r.rho_spent or 0.0 for r in rows] + [r.rho_budget or 0.0 for r in rows])
        pl = [(i, r.rho_planned) for i, r in enumerate(rows) if r.rho_planned is not None]
        if pl:
            ax_r.scatter([i for i, _ in pl], [v for _, v in pl], marker="D", color="black",
                         zorder=3, label="ρ planned (coordinator)")
            ymax_r = max(ymax_r, *(v for _, v in pl))
        budgets = {r.rho_budget for r in rows if r.rho_budget is not None}
        if len(budgets) == 1:
            b = budgets.pop()
            ax_r.axhline(b, color="#d62728", linestyle="--", linewidth=1.5,
                         label=f"ρ budget {b:.6g}")
        elif budgets:
            ax_r.scatter(list(xs), [r.rho_budget for r in rows], marker="_", s=400,
                         color="#d62728", zorder=3, label="ρ budget (per party)")
        _party_ticks(ax_r, parties)
    else:
        ax_r.text(0.5, 0.5, "no rho_spent in metrics.json", ha="center", va="center",
                  transform=ax_r.transAxes)
    ax_r.set_ylim(0, (ymax_r or 1.0) * 1.25)
    ax_r.set_ylabel("ρ (zCDP)")
    ax_r.set_xlabel("party")
    ax_r.set_title("ρ spent per party against the plan", fontsize=12)
    ax_r.grid(True, axis="y", alpha=0.3)
    ax_r.legend(loc="upper right")
    eps_t = _num(m.get("epsilon"))
    finite = [(i, r.epsilon_spent) for i, r in enumerate(rows)
              if r.epsilon_spent is not None and math.isfinite(r.epsilon_spent)]
    if finite:
        ax_e.bar([i for i, _ in finite], [v for _, v in finite], color="#ff7f0e",
                 alpha=0.85, label="ε spent (from the ledger's ρ)")
    if eps_t is not None:
        ax_e.axhline(eps_t, color="#d62728", linestyle="--", linewidth=1.5,
                     label=f"ε planned {eps_t:g} (δ = {m.get('delta', '?')})")
    ymax_e = max([v for _, v in finite] + [eps_t or 0.0])
    if not finite:
        ax_e.text(0.5, 0.5, "no finite ε spent (an exact run, or none recorded)",
                  ha="center", va="center", transform=ax_e.transAxes)
    if rows:
        _party_ticks(ax_e, parties)
    ax_e.set_ylim(0, (ymax_e or 1.0) * 1.25)
    ax_e.set_ylabel("ε")
    ax_e.set_xlabel("party")
    ax_e.set_title("ε spent per party against the plan", fontsize=12)
    ax_e.grid(True, axis="y", alpha=0.3)
    if ax_e.get_legend_handles_labels()[0]:
        ax_e.legend(loc="upper right")
    extra = []
    for key in ("ledger_agrees", "ledger_within_plan"):
        if key in m:
            extra.append(f"{key} = {m[key]}")
    fig.suptitle(f"Privacy budget per party: {run.label}"
                 + (f"\n{', '.join(extra)}" if extra else ""), fontsize=14)
    return _save(fig, path)


def make_synth_report(root: Path, dirs: Sequence[Path], out_dir: Path, *,
                      say: Callable[[str], None] = print) -> list[Path]:
    """Write the three plots of every FedForge run in ``dirs`` (below ``root``) into
    ``out_dir``: plain names for one run, ``<name>_<run>.png`` for several. A run that
    cannot be read is skipped with a message naming its directory.

    Raises:
        SynthReportError: not one of ``dirs`` could be read (names ``root``).
    """
    runs = []
    for d in dirs:
        try:
            runs.append(load_synth_run(d, root))
        except SynthReportError as exc:
            say(f"skipped: {exc}")
    if not runs:
        raise SynthReportError(f"no readable FedForge run below {root} (every "
                               "metrics.json was skipped)")
    written = []
    for run in runs:
        def name(base: str, run: SynthRun = run) -> Path:
            if len(runs) == 1:
                return out_dir / base
            stem, ext = base.rsplit(".", 1)
            return out_dir / f"{stem}_{run.stem}.{ext}"

        for note in run.notes:
            say(f"note: {run.label} ({run.path}): {note}")
        if not tv_bars(run):
            say(f"note: {run.label} ({run.path}): no per-marginal TV recorded "
                "(stages/quality.json tv_per_marginal); that plot shows the mean only")
        for p in (plot_stage_timeline(run, name(STAGE_PNG)),
                  plot_tv_per_marginal(run, name(TV_PNG)),
                  plot_privacy_budget(run, name(BUDGET_PNG))):
            written.append(p)
            say(str(p))
    return written


__all__ = ["GROUP_COLORS", "make_synth_report", "plot_privacy_budget",
           "plot_stage_timeline", "plot_tv_per_marginal"]
