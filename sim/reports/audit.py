"""Statistics of the empirical privacy audit (pure functions, no I/O).

``bench/dp_audit.py`` draws outputs of the product's own mechanisms under two
neighbouring inputs D and D' and asks two questions of each configuration:

* **Black box** (any mechanism): how large an ε do the draws *prove*? A test that
  guesses "D'" on a set of outputs has false-positive rate FPR = P_D(guess D') and
  false-negative rate FNR = P_D'(guess D). Every (ε, δ)-DP mechanism satisfies
  ``FPR + e^ε FNR ≥ 1 − δ`` and ``FNR + e^ε FPR ≥ 1 − δ`` (Kairouz, Oh & Viswanath
  2015), so with one-sided Clopper–Pearson upper limits FPR_hi, FNR_hi (each at level
  α/2: both hold together with probability ≥ 1 − α)

      ε ≥ max(log((1 − δ − FNR_hi) / FPR_hi), log((1 − δ − FPR_hi) / FNR_hi)).

  The test's threshold (and direction) is chosen on the first half of the draws and
  the bound is evaluated on the second half only, so the selection does not bias it
  (Nasr et al., "Tight Auditing of Differentially Private Machine Learning", USENIX
  Security 2023). :func:`eps_lower_bound` does this for a scalar statistic;
  :func:`projected_eps_lower_bound` first projects vector outputs onto the
  mean-difference direction estimated on the first half (for Gaussian outputs with a
  common covariance that is the log-likelihood ratio, the optimal statistic).
  Across the k cases of one audit run pass ``alpha = 0.05 / k`` (:func:`bonferroni`),
  so a sound case fails by chance with probability at most 0.05 over the whole run.

* **Exact** (discrete mechanisms): from the two output pmfs, including every rounding
  and modular step, the hockey-stick divergence
  ``δ(ε) = Σ_y max(0, P(y) − e^ε Q(y))`` both ways (:func:`hockey_stick`) and the
  smallest ε with ``δ(ε) ≤ δ`` (:func:`exact_epsilon`). For independent coordinates
  (two cells of a histogram under replace-one) the privacy-loss distributions
  convolve (:func:`compose_plds`, :func:`exact_epsilon_product`); losses are rounded
  *up* to a grid, so the result is an upper bound within ``grid`` per coordinate.

Probability tables of the product's noise distributions (discrete Gaussian, Skellam)
and of its per-party pipeline (rounding, summation over survivors, modular decoding)
are built by :class:`IntPmf` and :func:`released_sum_pmf`: they are the *exact
distributions* of what the product samples, cross-checked against its samplers by the
black-box half of each case, not a copy of a mechanism.

GDP helpers: :func:`gdp_tradeoff` (the µ-GDP trade-off curve), :func:`gdp_epsilon`
(µ → ε at δ through :func:`parties.privacy.dp.epsilon_for_delta`, the product's exact
conversion) and :func:`fitted_mu` (the µ a pair of error rates implies).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.special import ndtr, ndtri

#: Default confidence of the audit: 95 %.
DEFAULT_ALPHA = 0.05
#: Most candidate thresholds tried on the first half (quantiles of the pooled draws).
MAX_THRESHOLDS = 4096


# ---------------------------------------------------------------------------- Clopper–Pearson
def cp_upper(k: int | np.ndarray, n: int | np.ndarray, alpha: float = DEFAULT_ALPHA
             ) -> float | np.ndarray:
    """One-sided Clopper–Pearson upper limit on a binomial proportion.

    The exact limit ``p_hi`` with ``P(Bin(n, p_hi) ≤ k) = alpha``:
    ``Beta(1 − alpha; k + 1, n − k)`` (1 when ``k = n``).

    Args:
        k: successes (scalar or array), 0 ≤ k ≤ n.
        n: trials ≥ 1.
        alpha: one-sided error, in (0, 1).

    Returns:
        The upper limit(s), in (0, 1].

    Raises:
        ValueError: alpha outside (0, 1), n < 1, or k outside [0, n].
    """
    _check_alpha(alpha)
    k_arr, n_arr = np.broadcast_arrays(np.asarray(k, dtype=np.float64),
                                       np.asarray(n, dtype=np.float64))
    if np.any(n_arr < 1) or np.any(k_arr < 0) or np.any(k_arr > n_arr):
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k!r}, n={n!r}")
    full = k_arr >= n_arr
    out = np.ones_like(k_arr)
    if np.any(~full):
        out[~full] = stats.beta.ppf(1.0 - alpha, k_arr[~full] + 1.0, n_arr[~full] - k_arr[~full])
    return float(out) if out.ndim == 0 else out


def cp_lower(k: int | np.ndarray, n: int | np.ndarray, alpha: float = DEFAULT_ALPHA
             ) -> float | np.ndarray:
    """One-sided Clopper–Pearson lower limit: ``Beta(alpha; k, n − k + 1)`` (0 when k = 0).

    Raises:
        ValueError: as :func:`cp_upper`.
    """
    _check_alpha(alpha)
    k_arr, n_arr = np.broadcast_arrays(np.asarray(k, dtype=np.float64),
                                       np.asarray(n, dtype=np.float64))
    if np.any(n_arr < 1) or np.any(k_arr < 0) or np.any(k_arr > n_arr):
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k!r}, n={n!r}")
    zero = k_arr <= 0
    out = np.zeros_like(k_arr)
    if np.any(~zero):
        out[~zero] = stats.beta.ppf(alpha, k_arr[~zero], n_arr[~zero] - k_arr[~zero] + 1.0)
    return float(out) if out.ndim == 0 else out


def bonferroni(alpha: float, tests: int) -> float:
    """The per-test level ``alpha / tests`` that keeps the family-wise error at ``alpha``.

    Raises:
        ValueError: alpha outside (0, 1) or tests < 1.
    """
    _check_alpha(alpha)
    if tests < 1:
        raise ValueError(f"tests must be >= 1, got {tests!r}")
    return alpha / tests


def _check_alpha(alpha: float) -> None:
    if not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def _check_delta(delta: float) -> None:
    if not (0.0 <= delta < 1.0):
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")


# ---------------------------------------------------------------------------- black box
def eps_from_rates(fpr_hi: float | np.ndarray, fnr_hi: float | np.ndarray, delta: float
                   ) -> float | np.ndarray:
    """The ε lower bound implied by upper limits on a test's error rates.

    ``max(log((1 − δ − FNR_hi)/FPR_hi), log((1 − δ − FPR_hi)/FNR_hi))``, clamped at 0
    (a term whose numerator is ≤ 0 proves nothing).
    """
    fpr = np.asarray(fpr_hi, dtype=np.float64)
    fnr = np.asarray(fnr_hi, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where((1.0 - delta - fnr > 0) & (fpr > 0),
                     np.log(np.maximum(1.0 - delta - fnr, 1e-300)) - np.log(fpr), 0.0)
        b = np.where((1.0 - delta - fpr > 0) & (fnr > 0),
                     np.log(np.maximum(1.0 - delta - fpr, 1e-300)) - np.log(fnr), 0.0)
    out = np.maximum(0.0, np.maximum(a, b))
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True, slots=True, kw_only=True)
class LowerBound:
    """A black-box ε lower bound and the test behind it.

    Attributes:
        eps: the lower bound (0 when nothing is significant), valid with probability
            ≥ 1 − alpha.
        threshold: the chosen threshold on the statistic (first half).
        direction: +1: guess D' when the statistic ≥ threshold; −1: when ≤ threshold.
        fp, fn: false positives (under D) and false negatives (under D') on the second half.
        n_d, n_dprime: second-half draws under D and under D'.
        fpr_hi, fnr_hi: their Clopper–Pearson upper limits (each at alpha/2).
        alpha: the level used.
        delta: δ.
        mu_hat: the µ the point rates imply for a Gaussian trade-off (:func:`fitted_mu`;
            a description, not a bound).
    """

    eps: float
    threshold: float
    direction: int
    fp: int
    fn: int
    n_d: int
    n_dprime: int
    fpr_hi: float
    fnr_hi: float
    alpha: float
    delta: float
    mu_hat: float


def _errors(sx: np.ndarray, sy: np.ndarray, t: np.ndarray, direction: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """(false positives under D, false negatives under D') of the tests at thresholds t.

    sx, sy sorted. direction +1: guess D' iff s ≥ t; −1: iff s ≤ t.
    """
    if direction > 0:
        fp = sx.size - np.searchsorted(sx, t, side="left")  # x >= t
        fn = np.searchsorted(sy, t, side="left")  # y < t
    else:
        fp = np.searchsorted(sx, t, side="right")  # x <= t
        fn = sy.size - np.searchsorted(sy, t, side="right")  # y > t
    return fp, fn


def eps_lower_bound(s_d: np.ndarray, s_dprime: np.ndarray, *, delta: float,
                    alpha: float = DEFAULT_ALPHA, max_thresholds: int = MAX_THRESHOLDS
                    ) -> LowerBound:
    """Black-box ε lower bound from draws of a scalar statistic under D and under D'.

    The draws of each side are split in halves (first half: choose; second half:
    evaluate). On the first halves every candidate threshold (up to ``max_thresholds``
    quantiles of the pooled draws, all distinct values when fewer) and both directions
    are scored by the bound they would give there; the best test is then evaluated on
    the second halves with Clopper–Pearson upper limits at ``alpha/2`` each. The order
    of the draws must be random (i.i.d. draws are).

    Args:
        s_d: statistic of the outputs under D, shape ``(n,)``.
        s_dprime: statistic under D', shape ``(m,)``.
        delta: δ of the claim, in [0, 1).
        alpha: the error of the bound (pass the Bonferroni-corrected level).
        max_thresholds: candidate thresholds tried.

    Returns:
        The :class:`LowerBound`.

    Raises:
        ValueError: fewer than 4 draws a side, NaN in the statistic, bad alpha or δ.
    """
    _check_alpha(alpha)
    _check_delta(delta)
    x = np.asarray(s_d, dtype=np.float64).ravel()
    y = np.asarray(s_dprime, dtype=np.float64).ravel()
    if x.size < 4 or y.size < 4:
        raise ValueError(f"need at least 4 draws a side, got {x.size} and {y.size}")
    if np.isnan(x).any() or np.isnan(y).any():
        raise ValueError("the statistic has NaN values")
    hx, hy = x.size // 2, y.size // 2
    x1, x2 = np.sort(x[:hx]), np.sort(x[hx:])
    y1, y2 = np.sort(y[:hy]), np.sort(y[hy:])
    pooled = np.unique(np.concatenate([x1, y1]))
    if pooled.size > max_thresholds:
        pooled = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, max_thresholds),
                                       method="inverted_cdf"))
    best = (-1.0, 0.0, 1)
    for direction in (1, -1):
        fp, fn = _errors(x1, y1, pooled, direction)
        score = eps_from_rates(cp_upper(fp, x1.size, alpha / 2), cp_upper(fn, y1.size, alpha / 2),
                               delta)
        i = int(np.argmax(score))
        if score[i] > best[0]:
            best = (float(score[i]), float(pooled[i]), direction)
    _, t, direction = best
    fp_a, fn_a = _errors(x2, y2, np.array([t]), direction)
    fp, fn = int(fp_a[0]), int(fn_a[0])
    fpr_hi = float(cp_upper(fp, x2.size, alpha / 2))
    fnr_hi = float(cp_upper(fn, y2.size, alpha / 2))
    eps = float(eps_from_rates(fpr_hi, fnr_hi, delta))
    return LowerBound(eps=eps, threshold=t, direction=direction, fp=fp, fn=fn, n_d=x2.size,
                      n_dprime=y2.size, fpr_hi=fpr_hi, fnr_hi=fnr_hi, alpha=alpha, delta=delta,
                      mu_hat=fitted_mu(fp / x2.size, fn / y2.size))


def mean_difference_direction(out_d: np.ndarray, out_dprime: np.ndarray) -> np.ndarray:
    """The unit vector along ``mean(out_dprime) − mean(out_d)`` (rows are draws).

    For Gaussian outputs with a common isotropic covariance, projecting onto the true
    mean difference is the log-likelihood ratio up to an affine map.

    Returns:
        ``(d,)`` float64 (all zeros when the means coincide).
    """
    a = np.asarray(out_d, dtype=np.float64).reshape(len(out_d), -1)
    b = np.asarray(out_dprime, dtype=np.float64).reshape(len(out_dprime), -1)
    v = b.mean(axis=0) - a.mean(axis=0)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def projected_eps_lower_bound(out_d: np.ndarray, out_dprime: np.ndarray, *, delta: float,
                              alpha: float = DEFAULT_ALPHA) -> LowerBound:
    """:func:`eps_lower_bound` of vector outputs projected onto the mean difference.

    The direction is estimated on the first halves of the draws only (the same halves
    that choose the threshold), so the second halves stay untouched for evaluation.

    Args:
        out_d: ``(n, …)`` outputs under D.
        out_dprime: ``(m, …)`` outputs under D'.
    """
    a = np.asarray(out_d, dtype=np.float64).reshape(len(out_d), -1)
    b = np.asarray(out_dprime, dtype=np.float64).reshape(len(out_dprime), -1)
    v = mean_difference_direction(a[: len(a) // 2], b[: len(b) // 2])
    return eps_lower_bound(a @ v, b @ v, delta=delta, alpha=alpha)


def llr_statistic(log_p: Callable[[np.ndarray], np.ndarray],
                  log_q: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """The log-likelihood ratio ``log q(y) − log p(y)`` as a statistic (large: D').

    Neyman–Pearson: thresholding it is the most powerful test at every level, so it
    is the statistic to use wherever the auditor knows both output distributions.
    """
    def stat(y: np.ndarray) -> np.ndarray:
        return np.asarray(log_q(y), dtype=np.float64) - np.asarray(log_p(y), dtype=np.float64)
    return stat


# ---------------------------------------------------------------------------- integer pmfs
@dataclass(frozen=True, slots=True)
class IntPmf:
    """A probability mass function on the integers ``offset, offset + 1, …``.

    Attributes:
        offset: the smallest integer of the support window.
        probs: float64 masses (sum ≈ 1; tails beyond the window are dropped and their
            mass is reported by :attr:`missing`).
    """

    offset: int
    probs: np.ndarray

    @property
    def support(self) -> np.ndarray:
        """The integers of the window, int64."""
        return np.arange(self.offset, self.offset + self.probs.size, dtype=np.int64)

    @property
    def missing(self) -> float:
        """Mass outside the window: ``1 − Σ probs`` (≥ 0 up to rounding)."""
        return float(max(0.0, 1.0 - self.probs.sum()))

    def shift(self, k: int) -> IntPmf:
        """The pmf of ``Y + k``."""
        return IntPmf(self.offset + int(k), self.probs)

    def __add__(self, other: IntPmf) -> IntPmf:
        """The pmf of the sum of independent variables (convolution)."""
        return IntPmf(self.offset + other.offset, _convolve(self.probs, other.probs))

    def map(self, f: Callable[[np.ndarray], np.ndarray]) -> IntPmf:
        """The pmf of ``f(Y)`` for an integer-valued ``f`` (rounding, modular steps)."""
        vals = np.asarray(f(self.support)).astype(np.int64)
        lo = int(vals.min())
        out = np.zeros(int(vals.max()) - lo + 1)
        np.add.at(out, vals - lo, self.probs)
        return IntPmf(lo, out)

    def log_prob(self, y: np.ndarray) -> np.ndarray:
        """``log P(y)`` (−inf outside the window)."""
        y = np.asarray(y).astype(np.int64)
        idx = y - self.offset
        ok = (idx >= 0) & (idx < self.probs.size)
        out = np.full(y.shape, -np.inf)
        with np.errstate(divide="ignore"):
            out[ok] = np.log(self.probs[idx[ok]])
        return out


def _convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if min(a.size, b.size) <= 512:
        out = np.convolve(a, b)
    else:
        from scipy.signal import fftconvolve
        out = fftconvolve(a, b)
        # FFT round-off is ~1e-16 of the largest mass in every entry: zero what is below
        # 1e-14 of it (moves δ by at most 1e-14 per entry, far below any audited δ)
        out[out < 1e-14 * out.max()] = 0.0
    return out


def convolve_all(pmfs: Sequence[IntPmf]) -> IntPmf:
    """The pmf of the sum of independent variables with these pmfs.

    Raises:
        ValueError: no pmfs.
    """
    if not pmfs:
        raise ValueError("no pmfs to convolve")
    out = pmfs[0]
    for p in pmfs[1:]:
        out = out + p
    return out


def power(pmf: IntPmf, k: int) -> IntPmf:
    """The pmf of the sum of ``k`` i.i.d. copies (repeated squaring: log2(k) convolutions).

    Raises:
        ValueError: k < 1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    result: IntPmf | None = None
    base = pmf
    while True:
        if k & 1:
            result = base if result is None else result + base
        k >>= 1
        if not k:
            break
        base = base + base
    assert result is not None
    return result


def discrete_gaussian_pmf(sigma2: float, *, tail: float = 40.0) -> IntPmf:
    """The table of N_Z(0, σ²): ``P(y) ∝ exp(−y²/(2σ²))`` on |y| ≤ tail·σ + 10.

    The distribution :func:`synth.mechanism.discrete_gaussian` samples (CKS20); σ² = 0
    is the point mass at 0.

    Raises:
        ValueError: σ² negative or not finite.
    """
    if not (0.0 <= sigma2 < math.inf):
        raise ValueError(f"sigma2 must be a finite number >= 0, got {sigma2!r}")
    if sigma2 == 0.0:
        return IntPmf(0, np.ones(1))
    b = int(math.ceil(tail * math.sqrt(sigma2))) + 10
    y = np.arange(-b, b + 1, dtype=np.float64)
    logw = -(y * y) / (2.0 * sigma2)
    w = np.exp(logw - logw.max())
    return IntPmf(-b, w / w.sum())


def skellam_pmf(mu: float, *, tail: float = 40.0) -> IntPmf:
    """The table of Skellam(µ, µ) (difference of two Poisson(µ)): variance 2µ.

    Closed under summation: the sum of K Skellam(µ/K, µ/K) is Skellam(µ, µ)
    (Agarwal, Kairouz & Liu, NeurIPS 2021).

    Raises:
        ValueError: µ negative or not finite.
    """
    if not (0.0 <= mu < math.inf):
        raise ValueError(f"mu must be a finite number >= 0, got {mu!r}")
    if mu == 0.0:
        return IntPmf(0, np.ones(1))
    b = int(math.ceil(tail * math.sqrt(2.0 * mu))) + 10
    y = np.arange(-b, b + 1)
    p = stats.skellam.pmf(y, mu, mu)
    return IntPmf(-b, p / p.sum())


def point_pmf(value: int) -> IntPmf:
    """The point mass at ``value``."""
    return IntPmf(int(value), np.ones(1))


def released_sum_pmf(party_noise: Sequence[IntPmf], counts: Sequence[int], *,
                     survivors: Sequence[int] | None = None,
                     encode: Callable[[np.ndarray], np.ndarray] | None = None,
                     ring: tuple[int, int] | None = None) -> IntPmf:
    """The exact pmf of a released cell of distributed aggregation.

    Party ``j`` holds the integer count ``counts[j]`` and adds independent integer noise
    with pmf ``party_noise[j]``; it sends ``encode(count + noise)`` (identity when None:
    integer sums with no per-party rounding; the pre-fix FedForge sent
    ``rint((count + noise)/Δ)``); the coordinator sums the messages of the ``survivors``
    and decodes in the ring: with ``ring = (lo, w)`` the sum ``S`` comes back as
    ``lo + ((S − lo) mod 2^w)`` (what :func:`synth.protocol.decode_sum` computes).

    Args:
        party_noise: per-party noise pmfs (length K).
        counts: per-party true counts of the cell (length K).
        survivors: positions of the parties whose messages are summed (default all).
        encode: each party's integer encoding of its noisy count, vectorised.
        ring: ``(lo, width_bits)`` of the cell's window, or None (no modular step).

    Returns:
        The pmf of the decoded sum (in code units).

    Raises:
        ValueError: lengths differ, or no survivors.
    """
    if len(party_noise) != len(counts):
        raise ValueError(f"{len(party_noise)} noise pmfs for {len(counts)} counts")
    who = range(len(counts)) if survivors is None else list(survivors)
    if not who:
        raise ValueError("no survivors")
    groups: dict[tuple[int, int], list[int]] = {}
    for j in who:  # parties with the same noise table and count send identical laws
        groups.setdefault((id(party_noise[j]), int(counts[j])), []).append(j)
    msgs = []
    for (_, count), members in groups.items():
        m = party_noise[members[0]].shift(count)
        msgs.append(power(m.map(encode) if encode is not None else m, len(members)))
    total = convolve_all(msgs)
    if ring is not None:
        lo, w = int(ring[0]), int(ring[1])
        mod = 1 << w
        total = total.map(lambda s: lo + np.mod(s - lo, mod))
    return total


# ---------------------------------------------------------------------------- exact profile
def _aligned(p: IntPmf, q: IntPmf) -> tuple[np.ndarray, np.ndarray]:
    lo = min(p.offset, q.offset)
    hi = max(p.offset + p.probs.size, q.offset + q.probs.size)
    a = np.zeros(hi - lo)
    b = np.zeros(hi - lo)
    a[p.offset - lo: p.offset - lo + p.probs.size] = p.probs
    b[q.offset - lo: q.offset - lo + q.probs.size] = q.probs
    return a, b


def hockey_stick(p: IntPmf | np.ndarray, q: IntPmf | np.ndarray, eps: float) -> float:
    """``δ(ε) = max(Σ max(0, P − e^ε Q), Σ max(0, Q − e^ε P))`` on the common support.

    Args:
        p, q: the output pmfs under D and D' (:class:`IntPmf`, or arrays on one support).
        eps: ε ≥ 0 (``inf`` gives the mass of each side outside the other's support).
    """
    a, b = _aligned(p, q) if isinstance(p, IntPmf) else (np.asarray(p, float), np.asarray(q, float))
    return max(_one_way(a, b, eps), _one_way(b, a, eps))


def _one_way(a: np.ndarray, b: np.ndarray, eps: float) -> float:
    if math.isinf(eps):
        return float(a[b <= 0].sum())
    return float(np.maximum(0.0, a - math.exp(eps) * b).sum())


@dataclass(frozen=True, slots=True)
class Pld:
    """A privacy-loss distribution: the law of ``L = log(P(Y)/Q(Y))`` for ``Y ~ P``.

    Attributes:
        losses: finite loss values (float64, sorted).
        probs: their P-masses.
        inf_mass: P-mass where Q = 0 (loss +∞).
    """

    losses: np.ndarray
    probs: np.ndarray
    inf_mass: float

    def delta(self, eps: float) -> float:
        """``δ(ε) = inf_mass + Σ p·(1 − e^(ε − L))₊`` (one direction of the hockey stick)."""
        m = self.losses > eps
        return float(self.inf_mass + np.sum(self.probs[m] * -np.expm1(eps - self.losses[m])))


def pld_from_pmfs(p: IntPmf, q: IntPmf) -> Pld:
    """The privacy-loss distribution of ``P`` against ``Q`` (``Y ~ P``)."""
    a, b = _aligned(p, q)
    keep = a > 0
    fin = keep & (b > 0)
    losses = np.log(a[fin]) - np.log(b[fin])
    order = np.argsort(losses)
    return Pld(losses[order], a[fin][order], float(a[keep & (b <= 0)].sum()))


def compose_plds(plds: Sequence[Pld], *, grid: float = 1e-4) -> Pld:
    """The PLD of independent mechanisms run together: losses add, so the PLDs convolve.

    Each loss is rounded *up* to a multiple of ``grid`` first (a pessimistic
    discretisation, as dp-accounting's), so δ(ε) of the result is ≥ the exact one and
    the ε read from it overstates the exact ε by at most ``len(plds)·grid``.

    Raises:
        ValueError: no PLDs or grid ≤ 0.
    """
    if not plds:
        raise ValueError("no PLDs to compose")
    if not grid > 0:
        raise ValueError(f"grid must be > 0, got {grid!r}")
    idx_pmfs = []
    inf_ok = 1.0
    for pld in plds:
        k = np.ceil(pld.losses / grid - 1e-9).astype(np.int64)
        idx_pmfs.append(IntPmf(0, np.zeros(1)) if k.size == 0
                        else IntPmf(int(k.min()), np.bincount(k - k.min(), weights=pld.probs)))
        inf_ok *= 1.0 - pld.inf_mass
    total = convolve_all(idx_pmfs)
    keep = total.probs > 0
    return Pld((total.support[keep] * grid).astype(np.float64), total.probs[keep],
               float(1.0 - inf_ok))


def _eps_at(delta_fn: Callable[[float], float], delta: float, *, tol: float = 1e-9) -> float:
    """The smallest ε ≥ 0 with ``delta_fn(ε) ≤ delta`` (δ(ε) is non-increasing), by bisection."""
    if delta_fn(0.0) <= delta:
        return 0.0
    if delta_fn(math.inf) > delta:
        return math.inf
    hi = 1.0
    while delta_fn(hi) > delta:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    lo = 0.0
    while hi - lo > tol * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if delta_fn(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def exact_epsilon(p: IntPmf, q: IntPmf, delta: float) -> float:
    """The exact ε of the pair at δ: the smallest ε with ``hockey_stick(p, q, ε) ≤ δ``.

    ``inf`` when more than δ of one side's mass lies outside the other's support
    (a deterministic disclosure). Mass dropped from the pmf windows is not counted:
    keep the windows wide (the tables here keep 40σ).

    Raises:
        ValueError: δ outside [0, 1).
    """
    _check_delta(delta)
    fwd, bwd = pld_from_pmfs(p, q), pld_from_pmfs(q, p)
    return _eps_at(lambda e: max(fwd.delta(e), bwd.delta(e)) if not math.isinf(e)
                   else max(fwd.inf_mass, bwd.inf_mass), delta)


def exact_epsilon_product(pairs: Sequence[tuple[IntPmf, IntPmf]], delta: float, *,
                          grid: float = 1e-4) -> float:
    """The ε at δ of independent coordinates released together (e.g. the two cells that
    change under replace-one): the PLDs of each pair convolve, both directions.

    An upper bound on the exact ε within ``len(pairs)·grid`` (:func:`compose_plds`).

    Raises:
        ValueError: no pairs, δ outside [0, 1).
    """
    _check_delta(delta)
    if not pairs:
        raise ValueError("no pairs")
    if len(pairs) == 1:
        return exact_epsilon(pairs[0][0], pairs[0][1], delta)
    fwd = compose_plds([pld_from_pmfs(p, q) for p, q in pairs], grid=grid)
    bwd = compose_plds([pld_from_pmfs(q, p) for p, q in pairs], grid=grid)
    return _eps_at(lambda e: max(fwd.delta(e), bwd.delta(e)) if not math.isinf(e)
                   else max(fwd.inf_mass, bwd.inf_mass), delta)


# ---------------------------------------------------------------------------- GDP
def gdp_tradeoff(alpha: float | np.ndarray, mu: float) -> float | np.ndarray:
    """The µ-GDP trade-off curve: the least FNR at FPR ``alpha``, ``Φ(Φ⁻¹(1 − α) − µ)``."""
    out = ndtr(ndtri(1.0 - np.asarray(alpha, dtype=np.float64)) - mu)
    return float(out) if np.ndim(out) == 0 else out


def gdp_epsilon(mu: float, delta: float) -> float:
    """ε at δ of a µ-GDP mechanism, by the product's exact conversion
    (:func:`parties.privacy.dp.epsilon_for_delta`, Dong–Roth–Su Cor. 2.13)."""
    from parties.privacy.dp import epsilon_for_delta  # lazily: parties.privacy.dp imports torch

    return float(epsilon_for_delta(mu, delta))


def fitted_mu(fpr: float, fnr: float) -> float:
    """The µ of the Gaussian trade-off through the point ``(fpr, fnr)``:
    ``Φ⁻¹(1 − fpr) − Φ⁻¹(fnr)`` (the larger of the two orderings; ``inf`` at 0 errors)."""
    fpr = min(max(fpr, 0.0), 1.0)
    fnr = min(max(fnr, 0.0), 1.0)
    with np.errstate(invalid="ignore"):  # inf - inf at fpr = fnr = 0 or 1: no fit
        mu = float(ndtri(1.0 - fpr) - ndtri(fnr))
    return mu if not math.isnan(mu) else 0.0


__all__ = [
    "DEFAULT_ALPHA", "IntPmf", "LowerBound", "Pld", "bonferroni", "compose_plds",
    "convolve_all", "cp_lower", "cp_upper", "discrete_gaussian_pmf", "eps_from_rates",
    "eps_lower_bound", "exact_epsilon", "exact_epsilon_product", "fitted_mu", "gdp_epsilon",
    "gdp_tradeoff", "hockey_stick", "llr_statistic", "mean_difference_direction",
    "pld_from_pmfs", "point_pmf", "power", "projected_eps_lower_bound", "released_sum_pmf",
    "skellam_pmf",
]
