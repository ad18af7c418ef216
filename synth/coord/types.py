"""The value objects and the error shared by the coordinator's stages.

:class:`CoordinatorError` ends a run (its reason is broadcast with ``done``);
:class:`EvalData` is the evaluation-only data of the quality stage; :class:`RoundResult`
is one measurement round's decoded aggregate with its survivors, as the round runner
returns it and the checkpoint store keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from synth.protocol import RoundPlan

#: A clique of attribute names (a marginal's axes, in order).
Clique = tuple[str, ...]

#: The sigma given to the engine for an exact (epsilon = inf) measurement, in counts.
NOISELESS_SIGMA = 1e-3


class CoordinatorError(RuntimeError):
    """The run cannot complete.

    Attributes:
        reason: what went wrong (also broadcast to every participant with ``done``).
        code: the process exit code (2: bad input, 4: participants missing, 1: other).
    """

    def __init__(self, reason: str, *, code: int = 1) -> None:
        self.reason = reason
        self.code = code
        super().__init__(reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalData:
    """Evaluation-only data for the quality stage (the simulator has it; a deployed
    coordinator does not).

    Attributes:
        train: the pooled rows the parties hold.
        holdout: real rows no party used (the ML-utility test set).
    """

    train: pd.DataFrame
    holdout: pd.DataFrame


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class RoundResult:
    """One released measurement round.

    Attributes:
        plan: the plan the parties measured.
        values: float64 ``(vector_len,)``: the decoded aggregate over the survivors.
        sigma: the aggregate's noise std per cell (counts).
        survivors: the parties whose masked vectors were summed.
        dropped: the parties that seeded the round but sent nothing in time.
        missing: the planned parties that never advertised keys.
        seconds: the round's wall time (plan to decoded sum).
    """

    plan: RoundPlan
    values: np.ndarray
    sigma: float
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    missing: tuple[str, ...]
    seconds: float


__all__ = ["Clique", "CoordinatorError", "EvalData", "NOISELESS_SIGMA", "RoundResult"]
