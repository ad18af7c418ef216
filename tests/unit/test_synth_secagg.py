"""synth.secagg: exact unmasked sums, uniform masked vectors, dropouts, Shamir, pairing graph."""

from __future__ import annotations

import hashlib
import itertools
import random
import zlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from synth.compress import (
    DeltaDecoder,
    DeltaEncoder,
    DeltaMessage,
    ErrorFeedbackQuantizer,
    QuantSpec,
    pack_bits,
    packed_size,
)
from synth.secagg import (
    DuplicatePartyError,
    MissingPairKeys,
    ProtocolError,
    RoundSpec,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    TooFewShares,
    TooFewSurvivors,
    VectorError,
    _interpolate_at_zero,
    default_degree,
    mask,
    neighbours,
    recover_secret,
    run_key_stages,
    ring_bits,
    split_secret,
    stream_nonce,
)
from synth.secagg_state import restore_server, server_state


def _fixed_key(label: str) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(hashlib.sha256(label.encode()).digest())


def _setup(ids, m, n, *, session="s1", rounds=("r1",), fixed=False, threshold=None,
           degree=None, cell_bits=None):
    """Run the key stage and one seed batch; return (config, clients, server, specs)."""
    cfg = SecAggConfig(session_id=session, party_ids=tuple(ids), threshold=threshold,
                       degree=degree)
    clients = {}
    for p in ids:
        kw = {}
        if fixed:
            kw = {"mask_key": _fixed_key(f"{session}/{p}/c"), "enc_key": _fixed_key(f"{session}/{p}/e")}
        clients[p] = SecAggClient(p, cfg, **kw)
    server = SecAggServer(cfg)
    if fixed:
        for c in clients.values():
            server.register_keys(c.public_keys())
        for p, c in clients.items():
            c.receive_public_keys(server.keys_for(p))
        for p, c in clients.items():
            seeds = {r: hashlib.sha256(f"{session}/{p}/{r}/b".encode()).digest()[:16]
                     for r in rounds}
            server.collect_seed_shares(rounds, p, c.share_seeds(rounds, seeds=seeds))
        for p, c in clients.items():
            c.receive_seed_shares(rounds, server.seed_shares_for(rounds, p))
    else:
        run_key_stages(clients, server, rounds)
    specs = {r: RoundSpec(round_id=r, vector_len=n, ring_bits=m, cell_bits=cell_bits) for r in rounds}
    return cfg, clients, server, specs


def _finish(clients, server, round_id="r1"):
    survivors, dropped = server.unmask_request(round_id)
    revealed = {p: clients[p].reveal_all(round_id, survivors, dropped) for p in survivors}
    return server.unmask(round_id, survivors, dropped, revealed)


def _aggregate(xs, m, *, drop=(), session="s1"):
    ids = list(xs)
    n = len(next(iter(xs.values())))
    _, clients, server, specs = _setup(ids, m, n, session=session)
    for p, c in clients.items():
        y = c.masked(specs["r1"], xs[p])
        if p not in drop:
            server.collect_masked(specs["r1"], p, y)
    return _finish(clients, server)


def test_ring_bits() -> None:
    assert ring_bits(8, 10) == 8 + 4 + 2
    assert ring_bits(8, 1) == 10
    assert ring_bits(16, 100, headroom=0) == 23
    with pytest.raises(ValueError):
        ring_bits(60, 100)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 10, 17, 50, 200])
def test_neighbour_graph_is_symmetric_with_log_degree(k: int) -> None:
    ids = [f"party-{i}" for i in range(k)]
    g = neighbours(ids, None, b"seed")
    deg = default_degree(k)
    assert deg % 2 == 0 or deg == k - 1
    for a, nb in g.items():
        assert a not in nb and len(nb) == deg and len(set(nb)) == deg
        for b in nb:
            assert a in g[b]
    assert g == neighbours(list(reversed(ids)), None, b"seed")  # deterministic, order-free
    if k >= 50:
        assert deg <= 2 * np.ceil(np.log2(k)) + 1
        assert g != neighbours(ids, None, b"other seed")


