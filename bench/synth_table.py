"""FedForge against its centralised references: workload TV, bytes and wall time per system.

What is measured
----------------
For each dataset (``adult``, ``bank``) and ε (1 and 10; δ = 1e-9):

* ``fedforge_k1`` and ``fedforge_k10``: the real federated system via
  ``sim.launch.synth.run_synth`` (broker, coordinator, aggregators and K party
  processes), default mechanism (MST), distributed noise under secure aggregation.
* ``central_mst``: the standard MST (McKenna, Sheldon & Miklau 2021, private-pgm's
  ``mechanisms/mst.py``) run centrally by ``bench/synth_central.py`` on the POOLED
  training rows the federated run wrote (``RUN_DIR/data/train.parquet``), with the
  schema it used (``RUN_DIR/schema.json``), the same (ε, δ) and the same workload,
  private under FedForge's neighbouring relation, replace-one (``--central-relation
  add_remove``: private-pgm's, half the noise variance at the same ε).
* full mode only: ``fedforge_aim_k10`` (the federated system with ``--mechanism aim``,
  K = 10), ``nonprivate_k10`` (the federated MST at ε = ∞, no noise: the sum is the
  pooled histogram, so this is the pooled-without-privacy upper bound), ``independent_k10`` (each of the K = 10 parties runs central MST on
  its own rows, ``RUN_DIR/data/parties/<id>.parquet``, at the same ε; outputs pooled),
  and ``central_aim`` (AIM as private-pgm's ``mechanisms/aim.py``, mbi 2.0, always the
  mbi engine; defaults as the reference run in fedforge.md: 250 mirror-descent
  iterations, a 10 MB model cap; T = 16·d unless ``--aim-rounds``). On Adult the
  reference AIM run took 694 s, so the full mode takes well over an hour.

Every system runs ``--repeats`` times (1 with ``--quick``, else 2) on the same rows, split
and holdout;
only the noise is fresh each time (the parties' from OS entropy, the central mechanisms'
from ``--seed`` + repeat), and the table shows the means (``avg_tv_each`` keeps each
repeat's): one noise draw moves the TV by several percent.

Every system is scored the same way: :func:`synth.quality.workload_tv` (TV = 0.5 × L1
of normalised marginals) over all 3-way marginals of the schema's domain
(``all_k_way(domain, 3)``), synthetic rows against the pooled training rows. For the
federated systems the synthetic rows are ``RUN_DIR/synthetic.csv`` encoded with the
run's schema; the run's own ``avg_tv`` from ``metrics.json`` is kept alongside
(``avg_tv_run``) as a cross-check. Central systems communicate nothing: their
``bytes_wire`` and ``bytes_naive`` are 0 by definition.

The engine (``--engine``, default ``mbi`` when it is installed, else ``neural``) is the
same for the federated runs and the central references.

Usage::

    python bench/synth_table.py --quick --json /tmp/synth.json
    python bench/synth_table.py --json synth_full.json          # + independent_k10

JSON (as the issue's "Machine-readable output"): ``summary[dataset][eps][system]`` with
``avg_tv``, ``max_tv``, ``avg_tv_fixed_grid`` and ``max_tv_fixed_grid`` (the same workload on
a fixed grid of the original values, :func:`synth.quality.fixed_grid_tv`), ``bytes_wire``,
``bytes_naive``, ``wall_s`` (null where a system
failed), and ``summary[dataset][eps]["tv_ratio_k10_vs_central"]`` =
``fedforge_k10.avg_tv / central_mst.avg_tv`` (full mode also
``tv_ratio_aim_k10_vs_central_aim``); ``settings``, ``status`` and ``runs`` hold
the details. The Markdown table is printed and written next to the JSON (``.md``).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pandas as pd  # noqa: E402

from synth.domain import Schema, encode  # noqa: E402
from synth.quality import all_k_way, workload_tv  # noqa: E402

DATASETS_QUICK = ("adult", "bank")
EPSILONS = (1.0, 10.0)
DELTA = 1e-9
FED_K = (1, 10)
QUICK_SYSTEMS = ("fedforge_k1", "fedforge_k10", "central_mst")
FULL_SYSTEMS = QUICK_SYSTEMS + ("fedforge_aim_k10", "nonprivate_k10", "central_aim",
                                 "independent_k10")


def load_central_module(relation: str | None = None) -> Any:
    """``bench/synth_central.py`` as a module, by path (``bench`` is not a package); with
    ``relation``, its references private under that neighbouring relation (their
    ``relation`` argument fixed)."""
    spec = importlib.util.spec_from_file_location("synth_central", HERE / "synth_central.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if relation is not None:
        mod.sensitivities(relation)  # an unknown relation fails here, before any run
        for name in ("central_mst", "central_aim", "independent_ensemble"):
            setattr(mod, name, functools.partial(getattr(mod, name), relation=relation))
    return mod


def eps_key(eps: float) -> str:
    """``1.0 -> "1"``, ``10.0 -> "10"``, ``0.5 -> "0.5"``."""
    return f"{eps:g}"


def default_engine() -> str:
    """``mbi`` if importable, else ``neural``."""
    return "mbi" if importlib.util.find_spec("mbi") is not None else "neural"


# ---------------------------------------------------------------------------- scoring
def load_run_data(run_dir: Path) -> tuple[Schema, pd.DataFrame]:
    """The schema and pooled training rows a federated run used.

    Raises:
        FileNotFoundError: ``schema.json`` or ``data/train.parquet`` is missing.
    """
    schema = Schema.from_dict(json.loads((run_dir / "schema.json").read_text()))
    train = pd.read_parquet(run_dir / "data" / "train.parquet")
    return schema, train


def score(real_codes: np.ndarray, syn_codes: np.ndarray, schema: Schema) -> dict[str, float]:
    """avg/max TV over all 3-way marginals (all k-way with k = min(3, d))."""
    dom = schema.domain
    wl = all_k_way(dom, min(3, len(dom)))
    q = workload_tv(real_codes, syn_codes, dom, wl)
    return {"avg_tv": q["avg_tv"], "max_tv": q["max_tv"], "n_marginals": q["n_marginals"]}


def _read_synthetic_frame(path: Path, schema: Schema) -> pd.DataFrame:
    """``synthetic.csv`` with text columns read as text."""
    dtypes = {c.name: str for c in schema.columns if c.dtype == "object"}
    return pd.read_csv(path, dtype=dtypes, keep_default_na=False)


def _read_synthetic(path: Path, schema: Schema) -> np.ndarray:
    """Encode ``synthetic.csv`` with the run's schema (text columns read as text)."""
    return encode(_read_synthetic_frame(path, schema), schema)


