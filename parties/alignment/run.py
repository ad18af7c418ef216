"""The alignment command of one party (``psfl vfl align``): read the party's ID file,
run the two-party PSI (:mod:`parties.alignment.align`) or, with several passive parties, the N-way
protocol (:mod:`parties.alignment.nway`), and write the aligned rows and the counts.

Owns: the party's alignment process (its exit codes, its output files). May import both
protocols, :mod:`parties.runtime.exitcodes` and :mod:`parties.runtime.serve` (the atomic JSON writer).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from pubsub.security import CurveClient

from parties.alignment.align import (AlignConfig, AlignStats, AlignTimeout, IdFileError, align_over_bus,
                           load_ids)
from parties.alignment.nway import EmptyIntersection, align_active, align_passive
from parties.runtime.exitcodes import ExitCode, exit_code_for
from parties.alignment.psi import AlignResult
from parties.runtime.serve import write_json


def write_result(out: str | Path, result: AlignResult, stats: AlignStats,
                 extra: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write ``OUT/aligned-<role>.csv`` (``id,row``) and ``OUT/align-<role>.json`` (counts,
    times, bytes; never IDs). Returns both paths."""
    d = Path(out)
    csv = _write_aligned(d, stats.role, result)
    js = d / f"align-{stats.role}.json"
    write_json(js, {**stats.as_dict(), **(extra or {})})
    return csv, js


