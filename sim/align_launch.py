"""Launch private ID alignment on one machine: a broker and both parties as processes.

Each party is ``python -m sim.cli vfl align --role ROLE ...`` (its own OS process, so
the two parties' cryptography runs on two cores); the broker is ``python -m broker
run`` on free ports of 127.0.0.1 unless ``broker`` names a running one. If a child
fails the others are stopped and :class:`sim.launch.LaunchError` carries its exit code.
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
import contextlib
from pathlib import Path
from typing import Any

import orjson

from sim.launch import (
    VFL_IDENTITIES,
    JobTimeout,
    LaunchError,
    OutDirError,
    _spawn,
    _stop,
    _Terminated,
    run_security,
    start_broker,
    threading_main,
    wait_children,
)


def run_align(*, active_ids: str, passive_ids: str, out: str | Path,
              column: str | None = None, broker: str | None = None,
              run_id: str | None = None, chunk_size: int | None = None,
              window: int | None = None, timeout_s: float | None = None,
              quiet: bool = False, keys_dir: str | None = None,
              insecure: bool = False) -> dict[str, Any]:
    """Align two ID files: broker + two party processes; returns both ``align-*.json``.

    Args:
        active_ids / passive_ids: the parties' ID files (see :func:`parties.align.load_ids`).
        out: output directory: ``aligned-{active,passive}.csv``, ``align-*.json``,
            ``events.jsonl``, ``broker.addr``.
        column: the ID column of CSV/Parquet files (default ``id``).
        broker: a running broker ``tcp://HOST:PORT`` (default: start one).
        run_id: topic namespace (default random).
        chunk_size / window: :class:`parties.align.AlignConfig` overrides.
        timeout_s: stop everything after this long (None: no limit).
        quiet: no per-party lines on stdout.
        keys_dir / insecure: as :func:`sim.launch.run_security` (default: CURVE with keys
            made for this run).

    Returns:
        ``{"active": {...}, "passive": {...}, "wall_s": s, "broker": address}``.

    Raises:
        OutDirError: ``out`` cannot be created.
        LaunchError: a child failed (``.code`` is its exit code).
        JobTimeout: ``timeout_s`` passed.
    """
    d = Path(out)
    try:
        d.mkdir(parents=True, exist_ok=True)
        for role in ("active", "passive"):
            (d / f"align-{role}.json").unlink(missing_ok=True)
    except OSError as exc:
        raise OutDirError(f"cannot use {str(d)!r} as the output directory: "
                          f"{exc.strerror or exc}") from None
    run_id = run_id or f"align-{uuid.uuid4().hex[:8]}"
    events = d / "events.jsonl"
    t0 = time.perf_counter()
    procs: dict[str, Any] = {}
    broker_proc = None
    old = None
    if threading_main():
        def _on_term(*_: Any) -> None:
            raise _Terminated()

        old = signal.signal(signal.SIGTERM, _on_term)
    stack = contextlib.ExitStack()
    try:
        sec = stack.enter_context(run_security(VFL_IDENTITIES, keys_dir=keys_dir,
                                               insecure=insecure, broker=broker))
        if broker is None:
            broker_proc, broker = start_broker(d, events, security=sec,
                                               members={run_id: list(VFL_IDENTITIES)})
        else:
            (d / "broker.addr").write_text(broker)
        for role, ids in (("passive", passive_ids), ("active", active_ids)):
            cmd = [sys.executable, "-m", "sim.cli", "vfl", "align", "--role", role,
                   "--broker", broker, "--ids", str(ids), "--out", str(d), "--run-id", run_id,
                   "--events", str(events), *sec.client_args]
            if column:
                cmd += ["--column", column]
            if chunk_size:
                cmd += ["--chunk-size", str(chunk_size)]
            if window:
                cmd += ["--window", str(window)]
            if quiet:
                cmd += ["--quiet"]
            procs[role] = _spawn(cmd, quiet=quiet)
        wait_children(procs, watch={"broker": broker_proc} if broker_proc else None,
                      timeout_s=timeout_s)
    finally:
        for p in procs.values():
            _stop(p)
        if broker_proc is not None:
            _stop(broker_proc)
        stack.close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    res: dict[str, Any] = {"wall_s": time.perf_counter() - t0, "broker": broker,
                           "run_id": run_id, "security": sec.describe()}
    for role in ("active", "passive"):
        res[role] = orjson.loads((d / f"align-{role}.json").read_bytes())
    return res


__all__ = ["JobTimeout", "LaunchError", "run_align"]
