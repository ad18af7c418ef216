"""DP-SGD for the weight-based baselines: calibration, accounting and the private step.

Neighbouring relation: add or remove one record at one party (record-level DP). A record
lives at one party only, so each party's training is a DP-SGD run on its own rows and
the federated average of the parties' models is post-processing of the K private runs
(parallel composition: the release's ε is the largest party's ε).

Each party's run is a sequence of ``steps`` Poisson-subsampled Gaussian mechanisms
(sample rate ``q = batch / n_rows``, per-sample gradients clipped to ``max_grad_norm``,
noise ``σ·max_grad_norm``): opacus' per-sample gradients (``GradSampleModule``) and
``DPOptimizer`` do the step; opacus' RDP accountant calibrates σ for the planned steps
and re-accounts the steps actually run (a run stopped early by its time cap has spent
less than it planned, and reports that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The largest noise multiplier a baseline accepts: above it the model learns nothing
#: useful and the run would be reported as a result anyway.
MAX_NOISE_MULTIPLIER = 20.0


class BaselineError(RuntimeError):
    """Base class of the baselines' errors."""


class BaselineUnavailable(BaselineError, ImportError):
    """A baseline's library (opacus) is not installed.

    Attributes:
        package: the missing package.
    """

    def __init__(self, package: str) -> None:
        self.package = package
        super().__init__(f"the DP-SGD baselines need {package!r}: "
                         f"pip install 'pubsub-vfl[baselines]'")


class NoiseTooLarge(BaselineError, ValueError):
    """The noise multiplier that (ε, δ) needs exceeds :data:`MAX_NOISE_MULTIPLIER`.

    Attributes:
        epsilon / delta: the target.
        noise_multiplier: the σ it would need.
        sample_rate / steps: the plan it was calibrated for.
        max_noise_multiplier: the limit.
    """

    def __init__(self, *, epsilon: float, delta: float, noise_multiplier: float,
                 sample_rate: float, steps: int, max_noise_multiplier: float) -> None:
        self.epsilon, self.delta = epsilon, delta
        self.noise_multiplier = noise_multiplier
        self.sample_rate, self.steps = sample_rate, steps
        self.max_noise_multiplier = max_noise_multiplier
        super().__init__(
            f"epsilon={epsilon:g} (delta={delta:g}) over {steps} DP-SGD steps at sample "
            f"rate {sample_rate:.4g} needs noise multiplier {noise_multiplier:.3g}, above "
            f"the maximum {max_noise_multiplier:g}: raise epsilon, or train fewer steps")


def _opacus() -> Any:
    try:
        import opacus
    except ImportError as e:
        raise BaselineUnavailable("opacus") from e
    return opacus


@dataclass(frozen=True, slots=True, kw_only=True)
class DPSGDPlan:
    """One party's DP-SGD plan.

    Attributes:
        epsilon / delta: the target (``epsilon = inf``: no clipping, no noise).
        sample_rate: Poisson sampling rate ``q`` of each step.
        steps: the planned steps.
        noise_multiplier: σ (0 when ``epsilon`` is infinite).
        max_grad_norm: the per-sample clipping norm.
    """

    epsilon: float
    delta: float
    sample_rate: float
    steps: int
    noise_multiplier: float
    max_grad_norm: float

    @property
    def private(self) -> bool:
        return self.epsilon != float("inf")


