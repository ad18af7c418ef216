"""The "your file, their file" cross-organisation workflow, measured: what a user's own
files meet on the way in (an extreme value, bad settings, a file per branch), and what
the active party could do alone.

What runs (``--parts``, all by default; every ``psfl`` command is a subprocess of this
checkout, ``python -m sim.cli``, with a timeout):

``rmse``
    A generated regression table (:func:`make_regression_table`: 3,000 rows, numeric
    ``area``, ``dist``, ``rooms``, categorical ``kind``, ISO-date ``listed``, label
    ``price``; numpy, fixed seed) with ONE extreme test row (:func:`place_extreme`): its
    ``area`` is 200 times the largest ``area`` of every other row, in a row that is in the
    test split (:func:`parties.data.train_test_indices`, test_frac 0.3) of seeds 0, 1 and
    2. ``psfl vfl run --dataset table.csv --set label=price --set task=regression`` (the
    in-memory path, default data settings) three times at seed 0: ``rmse_spread`` is the
    largest test RMSE (``metrics.json``'s ``test_rmse``) over the smallest (acceptance:
    <= 1.05). ``rmse_spread_seeds``: the same over seeds 0, 1, 2 (information). Controls
    in the same run: the table without the extreme row at seed 0 (``rmse_vs_clean``: the
    extreme row's cost, ~1 when the fitted encoder clips to training quantiles,
    ``vfl.data.stream_clip_quantile``) and the extreme table with clipping off
    (``data.stream_clip_quantile=0``, ``rmse_unclipped_vs_clean``: what one row did
    before the encoder clipped).
``reject``
    ``psfl vfl party --job`` refusals (one organisation's party with its own file: a bad
    value ``job_bad_value``, a file without the join key ``job_missing_join_key``, the
    label in the passive party's file ``job_label_in_passive_file``) and
    ``psfl vfl run`` refusals, each timed from the command's start to its exit:
    ``bad_value`` (``--set epochs=-1``), ``csv_stream`` (``data.stream=true`` on a CSV
    file), ``nan_column`` (a feature column with no value at all named in
    ``data.active_columns``), ``unknown_column`` (a column the file lacks named in
    ``data.active_columns``). Each must exit 2 and its stderr must name the offending
    key, column or file (``named``). ``max_reject_s``: the largest time (acceptance: <= 2).
``synth``
    FedForge on the same rows, the same declared public schema (:data:`SYNTH_SCHEMA`,
    public bounds written here, not read from the rows), seed 0, ε = 1, K = 3: once on one
    table split by FedForge (``psfl synth run --dataset T.csv --parties 3 --set
    data.schema_file=S.toml``), then from three branch files holding exactly the rows each
    party held (the first run's ``data/parties/p00k.parquet`` written as CSV) with the
    first run's holdout (``psfl synth run --party-files ... --schema S.toml --holdout
    H.csv``). Both runs' TV is against the pooled party rows (the coordinator's
    ``data/train.parquet``: ``same_reference_rows`` checks they hold the same rows). Both
    runs set ``noise_seed`` (the parties' noise generators, a testing setting) so the two
    paths draw the same DP noise: without it each run draws fresh OS-entropy noise, and
    two runs of the SAME path differ by that noise's effect on TV (the full mode
    measures it: ``synth_tv_spread_os_noise``, the larger range of 3 runs per path, and
    ``synth_tv_diff_os_noise_median``, the difference of the two paths' medians). They also pin ``PYTHONHASHSEED`` (:data:`SYNTH_ENV`): mbi's
    sampler orders columns by iterating a set of names, so the same model and seed
    sample different rows in each process otherwise. With both pinned the two paths
    release the same noisy marginals and the same rows, so any difference is the path's.
    ``synth_tv_diff`` = |branch − one table| (acceptance: <= 0.01).
``active_only``
    :func:`active_only_auc`: the active party's own model on its own columns (the
    stronger by test AUC of an MLP and gradient boosting, the VFL split), on the bank's
    columns of the generated bank-and-partner scenario's merged table
    (:func:`parties.data.bank_partner.make_bank_partner`).
two hosts
    :func:`two_host_figures` (``bench/cross_org_hosts.py``): the commands of
    ``docs/tutorials/bank-and-partner.md`` on three hosts made of network namespaces (the
    broker, the bank, the partner: each its own address and directory; plain processes
    on loopback where namespaces cannot be made, ``two_hosts_netns`` false): the partner
    drafts its schema from its own file, both align on ``customer_id``, train without
    DP (8 epochs; ``auc_two_hosts``) and predict for new customers; the same settings on
    the merged table (``auc_merged``, acceptance: within 0.01); with the partner's
    records at µ = 8 (2 epochs, five noise seeds: ``auc_dp_two_hosts``, the median,
    acceptance: above ``auc_active_only``, the run's own active-only baseline: the
    bank's columns alone, the stronger by validation AUC of gradient boosting and an
    MLP, the same split; ``dp_columns_dropped``, acceptance: empty); and with DP at
    20,000 customers per side (``auc_dp_two_hosts_large``, ``auc_active_only_large``).
    ``--skip-two-hosts`` leaves it out.

Usage::

    python bench/cross_org.py --quick --json /tmp/cross_org.json   # ~2 min here (root)
    python bench/cross_org.py --quick --json /tmp/cross_org.json --skip-two-hosts
    python bench/cross_org.py --parts rmse,reject --json /tmp/co.json --skip-two-hosts

JSON: ``{"summary": {...}, "details": {...}}``. ``summary``: ``rmse_spread``,
``rmse_spread_seeds``, ``rmse_vs_clean``, ``rmse_unclipped_vs_clean``, ``max_reject_s``,
``rejects_named`` (how many refusals named their column/key, of ``rejects_total``),
``synth_tv_one_table``, ``synth_tv_branch_files``, ``synth_tv_diff`` (full mode also
``synth_tv_spread_os_noise``, ``synth_tv_diff_os_noise_median``), ``auc_active_only``
(the stronger model's; with the two-host part it becomes ``auc_active_only_sklearn``, a
cross-check), ``pass`` (every acceptance of the parts run) and, from the two-host part,
``two_hosts_netns``, ``auc_two_hosts``, ``auc_merged``, ``auc_dp_two_hosts``,
``auc_active_only``, ``dp_columns_dropped``, ``auc_dp_two_hosts_large``,
``auc_active_only_large``. ``details``: per part, each run's figures, exit code and wall
time; no record of any table is printed or written.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parties.data import train_test_indices  # noqa: E402

PARTS = ("rmse", "reject", "synth", "active_only")
#: acceptance limits
RMSE_SPREAD_MAX = 1.05
REJECT_MAX_S = 2.0
TV_DIFF_MAX = 0.01
AUC_MERGED_TOL = 0.01  # auc_two_hosts within this of auc_merged
#: the regression table
REG_ROWS = 3_000
REG_LABEL = "price"
EXTREME_COLUMN = "area"
EXTREME_FACTOR = 200.0
SPLIT_SEEDS = (0, 1, 2)
TEST_FRAC = 0.3
#: the FedForge table and its declared public schema (public bounds, not the rows')
SYNTH_ROWS = 4_000
SYNTH_LABEL = "sold"
SYNTH_PARTIES = 3
SYNTH_EPSILON = 1.0
#: the FedForge runs' added environment: mbi's sampler (``synthetic_data``) orders a
#: column's parents by iterating a set of column names, so with Python's per-process
#: string hashing the same fitted model and seed give different rows in each process
#: (a TV difference between two runs of the same path); pinned, the two paths are
#: compared on the same sampling
SYNTH_ENV = {"PYTHONHASHSEED": "0"}
SYNTH_SCHEMA = """\
version = 1
dataset = "cross_org_synth"
description = "declared public bounds of bench/cross_org.py's generated table"

