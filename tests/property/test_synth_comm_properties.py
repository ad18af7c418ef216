"""Property tests of FedForge communication: packing, quantisation, rings, deltas, Shamir, SecAgg."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synth.compress import (
    DeltaDecoder,
    DeltaEncoder,
    QuantSpec,
    dequantize,
    from_ring,
    pack_bits,
    pack_varbits,
    packed_size,
    quantize,
    to_ring,
    unpack_bits,
    unpack_varbits,
)
from synth.secagg import (
    SEED_BYTES,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    RoundSpec,
    recover_secret,
    run_key_stages,
    split_secret,
)


@st.composite
def packable(draw):
    bits = draw(st.integers(1, 64))
    values = draw(st.lists(st.integers(0, 2**bits - 1), max_size=300))
    return bits, np.array(values, dtype=np.uint64)


@given(packable())
def test_pack_unpack_round_trip(case) -> None:
    bits, v = case
    data = pack_bits(v, bits)
    assert len(data) == packed_size(v.size, bits)
    np.testing.assert_array_equal(unpack_bits(data, bits, v.size), v)


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def spec_and_values(draw):
    lo = draw(finite)
    width = draw(st.floats(1e-3, 1e6))
    spec = QuantSpec(bits=draw(st.integers(1, 30)), h_min=lo, h_max=lo + width)
    xs = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50))
    return spec, spec.h_min + np.array(xs) * (spec.h_max - spec.h_min)


@given(spec_and_values())
def test_quantize_dequantize_error_at_most_half_a_step(case) -> None:
    spec, x = case
    q = quantize(x, spec)
    assert q.min() >= 0 and q.max() <= spec.levels - 1
    err = np.abs(dequantize(q, spec) - np.clip(x, spec.h_min, spec.h_max))
    tol = 1e-9 * max(abs(spec.h_min), abs(spec.h_max), 1.0)
    assert err.max() <= spec.max_error + tol
    if spec.step > 1e-6 * max(abs(spec.h_min), abs(spec.h_max), 1.0):  # float64 resolves the levels
        np.testing.assert_array_equal(quantize(dequantize(q, spec), spec), q)  # idempotent on levels


@given(st.integers(1, 64), st.data())
def test_ring_round_trip_and_additive_homomorphism(m: int, data) -> None:
    lo, hi = -(2 ** (m - 1)), 2 ** (m - 1) - 1
    a = np.array(data.draw(st.lists(st.integers(lo, hi), min_size=1, max_size=40)), dtype=np.int64)
    np.testing.assert_array_equal(from_ring(to_ring(a, m), m), a)
    b = np.array(data.draw(st.lists(st.integers(lo, hi), min_size=a.size, max_size=a.size)), dtype=np.int64)
    mk = np.uint64(2**m - 1)
    summed = (to_ring(a, m) + to_ring(b, m)) & mk
    exact = [(int(x) + int(y)) % 2**m for x, y in zip(a, b, strict=True)]
    assert summed.tolist() == exact


@given(st.lists(st.lists(st.integers(0, 255), min_size=6, max_size=6), min_size=1, max_size=6),
       st.booleans())
def test_delta_stream_reconstructs_every_version(versions, ring) -> None:
    enc = DeltaEncoder(ring_bits=8 if ring else None)
    dec = DeltaDecoder(ring_bits=8 if ring else None)
    for v in versions:
        out = dec.decode(enc.encode(np.array(v)))
        assert out.tolist() == v
        enc.ack("", dec.version())


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=SEED_BYTES), st.integers(1, 7), st.data())
def test_shamir_any_threshold_subset_recovers(secret: bytes, t: int, data) -> None:
    n = data.draw(st.integers(t, 8))
    shares = split_secret(secret, n, t)
    subset = data.draw(st.permutations(shares)).copy()[:t]
    assert recover_secret(subset, t) == secret


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 7), n=st.integers(0, 20), rounds=st.integers(1, 3), data=st.data())
def test_secagg_sums_are_exact_with_dropouts_over_a_session(k: int, n: int, rounds: int,
                                                            data) -> None:
    """One key exchange, one seed batch, several rounds with per-cell rings and fresh
    dropouts each round: every round's unmasked sum is the plain sum in each cell's ring."""
    ids = tuple(f"u{i}" for i in range(k))
    cfg = SecAggConfig(session_id="prop", party_ids=ids)
    clients = {p: SecAggClient(p, cfg) for p in ids}
    server = SecAggServer(cfg)
    batch = tuple(f"r{j}" for j in range(rounds))
    run_key_stages(clients, server, batch)
    for r in batch:
        widths = data.draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
        spec = RoundSpec(round_id=r, vector_len=n, ring_bits=max(widths, default=1),
                         cell_bits=bytes(widths))
        # every survivor's seed needs t live holders among its neighbours and itself; a
        # dropout's pair masks need only its live partners' round keys
        max_drop = max(0, k - cfg.t)
        dropped = set(data.draw(st.permutations(ids))[:data.draw(st.integers(0, max_drop))])
        xs = {p: np.array([data.draw(st.integers(0, 2**w - 1)) for w in widths], dtype=np.uint64)
              for p in ids}
        for p, c in clients.items():
            y = c.masked(spec, xs[p])
            if p not in dropped:
                server.collect_masked(spec, p, y)
        survivors, gone = server.unmask_request(r)
        assert set(gone) == dropped
        revealed = {p: clients[p].reveal_all(r, survivors, gone) for p in survivors}
        total = server.unmask(r, survivors, gone, revealed)
        exact = [sum(int(xs[p][i]) for p in survivors) % 2**w for i, w in enumerate(widths)]
        assert total.tolist() == exact


@given(st.data())
def test_pack_varbits_round_trip(data) -> None:
    widths = data.draw(st.lists(st.integers(1, 64), max_size=300))
    v = np.array([data.draw(st.integers(0, 2**w - 1)) for w in widths], dtype=np.uint64)
    w = np.array(widths, dtype=np.uint8)
    raw = pack_varbits(v, w)
    assert len(raw) == (sum(widths) + 7) // 8
    np.testing.assert_array_equal(unpack_varbits(raw, w), v)
