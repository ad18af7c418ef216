"""Differential privacy of the passive party's records in PubSub-VFL (pure logic, no I/O).

The guarantee
-------------
* **Protected unit:** one record of the passive party: its feature values (one row of
  its table).
* **Neighbouring relation: replace-one.** Two datasets are neighbours if they differ in
  the feature values of one record; the set of aligned IDs and the row count are the
  same. Add/remove is moot here: the aligned ID set and the row count are shared with
  the active party by design (ID alignment), so presence is not secret; what the
  passive party protects is what its columns say about each record.
* **Adversary:** the active party, the broker and anyone on the wire, together; they
  see every message of the run (embeddings, gradients, reports, heartbeats), may choose
  the labels and the cut-layer gradients they send back (any function of what they have
  seen), and have unbounded computation. They do not see the passive party's process
  memory or its noise seeds.
* **Outside the guarantee:** the active party's labels and features (this guarantee is
  the passive party's; the active party protects its labels itself, with label DP or
  gradient noise: :mod:`parties.privacy.labels`, ``dp.labels`` in ``metrics.json``); timing side channels (how long a batch takes); floating
  point attacks on the samplers (Mironov, CCS 2012: noise comes from torch's MT19937,
  as in Opacus without ``secure_mode``); the public schema and the ID set themselves.

Every path by which a record reaches a message
----------------------------------------------
1. **Its embeddings.** Each published row is clipped to L2 norm C and gets
   N(0, (σ_e C)²) noise per coordinate. Under replace-one a row changes from one vector
   of norm ≤ C to another, so the sensitivity is **2C** and one publication is
   ``(2/σ_e)``-GDP (Dong, Roth & Su, JRSS-B 2022, Thm 2.7). Every attempt of a batch
   (reassignments included) and every evaluation publication counts. A compressed
   encoding of the published rows (``vfl.wire.dtype``, :mod:`parties.algorithms.wire`) is applied
   to the noised rows: post-processing, which changes nothing here.
2. **The bottom model's parameters**, which every later embedding of every record
   reveals: trained with DP-SGD (:mod:`parties.privacy.dpsgd`): per-example gradients clipped to
   C_g, summed, N(0, (σ_g C_g)²) noise, so one step is ``(2/σ_g)``-GDP for each record
   of its batch. A step consumes the forward pass of one publication of the batch (a
   backward needs its forward's graph, which it consumes), so a record takes at most
   as many steps as it has training publications; the accountant charges every
   training publication as one embedding release plus one DP-SGD step,
   ``µ_train² = (2/σ_e)² + (2/σ_g)²``. No amplification by subsampling: the active
   party knows every batch's IDs.
3. **Preprocessing:** with DP on, the passive party's encoders come from a public
   schema (declared ranges and categories, :mod:`parties.data.schema`), never from a pass
   over its rows; non-finite values become the declared fill.
4. **Everything else it sends** (report fields, counts) depends on public data only:
   the encoded width comes from the schema and row counts are public.

All of these are Gaussian mechanisms on the same record, composed adaptively, so
µ-GDP composes exactly: ``µ = sqrt(Σ µ_i²)`` (DRS Cor. 3.3). A record published k
times in training is ``sqrt(k)·µ_train``-GDP; validation and test records (never
trained on) only through their own embeddings. The run is µ-GDP with µ the largest
over all records; (ε, δ) by the exact conversion (DRS Cor. 2.13). The tests check it
against Google's ``dp-accounting`` PLD accountant composing the same mechanisms.

Calibration: the user sets one target (``dp_mu``, or ``dp_epsilon`` at ``dp_delta``);
:func:`plan_from_config` splits µ² between the embeddings (``dp_embedding_share``) and
DP-SGD for the most training publications a record can get, ``K_t = epochs +
dp_reassign_reserve``, checks the validation and test publications, and the accountant
refuses any publication past the plan.

Reassignments are charged when they happen, against a per-record reserve: each epoch
publishes each training record once (a batch's first attempt), and a reassigned attempt
is an *extra* publication of every record of its batch. The passive party counts, in
its own ledger (never from a peer's message), each record's extra publications; before
publishing a reassigned batch it checks that every record of it has an extra left
(``extra + 1 ≤ dp_reassign_reserve``) and otherwise drops the batch for the epoch
(counted, ``reserve_exhausted_batches``). So no record ever gets more than ``epochs``
first attempts plus ``dp_reassign_reserve`` extras, whatever the adversary does to the
schedule (withholding gradients forces reassignments): σ is fixed up front for that
capped count and the µ-GDP bound holds under any adaptive choice of which batches are
reassigned (each publication is a Gaussian mechanism whose σ does not depend on the
schedule; adaptive composition of at most ``K_t`` of them is ``sqrt(K_t)·µ_train``).
Counting extras separately (rather than checking the total against ``K_t``) keeps the
later epochs' first attempts inside the plan: a reassignment can never spend a
publication a later epoch needs.
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
from parties.core.errors import PrivacyBudgetExceeded
from pubsub.config import ConfigError

MECHANISM = "gaussian-gdp-replace-one"

#: L2 sensitivity of a clipped vector under replace-one, in units of its clip norm.
REPLACE_ONE_SENSITIVITY = 2.0


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
    """µ of one Gaussian mechanism with sensitivity Δ and noise std σΔ: ``1/σ`` (DRS Thm 2.7).
    (A clipped row under replace-one has Δ = 2C: see :func:`release_mu`.)

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


