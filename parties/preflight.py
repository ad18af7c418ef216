"""Data checks that need no torch: run by the launcher before training starts."""

from __future__ import annotations

from typing import Any

import numpy as np

from parties.config import VflConfig
from parties.data import (
    DataError,
    InvalidLabel,
    default_split,
    encode_labels,
    load_table,
    train_test_indices,
    validate_split,
)


def preflight(cfg: VflConfig) -> None:
    """Check the data and the column split before any process starts (fast, clear errors).

    Raises:
        parties.data.DataError: missing file, unknown column, bad split, a label with one
            class in the training split or in the test split.
    """
    frame, default_label = load_table(cfg.dataset)
    label, active, passive = resolve_columns(cfg, frame, default_label)
    train_idx, test_idx = train_test_indices(len(frame), test_frac=cfg.test_frac, seed=cfg.seed)
    _, y_test, _ = encode_labels(frame[[label]], label, train_idx, test_idx)
    check_test_labels(y_test, label)


def check_test_labels(y_test: np.ndarray, label: str) -> None:
    """Both classes must occur in the test split ``(n_test,)``, or test AUC is undefined.

    Raises:
        parties.data.InvalidLabel: a single class.
    """
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
        active, passive = default_split(list(frame.columns), label)
    validate_split(list(frame.columns), label, active, passive)
    return label, active, passive
