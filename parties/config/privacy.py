"""``[vfl.dp]``: the passive party's differential privacy settings, a section of the VFL
run configuration (:class:`parties.config.vfl.VflConfig`). May import :mod:`pubsub`
and :mod:`parties.config.modelspec`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from parties.config.sections import _bad
from pubsub.config import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class DpSection:
    """``[vfl.dp]``: differential privacy for each record of the passive party (its
    embeddings and its bottom model's DP-SGD training).

    Attributes:
        batchnorm: with DP on, what to do with BatchNorm in the passive bottom model:
            ``"refuse"`` (the default: the run is refused before it starts,
            :class:`parties.privacy.dpsgd.DpIncompatibleModel`) or ``"groupnorm"`` (each
            BatchNorm1d is replaced by a GroupNorm of the same width, whose statistics
            are per row).
        mu: target µ of Gaussian differential privacy for each record of the passive
            party (µ-GDP, Dong-Roth-Su 2022, replace-one neighbours; covers its
            embeddings and its bottom model's DP-SGD training); None or ``inf`` = no DP.
            Both noise multipliers are calibrated for ``epochs + dp.reassign_reserve``
            training publications per record (see :mod:`parties.privacy.dp`).
        epsilon: the target as ε at ``dp.delta`` instead of ``dp.mu`` (converted to
            the largest µ that implies it, exactly).
        noise_multiplier / sgd_noise_multiplier: σ_e (embedding noise std σ_e·C)
            and σ_g (DP-SGD noise std σ_g·C_g) given directly instead of a target (both
            or neither); the spent µ is then only reported.
        clip_norm: C, the L2 norm each embedding row is clipped to before noising.
        grad_clip_norm: C_g, the L2 norm each per-example gradient of the passive
            bottom model is clipped to (DP-SGD; the gradient of the per-example loss, i.e.
            B x the cut-layer gradient of the batch-mean loss). Default 3: measured on bank
            at µ = 8 (in-process sync VFL, 2 epochs), C_g = 1 gave test AUC 0.83, 2: 0.85,
            3: 0.86, 5: 0.86, 10: 0.84, 30: 0.77 (clipping bias below, noise above).
        embedding_share: the share of a training record's µ² spent on its embedding
            releases (the rest on DP-SGD), in (0, 1).
        max_noise_multiplier: a target whose calibrated noise multiplier exceeds this
            is refused before anything starts (exit 2).
        lr: the base Adam learning rate of both parties when DP is on, in place of
            ``lr`` (scaled by ``lr_scaling`` the same way). Clipped, noised DP-SGD steps
            move the passive model slowly at the non-private rate: measured on bank,
            µ = 8, 2 epochs, 2 + 2 workers (real runs), lr 1e-3: 0.69 test AUC (median of
            3), 5e-3: 0.81, 1e-2: 0.83 and 0.87, 2e-2: 0.87.
        delta: δ at which the spent budget is also reported as (ε, δ).
        noise_seed: seed of the passive party's noise generators, for reproducible
            tests only (the active party must never know it); None = fresh OS entropy.
        schema: path to the passive party's public feature schema (a TOML file of
            declared ranges and categories, :mod:`parties.data.schema`; draft one with
            ``psfl vfl schema`` and review it). With DP on the passive party's features
            are encoded from it, never from encoders fitted on its rows; None (the
            default) = the bundled reviewed schema of a named dataset. With DP on and no
            schema (a user file without ``dp.schema``) the run refuses to start. Ignored
            with DP off (fitted encoders, as before). Not a shared setting.
        reassign_reserve: with a DP target, the extra (reassigned) training
            publications each passive record may get over the whole run, beyond one per
            epoch; the noise is calibrated for ``epochs + dp.reassign_reserve``
            publications per record. Before publishing a reassigned batch the passive
            party checks its own per-record count: if a record of the batch has spent
            its reserve, the batch is dropped for the epoch instead (the active party is
            told; ``dp.reserve_exhausted_batches`` in ``metrics.json``). Default 1: a
            record may miss one gradient deadline in the whole run and still be trained
            on in that epoch, at the price of ``sqrt((epochs + 1) / epochs)`` more noise
            (1.05x at 10 epochs, 1.22x at 2); 0: no reassignment under DP (a missed
            batch is dropped for the epoch). The plan covers no more than the schedule
            can use: 0 where the passive party never reassigns (``timeouts.max_reassign = 0``,
            ``timeouts.t_ddl_s = 0``, or an algorithm other than ``pubsub``), at most ``epochs ×
            timeouts.max_reassign``. Ignored with DP off or with the noise multipliers given
            directly.
        predict_max_releases: with DP on, the most prediction releases (``psfl vfl
            predict``) of one record by this passive party: a record of a file of new
            rows is identified by its ID (a salted hash of it, in
            ``model/<party>/prediction_ledger.json``), a record of the run's test split
            by its row (the training ledger's ``test`` group; its release at the end of
            training is not counted). Each prediction release costs a record the test
            split's ``µ_test`` (the whole target: ``dp.mu``); ``k`` releases compose to
            ``sqrt(k)·µ_test``. A prediction that would take any record past this is
            refused before anything is released (exit 2, naming this key). Default 1:
            a record's predictions stay within the run's target µ; 0: no predictions
            under DP. Read from the saved model's config (set it when training).
    """

    SECTION: ClassVar[str] = "vfl.dp"

    mu: float | None = None
    epsilon: float | None = None
    noise_multiplier: float | None = None
    sgd_noise_multiplier: float | None = None
    clip_norm: float = 1.0
    grad_clip_norm: float = 3.0
    embedding_share: float = 0.5
    max_noise_multiplier: float = 1000.0
    lr: float = 1e-2
    delta: float = 1e-5
    noise_seed: int | None = None
    schema: str | None = None
    reassign_reserve: int = 1
    predict_max_releases: int = 1
    batchnorm: str = "refuse"

    def __post_init__(self) -> None:
        bad = _bad(self)
        from parties.config.modelspec import DP_BATCHNORM

        if self.mu is not None and not self.mu > 0:
            raise bad("mu", "must be > 0 (inf, or leaving it out, turns DP off)")
        if self.epsilon is not None:
            if not 0 < self.epsilon < math.inf:
                raise bad("epsilon", "must be a positive finite number")
            if self.mu is not None:
                raise ConfigError("vfl.dp.epsilon", "set either dp.mu or dp.epsilon (with "
                                  f"dp.delta), not both; got dp.mu={self.mu!r}, "
                                  f"dp.epsilon={self.epsilon!r}")
        for key in ("noise_multiplier", "sgd_noise_multiplier"):
            v = getattr(self, key)
            if v is not None and not 0 < v < math.inf:
                raise bad(key, "must be a positive finite number")
        if self.noise_multiplier is not None and (self.mu is not None
                                                  or self.epsilon is not None):
            raise ConfigError(
                "vfl.dp.noise_multiplier",
                "set either a target (dp.mu or dp.epsilon; the noise multipliers are "
                "calibrated from it) or dp.noise_multiplier, not both; got "
                f"dp.mu={self.mu!r}, dp.epsilon={self.epsilon!r}, "
                f"dp.noise_multiplier={self.noise_multiplier!r}")
        if (self.noise_multiplier is None) != (self.sgd_noise_multiplier is None):
            raise ConfigError("vfl.dp.sgd_noise_multiplier", "give both dp.noise_multiplier "
                              "and dp.sgd_noise_multiplier, or neither; got "
                              f"{self.noise_multiplier!r} and {self.sgd_noise_multiplier!r}")
        for key in ("clip_norm", "grad_clip_norm", "max_noise_multiplier", "lr"):
            if not 0 < getattr(self, key) < math.inf:
                raise bad(key, "must be a positive finite number")
        if not 0 < self.embedding_share < 1:
            raise bad("embedding_share", "must be in (0, 1)")
        if not 0 < self.delta < 1:
            raise bad("delta", "must be in (0, 1)")
        if self.noise_seed is not None and not 0 <= self.noise_seed < 2**63:
            raise bad("noise_seed", "must be in 0 .. 2**63-1")
        for key in ("reassign_reserve", "predict_max_releases"):
            if not 0 <= getattr(self, key) <= 1_000_000:
                raise bad(key, "must be an integer in 0 .. 1000000")
        if self.schema is not None and not self.schema.strip():
            raise bad("schema", "must be a path to a schema TOML file (leave it out for "
                      "a named dataset's bundled schema)")
        if self.batchnorm not in DP_BATCHNORM:
            raise bad("batchnorm", f"must be one of {DP_BATCHNORM}")


    @property
    def enabled(self) -> bool:
        """True when the passive party clips and noises its embeddings."""
        return self.noise_multiplier is not None or self.epsilon is not None or (
            self.mu is not None and not math.isinf(self.mu))


#: values of ``vfl.labels.defence``: the active party's perturbation of the cut-layer
#: gradients it sends (:mod:`parties.privacy.labels`)
LABEL_DEFENCES = ("none", "marvell")


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelsSection:
    """``[vfl.labels]``: the active party's protection of its labels against the passive
    parties and anyone on the wire (:mod:`parties.privacy.labels`). Only the active
    party's own configuration counts: not a shared setting, so a passive party can
    neither see nor switch it off through the handshake. Binary tasks only.

    Attributes:
        defence: how the cut-layer gradients sent to each passive party are perturbed:
            ``"none"`` (the default: the labels are not protected against the partner;
            the run says so at start) or ``"marvell"`` (noise shaped so the two classes'
            gradients overlap, after Li et al., ICLR 2022, see
            :class:`parties.privacy.labels.MarvellNoise`): it defeats the label
            inference attacks of ``bench/label_audit.py`` (their measured AUC is its
            protection) and carries no DP claim.
        strength: ``"marvell"``'s noise scale k, in units of the batch's gap between
            the two classes' mean gradients (and of the larger class's spread across
            it). Measured on bank (``bench/label_audit.py``): see
            docs/explanation/privacy.md for the trade-off table.
        epsilon: label differential privacy: each training label is replaced once by
            randomised response (kept with probability e^ε / (1 + e^ε), else flipped)
            before anything is trained on it, so everything the passive parties
            receive is ε-label-DP for each record's label (pure DP, δ = 0); None (the
            default): no label DP. Composes with ``defence`` (which then sees only the
            randomised labels).
        noise_seed: seed of the randomised response and the gradient noise, for
            reproducible tests only (a passive party must never know it); None = fresh
            OS entropy.
    """

    SECTION: ClassVar[str] = "vfl.labels"

    defence: str = "none"
    strength: float = 2.5
    epsilon: float | None = None
    noise_seed: int | None = None

    def __post_init__(self) -> None:
        bad = _bad(self)
        if self.defence not in LABEL_DEFENCES:
            raise bad("defence", f"must be one of {LABEL_DEFENCES}")
        if not 0 < self.strength <= 1000:
            raise bad("strength", "must be a number in (0, 1000]")
        if self.epsilon is not None and not 0 < self.epsilon < math.inf:
            raise bad("epsilon", "must be a positive finite number (leave it out for no "
                      "label DP)")
        if self.noise_seed is not None and not 0 <= self.noise_seed < 2**63:
            raise bad("noise_seed", "must be in 0 .. 2**63-1")

    @property
    def protected(self) -> bool:
        """True when the active party perturbs its gradients or randomises its labels."""
        return self.defence != "none" or self.epsilon is not None
