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
    DATASETS,
    DataError,
    DatasetNotFound,
    InvalidLabel,
    InvalidSplit,
    InvalidSynthetic,
    PartyFeatures,
    SyntheticSpec,
    UnknownColumn,
    clean_adult,
    default_split,
    encode_labels,
    encode_party_features,
    encode_regression_labels,
    load_table,
    make_synthetic,
    synthetic_columns,
    train_test_indices,
    validate_split,
)
from parties.data.treatments import TreatmentPolicy
from tests.bounds import above, below


@pytest.fixture(scope="module")
def bank() -> tuple[pd.DataFrame, str]:
    frame, label = load_table("bank")
    assert label is not None
    return frame, label


# ----------------------------------------------------------------- bundled data


def test_bundled_bank_shape_and_balance(bank):
    frame, label = bank
    info = DATASETS["bank"]
    assert (info.resource, info.label, info.task, info.rows) == ("bank-full.csv.gz", "y",
                                                                 "binary", 45_211)
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
    feats = encode_party_features(frame, ["num", "cat", "flag"], train_idx, test_idx,
                                  policy=TreatmentPolicy(clip_quantile=0.0))
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
    assert feats.x_test[0, 0] > 1000  # clip_quantile = 0: no clipping

    # Missing category is its own column; unseen test category "zzz" is all zeros.
    np.testing.assert_array_equal(feats.x_train[3, 1:4], [1, 0, 0])
    np.testing.assert_array_equal(feats.x_test[0, 1:4], [0, 0, 0])
    np.testing.assert_array_equal(feats.x_test[1, 1:4], [0, 0, 1])
    np.testing.assert_array_equal(feats.x_test[:, 4:], [[0, 1], [1, 0]])


def test_encode_clips_numeric_columns_to_train_quantiles():
    frame = _tiny_frame()
    train_idx, test_idx = np.array([0, 1, 2, 3]), np.array([4, 5])
    feats = encode_party_features(frame, ["num"], train_idx, test_idx,
                                  policy=TreatmentPolicy(clip_quantile=0.25))
    # observed train values 1, 2, 3: quantiles 1.5 and 2.5; NaN filled with the median 2
    code = feats.encoder.columns[0]
    assert (code.lo, code.hi) == (1.5, 2.5)
    train_num = np.array([1.5, 2.0, 2.5, 2.0])
    mean, std = train_num.mean(), train_num.std()
    assert code.mean == pytest.approx(mean) and code.scale == pytest.approx(std)
    np.testing.assert_allclose(feats.x_train[:, 0], (train_num - mean) / std, rtol=1e-6)
    # the 1000 test row is clipped to the train bound like a train row
    np.testing.assert_allclose(feats.x_test[:, 0], [(2.5 - mean) / std, 0.0], rtol=1e-6)
    # default: the 0.1 % / 99.9 % quantiles, as streaming
    assert TreatmentPolicy().clip_quantile == 0.001
    code = encode_party_features(frame, ["num"], train_idx, test_idx).encoder.columns[0]
    assert 1.0 < code.lo < 1.01 and 2.99 < code.hi < 3.0
    with pytest.raises(ValueError, match="clip_quantile"):
        TreatmentPolicy(clip_quantile=0.5)


