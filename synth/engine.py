"""Synthesis engines: fit a model to noisy aggregate marginals, then sample synthetic rows.

One small interface, interchangeable implementations (Flower/mbi style):

* :class:`Engine` (a Protocol): ``fit(domain, marginals, *, total, workload, seed)``
  returns a :class:`FittedModel`, which can ``sample(n, rng)`` rows in domain codes
  and report its ``marginal(clique)`` estimate (counts scaled to the total).
* :class:`MbiEngine`: Private-PGM (McKenna, Sheldon & Miklau, "Graphical-model based
  estimation and inference for differential privacy", ICML 2019) through ``mbi``
  2.0.0: a Markov random field fitted by mirror descent to the Gaussian likelihood
  of the measurements. ``mbi`` (and jax) is an optional dependency, imported lazily;
  a missing install raises :class:`EngineUnavailable` with the install hint.
* :class:`synth.diffusion.DiffusionEngine`: discrete diffusion (absorbing kernel by
  default, or TabDDPM's multinomial one) trained by the same workload-guided marginal
  loss through its reverse chain.
* :class:`NeuralEngine`: a torch generator in the RAP/GEM line (Aydore et al.,
  "Differentially Private Query Release Through Adaptive Projection", ICML 2021;
  Liu, Vietri & Wu, "Iterative Methods for Private Synthetic Data: Unifying
  Framework and New Methods", NeurIPS 2021): a relaxed synthetic dataset of M rows,
  each row a product of per-attribute softmax distributions, trained with Adam so
  that its differentiable marginals match the noisy measured ones. Needs only torch.

Everything an engine receives is post-processing of DP measurements (the noisy
aggregate), so fitting and sampling spend no privacy budget.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from synth.domain import Domain, DomainError

Clique = tuple[str, ...]

MBI_INSTALL_HINT = 'pip install -e ".[mbi]"'
ENGINES: tuple[str, ...] = ("mbi", "neural", "diffusion")


# ---------------------------------------------------------------------------- errors
class EngineError(RuntimeError):
    """Base class of engine errors."""


class EngineUnavailable(EngineError, ImportError):
    """An engine's optional dependency is not installed.

    Attributes:
        engine: the engine name (e.g. ``"mbi"``).
        package: the missing package.
        hint: the command that installs it.
    """

    def __init__(self, *, engine: str, package: str, hint: str) -> None:
        self.engine = engine
        self.package = package
        self.hint = hint
        super().__init__(f"engine {engine!r} needs the optional package {package!r}; "
                         f"install it with: {hint}")


class EngineInputError(EngineError, ValueError):
    """Bad input to an engine: an unknown engine name, or a marginal that does not fit.

    Attributes:
        clique: the offending clique (None if not about one marginal).
        reason: what is wrong.
    """

    def __init__(self, reason: str, *, clique: Clique | None = None) -> None:
        self.clique = clique
        self.reason = reason
        super().__init__(f"marginal {clique!r}: {reason}" if clique is not None else reason)


# ---------------------------------------------------------------------------- data
@dataclass(frozen=True, slots=True, kw_only=True)
class NoisyMarginal:
    """One noisy aggregate marginal, the unit the aggregate hands to the engine.

    Attributes:
        clique: the attributes, in the order of the flattened axes.
        values: float64 ``(cells,)``: the noisy counts, flattened in C order over the
            clique's domain sizes (entries may be negative).
        sigma: the total noise std of the aggregate (the central sigma), > 0.

    Raises:
        EngineInputError: an empty or repeated-attribute clique, non-finite values,
            or a sigma that is not positive and finite.
    """

    clique: tuple[str, ...]
    values: np.ndarray
    sigma: float

    def __post_init__(self) -> None:
        c = tuple(self.clique)
        if not c or len(set(c)) != len(c):
            raise EngineInputError("a clique must be a non-empty tuple of distinct attributes",
                                   clique=c)
        v = np.asarray(self.values, dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(v)):
            raise EngineInputError("values must be finite", clique=c)
        s = float(self.sigma)
        if not (0.0 < s < math.inf):
            raise EngineInputError(f"sigma must be positive and finite, got {self.sigma!r}",
                                   clique=c)
        v.setflags(write=False)
        object.__setattr__(self, "clique", c)
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "sigma", s)


def check_marginals(domain: Domain, marginals: Sequence[NoisyMarginal]) -> None:
    """Check that every marginal's clique is in the domain and its length matches.

    Raises:
        EngineInputError: no marginals, an unknown attribute, or a wrong length.
    """
    if not marginals:
        raise EngineInputError("no marginals to fit")
    for m in marginals:
        try:
            cells = domain.size(m.clique)
        except DomainError as e:
            raise EngineInputError(str(e), clique=m.clique) from e
        if m.values.size != cells:
            raise EngineInputError(f"{m.values.size} values for {cells} cells "
                                   f"(shape {domain.shape(m.clique)})", clique=m.clique)


def estimate_total(marginals: Sequence[NoisyMarginal]) -> float:
    """Minimum-variance unbiased estimate of the record count from the marginals' sums.

    The sum of a marginal with ``c`` cells and noise std σ has variance ``c·σ²``; the
    estimate is the inverse-variance weighted mean of the sums, floored at 1.

    Returns:
        The estimated total (float, ≥ 1).
    """
    sums = np.array([m.values.sum() for m in marginals])
    var = np.array([m.values.size * m.sigma ** 2 for m in marginals])
    w = 1.0 / var
    return max(1.0, float(np.sum(w * sums) / np.sum(w)))


def _resolve_total(total: float | None, marginals: Sequence[NoisyMarginal]) -> float:
    if total is None:
        return estimate_total(marginals)
    t = float(total)
    if not (0.0 < t < math.inf):
        raise EngineInputError(f"total must be positive and finite, got {total!r}")
    return t


# ---------------------------------------------------------------------------- interface
@runtime_checkable
class FittedModel(Protocol):
    """A fitted generative model over a :class:`Domain`."""

    domain: Domain
    total: float

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``(n, len(domain))`` int32 codes of n synthetic rows."""
        ...

    def marginal(self, clique: Sequence[str]) -> np.ndarray:
        """The model's float64 marginal over ``clique`` (shape ``domain.shape(clique)``),
        as counts summing to ``total``."""
        ...


