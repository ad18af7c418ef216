"""A FedForge party's privacy ledger on disk.

The party's zCDP accountant (:class:`synth.accounting.ZCdpAccountant`) is rewritten
atomically (:mod:`synth.checkpoint`) before each release, tagged with the party and the
run; a party process started again for the same run (a workload update after the run
finished) continues it, so what it spent stays spent.
"""

from __future__ import annotations

from pathlib import Path

from synth.accounting import ZCdpAccountant
from synth.checkpoint import CheckpointError, atomic_write_json, read_json
from synth.netutil import ParticipantError


class LedgerFile:
    """One party's ledger file of one run.

    Args:
        path: the file (``<state-dir>/<party>.ledger.json``).
        party: the party id it belongs to.
        run_id: the run it belongs to.
    """

    def __init__(self, path: str | Path, *, party: str, run_id: str) -> None:
        self.path = path
        self.party = party
        self.run_id = run_id

    def write(self, accountant: ZCdpAccountant) -> None:
        """Rewrite the file with the accountant's state (atomically)."""
        atomic_write_json(self.path, {"party": self.party, "run_id": self.run_id,
                                      **accountant.state_dict()})

    def restore(self, accountant: ZCdpAccountant) -> bool:
        """Load the file into ``accountant``; False when there is none yet.

        Raises:
            ParticipantError: (code 2) the file is unreadable or belongs to another party
                or run.
        """
        try:
            doc = read_json(self.path)
            if doc is None:
                return False
            if doc.get("run_id") != self.run_id or doc.get("party") != self.party:
                raise ValueError(f"it is the ledger of {doc.get('party')!r} in run "
                                 f"{doc.get('run_id')!r}")
            accountant.load_state_dict(doc)
        except (CheckpointError, ValueError) as exc:
            raise ParticipantError(self.party, f"cannot continue the privacy ledger "
                                   f"{self.path}: {exc}", code=2) from None
        return True


__all__ = ["LedgerFile"]
