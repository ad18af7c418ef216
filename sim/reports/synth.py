"""``psfl report`` for FedForge runs: loading and series (pure; no matplotlib).

A FedForge run directory (``psfl synth run --out RUN_DIR``, a consortium run, or a
benchmark's directory of them) holds ``metrics.json`` (``stage_s``, ``rho_spent``,
``epsilon_spent``, ``rho_planned``, ``ledger``, ``avg_tv`` ...), ``events.jsonl`` (the
coordinator's ``stage.started`` / ``stage.done`` / ``stage.failed`` with their UTC
timestamps) and ``stages/quality.json`` (``tv_per_marginal``: each workload marginal's TV
distance). The functions here turn those into the series that
:mod:`sim.reports.synth_plot` draws:

* :func:`stage_spans`: the coordinator's stages against wall time (seconds after the
  first stage started), with the kills, restarts and resumes of the coordinator;
* :func:`tv_bars`: the per-marginal TV, worst first;
* :func:`budget_rows`: ρ and ε spent per party against the planned budget.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sim.reports.common import ReportError, _num, _read_json, is_vfl_metrics

#: The plots of one FedForge run (several runs: ``<stem>_<run>.png`` each).
STAGE_PNG = "stage_timeline.png"
TV_PNG = "tv_per_marginal.png"
BUDGET_PNG = "privacy_budget.png"
#: Events drawn as vertical markers on the stage timeline.
MARKER_EVENTS = {"sim.coordinator_killed": "coordinator killed",
                 "sim.coordinator_restarted": "coordinator restarted",
                 "coordinator.resumed": "coordinator resumed"}
STAGE_EVENTS = ("stage.started", "stage.done", "stage.failed")


class SynthReportError(ReportError):
    """A FedForge run ``psfl report`` cannot plot (the message names its directory);
    exit 2."""


def is_synth_metrics(m: Any) -> bool:
    """True when ``m`` looks like a FedForge run's ``metrics.json`` (a dict with
    ``stage_s`` and ``rho_spent`` dicts; VFL metrics have neither)."""
    return (isinstance(m, dict) and isinstance(m.get("stage_s"), dict)
            and isinstance(m.get("rho_spent"), dict) and not is_vfl_metrics(m))


@dataclass
class SynthRun:
    """One FedForge run below the report's root.

    Attributes:
        path: the run directory.
        rel: its path relative to the root, POSIX style (``"."`` for the root itself).
        metrics: the parsed ``metrics.json``.
        events: the parsed lines of ``events.jsonl`` (``[]`` when absent).
        quality: the parsed ``stages/quality.json``, or None.
        notes: human-readable notes (missing / unreadable files), for stdout.
    """

    path: Path
    rel: str
    metrics: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    quality: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``dataset K=.. ε=.. mechanism/engine`` (plus the run's subdirectory)."""
        m = self.metrics
        ds = Path(str(m.get("dataset") or "?")).stem or "?"
        eps = _num(m.get("epsilon"))
        text = (f"{ds} K={m.get('parties', '?')} ε={'?' if eps is None else f'{eps:g}'} "
                f"{m.get('mechanism', '?')}/{m.get('engine', '?')}")
        return text if self.rel in ("", ".") else f"{text} ({self.rel})"

    @property
    def stem(self) -> str:
        """A filename-safe name of the run (its relative path, ``/`` -> ``_``; the
        directory's own name for the root run)."""
        name = self.path.name if self.rel in ("", ".") else self.rel.replace("/", "_")
        return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "run"


@dataclass(frozen=True)
class StageSpan:
    """One coordinator stage on the run's clock.

    Attributes:
        stage: its name (``schema``, ``round:one_way`` ...).
        t0, t1: start and end, seconds after the first stage started.
        status: ``done``, ``failed``, ``interrupted`` (started, never ended: the
            coordinator died) or ``duration`` (no events: laid end to end from
            ``metrics.json`` ``stage_s``).
    """

    stage: str
    t0: float
    t1: float
    status: str


@dataclass(frozen=True)
class PartyBudget:
    """One party's privacy budget: ρ (zCDP) spent, planned for it by the coordinator and
    its own budget; ε spent (at the run's δ). None where the run does not say."""

    party: str
    rho_spent: float | None
    rho_planned: float | None
    rho_budget: float | None
    epsilon_spent: float | None


# --------------------------------------------------------------------------- loading


