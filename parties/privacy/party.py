"""The passive party's DP state at the start of a run: its plan (from its own
configuration), its per-record ledger over the training, validation and test rows, its
workers' secret noise seeds and the privatizers of its evaluation releases.

Owns: :class:`PartyDp`, :func:`party_dp`. May import :mod:`parties.config` and
:mod:`parties.privacy.dp`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parties.config import VflConfig
from parties.privacy.dp import (DpPlan, EmbeddingPrivatizer, GdpAccountant, accountant_for,
                                party_noise_secret, plan_from_config, worker_seeds)
from parties.privacy.labels import LabelLedger, label_secret


@dataclass(frozen=True, kw_only=True)
class PartyDp:
    """A party's DP state: ``plan`` None with DP off (and for the active party);
    ``acct`` the passive party's ledger (also with DP off: it counts releases);
    ``noise_seeds`` one per worker (None without a plan; the active party's: its label
    secret, the same for every worker, with ``[vfl.labels]`` on); ``eval_privatize`` the
    privatizer per evaluation split under DP; ``label_ledger`` the active party's label
    ledger (None for a passive party)."""

    plan: DpPlan | None
    acct: GdpAccountant | None
    noise_seeds: tuple[int | None, ...]
    eval_privatize: dict[str, EmbeddingPrivatizer] | None
    label_ledger: LabelLedger | None = None


def party_dp(cfg: VflConfig, party: str, role: str, workers: int, rows: Mapping[str, int],
             *, log: Any) -> PartyDp:
    """``party``'s DP state (``rows``: the row count of each split, ``train``, ``val``,
    ``test``); the plan is logged (``dp.plan``)."""
    none = (None,) * workers
    if role != "passive":
        labels = cfg.labels
        ledger = LabelLedger(epsilon_per_release=labels.epsilon)
        if not labels.protected:
            log.info("labels.unprotected", defence="none", task=cfg.effective_task)
            return PartyDp(plan=None, acct=None, noise_seeds=none, eval_privatize=None,
                           label_ledger=ledger)
        ledger.release()  # every training label, randomised once for the whole run
        log.info("labels.protection", defence=labels.defence, strength=labels.strength,
                 epsilon=labels.epsilon,
                 noise_seed="config" if labels.noise_seed is not None else "os_entropy")
        secret = label_secret(labels)
        return PartyDp(plan=None, acct=None, noise_seeds=(secret,) * workers,
                       eval_privatize=None, label_ledger=ledger)
    if cfg.labels.protected:  # the active party's setting, set here by mistake
        log.warning("labels.ignored_on_passive", defence=cfg.labels.defence,
                    epsilon=cfg.labels.epsilon)
    plan = plan_from_config(cfg)
    acct = accountant_for(plan, dict(rows))
    if plan is None:
        return PartyDp(plan=None, acct=acct, noise_seeds=none, eval_privatize=None)
    *seeds, eval_seed = worker_seeds(party_noise_secret(cfg.dp.noise_seed, party), workers + 1)
    privatize = {
        g: EmbeddingPrivatizer(clip_norm=plan.clip_norm, noise_multiplier=sigma, seed=seed)
        for (g, sigma), seed in zip(sorted(plan.eval_noise_multipliers.items()),
                                    worker_seeds(eval_seed, 2), strict=True)}
    log.info("dp.plan", noise_multiplier=plan.noise_multiplier,
             sgd_noise_multiplier=plan.sgd_noise_multiplier,
             grad_clip_norm=plan.grad_clip_norm, clip_norm=plan.clip_norm,
             target_mu=plan.target_mu, delta=plan.delta,
             planned_publications=plan.planned_publications,
             noise_seed="config" if cfg.dp.noise_seed is not None else "os_entropy")
    return PartyDp(plan=plan, acct=acct, noise_seeds=tuple(seeds), eval_privatize=privatize)


__all__ = ["PartyDp", "party_dp"]