@pytest.mark.stochastic
def test_one_extreme_test_value_does_not_blow_up_a_regression():
    # a test row whose feature is 200x the training maximum (its label normal) must not
    # dominate the test RMSE: the encoder clips it to the training quantiles
    rng = np.random.default_rng(0)
    n = 3000
    frame = pd.DataFrame({"a": rng.gamma(2.0, 50.0, n), "b": rng.normal(10.0, 3.0, n),
                          "c": rng.uniform(0.0, 1.0, n)})
    y = 3.0 * frame["a"] + 20.0 * frame["b"] - 50.0 * frame["c"] + rng.normal(0.0, 5.0, n)
    train_idx, test_idx = np.arange(2100), np.arange(2100, n)
    frame.loc[test_idx[0], "a"] = 200.0 * frame["a"].iloc[train_idx].max()
    cols = ["a", "b", "c"]
    feats = encode_party_features(frame, cols, train_idx, test_idx)
    design = np.hstack([feats.x_train, np.ones((len(train_idx), 1), np.float32)])
    coef, *_ = np.linalg.lstsq(design.astype(np.float64), y.to_numpy()[train_idx], rcond=None)
    pred = np.hstack([feats.x_test, np.ones((len(test_idx), 1))]) @ coef
    err = pred - y.to_numpy()[test_idx]
    rmse_all, rmse_rest = np.sqrt(np.mean(err ** 2)), np.sqrt(np.mean(err[1:] ** 2))
    # the clipped row is scored as a row at the training maximum (its error is that of
    # the corrupted value, not of an extrapolation 200x out): the RMSE moves, not by 10x
    below(rmse_all / rmse_rest, 1.5, "test RMSE with / without the extreme row")
    y_train = y.to_numpy()[train_idx]
    below(pred[0], y_train.max(), "extreme row's prediction (below the train label max)")
    above(pred[0], y_train.min(), "extreme row's prediction (above the train label min)")
    # without clipping the same row's prediction is far outside the label range
    plain = encode_party_features(frame, cols, train_idx, test_idx,
                                  policy=TreatmentPolicy(clip_quantile=0.0))
    design = np.hstack([plain.x_train, np.ones((len(train_idx), 1), np.float32)])
    coef, *_ = np.linalg.lstsq(design.astype(np.float64), y_train, rcond=None)
    err = np.hstack([plain.x_test, np.ones((len(test_idx), 1))]) @ coef - y.to_numpy()[test_idx]
    assert float(np.r_[plain.x_test[0], 1.0] @ coef) > 10 * y_train.max()
    assert np.sqrt(np.mean(err ** 2)) > 10 * np.sqrt(np.mean(err[1:] ** 2))


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


# ----------------------------------------------------------------- adult


@pytest.fixture(scope="module")
def adult() -> tuple[pd.DataFrame, str]:
    frame, label = load_table("adult")
    assert label is not None
    return frame, label


def test_bundled_adult_shape_balance_and_missing(adult):
    frame, label = adult
    assert (DATASETS["adult"].label, DATASETS["adult"].task) == ("income", "binary")
    assert label == "income"
    assert frame.shape == (48_842, 15)
    assert set(frame[label].unique()) == {">50K", "<=50K"}
    assert int((frame[label] == ">50K").sum()) == 11_687  # 23.9 %
    # "?" is gone: it became NaN in exactly the three UCI columns that use it
    assert not (frame.astype(str) == "?").any().any()
    missing = frame.isna().sum()
    assert missing[missing > 0].to_dict() == {
        "workclass": 2_799, "occupation": 2_809, "native-country": 857,
    }


def test_adult_labels_and_missing_markers_are_normalised():
    raw = pd.DataFrame({
        "workclass": [" Private", " ?", "?", "State-gov"],
        "age": [39, 50, 38, 53],
        "income": [" >50K.", "<=50K.", " <=50K", ">50K"],
    })
    cleaned = clean_adult(raw)
    assert cleaned["income"].tolist() == [">50K", "<=50K", "<=50K", ">50K"]
    assert cleaned["workclass"].isna().tolist() == [False, True, True, False]
    assert cleaned.loc[0, "workclass"] == "Private"
    assert cleaned["age"].tolist() == [39, 50, 38, 53]
    assert raw.loc[1, "workclass"] == " ?"  # the input is not modified
    y, _, pos = encode_labels(cleaned, "income", np.arange(4), np.array([], dtype=np.int64))
    assert pos == ">50K" and y.tolist() == [1, 0, 0, 1]
    with pytest.raises(UnknownColumn, match="'income'"):
        clean_adult(raw.drop(columns="income"))


def test_adult_missing_values_are_their_own_category(adult):
    frame, label = adult
    active, passive = default_split(frame.columns, label)
    assert len(active) == 7 and len(passive) == 7
    assert active[:2] == ("age", "workclass") and passive[-1] == "native-country"
    train, test = train_test_indices(len(frame))
    fa = encode_party_features(frame, active, train, test)
    col = fa.feature_names.index("workclass=__missing__")
    missing_train = frame["workclass"].iloc[train].isna().to_numpy()
    np.testing.assert_array_equal(fa.x_train[:, col], missing_train.astype(np.float32))
    assert "workclass=?" not in fa.feature_names
    assert np.isfinite(fa.x_train).all() and np.isfinite(fa.x_test).all()


