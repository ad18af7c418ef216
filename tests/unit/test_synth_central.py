"""bench/synth_central.py: exponential mechanism, projection, and central MST on planted data."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from synth.domain import Domain
from synth.quality import all_k_way, workload_tv
from tests.bounds import above, below

#: the neural fits on one torch thread, as the coordinator runs them (conftest)
pytestmark = pytest.mark.usefixtures("torch_one_thread")

ROOT = Path(__file__).resolve().parents[2]


def load_central():
    spec = importlib.util.spec_from_file_location("synth_central", ROOT / "bench" / "synth_central.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sc = load_central()


def test_exponential_mechanism_picks_the_best_at_large_epsilon() -> None:
    rng = np.random.default_rng(0)
    q = np.array([1.0, 5.0, 3.0, 4.9])
    picks = [sc.exponential_mechanism(q, 1e4, 1.0, rng) for _ in range(200)]
    assert np.mean(np.array(picks) == 1) >= 0.99


def test_exponential_mechanism_matches_its_distribution() -> None:
    rng = np.random.default_rng(1)
    q = np.array([0.0, 1.0, 2.0])
    eps = 2.0
    draws = np.array([sc.exponential_mechanism(q, eps, 1.0, rng) for _ in range(20000)])
    p = np.exp(0.5 * eps * q)
    p /= p.sum()
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / draws.size, p, atol=0.015)
    with pytest.raises(ValueError):
        sc.exponential_mechanism(np.array([]), 1.0, 1.0, rng)
    with pytest.raises(ValueError):
        sc.exponential_mechanism(q, 0.0, 1.0, rng)


def test_project_to_total_is_nonnegative_and_sums() -> None:
    y = np.array([5.0, -3.0, 10.0, 0.5])
    x = sc.project_to_total(y, 12.0)
    assert np.all(x >= 0) and x.sum() == pytest.approx(12.0)
    np.testing.assert_allclose(sc.project_to_total(np.array([1.0, 2.0]), 3.0), [1.0, 2.0])


def planted(n: int = 4000, seed: int = 0) -> tuple[np.ndarray, Domain]:
    """a and b strongly dependent (b = a mostly), c and d independent noise."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 4, n)
    b = np.where(rng.random(n) < 0.9, a, rng.integers(0, 4, n))
    c = rng.integers(0, 3, n)
    d = rng.integers(0, 2, n)
    dom = Domain(attributes=("a", "b", "c", "d"), sizes=(4, 4, 3, 2))
    return np.stack([a, b, c, d], axis=1).astype(np.int32), dom


def test_mst_select_private_finds_the_planted_pair() -> None:
    codes, dom = planted()
    rng = np.random.default_rng(2)
    one = sc._measure(codes, dom, [(x,) for x in dom.attributes], 5.0, rng, 10_000)
    tree = sc.mst_select_private(codes, dom, one, rho_select=1.0, rng=rng)
    assert ("a", "b") in tree and len(tree) == 3


@pytest.mark.parametrize("engine", ["mbi", "neural"])
def test_central_mst_recovers_the_dependency(engine: str) -> None:
    if engine == "mbi":
        pytest.importorskip("mbi")
    else:
        pytest.importorskip("torch")
    codes, dom = planted()
    kw = {"iters": 300} if engine == "mbi" else {"rows": 120, "steps": 150}
    wl = all_k_way(dom, 2)
    res = sc.central_mst(codes, dom, epsilon=5.0, delta=1e-9, seed=0, engine=engine,
                         workload=wl, engine_kw=kw)
    assert ["a", "b"] in res["cliques"]
    assert res["codes"].shape == codes.shape and res["rho"] > 0 and res["wall_s"] > 0
    # independent marginals (shuffle each column) as the baseline
    rng = np.random.default_rng(9)
    indep = np.stack([rng.permutation(codes[:, j]) for j in range(codes.shape[1])], axis=1)
    tv_mst = workload_tv(codes, res["codes"], dom, wl)["avg_tv"]
    tv_ind = workload_tv(codes, indep, dom, wl)["avg_tv"]
    assert tv_mst < tv_ind


def test_independent_ensemble_pools_the_parties() -> None:
    pytest.importorskip("torch")
    codes, dom = planted(n=1200)
    parts = [codes[:400], codes[400:800], codes[800:]]
    res = sc.independent_ensemble(parts, dom, epsilon=5.0, delta=1e-9, seed=0,
                                  engine="neural", engine_kw={"rows": 40, "steps": 20})
    assert res["codes"].shape == codes.shape and res["parties"] == 3
    assert len(res["cliques"]) == 3


def test_bad_inputs_raise_typed_errors() -> None:
    codes, dom = planted(n=10)
    with pytest.raises(sc.CentralMstError, match="shape"):
        sc.central_mst(codes[:, :2], dom, epsilon=1.0, delta=1e-9, seed=0)
    with pytest.raises(sc.CentralMstError, match="epsilon"):
        sc.central_mst(codes, dom, epsilon=0.0, delta=1e-9, seed=0)
    with pytest.raises(sc.CentralMstError, match="no parties"):
        sc.independent_ensemble([], dom, epsilon=1.0, delta=1e-9, seed=0)