[columns.age]
kind = "numeric"
lo = 18
hi = 90
fill = 45

[columns.income]
kind = "numeric"
lo = 0
hi = 500000
fill = 20000
log = true

[columns.region]
kind = "categorical"
categories = ["N", "E", "S", "W"]

[columns.product]
kind = "categorical"
categories = ["a", "b", "c"]

[columns.sold]
kind = "categorical"
categories = ["no", "yes"]
"""


# --------------------------------------------------------------------------- helpers


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The subprocesses' environment: this checkout first on the path, plus ``extra``."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                     if env.get("PYTHONPATH") else "")
    return env


def psfl(args: list[str], timeout_s: float, env: dict[str, str] | None = None
         ) -> dict[str, Any]:
    """Run ``psfl ARGS`` (``python -m sim.cli`` of this checkout, with ``env`` added to
    the environment): exit code, wall seconds from start to exit, and stdout/stderr (kept
    in memory, never written out whole)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "sim.cli", *args], cwd=ROOT,
                              env=_env(env),
                              capture_output=True, text=True, timeout=timeout_s)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")) \
            + f"\n(timed out after {timeout_s} s)"
    return {"exit_code": code, "wall_s": time.perf_counter() - t0, "stdout": out,
            "stderr": err}


def _tail(run: dict[str, Any], n: int = 800) -> str:
    """The end of a failed run's output (the launcher's messages, no records)."""
    return (run["stdout"] + run["stderr"])[-n:]