def test_neighbour_graph_explicit_degree_and_duplicates() -> None:
    ids = [str(i) for i in range(20)]
    g = neighbours(ids, 5, b"s")  # odd: rounded up to 6
    assert {len(v) for v in g.values()} == {6}
    assert {len(v) for v in neighbours(ids, 19, b"s").values()} == {19}
    with pytest.raises(DuplicatePartyError) as ei:
        neighbours(["a", "b", "a"], None, b"")
    assert ei.value.duplicates == ("a",)
    with pytest.raises(DuplicatePartyError):
        SecAggConfig(session_id="s", party_ids=("x", "x"))


def test_shamir_any_threshold_subset_recovers() -> None:
    secret = b"\x00\x00" + bytes(range(14))  # leading zeros survive
    shares = split_secret(secret, 6, 3)
    for subset in itertools.combinations(shares, 3):
        assert recover_secret(subset, 3) == secret
        assert recover_secret(reversed(subset), 3) == secret
    assert recover_secret(split_secret(b"\xff" * 16, 2, 2), 2) == b"\xff" * 16
    with pytest.raises(ValueError, match="exceeds 16"):
        split_secret(b"\xff" * 17, 2, 2)
    assert recover_secret(split_secret(b"", 1, 1), 1) == b""


def test_shamir_below_threshold_reveals_nothing_useful() -> None:
    secret = bytes(range(16))
    shares = split_secret(secret, 5, 3)
    with pytest.raises(TooFewShares) as ei:
        recover_secret(shares[:2], 3, owner="u")
    assert (ei.value.owner, ei.value.got, ei.value.threshold) == ("u", 2, 3)
    with pytest.raises(TooFewShares):
        recover_secret([shares[0], shares[0], shares[0]], 3)  # duplicates do not count
    s = int.from_bytes(b"\x01" + secret, "big")
    for subset in itertools.combinations(shares, 2):
        assert _interpolate_at_zero(list(subset)) != s
    # Two different secrets split with the same coefficients differ only by a constant in
    # every share; with fresh randomness t - 1 shares of either look alike: their values
    # are spread over the whole field, far above the encoded secret.
    class Seeded:  # a fixed coefficient source, so the check is deterministic
        def __init__(self, seed: int) -> None:
            self.r = random.Random(seed)

        def randbelow(self, n: int) -> int:
            return self.r.randrange(n)

    rng = Seeded(7)
    ys = [split_secret(secret, 5, 3, rng)[0][1] for _ in range(20)]
    bits = sorted(y.bit_length() for y in ys)
    # field: 137 bits; the encoded secret has 129: uniform shares put half above 2^135
    assert len(set(ys)) == 20 and bits[10] >= 135 and bits[-1] == 136


def test_mask_is_deterministic_in_range_and_nonce_separated() -> None:
    key = bytes(32)
    a = mask(key, 1000, 20, stream_nonce("r", "s"))
    assert a.dtype == np.uint64 and int(a.max()) < 2**20
    np.testing.assert_array_equal(a, mask(key, 1000, 20, stream_nonce("r", "s")))
    assert (a != mask(key, 1000, 20, stream_nonce("r", "t"))).mean() > 0.99
    full = mask(key, 8, 64, stream_nonce("r", "s"))
    assert int(full.max()) >= 2**40
    with pytest.raises(ValueError):
        mask(b"short", 3, 8, stream_nonce("r"))


@pytest.mark.parametrize("k", [1, 2, 5, 10])
def test_unmasked_sum_equals_plain_sum_mod_2m(k: int) -> None:
    m = 24
    rng = np.random.default_rng(k)
    ids = [f"p{i:02d}" for i in range(k)]
    xs = {p: rng.integers(0, 2**m, 2000, dtype=np.uint64) for p in ids}  # full ring: wraps
    total = _aggregate(xs, m)
    expected = np.zeros(2000, dtype=np.uint64)
    for x in xs.values():
        expected = (expected + x) & np.uint64(2**m - 1)
    assert total.dtype == np.uint64
    np.testing.assert_array_equal(total, expected)


def test_unmasked_sum_in_64_bit_ring() -> None:
    rng = np.random.default_rng(3)
    xs = {p: rng.integers(0, 2**63, 100, dtype=np.uint64) * np.uint64(2) + np.uint64(1) for p in "abc"}
    np.testing.assert_array_equal(_aggregate(xs, 64), xs["a"] + xs["b"] + xs["c"])


