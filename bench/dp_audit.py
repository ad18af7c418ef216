"""Empirical privacy audit: is every ε the product prints at least what its mechanisms leak?

What is measured
----------------
For each *case* (one mechanism configuration the product ships) the audit draws the
product's own outputs under two neighbouring inputs D and D' at the sensitivity bound
of the stated relation, and reports

* ``claim``: ε at the audit's δ = 1e-5 from the product's own accountant (label DP:
  the label ledger's pure ε, δ = 0, which bounds the ε at any δ);
* ``lb``: the black-box ε lower bound, valid at 95 % for the whole run (Bonferroni:
  each of the k cases is tested at 0.05/k): the statistic is the log-likelihood ratio
  of the two output distributions where the auditor knows them (discrete tables) or
  the projection onto the mean-difference direction (Gaussian vector outputs), the
  threshold is chosen on the first half of the draws and evaluated on the second half,
  with Clopper–Pearson limits (:mod:`sim.reports.audit`);
* ``exact`` (discrete mechanisms): the exact ε at δ from the probability tables of the
  released value, with every rounding, summation and modular step
  (:func:`sim.reports.audit.exact_epsilon`), maximised over a grid of neighbouring pairs;
* a *positive control*: the pre-fix behaviour, the mechanism with σ halved (or at a
  larger ε), or the pre-fix (too small) claim, which the same test must catch
  (``lb > claim`` or ``exact > claim``), so that a weak test cannot pass.

Some cases are themselves positive controls (``must_hold = False``): a configuration
outside the product's stated guarantee, e.g. ``fedforge_collusion_h{h}`` with fewer
honest parties h than the trust model's ``min_honest``. Their main side must be caught
(``exact > claim`` or ``lb > claim``); they count among the controls, never among the
cases that must hold (``exact_violations``, ``max_lb_over_claim``).

A sound product gives ``max_lb_over_claim ≤ 1``, ``exact_violations = 0`` and
``controls_detected = controls``.

FedForge's trust model (``synth.mechanism.resolve_trust``): ``fedforge_collusion_h{h}``
(h = 1..10 honest parties at K = 10, the product's defaults, exact from the tables: the
coordinator and the K − h colluders choose the survivors, so the released sum holds
``max(1, S_min − (K − h))`` honest shares), ``fedforge_sybil_session`` (a party
configured for K = 10 handed a 100-ID session must refuse it; control: the pre-fix
party that took K from the session) and ``fedforge_threshold_floor`` (a Shamir threshold
of 1 must be refused; control: the party's own vector unmasked).

VFL label DP (``[vfl.labels] epsilon``, ``parties.privacy.labels``): ``vfl_label_rr_eps1``
and ``vfl_label_rr_eps2`` (randomised response at ε = 1 and 2; replace-one label: the
record's label 0 under D, 1 under D'; the adversary sees the labels the active party
trains on for the record in each epoch, exact from the randomised-response tables;
controls: the product's randomised response at 3ε against the claim for ε, and a fresh
secret every epoch, each copy of the label randomised independently).

Adapters
--------
Where the audit stood in for product functions that did not exist when it was written,
an *adapter* in the ADAPTERS section names the product function it calls. The VFL
adapters now call the fixed product: claims from ``parties.privacy.dp`` (``account``,
``compose_mu``, ``release_mu``, ``epsilon_for_delta``), the DP-SGD step
``parties.privacy.dpsgd.private_grads_with_noise`` (batched noise) followed by the first step of
the product's Adam (``parties.models.model.make_adam``, applied batched and checked against it),
the encoder ``parties.data.preflight.encode_features`` (public schema) and the report width;
the repeated-prediction case charges its releases through ``parties.runtime.predict.charge`` (the
passive party's prediction ledger) and takes the claim it reports (``prediction_mu``);
the label-DP cases take their claim from the active party's label ledger
(``parties.privacy.party.party_dp``, ``parties.privacy.labels.labels_report``) and draw
through ``parties.privacy.labels.label_protection`` and ``ActiveCompute.labels_of``.
The FedForge adapters still point at today's synth code (to be re-pointed). Everything
else calls the product's code: ``parties.privacy.dp.EmbeddingPrivatizer``,
``parties.models.model.party_bottom``, ``synth.mechanism.measure_party``,
``synth.protocol.{quant_range, quant_step, cell_windows, quantize_counts, decode_sum,
RoundPlan}``, ``synth.accounting``. The pre-fix controls run the old behaviour through
their own functions (``vfl_plain_step``, ``_prefix_encode``, ``claim_vfl_embedding_prefix``,
``claim_vfl_repeated_prediction_prefix``, ``prefix_ff_*``).

Usage::

    python bench/dp_audit.py --quick --json /tmp/audit.json   # <= 10 min on 2 cores
    python bench/dp_audit.py                                   # full: 10^5+ draws per case
    python bench/dp_audit.py --only vfl_embedding_1            # a subset (comma-separated)

JSON: ``summary`` has ``cases``, ``max_lb_over_claim``, ``exact_violations``,
``controls`` and ``controls_detected``; ``cases`` holds one record per case (claim,
lb and its test, exact, draws, control) and ``settings`` the run's parameters.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from parties.config import VflConfig  # noqa: E402
from parties.privacy.dp import (  # noqa: E402
    EmbeddingPrivatizer,
    account,
    compose_mu,
    epsilon_for_delta,
    gaussian_mu,
    plan_from_config,
    release_mu,
)
from parties.privacy.dpsgd import private_grads_with_noise  # noqa: E402
from parties.privacy.labels import (  # noqa: E402
    LabelProtection,
    RandomizedResponse,
    label_protection,
    labels_report,
)
from parties.models.model import (  # noqa: E402
    ActiveCompute,
    ParameterServer,
    flat_params,
    make_adam,
    party_bottom,
)
from parties.algorithms.wire import decode_rows, encode_rows  # noqa: E402
from sim.reports.audit import (  # noqa: E402
    IntPmf,
    bonferroni,
    discrete_gaussian_pmf,
    eps_lower_bound,
    exact_epsilon_product,
    gdp_epsilon,
    point_pmf,
    projected_eps_lower_bound,
    released_sum_pmf,
)
from synth.accounting import cdp_epsilon  # noqa: E402
from synth.mechanism import (  # noqa: E402
    SurvivorRefusal,
    check_survivors,
    TrustModel,
    claimed_epsilon,
    measure_party,
    resolve_trust,
)
from synth.plancheck import (  # noqa: E402
    PlanRefused,
    SessionRefused,
    verify_plan,
    verify_session,
)
from synth.protocol import (  # noqa: E402
    RoundPlan,
    cell_modmask,
    cell_windows,
    decode_sum,
    plans_epsilon,
    quantize_counts,
    secagg_threshold_floor,
)
from synth.skellam import (  # noqa: E402
    SENS_L2SQ,
    SkellamAccountingError,
    party_mu,
    released_noise_pmf,
)

DELTA = 1e-5
ALPHA = 0.05


# ============================================================================ ADAPTERS
# Everything the audit assumes about product functions that are being rewritten
# elsewhere lives here. Each ADAPTER says what it stands for and how to re-point it.
#
# Re-pointing checklist (done for both systems):
# * VFL: claim_vfl_embedding / claim_vfl_dpsgd / claim_vfl_train_publication call
#   parties.privacy.dp's accountant; VFL_STEP = vfl_dpsgd_step (private_grads_with_noise + Adam's
#   first step); vfl_encode_features / vfl_report_fields call parties.data.preflight.
#   encode_features with a DP-on VflConfig. Controls: claim_vfl_embedding_prefix,
#   VFL_PREFIX_STEP, _prefix_encode (pre-fix behaviour).
# * FedForge: synth.mechanism.measure_party / claimed_epsilon, synth.skellam,
#   synth.plancheck.verify_plan, synth.protocol. The controls keep the pre-fix pipeline
#   (FF_PREFIX, the removed product code reproduced under ``prefix_ff_*`` names).

def claim_vfl_embedding(sigma: float, releases: int) -> float:
    """ε at δ of ``releases`` publications of one record's clipped embedding at noise
    multiplier σ_e, from the product's accountant: ``parties.privacy.dp.account(k, σ_e, σ_e,
    train=False)`` (k releases of ``release_mu(σ_e) = 2/σ_e``, replace-one), converted by
    ``parties.privacy.dp.epsilon_for_delta``."""
    return epsilon_for_delta(account(releases, sigma, sigma, train=False), DELTA)


def claim_vfl_embedding_prefix(sigma: float, releases: int) -> float:
    """The pre-fix claim (add/remove, sensitivity C): µ = sqrt(k)/σ
    (``parties.privacy.dp.gaussian_mu``, the pre-fix accountant's per-release µ). Kept as the
    positive control."""
    return gdp_epsilon(math.sqrt(releases) * gaussian_mu(sigma), DELTA)


def claim_vfl_dpsgd(sigma_sgd: float, steps: int) -> float:
    """ε at δ of ``steps`` DP-SGD steps in which the record participates, from the
    product's accountant: each step ``parties.privacy.dp.release_mu(σ_g)``-GDP, composed exactly
    by ``parties.privacy.dp.compose_mu``, converted by ``epsilon_for_delta``."""
    return epsilon_for_delta(compose_mu([release_mu(sigma_sgd)] * steps), DELTA)


def claim_vfl_train_publication(sigma_emb: float, sigma_sgd: float, publications: int = 1
                                ) -> float:
    """ε at δ of ``publications`` training publications of a record (its embedding
    release and its DP-SGD step each time): ``parties.privacy.dp.account(k, σ_e, σ_g,
    train=True)``."""
    return epsilon_for_delta(account(publications, sigma_emb, sigma_sgd, train=True), DELTA)


def vfl_label_config(epsilon: float) -> VflConfig:
    """A VflConfig of the bundled ``bank`` dataset (binary task) with label DP on:
    ``[vfl.labels] epsilon = epsilon`` (no gradient defence, OS-entropy secret)."""
    from parties.config import vfl_config

    return vfl_config({"dataset": "bank", "labels": {"epsilon": epsilon}})


def claim_vfl_label_dp(epsilon: float) -> float:
    """ε of one training record's label under ``[vfl.labels] epsilon``, from the product's
    label ledger: the active party's ``parties.privacy.party.party_dp`` (it charges the
    run's one randomised-response release of every training label, whatever the epochs
    and workers), reported by ``parties.privacy.labels.labels_report`` (``dp.labels`` in
    ``metrics.json``). Pure ε-DP (the report's δ is 0, checked), so it is also the ε at
    the audit's δ. Also checks that ``party_dp`` hands its two workers one secret."""
    from types import SimpleNamespace

    from parties.privacy.party import party_dp
    cfg = vfl_label_config(epsilon)
    quiet = SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    dp = party_dp(cfg, "active", "active", 2, {"train": LABEL_ROWS, "val": 0, "test": 0},
                  log=quiet)
    rep = labels_report(cfg.labels, dp.label_ledger)
    assert rep["delta"] == 0.0 and rep["releases"] == 1, rep
    # every worker gets the one label secret (so the same flips: vfl_label_sampler)
    assert len(set(dp.noise_seeds)) == 1 and dp.noise_seeds[0] is not None, dp.noise_seeds
    return float(rep["epsilon"])


#: ADAPTER: FedForge's neighbouring relation as the product states it today
#: (re-pointed: ``synth.mechanism`` states replace-one, row counts public; one clique
#: histogram changes by −1 in one cell and +1 in another: L2 sensitivity √2, L1 2).
FEDFORGE_RELATION = "replace_one"


def claim_fedforge_cell(rho: float, n_cliques: int = 1) -> float:
    """The product's claim: ε at δ of ``n_cliques`` clique measurements each charged
    ``rho`` zCDP (``synth.mechanism.claimed_epsilon``; equal to
    ``synth.protocol.plans_epsilon`` of the plan, checked in :func:`fedforge_plan`)."""
    return claimed_epsilon(rho, n_cliques, DELTA)


def claim_fedforge_prefix(sigma2_central: float) -> float:
    """The pre-fix claim (add/remove, L2 sensitivity 1, Gaussian ρ = 1/(2σ²)), converted by
    the product's ``synth.accounting.cdp_epsilon``: kept for the positive controls."""
    return cdp_epsilon(1.0 / (2.0 * sigma2_central), DELTA)


@dataclass(frozen=True, slots=True, kw_only=True)
class FfConfig:
    """One FedForge cell configuration (what a RoundPlan and the session fix).

    ``sigma2_central`` names the configuration as the issue did: the product charges
    ρ = Δ₂²/(2σ²) = 1/σ² per clique (replace-one, Δ₂² = 2), i.e. the ρ of a Gaussian of
    central variance σ², and calibrates its Skellam noise for that ρ; the pre-fix
    pipeline (controls) added N_Z(0, σ²/K) per party. ``min_survivors`` and
    ``min_honest`` 0 = the product's defaults ⌈0.7 K⌉. ``bits``: the ring-width cap
    (0 = none)."""

    n_parties: int
    sigma2_central: float
    bits: int = 0
    max_party_rows: int = 1000
    min_survivors: int = 0
    min_honest: int = 0

    @property
    def rho(self) -> float:
        """The ρ per clique the product charges for this configuration."""
        return SENS_L2SQ / (2.0 * self.sigma2_central)

    @property
    def trust(self) -> TrustModel:
        """The party's trust model (``synth.mechanism.resolve_trust``): S_min, min_honest
        and d, the honest parties guaranteed in any released sum."""
        return resolve_trust(self.n_parties, self.min_survivors, self.min_honest)

    @property
    def s_min(self) -> int:
        """S_min as the party resolves it (``synth.mechanism.resolve_trust``)."""
        return self.trust.min_survivors

    @property
    def sigma2_party(self) -> float:
        """The pre-fix per-party variance σ²/K (distributed model): controls only."""
        return self.sigma2_central / self.n_parties


@functools.lru_cache(maxsize=None)
def _ff_party_mu(rho: float, honest: int) -> float:
    return party_mu(rho, honest, model="distributed")


def fedforge_party_mu(plan: RoundPlan) -> float:
    """The Skellam μ a party adds per cell for ``plan``, as the party computes it: it
    verifies the plan against its session (K parties) and its own configuration
    (K = the plan's, S_min and min_honest = the plan's, distributed noise, budget
    unlimited) with the product's ``synth.plancheck.verify_plan``, which returns μ
    (``synth.skellam.party_mu`` of d = S_min + min_honest − K).

    Raises:
        PlanRefused, SkellamAccountingError: the product refuses the plan.
    """
    return _ff_verified_mu(plan.n_parties, plan.min_survivors, plan.min_honest,
                           plan.noise_model, plan.step, plan.rho, plan.sigma2_central,
                           plan.vector_len)


@functools.lru_cache(maxsize=None)
def _ff_verified_mu(k: int, s_min: int, min_honest: int, model: str, step: float,
                    rho: float, s2: float, cells: int) -> float:
    return verify_plan(n_parties=k, min_survivors=s_min, min_honest=min_honest,
                       noise_model=model, step=step, rho=rho, sigma2_central=s2,
                       cliques=(("cell",),), sizes=(cells,),
                       session_parties=tuple(f"p{j}" for j in range(k)),
                       domain_shape={"cell": cells}, own_parties=k, own_min_survivors=s_min,
                       own_min_honest=min_honest, own_noise_model="distributed",
                       private=True, remaining_rho=math.inf)


def _skellam_table(mu: float) -> IntPmf:
    b = int(math.ceil(40.0 * math.sqrt(2.0 * mu))) + 10
    support = np.arange(-b, b + 1)
    p = released_noise_pmf(mu, 1, support)
    return IntPmf(-b, p / p.sum())


def fedforge_party_noise_pmf(cfg: FfConfig) -> IntPmf:
    """The table of the integer noise ONE party adds per cell: ``Sk(μ)`` with the μ the
    party computes (:func:`fedforge_party_mu`), from the product's
    ``synth.skellam.released_noise_pmf`` (= ``exp(skellam_logpmf)``), 40σ window."""
    return _skellam_table(fedforge_party_mu(fedforge_plan(cfg, 1)[0]))


def fedforge_plan(cfg: FfConfig, n_cells: int) -> tuple[RoundPlan, np.ndarray]:
    """The RoundPlan the product's coordinator builds for ``n_cells`` cells of this
    configuration (``synth/coord/rounds.py``: μ from ``party_mu`` of d, windows from
    ``cell_windows(sigma_sum = sqrt(2·μ·K), max_bits = bits)``, ``step = 1``,
    ``sigma2_central = 2·S_min·μ``, ``min_honest``), and the cells' window starts for
    ``decode_sum``.

    Raises:
        SkellamAccountingError: ρ needs less noise than the product accounts.
        ValueError: the window needs more than ``bits`` (``cell_windows``).
    """
    trust = cfg.trust
    s_min = trust.min_survivors
    mu = _ff_party_mu(cfg.rho, trust.honest_in_release)
    upper = np.full(n_cells, float(cfg.max_party_rows * cfg.n_parties))
    lo, widths = cell_windows(upper, sigma_sum=math.sqrt(2.0 * mu * cfg.n_parties),
                              uniform=True, max_bits=cfg.bits)
    plan = RoundPlan(round=0, name="audit", cliques=(("cell",),), sizes=(n_cells,),
                     sigma2_central=2.0 * mu * s_min, noise_model="distributed",
                     n_parties=cfg.n_parties, step=1.0, cell_bits=widths.tobytes(),
                     timeout_s=1.0, rho=cfg.rho, min_survivors=s_min,
                     min_honest=trust.min_honest)
    assert plans_epsilon([plan], DELTA) == claim_fedforge_cell(cfg.rho)
    return plan, lo


def fedforge_party_message(counts: np.ndarray, plan: RoundPlan,
                           rng: np.random.Generator) -> np.ndarray:
    """What one party sends for its cells, as ring words: the product's
    ``quantize_counts(measure_party(counts, mu=μ))`` with μ from the verified plan."""
    return quantize_counts(measure_party(counts, mu=fedforge_party_mu(plan), rng=rng), plan)


def fedforge_encode(cfg: FfConfig) -> Callable[[np.ndarray], np.ndarray]:
    """The per-party integer encoding of a noisy count: the identity (exact integer sums
    in the ring, no per-party rounding)."""
    del cfg
    return lambda v: np.asarray(v, dtype=np.int64)


#: Adam's defaults in the product (``parties.models.model.make_adam``: torch.optim.Adam, lr only).
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def adam_first_step(grad: torch.Tensor, lr: float) -> torch.Tensor:
    """The update of one Adam step from a fresh state (what ``torch.optim.Adam`` subtracts):
    ``m̂ = g``, ``v̂ = g²``, ``lr·m̂/(sqrt(v̂) + eps)``, written as torch computes it, so
    that it applies to a leading batch of draws at once. :func:`check_adam_first_step`
    compares it with the product's optimizer (``parties.models.model.make_adam``)."""
    b1, b2 = ADAM_BETAS
    # m / (1 - b1) = g and sqrt(v / (1 - b2)) = |g|, up to float rounding (checked)
    del b1, b2
    return grad.abs().add_(ADAM_EPS).reciprocal_().mul_(grad).mul_(lr)


def check_adam_first_step(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
                          lr: float) -> None:
    """Assert that :func:`adam_first_step` is the product optimizer's first step (one draw)."""
    ps = [torch.nn.Parameter(p.detach().clone()) for p in params.values()]
    opt = make_adam(ps, lr)
    for p, g in zip(ps, grads.values(), strict=True):
        p.grad = g.detach().clone()
    opt.step()
    for p, (n, p0) in zip(ps, params.items(), strict=True):
        ours = p0 - adam_first_step(grads[n], lr)
        if not torch.allclose(p.detach(), ours, rtol=1e-5, atol=1e-7):
            raise AssertionError(f"batched Adam step differs from make_adam on {n}")


def vfl_dpsgd_step(params: dict[str, torch.Tensor], x: torch.Tensor, g: torch.Tensor,
                   noise: dict[str, torch.Tensor], *, model: torch.nn.Module,
                   embed_clip: float, grad_clip: float, sigma: float, lr: float
                   ) -> dict[str, torch.Tensor]:
    """The product's passive step under DP, batched over draws: the DP-SGD gradient of
    ``parties.privacy.dpsgd.private_grads_with_noise`` (the clipped per-example sum computed
    once, ``noise[name]`` of shape ``(n, *param.shape)`` standard normal, noise std
    σ_g·C_g on the sum), then one Adam step from a fresh state with the product's
    hyper-parameters (:func:`adam_first_step`, checked against ``make_adam``). ``g`` is
    the cut-layer gradient of a batch-mean loss. Returns name -> ``(n, *shape)``."""
    grads = private_grads_with_noise(model, params, x, g, noise, embed_clip_norm=embed_clip,
                                     grad_clip_norm=grad_clip, noise_multiplier=sigma)
    return {n: params[n] - adam_first_step(grads[n], lr) for n in params}


def vfl_plain_step(params: dict[str, torch.Tensor], x: torch.Tensor, g: torch.Tensor,
                   noise: dict[str, torch.Tensor], *, model: torch.nn.Module,
                   embed_clip: float, grad_clip: float, sigma: float, lr: float
                   ) -> dict[str, torch.Tensor]:
    """The pre-fix passive step (``PassiveCompute.backward`` before the fix: back-propagate
    the cut-layer gradient, one Adam step from a fresh state; no per-example clipping, no
    noise), as a pure function broadcast to the draws: the positive control."""
    del grad_clip, sigma, embed_clip
    n = next(iter(noise.values())).shape[0]

    def total(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return (torch.func.functional_call(model, p, (x,)) * g).sum()

    grads = torch.func.grad(total)(params)
    return {k: (params[k] - adam_first_step(grads[k], lr)).expand(n, *params[k].shape)
            for k in params}


#: The passive party's columns in the audit (bank's default passive split).
VFL_COLUMNS = ("contact", "day", "month", "duration", "campaign", "pdays", "previous",
               "poutcome")


def vfl_dp_config(**kw: Any) -> VflConfig:
    """A DP-on VflConfig of the bundled ``bank`` dataset (the audit's product settings)."""
    from parties.config import vfl_config

    base: dict[str, Any] = {"dataset": "bank", "dp.mu": 1.0, "epochs": 1,
                            "timeouts.max_reassign": 0}
    base.update(kw)
    return vfl_config(base)


def vfl_encode_features(frame: Any, columns: Sequence[str], train_idx: np.ndarray
                        ) -> np.ndarray:
    """The passive party's encoded training features with DP on, by the product's
    ``parties.data.preflight.encode_features`` (a DP-on VflConfig of ``bank``: the bundled
    public schema, :class:`parties.data.schema.SchemaEncoder`)."""
    from parties.data.preflight import encode_features
    feats = encode_features(vfl_dp_config(), "passive", frame, list(columns), train_idx,
                            np.zeros(0, dtype=np.int64))
    return np.asarray(feats.x_train, dtype=np.float32)


def vfl_report_fields(frame: Any, columns: Sequence[str], train_idx: np.ndarray
                      ) -> dict[str, float]:
    """The value-derived fields of the passive party's report with DP on: ``n_features``
    is ``x_train.shape[1]`` (``parties/runtime/party.py``) of the product's encoder, i.e. the
    public schema's width."""
    return {"n_features": float(vfl_encode_features(frame, columns, train_idx).shape[1])}


#: The product's DP-SGD step, batched over draws.
VFL_STEP: Callable[..., dict[str, torch.Tensor]] = vfl_dpsgd_step
#: The pre-fix step (positive control).
VFL_PREFIX_STEP: Callable[..., dict[str, torch.Tensor]] = vfl_plain_step
# ============================================================================ end of ADAPTERS


# ---------------------------------------------------------------------------- FedForge pipelines
# The pre-fix FedForge pipeline (the positive controls). Its product functions
# (party_noise_variance, quant_range, quant_step, the step-aware cell_windows and the
# rounding quantize_counts, measure_party(σ², K, model)) were removed by the fix, so the
# few lines of each are reproduced here, verbatim in behaviour (git d7c0ba7^1).
def prefix_ff_noise_pmf(cfg: FfConfig) -> IntPmf:
    """Pre-fix per-party noise table: N_Z(0, σ²/K)."""
    return discrete_gaussian_pmf(cfg.sigma2_party)


def _prefix_step(cfg: FfConfig) -> float:
    """Pre-fix ``quant_range`` + ``quant_step`` (``auto_bits`` when ``bits`` = 0)."""
    s2 = cfg.sigma2_party
    pad = math.ceil(6.0 * math.sqrt(s2)) if s2 > 0 else 0
    h_min, h_max = float(-pad), float(cfg.max_party_rows + pad)
    b = cfg.bits
    if not b:
        levels = (h_max - h_min) / math.sqrt(s2) + 1.0 if s2 > 0 else 0.0
        b = int(min(24, max(4, math.ceil(math.log2(levels))))) if s2 > 0 else 24
    return (h_max - h_min) / float((1 << b) - 1)


def prefix_ff_plan(cfg: FfConfig, n_cells: int) -> tuple[RoundPlan, np.ndarray]:
    """Pre-fix plan: windows in code units of Δ (6σ tails plus K/2 rounding)."""
    step = _prefix_step(cfg)
    upper = np.full(n_cells, float(cfg.max_party_rows * cfg.n_parties))
    pad = 6.0 * math.sqrt(cfg.sigma2_central) / step + cfg.n_parties / 2.0
    lo = np.full(upper.shape, math.floor(-pad), dtype=np.int64)
    hi = np.ceil(upper / step + pad).astype(np.int64)
    w = int(max(1, math.ceil(math.log2(float((hi - lo + 1).max())))))
    widths = np.full(n_cells, w, dtype=np.uint8)
    plan = RoundPlan(round=0, name="audit", cliques=(("cell",),), sizes=(n_cells,),
                     sigma2_central=cfg.sigma2_central, noise_model="distributed",
                     n_parties=cfg.n_parties, step=step, cell_bits=widths.tobytes(),
                     timeout_s=1.0)
    return plan, lo


def prefix_ff_message(counts: np.ndarray, plan: RoundPlan,
                      rng: np.random.Generator) -> np.ndarray:
    """Pre-fix party message: N_Z(0, σ²/K) noise, then the code ``rint(x/Δ)`` mod 2^w."""
    from synth.mechanism import discrete_gaussian
    ints = np.asarray(counts, dtype=np.int64)
    noisy = ints + discrete_gaussian(plan.sigma2_central / plan.n_parties, ints.shape, rng)
    q = np.rint(noisy.astype(np.float64) / plan.step).astype(np.int64)
    return q.view(np.uint64) & cell_modmask(plan.widths)


def prefix_ff_encode(cfg: FfConfig) -> Callable[[np.ndarray], np.ndarray]:
    """Pre-fix per-party encoding: ``rint(x/Δ)``."""
    step = _prefix_step(cfg)
    return lambda v: np.rint(np.asarray(v, dtype=np.float64) / step)


@dataclass(frozen=True, slots=True)
class FfPipeline:
    """The four pieces of a FedForge cell pipeline the audit needs."""

    name: str
    noise_pmf: Callable[[FfConfig], IntPmf]
    plan: Callable[[FfConfig, int], tuple[RoundPlan, np.ndarray]]
    message: Callable[[np.ndarray, RoundPlan, np.random.Generator], np.ndarray]
    encode: Callable[[FfConfig], Callable[[np.ndarray], np.ndarray]]


#: The product as shipped.
FF_PRODUCT = FfPipeline("product", fedforge_party_noise_pmf, fedforge_plan,
                        fedforge_party_message, fedforge_encode)
#: The pre-fix pipeline (positive controls).
FF_PREFIX = FfPipeline("prefix", prefix_ff_noise_pmf, prefix_ff_plan, prefix_ff_message,
                       prefix_ff_encode)


def ff_scaled_noise_pipeline(scale: float) -> FfPipeline:
    """The product's pipeline (same plan, same claim) with each party's μ multiplied by
    ``scale`` (1/16: σ quartered): a positive control."""
    def noise_pmf(cfg: FfConfig) -> IntPmf:
        return _skellam_table(scale * fedforge_party_mu(fedforge_plan(cfg, 1)[0]))

    def message(counts: np.ndarray, plan: RoundPlan, rng: np.random.Generator) -> np.ndarray:
        return quantize_counts(measure_party(counts, mu=scale * fedforge_party_mu(plan),
                                             rng=rng), plan)

    return FfPipeline(f"product, mu x {scale:g}", noise_pmf, fedforge_plan, message,
                      fedforge_encode)


def ff_honest_pipeline(honest: int, what: str = "") -> FfPipeline:
    """The product's pipeline (same plan, same claim) with each party's μ calibrated by
    the product's ``synth.skellam.party_mu`` for ``honest`` honest parties in a release
    instead of the party's d: ``honest = S_min`` is the calibration before the trust
    model (μ = Λ/S_min), or, with a session's K, what a party that took K from the
    session computed. A positive control."""
    def noise_pmf(cfg: FfConfig) -> IntPmf:
        return _skellam_table(_ff_party_mu(cfg.rho, honest))

    def message(counts: np.ndarray, plan: RoundPlan, rng: np.random.Generator) -> np.ndarray:
        return quantize_counts(measure_party(counts, mu=_ff_party_mu(plan.rho, honest),
                                             rng=rng), plan)

    return FfPipeline(what or f"product, mu = Lambda/{honest}", noise_pmf, fedforge_plan,
                      message, fedforge_encode)


# ---------------------------------------------------------------------------- case registry
Draws = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """One audited mechanism: how to draw its outputs and what to compare them with.

    Attributes:
        claim: ε at δ the product claims (the accountant's figure), a thunk.
        sample: ``(n, rng) -> (outputs under D, outputs under D')``, rows are draws;
            None: reuse the main side's draws (a control that only changes the claim).
        statistic: scalar statistic of the outputs (e.g. the LLR from the tables), or
            None: project vector outputs onto the mean difference (first half).
        exact: ``() -> ε`` from the probability tables, or None (not discrete).
        what: one line saying what this side is.
    """

    claim: Callable[[], float]
    sample: Callable[[int, np.random.Generator], Draws] | None
    statistic: Callable[[np.ndarray], np.ndarray] | None = None
    exact: Callable[[], float] | None = None
    what: str = ""
    #: FedForge: the product's outcome ("released" or "refused" with its typed error)
    outcome: Callable[[], dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """A case: the mechanism as shipped (``main``) and its positive control."""

    name: str
    group: str
    what: str
    main: Side
    control: Side | None
    draws_quick: int
    draws_full: int
    fast: bool = False  # in the test suite's fast subset
    extra_controls: tuple[Side, ...] = ()  # further positive controls, each must be caught
    tags: tuple[str, ...] = field(default_factory=tuple)
    #: False: the case is itself a positive control (a configuration outside the product's
    #: stated guarantee, e.g. more colluders than ``K − min_honest``): its main side must
    #: be DETECTED (``exact > claim`` or ``lb > claim``); it counts among the controls,
    #: not among the cases that must hold (``exact_violations``, ``max_lb_over_claim``)
    must_hold: bool = True


REGISTRY: dict[str, Case] = {}


def register(case: Case) -> Case:
    """Add ``case`` to :data:`REGISTRY` (names are unique)."""
    if case.name in REGISTRY:
        raise ValueError(f"duplicate case {case.name!r}")
    REGISTRY[case.name] = case
    return case


# ---------------------------------------------------------------------------- VFL embeddings
def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**63 - 1))


def vfl_embedding_sampler(*, sigma: float, releases: int, clip: float = 1.0, dim: int = 4,
                          scale: float = 3.0, wire: str = "float32"
                          ) -> Callable[[int, np.random.Generator], Draws]:
    """Draws of ``releases`` publications of one record's embedding through the product's
    :class:`parties.privacy.dp.EmbeddingPrivatizer`: the row is ``scale·C·e1`` under D and
    ``−scale·C·e1`` under D' (clipped to ±C·e1 by the product: replace-one at the
    sensitivity bound 2C). Output ``(n, releases·dim)``. ``wire``: the noised rows then
    go through the product's wire encoding and back (``parties.algorithms.wire``), as the active
    party receives them under ``vfl.wire.dtype``."""
    def sample(n: int, rng: np.random.Generator) -> Draws:
        out = []
        for sign in (1.0, -1.0):
            priv = EmbeddingPrivatizer(clip_norm=clip, noise_multiplier=sigma, seed=_seed(rng))
            h = torch.zeros(n * releases, dim)
            h[:, 0] = sign * scale * clip
            _, pub = priv(h)
            arr = pub.numpy()
            if wire != "float32":
                arrays, tag = encode_rows(arr, wire)
                arr = decode_rows(arrays, tag)
            out.append(arr.reshape(n, releases * dim))
        return out[0], out[1]
    return sample


def _vfl_embedding_case(name: str, sigma: float, releases: int, fast: bool = False,
                        wire: str = "float32") -> Case:
    on_wire = "" if wire == "float32" else f", sent as {wire} (parties.algorithms.wire)"
    return Case(
        name=name, group="vfl",
        what=f"VFL embedding release, replace-one (±C·e1), sigma={sigma:g}, "
             f"{releases} release(s) of the record{on_wire}",
        main=Side(claim=lambda: claim_vfl_embedding(sigma, releases),
                  sample=vfl_embedding_sampler(sigma=sigma, releases=releases, wire=wire),
                  what="EmbeddingPrivatizer vs the replace-one claim mu = sqrt(k)*2/sigma"
                       + on_wire),
        control=Side(claim=lambda: claim_vfl_embedding_prefix(sigma, releases), sample=None,
                     what="the same draws vs the pre-fix claim mu = sqrt(k)/sigma"),
        draws_quick=1_000_000, draws_full=2_000_000, fast=fast)


register(_vfl_embedding_case("vfl_embedding_1", sigma=1.0, releases=1, fast=True))
register(_vfl_embedding_case("vfl_embedding_k4", sigma=2.0, releases=4))
# compressed on the wire after the noise (post-processing): the same claim must hold
register(_vfl_embedding_case("vfl_embedding_int8", sigma=1.0, releases=1, wire="int8"))


# ---------------------------------------------------------------------------- VFL predictions
#: Predictions of the same rows in the ``vfl_repeated_prediction`` case.
PREDICTIONS = 4


@functools.cache
def vfl_repeated_prediction_product(predictions: int = PREDICTIONS) -> dict[str, float]:
    """``predictions`` predictions of the same three rows of new records, each from its
    own file, through the product's prediction accounting: ``parties.runtime.predict.charge`` on
    a passive saved part (its training ledger after the run's test release, and its
    prediction ledger, in a temporary directory) of a bank ``dp_mu = 1`` run with
    ``dp_predict_max_releases = predictions``. Returns the σ and clip norm of the
    privatizer it hands out for the release, and the µ it reports: ``prediction_mu``
    after the last release (composed over the ID's releases) and ``release_mu`` (one
    release: what the product reported for every file before the fix)."""
    import tempfile
    from types import SimpleNamespace

    import orjson
    from parties.privacy.dp import accountant_for
    from parties.runtime.predict import charge
    from parties.runtime.saved import ledger_to_json

    cfg = vfl_dp_config(**{"dp.predict_max_releases": predictions})
    plan = plan_from_config(cfg)
    assert plan is not None
    acct = accountant_for(plan, {"train": 8, "val": 2, "test": 4})
    acct.record("test")  # the run's own release of its test split
    led = ledger_to_json(acct.state_dict())
    ids = ["c00017", "c00042", "c00099"]
    with tempfile.TemporaryDirectory(prefix="dp_audit_predict_") as tmp:
        (Path(tmp) / "ledger.json").write_bytes(orjson.dumps(led))
        part = SimpleNamespace(cfg=cfg, ledger=led, path=Path(tmp), party="passive",
                               manifest={"dp": {"ledger": "ledger.json"}})
        for i in range(predictions):
            privatize, dp = charge(part, len(ids), f"new-{i}.csv", ids)
    return {"sigma": privatize.noise_multiplier, "clip": privatize.clip_norm,
            "prediction_mu": dp["prediction_mu"], "release_mu": dp["release_mu"]}


def claim_vfl_repeated_prediction() -> float:
    """The product's claim for a record predicted :data:`PREDICTIONS` times: ε at δ of
    the ``prediction_mu`` its ledger reports after the last release."""
    return epsilon_for_delta(vfl_repeated_prediction_product()["prediction_mu"], DELTA)


def claim_vfl_repeated_prediction_prefix() -> float:
    """The pre-fix claim: each file's release reported alone (``release_mu``, µ_test),
    never composed with the earlier predictions of the same rows. Positive control."""
    return epsilon_for_delta(vfl_repeated_prediction_product()["release_mu"], DELTA)


def vfl_repeated_prediction_sampler(n: int, rng: np.random.Generator) -> Draws:
    """Draws of the :data:`PREDICTIONS` releases of one record's embedding through the
    product's ``EmbeddingPrivatizer`` at the σ and clip norm ``charge`` hands out, the
    record's row ±(3C)·e1 under D and D' (replace-one at the bound 2C)."""
    p = vfl_repeated_prediction_product()
    return vfl_embedding_sampler(sigma=p["sigma"], releases=PREDICTIONS, clip=p["clip"])(n, rng)


register(Case(
    name="vfl_repeated_prediction", group="vfl",
    what=f"VFL prediction: {PREDICTIONS} predictions of the same rows of new records (one "
         "file each) through the product's prediction ledger (parties.runtime.predict.charge)",
    main=Side(claim=claim_vfl_repeated_prediction, sample=vfl_repeated_prediction_sampler,
              what="the releases vs the ledger's composed claim, mu_test*sqrt(k)"),
    control=Side(claim=claim_vfl_repeated_prediction_prefix, sample=None,
                 what="the same draws vs the pre-fix per-file claim mu_test"),
    draws_quick=1_000_000, draws_full=2_000_000))


def _vfl_model(d_in: int, *, dim: int = 8, hidden: tuple[int, ...] = (16,)) -> torch.nn.Module:
    """The product's passive bottom model under DP (``parties.models.model.party_bottom``: linear
    output layer), at a fixed torch seed (the same model for every side and control)."""
    torch.manual_seed(0)
    return party_bottom(vfl_dp_config(model={"embedding_dim": dim, "bottom_hidden": hidden}), "passive", d_in)


def _known_direction(h_d: torch.Tensor, h_dprime: torch.Tensor, clip: float) -> torch.Tensor:
    """Unit vector along the difference of the two clipped (noiseless) releases (the
    auditor knows both output distributions: Gaussians around these means), zero when
    they are equal."""
    from parties.privacy.dp import clip_rows
    diff = (clip_rows(h_dprime, clip) - clip_rows(h_d, clip)).reshape(-1)
    norm = float(diff.norm())
    return diff / norm if norm > 0 else diff


def _nan_case() -> Case:
    sigma = 4.0
    cols = list(VFL_COLUMNS)

    def sample(n: int, rng: np.random.Generator) -> Draws:
        """The product path: the canary's raw row (valid under D; NaN / Inf / missing in
        every column under D') through the party's encoder, the DP bottom model and the
        privatizer."""
        frame = _audit_frame(0, rows=4)
        alt = frame.copy()
        for c, v in zip(cols, (None, math.nan, None, math.inf, -math.inf, math.nan, math.nan,
                               None), strict=True):
            alt[c] = alt[c].astype(object)
            alt.at[0, c] = v
        train = np.arange(len(frame))
        xs = [vfl_encode_features(f, cols, train)[:1] for f in (frame, alt)]
        model = _vfl_model(xs[0].shape[1], dim=4)
        with torch.no_grad():
            hs = [model(torch.from_numpy(x)) for x in xs]
        v = _known_direction(hs[0], hs[1], 1.0)
        out = []
        for h in hs:
            priv = EmbeddingPrivatizer(clip_norm=1.0, noise_multiplier=sigma, seed=_seed(rng))
            pub = priv(h.repeat(n, 1))[1].numpy()
            flag = ~np.isfinite(pub).all(axis=1)
            out.append(np.where(flag, 1e6, np.nan_to_num(pub) @ v.numpy())[:, None])
        return out[0], out[1]

    def sample_prefix(n: int, rng: np.random.Generator) -> Draws:
        """The pre-fix path: the encoded row reaches the privatizer as NaN."""
        out = []
        for bad in (False, True):
            priv = EmbeddingPrivatizer(clip_norm=1.0, noise_multiplier=sigma, seed=_seed(rng))
            h = torch.zeros(n, 4)
            h[:, 0] = float("nan") if bad else 1.0
            out.append(priv(h)[1].numpy())
        return out[0], out[1]

    def stat_prefix(y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
        return np.where(np.isnan(y).any(axis=1), 1e6, np.nan_to_num(y[:, 0]))

    return Case(
        name="vfl_embedding_nan_row", group="vfl",
        what="VFL embedding release of a record whose raw values are NaN/Inf/missing under D' "
             "(valid under D), through the party's encoder, bottom model and privatizer, "
             "sigma=4",
        main=Side(claim=lambda: claim_vfl_embedding(sigma, 1), sample=sample,
                  statistic=lambda y: np.asarray(y)[:, 0],
                  what="encoder (declared fill) + DP bottom + EmbeddingPrivatizer vs the claim"),
        control=Side(claim=lambda: claim_vfl_embedding(sigma, 1), sample=sample_prefix,
                     statistic=stat_prefix,
                     what="pre-fix: the NaN row reaches the privatizer (published as NaN)"),
        draws_quick=200_000, draws_full=1_000_000, fast=True)


register(_nan_case())


# ---------------------------------------------------------------------------- VFL preprocessing
def _audit_frame(rng_seed: int, rows: int = 200) -> Any:
    """A small table of the passive party's bank columns that the auditor chooses."""
    import pandas as pd
    r = np.random.default_rng(rng_seed)
    # the auditor picks the data: spread numeric values make a fitted scaler's shift
    # visible in every other record's encoding
    return pd.DataFrame({
        "contact": r.choice(["unknown", "telephone", "cellular"], size=rows),
        "day": r.choice([1.0, 31.0], size=rows),
        "month": r.choice(["jan", "may", "dec"], size=rows),
        "duration": r.choice([0.0, 3000.0], size=rows),
        "campaign": r.choice([1.0, 50.0], size=rows),
        "pdays": r.choice([-1.0, 500.0], size=rows),
        "previous": r.choice([0.0, 100.0], size=rows),
        "poutcome": r.choice(["unknown", "failure", "success"], size=rows),
    })


def vfl_preprocess_sampler(*, sigma: float, change: dict[str, Any], others: int = 1024,
                           dim: int = 8, encode: Callable[..., np.ndarray] | None = None
                           ) -> Callable[[int, np.random.Generator], Draws]:
    """Draws of OTHER records' published embeddings when the canary (row 0) changes
    (``change``: column -> its value under D'), through the party's encoder
    (:func:`vfl_encode_features`), the product's DP bottom model (``party_bottom``) and
    its ``EmbeddingPrivatizer`` (C = 1).

    The auditor knows both output distributions (Gaussians around the clipped
    embeddings, computed with the product's ``clip_rows``), so each draw is reduced on
    the fly to the optimal statistic, its projection onto the known mean difference
    (the log-likelihood ratio up to an affine map): output ``(n, 1)``."""
    def sample(n: int, rng: np.random.Generator) -> Draws:
        frame = _audit_frame(0, rows=others + 1)
        cols = list(VFL_COLUMNS)
        train = np.arange(len(frame))
        alt = frame.copy()
        for k, v in change.items():
            alt.loc[0, k] = v
        enc = encode or vfl_encode_features
        xs = [enc(f, cols, train) for f in (frame, alt)]
        d_in = max(x.shape[1] for x in xs)
        model = _vfl_model(d_in, dim=dim)
        hs = []
        for x in xs:
            x = np.pad(x, ((0, 0), (0, d_in - x.shape[1]))).astype(np.float32)
            with torch.no_grad():
                hs.append(model(torch.from_numpy(np.ascontiguousarray(x[1: 1 + others]))))
        v = _known_direction(hs[0], hs[1], 1.0)
        out = []
        for h in hs:
            priv = EmbeddingPrivatizer(clip_norm=1.0, noise_multiplier=sigma, seed=_seed(rng))
            parts = []
            with torch.no_grad():
                for at in range(0, n, 1000):
                    m = min(1000, n - at)
                    pub = priv(h.repeat(m, 1))[1].reshape(m, others * dim)
                    parts.append((pub @ v).numpy())
            out.append(np.concatenate(parts)[:, None])
        return out[0], out[1]
    return sample


def _prefix_encode(frame: Any, columns: Sequence[str], train_idx: np.ndarray) -> np.ndarray:
    """The pre-fix encoder (a scaler fitted on the private rows, as it was then: without
    clipping to training quantiles, which today's fitted encoder adds and which would
    blunt the control's one outlier): the positive control."""
    from parties.data import encode_party_features
    from parties.data.treatments import TreatmentPolicy
    return encode_party_features(frame, columns, train_idx, np.zeros(0, dtype=np.int64),
                                 policy=TreatmentPolicy(clip_quantile=0.0)).x_train


def _preprocess_case() -> Case:
    sigma = 4.0
    change = {"duration": 1e7, "campaign": 1e6, "previous": 1e6}
    return Case(
        name="vfl_preprocess_scaler", group="vfl",
        what="VFL preprocessing: one outlier record (duration 1e7, campaign, previous 1e6) "
             "would move a fitted scaler; the audit sees only 1024 OTHER records' published "
             "embeddings, sigma=4",
        main=Side(claim=lambda: claim_vfl_embedding(sigma, 1),
                  sample=vfl_preprocess_sampler(sigma=sigma, change=change),
                  statistic=lambda y: np.asarray(y)[:, 0],
                  what="the party's encoder (public schema) vs the record's claim"),
        control=Side(claim=lambda: claim_vfl_embedding(sigma, 1),
                     sample=vfl_preprocess_sampler(sigma=sigma, change=change,
                                                   encode=_prefix_encode),
                     statistic=lambda y: np.asarray(y)[:, 0],
                     what="pre-fix encoder fitted on the private rows, same claim"),
        draws_quick=20_000, draws_full=100_000, fast=True)


register(_preprocess_case())


def _report_case() -> Case:
    sigma = 4.0
    cols = list(VFL_COLUMNS)

    def pair() -> tuple[Any, Any, np.ndarray]:
        frame = _audit_frame(0)
        alt = frame.copy()
        alt.loc[0, "month"] = "unique"
        return frame, alt, np.arange(len(frame))

    def sample_with(fields: Callable[..., dict[str, float]]
                    ) -> Callable[[int, np.random.Generator], Draws]:
        def sample(n: int, rng: np.random.Generator) -> Draws:
            frame, alt, train = pair()
            out = []
            for f in (frame, alt):
                rep = fields(f, cols, train)
                out.append(np.tile(np.array([rep[k] for k in sorted(rep)]), (n, 1)))
            return out[0], out[1]
        return sample

    def exact_with(fields: Callable[..., dict[str, float]]) -> Callable[[], float]:
        def exact() -> float:
            frame, alt, train = pair()
            a, b = fields(frame, cols, train), fields(alt, cols, train)
            pairs = [(point_pmf(int(round(a[k] * 1000))), point_pmf(int(round(b[k] * 1000))))
                     for k in sorted(a)]
            return exact_epsilon_product(pairs, DELTA)
        return exact

    def prefix_fields(f: Any, c: Sequence[str], t: np.ndarray) -> dict[str, float]:
        return {"n_features": float(_prefix_encode(f, c, t).shape[1])}

    return Case(
        name="vfl_report_n_features", group="vfl",
        what="VFL passive report: n_features when the record has a unique category value",
        main=Side(claim=lambda: claim_vfl_embedding(sigma, 1),
                  sample=sample_with(vfl_report_fields),
                  statistic=lambda y: np.asarray(y, dtype=np.float64).sum(axis=1),
                  exact=exact_with(vfl_report_fields),
                  what="the report's value-derived fields vs the record's claim"),
        control=Side(claim=lambda: claim_vfl_embedding(sigma, 1),
                     sample=sample_with(prefix_fields),
                     statistic=lambda y: np.asarray(y, dtype=np.float64).sum(axis=1),
                     exact=exact_with(prefix_fields),
                     what="pre-fix report (n_features counts observed categories)"),
        draws_quick=100_000, draws_full=100_000, fast=True)


register(_report_case())


# ---------------------------------------------------------------------------- VFL end to end
#: The passive party's columns in the end-to-end cases: bank's seven numeric columns (a
#: split the bundled schema covers), so that the canary's encoded row can be +1 in every
#: feature under D and -1 under D' (schema ranges' two ends).
E2E_COLUMNS = ("age", "balance", "day", "duration", "campaign", "pdays", "previous")


@dataclass(frozen=True, slots=True, kw_only=True)
class VflE2e:
    """The end-to-end VFL setting: one DP-SGD step of the passive bottom model on a batch
    that holds the canary, then the publication of ``later`` batches of OTHER records'
    embeddings.

    The noise comes from the product's planner (``plan_from_config`` of a bank VflConfig
    with ``dp_mu``, ``dp_embedding_share``, one epoch, no reassignment: one training
    publication per record); ``sgd_scale`` multiplies σ_g (0.5: the σ-halved control)
    while the claim stays the plan's.

    ``grad_clip`` (C_g, the config's ``dp_grad_clip_norm``) is chosen so small that the
    noisy gradient's coordinates are far below Adam's ε = 1e-8: the first Adam step
    ``lr·g/(|g| + ε)`` is then linear in the gradient instead of ~``lr·sign(g)``, which
    would discard ~20 % of the signal (sign quantisation: µ·sqrt(2/π)); ``lr`` (the
    config's ``lr``) scales the step back up so that later embeddings show it. Both are
    configurations a user may set; the step's guarantee holds for any of them.
    """

    dp_mu: float = 10.0
    share: float = 0.99
    grad_clip: float = 1e-9
    lr: float = 0.5
    sgd_scale: float = 1.0
    batch: int = 16
    later: int = 3
    later_batch: int = 32
    dim: int = 8
    hidden: tuple[int, ...] = (16,)
    own_release: bool = False
    canary_grad: float = 1e3
    #: crafted parameters (see :func:`crafted_params`): output-layer gain K, first-layer
    #: scale, first-layer bias
    gain: float = 10.0
    w1_scale: float = 1e-3
    b1: float = 1.0
    chunk: int = 5000

    def config(self) -> VflConfig:
        return vfl_dp_config(dp={"mu": self.dp_mu, "embedding_share": self.share,
                                 "grad_clip_norm": self.grad_clip, "lr": self.lr},
                             lr=self.lr,
                             model={"embedding_dim": self.dim, "bottom_hidden": self.hidden})

    def sigmas(self) -> tuple[float, float]:
        """(σ_e, σ_g) the product's planner calibrates for this configuration."""
        plan = plan_from_config(self.config())
        assert plan is not None
        return plan.noise_multiplier, plan.sgd_noise_multiplier

    def claim(self) -> float:
        """The product's ε at δ for the canary: its DP-SGD step (plus its own release when
        the case publishes it: ``account(1, σ_e, σ_g, train=True)``)."""
        se, sg = self.sigmas()
        return claim_vfl_train_publication(se, sg) if self.own_release else claim_vfl_dpsgd(sg, 1)


def crafted_params(model: torch.nn.Module, cfg: VflE2e) -> dict[str, torch.Tensor]:
    """Parameters of the product's bottom model (Linear, ReLU, Linear) that the auditor
    picks for the step (DP-SGD's guarantee holds at ANY current parameters, e.g. those
    earlier training reached): ``W1 = ε·R`` (tiny), ``b1 = β`` (every hidden unit active
    for every encoded row), ``W2 = K·Q``, ``b2 = −W2·b1`` (embeddings ``K·ε·Q·R·x`` well
    inside the clip ball). The canary's per-example gradient is then dominated by its
    first-layer part ``(W2ᵀ g0) x0ᵀ``, which flips sign between x0 and −x0: its clipped
    gradients under D and D' are nearly opposite (distance ~sqrt(7/8)·2C_g, the shared
    first-layer bias part limits it), and the update along it moves the later embeddings
    by K."""
    named = dict(model.named_parameters())
    assert list(named) == ["0.weight", "0.bias", "2.weight", "2.bias"], list(named)
    gen = torch.Generator().manual_seed(12345)
    hidden, d_in = named["0.weight"].shape
    dim = named["2.weight"].shape[0]
    w1 = cfg.w1_scale * torch.randn(hidden, d_in, generator=gen) / math.sqrt(d_in)
    b1 = torch.full((hidden,), cfg.b1)
    w2 = cfg.gain * torch.randn(dim, hidden, generator=gen) / math.sqrt(hidden)
    return {"0.weight": w1, "0.bias": b1, "2.weight": w2, "2.bias": -(w2 @ b1)}


def _e2e_frame(n: int, seed: int) -> Any:
    """Raw rows of the e2e columns, uniform inside each column's public range."""
    import pandas as pd
    from parties.data.schema import bundled_schema
    schema = bundled_schema("bank")
    assert schema is not None
    r = np.random.default_rng(seed)
    cols = {c.name: r.uniform(c.lo, c.hi, size=n)
            for c in schema.select(E2E_COLUMNS).columns}
    return pd.DataFrame(cols)


def vfl_e2e_sampler(cfg: VflE2e, step: Callable[..., dict[str, torch.Tensor]]
                    ) -> Callable[[int, np.random.Generator], Draws]:
    """Draws of the statistic of OTHER records' published embeddings after one step of
    ``step`` on a batch holding the canary.

    * Preprocessing: raw rows through the product's encoder (:func:`vfl_encode_features`:
      bundled public schema). The canary's raw row is at the top of every column's
      public range under D (encoded +1) and at the bottom under D' (encoded -1).
    * Training: the product's DP bottom model (``party_bottom``) at its initialisation;
      the adversarial active party sends the canary a large cut-layer gradient and the
      batch's other rows zero; ``step`` (the product's DP-SGD step then Adam,
      :func:`vfl_dpsgd_step`) with the DP-SGD noise batched over the draws (the clipped
      per-example sum is computed once).
    * Publication: ``later`` batches of ``later_batch`` other records (half of them hold
      the canary's D values, half its D' values, so the update along the canary's
      gradient moves them most), forwarded at each draw's parameters
      (``torch.func.vmap`` of ``functional_call``) and privatised by the product's
      ``EmbeddingPrivatizer`` at the plan's σ_e; with ``own_release`` the canary's own
      embedding (before the step) is published too.

    Each draw is reduced on the fly to the auditor's linear statistic: the Gaussian
    log-likelihood ratio of the linearised mechanism (later embeddings ≈ J·update +
    noise: ``w = J (c² JᵀJ + s² I)⁻¹ ΔS``, J the Jacobian of the clipped later
    embeddings in the parameters, ΔS the difference of the canary's clipped gradients,
    c the update's noise scale, s = σ_e·C), plus the own release's ``⟨Δh, y⟩/s²``. It is
    fixed before any draw (computed from the model and the pair, no draws), so the
    lower bound stays valid whatever the mechanism really is. Output ``(n, 1)``."""
    from parties.privacy.dp import clip_rows

    def sample(n: int, rng: np.random.Generator) -> Draws:
        c = cfg.config()
        plan = plan_from_config(c)
        assert plan is not None
        sig_e, sig_g = plan.noise_multiplier, plan.sgd_noise_multiplier * cfg.sgd_scale
        clip, gclip, lr = plan.clip_norm, plan.grad_clip_norm, c.worker_lr("passive")
        cols = list(E2E_COLUMNS)
        n_later = cfg.later * cfg.later_batch
        frame = _e2e_frame(cfg.batch + n_later, seed=1)
        from parties.data.schema import bundled_schema
        schema = bundled_schema("bank")
        assert schema is not None
        sel = schema.select(E2E_COLUMNS).columns
        hi = {col.name: col.hi for col in sel}
        lo = {col.name: col.lo for col in sel}
        frames = []
        for vals in (hi, lo):
            f = frame.copy()
            for k, v in vals.items():
                f.loc[0, k] = v  # the canary
            half = cfg.batch + n_later // 2  # later records: copies of both canary values
            for k in cols:
                f.loc[cfg.batch: half - 1, k] = hi[k]
                f.loc[half:, k] = lo[k]
            frames.append(f)
        idx = np.arange(len(frame))
        xs = [torch.from_numpy(vfl_encode_features(f, cols, idx)) for f in frames]
        later_x = xs[0][cfg.batch:]
        assert torch.equal(later_x, xs[1][cfg.batch:])
        model = party_bottom(c, "passive", xs[0].shape[1])
        params = crafted_params(model, cfg)
        names = list(params)
        g = torch.zeros(cfg.batch, cfg.dim)
        g[0] = cfg.canary_grad / math.sqrt(cfg.dim)  # the canary's cut-layer gradient

        # the auditor's statistic, fixed before any draw: the Gaussian LLR of the
        # linearised mechanism. Mean difference: the step without noise; covariance:
        # the step's noise through the Jacobian of the later embeddings, plus σ_e·C.
        flat0 = torch.cat([params[k].reshape(-1) for k in names])

        def later_of(theta: torch.Tensor) -> torch.Tensor:
            p, at = {}, 0
            for k in names:
                p[k] = theta[at: at + params[k].numel()].reshape(params[k].shape)
                at += params[k].numel()
            return clip_rows(torch.func.functional_call(model, p, (later_x,)), clip).reshape(-1)

        zero = {nm: torch.zeros(1, *p.shape) for nm, p in params.items()}
        with torch.no_grad():
            means = [later_of(torch.cat([v[0].reshape(-1) for v in step(
                params, x[:cfg.batch], g, zero, model=model, embed_clip=clip, grad_clip=gclip,
                sigma=sig_g, lr=lr).values()])).double() for x in xs]
        d_m = means[1] - means[0]
        jac = torch.func.jacrev(later_of)(flat0).double()
        # update std per parameter: Adam's first step is ~ (lr/eps)·gradient when the
        # gradient is far below eps, the gradient's noise std is σ_g·C_g/B (0: plain step)
        cc = (lr / ADAM_EPS) * sig_g * gclip / cfg.batch if step is not VFL_PREFIX_STEP else 0.0
        ss = sig_e * clip
        m = cc * cc * (jac.T @ jac) + ss * ss * torch.eye(jac.shape[1], dtype=torch.float64)
        # Woodbury: (c²JJᵀ + s²I)⁻¹ Δm = (Δm − c² J (c²JᵀJ + s²I)⁻¹ Jᵀ Δm) / s²
        w = ((d_m - cc * cc * (jac @ torch.linalg.solve(m, jac.T @ d_m))) / (ss * ss)).float()
        with torch.no_grad():
            own = [clip_rows(torch.func.functional_call(model, params, (x[:1],)), clip)
                   for x in xs]
        w_own = ((own[1] - own[0]).reshape(-1) / (ss * ss)).float()

        # the later records hold two distinct rows: forward those, then index
        uniq, inverse = torch.unique(later_x, dim=0, return_inverse=True)

        def later_emb(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.func.functional_call(model, p, (uniq,))[inverse]

        check = True
        out = []
        for x, h_own in zip(xs, own, strict=True):
            priv = EmbeddingPrivatizer(clip_norm=clip, noise_multiplier=sig_e, seed=_seed(rng))
            gen = torch.Generator().manual_seed(_seed(rng))
            parts = []
            for at in range(0, n, cfg.chunk):
                k = min(cfg.chunk, n - at)
                noise = {nm: torch.randn(k, *p.shape, generator=gen) for nm, p in params.items()}
                with torch.no_grad():
                    new = step(params, x[:cfg.batch], g, noise, model=model, embed_clip=clip,
                               grad_clip=gclip, sigma=sig_g, lr=lr)
                    if check:  # the batched Adam step is the product optimizer's
                        grads0 = private_grads_with_noise(
                            model, params, x[:cfg.batch], g, {nm: t[0] for nm, t in noise.items()},
                            embed_clip_norm=clip, grad_clip_norm=gclip, noise_multiplier=sig_g)
                        if step is vfl_dpsgd_step:
                            check_adam_first_step(params, grads0, lr)
                            for nm in names:  # draw 0 of the batch is the one-draw step
                                one = params[nm] - adam_first_step(grads0[nm].clone(), lr)
                                if not torch.allclose(new[nm][0], one, rtol=1e-5, atol=1e-7):
                                    raise AssertionError(f"batched DP-SGD step differs on {nm}")
                        check = False
                    emb = torch.func.vmap(later_emb)(new)
                    _, pub = priv(emb.reshape(-1, cfg.dim))
                    stat = pub.reshape(k, -1) @ w
                    if cfg.own_release:
                        _, pub_own = priv(h_own.expand(k, -1).contiguous())
                        stat = stat + pub_own @ w_own
                parts.append(stat.numpy())
            out.append(np.concatenate(parts)[:, None])
        return out[0], out[1]
    return sample


def _vfl_e2e_case(name: str, cfg: VflE2e, *, draws_quick: int, draws_full: int,
                  halved: bool = True, fast: bool = False) -> Case:
    se, sg = cfg.sigmas()
    own = "the record's own release + " if cfg.own_release else ""
    stat = lambda y: np.asarray(y)[:, 0]  # noqa: E731
    extra = ()
    if halved:
        half = VflE2e(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
                         "sgd_scale": 0.5})
        extra = (Side(claim=cfg.claim, sample=vfl_e2e_sampler(half, VFL_STEP), statistic=stat,
                      what="DP-SGD step at sigma_g/2, same claim"),)
    return Case(
        name=name, group="vfl-e2e",
        what=f"VFL end to end: {own}one DP-SGD step (sigma_g={sg:.3g}, plan dp.mu="
             f"{cfg.dp_mu:g}, share {cfg.share:g}) with the canary (schema-encoded, "
             f"replace-one), then Adam, then {cfg.later} later batches of {cfg.later_batch} "
             f"OTHER records' published embeddings (sigma_e={se:.3g})",
        main=Side(claim=cfg.claim, sample=vfl_e2e_sampler(cfg, VFL_STEP), statistic=stat,
                  what="product DP-SGD step + Adam vs "
                       + ("account(1, sigma_e, sigma_g, train=True)" if cfg.own_release
                          else "release_mu(sigma_g)")),
        control=Side(claim=cfg.claim, sample=vfl_e2e_sampler(cfg, VFL_PREFIX_STEP),
                     statistic=stat,
                     what="pre-fix step (plain Adam: no per-example clipping, no noise), "
                          "same claim"),
        extra_controls=extra, draws_quick=draws_quick, draws_full=draws_full, fast=fast)


# Power (worked out in the case docstrings' terms; sim: Gaussian pairs through
# eps_lower_bound at alpha 0.05/20): a claim of mu_c = 1 (eps 4.38 at 1e-5) against a
# sigma_g-halved step of true mu ~1.87 (2·sqrt(7/8), the crafted pair's gradient gap;
# the readout through later embeddings loses ~1 %) gives a split-half 95 % bound of
# ~4.8-5.0 at 2-4·10^5 draws per side, ~3.7 at 2·10^4 (a mere 2x in mu needs ~2.6x to
# clear an eps at delta = 1e-5 with 10^4 evaluation draws), so the quick mode takes
# 3-4·10^5 draws (batched: ~10 s per 10^5 on 2 cores). mu_c = 0.75 or 1.25 leave less
# margin (the bound saturates near log(n/2) as mu grows and lags eps(mu) at small mu).
register(_vfl_e2e_case("vfl_e2e_step_3later", VflE2e(later=3, later_batch=32),
                       draws_quick=400_000, draws_full=1_000_000))
register(_vfl_e2e_case("vfl_e2e_step_20later", VflE2e(later=20, later_batch=8),
                       draws_quick=400_000, draws_full=1_000_000))
register(_vfl_e2e_case("vfl_e2e_own_plus_step", VflE2e(dp_mu=1.0, share=0.5, own_release=True),
                       draws_quick=20_000, draws_full=100_000, halved=False, fast=True))



# ---------------------------------------------------------------------------- VFL labels
#: Training rows of each audited run: the record is row 0, the others' labels are fixed.
LABEL_ROWS = 8
#: Epochs in which the record's label is trained on (one ``labels_of`` of its batch each).
LABEL_EPOCHS = 2
#: Draws whose flips a second worker (the same secret) must reproduce.
LABEL_WORKER_CHECK = 256


def _label_worker(y: np.ndarray, flips: np.ndarray) -> ActiveCompute:
    """An active worker (the product's ``ActiveCompute``) over the training labels ``y``
    with the label protection ``LabelProtection(flips=flips)``; its bottom and top are
    1-unit linear layers (the models play no part in ``labels_of``)."""
    mods = [torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)]
    return ActiveCompute(torch.zeros(len(y), 1), torch.from_numpy(y.astype(np.float32)),
                         lambda: torch.nn.Linear(1, 1), lambda: torch.nn.Linear(1, 1),
                         ParameterServer(flat_params(mods)), lr=1e-2, delta_t0=1,
                         labels=LabelProtection(flips=flips))


def vfl_label_sampler(*, epsilon: float, fresh_secret_per_epoch: bool = False,
                      epochs: int = LABEL_EPOCHS, rows: int = LABEL_ROWS
                      ) -> Callable[[int, np.random.Generator], Draws]:
    """Draws of the labels the active party trains on for one record, through the
    product's label DP: the record (row 0 of ``rows`` training rows) has label 0 under
    D and 1 under D' (replace-one label; the other rows' labels are fixed).

    Each draw is its own run with a fresh secret (from ``rng``, in place of the OS
    entropy of ``parties.privacy.labels.label_secret``): the worker's protection is
    ``parties.privacy.labels.label_protection([vfl.labels] of vfl_label_config(ε),
    secret, rows)``, and the labels it trains on come from ``ActiveCompute.labels_of`` of
    the record's batch in each of ``epochs`` epochs. The draws' runs are laid end to end
    in one ``ActiveCompute`` (draw i's rows are ``i·rows ..``, its flips the ones its own
    ``label_protection`` returned), so ``labels_of`` runs once per epoch over all draws.
    On the first :data:`LABEL_WORKER_CHECK` draws a second worker given the same secret
    (as ``parties.privacy.party.party_dp`` hands every worker) must draw the same flips.

    ``fresh_secret_per_epoch``: the positive control, a worker with its own fresh
    secret in every epoch (each copy of the label randomised independently). Output
    ``(n, epochs)`` 0/1 labels."""
    section = vfl_label_config(epsilon).labels
    others = (np.arange(1, rows) % 2).astype(np.float32)

    def flips_of(secrets: np.ndarray) -> np.ndarray:
        return np.concatenate([label_protection(section, int(v), rows).flips
                               for v in secrets])

    def sample(n: int, rng: np.random.Generator) -> Draws:
        record = np.arange(0, n * rows, rows)
        out = []
        for label in (0.0, 1.0):
            y = np.tile(np.concatenate([[label], others]).astype(np.float32), n)
            secrets = rng.integers(0, 2**63 - 1, size=(epochs if fresh_secret_per_epoch
                                                       else 1, n), dtype=np.int64)
            if not fresh_secret_per_epoch:
                flips = flips_of(secrets[0])
                m = min(n, LABEL_WORKER_CHECK)
                if not np.array_equal(flips_of(secrets[0, :m]), flips[: m * rows]):
                    raise AssertionError("two workers with the same label secret drew "
                                         "different flips")
                worker = _label_worker(y, flips)
            cols = []
            for e in range(epochs):
                if fresh_secret_per_epoch:
                    worker = _label_worker(y, flips_of(secrets[e]))
                cols.append(worker.labels_of(record).numpy())
            out.append(np.stack(cols, axis=1).astype(np.int8))
        return out[0], out[1]
    return sample


def vfl_label_exact(epsilon: float, releases: int = 1) -> float:
    """Exact ε at δ of ``releases`` independent randomised responses of the label at
    ``epsilon`` (flip probability ``RandomizedResponse.flip_probability``), from the
    tables of the released 0/1 label under D (true label 0) and D' (1)."""
    p = RandomizedResponse(epsilon=epsilon).flip_probability
    d, d_prime = IntPmf(0, np.array([1.0 - p, p])), IntPmf(0, np.array([p, 1.0 - p]))
    return exact_epsilon_product([(d, d_prime)] * releases, DELTA)


def _label_stat(y: np.ndarray) -> np.ndarray:
    """How many of the epochs' labels are 1: the LLR up to an affine map, both for the
    product (one randomised label repeated) and for independent randomisations."""
    return np.asarray(y, dtype=np.float64).reshape(len(y), -1).sum(axis=1)


def _label_case(epsilon: float, *, fast: bool = False) -> Case:
    e = LABEL_EPOCHS
    claim = functools.partial(claim_vfl_label_dp, epsilon)
    return Case(
        name=f"vfl_label_rr_eps{epsilon:g}", group="vfl-label",
        what=f"VFL label DP: randomised response at [vfl.labels] epsilon={epsilon:g}, "
             f"replace-one label (the record's 0 vs 1), the labels the active party trains "
             f"on for it in {e} epochs (label_protection + ActiveCompute.labels_of)",
        main=Side(claim=claim, sample=vfl_label_sampler(epsilon=epsilon),
                  statistic=_label_stat, exact=lambda: vfl_label_exact(epsilon),
                  what="label_protection's flips (one secret per run, every worker and "
                       "epoch the same) vs the label ledger's pure eps"),
        control=Side(claim=claim, sample=vfl_label_sampler(epsilon=3.0 * epsilon),
                     statistic=_label_stat, exact=lambda: vfl_label_exact(3.0 * epsilon),
                     what=f"randomised response at 3*eps (flip probability "
                          f"{RandomizedResponse(epsilon=3.0 * epsilon).flip_probability:.4f}"
                          f"), same claim"),
        extra_controls=(
            Side(claim=claim,
                 sample=vfl_label_sampler(epsilon=epsilon, fresh_secret_per_epoch=True),
                 statistic=_label_stat, exact=lambda: vfl_label_exact(epsilon, e),
                 what=f"a fresh secret every epoch (the label randomised {e} times "
                      f"independently), same claim"),),
        draws_quick=30_000, draws_full=200_000, fast=fast)


register(_label_case(1.0, fast=True))
register(_label_case(2.0))

# ---------------------------------------------------------------------------- FedForge cells
@dataclass(frozen=True, slots=True, kw_only=True)
class CellPair:
    """A neighbouring pair of per-party cell counts: ``counts_d[j, c]`` and
    ``counts_dprime[j, c]`` (party j, cell c), plus the counts released in clear (the
    parties' row counts, or None when nothing travels in clear)."""

    counts_d: np.ndarray
    counts_dprime: np.ndarray
    clear_d: int | None = None
    clear_dprime: int | None = None


def cell_pair(cfg: FfConfig, relation: str, c: int, other: int) -> CellPair:
    """The pair the audit uses: party 0 holds the record; the other parties hold
    ``other`` in each cell. Add/remove: one cell, ``c`` vs ``c + 1`` (and the row count
    changes by one). Replace-one: two cells, ``(c + 1, c)`` vs ``(c, c + 1)``."""
    k = cfg.n_parties
    if relation == "replace_one":
        d = np.full((k, 2), other, dtype=np.int64)
        dp = d.copy()
        d[0] = (c + 1, c)
        dp[0] = (c, c + 1)
        return CellPair(counts_d=d, counts_dprime=dp, clear_d=100, clear_dprime=100)
    d = np.full((k, 1), other, dtype=np.int64)
    dp = d.copy()
    d[0, 0] = c
    dp[0, 0] = c + 1
    return CellPair(counts_d=d, counts_dprime=dp, clear_d=100, clear_dprime=101)


def cell_tables(pipe: FfPipeline, cfg: FfConfig, counts: np.ndarray, survivors: int
                ) -> list[IntPmf]:
    """Exact pmfs of each released cell (decoded sum of the survivors' codes)."""
    plan, lo = pipe.plan(cfg, 1)
    encode = pipe.encode(cfg)
    noise = [pipe.noise_pmf(cfg)] * cfg.n_parties
    return [released_sum_pmf(noise, list(counts[:, c]), survivors=range(survivors),
                             encode=encode, ring=(int(lo[0]), int(plan.widths[0])))
            for c in range(counts.shape[1])]


def exact_for_pair(pipe: FfPipeline, cfg: FfConfig, pair: CellPair, survivors: int, *,
                   clear: bool) -> float:
    """Exact ε at δ of the released cells (and the clear row count when ``clear``)."""
    td = cell_tables(pipe, cfg, pair.counts_d, survivors)
    tp = cell_tables(pipe, cfg, pair.counts_dprime, survivors)
    pairs = list(zip(td, tp, strict=True))
    if clear and pair.clear_d is not None:
        pairs.append((point_pmf(pair.clear_d), point_pmf(pair.clear_dprime)))
    return exact_epsilon_product(pairs, DELTA)


def search_counts(pipe: FfPipeline, cfg: FfConfig) -> range:
    """The record holder's counts the pair search tries: one period of the rounding
    pattern of ``rint(v/Δ)`` (about Δ for Δ ≥ 1, ``1/dist(1/Δ, Z)`` below), at most
    ``max_party_rows`` and 256 values; just {0, 1} without per-party rounding."""
    plan, _ = pipe.plan(cfg, 1)
    inv = 1.0 / plan.step
    frac = abs(inv - round(inv))
    period = plan.step if plan.step >= 1 else (1.0 / frac if frac > 1e-9 else 1.0)
    return range(int(min(cfg.max_party_rows, 256, math.ceil(2 * period) + 3)))


@functools.lru_cache(maxsize=None)
def worst_pair(pipe: FfPipeline, cfg: FfConfig, relation: str, survivors: int, *,
               clear: bool) -> tuple[float, CellPair]:
    """The neighbouring pair with the largest exact ε over a grid (the record holder's
    count ``c`` from :func:`search_counts`, the others' counts 0 or c): rounding residues
    make the pre-fix pipeline's leak depend on the counts. Replace-one pairs are
    searched by their first cell (add/remove tables, cheap) and then evaluated whole."""
    search_rel = "add_remove" if relation == "replace_one" else relation
    best: tuple[float, int, int] | None = None
    for c in search_counts(pipe, cfg):
        for other in sorted({0, c}):
            e = exact_for_pair(pipe, cfg, cell_pair(cfg, search_rel, c, other), survivors,
                               clear=clear and search_rel == relation)
            if best is None or e > best[0]:
                best = (e, c, other)
            if math.isinf(e):
                break
    assert best is not None
    pair = cell_pair(cfg, relation, best[1], best[2])
    if search_rel == relation:
        return best[0], pair
    return exact_for_pair(pipe, cfg, pair, survivors, clear=clear), pair


def fedforge_sampler(pipe: FfPipeline, cfg: FfConfig, pair: CellPair, survivors: int, *,
                     clear: bool) -> Callable[[int, np.random.Generator], Draws]:
    """Draws of the released cells through the product's pipeline: each party's message
    (:func:`fedforge_party_message`), summed by the survivors in each cell's ring and
    decoded with ``synth.protocol.decode_sum``; the row count appended when ``clear``.
    Output ``(n, cells [+1])`` in code units."""
    def sample(n: int, rng: np.random.Generator) -> Draws:
        out = []
        for counts, rows in ((pair.counts_d, pair.clear_d), (pair.counts_dprime, pair.clear_dprime)):
            cells = counts.shape[1]
            plan, lo = pipe.plan(cfg, n * cells)
            mask = (np.uint64(1) << plan.widths.astype(np.uint64)) - np.uint64(1)
            total = np.zeros(n * cells, dtype=np.uint64)
            for j in range(survivors):
                msg = pipe.message(np.tile(counts[j], n), plan, rng)
                total = (total + msg) & mask
            dec = decode_sum(total, lo, plan) / plan.step
            res = np.rint(dec).astype(np.int64).reshape(n, cells)
            if clear and rows is not None:
                res = np.concatenate([res, np.full((n, 1), rows, dtype=np.int64)], axis=1)
            out.append(res)
        return out[0], out[1]
    return sample


def llr_of_tables(pipe: FfPipeline, cfg: FfConfig, pair: CellPair, survivors: int, *,
                  clear: bool) -> Callable[[np.ndarray], np.ndarray]:
    """The log-likelihood ratio log P_D'(y) − log P_D(y) of the released cells, from the
    tables (the optimal statistic; the auditor knows the distributions)."""
    td = cell_tables(pipe, cfg, pair.counts_d, survivors)
    tp = cell_tables(pipe, cfg, pair.counts_dprime, survivors)

    def stat(y: np.ndarray) -> np.ndarray:
        y = np.asarray(y).reshape(len(y), -1)
        s = np.zeros(len(y))
        for c, (a, b) in enumerate(zip(td, tp, strict=True)):
            lq, lp = b.log_prob(y[:, c]), a.log_prob(y[:, c])
            with np.errstate(invalid="ignore"):
                d = lq - lp
            s += np.nan_to_num(d, nan=0.0, posinf=1e6, neginf=-1e6)
        if (clear and pair.clear_d is not None and pair.clear_d != pair.clear_dprime
                and y.shape[1] > len(td)):
            s += np.where(y[:, -1] == pair.clear_dprime, 1e6, -1e6)
        return s
    return stat


def fedforge_side(cfg: FfConfig, relation: str, survivors: int, claim: Callable[[], float],
                  *, pipe: FfPipeline = FF_PRODUCT, clear: bool = False, what: str = "") -> Side:
    """A side of a FedForge case: the worst pair from the tables of ``pipe``, its exact
    ε, ``pipe``'s draws for that pair, and the table LLR as the statistic."""
    cache: dict[str, Any] = {}

    def pair() -> tuple[float, CellPair]:
        if "pair" not in cache:
            cache["pair"] = worst_pair(pipe, cfg, relation, survivors, clear=clear)
        return cache["pair"]

    def sample(n: int, rng: np.random.Generator) -> Draws:
        return fedforge_sampler(pipe, cfg, pair()[1], survivors, clear=clear)(n, rng)

    def statistic(y: np.ndarray) -> np.ndarray:
        if "stat" not in cache:
            cache["stat"] = llr_of_tables(pipe, cfg, pair()[1], survivors, clear=clear)
        return cache["stat"](y)

    return Side(claim=claim, sample=sample, statistic=statistic, exact=lambda: pair()[0],
                what=what)


#: The product's documented refusals: too little noise to account
#: (``SkellamAccountingError``), a plan the party refuses (``PlanRefused``), a round with
#: fewer survivors than S_min (``SurvivorRefusal``), a window wider than the ``bits`` cap
#: (``ValueError`` from ``cell_windows``; the coordinator exits 2 with it).
FF_REFUSALS: tuple[type[Exception], ...] = (SkellamAccountingError, PlanRefused,
                                            SurvivorRefusal, ValueError)


def fedforge_refusal(cfg: FfConfig, survivors: int) -> dict[str, Any] | None:
    """Whether the product refuses to release this configuration: it plans the round
    (:func:`fedforge_plan`), each party verifies the plan and computes its μ
    (:func:`fedforge_party_mu`), and each survivor checks the survivor count
    (``synth.mechanism.check_survivors``). None when it releases; else the refusal
    (error type and message): nothing is released, so the outcome is sound (ε = 0)."""
    try:
        plan, _ = fedforge_plan(cfg, 1)
        fedforge_party_mu(plan)
        check_survivors(survivors, plan.min_survivors)
    except FF_REFUSALS as exc:
        return {"outcome": "refused", "error": type(exc).__name__, "message": str(exc),
                "survivors": survivors, "n_parties": cfg.n_parties, "rho": cfg.rho}
    return None


def fedforge_product_side(cfg: FfConfig, survivors: int, *, relation: str = FEDFORGE_RELATION,
                          clear: bool = False, what: str = "") -> Side:
    """The product's side of a FedForge case: either a refusal (recorded as the case's
    ``outcome``; nothing released: constant draws, exact ε = 0), or the product's
    pipeline (:data:`FF_PRODUCT`) for the worst pair at ``survivors`` against the
    product's claim for the configuration's ρ."""
    cache: dict[str, Any] = {}

    def refusal() -> dict[str, Any] | None:
        if "r" not in cache:
            cache["r"] = fedforge_refusal(cfg, survivors)
        return cache["r"]

    inner = fedforge_side(cfg, relation, survivors, lambda: claim_fedforge_cell(cfg.rho),
                          pipe=FF_PRODUCT, clear=clear, what=what)

    def sample(n: int, rng: np.random.Generator) -> Draws:
        if refusal() is not None:
            z = np.zeros((n, 1), dtype=np.int64)
            return z, z.copy()
        assert inner.sample is not None
        return inner.sample(n, rng)

    def statistic(y: np.ndarray) -> np.ndarray:
        if refusal() is not None:
            return np.zeros(len(y))
        assert inner.statistic is not None
        return inner.statistic(y)

    def exact() -> float:
        if refusal() is not None:
            return 0.0
        assert inner.exact is not None
        return inner.exact()

    def outcome() -> dict[str, Any]:
        r = refusal()
        if r is not None:
            return r
        plan, _ = fedforge_plan(cfg, 1)
        return {"outcome": "released", "survivors": survivors, "n_parties": cfg.n_parties,
                "min_survivors": plan.min_survivors, "rho": plan.rho,
                "mu_party": fedforge_party_mu(plan), "ring_bits": plan.ring_bits,
                "relation": relation}

    return Side(claim=lambda: claim_fedforge_cell(cfg.rho), sample=sample,
                statistic=statistic, exact=exact, what=what, outcome=outcome)


def _prefix_control(cfg: FfConfig, survivors: int, what: str = "") -> Side:
    """The pre-fix behaviour: pre-fix pipeline (N_Z(0, σ²/K) per party, per-party
    rounding), pre-fix relation (add/remove) and pre-fix claim (ρ = 1/(2σ²))."""
    return fedforge_side(cfg, "add_remove", survivors,
                         lambda: claim_fedforge_prefix(cfg.sigma2_central), pipe=FF_PREFIX,
                         what=what or "pre-fix pipeline (sigma^2/K per party, per-party "
                                      "rounding), add/remove, pre-fix claim")


def _ff_case(name: str, what: str, cfg: FfConfig, *, survivors: int | None = None,
             control: Side | None = None, draws_quick: int = 1_000_000,
             draws_full: int = 2_000_000, fast: bool = False) -> Case:
    s = cfg.n_parties if survivors is None else survivors
    return Case(
        name=name, group="fedforge", what=what,
        main=fedforge_product_side(cfg, s, what="the product's cell pipeline vs its claim "
                                                "(or its refusal)"),
        control=control if control is not None else _prefix_control(cfg, s),
        draws_quick=draws_quick, draws_full=draws_full, fast=fast)


#: The central reference's control: σ quartered (at ρ = 1 the tight exact ε of σ halved,
#: 6.1, stays below the zCDP claim 7.08: the claim's conversion is not tight enough there).
FF_SIXTEENTH_NOISE = ff_scaled_noise_pipeline(1.0 / 16.0)


def _scaled_noise_control(cfg: FfConfig, survivors: int) -> Side:
    return fedforge_side(cfg, FEDFORGE_RELATION, survivors,
                         lambda: claim_fedforge_cell(cfg.rho), pipe=FF_SIXTEENTH_NOISE,
                         what="the product's pipeline with mu/16 (sigma quartered), same claim")


def _fewer_survivors_control(cfg: FfConfig, survivors: int) -> Side:
    s_min = cfg.s_min
    return fedforge_side(cfg, FEDFORGE_RELATION, survivors,
                         lambda: claim_fedforge_cell(cfg.rho),
                         pipe=ff_honest_pipeline(s_min),
                         what=f"pre-fix dropout behaviour: noise calibrated for S_min = "
                              f"{s_min} (mu = Lambda/S_min, before the trust model) released "
                              f"with {survivors} survivor(s) < S_min (no survivor check) at "
                              f"the charged rho")


_FF_C1 = FfConfig(n_parties=1, sigma2_central=1.0)
register(_ff_case("ff_central_s1", "FedForge reference: one party (K = 1), rho = 1 "
                  "(sigma^2 = 1)", _FF_C1, control=_scaled_noise_control(_FF_C1, 1),
                  fast=True))
register(_ff_case("ff_k10_s1", "FedForge cell, K = 10, rho = 1 (sigma^2 = 1; pre-fix "
                  "sigma^2/K = 0.1)", FfConfig(n_parties=10, sigma2_central=1.0), fast=True))
register(_ff_case("ff_k100_s1", "FedForge cell, K = 100, rho = 1 (sigma^2 = 1)",
                  FfConfig(n_parties=100, sigma2_central=1.0), draws_quick=200_000,
                  draws_full=1_000_000))
register(_ff_case("ff_k10_s05_refused", "FedForge cell, K = 10, rho = 2 (sigma^2 = 0.5): "
                  "too little noise to account, must be refused",
                  FfConfig(n_parties=10, sigma2_central=0.5)))
register(_ff_case("ff_k10_s10", "FedForge cell, K = 10, rho = 0.1 (sigma^2 = 10; pre-fix "
                  "sigma^2/K = 1)", FfConfig(n_parties=10, sigma2_central=10.0)))
register(_ff_case("ff_bits6_s100", "FedForge cell, bits = 6 (ring cap), K = 10, rho = 0.01 "
                  "(sigma^2 = 100): the window needs more, must be refused",
                  FfConfig(n_parties=10, sigma2_central=100.0, bits=6)))
register(_ff_case("ff_bits10_s100_rows10", "FedForge cell, bits = 10 (ring cap holds the "
                  "window), 10 rows per party, K = 10, rho = 0.01 (sigma^2 = 100)",
                  FfConfig(n_parties=10, sigma2_central=100.0, bits=10, max_party_rows=10),
                  control=_prefix_control(FfConfig(n_parties=10, sigma2_central=100.0,
                                                   bits=6), 10)))
_FF_D4 = FfConfig(n_parties=10, sigma2_central=16.0)
register(_ff_case("ff_dropout_4of10", "FedForge dropouts: 4 of 10 survive (S_min = 7), "
                  "rho = 1/16: must be refused", _FF_D4, survivors=4,
                  control=_fewer_survivors_control(_FF_D4, 4)))
register(_ff_case("ff_dropout_7of10", "FedForge dropouts: 7 of 10 survive (= S_min), "
                  "rho = 1/16 (sigma^2 = 16)", _FF_D4, survivors=7))
_FF_D1 = FfConfig(n_parties=2, sigma2_central=4.0)
register(_ff_case("ff_dropout_1of2", "FedForge dropouts: 1 of 2 survives (S_min = 2), "
                  "rho = 1/4: must be refused", _FF_D1, survivors=1,
                  control=_fewer_survivors_control(_FF_D1, 1)))
register(_ff_case("ff_dropout_2of2", "FedForge dropouts: 2 of 2 survive (= S_min), "
                  "rho = 1/4 (sigma^2 = 4)", _FF_D1, survivors=2))


def _rowcount_case() -> Case:
    cfg = FfConfig(n_parties=10, sigma2_central=10.0)
    return Case(
        name="ff_rowcount_clear", group="fedforge",
        what="FedForge cell plus the party's row count in clear, K = 10, rho = 0.1, "
             f"relation as stated ({FEDFORGE_RELATION}: row counts public, equal in D, D')",
        main=fedforge_product_side(cfg, 10, clear=True,
                                   what="cell + clear row count under the stated relation"),
        control=fedforge_side(cfg, "add_remove", 10,
                              lambda: claim_fedforge_prefix(cfg.sigma2_central),
                              pipe=FF_PREFIX, clear=True,
                              what="pre-fix add/remove claim: the clear row count is a "
                                   "deterministic disclosure (eps = inf)"),
        draws_quick=200_000, draws_full=1_000_000)


register(_rowcount_case())


def _replace_one_case() -> Case:
    cfg = FfConfig(n_parties=10, sigma2_central=10.0)
    return Case(
        name="ff_replace_one_s10", group="fedforge",
        what="FedForge, replace-one at the sensitivity bound (one cell -1, another +1: L2 "
             "sqrt 2, L1 2), K = 10, rho = 0.1, the product's claim",
        main=fedforge_product_side(cfg, 10, relation="replace_one",
                                   what="two cells vs the replace-one claim"),
        # the control's release holds d honest parties (the fewest the trust model
        # allows: exactly the charged noise); with all 10 it carries 10/d times that,
        # which the pre-fix claim no longer undercuts
        control=fedforge_side(cfg, "replace_one", cfg.trust.honest_in_release,
                              lambda: claim_fedforge_prefix(cfg.sigma2_central),
                              pipe=FF_PRODUCT,
                              what=f"the product's mechanism, a release holding d = "
                                   f"{cfg.trust.honest_in_release} honest parties (the "
                                   f"charged noise), vs the pre-fix add/remove claim "
                                   f"(sensitivity 1)"),
        draws_quick=1_000_000, draws_full=2_000_000)


register(_replace_one_case())


# ---------------------------------------------------------------------------- FedForge trust
#: The collusion cases' configuration: the product's defaults at K = 10 (S_min =
#: min_honest = 7, d = 4), ρ = 0.01 per clique (σ² = 100, the issue's second figure).
#: At ρ = 0.1 the tight claim (1.914) is loose enough that the control just below
#: min_honest (3 honest parties' shares, 3/4 of the charged noise: exact 1.859) would not
#: be detected; at ρ = 0.01 it is (exact 0.574 > claim 0.546). Per-clique ρ of real runs
#: is smaller still (adult, ε = 1: about 4e-4).
FF_TRUST_CFG = FfConfig(n_parties=10, sigma2_central=100.0)


def worst_honest_in_release(k: int, s_min: int, honest: int) -> int:
    """The fewest honest parties a released sum holds when the coordinator colludes with
    the ``k − honest`` others: they choose the survivor set (the coordinator declares
    honest parties dropped; colluders always "survive"), the released sum must have at
    least ``s_min`` members (honest parties refuse to help unmask fewer), and the record
    holder is in it (else nothing about the record is released). The colluders' own
    noise is known to the adversary and protects nobody."""
    return max(1, s_min - (k - honest))


def _collusion_case(h: int) -> Case:
    cfg = FF_TRUST_CFG
    trust = cfg.trust
    k, s_min = cfg.n_parties, trust.min_survivors
    m = worst_honest_in_release(k, s_min, h)
    holds = h >= trust.min_honest
    main = fedforge_side(
        cfg, FEDFORGE_RELATION, m, lambda: claim_fedforge_cell(cfg.rho), pipe=FF_PRODUCT,
        what=f"the product's noise (mu = Lambda/{trust.honest_in_release}); {k - h} "
             f"colluders and the coordinator release a sum of {max(s_min, k - h + 1)} "
             f"survivors holding {m} honest part{'y' if m == 1 else 'ies'}")

    def outcome() -> dict[str, Any]:
        plan, _ = fedforge_plan(cfg, 1)
        check_survivors(max(s_min, k - h + 1), plan.min_survivors)  # the product releases
        return {"outcome": "released", "n_parties": k, "honest": h, "colluders": k - h,
                "min_honest": trust.min_honest, "min_survivors": s_min,
                "honest_in_release": m, "survivors": max(s_min, k - h + 1),
                "mu_party": fedforge_party_mu(plan), "rho": cfg.rho,
                "expected": "holds" if holds else "exceeds the claim (outside the trust "
                                                  "model: a positive control)"}

    main = Side(claim=main.claim, sample=main.sample, statistic=main.statistic,
                exact=main.exact, what=main.what, outcome=outcome)
    control = None
    if holds:
        control = fedforge_side(
            cfg, FEDFORGE_RELATION, 1, lambda: claim_fedforge_cell(cfg.rho), pipe=FF_PRODUCT,
            what="no survivor floor: the coordinator releases the record holder's share "
                 "with only colluders (or declared dropouts) beside it")
    return Case(
        name=f"fedforge_collusion_h{h}", group="fedforge",
        what=f"FedForge collusion, K = 10, defaults (S_min = min_honest = 7, d = 4), rho = "
             f"0.01: {h} honest part{'y' if h == 1 else 'ies'}, {k - h} colluding with the "
             f"coordinator, who choose the survivors; worst released sum holds {m} honest "
             + ("(must hold)" if holds else "(fewer than min_honest: a control, must be "
                                             "detected)"),
        main=main, control=control, draws_quick=200_000, draws_full=1_000_000,
        must_hold=holds)


for _h in range(1, FF_TRUST_CFG.n_parties + 1):
    register(_collusion_case(_h))


#: The sybil and threshold cases: K = 10, defaults, ρ = 0.1 (σ² = 10), the issue's figures.
FF_SESSION_CFG = FfConfig(n_parties=10, sigma2_central=10.0)


def fedforge_session_refusal(cfg: FfConfig, session_parties: int, threshold: int | None
                             ) -> dict[str, Any] | None:
    """Whether a party configured as ``cfg`` (K, default threshold floor) refuses a session
    of ``session_parties`` IDs with Shamir ``threshold`` (None: the session's default), by
    the product's ``synth.plancheck.verify_session`` on the session's resolved threshold
    (``synth.protocol.SessionPlan.secagg``). None when it accepts."""
    from synth.protocol import SessionPlan, secagg_degree
    ids = tuple(f"p{j:03d}" for j in range(session_parties))
    session = SessionPlan(session_id="audit/0", party_ids=ids, threshold=threshold,
                          degree=secagg_degree(session_parties), graph_seed="00" * 16,
                          timeout_s=1.0, tree={})
    try:
        verify_session(session_parties=ids, threshold=session.secagg().t,
                       own_parties=cfg.n_parties,
                       own_threshold_floor=secagg_threshold_floor(cfg.n_parties))
    except SessionRefused as exc:
        return {"outcome": "refused", "error": type(exc).__name__, "field": exc.field,
                "got": exc.got, "expected": exc.expected, "message": str(exc),
                "session_parties": session_parties, "n_parties": cfg.n_parties}
    return None


def _refused_side(refusal: Callable[[], dict[str, Any] | None], claim: Callable[[], float],
                  what: str) -> Side:
    """The product's side of a session it must refuse: nothing is released (constant
    draws, exact 0) when it refuses; a side that raises when it accepts."""
    def check() -> dict[str, Any]:
        r = refusal()
        if r is None:
            raise AssertionError(f"the product accepted: {what}")
        return r

    def sample(n: int, rng: np.random.Generator) -> Draws:
        check()
        z = np.zeros((n, 1), dtype=np.int64)
        return z, z.copy()

    return Side(claim=claim, sample=sample, statistic=lambda y: np.zeros(len(y)),
                exact=lambda: (check(), 0.0)[1], what=what, outcome=check)


def _sybil_case() -> Case:
    cfg = FF_SESSION_CFG
    inflated = FfConfig(n_parties=100, sigma2_central=cfg.sigma2_central)
    prefix_d = inflated.s_min  # the pre-fix party: K and S_min = 70 from the session
    return Case(
        name="fedforge_sybil_session", group="fedforge",
        what="FedForge sybil session: a party configured for K = 10 handed a session of 100 "
             "IDs (90 sybils colluding with the coordinator), rho = 0.1: must be refused",
        main=_refused_side(lambda: fedforge_session_refusal(cfg, 100, None),
                           lambda: claim_fedforge_cell(cfg.rho),
                           "the party's session check (verify_session) vs a 100-ID session"),
        control=fedforge_side(
            inflated, FEDFORGE_RELATION, 10, lambda: claim_fedforge_cell(cfg.rho),
            pipe=ff_honest_pipeline(prefix_d),
            what="pre-fix: session accepted, K = 100 and S_min = 70 from it, mu = Lambda/70; "
                 "the 10 honest parties' sum"),
        extra_controls=(
            fedforge_side(inflated, FEDFORGE_RELATION, 1, lambda: claim_fedforge_cell(cfg.rho),
                          pipe=ff_honest_pipeline(prefix_d),
                          what="pre-fix, mu = Lambda/70: the record holder released with 69 "
                               "sybils (the survivor floor of 70 met by sybils alone)"),
            fedforge_side(inflated, FEDFORGE_RELATION, 10, lambda: claim_fedforge_cell(cfg.rho),
                          pipe=FF_PRODUCT,
                          what="the trust model without the session check: K = 100 taken "
                               "from the session (d = 40, mu = Lambda/40); the 10 honest "
                               "parties' sum")),
        draws_quick=200_000, draws_full=1_000_000)


register(_sybil_case())


def _threshold_case() -> Case:
    cfg = FF_SESSION_CFG
    return Case(
        name="fedforge_threshold_floor", group="fedforge",
        what="FedForge Shamir threshold 1 in a K = 10 session (the party's floor is "
             f"{secagg_threshold_floor(cfg.n_parties)}), rho = 0.1: must be refused",
        main=_refused_side(lambda: fedforge_session_refusal(cfg, cfg.n_parties, 1),
                           lambda: claim_fedforge_cell(cfg.rho),
                           "the party's session check (verify_session) vs threshold 1"),
        control=fedforge_side(
            cfg, FEDFORGE_RELATION, 1, lambda: claim_fedforge_cell(cfg.rho), pipe=FF_PRODUCT,
            what="pre-fix: threshold 1 accepted; one colluding neighbour rebuilds the party's "
                 "self-mask seed and mask key: its own vector unmasked (mu = Lambda/4)"),
        draws_quick=200_000, draws_full=1_000_000)


register(_threshold_case())


# ---------------------------------------------------------------------------- running
def _lb(side: Side, draws: Draws, alpha: float) -> dict[str, Any]:
    a, b = draws
    if side.statistic is not None:
        res = eps_lower_bound(side.statistic(a), side.statistic(b), delta=DELTA, alpha=alpha)
    else:
        res = projected_eps_lower_bound(a, b, delta=DELTA, alpha=alpha)
    return {"eps": res.eps, "fp": res.fp, "fn": res.fn, "n_eval": [res.n_d, res.n_dprime],
            "fpr_hi": res.fpr_hi, "fnr_hi": res.fnr_hi, "direction": res.direction,
            "threshold": res.threshold, "mu_hat": res.mu_hat, "alpha": alpha}


def _control(side: Side, case: Case, main_draws: Draws, main_exact: float | None, *, n: int,
             alpha: float, rng: np.random.Generator) -> dict[str, Any]:
    """One positive control: its claim, bound, exact ε and whether it is caught."""
    ctl_claim = float(side.claim())
    if side.sample is None:
        ctl_lb = _lb(case.main if side.statistic is None else side, main_draws, alpha)
    else:
        ctl_lb = _lb(side, side.sample(n, rng), alpha)
    ctl_exact = (float(side.exact()) if side.exact is not None
                 else main_exact if side.sample is None else None)
    by_lb = ctl_lb["eps"] > ctl_claim
    by_exact = ctl_exact is not None and ctl_exact > ctl_claim * (1 + 1e-9)
    return {"what": side.what, "claim": ctl_claim, "lb": ctl_lb["eps"], "lb_test": ctl_lb,
            "exact": ctl_exact, "detected": bool(by_lb or by_exact),
            "detected_by": "+".join(k for k, v in (("lb", by_lb), ("exact", by_exact)) if v)
            or None}


def run_case(case: Case, *, n: int, alpha: float, seed: int) -> dict[str, Any]:
    """Run one case: both sides, their bounds, exact ε and the verdicts."""
    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, zlib.crc32(case.name.encode())])
    main_claim = float(case.main.claim())
    assert case.main.sample is not None
    main_draws = case.main.sample(n, rng)
    main_lb = _lb(case.main, main_draws, alpha)
    main_exact = float(case.main.exact()) if case.main.exact is not None else None
    sides = (case.control, *case.extra_controls) if case.control is not None else ()
    controls = [_control(side, case, main_draws, main_exact, n=n, alpha=alpha, rng=rng)
                for side in sides]
    del main_draws
    exceeds = bool(main_exact is not None and main_exact > main_claim * (1 + 1e-9))
    if not case.must_hold:  # the case is itself a positive control: it must be caught
        by_lb = main_lb["eps"] > main_claim
        controls.insert(0, {
            "what": f"the case itself ({case.main.what})", "claim": main_claim,
            "lb": main_lb["eps"], "lb_test": main_lb, "exact": main_exact,
            "detected": bool(by_lb or exceeds),
            "detected_by": "+".join(k for k, v in (("lb", by_lb), ("exact", exceeds)) if v)
            or None})
    return {
        "name": case.name, "group": case.group, "what": case.what,
        "must_hold": case.must_hold,
        "claim": main_claim, "lb": main_lb["eps"], "lb_test": main_lb,
        "lb_over_claim": ((main_lb["eps"] / main_claim if main_claim > 0 else math.inf)
                          if case.must_hold else None),
        "exact": main_exact,
        "exact_violation": exceeds and case.must_hold,
        "draws": n,
        "control": controls[0],
        "extra_controls": controls[1:],
        "seconds": round(time.perf_counter() - t0, 2),
        **({"outcome": case.main.outcome()} if case.main.outcome is not None else {}),
    }