def read_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSON-lines file and the number of lines that were not one
    (a line cut short by a kill, say)."""
    events: list[dict[str, Any]] = []
    bad = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(ev, dict):
                events.append(ev)
            else:
                bad += 1
    return events, bad


def load_synth_run(run_dir: Path, root: Path, metrics: dict[str, Any] | None = None
                   ) -> SynthRun:
    """Load one FedForge run directory (metrics, events, quality).

    A missing or unreadable ``events.jsonl`` or ``stages/quality.json`` becomes a note.

    Raises:
        SynthReportError: ``metrics.json`` unreadable or not a FedForge run's.
    """
    mpath = run_dir / "metrics.json"
    if metrics is None:
        try:
            metrics = _read_json(mpath)
        except (OSError, ValueError) as exc:
            raise SynthReportError(f"{run_dir}: metrics.json unreadable ({exc})") from exc
    if not is_synth_metrics(metrics):
        raise SynthReportError(f"{run_dir}: metrics.json is not a FedForge run's "
                               "(no stage_s and rho_spent)")
    run = SynthRun(path=run_dir, rel=run_dir.relative_to(root).as_posix(), metrics=metrics)
    ev = run_dir / "events.jsonl"
    if ev.is_file():
        try:
            run.events, bad = read_events(ev)
            if bad:
                run.notes.append(f"events.jsonl: {bad} line(s) not JSON, left out")
        except OSError as exc:
            run.notes.append(f"events.jsonl unreadable ({exc})")
    else:
        run.notes.append("no events.jsonl: stage timeline from stage_s durations only")
    q = run_dir / "stages" / "quality.json"
    if q.is_file():
        try:
            doc = _read_json(q)
            run.quality = doc if isinstance(doc, dict) else None
        except (OSError, ValueError) as exc:
            run.notes.append(f"stages/quality.json unreadable ({exc})")
    return run


def classify_run_dirs(dirs: Sequence[Path]) -> tuple[list[Path], list[Path], list[str]]:
    """Split run directories (each holding a ``metrics.json``) by kind.

    Returns:
        ``(fedforge, vfl, skipped)``: directories of FedForge runs, of VFL runs, and one
        message per directory whose ``metrics.json`` is unreadable or of neither kind.
    """
    synth, vfl, skipped = [], [], []
    for d in dirs:
        try:
            m = _read_json(d / "metrics.json")
        except (OSError, ValueError) as exc:
            skipped.append(f"skipped: {d / 'metrics.json'}: unreadable ({exc})")
            continue
        if is_synth_metrics(m):
            synth.append(d)
        elif is_vfl_metrics(m):
            vfl.append(d)
        else:
            skipped.append(f"skipped: {d / 'metrics.json'}: neither a VFL nor a FedForge "
                           "run's metrics")
    return synth, vfl, skipped


# --------------------------------------------------------------------------- series


def parse_ts(text: Any) -> float | None:
    """An ISO-8601 timestamp (``2026-12-06T06:55:08.818471Z``) as POSIX seconds; None
    when it is not one (a naive timestamp is taken as UTC)."""
    if not isinstance(text, str):
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def stage_spans(events: Sequence[dict[str, Any]]
                ) -> tuple[list[StageSpan], list[tuple[float, str]]]:
    """The coordinator's stages from its ``stage.*`` events.

    Each ``stage.started`` is closed by the next ``stage.done`` / ``stage.failed`` of the
    same stage; one never closed (the coordinator was killed) ends at the next stage or
    marker event after it (the kill; else the last event), as ``interrupted``. A stage run twice
    (after a restart, or a reopened run's) gives two spans.

    Returns:
        ``(spans, markers)``: spans in start order, seconds after the first
        ``stage.started``; markers ``(t, what)`` for :data:`MARKER_EVENTS`. Both empty
        when no stage event has a readable timestamp.
    """
    timed = []
    for i, e in enumerate(events):
        t = parse_ts(e.get("timestamp"))
        if t is not None:
            timed.append((t, i, e))
    timed.sort(key=lambda x: (x[0], x[1]))
    starts = [t for t, _, e in timed if e.get("event") == "stage.started"]
    if not starts:
        return [], []
    zero = min(starts)
    stage_times = [t for t, _, e in timed
                   if e.get("event") in STAGE_EVENTS or e.get("event") in MARKER_EVENTS]
    last = timed[-1][0]

    def cut(stage: str, t0: float) -> StageSpan:  # started, never ended
        end = next((t for t in stage_times if t > t0), last)
        return StageSpan(stage, t0 - zero, max(end, t0) - zero, "interrupted")

    spans: list[StageSpan] = []
    open_: dict[str, float] = {}
    for t, _, e in timed:
        kind, stage = e.get("event"), str(e.get("stage", "?"))
        if kind == "stage.started":
            if stage in open_:  # started again without an end: the first was cut
                spans.append(cut(stage, open_[stage]))
            open_[stage] = t
        elif kind in ("stage.done", "stage.failed") and stage in open_:
            status = "done" if kind == "stage.done" else "failed"
            spans.append(StageSpan(stage, open_.pop(stage) - zero, t - zero, status))
    spans.extend(cut(stage, t0) for stage, t0 in open_.items())
    spans.sort(key=lambda s: (s.t0, s.t1))
    markers = [(t - zero, MARKER_EVENTS[str(e.get("event"))]) for t, _, e in timed
               if e.get("event") in MARKER_EVENTS]
    return spans, markers


def spans_from_durations(stage_s: dict[str, Any]) -> list[StageSpan]:
    """Stages laid end to end from ``metrics.json`` ``stage_s`` (dict order; wall
    seconds per stage), for runs without events: status ``duration``."""
    spans, t = [], 0.0
    for stage, s in stage_s.items():
        d = _num(s)
        if d is None or d < 0:
            continue
        spans.append(StageSpan(str(stage), t, t + d, "duration"))
        t += d
    return spans


def run_stage_spans(run: SynthRun) -> tuple[list[StageSpan], list[tuple[float, str]], str]:
    """A run's stage spans and markers (:func:`stage_spans`, else
    :func:`spans_from_durations`) and where they came from, for the plot's title."""
    spans, markers = stage_spans(run.events)
    if spans:
        return spans, markers, "stage.started/done events (events.jsonl)"
    return (spans_from_durations(run.metrics.get("stage_s") or {}), [],
            "metrics.json stage_s durations laid end to end (no stage events)")


