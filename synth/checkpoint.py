"""Atomic files for the coordinator's checkpoints and the parties' ledgers.

Every file is written to a temporary name in the same directory, flushed and fsynced,
then renamed over the target (``os.replace``, atomic on POSIX), and the directory is
fsynced (:func:`pubsub.outputs.write_atomic`, the one writer of both applications). A
failed write (a full disk, a read-only filesystem) removes the temporary file and raises
:class:`pubsub.outputs.OutputError` naming the file; a crash (kill -9, power loss) during
a write leaves the previous version intact and at most a stray hidden
``.<name>.<pid>.<random>.tmp`` file, which readers ignore.

A checkpoint is one JSON document (the commit record) plus arrays in ``.npz`` files that
it names; the arrays are written first, each under a fresh name, so the JSON never names
a file that is not complete.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from pubsub.outputs import atomic_output, output_error, write_atomic




class CheckpointError(RuntimeError):
    """A checkpoint or ledger file cannot be read.

    Attributes:
        path: the file.
        reason: what is wrong with it.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"checkpoint {self.path}: {reason}")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync dir).

    Raises:
        pubsub.outputs.OutputError: the directory is not writable, the disk is full (the
            target is then unchanged).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(path, exc) from None
    write_atomic(path, data)


def atomic_write_json(path: str | Path, doc: Any) -> None:
    """``doc`` as indented JSON, atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, json.dumps(doc, indent=1, default=str).encode())


def atomic_write_csv(path: str | Path, frame: Any) -> None:
    """A pandas frame as CSV (no index), atomically: a result such as ``synthetic.csv``
    is there whole or not at all (see :func:`atomic_write_bytes`)."""
    path = Path(path)
    with atomic_output(path, text=True) as f:
        frame.to_csv(f, index=False)


def atomic_write_parquet(path: str | Path, frame: Any) -> None:
    """A pandas frame as Parquet (no index), atomically (a run's data split: a full disk
    is an OutputError naming the file, never a truncated table)."""
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def atomic_save_npz(path: str | Path, **arrays: np.ndarray) -> None:
    """``arrays`` as an uncompressed ``.npz``, atomically."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def read_json(path: str | Path) -> Any | None:
    """The JSON document at ``path``, or None if there is none.

    Raises:
        CheckpointError: the file exists but is not valid JSON (never from a crash during
            an atomic write; only from outside damage).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(path, f"not valid JSON ({exc})") from None


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path``.

    Raises:
        CheckpointError: missing or unreadable.
    """
    try:
        with np.load(Path(path), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise CheckpointError(path, f"cannot read arrays ({exc})") from None


__all__ = ["CheckpointError", "atomic_save_npz", "atomic_write_bytes", "atomic_write_json",
           "load_npz", "read_json"]
