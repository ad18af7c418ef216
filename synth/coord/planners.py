"""The mechanisms' pure planners: what each measurement round measures, with which
share of ρ, given the noisy answers released so far.

Nothing here touches the bus, the event loop or files: a planner takes plain values
(the domain, the budget split, noisy aggregate marginals, a model's marginals) and
returns plans (:class:`RoundRequest`: the round's cliques and its ρ). The coordinator's
async driver (:mod:`synth.coord.driver`) asks the planner what to measure, runs the
round, and feeds the released answers back. Every decision is post-processing of DP
answers (:mod:`synth.select`), so none spends budget.

* :func:`split_budget`: ρ from (ε, δ) and its split among the mechanism's rounds, with
  the stream reserve held back for workload updates.
* :func:`compress`: MST's domain compression from the noisy 1-way answers (round 0).
* :class:`MstPlanner`: ``one_way`` (every 1-way marginal), ``select`` (every candidate
  pair within ``max_cells``), ``tree`` (the maximum spanning tree of the noisy pair
  scores); the engine also gets the best-scored further pair answers within
  ``mst.extra_mb`` (:meth:`MstPlanner.measurements`).
* :class:`AimPlanner`: ``one_way``, ``select``, then ``rounds`` adaptive rounds
  ``aim<j>``, each measuring the ``batch`` pairs the current model explains worst.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from synth.accounting import allocate, cdp_rho
from synth.coord.types import Clique
from synth.domain import Domain
from synth.engine import NoisyMarginal
from synth.select import (
    aim_select_batch,
    candidate_pairs,
    compress_domain,
    compress_marginal,
    compress_supports,
    mst_select,
    pair_scores,
)

#: A released noisy marginal on the compressed domain: (clique, values, per-cell std).
Known = tuple[Clique, np.ndarray, np.ndarray]

#: The mechanisms a planner exists for.
MECHANISMS = ("mst", "aim")


class PlanError(ValueError):
    """A planner was given input it cannot plan from.

    Attributes:
        field: the offending argument.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetSplit:
    """The run's ρ and its split.

    Attributes:
        rho: the total ρ (zCDP) of (ε, δ); inf for ε = inf.
        shares: round kind -> its ρ: ``one_way``, ``select`` and ``tree`` (MST) or
            ``adaptive`` (AIM, shared evenly by its adaptive rounds).
        reserve: the ρ held back for workload updates (``stream.rho_frac`` of ``rho``).
    """

    rho: float
    shares: Mapping[str, float]
    reserve: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRequest:
    """One measurement round a planner asks for.

    Attributes:
        round: the round index (the secure-aggregation round id's number).
        name: the round's name (``one_way``, ``select``, ``tree``, ``aim<j>``, ...).
        cliques: the marginals to measure.
        rho: the round's ρ, split evenly among its cliques by the round runner (inf:
            measured exactly).
    """

    round: int
    name: str
    cliques: tuple[Clique, ...]
    rho: float


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Compression:
    """MST's domain compression (post-processing of the noisy 1-way answers).

    Attributes:
        maps: attribute -> ``(k_a,)`` map from original to compressed code (only the
            attributes with a merged value).
        domain: the compressed domain.
        one_way: the noisy 1-way marginals summed onto the compressed codes.
        known: those marginals with each cell's noise std (a merged cell sums the noise
            variances of the values merged into it).
    """

    maps: Mapping[str, np.ndarray]
    domain: Domain
    one_way: Mapping[Clique, NoisyMarginal]
    known: tuple[Known, ...]

    def doc(self, original: Domain) -> dict[str, Any]:
        """The ``compress_domain`` stage's artifact."""
        return {"rule": "values with noisy 1-way count < 3 sigma merge (MST)",
                "sizes": dict(zip(original.attributes, original.sizes, strict=True)),
                "compressed": dict(zip(original.attributes, self.domain.sizes, strict=True)),
                "maps": {a: [int(x) for x in v] for a, v in self.maps.items()}}


def split_budget(*, mechanism: str, epsilon: float, delta: float, weights: Sequence[float],
                 stream_frac: float = 0.0) -> BudgetSplit:
    """ρ from (ε, δ) with the tight conversion (:func:`synth.accounting.cdp_rho`), less
    the ``stream_frac`` reserve, split by ``weights`` among the mechanism's three round
    kinds (:func:`synth.accounting.allocate`); all inf when ε is inf.

    Raises:
        PlanError: an unknown mechanism, not three weights, a reserve outside [0, 1).
        ValueError: a bad ε, δ or weight (:mod:`synth.accounting`).
    """
    if mechanism not in MECHANISMS:
        raise PlanError("mechanism", f"must be one of {MECHANISMS}, got {mechanism!r}")
    if len(weights) != 3:
        raise PlanError("weights", f"need three (1-way, select, third), got {list(weights)}")
    if not 0.0 <= stream_frac < 1.0:
        raise PlanError("stream_frac", f"must be in [0, 1), got {stream_frac!r}")
    if math.isfinite(epsilon):
        rho = cdp_rho(epsilon, delta)
        r1, r2, r3 = allocate(rho * (1.0 - stream_frac), list(weights))
        reserve = rho * stream_frac
    else:
        rho, r1, r2, r3 = math.inf, math.inf, math.inf, math.inf
        reserve = math.inf
    third = "tree" if mechanism == "mst" else "adaptive"
    return BudgetSplit(rho=rho, shares={"one_way": r1, "select": r2, third: r3},
                       reserve=reserve)


