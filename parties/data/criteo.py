"""A Criteo-shaped click table, generated and written as Parquet shards per party (numpy +
pyarrow; nothing is downloaded).

The Criteo display-advertising tables (Kaggle: 45,840,617 rows; Terabyte: 4.4 billion)
have a 0/1 click label, 13 integer columns (counts, heavy tailed, often missing) and 26
categorical columns (8-hex-digit hashed strings, 3 to several million levels, heavy
tailed, often missing). :func:`write_criteo` draws a table of that shape:

* ``I1 .. I13``: ``floor(exp(N(mu_j, sigma_j)))`` counts, 2 %-40 % missing;
* ``C1 .. C26``: column ``j`` has ``L_j`` levels (log-spaced from 4 to ``max_levels``,
  default 10^6), each an 8-hex-digit string; a row's level is Zipf-distributed
  (``zipf(1.15) − 1 mod L_j``, so a few levels are frequent and most are rare), 0 %-30 %
  missing;
* ``label``: Bernoulli of ``sigmoid(b + Σ_j w_j log1p(I_j) + Σ_j e_j[level] + Σ
  interactions)``: ``e_j`` a random effect per level (N(0, s_j), hashed into 4,096 effects
  per column), three cross-party interactions (``C1 x C14``, ``I1 x C15``, ``C2 x I8``: a
  random effect of the pair's combined hash), ``b`` set so that about 25 % of rows click
  (Criteo Kaggle: 25.6 %).

The active party's files hold ``label``, ``I1 .. I6`` and ``C1 .. C13``; the passive
parties share ``I7 .. I13`` and ``C14 .. C26`` (split in order among them). Rows are the
same records in the same order in every party's files (aligned by row order), shard
``k`` of each party holding the same rows. Shards are drawn from
``default_rng([seed, k])`` and written atomically, so an interrupted run resumes where it
stopped (:func:`write_criteo` skips shards that exist).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CRITEO_LABEL = "label"
N_INT, N_CAT = 13, 26
_EFFECTS = 4096
_INTERACTIONS = (("C1", "C14"), ("I1", "C15"), ("C2", "I8"))


@dataclass(frozen=True, slots=True, kw_only=True)
class CriteoSpec:
    """Parameters of :func:`write_criteo` (see the module docstring)."""

    rows: int
    seed: int = 0
    passive_parties: int = 1
    max_levels: int = 1_000_000
    shard_rows: int = 250_000
    row_group_rows: int = 65_536

    def __post_init__(self) -> None:
        if self.rows < 1 or self.shard_rows < 1 or self.row_group_rows < 1:
            raise ValueError(f"rows, shard_rows and row_group_rows must be >= 1: {self}")
        if not 1 <= self.passive_parties <= 20:  # the 20 passive columns
            raise ValueError(f"passive_parties must be in [1, 20], got {self.passive_parties}")
        if self.max_levels < 4:
            raise ValueError(f"max_levels must be >= 4, got {self.max_levels}")

    @property
    def shards(self) -> int:
        return -(-self.rows // self.shard_rows)


def party_columns(passive_parties: int = 1) -> dict[str, list[str]]:
    """Each party's columns (the active party's with the label first)."""
    from parties.core.ids import passive_party_ids

    active = [CRITEO_LABEL] + [f"I{j}" for j in range(1, 7)] + [f"C{j}" for j in range(1, 14)]
    rest = [f"I{j}" for j in range(7, 14)] + [f"C{j}" for j in range(14, 27)]
    out = {"active": active}
    ids = passive_party_ids(passive_parties)
    for i, p in enumerate(ids):
        out[p] = rest[i::passive_parties]
    return out


class _Truth:
    """The table's fixed parameters (vocabularies, effects), from ``seed``."""

    def __init__(self, spec: CriteoSpec) -> None:
        rng = np.random.default_rng([spec.seed, 0xC417E0])
        self.levels = np.round(np.geomspace(4, spec.max_levels, N_CAT)).astype(np.int64)
        rng.shuffle(self.levels)
        self.int_mu = rng.uniform(0.0, 3.0, N_INT)
        self.int_sigma = rng.uniform(0.5, 1.5, N_INT)
        self.int_missing = rng.uniform(0.02, 0.4, N_INT)
        self.int_w = rng.normal(0.0, 0.25, N_INT)
        self.cat_missing = rng.uniform(0.0, 0.3, N_CAT)
        self.cat_scale = rng.uniform(0.2, 0.8, N_CAT)
        self.effects = rng.normal(0.0, 1.0, (N_CAT, _EFFECTS)) * self.cat_scale[:, None]
        self.pair = rng.normal(0.0, 0.8, (len(_INTERACTIONS), _EFFECTS))
        self.salt = rng.integers(0, 2**32, N_CAT, dtype=np.uint64)
        self.bias = 0.0
        self._vocab: dict[int, object] = {}

    def vocab(self, j: int) -> object:
        """Column ``C{j+1}``'s level strings (8 hex digits, distinct), a pyarrow array."""
        import pyarrow as pa

        if j not in self._vocab:
            n = int(self.levels[j])
            ids = (np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B1)
                   + self.salt[j]) & np.uint64(0xFFFFFFFF)
            shifts = np.arange(28, -4, -4, dtype=np.uint64)
            digits = ((ids[:, None] >> shifts[None, :]) & np.uint64(0xF)).astype(np.uint8)
            text = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)[digits]
            self._vocab[j] = pa.array(np.ascontiguousarray(text).view("S8").ravel()
                                      ).cast(pa.string())
        return self._vocab[j]