def release_mu(noise_multiplier: float) -> float:
    """µ of one release of a vector clipped to norm C with noise std σC, under replace-one
    (sensitivity 2C): ``2/σ``.

    Raises:
        ValueError: ``noise_multiplier`` ≤ 0 or NaN.
    """
    return REPLACE_ONE_SENSITIVITY * gaussian_mu(noise_multiplier)


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The largest µ whose µ-GDP implies (ε, δ)-DP by the exact conversion (rounded down,
    so a µ target derived from an (ε, δ) target never overstates the budget).

    Raises:
        ValueError: ε not positive and finite, or δ outside (0, 1).
    """
    if not (0.0 < epsilon < math.inf):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")

    def f(mu: float) -> float:
        return math.log(max(delta_for_epsilon(epsilon, mu), 1e-300)) - math.log(delta)

    lo, hi = 1e-9, 1.0
    while f(hi) < 0:
        hi *= 2.0
    mu = float(brentq(f, lo, hi, xtol=1e-13, rtol=1e-13, maxiter=500))
    while mu > 0 and delta_for_epsilon(epsilon, mu) > delta:
        mu = math.nextafter(mu, 0.0) * (1 - 1e-12)
    return mu


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Noise multipliers meeting a µ target (see :func:`calibrate`).

    Attributes:
        embed_noise_multiplier: σ_e of the training embedding releases.
        sgd_noise_multiplier: σ_g of the DP-SGD steps.
        eval_noise_multiplier: σ_v of an evaluation record's releases (validation or
            test records are never trained on: their whole budget goes to their own
            ``eval_publications`` releases).
        train_mu: µ of one training publication (release and step), sqrt(µ_e² + µ_g²).
        eval_mu: µ of one evaluation publication, 2/σ_v.
    """

    embed_noise_multiplier: float
    sgd_noise_multiplier: float
    eval_noise_multiplier: float
    train_mu: float
    eval_mu: float


def calibrate(target_mu: float, *, train_publications: int, eval_publications: int,
              embedding_share: float) -> Calibration:
    """Split a µ target between the embedding releases and the DP-SGD steps.

    A training record is published (and stepped) at most ``train_publications`` times:
    its embeddings get ``embedding_share`` of its µ², DP-SGD the rest,
    ``µ_e = sqrt(s/K_t)·µ``, ``µ_g = sqrt((1−s)/K_t)·µ``. An evaluation record (never
    trained on) is published at most ``eval_publications`` times and gets the whole
    target for those: ``µ_v = µ/sqrt(K_v)``. ``σ = 2/µ`` for each (replace-one).
    Rounded so that re-accounting with :func:`account` gives at most the target in
    floating point.

    Raises:
        ValueError: µ not positive and finite, counts < 1, or share outside (0, 1).
    """
    if not (0.0 < target_mu < math.inf):
        raise ValueError(f"target mu must be positive and finite, got {target_mu!r}")
    if train_publications < 1 or eval_publications < 1:
        raise ValueError(f"publication counts must be >= 1, got {train_publications!r}, "
                         f"{eval_publications!r}")
    if not 0.0 < embedding_share < 1.0:
        raise ValueError(f"embedding_share must be in (0, 1), got {embedding_share!r}")
    kt, kv = train_publications, eval_publications
    per_train = target_mu / math.sqrt(kt)
    sigma_e = REPLACE_ONE_SENSITIVITY / (math.sqrt(embedding_share) * per_train)
    sigma_g = REPLACE_ONE_SENSITIVITY / (math.sqrt(1.0 - embedding_share) * per_train)
    sigma_v = REPLACE_ONE_SENSITIVITY * math.sqrt(kv) / target_mu
    for _ in range(10_000):
        if account(kt, sigma_e, sigma_g, train=True) <= target_mu:
            break
        sigma_e = math.nextafter(sigma_e, math.inf) * (1 + 1e-15)
        sigma_g = math.nextafter(sigma_g, math.inf) * (1 + 1e-15)
    while account(kv, sigma_v, sigma_v, train=False) > target_mu:
        sigma_v = math.nextafter(sigma_v, math.inf) * (1 + 1e-15)
    return Calibration(embed_noise_multiplier=sigma_e, sgd_noise_multiplier=sigma_g,
                       eval_noise_multiplier=sigma_v,
                       train_mu=compose_mu([release_mu(sigma_e), release_mu(sigma_g)]),
                       eval_mu=release_mu(sigma_v))