def compress(domain: Domain, one_way: Mapping[Clique, NoisyMarginal]) -> Compression:
    """MST's domain compression from the noisy 1-way answers: values whose noisy count is
    below 3σ merge into one code per attribute (:func:`synth.select.compress_supports`).

    Raises:
        PlanError: a 1-way answer of no attribute of ``domain``, or of the wrong size.
    """
    for c, m in one_way.items():
        if len(c) != 1 or c[0] not in domain.attributes:
            raise PlanError("one_way", f"{c!r} is not a 1-way clique of the domain")
        if m.values.size != domain.size(c):
            raise PlanError("one_way", f"{c!r} has {m.values.size} values, the domain "
                            f"{domain.size(c)}")
    maps = compress_supports(list(one_way.values()))
    cdomain = compress_domain(domain, maps)
    comp = {c: NoisyMarginal(clique=c, values=compress_marginal(
        m.values, maps[c[0]]) if c[0] in maps else m.values, sigma=m.sigma)
        for c, m in one_way.items()}
    known = []
    for c, m in comp.items():
        merged = (np.bincount(maps[c[0]], minlength=m.values.shape[0])
                  if c[0] in maps else np.ones(m.values.shape[0]))
        known.append((c, m.values, m.sigma * np.sqrt(merged)))
    return Compression(maps=maps, domain=cdomain, one_way=comp, known=tuple(known))


def known_answers(answers: Mapping[Clique, NoisyMarginal]) -> list[Known]:
    """Released answers as :data:`Known` bounds (one std for every cell)."""
    return [(c, m.values, np.full(m.values.shape[0], m.sigma)) for c, m in answers.items()]


def model_size_check(domain: Domain, *, engine: str, limit_mb: float
                     ) -> Callable[[Sequence[Clique]], bool]:
    """``cliques -> bool``: the graphical model over them stays within ``limit_mb``
    (mbi's ``hypothetical_model_size``); always True for the other engines, whose size
    does not grow with the cliques."""
    if engine != "mbi":
        return lambda cliques: True
    from mbi import Domain as MbiDomain
    from mbi.junction_tree import hypothetical_model_size

    mdom = MbiDomain(tuple(domain.attributes), tuple(domain.sizes))
    return lambda cliques: hypothetical_model_size(mdom, list(cliques)) <= limit_mb


class MeasurementPlanner:
    """The rounds both mechanisms start with: ``one_way`` (round 0) and ``select`` (round
    1: every candidate pair of the compressed domain).

    Args:
        domain: the (uncompressed) domain.
        shares: the budget split's shares (:attr:`BudgetSplit.shares`).
        max_cells: the largest marginal a pair may have.
        engine: the engine that is fitted (``mbi``, ``neural``, ``diffusion``).

    Raises:
        PlanError: an empty domain, a share missing, or a share not > 0 (inf allowed).
    """

    mechanism = ""
    third = ""

    def __init__(self, *, domain: Domain, shares: Mapping[str, float], max_cells: int,
                 engine: str) -> None:
        if not domain.attributes:
            raise PlanError("domain", "has no attributes")
        for key in ("one_way", "select", self.third):
            rho = shares.get(key)
            if rho is None:
                raise PlanError("shares", f"no {key!r} share (got {sorted(shares)})")
            if not rho > 0:
                raise PlanError("shares", f"the {key!r} share must be > 0, got {rho!r}")
        if max_cells < 1:
            raise PlanError("max_cells", f"must be >= 1, got {max_cells}")
        self.domain = domain
        self.shares = dict(shares)
        self.max_cells = max_cells
        self.engine = engine

    @property
    def n_rounds(self) -> int:
        """The mechanism's rounds (the first seed batch covers them all)."""
        raise NotImplementedError

    def one_way(self) -> RoundRequest:
        """Round 0: every 1-way marginal."""
        return RoundRequest(round=0, name="one_way",
                            cliques=tuple((a,) for a in self.domain.attributes),
                            rho=self.shares["one_way"])

    def select(self, cdomain: Domain) -> RoundRequest:
        """Round 1: every pair of the compressed domain within ``max_cells`` (fewer than
        ``d - 1`` when too many are too large: the tree becomes a forest)."""
        return RoundRequest(round=1, name="select",
                            cliques=tuple(candidate_pairs(cdomain, max_cells=self.max_cells)),
                            rho=self.shares["select"])

    def measurements(self, cdomain: Domain, one_way: Mapping[Clique, NoisyMarginal],
                     answers: Mapping[str, Mapping[Clique, NoisyMarginal]]
                     ) -> list[NoisyMarginal]:
        """Every noisy aggregate marginal the engine gets: the compressed 1-way ones, the
        chosen cliques' (every round but ``one_way`` and ``select``, in round order), and
        the selection round's answers for the chosen cliques (measured there too: free
        extra information), then :meth:`extra` answers.

        Args:
            cdomain: the compressed domain.
            one_way: the compressed noisy 1-way marginals.
            answers: round name -> its released noisy marginals, in round order.
        """
        ms = list(one_way.values())
        chosen: dict[Clique, None] = {}
        for name, got in answers.items():
            if name in ("one_way", "select"):
                continue
            for c, m in got.items():
                ms.append(m)
                chosen[c] = None
        if "select" in answers:
            sel = answers["select"]
            ms += [m for c, m in sel.items() if c in chosen]
            ms += self.extra(cdomain, one_way, sel, list(chosen))
        return ms

    def extra(self, cdomain: Domain, one_way: Mapping[Clique, NoisyMarginal],
              answers: Mapping[Clique, NoisyMarginal], chosen: list[Clique]
              ) -> list[NoisyMarginal]:
        """Further selection-round answers for the engine (none by default)."""
        return []


