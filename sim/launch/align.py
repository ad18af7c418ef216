"""Launch private ID alignment on one machine: a broker and every party as processes.

Each party is ``python -m sim.cli vfl align --role PARTY ...`` (its own OS process, so
the parties' cryptography runs on separate cores); with several passive parties
(``passive``, ``passive2``, ...: N-way alignment, :mod:`parties.alignment.nway`) each has its
own key, and the run membership isolates them (``owned``) as for training; the broker is ``python -m broker
run`` on free ports of 127.0.0.1 unless ``broker`` names a running one. If a child
fails the others are stopped and :class:`sim.launch.vfl.LaunchError` carries its exit code.
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from sim.launch.vfl import (
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


def run_align(*, active_ids: str, passive_ids: str | Sequence[str], out: str | Path,
              column: str | None = None, broker: str | None = None,
              run_id: str | None = None, chunk_size: int | None = None,
              window: int | None = None, timeout_s: float | None = None,
              quiet: bool = False, keys_dir: str | None = None,
              insecure: bool = False) -> dict[str, Any]:
    """Align ID files: broker + one process per party; returns every ``align-*.json``.

    Args:
        active_ids: the active party's ID file (see :func:`parties.alignment.align.load_ids`).
        passive_ids: the passive party's ID file, or a list of them: the k-th is party
            ``passive`` (k = 1), ``passive<k>`` (k >= 2); two or more is N-way alignment.
        out: output directory: ``aligned-<party>.csv``, ``align-<party>.json``,
            ``events.jsonl``, ``broker.addr``.
        column: the ID column of CSV/Parquet files (default ``id``).
        broker: a running broker ``tcp://HOST:PORT`` (default: start one).
        run_id: topic namespace (default random).
        chunk_size / window: :class:`parties.alignment.align.AlignConfig` overrides.
        timeout_s: stop everything after this long (None: no limit).
        quiet: no per-party lines on stdout.
        keys_dir / insecure: as :func:`sim.launch.vfl.run_security` (default: CURVE with keys
            made for this run).

    Returns:
        ``{"active": {...}, "passive": {...}, ..., "wall_s": s, "broker": address}`` (one
        entry per party id).

    Raises:
        OutDirError: ``out`` cannot be created.
        LaunchError: a child failed (``.code`` is its exit code).
        JobTimeout: ``timeout_s`` passed.
    """
    from parties.config import MAX_PASSIVE_PARTIES, passive_party_ids

    files = [passive_ids] if isinstance(passive_ids, str | Path) else list(passive_ids)
    if not 1 <= len(files) <= MAX_PASSIVE_PARTIES:
        raise ValueError(f"need 1 .. {MAX_PASSIVE_PARTIES} passive ID files, got {len(files)}")
    passive = passive_party_ids(len(files))
    parties = ("active", *passive)
    ids_of = {"active": active_ids, **dict(zip(passive, files, strict=True))}
    identities = (VFL_IDENTITIES if len(files) == 1
                  else {p: ("active" if p == "active" else "passive") for p in parties})
    d = Path(out)
    try:
        d.mkdir(parents=True, exist_ok=True)
        for party in parties:
            (d / f"align-{party}.json").unlink(missing_ok=True)
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
        sec = stack.enter_context(run_security(identities, keys_dir=keys_dir,
                                               insecure=insecure, broker=broker))
        if broker is None:
            broker_proc, broker = start_broker(
                d, events, security=sec, members={run_id: list(identities)},
                owned={run_id: list(passive)} if len(passive) > 1 else None)
        else:
            (d / "broker.addr").write_text(broker)
        for party in (*passive, "active"):
            cmd = [sys.executable, "-m", "sim.cli", "vfl", "align", "--role", party,
                   "--broker", broker, "--ids", str(ids_of[party]), "--out", str(d),
                   "--run-id", run_id, "--events", str(events), *sec.client_args]
            if len(passive) > 1:
                cmd += ["--passive-parties", str(len(passive))]
            if column:
                cmd += ["--column", column]
            if chunk_size:
                cmd += ["--chunk-size", str(chunk_size)]
            if window:
                cmd += ["--window", str(window)]
            if quiet:
                cmd += ["--quiet"]
            procs[party] = _spawn(cmd, quiet=quiet)
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
    for party in parties:
        res[party] = orjson.loads((d / f"align-{party}.json").read_bytes())
    return res


__all__ = ["JobTimeout", "LaunchError", "run_align"]