def calibrate(*, epsilon: float, delta: float, sample_rate: float, steps: int,
              max_grad_norm: float = 1.0,
              max_noise_multiplier: float = MAX_NOISE_MULTIPLIER) -> DPSGDPlan:
    """The σ at which ``steps`` Poisson-subsampled Gaussian steps spend (ε, δ) (opacus RDP).

    Raises:
        ValueError: ε ≤ 0, δ outside (0, 1), ``sample_rate`` outside (0, 1], steps < 1,
            ``max_grad_norm`` ≤ 0.
        NoiseTooLarge: σ > ``max_noise_multiplier``.
        BaselineUnavailable: opacus is missing.
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm!r}")
    if epsilon == float("inf"):
        return DPSGDPlan(epsilon=epsilon, delta=delta, sample_rate=sample_rate, steps=steps,
                         noise_multiplier=0.0, max_grad_norm=max_grad_norm)
    _opacus()
    from opacus.accountants.utils import get_noise_multiplier

    at_max = _epsilon(max_noise_multiplier, sample_rate, steps, delta)
    if at_max > epsilon:  # even the largest σ spends more: refuse before the search
        raise NoiseTooLarge(epsilon=epsilon, delta=delta, noise_multiplier=float("inf"),
                            sample_rate=sample_rate, steps=steps,
                            max_noise_multiplier=max_noise_multiplier)
    try:
        sigma = float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta,
                                           sample_rate=sample_rate, steps=steps,
                                           accountant="rdp", epsilon_tolerance=0.005))
    except ValueError as e:  # opacus: "The privacy budget is too low."
        raise NoiseTooLarge(epsilon=epsilon, delta=delta, noise_multiplier=float("inf"),
                            sample_rate=sample_rate, steps=steps,
                            max_noise_multiplier=max_noise_multiplier) from e
    if sigma > max_noise_multiplier:
        raise NoiseTooLarge(epsilon=epsilon, delta=delta, noise_multiplier=sigma,
                            sample_rate=sample_rate, steps=steps,
                            max_noise_multiplier=max_noise_multiplier)
    return DPSGDPlan(epsilon=epsilon, delta=delta, sample_rate=sample_rate, steps=steps,
                     noise_multiplier=sigma, max_grad_norm=max_grad_norm)


def spent_epsilon(plan: DPSGDPlan, steps_run: int) -> float:
    """ε (at ``plan.delta``) of ``steps_run`` steps of ``plan`` (opacus RDP accountant);
    ``inf`` for a non-private plan, 0 for no step."""
    if not plan.private:
        return float("inf")
    if steps_run <= 0:
        return 0.0
    _opacus()
    return _epsilon(plan.noise_multiplier, plan.sample_rate, int(steps_run), plan.delta)


#: RDP orders: opacus' defaults and a few larger ones (tighter at large ε).
ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 100, 128, 256]


def _epsilon(sigma: float, sample_rate: float, steps: int, delta: float) -> float:
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(float(sigma), float(sample_rate), int(steps))]
    return float(acc.get_epsilon(delta=delta, alphas=ALPHAS))


class PrivateModule:
    """A module trained by DP-SGD (or plainly, for ε = ∞) with one optimizer.

    ``step(loss_fn, batch)``: ``loss_fn(module, batch)`` returns per-sample losses
    ``(B,)``; their mean's per-sample gradients are clipped and noised by opacus.
    """

    def __init__(self, module: Any, optimizer: Any, plan: DPSGDPlan, *,
                 expected_batch: int, generator: Any = None) -> None:
        self.plan = plan
        self.steps_run = 0
        if plan.private:
            _opacus()
            from opacus import GradSampleModule
            from opacus.optimizers import DPOptimizer

            self.module = GradSampleModule(module)
            self.optimizer = DPOptimizer(optimizer, noise_multiplier=plan.noise_multiplier,
                                         max_grad_norm=plan.max_grad_norm,
                                         expected_batch_size=max(1, int(expected_batch)),
                                         generator=generator)
        else:
            self.module, self.optimizer = module, optimizer

    @property
    def inner(self) -> Any:
        """The wrapped ``torch.nn.Module`` (its state dict has the plain names)."""
        return self.module._module if self.plan.private else self.module

    def step(self, loss_fn: Any, batch: Any) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(self.module, batch).mean()
        loss.backward()
        self.optimizer.step()
        self.steps_run += 1
        return float(loss.detach())


__all__ = ["BaselineError", "BaselineUnavailable", "DPSGDPlan", "MAX_NOISE_MULTIPLIER",
           "NoiseTooLarge", "PrivateModule", "calibrate", "spent_epsilon"]
