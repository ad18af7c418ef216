"""Column treatments (parties.data.treatments) and the encoder that applies them: datetime parts,
ID-like columns dropped or refused, high-cardinality categoricals hashed, the encoder's
round trip (format 2, and format 1 still read), and the hashed bottom model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parties.config import DataSection, DpSection, VflConfig
from parties.data import DataError, InvalidLabel, InvalidSplit, encode_labels, encode_party_features
from parties.data.encoders import EncoderFormatError, FittedEncoder
from parties.data.demo_tables import make_traffic
from parties.data.treatments import (
    IdColumnRefused,
    Treatment,
    TreatmentPolicy,
    classify,
    classify_columns,
    encoded_width,
    hash_buckets,
)
from parties.models.zoo import HashedBottom, ModelFactory
from pubsub.config import ConfigError

N = 600


def _frame(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "when": pd.date_range("2021-03-01", periods=N, freq="37min").astype(str),
        "row_no": np.arange(N) + 100,
        "user_id": rng.permutation(N * 5)[:N],
        "token": [f"t{x:06x}" for x in rng.permutation(10 ** 6)[:N]],
        "income": rng.normal(50_000, 9_000, N).round(2),  # unique floats: never an ID
        "colour": rng.choice(["red", "green", "blue"], N),
        "city": [f"c{x}" for x in rng.integers(0, 200, N)],
        "industry": rng.integers(1, 9, N),  # a numeric code
        "age_band": rng.choice(["30-39", "1-2", "40-49"], N),  # not a date
    })


def test_each_kind_is_recognised_and_stated():
    f = _frame()
    got = {t.column: t for t in classify_columns(f, f.columns, TreatmentPolicy(
        categorical_columns=("industry",)))}
    assert got["when"].kind == "datetime"
    assert set(got["when"].parts) == {"day", "dayofweek", "hour", "minute"}  # 15 days of March
    for c in ("row_no", "user_id", "token"):
        assert got[c].kind == "dropped" and "ID-like" in got[c].reason, c
    assert "consecutive" in got["row_no"].reason and "name" in got["user_id"].reason
    assert got["income"].kind == "numeric"
    assert got["colour"].kind == "onehot" and got["colour"].levels == 3
    assert got["city"].kind == "hashed" and 180 < got["city"].levels <= 200
    assert got["city"].buckets == 512  # the power of two >= 2 x levels
    assert got["industry"].kind == "onehot" and got["industry"].levels == 8
    assert got["age_band"].kind == "onehot"


def test_thresholds_follow_the_policy():
    f = _frame()
    t = classify("city", f["city"], TreatmentPolicy(onehot_max_levels=256))
    assert t.kind == "onehot"
    t = classify("city", f["city"], TreatmentPolicy(hash_buckets=64))
    assert t.kind == "hashed" and t.buckets == 64
    assert classify("token", f["token"], TreatmentPolicy(id_columns="keep")).kind == "hashed"
    with pytest.raises(IdColumnRefused, match="'token'"):
        classify("token", f["token"], TreatmentPolicy(id_columns="refuse"))
    # fewer than 50 observed values: not enough to call it an ID
    assert classify("token", f["token"][:40], TreatmentPolicy()).kind == "onehot"


def test_bad_policies_and_config_keys_are_refused():
    with pytest.raises(ValueError, match="onehot_max_levels"):
        TreatmentPolicy(onehot_max_levels=1)
    with pytest.raises(ValueError, match="id_columns"):
        TreatmentPolicy(id_columns="maybe")
    for key, value in (("hash_buckets", 1), ("hash_embedding_dim", 0), ("id_columns", "x")):
        with pytest.raises(ConfigError, match=f"vfl.data.{key}"):
            VflConfig(data=DataSection(**{key: value}))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=1, max_size=40),
       st.integers(min_value=1, max_value=5000))
def test_hash_buckets_are_in_range_and_a_function_of_the_value(values, buckets):
    s = pd.Series(values, dtype=object)
    a = hash_buckets(s, buckets)
    assert a.dtype == np.int64 and ((a >= 0) & (a < buckets)).all()
    b = hash_buckets(pd.Series(list(reversed(values)), dtype=object), buckets)
    np.testing.assert_array_equal(a, b[::-1])  # row order does not matter


def test_hash_buckets_are_fixed_across_processes():
    # SipHash with pandas' fixed key: these exact buckets in every process and version
    got = hash_buckets(pd.Series(["a", "b", None, "a"], dtype=object), 1 << 20).tolist()
    assert got[0] == got[3] and len(set(got[:3])) == 3
    assert got == hash_buckets(pd.Series(["a", "b", "__missing__", "a"]), 1 << 20).tolist()


def test_encoder_applies_the_treatments_and_round_trips(caplog):
    f = _frame()
    train, test = np.arange(450), np.arange(450, N)
    feats = encode_party_features(f, list(f.columns), train, test,
                                  policy=TreatmentPolicy(categorical_columns=("industry",)))
    enc = feats.encoder
    assert enc.dropped == ("row_no", "user_id", "token")
    assert enc.hashed_buckets == (512,)
    assert feats.feature_names[-1] == "city#hash512"  # hashed columns come last
    assert feats.x_train.shape[1] == encoded_width(enc.treatments) == enc.width
    ids = feats.x_train[:, -1]
    assert (ids == np.round(ids)).all() and ids.min() >= 0 and ids.max() < 512
    np.testing.assert_allclose(feats.x_train[:, :5].mean(0), 0.0, atol=1e-5)  # date parts
    again = FittedEncoder.from_dict(enc.to_dict())
    assert again == enc
    np.testing.assert_array_equal(again.transform(f.iloc[test]), feats.x_test)
    np.testing.assert_array_equal(again.transform(f.iloc[train]), feats.x_train)
    assert {t["column"]: t["treatment"] for t in enc.treatments_dict()}["when"] == "datetime"


def test_a_format_1_encoder_still_reads():
    old = {"format": 1, "kind": "fitted", "missing": "__missing__", "columns": [
        {"name": "x", "kind": "numeric", "fill": 1.0, "mean": 2.0, "scale": 4.0},
        {"name": "c", "kind": "categorical", "categories": ["a", "b"]}]}
    enc = FittedEncoder.from_dict(old)
    x = enc.transform(pd.DataFrame({"x": [6.0, None], "c": ["b", "z"]}))
    np.testing.assert_array_equal(x, np.array([[1.0, 0, 1], [-0.25, 0, 0]], np.float32))
    with pytest.raises(EncoderFormatError, match="after every dense"):
        FittedEncoder.from_dict({**old, "format": 2, "columns": [
            {"name": "h", "kind": "hashed", "buckets": 8}, *old["columns"]]})


def test_refused_and_all_dropped_columns_are_clear_errors():
    f = _frame()
    with pytest.raises(DataError, match="'row_no' looks like an ID"):
        encode_party_features(f, ["row_no", "income"], np.arange(450), np.arange(450, N),
                              policy=TreatmentPolicy(id_columns="refuse"))
    with pytest.raises(InvalidSplit, match="every feature column was dropped"):
        encode_party_features(f, ["row_no", "token"], np.arange(450), np.arange(450, N))


def test_positive_class_can_be_named_and_a_wrong_one_is_refused():
    f = pd.DataFrame({"y": ["high", "low"] * 50})
    idx = np.arange(80), np.arange(80, 100)
    _, _, pos = encode_labels(f, "y", *idx)
    assert pos == "low"  # the rule: the larger string
    y, _, pos = encode_labels(f, "y", *idx, positive="high")
    assert pos == "high" and y[0] == 1.0 and y[1] == 0.0
    with pytest.raises(InvalidLabel, match="'hi' is not a class"):
        encode_labels(f, "y", *idx, positive="hi")


def test_hashed_bottom_looks_up_one_table_with_offsets():
    torch.manual_seed(0)
    body = torch.nn.Linear(2 + 2 * 3, 4)
    m = HashedBottom(2, (5, 7), 3, body)
    assert m.table.weight.shape == (12, 3)
    x = torch.tensor([[0.5, -1.0, 4.0, 0.0], [0.0, 0.0, 0.0, 6.0]])
    emb = m.table.weight
    want = body(torch.cat([x[:, :2], torch.stack([torch.cat([emb[4], emb[5]]),
                                                  torch.cat([emb[0], emb[11]])])], 1))
    torch.testing.assert_close(m(x), want)
    x_bad = x.clone()
    x_bad[0, 2] = 99.0  # out of range: clamped into the column's own rows, never the next
    torch.testing.assert_close(m(x_bad)[0], m(x)[0])


def test_factory_wraps_the_bottom_and_refuses_hashed_dp_passive():
    cfg = VflConfig(data=DataSection(hash_embedding_dim=4))
    fac = ModelFactory(cfg).with_hashed((16, 32))
    bottom = fac.bottom("passive", 10)  # 8 dense + 2 hashed
    assert isinstance(bottom, HashedBottom) and bottom.dense == 8
    out = bottom(torch.zeros(3, 10))
    assert out.shape == (3, cfg.model.embedding_dim)
    assert fac.describe("passive")["hashed"]["buckets"] == [16, 32]
    dp = ModelFactory(VflConfig(dp=DpSection(epsilon=4.0))).with_hashed((16,))
    with pytest.raises(ConfigError, match="hash"):
        dp.bottom("passive", 3)


def test_traffic_generator_has_the_public_table_shape():
    t = make_traffic(5000, seed=3)
    assert len(t) == 5000 and t["record_id"].is_unique
    assert 0.8 < t["date_time"].nunique() / 5000 < 0.9
    assert set(t["traffic"]) == {"high", "low"}
    plain = make_traffic(5000, seed=3, time_and_id=False)
    assert "date_time" not in plain and "record_id" not in plain
    pd.testing.assert_frame_equal(plain, t[plain.columns])
    got = {x.column: x.kind for x in classify_columns(t, t.columns[:-1], TreatmentPolicy())}
    assert got["date_time"] == "datetime" and got["record_id"] == "dropped"


def test_treatment_summary_lists_the_non_trivial_treatments():
    from parties.data.treatments import treatment_summary

    ts = [Treatment(column="amount", kind="numeric"),
          Treatment(column="city", kind="onehot", levels=5),
          Treatment(column="when", kind="datetime", parts=("year", "month", "day")),
          Treatment(column="merchant", kind="hashed", levels=900, buckets=1024),
          Treatment(column="user_id", kind="dropped", reason="every value distinct")]
    assert treatment_summary([t.to_dict() for t in ts]) == (
        "when -> year, month, day; merchant hashed into 1024 buckets; user_id dropped as "
        "ID-like")
    assert treatment_summary([t.to_dict() for t in ts[:2]]) == ""


def test_new_rows_with_a_missing_date_encode_with_the_fill():
    """A saved model's encoder on new rows (``psfl vfl predict``): a missing date took the
    in-place fill into a read-only array pandas returned (ValueError)."""
    from parties.data import encode_party_features

    rng = np.random.default_rng(0)
    days = pd.to_datetime("2021-01-01") + pd.to_timedelta(rng.integers(0, 900, 200), unit="D")
    frame = pd.DataFrame({"when": days.strftime("%Y-%m-%d"), "x": rng.normal(size=200)})
    feats = encode_party_features(frame, ["when", "x"], np.arange(150), np.arange(150, 200))
    new = pd.DataFrame({"when": ["2022-02-03", None, "not a date"], "x": [0.1, 0.2, 0.3]})
    out = feats.encoder.transform(new)
    assert out.shape[0] == 3 and np.isfinite(out).all()
    assert np.array_equal(out[1][:-1], out[2][:-1])  # the date parts: both the fill
