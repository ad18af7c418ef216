"""Run a two-party VFL job in this process: both parties over an in-memory bus.

The same :func:`parties.runtime.serve.serve_party` that a party process runs, twice, in one event
loop, joined by a :class:`pubsub.memory.MemoryBroker` instead of a broker process and
sockets: for notebooks, tests and quick experiments. Topics, bounded buffers, deadlines,
the handshake, heartbeats and the algorithms are the real ones; what is not modelled is
the network and the broker (no CURVE, no broker policy, no broker counters: ``broker``
in ``metrics.json`` holds the hub's), and the two parties share one interpreter (thread
workers share its GIL), so speed figures are not those of separate processes.

The run directory is the same as :func:`sim.launch.vfl.run_vfl`'s: ``config.toml``,
``metrics.json``, ``passive.json``, ``events.jsonl``, ``timeline-<role>.json`` and
``model/<role>/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from parties.config import VflConfig
from parties.data.preflight import preflight
from pubsub.outputs import RunDirLock
from pubsub.runner import run as run_loop

from sim.launch.vfl import JobTimeout, LaunchResult, finish_run, prepare_run


async def run_parties_in_memory(cfg: VflConfig, out: Path | None, *, run_id: str,
                                models: Any = None, quiet: bool = True,
                                timeout_s: float | None = None,
                                observer: Callable[[Any], Awaitable[Any]] | None = None
                                ) -> dict[str, Any]:
    """Every party of one run (the active party and each passive party) over one
    :class:`pubsub.memory.MemoryBroker`, in the running event loop; returns the active
    party's (the run's) metrics.

    ``observer``: a coroutine function given the hub's ``connect`` and run beside the
    parties (a third client of the bus, e.g. :class:`sim.faults.eavesdrop.GradientTap`),
    subscribed before the parties start and cancelled once they are done.

    Each party writes its files into ``out`` as a party process does
    (:func:`parties.runtime.serve.finish_party`). A party that fails cancels the other; its error
    propagates.

    Raises:
        JobTimeout: ``timeout_s`` passed first.
        whatever a party raises (:meth:`parties.runtime.party.Party.run`).
    """
    from parties.runtime.serve import finish_party, serve_party
    from pubsub.memory import MemoryBroker

    t0 = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}

    async def one(role: str, hub: MemoryBroker) -> None:
        res = await serve_party(role, cfg, run_id=run_id, out=out, connect=hub.connect,
                                models=models, progress=not quiet and role == "active")
        results[role] = finish_party(role, cfg, res, out, t0)

    async with MemoryBroker() as hub:
        watch = asyncio.create_task(observer(hub.connect)) if observer is not None else None
        if watch is not None:
            await asyncio.sleep(0.05)  # subscribed before the first publication
        try:
            async with asyncio.timeout(timeout_s), asyncio.TaskGroup() as tg:
                for role in (*cfg.party_ids[1:], "active"):
                    tg.create_task(one(role, hub))
        except TimeoutError:
            assert timeout_s is not None
            raise JobTimeout(timeout_s) from None
        except BaseExceptionGroup as eg:  # the first party's error, as a process would exit
            raise eg.exceptions[0] from None
        finally:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        st = hub.stats()
    metrics = results["active"]
    metrics["broker"] = {"transport": "memory", "forwarded": st.forwarded,
                         "rejected": st.rejected, "hwm_dropped": st.hwm_dropped}
    if out is not None:
        from parties.runtime.serve import write_json

        write_json(out / "metrics.json", metrics)
    return metrics


def run_vfl_in_process(cfg: VflConfig, out: str | Path, *, run_id: str | None = None,
                       models: Any = None, quiet: bool = True,
                       timeout_s: float | None = None,
                       observer: Callable[[Any], Awaitable[Any]] | None = None) -> LaunchResult:
    """:func:`sim.launch.vfl.run_vfl`, with both parties in this process over an in-memory bus.

    Must be called outside a running event loop (it runs its own; from a notebook's loop
    use :func:`run_parties_in_memory`).

    Args:
        cfg: the run config.
        out: the run directory (created; files of an earlier run there are replaced).
        run_id: topic namespace (default: random).
        models: a :class:`parties.models.zoo.ModelFactory` (Python callables need not be
            picklable here unless ``vfl.workers.mode = "process"``); None: the config's.
        quiet: no per-epoch lines.
        timeout_s: stop both parties after this long (None: only their own deadlines).
        observer: see :func:`run_parties_in_memory`.

    Raises:
        the errors of :func:`sim.launch.vfl.run_vfl` that are about the data, the models and
        the run directory, before training starts; a party's own error during the run
        (:mod:`parties.core.errors`); :class:`sim.launch.vfl.JobTimeout`.
    """
    t0 = time.perf_counter()
    out = Path(out)
    run_id = run_id or uuid.uuid4().hex[:8]
    with RunDirLock(out, run_id=run_id, command="psfl vfl run --transport memory"):
        return _run_locked(cfg, out, run_id=run_id, models=models, quiet=quiet,
                           timeout_s=timeout_s, observer=observer, t0=t0)


def _run_locked(cfg: VflConfig, out: Path, *, run_id: str, models: Any, quiet: bool,
                timeout_s: float | None, observer: Callable[[Any], Awaitable[Any]] | None,
                t0: float) -> LaunchResult:
    import torch

    events = prepare_run(cfg, out, models)
    preflight(cfg)
    from pubsub.logs import scoped_logging

    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.workers.torch_threads)
    try:
        with scoped_logging(events_path=events, run_id=run_id):
            run_loop(run_parties_in_memory(cfg, out, run_id=run_id, models=models,
                                           quiet=quiet, timeout_s=timeout_s,
                                           observer=observer),
                     event_loop=cfg.event_loop)
    finally:
        torch.set_num_threads(threads)
    return finish_run(cfg, out, t0, {"transport": "memory", "keys": None})


async def run_predict_parties(parties: Mapping[str, Any], *,
                              grace_s: float = 2.0) -> dict[str, Any]:
    """Run the :class:`parties.runtime.predict.PredictParty` objects of one prediction (party id
    -> party, all joined to one bus) to the end, in the running event loop; returns the
    active party's summary.

    When a party fails, the active party gets up to ``grace_s`` more to fail too (it meets
    every passive party, so its error names the one at fault, where a passive party's
    names only the active party), then the others are cancelled and the active party's
    error, else the first one, propagates.
    """
    tasks = {p: asyncio.create_task(party.run(), name=f"predict-{p}")
             for p, party in parties.items()}
    active = tasks["active"]
    try:
        done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        if failed and not active.done():
            await asyncio.wait([active], timeout=grace_s)
        if active.done() and not active.cancelled() and active.exception() is not None:
            failed.insert(0, active)
        if failed:
            raise failed[0].exception() from None  # type: ignore[misc]
        return active.result()
    finally:
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


def predict_in_process(run_dir: str | Path, out: str | Path, *, data: str | None = None,
                       id_column: str = "id", wait_s: float = 60.0,
                       models: Any = None) -> Any:
    """:func:`sim.launch.predict.run_predict` with every party in this process over an
    in-memory bus (a saved model whose factory lives in the calling script's ``__main__``
    can be rebuilt here, but not in a ``python -m parties predict`` process; ``models``
    gives the training factory for one that cannot be imported at all).

    Raises:
        the errors of :func:`sim.launch.predict.run_predict` about the saved parts, the
        rows and the output directory; a party's own error (:mod:`parties.core.errors`).
    """
    from parties.runtime.predict import PredictParty
    from pubsub.memory import MemoryBroker

    from sim.launch.predict import PredictResult, check_parts, prepare_out

    party_ids = check_parts(run_dir)
    out = Path(out)
    events = prepare_out(out)
    run_id = f"p{uuid.uuid4().hex[:8]}"
    from pubsub.logs import scoped_logging

    async def main() -> dict[str, Any]:
        async with MemoryBroker() as hub:
            parties = {p: PredictParty(p, run_dir, run_id=run_id, data=data,
                                       id_column=id_column, timeout_s=wait_s,
                                       out=out if p == "active" else None,
                                       connect=hub.connect, models=models)
                       for p in (*party_ids[1:], "active")}
            return await run_predict_parties(parties)

    with scoped_logging(events_path=events, run_id=run_id):
        summary = run_loop(main(), event_loop="asyncio")
    return PredictResult(summary=summary, predictions=out / "predictions.csv", out=out)


__all__ = ["predict_in_process", "run_parties_in_memory", "run_predict_parties",
           "run_vfl_in_process"]
