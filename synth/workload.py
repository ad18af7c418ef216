"""Streaming workload updates: new queries for a run in progress or
finished, handed to its coordinator through the run directory.

A workload update is a JSON document::

    {"marginals": [["age", "educational-num", "income"], ...],   # new queries (cliques)
     "weights": {"age,income": 2.0},                        # optional: weights on queries
     "rho_share": 0.5}                                      # optional, default 1.0

``rho_share`` is the fraction of the run's remaining *stream reserve* of ρ
(``synth.stream.rho_frac`` of the total, held back by the budget stage) that measuring the
update's missing marginals may spend. Only marginals no round has measured are measured
(the coordinator checks); weights only change how the fit weighs existing queries.

:func:`submit_workload` validates a document against the run's public schema and writes it
atomically to ``RUN_DIR/workload/pending/``; a running coordinator applies pending updates
after its measurement rounds, a finished run is reopened by ``psfl synth add-workload``
(:func:`sim.launch.synth.add_workload`). Applied updates move to ``workload/applied/``
with their report.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth.checkpoint import atomic_write_json, read_json


class WorkloadError(ValueError):
    """A workload update that cannot be used.

    Attributes:
        reason: what is wrong, naming the offending value.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadUpdate:
    """A validated workload update.

    Attributes:
        marginals: the new queries, cliques of distinct schema attributes (in the order
            given), duplicates removed.
        weights: clique (sorted attribute tuple) -> weight > 0 of existing or new queries.
        rho_share: fraction in (0, 1] of the remaining stream reserve of ρ to spend.
    """

    marginals: tuple[tuple[str, ...], ...]
    weights: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    rho_share: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON document form (inverse of :func:`parse_workload`)."""
        return {"marginals": [list(c) for c in self.marginals],
                "weights": {",".join(c): w for c, w in self.weights.items()},
                "rho_share": self.rho_share}


def parse_workload(doc: Any, attributes: Sequence[str], *, max_way: int = 4) -> WorkloadUpdate:
    """Validate a workload document against the schema's attribute names.

    Raises:
        WorkloadError: not a mapping, unknown keys, an unknown or repeated attribute, a
            clique wider than ``max_way``, an empty update, a weight or ``rho_share``
            out of range.
    """
    if not isinstance(doc, Mapping):
        raise WorkloadError(f"a workload update is a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - {"marginals", "weights", "rho_share"})
    if unknown:
        raise WorkloadError(f"unknown key(s) {unknown}; allowed: marginals, weights, rho_share")
    names = set(attributes)

    def clique(raw: Any, where: str) -> tuple[str, ...]:
        if isinstance(raw, str):
            raw = raw.split(",")
        if not isinstance(raw, Sequence) or not raw:
            raise WorkloadError(f"{where}: a marginal is a non-empty list of columns, got {raw!r}")
        c = tuple(str(a).strip() for a in raw)
        bad = [a for a in c if a not in names]
        if bad:
            raise WorkloadError(f"{where}: unknown column(s) {bad}; the schema has "
                                f"{sorted(names)}")
        if len(set(c)) != len(c):
            raise WorkloadError(f"{where}: column repeated in {list(c)}")
        if len(c) > max_way:
            raise WorkloadError(f"{where}: {len(c)}-way marginal {list(c)}; at most "
                                f"{max_way}-way")
        return c

    raw_m = doc.get("marginals", [])
    if not isinstance(raw_m, list):
        raise WorkloadError(f"marginals must be a list, got {type(raw_m).__name__}")
    marginals = tuple(dict.fromkeys(clique(c, f"marginals[{i}]") for i, c in enumerate(raw_m)))
    raw_w = doc.get("weights", {})
    if not isinstance(raw_w, Mapping):
        raise WorkloadError(f"weights must be an object, got {type(raw_w).__name__}")
    weights: dict[tuple[str, ...], float] = {}
    for k, w in raw_w.items():
        c = tuple(sorted(clique(k, f"weights[{k!r}]")))
        if isinstance(w, bool) or not isinstance(w, int | float) or not (0 < w < math.inf):
            raise WorkloadError(f"weights[{k!r}] must be a number > 0, got {w!r}")
        weights[c] = float(w)
    share = doc.get("rho_share", 1.0)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise WorkloadError(f"rho_share must be in (0, 1], got {share!r}")
    if not marginals and not weights:
        raise WorkloadError("an update needs at least one marginal or weight")
    return WorkloadUpdate(marginals=marginals, weights=weights, rho_share=float(share))


def _pending(run_dir: Path) -> Path:
    return Path(run_dir) / "workload" / "pending"


def submit_workload(run_dir: str | Path, queries: Mapping[str, Any]) -> Path:
    """Validate ``queries`` against ``RUN_DIR/schema.json`` and queue it for the run's
    coordinator (atomically: a coordinator never reads half a file).

    Returns:
        The queued file.

    Raises:
        WorkloadError: bad queries, or ``run_dir`` holds no run (no ``schema.json``).
    """
    run_dir = Path(run_dir)
    schema = read_json(run_dir / "schema.json")
    if schema is None:
        raise WorkloadError(f"{str(run_dir)!r} holds no FedForge run (no schema.json)")
    attributes = [str(c["name"]) for c in schema["columns"]]
    update = parse_workload(queries, attributes)
    name = f"{time.time_ns()}-{os.getpid()}.json"
    path = _pending(run_dir) / name
    atomic_write_json(path, update.to_dict())
    return path


def pending_updates(run_dir: str | Path, attributes: Sequence[str]
                    ) -> list[tuple[Path, WorkloadUpdate]]:
    """Queued updates in submission order (the file names sort by time).

    Raises:
        WorkloadError: a queued file that does not validate (named).
    """
    d = _pending(Path(run_dir))
    out = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out.append((f, parse_workload(json.loads(f.read_text()), attributes)))
        except (ValueError, OSError) as exc:
            raise WorkloadError(f"queued update {f.name}: {exc}") from None
    return out


def measured_cliques(run_dir: str | Path) -> set[frozenset[str]]:
    """The cliques the run's rounds measured so far (from ``RUN_DIR/stages/round_*.json``),
    as sets: a clique counts as measured in any attribute order."""
    out: set[frozenset[str]] = set()
    for f in (Path(run_dir) / "stages").glob("round_*.json"):
        out |= {frozenset(c) for c in (read_json(f) or {}).get("cliques", [])}
    return out


def mark_applied(run_dir: str | Path, pending: Path, report: Mapping[str, Any]) -> Path:
    """Move a queued update to ``workload/applied/`` with its report (atomic write of the
    report first, then removal of the queued file)."""
    dest = Path(run_dir) / "workload" / "applied" / pending.name
    doc = {"update": json.loads(pending.read_text()), "report": dict(report)}
    atomic_write_json(dest, doc)
    pending.unlink(missing_ok=True)
    return dest


__all__ = ["WorkloadError", "WorkloadUpdate", "mark_applied", "measured_cliques",
           "parse_workload", "pending_updates", "submit_workload"]
