"""Protection of the active party's labels against the passive parties (pure logic, numpy).

In split learning the only messages of a run that depend on the active party's labels
are the cut-layer gradients it sends each passive party (``grad/<run>/...``): the
validation and test labels are scored by the active party alone (the passive parties
are told only *that* a point was scored), the reports flow from the passive parties, and
predictions stay with the active party. A passive party (or anyone on the wire) can read
the training labels off those gradients almost perfectly (Li et al., "Label Leakage and
Protection in Two-party Split Learning", ICLR 2022; ``bench/label_audit.py`` measures
it). Two protections, both configured by the active party alone (``[vfl.labels]``, not a
shared setting), composable with each other and with the passive party's feature DP:

Label differential privacy (``labels.epsilon``)
-----------------------------------------------
* **Protected unit:** one training record's label.
* **Neighbouring relation: replace-one label.** Two label vectors are neighbours if they
  differ in the label of one record; features, IDs and row counts are the same.
* **Adversary:** every passive party, the broker and anyone on the wire, together: they
  see every message of the run, choose the embeddings they send (any function of what
  they have seen), and have unbounded computation; not the active party's memory or its
  noise seed.
* **Mechanism:** randomised response (Warner 1965; as the label-DP baseline of Ghazi et
  al., "Deep Learning with Label Differential Privacy", NeurIPS 2021, with the uniform
  prior, which for two classes is their RR-with-prior at k = 2): before anything is
  trained, each training label is kept with probability e^ε / (1 + e^ε) and flipped
  otherwise, once, with the active party's secret seed. The randomised label is a pure
  ε-DP release of the true one (the likelihood ratio of any output is at most e^ε).
  Every worker of the active party draws the same flips (a function of the seed and the
  row), so each label is randomised exactly once however often it is trained on.
* **Every path by which a label reaches a message:** the active party trains its top and
  own bottom models on the randomised labels only, so every gradient it sends (and the
  Marvell noise below, which reads the same labels) is post-processing of them; the
  validation and test labels are read only by the active party's own scoring, whose
  results are not sent. The run is ε-label-DP for every training record, with δ = 0, at
  any number of epochs, reassignments or workers (:class:`LabelLedger` records it; the
  tests re-account it with Google's ``dp-accounting`` PLD of randomised response).
* **Outside the guarantee:** the active party's features; the timing of its messages;
  the label distribution as a whole (label DP bounds what an attack learns about *one*
  label beyond the rest, not an attack's AUC over all labels: at ε = 1, 27 % of the
  labels flip, and an attack that recovers the randomised labels still ranks the true
  ones far above chance; docs/explanation/privacy.md has the measured AUCs).

Gradient perturbation (``labels.defence = "marvell"``)
------------------------------------------------------
:class:`MarvellNoise`: per batch the active party computes the two classes' mean
cut-layer gradients; their difference is the direction along which the classes
separate. Each row gets noise along it of scale k times the gap, and noise with the
*other* class's covariance, so that both classes end with the same spread (their norms
and their spread across u no longer tell them apart); both are the record's own draws,
the same in every epoch, so that averaging a record's gradients over epochs does not
remove them. This is
a simplified Marvell (Li et al. optimise the noise covariance under a power budget; here
the covariance has that shape with a fixed scale): it carries **no DP claim**; its
protection is the attack AUCs ``bench/label_audit.py`` measures.

Owns: :class:`RandomizedResponse`, :class:`MarvellNoise`, :class:`LabelProtection`,
:class:`LabelLedger`, :func:`label_protection`, :func:`labels_report`,
:func:`labels_line`. May import
:mod:`parties.config` (for the section's values) and numpy.
"""

from __future__ import annotations

import functools
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parties.config import LabelsSection

MECHANISM = "randomized-response"

#: stream ids mixed into the seed (each use of the secret draws from its own stream)
_RR_STREAM, _PERSIST_STREAM = 0x5252, 0x5053


