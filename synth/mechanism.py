"""The measurement mechanism: Skellam noise on integer marginal counts (pure logic).

Neighbouring relation and sensitivity
-------------------------------------
Replace-one: two datasets are neighbours if one record's values differ. The set of
records and every party's row count are public (row counts travel in the parties' hello
messages, so add/remove-one would be meaningless: presence is not secret). A record
falls into exactly one cell of a clique's histogram, so replacing it moves one count from
one cell to another: L2 sensitivity √2, L1 sensitivity 2.

Noise
-----
Each party adds ``Sk(μ) = Poisson(μ) − Poisson(μ)`` to each of its integer counts
(:func:`measure_party`). The family is closed under summation, so the exact sum that
secure aggregation releases over S surviving parties carries exactly ``Sk(S·μ)`` per cell
(:func:`synth.skellam.released_noise_pmf`). No value is rounded per party: counts and
noise are integers and sum exactly in the ring (:mod:`synth.protocol`).

Each party calibrates μ itself (:func:`synth.skellam.party_mu`) from the plan's ρ share
per clique and its own trust model (:func:`resolve_trust`): K, S_min and ``min_honest``
from its own configuration. A coordinator colluding with ``K − min_honest`` parties
chooses the survivor set, so a sum released over at least S_min parties holds at least
d = S_min + min_honest − K honest ones; each party adds Λ/d, so the honest parties of
every released sum carry the charge ρ, computed from the exact Rényi divergence of the
summed Skellam noise (:func:`synth.skellam.skellam_rho`). Parties refuse to help unmask
a round with fewer than S_min survivors (:func:`check_survivors`).

Noise models (recorded with every run)
--------------------------------------
* ``"distributed"`` (default): μ = Λ/d, Λ the total the charge needs. A party's own
  vector carries only 1/d of it: this model relies on secure aggregation hiding the
  individual vectors.
* ``"local"``: μ = Λ, each party's vector is private on its own; the sum carries K·Λ.

Limits: noise comes from NumPy's ``Generator`` (PCG64, not a CSPRNG; ``rng.poisson`` uses
floating point internally), timing is not constant; both are outside the guarantee.
The discrete Gaussian sampler below is kept for the central reference mechanisms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from synth.accounting import allocate, cdp_epsilon, gaussian_sigma
from synth.skellam import SkellamAccountingError, skellam_noise, skellam_rho

NoiseModel = Literal["distributed", "local"]
NOISE_MODELS: tuple[str, ...] = ("distributed", "local")


# ---------------------------------------------------------------------------- sampler
def discrete_laplace(t: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` i.i.d. draws of the discrete Laplace with scale ``t``: P(y) ∝ exp(−|y|/t).

    Drawn as the difference of two i.i.d. geometric variables with success
    probability ``1 − exp(−1/t)`` (the same law as CKS20 Algorithm 2, vectorised).

    Args:
        t: scale, a positive integer.
        size: number of draws.
        rng: the generator.

    Returns:
        ``(size,)`` int64.
    """
    p = -math.expm1(-1.0 / t)
    g1 = rng.geometric(p, size=size).astype(np.int64)
    g2 = rng.geometric(p, size=size).astype(np.int64)
    return g1 - g2


def discrete_gaussian(sigma2: float, size: int | tuple[int, ...],
                      rng: np.random.Generator) -> np.ndarray:
    """Exact-algorithm discrete Gaussian N_Z(0, σ²): P(y) ∝ exp(−y²/(2σ²)) on the integers.

    Canonne, Kamath & Steinke (NeurIPS 2020), Algorithm 3: propose Y from the discrete
    Laplace with scale ``t = floor(σ) + 1`` and accept with probability
    ``exp(−(|Y| − σ²/t)² / (2σ²))``. Rejection runs in rounds over the entries still
    pending, all vectorised (no Python loop over samples); the expected acceptance
    rate is above 0.5 for every σ, so the number of rounds is logarithmic in ``size``.

    Args:
        sigma2: variance parameter σ² ≥ 0 (0 gives zeros). The variance of the output is
            below σ² (CKS20) and within 1e-6 relative of it for σ² ≥ 1.
        size: an int or a shape.
        rng: the generator.

    Returns:
        int64 array of shape ``size``.

    Raises:
        ValueError: σ² negative, NaN or infinite.
    """
    if not isinstance(sigma2, int | float | np.floating | np.integer) or not (
            0.0 <= float(sigma2) < math.inf):
        raise ValueError(f"sigma2 must be a finite number >= 0, got {sigma2!r}")
    shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
    n = int(np.prod(shape, dtype=np.int64))
    out = np.zeros(n, dtype=np.int64)
    sigma2 = float(sigma2)
    if sigma2 == 0.0 or n == 0:
        return out.reshape(shape)
    sigma = math.sqrt(sigma2)
    t = math.floor(sigma) + 1
    pending = np.arange(n)
    while pending.size:
        y = discrete_laplace(t, pending.size, rng)
        gamma = (np.abs(y) - sigma2 / t) ** 2 / (2.0 * sigma2)
        accept = rng.random(pending.size) < np.exp(-gamma)
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    return out.reshape(shape)


