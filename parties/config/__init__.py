"""The VFL run configuration: :class:`VflConfig` (:mod:`parties.config.vfl`), the run's own
keys under ``[vfl]`` and its sections ``[vfl.data]``, ``[vfl.model]``, ``[vfl.workers]``,
``[vfl.timeouts]``, ``[vfl.wire]`` (:mod:`parties.config.sections`), ``[vfl.dp]`` and ``[vfl.labels]``
(:mod:`parties.config.privacy`); the job file of a cross-organisation run, ``[job]`` beside
``[vfl]`` (:mod:`parties.config.job`); the checks across sections
(:mod:`parties.config.checks`); where each key of the flat configuration before the
sections lives now (:mod:`parties.config.moved`); the model specs' grammar
(:mod:`parties.config.modelspec`). May import :mod:`parties.core`,
:mod:`parties.algorithms` and :mod:`parties.datasets`.
"""

from dataclasses import replace

from parties.algorithms.schedule import ALGOS
from parties.config.job import Job, JobSection, load_job
from parties.config.moved import MOVED_KEYS
from parties.config.privacy import LABEL_DEFENCES, DpSection, LabelsSection
from parties.config.sections import (ID_COLUMN_MODES, TOP_UPDATES, WORKER_MODES, DataSection,
                                     ModelSection, TimeoutsSection, WireSection,
                                     WorkersSection)
from parties.config.vfl import (ACTIVE_ONLY_BASELINE, DEFAULT_TARGETS, VflConfig,
                                dump_vfl_config, load_saved_config, load_vfl_config,
                                migrate_saved, vfl_config, vfl_config_from_saved)
from parties.core.ids import MAX_PASSIVE_PARTIES, check_run_id, passive_party_ids, role_of

__all__ = ["ACTIVE_ONLY_BASELINE", "ALGOS", "DEFAULT_TARGETS", "ID_COLUMN_MODES",
           "MAX_PASSIVE_PARTIES", "MOVED_KEYS", "TOP_UPDATES", "WORKER_MODES", "DataSection",
           "DpSection", "Job", "JobSection", "LABEL_DEFENCES", "LabelsSection", "ModelSection", "TimeoutsSection", "VflConfig", "WireSection",
           "WorkersSection", "check_run_id", "dump_vfl_config", "load_saved_config",
           "load_job", "load_vfl_config",
           "migrate_saved", "passive_party_ids", "replace", "role_of", "vfl_config", "vfl_config_from_saved"]