def test_adult_centralised_logistic_regression_reference(adult):
    """datasets.md: logistic regression on all rows, 70/30 seed 0, "?" as a category: 0.902."""
    frame, label = adult
    active, passive = default_split(frame.columns, label)
    train, test = train_test_indices(len(frame), test_frac=0.3, seed=0)
    fa = encode_party_features(frame, active, train, test)
    fp = encode_party_features(frame, passive, train, test)
    y_train, y_test, _ = encode_labels(frame, label, train, test)
    model = LogisticRegression(max_iter=1000).fit(np.hstack([fa.x_train, fp.x_train]), y_train)
    auc = roc_auc_score(y_test, model.predict_proba(np.hstack([fa.x_test, fp.x_test]))[:, 1])
    assert abs(auc - 0.902) < 0.01, auc


# ----------------------------------------------------------------- california


def test_bundled_california_shape():
    frame, label = load_table("california")
    info = DATASETS["california"]
    assert (info.label, info.task, info.rows) == ("MedHouseVal", "regression", 20_640)
    assert label == "MedHouseVal"
    assert frame.shape == (20_640, 9)
    assert frame.columns.tolist() == ["MedInc", "HouseAge", "AveRooms", "AveBedrms",
                                      "Population", "AveOccup", "Latitude", "Longitude",
                                      "MedHouseVal"]
    assert not frame.isna().any().any()
    assert all(frame[c].dtype == np.float64 for c in frame.columns)
    # units of $100,000, capped at 5.00001 as in the 1990 census data
    assert 0.14 < frame[label].min() and frame[label].max() == pytest.approx(5.00001)
    assert frame.iloc[0][label] == pytest.approx(4.526)
    active, passive = default_split(frame.columns, label)
    assert active == ("MedInc", "HouseAge", "AveRooms", "AveBedrms")
    assert passive == ("Population", "AveOccup", "Latitude", "Longitude")


# ----------------------------------------------------------------- regression labels


def test_regression_labels_standardised_with_train_statistics():
    frame = pd.DataFrame({"v": [1.0, 2.0, 3.0, 4.0, 100.0, -7.5]})
    train, test = np.array([0, 1, 2, 3]), np.array([4, 5])
    reg = encode_regression_labels(frame, "v", train, test)
    assert reg.mean == 2.5 and reg.std == pytest.approx(np.std([1, 2, 3, 4]))
    assert reg.y_train.dtype == np.float32 and reg.y_test.dtype == np.float32
    np.testing.assert_allclose(reg.y_train, (np.array([1, 2, 3, 4]) - 2.5) / reg.std, rtol=1e-6)
    np.testing.assert_array_equal(reg.y_test, [100.0, -7.5])  # original units
    np.testing.assert_allclose(reg.y_train * reg.std + reg.mean, [1, 2, 3, 4], rtol=1e-6)


def test_regression_labels_integer_column():
    frame = pd.DataFrame({"n": [3, 5, 7, 9]})
    reg = encode_regression_labels(frame, "n", np.array([0, 1, 2]), np.array([3]))
    assert reg.mean == 5.0 and reg.y_test.tolist() == [9.0]


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (["a", "b", "c", "d"], "must be numeric"),
        ([True, False, True, False], "must be numeric"),
        ([1.0, np.nan, 2.0, 3.0], "missing"),
        ([1.0, np.inf, 2.0, 3.0], "infinite"),
        ([2.0, 2.0, 2.0, 3.0], "constant"),
    ],
)
def test_regression_label_errors(values, match):
    frame = pd.DataFrame({"v": values})
    with pytest.raises(InvalidLabel, match=match):
        encode_regression_labels(frame, "v", np.array([0, 1, 2]), np.array([3]))


def test_numeric_label_with_many_classes_hints_at_regression():
    frame = pd.DataFrame({"v": [0.5, 1.5, 2.5, 3.5]})
    with pytest.raises(InvalidLabel, match="vfl.task=regression"):
        encode_labels(frame, "v", np.array([0, 1, 2]), np.array([3]))


# ----------------------------------------------------------------- synthetic


