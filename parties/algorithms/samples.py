"""A measured samples-to-target model for the planner: how many more training samples
PubSub-VFL needs to reach a target with ``(w_active, w_passive, B)`` than with one worker
per party at a reference batch size.

Pure logic: no sockets, no training. The measurements come from pilot runs
(:func:`sim.launch.pilot.pilot_samples_model` trains the real algorithms in one process); this
module only fits and evaluates the model.

The model
---------
``ratio(w_a, w_p, B) = r_B(B) · (1 + κ_a·(w_a − 1)) · (1 + κ_p·Σ_k (w_k − 1))``

* ``r_B``: the batch-size effect of the empirical model of large-batch training
  (McCandlish et al., "An Empirical Model of Large-Batch Training", 2018): the samples to
  a given loss grow as ``1 + B/B_noise``, so relative to ``B_ref``
  ``r_B(B) = (1 + B/B_noise) / (1 + B_ref/B_noise)``; ``B_noise = inf`` (the default)
  means no batch-size effect.
* ``κ_a``: the extra samples per additional active worker (its bottom replicas' and, with
  ``top_update = "replica"``, its top's staleness); ``κ_p``: per additional passive worker
  (summed over the passive parties).

It is a model with three measured numbers, not a law: the staleness a worker count causes
depends on the timing of the run, which pilot runs in one process only approximate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: a pilot that misses the target counts as this many times the training it was given
MISSED_FACTOR = 2.0


class SamplesModelError(ValueError):
    """Bad samples-model input."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplesModel:
    """Samples to target relative to 1 + 1 workers at ``batch_size_ref`` (see the module
    docstring). The default model is 1 everywhere (the planner then plans for throughput).

    Attributes:
        batch_size_ref: B_ref (>= 1).
        batch_noise: B_noise (> 0; inf: no batch-size effect).
        active_worker_cost: κ_a (>= 0).
        passive_worker_cost: κ_p (>= 0).
        source: where the numbers come from (free text, recorded in plans).

    Raises:
        SamplesModelError: a value out of range.
    """

    batch_size_ref: int = 256
    batch_noise: float = math.inf
    active_worker_cost: float = 0.0
    passive_worker_cost: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        if self.batch_size_ref < 1:
            raise SamplesModelError(f"batch_size_ref must be >= 1, got {self.batch_size_ref!r}")
        if not self.batch_noise > 0:
            raise SamplesModelError(f"batch_noise must be > 0, got {self.batch_noise!r}")
        for name in ("active_worker_cost", "passive_worker_cost"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise SamplesModelError(f"{name} must be a finite number >= 0, got {v!r}")

    def batch_ratio(self, batch_size: int) -> float:
        """``r_B(B)``: samples at B over samples at ``batch_size_ref`` (1 workers each)."""
        if batch_size < 1:
            raise SamplesModelError(f"batch_size must be >= 1, got {batch_size!r}")
        if math.isinf(self.batch_noise):
            return 1.0
        return (1.0 + batch_size / self.batch_noise) / (1.0 + self.batch_size_ref / self.batch_noise)

    def ratio(self, w_active: int, w_passive: int | Sequence[int], batch_size: int) -> float:
        """Predicted samples to target at ``(w_active, w_passive, B)`` over 1 + 1 at
        ``batch_size_ref``; ``w_passive`` one count or every passive party's.

        Raises:
            SamplesModelError: a worker count below 1 or B below 1.
        """
        ws = (w_passive,) if isinstance(w_passive, int) else tuple(w_passive)
        if w_active < 1 or not ws or any(w < 1 for w in ws):
            raise SamplesModelError(f"worker counts must be >= 1, got {w_active!r}, {ws!r}")
        return (self.batch_ratio(batch_size)
                * (1.0 + self.active_worker_cost * (w_active - 1))
                * (1.0 + self.passive_worker_cost * sum(w - 1 for w in ws)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplesModel:
        """The model of :meth:`to_dict` (``batch_noise`` None: infinite); a plan.json's or
        pilot document's ``model`` entry works too.

        Raises:
            SamplesModelError: unknown keys or bad values.
        """
        if not isinstance(d, Mapping):
            raise SamplesModelError(f"a samples model is a mapping, got {type(d).__name__}")
        known = {"batch_size_ref", "batch_noise", "active_worker_cost",
                 "passive_worker_cost", "source"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SamplesModelError(f"unknown samples-model keys {unknown}; known: "
                                    f"{sorted(known)}")
        kw = dict(d)
        if kw.get("batch_noise") is None:
            kw.pop("batch_noise", None)
        try:
            return cls(**kw)
        except TypeError as exc:
            raise SamplesModelError(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (an infinite ``batch_noise`` as None)."""
        d = asdict(self)
        if math.isinf(self.batch_noise):
            d["batch_noise"] = None
        return d


def pilot_ratio(samples: float | None, reference: float, budget: float) -> float:
    """One pilot's samples to target over the reference pilot's; a pilot that missed the
    target (``samples`` None) counts as :data:`MISSED_FACTOR` x its ``budget``.

    Raises:
        SamplesModelError: the reference is not positive.
    """
    if not reference > 0:
        raise SamplesModelError(f"the reference pilot must reach the target, got {reference!r}")
    return (MISSED_FACTOR * budget if samples is None else samples) / reference


def fit(samples: Mapping[tuple[int, int, int], float | None], *, budget: float,
        batch_size_ref: int, source: str = "") -> SamplesModel:
    """The model from pilot runs: ``samples[(w_active, w_passive, B)]`` is each pilot's
    samples (or epochs) to the target, None where it missed, ``budget`` what each was
    given. Needs ``(1, 1, batch_size_ref)``; uses, where present, ``(2, 1, B_ref)`` for
    κ_a, ``(1, w, B_ref)`` with the largest w >= 2 for κ_p and ``(1, 1, B)`` with the
    B nearest B_ref for B_noise. Costs below 0 (a pilot faster than the reference) are
    clipped to 0; a batch effect that the model cannot express (a smaller B needing more
    samples) leaves ``B_noise`` infinite.

    Raises:
        SamplesModelError: no reference pilot, or it missed the target.
    """
    ref = samples.get((1, 1, batch_size_ref))
    if ref is None:
        raise SamplesModelError(f"the reference pilot (1, 1, {batch_size_ref}) is missing or "
                                "missed the target")

    def r(key: tuple[int, int, int]) -> float:
        return pilot_ratio(samples[key], ref, budget)

    k_a = max(0.0, r((2, 1, batch_size_ref)) - 1.0) if (2, 1, batch_size_ref) in samples else 0.0
    wps = sorted(w for (wa, w, b) in samples if wa == 1 and b == batch_size_ref and w >= 2)
    k_p = max(0.0, (r((1, wps[-1], batch_size_ref)) - 1.0) / (wps[-1] - 1)) if wps else 0.0
    noise = math.inf
    bs = sorted((b for (wa, wp, b) in samples if wa == wp == 1 and b != batch_size_ref),
                key=lambda b: abs(math.log(b / batch_size_ref)))
    if bs:
        b = bs[0]
        rb = r((1, 1, b))
        # (1 + b/N) / (1 + B_ref/N) = rb  =>  N = (b - rb·B_ref) / (rb - 1)
        if rb != 1.0:
            n = (b - rb * batch_size_ref) / (rb - 1.0)
            noise = n if n > 0 else math.inf
            if n <= 0 and (b < batch_size_ref) == (rb < 1.0):
                noise = 1e-9  # samples proportional to B (the linear limit)
    return SamplesModel(batch_size_ref=batch_size_ref, batch_noise=noise,
                        active_worker_cost=k_a, passive_worker_cost=k_p, source=source)