def score_fixed(train: pd.DataFrame, synthetic: pd.DataFrame | np.ndarray, schema: Schema,
                seed: int = 0) -> dict[str, Any]:
    """The fixed-grid TV (:func:`synth.quality.fixed_grid_tv`) of a system's rows, given
    as values or as codes of ``schema`` (decoded first, values drawn within bins)."""
    from synth.domain import decode
    from synth.quality import fixed_grid_tv

    if isinstance(synthetic, np.ndarray):
        synthetic = decode(synthetic, schema, np.random.default_rng(seed))
    q = fixed_grid_tv(train, synthetic, schema)
    return {k: q[k] for k in ("avg_tv_fixed_grid", "max_tv_fixed_grid")}


def ml_row(run_dir: Path, schema: Schema, train: pd.DataFrame, codes: np.ndarray,
           seed: int = 0) -> dict[str, Any]:
    """``ml_auc`` (train on the system's rows, decoded; test on the run's real holdout)
    for a system that returns codes, as the federated run measures its own (the run's
    label; nothing without one)."""
    from synth.domain import decode
    from synth.quality import ml_utility

    try:
        label = json.loads((run_dir / "metrics.json").read_text())["config"].get("label")
        hold = pd.read_parquet(run_dir / "data" / "holdout.parquet")
    except (OSError, KeyError, ValueError):
        return {}
    if not label:
        return {}
    syn = decode(codes, schema, np.random.default_rng(seed))
    try:
        u = ml_utility(train, syn, hold, label, random_state=seed, threads=1)
    except ValueError as exc:  # e.g. a label that is not binary
        return {"ml_utility_skipped": str(exc)}
    return {"ml_auc": u["auc_synthetic"], "ml_utility": u}


