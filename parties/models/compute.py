"""What a run's configuration builds for a party (torch, no I/O): its models and
parameter server (:func:`party_models`), and a worker's compute object: the passive
party's bottom (with the DP privatizer and DP-SGD when the plan turns DP on) or the active
party's bottom and top, over the party's parameter server.

Owns: :func:`party_models`, :func:`make_compute` (exactly what a worker thread or
process, and the profiler, runs) and :func:`sync_mode_for`. May import the configuration, the privacy mechanisms,
the models, the fusing rule and the row store.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from parties.config import VflConfig
from parties.privacy.dp import EmbeddingPrivatizer, plan_from_config, sgd_seed
from parties.privacy.dpsgd import DpSgd
from parties.privacy.labels import label_protection
from parties.algorithms.fuse import fuse_of
from parties.core.ids import role_of
from parties.models.model import ActiveCompute, ParameterServer, PassiveCompute, flat_params
from parties.data.rowstore import DiskRows
from parties.models.zoo import ModelFactory


def sync_mode_for(algo: str, workers: int = 2) -> str:
    """The replicas' sync mode under ``algo`` for a party of ``workers`` workers
    (:data:`parties.models.model.SYNC_MODES`): ``pubsub`` every ΔT_t steps, ``avfl-ps`` every
    step (asynchronous PS), the others only when the party syncs (``vfl-ps``: a barrier
    every iteration; ``vfl``/``avfl``: one worker, synced at evaluation points).

    A party with one worker never syncs on its own (``"manual"``): the party flushes
    every worker to its parameter server after each training segment, before anything
    reads the server, and with one worker the server then holds exactly that worker's
    parameters; a push and pull per step or per ΔT_t would only copy them back and forth
    (0.08 ms each on the paper's small model, 2-4 % of a step, every step while
    ΔT_t = 1)."""
    if workers == 1:
        return "manual"
    return {"pubsub": "schedule", "avfl-ps": "step"}.get(algo, "manual")


def make_compute(role: str, cfg: VflConfig, x_train: np.ndarray, y_train: np.ndarray | None,
                 ps: Any, *, noise_seed: int | None = None,
                 sync_mode: str | None = None,
                 models: ModelFactory | None = None,
                 party: str | None = None) -> PassiveCompute | ActiveCompute:
    """Build a worker's compute object (its replica is initialised from ``ps.pull()``).

    Args:
        party: the worker's party id (its worker count and learning rate:
            ``vfl.workers.per_passive_party``); None = ``role``.
        models: the run's model factory (None: ``ModelFactory(cfg)``, the config's
            ``vfl.model.bottom`` / ``vfl.model.top``).
        sync_mode: the replica's sync mode; None = the algorithm's
            (:func:`sync_mode_for`).
        noise_seed: the passive worker's secret noise seed; required when the config
            turns DP on (the passive party then clips and noises what it publishes).
            For an active worker: the party's label secret, the same for every worker,
            required when ``[vfl.labels]`` protects the labels
            (:func:`parties.privacy.labels.label_protection`).

    Raises:
        ValueError: DP is on and a passive worker got no ``noise_seed``, or label
            protection is on and an active worker got none.
    """
    d_in = x_train.shape[1]
    # streamed rows (parties.data.rowstore.DiskRows) are indexed like the tensor, read from disk
    x = x_train if isinstance(x_train, DiskRows) else torch.from_numpy(
        np.ascontiguousarray(x_train, dtype=np.float32))
    party = party or role
    if sync_mode is None:
        sync_mode = sync_mode_for(cfg.algo, cfg.workers_for(party))

    factory = models if models is not None else ModelFactory(cfg)

    def make_bottom() -> torch.nn.Module:
        return factory.bottom(role, d_in)

    if role == "active":
        assert y_train is not None
        y = y_train if isinstance(y_train, DiskRows) else torch.from_numpy(
            np.ascontiguousarray(y_train, dtype=np.float32))
        return ActiveCompute(x, y, make_bottom, factory.top, ps, lr=cfg.worker_lr("active"),
                             delta_t0=cfg.workers.delta_t0, task=cfg.effective_task,
                             sync_mode=sync_mode, make_optimizer=factory.optimizer,
                             loss_fn=factory.loss(cfg.effective_task), fuse=fuse_of(cfg),
                             ps_update=cfg.ps_update_for("active"),
                             labels=label_protection(cfg.labels, noise_seed, len(y_train)))
    plan = plan_from_config(cfg)
    privatize = None
    make_dp_sgd = None
    if plan is not None:
        if noise_seed is None:
            raise ValueError("DP is on: a passive worker needs a noise seed")
        privatize = EmbeddingPrivatizer(clip_norm=plan.clip_norm,
                                        noise_multiplier=plan.noise_multiplier, seed=noise_seed)

        def make_dp_sgd(model: torch.nn.Module) -> DpSgd:
            return DpSgd(model, embed_clip_norm=plan.clip_norm,
                         grad_clip_norm=plan.grad_clip_norm,
                         noise_multiplier=plan.sgd_noise_multiplier, seed=sgd_seed(noise_seed))
    return PassiveCompute(x, make_bottom, ps, lr=cfg.worker_lr(party), delta_t0=cfg.workers.delta_t0,
                          privatize=privatize, sync_mode=sync_mode, make_dp_sgd=make_dp_sgd,
                          make_optimizer=factory.optimizer, ps_update=cfg.ps_update_for(party))


def party_models(cfg: VflConfig, party: str, data: Any, models: ModelFactory | None,
                 workers: int) -> tuple[ModelFactory, list[torch.nn.Module], ParameterServer]:
    """A party's model factory (with its encoder's hashed columns), its scoring copies of
    its models (bottom, then the active party's top; built from the current torch RNG
    state, in eval mode) and its parameter server over them, for ``workers`` workers
    (with ``vfl.workers.top_update = "shared"``, the active party's one top at the server)."""
    role = role_of(party)
    factory = models if models is not None else ModelFactory(cfg)
    hashed = getattr(data.encoder, "hashed_buckets", ())
    if hashed:  # the encoder's hashed columns: embedding tables inside the bottom
        factory = factory.with_hashed(hashed)
    mods = factory.modules(role, data.x_train.shape[1])
    for m in mods:
        m.eval()  # the party's copies only score (workers train their own replicas)
    update = cfg.ps_update_for(party)
    n_params = sum(p.numel() for m in mods for p in m.parameters())
    ps = ParameterServer(
        flat_params(mods), workers=workers, update=update,
        **({} if update == "average" else dict(
            n_params=n_params, lr=cfg.worker_lr(party), make_optimizer=factory.optimizer)))
    if role == "active" and cfg.shares_top():
        # one top at the PS, stepped in batch order at the unscaled rate
        bottom = mods[0]
        ps.share_top(factory.top(), offset=sum(p.numel() for p in bottom.parameters()),
                     lr=cfg.dp.lr if cfg.dp.enabled else cfg.lr,
                     buffer_offset=n_params + sum(  # θ: all parameters, then all float buffers
                         b.numel() for b in bottom.buffers() if b.is_floating_point()),
                     make_optimizer=factory.optimizer)
    return factory, mods, ps


__all__ = ["make_compute", "party_models", "sync_mode_for"]
