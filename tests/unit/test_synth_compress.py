"""synth.compress: quantisation, error feedback, deltas, ring helpers, bit packing, codecs."""

from __future__ import annotations

import numpy as np
import pytest

from synth.compress import (
    CodecUnavailable,
    DeltaDecoder,
    DeltaEncoder,
    DeltaStateError,
    ErrorFeedbackQuantizer,
    QuantSpec,
    compress_bytes,
    compression_report,
    decompress_bytes,
    dequantize,
    from_ring,
    pack_bits,
    packed_size,
    quantize,
    to_ring,
    unpack_bits,
    wire_size_naive,
)

try:
    import zstandard  # noqa: F401

    HAVE_ZSTD = True
except ImportError:
    HAVE_ZSTD = False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bits": 0, "h_min": 0.0, "h_max": 1.0},
        {"bits": 31, "h_min": 0.0, "h_max": 1.0},
        {"bits": 8, "h_min": 1.0, "h_max": 1.0},
        {"bits": 8, "h_min": 0.0, "h_max": float("inf")},
        {"bits": 8, "h_min": float("nan"), "h_max": 1.0},
    ],
)
def test_quantspec_rejects_bad_parameters(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        QuantSpec(**kwargs)


def test_quantize_clips_rounds_and_bounds_the_error() -> None:
    spec = QuantSpec(bits=4, h_min=0.0, h_max=15.0)  # step 1
    q = quantize(np.array([-3.0, 0.0, 0.49, 0.51, 7.0, 15.0, np.inf]), spec)
    assert q.dtype == np.int64
    assert q.tolist() == [0, 0, 0, 1, 7, 15, 15]
    spec = QuantSpec(bits=6, h_min=-10.0, h_max=250.0)
    x = np.random.default_rng(0).uniform(-10, 250, 10_000)
    err = np.abs(dequantize(quantize(x, spec), spec) - x)
    assert err.max() <= spec.max_error * (1 + 1e-9)
    assert err.max() > 0.9 * spec.max_error  # the bound is tight
    with pytest.raises(ValueError):
        quantize(np.array([1.0, np.nan]), spec)
    with pytest.raises(ValueError):
        dequantize(np.array([64]), spec)


def test_error_feedback_running_mean_converges_much_faster() -> None:
    """T rounds of the same x: with feedback the decoded mean is within Δ/(2T) of x;
    without it, it stays at the rounding bias (mean |bias| about Δ/4)."""
    spec = QuantSpec(bits=4, h_min=0.0, h_max=100.0)  # Δ = 6.67
    x = np.random.default_rng(1).uniform(5, 95, 500)
    ef = ErrorFeedbackQuantizer(spec)
    rounds = 200
    acc_ef = np.zeros_like(x)
    acc_plain = np.zeros_like(x)
    for _ in range(rounds):
        acc_ef += dequantize(ef.encode(x), spec)
        acc_plain += dequantize(quantize(x, spec), spec)
    err_ef = np.abs(acc_ef / rounds - x)
    err_plain = np.abs(acc_plain / rounds - x)
    assert err_ef.max() <= spec.step / (2 * rounds) + 1e-9  # <= 0.0167
    assert err_plain.mean() > spec.step / 8  # about Δ/4 = 1.67 expected
    assert err_plain.mean() > 50 * err_ef.mean()


def test_error_feedback_streams_and_state_dict() -> None:
    spec = QuantSpec(bits=3, h_min=0.0, h_max=7.0)
    a = ErrorFeedbackQuantizer(spec)
    x = np.array([0.3, 2.6, 6.9])
    a.encode(x, "c1")
    a.encode(x * 0.5, "c2")
    state = a.state_dict()
    b = ErrorFeedbackQuantizer(spec)
    b.load_state_dict(state)
    for _ in range(5):
        np.testing.assert_array_equal(a.encode(x, "c1"), b.encode(x, "c1"))
    np.testing.assert_allclose(a.residual("c2"), b.residual("c2"))
    assert a.residual("never") is None
    with pytest.raises(ValueError):
        ErrorFeedbackQuantizer(QuantSpec(bits=4, h_min=0.0, h_max=7.0)).load_state_dict(state)
    with pytest.raises(ValueError):
        a.encode(np.ones(4), "c1")  # length changed


def test_ring_helpers() -> None:
    d = np.array([-5, 0, 7, -(2**20), 2**20 - 1], dtype=np.int64)
    for m in (22, 32, 63, 64):
        r = to_ring(d, m)
        assert r.dtype == np.uint64 and int(r.max()) < 2**m
        np.testing.assert_array_equal(from_ring(r, m), d)
    assert to_ring(np.array([-1]), 8).tolist() == [255]
    assert from_ring(np.array([255, 128, 127], dtype=np.uint64), 8).tolist() == [-1, -128, 127]
    with pytest.raises(ValueError):
        to_ring(np.array([1.5]), 8)
    with pytest.raises(ValueError):
        to_ring(np.array([1]), 65)


def test_delta_encoder_decoder_round_trip_with_acks() -> None:
    enc, dec = DeltaEncoder(), DeltaDecoder()
    q1 = np.array([3, 0, 9, 15])
    m1 = enc.encode(q1, "s")
    assert m1.full and m1.base_version == 0
    np.testing.assert_array_equal(dec.decode(m1), q1)
    enc.ack("s", dec.version("s"))
    q2 = np.array([4, 0, 7, 15])
    m2 = enc.encode(q2, "s")
    assert not m2.full and m2.base_version == 1
    assert m2.payload.tolist() == [1, 0, -2, 0]
    np.testing.assert_array_equal(dec.decode(m2), q2)
    # Not acknowledged: the next delta is still against version 1, and the receiver
    # (which holds version 2) refuses it.
    m3 = enc.encode(np.array([4, 1, 7, 15]), "s")
    assert m3.base_version == 1
    with pytest.raises(DeltaStateError):
        dec.decode(m3)
    with pytest.raises(DeltaStateError):
        DeltaDecoder().decode(m2)  # no base
    with pytest.raises(DeltaStateError):
        enc.ack("s", 99)


def test_delta_in_ring_mode_and_state_dict() -> None:
    m = 10
    enc, dec = DeltaEncoder(ring_bits=m), DeltaDecoder(ring_bits=m)
    q = [np.array([5, 1000, 0]), np.array([0, 1023, 3]), np.array([1023, 0, 2])]
    for qt in q:
        msg = enc.encode(qt)
        assert msg.payload.dtype == np.uint64 and int(msg.payload.max()) < 2**m
        np.testing.assert_array_equal(dec.decode(msg), qt)
        enc.ack("", dec.version())
    enc2, dec2 = DeltaEncoder(), DeltaDecoder()
    enc2.load_state_dict(enc.state_dict())
    dec2.load_state_dict(dec.state_dict())
    np.testing.assert_array_equal(dec2.decode(enc2.encode(np.array([1, 2, 3]))), [1, 2, 3])


def test_pack_bits_sizes_and_chunk_boundaries() -> None:
    rng = np.random.default_rng(2)
    v = rng.integers(0, 16, 1000)
    data = pack_bits(v, 4)
    assert len(data) == 500
    np.testing.assert_array_equal(unpack_bits(data, 4, 1000), v)
    n = 2 * 65536 + 3  # crosses the internal chunking
    for bits in (1, 7, 13, 33, 64):
        hi = 2**bits - 1
        w = rng.integers(0, min(hi, 2**63 - 1), n, dtype=np.uint64, endpoint=True)
        if bits == 64:
            w[::5] |= np.uint64(1 << 63)
        d = pack_bits(w, bits)
        assert len(d) == packed_size(n, bits)
        np.testing.assert_array_equal(unpack_bits(d, bits, n), w)
    assert pack_bits(np.array([], dtype=np.uint64), 5) == b""
    assert pack_bits(np.array([1, 0, 1, 1, 0, 0, 0, 1]), 1) == bytes([0b10110001])


def test_pack_bits_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        pack_bits(np.array([16]), 4)
    with pytest.raises(ValueError):
        pack_bits(np.array([-1]), 4)
    with pytest.raises(ValueError):
        pack_bits(np.array([1.0]), 4)
    with pytest.raises(ValueError):
        pack_bits(np.array([1]), 65)
    with pytest.raises(ValueError):
        unpack_bits(b"\x00\x00", 4, 5)


def test_lossless_codecs_round_trip() -> None:
    data = pack_bits(np.repeat(np.arange(16), 500), 4)
    for codec in ("none", "zlib", "lzma"):
        c = compress_bytes(data, codec)
        assert decompress_bytes(c, codec) == data
        if codec != "none":
            assert len(c) < len(data) / 10
    if HAVE_ZSTD:
        assert decompress_bytes(compress_bytes(data, "zstd"), "zstd") == data
    else:
        with pytest.raises(CodecUnavailable):
            compress_bytes(data, "zstd")
    with pytest.raises(CodecUnavailable):
        compress_bytes(data, "brotli")


def test_wire_accounting() -> None:
    assert wire_size_naive(1000) == 4000
    rep = compression_report(1000, len(pack_bits(np.zeros(1000, dtype=np.uint64), 8)))
    assert rep["bytes_naive"] == 4000 and rep["bytes_wire"] == 1000
    assert rep["saving"] == pytest.approx(0.75)
