"""Gaussian differential privacy on the passive party's embeddings (pure logic, no I/O).

Mechanism
---------
Before publishing, the passive party clips each embedding row to L2 norm ``C``
(``dp_clip_norm``) and adds i.i.d. Gaussian noise ``N(0, (σC)²)`` to every
coordinate (σ = ``noise_multiplier``). Clipping is part of the forward function,
so the cut-layer gradient flows back through it; the noise is additive, so
``d published / d clipped`` is the identity.

Accounting (pinned so that results compare)
-------------------------------------------
µ-GDP, Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 84(1), 2022:

* Neighbouring datasets differ by adding or removing one record, and each
  published row is a function of one record only, so one publication of a
  record's embedding has L2 sensitivity ``C`` and, with noise std ``σC``, is
  ``(1/σ)``-GDP (DRS Thm. 2.7).
* Every publication counts: each attempt of a batch (reassignments included)
  and each publication of the test split for evaluation. Records are counted
  individually; training rows and test rows are different records, each with
  its own count.
* Mechanisms compose as ``µ = sqrt(Σ µ_i²)`` (DRS Cor. 3.3), so a record
  published ``k`` times is ``sqrt(k)/σ``-GDP and the run is
  ``sqrt(k_max)/σ``-GDP with ``k_max`` the largest count over all records.
* Batches are disjoint shuffles of the training rows; no amplification by
  subsampling is claimed.
* The (ε, δ) conversion is exact (DRS Cor. 2.13): a µ-GDP mechanism is
  (ε, δ(ε))-DP for all ε ≥ 0 with
  ``δ(ε) = Φ(−ε/µ + µ/2) − e^ε Φ(−ε/µ − µ/2)``.

Why not a library accountant at run time: without subsampling, the composition
of Gaussian mechanisms is exactly Gaussian, so µ is a closed form and the
(ε, δ) conversion is one equation. Opacus's GDP accountant models Poisson- or
uniformly-subsampled DP-SGD through a central-limit approximation (at sample
rate 1 it gives ``sqrt(k(e^{1/σ²}−1))``, not the exact ``sqrt(k)/σ``), and its
``eps_from_mu`` is the same Cor. 2.13 solved in linear space on ε ∈ [0, 500].
We solve it in log space (``scipy.special.log_ndtr``) for any µ. The tests
cross-check our numbers against Google's ``dp-accounting`` privacy-loss-
distribution accountant composing the same Gaussian mechanisms.

Limits: noise comes from torch's CPU generator (MT19937, not a CSPRNG) and
floating-point sampling attacks (Mironov, CCS 2012) are not mitigated, as in
Opacus without ``secure_mode``. Only the passive party's features are
protected: the active party's gradients (which depend on its labels) are not
noised.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.special import log_ndtr

from parties.config import VflConfig
from parties.errors import PrivacyBudgetExceeded

MECHANISM = "gaussian-gdp"


# ---------------------------------------------------------------------------- mechanism
def clip_rows(h: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Scale each row of ``h`` to L2 norm at most ``clip_norm`` (differentiable).

    ``h_i · min(1, C / ‖h_i‖₂)``; rows already inside the ball are unchanged and
    all-zero rows stay zero.

    Args:
        h: ``(B, d)`` float tensor (may carry a graph).
        clip_norm: C > 0.

    Returns:
        ``(B, d)`` tensor of the same dtype, every row norm ≤ C (up to float rounding).

    Raises:
        ValueError: ``h`` is not 2-D or ``clip_norm`` is not a positive finite number.
    """
    if h.dim() != 2:
        raise ValueError(f"expected a (B, d) tensor, got shape {tuple(h.shape)}")
    if not (0.0 < clip_norm < math.inf):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm!r}")
    norms = torch.linalg.vector_norm(h, dim=1, keepdim=True)
    factor = (clip_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
    return h * factor


def gaussian_noise_like(h: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """I.i.d. ``N(0, std²)`` noise of ``h``'s shape and dtype (no graph).

    Raises:
        ValueError: ``std`` is negative or not finite.
    """
    if not (0.0 <= std < math.inf):
        raise ValueError(f"noise std must be a finite number >= 0, got {std!r}")
    noise = torch.randn(h.shape, generator=generator, dtype=h.dtype, device=h.device)
    return noise.mul_(std)


class EmbeddingPrivatizer:
    """Clip-and-noise of embedding rows with its own seeded generator.

    Args:
        clip_norm: C, the L2 bound of each row.
        noise_multiplier: σ; the noise std is σ·C per coordinate.
        seed: seed of this privatizer's generator (keep it secret from the active party:
            anyone who knows it can regenerate and subtract the noise).

    Raises:
        ValueError: ``clip_norm`` or ``noise_multiplier`` not positive and finite.
    """

    def __init__(self, *, clip_norm: float, noise_multiplier: float, seed: int) -> None:
        if not (0.0 < noise_multiplier < math.inf):
            raise ValueError(f"noise_multiplier must be positive and finite, "
                             f"got {noise_multiplier!r}")
        if not (0.0 < clip_norm < math.inf):
            raise ValueError(f"clip_norm must be positive and finite, got {clip_norm!r}")
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Privatize a batch of embeddings.

        Args:
            h: ``(B, d)`` float32 embeddings, possibly with a graph.

        Returns:
            ``(clipped, published)``: ``clipped`` keeps the graph (back-propagate the
            cut-layer gradient into it); ``published = clipped + noise`` is detached.
        """
        clipped = clip_rows(h, self.clip_norm)
        noise = gaussian_noise_like(clipped, self.noise_multiplier * self.clip_norm,
                                    self.generator)
        return clipped, clipped.detach() + noise


# ---------------------------------------------------------------------------- GDP analysis
def gaussian_mu(noise_multiplier: float) -> float:
    """µ of one Gaussian mechanism with sensitivity C and noise std σC: ``1/σ`` (DRS Thm 2.7).

    ``σ = inf`` gives 0 (publishes pure noise); there is no σ ≤ 0.

    Raises:
        ValueError: ``noise_multiplier`` ≤ 0 or NaN.
    """
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    return 1.0 / noise_multiplier


def compose_mu(mus: Iterable[float]) -> float:
    """µ of the composition of µ_i-GDP mechanisms: ``sqrt(Σ µ_i²)`` (DRS Cor. 3.3).

    Raises:
        ValueError: a µ_i is negative or NaN.
    """
    total = 0.0
    for mu in mus:
        if not mu >= 0:
            raise ValueError(f"each mu must be >= 0, got {mu!r}")
        total += mu * mu
    return math.sqrt(total)


def composed_gaussian_mu(publications: int, noise_multiplier: float) -> float:
    """µ of ``publications`` Gaussian publications of a record with multiplier σ:
    ``sqrt(k)/σ``, i.e. :func:`compose_mu` of ``k`` copies of ``1/σ`` in closed form.

    Calibration and accounting both use this one expression, so a calibrated σ
    re-accounts to at most the target in floating point too.

    Raises:
        ValueError: ``publications`` < 0 or σ ≤ 0.
    """
    if publications < 0:
        raise ValueError(f"publications must be >= 0, got {publications!r}")
    gaussian_mu(noise_multiplier)  # validates σ
    return math.sqrt(publications) / noise_multiplier


def _log_delta(eps: float, mu: float) -> float:
    """``log δ(ε)`` of µ-GDP (DRS Cor. 2.13), stable for large ε and µ."""
    la = float(log_ndtr(-eps / mu + mu / 2))
    lb = float(log_ndtr(-eps / mu - mu / 2))
    x = eps + lb - la  # log(e^ε Φ(b) / Φ(a)) < 0
    if x >= 0:  # only by rounding, where δ is ~0
        return -math.inf
    # log(1 - e^x), accurate on both sides of -log 2
    log1mexp = math.log(-math.expm1(x)) if x > -math.log(2) else math.log1p(-math.exp(x))
    return la + log1mexp


def delta_for_epsilon(eps: float, mu: float) -> float:
    """The exact δ at which a µ-GDP mechanism is (ε, δ)-DP (DRS Cor. 2.13).

    ``δ(ε) = Φ(−ε/µ + µ/2) − e^ε Φ(−ε/µ − µ/2)``.

    Args:
        eps: ε ≥ 0.
        mu: µ ≥ 0 (0: δ = 0; ``inf``: δ = 1).

    Raises:
        ValueError: negative or NaN arguments.
    """
    if not (eps >= 0 and mu >= 0):
        raise ValueError(f"need eps >= 0 and mu >= 0, got eps={eps!r}, mu={mu!r}")
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    if math.isinf(eps):
        return 0.0
    return math.exp(_log_delta(eps, mu))


def epsilon_for_delta(mu: float, delta: float) -> float:
    """The smallest ε ≥ 0 with a µ-GDP mechanism (ε, δ)-DP, by the exact conversion.

    Solves ``δ(ε) = delta`` (DRS Cor. 2.13; δ(ε) is decreasing) in log space and rounds
    ε up, so the returned value never understates the privacy loss.

    Args:
        mu: µ ≥ 0 (``inf``: ε = inf, no privacy).
        delta: δ in (0, 1).

    Returns:
        ε ≥ 0 (0 when ``δ(0) = 2Φ(µ/2) − 1 ≤ delta``).

    Raises:
        ValueError: µ negative/NaN or δ outside (0, 1).
    """
    if not mu >= 0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if math.isinf(mu):
        return math.inf
    if mu == 0 or delta_for_epsilon(0.0, mu) <= delta:
        return 0.0
    target = math.log(delta)

    def f(e: float) -> float:
        return _log_delta(e, mu) - target

    hi = max(1.0, mu * mu)
    while f(hi) > 0:
        hi *= 2.0
    eps = float(brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12, maxiter=500))
    while f(eps) > 0:  # never report an ε at which δ(ε) is above the target
        eps = math.nextafter(eps, math.inf) + 1e-12 * max(1.0, eps)
    return eps


def calibrate_noise_multiplier(target_mu: float, publications: int) -> float:
    """The smallest σ (up to one ulp) with ``publications`` Gaussian publications
    ``target_mu``-GDP: ``σ = sqrt(k)/µ``, rounded up until ``sqrt(k)/σ ≤ µ`` holds in
    floating point.

    Args:
        target_mu: µ > 0, finite.
        publications: k ≥ 1, the most publications any record can get.

    Raises:
        ValueError: µ not positive and finite, or k < 1.
    """
    if not (0.0 < target_mu < math.inf):
        raise ValueError(f"target mu must be positive and finite, got {target_mu!r}")
    if publications < 1:
        raise ValueError(f"publications must be >= 1, got {publications!r}")
    sigma = math.sqrt(publications) / target_mu
    while composed_gaussian_mu(publications, sigma) > target_mu:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


# ---------------------------------------------------------------------------- plan
@dataclass(frozen=True, slots=True, kw_only=True)
class DpPlan:
    """The DP settings of a run, resolved from its config.

    Attributes:
        noise_multiplier: σ (noise std σC per coordinate).
        clip_norm: C, the L2 bound of each embedding row.
        delta: δ at which ε is reported.
        target_mu: the configured µ target, or None when σ was configured directly.
        planned_publications: most publications per record the calibration covers
            (``epochs × (1 + max_reassign)``, the schedule's worst case), or None when σ
            was configured directly (then nothing is capped).
    """

    noise_multiplier: float
    clip_norm: float
    delta: float
    target_mu: float | None
    planned_publications: int | None


def plan_from_config(cfg: VflConfig) -> DpPlan | None:
    """The run's :class:`DpPlan`, or None when DP is off.

    Calibration rule: with a target µ, σ is calibrated for
    ``max(epochs × (1 + max_reassign), V)`` publications per record, the most that
    the run can ever make: each epoch publishes each training batch once, plus at
    most ``max_reassign`` reassigned attempts; the validation rows (held out of
    training) are published once per validation scoring, V times in all
    (:func:`validation_publications`); the test rows once, at the end. So the target holds whatever the deadlines do; the spent µ is
    reported from the actual counts.

    Args:
        cfg: the run config (validated on construction).
    """
    if cfg.dp_noise_multiplier is not None:
        return DpPlan(noise_multiplier=cfg.dp_noise_multiplier, clip_norm=cfg.dp_clip_norm,
                      delta=cfg.dp_delta, target_mu=None, planned_publications=None)
    if cfg.dp_mu is None or math.isinf(cfg.dp_mu):
        return None
    planned = max(cfg.epochs * (1 + cfg.max_reassign), validation_publications(cfg))
    return DpPlan(noise_multiplier=calibrate_noise_multiplier(cfg.dp_mu, planned),
                  clip_norm=cfg.dp_clip_norm, delta=cfg.dp_delta, target_mu=cfg.dp_mu,
                  planned_publications=planned)


def validation_publications(cfg: VflConfig) -> int:
    """V, how often the validation rows are published: once per scoring, i.e. per
    evaluated epoch (every ``eval_every``-th and the last) times ``evals_per_epoch``."""
    evaluated = sum(1 for e in range(cfg.epochs)
                    if (e + 1) % cfg.eval_every == 0 or e == cfg.epochs - 1)
    return evaluated * cfg.evals_per_epoch


def worker_seeds(secret: int | None, n: int) -> list[int]:
    """``n`` independent 64-bit generator seeds from one secret (None: fresh OS entropy).

    The passive party gives one to each worker and one to its evaluation path.
    """
    children = np.random.SeedSequence(secret).spawn(n)
    return [int(c.generate_state(1, dtype=np.uint64)[0]) for c in children]


# ---------------------------------------------------------------------------- accountant
class GdpAccountant:
    """Per-record publication ledger and µ-GDP accountant of the passive party.

    Counts, for each record of each group, how often its embedding was published;
    the run is ``sqrt(k_max)/σ``-GDP (see the module docstring for the rules).

    Args:
        sizes: records per group; the passive party uses ``"train"`` (counted per batch
            attempt), ``"val"`` (the scored validation rows, once per validation
            scoring) and ``"test"`` (the whole split, once, at the end).
        noise_multiplier: σ, or None when nothing is noised (µ = inf; counts are kept).
        max_publications: refuse publications beyond this count per record (None: no cap).

    Raises:
        ValueError: a group size < 0, σ ≤ 0, or a cap < 1.
    """

    def __init__(self, sizes: Mapping[str, int], *, noise_multiplier: float | None,
                 max_publications: int | None = None) -> None:
        if noise_multiplier is not None:
            gaussian_mu(noise_multiplier)  # validates
        if max_publications is not None and max_publications < 1:
            raise ValueError(f"max_publications must be >= 1, got {max_publications!r}")
        if any(n < 0 for n in sizes.values()):
            raise ValueError(f"group sizes must be >= 0, got {dict(sizes)!r}")
        self.noise_multiplier = noise_multiplier
        self.max_publications = max_publications
        self._counts = {g: np.zeros(int(n), dtype=np.int64) for g, n in sizes.items()}
        self._max = dict.fromkeys(self._counts, 0)
        self.batches = dict.fromkeys(self._counts, 0)

    def record(self, group: str, rows: np.ndarray | None = None) -> None:
        """Count one publication of the records ``rows`` of ``group`` (None: all of them).

        Call it *before* publishing: it raises instead of counting when the cap would
        be passed, so a refused publication must not happen.

        Args:
            group: a group given at construction.
            rows: int array of distinct record positions in the group.

        Raises:
            KeyError: unknown group.
            PrivacyBudgetExceeded: a record would pass ``max_publications``.
        """
        counts = self._counts[group]
        if self.max_publications is None:
            # no cap to check: count now, find the maximum when asked (the per-batch
            # max over B rows was a tenth of the passive party's non-compute time)
            if rows is None:
                counts += 1
            else:
                counts[rows] += 1
            self._max[group] = -1  # stale: recomputed by group_max
            self.batches[group] += 1
            return
        sel = counts if rows is None else counts[rows]
        new_max = int(sel.max(initial=0)) + 1
        if new_max > self.max_publications:
            raise PrivacyBudgetExceeded(group, new_max, self.max_publications)
        if rows is None:
            counts += 1
        else:
            counts[rows] += 1
        self._max[group] = max(self._max[group], new_max)
        self.batches[group] += 1

    def publications(self, group: str) -> np.ndarray:
        """A copy of the per-record counts of ``group``, ``(n,)`` int64."""
        return self._counts[group].copy()

    @property
    def publications_max(self) -> int:
        """The largest count over all records of all groups."""
        return max((self.group_max(g) for g in self._max), default=0)

    def group_max(self, group: str) -> int:
        """The largest count over the records of ``group``."""
        if self._max[group] < 0:
            self._max[group] = int(self._counts[group].max(initial=0))
        return self._max[group]

    @property
    def mu(self) -> float:
        """µ spent so far: ``sqrt(k_max)/σ`` (``inf`` without noise, 0 before any publication)."""
        k = self.publications_max
        if k == 0:
            return 0.0
        if self.noise_multiplier is None:
            return math.inf
        return composed_gaussian_mu(k, self.noise_multiplier)

    def epsilon(self, delta: float) -> float:
        """ε spent at ``delta`` (exact GDP conversion of :attr:`mu`)."""
        return epsilon_for_delta(self.mu, delta)

    def state_dict(self) -> dict[str, Any]:
        """The ledger as plain data (counts as int64 arrays), for checkpoints."""
        return {"mechanism": MECHANISM, "noise_multiplier": self.noise_multiplier,
                "max_publications": self.max_publications,
                "counts": {g: c.copy() for g, c in self._counts.items()},
                "batches": dict(self.batches)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ledger saved by :meth:`state_dict`.

        Raises:
            ValueError: another mechanism, noise multiplier, cap or group layout.
        """
        if state.get("mechanism") != MECHANISM:
            raise ValueError(f"cannot load a {state.get('mechanism')!r} ledger into a "
                             f"{MECHANISM!r} accountant")
        for key in ("noise_multiplier", "max_publications"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"ledger {key} {state.get(key)!r} != this accountant's "
                                 f"{getattr(self, key)!r}")
        counts = {g: np.asarray(c, dtype=np.int64) for g, c in state["counts"].items()}
        layout = {g: c.shape for g, c in counts.items()}
        mine = {g: c.shape for g, c in self._counts.items()}
        if layout != mine:
            raise ValueError(f"ledger groups {layout} != this accountant's {mine}")
        self._counts = {g: c.copy() for g, c in counts.items()}
        self._max = {g: int(c.max(initial=0)) for g, c in self._counts.items()}
        self.batches = {g: int(state.get("batches", {}).get(g, 0)) for g in self._counts}


def report(plan: DpPlan | None, acct: GdpAccountant | None) -> dict[str, Any]:
    """The ``dp`` section of ``metrics.json``.

    With DP off, ``enabled`` is false and ``mu``, ``epsilon``, ``delta`` are None
    (µ = ∞: no privacy). ``mu``/``epsilon`` are the budget actually *spent* (from the
    ledger); when the ledger is missing (the passive report never arrived) they are None.
    """
    counts = ({"publications_max": acct.publications_max,
               "publications_max_train": acct.group_max("train"),
               "publications_max_test": acct.group_max("test"),
              "publications_max_val": acct.group_max("val") if "val" in acct.batches else 0,
               "published_batches": acct.batches.get("train", 0),
               "published_evaluations": acct.batches.get("val", 0) + acct.batches.get("test", 0)}
              if acct is not None else {"publications_max": None})
    if plan is None:
        return {"enabled": False, "mu": None, "epsilon": None, "delta": None,
                "noise_multiplier": None, "clip_norm": None, "target_mu": None,
                "publications_planned": None, **counts}
    spent_mu = acct.mu if acct is not None else None
    return {
        "enabled": True,
        "mu": spent_mu,
        "epsilon": epsilon_for_delta(spent_mu, plan.delta) if spent_mu is not None else None,
        "delta": plan.delta,
        "target_mu": plan.target_mu,
        "epsilon_target": (epsilon_for_delta(plan.target_mu, plan.delta)
                           if plan.target_mu is not None else None),
        "noise_multiplier": plan.noise_multiplier,
        "clip_norm": plan.clip_norm,
        "publications_planned": plan.planned_publications,
        **counts,
        "accounting": "per-record mu-GDP (Dong-Roth-Su 2022): add/remove neighbours, "
                      "sensitivity C, every publication counted (reassignments and "
                      "evaluations included), no subsampling amplification, "
                      "mu = sqrt(k_max)/sigma, exact (eps, delta) conversion",
    }


__all__ = [
    "MECHANISM", "DpPlan", "EmbeddingPrivatizer", "GdpAccountant",
    "PrivacyBudgetExceeded", "calibrate_noise_multiplier", "clip_rows", "compose_mu",
    "composed_gaussian_mu",
    "delta_for_epsilon", "epsilon_for_delta", "gaussian_mu", "gaussian_noise_like",
    "plan_from_config", "report", "worker_seeds",
]