class MstPlanner(MeasurementPlanner):
    """MST, federated: ``one_way``, ``select``, then ``tree`` (round 2): the maximum
    spanning tree of the pairs scored from their noisy answers.

    Args:
        extra_mb: hand the engine further pair answers while the graphical model stays
            within this size (0: none; ``mbi`` only).
        domain, shares, max_cells, engine: as :class:`MeasurementPlanner`.
    """

    mechanism = "mst"
    third = "tree"

    def __init__(self, *, domain: Domain, shares: Mapping[str, float], max_cells: int,
                 engine: str, extra_mb: float = 0.0) -> None:
        super().__init__(domain=domain, shares=shares, max_cells=max_cells, engine=engine)
        if not 0.0 <= extra_mb < math.inf:
            raise PlanError("extra_mb", f"must be finite and >= 0, got {extra_mb!r}")
        self.extra_mb = extra_mb

    @property
    def n_rounds(self) -> int:
        return 3

    def tree(self, cdomain: Domain, one_way: Mapping[Clique, NoisyMarginal],
             answers: Mapping[Clique, NoisyMarginal]) -> RoundRequest:
        """Round 2: the tree's pairs (:func:`synth.select.mst_select` over the compressed
        1-way answers and the selection round's pair answers)."""
        pairs = mst_select(cdomain, {c[0]: m for c, m in one_way.items()},
                           {(c[0], c[1]): m for c, m in answers.items()})
        return RoundRequest(round=2, name="tree", cliques=tuple(tuple(p) for p in pairs),
                            rho=self.shares["tree"])

    def extra(self, cdomain: Domain, one_way: Mapping[Clique, NoisyMarginal],
              answers: Mapping[Clique, NoisyMarginal], chosen: list[Clique]
              ) -> list[NoisyMarginal]:
        """The selection round's answers of further pairs, best scored first
        (:func:`synth.select.pair_scores`), as long as the graphical model stays within
        ``extra_mb``. Paid for already, so post-processing. The diffusion engine gets
        every further answer (its loss takes all 2-way terms from one matrix product, so
        its fit time does not grow with them); the neural engine none (its fit time grows
        with every marginal); mbi never all pairs: a model over all of them is one clique
        of every attribute."""
        if self.extra_mb <= 0 or self.engine not in ("mbi", "diffusion"):
            return []
        if self.engine == "diffusion":
            return [m for c, m in answers.items() if c not in chosen]
        fits = model_size_check(cdomain, engine=self.engine, limit_mb=self.extra_mb)
        scores = pair_scores(cdomain, {c[0]: m for c, m in one_way.items()},
                             {(c[0], c[1]): m for c, m in answers.items()})
        base = list(chosen)
        out: list[NoisyMarginal] = []
        for pair, _ in sorted(scores.items(), key=lambda kv: -kv[1]):
            c = pair if pair in answers else (pair[1], pair[0])
            if c in chosen or c not in answers:
                continue
            if fits(base + [c]):
                base.append(c)
                out.append(answers[c])
        return out


