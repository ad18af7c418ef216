"""Data checks that need no torch: run by the launcher before training starts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from parties.config import VflConfig
from parties.data import (
    SYNTHETIC_LABEL,
    DataError,
    EmptyColumn,
    InvalidLabel,
    PartyFeatures,
    select_rows,
    synthetic_spec,
    default_split_n,
    encode_labels,
    encode_party_features,
    encode_regression_labels,
    load_table,
    synthetic_columns,
    train_test_indices,
    validate_split_n,
)
from parties.data.schema import SchemaEncoder, dp_schema
from parties.data.treatments import policy_of


def load_configured_table(cfg: VflConfig,
                          party: str | None = None) -> tuple[pd.DataFrame, str | None]:
    """:func:`parties.data.load_table` of ``cfg.dataset`` (with the synthetic parameters),
    restricted to ``party``'s aligned rows when its rows file is set
    (:meth:`VflConfig.rows_file`, :func:`parties.data.select_rows`). ``party``: a party
    id of the run (``active``, ``passive``, ``passive2`` …).

    Raises:
        parties.data.DataError: missing or unreadable file, or a bad aligned-rows file.
    """
    frame, label = load_table(cfg.dataset_for(party) if party is not None else cfg.dataset,
                              synthetic=synthetic_spec(cfg),
                              max_line_bytes=cfg.data.max_line_bytes,
                              max_columns=cfg.data.max_columns)
    if party is not None and cfg.rows_file(party):
        frame = select_rows(frame, cfg.rows_file(party))
    return frame, label


def preflight(cfg: VflConfig) -> None:
    """Check the data and the column split before any process starts (fast, clear errors).

    The ``synthetic`` dataset with its own label is not generated here (its columns
    are known and its classes balanced by construction), only the column split is
    checked.

    Raises:
        parties.data.DataError: missing file, unknown column, bad split, a named feature
            column with no value (:class:`parties.data.EmptyColumn`), a binary label
            with one class in the training split or in the test split, a regression label
            that is not numeric or constant, an empty test split; a line or a column count
            past its bound (:class:`parties.data.LineTooLong`,
            :class:`parties.data.TooManyColumns`).
        pubsub.config.ConfigError: more workers than this machine's cores run, or a run
            needing more memory than it has (:mod:`parties.data.limits`: the Python API's
            path; ``psfl vfl run`` checks it before anything starts).
    """
    from parties.data.limits import check_memory, check_workers, estimate_memory

    check_workers(cfg)
    if cfg.data.stream or cfg.data.party_datasets:  # footers only: each party's file, its columns,
        from parties.data.stream import preflight_streamed  # aligned row counts

        preflight_streamed(cfg)
        return
    if cfg.dataset == "synthetic" and cfg.label in ("", SYNTHETIC_LABEL):
        columns = synthetic_columns(synthetic_spec(cfg))
        _, groups = resolve_party_columns(cfg, pd.DataFrame(columns=columns), SYNTHETIC_LABEL)
        if cfg.dp.enabled:
            for party in cfg.party_ids[1:]:
                dp_schema(cfg, groups[party])
        return
    files = cfg.rows_files
    if any(files.values()) and not all(files.values()):
        if cfg.passive_parties == 1:
            raise DataError("set both vfl.data.active_rows_file and vfl.data.passive_rows_file (each "
                            "party's aligned-<role>.csv from psfl vfl align), or neither")
        raise DataError("set vfl.data.active_rows_file and vfl.data.passive_party_rows_files (each "
                        "party's aligned-<party>.csv from psfl vfl align), or neither")
    frame, default_label = load_configured_table(cfg, "active")
    for party in cfg.party_ids[1:]:
        if files[party]:
            load_configured_table(cfg, party)  # its rows file is checked here too
    label, groups = resolve_party_columns(cfg, frame, default_label)
    check_memory(estimate_memory(cfg, columns={p: len(c) for p, c in groups.items()},
                                 rows=len(frame), table_columns=frame.shape[1]))
    from parties.data.launchcheck import named_columns

    for party, cols in named_columns(cfg).items():  # a named column with no value at all
        for c in cols:
            if frame[c].isna().all():
                raise EmptyColumn(c, party, cfg.dataset)
    if cfg.dp.enabled:  # refuse before any process starts
        for party in cfg.party_ids[1:]:
            dp_schema(cfg, groups[party])
    train_idx, test_idx = train_test_indices(len(frame), test_frac=cfg.data.test_frac, seed=cfg.seed)
    if cfg.effective_task == "regression":
        y_test = encode_regression_labels(frame[[label]], label, train_idx, test_idx).y_test
    else:
        _, y_test, _ = encode_labels(frame[[label]], label, train_idx, test_idx,
                                     positive=cfg.positive_class)
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
    """``(label, active_columns, passive_columns)`` from the config or the default even split
    (a two-party run; :func:`resolve_party_columns` for any number of parties).

    Raises:
        parties.data.DataError: no label known, only one party's columns given, or an
            invalid split (unknown column, overlap, label used as a feature).
    """
    label, groups = resolve_party_columns(cfg, frame, default_label)
    if len(groups) != 2:
        raise ValueError(f"resolve_columns is for two parties; this run has {len(groups)}")
    return label, groups["active"], groups["passive"]


def resolve_party_columns(cfg: VflConfig, frame: Any, default_label: str | None
                          ) -> tuple[str, dict[str, tuple[str, ...]]]:
    """``(label, {party id: its feature columns})`` from the config's column lists or the
    default split (:func:`parties.data.default_split_n`), every party of
    ``cfg.party_ids`` in order.

    Raises:
        parties.data.DataError: no label known, only one party's columns given, or an
            invalid split (unknown column, a column of two parties (both named), the
            label used as a feature).
    """
    label = cfg.label or default_label
    if not label:
        raise DataError(f"dataset {cfg.dataset!r} needs a label column: set vfl.label")
    parties = cfg.party_ids
    if cfg.passive_parties > 1 and cfg.data.passive_party_columns:
        groups = {"active": tuple(cfg.data.active_columns)}
        groups.update(zip(parties[1:], (tuple(c) for c in cfg.data.passive_party_columns)))
    elif cfg.passive_parties == 1 and (cfg.data.active_columns or cfg.data.passive_columns):
        if not (cfg.data.active_columns and cfg.data.passive_columns):
            raise DataError("set both vfl.data.active_columns and vfl.data.passive_columns, or neither")
        groups = {"active": tuple(cfg.data.active_columns), "passive": tuple(cfg.data.passive_columns)}
    else:
        groups = default_split_n([c for c in frame.columns if c != cfg.data.join_key],
                                 label, parties,
                                 n_active=cfg.data.active_features or None)
    validate_split_n(list(frame.columns), label, groups)
    return label, groups


def encode_features(cfg: VflConfig, role: str, frame: pd.DataFrame, columns: Sequence[str],
                    train_idx: np.ndarray, held_idx: np.ndarray) -> PartyFeatures:
    """Encode ``role``'s ``columns`` for the rows ``train_idx`` and ``held_idx``.

    With DP on, the passive party's features come from its public schema
    (:func:`dp_schema`; :class:`parties.data.schema.SchemaEncoder`: each row is a function of
    that row and the schema only, the width a function of the schema only, non-finite
    values become the declared fill). Otherwise (DP off, or the active party):
    :func:`parties.data.encode_party_features`, fitted on the training rows, unchanged.

    Raises:
        ConfigError, parties.data.schema.SchemaError: see :func:`dp_schema`.
        parties.data.DataError: see :func:`parties.data.encode_party_features`.
    """
    if role != "passive" or not cfg.dp.enabled:
        return encode_party_features(frame, columns, train_idx, held_idx,
                                     policy=policy_of(cfg))
    enc = SchemaEncoder(dp_schema(cfg, columns))
    return PartyFeatures(x_train=enc.transform(frame.iloc[np.asarray(train_idx)]),
                         x_test=enc.transform(frame.iloc[np.asarray(held_idx)]),
                         feature_names=enc.feature_names)


def feature_widths(cfg: VflConfig) -> dict[str, int]:
    """Each party's encoded input width (by party id), without encoding the table: the
    public schema's
    width (passive party, DP on), else one column per numeric feature and one per
    category seen in the training rows (missing values are a category), as
    :func:`parties.data.encode_party_features` fits them.

    Raises:
        parties.data.DataError, ConfigError, parties.data.schema.SchemaError: as
            :func:`preflight`.
    """
    from parties.algorithms.schedule import validation_split

    dp = cfg.dp.enabled
    if cfg.data.stream or cfg.data.party_datasets:
        from parties.data.stream import stream_feature_widths

        return stream_feature_widths(cfg)
    if cfg.dataset == "synthetic" and cfg.label in ("", SYNTHETIC_LABEL):
        frame = pd.DataFrame(columns=synthetic_columns(synthetic_spec(cfg)))
        _, groups = resolve_party_columns(cfg, frame, SYNTHETIC_LABEL)
        return {p: (dp_schema(cfg, cols).width if dp and p != "active" else len(cols))
                for p, cols in groups.items()}
    frame, default_label = load_configured_table(cfg, "active")
    _, groups = resolve_party_columns(cfg, frame, default_label)
    all_train, _ = train_test_indices(len(frame), test_frac=cfg.data.test_frac, seed=cfg.seed)
    fit, _ = validation_split(len(all_train), seed=cfg.seed)
    rows = frame.iloc[all_train[fit]]

    policy = policy_of(cfg)

    def width(cols: Sequence[str]) -> int:
        from parties.data.treatments import IdColumnRefused, classify_columns, encoded_width

        try:
            return encoded_width(classify_columns(rows, cols, policy))
        except IdColumnRefused as exc:
            raise DataError(str(exc)) from None

    return {p: (dp_schema(cfg, cols).width if dp and p != "active" else width(cols))
            for p, cols in groups.items()}
