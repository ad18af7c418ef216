"""Data checks that need no torch: run by the launcher before training starts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from parties.config import VflConfig
from parties.data import (
    SYNTHETIC_LABEL,
    DataError,
    InvalidLabel,
    SyntheticSpec,
    select_rows,
    default_split,
    encode_labels,
    encode_regression_labels,
    load_table,
    synthetic_columns,
    train_test_indices,
    validate_split,
)


def synthetic_spec(cfg: VflConfig) -> SyntheticSpec:
    """The ``synthetic`` dataset's parameters from the ``vfl.synthetic_*`` keys."""
    return SyntheticSpec(rows=cfg.synthetic_rows, features=cfg.synthetic_features,
                         informative=cfg.synthetic_informative, seed=cfg.synthetic_seed)


def load_configured_table(cfg: VflConfig,
                          role: str | None = None) -> tuple[pd.DataFrame, str | None]:
    """:func:`parties.data.load_table` of ``cfg.dataset`` (with the synthetic parameters),
    restricted to ``role``'s aligned rows when its ``rows_file`` is set
    (:func:`parties.data.select_rows`).

    Raises:
        parties.data.DataError: missing or unreadable file, or a bad aligned-rows file.
    """
    frame, label = load_table(cfg.dataset, synthetic=synthetic_spec(cfg))
    if role is not None and cfg.rows_file(role):
        frame = select_rows(frame, cfg.rows_file(role))
    return frame, label


def preflight(cfg: VflConfig) -> None:
    """Check the data and the column split before any process starts (fast, clear errors).

    The ``synthetic`` dataset with its own label is not generated here (its columns
    are known and its classes balanced by construction), only the column split is
    checked.

    Raises:
        parties.data.DataError: missing file, unknown column, bad split, a binary label
            with one class in the training split or in the test split, a regression label
            that is not numeric or constant, an empty test split.
    """
    if cfg.dataset == "synthetic" and cfg.label in ("", SYNTHETIC_LABEL):
        columns = synthetic_columns(synthetic_spec(cfg))
        resolve_columns(cfg, pd.DataFrame(columns=columns), SYNTHETIC_LABEL)
        return
    if bool(cfg.active_rows_file) != bool(cfg.passive_rows_file):
        raise DataError("set both vfl.active_rows_file and vfl.passive_rows_file (each "
                        "party's aligned-<role>.csv from psfl vfl align), or neither")
    frame, default_label = load_configured_table(cfg, "active")
    if cfg.passive_rows_file:
        load_configured_table(cfg, "passive")  # its rows file is checked here too
    label, active, passive = resolve_columns(cfg, frame, default_label)
    train_idx, test_idx = train_test_indices(len(frame), test_frac=cfg.test_frac, seed=cfg.seed)
    if cfg.effective_task == "regression":
        y_test = encode_regression_labels(frame[[label]], label, train_idx, test_idx).y_test
    else:
        _, y_test, _ = encode_labels(frame[[label]], label, train_idx, test_idx)
    check_test_labels(y_test, label, task=cfg.effective_task)


def check_test_labels(y_test: np.ndarray, label: str, *, task: str = "binary") -> None:
    """The test split ``(n_test,)`` must make the test metric defined: both classes
    (binary: AUC) or at least one row (regression: RMSE).

    Raises:
        parties.data.InvalidLabel: a single class, or no test rows.
    """
    if task == "regression":
        if len(y_test) == 0:
            raise InvalidLabel(
                f"the test split of label {label!r} is empty, so test RMSE is undefined; "
                "use more rows or a larger test_frac"
            )
        return
    if len(np.unique(y_test)) < 2:
        raise InvalidLabel(
            f"the test split ({len(y_test)} rows) of label {label!r} has a single class, so "
            "test AUC is undefined; use more rows, another seed or a larger test_frac"
        )


def resolve_columns(cfg: VflConfig, frame: Any,
                    default_label: str | None) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """``(label, active_columns, passive_columns)`` from the config or the default even split.

    Raises:
        parties.data.DataError: no label known, only one party's columns given, or an
            invalid split (unknown column, overlap, label used as a feature).
    """
    label = cfg.label or default_label
    if not label:
        raise DataError(f"dataset {cfg.dataset!r} needs a label column: set vfl.label")
    if cfg.active_columns or cfg.passive_columns:
        if not (cfg.active_columns and cfg.passive_columns):
            raise DataError("set both vfl.active_columns and vfl.passive_columns, or neither")
        active, passive = tuple(cfg.active_columns), tuple(cfg.passive_columns)
    else:
        active, passive = default_split(list(frame.columns), label,
                                        n_active=cfg.active_features or None)
    validate_split(list(frame.columns), label, active, passive)
    return label, active, passive
