"""The FedForge run configuration: ``[synth]`` and its nested tables, loaded from TOML plus
``--set``.

``[synth]`` holds the run itself (dataset, parties, budget, mechanism, seeds); the nested
tables (:mod:`synth.config_sections`) hold the rest: ``[synth.mst]``, ``[synth.aim]``,
``[synth.engine]``, ``[synth.secagg]``, ``[synth.data]``, ``[synth.stream]``,
``[synth.timeouts]``, ``[synth.launch]``.

Defaults follow the issue and the AIM/MST literature: ε = 1, δ = 1e-9, MST cliques, all
3-way marginals as the workload, numeric columns coarsened to about 10 bins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pubsub.config import (ConfigError, deep_merge, dump_toml, from_mapping, load_section,
                           load_toml, migrate_moved, parse_overrides, to_mapping)
from synth.config_sections import (ENGINES, NOISE_MODELS, SPLITS, AimSection, DataSection,
                                   EngineSection, LaunchSection, MstSection, SecAggSection,
                                   StreamSection, TimeoutsSection)

#: Columns a named dataset leaves out of synthesis unless ``data.drop_columns`` is set.
DEFAULT_DROP: dict[str, tuple[str, ...]] = {"adult": ("education",)}
MECHANISMS = ("mst", "aim")

#: The nested tables of ``[synth]``: field -> its dataclass.
_SECTIONS: dict[str, type] = {"mst": MstSection, "aim": AimSection, "engine": EngineSection,
                              "secagg": SecAggSection, "data": DataSection,
                              "stream": StreamSection, "timeouts": TimeoutsSection,
                              "launch": LaunchSection}

#: Every key of the flat ``[synth]`` table (before the nested tables) whose place changed
#: -> its dotted place under ``synth``.
MOVED_KEYS: dict[str, str] = {
    "mst_split": "mst.split", "mst_extra_mb": "mst.extra_mb",
    "aim_rounds": "aim.rounds", "aim_batch": "aim.batch", "aim_split": "aim.split",
    "aim_max_model_mb": "aim.max_model_mb",
    "engine": "engine.name", "engine_iters": "engine.iters",
    "engine_threads": "engine.threads",
    "noise_model": "secagg.noise_model", "min_survivors": "secagg.min_survivors",
    "min_honest": "secagg.min_honest", "secagg_threshold": "secagg.threshold",
    "secagg_degree": "secagg.degree", "bits": "secagg.bits", "ring": "secagg.ring",
    "fanout": "secagg.fanout", "root_children": "secagg.root_children",
    "unmask": "secagg.unmask",
    "drop_columns": "data.drop_columns", "split": "data.split",
    "split_column": "data.split_column", "dirichlet_alpha": "data.dirichlet_alpha",
    "party_weights": "data.party_weights", "numeric_bins": "data.numeric_bins",
    "binning": "data.binning", "domain": "data.domain", "schema_file": "data.schema_file",
    "holdout_frac": "data.holdout_frac", "max_cells": "data.max_cells",
    "stream_rho_frac": "stream.rho_frac", "stream_refit": "stream.refit",
    "stream_iters": "stream.iters", "stream_compare_full": "stream.compare_full",
    "round_timeout_s": "timeouts.round_timeout_s",
    "handshake_timeout_s": "timeouts.handshake_timeout_s",
    "connect_timeout_s": "timeouts.connect_timeout_s",
    "parties_per_process": "launch.parties_per_process",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SynthConfig:
    """Settings of one FedForge run (the coordinator sends the shared ones to every party).

    ``[synth]`` holds the run itself; its nested tables hold the rest (a dotted key,
    ``--set synth.aim.rounds=8``, is the same as the table). A key of the flat layout
    before the tables (``aim_rounds``) is refused naming its new place
    (:attr:`MOVED_KEYS`); a saved run's ``config.toml`` of that layout is migrated on read
    (:func:`load_synth_config` with ``saved=True``).

    Attributes:
        dataset: the table: a named dataset (resolved by the launcher, e.g. ``adult``) or a
            CSV/Parquet path readable by every party process.
        label: the label column used for the ML-utility score ('' = none: no ML utility).
        parties: K, the number of data-holding parties.
        epsilon / delta: the (ε, δ) target of the whole release, per party (each
            record lives at one party); converted to zCDP ρ with the tight conversion
            (:func:`synth.accounting.cdp_rho`). ``epsilon = inf`` runs without noise.
        mechanism: clique selection: ``mst`` (1-way marginals, all 2-way marginals
            measured for the selection, then the maximum spanning tree's 2-way marginals;
            ρ split in thirds) or ``aim`` (1-way marginals, all 2-way marginals measured
            as answers, then ``aim.rounds`` adaptive rounds, each measuring the
            ``aim.batch`` cliques the current model explains worst, scored AIM's way from
            the noisy answers; :func:`synth.select.aim_select_batch`).
        synthetic_rows: rows to sample (0 = as many as the parties hold together).
        workload_k: the workload is all ``workload_k``-way marginals (quality report).
        seed: split, graph and sampling seed (the noise itself comes from OS entropy
            unless ``noise_seed`` is set).
        noise_seed: seed of the parties' noise generators, for reproducible tests only.
        mst: ``[synth.mst]``, the ``mst`` mechanism's knobs
            (:class:`synth.config_sections.MstSection`).
        aim: ``[synth.aim]``, the ``aim`` mechanism's knobs
            (:class:`synth.config_sections.AimSection`).
        engine: ``[synth.engine]``, the synthesis engine
            (:class:`synth.config_sections.EngineSection`).
        secagg: ``[synth.secagg]``, the trust model, the noise and the secure aggregation
            (:class:`synth.config_sections.SecAggSection`).
        data: ``[synth.data]``, the columns, the split over the parties and the public
            domain (:class:`synth.config_sections.DataSection`).
        stream: ``[synth.stream]``, workload updates after the run
            (:class:`synth.config_sections.StreamSection`).
        timeouts: ``[synth.timeouts]``, deadlines
            (:class:`synth.config_sections.TimeoutsSection`).
        launch: ``[synth.launch]``, the launcher's process layout
            (:class:`synth.config_sections.LaunchSection`).
    """

    #: Keys of the flat ``[synth]`` table before the nested tables -> their new place.
    MOVED_KEYS: ClassVar[dict[str, str]] = MOVED_KEYS

    dataset: str = "adult"
    label: str = ""
    parties: int = 10
    epsilon: float = 1.0
    delta: float = 1e-9
    mechanism: str = "mst"
    synthetic_rows: int = 0
    workload_k: int = 3
    seed: int = 0
    noise_seed: int | None = None
    mst: MstSection = field(default_factory=MstSection)
    aim: AimSection = field(default_factory=AimSection)
    engine: EngineSection = field(default_factory=EngineSection)
    secagg: SecAggSection = field(default_factory=SecAggSection)
    data: DataSection = field(default_factory=DataSection)
    stream: StreamSection = field(default_factory=StreamSection)
    timeouts: TimeoutsSection = field(default_factory=TimeoutsSection)
    launch: LaunchSection = field(default_factory=LaunchSection)

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"synth.{key}", why)

        if not self.dataset:
            raise bad("dataset", "must name a dataset or a file")
        if not 1 <= self.parties <= 10_000:
            raise bad("parties", f"must be in [1, 10000], got {self.parties}")
        if not (self.epsilon > 0):  # also rejects NaN
            raise bad("epsilon", f"must be > 0 (inf = no noise), got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise bad("delta", f"must be in (0, 1), got {self.delta}")
        if self.mechanism not in MECHANISMS:
            raise bad("mechanism", f"must be one of {MECHANISMS}, got {self.mechanism!r}")
        if self.synthetic_rows < 0:
            raise bad("synthetic_rows", f"must be >= 0, got {self.synthetic_rows}")
        if not 1 <= self.workload_k <= 4:
            raise bad("workload_k", f"must be in [1, 4], got {self.workload_k}")
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise bad(name, f"must be a {cls.__name__} (the [synth.{name}] table), "
                          f"got {getattr(self, name)!r}")
        check_across(self)

    @property
    def private(self) -> bool:
        """False when ``epsilon`` is infinite (the no-privacy upper bound)."""
        return math.isfinite(self.epsilon)

    def resolved_drop(self) -> tuple[str, ...]:
        """``data.drop_columns``, or the named dataset's default when it is None."""
        if self.data.drop_columns is not None:
            return self.data.drop_columns
        return DEFAULT_DROP.get(self.dataset, ())

    def resolved_engine(self) -> str:
        """``engine.name`` with ``auto`` resolved: ``mbi`` if the package imports, else
        ``neural``."""
        return self.engine.resolved()

    def party_ids(self) -> tuple[str, ...]:
        """``("p000", "p001", ...)``: the K party ids, zero-padded so they sort in order."""
        width = max(3, len(str(self.parties - 1)))
        return tuple(f"p{i:0{width}d}" for i in range(self.parties))