def stage_group(stage: str) -> str:
    """A stage's kind, for its colour: ``setup`` (schema, budget, keys, seed shares),
    ``round`` (a measurement round), ``select`` (domain compression, selection),
    ``synthesis``, ``quality``, ``workload`` (a workload update) or ``other``."""
    head = stage.split(":", 1)[0]
    if head in ("schema", "budget", "keys", "seeds"):
        return "setup"
    if head == "round":
        return "round"
    if head == "compress_domain" or head.startswith("select"):
        return "select"
    if head in ("synthesis", "quality", "workload"):
        return head
    return "other"


def stage_rows(spans: Sequence[StageSpan]) -> list[str]:
    """The timeline's rows: each stage name once, in order of its first start."""
    return list(dict.fromkeys(s.stage for s in sorted(spans, key=lambda s: (s.t0, s.t1))))


def tv_bars(run: SynthRun) -> list[tuple[str, float]]:
    """Each workload marginal's TV distance, worst first (ties by name): ``(clique,
    tv)`` from ``stages/quality.json`` (or ``metrics.json``) ``tv_per_marginal``;
    ``[]`` when the run did not record it (runs before it existed, or no quality
    stage). Non-finite values are left out."""
    per = (run.quality or {}).get("tv_per_marginal") or run.metrics.get("tv_per_marginal")
    if not isinstance(per, dict):
        return []
    out = [(str(k), v) for k, v in ((k, _num(v)) for k, v in per.items()) if v is not None]
    return sorted(out, key=lambda kv: (-kv[1], kv[0]))


def _party_key(p: str) -> tuple[int, str]:
    return (len(p), p)


def budget_rows(metrics: dict[str, Any]) -> list[PartyBudget]:
    """ρ and ε per party, parties in id order (``p000``, ``p001`` ...).

    ``rho_spent`` and ``epsilon_spent`` are the parties' own ledgers' figures,
    ``rho_planned`` the coordinator's plans, ``rho_budget`` the party's ledger budget
    (``ledger.<p>.rho_budget``), else the run's ``rho``. Infinite ε (an exact run) is
    kept as ``inf``.
    """
    spent = metrics.get("rho_spent") or {}
    planned = metrics.get("rho_planned") or {}
    eps = metrics.get("epsilon_spent") or {}
    ledger = metrics.get("ledger") or {}
    rho = _num(metrics.get("rho"))
    parties = sorted({*spent, *planned, *eps}, key=_party_key)
    rows = []
    for p in parties:
        led = ledger.get(p) if isinstance(ledger, dict) else None
        budget = _num(led.get("rho_budget")) if isinstance(led, dict) else None
        e = eps.get(p)
        e_val = math.inf if e in (math.inf, "inf", "Infinity") else _num(e)
        rows.append(PartyBudget(str(p), _num(spent.get(p)), _num(planned.get(p)),
                                budget if budget is not None else rho, e_val))
    return rows


__all__ = ["BUDGET_PNG", "STAGE_PNG", "TV_PNG", "PartyBudget", "StageSpan",
           "SynthReportError", "SynthRun", "budget_rows", "classify_run_dirs",
           "is_synth_metrics", "load_synth_run", "parse_ts", "read_events",
           "run_stage_spans", "spans_from_durations", "stage_group", "stage_rows",
           "stage_spans", "tv_bars"]