@runtime_checkable
class Engine(Protocol):
    """Fits a :class:`FittedModel` to noisy marginals."""

    name: str

    def fit(self, domain: Domain, marginals: Sequence[NoisyMarginal], *,
            total: float | None = None, workload: Sequence[Clique] | None = None,
            seed: int = 0) -> FittedModel:
        """Fit a model.

        Args:
            domain: the shared public domain.
            marginals: the noisy aggregate marginals (a clique may appear more than once).
            total: the number of records (None: estimated from the marginals).
            workload: the cliques the output will be judged on (used by engines that
                weight their loss by it).
            seed: fixes all randomness of the fit.
        """
        ...


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    return int(n)


# ---------------------------------------------------------------------------- mbi
def _import_mbi() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mbi warns about JAX float32 / compile cache
            import mbi
            from mbi import estimation  # noqa: F401
    except ImportError as e:
        raise EngineUnavailable(engine="mbi", package="mbi==2.0.0", hint=MBI_INSTALL_HINT) from e
    return mbi


@dataclass(slots=True, kw_only=True)
class MbiFittedModel:
    """An mbi ``MarkovRandomField`` wrapped in the :class:`FittedModel` interface.

    Attributes:
        domain: our domain.
        total: the record count the marginals are scaled to.
        model: the mbi model (``mbi.MarkovRandomField``).
        fit_seconds: wall time of the fit.
    """

    domain: Domain
    total: float
    model: Any
    fit_seconds: float = 0.0

    def marginal(self, clique: Sequence[str]) -> np.ndarray:
        """The model's marginal over ``clique`` (axes in the clique's order), float64
        counts summing to ``total``. Raises DomainError on an unknown attribute."""
        c = tuple(clique)
        shape = self.domain.shape(c)
        f = self.model.project(c)
        arr = np.asarray(f.datavector(flatten=False), dtype=np.float64).reshape(shape)
        s = arr.sum()
        return arr * (self.total / s) if s > 0 else np.full(shape, self.total / arr.size)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows from ``model.synthetic_data(n)`` (randomised rounding of the
        junction-tree conditionals), as ``(n, d)`` int32 codes.

        mbi draws from NumPy's global generator; it is seeded from ``rng`` for the call
        and its previous state restored afterwards.
        """
        n = _check_n(n)
        d = len(self.domain)
        if n == 0:
            return np.zeros((0, d), dtype=np.int32)
        state = np.random.get_state()
        try:
            np.random.seed(int(rng.integers(0, 2 ** 32 - 1)))
            data = self.model.synthetic_data(n).to_dict()
        finally:
            np.random.set_state(state)
        out = np.empty((n, d), dtype=np.int32)
        for j, a in enumerate(self.domain.attributes):
            out[:, j] = np.asarray(data[a], dtype=np.int32)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MbiEngine:
    """Private-PGM through ``mbi`` 2.0.0 (optional extra ``[mbi]``).

    Each :class:`NoisyMarginal` becomes ``mbi.LinearMeasurement(values, clique,
    stddev=sigma)``; ``mbi.estimation.MirrorDescent().estimate(domain, measurements,
    known_total=total, iters=iters)`` fits a Markov random field whose cliques are
    the measured ones (exact inference on their junction tree, so a set of cliques
    whose junction tree is too large costs memory: measure trees or small cliques).

    Attributes:
        iters: mirror-descent iterations.
        stepsize: fixed step (None: Armijo line search, mbi's default).
        tol: early-stopping relative tolerance (None: run all ``iters``).

    Raises (from :meth:`fit`):
        EngineUnavailable: ``mbi`` is not installed (hint ``pip install -e ".[mbi]"``).
        EngineInputError: bad marginals or total.
    """

    iters: int = 1000
    stepsize: float | None = None
    tol: float | None = None
    name: str = field(default="mbi", init=False)

    def fit(self, domain: Domain, marginals: Sequence[NoisyMarginal], *,
            total: float | None = None, workload: Sequence[Clique] | None = None,
            seed: int = 0, warm_start: Any = None) -> MbiFittedModel:
        """Fit a graphical model (``workload`` and ``seed`` are unused: the fit is
        deterministic and its loss is the likelihood of the measurements).

        ``warm_start``: an earlier :class:`MbiFittedModel` or potentials from
        :func:`load_warm_start`; mbi expands its potentials to any new cliques and starts
        the mirror descent there (incremental refits after a workload update)."""
        mbi = _import_mbi()
        check_marginals(domain, marginals)
        tot = _resolve_total(total, marginals)
        mdom = mbi.Domain(tuple(domain.attributes), tuple(domain.sizes))
        meas = [mbi.LinearMeasurement(np.asarray(m.values, dtype=np.float64), m.clique,
                                      stddev=float(m.sigma)) for m in marginals]
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = mbi.estimation.MirrorDescent(stepsize=self.stepsize)
            warm = warm_start.model if isinstance(warm_start, MbiFittedModel) else warm_start
            model = est.estimate(mdom, meas, known_total=tot, iters=int(self.iters),
                                 tol=self.tol, warm_start=warm)
        return MbiFittedModel(domain=domain, total=tot, model=model,
                              fit_seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------- neural
def _relaxed_marginal(probs: Sequence[Any], idx: Sequence[int], xp: Any) -> Any:
    """Mean over rows of the outer product of per-row attribute distributions.

    ``probs[j]`` is ``(M, k_j)``; returns the flattened (C order over ``idx``)
    ``(prod k,)`` marginal of the relaxed dataset, summing to 1. Works for numpy and
    torch (``xp`` provides nothing but is passed for clarity of the two call sites).
    """
    p = probs[idx[0]]
    m = p.shape[0]
    for j in idx[1:]:
        q = probs[j]
        p = (p[:, :, None] * q[:, None, :]).reshape(m, -1)
    return p.mean(0)


def marginal_loss_terms(marginals: Sequence[NoisyMarginal], total: float,
                        workload: Sequence[Clique] | None, off_workload_weight: float,
                        domain: Domain) -> tuple[list[Any], list[list[int]], list[float]]:
    """The workload-guided loss's terms, per marginal: the target ``y_c / N`` (a float32
    torch tensor), the clique's attribute indices and its weight ``w_c ∝ 1/σ_c²``
    (times ``off_workload_weight`` when no workload clique contains it), normalised to
    mean 1 (which leaves Adam's step scale unchanged)."""
    import torch

    wl = [frozenset(c) for c in workload] if workload else None
    raw = [(1.0 / m.sigma ** 2) * (off_workload_weight if wl is not None and not any(
        frozenset(m.clique) <= c for c in wl) else 1.0) for m in marginals]
    wts = [float(w) for w in np.asarray(raw) / np.mean(raw)]
    targets = [torch.as_tensor(m.values / total, dtype=torch.float32) for m in marginals]
    return targets, [[domain.index(a) for a in m.clique] for m in marginals], wts


def marginal_loss(probs: Sequence[Any], targets: Sequence[Any], idxs: Sequence[Sequence[int]],
                  wts: Sequence[float]) -> Any:
    """``Σ_c w_c ||p_c − y_c / N||²`` of per-row distributions ``probs`` (torch)."""
    import torch

    loss = torch.zeros(())
    for idx, y, w in zip(idxs, targets, wts, strict=True):
        loss = loss + w * torch.sum((_relaxed_marginal(probs, idx, torch) - y) ** 2)
    return loss


@dataclass(slots=True, kw_only=True)
class NeuralFittedModel:
    """A relaxed synthetic dataset: M rows of per-attribute categorical distributions.

    Attributes:
        domain: the domain.
        total: the record count the marginals are scaled to.
        probs: one float64 ``(M, k_j)`` array per attribute (rows sum to 1).
        losses: the training loss every 50 steps (for diagnostics).
        fit_seconds: wall time of the fit.
    """

    domain: Domain
    total: float
    probs: tuple[np.ndarray, ...]
    losses: tuple[float, ...] = ()
    fit_seconds: float = 0.0

    def marginal(self, clique: Sequence[str]) -> np.ndarray:
        """The exact expected marginal of :meth:`sample` over ``clique`` (float64 counts
        summing to ``total``, shape ``domain.shape(clique)``)."""
        c = tuple(clique)
        shape = self.domain.shape(c)
        idx = [self.domain.index(a) for a in c]
        return (_relaxed_marginal(self.probs, idx, np) * self.total).reshape(shape)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` rows: each picks a relaxed row (stratified: every row ⌊n/M⌋ or ⌈n/M⌉
        times, in random order), then draws each attribute from that row's softmax.

        Returns:
            ``(n, d)`` int32 codes.
        """
        n = _check_n(n)
        d = len(self.domain)
        m = self.probs[0].shape[0]
        rows = rng.permutation(np.resize(np.arange(m), n)) if n else np.zeros(0, np.int64)
        out = np.empty((n, d), dtype=np.int32)
        for j, p in enumerate(self.probs):
            cdf = np.cumsum(p[rows], axis=1)
            u = rng.random(n)[:, None] * cdf[:, -1:]
            out[:, j] = np.minimum((u >= cdf).sum(axis=1), p.shape[1] - 1)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class NeuralEngine:
    """RAP/GEM-style relaxed-dataset generator trained with Adam (torch, CPU).

    Model: M synthetic rows, each with free logits per attribute; row i's distribution
    over attribute j is ``softmax(logits_j[i])``. A marginal of the relaxed dataset is
    the mean over rows of the outer product of the clique's per-row distributions
    (Aydore et al. 2021, §4; the softmax parametrisation is GEM's RAP^softmax).

    Loss (workload-guided, Gaussian likelihood): for every measured marginal c with
    noisy counts y_c and noise std σ_c,
    ``w_c · ||p_c(θ) − y_c / N||²``, summed, where p_c is the relaxed marginal and N
    the total. The weight rule: ``w_c ∝ N² / σ_c²`` (the Gaussian log-likelihood of
    the measurement, as Private-PGM's L2 loss), times ``off_workload_weight`` if the
    clique is not contained in any workload clique (it still carries information but
    is not judged); the weights are normalised to mean 1, which leaves Adam's step
    scale unchanged. Noisy targets are not clipped (the noise is unbiased).

    Attributes:
        rows: M, the relaxed rows (more rows, more expressive, slower).
        steps: Adam steps (full batch: every measured marginal each step).
        lr: Adam learning rate on the logits.
        init_scale: std of the initial logits.
        off_workload_weight: weight factor of marginals outside the workload.
        tol: stop early when the loss, checked every 50 steps, improved by less than
            this relative amount since the last check (0 disables early stopping).
        name: ``"neural"``.
    """

    rows: int = 1000
    steps: int = 1500
    lr: float = 0.05
    init_scale: float = 0.1
    off_workload_weight: float = 0.5
    tol: float = 1e-4
    name: str = field(default="neural", init=False)

    def fit(self, domain: Domain, marginals: Sequence[NoisyMarginal], *,
            total: float | None = None, workload: Sequence[Clique] | None = None,
            seed: int = 0, warm_start: Any = None) -> NeuralFittedModel:
        """Train the relaxed dataset (deterministic for a given ``seed`` on CPU).

        ``warm_start``: an earlier :class:`NeuralFittedModel` with the same rows: its
        per-row distributions initialise the logits (their logs), so training continues
        from it (incremental refits after a workload update).

        Raises:
            EngineInputError: bad marginals or total.
            ValueError: bad hyper-parameters.
        """
        import torch

        if self.rows < 1 or self.steps < 0 or not (self.lr > 0):
            raise ValueError(f"bad NeuralEngine parameters rows={self.rows}, "
                             f"steps={self.steps}, lr={self.lr}")
        check_marginals(domain, marginals)
        tot = _resolve_total(total, marginals)
        targets, idxs, wt = marginal_loss_terms(marginals, tot, workload,
                                                self.off_workload_weight, domain)
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(int(seed))
        dt = torch.float32
        if (isinstance(warm_start, NeuralFittedModel)
                and all(p.shape == (self.rows, k) for p, k in zip(warm_start.probs, domain.sizes,
                                                                  strict=True))):
            logits = [torch.nn.Parameter(torch.log(torch.as_tensor(p, dtype=dt).clamp_min(1e-12)))
                      for p in warm_start.probs]
        else:
            logits = [torch.nn.Parameter(torch.randn(self.rows, k, generator=gen, dtype=dt)
                                         * self.init_scale) for k in domain.sizes]
        opt = torch.optim.Adam(logits, lr=self.lr)
        losses: list[float] = []
        for step in range(self.steps):
            opt.zero_grad(set_to_none=True)
            loss = marginal_loss([torch.softmax(lg, dim=1) for lg in logits], targets, idxs,
                                 wt)
            loss.backward()
            opt.step()
            if step % 50 == 0 or step == self.steps - 1:
                cur = float(loss.detach())
                if (self.tol > 0 and losses and step >= 200
                        and losses[-1] - cur <= self.tol * abs(losses[-1])):
                    losses.append(cur)
                    break
                losses.append(cur)
        with torch.no_grad():
            probs_np = tuple(torch.softmax(lg, dim=1).double().numpy() for lg in logits)
        return NeuralFittedModel(domain=domain, total=tot, probs=probs_np,
                                 losses=tuple(losses), fit_seconds=time.perf_counter() - t0)
