"""Hierarchical unmasking: leaf aggregators remove their children's self masks
(synth.secagg.self_mask_sum), the server only the dropped parties' pair masks."""

from __future__ import annotations

import numpy as np
import pytest

from synth.protocol import build_tree
from synth.secagg import (
    ProtocolError,
    RoundSpec,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    TooFewShares,
    run_key_stages,
    self_mask_sum,
)


def _session(k: int, dropped: set[str], seed: int = 3):
    ids = tuple(f"p{i:03d}" for i in range(k))
    cfg = SecAggConfig(session_id="t", party_ids=ids, degree=4)
    clients = {p: SecAggClient(p, cfg) for p in ids}
    server = SecAggServer(cfg)
    run_key_stages(clients, server, ["r0"])
    spec = RoundSpec(round_id="r0", vector_len=37, ring_bits=20,
                     cell_bits=bytes([20] * 30 + [12] * 7))
    rng = np.random.default_rng(seed)
    xs = {p: rng.integers(0, 1 << 10, 37, dtype=np.uint64) for p in ids}
    tree = build_tree(ids, 4)
    for leaf in tree.levels[0]:
        kids = [p for p in tree.children[leaf] if p not in dropped]
        if kids:
            s = np.zeros(37, np.uint64)
            for p in kids:
                s = (s + clients[p].masked(spec, xs[p])) & spec.modmask
            server.collect_masked_sum(spec, kids, s)
    surv, drop = server.unmask_request("r0")
    reveals = {p: clients[p].reveal_all("r0", surv, drop) for p in surv}
    return cfg, server, spec, xs, tree, surv, drop, reveals


def _leaf_sums(cfg, spec, tree, surv, reveals, skip_holder=None):
    out = []
    for leaf in tree.levels[0]:
        mine = [p for p in tree.children[leaf] if p in surv]
        shares: dict[str, list[tuple[int, int]]] = {p: [] for p in mine}
        for holder, got in reveals.items():
            if holder == skip_holder:
                continue
            for owner, sh in got.items():
                if sh.kind == "seed" and owner in shares:
                    shares[owner].append((sh.x, sh.y))
        out.append((mine, self_mask_sum(cfg, spec, shares)))
    return out


@pytest.mark.parametrize("dropped", [set(), {"p003"}, {"p001", "p010"}])
def test_tree_unmasking_gives_the_survivors_sum(dropped: set[str]) -> None:
    cfg, server, spec, xs, tree, surv, drop, reveals = _session(14, dropped)
    assert set(drop) == dropped
    pair_keys = {h: {o: s for o, s in got.items() if s.kind == "pair"}
                 for h, got in reveals.items()}
    assert set(server.pair_holders("r0", surv, drop)) == {h for h, g in pair_keys.items() if g}
    total = server.unmask_tree("r0", surv, drop, _leaf_sums(cfg, spec, tree, surv, reveals),
                               pair_keys)
    want = sum((xs[p] for p in surv), np.zeros(37, np.uint64)) & spec.modmask
    assert np.array_equal(total, want)


def test_uncovered_survivors_are_refused() -> None:
    cfg, server, spec, xs, tree, surv, drop, reveals = _session(14, set())
    sums = _leaf_sums(cfg, spec, tree, surv, reveals)
    with pytest.raises(ProtocolError, match="lacking"):
        server.unmask_tree("r0", surv, drop, sums[1:], {})


def test_a_leaf_needs_t_shares_per_seed() -> None:
    cfg, server, spec, xs, tree, surv, drop, reveals = _session(14, set())
    few = {"p000": [(s.x, s.y) for s in (reveals[h]["p000"] for h in reveals
                                            if "p000" in reveals[h])][: cfg.t - 1]}
    with pytest.raises(TooFewShares):
        self_mask_sum(cfg, spec, few)
