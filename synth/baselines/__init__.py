"""The FedForge paper's weight-based and ensemble baselines (DP-SGD via opacus).

``run_baseline(kind, parts, sizes, epsilon=..., delta=..., cap_s=..., n_out=...)`` with
``kind`` in :data:`KINDS`; needs the ``baselines`` extra (opacus) for a finite ε.
"""

from synth.baselines.dpsgd import (MAX_NOISE_MULTIPLIER, BaselineError, BaselineUnavailable,
                                   DPSGDPlan, NoiseTooLarge, calibrate, spent_epsilon)
from synth.baselines.federated import KINDS, BaselineResult, run_baseline

__all__ = ["BaselineError", "BaselineResult", "BaselineUnavailable", "DPSGDPlan", "KINDS",
           "MAX_NOISE_MULTIPLIER", "NoiseTooLarge", "calibrate", "run_baseline",
           "spent_epsilon"]