def test_replace_one_references_pay_what_fedforge_pays() -> None:
    """Under replace-one (FedForge's relation) a clique histogram has Δ₂² = 2 and an L1
    score Δ₁ = 2: at the same ε the central MST's noise std is √2 × its add/remove std;
    an unknown relation is refused before anything runs."""
    pytest.importorskip("torch")
    codes, dom = planted(n=400)
    kw = {"engine": "neural", "engine_kw": {"rows": 40, "steps": 5}, "compress": False}
    rep = sc.central_mst(codes, dom, epsilon=1.0, delta=1e-9, seed=0, relation="replace_one",
                         **kw)  # type: ignore[arg-type]
    add = sc.central_mst(codes, dom, epsilon=1.0, delta=1e-9, seed=0, relation="add_remove",
                         **kw)  # type: ignore[arg-type]
    assert rep["rho"] == add["rho"]  # the same ε, δ: the same ρ charged ...
    assert rep["sigma_one_way"] == pytest.approx(np.sqrt(2.0) * add["sigma_one_way"], rel=1e-12)
    assert rep["sigma_tree"] == pytest.approx(np.sqrt(2.0) * add["sigma_tree"], rel=1e-12)
    assert sc.sensitivities("replace_one") == (2.0, 2.0)
    assert sc.sensitivities("add_remove") == (1.0, 1.0)
    with pytest.raises(sc.CentralMstError, match="bounded"):
        sc.central_mst(codes, dom, epsilon=1.0, delta=1e-9, seed=0, relation="bounded")


def test_workload_candidates_are_the_weighted_downward_closure() -> None:
    dom = Domain(attributes=("a", "b", "c"), sizes=(2, 2, 2))
    cands = sc._workload_candidates(dom, [("a", "b"), ("b", "c")])
    assert cands == {("a",): 1.0, ("b",): 2.0, ("c",): 1.0, ("a", "b"): 3.0, ("b", "c"): 3.0}


@pytest.mark.stochastic
def test_central_aim_runs_and_measures_the_planted_pair() -> None:
    pytest.importorskip("mbi")
    codes, dom = planted(n=3000)
    wl = all_k_way(dom, 2)
    res = sc.central_aim(codes, dom, epsilon=5.0, delta=1e-9, seed=0, workload=wl,
                         rounds=6, max_iters=40)
    assert res["codes"].shape == codes.shape and res["rounds"] >= 1
    assert ["a", "b"] in res["cliques"]
    tv = workload_tv(codes, res["codes"], dom, wl)["avg_tv"]
    below(tv, 0.1, "central AIM workload TV")


def test_central_aim_refuses_too_few_rounds() -> None:
    pytest.importorskip("mbi")
    codes, dom = planted(n=100)
    with pytest.raises(sc.CentralMstError, match="too few"):
        sc.central_aim(codes, dom, epsilon=1.0, delta=1e-9, seed=0, rounds=3)


def test_compression_maps_rare_values_and_back() -> None:
    dom = Domain(attributes=("a", "b"), sizes=(5, 2))
    one = [sc.NoisyMarginal(clique=("a",), values=np.array([100.0, 1.0, 50.0, 0.0, -2.0]),
                            sigma=3.0),
           sc.NoisyMarginal(clique=("b",), values=np.array([60.0, 90.0]), sigma=3.0)]
    maps = sc.compress_supports(one)
    assert set(maps) == {"a"}
    np.testing.assert_array_equal(maps["a"], [0, 2, 1, 2, 2])
    codes = np.array([[0, 0], [1, 1], [2, 0], [3, 1], [4, 0]], dtype=np.int32)
    cdom, cc = sc.compress_codes(codes, dom, maps)
    assert cdom.sizes == (3, 2)
    np.testing.assert_array_equal(cc[:, 0], [0, 2, 1, 2, 2])
    back = sc.uncompress_codes(cc, dom, maps, np.random.default_rng(0))
    np.testing.assert_array_equal(back[[0, 2], 0], [0, 2])
    assert set(back[[1, 3, 4], 0]) <= {1, 3, 4}
    np.testing.assert_array_equal(back[:, 1], codes[:, 1])


def test_central_mst_compresses_a_rare_level_with_mbi() -> None:
    pytest.importorskip("mbi")
    codes, dom = planted(n=3000)
    rng = np.random.default_rng(3)
    rare = np.where(rng.random(len(codes)) < 0.002, 5, rng.integers(0, 5, len(codes)))
    codes = np.column_stack([codes, rare]).astype(np.int32)
    dom = Domain(attributes=dom.attributes + ("r",), sizes=dom.sizes + (8,))
    res = sc.central_mst(codes, dom, epsilon=1.0, delta=1e-9, seed=0, engine="mbi",
                         engine_kw={"iters": 200})
    assert res["compressed_sizes"][-1] < 8
    assert res["codes"].shape == codes.shape
    assert res["codes"][:, -1].max() < 8 and ["a", "b"] in res["cliques"]