def discrete_gaussian_variance(sigma2: float, *, tail: float = 40.0) -> float:
    """The exact variance of N_Z(0, σ²), summed over |y| ≤ tail·σ + 10 (for tests, reports).

    Raises:
        ValueError: σ² not positive and finite.
    """
    if not (0.0 < sigma2 < math.inf):
        raise ValueError(f"sigma2 must be a positive finite number, got {sigma2!r}")
    bound = int(math.ceil(tail * math.sqrt(sigma2))) + 10
    y = np.arange(-bound, bound + 1, dtype=np.float64)
    w = np.exp(-(y ** 2) / (2.0 * sigma2))
    return float(np.sum(y ** 2 * w) / np.sum(w))


# ---------------------------------------------------------------------------- party noise
def _check_model(model: str) -> str:
    if model not in NOISE_MODELS:
        raise ValueError(f"noise model must be one of {NOISE_MODELS}, got {model!r}")
    return model


def _int_counts(counts: np.ndarray) -> np.ndarray:
    arr = np.asarray(counts)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise ValueError("counts must be finite")
        if not np.all(arr == np.round(arr)):
            raise ValueError("counts must be integer-valued")
    elif arr.dtype.kind not in "iub":
        raise ValueError(f"counts must be an integer or float array, got dtype {arr.dtype}")
    ints = arr.astype(np.int64)
    if np.any(ints < 0):
        raise ValueError("counts must be non-negative")
    return ints


def measure_party(counts: np.ndarray, *, mu: float, rng: np.random.Generator) -> np.ndarray:
    """A party's noisy marginal: its integer counts plus ``Sk(mu)`` noise per cell. This is
    the integer vector the party masks (:func:`synth.protocol.quantize_counts` only reduces
    it mod 2^w; nothing is rounded).

    Args:
        counts: the party's marginal counts, any shape, integer-valued (int or float
            dtype), non-negative.
        mu: the Skellam parameter (variance 2μ per cell), from
            :func:`synth.skellam.party_mu`; 0 = no noise (ε = ∞ runs only).
        rng: the party's generator (keep its seed private).

    Returns:
        int64 array of ``counts``' shape (entries may be negative).

    Raises:
        ValueError: non-integer, negative or non-finite counts, or a negative / non-finite μ.
    """
    ints = _int_counts(counts)
    if isinstance(mu, bool) or not (0.0 <= float(mu) < math.inf):
        raise ValueError(f"mu must be a finite number >= 0, got {mu!r}")
    if float(mu) == 0.0:
        return ints
    return ints + skellam_noise(float(mu), ints.shape, rng)


class SurvivorRefusal(RuntimeError):
    """A party refuses to help unmask a round with fewer survivors than its S_min: the sum
    would carry less noise than was charged.

    Attributes:
        survivors: the survivor count asked for.
        min_survivors: the party's S_min.
    """

    def __init__(self, survivors: int, min_survivors: int) -> None:
        self.survivors = survivors
        self.min_survivors = min_survivors
        super().__init__(f"refusing to unmask: {survivors} survivor(s) < min_survivors = "
                         f"{min_survivors} (the sum would carry less noise than charged)")


def check_survivors(n_survivors: int, min_survivors: int) -> None:
    """Raise :class:`SurvivorRefusal` if ``n_survivors < min_survivors``."""
    if int(n_survivors) < int(min_survivors):
        raise SurvivorRefusal(int(n_survivors), int(min_survivors))