@dataclass(frozen=True, slots=True, kw_only=True)
class RandomizedResponse:
    """Binary randomised response at ``epsilon``: keep a label with probability
    e^ε / (1 + e^ε), flip it otherwise (pure ε-DP for the label).

    Raises:
        ValueError: ``epsilon`` not positive and finite.
    """

    epsilon: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and 0 < self.epsilon < math.inf):
            raise ValueError(f"label epsilon must be a positive finite number, got "
                             f"{self.epsilon!r}")

    @property
    def flip_probability(self) -> float:
        """1 / (1 + e^ε) (as e^−ε / (1 + e^−ε): no overflow at a large ε, where it is 0)."""
        t = math.exp(-self.epsilon)
        return t / (1.0 + t)

    @staticmethod
    def epsilon_of(flip_probability: float) -> float:
        """The ε of randomised response that flips with ``flip_probability`` (< 1/2):
        ln((1 - p) / p)."""
        p = flip_probability
        if not 0 < p < 0.5:
            raise ValueError(f"flip probability must be in (0, 1/2), got {p!r}")
        return math.log((1 - p) / p)

    def flips(self, n: int, seed: int) -> np.ndarray:
        """``(n,)`` bool: which of rows ``0 .. n-1`` are flipped under ``seed`` (the same
        for the same ``seed`` and row, whatever ``n``: row i's draw is the i-th)."""
        rng = np.random.default_rng([_RR_STREAM, seed & (2**63 - 1)])
        return rng.random(n) < self.flip_probability

    def apply(self, labels: np.ndarray, seed: int) -> np.ndarray:
        """``labels`` (0/1, ``(n,)``) randomised: row i flipped where :meth:`flips` says."""
        y = np.asarray(labels)
        f = self.flips(y.shape[0], seed)
        return np.where(f, 1 - y, y).astype(y.dtype, copy=False)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of each uint64 of ``x`` (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def record_normals(seed: int, rows: np.ndarray, width: int) -> np.ndarray:
    """``(len(rows), width)`` standard normals that are a function of (``seed``, row,
    column) only: the same record gets the same draws in every batch, epoch and worker,
    with nothing stored per record (one SplitMix64 hash per value, its two 32-bit halves
    through Box-Muller)."""
    r = np.asarray(rows, dtype=np.uint64)[:, None]
    c = np.arange(width, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        h = _splitmix64(r * np.uint64(width) + c + np.uint64(seed))
    u1 = ((h >> np.uint64(32)).astype(np.float64) + 0.5) * 2.0**-32
    u2 = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) * 2.0**-32
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


def _factor(x: np.ndarray) -> np.ndarray:
    """A factor L with L Lᵀ = the covariance of the rows ``x`` (centred, ``(n, d)``):
    Cholesky of Xᵀ X / n plus a jitter of 1e-9 of its mean variance (a few rows in d
    dimensions make it singular), far cheaper than a symmetric square root."""
    cov = x.T @ x / x.shape[0]
    jitter = 1e-9 * (float(np.trace(cov)) / cov.shape[0] or 1.0)
    return np.linalg.cholesky(cov + jitter * np.eye(cov.shape[0]))


class MarvellNoise:
    """Noise on the cut-layer gradients that makes the two classes' distributions overlap
    (a simplified Marvell, see the module docstring).

    Per batch of gradients ``g`` (B, d) with labels ``y`` (the labels the run trains on):
    Δ = μ₁ − μ₀ (the classes' mean gradients), u = Δ / ‖Δ‖, Σ₀ and Σ₁ the classes'
    covariances about their means. A row of class c gets

    ``k‖Δ‖·z_i·u + L_c̄·ζ_i``, with L_c̄ L_c̄ᵀ = Σ_c̄ (the *other* class's covariance)

    so that both classes end with covariance Σ₀ + Σ₁ (their spreads and norms no longer
    differ) and means ``1/k`` noise standard deviations apart along u (an attack that
    projects on u reaches an AUC near Φ(1/(k√2)): k = 2.5 → about 0.61). ``z_i`` and the
    d-vector ``ζ_i`` are the record's own standard normals (:func:`record_normals`, one set
    per passive party), the same in every epoch: averaging a record's gradients over
    epochs does not remove them (fresh draws would average away and expose the record's
    own, persistent, class-dependent spread; measured on bank, and for a given
    protection they also cost less accuracy). A class with fewer than two rows in the
    batch uses that party's last estimate of its covariance (and of u and ‖Δ‖ when a
    class is missing).

    Args:
        strength: k > 0.
        seed: the active party's secret.
        n_rows: the training rows, when known: a table of at most
            :data:`TABLE_MAX_VALUES` draws is computed once per party instead of per batch
            (the same values).

    Raises:
        ValueError: ``strength`` not positive and finite.
    """

    #: the largest per-party table of the records' draws kept (float32 values; 16 MiB)
    TABLE_MAX_VALUES = 4 << 20

    def __init__(self, strength: float, seed: int, n_rows: int | None = None) -> None:
        if not 0 < strength < math.inf:
            raise ValueError(f"strength must be a positive finite number, got {strength!r}")
        self.strength = float(strength)
        self.seed = seed & (2**63 - 1)
        self.n_rows = n_rows
        self._u: dict[int, tuple[np.ndarray, float]] = {}
        self._s: dict[tuple[int, bool], np.ndarray] = {}
        self._tables: dict[int, np.ndarray] = {}

    def _draws(self, party: int, rows: np.ndarray, width: int) -> np.ndarray:
        """The records' draws ``(len(rows), width)``: from the party's table when the
        rows fit one, else computed."""
        seed = self._party_seed(party)
        n = self.n_rows
        if n is None or n * width > self.TABLE_MAX_VALUES or (rows.size and rows.max() >= n):
            return record_normals(seed, rows, width)
        table = self._tables.get(party)
        if table is None or table.shape[1] != width:
            table = self._tables[party] = record_normals(
                seed, np.arange(n), width).astype(np.float32)
        return table[rows]

    @functools.lru_cache(maxsize=64)  # noqa: B019 - a handful of parties per object
    def _party_seed(self, party: int) -> int:
        return int(_splitmix64(np.array([self.seed ^ (party * 0x1000193 + _PERSIST_STREAM)],
                                        dtype=np.uint64))[0])

    def __call__(self, grad: np.ndarray, labels: np.ndarray, rows: np.ndarray, *,
                 epoch: int = 0, party: int = 0) -> np.ndarray:
        """``grad`` (B, d) float32 plus the noise, float32 (``epoch`` is unused: the
        noise is the record's own).

        Raises:
            ValueError: ``labels`` or ``rows`` do not match the batch.
        """
        g = np.asarray(grad, dtype=np.float64)
        if g.ndim != 2 or labels.shape != (g.shape[0],) or rows.shape != (g.shape[0],):
            raise ValueError(f"gradient {g.shape}, labels {labels.shape} and rows "
                             f"{rows.shape} do not match")
        b, d = g.shape
        if b == 0:
            return np.asarray(grad, dtype=np.float32)
        pos = labels > 0.5
        classes = {True: pos, False: ~pos}
        means = {c: g[m].mean(axis=0) for c, m in classes.items() if m.any()}
        if len(means) == 2:
            delta = means[True] - means[False]
            gap = float(np.linalg.norm(delta))
            if gap > 0:
                self._u[party] = (delta / gap, gap)
        for c, m in classes.items():
            if m.sum() >= 2:
                x = g[m] - means[c]
                self._s[(party, c)] = _factor(x)
        draws = self._draws(party, rows, d + 1)
        out = g.copy()
        u_gap = self._u.get(party)
        if u_gap is not None:
            u, gap = u_gap
            out += (draws[:, 0] * (self.strength * gap))[:, None] * u[None, :]
        for c, m in classes.items():
            other = self._s.get((party, not c))
            if other is not None and m.any():
                out[m] += draws[m, 1:] @ other.T
        return out.astype(np.float32)


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelProtection:
    """What an active worker applies: ``flips`` (``(n_train,)`` bool, the randomised
    response's flipped rows; None without label DP) and ``noise`` (None without a
    gradient defence)."""

    flips: np.ndarray | None = None
    noise: MarvellNoise | None = None


def label_secret(section: LabelsSection) -> int:
    """The active party's label-noise secret: ``noise_seed`` if given, else fresh OS
    entropy (drawn once per run and handed to every worker)."""
    return section.noise_seed if section.noise_seed is not None else secrets.randbits(63)


def label_protection(section: LabelsSection, secret: int | None, n_rows: int
                     ) -> LabelProtection | None:
    """An active worker's protection for ``n_rows`` training rows (None: unprotected).

    Raises:
        ValueError: protection is on and ``secret`` is None.
    """
    if not section.protected:
        return None
    if secret is None:
        raise ValueError("label protection is on: an active worker needs the label secret")
    flips = (RandomizedResponse(epsilon=section.epsilon).flips(n_rows, secret)
             if section.epsilon is not None else None)
    noise = (MarvellNoise(section.strength, secret, n_rows) if section.defence == "marvell"
             else None)
    return LabelProtection(flips=flips, noise=noise)


@dataclass(slots=True, kw_only=True)
class LabelLedger:
    """The active party's label ledger: the releases of each training label (randomised
    response: one, at the start; every later use is post-processing) and the ε they
    compose to (pure DP composes by addition)."""

    epsilon_per_release: float | None
    releases: int = 0
    spent: list[float] = field(default_factory=list)

    def release(self) -> None:
        """Charge one randomised-response release of every training label."""
        if self.epsilon_per_release is None:
            return
        self.releases += 1
        self.spent.append(self.epsilon_per_release)

    @property
    def epsilon(self) -> float | None:
        """The composed ε of one label (None: no label DP)."""
        return math.fsum(self.spent) if self.epsilon_per_release is not None else None


#: The label guarantee, as recorded in ``metrics.json`` (``dp.labels``).
LABEL_GUARANTEE: dict[str, Any] = {
    "protected_unit": "one training record's label (of the active party)",
    "neighbouring": "replace-one: the label of one record changes; features, IDs and row "
                    "counts are the same",
    "adversary": "every passive party, the broker and anyone on the wire, together: they see "
                 "every message, choose the embeddings they send, and have unbounded "
                 "computation; not the active party's memory or its noise seed",
    "paths": ["cut-layer gradients: computed from the randomised labels only (the top and "
              "the own bottom are trained on them), post-processing",
              "validation and test labels: scored by the active party alone, results not "
              "sent"],
    "accounting": "randomised response once per training label: pure epsilon-DP, delta 0, "
                  "at any number of epochs",
    "outside": ["the active party's features", "timing side channels",
                "an attack's AUC over all labels (label DP bounds one label's)"],
}


def labels_report(section: LabelsSection, ledger: LabelLedger | None = None) -> Any:
    """``dp.labels`` in ``metrics.json``: ``"unprotected"``, or the defence, its setting
    and, with label DP, the guarantee and its ε (from ``ledger`` when given)."""
    if not section.protected:
        return "unprotected"
    out: dict[str, Any] = {"defence": section.defence,
                           "strength": section.strength if section.defence != "none" else None,
                           "label_dp": section.epsilon is not None}
    if section.defence == "marvell":
        out["defence_claim"] = "none (an empirical defence: see bench/label_audit.py)"
    if section.epsilon is not None:
        rr = RandomizedResponse(epsilon=section.epsilon)
        eps = ledger.epsilon if ledger is not None else section.epsilon
        out.update({"mechanism": MECHANISM, "epsilon": eps, "delta": 0.0,
                    "flip_probability": rr.flip_probability,
                    "releases": ledger.releases if ledger is not None else 1,
                    "guarantee": LABEL_GUARANTEE})
    return out


def labels_line(section: LabelsSection, task: str = "binary") -> str:
    """The line the active party's run prints at start about its labels' protection
    (``task``: the run's; nothing is offered for regression, where none is analysed)."""
    if not section.protected:
        if task != "binary":
            return ("labels: NOT protected against the passive parties (label protection "
                    "is analysed for binary tasks only)")
        return ("labels: NOT protected against the passive parties (they can read them off "
                "the gradients); set [vfl.labels] defence = \"marvell\" and/or epsilon "
                "(docs/explanation/privacy.md)")
    parts = []
    if section.defence == "marvell":
        parts.append(f"gradient noise marvell k={section.strength:g} (no DP claim)")
    if section.epsilon is not None:
        parts.append(f"label DP epsilon {section.epsilon:g} (randomised response, delta 0)")
    return "labels: " + "; ".join(parts)


#: what a passive party says when its own configuration sets ``[vfl.labels]``
PASSIVE_IGNORES = ("labels: [vfl.labels] is the active party's setting; this passive party "
                   "ignores it (the active party's own configuration decides)")


__all__ = ["LABEL_GUARANTEE", "PASSIVE_IGNORES", "MECHANISM", "LabelLedger", "LabelProtection", "MarvellNoise",
           "RandomizedResponse", "label_protection", "label_secret", "labels_line",
           "labels_report", "record_normals"]