class AimPlanner(MeasurementPlanner):
    """AIM, federated: ``one_way``, ``select``, then ``rounds`` adaptive rounds ``aim<j>``
    (round ``2 + j``), each measuring the ``batch`` pairs the model fitted to everything
    measured so far explains worst (:func:`synth.select.aim_select_batch`), with an even
    share of the ``adaptive`` ρ.

    Args:
        rounds: the adaptive rounds (>= 1).
        batch: the pairs per adaptive round (0: half the attributes, rounded up).
        max_model_mb: skip a pair that would make the graphical model larger (``mbi``).
        domain, shares, max_cells, engine: as :class:`MeasurementPlanner`.
    """

    mechanism = "aim"
    third = "adaptive"

    def __init__(self, *, domain: Domain, shares: Mapping[str, float], max_cells: int,
                 engine: str, rounds: int, batch: int = 0, max_model_mb: float = 25.0
                 ) -> None:
        super().__init__(domain=domain, shares=shares, max_cells=max_cells, engine=engine)
        if rounds < 1:
            raise PlanError("rounds", f"must be >= 1, got {rounds}")
        if batch < 0:
            raise PlanError("batch", f"must be >= 0 (0 = auto), got {batch}")
        if not (max_model_mb > 0 and math.isfinite(max_model_mb)):
            raise PlanError("max_model_mb", f"must be finite and > 0, got {max_model_mb!r}")
        self.rounds = rounds
        self.batch = batch or math.ceil(len(domain.attributes) / 2)
        self.max_model_mb = max_model_mb
        #: each adaptive round's ρ
        self.rho_round = self.shares["adaptive"] / rounds
        #: the Gaussian std of the next round's cliques under replace-one (Δ₂ = √2)
        self.sigma_next = (math.sqrt(self.batch / self.rho_round)
                           if math.isfinite(self.rho_round) else 1.0)

    @property
    def n_rounds(self) -> int:
        return 2 + self.rounds

    @staticmethod
    def round_name(j: int) -> str:
        """The name of adaptive round ``j``."""
        return f"aim{j}"

    def pick(self, cdomain: Domain, answers: Mapping[Clique, NoisyMarginal],
             model_marginal: Callable[[Clique], np.ndarray], *,
             measured: Sequence[Clique]) -> list[tuple[Clique, float]]:
        """The next adaptive round's pairs: the ``batch`` best AIM scores of the
        selection round's answers against the model (``model_marginal``: clique ->
        counts), keeping the model over ``measured`` plus the picks within
        ``max_model_mb``. Best first; empty when nothing fits.

        Raises:
            PlanError: no selection-round answers.
        """
        if not answers:
            raise PlanError("answers", "no selection-round answers to score")
        fits = model_size_check(cdomain, engine=self.engine, limit_mb=self.max_model_mb)
        base = list(measured)
        return aim_select_batch(cdomain, list(answers), answers, model_marginal,
                                sigma_next=self.sigma_next, batch=self.batch,
                                fits=lambda extra: fits(base + extra))

    def adaptive(self, j: int, picks: Sequence[tuple[Clique, float]]) -> RoundRequest:
        """Adaptive round ``j`` measuring ``picks`` (from :meth:`pick`).

        Raises:
            PlanError: ``j`` outside ``[0, rounds)`` or no picks.
        """
        if not 0 <= j < self.rounds:
            raise PlanError("j", f"must be in [0, {self.rounds}), got {j}")
        if not picks:
            raise PlanError("picks", "an adaptive round needs at least one clique")
        return RoundRequest(round=2 + j, name=self.round_name(j),
                            cliques=tuple(tuple(c) for c, _ in picks), rho=self.rho_round)


def planner_for(*, mechanism: str, domain: Domain, shares: Mapping[str, float],
                max_cells: int, engine: str, mst_extra_mb: float = 0.0, aim_rounds: int = 4,
                aim_batch: int = 0, aim_max_model_mb: float = 25.0
                ) -> MstPlanner | AimPlanner:
    """The planner of ``mechanism`` (``mst`` or ``aim``) with its settings.

    Raises:
        PlanError: an unknown mechanism, or a bad setting.
    """
    if mechanism == "mst":
        return MstPlanner(domain=domain, shares=shares, max_cells=max_cells, engine=engine,
                          extra_mb=mst_extra_mb)
    if mechanism == "aim":
        return AimPlanner(domain=domain, shares=shares, max_cells=max_cells, engine=engine,
                          rounds=aim_rounds, batch=aim_batch, max_model_mb=aim_max_model_mb)
    raise PlanError("mechanism", f"must be one of {MECHANISMS}, got {mechanism!r}")


__all__ = ["AimPlanner", "BudgetSplit", "Compression", "Known", "MeasurementPlanner",
           "MstPlanner", "PlanError", "RoundRequest", "compress", "known_answers",
           "model_size_check", "planner_for", "split_budget"]