def make_regression_table(n: int = REG_ROWS, seed: int = 0) -> pd.DataFrame:
    """A regression table (no extreme value yet): ``area``, ``dist``, ``rooms``
    (numeric), ``kind`` (4 levels), ``listed`` (ISO dates over ~2 years) and the label
    ``price``, a noisy function of them. Deterministic in ``(n, seed)``."""
    rng = np.random.default_rng(seed)
    area = rng.normal(80.0, 20.0, n).clip(15.0, None)
    dist = rng.uniform(0.0, 30.0, n)
    rooms = rng.integers(1, 7, n)
    kind = rng.choice(["flat", "house", "loft", "studio"], n, p=[0.45, 0.3, 0.1, 0.15])
    days = rng.integers(0, 730, n)
    listed = (np.datetime64("2023-01-01") + days.astype("timedelta64[D]")).astype(str)
    price = (2.0 * area - 1.5 * dist + 8.0 * rooms
             + np.select([kind == "house", kind == "loft"], [40.0, 25.0], 0.0)
             + 0.01 * days + rng.normal(0.0, 10.0, n))
    return pd.DataFrame({"area": area.round(1), "dist": dist.round(2), "rooms": rooms,
                         "kind": kind, "listed": listed, REG_LABEL: price.round(2)})


def extreme_row_index(n_rows: int, seeds: tuple[int, ...] = SPLIT_SEEDS,
                      test_frac: float = TEST_FRAC) -> int:
    """The first row that is in the test split of every seed in ``seeds``
    (:func:`parties.data.train_test_indices`)."""
    common: np.ndarray | None = None
    for s in seeds:
        _, test = train_test_indices(n_rows, test_frac=test_frac, seed=s)
        common = test if common is None else np.intersect1d(common, test)
    if common is None or common.size == 0:
        raise ValueError(f"no row is in the test split of every seed {seeds}")
    return int(common[0])


