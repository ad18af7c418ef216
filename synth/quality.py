"""Quality monitor: marginal distances and ML utility of synthetic data (pure logic).

Metric names
------------
Two names for the same workload quantity circulate in the literature:

* ``avg_tv``: the mean over the workload's marginals of the total-variation distance
  ``TV(p, q) = 0.5 · ||p − q||_1`` between normalised marginals (private-pgm's
  scripts print this).
* ``avg_l1`` = ``workload_error``: the mean of ``||p − q||_1`` (the "workload error" of
  AIM, McKenna et al., VLDB 2022), which is exactly ``2 · avg_tv``.

Both are reported. As in the AIM literature, the reference is the pooled data the
parties hold; the default workload is all 3-way marginals (:func:`all_k_way`).

ML utility
----------
:func:`ml_utility` trains scikit-learn's ``HistGradientBoostingClassifier`` on the
synthetic rows and on the real training rows, and tests both on a real holdout no
party used (train-on-synthetic, test-on-real).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from synth.domain import DEFAULT_MAX_CELLS, Domain, Schema, marginal

Clique = tuple[str, ...]


def tv_distance(p_counts: np.ndarray, q_counts: np.ndarray) -> float:
    """Total-variation distance ``0.5 · ||p/Σp − q/Σq||_1`` between two count vectors.

    Args:
        p_counts: non-negative counts, any shape.
        q_counts: counts of the same size (flattened in the same order).

    Returns:
        A float in [0, 1].

    Raises:
        ValueError: different sizes, negative or non-finite entries, or a zero sum.
    """
    p = np.asarray(p_counts, dtype=np.float64).reshape(-1)
    q = np.asarray(q_counts, dtype=np.float64).reshape(-1)
    if p.size != q.size:
        raise ValueError(f"the count vectors differ in size: {p.size} vs {q.size}")
    for name, v in (("p_counts", p), ("q_counts", q)):
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise ValueError(f"{name} must be finite and non-negative")
        if v.sum() <= 0:
            raise ValueError(f"{name} sums to 0")
    return float(0.5 * np.abs(p / p.sum() - q / q.sum()).sum())


def all_k_way(domain: Domain, k: int = 3, *,
              max_cells: int | None = None) -> list[Clique]:
    """All k-attribute cliques of the domain, in domain order (the standard workload).

    Adult's 14 attributes (label included) give C(14, 3) = 364 three-way cliques.

    Args:
        domain: the domain.
        k: clique size, 1 ≤ k ≤ len(domain).
        max_cells: leave out cliques with more cells (None keeps all).

    Returns:
        The cliques, as tuples in ``itertools.combinations`` order.

    Raises:
        ValueError: k out of range.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not (1 <= k <= len(domain)):
        raise ValueError(f"k must be an integer in [1, {len(domain)}], got {k!r}")
    out = list(itertools.combinations(domain.attributes, k))
    if max_cells is not None:
        out = [c for c in out if domain.size(c) <= max_cells]
    return out


def workload_tv(real_codes: np.ndarray, synth_codes: np.ndarray, domain: Domain,
                workload: Sequence[Sequence[str]] | None = None, *,
                max_cells: int = DEFAULT_MAX_CELLS) -> dict[str, Any]:
    """TV distance between real and synthetic marginals over a workload.

    Args:
        real_codes: ``(n, d)`` int codes of the reference (pooled) data.
        synth_codes: ``(m, d)`` int codes of the synthetic data.
        domain: their domain.
        workload: the cliques (default :func:`all_k_way` with k = min(3, d)).
        max_cells: refuse cliques with more cells (``DomainTooLarge``).

    Returns:
        ``{"avg_tv", "max_tv", "avg_l1", "n_marginals", "per_clique"}``, where
        ``avg_l1 = 2 · avg_tv`` and ``per_clique`` maps ``"a,b,c"`` to that clique's TV.

    Raises:
        ValueError: an empty workload or an empty code array.
        DomainError, DomainTooLarge: bad codes or cliques (from :func:`marginal`).
    """
    wl = [tuple(c) for c in (workload if workload is not None
                             else all_k_way(domain, min(3, len(domain))))]
    if not wl:
        raise ValueError("empty workload")
    if len(real_codes) == 0 or len(synth_codes) == 0:
        raise ValueError("real and synthetic data must both have rows")
    per = {}
    for c in wl:
        per[",".join(c)] = tv_distance(marginal(real_codes, domain, c, max_cells=max_cells),
                                       marginal(synth_codes, domain, c, max_cells=max_cells))
    vals = np.fromiter(per.values(), dtype=np.float64, count=len(per))
    avg = float(vals.mean())
    return {"avg_tv": avg, "max_tv": float(vals.max()), "avg_l1": 2.0 * avg,
            "n_marginals": len(wl), "per_clique": per}