@pytest.mark.stochastic
def test_synthetic_shape_balance_and_determinism():
    spec = SyntheticSpec(rows=5_000, features=12, informative=4, seed=7)
    frame = make_synthetic(spec)
    assert frame.shape == (5_000, 13)
    assert frame.columns.tolist() == synthetic_columns(spec)
    assert frame.columns[0] == "x000" and frame.columns[-1] == "y"
    assert (frame.dtypes.iloc[:-1] == np.float32).all() and frame["y"].dtype == np.int64
    assert set(frame["y"].unique()) == {0, 1}
    below(abs(frame["y"].mean() - 0.5), 0.02, "label imbalance")  # up to 1 % flipped labels
    pd.testing.assert_frame_equal(frame, make_synthetic(spec))
    assert not frame.equals(make_synthetic(SyntheticSpec(rows=5_000, features=12,
                                                         informative=4, seed=8)))
    loaded, label = load_table("synthetic", synthetic=spec)
    assert label == "y"
    pd.testing.assert_frame_equal(loaded, frame)


def test_synthetic_default_and_wide_column_names():
    assert SyntheticSpec() == SyntheticSpec(rows=100_000, features=100, informative=20, seed=0)
    assert synthetic_columns(SyntheticSpec(rows=10, features=1500, informative=2))[-2:] == [
        "x1499", "y"]


@pytest.mark.stochastic
def test_synthetic_is_learnable_from_each_half():
    spec = SyntheticSpec(rows=4_000, features=20, informative=10, seed=0)
    frame = make_synthetic(spec)
    active, passive = default_split(frame.columns, "y")
    assert len(active) == len(passive) == 10
    train, test = train_test_indices(len(frame))
    y_train, y_test, pos = encode_labels(frame, "y", train, test)
    assert pos == "1"
    x = encode_party_features(frame, active + passive, train, test)
    model = LogisticRegression(max_iter=1000).fit(x.x_train, y_train)
    above(roc_auc_score(y_test, model.predict_proba(x.x_test)[:, 1]), 0.7, "logistic AUC")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"rows": 1}, "rows"), ({"features": 1}, "features"),
     ({"features": 5, "informative": 6}, "informative"), ({"informative": 1}, "informative"),
     ({"seed": -1}, "seed")],
)
def test_synthetic_spec_errors(kwargs, match):
    with pytest.raises(InvalidSynthetic, match=match):
        SyntheticSpec(**kwargs)


def test_unknown_dataset_name_lists_the_named_ones():
    with pytest.raises(DatasetNotFound) as info:
        load_table("adultt")
    assert "adult, bank, california, synthetic" in str(info.value)


def test_bundled_table_with_the_wrong_row_count_is_refused(monkeypatch):
    import parties.data as data

    monkeypatch.setitem(data.DATASETS, "bank", data.DatasetInfo(
        name="bank", label="y", task="binary", resource="bank-full.csv.gz", rows=4_521))
    with pytest.raises(DataError, match="45,211 rows, expected 4,521"):
        load_table("bank")


def test_default_split_with_an_active_feature_count():
    from parties.data import InvalidSplit, default_split

    cols = ["y"] + [f"x{i}" for i in range(10)]
    a, p = default_split(cols, "y", n_active=2)
    assert a == ("x0", "x1") and p == tuple(f"x{i}" for i in range(2, 10))
    for bad in (0, 10, 11):
        with pytest.raises(InvalidSplit, match=str(bad)):
            default_split(cols, "y", n_active=bad)


def test_every_infinite_column_is_named_in_one_error():
    frame = pd.DataFrame({"a": [1.0, np.inf, 3.0, 4.0], "b": [1.0, 2.0, 3.0, 4.0],
                          "c": [-np.inf, 2.0, 3.0, 5.0]})
    train, test = np.arange(3), np.arange(3, 4)
    with pytest.raises(DataError, match="2 numeric columns contain infinite values: 'a', 'c'"):
        encode_party_features(frame, ["a", "b", "c"], train, test)
    enc = encode_party_features(frame.assign(a=1.0, c=2.0), ["a", "b", "c"], train,
                                test).encoder
    with pytest.raises(DataError, match="'a', 'c'"):
        enc.transform(frame)