def default_min_survivors(n_parties: int) -> int:
    """S_min = ⌈0.7·K⌉: a round survives up to 30 % dropouts."""
    if isinstance(n_parties, bool) or int(n_parties) != n_parties or n_parties < 1:
        raise ValueError(f"n_parties must be an integer >= 1, got {n_parties!r}")
    return max(1, math.ceil(0.7 * int(n_parties) - 1e-9))


def resolve_min_survivors(configured: int, n_parties: int) -> int:
    """The S_min a party uses: ``configured`` (> 0) or the default for K, checked
    ``1 <= S_min <= K``.

    Raises:
        SkellamAccountingError: S_min > K or < 1.
    """
    s = int(configured) if configured else default_min_survivors(n_parties)
    if not 1 <= s <= int(n_parties):
        raise SkellamAccountingError(f"min_survivors = {s} must be in [1, K = {n_parties}]")
    return s


def default_min_honest(n_parties: int) -> int:
    """The default ``min_honest``: ⌈0.7·K⌉ honest, non-colluding parties (the same
    figure as the default S_min, :func:`default_min_survivors`)."""
    return default_min_survivors(n_parties)


class TrustModelError(SkellamAccountingError):
    """A trust configuration that leaves no honest party's noise guaranteed in a released
    sum (or a key outside its range): refused, nothing is measured or released.

    Attributes:
        keys: the configuration keys involved (``parties``, ``min_survivors``,
            ``min_honest``).
        values: their resolved values.
    """

    def __init__(self, keys: Sequence[str], values: Sequence[int], why: str) -> None:
        self.keys = tuple(keys)
        self.values = tuple(int(v) for v in values)
        named = ", ".join(f"{k} = {v}" for k, v in zip(self.keys, self.values, strict=True))
        super().__init__(f"{named}: {why}")


@dataclass(frozen=True, slots=True)
class TrustModel:
    """The trust a party's noise is calibrated for (:func:`resolve_trust`).

    Attributes:
        parties: K, from the party's own configuration.
        min_survivors: S_min, the fewest parties whose sum may be released.
        min_honest: the fewest honest, non-colluding parties assumed among the K.
        colluders_tolerated: ``K − min_honest``: parties (sybils included) that may
            collude with the coordinator, the aggregators and each other.
        honest_in_release: d = ``S_min + min_honest − K``, the honest parties every
            released sum is guaranteed to hold: a coordinator colluding with the
            ``K − min_honest`` others chooses the survivor set (it can declare honest
            parties dropped), so a sum over S ≥ S_min parties may hold only
            ``S_min − (K − min_honest)`` honest ones; the colluders' noise is known to
            the adversary and protects nobody.
    """

    parties: int
    min_survivors: int
    min_honest: int
    colluders_tolerated: int
    honest_in_release: int


def resolve_trust(n_parties: int, min_survivors: int = 0, min_honest: int = 0, *,
                  noise_model: str = "distributed") -> TrustModel:
    """The trust model of a party configured for K = ``n_parties`` (0 = the default for
    ``min_survivors`` and ``min_honest``, both ⌈0.7·K⌉). The one place that computes d,
    the honest parties in any released sum; each party's noise share is Λ/d
    (:func:`synth.skellam.party_mu`).

    Under the ``local`` noise model each vector carries the whole noise on its own, so a
    d below 1 is not refused there (the figure is still reported).

    Raises:
        TrustModelError: ``min_survivors`` or ``min_honest`` outside [1, K], or
            (distributed noise) d = S_min + min_honest − K < 1.
    """
    k = int(n_parties)
    if k < 1:
        raise TrustModelError(("parties",), (k,), "must be >= 1")
    s = int(min_survivors) if min_survivors else default_min_survivors(k)
    h = int(min_honest) if min_honest else default_min_honest(k)
    if not 1 <= s <= k:
        raise TrustModelError(("min_survivors", "parties"), (s, k), "min_survivors must be "
                              "in [1, K]")
    if not 1 <= h <= k:
        raise TrustModelError(("min_honest", "parties"), (h, k), "min_honest must be in "
                              "[1, K]")
    d = s + h - k
    if d < 1 and noise_model != "local":
        raise TrustModelError(
            ("min_survivors", "min_honest", "parties"), (s, h, k),
            f"min_survivors + min_honest - parties = {d} < 1: a coordinator colluding with "
            f"{k - h} parties could release a sum over {s} survivors that holds no honest "
            "party's noise besides the record holder's own share; raise min_survivors or "
            "min_honest")
    return TrustModel(parties=k, min_survivors=s, min_honest=h, colluders_tolerated=k - h,
                      honest_in_release=d)


