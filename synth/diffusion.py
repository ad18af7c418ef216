"""Engine ``diffusion``: a discrete diffusion model fitted to the noisy aggregate only.

The model is a discrete diffusion over the domain codes, as TabDDPM's categorical half
(Kotelnikov et al., "TabDDPM: Modelling Tabular Data with Diffusion Models", ICML 2023),
with one of two forward kernels (``DiffusionEngine.noise``):

* ``"absorbing"`` (the default; :class:`_MaskChain`): ``x_T`` has every attribute masked,
  and each reverse step unmasks a group of attributes (each chain its own random order),
  drawing them from the denoiser's ``x̂_0`` given what is already decided; the last
  group's ``x̂_0`` distribution is the sample's (D3PM's absorbing kernel, Austin et al.
  2021; order-agnostic autoregressive diffusion, Hoogeboom et al. 2022);
* ``"uniform"`` (multinomial diffusion, Hoogeboom et al., "Argmax Flows and Multinomial
  Diffusion", NeurIPS 2021): per attribute with ``K`` levels ``q(x_t | x_0) =
  Cat(ᾱ_t·x_0 + (1 − ᾱ_t)/K)``, cosine schedule, ``T`` steps (``x_T`` is uniform); the
  reverse step is the posterior ``q(x_{t−1} | x_t, x̂_0) ∝ (α_t·x_t + (1 − α_t)/K) ⊙
  (ᾱ_{t−1}·x̂_0 + (1 − ᾱ_{t−1})/K)``, and the last step's ``x̂_0`` distribution is the
  sample's.

The denoiser is an MLP ``f(x_t, t)`` over the concatenated one-hot codes (and, absorbing,
the mask flags) and a sinusoidal time embedding, giving per-attribute logits of ``x̂_0``.

No record reaches it, so it cannot learn from a denoising loss on data. It learns from
the measurements: each step runs the reverse chain for a batch of ``batch`` rows
(straight-through Gumbel-softmax draws, so the forward pass is the sampler
and the gradients flow through the chain), takes the differentiable marginals of the
batch's final distributions, and minimises the workload-guided loss of
:class:`synth.engine.NeuralEngine`: ``Σ_c w_c ||p_c(θ) − y_c / N||²`` with ``w_c ∝ 1/σ_c²``
(the Gaussian likelihood of each measurement), times ``off_workload_weight`` off the
workload. A fresh batch each step makes it a generator of a distribution, not a fixed
relaxed dataset. Fitting and sampling are post-processing of DP measurements.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from synth.domain import Domain
from synth.engine import (Clique, NoisyMarginal, _check_n, _relaxed_marginal, _resolve_total,
                          check_marginals, marginal_loss_terms)

#: Rows whose final distributions give :meth:`DiffusionFittedModel.marginal`.
MARGINAL_ROWS = 8192
#: The forward kernels (``DiffusionEngine.noise``): ``"absorbing"`` (masking) or
#: ``"uniform"`` (multinomial).
NOISES = ("absorbing", "uniform")


def cosine_alphas(steps: int, s: float = 0.008) -> np.ndarray:
    """``ᾱ_0 .. ᾱ_T`` of the cosine schedule (Nichol & Dhariwal 2021), ``ᾱ_0 = 1``,
    ``ᾱ_T`` ≈ 0, decreasing."""
    t = np.arange(steps + 1) / steps
    f = np.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    return np.clip(f / f[0], 0.0, 1.0)


def _build(sizes: Sequence[int], hidden: int, layers: int, seed: int,
           self_condition: bool = False, noise: str = "uniform") -> Any:
    import torch

    width = int(sum(sizes))
    mods: list[Any] = []
    # absorbing: one "still masked" flag per attribute as well
    d = width * (2 if self_condition else 1) + 16 + (len(sizes) if noise == "absorbing" else 0)
    with torch.random.fork_rng(devices=[]):  # seeded init, the caller's torch RNG untouched
        torch.manual_seed(int(seed))
        for _ in range(layers):
            mods += [torch.nn.Linear(d, hidden), torch.nn.SiLU()]
            d = hidden
        mods.append(torch.nn.Linear(d, width))
    return torch.nn.Sequential(*mods)


class _Chain:
    """The reverse chain of one denoiser (torch, CPU)."""

    def __init__(self, net: Any, sizes: Sequence[int], steps: int,
                 self_condition: bool = False) -> None:
        import torch

        self.net, self.sizes, self.steps = net, list(sizes), int(steps)
        self.self_condition = bool(self_condition)
        abar = cosine_alphas(self.steps)
        self.abar = torch.as_tensor(abar, dtype=torch.float32)
        alpha = np.ones_like(abar)
        alpha[1:] = abar[1:] / np.maximum(abar[:-1], 1e-12)
        self.alpha = torch.as_tensor(alpha, dtype=torch.float32)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).tolist()
        half = 8
        self.freqs = torch.exp(-math.log(1000.0) * torch.arange(half) / half)

    def _time(self, t: int, n: int, steps: int | None = None) -> Any:
        import torch

        arg = (t / (steps or self.steps) * 1000.0) * self.freqs
        return torch.cat([torch.sin(arg), torch.cos(arg)]).expand(n, -1)

    def _split(self, z: Any) -> list[Any]:
        return [z[:, self.offsets[j]:self.offsets[j + 1]] for j in range(len(self.sizes))]

    def run(self, n: int, gen: Any, *, hard_sample: bool, tau: float = 1.0) -> list[Any]:
        """``n`` chains from uniform noise; returns the final per-attribute ``x̂_0``
        distributions ``(n, K_j)``. ``hard_sample``: plain categorical draws (sampling,
        no gradient); else straight-through Gumbel-softmax draws (training)."""
        import torch

        xs = [torch.nn.functional.one_hot(torch.randint(k, (n,), generator=gen), k).float()
              for k in self.sizes]
        # self-conditioning: the previous step's x̂_0 estimate (zeros at t = T) is an input
        prev = [torch.zeros(n, sum(self.sizes))] if self.self_condition else []
        for t in range(self.steps, 0, -1):
            logits = self._split(self.net(torch.cat([*xs, *prev, self._time(t, n)], dim=1)))
            x0 = [torch.softmax(lg, dim=1) for lg in logits]
            if self.self_condition:
                prev = [torch.cat(x0, dim=1)]
            if t == 1:
                return x0
            a, ab = self.alpha[t], self.abar[t - 1]
            nxt = []
            for x, p, k in zip(xs, x0, self.sizes, strict=True):
                post = (a * x + (1 - a) / k) * (ab * p + (1 - ab) / k)
                logp = torch.log(post.clamp_min(1e-30))
                if hard_sample:
                    g = -torch.log(-torch.log(torch.rand(logp.shape, generator=gen)
                                              .clamp(1e-20, 1.0)))
                    nxt.append(torch.nn.functional.one_hot((logp + g).argmax(1), k).float())
                else:
                    u = torch.rand(logp.shape, generator=gen).clamp(1e-20, 1.0)
                    soft = torch.softmax((logp - torch.log(-torch.log(u))) / tau, dim=1)
                    hard = torch.nn.functional.one_hot(soft.argmax(1), k).float()
                    nxt.append(hard + soft - soft.detach())
            xs = nxt
        raise AssertionError("unreachable: steps >= 1")


class _MaskChain(_Chain):
    """The reverse chain of absorbing-state (masking) diffusion, the discrete diffusion
    of D3PM's absorbing kernel (Austin et al., "Structured Denoising Diffusion Models in
    Discrete State-Spaces", NeurIPS 2021), which with one attribute per step is an
    order-agnostic autoregressive model (Hoogeboom et al., "Autoregressive Diffusion
    Models", ICLR 2022). ``x_T`` has every attribute masked; each chain draws its own
    random order of the attributes, and step ``s`` (of ``T``) unmasks the ``s``-th of
    ``T`` equal groups of them: their values are drawn from the denoiser's ``x̂_0``
    given everything decided so far, and stay. The last group's ``x̂_0`` distributions
    are returned with the earlier groups' drawn one-hots. Unlike the uniform kernel,
    where every step redraws every attribute independently, a value once drawn conditions
    all later ones, so near-deterministic pairs (Adult's ``education`` and
    ``educational-num``) come out consistent whenever they fall in different groups."""

    def run(self, n: int, gen: Any, *, hard_sample: bool, tau: float = 1.0) -> list[Any]:
        """``n`` chains from all-masked; per attribute ``(n, K_j)``: a drawn one-hot
        (straight-through Gumbel-softmax when training) or, for the last group, its
        ``x̂_0`` distribution."""
        import torch

        d = len(self.sizes)
        steps = min(self.steps, d)  # more steps than attributes would unmask nothing
        order = torch.argsort(torch.rand(n, d, generator=gen), dim=1)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(d).expand(n, d).contiguous())
        group = (rank * steps) // d  # the step (0 .. steps - 1) that unmasks each attribute
        xs = [torch.zeros(n, k) for k in self.sizes]
        masked = torch.ones(n, d)
        prev = [torch.zeros(n, sum(self.sizes))] if self.self_condition else []
        for s in range(steps):
            logits = self._split(self.net(torch.cat(
                [*xs, masked, *prev, self._time(steps - s, n, steps)], dim=1)))
            x0 = [torch.softmax(lg, dim=1) for lg in logits]
            if self.self_condition:
                prev = [torch.cat(x0, dim=1)]
            now = (group == s).float()
            nxt = []
            for j, (x, p, k) in enumerate(zip(xs, x0, self.sizes, strict=True)):
                if s == steps - 1:
                    val = p
                elif hard_sample:
                    pick = torch.multinomial(p.clamp_min(1e-12), 1, generator=gen)[:, 0]
                    val = torch.nn.functional.one_hot(pick, k).float()
                else:
                    u = torch.rand(p.shape, generator=gen).clamp(1e-20, 1.0)
                    soft = torch.softmax((torch.log(p.clamp_min(1e-30))
                                          - torch.log(-torch.log(u))) / tau, dim=1)
                    hard = torch.nn.functional.one_hot(soft.argmax(1), k).float()
                    val = hard + soft - soft.detach()
                nxt.append(x + now[:, j:j + 1] * val)
            xs, masked = nxt, masked * (1.0 - now)
        return xs


def _make_chain(net: Any, sizes: Sequence[int], steps: int, self_condition: bool,
                noise: str) -> _Chain:
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    cls = _MaskChain if noise == "absorbing" else _Chain
    return cls(net, sizes, steps, self_condition)


class _GramLoss:
    """The workload-guided loss of :func:`synth.engine.marginal_loss` for 1- and 2-way
    marginals from one matrix product: with ``P`` the ``(n, width)`` concatenated row
    distributions, every 2-way relaxed marginal is a block of ``PᵀP / n`` and every 1-way
    one a segment of ``P``'s column means. A clique measured more than once enters once,
    at its measurements' weighted mean target with their summed weight (the same
    gradient: ``Σ_k w_k||p − y_k||²`` and ``(Σ_k w_k)||p − ȳ||²`` differ by a constant).
    Larger cliques keep the generic term."""

    def __init__(self, sizes: Sequence[int], targets: Sequence[Any],
                 idxs: Sequence[Sequence[int]], wts: Sequence[float]) -> None:
        import torch

        off = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        width = int(off[-1])
        w2 = np.zeros((width, width)); y2 = np.zeros((width, width))
        w1 = np.zeros(width); y1 = np.zeros(width)
        self.rest: list[tuple[list[int], Any, float]] = []
        for idx, y, w in zip(idxs, targets, wts, strict=True):
            yv = np.asarray(y, dtype=np.float64).ravel()
            if len(idx) == 1:
                sl = slice(off[idx[0]], off[idx[0] + 1])
                y1[sl] += w * yv
                w1[sl] += w
            elif len(idx) == 2:
                i, j = idx
                if i > j:  # one orientation: the block of the lower attribute's rows
                    i, j = j, i
                    yv = yv.reshape(sizes[j], sizes[i]).T.ravel()
                blk = (slice(off[i], off[i + 1]), slice(off[j], off[j + 1]))
                y2[blk] += w * yv.reshape(sizes[i], sizes[j])
                w2[blk] += w
            else:
                self.rest.append((list(idx), y, w))
        y1 = np.divide(y1, w1, out=np.zeros_like(y1), where=w1 > 0)
        y2 = np.divide(y2, w2, out=np.zeros_like(y2), where=w2 > 0)
        self.w1 = torch.as_tensor(w1, dtype=torch.float32)
        self.y1 = torch.as_tensor(y1, dtype=torch.float32)
        self.w2 = torch.as_tensor(w2, dtype=torch.float32)
        self.y2 = torch.as_tensor(y2, dtype=torch.float32)
        self.off = off.tolist()

    def __call__(self, flat: Any) -> Any:
        import torch

        n = flat.shape[0]
        loss = torch.sum(self.w1 * (flat.mean(0) - self.y1) ** 2)
        loss = loss + torch.sum(self.w2 * (flat.T @ flat / n - self.y2) ** 2)
        if self.rest:
            probs = [flat[:, self.off[j]:self.off[j + 1]] for j in range(len(self.off) - 1)]
            for idx, y, w in self.rest:
                loss = loss + w * torch.sum((_relaxed_marginal(probs, idx, torch) - y) ** 2)
        return loss


@dataclass(slots=True, kw_only=True)
class DiffusionFittedModel:
    """A fitted multinomial diffusion model.

    Attributes:
        domain: the domain.
        total: the record count the marginals are scaled to.
        state: the denoiser's weights (name -> float32 array).
        hidden / layers / steps: its shape and the chain's length.
        self_condition: whether the denoiser also takes the previous step's x̂_0.
        noise: the forward kernel, one of :data:`NOISES` (``"uniform"`` for models saved
            before the absorbing kernel existed).
        probs: final distributions of :data:`MARGINAL_ROWS` chains (float64, per
            attribute), from which :meth:`marginal` is computed.
        losses: the training loss every 50 steps.
        fit_seconds: wall time of the fit.
    """

    domain: Domain
    total: float
    state: dict[str, np.ndarray]
    hidden: int
    layers: int
    steps: int
    self_condition: bool = False
    noise: str = "uniform"
    probs: tuple[np.ndarray, ...] = ()
    losses: tuple[float, ...] = ()
    fit_seconds: float = 0.0

    def _chain(self) -> _Chain:
        import torch

        net = _build(self.domain.sizes, self.hidden, self.layers, 0, self.self_condition,
                     self.noise)
        net.load_state_dict({k: torch.as_tensor(v) for k, v in self.state.items()})
        return _make_chain(net, self.domain.sizes, self.steps, self.self_condition,
                           self.noise)

    def marginal(self, clique: Sequence[str]) -> np.ndarray:
        """The model's marginal over ``clique`` (float64 counts summing to ``total``):
        the mean outer product of the final distributions of :data:`MARGINAL_ROWS` chains
        (a Monte Carlo estimate of the sampler's expected marginal)."""
        c = tuple(clique)
        idx = [self.domain.index(a) for a in c]
        return (_relaxed_marginal(self.probs, idx, np) * self.total).reshape(
            self.domain.shape(c))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows, each from its own reverse chain: ``(n, d)`` int32 codes."""
        import torch

        n = _check_n(n)
        out = np.empty((n, len(self.domain)), dtype=np.int32)
        if not n:
            return out
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        chain = self._chain()
        with torch.no_grad():
            for s in range(0, n, 8192):
                m = min(8192, n - s)
                for j, p in enumerate(chain.run(m, gen, hard_sample=True)):
                    out[s:s + m, j] = torch.multinomial(p.clamp_min(0), 1, generator=gen)[:, 0]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffusionEngine:
    """Discrete diffusion trained on the noisy marginals (module docstring).

    Attributes:
        steps: Adam steps (one batch of chains each).
        batch: chains per step (the rows whose marginals are matched). At equal compute,
            more steps of smaller batches fit better (uniform kernel, Adult, K = 10,
            ε = 1, all 3-way TV at lr 1e-2: 1,024 x 1,500 0.134-0.139, 512 x 3,000
            0.125, 256 x 6,000 0.105, 128 x 12,000 0.115; 256 x 6,000 at lr 5e-3 0.099).
        noise: the forward kernel, one of :data:`NOISES`: ``"absorbing"`` (the default;
            :class:`_MaskChain`: each chain unmasks the attributes in its own random
            order, ``T`` groups, a drawn value stays) or ``"uniform"`` (multinomial
            diffusion, every step redraws every attribute). Same refit as above, 256 x
            6,000 at lr 5e-3: absorbing with T = 5 0.069 against uniform's 0.099 (`mbi`
            0.051).
        diffusion_steps: ``T``, the chain's length (absorbing: at most the number of
            attributes; one attribute a step is an order-agnostic autoregressive model).
        hidden / layers: the denoiser MLP.
        lr: Adam learning rate (cosine-annealed to a twentieth of it).
        tau: the Gumbel-softmax temperature of the training draws.
        self_condition: feed each reverse step the previous step's x̂_0 estimate as well
            as ``x_t`` (self-conditioning, Chen et al., "Analog Bits", ICLR 2023), so
            what the chain has decided passes from step to step without the posterior's
            per-attribute noise; the sampler's joint structure no longer has to survive
            the factorised posterior draws alone.
        off_workload_weight: weight factor of marginals outside the workload.
        name: ``"diffusion"``.
    """

    steps: int = 6000
    batch: int = 256
    noise: str = "absorbing"
    diffusion_steps: int = 5
    hidden: int = 256
    layers: int = 2
    lr: float = 5e-3
    tau: float = 1.0
    off_workload_weight: float = 0.5
    self_condition: bool = True
    name: str = field(default="diffusion", init=False)

    def fit(self, domain: Domain, marginals: Sequence[NoisyMarginal], *,
            total: float | None = None, workload: Sequence[Clique] | None = None,
            seed: int = 0, warm_start: Any = None) -> DiffusionFittedModel:
        """Train the denoiser (deterministic for a given ``seed`` on CPU, one thread).

        ``warm_start``: an earlier :class:`DiffusionFittedModel` of the same shape: its
        weights initialise the denoiser.

        Raises:
            EngineInputError: bad marginals or total.
            ValueError: bad hyper-parameters.
        """
        import torch

        if (self.steps < 0 or self.batch < 1 or self.diffusion_steps < 1 or self.hidden < 1
                or self.layers < 1 or not self.lr > 0 or not self.tau > 0
                or self.noise not in NOISES):
            raise ValueError(f"bad DiffusionEngine parameters {self!r}")
        check_marginals(domain, marginals)
        tot = _resolve_total(total, marginals)
        targets, idxs, wts = marginal_loss_terms(marginals, tot, workload,
                                                 self.off_workload_weight, domain)
        t0 = time.perf_counter()
        net = _build(domain.sizes, self.hidden, self.layers, seed, self.self_condition,
                     self.noise)
        if (isinstance(warm_start, DiffusionFittedModel) and warm_start.hidden == self.hidden
                and warm_start.noise == self.noise
                and warm_start.layers == self.layers
                and warm_start.steps == self.diffusion_steps
                and warm_start.self_condition == self.self_condition
                and tuple(warm_start.domain.sizes) == tuple(domain.sizes)):
            net.load_state_dict({k: torch.as_tensor(v) for k, v in warm_start.state.items()})
        chain = _make_chain(net, domain.sizes, self.diffusion_steps, self.self_condition,
                            self.noise)
        gram = _GramLoss(domain.sizes, targets, idxs, wts)
        gen = torch.Generator().manual_seed(int(seed) + 1)
        opt = torch.optim.Adam(net.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, self.steps),
                                                           eta_min=self.lr / 20)
        losses: list[float] = []
        for step in range(self.steps):
            opt.zero_grad(set_to_none=True)
            probs = chain.run(self.batch, gen, hard_sample=False, tau=self.tau)
            loss = gram(torch.cat(probs, dim=1))
            loss.backward()
            opt.step()
            sched.step()
            if step % 50 == 0 or step == self.steps - 1:
                losses.append(float(loss.detach()))
        with torch.no_grad():
            final = chain.run(MARGINAL_ROWS, gen, hard_sample=True)
        state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
        return DiffusionFittedModel(
            domain=domain, total=tot, state=state, hidden=self.hidden, layers=self.layers,
            steps=self.diffusion_steps, self_condition=self.self_condition,
            noise=self.noise, probs=tuple(p.double().numpy() for p in final),
            losses=tuple(losses), fit_seconds=time.perf_counter() - t0)


__all__ = ["DiffusionEngine", "DiffusionFittedModel", "MARGINAL_ROWS", "NOISES",
           "cosine_alphas"]
