"""Named datasets: the values of ``vfl.dataset`` other than a file path.

Bundled tables are package resources of this directory (provenance, licences and
sha256 checksums in ``README.md`` here); ``synthetic`` is generated in memory.
Loading lives in :mod:`parties.data`; this module is pure Python so the config can
resolve a dataset's task without importing pandas.
"""

from __future__ import annotations

from dataclasses import dataclass

from parties.core.tasks import TASKS


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetInfo:
    """One named dataset.

    Attributes:
        name: the ``vfl.dataset`` value.
        label: label column.
        task: ``"binary"`` or ``"regression"``.
        resource: file name in this package (``.csv.gz`` or ``.parquet``); ``None``
            for a dataset generated in memory.
        rows: row count of the bundled table, checked when it is loaded (``None``:
            set by the config).
    """

    name: str
    label: str
    task: str
    resource: str | None
    rows: int | None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")


DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in (
        DatasetInfo(name="bank", label="y", task="binary", resource="bank-full.csv.gz",
                    rows=45_211),
        DatasetInfo(name="adult", label="income", task="binary", resource="adult.parquet",
                    rows=48_842),
        DatasetInfo(name="california", label="MedHouseVal", task="regression",
                    resource="california_housing.parquet", rows=20_640),
        DatasetInfo(name="synthetic", label="y", task="binary", resource=None, rows=None),
    )
}
"""The named datasets, by ``vfl.dataset`` value (sources and licences: README.md here)."""

__all__ = ["DATASETS", "DatasetInfo"]