def released_rho(mu_party: float, n_survivors: int, n_cliques: int = 1) -> float:
    """The zCDP ρ actually carried by a released sum of ``n_survivors`` parties' ``Sk(mu)``
    over ``n_cliques`` clique histograms (replace-one, exact Skellam RDP)."""
    return n_cliques * skellam_rho(float(mu_party) * int(n_survivors))


def claimed_epsilon(rho_per_clique: float, n_cliques: int, delta: float) -> float:
    """ε at δ claimed for a round (or a whole plan) of ``n_cliques`` measurements, each
    charged ``rho_per_clique`` zCDP (tight conversion, :func:`synth.accounting.cdp_epsilon`)."""
    return cdp_epsilon(float(rho_per_clique) * int(n_cliques), delta)


def dp_statement(cfg: Any) -> dict[str, Any]:
    """The guarantee FedForge's released aggregates carry, as ``metrics.json``'s ``dp``
    block (``cfg``: a :class:`synth.config.SynthConfig`)."""
    from synth.protocol import secagg_threshold_floor

    k, sec = int(cfg.parties), cfg.secagg
    trust = resolve_trust(k, int(sec.min_survivors), int(sec.min_honest),
                          noise_model=sec.noise_model)
    s_min = trust.min_survivors
    d = trust.honest_in_release
    threshold = secagg_threshold_floor(k, int(sec.degree), int(sec.threshold))
    return {
        "protected_unit": "one record (row) of one party's table",
        "neighbouring_relation": "replace-one: one record's values change; the set of "
                                 "records and every party's row count are public",
        "why": "each party's row count travels in its hello message and in metrics.json, "
               "so the presence of a record is not secret; replace-one is the relation "
               "that holds. A clique histogram then has L2 sensitivity sqrt(2), L1 2.",
        "mechanism": "Skellam noise (Poisson(mu) - Poisson(mu)) per cell and party, "
                     "integer counts + integer noise summed exactly in Z_2^w under secure "
                     "aggregation; each party adds mu = Lambda/honest_in_any_release "
                     "(distributed) so that the honest parties of any released sum carry "
                     "Sk(Lambda), accounted from its exact Renyi divergence and charged as "
                     "zCDP rho (synth.skellam)",
        "noise_model": sec.noise_model,
        "min_survivors": s_min,
        "parties": k,
        "min_honest": trust.min_honest,
        "colluders_tolerated": trust.colluders_tolerated,
        "honest_in_any_release": d,
        "secagg_threshold": threshold,
        "trust": (
            f"K = {k} and the trust model come from each party's own configuration. The "
            f"guarantee holds with any {trust.colluders_tolerated} of the K parties "
            f"(sybils included) colluding with the coordinator and the aggregators: they "
            f"choose the survivor set (the coordinator can declare honest parties dropped), "
            f"so a released sum over >= {s_min} survivors holds at least {d} honest "
            f"parties (min_survivors + min_honest - K), and each party adds 1/{d} of the "
            f"charged noise. More colluders than that, or fewer honest parties than "
            f"min_honest, are outside the guarantee. A session with other than K parties "
            f"or a Shamir threshold below {threshold}, or a plan assuming fewer than "
            f"{trust.min_honest} honest parties, is refused"
            if sec.noise_model == "distributed" else
            f"local model: each party's vector carries the whole charged noise, so the "
            f"guarantee holds whoever colludes; a session with other than K = {k} parties "
            f"or a Shamir threshold below {threshold} is still refused"),
        "epsilon": cfg.epsilon, "delta": cfg.delta,
        "accounting": "zCDP rho per clique = sup over alpha of RDP(alpha)/alpha of the "
                      "released Skellam sum (replace-one, numerically exact on a grid of "
                      "orders to 1000, Agarwal-Kairouz-Liu closed form beyond), composed "
                      "additively; (eps, delta) by the tight CKS20 conversion",
        "adversary": (f"the coordinator, the aggregators, up to K - min_honest = "
                      f"{trust.colluders_tolerated} colluding parties (sybils included), "
                      "the broker and anyone on the wire; unbounded computation; sees "
                      "every message"),
        "secure_aggregation": (
            "masking (pairwise X25519/ChaCha20 masks + Shamir-shared self masks, SecAgg+) "
            "hides each party's noisy vector from everyone unless at least the Shamir "
            "threshold t of its neighbours collude with the coordinator (unmask = tree: "
            "with a leaf aggregator); honest-but-curious aggregation is NOT assumed for "
            "the sum: the released sum alone is DP, and each party's own vector carries "
            f"1/{d} of the noise (distributed model), so privacy of a single vector "
            f"relies on masking: on fewer than t = {threshold} of its neighbours colluding"
            if sec.noise_model == "distributed" else
            "local model: each party's vector is DP on its own; masking is not needed "
            "for the guarantee"),
        "dropouts": "each party refuses to help unmask a round with fewer than "
                    "min_survivors survivors; the survivor set is the coordinator's "
                    "word (it can fake dropouts), which honest_in_any_release accounts "
                    "for, so every released sum carries at least the charged noise",
        "plan_checks": "each party checks every round plan against its session (K) and "
                       "its own configuration (K, budget, min_survivors, min_honest, "
                       "Shamir threshold, noise model, domain) "
                       "and computes its noise itself; a disagreeing plan is refused",
        "domain": ("declared: levels and bins from the data owners' public schema, so no "
                   "record changes them" if cfg.data.domain == "declared" else
                   "inferred from the pooled rows by the launcher: its levels and bin edges "
                   "depend on the records and are NOT covered by this guarantee; declare "
                   "the domain (domain = declared, schema_file) for a guarantee that holds"),
        "outside": ["timing side channels", "floating-point effects in numpy's Poisson "
                    "sampler (not a CSPRNG, not constant time)", "the public row counts "
                    "and the declared domain (schema)", "the coordinator's own code on the "
                    "released sums (post-processing)"],
    }


