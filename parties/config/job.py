"""The job file: one TOML file every organisation of a cross-organisation run holds.

A job file (``job.toml``) has two tables: ``[job]`` (:class:`JobSection`: the run's id,
the broker's address, the join key, the organisations in party order) and ``[vfl]`` (the
run's settings, as in any config file). Each organisation points at its own data file on
its own command line (``psfl vfl party --job job.toml --role passive --data partner.csv``),
so the file holds nothing private and no path to anyone's data.

What the handshake checks: the ``[vfl]`` table's shared settings (the digest the parties
compare today) with the join key among them (``vfl.data.join_key`` is the job's
``join_key``); the run id and the broker decide whether the parties meet at all.
:attr:`Job.digest` is the whole file's digest (both tables, normalised), printed by every
party at start so that organisations can compare it out of band.

Owns: :class:`JobSection`, :class:`Job`, :func:`load_job`. May import :mod:`pubsub.config`
and the rest of :mod:`parties.config`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson

from parties.config.vfl import VflConfig
from pubsub.config import ConfigError, from_mapping, load_toml, section_from_data, to_mapping

_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
_BROKER = re.compile(r"tcp://[^\s:/]+:\d{1,5}")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSection:
    """``[job]``: who takes part and where they meet.

    Attributes:
        run_id: the run's id (1-40 of ``[A-Za-z0-9_-]``); training uses it as its topic
            namespace, the alignment before it ``<run_id>-align``, a prediction
            ``<run_id>-predict`` (and ``<run_id>-predict-align``).
        broker: the broker's address every party connects to, ``tcp://HOST:PORT`` (the
            broker's host runs ``psfl broker run --bind tcp://0.0.0.0:PORT``).
        join_key: the column that identifies a record (a customer ID) in every party's
            file; it becomes ``vfl.data.join_key``: never a feature, and what the parties
            align their files on before training and before each prediction.
        organisations: the organisations' names in party order (the active party, then
            ``passive``, ``passive2`` ...), as they appear in the parties' start lines;
            as many as the run's parties (``vfl.passive_parties`` + 1).
        align_timeout_s: the alignment's deadline for each wait on the partner, the
            first hello included (default 300 s: an organisation may start later).
    """

    SECTION: ClassVar[str] = "job"

    run_id: str = ""
    broker: str = ""
    join_key: str = ""
    organisations: tuple[str, ...] = ()
    align_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"job.{key}", f"{why}, got {getattr(self, key)!r}")

        if not _RUN_ID.fullmatch(self.run_id):
            raise bad("run_id", "must be 1-40 of [A-Za-z0-9_-]")
        if not _BROKER.fullmatch(self.broker):
            raise bad("broker", "must be tcp://HOST:PORT")
        if not 0 < int(self.broker.rsplit(":", 1)[1]) < 65536:
            raise bad("broker", "port must be in 1 .. 65535")
        if not self.join_key.strip():
            raise bad("join_key", "must name the ID column of every party's file")
        if any(not o.strip() for o in self.organisations):
            raise bad("organisations", "has an empty name")
        if len(set(self.organisations)) != len(self.organisations):
            raise bad("organisations", "names an organisation twice")
        if not self.align_timeout_s > 0:
            raise bad("align_timeout_s", "must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A loaded job file.

    Attributes:
        job: the ``[job]`` table.
        vfl: the run's configuration (``[vfl]``, with ``data.join_key`` the job's and
            ``dataset`` the party's own file when one was given).
        digest: 16 hex digits of the normalised file (both tables, before the party's
            own data file and ``--set`` items were applied).
        path: the file it was read from.
    """

    job: JobSection
    vfl: VflConfig
    digest: str
    path: str

    def organisation(self, party: str) -> str:
        """``party``'s organisation name (its party id when the job names none)."""
        ids = self.vfl.party_ids
        if party in ids and len(self.job.organisations) == len(ids):
            return self.job.organisations[ids.index(party)]
        return party


def load_job(path: str | Path, sets: Sequence[str] = (), *, data: str | None = None,
             extra: Mapping[str, Any] | None = None) -> Job:
    """Read a job file; ``data``: this party's own file (becomes ``vfl.dataset``);
    ``sets``: ``--set`` items of the ``[vfl]`` table (this party's own settings, such as
    ``dp.schema``).

    Raises:
        ConfigError: a missing or unreadable file, an unknown table or key, a bad value,
            a ``[vfl]`` that sets another ``data.join_key`` than the job's, or
            ``organisations`` that do not match the run's parties.
    """
    doc = load_toml(path)
    unknown = sorted(set(doc) - {"job", "vfl"})
    if unknown:
        raise ConfigError(unknown[0], "unknown table in a job file (expected [job] and [vfl])")
    if "job" not in doc:
        raise ConfigError("job", f"{str(path)!r} has no [job] table (run_id, broker, join_key)")
    section = from_mapping(JobSection, doc["job"], section="job")
    vfl_doc = dict(doc.get("vfl", {}))
    given = vfl_doc.get("data", {}).get("join_key") if isinstance(vfl_doc.get("data"), Mapping) \
        else vfl_doc.get("data.join_key")
    if given not in (None, section.join_key):
        raise ConfigError("vfl.data.join_key", f"{given!r} differs from job.join_key "
                          f"{section.join_key!r}: leave it out of [vfl]")
    base: dict[str, Any] = {"data.join_key": section.join_key}
    digest_cfg = section_from_data(VflConfig, "vfl", {"vfl": vfl_doc}, (), base)
    digest = hashlib.sha256(orjson.dumps(
        {"job": to_mapping(section), "vfl": to_mapping(digest_cfg)},
        option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    over = dict(base)
    if data is not None:
        over["dataset"] = str(data)
    if extra:
        over.update(extra)
    cfg = section_from_data(VflConfig, "vfl", {"vfl": vfl_doc}, sets, over)
    if cfg.data.join_key != section.join_key:
        raise ConfigError("vfl.data.join_key", f"{cfg.data.join_key!r} differs from "
                          f"job.join_key {section.join_key!r}")
    if section.organisations and len(section.organisations) != len(cfg.party_ids):
        raise ConfigError("job.organisations", f"names {len(section.organisations)} "
                          f"organisations; the run has {len(cfg.party_ids)} parties "
                          f"({', '.join(cfg.party_ids)}: vfl.passive_parties = "
                          f"{cfg.passive_parties})")
    return Job(job=section, vfl=cfg, digest=digest, path=str(path))


__all__ = ["Job", "JobSection", "load_job"]
