"""The coordinator's pure planners (synth.coord.planners): the budget split, MST's domain
compression, MST's and AIM's round plans from synthetic noisy answers; no bus, no I/O."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from synth.accounting import cdp_rho
from synth.coord import planners
from synth.coord.planners import (
    AimPlanner,
    MstPlanner,
    PlanError,
    compress,
    known_answers,
    planner_for,
    split_budget,
)
from synth.domain import Domain, marginal
from synth.engine import NoisyMarginal
from synth.select import candidate_pairs

ATTRS = ("a", "b", "c", "d", "e")
# d has six values of which 4 and 5 never occur: the compression merges them
SIZES = (3, 4, 2, 6, 3)
DOM = Domain(attributes=ATTRS, sizes=SIZES)
N = 20_000
# planted chain of dependencies; e is independent of everything
PLANTED = {("a", "b"), ("b", "c"), ("c", "d")}
SIGMA_1, SIGMA_2 = 5.0, 8.0


def _data(seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.empty((N, len(ATTRS)), dtype=np.int32)
    x[:, 0] = rng.integers(0, 3, N)
    for j, k in ((1, 4), (2, 2), (3, 4)):  # child = parent mod k w.p. 0.8, else uniform
        x[:, j] = np.where(rng.random(N) < 0.8, x[:, j - 1] % k, rng.integers(0, k, N))
    x[:, 4] = rng.integers(0, 3, N)
    return x


def _noisy(x: np.ndarray, dom: Domain, clique: tuple[str, ...], sigma: float,
           rng: np.random.Generator) -> NoisyMarginal:
    counts = marginal(x, dom, clique).ravel().astype(np.float64)
    return NoisyMarginal(clique=clique, values=counts + rng.normal(0.0, sigma, counts.size),
                         sigma=sigma)


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return _data()


def _shares(mechanism: str, epsilon: float = 1.0) -> dict[str, float]:
    return dict(split_budget(mechanism=mechanism, epsilon=epsilon, delta=1e-9,
                             weights=(1.0, 2.0, 3.0) if mechanism == "mst" else (0.1, 0.3, 0.6)
                             ).shares)


def _compressed(x: np.ndarray, seed: int = 1):
    rng = np.random.default_rng(seed)
    one = {(a,): _noisy(x, DOM, (a,), SIGMA_1, rng) for a in ATTRS}
    return compress(DOM, one)


def _pair_answers(x: np.ndarray, comp, seed: int = 2) -> dict[tuple[str, ...], NoisyMarginal]:
    """Noisy answers of every candidate pair, counted on the compressed codes."""
    rng = np.random.default_rng(seed)
    cx = x.copy()
    for a, mp in comp.maps.items():
        j = DOM.index(a)
        cx[:, j] = mp[x[:, j]]
    return {p: _noisy(cx, comp.domain, p, SIGMA_2, rng) for p in candidate_pairs(comp.domain)}


def _is_spanning_tree(edges: tuple[tuple[str, ...], ...], nodes: tuple[str, ...]) -> bool:
    parent = {v: v for v in nodes}

    def find(v: str) -> str:
        while parent[v] != v:
            v = parent[v]
        return v

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra == rb:
            return False  # a cycle
        parent[ra] = rb
    return len(edges) == len(nodes) - 1


# --------------------------------------------------------------------------- the budget
@pytest.mark.parametrize("frac", [0.0, 0.25])
def test_split_budget_divides_rho_less_the_reserve_by_the_weights(frac: float) -> None:
    rho = cdp_rho(1.0, 1e-9)
    mst = split_budget(mechanism="mst", epsilon=1.0, delta=1e-9, weights=(1, 1, 2),
                       stream_frac=frac)
    assert mst.rho == pytest.approx(rho, rel=1e-12)
    assert list(mst.shares) == ["one_way", "select", "tree"]
    assert math.fsum(mst.shares.values()) == pytest.approx(rho * (1 - frac), rel=1e-12)
    assert mst.shares["tree"] == pytest.approx(2 * mst.shares["one_way"], rel=1e-12)
    assert mst.reserve == pytest.approx(rho * frac, rel=1e-12, abs=0.0)
    aim = split_budget(mechanism="aim", epsilon=1.0, delta=1e-9, weights=(0.1, 0.3, 0.6),
                       stream_frac=frac)
    assert list(aim.shares) == ["one_way", "select", "adaptive"]
    assert aim.shares["adaptive"] == pytest.approx(6 * aim.shares["one_way"], rel=1e-9)


def test_split_budget_without_privacy_is_infinite() -> None:
    b = split_budget(mechanism="mst", epsilon=math.inf, delta=1e-9, weights=(1, 1, 1))
    assert b.rho == b.reserve == math.inf
    assert all(v == math.inf for v in b.shares.values())


@pytest.mark.parametrize(("kw", "field"), [
    ({"mechanism": "pgm"}, "mechanism"),
    ({"weights": (1.0, 1.0)}, "weights"),
    ({"stream_frac": 1.0}, "stream_frac"),
])
def test_split_budget_refuses_bad_input(kw: dict, field: str) -> None:
    args = {"mechanism": "mst", "epsilon": 1.0, "delta": 1e-9, "weights": (1, 1, 1), **kw}
    with pytest.raises(PlanError) as e:
        split_budget(**args)
    assert e.value.field == field


# --------------------------------------------------------------------------- compression
def test_compress_merges_values_below_three_sigma(x: np.ndarray) -> None:
    comp = _compressed(x)
    # d's two absent values merge into one code; every other value is well supported
    assert set(comp.maps) == {"d"}
    assert comp.maps["d"].tolist() == [0, 1, 2, 3, 4, 4]
    assert comp.domain.attributes == ATTRS
    assert comp.domain.sizes == (3, 4, 2, 5, 3)
    d = comp.one_way[("d",)]
    assert d.values.shape == (5,) and d.sigma == SIGMA_1
    raw = _compressed(x)  # same seed: same answers
    assert np.array_equal(d.values, raw.one_way[("d",)].values)
    # the merged cell's std sums the two variances; the others keep sigma
    std = dict((c, s) for c, _, s in comp.known)[("d",)]
    np.testing.assert_allclose(std, [SIGMA_1] * 4 + [SIGMA_1 * math.sqrt(2)], rtol=1e-12)
    doc = comp.doc(DOM)
    assert doc["sizes"]["d"] == 6 and doc["compressed"]["d"] == 5
    assert doc["maps"] == {"d": [0, 1, 2, 3, 4, 4]}


def test_compress_refuses_answers_that_are_not_one_way() -> None:
    m = NoisyMarginal(clique=("a", "b"), values=np.zeros(12), sigma=1.0)
    with pytest.raises(PlanError, match="1-way"):
        compress(DOM, {("a", "b"): m})
    with pytest.raises(PlanError, match="values"):
        compress(DOM, {("a",): NoisyMarginal(clique=("a",), values=np.zeros(4), sigma=1.0)})


def test_known_answers_give_every_cell_the_answers_sigma() -> None:
    m = NoisyMarginal(clique=("a", "b"), values=np.arange(12.0), sigma=3.0)
    [(c, v, s)] = known_answers({("a", "b"): m})
    assert c == ("a", "b") and v is m.values
    np.testing.assert_array_equal(s, np.full(12, 3.0))


# --------------------------------------------------------------------------- MST
def test_mst_plans_one_way_all_pairs_then_a_spanning_tree(x: np.ndarray) -> None:
    shares = _shares("mst")
    p = MstPlanner(domain=DOM, shares=shares, max_cells=1_000_000, engine="neural")
    assert p.n_rounds == 3
    ow = p.one_way()
    assert (ow.round, ow.name, ow.rho) == (0, "one_way", shares["one_way"])
    assert ow.cliques == tuple((a,) for a in ATTRS)
    comp = _compressed(x)
    sel = p.select(comp.domain)
    assert (sel.round, sel.name, sel.rho) == (1, "select", shares["select"])
    assert len(sel.cliques) == math.comb(len(ATTRS), 2)
    answers = _pair_answers(x, comp)
    tree = p.tree(comp.domain, comp.one_way, answers)
    assert (tree.round, tree.name, tree.rho) == (2, "tree", shares["tree"])
    assert _is_spanning_tree(tree.cliques, ATTRS)
    # the planted chain is in the tree (e, independent, hangs on anything)
    assert PLANTED <= set(tree.cliques)
    # the three rounds spend the split exactly
    assert ow.rho + sel.rho + tree.rho == pytest.approx(
        cdp_rho(1.0, 1e-9), rel=1e-12)


def test_mst_select_leaves_out_pairs_over_max_cells(x: np.ndarray) -> None:
    comp = _compressed(x)
    p = MstPlanner(domain=DOM, shares=_shares("mst"), max_cells=10, engine="neural")
    sel = p.select(comp.domain)
    assert sel.cliques and all(comp.domain.size(c) <= 10 for c in sel.cliques)
    assert ("b", "d") not in sel.cliques  # 4 x 5 = 20 cells


def test_mst_measurements_are_one_way_then_chosen_then_their_select_answers(
        x: np.ndarray) -> None:
    comp = _compressed(x)
    answers = _pair_answers(x, comp)
    p = MstPlanner(domain=DOM, shares=_shares("mst"), max_cells=1_000_000, engine="neural",
                   extra_mb=1.0)  # extra answers are for mbi only
    tree = p.tree(comp.domain, comp.one_way, answers)
    rng = np.random.default_rng(3)
    tree_answers = {c: NoisyMarginal(clique=c, values=answers[c].values
                                     + rng.normal(0, 1.0, answers[c].values.size), sigma=4.0)
                    for c in tree.cliques}
    ms = p.measurements(comp.domain, comp.one_way,
                        {"one_way": {}, "select": answers, "tree": tree_answers})
    k = len(ATTRS) - 1
    assert len(ms) == len(ATTRS) + 2 * k
    assert [m.clique for m in ms[:len(ATTRS)]] == [(a,) for a in ATTRS]
    assert ms[len(ATTRS):len(ATTRS) + k] == list(tree_answers.values())
    assert ms[len(ATTRS) + k:] == [answers[c] for c in tree.cliques]


def test_mst_extra_answers_fill_the_model_size_in_score_order(x: np.ndarray) -> None:
    pytest.importorskip("mbi")
    comp = _compressed(x)
    answers = _pair_answers(x, comp)
    chosen = [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")]
    big = MstPlanner(domain=DOM, shares=_shares("mst"), max_cells=1_000_000, engine="mbi",
                     extra_mb=100.0)
    extra = big.extra(comp.domain, comp.one_way, answers, chosen)
    # a 5-attribute model of at most 360 cells fits in 100 MB: every other pair is added
    assert {m.clique for m in extra} == set(answers) - set(chosen)
    tiny = MstPlanner(domain=DOM, shares=_shares("mst"), max_cells=1_000_000, engine="mbi",
                      extra_mb=1e-9)
    assert tiny.extra(comp.domain, comp.one_way, answers, chosen) == []
    neural = MstPlanner(domain=DOM, shares=_shares("mst"), max_cells=1_000_000,
                        engine="neural", extra_mb=100.0)
    assert neural.extra(comp.domain, comp.one_way, answers, chosen) == []
    # the diffusion engine gets every further answer, whatever the model-size limit (its
    # loss costs one matrix product however many pairs); mst_extra_mb = 0 still turns
    # the extra answers off
    diff = MstPlanner(domain=DOM, shares=_shares("mst"), max_cells=1_000_000,
                      engine="diffusion", extra_mb=1e-9)
    got = diff.extra(comp.domain, comp.one_way, answers, chosen)
    assert [m.clique for m in got] == [c for c in answers if c not in chosen]
    off = MstPlanner(domain=DOM, shares=_shares("mst"), max_cells=1_000_000,
                     engine="diffusion", extra_mb=0.0)
    assert off.extra(comp.domain, comp.one_way, answers, chosen) == []


# --------------------------------------------------------------------------- AIM
def _independence(comp):
    """The model that explains every pair as the product of its 1-way answers."""
    total = float(np.mean([m.values.sum() for m in comp.one_way.values()]))

    def model(c: tuple[str, ...]) -> np.ndarray:
        ps = [np.clip(comp.one_way[(a,)].values, 0, None) for a in c]
        ps = [v / v.sum() for v in ps]
        return total * np.multiply.outer(*ps)

    return model


def test_aim_picks_the_pairs_independence_explains_worst_within_its_batch(
        x: np.ndarray) -> None:
    shares = _shares("aim")
    p = AimPlanner(domain=DOM, shares=shares, max_cells=1_000_000, engine="neural", rounds=2)
    assert p.n_rounds == 4
    assert p.batch == 3  # ceil(5 / 2)
    assert p.rho_round == pytest.approx(shares["adaptive"] / 2, rel=1e-15)
    assert p.sigma_next == pytest.approx(math.sqrt(3 / p.rho_round), rel=1e-12)
    comp = _compressed(x)
    answers = _pair_answers(x, comp)
    picks = p.pick(comp.domain, answers, _independence(comp),
                   measured=[m for m in comp.one_way])
    assert 1 <= len(picks) <= p.batch
    assert len({c for c, _ in picks}) == len(picks)
    assert [s for _, s in picks] == sorted((s for _, s in picks), reverse=True)
    assert {c for c, _ in picks} == PLANTED  # the dependent pairs, nothing with e
    req = p.adaptive(1, picks)
    assert (req.round, req.name, req.rho) == (3, "aim1", p.rho_round)
    assert req.cliques == tuple(c for c, _ in picks)
    # one_way + select + every adaptive round spend the split
    total = p.one_way().rho + p.select(comp.domain).rho + p.rounds * p.rho_round
    assert total == pytest.approx(cdp_rho(1.0, 1e-9), rel=1e-12)


def test_aim_batch_and_model_size_bound_the_picks(x: np.ndarray) -> None:
    comp = _compressed(x)
    answers = _pair_answers(x, comp)
    one = AimPlanner(domain=DOM, shares=_shares("aim"), max_cells=1_000_000,
                     engine="neural", rounds=4, batch=1)
    picks = one.pick(comp.domain, answers, _independence(comp), measured=[])
    assert len(picks) == 1 and picks[0][0] in PLANTED
    pytest.importorskip("mbi")
    tiny = AimPlanner(domain=DOM, shares=_shares("aim"), max_cells=1_000_000, engine="mbi",
                      rounds=2, max_model_mb=1e-9)
    assert tiny.pick(comp.domain, answers, _independence(comp), measured=[]) == []


def test_aim_without_privacy_scores_with_unit_next_sigma() -> None:
    p = AimPlanner(domain=DOM, shares=_shares("aim", math.inf), max_cells=1_000_000,
                   engine="neural", rounds=3, batch=2)
    assert p.rho_round == math.inf and p.sigma_next == 1.0


@pytest.mark.parametrize(("kw", "field"), [
    ({"rounds": 0}, "rounds"),
    ({"batch": -1}, "batch"),
    ({"max_model_mb": 0.0}, "max_model_mb"),
    ({"shares": {"one_way": 0.1, "select": 0.1}}, "shares"),
    ({"shares": {"one_way": 0.1, "select": 0.0, "adaptive": 0.1}}, "shares"),
    ({"shares": {"one_way": math.nan, "select": 0.1, "adaptive": 0.1}}, "shares"),
    ({"max_cells": 0}, "max_cells"),
    ({"domain": Domain(attributes=(), sizes=())}, "domain"),
])
def test_aim_planner_refuses_bad_settings(kw: dict, field: str) -> None:
    args = {"domain": DOM, "shares": _shares("aim"), "max_cells": 1_000_000,
            "engine": "neural", "rounds": 2, **kw}
    with pytest.raises(PlanError) as e:
        AimPlanner(**args)
    assert e.value.field == field


def test_aim_refuses_bad_rounds_and_empty_input(x: np.ndarray) -> None:
    p = AimPlanner(domain=DOM, shares=_shares("aim"), max_cells=1_000_000, engine="neural",
                   rounds=2)
    with pytest.raises(PlanError) as e:
        p.adaptive(2, [(("a", "b"), 1.0)])
    assert e.value.field == "j"
    with pytest.raises(PlanError) as e:
        p.adaptive(0, [])
    assert e.value.field == "picks"
    with pytest.raises(PlanError) as e:
        p.pick(DOM, {}, lambda c: np.zeros(DOM.size(c)), measured=[])
    assert e.value.field == "answers"


def test_mst_planner_refuses_a_missing_tree_share() -> None:
    with pytest.raises(PlanError) as e:
        MstPlanner(domain=DOM, shares=_shares("aim"), max_cells=10, engine="neural")
    assert e.value.field == "shares" and "'tree'" in str(e.value)


def test_planner_for_builds_the_configured_mechanism() -> None:
    mst = planner_for(mechanism="mst", domain=DOM, shares=_shares("mst"), max_cells=100,
                      engine="mbi", mst_extra_mb=2.0)
    assert isinstance(mst, MstPlanner) and mst.extra_mb == 2.0
    aim = planner_for(mechanism="aim", domain=DOM, shares=_shares("aim"), max_cells=100,
                      engine="neural", aim_rounds=3, aim_batch=2, aim_max_model_mb=5.0)
    assert isinstance(aim, AimPlanner) and (aim.rounds, aim.batch) == (3, 2)
    with pytest.raises(PlanError):
        planner_for(mechanism="privbayes", domain=DOM, shares=_shares("mst"),
                    max_cells=100, engine="mbi")


def test_the_planners_module_needs_no_bus_event_loop_or_files() -> None:
    tree = ast.parse(Path(planners.__file__).read_text())
    imported = {(n.module or "") if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    banned = ("asyncio", "pubsub", "zmq", "synth.checkpoint", "synth.coord.context",
              "synth.coord.store", "pathlib", "os", "json")
    assert not [m for m in imported if m.split(".")[0] in banned or m in banned]
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "open" not in names
