"""Zero-concentrated differential privacy (zCDP) accounting for FedForge (pure logic, no I/O).

Privacy notion
--------------
ρ-zCDP (Bun & Steinke, "Concentrated Differential Privacy: Simplifications,
Extensions, and Lower Bounds", TCC 2016). FedForge's neighbouring relation is
replace-one (one record's values change; row counts are public, see
:mod:`synth.mechanism`), under which a clique histogram has L2 sensitivity √2. The
measurements are Skellam mechanisms whose exact RDP is charged as ρ
(:func:`synth.skellam.skellam_rho`). zCDP composes additively: a run made of measurements that
are ρ_1-, ..., ρ_k-zCDP is (Σ ρ_j)-zCDP (BS16 Lemma 2.3), so a budget is a number
ρ_total and every measurement spends a share of it.

Conversion to (ε, δ)
--------------------
The tight conversion of Canonne, Kamath & Steinke, "The Discrete Gaussian for
Differential Privacy", NeurIPS 2020, Prop. 12 / Cor. 13 (the one private-pgm's
``cdp_rho``/``cdp_eps`` implement): a ρ-zCDP mechanism is (ε, δ)-DP with

    ε(ρ, δ) = inf_{α>1}  αρ + (log(1/(αδ)) + (α−1)·log(1 − 1/α)) / (α − 1).

The objective is convex in α with derivative ``ρ − (log(1/δ) − log α)/(α−1)²``,
which has a single root; we find it with Brent's method. Any α > 1 gives a valid
(if looser) bound, so root-finding error can only make ε larger, never smaller.
``cdp_rho`` inverts ``cdp_epsilon`` by bisection and returns the *lower* end of
the final bracket, so ``cdp_epsilon(cdp_rho(ε, δ), δ) <= ε`` always holds.

At ε = 1, δ = 1e-9 this allows ρ ≈ 0.01497; the simple bound
ε = ρ + 2·sqrt(ρ·log(1/δ)) (BS16 Prop. 1.3, :func:`cdp_rho_simple`) allows only
ρ ≈ 0.01178, i.e. the tight conversion gives about 27 % more budget.

The Gaussian mechanism with L2 sensitivity Δ and noise N(0, σ²) is
(Δ²/(2σ²))-zCDP (BS16 Prop. 1.6); the same holds for the discrete Gaussian
(CKS20 Thm. 4). These Gaussian helpers serve the central reference mechanisms and AIM's
selection heuristics; the federated release is charged from the Skellam RDP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


DEFAULT_DELTA = 1e-9
#: relative float slack allowed when checking that a spend fits in the budget
BUDGET_SLACK = 1e-12


class BudgetExceeded(RuntimeError):
    """A measurement would take the zCDP spend past the budget.

    Attributes:
        requested: ρ of the refused measurement.
        spent: ρ already spent before it.
        budget: the accountant's ρ budget.
        what: the label of the refused measurement.
    """

    def __init__(self, *, requested: float, spent: float, budget: float, what: str) -> None:
        self.requested = requested
        self.spent = spent
        self.budget = budget
        self.what = what
        super().__init__(
            f"zCDP budget exceeded by {what!r}: requested rho={requested!r} with "
            f"rho={spent!r} already spent of a budget of {budget!r} "
            f"(remaining {max(0.0, budget - spent)!r})")


# ---------------------------------------------------------------------------- validation
def _check_positive(name: str, value: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (0.0 < value < math.inf):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def _check_delta(delta: float) -> float:
    if not isinstance(delta, int | float) or isinstance(delta, bool):
        raise ValueError(f"delta must be a number, got {delta!r}")
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return delta


# ---------------------------------------------------------------------------- conversions
def _eps_objective(alpha: float, rho: float, log_inv_delta: float) -> float:
    return (alpha * rho + (log_inv_delta - math.log(alpha)) / (alpha - 1.0)
            + math.log1p(-1.0 / alpha))


def cdp_epsilon(rho: float, delta: float = DEFAULT_DELTA) -> float:
    """ε such that a ρ-zCDP mechanism is (ε, δ)-DP, by the tight conversion.

    Canonne, Kamath & Steinke (NeurIPS 2020), Prop. 12 / Cor. 13:
    ``ε = inf_{α>1} αρ + (log(1/(αδ)) + (α−1) log(1−1/α)) / (α−1)``, clamped at 0.

    Args:
        rho: ρ ≥ 0 (ρ = 0 gives ε = 0).
        delta: δ in (0, 1).

    Returns:
        ε ≥ 0 (float). Root-finding error can only overstate it.

    Raises:
        ValueError: ρ negative or not finite, δ outside (0, 1).
    """
    if not isinstance(rho, int | float) or isinstance(rho, bool) or not (0.0 <= rho < math.inf):
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    delta = _check_delta(delta)
    if rho == 0.0:
        return 0.0
    rho = float(rho)
    log_inv_delta = -math.log(delta)

    # d/dα of the objective, scaled by (α−1)²: ρ(α−1)² − (log(1/δ) − log α); increasing in α.
    def slope(alpha: float) -> float:
        return rho * (alpha - 1.0) ** 2 - (log_inv_delta - math.log(alpha))

    lo = 1.0 + 1e-12
    hi = 2.0 + math.sqrt(log_inv_delta / rho)
    while slope(hi) <= 0.0:  # pragma: no cover - the bound above already suffices
        hi *= 2.0
    from scipy.optimize import brentq  # lazily: scipy.optimize costs 0.4 s to import

    alpha = lo if slope(lo) >= 0.0 else brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15, maxiter=500)
    # any α > 1 is a valid bound: guard against a root landing on 1 exactly
    alpha = max(alpha, 1.0 + 1e-12)
    return max(0.0, _eps_objective(alpha, rho, log_inv_delta))


def cdp_delta(rho: float, epsilon: float) -> float:
    """δ such that a ρ-zCDP mechanism is (ε, δ)-DP, by the tight conversion.

    Canonne, Kamath & Steinke (NeurIPS 2020), Cor. 13:
    ``δ = inf_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α``, capped at 1
    (private-pgm's ``cdp_delta``).

    Args:
        rho: ρ ≥ 0.
        epsilon: ε ≥ 0.

    Returns:
        δ in [0, 1].

    Raises:
        ValueError: a negative or non-finite argument.
    """
    if not (0.0 <= rho < math.inf):
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    if not (0.0 <= epsilon < math.inf):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    if rho == 0.0:
        return 0.0

    # derivative of log δ(α): (2α−1)ρ − ε + log(1 − 1/α); increasing in α, −∞ at α → 1+
    def slope(alpha: float) -> float:
        return (2.0 * alpha - 1.0) * rho - epsilon + math.log1p(-1.0 / alpha)

    lo, hi = 1.0 + 1e-12, (epsilon + 1.0) / (2.0 * rho) + 2.0
    from scipy.optimize import brentq  # lazily: scipy.optimize costs 0.4 s to import

    alpha = lo if slope(lo) >= 0.0 else brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15, maxiter=500)
    alpha = max(alpha, 1.0 + 1e-12)
    log_delta = ((alpha - 1.0) * (alpha * rho - epsilon) + alpha * math.log1p(-1.0 / alpha)
                 - math.log(alpha - 1.0))
    return min(1.0, math.exp(min(log_delta, 0.0)))


def cdp_rho(epsilon: float, delta: float = DEFAULT_DELTA) -> float:
    """The largest ρ whose tight (ε, δ) conversion stays within ``epsilon``.

    Inverts :func:`cdp_epsilon` (Canonne, Kamath & Steinke, NeurIPS 2020, Prop. 12 /
    Cor. 13; private-pgm's ``cdp_rho``) by bisection on ρ, returning the lower end
    of the bracket so that ``cdp_epsilon(cdp_rho(ε, δ), δ) <= ε``.

    Args:
        epsilon: target ε > 0.
        delta: δ in (0, 1); default 1e-9.

    Returns:
        ρ > 0. Example: ``cdp_rho(1.0, 1e-9) ≈ 0.01497``.

    Raises:
        ValueError: ε not a positive finite number or δ outside (0, 1).
    """
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    lo = 0.0  # invariant: cdp_epsilon(lo) <= epsilon
    hi = epsilon + 1.0
    while cdp_epsilon(hi, delta) <= epsilon:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if cdp_epsilon(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def cdp_rho_simple(epsilon: float, delta: float = DEFAULT_DELTA) -> float:
    """ρ from the simple bound ε = ρ + 2·sqrt(ρ·log(1/δ)) (Bun & Steinke 2016, Prop. 1.3).

    Solved in closed form: ``ρ = (sqrt(log(1/δ) + ε) − sqrt(log(1/δ)))²``. Looser than
    :func:`cdp_rho` (about 27 % less ρ at ε = 1, δ = 1e-9); kept for comparison.

    Raises:
        ValueError: ε not a positive finite number or δ outside (0, 1).
    """
    epsilon = _check_positive("epsilon", epsilon)
    log_inv_delta = -math.log(_check_delta(delta))
    # (√(L+ε) − √L)² written as ε² / (√(L+ε) + √L)² to avoid cancellation
    return epsilon ** 2 / (math.sqrt(log_inv_delta + epsilon) + math.sqrt(log_inv_delta)) ** 2


def gaussian_sigma(rho: float, sensitivity: float = 1.0) -> float:
    """Noise std of a Gaussian mechanism that is ρ-zCDP: ``Δ / sqrt(2ρ)``.

    Bun & Steinke (TCC 2016), Prop. 1.6: adding N(0, σ²) to a query of L2
    sensitivity Δ is (Δ²/(2σ²))-zCDP. Also holds for the discrete Gaussian
    (Canonne, Kamath & Steinke 2020, Thm. 4).

    Args:
        rho: ρ > 0.
        sensitivity: Δ > 0, the L2 sensitivity (√2 for a histogram under replace-one).

    Returns:
        σ (same units as the query).

    Raises:
        ValueError: a non-positive, NaN or infinite argument.
    """
    rho = _check_positive("rho", rho)
    sensitivity = _check_positive("sensitivity", sensitivity)
    return sensitivity / math.sqrt(2.0 * rho)


def gaussian_rho(sigma: float, sensitivity: float = 1.0) -> float:
    """ρ of a Gaussian mechanism with noise std σ and L2 sensitivity Δ: ``Δ² / (2σ²)``.

    Bun & Steinke (TCC 2016), Prop. 1.6; inverse of :func:`gaussian_sigma`.

    Raises:
        ValueError: a non-positive, NaN or infinite argument.
    """
    sigma = _check_positive("sigma", sigma)
    sensitivity = _check_positive("sensitivity", sensitivity)
    return sensitivity ** 2 / (2.0 * sigma ** 2)


def allocate(rho_total: float, weights: Sequence[float]) -> list[float]:
    """Split ``rho_total`` proportionally to ``weights``.

    The last share is ``rho_total`` minus the sum of the others (``math.fsum``), so
    the shares sum to ``rho_total`` within one rounding error.

    Args:
        rho_total: ρ > 0 to split.
        weights: non-negative finite weights with a positive sum.

    Returns:
        One ρ share per weight, in order (a zero weight gets 0.0).

    Raises:
        ValueError: empty weights, a negative / NaN / infinite weight, zero total weight,
            or a bad ``rho_total``.
    """
    rho_total = _check_positive("rho_total", rho_total)
    ws = [float(w) for w in weights]
    if not ws:
        raise ValueError("weights must not be empty")
    for w in ws:
        if not (0.0 <= w < math.inf):
            raise ValueError(f"weights must be finite numbers >= 0, got {w!r}")
    total = math.fsum(ws)
    if total <= 0.0:
        raise ValueError(f"weights must have a positive sum, got {ws!r}")
    shares = [rho_total * (w / total) for w in ws]
    last = max(i for i, w in enumerate(ws) if w > 0.0)
    shares[last] = max(0.0, rho_total - math.fsum(s for i, s in enumerate(shares) if i != last))
    return shares


# ---------------------------------------------------------------------------- accountant
class ZCdpAccountant:
    """A party's zCDP ledger with a hard budget.

    Every measurement calls :meth:`spend` before it is released; a spend that would
    take the total past the budget is refused with :class:`BudgetExceeded` and
    nothing is recorded. Persist :meth:`state_dict` with the checkpoint and restore
    it with :meth:`load_state_dict`, so a restart never spends the same budget twice.

    Args:
        rho_budget: total ρ > 0.
        delta: δ in (0, 1) used to report (ε, δ); default 1e-9.

    Raises:
        ValueError: a bad budget or δ.
    """

    def __init__(self, *, rho_budget: float, delta: float = DEFAULT_DELTA) -> None:
        self.rho_budget = _check_positive("rho_budget", rho_budget)
        self.delta = _check_delta(delta)
        self._ledger: list[tuple[str, float]] = []
        self._spent = 0.0

    @classmethod
    def from_epsilon(cls, epsilon: float, delta: float = DEFAULT_DELTA) -> ZCdpAccountant:
        """An accountant whose budget is the tight ``cdp_rho(epsilon, delta)``.

        Raises:
            ValueError: ε not a positive finite number or δ outside (0, 1).
        """
        return cls(rho_budget=cdp_rho(epsilon, delta), delta=delta)

    @property
    def spent(self) -> float:
        """ρ spent so far (``math.fsum`` of the ledger)."""
        return self._spent

    @property
    def remaining(self) -> float:
        """ρ left, never negative."""
        return max(0.0, self.rho_budget - self._spent)

    @property
    def ledger(self) -> tuple[tuple[str, float], ...]:
        """The measurements spent so far, in order, as ``(what, rho)``."""
        return tuple(self._ledger)

    def can_spend(self, rho: float) -> bool:
        """Whether ``spend(rho)`` would succeed (``rho`` must be valid)."""
        rho = _check_positive("rho", rho)
        return self._spent + rho <= self.rho_budget * (1.0 + BUDGET_SLACK)

    def spend(self, rho: float, *, what: str) -> None:
        """Record a ρ-zCDP measurement, or refuse it.

        Args:
            rho: ρ > 0 of the measurement.
            what: a label for the ledger (e.g. ``"marginal:age,income"``).

        Raises:
            ValueError: ρ not a positive finite number, or an empty label.
            BudgetExceeded: ``spent + rho`` exceeds the budget by more than a relative
                1e-12 of float slack; nothing is recorded.
        """
        rho = _check_positive("rho", rho)
        if not isinstance(what, str) or not what:
            raise ValueError(f"what must be a non-empty string, got {what!r}")
        if not self.can_spend(rho):
            raise BudgetExceeded(requested=rho, spent=self._spent, budget=self.rho_budget,
                                 what=what)
        self._ledger.append((what, rho))
        self._spent = math.fsum(r for _, r in self._ledger)

    def epsilon(self) -> float:
        """ε of what has been spent, at the accountant's δ (tight CKS20 conversion)."""
        return cdp_epsilon(self._spent, self.delta)

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state: budget, δ, spent and the ledger."""
        return {"rho_budget": self.rho_budget, "delta": self.delta, "spent": self._spent,
                "ledger": [[what, rho] for what, rho in self._ledger]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ledger saved by :meth:`state_dict`.

        Raises:
            ValueError: the saved budget or δ differs from this accountant's, the ledger
                is malformed, or it exceeds the budget.
        """
        try:
            budget, delta = float(state["rho_budget"]), float(state["delta"])
            ledger = [(str(w), float(r)) for w, r in state["ledger"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed accountant state: {e!r}") from e
        if budget != self.rho_budget:
            raise ValueError(f"saved rho_budget={budget!r} differs from this accountant's "
                             f"{self.rho_budget!r}")
        if delta != self.delta:
            raise ValueError(f"saved delta={delta!r} differs from this accountant's "
                             f"{self.delta!r}")
        for what, rho in ledger:
            if not (0.0 < rho < math.inf):
                raise ValueError(f"saved ledger entry {what!r} has invalid rho={rho!r}")
        spent = math.fsum(r for _, r in ledger)
        if spent > self.rho_budget * (1.0 + BUDGET_SLACK):
            raise ValueError(f"saved ledger spends rho={spent!r}, over the budget "
                             f"{self.rho_budget!r}")
        self._ledger = ledger
        self._spent = spent

    def __repr__(self) -> str:
        return (f"ZCdpAccountant(rho_budget={self.rho_budget!r}, delta={self.delta!r}, "
                f"spent={self._spent!r}, entries={len(self._ledger)})")