def _mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + b.astype(np.uint64)
        z ^= z >> np.uint64(31)
    return (z % np.uint64(_EFFECTS)).astype(np.int64)


def _draw(spec: CriteoSpec, truth: _Truth, k: int, *, strings: bool = True
          ) -> tuple[dict[str, object], np.ndarray, np.random.Generator]:
    """Shard ``k``'s feature columns (pyarrow arrays by name; none when not ``strings``),
    its logits without the intercept, and its generator (the label is drawn next)."""
    import pyarrow as pa

    n = min(spec.shard_rows, spec.rows - k * spec.shard_rows)
    rng = np.random.default_rng([spec.seed, k])
    cols: dict[str, object] = {}
    logit = np.zeros(n)
    ints: dict[str, np.ndarray] = {}
    for j in range(N_INT):
        v = np.floor(np.exp(rng.normal(truth.int_mu[j], truth.int_sigma[j], n)))
        miss = rng.random(n) < truth.int_missing[j]
        logit += truth.int_w[j] * np.where(miss, 0.0, np.log1p(v) - truth.int_mu[j])
        ints[f"I{j + 1}"] = np.where(miss, -1, v).astype(np.int64)
        if strings:
            cols[f"I{j + 1}"] = pa.array(v.astype(np.int64), mask=miss)
    cats: dict[str, np.ndarray] = {}
    for j in range(N_CAT):
        lv = (rng.zipf(1.15, n) - 1) % truth.levels[j]
        miss = rng.random(n) < truth.cat_missing[j]
        logit += np.where(miss, 0.0, truth.effects[j, _mix(lv, np.full(n, j))])
        cats[f"C{j + 1}"] = np.where(miss, -1, lv)
        if strings:
            idx = pa.array(lv.astype(np.int32), mask=miss)
            cols[f"C{j + 1}"] = pa.DictionaryArray.from_arrays(idx, truth.vocab(j)
                                                               ).dictionary_decode()
    for i, (a, b) in enumerate(_INTERACTIONS):
        va = cats.get(a, ints.get(a))
        vb = cats.get(b, ints.get(b))
        logit += truth.pair[i, _mix(va, vb)]
    return cols, logit, rng


def _shard(spec: CriteoSpec, truth: _Truth, k: int) -> dict[str, object]:
    """Shard ``k``'s columns (pyarrow arrays) by name, the label included."""
    import pyarrow as pa

    cols, logit, rng = _draw(spec, truth, k)
    p = 1.0 / (1.0 + np.exp(-(logit + truth.bias)))
    cols[CRITEO_LABEL] = pa.array((rng.random(len(p)) < p).astype(np.int64))
    return cols


def _calibrate(spec: CriteoSpec, truth: _Truth, rate: float = 0.25) -> None:
    """Set the intercept so that the expected click rate of a 20,000-row pilot is
    ``rate``."""
    pilot = CriteoSpec(rows=20_000, seed=spec.seed + 7919, max_levels=spec.max_levels,
                       shard_rows=20_000)
    _, logit, _ = _draw(pilot, truth, 0, strings=False)
    lo, hi = -20.0, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        got = float(np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))))
        lo, hi = (mid, hi) if got < rate else (lo, mid)
    truth.bias = (lo + hi) / 2


def write_criteo(out_dir: str | Path, spec: CriteoSpec, *, progress: bool = False
                 ) -> dict[str, Path]:
    """Write each party's shards under ``out_dir/<party>/part-NNNNN.parquet``.

    Returns each party's directory. A shard that exists is kept (resumable; the same
    spec gives the same shards); a ``_spec.json`` records the spec and refuses another
    spec in the same directory (ValueError).
    """
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = out / "_spec.json"
    want = {"rows": spec.rows, "seed": spec.seed, "passive_parties": spec.passive_parties,
            "max_levels": spec.max_levels, "shard_rows": spec.shard_rows}
    if meta.exists() and json.loads(meta.read_text()) != want:
        raise ValueError(f"{out} holds another table ({meta.read_text()}); use another "
                         "directory")
    meta.write_text(json.dumps(want))
    groups = party_columns(spec.passive_parties)
    dirs = {p: out / p for p in groups}
    for d in dirs.values():
        d.mkdir(exist_ok=True)
    truth = _Truth(spec)
    _calibrate(spec, truth)
    for k in range(spec.shards):
        name = f"part-{k:05d}.parquet"
        if all((dirs[p] / name).exists() for p in groups):
            continue
        cols = _shard(spec, truth, k)
        for p, names in groups.items():
            final = dirs[p] / name
            tmp = final.with_suffix(".tmp")
            table = pa.table({c: cols[c] for c in names})
            pq.write_table(table, tmp, row_group_size=spec.row_group_rows)
            os.replace(tmp, final)
        if progress:
            print(f"criteo: shard {k + 1}/{spec.shards}", flush=True)
    return dirs


__all__ = ["CRITEO_LABEL", "CriteoSpec", "party_columns", "write_criteo"]