def workload_error(real_codes: np.ndarray, synth_codes: np.ndarray, domain: Domain,
                   workload: Sequence[Sequence[str]] | None = None, *,
                   max_cells: int = DEFAULT_MAX_CELLS) -> float:
    """AIM's workload error: mean over the workload of ``||p − q||_1`` between normalised
    marginals. Identical to ``workload_tv(...)["avg_l1"]`` (= 2 · avg TV); both names
    exist in the literature. Arguments and errors as :func:`workload_tv`."""
    return float(workload_tv(real_codes, synth_codes, domain, workload,
                             max_cells=max_cells)["avg_l1"])


# ---------------------------------------------------------------------------- fixed grid
#: numeric columns' equal-width bins on the fixed evaluation grid
FIXED_GRID_BINS = 32


def _grid_strings(s: pd.Series, spec: Any) -> pd.Series:
    """A categorical column's values as the schema's canonical level strings."""
    from synth.domain import MISSING_LEVEL, _level_str, _text_strings

    if spec.dtype == "object":
        return _text_strings(s)
    return s.astype(object).map(lambda v: MISSING_LEVEL if pd.isna(v) else _level_str(v))


def fixed_grid_codes(real: pd.DataFrame, synth: pd.DataFrame, schema: Schema, *,
                     bins: int = FIXED_GRID_BINS) -> tuple[np.ndarray, np.ndarray, Domain]:
    """Both tables on one evaluation grid of the original values, whatever the run's
    binning: a numeric column in ``bins`` equal-width bins over its declared range (the
    schema's first and last edge; values outside go to the end bins) plus one cell for a
    missing value; a categorical column by its values as they are (the union of both
    tables' levels, so a level the synthesis merged away, e.g. into ``__other__``, counts
    against it). Independent of ``numeric_bins`` and of the domain's compression.

    Returns:
        ``(real_codes, synth_codes, domain)``.

    Raises:
        ValueError: ``bins`` below 1, or a schema column missing from either table.
    """
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    rc: list[np.ndarray] = []
    sc: list[np.ndarray] = []
    sizes: list[int] = []
    for spec in schema.columns:
        for name, frame in (("real", real), ("synthetic", synth)):
            if spec.name not in frame.columns:
                raise ValueError(f"column {spec.name!r} is not in the {name} table")
        if spec.kind == "numeric":
            lo, hi = float(spec.edges[0]), float(spec.edges[-1])

            def cut(col: pd.Series, lo: float = lo, hi: float = hi) -> np.ndarray:
                x = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
                code = np.floor((x - lo) / (hi - lo) * bins)
                code = np.clip(np.nan_to_num(code, nan=bins), 0, bins)
                code[np.isnan(x)] = bins  # the missing cell
                code[(~np.isnan(x)) & (code >= bins)] = bins - 1
                return code.astype(np.int32)

            rc.append(cut(real[spec.name]))
            sc.append(cut(synth[spec.name]))
            sizes.append(bins + 1)
        else:
            rs, ss = _grid_strings(real[spec.name], spec), _grid_strings(synth[spec.name], spec)
            levels = sorted(set(rs.unique()) | set(ss.unique()))
            lookup = {lv: i for i, lv in enumerate(levels)}
            rc.append(rs.map(lookup).to_numpy(dtype=np.int32))
            sc.append(ss.map(lookup).to_numpy(dtype=np.int32))
            sizes.append(max(1, len(levels)))
    domain = Domain(attributes=schema.names, sizes=tuple(sizes))
    return np.stack(rc, axis=1), np.stack(sc, axis=1), domain


