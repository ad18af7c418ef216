"""Label-inference attacks a passive party can run on what it receives (pure: numpy and
scikit-learn), for the label audit (``bench/label_audit.py``).

Input: the cut-layer gradients the passive party received, per epoch, as recorded by
:class:`sim.faults.eavesdrop.GradientTap` (``grads[e]``: ``(n, d)``, NaN rows for records
not received; ``batches[e]``: the batch of each record), and for the attacks that use
them a few known labels (``known``: record indices whose label the attacker knows, e.g.
its own customers who are also the active party's). Each attack returns one score per
record; :func:`attack_auc` is its ROC AUC against the true labels as max(AUC, 1 − AUC)
(an inverted score leaks as much), over the records the attacker does not know.

==================  ========================================================================
attack              score of record i in epoch e
==================  ========================================================================
``norm``            ‖g_i‖ (Li et al., ICLR 2022: the rarer class's gradients are larger)
``cosine``          cosine of g_i to the largest-norm gradient of its batch (Li et al.)
``pca``             projection of g_i on the first principal direction of the epoch's
                    gradients
``residual``        the norm of g_i's component orthogonal to that direction (the classes'
                    spreads differ even where their means do not)
``logistic``        a logistic regression fitted on the known records' gradients
``summed_*``        the same scores summed over the epochs so far (``summed_pca``: each
                    epoch's direction signed to agree with the sum; ``summed_residual``
                    and ``summed_logistic``: on the gradients averaged over the epochs,
                    where noise drawn afresh each epoch averages away)
``model_completion``  Fu et al. (USENIX Security 2022): the passive party's trained bottom
                    model's embeddings, a classifier fitted on the known records
                    (:func:`model_completion`); its baseline is the same classifier on the
                    party's own features without any gradient
==================  ========================================================================

May import numpy and scikit-learn.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

#: the gradient attacks, in report order (``model_completion`` is reported apart)
GRADIENT_ATTACKS = ("norm", "cosine", "pca", "residual", "logistic", "summed_norm",
                    "summed_cosine", "summed_pca", "summed_residual", "summed_logistic")


def attack_auc(labels: np.ndarray, scores: np.ndarray, mask: np.ndarray | None = None
               ) -> float:
    """max(AUC, 1 − AUC) of ``scores`` against 0/1 ``labels`` over ``mask`` (None: all)
    and finite scores; 0.5 where one class is missing."""
    from sklearn.metrics import roc_auc_score

    ok = np.isfinite(scores)
    if mask is not None:
        ok &= mask
    y = np.asarray(labels)[ok] > 0.5
    if y.all() or not y.any():
        return 0.5
    a = float(roc_auc_score(y, np.asarray(scores)[ok]))
    return max(a, 1.0 - a)


def _norm(g: np.ndarray) -> np.ndarray:
    return np.linalg.norm(g, axis=1)


def _cosine(g: np.ndarray, batch: np.ndarray) -> np.ndarray:
    out = np.full(g.shape[0], np.nan)
    ok = np.isfinite(g).all(axis=1) & (batch >= 0)
    norms = _norm(np.where(ok[:, None], g, 0.0))
    idx = np.flatnonzero(ok)
    order = np.argsort(batch[idx], kind="stable")
    idx = idx[order]
    bounds = np.flatnonzero(np.diff(batch[idx])) + 1
    for part in np.split(idx, bounds):
        ref = g[part[np.argmax(norms[part])]]
        out[part] = (g[part] @ ref) / np.maximum(norms[part] * np.linalg.norm(ref), 1e-30)
    return out


def _pca(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The projection on the first principal direction, and the norm of the rest."""
    out = np.full(g.shape[0], np.nan)
    rest = np.full(g.shape[0], np.nan)
    ok = np.isfinite(g).all(axis=1)
    x = g[ok] - g[ok].mean(axis=0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    out[ok] = x @ vt[0]
    rest[ok] = np.linalg.norm(x - out[ok][:, None] * vt[0][None, :], axis=1)
    return out, rest


def _logistic(g: np.ndarray, labels: np.ndarray, known: np.ndarray) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    out = np.full(g.shape[0], np.nan)
    ok = np.isfinite(g).all(axis=1)
    k = known[ok[known]]
    yk = labels[k] > 0.5
    if yk.all() or not yk.any():
        return out
    scale = StandardScaler().fit(g[ok])
    clf = LogisticRegression(C=1.0, max_iter=1000).fit(scale.transform(g[k]), yk)
    out[ok] = clf.decision_function(scale.transform(g[ok]))
    return out


def _z(s: np.ndarray) -> np.ndarray:
    m = np.isfinite(s)
    if m.sum() < 2:
        return np.where(m, 0.0, np.nan)
    sd = float(np.std(s[m])) or 1.0
    return (s - float(np.mean(s[m]))) / sd


def epoch_scores(grads: Mapping[int, np.ndarray], batches: Mapping[int, np.ndarray],
                 labels: np.ndarray, known: np.ndarray) -> dict[str, dict[int, np.ndarray]]:
    """Every gradient attack's scores after each epoch: ``{attack: {epoch: (n,)}}``
    (``summed_*``: over the epochs up to that one)."""
    out: dict[str, dict[int, np.ndarray]] = {a: {} for a in GRADIENT_ATTACKS}
    sums: dict[str, np.ndarray | None] = {"norm": None, "cosine": None, "pca": None}
    mean_g: np.ndarray | None = None
    seen: np.ndarray | None = None
    for e in sorted(grads):
        g = grads[e].astype(np.float64)
        pca, residual = _pca(g)
        per = {"norm": _norm(g), "cosine": _cosine(g, batches[e]), "pca": pca,
               "residual": residual, "logistic": _logistic(g, labels, known)}
        for a, s in per.items():
            out[a][e] = s
        for a in ("norm", "cosine", "pca"):
            z = _z(per[a])
            prev = sums[a]
            if prev is not None and a == "pca":  # the direction's sign is arbitrary
                both = np.isfinite(prev) & np.isfinite(z)
                if both.any() and float(np.dot(prev[both], z[both])) < 0:
                    z = -z
            z = np.nan_to_num(z, nan=0.0)
            sums[a] = z if prev is None else prev + z
            out[f"summed_{a}"][e] = sums[a].copy()
        got = np.isfinite(g).all(axis=1)
        gz = np.where(got[:, None], g, 0.0)
        mean_g = gz if mean_g is None else mean_g + gz
        seen = got.astype(np.int64) if seen is None else seen + got
        assert seen is not None
        avg = np.where(seen[:, None] > 0, mean_g / np.maximum(seen, 1)[:, None], np.nan)
        out["summed_logistic"][e] = _logistic(avg, labels, known)
        out["summed_residual"][e] = _pca(avg)[1]
    return out


def attack_aucs(grads: Mapping[int, np.ndarray], batches: Mapping[int, np.ndarray],
                labels: np.ndarray, known: np.ndarray) -> dict[str, dict[str, float]]:
    """``{attack: {"first": AUC after the first epoch, "last": after the last}}`` over the
    records not in ``known``."""
    scores = epoch_scores(grads, batches, labels, known)
    unknown = np.ones(labels.shape[0], bool)
    unknown[known] = False
    epochs = sorted(grads)
    return {a: {"first": attack_auc(labels, s[epochs[0]], unknown),
                "last": attack_auc(labels, s[epochs[-1]], unknown)}
            for a, s in scores.items()}


def known_records(labels: np.ndarray, count: int, seed: int) -> np.ndarray:
    """``count`` record indices drawn at random (the attacker's known labels), with at
    least 5 of each class where the data has them."""
    rng = np.random.default_rng(seed)
    n = labels.shape[0]
    pos = np.flatnonzero(labels > 0.5)
    neg = np.flatnonzero(labels <= 0.5)
    for _ in range(100):
        k = rng.choice(n, size=min(count, n), replace=False)
        if (labels[k] > 0.5).sum() >= min(5, pos.size) and \
                (labels[k] <= 0.5).sum() >= min(5, neg.size):
            return np.sort(k)
    return np.sort(k)


def model_completion(features: np.ndarray, labels: np.ndarray, known: np.ndarray,
                     seed: int = 0) -> float:
    """AUC (max(AUC, 1 − AUC), over the unknown records) of a small classifier fitted on
    the known records' ``features`` (the passive party's bottom-model embeddings for the
    attack, its own encoded features for the baseline): a logistic regression and a
    one-hidden-layer MLP, the better by cross-validation on the known records (the
    attacker's own choice, made without the unknown labels)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(features, dtype=np.float64)
    yk = labels[known] > 0.5
    if yk.all() or not yk.any():
        return 0.5
    models: list[Any] = [
        make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=2000)),
        make_pipeline(StandardScaler(), MLPClassifier((32,), alpha=1e-2, max_iter=500,
                                                      random_state=seed))]
    folds = int(min(5, yk.sum(), (~yk).sum()))
    best = models[0]
    with warnings.catch_warnings():  # a small MLP on 200 rows may stop before converging
        warnings.simplefilter("ignore", ConvergenceWarning)
        if folds >= 2:
            cv = [float(np.mean(cross_val_score(m, x[known], yk, cv=folds,
                                                scoring="roc_auc"))) for m in models]
            best = models[int(np.argmax(cv))]
        best.fit(x[known], yk)
    unknown = np.ones(labels.shape[0], bool)
    unknown[known] = False
    s = best.predict_proba(x)[:, 1]
    return attack_auc(labels, s, unknown)


__all__ = ["GRADIENT_ATTACKS", "attack_auc", "attack_aucs", "epoch_scores", "known_records",
           "model_completion"]