def _chi2_uniform(words: np.ndarray, m: int, top: int = 4) -> float:
    bins = np.bincount((words >> np.uint64(m - top)).astype(np.int64), minlength=2**top)
    exp = words.size / 2**top
    return float(((bins - exp) ** 2 / exp).sum())


def test_masked_vector_is_uniform_whatever_the_input() -> None:
    """Chi-square over the top 4 bits (16 bins) of 20k masked words, fixed keys.

    Critical value for 15 dof at p = 1e-9 is 73.6; keys are fixed, so the statistic is
    deterministic. The raw inputs fail the same test by orders of magnitude.
    """
    m, n = 16, 20_000
    inputs = {
        "zeros": np.zeros(n, dtype=np.uint64),
        "max": np.full(n, 2**m - 1, dtype=np.uint64),
        "ramp": (np.arange(n, dtype=np.uint64) % 7),
    }
    stats = {}
    first_words = {}
    for name, x in inputs.items():
        _, clients, _, specs = _setup(["a", "b", "c"], m, n, session=f"u-{name}", fixed=True)
        y = clients["a"].masked(specs["r1"], x)
        stats[name] = _chi2_uniform(y, m)
        first_words[name] = y
        assert _chi2_uniform(x, m) > 10_000  # the raw input is far from uniform
    print("chi2 of masked words:", stats)
    assert max(stats.values()) < 73.6, stats
    # Two very different inputs: homogeneity of the two masked histograms (16 bins).
    h0 = np.bincount((first_words["zeros"] >> np.uint64(m - 4)).astype(np.int64), minlength=16)
    h1 = np.bincount((first_words["max"] >> np.uint64(m - 4)).astype(np.int64), minlength=16)
    pooled = (h0 + h1) / 2
    homogeneity = float((((h0 - pooled) ** 2 + (h1 - pooled) ** 2) / pooled).sum())
    print("homogeneity chi2:", homogeneity)
    assert homogeneity < 73.6
    # The masked words carry no compressible structure: zlib saves under 1%.
    packed = pack_bits(first_words["zeros"], m)
    assert len(packed) == packed_size(n, m)
    assert len(zlib.compress(packed, 9)) > 0.99 * len(packed)


@pytest.mark.parametrize("drop", [("p3",), ("p3", "p7")])
def test_dropouts_after_masking_are_recovered(drop: tuple[str, ...]) -> None:
    m = 20
    rng = np.random.default_rng(7)
    ids = [f"p{i}" for i in range(10)]
    xs = {p: rng.integers(0, 2**15, 500, dtype=np.uint64) for p in ids}
    total = _aggregate(xs, m, drop=drop)
    expected = sum(xs[p] for p in ids if p not in drop) & np.uint64(2**m - 1)
    np.testing.assert_array_equal(total, expected)


def test_too_few_survivors_is_a_typed_error() -> None:
    ids = [f"p{i}" for i in range(5)]  # complete graph, k = 4, t = 3
    cfg, clients, server, specs = _setup(ids, 12, 10)
    assert cfg.t == 3
    for p in ids[:2]:
        server.collect_masked(specs["r1"], p, clients[p].masked(specs["r1"], np.zeros(10, dtype=np.uint64)))
    with pytest.raises(TooFewSurvivors) as ei:
        server.unmask_request("r1")
    assert (ei.value.survivors, ei.value.threshold) == (2, 3)
    with pytest.raises(TooFewSurvivors):
        clients["p0"].reveal_all("r1", ["p0", "p1"], ["p2", "p3", "p4"])


def test_missing_shares_for_an_owner() -> None:
    ids = [f"p{i}" for i in range(5)]
    _, clients, server, specs = _setup(ids, 12, 4)
    for p in ids:
        server.collect_masked(specs["r1"], p, clients[p].masked(specs["r1"], np.ones(4, dtype=np.uint64)))
    survivors, dropped = server.unmask_request("r1")
    revealed = {p: clients[p].reveal_all("r1", survivors, dropped) for p in survivors[:2]}
    with pytest.raises(TooFewShares):
        server.unmask("r1", survivors, dropped, revealed)


