"""Centralised references for FedForge: MST on the pooled rows, and the independent ensemble.

Loaded by path from bench scripts (``bench`` is not a package)::

    spec = importlib.util.spec_from_file_location("synth_central", HERE / "synth_central.py")

``central_mst`` is the standard MST of McKenna, Sheldon & Miklau, "Winning the NIST
Contest: A scalable and general approach to differentially private synthetic data"
(JPC 2021), as in private-pgm's ``mechanisms/mst.py`` (repository
ryan112358/private-pgm), re-expressed on :mod:`synth`'s domain, accounting and engines:

1. ρ = ``cdp_rho(ε, δ)`` (tight zCDP → (ε, δ) conversion, :func:`synth.accounting.cdp_rho`),
   and σ = sqrt(3 / (2ρ)).
2. ρ/3: all d one-way marginals, as one Gaussian measurement of L2 sensitivity √d
   (each record adds 1 to one cell of each marginal): each marginal gets
   N(0, (σ·√d)²) noise (the reference's ``measure`` with weights 1/√d).
3. ρ/3: d − 1 exponential-mechanism picks (Kruskal order: each pick among the pairs
   not yet connected), each ε_sel = sqrt(8·(ρ/3)/(d − 1)) so that the picks compose to
   ρ/3 (the EM is ε²/8-zCDP). The score of pair (a, b) is ``||x_ab − x̂_ab||_1``, the L1
   error on the real data of the one-way model, with sensitivity 1.0 and the
   non-monotone coefficient 1/2 exactly as the reference (``exponential_mechanism(q,
   eps, sensitivity=1.0)``). Sampling uses the Gumbel-max trick with a seeded
   generator (:func:`exponential_mechanism`).
4. ρ/3: the d − 1 tree pairs' 2-way marginals, each with N(0, (σ·√(d − 1))²) noise.
5. The one-way and tree measurements are fitted with :class:`synth.engine.MbiEngine`
   (or :class:`synth.engine.NeuralEngine`), and as many rows as the input are sampled.

Deviations from the reference (documented):

* Domain compression (the reference merges the values whose noisy one-way count is
  below 3σ into one value, re-expresses that measurement with a scaled query row, and
  maps merged values back uniformly) is done with ``engine="mbi"`` (default
  ``compress=True``), through mbi 2.0's ``LinearMeasurement.compress`` and a direct
  ``MirrorDescent`` fit (not :class:`synth.engine.MbiEngine`, whose
  :class:`NoisyMarginal` has no query). The neural engine runs without compression.
  The selection scores on the compressed domain use the one-way model of the merged
  sums (the merged cell's larger noise is not down-weighted there).
* The one-way model used for the selection scores is the maximum-likelihood estimate
  of the one-way measurements alone (a product distribution): each attribute's noisy
  counts projected onto ``{x ≥ 0, Σx = N̂}`` (N̂ the inverse-variance total). The
  reference gets it from ``FactoredInference(iters=1000)``, whose optimum this is.
* mbi 2.0's ``MirrorDescent`` with ``iters`` (default 1000, as a one-off probe script,
  not kept, measured) replaces mbi 1.x's
  ``FactoredInference(iters=5000)``.
* Noise is the continuous Gaussian, as in the reference (the federated parties use the
  discrete Gaussian; both are ρ-zCDP for the same σ).

``central_aim``: AIM (McKenna, Mullins, Sheldon & Miklau, VLDB 2022) as private-pgm's
``mechanisms/aim.py``, fitted with mbi 2.0 directly (warm-started ``MirrorDescent``).

``independent_ensemble``: every party runs :func:`central_mst` on its own rows at the
full (ε, δ) (each record lives at one party, so the pooled output is (ε, δ)-DP by
parallel composition), and the outputs are concatenated.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from synth.accounting import cdp_rho
from synth.domain import DEFAULT_MAX_CELLS, Domain, DomainError, marginal
from synth.engine import NoisyMarginal, estimate_total
from synth.engines import make_engine
from synth.select import candidate_pairs, compress_codes, compress_supports, uncompress_codes

Pair = tuple[str, str]

DEFAULT_MBI_ITERS = 1000


class CentralMstError(ValueError):
    """Bad input to a centralised reference (empty data, wrong shape, bad ε/δ)."""


#: the neighbouring relations a central reference can be private under
RELATIONS = ("replace_one", "add_remove")


def sensitivities(relation: str) -> tuple[float, float]:
    """(Δ₂², Δ₁) of one clique histogram and of an L1 error score under ``relation``:
    ``replace_one`` (one record's values change: one cell −1, another +1; FedForge's
    relation) (2, 2), ``add_remove`` (a record added or removed; private-pgm's) (1, 1).

    Raises:
        CentralMstError: an unknown relation.
    """
    if relation not in RELATIONS:
        raise CentralMstError(f"relation must be one of {RELATIONS}, got {relation!r}")
    return (2.0, 2.0) if relation == "replace_one" else (1.0, 1.0)


# ---------------------------------------------------------------------------- pieces
def exponential_mechanism(scores: np.ndarray, epsilon: float, sensitivity: float,
                          rng: np.random.Generator, *, monotonic: bool = False) -> int:
    """Index drawn with probability ∝ exp(c · ε · q / Δ), c = 1 if monotonic else 1/2.

    Gumbel-max trick: ``argmax(c·ε·q/Δ + G)`` with G i.i.d. standard Gumbel has exactly
    the exponential mechanism's distribution (no overflow in exp). Same law as
    private-pgm's ``exponential_mechanism`` (which uses logsumexp and ``prng.choice``).

    Args:
        scores: ``(m,)`` float64 quality scores (higher is better), m ≥ 1.
        epsilon: ε > 0 of this selection (pure DP; ε²/8-zCDP).
        sensitivity: Δ > 0, the scores' sensitivity.
        rng: the seeded generator.
        monotonic: use coefficient 1 (monotone scores) instead of 1/2.

    Returns:
        The chosen index in ``[0, m)``.

    Raises:
        ValueError: empty or non-finite scores, or a non-positive ε or Δ.
    """
    q = np.asarray(scores, dtype=np.float64).reshape(-1)
    if q.size == 0 or not np.all(np.isfinite(q)):
        raise ValueError(f"scores must be a non-empty finite vector, got {q.size} entries")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be positive and finite, got {sensitivity!r}")
    coef = 1.0 if monotonic else 0.5
    logits = coef * epsilon / sensitivity * q
    return int(np.argmax(logits + rng.gumbel(size=q.size)))


def project_to_total(y: np.ndarray, total: float) -> np.ndarray:
    """Euclidean projection of ``y`` onto ``{x ≥ 0, Σx = total}`` (sort-based, vectorised).

    Args:
        y: ``(k,)`` noisy counts.
        total: the target sum, > 0.

    Returns:
        ``(k,)`` float64, non-negative, summing to ``total``.
    """
    v = np.asarray(y, dtype=np.float64).reshape(-1)
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - total
    ind = np.arange(1, v.size + 1)
    cond = u - css / ind > 0
    r = int(np.flatnonzero(cond)[-1]) + 1 if cond.any() else v.size
    theta = css[r - 1] / r
    return np.maximum(v - theta, 0.0)


def _check_inputs(codes: np.ndarray, domain: Domain, epsilon: float, delta: float) -> np.ndarray:
    arr = np.asarray(codes)
    if arr.ndim != 2 or arr.shape[1] != len(domain):
        raise CentralMstError(f"codes must have shape (n, {len(domain)}), got {arr.shape}")
    if arr.shape[0] == 0:
        raise CentralMstError("no rows")
    if arr.dtype.kind not in "iu":
        raise CentralMstError(f"codes must be integers, got dtype {arr.dtype}")
    if len(domain) < 2:
        raise CentralMstError("MST needs at least two attributes")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise CentralMstError(f"epsilon must be positive and finite, got {epsilon!r}")
    if not 0 < delta < 1:
        raise CentralMstError(f"delta must be in (0, 1), got {delta!r}")
    return arr


class _DisjointSet:
    """Union-find over attribute names (path halving)."""

    def __init__(self, items: Sequence[str]) -> None:
        self.parent = {a: a for a in items}

    def find(self, a: str) -> str:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def mst_select_private(codes: np.ndarray, domain: Domain, one_way: Sequence[NoisyMarginal],
                       rho_select: float, rng: np.random.Generator, *,
                       max_cells: int = DEFAULT_MAX_CELLS,
                       score_sensitivity: float = 1.0) -> list[Pair]:
    """MST's private tree selection (private-pgm ``select`` with no initial cliques).

    Args:
        codes: ``(n, d)`` int codes of the (pooled) data.
        domain: their domain.
        one_way: the noisy one-way measurements (one per attribute).
        rho_select: ρ spent on the d − 1 picks together.
        rng: seeded generator for the Gumbel draws.
        max_cells: candidate pairs above this many cells are left out.
        score_sensitivity: Δ₁ of a score (1 under add/remove, 2 under replace-one).

    Returns:
        The chosen pairs, in pick order (d − 1 if the candidates connect everything).
    """
    total = estimate_total(list(one_way))
    p = {m.clique[0]: project_to_total(m.values, total) / total for m in one_way}
    cands = candidate_pairs(domain, max_cells=max_cells)
    scores = {}
    for a, b in cands:
        x = marginal(codes, domain, (a, b), max_cells=max_cells)
        xhat = total * np.outer(p[a], p[b])
        scores[(a, b)] = float(np.abs(x - xhat).sum())
    d = len(domain)
    eps = math.sqrt(8.0 * rho_select / (d - 1))
    ds = _DisjointSet(domain.attributes)
    tree: list[Pair] = []
    remaining = list(cands)
    for _ in range(d - 1):
        remaining = [e for e in remaining if ds.find(e[0]) != ds.find(e[1])]
        if not remaining:
            break
        w = np.array([scores[e] for e in remaining])
        e = remaining[exponential_mechanism(w, eps, score_sensitivity, rng)]
        tree.append(e)
        ds.union(*e)
    return tree


def _measure(codes: np.ndarray, domain: Domain, cliques: Sequence[tuple[str, ...]],
             sigma: float, rng: np.random.Generator, max_cells: int) -> list[NoisyMarginal]:
    """Gaussian measurement of ``cliques`` as one query of L2 sensitivity √len(cliques)."""
    s = sigma * math.sqrt(len(cliques))
    out = []
    for c in cliques:
        x = marginal(codes, domain, c, max_cells=max_cells).reshape(-1)
        out.append(NoisyMarginal(clique=tuple(c), values=x + rng.normal(0.0, s, x.size),
                                 sigma=s))
    return out


# ---------------------------------------------------------------------------- compression
def _fit_mbi_compressed(domain: Domain, cdom: Domain, maps: Mapping[str, np.ndarray],
                        one: Sequence[NoisyMarginal], two: Sequence[NoisyMarginal], *,
                        iters: int) -> Any:
    """mbi fit on the compressed domain: one-way measurements re-expressed with mbi's
    ``LinearMeasurement.compress`` (merged cell's sum scaled by 1/sqrt(count) with a
    weighted query, as the reference), tree measurements as they are."""
    import warnings

    from synth.engine import MbiFittedModel, _import_mbi

    mbi = _import_mbi()
    full = mbi.Domain(tuple(domain.attributes), tuple(domain.sizes))
    small = mbi.Domain(tuple(cdom.attributes), tuple(cdom.sizes))
    meas = []
    for m in one:
        lm = mbi.LinearMeasurement(np.asarray(m.values, dtype=np.float64), m.clique,
                                   stddev=float(m.sigma))
        a = m.clique[0]
        meas.append(lm.compress({a: maps[a]}, full) if a in maps else lm)
    meas += [mbi.LinearMeasurement(np.asarray(m.values, dtype=np.float64), m.clique,
                                   stddev=float(m.sigma)) for m in two]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = mbi.estimation.MirrorDescent().estimate(small, meas, iters=iters)
    return MbiFittedModel(domain=cdom, total=float(model.total), model=model,
                          fit_seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------- MST
def central_mst(codes: np.ndarray, domain: Domain, *, epsilon: float, delta: float,
                seed: int, engine: str = "mbi", max_cells: int = DEFAULT_MAX_CELLS,
                rows: int | None = None, workload: Sequence[Sequence[str]] | None = None,
                engine_kw: Mapping[str, Any] | None = None,
                compress: bool | None = None,
                relation: str = "add_remove") -> dict[str, Any]:
    """Standard (centralised) MST on the pooled rows (see the module docstring).

    Args:
        codes: ``(n, d)`` int codes of the pooled training rows (``synth.domain.encode``).
        domain: the shared public domain (the federated run's).
        epsilon, delta: the (ε, δ) target; ρ = ``cdp_rho(ε, δ)``.
        seed: fixes noise, selection, fit and sampling.
        engine: ``"mbi"`` (MbiEngine, default ``iters=1000``) or ``"neural"``.
        max_cells: largest pair marginal considered (cells).
        rows: rows to sample (default n).
        workload: passed to the engine's fit (the neural engine weights by it).
        engine_kw: keyword arguments of the engine (``make_engine(engine, **kw)``).
        compress: the reference's domain compression (default: on for ``mbi``, which is
            the only engine that supports it; see :func:`compress_supports`).
        relation: the neighbouring relation (:func:`sensitivities`): ``add_remove`` (the
            reference's) or ``replace_one`` (FedForge's: √2 × the noise std, scores of
            sensitivity 2).

    Returns:
        ``{"codes": (rows, d) int32 on the ORIGINAL domain, "wall_s": float seconds
        (measure + select + fit + sample), "rho": float, "cliques": [[a, b], ...] the
        tree, "sigma_one_way", "sigma_tree": noise std per cell, "engine": name,
        "fit_s": float, "compressed_sizes": list of the attribute sizes fitted}``.

    Raises:
        CentralMstError: bad codes, domain, ε or δ.
        synth.engine.EngineUnavailable: ``engine="mbi"`` without mbi installed.
    """
    arr = _check_inputs(codes, domain, epsilon, delta)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    rho = cdp_rho(epsilon, delta)
    d2, d1 = sensitivities(relation)
    sigma = math.sqrt(3.0 * d2 / (2.0 * rho))
    one = _measure(arr, domain, [(a,) for a in domain.attributes], sigma, rng, max_cells)
    if compress is None:
        compress = engine == "mbi"
    if compress and engine != "mbi":
        raise CentralMstError("domain compression needs engine='mbi' (a weighted query)")
    n = arr.shape[0] if rows is None else int(rows)
    kw = dict(engine_kw) if engine_kw is not None else (
        {"iters": DEFAULT_MBI_ITERS} if engine == "mbi" else {})
    if compress:
        maps = compress_supports(one)
        cdom, ccodes = compress_codes(arr, domain, maps)
        one_c = [NoisyMarginal(clique=m.clique, values=np.bincount(
            maps[m.clique[0]], weights=m.values, minlength=cdom.sizes[i])
            if m.clique[0] in maps else m.values, sigma=m.sigma) for i, m in enumerate(one)]
        tree = mst_select_private(ccodes, cdom, one_c, rho / 3.0, rng, max_cells=max_cells,
                                  score_sensitivity=d1)
        two = _measure(ccodes, cdom, tree, sigma, rng, max_cells) if tree else []
        t1 = time.perf_counter()
        fm = _fit_mbi_compressed(domain, cdom, maps, one, two, iters=int(kw.get("iters", DEFAULT_MBI_ITERS)))
        fit_s = time.perf_counter() - t1
        syn = uncompress_codes(np.asarray(fm.sample(n, rng), dtype=np.int32), domain, maps, rng)
        csizes = list(cdom.sizes)
    else:
        tree = mst_select_private(arr, domain, one, rho / 3.0, rng, max_cells=max_cells,
                                  score_sensitivity=d1)
        two = _measure(arr, domain, tree, sigma, rng, max_cells) if tree else []
        eng = make_engine(engine, **kw)
        t1 = time.perf_counter()
        fm = eng.fit(domain, one + two, total=None,
                     workload=[tuple(c) for c in workload] if workload is not None else None,
                     seed=seed)
        fit_s = time.perf_counter() - t1
        syn = np.asarray(fm.sample(n, rng), dtype=np.int32)
        csizes = list(domain.sizes)
    return {"codes": syn, "wall_s": time.perf_counter() - t0, "rho": rho,
            "cliques": [list(e) for e in tree], "sigma_one_way": one[0].sigma,
            "compressed_sizes": csizes,
            "sigma_tree": two[0].sigma if two else None, "engine": engine, "fit_s": fit_s}


def independent_ensemble(party_codes: Sequence[np.ndarray], domain: Domain, *,
                         epsilon: float, delta: float, seed: int, engine: str = "mbi",
                         max_cells: int = DEFAULT_MAX_CELLS,
                         workload: Sequence[Sequence[str]] | None = None,
                         engine_kw: Mapping[str, Any] | None = None,
                         relation: str = "add_remove") -> dict[str, Any]:
    """Each party fits its own :func:`central_mst` on its rows at the full (ε, δ); pooled.

    Args:
        party_codes: one ``(n_i, d)`` int code array per party (n_i ≥ 1).
        domain: the shared domain.
        epsilon, delta: every party's (ε, δ) (parallel composition over disjoint rows).
        seed: party i uses ``seed + i``.
        engine, max_cells, workload, engine_kw, relation: as :func:`central_mst`.

    Returns:
        ``{"codes": (Σ n_i, d) int32 (party 0's rows first), "wall_s": summed seconds,
        "rho": ρ of each party, "cliques": one tree per party, "parties": K}``.

    Raises:
        CentralMstError: no parties, or a party's bad codes.
    """
    if not party_codes:
        raise CentralMstError("no parties")
    outs = []
    for i, pc in enumerate(party_codes):
        try:
            outs.append(central_mst(pc, domain, epsilon=epsilon, delta=delta, seed=seed + i,
                                    engine=engine, max_cells=max_cells, workload=workload,
                                    engine_kw=engine_kw, relation=relation))
        except (CentralMstError, DomainError) as e:
            raise CentralMstError(f"party {i}: {e}") from e
    return {"codes": np.concatenate([o["codes"] for o in outs], axis=0),
            "wall_s": float(sum(o["wall_s"] for o in outs)), "rho": outs[0]["rho"],
            "cliques": [o["cliques"] for o in outs], "parties": len(outs)}


# ---------------------------------------------------------------------------- AIM
def _workload_candidates(domain: Domain, workload: Sequence[Sequence[str]]
                         ) -> dict[tuple[str, ...], float]:
    """AIM's candidates: the downward closure of the workload, each weighted by
    ``Σ_w |cl ∩ w|`` (private-pgm ``compile_workload``, unit workload weights). Cliques are
    in domain order."""
    order = {a: i for i, a in enumerate(domain.attributes)}
    wl = [tuple(sorted(set(w), key=order.__getitem__)) for w in workload]
    closure: set[tuple[str, ...]] = set()
    for w in wl:
        for r in range(1, len(w) + 1):
            closure.update(itertools.combinations(w, r))
    sets = [frozenset(w) for w in wl]
    return {cl: float(sum(len(frozenset(cl) & w) for w in sets))
            for cl in sorted(closure, key=lambda c: (len(c), [order[a] for a in c]))}


def central_aim(codes: np.ndarray, domain: Domain, *, epsilon: float, delta: float,
                seed: int, workload: Sequence[Sequence[str]] | None = None,
                rounds: int | None = None, max_model_size: float = 80.0,
                max_iters: int = 1000, rows: int | None = None,
                max_cells: int = DEFAULT_MAX_CELLS,
                relation: str = "add_remove") -> dict[str, Any]:
    """Centralised AIM (McKenna et al., VLDB 2022), as private-pgm's ``mechanisms/aim.py``.

    ρ = ``cdp_rho(ε, δ)``; T = ``rounds`` (default 16·d); σ = sqrt(T / (2·0.9ρ)) and the
    selection ε = sqrt(8·0.1ρ/T). All one-way marginals are measured first; each round
    then picks, by the exponential mechanism (coefficient 1/2, sensitivity = the largest
    candidate weight), the candidate (downward closure of the workload, weighted by
    overlap) with the largest ``w·(||x − x̂||_1 − sqrt(2/π)·σ·cells)`` among those whose
    junction tree stays under ``max_model_size·ρ_used/ρ`` MB (or already supported),
    measures it with N(0, σ²), refits mbi's ``MirrorDescent`` warm-started, and halves σ
    (doubles ε) when the new measurement barely moved the model. The last round uses up
    what is left. Candidate scoring runs under ``jax.disable_jit()`` (fedforge.md: JAX
    compilation dominates AIM on CPU otherwise). Needs ``mbi``.

    Args:
        codes: ``(n, d)`` int codes of the pooled rows.
        domain: the shared domain.
        epsilon, delta: the (ε, δ) target.
        seed: noise, selection and sampling seed.
        workload: the cliques judged (default all 3-way, or all k-way with k = d if d < 3).
        rounds: T (default 16·d).
        max_model_size: the model cap, MB.
        max_iters: mirror-descent iterations per fit.
        rows: rows to sample (default n).
        max_cells: candidates with more cells are left out.
        relation: as :func:`central_mst` (``replace_one``: every measurement's ρ is
            Δ₂²/(2σ²) with Δ₂² = 2, the selection's scores have sensitivity 2 × weight).

    Returns:
        ``{"codes", "wall_s", "rho", "cliques" (measured, in order), "rounds" (run),
        "fit_s"}``.

    Raises:
        CentralMstError: bad input, or ``rounds`` ≤ 0.9·d (the one-way marginals would
            overspend ρ). synth.engine.EngineUnavailable: no mbi.
    """
    from synth.engine import MbiFittedModel, _import_mbi
    from synth.quality import all_k_way

    mbi = _import_mbi()
    import jax
    from mbi.junction_tree import hypothetical_model_size

    arr = _check_inputs(codes, domain, epsilon, delta)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    d = len(domain)
    rho = cdp_rho(epsilon, delta)
    d2, d1 = sensitivities(relation)
    wl = workload if workload is not None else all_k_way(domain, min(3, d))
    candidates = {cl: w for cl, w in _workload_candidates(domain, wl).items()
                  if domain.size(cl) <= max_cells}
    answers = {cl: marginal(arr, domain, cl, max_cells=max_cells).reshape(-1)
               for cl in candidates}
    mdom = mbi.Domain(tuple(domain.attributes), tuple(domain.sizes))
    est = mbi.estimation.MirrorDescent()
    t_rounds = int(rounds) if rounds else 16 * d
    if 0.9 * d / t_rounds >= 1.0:
        raise CentralMstError(f"rounds={t_rounds} is too few for {d} attributes: the one-way "
                              f"marginals alone would take 0.9·d/T = {0.9 * d / t_rounds:.2f} "
                              f"of ρ (need T > 0.9·d)")
    sigma = math.sqrt(d2 * t_rounds / (2.0 * 0.9 * rho))
    eps = math.sqrt(8.0 * 0.1 * rho / t_rounds)
    measurements = []
    cliques: list[tuple[str, ...]] = []
    for a in domain.attributes:
        x = answers.get((a,), marginal(arr, domain, (a,)).reshape(-1))
        measurements.append(mbi.LinearMeasurement(x + rng.normal(0.0, sigma, x.size), (a,),
                                                  stddev=sigma))
        cliques.append((a,))
    rho_used = d * 0.5 * d2 / sigma ** 2
    fit_s = 0.0

    def fit(warm: Any) -> Any:
        nonlocal fit_s
        t = time.perf_counter()
        m = est.estimate(mdom, measurements, iters=max_iters, warm_start=warm)
        fit_s += time.perf_counter() - t
        return m

    model = fit(None)
    t = 0
    terminate = False
    while not terminate:
        t += 1
        if rho - rho_used < 2 * (0.5 * d2 / sigma ** 2 + eps ** 2 / 8.0):
            remaining = rho - rho_used
            sigma = math.sqrt(d2 / (2.0 * 0.9 * remaining))
            eps = math.sqrt(8.0 * 0.1 * remaining)
            terminate = True
        rho_used += eps ** 2 / 8.0 + 0.5 * d2 / sigma ** 2
        size_limit = max_model_size * rho_used / rho
        free = {frozenset(s) for c in cliques for r in range(1, len(c) + 1)
                for s in itertools.combinations(c, r)}
        small = [cl for cl in candidates
                 if frozenset(cl) in free
                 or hypothetical_model_size(mdom, cliques + [cl]) <= size_limit]
        errors = np.empty(len(small))
        with jax.disable_jit():
            for i, cl in enumerate(small):
                xest = np.asarray(model.project(cl).transpose(cl).datavector(), dtype=np.float64)
                bias = math.sqrt(2.0 / math.pi) * sigma * domain.size(cl)
                errors[i] = candidates[cl] * (float(np.abs(answers[cl] - xest).sum()) - bias)
        sens = d1 * max(abs(candidates[cl]) for cl in small)
        cl = small[exponential_mechanism(errors, eps, sens, rng)]
        x = answers[cl]
        measurements.append(mbi.LinearMeasurement(x + rng.normal(0.0, sigma, x.size), cl,
                                                  stddev=sigma))
        cliques.append(cl)
        with jax.disable_jit():
            z = np.asarray(model.project(cl).transpose(cl).datavector(), dtype=np.float64)
        model = fit(model)
        w = np.asarray(model.project(cl).transpose(cl).datavector(), dtype=np.float64)
        if np.abs(w - z).sum() <= sigma * math.sqrt(2.0 / math.pi) * x.size:
            sigma /= 2.0
            eps *= 2.0
    model = fit(model)
    total = float(model.total)
    fm = MbiFittedModel(domain=domain, total=total, model=model, fit_seconds=fit_s)
    n = arr.shape[0] if rows is None else int(rows)
    syn = np.asarray(fm.sample(n, rng), dtype=np.int32)
    return {"codes": syn, "wall_s": time.perf_counter() - t0, "rho": rho,
            "cliques": [list(c) for c in cliques], "rounds": t, "fit_s": fit_s}


__all__ = ["CentralMstError", "central_aim", "central_mst", "exponential_mechanism", "independent_ensemble",
           "mst_select_private", "project_to_total"]
