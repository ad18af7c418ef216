"""The Skellam mechanism and its exact Rényi accounting (pure logic, no I/O).

Noise family
------------
``Sk(μ)`` is ``Poisson(μ) − Poisson(μ)``: integer-valued, symmetric, variance ``2μ``, and
closed under summation: the sum of independent ``Sk(μ_1), ..., Sk(μ_S)`` is
``Sk(μ_1 + ... + μ_S)`` (a sum of Poissons is Poisson). So when each of S surviving
parties adds ``Sk(μ)`` to its integer counts and secure aggregation releases only the
exact sum, the released noise is exactly ``Sk(S·μ)``: no approximation (Agarwal, Kairouz
& Liu, "The Skellam Mechanism for Differentially Private Federated Learning", NeurIPS
2021).

Neighbouring relation and sensitivity
-------------------------------------
Replace-one: one record's values change; the set of records and every party's row count
are public (counts travel in the hello messages). One clique's histogram then changes by
−1 in one cell and +1 in another (L2 sensitivity √2, L1 2), or not at all.

Exact accounting
----------------
For a released cell noise ``N ~ Sk(Λ)`` the Rényi divergence of order α of a +1 shift is
``D_α(Sk(Λ)+1 || Sk(Λ)) = log(Σ_k q(k−1)^α q(k)^(1−α)) / (α−1)`` with ``q`` the Skellam
pmf ``q(k) = e^(−2Λ) I_|k|(2Λ)`` (computed as ``scipy.special.ive(|k|, 2Λ)``). A −1 shift
gives the same value (``q`` is symmetric), so a replace-one neighbour (one cell +1,
another −1, independent noise per cell) has RDP ``ε(α) = 2·D_α(Sk(Λ)+1 || Sk(Λ))``,
computed numerically by :func:`skellam_rdp` on the orders of :data:`ALPHAS`.

Budget unit: the project keeps a zCDP ρ budget (:mod:`synth.accounting`). A measurement
is charged :func:`skellam_rho`, the smallest ρ with ``ε(α) ≤ α·ρ`` for EVERY α > 1:

* for α up to ``ALPHA_MAX``: ε(α) is computed on the grid ``1 < α_0 < ... = ALPHA_MAX``
  (α − 1 geometric from 1e-4, 160 orders); between two grid orders a < b we use that
  ``E(α) = (α−1)·ε(α)`` is convex in α (it is a cumulant generating function of the
  privacy loss), so ``E`` lies below its chord ``A + Bα`` and
  ``ε(α)/α ≤ (A + Bα)/(α(α−1))``, maximised exactly over ``[a, b]`` (end points and the
  root of ``Bα² + 2Aα − A = 0``); on ``(1, α_0]`` the chord starts at ``E(1) = 0``;
* beyond ``ALPHA_MAX``: the closed-form bound of Agarwal, Kairouz & Liu (Thm 3.5, integer
  orders; used at ``⌈α⌉`` by monotonicity), :func:`akl_rdp_bound`.

An order whose numerical sum is not reliable (the tilted mass reaches the edge of the
range where the pmf is representable) falls back to the closed form as well. Then the
measurement is ρ-zCDP, ρ composes additively, and the tight zCDP → (ε, δ) conversion of
:func:`synth.accounting.cdp_epsilon` applies unchanged: the printed ε is a bound on the
actual mechanism, never on an approximation below it. Calibration
(:func:`calibrate_total`) picks the smallest total Λ whose charge is within a target ρ.

Too little noise to account (``Λ < MIN_TOTAL_MU``) is refused with
:class:`SkellamAccountingError`.
"""

from __future__ import annotations

import functools
import math

import numpy as np

