"""Fits of a party's system profile: the PubSub-VFL cost model (Sec. 4, system profiling).

Pure numerics (numpy/scipy), no sockets, no processes, no torch. The profiler measures;
this module turns measurements into the models the planner (:mod:`parties.planning.planner`) uses.

The paper's cost model, one worker's batch of B rows when w workers share C cores:

    T_f(B) = λ_f · B^γ_f · w / C          forward, seconds
    T_b(B) = λ_b · B^γ_b · w / C          backward, seconds
    M(B)   = M_0 + ρ · B^χ                memory, bytes

Normalisation: λ is "per core at w = 1", so ``λ · B^γ`` is the work of one step in
core-seconds (what ``time.process_time`` measures for a single-threaded step). A
measurement of t seconds taken with w workers on C cores gives ``λ = t · C / (w · B^γ)``
(the paper's formula solved for λ). When the worker's intra-op threads are known, a
worker cannot use more than ``threads`` cores, so the cores one worker had are
``c = min(threads, C / w)`` and ``λ = t · c / B^γ`` (equal to the paper's when
``threads >= C / w``). :meth:`PowerFit.predict` inverts the same rule.

Communication per message: ``t(n) = a + n / bandwidth`` (n bytes), stored as the
latency ``a`` and ``s_per_byte = 1 / bandwidth`` (so an immeasurably small per-byte cost
is 0, not an infinite bandwidth, and ``profile.json`` holds no infinities).

Hold-out error (all fits): the final parameters are fitted on **all** points; the
hold-out error is the mean ``|pred − meas| / meas`` over the points of held-out B values
predicted by a second fit that did not see them. Default ``holdout="alternate"``: sort
the distinct B values b_0 < b_1 < ... and hold out those at odd positions (b_1, b_3, ...),
so the fit keeps the smallest B and the hold-out mixes interpolation with (for an even
count) extrapolation to the largest B, the planner's typical use. Held-out values are
dropped from the largest down until the hold-out fit keeps the points it needs (2
distinct B for a power or comm fit, 3 for a memory fit); if none can be held out (too
few distinct B) ``rel_err_holdout`` is NaN. ``holdout="none"`` skips it; a sequence of B
values holds out exactly those.

Errors (all subclass :class:`CostModelError`, a ``ValueError``): :class:`TooFewPoints`
(fewer distinct B than the fit needs), :class:`NonPositiveValue` (a B, a time or a
memory <= 0), :class:`NonFiniteValue` (NaN or ±inf), :class:`ShapeMismatch`,
:class:`BadHoldout`, :class:`MemoryLimitTooSmall` (``b_max`` with M̄ <= M_0).

Source: PubSub-VFL (arXiv 2510.12494), Sec. 4, the system-profile cost model that the
planner optimises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar, nnls

#: Memory rules for w workers of one party (see :meth:`MemoryFit.party_bytes`).
MEMORY_RULES = ("shared", "per_worker")


# ------------------------------------------------------------------------------ errors
class CostModelError(ValueError):
    """Root of the cost-model fitting errors."""


class TooFewPoints(CostModelError):
    """Fewer distinct B (or message sizes) than the fit needs.

    Attributes:
        distinct: distinct values given.
        needed: distinct values needed.
    """

    def __init__(self, what: str, distinct: int, needed: int) -> None:
        self.distinct = distinct
        self.needed = needed
        super().__init__(f"{what}: {distinct} distinct value(s), need at least {needed}")


class BadMeasurement(CostModelError):
    """A measurement that cannot enter the fit.

    Attributes:
        name: the argument (``"b"``, ``"t"``, ``"m_bytes"``, ``"nbytes"``).
        index: position of the offending value.
        value: the offending value.
    """

    def __init__(self, name: str, index: int, value: float, why: str) -> None:
        self.name = name
        self.index = index
        self.value = value
        super().__init__(f"{name}[{index}] = {value!r}: {why}")


class NonPositiveValue(BadMeasurement):
    """A batch size, time or memory that is <= 0 (a message size that is < 0)."""


class NonFiniteValue(BadMeasurement):
    """A NaN or infinite measurement."""


class ShapeMismatch(CostModelError):
    """The x and y sequences differ in length or are not 1-D."""


class BadHoldout(CostModelError):
    """An explicit hold-out B value that is not among the measured ones, or an unknown
    hold-out rule."""


class MemoryLimitTooSmall(CostModelError):
    """M̄ <= M_0: not even an empty batch fits.

    Attributes:
        mem_limit_bytes: the limit M̄ asked for.
        m0_bytes: the fitted baseline M_0.
    """

    def __init__(self, mem_limit_bytes: float, m0_bytes: float) -> None:
        self.mem_limit_bytes = mem_limit_bytes
        self.m0_bytes = m0_bytes
        super().__init__(f"memory limit {mem_limit_bytes!r} bytes <= the fitted baseline "
                         f"M_0 = {m0_bytes:.6g} bytes: no batch size fits")


# ----------------------------------------------------------------------------- helpers
def _vector(name: str, x: Sequence[float] | np.ndarray, *, allow_zero: bool = False
            ) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ShapeMismatch(f"{name} must be 1-D, got shape {arr.shape}")
    for i, v in enumerate(arr):
        if not math.isfinite(v):
            raise NonFiniteValue(name, i, float(v), "must be finite")
        if v < 0 or (v == 0 and not allow_zero):
            raise NonPositiveValue(name, i, float(v),
                                   "must be >= 0" if allow_zero else "must be > 0")
    return arr


def _pair(xn: str, x: Sequence[float] | np.ndarray, yn: str, y: Sequence[float] | np.ndarray,
          *, x_zero: bool = False) -> tuple[np.ndarray, np.ndarray]:
    xa = _vector(xn, x, allow_zero=x_zero)
    ya = _vector(yn, y)
    if xa.shape != ya.shape:
        raise ShapeMismatch(f"{xn} has {xa.size} values, {yn} has {ya.size}")
    return xa, ya


def _holdout_values(x: np.ndarray, holdout: str | Sequence[float], min_fit: int) -> set[float]:
    """The x values to hold out (see the module docstring)."""
    distinct = sorted(set(x.tolist()))
    if isinstance(holdout, str):
        if holdout == "none":
            return set()
        if holdout != "alternate":
            raise BadHoldout(f"holdout must be 'alternate', 'none' or a sequence of B "
                             f"values, got {holdout!r}")
        held = distinct[1::2]
        while held and len(distinct) - len(held) < min_fit:
            held.pop()
        return set(held)
    held_set = {float(v) for v in holdout}
    missing = held_set - set(distinct)
    if missing:
        raise BadHoldout(f"hold-out value(s) {sorted(missing)} not among the measured "
                         f"{distinct}")
    if len(distinct) - len(held_set) < min_fit:
        raise TooFewPoints("fit after the hold-out", len(distinct) - len(held_set), min_fit)
    return held_set


def _holdout_error(x: np.ndarray, y: np.ndarray, held: set[float],
                   fit: Callable[[np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]]
                   ) -> float:
    """Mean relative error on the held-out points of a fit that did not see them."""
    if not held:
        return math.nan
    mask = np.isin(x, np.fromiter(held, dtype=np.float64))
    pred = fit(x[~mask], y[~mask])(x[mask])
    return float(np.mean(np.abs(pred - y[mask]) / y[mask]))


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - np.mean(y)) ** 2))
    if ss_tot <= 0.0:
        return 1.0 if ss_res <= 1e-24 * max(1.0, float(np.sum(y ** 2))) else 0.0
    return 1.0 - ss_res / ss_tot


def _nan_to_none(v: float) -> float | None:
    return None if isinstance(v, float) and math.isnan(v) else v


def _none_to_nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _cores_per_worker(workers: int, cores: float, threads: int | None) -> float:
    if workers < 1:
        raise CostModelError(f"workers must be >= 1, got {workers!r}")
    if not cores > 0:
        raise CostModelError(f"cores must be > 0, got {cores!r}")
    if threads is not None and threads < 1:
        raise CostModelError(f"threads must be >= 1, got {threads!r}")
    per = cores / workers
    return per if threads is None else min(float(threads), per)


# ------------------------------------------------------------------------- power fits
@dataclass(frozen=True, slots=True, kw_only=True)
class PowerFit:
    """``t(B) = λ · B^γ / c`` seconds, c the cores one worker has (``λ · B^γ`` is the
    step's work in core-seconds; see the module docstring for the normalisation).

    Attributes:
        lam: λ, core-seconds at B = 1 (> 0).
        gamma: γ, dimensionless; any sign.
        r2: coefficient of determination of the fit on ``(log B, log t)``.
        rel_err_holdout: mean relative error on held-out B values (NaN: none held out).
        n_points: measurements fitted.
        b_lo / b_hi: smallest and largest B measured (0 when built by hand).
    """

    lam: float
    gamma: float
    r2: float = 1.0
    rel_err_holdout: float = math.nan
    n_points: int = 0
    b_lo: float = 0.0
    b_hi: float = 0.0

    def core_seconds(self, b: float | np.ndarray) -> float | np.ndarray:
        """``λ · B^γ``: the work of one step of B rows, core-seconds."""
        return self.lam * np.power(b, self.gamma) if isinstance(b, np.ndarray) \
            else self.lam * float(b) ** self.gamma

    def predict(self, b: float | np.ndarray, *, workers: int = 1, cores: float = 1.0,
                threads: int | None = None) -> float | np.ndarray:
        """Seconds of one worker's step of B rows when ``workers`` workers share ``cores``
        cores, each using at most ``threads`` (None: unbounded, the paper's
        ``λ·B^γ·w/C``).

        Raises:
            CostModelError: ``workers < 1``, ``cores <= 0`` or ``threads < 1``.
        """
        return self.core_seconds(b) / _cores_per_worker(workers, cores, threads)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN as None)."""
        return {"lam": self.lam, "gamma": self.gamma, "r2": self.r2,
                "rel_err_holdout": _nan_to_none(self.rel_err_holdout),
                "n_points": self.n_points, "b_lo": self.b_lo, "b_hi": self.b_hi}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PowerFit:
        """Inverse of :meth:`to_dict`. Raises ``KeyError`` if ``lam``/``gamma`` are missing."""
        return cls(lam=float(d["lam"]), gamma=float(d["gamma"]), r2=float(d.get("r2", 1.0)),
                   rel_err_holdout=_none_to_nan(d.get("rel_err_holdout")),
                   n_points=int(d.get("n_points", 0)), b_lo=float(d.get("b_lo", 0.0)),
                   b_hi=float(d.get("b_hi", 0.0)))


def _loglog(b: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Least squares of ``log t = c + γ log b``: returns ``(c, γ)``."""
    a = np.column_stack([np.ones_like(b), np.log(b)])
    (c, gamma), *_ = np.linalg.lstsq(a, np.log(t), rcond=None)
    return float(c), float(gamma)


def fit_power(b: Sequence[float] | np.ndarray, t: Sequence[float] | np.ndarray, *,
              holdout: str | Sequence[float] = "alternate", workers: int = 1,
              cores: float = 1.0, threads: int | None = None) -> PowerFit:
    """Fit ``log t = log λ' + γ log B`` by least squares (no sign constraint on γ) and
    normalise ``λ = λ' · c``, c the cores per worker during the measurement
    (``C / w``, or ``min(threads, C / w)`` when ``threads`` is given).

    Args:
        b: ``(n,)`` batch sizes, > 0; repeated values (repeated measurements) allowed.
        t: ``(n,)`` seconds per step measured at each B, > 0 (wall seconds of one
            worker; pass CPU seconds with ``workers=1, cores=1`` to fit core-seconds).
        holdout: ``"alternate"`` (default), ``"none"`` or B values to hold out (module
            docstring).
        workers / cores / threads: the measurement's w, C and intra-op threads.

    Returns:
        :class:`PowerFit` fitted on all points, with ``r2`` on log data and the hold-out
        error.

    Raises:
        TooFewPoints: fewer than 2 distinct B.
        NonPositiveValue / NonFiniteValue / ShapeMismatch: bad input.
        BadHoldout: an explicit hold-out value not measured.
    """
    ba, ta = _pair("b", b, "t", t)
    distinct = len(set(ba.tolist()))
    if distinct < 2:
        raise TooFewPoints("power fit", distinct, 2)
    held = _holdout_values(ba, holdout, 2)
    c_per = _cores_per_worker(workers, cores, threads)
    c, gamma = _loglog(ba, ta)
    pred_log = c + gamma * np.log(ba)

    def refit(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        c2, g2 = _loglog(x, y)
        return lambda q: np.exp(c2 + g2 * np.log(q))

    return PowerFit(lam=math.exp(c) * c_per, gamma=gamma, r2=_r2(np.log(ta), pred_log),
                    rel_err_holdout=_holdout_error(ba, ta, held, refit), n_points=int(ba.size),
                    b_lo=float(ba.min()), b_hi=float(ba.max()))


# ------------------------------------------------------------------------- memory fit
@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryFit:
    """``M(B) = M_0 + ρ · B^χ`` bytes: one party's memory with one worker at batch B.

    Attributes:
        m0: M_0, bytes (the party's baseline: interpreter, tables, model).
        rho: ρ, bytes at B = 1 of the batch-dependent part (> 0).
        chi: χ, dimensionless.
        r2: coefficient of determination on the bytes themselves (not on logs: the log
            data depend on M_0).
        rel_err_holdout: mean relative error on held-out B values (NaN: none held out).
        n_points / b_lo / b_hi: as in :class:`PowerFit`.
    """

    m0: float
    rho: float
    chi: float
    r2: float = 1.0
    rel_err_holdout: float = math.nan
    n_points: int = 0
    b_lo: float = 0.0
    b_hi: float = 0.0

    def predict(self, b: float | np.ndarray) -> float | np.ndarray:
        """M(B), bytes."""
        return self.m0 + self.rho * (np.power(b, self.chi) if isinstance(b, np.ndarray)
                                     else float(b) ** self.chi)

    def party_bytes(self, b: float, workers: int = 1, rule: str = "shared") -> float:
        """Memory of a party of ``workers`` workers at batch ``b``, bytes.

        ``"shared"``: ``M_0 + w · ρ · B^χ``: thread workers share the process's baseline
        (tables, interpreter) and each adds its batch-dependent part.
        ``"per_worker"``: ``w · M(B)``: each worker a process with its own baseline.

        Raises:
            CostModelError: unknown rule or ``workers < 1``.
        """
        if rule not in MEMORY_RULES:
            raise CostModelError(f"memory rule must be one of {MEMORY_RULES}, got {rule!r}")
        if workers < 1:
            raise CostModelError(f"workers must be >= 1, got {workers!r}")
        per = self.rho * float(b) ** self.chi
        return self.m0 + workers * per if rule == "shared" else workers * (self.m0 + per)

    def b_max(self, mem_limit_bytes: float, workers: int = 1, rule: str = "shared") -> float:
        """Largest B with ``party_bytes(B, workers, rule) <= M̄``:
        ``((M̄ − M_0) / (w·ρ))^(1/χ)`` (``"shared"``; w = 1 gives the paper's
        ``((M̄ − M_0)/ρ)^(1/χ)``) or ``((M̄/w − M_0) / ρ)^(1/χ)`` (``"per_worker"``).
        ``inf`` when χ <= 0 (memory does not grow with B). Not rounded to an integer.

        Raises:
            MemoryLimitTooSmall: the budget left for batches is <= 0 (M̄ <= M_0, or
                M̄/w <= M_0 per worker).
            CostModelError: unknown rule, ``workers < 1``, or M̄ not a number.
        """
        if rule not in MEMORY_RULES:
            raise CostModelError(f"memory rule must be one of {MEMORY_RULES}, got {rule!r}")
        if workers < 1:
            raise CostModelError(f"workers must be >= 1, got {workers!r}")
        if math.isnan(mem_limit_bytes):
            raise CostModelError("memory limit is NaN")
        if rule == "shared":
            room = (mem_limit_bytes - self.m0) / workers
        else:
            room = mem_limit_bytes / workers - self.m0
        if not room > 0:
            raise MemoryLimitTooSmall(mem_limit_bytes, self.m0)
        if self.chi <= 0:
            return math.inf
        return (room / self.rho) ** (1.0 / self.chi)

    def fits(self, b: float, workers: int, mem_limit_bytes: float | None,
             rule: str = "shared") -> bool:
        """Whether ``workers`` workers at batch ``b`` fit in M̄ (None: no limit). For
        χ > 0 this is ``b <= b_max(...)``, so it agrees with :meth:`b_max` exactly."""
        if mem_limit_bytes is None:
            return True
        try:
            limit = self.b_max(mem_limit_bytes, workers, rule)
        except MemoryLimitTooSmall:
            return False
        if self.chi > 0:
            return b <= limit
        return self.party_bytes(b, workers, rule) <= mem_limit_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN as None)."""
        return {"m0": self.m0, "rho": self.rho, "chi": self.chi, "r2": self.r2,
                "rel_err_holdout": _nan_to_none(self.rel_err_holdout),
                "n_points": self.n_points, "b_lo": self.b_lo, "b_hi": self.b_hi}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryFit:
        """Inverse of :meth:`to_dict`. Raises ``KeyError`` on a missing m0/rho/chi."""
        return cls(m0=float(d["m0"]), rho=float(d["rho"]), chi=float(d["chi"]),
                   r2=float(d.get("r2", 1.0)),
                   rel_err_holdout=_none_to_nan(d.get("rel_err_holdout")),
                   n_points=int(d.get("n_points", 0)), b_lo=float(d.get("b_lo", 0.0)),
                   b_hi=float(d.get("b_hi", 0.0)))


def _memory_given_m0(b: np.ndarray, m: np.ndarray, m0: float) -> tuple[float, float]:
    """``(log ρ, χ)`` of the log-space least squares of ``M − M_0 = ρ B^χ``."""
    return _loglog(b, m - m0)


def _fit_memory_params(b: np.ndarray, m: np.ndarray, m0_lo: float,
                       grid: int = 64) -> tuple[float, float, float]:
    """``(M_0, ρ, χ)``: M_0 by a bounded 1-D search below min(M), ρ and χ by log-space
    least squares given M_0.

    The search variable is ``u = log(min(M) − M_0)`` (the gap below the smallest
    measurement spans many orders of magnitude), over
    ``[log(1e-9 · min M), log(min M − m0_lo)]``. Its objective is the sum of squared
    *relative* residuals of M itself, ``Σ ((M̂ − M)/M)²``: comparable across M_0,
    unlike the log-space residuals, whose scale changes with M_0 (log(M − M_0) blows up
    as M_0 nears min M). The objective need not be unimodal, so a 64-point grid over u
    picks the best cell and a bounded Brent search (``scipy.optimize.minimize_scalar``)
    refines it between the neighbouring grid points.
    """
    m_min = float(m.min())
    hi_gap = m_min - m0_lo
    lo_gap = 1e-9 * m_min
    if not hi_gap > lo_gap:
        raise CostModelError(f"M_0 lower bound {m0_lo!r} is not below min(M) = {m_min!r}")

    def to_m0(u: float) -> float:
        return max(m0_lo, m_min - math.exp(u))  # exp(log(gap)) may overshoot by an ulp

    def loss(u: float) -> float:
        m0 = to_m0(u)
        lr, chi = _memory_given_m0(b, m, m0)
        pred = m0 + math.exp(lr) * np.power(b, chi)
        return float(np.sum(((pred - m) / m) ** 2))

    us = np.linspace(math.log(lo_gap), math.log(hi_gap), grid)
    losses = [loss(float(u)) for u in us]
    k = int(np.argmin(losses))
    lo, hi = us[max(k - 1, 0)], us[min(k + 1, grid - 1)]
    best_u, best_loss = float(us[k]), losses[k]
    if hi > lo:
        res = minimize_scalar(loss, bounds=(float(lo), float(hi)), method="bounded",
                              options={"xatol": 1e-10})
        if res.fun < best_loss:
            best_u = float(res.x)
    m0 = to_m0(best_u)
    lr, chi = _memory_given_m0(b, m, m0)
    return m0, math.exp(lr), chi


def fit_memory(b: Sequence[float] | np.ndarray, m_bytes: Sequence[float] | np.ndarray, *,
               holdout: str | Sequence[float] = "alternate", m0_min: float = 0.0) -> MemoryFit:
    """Fit ``M(B) = M_0 + ρ · B^χ`` (see :func:`_fit_memory_params` for the method).

    Args:
        b: ``(n,)`` batch sizes, > 0.
        m_bytes: ``(n,)`` memory of the party (one worker) at each B, bytes, > 0.
        holdout: as in :func:`fit_power` (the hold-out fit keeps >= 3 distinct B).
        m0_min: lower bound of M_0, bytes (default 0: memory is not negative).

    Returns:
        :class:`MemoryFit` on all points; ``r2`` on the bytes.

    Raises:
        TooFewPoints: fewer than 3 distinct B (three parameters).
        NonPositiveValue / NonFiniteValue / ShapeMismatch / BadHoldout: bad input.
        CostModelError: ``m0_min >= min(M)``.
    """
    ba, ma = _pair("b", b, "m_bytes", m_bytes)
    distinct = len(set(ba.tolist()))
    if distinct < 3:
        raise TooFewPoints("memory fit", distinct, 3)
    held = _holdout_values(ba, holdout, 3)
    m0, rho, chi = _fit_memory_params(ba, ma, m0_min)
    pred = m0 + rho * np.power(ba, chi)

    def refit(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        m02, rho2, chi2 = _fit_memory_params(x, y, m0_min)
        return lambda q: m02 + rho2 * np.power(q, chi2)

    return MemoryFit(m0=m0, rho=rho, chi=chi, r2=_r2(ma, pred),
                     rel_err_holdout=_holdout_error(ba, ma, held, refit),
                     n_points=int(ba.size), b_lo=float(ba.min()), b_hi=float(ba.max()))


# --------------------------------------------------------------------------- comm fit
@dataclass(frozen=True, slots=True, kw_only=True)
class CommFit:
    """Time of one message of n bytes: ``latency_s + n · s_per_byte`` seconds.

    Attributes:
        latency_s: a, seconds per message (>= 0).
        s_per_byte: 1 / bandwidth, seconds per byte (>= 0; 0 = no measurable per-byte
            cost).
        r2: coefficient of determination on the times.
        rel_err_holdout: mean relative error on held-out sizes (NaN: none held out).
        n_points: measurements fitted.
    """

    latency_s: float
    s_per_byte: float
    r2: float = 1.0
    rel_err_holdout: float = math.nan
    n_points: int = 0

    @property
    def bandwidth(self) -> float:
        """Bytes per second (``inf`` when ``s_per_byte`` is 0)."""
        return math.inf if self.s_per_byte == 0 else 1.0 / self.s_per_byte

    def time(self, nbytes: float) -> float:
        """Seconds for one message of ``nbytes`` bytes."""
        return self.latency_s + float(nbytes) * self.s_per_byte

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN as None)."""
        return {"latency_s": self.latency_s, "s_per_byte": self.s_per_byte, "r2": self.r2,
                "rel_err_holdout": _nan_to_none(self.rel_err_holdout),
                "n_points": self.n_points}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CommFit:
        """Inverse of :meth:`to_dict`. Raises ``KeyError`` on missing latency/per-byte."""
        return cls(latency_s=float(d["latency_s"]), s_per_byte=float(d["s_per_byte"]),
                   r2=float(d.get("r2", 1.0)),
                   rel_err_holdout=_none_to_nan(d.get("rel_err_holdout")),
                   n_points=int(d.get("n_points", 0)))


def _linear_nonneg(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Non-negative least squares of ``t = a + s·n`` (columns scaled for conditioning)."""
    scale = float(n.max()) or 1.0
    coef, _ = nnls(np.column_stack([np.ones_like(n), n / scale]), t)
    return float(coef[0]), float(coef[1]) / scale


def fit_comm(nbytes: Sequence[float] | np.ndarray, t: Sequence[float] | np.ndarray, *,
             holdout: str | Sequence[float] = "alternate") -> CommFit:
    """Fit ``t = a + n / bandwidth`` by linear least squares with ``a, 1/bandwidth >= 0``
    (``scipy.optimize.nnls``: a noisy fit cannot yield a negative latency or bandwidth).

    Args:
        nbytes: ``(n,)`` message sizes, bytes, >= 0.
        t: ``(n,)`` one-way seconds per message, > 0.
        holdout: as in :func:`fit_power`, over the message sizes.

    Raises:
        TooFewPoints: fewer than 2 distinct sizes.
        NonPositiveValue / NonFiniteValue / ShapeMismatch / BadHoldout: bad input.
    """
    na, ta = _pair("nbytes", nbytes, "t", t, x_zero=True)
    distinct = len(set(na.tolist()))
    if distinct < 2:
        raise TooFewPoints("comm fit", distinct, 2)
    held = _holdout_values(na, holdout, 2)
    a, s = _linear_nonneg(na, ta)

    def refit(x: np.ndarray, y: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        a2, s2 = _linear_nonneg(x, y)
        return lambda q: a2 + s2 * q

    return CommFit(latency_s=a, s_per_byte=s, r2=_r2(ta, a + s * na),
                   rel_err_holdout=_holdout_error(na, ta, held, refit), n_points=int(na.size))


# -------------------------------------------------------------------------- the model
@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    """One party's fitted cost model (``profile.json``'s ``cost_model.<role>``).

    Attributes:
        role: ``"active"`` or ``"passive"``.
        forward: :class:`PowerFit` of the party's forward share of a step (core-seconds
            normalisation).
        backward: :class:`PowerFit` of its backward share (incl. the optimiser step).
        memory: :class:`MemoryFit` of the party's memory with one worker.
        comm: :class:`CommFit` of one message from this party to its partner (one way).
        cores: C, cores allotted to the party (> 0; may be fractional under a quota).
        param_bytes: bytes of the party's model parameters (one PS push or pull).
        sync_overhead_s: fixed seconds per parameter-server sync (lock, bookkeeping).
        sync_comm: how a PS push/pull of n bytes costs; None = ``comm`` (a PS reached
            over the bus). An in-process PS (thread workers) is a memory copy: pass its
            own fit.
        mem_limit_bytes: M̄, the party's memory budget, bytes; None = unlimited.
    """

    role: str
    forward: PowerFit
    backward: PowerFit
    memory: MemoryFit
    comm: CommFit
    cores: float
    param_bytes: int = 0
    sync_overhead_s: float = 0.0
    sync_comm: CommFit | None = None
    mem_limit_bytes: float | None = None

    def __post_init__(self) -> None:
        if self.role not in ("active", "passive"):
            raise CostModelError(f"role must be 'active' or 'passive', got {self.role!r}")
        if not (math.isfinite(self.cores) and self.cores > 0):
            raise CostModelError(f"cores must be finite and > 0, got {self.cores!r}")
        if self.param_bytes < 0 or not self.sync_overhead_s >= 0:
            raise CostModelError(f"param_bytes and sync_overhead_s must be >= 0, got "
                                 f"{self.param_bytes!r}, {self.sync_overhead_s!r}")

    def work(self, b: float) -> float:
        """Core-seconds of one training step of B rows (forward + backward)."""
        return float(self.forward.core_seconds(b)) + float(self.backward.core_seconds(b))

    def step_time(self, b: float, w: int, cores: float | None = None, threads: int = 1
                  ) -> float:
        """Seconds of one worker's step (T_f + T_b) when ``w`` workers share ``cores``
        cores (None: the party's C), each with at most ``threads`` intra-op threads:
        ``work(B) / min(threads, C / w)``.

        Raises:
            CostModelError: ``w < 1``, ``cores <= 0`` or ``threads < 1``.
        """
        c = self.cores if cores is None else cores
        return self.work(b) / _cores_per_worker(w, c, threads)

    def sync_time(self) -> float:
        """Seconds of one PS sync: the constant plus a push and a pull of the parameters."""
        fit = self.comm if self.sync_comm is None else self.sync_comm
        return self.sync_overhead_s + 2.0 * fit.time(self.param_bytes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"role": self.role, "forward": self.forward.to_dict(),
                "backward": self.backward.to_dict(), "memory": self.memory.to_dict(),
                "comm": self.comm.to_dict(), "cores": self.cores,
                "param_bytes": self.param_bytes, "sync_overhead_s": self.sync_overhead_s,
                "sync_comm": None if self.sync_comm is None else self.sync_comm.to_dict(),
                "mem_limit_bytes": self.mem_limit_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CostModel:
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError: a required field is missing.
            CostModelError: invalid values.
        """
        sync = d.get("sync_comm")
        limit = d.get("mem_limit_bytes")
        return cls(role=d["role"], forward=PowerFit.from_dict(d["forward"]),
                   backward=PowerFit.from_dict(d["backward"]),
                   memory=MemoryFit.from_dict(d["memory"]), comm=CommFit.from_dict(d["comm"]),
                   cores=float(d["cores"]), param_bytes=int(d.get("param_bytes", 0)),
                   sync_overhead_s=float(d.get("sync_overhead_s", 0.0)),
                   sync_comm=None if sync is None else CommFit.from_dict(sync),
                   mem_limit_bytes=None if limit is None else float(limit))


def step_time(cost: CostModel, b: float, w: int, cores: float | None = None,
              threads: int = 1) -> float:
    """Module-level form of :meth:`CostModel.step_time` (seconds per worker step)."""
    return cost.step_time(b, w, cores, threads)
