"""Prediction with a saved VFL model: one party process of ``psfl vfl predict``.

Each party (the active party and every passive party of the run: ``passive``,
``passive2`` …) loads only its own saved part (:func:`parties.runtime.saved.load_party_model`)
and reads only its own columns of the rows to predict: by default the run's own test
split, re-derived from the saved config and seed (the rows the run scored for
``test_auc`` / ``test_rmse``), or the rows of a CSV/Parquet file of new records with an
ID column (every party reads the same file, rows matched by position; their ID lists
must agree).

Protocol (topics of the prediction's own id ``P``, allowed by the broker's default
policy for the ``active``/``passive`` roles; with several passive parties the launcher's
run membership makes them ``owned``, so none reads another's topics):

1. hellos (:func:`pubsub.session.rendezvous`) on ``ctl/P/hello/<addressee>`` carry each
   part's run id and config digest and the rows' digest: the active party meets every
   passive party, a passive party the active party. A part of another run refuses
   (:class:`parties.runtime.saved.SavedModelMismatch`), as do other rows
   (:class:`parties.core.errors.ConfigMismatch`), on both sides, naming the party;
2. each passive party publishes its rows' embeddings on ``eval/P/<party id>/predict`` in
   eval mode; with DP on they are clipped and noised exactly like the run's test-split
   release (clip C, noise multiplier σ of the ``test`` group), and each release is
   charged per record before it happens (:func:`charge`): the test split's rows continue
   that party's training ledger (``ledger.json`` of its part), a file's rows its
   prediction ledger keyed by a salted hash of each record's ID
   (``prediction_ledger.json``, :class:`PredictionLedger`), so that every release of a
   record composes with its earlier ones whatever the file; a prediction that would take
   a record past ``dp_predict_max_releases`` is refused before the party even joins the
   bus (:class:`PredictionBudgetExceeded`, exit 2), and so is a file without IDs
   (:class:`PredictionIdsRequired`); its DP report rides along in the message's metadata
   (public figures only);
3. the active party waits for every passive party's embeddings under one deadline
   (:class:`parties.core.errors.PartnerStalled` naming the missing ones), checks each, fuses
   them with its own bottom output as the run did (``vfl.fuse``), writes
   ``predictions.csv`` (ID or row, prediction, label when present) and ``predict.json``
   (metric when labels are present; ``dp``: the first passive party's DP report,
   ``dp_by_party``: each one's) to its output directory, and publishes ``ctl/P/done``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import math
import secrets
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
import structlog
import torch

from pubsub import Bus, BusConfig, DeadlineExceeded
from pubsub.buffer import BufferLimits
from pubsub.config import ConfigError
from pubsub.errors import RendezvousTimeout, SettingsMismatch
from pubsub.outputs import atomic_output, write_atomic
from pubsub.security import CurveClient
from pubsub.session import answer_hello, rendezvous, wait_any
from pubsub.transport import Transport

from parties.data import DataError
from parties.core.errors import ConfigMismatch, HandshakeTimeout, PartnerStalled
from parties.runtime.saved import SavedModelError, SavedPart, check_same_run, load_party_model

log = structlog.get_logger(__name__)

#: Default ID column of a file of new rows.
DEFAULT_ID_COLUMN = "id"
#: A passive party's ledger of prediction releases of new rows, beside its saved part.
PREDICTION_LEDGER = "prediction_ledger.json"
#: The ledger's format: counts of prediction releases keyed by a salted hash of each ID.
PREDICTION_LEDGER_FORMAT = "prediction-releases-by-salted-id/1"
#: The config key of the per-record prediction budget.
BUDGET_KEY = "vfl.dp.predict_max_releases"


class PredictionBudgetExceeded(ConfigError):
    """A prediction would take records past ``dp_predict_max_releases`` prediction
    releases; nothing was released (a :class:`~pubsub.config.ConfigError`: exit 2).

    Attributes:
        limit: the configured budget (releases per record).
        worst: the count the most released record would have reached.
        over: how many records (distinct IDs, or test-split rows) would pass the budget.
    """

    def __init__(self, limit: int, worst: int, over: int, what: str) -> None:
        self.limit, self.worst, self.over = limit, worst, over
        super().__init__(BUDGET_KEY, f"{limit}: this prediction would give {over} "
                         f"{what} up to {worst} prediction releases each (with DP on, "
                         f"every release of a record composes with its earlier ones); "
                         "refusing before anything is released. Raise "
                         "dp_predict_max_releases in the run's config to allow more (k "
                         "releases of a record cost it sqrt(k) times the test split's µ)")


class PredictionIdsRequired(DataError):
    """With DP on, a file of new rows must name each record by its ID (the prediction
    ledger composes a record's releases by ID): the ID column is missing or has empty
    values (exit 2, bad data).

    Attributes:
        column: the configured ID column (``--id-column``).
    """

    def __init__(self, column: str, source: str, detail: str) -> None:
        self.column = column
        super().__init__(f"{source}: {detail}; with DP on every row to predict needs its "
                         f"record's ID in the ID column {column!r} (--id-column): the "
                         "passive party's prediction ledger composes each record's "
                         "releases by ID")


class PredictionLedger:
    """A passive party's count of prediction releases of each record of new rows, keyed
    by a salted hash of the record's ID (``HMAC-SHA256(salt, ID)``, 128 bits; the salt
    is random per saved model and kept in the ledger file, so the file holds no raw IDs
    and its keys cannot be matched against another model's).

    The file (:data:`PREDICTION_LEDGER` in the party's saved part) is read afresh and
    rewritten atomically (a temporary file in the same directory, fsync, rename, fsync
    of the directory) under an exclusive lock for each :meth:`commit`, so concurrent
    predictions of one model never lose a count.

    Args:
        path: the ledger file (created on the first commit).

    Raises:
        ValueError: the file is not a prediction ledger.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._load()

    def _load(self) -> None:
        if self.path.exists():
            doc = orjson.loads(self.path.read_bytes())
            if not isinstance(doc, dict) or doc.get("format") != PREDICTION_LEDGER_FORMAT:
                raise ValueError(f"{self.path} is not a prediction ledger "
                                 f"({PREDICTION_LEDGER_FORMAT})")
            self.salt = bytes.fromhex(doc["salt"])
            self.counts: dict[str, int] = {str(k): int(v) for k, v in doc["counts"].items()}
            self.releases: list[dict[str, Any]] = list(doc.get("releases", []))
        else:
            self.salt = secrets.token_bytes(16)
            self.counts, self.releases = {}, []

    def keys(self, ids: Sequence[str]) -> list[str]:
        """Each ID's ledger key (hex), in order."""
        salt = self.salt
        return [hmac.new(salt, str(i).encode(), hashlib.sha256).hexdigest()[:32] for i in ids]

    def after(self, ids: Sequence[str]) -> dict[str, int]:
        """Each record's count once ``ids`` are released (by key; an ID listed twice in
        one file is released twice)."""
        return {k: self.counts.get(k, 0) + c for k, c in Counter(self.keys(ids)).items()}

    def check(self, ids: Sequence[str], limit: int) -> dict[str, int]:
        """:meth:`after`, refused past ``limit``.

        Raises:
            PredictionBudgetExceeded: a record would pass ``limit`` releases.
        """
        after = self.after(ids)
        over = [c for c in after.values() if c > limit]
        if over:
            raise PredictionBudgetExceeded(limit, max(over), len(over),
                                           "record(s) (distinct IDs)")
        return after

    @property
    def max_count(self) -> int:
        """The most prediction releases of one record so far."""
        return max(self.counts.values(), default=0)

    def commit(self, ids: Sequence[str], limit: int, *, release_mu: float,
               source: str) -> dict[str, int]:
        """Charge one release of each of ``ids`` (re-read under the lock, checked against
        ``limit``, written atomically); returns the counts of ``ids``' records after it.
        Call it before the release: a refusal releases nothing.

        Raises:
            PredictionBudgetExceeded: a record would pass ``limit`` (nothing written).
        """
        with file_lock(self.path.with_name(self.path.name + ".lock")):
            self._load()
            after = self.check(ids, limit)
            self.counts.update(after)
            self.releases.append({"source": source, "rows": len(ids), "records": len(after),
                                  "release_mu": release_mu,
                                  "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            self._write()
        return after

    def _write(self) -> None:
        doc = {"format": PREDICTION_LEDGER_FORMAT, "salt": self.salt.hex(),
               "key": "hmac-sha256(salt, id)[:128 bits]", "counts": self.counts,
               "releases": self.releases}
        atomic_write(self.path, orjson.dumps(doc))


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing) for the block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: a temporary file in the same directory,
    fsync, rename, fsync of the directory (a crash leaves the old file or the new one;
    :func:`pubsub.outputs.write_atomic`, whose OutputError names the file)."""
    write_atomic(path, data)


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictRows:
    """The rows one party predicts, with its own columns only.

    Attributes:
        frame: this party's raw columns of the rows (and, active party, the label
            column when present).
        ids: the ID column's values as strings (a file), or None (the test split:
            rows are named by their position in the table).
        rows: ``(n,)`` positions of the rows in the table.
        source: ``"test_split"`` or the file's path.
        digest: the rows' digest (every party must agree).
    """

    frame: pd.DataFrame
    ids: np.ndarray | None
    rows: np.ndarray
    source: str
    digest: str


def _digest(items: Sequence[str]) -> str:
    h = hashlib.sha256()
    for s in items:
        h.update(s.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def select_rows(part: SavedPart, data: str | None = None,
                id_column: str = DEFAULT_ID_COLUMN, rows_file: str | None = None
                ) -> PredictRows:
    """The rows to predict and this party's columns of them.

    Args:
        part: this party's saved part.
        data: a CSV/Parquet file of new rows with ``id_column``; None = the run's test
            split, re-derived from the saved config (dataset, rows file, seed, test_frac).
        rows_file: with ``data``: the file's ``aligned-<party>.csv`` (the alignment of its
            IDs with the other parties', :mod:`parties.alignment.own_file`): only those
            rows, in the shared sorted-ID order, so that every party lists the same
            records in the same order.

    Raises:
        parties.data.DataError: unreadable file, missing ID column or feature columns.
        PredictionIdsRequired: with DP on, a file without the ID column, or rows without
            an ID.
    """
    from parties.data import UnknownColumn, load_table, train_test_indices
    from parties.data.preflight import load_configured_table

    cfg, columns = part.cfg, list(part.manifest["columns"])
    label = part.manifest.get("label", {}).get("column")
    if data is None:
        frame, _ = load_configured_table(cfg, part.party)
        if len(frame) != part.manifest["n_rows"]:
            raise DataError(f"the run's table now has {len(frame)} rows, the saved model "
                            f"was trained on {part.manifest['n_rows']}: cannot re-derive "
                            "its test split")
        split = cfg.data.effective_row_split
        if split == "hash":  # the scored test subset of a streamed (or hash-split) run
            from parties.data.stream import stream_split

            test_idx = stream_split(cfg, len(frame))[2]
        else:
            _, test_idx = train_test_indices(len(frame), test_frac=cfg.data.test_frac,
                                             seed=cfg.seed)
        keep = columns + ([label] if label and label in frame.columns else [])
        return PredictRows(frame=frame.iloc[test_idx][keep].reset_index(drop=True), ids=None,
                           rows=np.asarray(test_idx, dtype=np.int64), source="test_split",
                           digest=_digest(["test_split", str(len(frame)), str(cfg.seed),
                                           repr(cfg.data.test_frac),
                                           *([split, str(cfg.data.stream_eval_max_rows)]
                                             if split == "hash" else [])]))
    frame, _ = load_table(data)
    if rows_file:
        from parties.data import select_rows as aligned_rows

        frame = aligned_rows(frame, rows_file)
    dp_on = cfg.dp.enabled
    if id_column not in frame.columns:
        if dp_on:
            raise PredictionIdsRequired(id_column, str(data), "no such column")
        raise UnknownColumn([id_column], list(frame.columns))
    if dp_on:
        empty = frame[id_column].isna() | (frame[id_column].astype(str).str.strip() == "")
        if empty.any():
            raise PredictionIdsRequired(id_column, str(data),
                                        f"{int(empty.sum())} row(s) without an ID")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise UnknownColumn(missing, list(frame.columns))
    ids = frame[id_column].map(str).to_numpy()  # (astype(str) may keep NaN a float)
    keep = columns + ([label] if label and label in frame.columns else [])
    return PredictRows(frame=frame[keep].reset_index(drop=True), ids=ids,
                       rows=np.arange(len(frame), dtype=np.int64), source=str(data),
                       digest=_digest(["file", *ids.tolist()]))


def labels_of(part: SavedPart, frame: pd.DataFrame) -> np.ndarray | None:
    """The active party's labels of ``frame`` encoded as in training (0/1 with the saved
    positive class, or the label's original units), or None when the label column is
    absent or has missing values."""
    from parties.data import _class_name

    info = part.manifest.get("label") or {}
    col = info.get("column")
    if not col or col not in frame.columns or frame[col].isna().any():
        return None
    if info.get("encoding") == "binary":
        return np.array([_class_name(v) == info["positive"] for v in frame[col]],
                        dtype=np.float32)
    return frame[col].to_numpy(dtype=np.float64)


# ---------------------------------------------------------------------------- DP
def prediction_ledger(part: SavedPart) -> PredictionLedger:
    """The passive party's :class:`PredictionLedger` of its saved ``part``."""
    return PredictionLedger(part.path / PREDICTION_LEDGER)


def charge(part: SavedPart, n: int, source: str, ids: Sequence[str] | None = None, *,
           dry_run: bool = False) -> tuple[Any, dict[str, Any]]:
    """A passive party's DP for one prediction release of ``n`` rows: ``(privatize,
    report)``, after charging the release to its own ledgers (saved back to its part).

    Every prediction release of a record is composed with its earlier ones, whatever
    the file it arrives in (each costs ``µ_test = release_mu(σ_test)``, so ``k`` releases
    are ``sqrt(k)·µ_test``-GDP), and refused before anything is released (nothing
    charged) when a record would pass ``dp_predict_max_releases`` releases
    (:class:`PredictionBudgetExceeded`):

    * rows of a file (``ids``, the ID column's values) are identified by their ID: the
      :class:`PredictionLedger` (``prediction_ledger.json``) counts each ID's releases
      over every file (an ID listed twice in one file counts twice);
    * the run's test split continues the training ledger's ``test`` group by row (each
      record's release at the end of training is its first; the budget counts the
      releases after it; the run's cap of one release is lifted).

    The two ledgers cannot be linked (the run's table is matched by row, not by ID), so
    the reported ``mu`` composes them as if a file's record could be any record of the
    run: ``sqrt(µ_run² + µ_ids²)``, µ_run the training ledger's worst record (training,
    validation and test-split releases) and µ_ids the prediction ledger's.
    ``prediction_mu`` is the worst record of *this* release over the releases its ledger
    links to it. None (and DP off report) when the run had DP off. Both ledgers are
    re-read and rewritten atomically under a lock (:func:`atomic_write`,
    :func:`file_lock`), so concurrent predictions of one model never lose a count.

    Args:
        dry_run: only check the budget (raises as a real charge would; writes nothing).

    Raises:
        PredictionBudgetExceeded: a record would pass ``dp_predict_max_releases``.
        PredictionIdsRequired: rows of a file without IDs.
    """
    from parties.privacy.dp import plan_from_config

    if plan_from_config(part.cfg) is None:
        return None, {"enabled": False, "mu": None, "epsilon": None}
    assert part.ledger is not None, "a DP run's passive part has a ledger"
    path = part.path / part.manifest["dp"]["ledger"]
    # one prediction at a time per part: the training ledger is re-read and rewritten
    # under the lock, so concurrent predictions never lose a count
    with file_lock(path.with_name(path.name + ".lock")):
        if path.exists():
            part.ledger.clear()
            part.ledger.update(orjson.loads(path.read_bytes()))
        return _charge(part, path, n, source, ids, dry_run=dry_run)


def _charge(part: SavedPart, path: Path, n: int, source: str, ids: Sequence[str] | None, *,
            dry_run: bool) -> tuple[Any, dict[str, Any]]:
    from parties.privacy.dp import (EmbeddingPrivatizer, GdpAccountant, epsilon_for_delta,
                            party_noise_secret, plan_from_config, release_mu)

    cfg = part.cfg
    plan = plan_from_config(cfg)
    assert plan is not None and part.ledger is not None
    limit = cfg.dp.predict_max_releases
    sigma = plan.eval_noise_multipliers["test"]
    mu_one = release_mu(sigma)
    state = dict(part.ledger)
    sizes = {g: len(c) for g, c in state["counts"].items()}
    acct = GdpAccountant(sizes, release_mu=state["release_mu"])
    acct.load_state_dict({**state, "max_publications": {}, "reserve": {}})
    ids_ledger = prediction_ledger(part)
    if source == "test_split":
        # the test group's count includes each record's release at the end of training:
        # after this release a record has (count + 1) - 1 = count prediction releases
        worst = acct.group_max("test")
        if worst > limit:
            over = int(np.count_nonzero(acct.publications("test") > limit))
            raise PredictionBudgetExceeded(limit, worst, over, "test-split record(s)")
        if dry_run:
            return None, {}
        acct.record("test")  # every record of the test split, once more
        prediction_mu = acct.group_mu("test")
        new: dict[str, Any] = {"continues": "test", "rows": n,
                               "prediction_releases_max": acct.group_max("test") - 1}
    else:
        if ids is None or len(ids) != n:
            raise PredictionIdsRequired(DEFAULT_ID_COLUMN, source, "no ID for every row")
        if dry_run:
            ids_ledger.check(ids, limit)
            return None, {}
        after = ids_ledger.commit(ids, limit, release_mu=mu_one, source=source)
        k = max(after.values(), default=0)
        prediction_mu = mu_one * math.sqrt(k)
        new = {"continues": "prediction_ledger", "rows": n, "records": len(after),
               "prediction_releases_max": k,
               "note": "new rows: composed by ID over every prediction file"}
    ledger_mu = mu_one * math.sqrt(ids_ledger.max_count)
    total = math.hypot(acct.mu, ledger_mu)
    # a fixed dp_noise_seed (tests) still gives every release its own noise: the seed
    # mixes in how many predictions came before, so two predictions of different rows
    # never share a noise draw (their difference would reveal the rows exactly)
    # (and each passive party has its own secret: parties.privacy.dp.party_noise_secret)
    earlier = len(state.get("predictions", []))
    secret = party_noise_secret(cfg.dp.noise_seed, part.party)
    seed = (None if secret is None else
            int(np.random.SeedSequence([secret, 0x9E, n, earlier])
                .generate_state(1, dtype=np.uint64)[0]))
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0])
    privatize = EmbeddingPrivatizer(clip_norm=plan.clip_norm, noise_multiplier=sigma,
                                    seed=seed)
    from parties.runtime.saved import ledger_to_json

    led = ledger_to_json(acct.state_dict())
    led["max_publications"] = state.get("max_publications", {})  # the run's plan, kept
    for key in ("reserve", "extra", "reserve_refusals"):  # the run's reserve, kept
        if key in state:
            led[key] = state[key]
    led["predictions"] = [*state.get("predictions", []),
                          {"source": source, "rows": n, "release_mu": mu_one,
                           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
    atomic_write(path, orjson.dumps(led))
    part.ledger.clear()
    part.ledger.update(led)
    report = {"enabled": True, "noise_multiplier": sigma, "clip_norm": plan.clip_norm,
              "release_mu": mu_one, "prediction_mu": prediction_mu,
              "prediction_ledger_mu": ledger_mu, "max_releases": limit,
              "mu": total, "epsilon": epsilon_for_delta(total, plan.delta),
              "delta": plan.delta, "target_mu": plan.target_mu,
              "publications_max_test": acct.group_max("test"), **new}
    return privatize, report


# ---------------------------------------------------------------------------- party
class PredictParty:
    """One party of a prediction over the bus: ``await PredictParty(...).run()``.

    Args:
        party: its party id: ``"active"``, ``"passive"``, ``"passive2"`` … (one of the
            run's: the active part's saved ``passive_parties`` says how many).
        run_dir: the training run's directory (with ``model/<party id>/``).
        broker / run_id / security: as :class:`parties.runtime.party.Party` (``run_id`` is the
            prediction's own topic namespace).
        out: the active party's output directory (``predictions.csv``, ``predict.json``).
        data / id_column / rows_file: see :func:`select_rows`.
        timeout_s: deadline of each wait for the partners (handshake, embeddings, done).
        connect: how to join the bus instead of a :class:`pubsub.Bus` to ``broker``
            (see :class:`parties.runtime.party.Party`), e.g. ``MemoryBroker.connect``.
        models: the model factory that trained the run (see
            :func:`parties.runtime.saved.load_party_model`); None: the recorded specs.

    Raises:
        ValueError: ``party`` is not a party id.
        parties.runtime.saved.SavedModelError: its part is missing or unusable, or the run had no
            such party.
        PredictionBudgetExceeded: (passive, DP on) a record of the rows would pass
            ``dp_predict_max_releases`` prediction releases; checked here, before the
            party joins the bus, and again when it charges the release.
        PredictionIdsRequired: (DP on) a file without IDs.
    """

    def __init__(self, party: str, run_dir: str | Path, *, broker: str = "", run_id: str,
                 out: str | Path | None = None, data: str | None = None,
                 id_column: str = DEFAULT_ID_COLUMN, security: CurveClient | None = None,
                 timeout_s: float = 60.0, connect: Any = None, models: Any = None,
                 rows_file: str | None = None) -> None:
        from parties.core.ids import role_of

        role = role_of(party)
        if role == "active" and out is None:
            raise ConfigError("out", "the active party needs an output directory")
        self.party, self.role = party, role
        self.part = load_party_model(run_dir, party, models=models)
        ids = self.part.cfg.party_ids
        if party not in ids:
            raise SavedModelError(self.part.path, f"party {party!r} is not a party of this "
                                  f"run (its parties: {', '.join(ids)})")
        #: whom this party meets: every passive party (active), the active party (passive)
        self.partners: tuple[str, ...] = ids[1:] if role == "active" else ("active",)
        self.rows = select_rows(self.part, data, id_column, rows_file)
        if role == "passive":  # refused before anything is released (or even started)
            charge(self.part, len(self.rows.rows), self.rows.source, self._ids(),
                   dry_run=True)
        self.x = torch.from_numpy(self.part.encoder.transform(self.rows.frame))
        self.broker, self.run_id, self.security = broker, run_id, security
        self._connect = connect
        self.out = Path(out) if out is not None else None
        self.timeout_s = timeout_s
        self.asked = 0  # active: requests for a passive party's embeddings again
        #: this side's hello as the handshake said it (answered to a partner's late hello)
        self._greeting: dict[str, Any] = {}
        self.log = log.bind(party=party, run_id=run_id)

    def _ids(self) -> list[str] | None:
        ids = self.rows.ids
        return None if ids is None else [str(i) for i in ids]

    # topics of the prediction P: a hello goes to its addressee's topic; each passive
    # party's embeddings have its own (owned by it in a run membership with `owned`)
    def _hello(self, party: str) -> str:
        return f"ctl/{self.run_id}/hello/{party}"

    def _emb(self, party: str) -> str:
        return f"eval/{self.run_id}/{party}/predict"

    @property
    def _done(self) -> str:
        return f"ctl/{self.run_id}/done"

    def _resend(self, party: str) -> str:
        """The active party asks ``party`` to publish its embeddings again (lost to a
        broker restart)."""
        return f"ctl/{self.run_id}/resend/{party}"

    @property
    def _resend_every_s(self) -> float:
        every = self.part.cfg.timeouts.resend_interval_s
        return every if every > 0 else self.timeout_s

    async def run(self) -> dict[str, Any]:
        """Handshake, exchange, write the outputs (active); return a summary.

        Raises:
            SavedModelMismatch: a partner's saved part is of another run (naming it).
            ConfigMismatch: a partner predicts other rows (naming it).
            HandshakeTimeout / PartnerStalled: a partner did not come or answer (naming it).
            PartnerMisbehaved: a passive party's embeddings are malformed (naming it).
        """
        n = int(self.x.shape[0])
        emb_bytes = n * int(self.part.manifest["embedding_dim"]) * 4 + (1 << 16)
        cfg = BusConfig(topic_max_bytes=max(64 << 20, 2 * emb_bytes))
        name = f"predict-{self.party}"
        joined = (self._connect(name, config=cfg) if self._connect is not None else
                  Bus(self.broker, name=name, config=cfg, security=self.security))
        async with joined as bus:
            if self.role == "active":
                await bus.subscribe_many([self._emb(p) for p in self.partners],
                                         limits=BufferLimits(max_msgs=2,
                                                             max_bytes=2 * emb_bytes))
            else:
                await bus.subscribe(self._done)
                await bus.subscribe(self._resend(self.party),
                                    limits=BufferLimits(max_msgs=16, max_bytes=1 << 16))
            # subscribed last: a partner's hello proves the above reached its publisher
            await bus.subscribe(self._hello(self.party))
            heard = await self._handshake(bus)
            if self.role == "passive":
                bus.accept_only(heard["active"], [self._done, self._resend(self.party)])
                return await self._passive(bus)
            for p in self.partners:  # only the client each handshake came from
                bus.accept_only(heard[p], [self._emb(p)])
            return await self._active(bus)

    async def _handshake(self, bus: Transport) -> dict[str, str]:
        """Meet the partners (:func:`pubsub.session.rendezvous`) over a digest of the
        part's run id, config digest and the rows; returns each partner's bus client id.

        Raises:
            SavedModelMismatch / ConfigMismatch: a partner's part is of another run / it
                predicts other rows (both sides fail: the mismatch lingers).
            HandshakeTimeout: naming the partners that did not come.
        """
        mine = {**self.part.identity, "rows": self.rows.digest, "n": int(self.x.shape[0])}
        digest = _digest([str(mine[k]) for k in ("run_id", "config_digest", "rows", "n")])
        self._greeting = {"me": self.party, "peers": list(self.partners), "digest": digest,
                          "say": [self._hello(p) for p in self.partners],
                          "info": {"who": mine}}
        try:
            heard = await rendezvous(
                bus, **self._greeting, hear=[self._hello(self.party)],
                timeout_s=self.timeout_s, interval_s=0.1, mismatch_linger_s=0.5,
                on_found=lambda peer, _: self.log.info("predict.partner_found", partner=peer))
        except RendezvousTimeout as exc:
            raise HandshakeTimeout(", ".join(exc.missing), self.timeout_s,
                                   self.run_id) from None
        except SettingsMismatch as exc:
            who = exc.hello.get("who")
            theirs: dict[str, Any] = dict(who) if isinstance(who, dict) else {}
            self.log.error("predict.partner_mismatch", partner=exc.peer)
            check_same_run(mine, theirs, party=exc.peer)
            raise ConfigMismatch({"rows": mine["rows"], "n": mine["n"]},
                                 {"rows": theirs.get("rows"), "n": theirs.get("n")},
                                 party=exc.peer) from None
        return {p: str(heard[p]["publisher"]) for p in self.partners}

    async def _passive(self, bus: Transport) -> dict[str, Any]:
        from parties.models.model import embed

        bottom = self.part.modules[0]
        emb = await asyncio.to_thread(embed, bottom, self.x)
        privatize, dp = await asyncio.to_thread(charge, self.part, int(emb.shape[0]),
                                                self.rows.source, self._ids())
        if privatize is not None:
            emb = privatize(torch.from_numpy(emb))[1].numpy()
        topic = self._emb(self.party)
        bus.publish_nowait(topic, [emb], {"dp": dp}, copy=False)
        self.log.info("predict.published", rows=int(emb.shape[0]), dp=dp["enabled"])
        resent = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        hear = [self._done, self._resend(self.party), self._hello(self.party)]
        while True:  # until done; the same release again if the active party asks
            try:
                msg = await wait_any(bus, hear, max(0.0, deadline - loop.time()))
            except DeadlineExceeded:
                self.log.warning("predict.no_done", waited_s=self.timeout_s)
                break
            if msg.topic == self._done:
                break
            if msg.topic == hear[2]:  # the active party missed our last hello
                answer_hello(bus, msg, **self._greeting)
                continue
            if msg.meta.get("topic") == topic:  # the same bytes: nothing more is charged
                bus.publish_nowait(topic, [emb], {"dp": dp}, copy=False)
                resent += 1
                self.log.info("predict.resent", topic=topic, resent=resent)
        return {"role": "passive", "party": self.party, "rows": int(emb.shape[0]), "dp": dp,
                "resent": resent}

    async def _embeddings(self, bus: Transport) -> dict[str, Any]:
        """Every passive party's embeddings of the rows (its message), under one deadline,
        each checked (:func:`parties.algorithms.intake.check_tensor`).

        Raises:
            PartnerStalled: naming the passive parties whose embeddings did not come.
            PartnerMisbehaved: naming the one whose embeddings are malformed.
        """
        from parties.core.errors import PartnerMisbehaved
        from parties.algorithms.intake import TensorSpec, check_tensor

        n = len(self.x)
        spec = TensorSpec(width=int(self.part.manifest["embedding_dim"]), max_rows=max(n, 1),
                          rows=n)
        of = {self._emb(p): p for p in self.partners}
        got: dict[str, Any] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        hello = self._hello(self.party)
        while len(got) < len(of):
            waiting = [t for t, p in of.items() if p not in got]
            left = max(0.0, deadline - loop.time())
            try:
                msg = await wait_any(bus, [*waiting, hello], min(left, self._resend_every_s))
                if msg.topic == hello:  # a passive party missed our last hello
                    answer_hello(bus, msg, **self._greeting)
                    continue
            except DeadlineExceeded:
                if loop.time() < deadline:  # a slice: ask again (lost to a restart?)
                    for t in waiting:
                        self.asked += 1
                        self.log.warning("predict.resend_asked", partner=of[t], topic=t,
                                         asked=self.asked)
                        bus.publish_nowait(self._resend(of[t]), (), {"topic": t})
                    continue
                missing = ", ".join(of[t] for t in waiting)
                self.log.error("predict.partner_stalled", partner=missing,
                               waited_s=self.timeout_s)
                raise PartnerStalled(missing, "predict", self.timeout_s,
                                     "embeddings of the rows to predict") from None
            party = of[msg.topic]
            reason = check_tensor(msg.arrays, spec)
            if reason is not None:  # one release: nothing to wait for instead
                raise PartnerMisbehaved(party, msg.publisher, reason, 1)
            got[party] = msg
        return got

    async def _active(self, bus: Transport) -> dict[str, Any]:
        from parties.algorithms.fuse import fuse_of
        from parties.models.model import predict
        from parties.core.tasks import compute_metric, metric_name

        got = await self._embeddings(bus)
        bottom, top = self.part.modules
        task = self.part.manifest["task"]
        embs = [got[p].arrays[0] for p in self.partners]  # the run's party order
        pred = await asyncio.to_thread(predict, bottom, top, self.x, embs, task=task,
                                       fuse=fuse_of(self.part.cfg))
        pred = pred.astype(np.float64)
        label = self.part.manifest["label"]
        if task == "regression":
            pred = pred * label["std"] + label["mean"]
        y = labels_of(self.part, self.rows.frame)
        metric = None if y is None else compute_metric(task, y, pred)
        assert self.out is not None
        self.out.mkdir(parents=True, exist_ok=True)
        table = pd.DataFrame({"id" if self.rows.ids is not None else "row":
                              self.rows.ids if self.rows.ids is not None else self.rows.rows,
                              "prediction": pred})
        if y is not None:
            table["label"] = y
        with atomic_output(self.out / "predictions.csv", text=True) as f:
            table.to_csv(f, index=False)
        name = metric_name(task)
        dp_by_party = {p: dict(got[p].meta.get("dp", {})) for p in self.partners}
        summary = {"run_id": self.part.manifest["run_id"], "predict_id": self.run_id,
                   "source": self.rows.source, "rows": int(len(pred)), "task": task,
                   "metric_name": name, f"{'test' if self.rows.source == 'test_split' else 'data'}"
                   f"_{name}": metric, "metric": metric,
                   "parties": list(self.part.cfg.party_ids),
                   "dp": dp_by_party[self.partners[0]], "dp_by_party": dp_by_party,
                   "resends_asked": self.asked, "predictions": "predictions.csv"}
        bus.publish_nowait(self._done, (), {"ok": True})
        await asyncio.sleep(0.05)
        from parties.runtime.serve import write_json

        write_json(self.out / "predict.json", summary)
        self.log.info("predict.done", rows=int(len(pred)), parties=len(self.partners) + 1)
        return summary


# ---------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m parties predict PARTY_ID --run-dir DIR --broker ADDR [...]`` (party ids
    ``active``, ``passive``, ``passive2`` …)."""
    from pubsub.cli import add_security_arguments, security_from_args
    from pubsub.logs import configure_logging
    from pubsub.runner import run as run_loop

    from parties.runtime.exitcodes import ExitCode, exit_code_for
    from parties.core.ids import MAX_PASSIVE_PARTIES, check_run_id, passive_party_ids

    p = argparse.ArgumentParser(prog="python -m parties predict",
                                description="One party of a prediction with a saved model.")
    p.add_argument("party", choices=["active", *passive_party_ids(MAX_PASSIVE_PARTIES)],
                   metavar="PARTY_ID", help="active, passive, passive2 .. passive9")
    p.add_argument("--run-dir", required=True, help="the training run's directory")
    p.add_argument("--broker", required=True, help="broker base address tcp://HOST:PORT")
    p.add_argument("--run-id", default="predict", help="the prediction's topic namespace")
    p.add_argument("--out", help="output directory (active: predictions.csv, predict.json)")
    p.add_argument("--data", help="CSV/Parquet of new rows (default: the run's test split)")
    p.add_argument("--id-column", default=DEFAULT_ID_COLUMN, help="ID column of --data")
    p.add_argument("--timeout-s", type=float, default=60.0, help="each wait's deadline")
    p.add_argument("--events", help="append JSON log lines here")
    p.add_argument("--quiet", action="store_true",
                   help="no result line (the launcher of psfl vfl predict prints its own)")
    add_security_arguments(p)
    args = p.parse_args(argv)
    try:
        check_run_id(args.run_id)
        security = security_from_args(args, args.broker, identity=args.party)
        configure_logging(events_path=args.events, party=args.party, run_id=args.run_id)
        party = PredictParty(args.party, args.run_dir, broker=args.broker, run_id=args.run_id,
                             out=args.out, data=args.data, id_column=args.id_column,
                             security=security, timeout_s=args.timeout_s)
        result = run_loop(party.run(), event_loop="asyncio")
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        print(f"error ({args.party} party, predict): {exc}", file=sys.stderr)
        return int(code)
    if args.party == "active" and not args.quiet:
        m = result.get("metric")
        print(f"predicted {result['rows']} rows"
              + ("" if m is None or not math.isfinite(m) else
                 f", {result['metric_name']} {m:.6f}"), flush=True)
    return int(ExitCode.OK)


__all__ = ["DEFAULT_ID_COLUMN", "PREDICTION_LEDGER", "PredictParty", "PredictRows",
           "PredictionBudgetExceeded", "PredictionIdsRequired", "PredictionLedger",
           "atomic_write", "charge", "file_lock", "labels_of", "main", "prediction_ledger",
           "select_rows"]
