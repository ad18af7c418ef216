"""Alignment of a party's own file on the job's join key, before training and before a
prediction: the cross-organisation path (``psfl vfl party --job``, ``psfl vfl predict
--job``), where each organisation holds only its file.

The party runs the alignment protocol of :mod:`parties.alignment.run` on its file's join
key column (the same mutual ECDH PSI as ``psfl vfl align``, on the namespace
``<run_id>-align``), and the step after it reads the rows the file shares with every
other party, in the shared sorted-ID order (:func:`with_own_rows_file`). What each
party learns is what ``psfl vfl align`` discloses (the shared IDs and the partner's set
size; see ``docs/explanation/private-id-alignment.md``).

Owns: :func:`align_own_file`, :func:`with_own_rows_file`. May import
:mod:`parties.alignment.run` and :mod:`parties.config`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from parties.alignment.align import AlignConfig
from parties.alignment.run import run_align_party
from parties.config import VflConfig
from parties.config.job import Job


def align_own_file(job: Job, party: str, data: str | Path, out: str | Path, *,
                   run_id: str, security: Any = None, quiet: bool = False) -> tuple[int, Path]:
    """Align ``party``'s file ``data`` (its ``job.join_key`` column) with every other
    party's over the job's broker, on the topic namespace ``run_id``; writes
    ``out/aligned-<party>.csv`` and ``out/align-<party>.json``.

    Returns:
        ``(exit code, the aligned-rows file)``: 0 and the file, or the alignment's exit
        code (2 bad IDs, 3 no broker, 4 the partner never came, disagreed or sent
        malformed points; its error line already printed).
    """
    t = job.job.align_timeout_s
    cfg = AlignConfig(join_timeout_s=t, chunk_timeout_s=t, final_timeout_s=t)
    code = run_align_party(role=party, broker=job.job.broker, ids_path=str(data),
                           out=str(out), run_id=run_id, column=job.job.join_key, config=cfg,
                           quiet=quiet, security=security,
                           passive_parties=job.vfl.passive_parties)
    return code, Path(out) / f"aligned-{party}.csv"


def with_own_rows_file(cfg: VflConfig, party: str, rows_file: str | Path) -> VflConfig:
    """``cfg`` with ``party``'s aligned-rows file set (the other parties' files are not
    this party's to read: with several passive parties every entry of
    ``data.passive_party_rows_files`` is this party's own, and it reads only its own)."""
    path = str(rows_file)
    if party == "active":
        data = replace(cfg.data, active_rows_file=path)
    elif cfg.passive_parties == 1:
        data = replace(cfg.data, passive_rows_file=path)
    else:
        data = replace(cfg.data, passive_party_rows_files=(path,) * cfg.passive_parties)
    return replace(cfg, data=data)


__all__ = ["align_own_file", "with_own_rows_file"]