def fixed_grid_tv(real: pd.DataFrame, synth: pd.DataFrame, schema: Schema, *,
                  bins: int = FIXED_GRID_BINS, k: int = 3,
                  max_cells: int = DEFAULT_MAX_CELLS) -> dict[str, Any]:
    """The workload TV on the fixed evaluation grid (:func:`fixed_grid_codes`): the
    mean over all k-way marginals (cliques of at most ``max_cells`` cells; the rest are
    left out and counted) of the TV distance between real and synthetic marginals.
    Comparable across runs of one table whatever their ``numeric_bins``.

    Returns:
        ``{"avg_tv_fixed_grid", "max_tv_fixed_grid", "n_marginals_fixed_grid",
        "left_out_fixed_grid", "fixed_grid"}``.
    """
    real_c, syn_c, dom = fixed_grid_codes(real, synth, schema, bins=bins)
    every = all_k_way(dom, min(k, len(dom)))
    wl = [c for c in every if dom.size(c) <= max_cells]
    q = workload_tv(real_c, syn_c, dom, wl, max_cells=max_cells)
    return {"avg_tv_fixed_grid": q["avg_tv"], "max_tv_fixed_grid": q["max_tv"],
            "n_marginals_fixed_grid": q["n_marginals"],
            "left_out_fixed_grid": len(every) - len(wl),
            "fixed_grid": f"numeric columns in {bins} equal-width bins over their declared "
                          f"ranges, categories as they are; all {min(k, len(dom))}-way "
                          "marginals"}


# ---------------------------------------------------------------------------- ML utility
def _label_strings(s: pd.Series) -> pd.Series:
    return s.astype(object).map(lambda v: "<missing>" if pd.isna(v) else str(v))


def _encode_features(frames: Sequence[pd.DataFrame], features: Sequence[str]
                     ) -> tuple[list[np.ndarray], list[bool]]:
    """Ordinal-encode text columns on the union of their levels across ``frames``;
    numeric columns pass through as float64. Returns the matrices and a categorical mask
    (text columns with more than 255 levels are passed as ordinal, not categorical)."""
    mats = [np.empty((len(f), len(features)), dtype=np.float64) for f in frames]
    cat_mask: list[bool] = []
    for j, col in enumerate(features):
        cols = [f[col] for f in frames]
        numeric = all(pd.api.types.is_numeric_dtype(c) and not pd.api.types.is_bool_dtype(c)
                      for c in cols)
        if numeric:
            for m, c in zip(mats, cols, strict=True):
                m[:, j] = c.to_numpy(dtype=np.float64, na_value=np.nan)
            cat_mask.append(False)
            continue
        strs = [_label_strings(c) for c in cols]
        levels = sorted(set().union(*(set(s.unique()) for s in strs)))
        lookup = {lv: i for i, lv in enumerate(levels)}
        for m, s in zip(mats, strs, strict=True):
            m[:, j] = s.map(lookup).to_numpy(dtype=np.float64)
        cat_mask.append(len(levels) <= 255)
    return mats, cat_mask