def place_extreme(frame: pd.DataFrame, column: str = EXTREME_COLUMN,
                  factor: float = EXTREME_FACTOR, seeds: tuple[int, ...] = SPLIT_SEEDS,
                  test_frac: float = TEST_FRAC) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A copy of ``frame`` with one value of ``column`` set to ``factor`` × the column's
    largest value over every other row (so over every seed's training rows), in the row
    :func:`extreme_row_index` picks; and what was placed (row, column, value, each seed's
    training maximum, the row's test membership per seed)."""
    row = extreme_row_index(len(frame), seeds, test_frac)
    others = frame[column].drop(index=frame.index[row])
    value = round(float(factor * others.max()), 6)
    out = frame.copy()
    out[column] = out[column].astype(float)
    out.iloc[row, out.columns.get_loc(column)] = value
    train_max, in_test = {}, {}
    for s in seeds:
        tr, te = train_test_indices(len(frame), test_frac=test_frac, seed=s)
        train_max[str(s)] = float(out[column].to_numpy()[tr].max())
        in_test[str(s)] = bool(np.isin(row, te))
    return out, {"row": row, "column": column, "value": value, "factor": factor,
                 "train_max": train_max, "in_test_split": in_test}


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- parts


def _vfl_rmse(csv: Path, out: Path, seed: int, epochs: int, extra: list[str],
              timeout_s: float) -> dict[str, Any]:
    run = psfl(["vfl", "run", "--dataset", str(csv), "--set", f"label={REG_LABEL}",
                "--set", "task=regression", "--set", f"seed={seed}", "--set", f"epochs={epochs}",
                "--out", str(out), *extra], timeout_s)
    rec: dict[str, Any] = {"seed": seed, "exit_code": run["exit_code"],
                           "wall_s": round(run["wall_s"], 2)}
    mpath = out / "metrics.json"
    if run["exit_code"] != 0 or not mpath.is_file():
        rec["error_tail"] = _tail(run)
        return rec
    m = json.loads(mpath.read_text())
    rec["test_rmse"] = m.get("test_rmse")
    return rec


def rmse_part(work: Path, quick: bool, timeout_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The extreme-row regression runs (see the module docstring)."""
    epochs = 10 if quick else 20
    clean = make_regression_table()
    table, placed = place_extreme(clean)
    d = work / "rmse"
    d.mkdir(parents=True, exist_ok=True)
    csv, clean_csv = d / "table.csv", d / "table_clean.csv"
    table.to_csv(csv, index=False)
    clean.to_csv(clean_csv, index=False)
    repeats = [_vfl_rmse(csv, d / f"seed0_run{i}", 0, epochs, [], timeout_s) for i in range(3)]
    seeds = [repeats[0]] + [_vfl_rmse(csv, d / f"seed{s}", s, epochs, [], timeout_s)
                            for s in SPLIT_SEEDS[1:]]
    ctl_clean = _vfl_rmse(clean_csv, d / "clean_seed0", 0, epochs, [], timeout_s)
    ctl_unclipped = _vfl_rmse(csv, d / "unclipped_seed0", 0, epochs,
                              ["--set", "data.stream_clip_quantile=0"], timeout_s)

    def ratio(rs: list[dict[str, Any]]) -> float | None:
        vals = [r.get("test_rmse") for r in rs]
        if any(v is None for v in vals):
            return None
        return round(max(vals) / min(vals), 4)

    r0 = repeats[0].get("test_rmse")
    cl = ctl_clean.get("test_rmse")
    un = ctl_unclipped.get("test_rmse")
    summary = {"rmse_spread": ratio(repeats), "rmse_spread_seeds": ratio(seeds),
               "rmse_vs_clean": round(r0 / cl, 4) if r0 and cl else None,
               "rmse_unclipped_vs_clean": round(un / cl, 4) if un and cl else None}
    details = {"epochs": epochs, "rows": len(table), "extreme": placed,
               "repeats_seed0": repeats, "seeds": seeds, "clean_seed0": ctl_clean,
               "unclipped_seed0": ctl_unclipped}
    return summary, details


def reject_cases(d: Path) -> list[dict[str, Any]]:
    """The refusal cases: name, ``psfl vfl run`` arguments, and the word its stderr must
    contain (the offending key, column or file). Writes their input files under ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    base = make_regression_table(600, seed=1)
    reg = d / "reg.csv"
    base.to_csv(reg, index=False)
    binary = base.drop(columns=[REG_LABEL]).assign(
        sold=np.where(base[REG_LABEL] > base[REG_LABEL].median(), "yes", "no"))
    bin_csv = d / "binary.csv"
    binary.to_csv(bin_csv, index=False)
    nan_csv = d / "with_empty.csv"
    base.assign(empty=np.nan).to_csv(nan_csv, index=False)
    reg_args = ["--set", f"label={REG_LABEL}", "--set", "task=regression"]
    passive = ["--set", 'data.passive_columns=["dist", "rooms"]']
    # the cross-organisation path: one party of a job, its own file (psfl vfl party --job)
    own = d / "own.csv"
    binary.assign(cid=[f"c{i}" for i in range(len(binary))]).to_csv(own, index=False)
    job = d / "job.toml"
    job.write_text('[job]\nrun_id = "r1"\nbroker = "tcp://10.77.0.1:5555"\n'
                   'join_key = "cid"\n\n[vfl]\nlabel = "sold"\n')
    job_other_key = d / "job_other_key.toml"
    job_other_key.write_text(job.read_text().replace('"cid"', '"customer"'))
    party = ["vfl", "party", "--insecure", "--data", str(own)]
    return [
        {"case": "job_bad_value", "expect": "vfl.epochs",
         "cmd": [*party, "--job", str(job), "--role", "active", "--set", "epochs=0"]},
        {"case": "job_missing_join_key", "expect": "'customer'",
         "cmd": [*party, "--job", str(job_other_key), "--role", "active"]},
        {"case": "job_label_in_passive_file", "expect": "holds the label 'sold'",
         "cmd": [*party, "--job", str(job), "--role", "passive"]},
        {"case": "bad_value", "expect": "epochs",
         "args": ["--dataset", str(reg), *reg_args, "--set", "epochs=-1"]},
        {"case": "csv_stream", "expect": bin_csv.name,
         "args": ["--dataset", str(bin_csv), "--set", "label=sold", "--set", "data.stream=true"]},
        {"case": "nan_column", "expect": "'empty'",
         "args": ["--dataset", str(nan_csv), *reg_args,
                  "--set", 'data.active_columns=["area", "empty"]', *passive]},
        {"case": "unknown_column", "expect": "'nosuch'",
         "args": ["--dataset", str(reg), *reg_args,
                  "--set", 'data.active_columns=["area", "nosuch"]', *passive]},
    ]


def reject_part(work: Path, quick: bool, timeout_s: float
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each refusal once: its time from start to exit, exit code, stderr's first line."""
    d = work / "reject"
    cases = []
    for c in reject_cases(d):
        run = psfl([*c.get("cmd", ["vfl", "run", *c.get("args", [])]), "--out",
                    str(d / f"out_{c['case']}")], min(timeout_s, 120.0))
        first = next((ln for ln in run["stderr"].splitlines() if ln.strip()), "")
        cases.append({"case": c["case"], "exit_code": run["exit_code"],
                      "wall_s": round(run["wall_s"], 3), "stderr_first_line": first[:300],
                      "expect": c["expect"], "named": c["expect"] in run["stderr"]})
    times = [c["wall_s"] for c in cases]
    summary = {"max_reject_s": max(times),
               "rejects_named": sum(c["named"] for c in cases),
               "rejects_exit_2": sum(c["exit_code"] == 2 for c in cases),
               "rejects_total": len(cases)}
    return summary, {"cases": cases}


def make_synth_table(n: int = SYNTH_ROWS, seed: int = 0) -> pd.DataFrame:
    """FedForge's table: ``age``, ``income``, ``region``, ``product`` and a yes/no label
    ``sold`` that depends on them; within :data:`SYNTH_SCHEMA`'s declared bounds."""
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 80, n)
    income = np.round(rng.lognormal(10.0, 0.5, n), 2).clip(0, 500_000)
    region = rng.choice(["N", "S", "E", "W"], n)
    product = rng.choice(["a", "b", "c"], n, p=[0.5, 0.3, 0.2])
    z = (0.04 * (age - 45) + 0.8 * (np.log(income) - 10.0) + (product == "c")
         + 0.3 * (region == "N") + rng.normal(0.0, 1.0, n))
    return pd.DataFrame({"age": age, "income": income, "region": region, "product": product,
                         SYNTH_LABEL: np.where(z > 0.3, "yes", "no")})


def _synth_tv(run: dict[str, Any], out: Path) -> dict[str, Any]:
    rec: dict[str, Any] = {"exit_code": run["exit_code"], "wall_s": round(run["wall_s"], 2)}
    mpath = out / "metrics.json"
    if run["exit_code"] != 0 or not mpath.is_file():
        rec["error_tail"] = _tail(run)
        return rec
    m = json.loads(mpath.read_text())
    rec.update(avg_tv=m.get("avg_tv"), max_tv=m.get("max_tv"),
               n_workload=m.get("n_workload"),
               domain_source=(m.get("data") or {}).get("domain_source"),
               rows=(m.get("data") or {}).get("rows"))
    return rec


def _same_rows(a: Path, b: Path) -> bool:
    """Whether two Parquet files hold the same rows (as a multiset, any order)."""
    fa, fb = pd.read_parquet(a), pd.read_parquet(b)
    if list(fa.columns) != list(fb.columns) or len(fa) != len(fb):
        return False
    key = list(fa.columns)
    sa = fa.astype(str).sort_values(key).reset_index(drop=True)
    sb = fb.astype(str).sort_values(key).reset_index(drop=True)
    return bool(sa.equals(sb))


def synth_part(work: Path, quick: bool, timeout_s: float
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One table split by FedForge vs. the same rows as branch files (module docstring)."""
    d = work / "synth"
    d.mkdir(parents=True, exist_ok=True)
    table, schema = d / "table.csv", d / "schema.toml"
    make_synth_table().to_csv(table, index=False)
    schema.write_text(SYNTH_SCHEMA)
    common = ["--epsilon", f"{SYNTH_EPSILON:g}", "--set", f"label={SYNTH_LABEL}",
              "--set", "seed=0"]

    def one_table(out: Path, noise: list[str]) -> dict[str, Any]:
        return _synth_tv(psfl(["synth", "run", "--dataset", str(table), "--parties",
                               str(SYNTH_PARTIES), "--set", f"data.schema_file={schema}",
                               *common, *noise, "--out", str(out)], timeout_s,
                              env=SYNTH_ENV), out)

    def branches(out: Path, files: list[Path], hold: Path, noise: list[str]) -> dict[str, Any]:
        return _synth_tv(psfl(["synth", "run", "--party-files", *map(str, files),
                               "--schema", str(schema), "--holdout", str(hold), *common,
                               *noise, "--out", str(out)], timeout_s, env=SYNTH_ENV), out)

    seeded = ["--set", "noise_seed=0"]
    one = one_table(d / "one_table", seeded)
    details: dict[str, Any] = {"rows": SYNTH_ROWS, "parties": SYNTH_PARTIES,
                               "epsilon": SYNTH_EPSILON, "noise_seed": 0, "env": SYNTH_ENV,
                               "one_table": one}
    if one.get("avg_tv") is None:
        return {"synth_tv_one_table": None, "synth_tv_branch_files": None}, details
    files = []
    for p in sorted((d / "one_table" / "data" / "parties").glob("p*.parquet")):
        f = d / f"branch_{p.stem}.csv"
        pd.read_parquet(p).to_csv(f, index=False)
        files.append(f)
    hold = d / "holdout.csv"
    pd.read_parquet(d / "one_table" / "data" / "holdout.parquet").to_csv(hold, index=False)
    br = branches(d / "branch_files", files, hold, seeded)
    details["branch_files"] = br
    summary: dict[str, Any] = {
        "synth_tv_one_table": round(one["avg_tv"], 5),
        "synth_tv_branch_files": None if br.get("avg_tv") is None else round(br["avg_tv"], 5)}
    if br.get("avg_tv") is not None:
        summary["synth_tv_diff"] = round(abs(br["avg_tv"] - one["avg_tv"]), 5)
        details["same_reference_rows"] = _same_rows(
            d / "one_table" / "data" / "train.parquet",
            d / "branch_files" / "data" / "train.parquet")
        details["same_holdout_rows"] = _same_rows(
            d / "one_table" / "data" / "holdout.parquet",
            d / "branch_files" / "data" / "holdout.parquet")
    if not quick:  # the spread of each path with fresh OS-entropy noise per run
        os_one = [one_table(d / f"one_table_os{i}", []) for i in range(3)]
        os_br = [branches(d / f"branch_files_os{i}", files, hold, []) for i in range(3)]
        details["os_noise"] = {"one_table": os_one, "branch_files": os_br}
        tvs = [r.get("avg_tv") for r in os_one + os_br]
        if all(t is not None for t in tvs):
            one_tvs, br_tvs = tvs[:3], tvs[3:]
            summary["synth_tv_spread_os_noise"] = round(
                max(max(one_tvs) - min(one_tvs), max(br_tvs) - min(br_tvs)), 5)
            summary["synth_tv_diff_os_noise_median"] = round(
                abs(float(np.median(br_tvs)) - float(np.median(one_tvs))), 5)
    return summary, details


def _preprocess(train: pd.DataFrame, test: pd.DataFrame, max_levels: int = 50
                ) -> tuple[np.ndarray, np.ndarray, dict[str, list[str]]]:
    """One-hot of string columns with at most ``max_levels`` levels (others dropped),
    standardised numerics; NaN imputed with the training median (numerics) or a level of
    its own (strings). Fitted on ``train`` only."""
    num, cat, dropped = [], [], []
    for c in train.columns:
        if pd.api.types.is_numeric_dtype(train[c]):
            num.append(c)
        elif train[c].nunique(dropna=True) <= max_levels:
            cat.append(c)
        else:
            dropped.append(c)
    blocks_tr, blocks_te = [], []
    if num:
        xtr = train[num].to_numpy(dtype=float)
        xte = test[num].to_numpy(dtype=float)
        med = np.nanmedian(xtr, axis=0)
        med = np.where(np.isnan(med), 0.0, med)
        xtr = np.where(np.isnan(xtr), med, xtr)
        xte = np.where(np.isnan(xte), med, xte)
        mu, sd = xtr.mean(axis=0), xtr.std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        blocks_tr.append((xtr - mu) / sd)
        blocks_te.append((xte - mu) / sd)
    for c in cat:
        levels = sorted(train[c].fillna("<NA>").astype(str).unique())
        tr = train[c].fillna("<NA>").astype(str).to_numpy()
        te = test[c].fillna("<NA>").astype(str).to_numpy()
        blocks_tr.append((tr[:, None] == np.array(levels)[None, :]).astype(float))
        blocks_te.append((te[:, None] == np.array(levels)[None, :]).astype(float))
    return (np.hstack(blocks_tr), np.hstack(blocks_te),
            {"numeric": num, "one_hot": cat, "dropped": dropped})


def active_only_auc(frame: pd.DataFrame, label: str, feature_columns: list[str] | tuple[str, ...],
                    seed: int = 0, test_frac: float = 0.3, positive: str = "yes"
                    ) -> dict[str, Any]:
    """The active party's own model on its own columns: the stronger by test AUC of an
    sklearn MLPClassifier and a HistGradientBoostingClassifier, trained on the rows
    :func:`parties.data.train_test_indices` ``(len(frame), test_frac, seed)`` puts in
    training (the VFL run's split of an aligned table, rows in ``frame``'s order) and
    scored on its test rows. ``positive``: the label's positive class.

    Returns:
        ``{"auc": the stronger's, "best": its name, "auc_mlp", "auc_hgb", "columns",
        "train_rows", "test_rows", "positive_rate"}``.
    """
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.neural_network import MLPClassifier

    tr, te = train_test_indices(len(frame), test_frac=test_frac, seed=seed)
    x = frame[list(feature_columns)]
    y = (frame[label].astype(str) == str(positive)).to_numpy(dtype=int)
    xtr, xte, cols = _preprocess(x.iloc[tr], x.iloc[te])
    mlp = MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=300, early_stopping=True,
                        random_state=seed).fit(xtr, y[tr])
    hgb = HistGradientBoostingClassifier(random_state=seed).fit(xtr, y[tr])
    auc_mlp = float(roc_auc_score(y[te], mlp.predict_proba(xte)[:, 1]))
    auc_hgb = float(roc_auc_score(y[te], hgb.predict_proba(xte)[:, 1]))
    best = "mlp" if auc_mlp >= auc_hgb else "hgb"
    return {"auc": round(max(auc_mlp, auc_hgb), 4), "best": best,
            "auc_mlp": round(auc_mlp, 4), "auc_hgb": round(auc_hgb, 4), "columns": cols,
            "train_rows": int(len(tr)), "test_rows": int(len(te)),
            "positive_rate": round(float(y.mean()), 4)}


def active_only_part(work: Path, quick: bool, timeout_s: float
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`active_only_auc` on the bank's columns of the bank-and-partner scenario."""
    from parties.data.bank_partner import BANK_COLUMNS, JOIN_KEY, LABEL, make_bank_partner

    merged = make_bank_partner(5000, seed=0).merged.sort_values(JOIN_KEY).reset_index(drop=True)
    t0 = time.perf_counter()
    res = active_only_auc(merged, LABEL, BANK_COLUMNS, seed=0, test_frac=TEST_FRAC)
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    res["scenario"] = "make_bank_partner(5000, seed=0).merged, sorted by customer_id"
    return {"auc_active_only": res["auc"]}, res


# ----------------------------------------------------------- the two-host part (to write)


def two_host_figures(work: Path, quick: bool) -> dict[str, Any]:
    """The bank-and-partner scenario on two hosts (:mod:`cross_org_hosts`, beside this
    script): ``two_hosts_netns``, ``auc_two_hosts``, ``auc_merged``, ``auc_dp_two_hosts``,
    ``auc_active_only`` (the run's own baseline, its stronger model on test),
    ``dp_columns_dropped``, and ``details``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cross_org_hosts import two_host_figures as run

    res = run(work / "two_hosts", quick)
    return {**res["summary"], "details": res["details"]}


# --------------------------------------------------------------------------- main

RUNNERS = {"rmse": rmse_part, "reject": reject_part, "synth": synth_part,
           "active_only": active_only_part}


def acceptance(summary: dict[str, Any]) -> dict[str, bool]:
    """Each acceptance of the parts that ran: name -> held."""
    out: dict[str, bool] = {}
    if "rmse_spread" in summary:
        out["rmse_spread"] = summary["rmse_spread"] is not None and \
            summary["rmse_spread"] <= RMSE_SPREAD_MAX
    if "max_reject_s" in summary:
        out["max_reject_s"] = (summary["max_reject_s"] <= REJECT_MAX_S
                               and summary["rejects_named"] == summary["rejects_total"]
                               and summary["rejects_exit_2"] == summary["rejects_total"])
    if "synth_tv_one_table" in summary:
        diff = summary.get("synth_tv_diff")
        out["synth_tv_diff"] = diff is not None and diff <= TV_DIFF_MAX
    if "auc_two_hosts" in summary:
        out["two_hosts_netns"] = bool(summary["two_hosts_netns"])
        out["auc_two_hosts"] = abs(summary["auc_two_hosts"] - summary["auc_merged"]) <= AUC_MERGED_TOL
        out["auc_dp_two_hosts"] = summary["auc_dp_two_hosts"] > summary["auc_active_only"]
        out["dp_columns_dropped"] = summary["dp_columns_dropped"] == []
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer epochs; no OS-noise repeats of the FedForge runs")
    ap.add_argument("--json", help="write {summary, details} here")
    ap.add_argument("--work", help="keep the tables and run directories here "
                                   "(default: a temporary directory, removed)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run (default: {','.join(PARTS)})")
    ap.add_argument("--skip-two-hosts", action="store_true",
                    help="leave out the two-host figures (two_host_figures)")
    ap.add_argument("--timeout-s", type=float, default=300.0,
                    help="each psfl command's limit, seconds")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in RUNNERS]
    if unknown:
        ap.error(f"unknown part(s) {unknown}; choose from {list(RUNNERS)}")

    tmp = None
    if args.work:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="cross_org_")
        work = Path(tmp.name)
    summary: dict[str, Any] = {}
    details: dict[str, Any] = {"quick": args.quick, "parts": parts, "wall_s": {}}
    t_all = time.perf_counter()
    try:
        for name in parts:
            t0 = time.perf_counter()
            s, d = RUNNERS[name](work, args.quick, args.timeout_s)
            summary.update(s)
            details[name] = d
            details["wall_s"][name] = round(time.perf_counter() - t0, 1)
            print(f"[{name}] {json.dumps(s)} ({details['wall_s'][name]} s)", flush=True)
        two_hosts_ok = True
        if not args.skip_two_hosts:
            t0 = time.perf_counter()
            try:
                th = two_host_figures(work, args.quick)
            except NotImplementedError as exc:
                details["two_hosts"] = {"error": str(exc)}
                print(f"[two_hosts] not run: {exc}", file=sys.stderr)
                two_hosts_ok = False
            else:
                details["two_hosts"] = th.pop("details", None)
                own = summary.pop("auc_active_only", None)  # this script's sklearn one
                summary.update(th)
                summary["auc_active_only_sklearn"] = own
            details["wall_s"]["two_hosts"] = round(time.perf_counter() - t0, 1)
    finally:
        if tmp is not None:
            tmp.cleanup()
    checks = acceptance(summary)
    details["acceptance"] = checks
    summary["pass"] = all(checks.values()) and two_hosts_ok
    details["wall_s"]["total"] = round(time.perf_counter() - t_all, 1)
    if args.json:
        _write_atomic(Path(args.json), json.dumps({"summary": summary, "details": details},
                                                  indent=2, default=str))
    if "rmse_spread" in summary:
        print(f"RMSE spread, 3 runs at seed 0: {summary['rmse_spread']} (<= {RMSE_SPREAD_MAX}); "
              f"over seeds 0-2: {summary['rmse_spread_seeds']}; with the extreme row / "
              f"without: {summary['rmse_vs_clean']} (clipping off: "
              f"{summary['rmse_unclipped_vs_clean']})")
    if "max_reject_s" in summary:
        print(f"refusals: slowest {summary['max_reject_s']:.2f} s (<= {REJECT_MAX_S}), "
              f"{summary['rejects_named']}/{summary['rejects_total']} name the column/key, "
              f"{summary['rejects_exit_2']}/{summary['rejects_total']} exit 2")
    if "synth_tv_one_table" in summary:
        print(f"FedForge TV: one table {summary['synth_tv_one_table']}, branch files "
              f"{summary.get('synth_tv_branch_files')}, difference "
              f"{summary.get('synth_tv_diff')} (<= {TV_DIFF_MAX})")
    if "active_only" in details:
        a = details["active_only"]
        print(f"active party alone (sklearn, merged table's bank columns): AUC {a['auc']} "
              f"({a['best']}; mlp {a['auc_mlp']}, hgb {a['auc_hgb']})")
    if "auc_two_hosts" in summary:
        s = summary
        print(f"two hosts ({'network namespaces' if s['two_hosts_netns'] else 'loopback'}): "
              f"AUC {s['auc_two_hosts']:.4f} vs merged table {s['auc_merged']:.4f} "
              f"(within {AUC_MERGED_TOL}); DP mu 8: {s['auc_dp_two_hosts']:.4f} vs active "
              f"party alone {s['auc_active_only']:.4f} (columns dropped: "
              f"{s['dp_columns_dropped']}); at 20,000 customers "
              f"{s['auc_dp_two_hosts_large']:.4f} vs {s['auc_active_only_large']:.4f}")
    print(f"pass: {summary['pass']}  total {details['wall_s']['total']} s")
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
