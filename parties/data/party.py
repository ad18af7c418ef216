"""One party's view of the data: its columns (and the active party's labels) loaded from
its own file or the shared table, split into training, validation and test rows, and
encoded (fitted on the training rows, or from the public schema under DP; streamed rows
stay on disk).

Owns: :class:`PartyData` and :func:`load_party_data`. May import the configuration, the
data layer and the schedules' row splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from parties.config import VflConfig
from parties.data import encode_labels, encode_regression_labels, train_test_indices
from parties.core.ids import role_of
from parties.data.preflight import (check_test_labels, encode_features, load_configured_table,
                               resolve_party_columns)
from parties.algorithms.schedule import validation_split

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartyData:
    """One party's view of the data after encoding.

    Attributes:
        x_train / x_val / x_test: ``(n, d)`` float32 features of this party's columns:
            the rows that train, the scored validation rows (held out of the training
            split, see :func:`parties.algorithms.schedule.validation_split`), the test rows.
        y_train / y_val / y_test: ``(n,)`` float32 labels (active party only, else None):
            0/1 (binary task); for regression ``y_train`` is standardised and ``y_val``,
            ``y_test`` are in the label's original units.
        columns: this party's raw feature columns.
        n_rows: rows in the whole (aligned) table.
        dataset: dataset name or path.
        task: ``"binary"`` or ``"regression"``.
        label_mean / label_std: regression only: the training labels' mean and standard
            deviation, original units (standardised prediction p means ``p·std + mean``).
        encoder: the fitted feature encoder (:class:`parties.data.encoders.FittedEncoder`), or
            None when the features come from the public schema (passive party, DP on).
        label / label_positive: active party only: the label column and (binary task)
            its positive class as a string (saved with the model).
        cache_dir: streaming (``vfl.data.stream``): the encoded cache; ``x_train`` and
            ``y_train`` are then :class:`parties.data.rowstore.DiskRows` reading it.
    """

    x_train: np.ndarray
    x_test: np.ndarray
    y_train: np.ndarray | None
    y_test: np.ndarray | None
    x_val: np.ndarray
    y_val: np.ndarray | None
    columns: tuple[str, ...]
    n_rows: int
    dataset: str
    task: str = "binary"
    label_mean: float = 0.0
    label_std: float = 1.0
    encoder: Any = None
    label: str = ""
    label_positive: str = ""
    cache_dir: str = ""


def load_party_data(cfg: VflConfig, role: str) -> PartyData:
    """Load and encode this party's columns (and labels, for the active party).

    ``role``: the party's id (``active``, ``passive``, ``passive2`` …; in a two-party run
    the ids are the roles).

    Raises:
        parties.data.DataError: missing file, unknown column, bad split, a label unfit for
            the task (one class; not numeric or constant for regression).
        ValueError: ``role`` is not one of the run's party ids.
    """
    party = role
    cfg.check_party(party)
    role = role_of(party)
    task = cfg.effective_task
    if cfg.data.stream:
        return _load_streamed(cfg, party)
    frame, default_label = load_configured_table(cfg, party)  # the party's own rows file
    if cfg.data.party_datasets or cfg.data.join_key:  # the party's own file: its columns
        # (and the active party's label); never the join key
        from parties.data.stream import own_columns

        label, groups = cfg.label, {party: own_columns(cfg, party, list(frame.columns))}
    else:
        label, groups = resolve_party_columns(cfg, frame, default_label)
    if cfg.data.effective_row_split == "hash":  # the rows a streamed run would use
        from parties.data.stream import stream_split

        train_idx, val_idx, test_idx = stream_split(cfg, len(frame))
    else:
        all_train, test_idx = train_test_indices(len(frame), test_frac=cfg.data.test_frac,
                                                 seed=cfg.seed)
        fit, val = validation_split(len(all_train), seed=cfg.seed)
        train_idx, val_idx = all_train[fit], all_train[val]
    n_val = len(val_idx)
    held = np.concatenate([val_idx, test_idx])  # encoded with the training rows' statistics
    mine = tuple(groups[party])
    # DP on, passive party: public-schema encoding, nothing fitted on the rows
    feats = encode_features(cfg, role, frame, mine, train_idx, held)
    x_val, x_test = feats.x_test[:n_val], feats.x_test[n_val:]
    y_train = y_test = y_val = None
    mean, std = 0.0, 1.0
    pos = ""
    if role == "active":
        if task == "regression":
            reg = encode_regression_labels(frame, label, train_idx, held)
            y_train, y_held, mean, std = reg.y_train, reg.y_test, reg.mean, reg.std
        else:
            y_train, y_held, pos = encode_labels(frame, label, train_idx, held,
                                                 positive=cfg.positive_class)
        y_val, y_test = y_held[:n_val], y_held[n_val:]
        check_test_labels(y_test, label, task=task)
    log.info("vfl.data_loaded", party=party, dataset=cfg.dataset, task=task, n_rows=len(frame),
             n_train=len(train_idx), n_val=n_val, n_test=len(test_idx), columns=len(mine),
             features=int(feats.x_train.shape[1]),
             hashed=len(getattr(feats.encoder, "hashed_buckets", ())),
             dropped=list(getattr(feats.encoder, "dropped", ())))
    if pos:
        log.info("vfl.label_positive", party=party, label=label, positive=pos)
    return PartyData(
        x_train=feats.x_train, x_test=x_test, y_train=y_train, y_test=y_test,
        x_val=x_val, y_val=y_val,
        columns=mine, n_rows=len(frame), dataset=cfg.dataset, task=task,
        label_mean=mean, label_std=std, encoder=feats.encoder,
        label=label if role == "active" else "", label_positive=pos,
    )


def _load_streamed(cfg: VflConfig, party: str) -> PartyData:
    """:func:`load_party_data` with ``vfl.data.stream``: :func:`parties.data.stream.load_streamed`
    (the training rows stay on disk, :class:`parties.data.rowstore.DiskRows`)."""
    from parties.data.stream import load_streamed

    got = load_streamed(cfg, party, log=log)
    rows, enc = got.rows, got.encoder
    log.info("vfl.data_loaded", party=party, dataset=cfg.dataset_for(party), task="binary",
             n_rows=rows.n_rows, n_train=rows.x_train.n, n_val=len(rows.x_val),
             n_test=len(rows.x_test), columns=len(got.columns), features=int(enc.width),
             hashed=len(getattr(enc, "hashed_buckets", ())),
             dropped=list(getattr(enc, "dropped", ())), streamed=True,
             cache=str(rows.cache_dir))
    if got.positive:
        log.info("vfl.label_positive", party=party, label=got.label, positive=got.positive)
        check_test_labels(rows.y_test, got.label, task="binary")
    return PartyData(
        x_train=rows.x_train, x_test=rows.x_test, y_train=rows.y_train, y_test=rows.y_test,
        x_val=rows.x_val, y_val=rows.y_val, columns=got.columns, n_rows=rows.n_rows,
        dataset=cfg.dataset_for(party), task="binary", encoder=enc, label=got.label,
        label_positive=got.positive, cache_dir=str(rows.cache_dir))


__all__ = ["PartyData", "load_party_data"]
