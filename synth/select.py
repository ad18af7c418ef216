"""Clique selection at the coordinator from noisy AGGREGATE answers (pure logic).

The coordinator never sees records: it only holds noisy aggregate marginals
(:class:`synth.engine.NoisyMarginal`), each already DP. Everything here is a function
of those answers, so it is **post-processing** and spends no privacy budget (Dwork &
Roth 2014, Prop. 2.1); no exponential mechanism is needed, unlike the centralised
MST/AIM whose selection scores touch the data.

MST, federated variant
----------------------
McKenna, Sheldon & Miklau, "Winning the NIST Contest: A scalable and general
approach to differentially private synthetic data" (JPC 2021), split ρ in thirds:
1-way marginals, private selection of a maximum spanning tree of 2-way marginals,
then the tree's 2-way marginals. Here (:func:`mst_budget`):

1. ρ/3: every 1-way marginal, measured by the parties.
2. ρ/3: **all** candidate 2-way marginals (:func:`candidate_pairs`), measured by the
   parties with noise; the coordinator scores each pair from those noisy answers
   (:func:`pair_scores`) and takes a maximum spanning tree (:func:`mst_select`).
3. ρ/3: the d − 1 tree pairs, measured again with fresh noise (their phase-2 answers
   may also be handed to the engine: that is free post-processing).

AIM-style rounds
----------------
:func:`aim_scores` scores candidate cliques from their noisy aggregate answers: how badly
the current model estimates each, after subtracting the noise expected in the answer and
in the next measurement (McKenna et al., "AIM: An Adaptive and Iterative Mechanism for
Differentially Private Synthetic Data", VLDB 2022, §4 score, with the data replaced by the
noisy aggregate answer). :func:`aim_select_round` takes the best one;
:func:`aim_select_batch` the best few that fit a model-size rule, for one federated round
(the coordinator's ``aim`` mechanism: 1-way and all-pairs answer rounds, then adaptive
rounds of such batches).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import networkx as nx
import numpy as np

from synth.domain import DEFAULT_MAX_CELLS, Domain, DomainTooLarge, check_clique_size
from synth.engine import NoisyMarginal, estimate_total

Pair = tuple[str, str]
Clique = tuple[str, ...]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def mst_budget(rho_total: float) -> tuple[float, float, float]:
    """MST's budget split in thirds.

    Args:
        rho_total: the ρ (zCDP) of the whole mechanism, > 0.

    Returns:
        ``(rho_one_way, rho_select, rho_tree)``, each ``rho_total / 3`` (summing to
        ``rho_total`` up to float rounding).

    Raises:
        ValueError: ``rho_total`` not positive and finite.
    """
    r = float(rho_total)
    if not (0.0 < r < math.inf):
        raise ValueError(f"rho_total must be positive and finite, got {rho_total!r}")
    return r / 3.0, r / 3.0, r - 2.0 * (r / 3.0)


def candidate_pairs(domain: Domain, *, max_cells: int = DEFAULT_MAX_CELLS,
                    strict: bool = False) -> list[Pair]:
    """All attribute pairs (in domain order) whose 2-way marginal fits under ``max_cells``.

    Args:
        domain: the domain.
        max_cells: the most cells a pair's marginal may have.
        strict: raise on the first too-large pair instead of leaving it out.

    Returns:
        The pairs ``(a, b)`` with ``a`` before ``b`` in the domain.

    Raises:
        DomainTooLarge: ``strict`` and a pair exceeds ``max_cells``.
    """
    out: list[Pair] = []
    for a, b in itertools.combinations(domain.attributes, 2):
        try:
            check_clique_size(domain, (a, b), max_cells=max_cells)
        except DomainTooLarge:
            if strict:
                raise
            continue
        out.append((a, b))
    return out


def _normalised(values: np.ndarray) -> np.ndarray:
    """Clip at 0 and normalise to sum 1 (uniform if nothing is left)."""
    v = np.clip(np.asarray(values, dtype=np.float64), 0.0, None)
    s = v.sum()
    return v / s if s > 0 else np.full(v.shape, 1.0 / v.size)


def pair_scores(domain: Domain, one_way: Mapping[str, NoisyMarginal],
                two_way: Mapping[Pair, NoisyMarginal], *,
                model_marginal: Callable[[Pair], np.ndarray] | None = None,
                debias: bool = True) -> dict[Pair, float]:
    """Score each measured pair by how badly independence (or a model) explains it.

    ``score(a, b) = ||y_ab − N̂ · p_a ⊗ p_b||_1 − sqrt(2/π) · σ_ab · cells_ab``, where
    ``y_ab`` is the noisy 2-way answer (counts), ``p_a`` the clipped, normalised noisy
    1-way answer, and ``N̂`` the inverse-variance estimate of the total from the 1-way
    answers. With ``model_marginal``, the product term is replaced by the model's
    2-way estimate (counts). The subtracted term is the expected L1 norm of the answer's
    Gaussian noise, so large pairs are not favoured for their noise (``debias``).

    Args:
        domain: the domain.
        one_way: attribute -> its noisy 1-way marginal.
        two_way: pair -> its noisy 2-way marginal (either attribute order).
        model_marginal: optional ``pair -> (k_a, k_b)`` float64 counts.
        debias: subtract the expected noise L1.

    Returns:
        ``{(a, b): score}`` (a before b in the domain), in counts.

    Raises:
        KeyError: a 1-way marginal that a pair needs is missing (named).
        ValueError: a marginal's length does not match the domain.
    """
    for a, m in one_way.items():
        if m.clique != (a,) or m.values.size != domain.size((a,)):
            raise ValueError(f"one_way[{a!r}] has clique {m.clique!r} and "
                             f"{m.values.size} values; expected ({a!r},) with "
                             f"{domain.size((a,))}")
    total = estimate_total(list(one_way.values())) if one_way else 1.0
    scores: dict[Pair, float] = {}
    order = {a: i for i, a in enumerate(domain.attributes)}
    seen: set[frozenset[str]] = set()
    for key, m in two_way.items():
        if len(m.clique) != 2:
            raise ValueError(f"two_way[{key!r}] has clique {m.clique!r}, not a pair")
        a, b = sorted(m.clique, key=order.__getitem__)
        if frozenset((a, b)) in seen:
            continue
        seen.add(frozenset((a, b)))
        if m.values.size != domain.size((a, b)):
            raise ValueError(f"two_way[{key!r}] has {m.values.size} values; expected "
                             f"{domain.size((a, b))}")
        y = m.values.reshape(domain.shape(m.clique))
        if m.clique != (a, b):
            y = y.T
        if model_marginal is not None:
            est = np.asarray(model_marginal((a, b)), dtype=np.float64).reshape(y.shape)
        else:
            for c in (a, b):
                if c not in one_way:
                    raise KeyError(f"no 1-way marginal for attribute {c!r}")
            est = total * np.outer(_normalised(one_way[a].values),
                                   _normalised(one_way[b].values))
        score = float(np.abs(y - est).sum())
        if debias:
            score -= _SQRT_2_OVER_PI * m.sigma * y.size
        scores[(a, b)] = score
    return scores


def mst_select(domain: Domain, one_way: Mapping[str, NoisyMarginal],
               two_way: Mapping[Pair, NoisyMarginal], *,
               model_marginal: Callable[[Pair], np.ndarray] | None = None,
               debias: bool = True) -> list[Pair]:
    """The maximum spanning tree over :func:`pair_scores` (post-processing only).

    Kruskal's algorithm (``networkx.maximum_spanning_tree``) on the graph of measured
    pairs; every attribute is a node. Ties are broken by the order of ``two_way``.

    Args:
        domain, one_way, two_way, model_marginal, debias: as :func:`pair_scores`.

    Returns:
        The tree's edges ``(a, b)`` (a before b in the domain), sorted in domain order:
        ``d − 1`` edges spanning all attributes if the measured pairs connect them (a
        spanning forest otherwise, e.g. when :func:`candidate_pairs` left pairs out).

    Raises:
        KeyError, ValueError: as :func:`pair_scores`.
    """
    scores = pair_scores(domain, one_way, two_way, model_marginal=model_marginal,
                         debias=debias)
    g = nx.Graph()
    g.add_nodes_from(domain.attributes)
    for (a, b), s in scores.items():
        g.add_edge(a, b, weight=s)
    tree = nx.maximum_spanning_tree(g, algorithm="kruskal")
    order = {a: i for i, a in enumerate(domain.attributes)}
    edges = [tuple(sorted((a, b), key=order.__getitem__)) for a, b in tree.edges()]
    return sorted(edges, key=lambda e: (order[e[0]], order[e[1]]))  # type: ignore[return-value]


def aim_scores(domain: Domain, candidates: Sequence[Sequence[str]],
               answers: Mapping[Clique, NoisyMarginal],
               model_marginal: Callable[[Clique], np.ndarray], *, sigma_next: float,
               weights: Mapping[Clique, float] | None = None) -> dict[Clique, float]:
    """AIM's quality score of every candidate clique, from noisy aggregate answers.

    ``score(r) = w_r · (||y_r − M_r(model)||_1 − sqrt(2/π) · (σ_y,r + σ_next) · n_r)``,
    where ``y_r`` is the noisy aggregate answer of candidate r (counts), ``σ_y,r`` its
    noise std, ``M_r(model)`` the current model's estimate (counts), ``n_r`` its cells
    and ``σ_next`` the std the next measurement would carry. The first noise term
    removes the expected L1 of the answer's own noise; the second is AIM's penalty for
    the noise the new measurement would add (McKenna et al. VLDB 2022, §4, with the data
    replaced by the noisy aggregate answer). Post-processing of the answers.

    Args:
        domain: the domain.
        candidates: the cliques to score (each must have an answer).
        answers: clique -> its noisy aggregate answer (keyed by the clique tuple).
        model_marginal: ``clique -> counts`` of the current model, shape
            ``domain.shape(clique)``.
        sigma_next: noise std of the next measurement (> 0).
        weights: per-clique workload weights ``w_r`` (default 1).

    Returns:
        ``{clique: score}`` in the candidates' order.

    Raises:
        ValueError: no candidates, a bad sigma_next.
        KeyError: a candidate without an answer (named).
    """
    if not candidates:
        raise ValueError("no candidate cliques")
    if not (0.0 < sigma_next < math.inf):
        raise ValueError(f"sigma_next must be positive and finite, got {sigma_next!r}")
    out: dict[Clique, float] = {}
    for cand in candidates:
        c = tuple(cand)
        if c not in answers:
            raise KeyError(f"no noisy answer for candidate clique {c!r}")
        m = answers[c]
        shape = domain.shape(c)
        y = m.values.reshape(shape)
        est = np.asarray(model_marginal(c), dtype=np.float64).reshape(shape)
        w = 1.0 if weights is None else float(weights.get(c, 1.0))
        out[c] = w * (float(np.abs(y - est).sum())
                      - _SQRT_2_OVER_PI * (m.sigma + sigma_next) * y.size)
    return out


def aim_select_round(domain: Domain, candidates: Sequence[Sequence[str]],
                     answers: Mapping[Clique, NoisyMarginal],
                     model_marginal: Callable[[Clique], np.ndarray], *,
                     sigma_next: float,
                     weights: Mapping[Clique, float] | None = None) -> tuple[Clique, float]:
    """One AIM-style round: the candidate clique with the highest :func:`aim_scores`.

    Returns:
        ``(clique, score)`` of the best candidate (the first one on ties).

    Raises:
        ValueError: no candidates, a bad sigma_next.
        KeyError: a candidate without an answer (named).
    """
    scores = aim_scores(domain, candidates, answers, model_marginal, sigma_next=sigma_next,
                        weights=weights)
    best = max(scores.items(), key=lambda kv: kv[1])  # max keeps the first on ties
    return best


def aim_select_batch(domain: Domain, candidates: Sequence[Sequence[str]],
                     answers: Mapping[Clique, NoisyMarginal],
                     model_marginal: Callable[[Clique], np.ndarray], *, sigma_next: float,
                     batch: int, fits: Callable[[list[Clique]], bool] | None = None,
                     weights: Mapping[Clique, float] | None = None) -> list[tuple[Clique, float]]:
    """A batch of AIM-style picks for one federated round: the ``batch`` best-scoring
    distinct candidates (:func:`aim_scores`), taken greedily in score order, skipping a
    candidate when ``fits(chosen + [candidate])`` is False (e.g. the graphical model would
    pass its size limit, as AIM's ``filter_candidates``).

    One bus round per batch instead of per clique: the scores of the batch all come from
    the same model, where AIM refits after each pick; that trades some adaptivity for
    ``batch`` times fewer rounds of secure aggregation.

    Returns:
        ``[(clique, score), ...]``, best first (fewer than ``batch`` if too few fit).

    Raises:
        ValueError: no candidates, a bad sigma_next or batch < 1.
        KeyError: a candidate without an answer (named).
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    scores = aim_scores(domain, candidates, answers, model_marginal, sigma_next=sigma_next,
                        weights=weights)
    order = sorted(scores.items(), key=lambda kv: -kv[1])
    chosen: list[tuple[Clique, float]] = []
    for c, sc in order:
        if len(chosen) == batch:
            break
        if fits is not None and not fits([x for x, _ in chosen] + [c]):
            continue
        chosen.append((c, sc))
    return chosen


# --------------------------------------------------------------------------- domain compression
# MST's compress_domain / reverse_data (McKenna et al. 2021; private-pgm mechanisms/mst.py):
# after the noisy 1-way marginals, values too rare to be told from noise merge into one
# code per attribute, which shrinks every later marginal and the noise it carries.


def compress_supports(one_way: Sequence[NoisyMarginal]) -> dict[str, np.ndarray]:
    """The reference's ``compress_domain`` rule: per attribute, the values whose noisy
    one-way count is at least 3σ keep their own code (in order); the others merge into one
    last code. Attributes with every value supported are left out. Post-processing of the
    noisy answers: no privacy cost.

    Returns:
        attribute -> ``(k_a,)`` int64 map from original to compressed code.
    """
    maps: dict[str, np.ndarray] = {}
    for m in one_way:
        sup = m.values >= 3.0 * m.sigma
        if sup.all():
            continue
        k = int(sup.sum())
        mp = np.full(m.values.size, k, dtype=np.int64)
        mp[sup] = np.arange(k)
        maps[m.clique[0]] = mp
    return maps


def compress_domain(domain: Domain, maps: Mapping[str, np.ndarray]) -> Domain:
    """The domain after :func:`compress_supports`'s maps."""
    sizes = list(domain.sizes)
    for a, mp in maps.items():
        sizes[domain.index(a)] = int(mp.max()) + 1
    return Domain(attributes=domain.attributes, sizes=tuple(sizes))


def compress_codes(codes: np.ndarray, domain: Domain, maps: Mapping[str, np.ndarray]
                   ) -> tuple[Domain, np.ndarray]:
    """The compressed domain and the codes mapped onto it (``(n, d)`` int32)."""
    out = np.array(codes, dtype=np.int32, copy=True)
    for a, mp in maps.items():
        j = domain.index(a)
        out[:, j] = mp[codes[:, j]]
    return compress_domain(domain, maps), out


def compress_marginal(values: np.ndarray, mp: np.ndarray) -> np.ndarray:
    """A 1-way marginal (``(k_a,)``) summed onto its compressed codes (``(max(mp)+1,)``)."""
    return np.bincount(mp, weights=np.asarray(values, dtype=np.float64),
                       minlength=int(mp.max()) + 1)


def uncompress_codes(codes: np.ndarray, domain: Domain, maps: Mapping[str, np.ndarray],
                     rng: np.random.Generator) -> np.ndarray:
    """Back to the original domain: a merged code becomes a uniform draw among the merged
    original values (the reference's ``reverse_data``)."""
    out = np.array(codes, dtype=np.int32, copy=True)
    for a, mp in maps.items():
        j = domain.index(a)
        k = int(mp.max())
        kept = np.flatnonzero(mp < k) if (mp == k).any() else np.arange(mp.size)
        extra = np.flatnonzero(mp == k)
        col = codes[:, j]
        merged = col == k if extra.size else np.zeros(col.size, dtype=bool)
        res = np.empty(col.size, dtype=np.int32)
        res[~merged] = kept[col[~merged]]
        if merged.any():
            res[merged] = rng.choice(extra, int(merged.sum()))
        out[:, j] = res
    return out