#: orders of the numerical RDP grid: 1.01^j up to ALPHA_MAX
ALPHA_MAX = 1000.0
ALPHAS: np.ndarray = 1.0 + np.geomspace(1e-4, ALPHA_MAX - 1.0, 160)
#: the smallest total Skellam parameter Λ (released variance 2Λ) this module accounts
MIN_TOTAL_MU = 0.5
#: log-space margin below the peak at which a term counts as negligible at the range edge
EDGE_MARGIN = 40.0
#: the L2² and L1 sensitivities of one clique histogram under replace-one
SENS_L2SQ = 2.0
SENS_L1 = 2.0


class SkellamAccountingError(ValueError):
    """A Skellam configuration this module cannot account (refused, nothing released)."""


def _check_mu(name: str, mu: float) -> float:
    if isinstance(mu, bool) or not isinstance(mu, int | float | np.floating | np.integer):
        raise SkellamAccountingError(f"{name} must be a number, got {mu!r}")
    mu = float(mu)
    if not (0.0 < mu < math.inf):
        raise SkellamAccountingError(f"{name} must be positive and finite, got {mu!r}")
    return mu


# ---------------------------------------------------------------------------- sampling
def skellam_noise(mu: float, size: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """``size`` i.i.d. draws of ``Sk(μ) = Poisson(μ) − Poisson(μ)`` (int64; variance 2μ).

    Raises:
        SkellamAccountingError: μ not positive and finite.
    """
    mu = _check_mu("mu", mu)
    return rng.poisson(mu, size).astype(np.int64) - rng.poisson(mu, size).astype(np.int64)


# ---------------------------------------------------------------------------- pmf
def skellam_logpmf(k: np.ndarray, mu: float) -> np.ndarray:
    """log P(N = k) for ``N ~ Sk(μ)``: ``log ive(|k|, 2μ)`` (−inf where it underflows)."""
    from scipy.special import ive

    mu = _check_mu("mu", mu)
    with np.errstate(divide="ignore"):
        return np.log(ive(np.abs(np.asarray(k, dtype=np.float64)), 2.0 * mu))


def released_noise_pmf(mu_party: float, n_survivors: int, support: np.ndarray) -> np.ndarray:
    """The exact pmf of the noise in one released cell when ``n_survivors`` parties each
    added ``Sk(mu_party)``: ``Sk(n_survivors·mu_party)`` at the integers ``support``.

    Raises:
        SkellamAccountingError: a bad μ or survivor count.
    """
    if isinstance(n_survivors, bool) or int(n_survivors) != n_survivors or n_survivors < 1:
        raise SkellamAccountingError(f"n_survivors must be an integer >= 1, got {n_survivors!r}")
    return np.exp(skellam_logpmf(np.asarray(support), _check_mu("mu_party", mu_party)
                                 * int(n_survivors)))


# ---------------------------------------------------------------------------- RDP
def akl_rdp_bound(alpha: float, variance: float, l2sq: float = SENS_L2SQ,
                  l1: float = SENS_L1) -> float:
    """Agarwal, Kairouz & Liu (NeurIPS 2021) closed-form RDP bound of the Skellam mechanism
    at integer order α: ``αΔ₂²/(2σ²) + min(((2α−1)Δ₂² + 6Δ₁)/(4σ⁴), 3Δ₁/(2σ²))`` with σ²
    the total variance (2Λ). Non-integer α is rounded up (RDP is monotone in α)."""
    a = math.ceil(alpha)
    s2 = float(variance)
    return a * l2sq / (2 * s2) + min(((2 * a - 1) * l2sq + 6 * l1) / (4 * s2 ** 2),
                                     3 * l1 / (2 * s2))


@functools.lru_cache(maxsize=256)
def _rdp_curve(mu_total: float) -> tuple[np.ndarray, np.ndarray]:
    """(ε(α) on ALPHAS for a replace-one histogram, mask of orders computed numerically)."""
    from scipy.special import logsumexp

    sd = math.sqrt(2.0 * mu_total)
    lim = int(ALPHA_MAX + 40.0 * sd + 60)
    k = np.arange(-lim, lim + 2)
    lq = skellam_logpmf(k, mu_total)
    ok = np.isfinite(lq) & (lq > -700.0)
    idx = np.flatnonzero(ok)
    lq = lq[idx[0]:idx[-1] + 1]  # contiguous (the pmf is log-concave)
    lq_prev, lq_cur = lq[:-1], lq[1:]  # q(k−1), q(k)
    out = np.empty(ALPHAS.size)
    numeric = np.zeros(ALPHAS.size, dtype=bool)
    for chunk in np.array_split(np.arange(ALPHAS.size), 8):
        a = ALPHAS[chunk][:, None]
        terms = a * lq_prev[None, :] + (1.0 - a) * lq_cur[None, :]
        tot = logsumexp(terms, axis=1)
        edge = np.maximum(terms[:, 0], terms[:, -1])
        good = edge < tot - EDGE_MARGIN
        d = tot / (a[:, 0] - 1.0)
        for j, i in enumerate(chunk):
            if good[j]:
                out[i] = 2.0 * max(d[j], 0.0)
                numeric[i] = True
            else:  # the sum reaches the edge of the representable range: closed form
                out[i] = akl_rdp_bound(ALPHAS[i], 2.0 * mu_total)
    out.setflags(write=False)
    numeric.setflags(write=False)
    return out, numeric


def skellam_rdp(mu_total: float) -> tuple[np.ndarray, np.ndarray]:
    """RDP of one replace-one clique measurement with released noise ``Sk(mu_total)`` per
    cell: ``(ALPHAS, ε(α))``, ``ε(α) = 2·D_α(Sk+1 || Sk)`` computed from the pmf (orders
    whose sum is numerically unreliable use :func:`akl_rdp_bound`).

    Raises:
        SkellamAccountingError: ``mu_total`` below :data:`MIN_TOTAL_MU` or not finite.
    """
    mu_total = _check_mu("mu_total", mu_total)
    if mu_total < MIN_TOTAL_MU:
        raise SkellamAccountingError(
            f"total Skellam parameter {mu_total!r} (variance {2 * mu_total!r}) is below "
            f"{MIN_TOTAL_MU}: too little noise to account")
    eps, _ = _rdp_curve(mu_total)
    return ALPHAS, eps


def skellam_rho(mu_total: float) -> float:
    """The zCDP ρ charged for one clique measured with released noise ``Sk(mu_total)``:
    the smallest ρ with ``ε(α) ≤ α·ρ`` for every α > 1 (see the module docstring).

    Raises:
        SkellamAccountingError: too little noise to account.
    """
    alphas, eps = skellam_rdp(mu_total)
    grid = _chord_sup(np.concatenate([[1.0], alphas]),
                      np.concatenate([[0.0], (alphas - 1.0) * eps]))
    a = float(alphas[-1])
    s2 = 2.0 * float(mu_total)
    # beyond the grid: AKL at ⌈α⌉ ≤ α + 1; both of its terms, divided by α, decrease in α
    tail = ((a + 1) * SENS_L2SQ / (2 * s2)
            + min(((2 * (a + 1) - 1) * SENS_L2SQ + 6 * SENS_L1) / (4 * s2 ** 2),
                  3 * SENS_L1 / (2 * s2))) / a
    return max(grid, tail)


def _chord_sup(alphas: np.ndarray, e: np.ndarray) -> float:
    """sup over α in [alphas[0], alphas[-1]] of chord(α)/(α(α−1)), with chord the piecewise
    linear interpolation of the convex ``E = (α−1)ε(α)`` at the grid (an upper bound on
    ``E``, hence on ``ε(α)/α``)."""
    best = 0.0
    for i in range(len(alphas) - 1):
        a, b = float(alphas[i]), float(alphas[i + 1])
        bb = (float(e[i + 1]) - float(e[i])) / (b - a)
        aa = float(e[i]) - bb * a
        cands = [b]
        if a > 1.0:
            cands.append(a)
        else:  # first piece, E(1) = 0: f(α) = B/α, largest as α → 1
            cands.append(a)
            best = max(best, bb)
        if bb != 0.0:
            disc = aa * aa + aa * bb
            if disc >= 0.0:
                for r in ((-aa + math.sqrt(disc)) / bb, (-aa - math.sqrt(disc)) / bb):
                    if a < r < b:
                        cands.append(r)
        for x in cands:
            if x > 1.0:
                best = max(best, (aa + bb * x) / (x * (x - 1.0)))
    return best


@functools.lru_cache(maxsize=1024)
def calibrate_total(rho: float) -> float:
    """The smallest total Skellam parameter Λ (released variance 2Λ per cell) whose charge
    :func:`skellam_rho` is at most ``rho`` (to a relative 1e-4 of the noise).

    Raises:
        SkellamAccountingError: ρ not positive and finite, or so large that the noise
            needed is below :data:`MIN_TOTAL_MU`.
    """
    rho = _check_mu("rho", rho)
    lo_mu = SENS_L2SQ / (4.0 * rho)  # the Gaussian's variance 2Λ = Δ₂²/(2ρ): a lower bound
    if lo_mu < MIN_TOTAL_MU:
        raise SkellamAccountingError(
            f"rho={rho!r} per clique needs less noise (Λ={lo_mu!r}) than this module "
            f"accounts (Λ >= {MIN_TOTAL_MU})")
    hi = lo_mu
    for _ in range(60):
        if skellam_rho(hi) <= rho:
            break
        hi *= 1.0 + max(skellam_rho(hi) / rho - 1.0, 1e-4) * 1.5
    else:  # pragma: no cover
        raise SkellamAccountingError(f"cannot calibrate Skellam noise for rho={rho!r}")
    lo = lo_mu
    while hi - lo > 1e-4 * hi:  # invariant: skellam_rho(hi) <= rho
        mid = 0.5 * (lo + hi)
        if skellam_rho(mid) <= rho:
            hi = mid
        else:
            lo = mid
    return hi


def party_mu(rho: float, honest: int, *, model: str = "distributed") -> float:
    """μ of the ``Sk(μ)`` each party adds per cell: ``μ·d ≥ calibrate_total(rho)`` with
    d = ``honest`` (``distributed``), or ``μ = calibrate_total(rho)`` (``local``: each
    party's vector alone is charged at most ``rho`` per clique).

    ``honest`` is d, the honest parties every released sum is guaranteed to hold
    (:func:`synth.mechanism.resolve_trust`: ``S_min + min_honest − K``): only their noise
    protects a record against a coordinator colluding with the other parties, so their
    shares alone must carry the total Λ. (Before the trust model this was S_min, which
    holds only when no party colludes.)

    Raises:
        SkellamAccountingError: a bad ρ, ``honest`` < 1, or an unknown model.
    """
    if isinstance(honest, bool) or int(honest) != honest or honest < 1:
        raise SkellamAccountingError(f"honest parties in a release must be an integer >= 1, "
                                     f"got {honest!r}")
    if model not in ("distributed", "local"):
        raise SkellamAccountingError(f"unknown noise model {model!r}")
    total = calibrate_total(rho)
    s = 1 if model == "local" else int(honest)
    mu = total / s
    while mu * s < total:  # float rounding: the honest parties' sum must carry the total
        mu = math.nextafter(mu, math.inf)
    return mu


__all__ = ["ALPHAS", "ALPHA_MAX", "MIN_TOTAL_MU", "SENS_L1", "SENS_L2SQ",
           "SkellamAccountingError", "akl_rdp_bound", "calibrate_total", "party_mu",
           "released_noise_pmf", "skellam_logpmf", "skellam_noise", "skellam_rdp",
           "skellam_rho"]