def check_across(cfg: SynthConfig) -> None:
    """The checks that need keys of more than one table (K and the trust model, K and
    the Shamir threshold, K and the ``sizes`` split's weights).

    Raises:
        ConfigError: naming the dotted key (``synth.secagg.min_honest``).
    """
    sec, k = cfg.secagg, cfg.parties
    for key in ("min_survivors", "min_honest"):
        v = getattr(sec, key)
        if not 0 <= v <= k:
            raise ConfigError(f"synth.secagg.{key}", f"must be 0 (default ceil(0.7 K)) or in "
                              f"[1, K = {k}], got {v}")
    from synth.mechanism import TrustModelError, resolve_trust
    try:
        resolve_trust(k, sec.min_survivors, sec.min_honest, noise_model=sec.noise_model)
    except TrustModelError as exc:
        raise ConfigError("synth.secagg.min_honest", str(exc)) from None
    from synth.protocol import secagg_degree
    k_deg = secagg_degree(k, sec.degree)
    if not 0 <= sec.threshold <= k_deg + 1:
        raise ConfigError("synth.secagg.threshold", f"must be 0 (default k // 2 + 1) or in "
                          f"[1, degree + 1 = {k_deg + 1}], got {sec.threshold}")
    if cfg.data.split == "sizes" and len(cfg.data.party_weights) != k:
        raise ConfigError("synth.data.party_weights", f"the sizes split needs one weight per "
                          f"party ({k}), got {len(cfg.data.party_weights)}")


