"""Property: the serialisable encoder reproduces the fitted scikit-learn encoding exactly,
through a JSON round trip, on random tables (numbers with gaps, categories with missing
values and categories unseen in training)."""

from __future__ import annotations

import numpy as np
import orjson
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from parties.data import encode_party_features
from parties.data.encoders import FittedEncoder

_num = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))
_cat = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "dd", "e e"]))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_encoder_round_trip_matches_sklearn(data: st.DataObject) -> None:
    n = data.draw(st.integers(3, 25), label="rows")
    n_train = data.draw(st.integers(1, n - 1), label="train rows")
    kinds = data.draw(st.lists(st.sampled_from(["num", "cat"]), min_size=1, max_size=4))
    cols = {}
    for i, k in enumerate(kinds):
        vals = data.draw(st.lists(_num if k == "num" else _cat, min_size=n, max_size=n))
        cols[f"{k}{i}"] = (pd.Series([np.nan if v is None else v for v in vals], dtype=float)
                           if k == "num" else pd.Series(vals, dtype=object))
    frame = pd.DataFrame(cols)
    train, held = np.arange(n_train), np.arange(n_train, n)
    feats = encode_party_features(frame, list(frame.columns), train, held)
    enc = FittedEncoder.from_dict(orjson.loads(orjson.dumps(feats.encoder.to_dict())))
    assert enc.feature_names == feats.feature_names
    assert np.array_equal(enc.transform(frame.iloc[train]), feats.x_train)
    assert np.array_equal(enc.transform(frame.iloc[held]), feats.x_test)