def test_missing_round_keys_of_a_dropout_are_a_typed_error() -> None:
    """A survivor that paired with a dropped party and then goes silent: the round's sum
    cannot be freed of that pair mask, and the error names who is missing."""
    ids = [f"p{i}" for i in range(6)]
    _, clients, server, specs = _setup(ids, 12, 4)
    for p in ids[1:]:
        server.collect_masked(specs["r1"], p, clients[p].masked(specs["r1"], np.ones(4, dtype=np.uint64)))
    survivors, dropped = server.unmask_request("r1")
    assert dropped == ("p0",)
    revealed = {p: clients[p].reveal_all("r1", survivors, dropped) for p in survivors if p != "p3"}
    with pytest.raises(MissingPairKeys) as ei:
        server.unmask("r1", survivors, dropped, revealed)
    assert ei.value.dropped == "p0" and ei.value.holders == ("p3",)


def test_bad_vectors_are_rejected() -> None:
    _, clients, server, specs = _setup(["a", "b"], 8, 4)
    spec = specs["r1"]
    with pytest.raises(VectorError) as ei:
        clients["a"].masked(spec, np.zeros(5, dtype=np.uint64))
    assert ei.value.party == "a"
    with pytest.raises(VectorError):
        clients["a"].masked(spec, np.array([0, 1, 2, 256]))
    with pytest.raises(VectorError):
        clients["a"].masked(spec, np.array([0, 1, 2, -1]))
    with pytest.raises(VectorError):
        clients["a"].masked(spec, np.array([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(VectorError):
        server.collect_masked(spec, "b", np.zeros(3, dtype=np.uint64))
    cells = RoundSpec(round_id="r1", vector_len=4, ring_bits=8, cell_bits=bytes([8, 2, 2, 8]))
    with pytest.raises(VectorError, match="its cell's ring"):
        clients["b"].masked(cells, np.array([200, 3, 4, 0]))  # 4 does not fit 2 bits
    with pytest.raises(ValueError, match="cell widths"):
        RoundSpec(round_id="r1", vector_len=2, ring_bits=8, cell_bits=bytes([9, 1]))


def test_client_never_reveals_both_kinds_for_one_owner_in_a_round() -> None:
    _, clients, _, _ = _setup(["a", "b", "c"], 8, 4, rounds=("r1", "r2"))
    clients["a"].reveal("r1", "b", dropped=False)
    with pytest.raises(ProtocolError):
        clients["a"].reveal("r1", "b", dropped=True)
    with pytest.raises(ProtocolError):
        clients["a"].reveal_all("r1", ["a", "b"], ["b"])
    clients["a"].reveal("r2", "b", dropped=True)  # another round: its own masks


def test_tampered_or_misrouted_share_messages_fail_authentication() -> None:
    cfg = SecAggConfig(session_id="s", party_ids=("a", "b", "c"))
    clients = {p: SecAggClient(p, cfg) for p in "abc"}
    server = SecAggServer(cfg)
    for c in clients.values():
        server.register_keys(c.public_keys())
    for p, c in clients.items():
        c.receive_public_keys(server.keys_for(p))
    batch = ("r1", "r2")
    msgs = {p: c.share_seeds(batch) for p, c in clients.items()}
    blob = bytearray(msgs["a"]["b"])
    blob[-1] ^= 1
    with pytest.raises(ProtocolError):
        clients["b"].receive_seed_shares(batch, {"a": bytes(blob), "c": msgs["c"]["b"]})
    with pytest.raises(ProtocolError):  # a ciphertext for c replayed to b
        clients["b"].receive_seed_shares(batch, {"a": msgs["a"]["c"]})
    with pytest.raises(ProtocolError):  # the same ciphertext claimed for another batch
        clients["b"].receive_seed_shares(("r1", "r3"), {"a": msgs["a"]["b"]})


def test_stages_must_run_in_order() -> None:
    cfg = SecAggConfig(session_id="s", party_ids=("a", "b"))
    spec = RoundSpec(round_id="r1", vector_len=2, ring_bits=8)
    c = SecAggClient("a", cfg)
    with pytest.raises(ProtocolError):
        c.masked(spec, np.zeros(2, dtype=np.uint64))
    with pytest.raises(ProtocolError):
        c.share_seeds(["r1"])
    server = SecAggServer(cfg)
    with pytest.raises(ProtocolError):
        server.collect_masked(spec, "a", np.zeros(2, dtype=np.uint64))
    with pytest.raises(ProtocolError):
        server.collect_seed_shares(["r1"], "a", {})
    with pytest.raises(ValueError):
        SecAggClient("z", cfg)
    _, clients, server, specs = _setup(["a", "b", "c"], 8, 2, rounds=("r1",))
    with pytest.raises(ProtocolError, match="already seeded"):
        clients["a"].share_seeds(["r1"])
    with pytest.raises(ProtocolError, match="not in a closed seed batch"):
        server.collect_masked(RoundSpec(round_id="r9", vector_len=2, ring_bits=8), "a",
                              np.zeros(2, dtype=np.uint64))


def test_one_key_exchange_serves_many_rounds_and_a_dropout_rejoins() -> None:
    """Keys are agreed once; two seed batches cover four rounds. p2 drops out of round
    r2 (after the others masked) and takes part again in r3 and r4: every round's sum is
    exact, and the round keys revealed for r2 leave r3's pair masks unknown."""
    ids = [f"p{i}" for i in range(7)]
    rng = np.random.default_rng(5)
    n, m = 50, 16
    cfg, clients, server, specs = _setup(ids, m, n, rounds=("r1", "r2"))
    batch2 = ("r3", "r4")
    for p, c in clients.items():
        server.collect_seed_shares(batch2, p, c.share_seeds(batch2))
    for p, c in clients.items():
        c.receive_seed_shares(batch2, server.seed_shares_for(batch2, p))
    mk = np.uint64(2**m - 1)
    for r in ("r1", "r2", "r3", "r4"):
        spec = specs.get(r) or RoundSpec(round_id=r, vector_len=n, ring_bits=m)
        xs = {p: rng.integers(0, 2**10, n, dtype=np.uint64) for p in ids}
        alive = [p for p in ids if not (r == "r2" and p == "p2")]
        for p in alive:
            server.collect_masked(spec, p, clients[p].masked(spec, xs[p]))
        survivors, dropped = server.unmask_request(r)
        assert dropped == (("p2",) if r == "r2" else ())
        revealed = {p: clients[p].reveal_all(r, survivors, dropped) for p in survivors}
        total = server.unmask(r, survivors, dropped, revealed)
        np.testing.assert_array_equal(total, sum(xs[p] for p in alive) & mk)
        if r == "r2":
            keys_r2 = {v: sh.y for v, got in revealed.items() for o, sh in got.items() if sh.kind == "pair"}
            assert set(keys_r2) == set(cfg.graph["p2"])
    # the round key of (p2, v) in r3 differs from the one revealed in r2
    from synth.secagg import _round_key
    v = cfg.graph["p2"][0]
    k3 = _round_key(clients[v]._shared["p2"], v, "p2", cfg, "r3")
    assert int.from_bytes(k3, "big") != keys_r2[v]


def test_a_late_input_of_a_declared_dropout_stays_hidden() -> None:
    """The server declares p0 dropped, collects the round keys of its partners, then
    receives p0's masked vector anyway: removing every pair mask leaves x + PRG(b), still
    uniform (the self-mask seed's shares are never revealed for a dropped party)."""
    m, n = 16, 20_000
    ids = ["p0", "p1", "p2", "p3"]
    _, clients, server, specs = _setup(ids, m, n, fixed=True, session="late")
    spec = specs["r1"]
    x0 = np.zeros(n, dtype=np.uint64)
    y0 = clients["p0"].masked(spec, x0)
    for p in ids[1:]:
        server.collect_masked(spec, p, clients[p].masked(spec, np.ones(n, dtype=np.uint64)))
    survivors, dropped = server.unmask_request("r1")
    revealed = {p: clients[p].reveal_all("r1", survivors, dropped) for p in survivors}
    from synth.secagg import _pair_mask, _pair_sign
    stripped = y0.copy()
    for v in survivors:
        key = revealed[v]["p0"].y.to_bytes(32, "big")
        pm = _pair_mask(key, clients["p0"].config, spec)
        stripped = stripped - pm if _pair_sign("p0", v) > 0 else stripped + pm
    stripped &= np.uint64(2**m - 1)
    assert _chi2_uniform(stripped, m) < 73.6  # x0 = 0 would give a single bin
    assert all("p0" not in got or got["p0"].kind == "pair" for got in revealed.values())


def test_per_cell_rings_sum_exactly() -> None:
    widths = np.array([1, 3, 8, 17, 40, 64] * 50, dtype=np.uint8)
    n = widths.size
    mod = [(1 << int(w)) - 1 for w in widths]
    rng = np.random.default_rng(9)
    ids = [f"p{i}" for i in range(6)]
    xs = {p: np.array([int(rng.integers(0, 2**62)) & mk for mk in mod], dtype=np.uint64) for p in ids}
    _, clients, server, specs = _setup(ids, 64, n, cell_bits=widths.tobytes())
    for p in ids[1:]:
        server.collect_masked(specs["r1"], p, clients[p].masked(specs["r1"], xs[p]))
    total = _finish(clients, server)
    expect = [sum(int(xs[p][i]) for p in ids[1:]) & mod[i] for i in range(n)]
    np.testing.assert_array_equal(total, np.array(expect, dtype=np.uint64))


def test_delta_encoding_survives_masking_over_rounds() -> None:
    """Each party error-feedback quantises, delta-encodes in Z_{2^m} and masks; the
    aggregator adds the unmasked sum of deltas to its previous aggregate. After every
    round it holds exactly the sum of the parties' current codes."""
    k, n, b = 5, 300, 6
    m = ring_bits(b, k)
    spec = QuantSpec(bits=b, h_min=0.0, h_max=200.0)
    ids = [f"p{i}" for i in range(k)]
    rng = np.random.default_rng(11)
    base = {p: rng.uniform(0, 200, n) for p in ids}
    quant = {p: ErrorFeedbackQuantizer(spec) for p in ids}
    enc = {p: DeltaEncoder(ring_bits=m) for p in ids}
    agg = DeltaDecoder(ring_bits=m)
    rounds = tuple(f"round-{t}" for t in range(4))
    _, clients, server, specs = _setup(ids, m, n, rounds=rounds)
    for t, r in enumerate(rounds):
        current, msgs = {}, {}
        for p in ids:
            current[p] = quant[p].encode(np.clip(base[p] + rng.normal(0, 5, n), 0, 200))
            msgs[p] = enc[p].encode(current[p], "clique")
            server.collect_masked(specs[r], p, clients[p].masked(specs[r], msgs[p].payload))
        assert len({msgs[p].full for p in ids}) == 1 and msgs[ids[0]].full == (t == 0)
        masked_sum = _finish(clients, server, r)
        template = msgs[ids[0]]
        summed = DeltaMessage(stream="clique", version=template.version,
                                base_version=template.base_version, full=template.full, payload=masked_sum)
        result = agg.decode(summed)
        np.testing.assert_array_equal(result, sum(current[p] for p in ids))
        for p in ids:
            enc[p].ack("clique", agg.version("clique"))


def test_hierarchical_masked_sums_unmask_to_the_plain_sum_with_a_dropout() -> None:
    """Aggregators forward sums of masked vectors; the server never sees one alone."""
    m = 18
    rng = np.random.default_rng(11)
    ids = [f"p{i}" for i in range(9)]
    xs = {p: rng.integers(0, 2**12, 64, dtype=np.uint64) for p in ids}
    _, clients, server, specs = _setup(ids, m, 64)
    spec = specs["r1"]
    mk = np.uint64(2**m - 1)
    groups = [ids[0:3], ids[3:6], ids[6:9]]
    dropped = "p4"
    for g in groups:
        alive = [p for p in g if p != dropped]
        part = sum(clients[p].masked(spec, xs[p]) for p in alive) & mk
        server.collect_masked_sum(spec, alive, part)
    with pytest.raises(ProtocolError, match="twice"):
        server.collect_masked_sum(spec, ["p0"], np.zeros(64, dtype=np.uint64))
    total = _finish(clients, server)
    expected = sum(xs[p] for p in ids if p != dropped) & mk
    np.testing.assert_array_equal(total, expected)


def test_reveal_layout_matches_what_each_survivor_reveals() -> None:
    """A reveal travels as bare bytes: the server's layout (owners, kinds, order) must be
    exactly what each client's reveal_all returns, with and without dropouts."""
    ids = [f"p{i}" for i in range(9)]
    _, clients, server, specs = _setup(ids, 12, 3, rounds=("r1", "r2"))
    for r, drop in (("r1", set()), ("r2", {"p2", "p5"})):
        for p in ids:
            y = clients[p].masked(specs[r], np.ones(3, dtype=np.uint64))
            if p not in drop:
                server.collect_masked(specs[r], p, y)
        survivors, dropped = server.unmask_request(r)
        assert set(dropped) == drop
        for p in survivors:
            got = clients[p].reveal_all(r, survivors, dropped)
            assert [(o, sh.kind) for o, sh in got.items()] == server.reveal_layout(
                r, p, survivors, dropped)


@pytest.mark.parametrize(("n", "threshold"), [(4, None), (6, 2), (6, 4), (7, None)])
def test_every_dropout_count_up_to_n_minus_t_is_recovered_and_one_more_aborts(
        n: int, threshold: int | None) -> None:
    """Complete pairing graph (n <= 7): parties drop after the seed stage, before masking.
    Every count of dropouts from 1 to n − t unmasks to exactly the survivors' sum;
    n − t + 1 dropouts leave t − 1 survivors, and the round aborts with TooFewSurvivors."""
    m, cells = 16, 12
    rng = np.random.default_rng([n, threshold or 0])
    ids = [f"p{i}" for i in range(n)]
    cfg = SecAggConfig(session_id="sweep", party_ids=tuple(ids), threshold=threshold)
    assert all(len(cfg.graph[p]) == n - 1 for p in ids)  # complete: any t survivors suffice
    t = cfg.t
    xs = {p: rng.integers(0, 2**12, cells, dtype=np.uint64) for p in ids}
    for n_drop in range(1, n - t + 2):
        drop = set(rng.choice(ids, n_drop, replace=False).tolist())
        rid = f"r{n_drop}"
        _, clients, server, specs = _setup(ids, m, cells, session=f"sweep{n_drop}",
                                           rounds=(rid,), threshold=threshold)
        for p in ids:
            if p not in drop:  # a dropped party never masks: it left after the seeds
                server.collect_masked(specs[rid], p, clients[p].masked(specs[rid], xs[p]))
        if n_drop <= n - t:
            total = _finish(clients, server, rid)
            expected = sum(xs[p] for p in ids if p not in drop) & np.uint64(2**m - 1)
            np.testing.assert_array_equal(total, expected, err_msg=f"{n_drop} dropped")
        else:
            with pytest.raises(TooFewSurvivors) as ei:
                server.unmask_request(rid)
            assert (ei.value.survivors, ei.value.threshold) == (t - 1, t)


def test_server_state_survives_a_restart_and_unmasks_the_same_sum() -> None:
    """A coordinator that died after the key and seed stages restores the session from its
    checkpoint (public keys and routed ciphertexts only) and unmasks a round, with a
    dropout, to exactly the sum the original server gets."""
    import json

    ids = [f"p{i}" for i in range(6)]
    rng = np.random.default_rng(11)
    xs = {p: rng.integers(0, 2**20, 300, dtype=np.uint64) for p in ids}
    cfg, clients, server, specs = _setup(ids, 24, 300, rounds=("r1", "r2"))
    state = json.loads(json.dumps(server_state(server)))  # as the checkpoint stores it
    assert "secret" not in json.dumps(state).lower()
    restored = SecAggServer(cfg)
    restore_server(restored, state)
    assert restored.keyed == server.keyed and restored.seeded("r2") == server.seeded("r2")
    ys = {p: clients[p].masked(specs["r2"], xs[p]) for p in ids[:-1]}  # p5 drops
    for srv in (server, restored):
        for p, y in ys.items():
            srv.collect_masked(specs["r2"], p, y)
    surv, drop = server.unmask_request("r2")
    assert restored.unmask_request("r2") == (surv, drop) and drop == ("p5",)
    revealed = {p: clients[p].reveal_all("r2", surv, drop) for p in surv}
    a = server.unmask("r2", surv, drop, revealed)
    b = restored.unmask("r2", surv, drop, revealed)
    np.testing.assert_array_equal(a, b)
    expected = sum(xs[p] for p in ids[:-1]) & np.uint64(2**24 - 1)
    np.testing.assert_array_equal(b, expected)
    with pytest.raises(ProtocolError, match="already has state"):
        restore_server(restored, state)
    other = SecAggServer(SecAggConfig(session_id="other", party_ids=tuple(ids)))
    with pytest.raises(ProtocolError, match="session"):
        restore_server(other, state)


def test_a_dropped_partys_revealed_secrets_are_never_reused_by_a_later_query() -> None:
    """A consortium session: one key exchange and one seed batch serve two queries (the
    release's round ``q1`` and a later update's round ``q2``, seeded ahead in the same
    batch). In q1 p2 survives (its self-mask seed of q1 is reconstructed from the
    revealed shares) and p3 drops (its partners reveal their q1 round keys with it). In q2
    p2 is declared dropped although its masked vector arrives: with everything revealed
    in q1 and q2 its input stays hidden (q1's seed and round keys are not q2's); p3's q2
    round keys are new; and no round of q1 can be masked or seeded again for a later
    query."""
    ids = ["p0", "p1", "p2", "p3", "p4"]
    m, n = 16, 20_000
    cfg, clients, server, specs = _setup(ids, m, n, rounds=("q1", "q2"), fixed=True,
                                         session="consortium")
    rng = np.random.default_rng(3)
    # query 1: p3 drops before masking; everyone else is counted
    xs = {p: rng.integers(0, 2**8, n, dtype=np.uint64) for p in ids}
    for p in ids:
        if p != "p3":
            server.collect_masked(specs["q1"], p, clients[p].masked(specs["q1"], xs[p]))
    survivors, dropped = server.unmask_request("q1")
    assert dropped == ("p3",)
    rev1 = {p: clients[p].reveal_all("q1", survivors, dropped) for p in survivors}
    total = server.unmask("q1", survivors, dropped, rev1)
    np.testing.assert_array_equal(total, sum(xs[p] for p in survivors) & np.uint64(2**m - 1))
    seed_p2_q1 = recover_secret([(s["p2"].x, s["p2"].y) for s in rev1.values() if "p2" in s],
                                cfg.t)
    keys_p3_q1 = {v: s["p3"].y for v, s in rev1.items() if "p3" in s}
    assert keys_p3_q1 and all(s.kind == "pair" for r in rev1.values() for o, s in r.items()
                              if o == "p3")
    # query 2: p2's masked vector (of zeros) arrives, but the server declares it dropped
    x2 = np.zeros(n, dtype=np.uint64)
    y2 = clients["p2"].masked(specs["q2"], x2)
    for p in ("p0", "p1", "p4"):
        server.collect_masked(specs["q2"], p, clients[p].masked(specs["q2"], xs[p]))
    survivors2, dropped2 = server.unmask_request("q2")
    assert set(dropped2) == {"p2", "p3"}
    rev2 = {p: clients[p].reveal_all("q2", survivors2, dropped2) for p in survivors2}
    keys_p3_q2 = {v: s["p3"].y for v, s in rev2.items() if "p3" in s}
    assert all(keys_p3_q2[v] != keys_p3_q1[v] for v in keys_p3_q2 if v in keys_p3_q1)
    # strip p2's vector of every q2 pair mask (those revealed, and even the one with the
    # dead p3, which nobody reveals: a stronger adversary) and of q1's self mask
    from synth.secagg import _pair_mask, _pair_sign, _round_key, _self_mask
    stripped = y2.copy()
    for v in clients["p2"]._round_partners("q2"):
        key = _round_key(clients["p2"]._shared[v], "p2", v, cfg, "q2")
        if v in rev2:
            assert rev2[v]["p2"].y == int.from_bytes(key, "big")
        pm = _pair_mask(key, cfg, specs["q2"])
        stripped = stripped - pm if _pair_sign("p2", v) > 0 else stripped + pm
    mk = np.uint64(2**m - 1)
    # control: the stripping is right (with q2's own seed, which nothing revealed, it
    # gives x2 back exactly)
    own = clients["p2"]._seeds["q2"]
    np.testing.assert_array_equal((stripped - _self_mask(own, "p2", cfg, specs["q2"])) & mk, x2)
    stripped = (stripped - _self_mask(seed_p2_q1, "p2", cfg, specs["q2"])) & mk
    assert _chi2_uniform(stripped, m) < 73.6  # x2 = 0: a single bin were it unmasked
    assert all("p2" not in got or got["p2"].kind == "pair" for got in rev2.values())
    # no later query reuses q1: masking or seeding it again is refused
    with pytest.raises(ProtocolError):
        clients["p0"].masked(specs["q1"], xs["p0"])
    with pytest.raises(ProtocolError):
        clients["p0"].share_seeds(["q1"])