# ---------------------------------------------------------------------------- systems
def run_fedforge(dataset: str, eps: float, k: int, *, seed: int, engine: str, out: Path,
                 timeout_s: float, mechanism: str = "mst", split: str = "iid",
                 alpha: float = 1.0, overrides: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """One federated run; scored on its own pooled rows. Returns the system's row.
    ``overrides``: further SynthConfig keys (``--fedforge-set``)."""
    from pubsub.config import deep_merge, expand_dotted, from_mapping
    from sim.launch.synth import run_synth
    from synth.config import SynthConfig

    table: dict[str, Any] = {"dataset": dataset, "parties": k, "epsilon": eps, "delta": DELTA,
                             "seed": seed, "mechanism": mechanism, "engine": {"name": engine}}
    if split != "iid":
        table["data"] = {"split": split, "dirichlet_alpha": alpha}
    # dotted keys (secagg.min_honest=10) are nested tables; a flat-layout key is refused
    cfg = from_mapping(SynthConfig, deep_merge(table, expand_dotted(dict(overrides or {}))),
                       section="synth")
    t0 = time.perf_counter()
    res = run_synth(cfg, out, timeout_s=timeout_s, quiet=True)
    launch_s = time.perf_counter() - t0
    m = res.metrics
    schema, train = load_run_data(out)
    real = encode(train, schema)
    row: dict[str, Any] = {"bytes_wire": m.get("bytes_wire"), "bytes_naive": m.get("bytes_naive"),
                           "wall_s": m.get("wall_s", launch_s), "avg_tv_run": m.get("avg_tv"),
                           "max_tv_run": m.get("max_tv"), "ml_utility": m.get("ml_utility"),
                           "ml_auc": (m.get("ml_utility") or {}).get("auc_synthetic"),
                           "run_dir": str(out)}
    try:
        syn_df = _read_synthetic_frame(out / "synthetic.csv", schema)
        row.update(score(real, encode(syn_df, schema), schema))
        row.update(score_fixed(train, syn_df, schema))
    except Exception as e:  # noqa: BLE001 - fall back to the run's own score, say so
        row.update({"avg_tv": m.get("avg_tv"), "max_tv": m.get("max_tv"),
                    "score_note": f"synthetic.csv not re-scored ({e!r}); run's own avg_tv"})
    return row


def run_central(run_dir: Path, eps: float, *, seed: int, engine: str,
                central: Any) -> dict[str, Any]:
    """Central MST on a run's pooled rows and schema."""
    schema, train = load_run_data(run_dir)
    real = encode(train, schema)
    dom = schema.domain
    wl = all_k_way(dom, min(3, len(dom)))
    out = central.central_mst(real, dom, epsilon=eps, delta=DELTA, seed=seed, engine=engine,
                              workload=wl)
    row = {"bytes_wire": 0, "bytes_naive": 0, "wall_s": out["wall_s"], "fit_s": out["fit_s"],
           "rho": out["rho"], "cliques": out["cliques"], "source_run": str(run_dir)}
    row.update(score(real, out["codes"], schema))
    row.update(score_fixed(train, out["codes"], schema, seed))
    row.update(ml_row(run_dir, schema, train, out["codes"], seed))
    return row


def run_central_aim(run_dir: Path, eps: float, *, seed: int, engine: str, central: Any,
                    rounds: int | None = None, max_iters: int = 250,
                    max_model_size: float = 10.0) -> dict[str, Any]:
    """Central AIM (mbi only, whatever ``engine``) on a run's pooled rows and schema."""
    schema, train = load_run_data(run_dir)
    real = encode(train, schema)
    dom = schema.domain
    out = central.central_aim(real, dom, epsilon=eps, delta=DELTA, seed=seed,
                              workload=all_k_way(dom, min(3, len(dom))), rounds=rounds,
                              max_iters=max_iters, max_model_size=max_model_size)
    row = {"bytes_wire": 0, "bytes_naive": 0, "wall_s": out["wall_s"], "fit_s": out["fit_s"],
           "rho": out["rho"], "cliques": out["cliques"], "rounds": out["rounds"],
           "engine": "mbi", "source_run": str(run_dir)}
    row.update(score(real, out["codes"], schema))
    row.update(score_fixed(train, out["codes"], schema, seed))
    row.update(ml_row(run_dir, schema, train, out["codes"], seed))
    return row


def run_independent(run_dir: Path, eps: float, *, seed: int, engine: str,
                    central: Any) -> dict[str, Any]:
    """Independent ensemble on the parties' own rows (``data/parties/*.parquet``)."""
    schema, train = load_run_data(run_dir)
    real = encode(train, schema)
    files = sorted((run_dir / "data" / "parties").glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no party files under {run_dir / 'data' / 'parties'}")
    parts = [encode(pd.read_parquet(f), schema) for f in files]
    dom = schema.domain
    out = central.independent_ensemble(parts, dom, epsilon=eps, delta=DELTA, seed=seed,
                                       engine=engine, workload=all_k_way(dom, min(3, len(dom))))
    row = {"bytes_wire": 0, "bytes_naive": 0, "wall_s": out["wall_s"], "parties": out["parties"],
           "source_run": str(run_dir)}
    row.update(score(real, out["codes"], schema))
    row.update(score_fixed(train, out["codes"], schema, seed))
    row.update(ml_row(run_dir, schema, train, out["codes"], seed))
    return row


def run_dp_baseline(run_dir: Path, eps: float, kind: str, *, seed: int, cap_s: float,
                    dataset: str) -> dict[str, Any]:
    """A DP-SGD baseline of :mod:`synth.baselines` on a federated run's party files,
    scored as the federated systems are (TV on the pooled rows, ML AUC on the holdout)."""
    from sim.launch.synth import DECLARED_LABELS
    from synth.baselines import run_baseline
    from synth.domain import decode
    from synth.quality import ml_utility

    schema, train = load_run_data(run_dir)
    real = encode(train, schema)
    files = sorted((run_dir / "data" / "parties").glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no party files under {run_dir / 'data' / 'parties'}")
    parts = [encode(pd.read_parquet(f), schema) for f in files]
    res = run_baseline(kind, parts, schema.domain.sizes, epsilon=eps, delta=DELTA,
                       cap_s=cap_s, n_out=len(real), seed=seed)
    row: dict[str, Any] = {"bytes_wire": None, "bytes_naive": None, "wall_s": res.wall_s,
                           "parties": len(parts), "source_run": str(run_dir), **res.summary()}
    row.update(score(real, res.codes, schema))
    row.update(score_fixed(train, res.codes, schema, seed))
    label = DECLARED_LABELS.get(dataset, ("",))[0]
    if label:
        syn = decode(res.codes, schema, np.random.default_rng(seed))
        hold = pd.read_parquet(run_dir / "data" / "holdout.parquet")
        u = ml_utility(train, syn, hold, label, threads=1)
        row["ml_auc"] = u["auc_synthetic"]
        row["ml_utility"] = u
    return row


# ---------------------------------------------------------------------------- table
def _null_row() -> dict[str, Any]:
    return {"avg_tv": None, "max_tv": None, "bytes_wire": None, "bytes_naive": None,
            "wall_s": None}


def ratio(a: Any, b: Any) -> float | None:
    """``a / b`` or None when either is missing or b is 0."""
    if a is None or b is None or not b or (isinstance(a, float) and math.isnan(a)):
        return None
    return float(a) / float(b)


def markdown(summary: dict[str, Any], systems: tuple[str, ...]) -> str:
    """The Markdown table of the summary (central systems: no communication, 0 bytes)."""
    def fmt(v: Any, spec: str) -> str:
        if v is None:
            return "—"
        return format(int(round(v)) if spec == "," else v, spec)

    lines = ["| dataset | ε | system | avg TV | max TV | TV fixed grid | bytes wire | "
             "bytes naive | wire / naive | wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for ds, by_eps in summary.items():
        for e, row in by_eps.items():
            for sysname in systems:
                r = row.get(sysname, _null_row())
                central = sysname.startswith(("central", "independent"))
                bw = "0 (central)" if central and r.get("avg_tv") is not None else fmt(
                    r.get("bytes_wire"), ",")
                bn = "0 (central)" if central and r.get("avg_tv") is not None else fmt(
                    r.get("bytes_naive"), ",")
                rr = ratio(r.get("bytes_wire"), r.get("bytes_naive"))
                lines.append(f"| {ds} | {e} | {sysname} | {fmt(r.get('avg_tv'), '.4f')} | "
                             f"{fmt(r.get('max_tv'), '.4f')} | "
                             f"{fmt(r.get('avg_tv_fixed_grid'), '.4f')} | {bw} | {bn} | "
                             f"{fmt(rr, '.3f')} | {fmt(r.get('wall_s'), '.1f')} |")
            lines.append(f"| {ds} | {e} | **tv_ratio_k10_vs_central** | "
                         f"{fmt(row.get('tv_ratio_k10_vs_central'), '.3f')} | | | | | | |")
            if "tv_ratio_aim_k10_vs_central_aim" in row:
                lines.append(f"| {ds} | {e} | **tv_ratio_aim_k10_vs_central_aim** | "
                             f"{fmt(row.get('tv_ratio_aim_k10_vs_central_aim'), '.3f')} "
                             "| | | | | | |")
    paper = [(ds, e, row) for ds, by_eps in summary.items() for e, row in by_eps.items()
             if "noniid" in row]
    if paper:
        lines += ["", "The FedForge paper's Table 2 shape (K = 10):", "",
                  "| dataset | ε | system | avg TV (IID) | ML AUC | avg TV (Dirichlet) | "
                  "non-IID / IID | avg TV at ε = ∞ | ε spent | wall s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for ds, e, row in paper:
            for name in ("fedforge_k10", "fedforge_diffusion_k10",
                         *(f"{k}_k10" for k in PAPER_BASELINES)):
                r = row.get(name) or {}
                lines.append(
                    f"| {ds} | {e} | {name} | {fmt(r.get('avg_tv'), '.4f')} | "
                    f"{fmt(r.get('ml_auc'), '.3f')} | "
                    f"{fmt((row['noniid'].get(name) or {}).get('avg_tv'), '.4f')} | "
                    f"{fmt(row['noniid_over_iid'].get(name), '.3f')} | "
                    f"{fmt((row['eps_inf'].get(name) or {}).get('avg_tv'), '.4f')} | "
                    f"{fmt(r.get('epsilon_spent'), '.3f')} | {fmt(r.get('wall_s'), '.1f')} |")
            lines.append(f"| {ds} | {e} | **diffusion_over_mbi** | "
                         f"{fmt(row.get('diffusion_over_mbi'), '.3f')} | | | | | | |")
    lines.append("")
    lines.append("Means over the repeats (fresh noise each). Central systems (central_mst, "
                 "central_aim, independent_k10) send nothing: bytes are 0 by definition. "
                 "TV = 0.5 × L1 over all 3-way marginals, against the pooled training rows.")
    return "\n".join(lines)


def _mean_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary row of a system over repeats: the mean of each figure over the repeats
    that produced it, and the per-repeat ``avg_tv`` values."""
    out: dict[str, Any] = {}
    for x in ("avg_tv", "max_tv", "avg_tv_fixed_grid", "ml_auc", "bytes_wire",
              "bytes_naive", "wall_s"):
        vals = [r[x] for r in rows if r.get(x) is not None]
        out[x] = float(np.mean(vals)) if vals else None
    out["avg_tv_each"] = [r.get("avg_tv") for r in rows]
    return out


PAPER_BASELINES = ("indep_ctgan", "dpfedavg_gan", "dpfedavg_diffusion")


def paper_block(args: argparse.Namespace, ds: str, eps: float, row: dict[str, Any],
                record: Any, runs_root: Path, status: dict[str, Any]) -> None:
    """The FedForge paper's Table 2 systems at (``ds``, ``eps``), K = 10, into ``row``:
    ``fedforge_diffusion_k10`` and the three DP-SGD baselines (``<kind>_k10``) on the
    IID run's parties, the same on a Dirichlet(α) split (``noniid``), the baselines at
    ε = ∞ (``eps_inf``), and ``noniid_over_iid[system]``."""
    ek = eps_key(eps)
    iid_src = runs_root / f"{ds}_eps{ek}_k10"
    non_src = runs_root / f"{ds}_eps{ek}_k10_dirichlet"
    noniid: dict[str, Any] = {}
    non_fed = {
        "fedforge_k10": dict(engine=args.engine),
        "fedforge_diffusion_k10": dict(engine="diffusion")}
    row["fedforge_diffusion_k10"] = record(
        f"{ds}/{ek}/fedforge_diffusion_k10", run_fedforge, ds, eps, 10, seed=args.seed,
        engine="diffusion", out=runs_root / f"{ds}_eps{ek}_k10_diffusion",
        timeout_s=args.timeout_s)
    for name, kw in non_fed.items():
        out = non_src if name == "fedforge_k10" else runs_root / f"{ds}_eps{ek}_k10_diffusion_dirichlet"
        noniid[name] = record(f"{ds}/{ek}/noniid/{name}", run_fedforge, ds, eps, 10,
                              seed=args.seed, out=out, timeout_s=args.timeout_s,
                              split="dirichlet", alpha=args.alpha, **kw)
    eps_inf: dict[str, Any] = {}
    for kind in PAPER_BASELINES:
        name = f"{kind}_k10"
        for target, src, e, cap in ((row, iid_src, eps, args.baseline_cap_s),
                                    (noniid, non_src, eps, args.baseline_cap_s),
                                    (eps_inf, iid_src, math.inf, args.baseline_inf_cap_s)):
            tag = {id(row): "", id(noniid): "noniid/", id(eps_inf): "eps_inf/"}[id(target)]
            key = f"{ds}/{ek}/{tag}{name}"
            if not (src / "schema.json").exists():
                target[name], status[key] = _null_row(), "skipped: no federated run's data"
                continue
            target[name] = record(key, run_dp_baseline, src, e, kind, seed=args.seed,
                                  cap_s=cap, dataset=ds)
    row["noniid"] = noniid
    row["eps_inf"] = eps_inf
    row["noniid_over_iid"] = {name: ratio(noniid[name].get("avg_tv"), row[name].get("avg_tv"))
                              for name in noniid if name in row}
    row["diffusion_over_mbi"] = ratio(row["fedforge_diffusion_k10"].get("avg_tv"),
                                      row["fedforge_k10"].get("avg_tv"))


def build(args: argparse.Namespace) -> dict[str, Any]:
    """Run every system ``args.repeats`` times and return the JSON document.

    Every repeat uses the same rows, split and holdout (``--seed``); what changes is the
    noise: the parties' (OS entropy) and the central mechanisms' (seed + repeat).
    """
    central = load_central_module(args.central_relation)
    systems = selected_systems(args)
    runs_root = Path(args.out)
    summary: dict[str, Any] = {}
    status: dict[str, Any] = {}
    runs: dict[str, Any] = {}

    def aim(src: Path, e: float, **kw: Any) -> dict[str, Any]:
        return run_central_aim(src, e, rounds=args.aim_rounds, max_iters=args.aim_iters,
                               max_model_size=args.aim_max_mb, **kw)

    def record(key: str, fn: Any, *a: Any, **kw: Any) -> dict[str, Any]:
        print(f"[synth_table] {key} ...", flush=True)
        try:
            r = fn(*a, **kw)
            status[key] = "ok"
        except Exception as e:  # noqa: BLE001 - record and go on
            r = _null_row()
            status[key] = f"failed: {e!r}"
            runs[key + "/traceback"] = traceback.format_exc()
        runs[key] = r
        print(f"[synth_table] {key}: {status[key]} avg_tv={r.get('avg_tv')}", flush=True)
        return r

    for ds in args.datasets:
        summary[ds] = {}
        for eps in args.epsilons:
            ek = eps_key(eps)
            per: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
            for rep in range(args.repeats):
                tag = f"/r{rep}" if args.repeats > 1 else ""
                fed = [(f"fedforge_k{k}", k, "mst", eps, "") for k in FED_K
                       if f"fedforge_k{k}" in systems]
                if "fedforge_aim_k10" in systems:
                    fed.append(("fedforge_aim_k10", 10, "aim", eps, "_aim"))
                if "nonprivate_k10" in systems:  # the pooled data's floor: no noise at all
                    fed.append(("nonprivate_k10", 10, "mst", math.inf, "_nonprivate"))
                for name, k, mech, e, suffix in fed:
                    out = runs_root / (f"{ds}_eps{ek}_k{k}{suffix}"
                                       + (f"_r{rep}" if args.repeats > 1 else ""))
                    per[name].append(record(f"{ds}/{ek}/{name}{tag}", run_fedforge, ds, e,
                                            k, seed=args.seed, engine=args.engine, out=out,
                                            timeout_s=args.timeout_s, mechanism=mech,
                                            overrides=args.fedforge_set))
                src = runs_root / (f"{ds}_eps{ek}_k10" + (f"_r{rep}" if args.repeats > 1 else ""))
                extra = [(name, fn, src) for name, fn in (
                    ("central_mst", run_central), ("central_aim", aim),
                    ("independent_k10", run_independent)) if name in systems]
                for name, fn, where in extra:
                    key = f"{ds}/{ek}/{name}{tag}"
                    if not (where / "schema.json").exists():
                        r, status[key] = _null_row(), "skipped: no federated run wrote its data"
                        per[name].append(r)
                        continue
                    per[name].append(record(key, fn, where, eps, seed=args.seed + rep,
                                            engine=args.engine, central=central))
            row: dict[str, Any] = {name: _mean_row(rows) for name, rows in per.items()}
            row["tv_ratio_k10_vs_central"] = ratio(
                row.get("fedforge_k10", {}).get("avg_tv"),
                row.get("central_mst", {}).get("avg_tv"))
            if "central_aim" in row and "fedforge_aim_k10" in row:
                row["tv_ratio_aim_k10_vs_central_aim"] = ratio(
                    row["fedforge_aim_k10"]["avg_tv"], row["central_aim"]["avg_tv"])
            summary[ds][ek] = row
            if not args.systems and (not args.quick or (ds == "adult" and eps == 1.0)):
                paper_block(args, ds, eps, row, record, runs_root, status)
    return {"settings": {"quick": args.quick, "datasets": list(args.datasets),
                         "epsilons": [eps_key(e) for e in args.epsilons], "delta": DELTA,
                         "central_relation": args.central_relation,
                         "parties": list(FED_K), "engine": args.engine, "seed": args.seed,
                         "repeats": args.repeats,
                         "aim": {"rounds": args.aim_rounds, "iters": args.aim_iters,
                                 "max_model_mb": args.aim_max_mb},
                         "workload": "all 3-way marginals", "metric": "TV = 0.5 x L1",
                         "systems": list(systems),
                         "fedforge_set": dict(args.fedforge_set)},
            "summary": summary, "status": status, "runs": runs}


def selected_systems(args: argparse.Namespace) -> tuple[str, ...]:
    """The systems of this run: ``--systems`` (a subset, in the table's order), else the
    quick or full set."""
    systems = QUICK_SYSTEMS if args.quick else FULL_SYSTEMS
    if args.systems:
        return tuple(s for s in systems if s in args.systems)
    return systems


def _set_value(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="adult + bank, eps 1 and 10, fedforge K=1/10 and central_mst")
    ap.add_argument("--json", type=Path, default=None, help="write the JSON document here")
    ap.add_argument("--md", type=Path, default=None, help="Markdown path (default: JSON .md)")
    ap.add_argument("--out", type=Path, default=Path("runs/synth_table"),
                    help="directory of the federated run directories")
    ap.add_argument("--datasets", default=",".join(DATASETS_QUICK))
    ap.add_argument("--epsilons", default=",".join(eps_key(e) for e in EPSILONS))
    ap.add_argument("--engine", default=None, choices=("mbi", "neural", "diffusion"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs of every system (fresh noise each; the table shows means); "
                    "default 1 with --quick (under 15 minutes), else 2")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per federated run")
    ap.add_argument("--aim-rounds", type=int, default=None, help="AIM's T (default 16 d)")
    ap.add_argument("--aim-iters", type=int, default=250, help="AIM mirror-descent iterations")
    ap.add_argument("--aim-max-mb", type=float, default=10.0, help="AIM model cap, MB")
    ap.add_argument("--central-relation", default="replace_one",
                    choices=("replace_one", "add_remove"),
                    help="the neighbouring relation of the central references (default "
                    "FedForge's, replace_one: the same ε means the same promise; "
                    "add_remove is private-pgm's, with half the noise variance)")
    ap.add_argument("--alpha", type=float, default=0.3,
                    help="Dirichlet alpha of the non-IID split (paper systems)")
    ap.add_argument("--baseline-cap-s", type=float, default=150.0,
                    help="training cap of each DP-SGD baseline run (all K parties)")
    ap.add_argument("--baseline-inf-cap-s", type=float, default=None,
                    help="the same at epsilon = inf (default: 40 with --quick, else the cap)")
    ap.add_argument("--systems", default="",
                    help="comma-separated subset of the systems to run (e.g. fedforge_k10: "
                    "one row; no paper systems then)")
    ap.add_argument("--fedforge-set", action="append", type=_set_value, default=[],
                    metavar="KEY=VALUE",
                    help="a SynthConfig key for every federated run (repeatable; a nested "
                    "table's key with its dots), e.g. secagg.min_honest=10")
    args = ap.parse_args(argv)
    args.fedforge_set = dict(args.fedforge_set)
    args.systems = [x for x in str(args.systems).split(",") if x]
    known = set(FULL_SYSTEMS)
    if any(x not in known for x in args.systems):
        ap.error(f"--systems: unknown {sorted(set(args.systems) - known)}; known "
                 f"{sorted(known)}")
    args.datasets = [d for d in str(args.datasets).split(",") if d]
    args.epsilons = [float(e) for e in str(args.epsilons).split(",") if e]
    args.engine = args.engine or default_engine()
    if args.repeats is None:
        args.repeats = 1 if args.quick else 2
    if args.baseline_inf_cap_s is None:
        args.baseline_inf_cap_s = 40.0 if args.quick else args.baseline_cap_s
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    t0 = time.perf_counter()
    doc = build(args)
    doc["settings"]["total_wall_s"] = time.perf_counter() - t0
    systems = selected_systems(args)
    md = markdown(doc["summary"], systems)
    print(md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1, default=str))
        (args.md or args.json.with_suffix(".md")).write_text(md + "\n")
    elif args.md:
        args.md.write_text(md + "\n")
    failed = [k for k, v in doc["status"].items() if str(v).startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
