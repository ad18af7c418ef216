"""The paper's Table 9 shape on a generated Criteo-shaped table, streamed from each party's
own Parquet shards (``vfl.data.stream``).

What runs (each a ``psfl vfl run``: broker + both parties as processes, on 2 cores):

* the table (:mod:`parties.data.criteo`: 13 integer and 26 categorical columns, Zipf levels up
  to 10^6, a logistic truth with cross-party interactions) at 1x rows and at 10x rows,
  written once per party under ``--data-dir`` (kept and reused);
* the five algorithms streaming the 1x table: test AUC, training samples/s, CPU use,
  wait per epoch, comm GB (embeddings + gradients through the broker);
* PubSub-VFL streaming the 10x table: its peak RSS over the 1x run's
  (``rss_ratio_10x_rows``);
* PubSub-VFL in memory (``vfl.data.stream = false``, the same files, the same hashed row
  split) on the 1x table (``stream_vs_memory``: streaming samples/s over in-memory
  samples/s; the AUC of both) and on the 10x table (``memory_10x_peak_rss_mb``: what a
  reader that loads everything needs; not with ``--skip-memory-10x``).

Peak RSS is each party's ``metrics.json`` ``peak_rss_mb`` (the largest of the party
process and its worker processes); ``peak_rss_mb`` in the summary is the largest party's.
Both scored subsets are capped (``--eval-max-rows``, default 50,000 test rows), so the
1x and 10x runs score the same number of rows.

``--full`` streams 45,000,000 rows (the Kaggle set's size) through one epoch of
PubSub-VFL (generation is resumable: rerun the same command after an interruption) and
reports the generation time, the table's and the encoded caches' disk use (the caches'
largest size during the run) and the run's figures.

Usage: ``python bench/criteo.py --quick --json OUT.json`` (about 8 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from parties.data.criteo import CRITEO_LABEL, CriteoSpec, write_criteo  # noqa: E402

ALGOS = ("pubsub", "vfl", "vfl-ps", "avfl", "avfl-ps")


def _table(root: Path, rows: int, seed: int) -> dict[str, Path]:
    t0 = time.perf_counter()
    dirs = write_criteo(root / f"criteo-{rows}", CriteoSpec(rows=rows, seed=seed),
                        progress=rows >= 5_000_000)
    print(f"table {rows:,} rows: {time.perf_counter() - t0:.1f} s", flush=True)
    return dirs


def _run(dirs: dict[str, Path], out: Path, *, algo: str, epochs: int, stream: bool,
         eval_max_rows: int, timeout_s: float, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "sim.cli", "vfl", "run", "--out", str(out),
           "--set", f"algo={algo}", "--set", f"label={CRITEO_LABEL}",
           "--set", f"epochs={epochs}", "--set", "eval_every=1000",
           "--set", f"data.stream={'true' if stream else 'false'}", "--set", "data.row_split=hash",
           "--set", f"data.stream_eval_max_rows={eval_max_rows}",
           "--set", "data.party_datasets=[" + ", ".join(f'"{d}"' for d in dirs.values()) + "]",
           *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    rec: dict[str, Any] = {"algo": algo, "stream": stream, "exit_code": proc.returncode,
                           "wall_s": round(time.perf_counter() - t0, 1)}
    mpath = out / "metrics.json"
    if proc.returncode != 0 or not mpath.exists():
        rec["error_tail"] = (proc.stdout + proc.stderr)[-1500:]
        print(f"  {algo} data.stream={stream}: FAILED (exit {proc.returncode})", flush=True)
        return rec
    m = json.loads(mpath.read_text())
    parties = m["parties"]
    comm = sum(int(m["broker_bytes"].get(k, 0)) for k in ("emb", "grad", "ids"))
    rec.update(
        auc=m.get("test_auc"), samples_per_s=m.get("train_samples_per_s"),
        train_s=m.get("train_wall_s"),
        peak_rss_mb=max(float(v.get("peak_rss_mb") or 0) for v in parties.values()),
        peak_rss_mb_by_party={p: v.get("peak_rss_mb") for p, v in parties.items()},
        cpu_util={p: v.get("cpu_util_train") for p, v in parties.items()},
        wait_s_per_epoch={p: v.get("wait_s_per_epoch") for p, v in parties.items()},
        comm_gb=round(comm / 1e9, 3), label_positive=m.get("label_positive"),
        n_features={p: v.get("n_features") for p, v in parties.items()},
        treatments={p: [t.get("treatment") for t in v.get("treatments") or []]
                    for p, v in parties.items()})
    print(f"  {algo} data.stream={stream}: auc {rec['auc']:.4f}  {rec['samples_per_s']:,.0f} "
          f"samples/s  peak {rec['peak_rss_mb']:.0f} MB  ({rec['wall_s']} s)", flush=True)
    return rec


def _size_gb(root: Path) -> float:
    return round(sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) / 1e9, 2)


class _DiskWatch:
    """The largest size a directory reached while the block ran (sampled every 10 s)."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak_gb = root, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            if self.root.exists():
                self.peak_gb = max(self.peak_gb, _size_gb(self.root))
            if self._stop.wait(10.0):
                return

    def __enter__(self) -> _DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.root.exists():
            self.peak_gb = max(self.peak_gb, _size_gb(self.root))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="1x = 200,000 rows (default)")
    mode.add_argument("--full", action="store_true",
                      help="45,000,000 rows through one epoch of PubSub-VFL")
    ap.add_argument("--rows", type=int, default=0, help="1x rows (default 200,000)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--eval-max-rows", type=int, default=50_000)
    ap.add_argument("--data-dir", default="", help="where the tables go (kept; default a "
                    "directory under the system temp dir)")
    ap.add_argument("--skip-memory-10x", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    data = Path(args.data_dir or Path(tempfile.gettempdir()) / "psfl-criteo")
    data.mkdir(parents=True, exist_ok=True)
    runs = Path(tempfile.mkdtemp(prefix="psfl-criteo-runs-"))
    t_all = time.perf_counter()
    res: dict[str, Any] = {"command": " ".join(["python", "bench/criteo.py",
                                                *(argv if argv is not None else sys.argv[1:])]),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.full:
        rows = args.rows or 45_000_000
        t_gen = time.perf_counter()
        dirs = _table(data, rows, args.seed)
        gen_s = time.perf_counter() - t_gen
        cache = runs / "cache"  # kept until measured: the disk a run needs beside its table
        watch = _DiskWatch(cache)
        with watch:
            rec = _run(dirs, runs / "full", algo="pubsub", epochs=1, stream=True,
                       eval_max_rows=args.eval_max_rows, timeout_s=4 * 3600,
                       extra=("--set", f"data.stream_cache_dir={cache}",
                              "--set", "timeouts.handshake_timeout_s=7200"))
        table_gb = _size_gb(data / f"criteo-{rows}")
        res["summary"] = {"rows": rows, "pubsub": rec, "peak_rss_mb": rec.get("peak_rss_mb"),
                          "generate_s": round(gen_s, 1),
                          "table_gb": table_gb, "cache_gb": watch.peak_gb,
                          "disk_gb": round(table_gb + watch.peak_gb, 2)}
        shutil.rmtree(cache, ignore_errors=True)
    else:
        rows = args.rows or 200_000
        one = _table(data, rows, args.seed)
        ten = _table(data, 10 * rows, args.seed)
        kw = {"epochs": args.epochs, "eval_max_rows": args.eval_max_rows, "timeout_s": 1800}
        algos = {a: _run(one, runs / f"s-{a}", algo=a, stream=True, **kw) for a in ALGOS}
        mem = _run(one, runs / "m-1x", algo="pubsub", stream=False, **kw)
        big = _run(ten, runs / "s-10x", algo="pubsub", stream=True, **kw)
        mem10 = None if args.skip_memory_10x else _run(ten, runs / "m-10x", algo="pubsub",
                                                       stream=False, **kw)
        s1 = algos["pubsub"]
        ok = all("auc" in r for r in (s1, mem, big))
        res["summary"] = {
            "rows": rows, "rows_10x": 10 * rows,
            **{a: {k: r.get(k) for k in ("auc", "samples_per_s", "train_s", "cpu_util",
                                          "wait_s_per_epoch", "comm_gb", "peak_rss_mb")}
               for a, r in algos.items()},
            "peak_rss_mb": max((r.get("peak_rss_mb") or 0) for r in
                               (*algos.values(), big)),
            "rss_ratio_10x_rows": round(big["peak_rss_mb"] / s1["peak_rss_mb"], 3) if ok
            else None,
            "stream_vs_memory": round(s1["samples_per_s"] / mem["samples_per_s"], 3) if ok
            else None,
            "auc_stream_minus_memory": round(s1["auc"] - mem["auc"], 4) if ok else None,
            "memory_1x": {k: mem.get(k) for k in ("auc", "samples_per_s", "peak_rss_mb")},
            "stream_10x": {k: big.get(k) for k in ("auc", "samples_per_s", "peak_rss_mb")},
            "memory_10x_peak_rss_mb": mem10.get("peak_rss_mb") if mem10 else None,
            "memory_10x_over_stream_1x_peak": round(mem10["peak_rss_mb"] / s1["peak_rss_mb"],
                                                    2) if mem10 and ok and "auc" in mem10
            else None,
        }
        res["runs"] = {**{f"stream_{a}": r for a, r in algos.items()}, "memory_1x": mem,
                       "stream_10x": big, "memory_10x": mem10}
    res["wall_s"] = round(time.perf_counter() - t_all, 1)
    text = json.dumps(res, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    print(json.dumps(res["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