def account(publications: int, embed_noise_multiplier: float, sgd_noise_multiplier: float,
            *, train: bool) -> float:
    """µ of a record published ``publications`` times: each publication one embedding
    release (σ_e) and, for a training record, one DP-SGD step (σ_g); exact µ-GDP
    composition ``sqrt(k · Σ µ_i²)``.
    """
    if publications < 0:
        raise ValueError(f"publications must be >= 0, got {publications!r}")
    per = [release_mu(embed_noise_multiplier)]
    if train:
        per.append(release_mu(sgd_noise_multiplier))
    return math.sqrt(publications) * compose_mu(per)


# ---------------------------------------------------------------------------- plan
#: Default ceiling on a calibrated noise multiplier: a target that needs more noise than
#: this trains nothing useful, and the run refuses to start (``dp_max_noise_multiplier``).
MAX_NOISE_MULTIPLIER = 1000.0


class UnmeetableTarget(ConfigError):
    """The DP target cannot be met with this configuration; nothing was started (a
    :class:`~pubsub.config.ConfigError`: the CLI exits 2).

    Attributes:
        key: the dotted config key at fault (``vfl.dp.mu`` or ``vfl.dp.epsilon``).
        value: its value.
    """

    def __init__(self, key: str, value: object, why: str) -> None:
        self.value = value
        super().__init__(f"vfl.{key}", f"{value!r}: {why}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DpPlan:
    """The DP settings of a run, resolved from its config.

    Attributes:
        noise_multiplier: σ_e of the training embedding releases (noise std σ_e·C).
        sgd_noise_multiplier: σ_g of the DP-SGD steps (noise std σ_g·C_g on the sum).
        eval_noise_multipliers: σ of the releases of each evaluation group (``val``,
            ``test``): their records are never trained on, so each gets its own budget.
        clip_norm: C, the L2 bound of each embedding row.
        grad_clip_norm: C_g, the L2 bound of each per-example parameter gradient.
        delta: δ at which ε is reported.
        target_mu: the µ target (from ``dp_mu`` or ``dp_epsilon``), or None when the
            noise multipliers were configured directly.
        embedding_share: the share of a training record's µ² given to its embeddings.
        planned: most publications per record of each group (``train``, ``val``,
            ``test``) the calibration covers; the accountant refuses more. Empty when the
            noise multipliers were configured directly (nothing is capped).
        reassign_reserve: extra (reassigned) training publications each record may get
            over the whole run beyond one per epoch (``dp_reassign_reserve``); a
            reassigned batch holding a record whose reserve is spent is dropped for the
            epoch. None when the noise multipliers were configured directly (uncapped).
    """

    noise_multiplier: float
    sgd_noise_multiplier: float
    clip_norm: float
    grad_clip_norm: float
    delta: float
    target_mu: float | None
    embedding_share: float | None
    planned: Mapping[str, int]
    eval_noise_multipliers: Mapping[str, float]
    reassign_reserve: int | None = None

    def release_mu(self) -> dict[str, float]:
        """µ of one publication of a record of each group: a training publication is an
        embedding release and a DP-SGD step; an evaluation one a release only."""
        ev = release_mu(self.noise_multiplier)
        return {"train": compose_mu([ev, release_mu(self.sgd_noise_multiplier)]),
                **{g: release_mu(s) for g, s in self.eval_noise_multipliers.items()}}

    @property
    def planned_publications(self) -> int | None:
        """The largest per-record cap over the groups (None: uncapped)."""
        return max(self.planned.values()) if self.planned else None


def target_mu_of(cfg: VflConfig) -> float | None:
    """The run's µ target: ``dp_mu``, or ``dp_epsilon`` at ``dp_delta`` converted exactly
    (rounded down); None when DP is off or the noise is configured directly."""
    if cfg.dp.epsilon is not None:
        return mu_for_epsilon(cfg.dp.epsilon, cfg.dp.delta)
    if cfg.dp.mu is None or math.isinf(cfg.dp.mu):
        return None
    return cfg.dp.mu


def plan_from_config(cfg: VflConfig) -> DpPlan | None:
    """The run's :class:`DpPlan`, or None when DP is off.

    With a target, the noise is calibrated (:func:`calibrate`) for
    ``epochs + dp_reassign_reserve`` training publications per record (each epoch
    publishes each training batch once; reassigned attempts are extra publications,
    at most ``dp_reassign_reserve`` per record over the run, enforced by the
    accountant's reserve: see the module docstring), ``V`` publications of each
    validation record
    (:func:`validation_publications`) and one of each test record.

    Raises:
        UnmeetableTarget: the calibrated noise exceeds ``dp_max_noise_multiplier``.
    """
    if cfg.dp.noise_multiplier is not None:
        assert cfg.dp.sgd_noise_multiplier is not None  # the config requires both
        return DpPlan(noise_multiplier=cfg.dp.noise_multiplier,
                      sgd_noise_multiplier=cfg.dp.sgd_noise_multiplier,
                      clip_norm=cfg.dp.clip_norm, grad_clip_norm=cfg.dp.grad_clip_norm,
                      delta=cfg.dp.delta, target_mu=None, embedding_share=None, planned={},
                      eval_noise_multipliers={"val": cfg.dp.noise_multiplier,
                                              "test": cfg.dp.noise_multiplier})
    target = target_mu_of(cfg)
    if target is None:
        return None
    reserve = reassign_reserve_of(cfg)
    kt = cfg.epochs + reserve
    kv = validation_publications(cfg)
    cal = calibrate(target, train_publications=kt, eval_publications=max(kv, 1),
                    embedding_share=cfg.dp.embedding_share)
    test = calibrate(target, train_publications=kt, eval_publications=1,
                     embedding_share=cfg.dp.embedding_share)
    worst = max(cal.embed_noise_multiplier, cal.sgd_noise_multiplier,
                cal.eval_noise_multiplier)
    if worst > cfg.dp.max_noise_multiplier:
        key = "epsilon" if cfg.dp.epsilon is not None else "mu"
        raise UnmeetableTarget(
            f"dp.{key}", getattr(cfg.dp, key),
            f"meeting it over {kt} training publications per record (epochs + "
            f"dp.reassign_reserve) and {kv} validation publications needs a noise "
            f"multiplier of {worst:.4g}, above dp.max_noise_multiplier="
            f"{cfg.dp.max_noise_multiplier:g}; raise the target, or train fewer epochs or "
            f"with a smaller dp.reassign_reserve")
    return DpPlan(noise_multiplier=cal.embed_noise_multiplier,
                  sgd_noise_multiplier=cal.sgd_noise_multiplier, clip_norm=cfg.dp.clip_norm,
                  grad_clip_norm=cfg.dp.grad_clip_norm, delta=cfg.dp.delta, target_mu=target,
                  embedding_share=cfg.dp.embedding_share,
                  planned={"train": kt, "val": kv, "test": 1},
                  eval_noise_multipliers={"val": cal.eval_noise_multiplier,
                                          "test": test.eval_noise_multiplier},
                  reassign_reserve=reserve)


def reassign_reserve_of(cfg: VflConfig) -> int:
    """The reassignment reserve the plan covers: ``dp_reassign_reserve``, but no more
    than the schedule can use: 0 where the passive party never reassigns a batch (an
    algorithm other than ``pubsub``, or ``t_ddl_s = 0``: nothing is dropped), and at most
    ``epochs × max_reassign``."""
    if cfg.algo != "pubsub" or cfg.timeouts.t_ddl_s <= 0:
        return 0
    return min(cfg.dp.reassign_reserve, cfg.epochs * cfg.timeouts.max_reassign)


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


def party_noise_secret(secret: int | None, party: str) -> int | None:
    """The noise secret of passive party ``party`` from the run's ``dp_noise_seed``: the
    seed itself for the first passive party (``passive``), an independent child of it for
    ``passive2`` … (None stays None: fresh OS entropy). Several passive parties with one
    configured seed would otherwise draw the same noise, and under ``fuse = sum`` the
    active party could cancel it between two parties' embeddings."""
    if secret is None or party == "passive":
        return secret
    index = int(party.removeprefix("passive"))
    child = np.random.SeedSequence([secret, 0x9A, index])
    return int(child.generate_state(1, dtype=np.uint64)[0] >> 1)  # < 2**63, as configured


def sgd_seed(noise_seed: int) -> int:
    """The DP-SGD generator's seed of a worker, derived from its embedding noise seed
    (independent streams of one secret)."""
    child = np.random.SeedSequence([noise_seed, 0x5D]).spawn(1)[0]
    return int(child.generate_state(1, dtype=np.uint64)[0])


# ---------------------------------------------------------------------------- accountant
class GdpAccountant:
    """Per-record publication ledger and µ-GDP accountant of the passive party.

    Counts, for each record of each group, how often it was published; a record of
    group g published k times is ``sqrt(k)·µ_g``-GDP, µ_g the µ of one publication of
    that group (:meth:`DpPlan.release_mu`); the run is the largest over all records.

    Args:
        sizes: records per group; the passive party uses ``"train"`` (counted per batch
            attempt), ``"val"`` (the scored validation rows, once per validation
            scoring) and ``"test"`` (the whole split, once, at the end).
        release_mu: µ of one publication per group, or None when nothing is noised
            (µ = inf; counts are kept).
        max_publications: per group, refuse publications beyond this count per record
            (missing group or None: no cap).
        reserve: per group, the extra publications (``record(..., extra=True)``: a
            reassigned batch) each record may get over the run; :meth:`admits_extra`
            says whether a batch fits, :meth:`record` refuses past it (missing group or
            None: extras are not limited beyond the cap).

    Attributes:
        reserve_refusals: per group, the batches :meth:`admits_extra` turned away (the
            caller dropped them: ``reserve_exhausted_batches`` in the report).

    Raises:
        ValueError: a group size < 0, a µ not positive and finite, a cap or reserve < 0,
            or a group without a µ.
    """

    def __init__(self, sizes: Mapping[str, int], *, release_mu: Mapping[str, float] | None,
                 max_publications: Mapping[str, int] | None = None,
                 reserve: Mapping[str, int] | None = None) -> None:
        if release_mu is not None:
            for g in sizes:
                mu = release_mu.get(g)
                if mu is None or not (0.0 < mu < math.inf):
                    raise ValueError(f"group {g!r} needs a positive finite mu, got {mu!r}")
        caps = dict(max_publications or {})
        if any(c < 0 for c in caps.values()):
            raise ValueError(f"max_publications must be >= 0, got {caps!r}")
        if any(n < 0 for n in sizes.values()):
            raise ValueError(f"group sizes must be >= 0, got {dict(sizes)!r}")
        self.release_mu = None if release_mu is None else {g: float(release_mu[g])
                                                            for g in sizes}
        self.max_publications = {g: int(c) for g, c in caps.items() if g in sizes}
        self._counts = {g: np.zeros(int(n), dtype=np.int64) for g, n in sizes.items()}
        self._max = dict.fromkeys(self._counts, 0)
        self.batches = dict.fromkeys(self._counts, 0)
        res = dict(reserve or {})
        if any(r < 0 for r in res.values()):
            raise ValueError(f"reserve must be >= 0, got {res!r}")
        self.reserve = {g: int(r) for g, r in res.items() if g in sizes}
        self._extra = {g: np.zeros(int(sizes[g]), dtype=np.int64) for g in self.reserve}
        self.reserve_refusals = dict.fromkeys(self.reserve, 0)

    def admits_extra(self, group: str, rows: np.ndarray | None = None) -> bool:
        """True if every record of ``rows`` (None: all) of ``group`` has an extra
        publication left in its reserve (always True for a group without a reserve).
        False counts one refusal (:attr:`reserve_refusals`): the caller drops the batch
        instead of publishing it."""
        extra = self._extra.get(group)
        if extra is None:
            return True
        sel = extra if rows is None else extra[rows]
        if int(sel.max(initial=0)) + 1 <= self.reserve[group]:
            return True
        self.reserve_refusals[group] += 1
        return False

    def extra_max(self, group: str) -> int:
        """The most extra publications of one record of ``group`` so far (0 without a
        reserve)."""
        extra = self._extra.get(group)
        return 0 if extra is None else int(extra.max(initial=0))

    def record(self, group: str, rows: np.ndarray | None = None, *, extra: bool = False) -> None:
        """Count one publication of the records ``rows`` of ``group`` (None: all of them);
        ``extra``: a reassigned attempt, also counted against the group's reserve.

        Call it *before* publishing: it raises instead of counting when the cap (or the
        reserve) would be passed, so a refused publication must not happen.

        Raises:
            KeyError: unknown group.
            PrivacyBudgetExceeded: a record would pass its group's cap or reserve.
        """
        if extra and group in self._extra:
            ex = self._extra[group]
            new_extra = int((ex if rows is None else ex[rows]).max(initial=0)) + 1
            if new_extra > self.reserve[group]:
                raise PrivacyBudgetExceeded(f"{group} (reassignment reserve)", new_extra,
                                            self.reserve[group])
            self._record(group, rows)
            if rows is None:
                ex += 1
            else:
                ex[rows] += 1
            return
        self._record(group, rows)

    def _record(self, group: str, rows: np.ndarray | None) -> None:
        counts = self._counts[group]
        cap = self.max_publications.get(group)
        if cap is None:
            if rows is None:
                counts += 1
            else:
                counts[rows] += 1
            self._max[group] = -1  # stale: recomputed by group_max
            self.batches[group] += 1
            return
        sel = counts if rows is None else counts[rows]
        new_max = int(sel.max(initial=0)) + 1
        if new_max > cap:
            raise PrivacyBudgetExceeded(group, new_max, cap)
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

    def group_mu(self, group: str) -> float:
        """µ spent on the most published record of ``group``."""
        k = self.group_max(group)
        if k == 0:
            return 0.0
        if self.release_mu is None:
            return math.inf
        return math.sqrt(k) * self.release_mu[group]

    @property
    def mu(self) -> float:
        """µ spent so far: the largest over all records (``inf`` without noise, 0 before
        any publication)."""
        return max((self.group_mu(g) for g in self._counts), default=0.0)

    def epsilon(self, delta: float) -> float:
        """ε spent at ``delta`` (exact GDP conversion of :attr:`mu`)."""
        return epsilon_for_delta(self.mu, delta)

    def state_dict(self) -> dict[str, Any]:
        """The ledger as plain data (counts as int64 arrays), for checkpoints."""
        state: dict[str, Any] = {"mechanism": MECHANISM, "release_mu": self.release_mu,
                                 "max_publications": dict(self.max_publications),
                                 "counts": {g: c.copy() for g, c in self._counts.items()},
                                 "batches": dict(self.batches)}
        if self.reserve:
            state["reserve"] = dict(self.reserve)
            state["extra"] = {g: c.copy() for g, c in self._extra.items()}
            state["reserve_refusals"] = dict(self.reserve_refusals)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ledger saved by :meth:`state_dict`.

        Raises:
            ValueError: another mechanism, release µ, caps or group layout.
        """
        if state.get("mechanism") != MECHANISM:
            raise ValueError(f"cannot load a {state.get('mechanism')!r} ledger into a "
                             f"{MECHANISM!r} accountant")
        for key in ("release_mu", "max_publications", "reserve"):
            if (state.get(key) or {}) != (getattr(self, key) or {}):
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
        saved_extra = state.get("extra") or {}
        self._extra = {g: (np.asarray(saved_extra[g], dtype=np.int64).copy()
                           if g in saved_extra else np.zeros_like(self._counts[g]))
                       for g in self.reserve}
        refusals = state.get("reserve_refusals") or {}
        self.reserve_refusals = {g: int(refusals.get(g, 0)) for g in self.reserve}


def accountant_for(plan: DpPlan | None, sizes: Mapping[str, int]) -> GdpAccountant:
    """The passive party's ledger for ``plan`` (None: DP off, counts only)."""
    if plan is None:
        return GdpAccountant(sizes, release_mu=None)
    mus = plan.release_mu()
    reserve = ({"train": plan.reassign_reserve}
               if plan.reassign_reserve is not None and "train" in sizes else None)
    return GdpAccountant(sizes, release_mu={g: mus[g] for g in sizes},
                         max_publications={g: c for g, c in plan.planned.items() if g in sizes},
                         reserve=reserve)


#: The guarantee, as recorded in ``metrics.json`` (see the module docstring).
GUARANTEE: dict[str, Any] = {
    "protected_unit": "one record of the passive party: its feature values",
    "neighbouring": "replace-one: the feature values of one record change; the aligned ID "
                    "set and the row count are public (shared by ID alignment by design)",
    "adversary": "the active party, the broker and anyone on the wire, together: they see "
                 "every message, choose the labels and the cut-layer gradients, and have "
                 "unbounded computation; not the passive party's memory or noise seeds",
    "paths": ["embeddings: clip C, Gaussian noise sigma*C, sensitivity 2C",
              "bottom-model parameters: DP-SGD, per-example clip C_g, noise sigma_g*C_g, "
              "sensitivity 2C_g, one step per training publication at most",
              "preprocessing: encoders from the public schema, nothing fitted on rows",
              "report fields and counts: public data only"],
    "accounting": "exact mu-GDP composition (Dong-Roth-Su 2022) over every publication "
                  "(reassignments and evaluations included), no amplification by "
                  "subsampling; exact (epsilon, delta) conversion",
    "outside": ["the active party's labels and features (its labels: dp.labels, the active "
                "party's own protection)", "timing side channels",
                "floating-point attacks on the noise samplers (torch MT19937)",
                "the public schema and the aligned ID set"],
}


def report(plan: DpPlan | None, acct: GdpAccountant | None) -> dict[str, Any]:
    """The ``dp`` section of ``metrics.json``.

    With DP off, ``enabled`` is false and ``mu``, ``epsilon``, ``delta`` are None
    (µ = ∞: no privacy). ``mu``/``epsilon`` are the budget actually *spent* (from the
    ledger); when the ledger is missing (the passive report never arrived) they are None.
    ``publications_planned`` is the plan's cap per record of each group and
    ``publications_max_<group>`` the most any record got; ``reassign_reserve`` the extra
    training publications each record may get (``dp_reassign_reserve``),
    ``reassign_reserve_spent_max`` the most extras any record got and
    ``reserve_exhausted_batches`` the reassigned batches dropped because a record's
    reserve was spent.
    """
    counts = ({"publications_max": acct.publications_max,
               "publications_max_train": acct.group_max("train"),
               "publications_max_test": acct.group_max("test"),
               "publications_max_val": acct.group_max("val") if "val" in acct.batches else 0,
               "published_batches": acct.batches.get("train", 0),
               "published_evaluations": acct.batches.get("val", 0) + acct.batches.get("test", 0),
               "reassign_reserve_spent_max": acct.extra_max("train"),
               "reserve_exhausted_batches": acct.reserve_refusals.get("train", 0)}
              if acct is not None else {"publications_max": None})
    if plan is None:
        return {"enabled": False, "mu": None, "epsilon": None, "delta": None,
                "noise_multiplier": None, "clip_norm": None, "target_mu": None,
                "publications_planned": None, "reassign_reserve": None, **counts}
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
        "sgd_noise_multiplier": plan.sgd_noise_multiplier,
        "eval_noise_multipliers": dict(plan.eval_noise_multipliers),
        "clip_norm": plan.clip_norm,
        "grad_clip_norm": plan.grad_clip_norm,
        "embedding_share": plan.embedding_share,
        "release_mu": plan.release_mu(),
        "publications_planned": dict(plan.planned) or None,
        "reassign_reserve": plan.reassign_reserve,
        **counts,
        "guarantee": GUARANTEE,
    }


__all__ = [
    "GUARANTEE", "MAX_NOISE_MULTIPLIER", "MECHANISM", "REPLACE_ONE_SENSITIVITY", "Calibration",
    "DpPlan", "EmbeddingPrivatizer", "GdpAccountant", "PrivacyBudgetExceeded",
    "UnmeetableTarget", "account", "accountant_for", "calibrate", "clip_rows", "compose_mu",
    "delta_for_epsilon", "epsilon_for_delta", "gaussian_mu", "gaussian_noise_like",
    "mu_for_epsilon", "plan_from_config", "reassign_reserve_of", "release_mu", "report",
    "sgd_seed",
    "target_mu_of", "validation_publications", "worker_seeds",
]
