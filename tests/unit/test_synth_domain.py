"""Domains, schema inference, encode/decode, domain agreement and marginal counts."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from synth.domain import (
    MISSING_LEVEL,
    ColumnSpec,
    Domain,
    DomainError,
    DomainMismatch,
    DomainTooLarge,
    Schema,
    check_clique_size,
    check_same_domain,
    decode,
    encode,
    infer_schema,
    marginal,
    marginals,
)


def table(n: int = 2000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "age": rng.integers(17, 91, n),
        "income": rng.lognormal(10, 1, n),
        "job": rng.choice(["clerk", "nurse", "admin", "farmer"], n),
        "kids": rng.integers(0, 4, n),
        "married": rng.random(n) < 0.4,
        "city": pd.Categorical(rng.choice(["b", "a", "c"], n)),
    })


# ---------------------------------------------------------------------------- Domain
def test_domain_basics() -> None:
    dom = Domain(attributes=("a", "b", "c"), sizes=(2, 3, 4))
    assert dom.size(("a", "c")) == 8
    assert dom.size() == 24
    assert dom.size(()) == 1
    assert dom.index("b") == 1
    assert "c" in dom and "z" not in dom
    sub = dom.project(("c", "a"))
    assert sub == Domain(attributes=("c", "a"), sizes=(4, 2))
    assert Domain.from_dict(json.loads(json.dumps(dom.to_dict()))) == dom
    with pytest.raises(DomainError, match="'z'"):
        dom.index("z")
    with pytest.raises(DomainError, match="repeats"):
        dom.size(("a", "a"))


def test_domain_validation() -> None:
    with pytest.raises(DomainError, match="sizes"):
        Domain(attributes=("a",), sizes=(1, 2))
    with pytest.raises(DomainError, match="repeated"):
        Domain(attributes=("a", "a"), sizes=(1, 2))
    with pytest.raises(DomainError, match=">= 1"):
        Domain(attributes=("a",), sizes=(0,))


def test_fingerprint_is_stable_and_sensitive() -> None:
    a = Domain(attributes=("x", "y"), sizes=(3, 4))
    assert a.fingerprint() == Domain(attributes=("x", "y"), sizes=(3, 4)).fingerprint()
    assert len(a.fingerprint()) == 64
    assert a.fingerprint() != Domain(attributes=("x", "y"), sizes=(3, 5)).fingerprint()
    assert a.fingerprint() != Domain(attributes=("y", "x"), sizes=(4, 3)).fingerprint()
    # pinned: the digest must not change between runs, processes or versions
    assert a.fingerprint() == __import__("hashlib").sha256(
        b'{"attributes":["x","y"],"sizes":[3,4]}').hexdigest()


# ---------------------------------------------------------------------------- inference
def test_infer_schema_kinds_levels_and_edges() -> None:
    df = table()
    s = infer_schema(df, numeric_bins=10)
    kinds = {c.name: c.kind for c in s.columns}
    assert kinds == {"age": "numeric", "income": "numeric", "job": "categorical",
                     "kids": "categorical", "married": "categorical", "city": "categorical"}
    assert s.column("job").levels == ("admin", "clerk", "farmer", "nurse")
    assert s.column("kids").levels == ("0", "1", "2", "3")
    assert s.column("married").levels == ("False", "True")
    assert s.column("city").levels == ("a", "b", "c")
    age = s.column("age")
    assert age.integer and age.edges[0] == df.age.min() and age.edges[-1] == df.age.max()
    assert all(float(e).is_integer() for e in age.edges)
    inc = s.column("income")
    assert not inc.integer and inc.n_cells == 10
    assert inc.edges[0] == df.income.min() and inc.edges[-1] == df.income.max()
    assert s.domain.attributes == tuple(df.columns)
    assert s.domain.sizes == tuple(c.n_cells for c in s.columns)
    assert Schema.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_quantile_edges_are_deduplicated_and_uniform_edges_are_even() -> None:
    x = np.r_[np.zeros(900), np.arange(1, 101, dtype=float)]
    s = infer_schema(pd.DataFrame({"x": x}), numeric_bins=10)
    e = s.column("x").edges
    # 90 % zeros: the zeros get their own bin, the rest is cut at its quantiles
    assert len(set(e)) == len(e) and e[0] == 0.0 and e[1] == 1.0 and e[-1] == 100.0
    assert 3 <= len(e) <= 11
    u = infer_schema(pd.DataFrame({"x": np.linspace(0.0, 1.0, 50)}), numeric_bins=4,
                     binning="uniform").column("x").edges
    np.testing.assert_allclose(u, [0, 0.25, 0.5, 0.75, 1.0])


def test_columns_argument_selects_and_orders() -> None:
    s = infer_schema(table(), columns=["job", "age"])
    assert s.names == ("job", "age")
    with pytest.raises(DomainError, match="'nope'"):
        infer_schema(table(), columns=["nope"])


def test_text_missing_values_become_a_level() -> None:
    df = pd.DataFrame({"c": ["a", None, "b", "a"]})
    s = infer_schema(df)
    assert s.column("c").levels == tuple(sorted(("a", "b", MISSING_LEVEL)))
    out = decode(encode(df, s), s, np.random.default_rng(0))
    assert not out["c"].isna().any()


def test_inference_errors_name_the_column_and_value() -> None:
    with pytest.raises(DomainError, match="empty frame"):
        infer_schema(pd.DataFrame({"a": []}))
    with pytest.raises(DomainError, match="'const'.*single distinct value '7'") as info:
        infer_schema(pd.DataFrame({"const": [7, 7, 7], "ok": [1, 2, 3]}))
    assert info.value.column == "const" and "single" in info.value.reason
    with pytest.raises(DomainError, match="'x'.*10 NaN.*20 rows") as info:
        infer_schema(pd.DataFrame({"x": [1.0, np.nan, 3.0, np.nan] * 5}))
    assert info.value.column == "x" and info.value.columns == ("x",)
    with pytest.raises(DomainError, match="'id'.*150 levels.*max_levels=100"):
        infer_schema(pd.DataFrame({"id": [f"u{i}" for i in range(150)]}))
    with pytest.raises(DomainError, match="unsupported dtype"):
        infer_schema(pd.DataFrame({"t": pd.date_range("2020-01-01", periods=5)}))
    assert issubclass(DomainError, ValueError)


# ---------------------------------------------------------------------------- encode/decode
def test_encode_shape_dtype_and_out_of_range_values() -> None:
    df = table()
    s = infer_schema(df)
    codes = encode(df, s)
    assert codes.shape == (len(df), len(s.columns)) and codes.dtype == np.int32
    assert np.all(codes >= 0) and np.all(codes < np.array(s.domain.sizes))
    other = pd.DataFrame({"age": [0, 200, 17, 90], "income": [-5.0, 1e12, 1.0, 2.0]})
    sub = infer_schema(df, columns=["age", "income"])
    c = encode(other, sub)
    assert c[0, 0] == 0 and c[1, 0] == sub.domain.sizes[0] - 1
    assert c[0, 1] == 0 and c[1, 1] == sub.domain.sizes[1] - 1


def test_encode_rejects_an_unseen_level_by_name() -> None:
    s = infer_schema(table(), columns=["job"])
    with pytest.raises(DomainError, match="'job'.*'pilot'") as info:
        encode(pd.DataFrame({"job": ["clerk", "pilot"]}), s)
    assert info.value.column == "job"
    with pytest.raises(DomainError, match="not in the frame"):
        encode(pd.DataFrame({"other": [1]}), s)


def test_decode_round_trip_keeps_every_bin_and_dtype() -> None:
    df = table()
    s = infer_schema(df)
    codes = encode(df, s)
    out = decode(codes, s, np.random.default_rng(1))
    np.testing.assert_array_equal(encode(out, s), codes)
    assert out["age"].dtype == np.int64
    assert out["kids"].dtype == np.int64
    assert out["married"].dtype == bool
    assert out["income"].dtype == np.float64
    assert set(out["job"]) <= {"admin", "clerk", "farmer", "nurse"}
    assert not out.isna().any().any()
    # numeric values fall inside their bin
    e = np.asarray(s.column("income").edges)
    b = codes[:, 1]
    assert np.all(out["income"].to_numpy() >= e[b]) and np.all(out["income"].to_numpy() <= e[b + 1])


def test_decode_rejects_bad_codes() -> None:
    s = Schema(columns=(ColumnSpec(name="c", kind="categorical", levels=("a", "b")),))
    with pytest.raises(DomainError, match="'c'.*code 2"):
        decode(np.array([[0], [2]]), s, np.random.default_rng(0))
    with pytest.raises(DomainError, match="shape"):
        decode(np.zeros((2, 2), dtype=int), s, np.random.default_rng(0))


def test_column_spec_validation() -> None:
    with pytest.raises(DomainError, match="increasing"):
        ColumnSpec(name="x", kind="numeric", edges=(0.0, 0.0, 1.0))
    with pytest.raises(DomainError, match="kind"):
        ColumnSpec(name="x", kind="ordinal", levels=("a",))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- agreement
def test_check_same_domain_names_the_odd_parties() -> None:
    good = Domain(attributes=("a",), sizes=(3,)).fingerprint()
    bad = Domain(attributes=("a",), sizes=(4,)).fingerprint()
    check_same_domain({"p0": good, "p1": good})
    check_same_domain({})
    with pytest.raises(DomainMismatch, match="p2") as info:
        check_same_domain({"p0": good, "p1": good, "p2": bad})
    assert info.value.differing == ("p2",)
    assert info.value.groups == {good: ("p0", "p1"), bad: ("p2",)}
    assert isinstance(info.value, DomainError)


# ---------------------------------------------------------------------------- marginals
def test_marginal_counts_match_a_naive_count() -> None:
    rng = np.random.default_rng(5)
    dom = Domain(attributes=("a", "b", "c"), sizes=(3, 4, 2))
    codes = np.stack([rng.integers(0, s, 500) for s in dom.sizes], axis=1).astype(np.int32)
    m = marginal(codes, dom, ("c", "a"))
    assert m.shape == (2, 3) and m.dtype == np.float64 and m.sum() == 500
    naive = np.zeros((2, 3))
    for row in codes:
        naive[row[2], row[0]] += 1
    np.testing.assert_array_equal(m, naive)
    assert float(marginal(codes, dom, ())) == 500.0
    ms = marginals(codes, dom, [("a",), ("a", "b")])
    assert set(ms) == {("a",), ("a", "b")}
    np.testing.assert_array_equal(ms[("a",)], ms[("a", "b")].sum(axis=1))


def test_marginal_rejects_out_of_range_codes() -> None:
    dom = Domain(attributes=("a",), sizes=(2,))
    with pytest.raises(DomainError, match="'a'.*out of range"):
        marginal(np.array([[0], [2]]), dom, ("a",))


def test_clique_size_is_checked_before_allocating() -> None:
    dom = Domain(attributes=tuple(f"x{i}" for i in range(8)), sizes=(100,) * 8)
    codes = np.zeros((3, 8), dtype=np.int32)
    with pytest.raises(DomainTooLarge) as info:
        marginal(codes, dom, dom.attributes)  # 1e16 cells: must fail without allocating
    err = info.value
    assert err.cells == 100 ** 8 and err.max_cells == 5_000_000 and err.clique == dom.attributes
    assert check_clique_size(dom, ("x0", "x1", "x2")) == 1_000_000
    with pytest.raises(DomainTooLarge):
        check_clique_size(dom, ("x0", "x1"), max_cells=9_999)
    with pytest.raises(DomainTooLarge):
        marginals(codes, dom, [("x0",), dom.attributes])


def test_every_nan_column_is_named_in_one_error() -> None:
    rng = np.random.default_rng(0)
    df = pd.DataFrame({f"c{i}": rng.normal(size=30) for i in range(20)})
    df["job"] = rng.choice(["a", "b"], 30)
    holed = [f"c{i}" for i in range(0, 20, 2)] + ["c5"]
    for k, c in enumerate(holed):
        df.loc[k, c] = np.nan if k % 3 else np.inf
    with pytest.raises(DomainError) as info:
        infer_schema(df)
    order = [c for c in df.columns if c in holed]
    assert info.value.columns == tuple(order) and info.value.column == order[0]
    assert all(repr(c) in str(info.value) for c in holed)
    assert "11 columns" in str(info.value)
    schema = infer_schema(df.drop(columns=holed))
    kept = df.drop(columns=holed)
    kept.loc[3, "c1"] = kept.loc[4, "c3"] = np.nan
    with pytest.raises(DomainError) as info:
        encode(kept, schema)
    assert info.value.columns == ("c1", "c3") and "'c3' (1 NaN of 30 rows)" in str(info.value)
