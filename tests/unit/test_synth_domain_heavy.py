"""Zero-inflated / heavily tied numeric columns: dominant values get their own bin."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from synth.domain import ColumnSpec, Schema, decode, encode, infer_schema, marginal


def zero_inflated(n: int = 5000, zero_frac: float = 0.9, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.choice([114, 401, 594, 2174, 3103, 5013, 7688, 15024, 99999], n)
    x = x + rng.integers(0, 50, n) * (x < 99999)
    x[rng.random(n) < zero_frac] = 0
    return pd.DataFrame({"gain": x.astype(np.int64)})


def test_ninety_percent_zeros_get_their_own_bin_and_at_least_three_bins() -> None:
    df = zero_inflated()
    s = infer_schema(df, numeric_bins=10)
    spec = s.column("gain")
    assert spec.kind == "numeric" and spec.integer
    assert spec.n_cells >= 3 and spec.n_cells <= 10
    e = spec.edges
    assert e[0] == 0.0 and e[1] == 1.0 and e[-1] == float(df.gain.max())
    assert all(float(v).is_integer() for v in e)  # integer column, integer edges
    codes = encode(df, s)[:, 0]
    zeros = df.gain.to_numpy() == 0
    assert np.all(codes[zeros] == 0) and np.all(codes[~zeros] > 0)  # zeros alone in bin 0
    # no empty bin
    assert np.all(marginal(encode(df, s), s.domain, ("gain",)) > 0)


def test_round_trip_keeps_bins_and_decodes_the_dominant_value_exactly() -> None:
    df = zero_inflated(seed=1)
    s = infer_schema(df, numeric_bins=10)
    codes = encode(df, s)
    out = decode(codes, s, np.random.default_rng(3))
    np.testing.assert_array_equal(encode(out, s), codes)
    assert np.all(out.gain.to_numpy()[codes[:, 0] == 0] == 0)
    assert out.gain.min() >= df.gain.min() and out.gain.max() <= df.gain.max()


def test_interior_dominant_value_and_bin_budget() -> None:
    rng = np.random.default_rng(2)
    n = 4000
    h = rng.integers(1, 100, n)
    h[rng.random(n) < 0.5] = 40
    df = pd.DataFrame({"hours": h})
    s = infer_schema(df, numeric_bins=10)
    e = s.column("hours").edges
    assert len(e) - 1 <= 10 and 40.0 in e and 41.0 in e
    codes = encode(df, s)[:, 0]
    b40 = e.index(40.0)
    assert set(df.hours[codes == b40]) == {40}
    assert np.all(marginal(encode(df, s), s.domain, ("hours",)) > 0)
    out = decode(encode(df, s), s, np.random.default_rng(0))
    np.testing.assert_array_equal(encode(out, s)[:, 0], codes)


def test_several_heavy_values_each_isolated() -> None:
    rng = np.random.default_rng(4)
    n = 6000
    x = rng.integers(1, 17, n)
    u = rng.random(n)
    x[u < 0.32] = 9
    x[(u >= 0.32) & (u < 0.54)] = 10
    x[(u >= 0.54) & (u < 0.70)] = 13
    df = pd.DataFrame({"edu": x})
    s = infer_schema(df, numeric_bins=10)
    codes = encode(df, s)[:, 0]
    for v in (9, 10, 13):
        assert set(df.edu[codes == codes[x == v][0]]) == {v}
    assert s.column("edu").n_cells <= 10


def test_dominant_maximum_and_float_columns() -> None:
    rng = np.random.default_rng(5)
    n = 3000
    x = rng.normal(0.0, 1.0, n)
    x[rng.random(n) < 0.6] = 7.25  # the maximum is dominant
    df = pd.DataFrame({"f": x})
    s = infer_schema(df, numeric_bins=8)
    spec = s.column("f")
    assert spec.edges[-1] == 7.25 and spec.n_cells <= 8
    codes = encode(df, s)[:, 0]
    last = spec.n_cells - 1
    assert np.all((codes == last) == (x == 7.25))
    out = decode(encode(df, s), s, np.random.default_rng(1))
    assert np.all(out.f.to_numpy()[codes == last] == pytest.approx(7.25))
    assert out.f.min() >= x.min() and out.f.max() <= x.max()
    # float zero-inflation: the zero bin decodes to 0.0
    z = np.where(rng.random(n) < 0.8, 0.0, rng.lognormal(3.0, 1.0, n))
    sz = infer_schema(pd.DataFrame({"z": z}), numeric_bins=10)
    cz = encode(pd.DataFrame({"z": z}), sz)
    oz = decode(cz, sz, np.random.default_rng(2))
    assert np.all(oz.z.to_numpy()[cz[:, 0] == 0] == 0.0)
    np.testing.assert_array_equal(encode(oz, sz), cz)


def test_plain_columns_keep_plain_quantile_edges() -> None:
    x = np.random.default_rng(6).lognormal(10, 1, 2000)
    s = infer_schema(pd.DataFrame({"x": x}), numeric_bins=10)
    e = np.asarray(s.column("x").edges)
    np.testing.assert_allclose(e, np.quantile(x, np.linspace(0, 1, 11)))


def test_decode_never_leaves_min_max_even_for_hand_made_bins() -> None:
    spec = ColumnSpec(name="i", kind="numeric", edges=(0.2, 0.7, 5.0), integer=True,
                      dtype="int64")
    s = Schema(columns=(spec,))
    out = decode(np.array([[0]] * 50 + [[1]] * 50), s, np.random.default_rng(0))
    assert out.i.min() >= 0.2 and out.i.max() <= 5.0
    fspec = ColumnSpec(name="f", kind="numeric", edges=(-1.0, 0.0, 1e-300), dtype="float64")
    fo = decode(np.array([[0], [1]] * 50), Schema(columns=(fspec,)), np.random.default_rng(0))
    assert fo.f.min() >= -1.0 and fo.f.max() <= 1e-300
