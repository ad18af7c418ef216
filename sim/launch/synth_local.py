"""Run a FedForge job in this process: the coordinator, every aggregator and every party
as asyncio tasks over one :class:`pubsub.memory.MemoryBroker` instead of a broker and OS
processes.

The participants are the same classes the processes run (:mod:`synth.cli`), handed the
hub's ``connect`` instead of a broker address, so the protocol (schema, keys, seeds,
masked rounds through the aggregation tree, unmasking, synthesis, quality) is the one a
deployment runs; only the transport differs (no CURVE, no broker policy, no wire-byte
count: ``metrics["wire_bytes"]`` is None). The run directory is laid out as
:func:`sim.launch.synth.run_synth` lays it out, and read the same way.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pubsub.outputs import write_atomic
from pubsub.runner import run as run_loop
from sim.launch.vfl import JobTimeout, LaunchResult
from sim.launch.synth import add_ledgers
from synth.cli import read_table
from synth.checkpoint import atomic_write_json
from synth.config import SynthConfig, dump_synth_config


async def run_synth_tasks(cfg: SynthConfig, out: Path, *, run_id: str,
                          timeout_s: float | None = None) -> dict[str, Any]:
    """Every participant of the run prepared in ``out``, over one in-memory hub, in the
    running event loop; returns the coordinator's metrics.

    Raises:
        JobTimeout: ``timeout_s`` passed first.
        synth.coordinator.CoordinatorError, synth.netutil.ParticipantError: the first
            participant's error (the others are cancelled), as its process would exit.
    """
    from pubsub.memory import MemoryBroker
    from synth.aggregator import Aggregator
    from synth.coordinator import Coordinator, EvalData
    from synth.domain import Schema
    from synth.party import SynthParty
    from synth.protocol import build_tree

    data = out / "data"
    schema = Schema.from_dict(json.loads((out / "schema.json").read_text()))
    ev = None
    if (data / "holdout.parquet").is_file():
        ev = EvalData(train=read_table(data / "train.parquet"),
                      holdout=read_table(data / "holdout.parquet"))
    ids = cfg.party_ids()
    state = out / "state"
    state.mkdir(parents=True, exist_ok=True)
    frames = [read_table(data / "parties" / f"{i}.parquet") for i in ids]
    seeds = ([None] * len(ids) if cfg.noise_seed is None
             else [cfg.noise_seed * 100_003 + k for k in range(len(ids))])
    tree = build_tree(ids, cfg.secagg.fanout, cfg.secagg.root_children)
    async with MemoryBroker() as hub:
        coord = Coordinator(cfg, schema, broker="memory", run_id=run_id, out=out,
                            eval_data=ev, connect=hub.connect)
        aggs = [Aggregator(a, cfg=cfg, broker="memory", run_id=run_id, connect=hub.connect)
                for a in tree.aggregators]
        parties = [SynthParty(i, f, cfg=cfg, broker="memory", run_id=run_id, noise_seed=s,
                              ledger_file=str(state / f"{i}.ledger.json"),
                              connect=hub.connect)
                   for i, f, s in zip(ids, frames, seeds, strict=True)]
        try:
            async with asyncio.timeout(timeout_s), asyncio.TaskGroup() as tg:
                done = tg.create_task(coord.run())
                for a in aggs:
                    tg.create_task(a.run())
                for p in parties:
                    tg.create_task(p.run())
        except TimeoutError:
            assert timeout_s is not None
            raise JobTimeout(timeout_s) from None
        except BaseExceptionGroup as eg:
            raise _first(eg) from None
        st = hub.stats()
    metrics = done.result()
    metrics["broker"] = {"transport": "memory", "forwarded": st.forwarded,
                         "rejected": st.rejected, "hwm_dropped": st.hwm_dropped}
    return metrics


def _first(eg: BaseExceptionGroup) -> BaseException:
    """The coordinator's error when it has one (it names the participant at fault), else
    the first."""
    from synth.coordinator import CoordinatorError

    flat: list[BaseException] = []
    stack: list[BaseException] = [eg]
    while stack:
        e = stack.pop(0)
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        else:
            flat.append(e)
    return next((e for e in flat if isinstance(e, CoordinatorError)), flat[0])


def run_synth_in_process(cfg: SynthConfig, out: str | Path, *, prepared: Mapping[str, Any],
                         run_id: str | None = None, timeout_s: float | None = None,
                         event_loop: str = "uvloop") -> LaunchResult:
    """:func:`sim.launch.synth.run_synth` in this process (its own event loop; call it
    outside a running one, or await :func:`run_synth_tasks`).

    Args:
        cfg: the run config.
        out: a run directory that holds the prepared data (``prepared``: its info, as
            :func:`sim.launch.synth.run_synth` takes it).
        run_id: topic namespace (default: random).
        timeout_s: stop after this long (None: the participants' own deadlines).

    Raises:
        the participants' errors (see :func:`run_synth_tasks`); :class:`JobTimeout`.
    """
    from pubsub.logs import scoped_logging

    t0 = time.perf_counter()
    out = Path(out)
    for stale in ("metrics.json", "synthetic.csv"):
        (out / stale).unlink(missing_ok=True)
    for stale_dir in ("stages", "state", "workload"):
        if (out / stale_dir).is_dir():
            shutil.rmtree(out / stale_dir)
    write_atomic(out / "config.toml", dump_synth_config(cfg))
    events = out / "events.jsonl"
    events.write_text("")
    run_id = run_id or uuid.uuid4().hex[:8]
    with scoped_logging(events_path=events, run_id=run_id):
        metrics = run_loop(run_synth_tasks(cfg, out, run_id=run_id, timeout_s=timeout_s),
                           event_loop=event_loop)
    metrics["security"] = {"transport": "memory", "keys": None}
    metrics["wall_s"] = time.perf_counter() - t0
    metrics["data"] = dict(prepared)
    metrics["faults"] = []
    add_ledgers(metrics, out / "state")
    atomic_write_json(out / "metrics.json", metrics)
    return LaunchResult(metrics=metrics, out=out)


__all__ = ["run_synth_in_process", "run_synth_tasks"]
