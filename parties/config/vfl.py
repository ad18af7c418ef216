"""The VFL run configuration: :class:`VflConfig`, the run's own keys (``[vfl]``) and its
sections (:mod:`parties.config.sections`, :mod:`parties.config.privacy`), loaded from TOML
plus ``--set``; old flat keys are refused naming their new place (:data:`MOVED_KEYS`). May
import :mod:`parties.core`, :mod:`parties.algorithms` (the algorithms' names and
schedules) and :mod:`parties.datasets` (the named datasets' tasks).

Defaults follow PubSub-VFL (arXiv 2510.12494, Sec. 5.1): ΔT0 = 5, p = q = 5,
T_ddl = 10 s, lr = 1e-3. Model sizes default to the minimal split model of the
first slice (bottom in→64→32 per party, top 64→32→1).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, ClassVar

import orjson

from parties.algorithms.schedule import ALGOS, LR_SCALINGS, effective_workers, worker_lr
from parties.algorithms.wire import resolve_wire_dtype
from parties.config.checks import check_parties
from parties.config.moved import MOVED_KEYS
from parties.config.privacy import DpSection, LabelsSection
from parties.config.sections import (DataSection, ModelSection, TimeoutsSection,
                                     WireSection, WorkersSection)
from parties.core.ids import passive_party_ids, role_of
from parties.core.tasks import TASKS
from parties.datasets import DATASETS
from pubsub.config import ConfigError, dump_toml, load_section, migrate_moved, to_mapping

#: Default ``target_metric`` per named dataset (validation AUC); others have none.
DEFAULT_TARGETS: dict[str, float] = {"bank": 0.92, "adult": 0.90}
#: values of ``vfl.active_only_baseline``
ACTIVE_ONLY_BASELINE = ("auto", "on", "off")


@dataclass(frozen=True, slots=True, kw_only=True)
class VflConfig:
    """Settings of one VFL run (every party must agree on the shared ones): the run's own
    keys, and its sections ``data``, ``model``, ``workers``, ``timeouts``, ``wire``,
    ``dp`` (each a table ``[vfl.<section>]`` in a file, ``--set vfl.<section>.<key>=v``
    on the command line).

    Attributes:
        algo: coordination algorithm: ``"pubsub"`` (PubSub-VFL), or a baseline
            ``"vfl"``, ``"vfl-ps"``, ``"avfl"``, ``"avfl-ps"`` (semantics and sources in
            :mod:`parties.runtime.party`). All share models, data and the bus.
        dataset: a named dataset (``"bank"``, ``"adult"``, ``"california"``,
            ``"synthetic"``; see :data:`parties.datasets.DATASETS`) or a path to a
            CSV/Parquet file.
        label: label column (default: the named dataset's, required for files).
        positive_class: binary task: the label value counted as positive (its string
            form, e.g. ``"high"``); empty (the default): ``yes`` / ``true`` / ``1``, else
            the larger value. The one used is printed, logged (``vfl.label_positive``) and
            recorded (``label_positive`` in metrics.json, and in the saved model); a value
            that is no class of the label is an error.
        task: ``"binary"`` or ``"regression"``; empty (the default) means the named
            dataset's own task, or ``"binary"`` for a file; contradicting a named
            dataset's task is an error. See :mod:`parties.core.tasks`.
        passive_parties: how many passive parties train with the active party (1 to
            9; docs/dev/multiparty.md). Their party ids are ``passive``, ``passive2``,
            …; ``workers.passive`` (unless ``workers.per_passive_party``), ``model.passive_bottom_hidden``
            and ``workers.passive_cpus`` apply to each.
        fuse: how the active party fuses its own bottom output with the passive
            embeddings: ``"concat"`` (the default; the top model's input is
            (1 + ``passive_parties``) × ``model.embedding_dim`` wide), ``"sum"`` or ``"mean"``
            (``model.embedding_dim`` wide; :mod:`parties.algorithms.fuse`).
        seed: seed of the split, the batch order and the model initialisation.
        epochs: training epochs.
        batch_size: B, rows per batch.
        lr: Adam learning rate (of the single worker; see ``lr_scaling``).
        lr_scaling: how a worker's rate follows the worker count under ``pubsub`` and
            ``avfl-ps``, whose averaged workers form an effective batch of w·B:
            ``"linear"`` (lr·w, the default; Goyal et al. 2017), ``"sqrt"`` (lr·√w) or
            ``"none"`` (:func:`parties.algorithms.schedule.worker_lr`). ``vfl-ps`` splits one batch
            across its pairs and keeps lr. Measured on bank, 6 epochs, ``pubsub``: test
            AUC 0.9223 unscaled, 0.9274 linear.
        eval_every: score the validation split every this many epochs (and after the
            last); on ``synthetic`` every quarter of such an epoch. The test split is
            scored once, at the end.
        val_per_epoch: validation scorings per evaluated epoch, each after its share of
            the epoch's batches (finer time-to-target readings; with DP on each is a
            release, planned and charged); 0 (default): 4 on ``synthetic``, else 1.
        sync_per_epoch: training segments per epoch; each ends with the batches in
            flight finished and every worker synced to its PS (a barrier that bounds the
            replicas' drift), and the validation scorings fall on the ends of some of
            them; 0 (default): one segment per scoring. Else a multiple of
            :attr:`evals_per_epoch` (every epoch is segmented, evaluated or not).
        val_overlap: ``pubsub`` with two or more workers on every party (default true):
            a validation point inside a training segment is scored while the segment
            trains, from each party's PS (synced every ΔT_t steps, so current within
            a few steps): the passive party publishes its embeddings of the validation
            rows when it has applied the point's share of the epoch's batches, the
            active party scores them when they arrive, and nothing drains; by default
            an epoch is then one segment (``sync_per_epoch`` still sets more). Only where
            every party is allotted a core or more
            (:func:`parties.algorithms.schedule.overlap_decision`: below one core a party's training
            already fills its quota, and its evaluation work only slows it): the active
            party decides after the handshake and tells the passive parties;
            ``metrics.json`` records it (``parties.*.val_overlap``). Else
            (false, another algorithm, a party with one worker) each point ends a
            segment: the batches in flight finish, the replicas sync, and the passive
            party waits for the active party's score before it trains on (across a
            slow link about two round trips a point). See :attr:`scores_in_flight`.
        target_metric: the validation metric that ``time_to_target_s`` waits for (AUC
            reached from below, RMSE from above, in the label's units); None = the
            dataset's default (bank 0.92, adult 0.90; none for other data).
        event_loop: ``"uvloop"`` or ``"asyncio"``.
        active_only_baseline: the active-only baseline (:mod:`parties.algorithms.baseline`): after
            training the active party fits gradient boosting and an MLP on its own columns
            and labels (same train/validation/test rows; the stronger by validation AUC),
            records it as ``active_only`` in metrics.json, and ``psfl vfl run`` warns when
            a DP or label-protected run's test AUC ends below it. ``"auto"`` (the
            default): with DP on or the labels protected (``[vfl.labels]``), binary tasks; ``"on"``: every binary run; ``"off"``: never. Costs no budget
            and sends nothing. Not a shared setting.
        data: ``[vfl.data]``, :class:`parties.config.sections.DataSection`.
        model: ``[vfl.model]``, :class:`parties.config.sections.ModelSection`.
        workers: ``[vfl.workers]``, :class:`parties.config.sections.WorkersSection`.
        timeouts: ``[vfl.timeouts]``, :class:`parties.config.sections.TimeoutsSection`.
        wire: ``[vfl.wire]``, :class:`parties.config.sections.WireSection`.
        dp: ``[vfl.dp]``, :class:`parties.config.privacy.DpSection`.
        labels: ``[vfl.labels]``, :class:`parties.config.privacy.LabelsSection` (the
            active party's own: not a shared setting).
    """

    #: the keys of the flat configuration before the sections, and where each lives now
    MOVED_KEYS: ClassVar[dict[str, str]] = MOVED_KEYS

    algo: str = "pubsub"
    dataset: str = "bank"
    label: str = ""
    positive_class: str = ""
    task: str = ""
    passive_parties: int = 1
    fuse: str = "concat"
    seed: int = 0
    epochs: int = 10
    batch_size: int = 256
    lr: float = 1e-3
    lr_scaling: str = "linear"
    eval_every: int = 1
    val_per_epoch: int = 0
    sync_per_epoch: int = 0
    val_overlap: bool = True
    target_metric: float | None = None
    event_loop: str = "uvloop"
    active_only_baseline: str = "auto"
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    workers: WorkersSection = field(default_factory=WorkersSection)
    timeouts: TimeoutsSection = field(default_factory=TimeoutsSection)
    wire: WireSection = field(default_factory=WireSection)
    dp: DpSection = field(default_factory=DpSection)
    labels: LabelsSection = field(default_factory=LabelsSection)

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"vfl.{key}", f"{why}, got {getattr(self, key)!r}")

        if self.algo not in ALGOS:
            raise bad("algo", f"must be one of {ALGOS}")
        if self.task not in ("", *TASKS):
            raise bad("task", f"must be one of {TASKS} (or empty: the dataset's own)")
        named = DATASETS.get(self.dataset)
        if named is not None and self.task and self.task != named.task:
            raise bad("task", f"dataset {self.dataset!r} is a {named.task} task; "
                              f"leave vfl.task empty or set it to {named.task!r}")
        for key in ("epochs", "batch_size", "eval_every"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        if not 0 <= self.val_per_epoch <= 1000:
            raise bad("val_per_epoch", "must be in 0 .. 1000 (0: the dataset's default)")
        if not 0 <= self.sync_per_epoch <= 10_000:
            raise bad("sync_per_epoch", "must be in 0 .. 10000 (0: one per scoring)")
        if self.sync_per_epoch and self.sync_per_epoch % self.evals_per_epoch:
            raise bad("sync_per_epoch", f"must be a multiple of the scorings per epoch "
                      f"({self.evals_per_epoch}: val_per_epoch, or the dataset's default)")
        if not 0 <= self.seed < 2**31:
            raise bad("seed", "must be in 0 .. 2**31-1")
        if not self.lr > 0:
            raise bad("lr", "must be > 0")
        if self.lr_scaling not in LR_SCALINGS:
            raise bad("lr_scaling", f"must be one of {LR_SCALINGS}")
        if self.target_metric is not None and not math.isfinite(self.target_metric):
            raise bad("target_metric", "must be a finite number")
        if self.event_loop not in ("uvloop", "asyncio"):
            raise bad("event_loop", "must be 'uvloop' or 'asyncio'")
        if self.active_only_baseline not in ACTIVE_ONLY_BASELINE:
            raise bad("active_only_baseline", f"must be one of {ACTIVE_ONLY_BASELINE}")
        check_parties(self, bad)
        if self.labels.protected and self.effective_task != "binary":
            key = "epsilon" if self.labels.epsilon is not None else "defence"
            raise ConfigError(f"vfl.labels.{key}", (
                f"label protection is analysed for binary tasks only; this run's task is "
                f"{self.effective_task!r}: leave [vfl.labels] out (got "
                f"labels.{key}={getattr(self.labels, key)!r})"))
        if self.data.stream and self.effective_task != "binary":
            raise ConfigError("vfl.data.stream", (
                f"streaming takes a binary label; this run's task is {self.effective_task!r}: "
                "a regression task runs in memory (vfl.data.stream = false)"))

    @property
    def party_ids(self) -> tuple[str, ...]:
        """Every party's id: ``active``, then ``passive``, ``passive2``, …"""
        return ("active", *passive_party_ids(self.passive_parties))

    @property
    def top_input_width(self) -> int:
        """The top model's input width: the fused width of the active party's bottom
        output and every passive embedding (``embedding_dim`` each)."""
        parts = 1 + self.passive_parties
        return parts * self.model.embedding_dim if self.fuse == "concat" else self.model.embedding_dim

    def batch_order(self, n_train: int, epoch: int) -> Any:
        """One epoch's batches (:func:`parties.algorithms.schedule.batch_order`), the same on every
        party."""
        from parties.algorithms.schedule import batch_order

        return batch_order(n_train, self.batch_size, seed=self.seed, epoch=epoch,
                           shuffle=self.data.effective_shuffle,
                           block_rows=self.data.shuffle_block_rows,
                           window_rows=self.data.shuffle_window_rows)

    def dataset_for(self, party: str) -> str:
        """``party``'s own file (``party_datasets``), else ``dataset``."""
        self.check_party(party)
        if not self.data.party_datasets:
            return self.dataset
        return self.data.party_datasets[self.party_ids.index(party)]

    @property
    def effective_wire_dtype(self) -> str:
        """The encoding of the cut-layer tensors this run sends: ``wire_dtype``, with
        ``auto`` resolved from ``link_mbps`` (:func:`parties.algorithms.wire.resolve_wire_dtype`)."""
        return resolve_wire_dtype(self.wire.dtype, link_mbps=self.wire.link_mbps,
                                  batch_size=self.batch_size,
                                  embedding_dim=self.model.embedding_dim)

    @property
    def effective_target(self) -> float | None:
        """``target_metric`` if set, else the named dataset's default (see
        :data:`DEFAULT_TARGETS`), else None."""
        if self.target_metric is not None:
            return self.target_metric
        return DEFAULT_TARGETS.get(self.dataset)

    @property
    def segments_per_epoch(self) -> int:
        """Training segments per epoch (each ends in a drain and PS sync):
        ``sync_per_epoch``, or by default :attr:`evals_per_epoch` (1 when
        :attr:`scores_in_flight`)."""
        return self.sync_per_epoch or (1 if self.scores_in_flight else self.evals_per_epoch)

    @property
    def scores_in_flight(self) -> bool:
        """Validation points inside a segment are scored while it trains
        (:attr:`val_overlap` under ``pubsub`` with two or more workers on every party:
        each PS is then synced by its workers every ΔT_t steps; a one-worker party's PS
        is current only after a segment's flush)."""
        return (self.val_overlap and self.algo == "pubsub"
                and all(self.workers_for(p) >= 2 for p in self.party_ids))

    @property
    def evals_per_epoch(self) -> int:
        """Validation scorings per evaluated epoch: ``val_per_epoch``, or by default 4
        (quarter epochs) on ``synthetic``, else 1."""
        if self.val_per_epoch:
            return self.val_per_epoch
        return 4 if self.dataset == "synthetic" else 1

    def workers_for_party(self, party: str) -> int:
        """The worker count ``party`` is configured with (before the algorithm's rule of
        :meth:`workers_for`): ``w_active`` for the active party; for a passive party its
        entry of ``passive_party_workers``, else ``w_passive``.

        ``party``: a party id of this run (``active``, ``passive``, ``passive2`` …; the
        role ``passive`` is the first passive party's id).

        Raises:
            ValueError: not a party id of this run.
        """
        self.check_party(party)
        if party == "active":
            return self.workers.active
        if not self.workers.per_passive_party:
            return self.workers.passive
        return self.workers.per_passive_party[self.party_ids.index(party) - 1]

    def check_party(self, party: str) -> None:
        """Raise ValueError naming ``party`` and this run's party ids unless it is one."""
        if party not in self.party_ids:
            raise ValueError(f"party {party!r} is not in this run (its parties: "
                             f"{', '.join(self.party_ids)})")

    @property
    def passive_workers(self) -> tuple[int, ...]:
        """Every passive party's configured worker count, in party order."""
        return tuple(self.workers_for_party(p) for p in self.party_ids[1:])

    def workers_for(self, party: str) -> int:
        """The workers ``party`` (a party id, or a role: ``passive`` is the first
        passive party) runs under ``algo``: its :meth:`workers_for_party` count through
        :func:`parties.algorithms.schedule.effective_workers` (``vfl``/``avfl``: 1; ``vfl-ps``: the
        pairs, the same on every party)."""
        return effective_workers(self.algo, role_of(party), *self._pair(party))

    def ps_update_for(self, party: str) -> str:
        """How ``party``'s parameter server (a party id or role, as :meth:`workers_for`)
        combines its workers: ``ps_update`` under ``pubsub`` and ``avfl-ps`` with two or
        more workers, else ``"average"`` (one worker needs no combining; ``vfl-ps``
        aggregates every batch)."""
        if self.algo in ("pubsub", "avfl-ps") and self.workers_for(party) > 1:
            return self.workers.ps_update
        return "average"

    def shares_top(self) -> bool:
        """Whether the active party's workers share one top model at its PS
        (``top_update = "shared"``): under ``pubsub`` with two or more active workers
        averaged by their PS (``ps_update = "average"``); otherwise each worker's replica
        holds its own top."""
        return (self.workers.top_update == "shared" and self.algo == "pubsub"
                and self.workers_for("active") > 1 and self.ps_update_for("active") == "average")

    def worker_lr(self, party: str) -> float:
        """The Adam learning rate of one of ``party``'s workers (a party id or role, as
        :meth:`workers_for`; ``lr`` scaled by ``lr_scaling`` for the party's own worker
        count; see :func:`parties.algorithms.schedule.worker_lr`; unscaled with gradient push, where
        the server applies every batch's step)."""
        base = self.dp.lr if self.dp.enabled else self.lr
        if self.ps_update_for(party) == "gradient":
            return base
        return worker_lr(self.algo, role_of(party), base, *self._pair(party),
                         self.lr_scaling)

    def _pair(self, party: str) -> tuple[int, int]:
        """``(w_active, w_passive)`` as :mod:`parties.algorithms.schedule` sees them for ``party``:
        a passive party's own count, or for the active party the first passive party's
        (all equal under ``vfl-ps``, the one algorithm that pairs them)."""
        passive = party if party != "active" else self.party_ids[1]
        return self.workers.active, self.workers_for_party(passive)

    def rows_file(self, party: str) -> str:
        """``party``'s aligned-rows file (``psfl vfl align`` output); "" = all rows.

        ``party``: a party id of this run (``active``, ``passive``, ``passive2`` …; with
        one passive party the ids are the roles).

        Raises:
            ValueError: not a party id of this run.
        """
        self.check_party(party)
        if party == "active":
            return self.data.active_rows_file
        if self.passive_parties == 1:
            return self.data.passive_rows_file
        if not self.data.passive_party_rows_files:
            return ""
        return self.data.passive_party_rows_files[self.party_ids.index(party) - 1]

    @property
    def rows_files(self) -> dict[str, str]:
        """Every party's aligned-rows file by party id ("" = all rows)."""
        return {p: self.rows_file(p) for p in self.party_ids}

    @property
    def effective_task(self) -> str:
        """The run's task: ``vfl.task`` if set, else the named dataset's, else ``"binary"``."""
        if self.task:
            return self.task
        named = DATASETS.get(self.dataset)
        return named.task if named is not None else "binary"

    def shared_settings(self, n_rows: int, rows_digest: str = "") -> dict[str, Any]:
        """The settings both parties must agree on, plus the table's row count, and their
        ``digest``. Two parties whose digests differ refuse to train together.

        ``rows_digest``: with aligned rows (``active_rows_file`` and the passive
        parties' files), a
        keyed hash of the ordered shared IDs (:func:`parties.data.aligned_ids_digest`):
        both parties know those IDs, so it reveals nothing new, and two parties whose
        rows files list different records, or the same in another order, refuse to train.

        For the ``synthetic`` dataset, which each party generates itself, they also
        include the generator's parameters and the scikit-learn and NumPy versions
        (the generated table is only guaranteed identical under the same versions).
        """
        shared: dict[str, Any] = {
            "algo": self.algo, "n_rows": n_rows, "test_frac": self.data.test_frac, "seed": self.seed,
            "epochs": self.epochs, "batch_size": self.batch_size,
            "embedding_dim": self.model.embedding_dim, "eval_every": self.eval_every,
            "task": self.effective_task,
        }
        if self.val_per_epoch:
            shared["val_per_epoch"] = self.val_per_epoch
        if self.data.effective_shuffle != "full":
            shared["shuffle"] = [self.data.effective_shuffle, self.data.shuffle_block_rows,
                                 self.data.shuffle_window_rows]
        if self.data.effective_row_split == "hash":  # and the scored test subset
            shared["row_split"] = {"split": "hash", "eval_max_rows": self.data.stream_eval_max_rows}
        if self.sync_per_epoch:
            shared["sync_per_epoch"] = self.sync_per_epoch
        if self.scores_in_flight:  # the parties must agree on how a point is scored
            shared["val_overlap"] = True
        if self.algo == "vfl-ps":
            shared["pairs"] = self.workers_for("active")
        if self.passive_parties > 1 or self.fuse != "concat":
            shared["passive_parties"] = self.passive_parties
            shared["fuse"] = self.fuse
        if self.workers.per_passive_party:
            shared["passive_party_workers"] = list(self.workers.per_passive_party)
        if rows_digest:
            shared["aligned_ids"] = rows_digest
        if self.data.join_key:
            shared["join_key"] = self.data.join_key
        if self.dataset == "synthetic":
            shared["synthetic"] = {
                "features": self.data.synthetic_features,
                "informative": self.data.synthetic_informative,
                "seed": self.data.synthetic_seed,
                "generator": f"scikit-learn {_version('scikit-learn')}, numpy {_version('numpy')}",
            }
        shared["digest"] = hashlib.sha256(
            orjson.dumps(shared, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
        return shared


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def load_vfl_config(
    path: str | Path | None = None,
    sets: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> VflConfig:
    """Effective config: defaults, then the TOML file's ``[vfl]`` table, then ``--set`` items.

    ``--set`` keys may be written ``vfl.epochs=3`` or just ``epochs=3``.
    ``extra`` (from dedicated CLI flags) is applied last.

    Raises:
        ConfigError: unknown section or key, wrong type, or an invalid value.
    """
    return load_section(VflConfig, "vfl", path, sets, extra)


def dump_vfl_config(cfg: VflConfig) -> str:
    """The config as TOML text (a ``[vfl]`` table) that :func:`load_vfl_config` reads back."""
    return dump_toml({"vfl": to_mapping(cfg)})


def vfl_config(settings: Mapping[str, Any]) -> VflConfig:
    """A configuration from a mapping of its keys: the run's own keys, each section as a
    nested mapping or as dotted keys (``{"epochs": 3, "dp.mu": 8, "workers": {"active":
    4}}``). An old flat key is refused, naming its new place.

    Raises:
        ConfigError: unknown, moved or invalid key.
    """
    from pubsub.config import from_mapping

    return from_mapping(VflConfig, settings, section="vfl")


def load_saved_config(path: str | Path) -> VflConfig:
    """The ``config.toml`` of a saved model or run directory (a ``[vfl]`` table), migrated
    when written before the sections (:func:`migrate_saved`).

    Raises:
        ConfigError: unreadable TOML, an unknown section or key, or an invalid value.
    """
    from pubsub.config import load_toml

    data = load_toml(path)
    unknown = set(data) - {"vfl"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], f"unknown section in {str(path)!r} (expected [vfl])")
    return vfl_config_from_saved(data.get("vfl", {}))


def migrate_saved(table: Mapping[str, Any]) -> dict[str, Any]:
    """A ``[vfl]`` table read back from a run directory or a saved model: one written
    before the sections (flat keys such as ``dp_mu``) is migrated to its sections
    (:data:`MOVED_KEYS`); one written after is returned as it is. A user's own file is
    never migrated: its old keys are refused, naming their new places."""
    return migrate_moved(table, MOVED_KEYS)


def vfl_config_from_saved(table: Mapping[str, Any]) -> VflConfig:
    """The configuration of a saved run or model (:func:`migrate_saved`, then checked).

    Raises:
        ConfigError: a key unknown in either layout, or an invalid value.
    """
    from pubsub.config import from_mapping

    return from_mapping(VflConfig, migrate_saved(table), section="vfl")


