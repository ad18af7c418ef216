"""One party's generator under DP-SGD: a CTGAN-style GAN or a record-trained diffusion model.

A trainer holds its party's rows (one-hot), its networks and optimizers and its
:class:`~synth.baselines.dpsgd.PrivateModule` (the network that sees the rows: the GAN's
discriminator, the diffusion denoiser). ``train(steps)`` runs Poisson-subsampled DP-SGD
steps; ``state()`` / ``load(state)`` exchange the weights for federated averaging;
``sample(n, seed)`` draws codes. Only DP-SGD outputs (and, for the GAN, a generator
trained on them, post-processing) leave a trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from synth.baselines.dpsgd import DPSGDPlan, PrivateModule
from synth.baselines.models import (build_discriminator, build_generator, diffusion_loss,
                                    gumbel_rows, offsets, one_hot)
from synth.diffusion import _build, _Chain, cosine_alphas


@dataclass(frozen=True, slots=True, kw_only=True)
class GanSettings:
    """smartnoise DPCTGAN's defaults (batch 500, Adam 2e-4, betas (0.5, 0.9), weight
    decay 1e-6, embedding 128, (256, 256) layers, clipping norm 1.0, one discriminator
    step per generator step); the epochs are set by the time cap."""

    batch: int = 500
    lr: float = 2e-4
    embedding_dim: int = 128
    dims: tuple[int, ...] = (256, 256)
    max_grad_norm: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffusionSettings:
    """The record-trained diffusion model: :mod:`synth.diffusion`'s denoiser (hidden 256,
    2 layers), T = 50 steps (the FedForge engine's 4 are for marginal matching through
    the chain; a denoising loss on records wants a longer chain), batch 512, Adam 1e-3,
    clipping norm 1.0."""

    batch: int = 512
    lr: float = 1e-3
    hidden: int = 256
    layers: int = 2
    diffusion_steps: int = 50
    max_grad_norm: float = 1.0


def _poisson(n: int, q: float, rng: np.random.Generator) -> np.ndarray:
    return np.flatnonzero(rng.random(n) < q)


class GanTrainer:
    """DP-CTGAN at one party (pac = 1, no gradient penalty; :mod:`.models`)."""

    def __init__(self, codes: np.ndarray, sizes: tuple[int, ...], plan: DPSGDPlan,
                 settings: GanSettings, *, seed: int) -> None:
        import torch

        self.sizes, self.settings, self.plan = sizes, settings, plan
        self.x = one_hot(codes, sizes)
        self.rng = np.random.default_rng(seed)
        self.gen_t = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.g = build_generator(sizes, embedding_dim=settings.embedding_dim,
                                     dims=settings.dims)
            d = build_discriminator(int(sum(sizes)), dims=settings.dims)
        kw = {"lr": settings.lr, "betas": (0.5, 0.9), "weight_decay": 1e-6}
        self.opt_g = torch.optim.Adam(self.g.parameters(), **kw)
        # the expected real batch q·n (the settings' batch, or half a small party's rows)
        self.fake_n = max(1, round(plan.sample_rate * len(self.x)))
        self.d = PrivateModule(d, torch.optim.Adam(d.parameters(), **kw), plan,
                               expected_batch=2 * self.fake_n,
                               generator=self.gen_t)

    def _fake(self, n: int) -> Any:
        import torch

        z = torch.randn(n, self.settings.embedding_dim, generator=self.gen_t)
        return gumbel_rows(self.g(z), self.sizes)

    def train(self, steps: int) -> None:
        import torch

        bce = torch.nn.functional.binary_cross_entropy_with_logits
        for _ in range(steps):
            idx = _poisson(len(self.x), self.plan.sample_rate, self.rng)
            real = self.x[torch.as_tensor(idx, dtype=torch.int64)]
            with torch.no_grad():
                fake = self._fake(self.fake_n)
            batch = torch.cat([real, fake])
            target = torch.cat([torch.ones(len(real)), torch.zeros(len(fake))])
            self.d.step(lambda m, b: bce(m(b)[:, 0], target, reduction="none"), batch)
            self.opt_g.zero_grad(set_to_none=True)
            out = self.d.module(self._fake(self.fake_n))[:, 0]
            loss_g = bce(out, torch.ones(len(out)))
            loss_g.backward()
            self.opt_g.step()
            self.d.optimizer.zero_grad(set_to_none=True)  # drop the G pass's grad samples

    def state(self) -> dict[str, Any]:
        return {"g": {k: v.detach().clone() for k, v in self.g.state_dict().items()},
                "d": {k: v.detach().clone() for k, v in self.d.inner.state_dict().items()}}

    def load(self, state: dict[str, Any]) -> None:
        self.g.load_state_dict(state["g"])
        self.d.inner.load_state_dict(state["d"])

    def sample(self, n: int, seed: int) -> np.ndarray:
        import torch

        self.g.eval()
        gen = torch.Generator().manual_seed(seed)
        off = offsets(self.sizes)
        out = np.empty((n, len(self.sizes)), dtype=np.int32)
        with torch.no_grad():
            for s in range(0, n, 8192):
                m = min(8192, n - s)
                z = torch.randn(m, self.settings.embedding_dim, generator=gen)
                logits = self.g(z)
                for j in range(len(self.sizes)):
                    p = torch.softmax(logits[:, off[j]:off[j + 1]] / 0.2, dim=1)
                    out[s:s + m, j] = torch.multinomial(p, 1, generator=gen)[:, 0].numpy()
        self.g.train()
        return out


class DiffusionTrainer:
    """A multinomial diffusion denoiser trained on one party's records by DP-SGD."""

    def __init__(self, codes: np.ndarray, sizes: tuple[int, ...], plan: DPSGDPlan,
                 settings: DiffusionSettings, *, seed: int) -> None:
        import torch

        self.sizes, self.settings, self.plan = sizes, settings, plan
        self.x = one_hot(codes, sizes)
        self.rng = np.random.default_rng(seed)
        self.gen_t = torch.Generator().manual_seed(seed)
        self.abar = torch.as_tensor(cosine_alphas(settings.diffusion_steps),
                                    dtype=torch.float32)
        net = _build(sizes, settings.hidden, settings.layers, seed)
        self.net = PrivateModule(net, torch.optim.Adam(net.parameters(), lr=settings.lr),
                                 plan, expected_batch=max(1, round(plan.sample_rate
                                                                   * len(self.x))),
                                 generator=self.gen_t)

    def train(self, steps: int) -> None:
        import torch

        t_steps = self.settings.diffusion_steps
        for _ in range(steps):
            idx = _poisson(len(self.x), self.plan.sample_rate, self.rng)
            if len(idx) == 0:  # (1 - q)^n: negligible at the plans' batch sizes
                idx = self.rng.integers(len(self.x), size=1)
            batch = self.x[torch.as_tensor(idx, dtype=torch.int64)]
            self.net.step(lambda m, b: diffusion_loss(m, b, self.sizes, self.abar, t_steps,
                                                      self.gen_t), batch)

    def state(self) -> dict[str, Any]:
        return {"net": {k: v.detach().clone() for k, v in self.net.inner.state_dict().items()}}

    def load(self, state: dict[str, Any]) -> None:
        self.net.inner.load_state_dict(state["net"])

    def sample(self, n: int, seed: int) -> np.ndarray:
        import torch

        gen = torch.Generator().manual_seed(seed)
        chain = _Chain(self.net.inner, self.sizes, self.settings.diffusion_steps)
        out = np.empty((n, len(self.sizes)), dtype=np.int32)
        with torch.no_grad():
            for s in range(0, n, 8192):
                m = min(8192, n - s)
                for j, p in enumerate(chain.run(m, gen, hard_sample=True)):
                    out[s:s + m, j] = torch.multinomial(p.clamp_min(0), 1,
                                                        generator=gen)[:, 0].numpy()
        return out


__all__ = ["DiffusionSettings", "DiffusionTrainer", "GanSettings", "GanTrainer"]