def load_synth_config(path: str | Path | None = None, sets: Sequence[str] = (),
                      extra: Mapping[str, Any] | None = None, *,
                      saved: bool = False) -> SynthConfig:
    """Effective config: defaults, then the TOML file's ``[synth]`` table, then ``--set``.

    ``--set`` keys may be written ``synth.parties=10`` or just ``parties=10`` (a nested
    table's key with its dots: ``synth.aim.rounds=8``); ``extra`` (from dedicated CLI
    flags) is applied last. A key of the flat layout (``aim_rounds``) is refused naming
    its new place, unless ``saved``: the file is a run's own ``config.toml``, written
    before the nested tables, and its table is migrated (:func:`migrate_synth_table`);
    ``sets`` and ``extra`` are still refused.

    Raises:
        ConfigError: unknown section or key, wrong type, or an invalid value.
    """
    if not saved or path is None:
        return load_section(SynthConfig, "synth", path, sets, extra)
    data = load_toml(path)
    unknown = set(data) - {"synth"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown section (expected [synth])")
    table = migrate_synth_table(data.get("synth", {}))
    over = parse_overrides(sets)
    table = deep_merge(table, over.get("synth", {}))
    table = deep_merge(table, {k: v for k, v in over.items() if k != "synth"})
    if extra:
        table = deep_merge(table, dict(extra))
    return from_mapping(SynthConfig, table, section="synth")


def migrate_synth_table(table: Mapping[str, Any]) -> dict[str, Any]:
    """A saved ``[synth]`` table with each key of the flat layout at its new place
    (:data:`MOVED_KEYS`); a table of the nested layout comes back as it is."""
    return migrate_moved(table, MOVED_KEYS)


def synth_from_saved(table: Mapping[str, Any]) -> SynthConfig:
    """The config of a saved ``[synth]`` table (either layout; see
    :func:`migrate_synth_table`).

    Raises:
        ConfigError: an unknown key or an invalid value.
    """
    return from_mapping(SynthConfig, migrate_synth_table(table), section="synth")


def flat_config(cfg: SynthConfig) -> dict[str, Any]:
    """The config as one flat dict under the flat layout's key names (``aim_rounds``,
    ``engine``), as :func:`pubsub.config.to_mapping` wrote it before the nested tables:
    what a checkpoint's fingerprint hashes, so a run checkpointed then still resumes."""
    back = {new: old for old, new in MOVED_KEYS.items()}
    out: dict[str, Any] = {}
    for key, value in to_mapping(cfg).items():
        if isinstance(value, dict):
            for sub, v in value.items():
                dotted = f"{key}.{sub}"
                out[back.get(dotted, dotted)] = v
        else:
            out[key] = value
    return out


def dump_synth_config(cfg: SynthConfig) -> str:
    """The config as TOML text (``[synth]`` and its nested tables) that
    :func:`load_synth_config` reads."""
    return dump_toml({"synth": to_mapping(cfg)})


__all__ = ["DEFAULT_DROP", "ENGINES", "MECHANISMS", "MOVED_KEYS", "NOISE_MODELS", "SPLITS",
           "AimSection", "DataSection", "EngineSection", "LaunchSection", "MstSection",
           "SecAggSection", "StreamSection", "SynthConfig", "TimeoutsSection", "check_across",
           "dump_synth_config", "flat_config", "load_synth_config", "migrate_synth_table",
           "synth_from_saved"]
