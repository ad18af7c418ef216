"""One party's whole run, I/O included: load its data, check its models, train over a
transport, save its trained part, write its metrics.

Shared by every way a party runs: ``python -m parties ROLE`` (:mod:`parties.cli`), a
party process that the Python API spawns with the user's model factories
(:func:`party_process_main`), and both parties in one process over an in-memory bus
(:mod:`sim.launch.local`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from pubsub.outputs import write_atomic
from pubsub.security import CurveClient
from pubsub.transport import Connect

from parties.config import VflConfig, dump_vfl_config



def write_json(path: Path, data: Any) -> None:
    """Write JSON whole or not at all (:func:`pubsub.outputs.write_atomic`); overwrites.

    Raises:
        pubsub.outputs.OutputError: the file cannot be written (nothing left under its name).
    """
    write_atomic(path, orjson.dumps(data, option=orjson.OPT_INDENT_2
                                    | orjson.OPT_SERIALIZE_NUMPY))


async def serve_party(role: str, cfg: VflConfig, *, run_id: str, out: Path | None,
                      broker: str = "", security: CurveClient | None = None,
                      connect: Connect | None = None, models: Any = None,
                      progress: bool = False) -> dict[str, Any]:
    """Run ``role`` to completion and return its metrics (the active party's are the run's,
    :func:`parties.runtime.report.assemble_metrics`).

    Args:
        role: the party's id: ``"active"`` or ``"passive"`` (``passive2`` … with several
            passive parties).
        cfg: the run config.
        run_id: topic namespace, the same on both parties.
        out: the run directory (this party's timeline and ``model/<role>/`` go there);
            None: nothing is written.
        broker / security / connect: how to reach the bus (see
            :class:`parties.runtime.party.Party`).
        models: a :class:`parties.models.zoo.ModelFactory`; None: the config's model specs.
        progress: one line per epoch on stdout (active party).

    Raises:
        everything :meth:`parties.runtime.party.Party.run` and
        :func:`parties.data.party.load_party_data` raise;
        parties.models.zoo.ModelSpecError: a model factory fails its probe on this party's width.
    """
    from parties.models.zoo import default_models
    from parties.runtime.report import assemble_metrics
    from parties.data.party import load_party_data
    from parties.runtime.party import Party
    from parties.models.zoo import ModelFactory, check_models

    fork_server = None
    if cfg.workers.mode == "process":
        from parties.runtime.workers import ensure_forkserver

        # start the workers' fork server (it imports torch) while the data loads
        fork_server = asyncio.create_task(asyncio.to_thread(ensure_forkserver))
    data = await asyncio.to_thread(load_party_data, cfg, role)
    if fork_server is not None:
        await fork_server
    factory = models if models is not None else ModelFactory(cfg)
    if models is not None or not default_models(cfg):  # a typed error before the bus
        check_models(factory, {role: int(data.x_train.shape[1])})
    party = Party(role, cfg, data, broker=broker, run_id=run_id, progress=progress,
                  security=security, models=factory, connect=connect)
    try:
        metrics = await party.run()
    finally:
        if out is not None:  # the timeline also tells where a failed run stood
            party.timeline.write(out / f"timeline-{role}.json")
    if out is not None:  # this party's trained part: <out>/model/<role>/ (parties.runtime.saved)
        from parties.runtime.saved import save_party_model

        saved = await asyncio.to_thread(save_party_model, out, party, run_id=run_id)
        metrics["model_dir"] = str(saved)
    metrics["timeline"] = {"file": f"timeline-{role}.json", "spans": party.timeline.n,
                           "overflow": party.timeline.overflow,
                           "totals_s": party.timeline.totals()}
    if role == "active":
        if cfg.passive_parties > 1:
            return assemble_metrics(cfg, run_id, metrics, None, reports={
                p: party.partner_reports.get(p) for p in party.partners})
        return assemble_metrics(cfg, run_id, metrics, party.partner_report)
    return metrics


def metrics_file(out: Path, role: str) -> Path:
    """Where party ``role`` writes its metrics in the run directory: the active party's
    are the run's ``metrics.json``, a passive party's ``<party id>.json``
    (``passive.json``, ``passive2.json``, …)."""
    return out / ("metrics.json" if role == "active" else f"{role}.json")


def finish_party(role: str, cfg: VflConfig, result: dict[str, Any], out: Path | None,
                 t0: float) -> dict[str, Any]:
    """Stamp the party's wall time and write its metrics and the config into ``out``."""
    result["process_wall_s"] = time.perf_counter() - t0
    result["wall_s"] = result["process_wall_s"]  # a launcher replaces it with the job's
    if out is not None:
        write_json(metrics_file(out, role), result)
        write_atomic(out / "config.toml", dump_vfl_config(cfg))
    return result


def party_process_main(role: str, cfg: VflConfig, models: Any, *, broker: str, run_id: str,
                       out: str, events: str, keys_dir: str | None, quiet: bool) -> None:
    """Body of a party process that a launcher spawns with a pickled model factory (the
    Python API's user models; ``multiprocessing`` re-imports the user's main module, so
    its module-level classes and functions resolve). Exits with the party's exit code
    (:class:`parties.runtime.exitcodes.ExitCode`)."""
    from pubsub.logs import configure_logging
    from pubsub.runner import run as run_loop

    from parties.runtime.exitcodes import exit_code_for

    t0 = time.perf_counter()
    out_dir = Path(out)
    try:
        security = CurveClient.from_dir(keys_dir, role) if keys_dir else None
        configure_logging(events_path=events, party=role, run_id=run_id)
        import torch

        torch.set_num_threads(cfg.workers.threads_for(role))
        result = run_loop(serve_party(role, cfg, run_id=run_id, out=out_dir, broker=broker,
                                      security=security, models=models,
                                      progress=not quiet and role == "active"),
                          event_loop=cfg.event_loop)
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        print(f"error ({role} party): {exc}", file=sys.stderr)
        sys.exit(int(code))
    finish_party(role, cfg, result, out_dir, t0)
    sys.exit(0)


__all__ = ["Connect", "finish_party", "metrics_file", "party_process_main", "serve_party",
           "write_json"]
