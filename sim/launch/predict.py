"""Launch a prediction with a saved VFL model: broker + one process per party.

``psfl vfl predict RUN_DIR --out OUT`` and :func:`run_predict`: each party process
(``python -m parties predict PARTY_ID``: the active party and every passive party of the
run) loads its own saved part of the run (``RUN_DIR/model/<party id>/``,
:mod:`parties.runtime.saved`) and reads only its own columns; see :mod:`parties.runtime.predict` for the
protocol. Keys and the broker's run membership are made per party id as for training
(:func:`sim.launch.vfl.run_security`, :func:`sim.launch.vfl.run_members`: with several passive
parties they are owned, so none reads another's topics). Children are owned as in
:func:`sim.launch.vfl.run_vfl`: every wait has a deadline, a failed child stops the others.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from parties.core import zygote
from pubsub.config import ConfigError
from pubsub.outputs import RunDirLock
from sim.launch.vfl import (
    OutDirError,  # noqa: F401 (raised by clean_out_dir; re-exported for callers)
    clean_out_dir,
    _stop,
    run_members,
    run_security,
    spawn_party_cli,
    start_broker,
    vfl_identities,
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


def _manifest(run_dir: str | Path, party: str) -> dict[str, Any]:
    from parties.runtime.saved import MANIFEST_FILE, SavedModelError, part_dir

    path = part_dir(run_dir, party)
    try:
        m = orjson.loads((path / MANIFEST_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise SavedModelError(path, f"no readable {MANIFEST_FILE} ({exc}); was the run "
                              "made by a version that saves models?") from None
    if not isinstance(m, dict):
        raise SavedModelError(path, f"{MANIFEST_FILE} is not a JSON object")
    return {"run_id": m.get("run_id"), "config_digest": m.get("config_digest")}


def check_parts(run_dir: str | Path) -> tuple[str, ...]:
    """Refuse before any process starts when a saved part in ``run_dir`` is missing or
    unreadable, or of another run than the active party's (reads the manifests and the
    active part's saved config only); returns the run's party ids (``active`` first,
    then ``passive``, ``passive2`` …, as many as the saved ``vfl.passive_parties``).

    Raises:
        parties.runtime.saved.SavedModelError: a manifest or the active part's config is missing
            or unreadable.
        parties.runtime.saved.SavedModelMismatch: a part's run id or config digest differs from
            the active part's (naming that party).
    """
    from parties.config import load_saved_config
    from parties.runtime.saved import SavedModelError, check_same_run, part_dir

    active = _manifest(run_dir, "active")
    # the first passive party is in every run: check it before reading the config
    check_same_run(active, _manifest(run_dir, "passive"), party="passive")
    path = part_dir(run_dir, "active") / "config.toml"
    try:
        party_ids = load_saved_config(path).party_ids
    except (OSError, ConfigError) as exc:
        raise SavedModelError(path.parent, f"no readable config.toml ({exc})") from None
    for party in party_ids[2:]:
        check_same_run(active, _manifest(run_dir, party), party=party)
    return party_ids


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
    """Predict with the model saved in ``run_dir``: the broker and one process per party
    (every passive party of the run, then the active party).

    Args:
        run_dir: a training run's directory (``psfl vfl run --out``) with ``model/``.
        out: output directory (``predictions.csv``, ``predict.json``, ``events.jsonl``).
        data: CSV/Parquet of new rows with ``id_column`` (None: the run's test split).
        broker: use this running broker instead of starting one.
        run_id: the prediction's topic namespace (default random).
        timeout_s: stop everything after this long (None: no job-level limit).
        wait_s: each party's deadline for each wait on its partners.
        keys_dir: your CURVE keys (see :func:`sim.launch.vfl.run_security`; default:
            ephemeral keys made for the run).
        insecure: plaintext on loopback (see :func:`sim.launch.vfl.run_security`).

    Raises:
        parties.runtime.saved.SavedModelError: see :func:`check_parts`.
        parties.runtime.saved.SavedModelMismatch: see :func:`check_parts`.
        sim.launch.vfl.LaunchError: a child failed (its exit code is carried).
        sim.launch.vfl.JobTimeout: ``timeout_s`` passed.
        OutDirError: ``out`` cannot be created.
    """
    party_ids = check_parts(run_dir)
    out = Path(out)
    run_id = run_id or f"p{uuid.uuid4().hex[:8]}"
    with RunDirLock(out, run_id=run_id, command="psfl vfl predict"):  # the job's life
        events = prepare_out(out)
        procs: dict[str, Any] = {}
        zygote.warm()
        with contextlib.ExitStack() as stack:
            sec = stack.enter_context(run_security(vfl_identities(party_ids), keys_dir=keys_dir,
                                                   insecure=insecure, broker=broker))
            try:
                if broker is None:
                    procs["broker"], broker = start_broker(out, events, security=sec,
                                                           **run_members(run_id, party_ids))
                common = ["--run-dir", str(run_dir), "--broker", broker, "--run-id", run_id,
                          "--events", str(events), "--timeout-s", str(wait_s),
                          "--id-column", id_column, *sec.client_args,
                          *(["--data", str(data)] if data is not None else [])]
                for party in (*party_ids[1:], "active"):
                    extra = ["--out", str(out), "--quiet"] if party == "active" else []
                    procs[party] = spawn_party_cli(["predict", party, *common, *extra],
                                                   name=f"psfl-predict-{party}")
                wait_children({p: procs[p] for p in party_ids},
                              watch={"broker": procs["broker"]} if "broker" in procs else None,
                              timeout_s=timeout_s)
            finally:
                for name in (*party_ids, "broker"):
                    if name in procs:
                        _stop(procs[name])
        summary = orjson.loads((out / "predict.json").read_bytes())
        return PredictResult(summary=summary, predictions=out / "predictions.csv", out=out)


__all__ = ["PredictResult", "check_parts", "prepare_out", "run_predict"]