def run(names: Sequence[str], *, quick: bool, seed: int = 0, draws: int | None = None,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the named cases; the Bonferroni level is over the cases of this run."""
    alpha = bonferroni(ALPHA, len(names))
    rows = []
    for name in names:
        case = REGISTRY[name]
        n = draws or (case.draws_quick if quick else case.draws_full)
        r = run_case(case, n=n, alpha=alpha, seed=seed)
        rows.append(r)
        log(_row(r))
    finite = [r["lb_over_claim"] for r in rows if r["must_hold"]]
    summary = {
        "cases": len(rows),
        "cases_must_hold": sum(r["must_hold"] for r in rows),
        "control_cases": sum(not r["must_hold"] for r in rows),
        "max_lb_over_claim": max(finite) if finite else 0.0,
        "exact_violations": sum(r["exact_violation"] for r in rows),
        "controls": sum(1 + len(r["extra_controls"]) for r in rows),
        "controls_detected": sum(c["detected"] for r in rows
                                 for c in (r["control"], *r["extra_controls"])),
    }
    return {"summary": summary, "cases": rows,
            "settings": {"delta": DELTA, "alpha_family": ALPHA, "alpha_per_case": alpha,
                         "quick": quick, "seed": seed,
                         "fedforge_relation": FEDFORGE_RELATION,
                         "vfl_step": VFL_STEP.__name__}}


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else f"{x:.3f}"


HEADER = (f"{'case':24s} {'claim':>7s} {'lb(95%)':>8s} {'exact':>7s}  {'draws':>8s} "
          f"{'ctl claim':>9s} {'ctl lb':>7s} {'ctl exact':>9s} {'detected':>9s} {'s':>6s}")


def _row(r: dict[str, Any]) -> str:
    c = r["control"]
    f_lb = "!" if r["lb_over_claim"] is not None and r["lb_over_claim"] > 1 else " "
    f_ex = "!" if r["exact_violation"] else " "
    if not r["must_hold"]:  # a control case: its own claim/lb/exact are the control's
        return (f"{r['name']:24s} {'(ctl)':>7s} {'':>8s} {'':>7s}  {r['draws']:>8d} "
                f"{_fmt(c['claim']):>9s} {_fmt(c['lb']):>7s} {_fmt(c['exact']):>9s} "
                f"{(c['detected_by'] or 'NO'):>9s} {r['seconds']:>6.1f}")
    return (f"{r['name']:24s} {_fmt(r['claim']):>7s} {_fmt(r['lb']):>8s}{f_lb}"
            f"{_fmt(r['exact']):>7s}{f_ex} {r['draws']:>8d} {_fmt(c['claim']):>9s} {_fmt(c['lb']):>7s} "
            f"{_fmt(c['exact']):>9s} {(c['detected_by'] or 'NO'):>9s} {r['seconds']:>6.1f}"
            + "".join(f"\n{'  + control ' + str(i + 2):24s} {'':>7s} {'':>8s} {'':>7s}  {'':>8s} "
                      f"{_fmt(e['claim']):>9s} {_fmt(e['lb']):>7s} {_fmt(e['exact']):>9s} "
                      f"{(e['detected_by'] or 'NO'):>9s}"
                      for i, e in enumerate(r["extra_controls"])))


def _strict(x: Any) -> Any:
    """``x`` as strict JSON data: numpy scalars as Python numbers, ±inf as the strings
    ``"inf"``/``"-inf"`` (an infinite exact ε: a deterministic disclosure), NaN as None."""
    if isinstance(x, dict):
        return {str(k): _strict(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_strict(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    return x


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer draws (<= 10 min on 2 cores)")
    ap.add_argument("--json", metavar="PATH", help="write summary + per-case details")
    ap.add_argument("--only", metavar="NAMES", help="comma-separated case names")
    ap.add_argument("--fast", action="store_true", help="only the test suite's fast subset")
    ap.add_argument("--draws", type=int, metavar="N", help="draws per side for every case")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    if args.list:
        for c in REGISTRY.values():
            print(f"{c.name:24s} {c.group:9s} {c.what}")
        return 0
    names = list(REGISTRY)
    if args.only:
        names = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in names if s not in REGISTRY]
        if unknown:
            print(f"unknown case(s): {', '.join(unknown)}", file=sys.stderr)
            return 2
    if args.fast:
        names = [n for n in names if REGISTRY[n].fast]
    t0 = time.perf_counter()
    print(f"privacy audit at delta={DELTA:g}, {len(names)} case(s), 95 % family-wise "
          f"(alpha {ALPHA}/{len(names)} per case); '!' marks a claim the audit refutes")
    print(HEADER)
    doc = run(names, quick=args.quick, seed=args.seed, draws=args.draws)
    doc["settings"]["seconds"] = round(time.perf_counter() - t0, 1)
    s = doc["summary"]
    print(f"\n{s['cases']} cases in {doc['settings']['seconds']:.0f} s: max lb/claim "
          f"{s['max_lb_over_claim']:.3f}, exact violations {s['exact_violations']}, "
          f"controls detected {s['controls_detected']}/{s['controls']}")
    if args.json:
        Path(args.json).write_text(json.dumps(_strict(doc), indent=1, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
