"""FedForge's pure protocol pieces: the aggregation tree, round plans, quantised sums,
the config and the row split (synth/protocol.py, synth/config.py, synth/split.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pubsub.config import ConfigError
from synth.config import SynthConfig, load_synth_config
from synth.protocol import (
    ROOT,
    RoundPlan,
    Topics,
    Tree,
    aggregate_sigma,
    build_tree,
    SessionPlan,
    cell_modmask,
    cell_upper_bounds,
    cell_windows,
    decode_sum,
    party_sigma2,
    quantize_counts,
    split_marginals,
)
from synth.split import holdout_split, party_split


@pytest.mark.parametrize(("k", "fanout", "levels", "top"), [
    (1, 4, 1, 1), (4, 4, 1, 1), (10, 4, 1, 3), (17, 4, 2, 2), (100, 4, 3, 2), (300, 8, 2, 5),
])
def test_tree_has_bounded_fanout_and_covers_every_party(k: int, fanout: int, levels: int,
                                                        top: int) -> None:
    ids = [f"p{i:03d}" for i in range(k)]
    tree = build_tree(ids, fanout)
    assert len(tree.levels) == levels
    assert len(tree.children[ROOT]) == top <= fanout
    assert all(len(kids) <= fanout for kids in tree.children.values())
    assert sorted(tree.parties_under(ROOT)) == ids
    for p in ids:
        assert tree.parent[p] in tree.levels[0]
    assert Tree.from_dict(tree.to_dict()) == tree
    assert tree.level_of(tree.levels[-1][0]) == levels - 1


def test_tree_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="fanout"):
        build_tree(["a", "b"], 1)
    with pytest.raises(ValueError, match="duplicate"):
        build_tree(["a", "a"], 2)
    with pytest.raises(ValueError, match="at least one"):
        build_tree([], 2)


def _plan(**kw: object) -> RoundPlan:
    base = dict(round=1, name="select", cliques=(("a",), ("a", "b")), sizes=(3, 6),
                sigma2_central=100.0, noise_model="distributed", n_parties=4, step=1.0,
                cell_bits=bytes([12, 12, 12, 9, 9, 9, 9, 9, 9]), timeout_s=5.0,
                rho=0.01, min_survivors=4)
    base.update(kw)
    return RoundPlan(**base)  # type: ignore[arg-type]


def test_round_plan_round_trips_through_bus_messages() -> None:
    import orjson

    plan = _plan(maps={"a": (0, 0, 1)})
    meta, arrays = plan.to_message()
    back = RoundPlan.from_message(orjson.loads(orjson.dumps(meta)), arrays)
    assert back == plan and back.vector_len == 9 and back.ring_bits == 12
    assert back.round_id == "r1" and back.spec().cell_bits == plan.cell_bits
    with pytest.raises(ValueError, match="cell widths"):
        RoundPlan.from_message({**meta, "cells": 10}, arrays)
    with pytest.raises(ValueError, match="cell widths"):
        RoundPlan.from_message(*_plan(sizes=(3, 7)).to_message())
    # all pairs of 14 long attribute names: the compressed body is a fraction of the JSON
    names = [f"attribute-number-{i}" for i in range(14)]
    pairs = tuple((a, b) for i, a in enumerate(names) for b in names[i + 1:])
    big = _plan(cliques=pairs, sizes=(4,) * len(pairs), cell_bits=bytes([7] * 4 * len(pairs)))
    bmeta, barrays = big.to_message()
    assert barrays[0].nbytes < 0.3 * len(orjson.dumps([list(c) for c in pairs]))
    assert RoundPlan.from_message(orjson.loads(orjson.dumps(bmeta)), barrays) == big
    session = SessionPlan(session_id="run/0", party_ids=("p0", "p1", "p2"), threshold=None,
                          degree=2, graph_seed="ab", timeout_s=5.0,
                          tree=build_tree(["p0", "p1", "p2"], 2).to_dict())
    assert SessionPlan.from_meta(orjson.loads(orjson.dumps(session.to_meta()))) == session
    assert session.secagg().t == 2


def test_windows_decode_the_exact_integer_sum_whatever_the_parties() -> None:
    """Integer counts + integer Skellam noise summed in per-cell rings decode to the exact
    sum whenever the true counts respect the bounds, for every subset of parties."""
    from synth.mechanism import measure_party

    rng = np.random.default_rng(3)
    k, mu = 6, 50.0
    upper = np.array([0.0, 3.0, 50.0, 400.0, 5000.0, 20.0, 20.0, 20.0, 20.0])
    lo, widths = cell_windows(upper, sigma_sum=math.sqrt(2 * mu * k))
    assert widths.dtype == np.uint8 and widths[0] <= widths[3] < widths[4]
    plan = _plan(n_parties=k, cell_bits=widths.tobytes())
    for trial in range(200):
        true = np.floor(upper * rng.uniform(0, 1, upper.size))
        split = rng.multinomial(1, np.ones(k) / k, size=(upper.size, int(true.max()) + 1))
        counts = np.stack([[split[c, :int(true[c]), p].sum() for c in range(upper.size)]
                           for p in range(k)])
        noisy = np.stack([measure_party(counts[p], mu=mu, rng=rng) for p in range(k)])
        alive = rng.permutation(k)[:rng.integers(1, k + 1)]
        codes = [quantize_counts(noisy[p], plan) for p in alive]
        total = sum(codes) & cell_modmask(widths)
        decoded = decode_sum(total, lo, plan)
        np.testing.assert_array_equal(decoded, sum(noisy[p] for p in alive),
                                      err_msg=f"trial {trial}")
    with pytest.raises(ValueError, match="shape"):
        decode_sum(total[:3], lo, plan)
    u_lo, u_w = cell_windows(upper, sigma_sum=24.5, uniform=True)
    assert set(u_w.tolist()) == {int(cell_windows(upper, sigma_sum=24.5)[1].max())}
    with pytest.raises(ValueError, match="bits"):
        cell_windows(upper, sigma_sum=24.5, max_bits=8)
    with pytest.raises(ValueError, match="step"):
        quantize_counts(np.zeros(9), _plan(step=4.0))
    with pytest.raises(ValueError, match="integers"):
        quantize_counts(np.full(9, 0.5), plan)


def test_upper_bounds_come_from_released_sub_cliques() -> None:
    shape = {"a": 3, "b": 2, "c": 2}
    one_a = np.array([10.0, 0.0, 100.0])
    pair_cb = np.array([[1.0, 2.0], [50.0, 60.0]])  # clique (c, b): c-major
    known = [(("a",), one_a, np.full(3, 1.0)), (("c", "b"), pair_cb.ravel(), np.full(4, 0.5))]
    u = cell_upper_bounds([("a", "b"), ("b", "c")], shape, known, 1000.0, tails=2.0)
    ab = u[:6].reshape(3, 2)
    np.testing.assert_array_equal(ab, np.repeat([[12.0], [2.0], [102.0]], 2, axis=1))
    bc = u[6:].reshape(2, 2)  # (b, c) = transpose of (c, b) + 1
    np.testing.assert_array_equal(bc, pair_cb.T + 1.0)
    assert cell_upper_bounds([("a",)], shape, [], 77.0).tolist() == [77.0] * 3


def test_noise_shares_and_aggregate_sigma() -> None:
    plan = _plan()  # sigma2_central is the variance of a sum of S_min = 4 parties
    assert party_sigma2(plan) == pytest.approx(25.0)
    assert party_sigma2(_plan(noise_model="local")) == pytest.approx(100.0)
    assert aggregate_sigma(plan, 4) == pytest.approx(10.0)  # exact sums: no rounding error
    assert aggregate_sigma(plan, 3) == pytest.approx(math.sqrt(75.0))


def test_split_marginals_cuts_the_concatenated_vector() -> None:
    plan = _plan()
    parts = split_marginals(np.arange(9.0), plan)
    assert list(parts) == [("a",), ("a", "b")]
    np.testing.assert_array_equal(parts[("a", "b")], np.arange(3.0, 9.0))


def test_topics_put_each_participant_under_its_own_prefix() -> None:
    t = Topics("r1")
    assert t.nk(0, "p001").startswith(t.to("p001"))
    assert t.up(2, "a0_1").startswith(t.to("a0_1"))
    for topic in (t.hello, t.error, t.pk(0), t.sh(0), t.rv(0), t.up(0, ROOT)):
        assert topic.startswith(t.to(ROOT))
    for topic in (t.schema, t.plan, t.unmask(3), t.done):
        assert topic.startswith(t.all())


def test_config_rejects_bad_values_and_unknown_keys() -> None:
    assert SynthConfig().party_ids()[:2] == ("p000", "p001")
    assert not load_synth_config(None, ["epsilon=inf"]).private
    for bad in ("epsilon=0", "epsilon=-1", "parties=0", "secagg.bits=-1", "secagg.bits=63",
                "secagg.fanout=1", "secagg.min_survivors=11", "secagg.min_survivors=-1",
                "engine.name=gan", "secagg.noise_model=shouting", "delta=1"):
        with pytest.raises(ConfigError):
            load_synth_config(None, [bad])
    with pytest.raises(ConfigError, match="unknown key"):
        load_synth_config(None, ["partys=3"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_synth_config(None, ["secagg.fanouts=3"])


def test_iid_split_is_a_seeded_partition() -> None:
    parts = party_split(103, 10, seed=1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(103))
    assert {len(p) for p in parts} <= {10, 11}
    again = party_split(103, 10, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    with pytest.raises(ValueError, match="cannot give"):
        party_split(3, 4, seed=0)


def test_dirichlet_split_skews_labels_and_gives_every_party_rows() -> None:
    labels = np.array(["a"] * 500 + ["b"] * 500)
    parts = party_split(1000, 10, seed=0, how="dirichlet", groups=labels, alpha=0.1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    assert all(len(p) >= 1 for p in parts)
    shares = [np.mean(labels[p] == "a") for p in parts if len(p) > 20]
    assert max(shares) - min(shares) > 0.5  # strongly non-IID at alpha = 0.1
    with pytest.raises(ValueError, match="group"):
        party_split(10, 2, seed=0, how="dirichlet")


def test_holdout_split() -> None:
    train, hold = holdout_split(100, 0.2, seed=0)
    assert len(hold) == 20 and len(train) == 80
    assert not set(train) & set(hold)
    with pytest.raises(ValueError):
        holdout_split(1, 0.2, seed=0)


def test_secagg_degree_is_logarithmic_even_and_capped() -> None:
    from synth.protocol import secagg_degree

    assert secagg_degree(1) == 0 and secagg_degree(2) == 1 and secagg_degree(4) == 3
    assert secagg_degree(10) == 6 and secagg_degree(100) == 8 and secagg_degree(1000) == 12
    assert secagg_degree(10, 3) == 4 and secagg_degree(5, 20) == 4
