"""Unit tests for the tabular data layer (parties.data)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from parties.data import (
    BUNDLED,
    DataError,
    DatasetNotFound,
    InvalidLabel,
    InvalidSplit,
    PartyFeatures,
    UnknownColumn,
    default_split,
    encode_labels,
    encode_party_features,
    load_table,
    train_test_indices,
    validate_split,
)


@pytest.fixture(scope="module")
def bank() -> tuple[pd.DataFrame, str]:
    frame, label = load_table("bank")
    assert label is not None
    return frame, label


# ----------------------------------------------------------------- bundled data


def test_bundled_bank_shape_and_balance(bank):
    frame, label = bank
    assert BUNDLED["bank"] == ("bank-full.csv.gz", "y")
    assert label == "y"
    assert frame.shape == (45_211, 17)
    assert int((frame[label] == "yes").sum()) == 5_289
    assert set(frame[label].unique()) == {"yes", "no"}
    # UCI order restored: first and last rows of bank-full.csv.
    assert frame.iloc[0][["age", "job", "balance", "duration"]].tolist() == [
        58,
        "management",
        2143,
        261,
    ]
    assert frame.iloc[-1][["age", "job", "balance", "duration"]].tolist() == [
        37,
        "entrepreneur",
        2971,
        361,
    ]


def test_default_split_bank(bank):
    frame, label = bank
    active, passive = default_split(frame.columns, label)
    assert len(active) == 8 and len(passive) == 8
    features = [c for c in frame.columns if c != label]
    assert list(active) + list(passive) == features
    assert label not in active and label not in passive
    validate_split(frame.columns, label, active, passive)


def test_default_split_odd_count():
    active, passive = default_split(["a", "b", "y", "c"], "y")
    assert active == ("a", "b") and passive == ("c",)


# ----------------------------------------------------------------- row split


def test_train_test_indices_deterministic_disjoint_70_30():
    n = 45_211
    train, test = train_test_indices(n, test_frac=0.3, seed=0)
    train2, test2 = train_test_indices(n, test_frac=0.3, seed=0)
    np.testing.assert_array_equal(train, train2)
    np.testing.assert_array_equal(test, test2)
    assert train.dtype == np.int64 and test.dtype == np.int64
    assert len(test) == round(n * 0.3) and len(train) == n - len(test)
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.union1d(train, test), np.arange(n))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    other_train, _ = train_test_indices(n, test_frac=0.3, seed=1)
    assert not np.array_equal(train, other_train)


@settings(deadline=None, max_examples=200, derandomize=True, database=None)
@given(
    n_rows=st.integers(min_value=2, max_value=5000),
    test_frac=st.floats(min_value=0.05, max_value=0.95, exclude_min=True, exclude_max=True),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_train_test_indices_property(n_rows, test_frac, seed):
    train, test = train_test_indices(n_rows, test_frac=test_frac, seed=seed)
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(n_rows))
    assert len(test) == round(n_rows * test_frac)
    assert len(train) == n_rows - len(test)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_train_test_indices_bad_frac(bad):
    with pytest.raises(InvalidSplit, match="test_frac"):
        train_test_indices(100, test_frac=bad)


# ----------------------------------------------------------------- features


def _tiny_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "num": [1.0, 2.0, 3.0, np.nan, 1000.0, 2.0],
            "cat": ["a", "b", "a", None, "zzz", "b"],
            "flag": [True, False, True, False, True, False],
        }
    )


def test_encode_scaling_uses_train_rows_only():
    frame = _tiny_frame()
    train_idx = np.array([0, 1, 2, 3])
    test_idx = np.array([4, 5])
    feats = encode_party_features(frame, ["num", "cat", "flag"], train_idx, test_idx)
    assert isinstance(feats, PartyFeatures)
    assert feats.feature_names == (
        "num",
        "cat=__missing__",
        "cat=a",
        "cat=b",
        "flag=False",
        "flag=True",
    )
    assert feats.x_train.dtype == np.float32 and feats.x_test.dtype == np.float32
    assert feats.x_train.flags.c_contiguous and feats.x_test.flags.c_contiguous
    assert feats.x_train.shape == (4, 6) and feats.x_test.shape == (2, 6)

    # Train values 1, 2, 3 and NaN -> median 2; mean 2, population std sqrt(0.5).
    train_num = np.array([1.0, 2.0, 3.0, 2.0])
    mean, std = train_num.mean(), train_num.std()
    np.testing.assert_allclose(feats.x_train[:, 0], (train_num - mean) / std, rtol=1e-6)
    # Test row far outside the train range is still scaled with train mean/std.
    np.testing.assert_allclose(feats.x_test[:, 0], [(1000.0 - mean) / std, 0.0], rtol=1e-6)
    assert feats.x_test[0, 0] > 1000

    # Missing category is its own column; unseen test category "zzz" is all zeros.
    np.testing.assert_array_equal(feats.x_train[3, 1:4], [1, 0, 0])
    np.testing.assert_array_equal(feats.x_test[0, 1:4], [0, 0, 0])
    np.testing.assert_array_equal(feats.x_test[1, 1:4], [0, 0, 1])
    np.testing.assert_array_equal(feats.x_test[:, 4:], [[0, 1], [1, 0]])


def test_encode_bank_party_widths(bank):
    frame, label = bank
    active, passive = default_split(frame.columns, label)
    train, test = train_test_indices(len(frame))
    fa = encode_party_features(frame, active, train, test)
    fp = encode_party_features(frame, passive, train, test)
    assert fa.x_train.shape == (len(train), len(fa.feature_names))
    assert fp.x_test.shape == (len(test), len(fp.feature_names))
    assert "job=admin." in fa.feature_names and "duration" in fp.feature_names
    assert np.isfinite(fa.x_train).all() and np.isfinite(fp.x_test).all()


# ----------------------------------------------------------------- labels


@pytest.mark.parametrize(
    ("values", "positive", "expected"),
    [
        (["no", "yes", "no", "yes"], "yes", [0, 1, 0, 1]),
        (["No", "YES", "No", "YES"], "YES", [0, 1, 0, 1]),
        ([0, 1, 0, 1], "1", [0, 1, 0, 1]),
        ([True, False, True, False], "True", [1, 0, 1, 0]),
        (["false", "true", "false", "true"], "true", [0, 1, 0, 1]),
        ([">50K", "<=50K", ">50K", "<=50K"], ">50K", [1, 0, 1, 0]),
    ],
)
def test_encode_labels_positive_class(values, positive, expected):
    frame = pd.DataFrame({"y": values})
    y_train, y_test, pos = encode_labels(frame, "y", np.array([0, 1]), np.array([2, 3]))
    assert pos == positive
    assert y_train.dtype == np.float32 and y_test.dtype == np.float32
    np.testing.assert_array_equal(np.concatenate([y_train, y_test]), expected)


def test_encode_labels_bank(bank):
    frame, label = bank
    train, test = train_test_indices(len(frame))
    y_train, y_test, pos = encode_labels(frame, label, train, test)
    assert pos == "yes"
    assert y_train.shape == (len(train),) and y_test.shape == (len(test),)
    assert int(y_train.sum() + y_test.sum()) == 5_289


# ----------------------------------------------------------------- errors


def test_error_hierarchy():
    assert issubclass(DatasetNotFound, DataError) and issubclass(DatasetNotFound, FileNotFoundError)
    assert issubclass(UnknownColumn, DataError) and issubclass(UnknownColumn, KeyError)
    assert issubclass(InvalidSplit, DataError) and issubclass(InvalidSplit, ValueError)
    assert issubclass(InvalidLabel, DataError) and issubclass(InvalidLabel, ValueError)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(DatasetNotFound) as info:
        load_table(str(missing))
    assert str(missing) in str(info.value)
    assert isinstance(info.value, FileNotFoundError)


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "table.xlsx"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="unsupported"):
        load_table(str(path))


def test_unknown_column_message():
    columns = ["a", "b", "y"]
    with pytest.raises(UnknownColumn) as info:
        validate_split(columns, "y", ["a", "ghost"], ["b"])
    message = str(info.value)
    assert "'ghost'" in message and "available columns" in message and "'b'" in message
    assert not message.startswith('"')  # not repr-quoted like a plain KeyError
    assert info.value.columns == ("ghost",)
    with pytest.raises(UnknownColumn, match="'label_x'"):
        validate_split(columns, "label_x", ["a"], ["b"])
    with pytest.raises(UnknownColumn, match="'zz'"):
        encode_party_features(pd.DataFrame({"a": [1.0, 2.0]}), ["zz"], np.array([0]), np.array([1]))


def test_overlap():
    with pytest.raises(InvalidSplit, match="'b'"):
        validate_split(["a", "b", "c", "y"], "y", ["a", "b"], ["b", "c"])


def test_label_as_feature():
    with pytest.raises(InvalidSplit, match="'y'"):
        validate_split(["a", "b", "y"], "y", ["a", "y"], ["b"])


def test_empty_party():
    with pytest.raises(InvalidSplit, match="passive"):
        validate_split(["a", "b", "y"], "y", ["a", "b"], [])


def test_one_class_label():
    frame = pd.DataFrame({"y": ["no", "no", "no", "yes"]})
    with pytest.raises(InvalidLabel, match="'no'"):
        encode_labels(frame, "y", np.array([0, 1, 2]), np.array([3]))


def test_three_class_label():
    frame = pd.DataFrame({"y": ["cat", "dog", "emu", "cat"]})
    with pytest.raises(InvalidLabel, match="3 classes") as info:
        encode_labels(frame, "y", np.array([0, 1, 2]), np.array([3]))
    assert "'emu'" in str(info.value)


def test_missing_label():
    frame = pd.DataFrame({"y": ["no", None, "yes", "no"]})
    with pytest.raises(InvalidLabel, match="missing"):
        encode_labels(frame, "y", np.array([0, 1, 2]), np.array([3]))


# ----------------------------------------------------------------- user files


def _user_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "x1": [0.5, 1.5, -2.0, 3.25],
            "x2": ["u", "v", "u", "w"],
            "n": [1, 2, 3, 4],
            "target": [0, 1, 1, 0],
        }
    )


@pytest.mark.parametrize("name", ["table.csv", "table.csv.gz"])
def test_user_csv_round_trip(tmp_path, name):
    original = _user_frame()
    path = tmp_path / name
    original.to_csv(path, index=False)
    frame, label = load_table(str(path))
    assert label is None
    pd.testing.assert_frame_equal(frame, original, check_dtype=False)
    assert frame["n"].dtype == np.int64


def test_user_parquet_round_trip(tmp_path):
    original = _user_frame()
    path = tmp_path / "table.parquet"
    original.to_parquet(path, index=False)
    frame, label = load_table(str(path))
    assert label is None
    pd.testing.assert_frame_equal(frame, original)


# ----------------------------------------------------------------- reference


def test_centralised_logistic_regression_reference(bank):
    frame, label = bank
    active, passive = default_split(frame.columns, label)
    train, test = train_test_indices(len(frame), test_frac=0.3, seed=0)
    fa = encode_party_features(frame, active, train, test)
    fp = encode_party_features(frame, passive, train, test)
    y_train, y_test, _ = encode_labels(frame, label, train, test)
    x_train = np.hstack([fa.x_train, fp.x_train])
    x_test = np.hstack([fa.x_test, fp.x_test])
    model = LogisticRegression(max_iter=1000).fit(x_train, y_train)
    auc = roc_auc_score(y_test, model.predict_proba(x_test)[:, 1])
    assert abs(auc - 0.907) < 0.01, auc
