"""Launch a prediction with a saved VFL model: broker + both party processes.

``psfl vfl predict RUN_DIR --out OUT`` and :func:`run_predict`: each party process
(``python -m parties predict ROLE``) loads its own saved part of the run
(``RUN_DIR/model/<role>/``, :mod:`parties.saved`) and reads only its own columns; see
:mod:`parties.predict` for the protocol. Children are owned as in :func:`sim.launch.run_vfl`:
every wait has a deadline, a failed child stops the others.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from parties import zygote
from sim.launch import (
    VFL_IDENTITIES,
    OutDirError,  # noqa: F401 (raised by clean_out_dir; re-exported for callers)
    clean_out_dir,
    _stop,
    run_security,
    spawn_party_cli,
    start_broker,
    wait_children,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictResult:
    """Outcome of :func:`run_predict`.

    Attributes:
        summary: ``predict.json`` (rows, metric when labels are present, DP report).
        predictions: path of ``predictions.csv``.
        out: the output directory.
    """

    summary: dict[str, Any]
    predictions: Path
    out: Path


def check_parts(run_dir: str | Path) -> None:
    """Refuse before any process starts when the two saved parts in ``run_dir`` are of
    different runs, or a part is missing or unreadable (reads the manifests only).

    Raises:
        parties.saved.SavedModelError: a manifest is missing or unreadable, or the run
            had several passive parties (not predicted yet).
        parties.saved.SavedModelMismatch: run id or config digest differ.
    """
    from parties.saved import MANIFEST_FILE, SavedModelError, check_same_run, part_dir

    ids = []
    for role in ("active", "passive"):
        path = part_dir(run_dir, role)
        try:
            m = orjson.loads((path / MANIFEST_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise SavedModelError(path, f"no readable {MANIFEST_FILE} ({exc}); was the run "
                                  "made by a version that saves models?") from None
        ids.append({"run_id": m.get("run_id"), "config_digest": m.get("config_digest")})
    check_same_run(ids[0], ids[1])
    if (part_dir(run_dir, "passive").parent / "passive2").is_dir():
        raise SavedModelError(part_dir(run_dir, "passive").parent,
                              "the run has several passive parties; prediction with more "
                              "than one passive party is not built yet (docs/dev/multiparty.md)")


def prepare_out(out: Path) -> Path:
    """Make ``out`` a clean prediction directory; returns its (emptied) ``events.jsonl``.

    Raises:
        OutDirError: ``out`` cannot be created or written.
    """
    return clean_out_dir(out, ("predict.json", "predictions.csv", "broker.addr"),
                         what="the output directory")


def run_predict(run_dir: str | Path, out: str | Path, *, data: str | None = None,
                id_column: str = "id", broker: str | None = None, run_id: str | None = None,
                timeout_s: float | None = None, wait_s: float = 60.0,
                keys_dir: str | None = None, insecure: bool = False) -> PredictResult:
    """Predict with the model saved in ``run_dir``: broker + passive + active processes.

    Args:
        run_dir: a training run's directory (``psfl vfl run --out``) with ``model/``.
        out: output directory (``predictions.csv``, ``predict.json``, ``events.jsonl``).
        data: CSV/Parquet of new rows with ``id_column`` (None: the run's test split).
        broker: use this running broker instead of starting one.
        run_id: the prediction's topic namespace (default random).
        timeout_s: stop everything after this long (None: no job-level limit).
        wait_s: each party's deadline for each wait on its partner.
        keys_dir / insecure: see :func:`sim.launch.run_security`.

    Raises:
        parties.saved.SavedModelError / SavedModelMismatch: see :func:`check_parts`.
        sim.launch.LaunchError: a child failed (its exit code is carried).
        sim.launch.JobTimeout: ``timeout_s`` passed.
        OutDirError: ``out`` cannot be created.
    """
    check_parts(run_dir)
    out = Path(out)
    events = prepare_out(out)
    run_id = run_id or f"p{uuid.uuid4().hex[:8]}"
    procs: dict[str, Any] = {}
    zygote.warm()
    with contextlib.ExitStack() as stack:
        sec = stack.enter_context(run_security(VFL_IDENTITIES, keys_dir=keys_dir,
                                               insecure=insecure, broker=broker))
        try:
            if broker is None:
                procs["broker"], broker = start_broker(
                    out, events, security=sec, members={run_id: list(VFL_IDENTITIES)})
            common = ["--run-dir", str(run_dir), "--broker", broker, "--run-id", run_id,
                      "--events", str(events), "--timeout-s", str(wait_s),
                      "--id-column", id_column, *sec.client_args,
                      *(["--data", str(data)] if data is not None else [])]
            for role in ("passive", "active"):
                extra = ["--out", str(out)] if role == "active" else []
                procs[role] = spawn_party_cli(["predict", role, *common, *extra],
                                              name=f"psfl-predict-{role}")
            wait_children({r: procs[r] for r in ("active", "passive")},
                          watch={"broker": procs["broker"]} if "broker" in procs else None,
                          timeout_s=timeout_s)
        finally:
            for role in ("active", "passive", "broker"):
                if role in procs:
                    _stop(procs[role])
    summary = orjson.loads((out / "predict.json").read_bytes())
    return PredictResult(summary=summary, predictions=out / "predictions.csv", out=out)


__all__ = ["PredictResult", "check_parts", "prepare_out", "run_predict"]
