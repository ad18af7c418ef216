"""Checks of the VFL run configuration that span its sections (the party count against
each per-party list, the algorithm against the worker counts, the dataset against the
task). May import :mod:`parties.core`, :mod:`parties.algorithms` and the configuration's
sections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parties.core.ids import MAX_PASSIVE_PARTIES
from pubsub.config import ConfigError


def check_parties(cfg: Any, bad: Callable[[str, str], ConfigError]) -> None:
    """Refuse settings of ``cfg`` (a :class:`parties.config.vfl.VflConfig` being built) whose per-party lists do not match ``vfl.passive_parties`` (or the
    algorithm), naming the offending dotted key.

    Raises:
        ConfigError: the first such setting.
    """
    from parties.algorithms.fuse import FUSES

    data, n = cfg.data, cfg.passive_parties

    def wrong(key: str, why: str) -> ConfigError:
        section, _, leaf = key.partition(".")
        return ConfigError(f"vfl.{key}", f"{why}, got {getattr(getattr(cfg, section), leaf)!r}")

    if not 1 <= n <= MAX_PASSIVE_PARTIES:
        raise bad("passive_parties", f"must be in 1 .. {MAX_PASSIVE_PARTIES}")
    if cfg.fuse not in FUSES:
        raise bad("fuse", f"must be one of {FUSES}")
    if data.passive_party_columns:
        if n == 1:
            raise wrong("data.passive_party_columns", "is for several passive parties "
                        "(vfl.passive_parties > 1); with one, use vfl.data.passive_columns")
        if len(data.passive_party_columns) != n:
            raise wrong("data.passive_party_columns",
                        f"needs one column list per passive party ({n})")
        if not data.active_columns:
            raise wrong("data.passive_party_columns", "needs vfl.data.active_columns too")
    if n > 1:
        if data.passive_columns:
            raise wrong("data.passive_columns", "is for one passive party; with "
                        f"vfl.passive_parties = {n}, list each one's columns in "
                        "vfl.data.passive_party_columns")
        if data.active_columns and not data.passive_party_columns:
            raise wrong("data.active_columns", "with several passive parties, give "
                        "vfl.data.passive_party_columns too (or neither)")
        if data.passive_rows_file:
            raise wrong("data.passive_rows_file", "is for one passive party; with "
                        f"vfl.passive_parties = {n}, list each one's aligned-<party>.csv "
                        "in vfl.data.passive_party_rows_files")
        if data.passive_party_rows_files and len(data.passive_party_rows_files) != n:
            raise wrong("data.passive_party_rows_files", "needs one rows file per passive "
                        f"party ({n}), in party order")
    elif data.passive_party_rows_files:
        raise wrong("data.passive_party_rows_files", "is for several passive parties "
                    "(vfl.passive_parties > 1); with one, use vfl.data.passive_rows_file")
    if data.party_datasets and len(data.party_datasets) != 1 + n:
        raise wrong("data.party_datasets", f"needs one file per party ({1 + n}: active "
                    "first, then each passive party)")
    counts = cfg.workers.per_passive_party
    if counts:
        if n == 1:
            raise wrong("workers.per_passive_party", "is for several passive parties "
                        "(vfl.passive_parties > 1); with one, use vfl.workers.passive")
        if len(counts) != n:
            raise wrong("workers.per_passive_party", "needs one worker count per passive "
                        f"party ({n}), in party order")
        if cfg.algo == "vfl-ps" and len(set(counts)) > 1:
            raise wrong("workers.per_passive_party", "vfl-ps pairs each active worker with "
                        "one worker of every passive party, so every passive party needs "
                        "the same count (or set vfl.workers.passive)")