# ---------------------------------------------------------------------------- planning
@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedMeasurement:
    """One clique's measurement: its ρ share and the central noise it implies.

    Attributes:
        clique: the attributes of the marginal.
        rho: the ρ share (zCDP) spent on it.
        sigma: the Gaussian std of the same ρ, ``sqrt(2) / sqrt(2ρ)`` (L2 sensitivity √2,
            replace-one); the Skellam noise actually used is calibrated by
            :func:`synth.skellam.calibrate_total` and is a little larger.
    """

    clique: tuple[str, ...]
    rho: float
    sigma: float

    @property
    def sigma2(self) -> float:
        """Central variance σ²."""
        return self.sigma ** 2


def plan_measurements(cliques: Sequence[Sequence[str]], rho_total: float,
                      weights: Sequence[float] | None = None) -> tuple[PlannedMeasurement, ...]:
    """Split ``rho_total`` over ``cliques`` and calibrate each one's noise.

    Each clique's histogram has L2 sensitivity √2 under replace-one, so clique i gets
    σ_i = ``gaussian_sigma(ρ_i, √2)`` = 1/sqrt(ρ_i) and the plan is Σρ_i =
    ``rho_total``-zCDP.

    Args:
        cliques: the cliques to measure (each a non-empty sequence of distinct names).
        rho_total: ρ > 0 for the whole plan.
        weights: per-clique weights (default equal); a zero weight is not allowed, since
            a clique measured with ρ = 0 would carry infinite noise.

    Returns:
        One :class:`PlannedMeasurement` per clique, in order.

    Raises:
        ValueError: no cliques, an empty or repeated-attribute clique, a weight count that
            does not match, a non-positive weight, or a bad ``rho_total``.
    """
    cl = [tuple(c) for c in cliques]
    if not cl:
        raise ValueError("no cliques to measure")
    for c in cl:
        if not c or len(set(c)) != len(c):
            raise ValueError(f"a clique must be a non-empty tuple of distinct attributes, got {c!r}")
    ws = [1.0] * len(cl) if weights is None else [float(w) for w in weights]
    if len(ws) != len(cl):
        raise ValueError(f"{len(ws)} weights for {len(cl)} cliques")
    for c, w in zip(cl, ws, strict=True):
        if not (0.0 < w < math.inf):
            raise ValueError(f"weight of clique {c!r} must be positive and finite, got {w!r}")
    shares = allocate(rho_total, ws)
    return tuple(PlannedMeasurement(clique=c, rho=r, sigma=gaussian_sigma(r, math.sqrt(2.0)))
                 for c, r in zip(cl, shares, strict=True))
