"""The Python API of PubSub-VFL: describe a job, train it in this process or across
processes, keep the trained model, predict with it.

::

    from sim.api import VflJob, train, predict

    def bottom(d_in: int, d_out: int) -> torch.nn.Module:   # each party's bottom model
        return torch.nn.Sequential(torch.nn.Linear(d_in, 64), torch.nn.BatchNorm1d(64),
                                   torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                   torch.nn.Linear(64, d_out))

    job = VflJob(data=frame, label="y", passive_columns=["age", "job"], bottom=bottom,
                 config={"epochs": 3})
    result = train(job, "runs/mine")                       # both parties in this process
    result = train(job, "runs/mine", transport="broker")   # broker + two party processes
    print(result.metric_name, result.metric)
    scored = predict("runs/mine", "runs/mine/predict")      # the saved model, jointly

**What each party sees.** A job holds one table split by columns: the passive party's
columns, the active party's columns and the label. This simulates vertical partitioning
on one machine: each party encodes and trains on its own columns only, and only
embeddings and gradients cross the bus. Parties on different hosts, each with its own
file, run ``psfl vfl party`` after ``psfl vfl align`` (docs/tutorials/across-hosts.md).

**Models.** ``bottom``, ``passive_bottom`` and ``top`` are callables ``(d_in, d_out) ->
torch.nn.Module`` (bottom: ``d_out = embedding_dim``; top: ``d_in`` the fused width,
``2·embedding_dim`` for two parties' concatenation, ``d_out = 1``), or a built-in spec (``"mlp"``, ``"resnet"``, ``"pkg.module:callable"``).
``optimizer`` is ``(parameters, lr) -> torch.optim.Optimizer`` (default Adam) and
``loss`` is ``(task) -> nn.Module`` called on ``(logits (B,), labels (B,))`` (default
BCE-with-logits or MSE). Each worker trains its own replica built by the factory and
syncs parameters and floating-point buffers (BatchNorm running statistics) with the
party's parameter server as a flat vector; the server's copy scores in eval mode
(docs/tutorials/your-own-model.md). For worker or party processes (``vfl.workers.mode = "process"``,
``transport="broker"``) the callables must be picklable: module-level in an importable
module or in the main script, which then needs the ``if __name__ == "__main__":`` guard
(Python's ``multiprocessing`` re-imports it).

**Errors before anything starts.** A bad job raises a typed error naming the value
before any process starts: :class:`JobError` (a field of the job), :class:`parties.data.
DataError` (a named column missing from the data, a label unfit for the task),
:class:`parties.models.zoo.ModelSpecError` (a factory that raises, a bottom whose output width
is not ``embedding_dim``, a top that rejects ``2·embedding_dim``), :class:`pubsub.config.
ConfigError` (an unknown or invalid setting), :class:`parties.privacy.dpsgd.DpIncompatibleModel`
(DP on and BatchNorm in the passive bottom: set ``dp_batchnorm = "groupnorm"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from parties.config import VflConfig
from parties.datasets import DATASETS
from parties.data import DataError, UnknownColumn
from pubsub.config import (ConfigError, deep_merge, expand_dotted, from_mapping, refuse_moved,
                           to_mapping)

if TYPE_CHECKING:
    import pandas as pd

    from parties.runtime.saved import SavedPart
    from parties.models.zoo import LossFn, ModelFactory, ModuleFn, OptimizerFn

    from sim.launch.predict import PredictResult

#: where a job's in-memory table is written in the run directory (both transports read it)
TABLE_FILE = "data/table.parquet"

Transport = Literal["memory", "broker"]


class JobError(ConfigError):
    """A field of a :class:`VflJob` is invalid (``key`` names it, e.g. ``job.data``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VflJob:
    """A VFL job: the data, how it is split among the parties, the models and the
    settings.

    Attributes:
        data: a bundled dataset name (``"bank"``, ``"adult"``, ``"california"``,
            ``"synthetic"``), a ``.csv``/``.csv.gz``/``.parquet`` path, a
            ``pandas.DataFrame`` or a 2-D ``numpy.ndarray`` (columns named by
            ``columns``, default ``c0``, ``c1``, ...).
        label: the label column (default: the bundled dataset's).
        active_columns / passive_columns: each party's feature columns (both or neither;
            neither: the default even split, ``vfl.data.active_features``).
        passive_party_columns: with several passive parties (``config``'s
            ``passive_parties``), each one's feature columns in party order (with
            ``active_columns``; docs/tutorials/several-parties.md).
        columns: the column names of an ndarray ``data``.
        bottom: the bottom models (both parties, unless ``passive_bottom``): a callable
            ``(d_in, d_out) -> nn.Module`` or a spec string; None: ``config``'s
            ``model.bottom`` (default ``"mlp"``).
        passive_bottom: the passive party's bottom, when it differs.
        top: the top model, a callable or spec; None: ``config``'s ``model.top``.
        optimizer: ``(parameters, lr) -> torch.optim.Optimizer``; None: Adam.
        loss: ``(task) -> nn.Module``; None: BCE-with-logits (binary), MSE (regression).
        config: every other setting (a :class:`parties.config.VflConfig` or a mapping of
            its keys, sections as nested mappings or dotted keys, e.g.
            ``{"epochs": 3, "algo": "vfl-ps", "dp.epsilon": 8}``; docs/reference/config.md
            lists them).
    """

    data: Any = "bank"
    label: str = ""
    active_columns: Sequence[str] = ()
    passive_columns: Sequence[str] = ()
    passive_party_columns: Sequence[Sequence[str]] = ()
    columns: Sequence[str] = ()
    bottom: ModuleFn | str | None = None
    passive_bottom: ModuleFn | None = None
    top: ModuleFn | str | None = None
    optimizer: OptimizerFn | None = None
    loss: LossFn | None = None
    config: VflConfig | Mapping[str, Any] | None = field(default=None)

    def resolve(self, out: str | Path) -> tuple[VflConfig, ModelFactory]:
        """The run's config and model factory; an in-memory table is written to
        ``out/data/table.parquet`` (:data:`TABLE_FILE`).

        Raises:
            JobError: a field of the job is invalid (named).
            parties.data.DataError: a named column is not in the data.
            pubsub.config.ConfigError: an unknown or invalid setting.
        """
        from parties.models.zoo import ModelFactory

        base = self._base_config()
        settings: dict[str, Any] = {}
        for name in ("active_columns", "passive_columns", "passive_party_columns"):
            if getattr(self, name) and getattr(base.data, name):
                raise JobError(f"job.{name}", f"given both as the job's {name} and as the "
                               f"config's data.{name}: give it once")
        if self.label:
            settings["label"] = str(self.label)
        if self.passive_party_columns:
            if self.passive_columns:
                raise JobError("job.passive_columns", "give passive_party_columns (several "
                               "passive parties) or passive_columns (one), not both")
            if not self.active_columns:
                raise JobError("job.active_columns", "give active_columns with "
                               "passive_party_columns")
            if any(isinstance(cols, str) for cols in self.passive_party_columns):
                raise JobError("job.passive_party_columns", "expected one list of column "
                               "names per passive party, e.g. [['a', 'b'], ['c']]")
            settings["data.active_columns"] = tuple(str(c) for c in self.active_columns)
            settings["data.passive_party_columns"] = tuple(
                tuple(str(c) for c in cols) for cols in self.passive_party_columns)
            if base.passive_parties == 1:  # else the config's count (a mismatch: named)
                settings["passive_parties"] = len(self.passive_party_columns)
        elif bool(self.active_columns) != bool(self.passive_columns):
            raise JobError("job.passive_columns" if not self.passive_columns else
                           "job.active_columns",
                           "give both active_columns and passive_columns, or neither")
        elif self.active_columns:
            settings["data.active_columns"] = tuple(str(c) for c in self.active_columns)
            settings["data.passive_columns"] = tuple(str(c) for c in self.passive_columns)
        settings["dataset"] = self._dataset(Path(out), base)
        for key, spec in (("bottom", self.bottom), ("top", self.top)):
            if isinstance(spec, str):
                settings[f"model.{key}"] = spec
            elif spec is not None and not callable(spec):
                raise JobError(f"job.{key}",
                               f"expected a callable (d_in, d_out) -> nn.Module or a model "
                               f"spec string, got {type(spec).__name__}")
        for name in ("passive_bottom", "optimizer", "loss"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise JobError(f"job.{name}", f"expected a callable, got "
                               f"{type(value).__name__}")
        cfg = from_mapping(VflConfig, deep_merge(to_mapping(base), expand_dotted(settings)))
        factory = ModelFactory(
            cfg, bottom_fn=self.bottom if callable(self.bottom) else None,
            top_fn=self.top if callable(self.top) else None,
            passive_bottom_fn=self.passive_bottom, optimizer_fn=self.optimizer,
            loss_fn=self.loss)
        return cfg, factory

    def _base_config(self) -> VflConfig:
        if self.config is None:
            return VflConfig()
        if isinstance(self.config, VflConfig):
            return self.config
        if isinstance(self.config, Mapping):
            # ``vfl.dp.mu`` as on the command line: the section's name is optional
            table = expand_dotted({(k[4:] if isinstance(k, str) and k.startswith("vfl.")
                                    else k): v for k, v in self.config.items()})
            if "dataset" not in table:
                # the job's data replaces it (_dataset): check the settings against that
                # named dataset, or a file's defaults (not bank's: a binary task)
                named = isinstance(self.data, str) and self.data in DATASETS
                table["dataset"] = self.data if named else TABLE_FILE
            known = {f.name for f in fields(VflConfig)}
            refuse_moved(table, VflConfig.MOVED_KEYS, section="vfl")
            unknown = sorted(set(table) - known)
            if unknown:
                raise JobError("job.config", f"unknown setting(s) {unknown}; known: "
                               "docs/reference/config.md (VflConfig)")
            return from_mapping(VflConfig, table, section="vfl")
        raise JobError("job.config", "expected a VflConfig or a mapping of its keys, got "
                       f"{type(self.config).__name__}")

    def _dataset(self, out: Path, base: VflConfig) -> str:
        """``vfl.dataset`` for this job's data (writes an in-memory table to ``out``)."""
        import pandas as pd

        data = self.data
        if isinstance(data, (str, os.PathLike)):
            return os.fspath(data)
        if isinstance(data, np.ndarray):
            data = self._frame_of_array(data)
        if not isinstance(data, pd.DataFrame):
            raise JobError("job.data", "expected a dataset name, a CSV/Parquet path, a "
                           f"pandas DataFrame or a 2-D numpy array, got {type(data).__name__}")
        if len(data) == 0:
            raise JobError("job.data", "the data frame has no rows")
        frame = data.copy()
        frame.columns = [str(c) for c in frame.columns]
        if len(set(frame.columns)) != len(frame.columns):
            dup = sorted({c for c in frame.columns if list(frame.columns).count(c) > 1})
            raise JobError("job.data", f"duplicate column names {dup}")
        label = self.label or base.label
        if not label:
            raise JobError("job.label", "name the label column of an in-memory table")
        named = [label, *self.active_columns, *self.passive_columns,
                 *(c for cols in self.passive_party_columns for c in cols)]
        missing = [str(c) for c in named if str(c) not in frame.columns]
        if missing:
            raise UnknownColumn(missing, list(frame.columns))
        path = out / TABLE_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            frame.reset_index(drop=True).to_parquet(path, index=False)
        except OSError as exc:
            raise JobError("out", f"cannot write the job's table to {str(path)!r}: "
                           f"{exc.strerror or exc}") from None
        except (ValueError, TypeError, ImportError) as exc:  # pyarrow rejects a column type
            raise DataError(f"the data frame cannot be stored as Parquet: {exc}") from None
        return str(path)

    def _frame_of_array(self, arr: np.ndarray) -> pd.DataFrame:
        import pandas as pd

        if arr.ndim != 2:
            raise JobError("job.data", f"a numpy array must be 2-D (rows x columns), got "
                           f"shape {arr.shape}")
        names = [str(c) for c in self.columns] or [f"c{i}" for i in range(arr.shape[1])]
        if len(names) != arr.shape[1]:
            raise JobError("job.columns", f"{len(names)} names for {arr.shape[1]} columns")
        return pd.DataFrame(arr, columns=names)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        metrics: the run's ``metrics.json`` (docs/reference/metrics.md).
        out: the run directory; the trained parts are in ``out/model/<role>/``.
        models: the job's model factory (rebuilds user models that cannot be imported
            by name, e.g. lambdas, for :meth:`load` and :func:`predict`).
    """

    metrics: dict[str, Any]
    out: Path
    models: ModelFactory | None = field(default=None, repr=False, compare=False)

    @property
    def metric_name(self) -> str:
        """``"auc"`` (binary task) or ``"rmse"`` (regression)."""
        return str(self.metrics["metric_name"])

    @property
    def metric(self) -> float:
        """The test metric of the trained model (AUC or RMSE)."""
        return float(self.metrics["metric"])

    @property
    def test_auc(self) -> float | None:
        """The test AUC (binary task), else None."""
        value = self.metrics.get("test_auc")
        return None if value is None else float(value)

    @property
    def model_dir(self) -> Path:
        """Where the parties saved their trained parts (``model/``)."""
        return self.out / "model"

    def load(self, role: str) -> SavedPart:
        """Party ``role``'s trained part (a party id: ``active``, ``passive``,
        ``passive2`` …; :func:`parties.runtime.saved.load_party_model`): its modules in eval mode,
        its encoder, manifest and (passive, DP on) privacy ledger."""
        from parties.runtime.saved import load_party_model

        return load_party_model(self.out, role, models=self.models)


def train(job: VflJob, out: str | Path, *, transport: Transport = "memory",
          timeout_s: float | None = None, quiet: bool = True, keys_dir: str | None = None,
          insecure: bool = False) -> TrainResult:
    """Train ``job``; write the run directory ``out`` (metrics, config, saved models).

    Args:
        job: the job.
        out: the run directory (created; an earlier run's results there are replaced).
        transport: ``"memory"``: both parties in this process over an in-memory bus
            (:mod:`sim.launch.local`); ``"broker"``: a broker process and one process per party
            over TCP, CURVE-secured with ephemeral keys by default (:mod:`sim.launch.vfl`).
        timeout_s: stop the job after this long (None: only the parties' own deadlines).
        quiet: no per-epoch progress lines.
        keys_dir: ``"broker"`` only: your CURVE keys (see :func:`sim.launch.vfl.run_security`;
            default: ephemeral keys made for the run).
        insecure: ``"broker"`` only: plaintext on loopback (see
            :func:`sim.launch.vfl.run_security`).

    Raises:
        JobError: a field of the job is invalid (bad input, before anything starts).
        parties.data.DataError: bad data, e.g. an unknown column (before anything starts).
        parties.models.zoo.ModelSpecError: a model factory fails its probe (before anything
            starts).
        pubsub.config.ConfigError: an invalid setting (before anything starts).
        parties.privacy.dpsgd.DpIncompatibleModel: DP on and BatchNorm in the passive bottom
            (before anything starts).
        sim.launch.vfl.LaunchError (``"broker"``): a party process failed (its exit code).
        parties.core.errors.VflError (``"memory"``): a party failed (partner lost, ...).
        sim.launch.vfl.JobTimeout: ``timeout_s`` passed.
    """
    if transport not in ("memory", "broker"):
        raise JobError("transport", f"expected 'memory' or 'broker', got {transport!r}")
    cfg, models = job.resolve(out)
    if transport == "memory":
        from sim.launch.local import run_vfl_in_process

        res = run_vfl_in_process(cfg, out, models=models, quiet=quiet, timeout_s=timeout_s)
    else:
        from sim.launch.vfl import run_vfl

        res = run_vfl(cfg, out, models=models, quiet=quiet, timeout_s=timeout_s,
                      keys_dir=keys_dir, insecure=insecure)
    return TrainResult(metrics=res.metrics, out=res.out, models=models)


def predict(run_dir: str | Path, out: str | Path, *, data: str | Path | None = None,
            id_column: str = "id", transport: Transport = "memory",
            timeout_s: float | None = None, models: Any = None) -> PredictResult:
    """Score rows jointly with the model saved in ``run_dir``; every party of the run (the
    active party and each passive party) reads only its own columns of ``data``, and each
    passive party's embeddings cross the bus (with DP on, noised and charged to its own
    ledger, as in training; ``summary["dp_by_party"]``).

    Args:
        run_dir: a training run directory (:func:`train`'s ``out``).
        out: output directory: ``predictions.csv`` and ``predict.json``.
        data: a CSV/Parquet file of new rows with ``id_column`` (None: the run's test split,
            which reproduces the run's test metric).
        id_column: the ID column of ``data``.
        transport: as for :func:`train`. ``"broker"`` runs ``python -m parties predict``
            processes, which rebuild user models from their recorded ``module:callable``
            (a model defined in a script's ``__main__`` can be rebuilt only in-process).
        timeout_s: ``"broker"``: stop everything after this long.
        models: ``"memory"``: the training run's factory, or a :class:`TrainResult`
            (whose factory is used), to rebuild models that cannot be imported by name.

    Returns:
        :class:`sim.launch.predict.PredictResult` (``summary``, ``predictions``, ``out``).

    Raises:
        parties.runtime.saved.SavedModelError / SavedModelMismatch: missing parts, or parts of
            different runs (the party and both run ids named).
        parties.data.DataError: ``data`` lacks a party's column or the ID column.
    """
    src = None if data is None else os.fspath(data)
    if isinstance(models, TrainResult):
        models = models.models
    if transport == "memory":
        from sim.launch.local import predict_in_process

        return predict_in_process(run_dir, out, data=src, id_column=id_column, models=models)
    if transport != "broker":
        raise JobError("transport", f"expected 'memory' or 'broker', got {transport!r}")
    from sim.launch.predict import run_predict

    return run_predict(run_dir, out, data=src, id_column=id_column, timeout_s=timeout_s)


__all__ = ["JobError", "TABLE_FILE", "TrainResult", "VflJob", "predict", "train"]