def ml_utility(train_real: pd.DataFrame, train_synth: pd.DataFrame, test_real: pd.DataFrame,
               label: str, *, random_state: int = 0,
               threads: int | None = None) -> dict[str, Any]:
    """Train-on-synthetic / train-on-real, test-on-real-holdout utility of a binary task.

    Features are the columns other than ``label`` present in all three frames. Text
    columns are ordinal-encoded on the union of their levels over the three frames and
    passed to ``HistGradientBoostingClassifier(categorical_features=mask,
    random_state=random_state)``; numeric columns are used as they are. The positive
    class is the larger label string in sort order (``">50K"`` for Adult). F1 uses the
    classifier's predicted class.

    Args:
        train_real: the real rows the parties hold (the reference classifier's data).
        train_synth: the synthetic rows.
        test_real: the real holdout no party used.
        label: the label column.
        random_state: the classifiers' seed.
        threads: OpenMP threads of the classifiers' fits and predictions (None:
            scikit-learn's default, one per core). The scores do not depend on it; on a
            loaded machine, OpenMP threads that spin-wait for cores the other processes
            hold made this call 3 to 10 times slower than one thread (2,400 rows, 2 cores:
            2.7 to 8.2 s against 0.7 s).

    Returns:
        ``{"auc_synthetic", "auc_real", "f1_synthetic", "f1_real", "positive_class",
        "n_features", "warning"}``; ``warning`` is None, or says why the synthetic
        scores are NaN (a synthetic set whose label has a single class).

    Raises:
        ValueError: ``label`` missing from a frame; the real label (training and holdout
            together) not having exactly two classes (the label is named); an empty
            frame; no common feature; or ``threads`` < 1.
    """
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be None or >= 1, got {threads}")
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import f1_score, roc_auc_score
    from threadpoolctl import threadpool_limits

    for name, f in (("train_real", train_real), ("train_synth", train_synth),
                    ("test_real", test_real)):
        if label not in f.columns:
            raise ValueError(f"label {label!r} is not a column of {name}")
        if len(f) == 0:
            raise ValueError(f"{name} has no rows")
    y_tr = _label_strings(train_real[label])
    y_te = _label_strings(test_real[label])
    y_sy = _label_strings(train_synth[label])
    classes = sorted(set(y_tr.unique()) | set(y_te.unique()))
    if len(classes) != 2:
        raise ValueError(f"label {label!r} must be binary; the real data has "
                         f"{len(classes)} classes {classes[:10]!r}")
    if y_tr.nunique() != 2 or y_te.nunique() != 2:
        raise ValueError(f"label {label!r} needs both classes in train_real and test_real")
    pos = classes[1]
    unknown = set(y_sy.unique()) - set(classes)
    if unknown:
        raise ValueError(f"label {label!r} of train_synth has classes {sorted(unknown)!r} "
                         f"absent from the real data")
    features = [c for c in train_real.columns
                if c != label and c in train_synth.columns and c in test_real.columns]
    if not features:
        raise ValueError("no feature column common to the three frames")
    (x_tr, x_sy, x_te), mask = _encode_features([train_real, train_synth, test_real],
                                                features)
    yb_tr = (y_tr == pos).to_numpy(dtype=np.int64)
    yb_te = (y_te == pos).to_numpy(dtype=np.int64)
    yb_sy = (y_sy == pos).to_numpy(dtype=np.int64)

    def fit_score(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        clf = HistGradientBoostingClassifier(categorical_features=np.asarray(mask),
                                             random_state=random_state)
        with threadpool_limits(limits=threads, user_api="openmp"):
            clf.fit(x, y)
            proba = clf.predict_proba(x_te)[:, 1]
        return (float(roc_auc_score(yb_te, proba)),
                float(f1_score(yb_te, (proba >= 0.5).astype(np.int64), zero_division=0)))

    auc_real, f1_real = fit_score(x_tr, yb_tr)
    warning = None
    if len(np.unique(yb_sy)) < 2:
        auc_syn, f1_syn = math.nan, math.nan
        warning = (f"the synthetic label {label!r} has a single class "
                   f"{y_sy.iloc[0]!r}; synthetic AUC and F1 are undefined")
    else:
        auc_syn, f1_syn = fit_score(x_sy, yb_sy)
    return {"auc_synthetic": auc_syn, "auc_real": auc_real, "f1_synthetic": f1_syn,
            "f1_real": f1_real, "positive_class": pos, "n_features": len(features),
            "warning": warning}