def write_nway_result(out: str | Path, nway: Any,
                      extra: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """N-way alignment (:class:`parties.alignment.nway.NwayResult`): write
    ``OUT/aligned-<party>.csv`` (``id,row``, as :func:`write_result`, the final IDs) and
    ``OUT/align-<party>.json`` (counts, times, bytes per pair; never IDs)."""
    d = Path(out)
    csv = _write_aligned(d, nway.party, nway.result)
    js = d / f"align-{nway.party}.json"
    write_json(js, {**nway.summary(), **(extra or {})})
    return csv, js


def _write_aligned(d: Path, party: str, result: AlignResult) -> Path:
    """``d/aligned-<party>.csv``: ``id,row``, written atomically."""
    import pandas as pd

    d.mkdir(parents=True, exist_ok=True)
    csv = d / f"aligned-{party}.csv"
    tmp = csv.with_name(csv.name + ".tmp")
    pd.DataFrame({"id": list(result.ids), "row": result.rows}).to_csv(tmp, index=False)
    tmp.replace(csv)
    return csv


def write_demo_ids(out: str | Path, n: int, overlap: float, seed: int) -> tuple[Path, Path]:
    """Write ``OUT/active-ids.txt`` and ``OUT/passive-ids.txt``: ``n`` IDs each, a share
    ``overlap`` of them in common (:func:`parties.alignment.psi.demo_ids`)."""
    from parties.alignment.psi import demo_ids

    a, b = demo_ids(n, overlap, seed)
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    pa, pb = d / "active-ids.txt", d / "passive-ids.txt"
    pa.write_text("".join(x + "\n" for x in a))
    pb.write_text("".join(x + "\n" for x in b))
    return pa, pb


def peak_rss_mb() -> float | None:
    """This process's peak resident set size, MiB (``VmHWM`` of ``/proc/self/status``).

    Not ``getrusage``'s ``ru_maxrss``: that survives ``execve``, so a child forked from
    a large parent (a benchmark holding 1M IDs) reports the parent's size. None where
    ``/proc`` is missing.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def run_align_party(*, role: str, broker: str, ids_path: str, out: str, run_id: str,
                    column: str | None = None, config: AlignConfig | None = None,
                    events: str | None = None, quiet: bool = False,
                    security: CurveClient | None = None, passive_parties: int = 1) -> int:
    """One party process: read IDs, align over the broker, write the outputs.

    ``role``: the party id (``active``, ``passive``, ``passive2`` ...; with one passive
    party the ids are the roles). ``passive_parties``: how many passive parties align
    (1: the two-party protocol; more: :mod:`parties.alignment.nway`, every party must be
    given the same number). ``security``: the party's CURVE keys (None: plaintext,
    loopback only).

    Returns:
        An exit code (:class:`parties.runtime.exitcodes.ExitCode`): 0, 2 bad input (IDs, files, run
        id, party id; with several passive parties also no ID in every party's set),
        3 broker unreachable, 4 partner problem (timeout, mismatch, bad chunk or mask).
        One ``error (PARTY party): ...`` line on stderr for the expected failures.
    """
    from parties.core.ids import check_run_id
    from parties.alignment.psi import DuplicateIds, EmptyId
    from pubsub.logs import configure_logging
    from pubsub.runner import run as run_loop

    t0 = time.perf_counter()
    nway = passive_parties > 1
    try:
        _check_party(role, passive_parties)
        check_run_id(run_id)
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        configure_logging(events_path=events or d / "events.jsonl", party=role, run_id=run_id,
                          stage="align")
        ids = load_ids(ids_path, column)
        if not ids:
            raise IdFileError(ids_path, "holds no IDs")
        t_load = time.perf_counter() - t0
        if nway:
            from parties.core.ids import passive_party_ids

            kw: dict[str, Any] = {"broker": broker, "run_id": run_id, "config": config,
                                  "security": security}
            coro = (align_active(ids, passive=passive_party_ids(passive_parties), **kw)
                    if role == "active" else align_passive(ids, party=role, **kw))
            outcome = run_loop(coro)
        else:
            result, stats = run_loop(align_over_bus(ids, role=role, broker=broker,
                                                    run_id=run_id, config=config,
                                                    security=security))
        extra = {"load_s": t_load, "max_rss_mb": peak_rss_mb(),
                 "process_wall_s": time.perf_counter() - t0, "run_id": run_id}
        csv, _ = (write_nway_result(d, outcome, extra) if nway
                  else write_result(d, result, stats, extra))
    except AlignTimeout as exc:  # a TimeoutError (an OSError): the partner, not the input
        print(f"error ({role} party): {exc}", file=sys.stderr)
        return int(ExitCode.PARTNER)
    except (IdFileError, DuplicateIds, EmptyId, EmptyIntersection, OSError) as exc:
        print(f"error ({role} party): {exc}", file=sys.stderr)
        return int(ExitCode.BAD_INPUT)
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        print(f"error ({role} party): {exc}", file=sys.stderr)
        return int(code)
    if not quiet and nway:
        pairs = ", ".join(f"{p} {n:,}" for p, n in outcome.n_pair_shared.items())
        print(f"{role} party: {outcome.result.n_shared:,} IDs in every party's set, of "
              f"{outcome.result.n_own:,} own IDs (shared with {pairs}) in "
              f"{outcome.seconds:.2f} s; {csv}", flush=True)
    elif not quiet:
        print(f"{role} party: {stats.n_shared:,} shared of {stats.n_own:,} own IDs "
              f"(partner {stats.n_partner:,}) in {stats.seconds:.2f} s; sent "
              f"{stats.bytes_sent:,} B, received {stats.bytes_received:,} B; {csv}", flush=True)
    if not nway and stats.n_shared == 0:
        print(f"warning ({role} party): no ID is shared: check that both files write the IDs "
              "the same way (text is compared exactly: '007' is not '7', 'C12' not 'c12')",
              file=sys.stderr)
    return int(ExitCode.OK)


def _check_party(party: str, passive_parties: int) -> None:
    """A party id of an alignment with ``passive_parties`` passive parties.

    Raises:
        pubsub.config.ConfigError: ``passive_parties`` outside 1 .. 9, or ``party`` not
            one of its ids.
    """
    from parties.core.ids import MAX_PASSIVE_PARTIES, passive_party_ids
    from pubsub.config import ConfigError

    if not 1 <= passive_parties <= MAX_PASSIVE_PARTIES:
        raise ConfigError("passive_parties", f"must be in 1 .. {MAX_PASSIVE_PARTIES}, got "
                          f"{passive_parties!r}")
    ids = ("active", *passive_party_ids(passive_parties))
    if party not in ids:
        hint = (" (a party id after 'passive' needs --passive-parties, as many passive "
                "parties as align)" if passive_parties == 1 and party.startswith("passive")
                else "")
        raise ConfigError("role", f"party {party!r} is not in an alignment of "
                          f"{passive_parties} passive part"
                          f"{'ies' if passive_parties > 1 else 'y'} (its parties: "
                          f"{', '.join(ids)}){hint}")


__all__ = ["peak_rss_mb", "run_align_party", "write_demo_ids", "write_nway_result",
           "write_result"]
