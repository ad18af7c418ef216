"""Private ID alignment: our mutual PSI over the bus vs the PSI library called directly.

For each size N (IDs per party; ``--overlap`` of them shared, default 0.5; IDs from
:func:`parties.alignment.psi.demo_ids` with ``--seed``), on the same two ID sets, in one run:

``library``
    OpenMined PSI 2.0.6's own protocol in one process, one thread, no network: the
    client's ``CreateRequest`` (hash + multiply by k_c, N points), the server's
    ``CreateSetupMessage(fpr, N, items, DataStructure.RAW)`` (hash + multiply by k_s,
    N points, sent in full: RAW, the same representation our path compares), the
    server's ``ProcessRequest`` (multiply by k_s) and the client's ``GetIntersection``
    (remove k_c, compare). **Only the client learns the intersection** (as indices
    into its input); the server learns nothing but the client's set size. ``bytes``:
    the serialized request, setup and response (what would cross a network).
``mutual_local``
    Our protocol's primitives in one process, one thread, no bus
    (:func:`parties.alignment.psi.mutual_psi_local`): both parties' ``CreateRequest`` and
    ``ProcessRequest`` of the other's request, the 128-bit comparison, both outputs.
    **Both parties learn the intersection.** The same elliptic-curve work as
    ``ours`` done serially: a reference for what the bus and the second core add.
``ours``
    ``psfl vfl align`` as the launcher runs it: a broker process and two party
    processes on 127.0.0.1 (:func:`sim.launch.align.run_align`), chunked
    (``--chunk-size``, default 16384) with a window of 4 chunks in flight, every
    library call on each party's crypto thread. **Both parties learn the
    intersection** (sorted IDs and their own row indices). ``seconds``: the slower
    party's alignment, from connecting to the bus to its result (the processes' start,
    imports and ID-file reading are excluded, as for the other rows; ``job_s`` is the
    launcher's whole wall time including them). ``bytes``: the envelopes both parties
    published (every byte that crossed the bus once, each way through the broker).

Per party, ours does 2N point multiplications (N of them with hashing) on its own
core; the library path does about 4N in one thread (the client's unblinding is a
fourth pass). ``ratio_vs_library`` = ours seconds / library seconds (target <= 1.1).
``correct``: the row's output equals the plain ``set`` intersection (for ``ours``,
both parties' files; for ``library``, the client's indices).

Each row records the 1-minute load average before it (``loadavg_1min_before``) and the
CPU time it took (``bench_process_cpu_s`` for the in-process rows, ``crypto_cpu_s`` per
party for ours): on a shared machine, a wall time far above the CPU time means other
work competed for the cores.

Run: ``PYTHONPATH=. python bench/psi.py --quick --json OUT.json`` (100k x 100k) or
without ``--quick`` (also 1M x 1M: about 12-15 minutes on 2 cores). Do not run other
heavy work meanwhile: ours uses both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from parties.alignment.psi import demo_ids, mutual_psi_local  # noqa: E402
from sim.launch.align import run_align  # noqa: E402


def run_library(a: list[str], b: list[str], fpr: float) -> dict[str, Any]:
    """The library's own client/server protocol in this process (client holds ``a``)."""
    import private_set_intersection.python as psi

    t0 = time.perf_counter()
    client = psi.client.CreateWithNewKey(True)
    server = psi.server.CreateWithNewKey(True)
    req = client.CreateRequest(a)
    t1 = time.perf_counter()
    setup = server.CreateSetupMessage(fpr, len(a), b, psi.DataStructure.RAW)
    t2 = time.perf_counter()
    resp = server.ProcessRequest(req)
    t3 = time.perf_counter()
    idx = client.GetIntersection(setup, resp)
    t4 = time.perf_counter()
    nbytes = req.ByteSize() + setup.ByteSize() + resp.ByteSize()
    got = sorted(a[i] for i in idx)
    return {"seconds": t4 - t0, "bytes": nbytes, "n_shared": len(idx), "ids": got,
            "phases_s": {"request": t1 - t0, "setup": t2 - t1, "process": t3 - t2,
                         "intersection": t4 - t3}, "learns": "client only"}


def run_local(a: list[str], b: list[str], chunk: int) -> dict[str, Any]:
    """Our mutual protocol's primitives in this process, no bus."""
    t0 = time.perf_counter()
    ra, rb = mutual_psi_local(a, b, chunk_size=chunk)
    dt = time.perf_counter() - t0
    ok = (list(ra.ids) == list(rb.ids) and all(a[r] == x for r, x in zip(ra.rows, ra.ids, strict=True))
          and all(b[r] == x for r, x in zip(rb.rows, rb.ids, strict=True)))
    return {"seconds": dt, "bytes": None, "n_shared": ra.n_shared, "ids": list(ra.ids),
            "rows_ok": ok, "learns": "both"}


def run_ours(a_path: Path, b_path: Path, a: list[str], b: list[str], out: Path,
             chunk: int) -> dict[str, Any]:
    """``psfl vfl align``'s launcher: broker + two party processes."""
    res = run_align(active_ids=str(a_path), passive_ids=str(b_path), out=out,
                    chunk_size=chunk, quiet=True, timeout_s=3600)
    act, pas = res["active"], res["passive"]
    da = pd.read_csv(out / "aligned-active.csv", dtype={"id": str}, keep_default_na=False)
    dp = pd.read_csv(out / "aligned-passive.csv", dtype={"id": str}, keep_default_na=False)
    ids = da["id"].tolist()
    ok = (ids == dp["id"].tolist()
          and all(a[r] == x for r, x in zip(da["row"].tolist(), ids, strict=True))
          and all(b[r] == x for r, x in zip(dp["row"].tolist(), ids, strict=True)))
    return {"seconds": max(act["seconds"], pas["seconds"]), "job_s": res["wall_s"],
            "bytes": act["bytes_sent"] + pas["bytes_sent"], "n_shared": act["n_shared"],
            "ids": ids, "rows_ok": ok, "learns": "both",
            "transport": res["security"]["transport"],
            "parties": {r: {k: res[r][k] for k in ("seconds", "crypto_s", "crypto_cpu_s",
                                                   "compare_s",
                                                   "bytes_sent", "bytes_received",
                                                   "loop_lag_max_s", "max_rss_mb",
                                                   "chunks_sent")
                            if k in res[r]} for r in ("active", "passive")}}


def bench_size(n: int, overlap: float, seed: int, chunk: int, fpr: float,
               tmp: Path) -> dict[str, Any]:
    """All three rows on one pair of ID sets of ``n`` each."""
    a, b = demo_ids(n, overlap, seed)
    truth = sorted(set(a) & set(b))
    d = tmp / f"n{n}"
    d.mkdir(parents=True, exist_ok=True)
    pa, pb = d / "active-ids.txt", d / "passive-ids.txt"
    pa.write_text("".join(x + "\n" for x in a))
    pb.write_text("".join(x + "\n" for x in b))
    rows: dict[str, Any] = {}
    for name, fn in (("library", lambda: run_library(a, b, fpr)),
                     ("ours", lambda: run_ours(pa, pb, a, b, d / "out", chunk)),
                     ("mutual_local", lambda: run_local(a, b, chunk))):
        print(f"  n={n:,}: {name} ...", flush=True)
        load = os.getloadavg()[0]
        c0 = time.process_time()
        r = fn()
        r["bench_process_cpu_s"] = time.process_time() - c0  # 0-ish for ours (children)
        r["loadavg_1min_before"] = load
        r["correct"] = bool(r.pop("ids") == truth and r.pop("rows_ok", True))
        rows[name] = r
        print(f"    {r['seconds']:.2f} s, correct {r['correct']} (load average before "
              f"{load:.2f})", flush=True)
    lib = rows["library"]["seconds"]
    return {"n_per_party": n, "overlap": overlap, "n_shared": len(truth), "seed": seed,
            "chunk_size": chunk, "rows": rows,
            "seconds": rows["ours"]["seconds"], "bytes": rows["ours"]["bytes"],
            "ratio_vs_library": rows["ours"]["seconds"] / lib,
            "ratio_local_vs_library": rows["mutual_local"]["seconds"] / lib,
            "correct": rows["ours"]["correct"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k x 100k only")
    ap.add_argument("--sizes", help="comma-separated N per party (overrides the mode)")
    ap.add_argument("--overlap", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-size", type=int, default=16384)
    ap.add_argument("--fpr", type=float, default=1e-9,
                    help="the library's CreateSetupMessage fpr (RAW keeps every point)")
    ap.add_argument("--json", help="write results here (overwritten)")
    args = ap.parse_args()
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else [100_000] if args.quick else [100_000, 1_000_000])
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-psi-") as tmp:
        for n in sizes:
            results.append(bench_size(n, args.overlap, args.seed, args.chunk_size, args.fpr,
                                      Path(tmp)))
    print()
    print(f"{'N per party':>12} {'path':<13} {'learns':<12} {'seconds':>9} {'vs library':>10} "
          f"{'bytes':>13} {'correct':>8}")
    for r in results:
        lib = r["rows"]["library"]["seconds"]
        for name, row in r["rows"].items():
            nb = "-" if row["bytes"] is None else f"{row['bytes']:,}"
            print(f"{r['n_per_party']:>12,} {name:<13} {row['learns']:<12} "
                  f"{row['seconds']:>9.2f} {row['seconds'] / lib:>10.2f} {nb:>13} "
                  f"{str(row['correct']):>8}")
        ours = r["rows"]["ours"]
        print(f"{'':>12} ours: job {ours['job_s']:.2f} s; per party " + "; ".join(
            f"{k} crypto {v['crypto_s']:.1f} s, loop lag max {v['loop_lag_max_s'] * 1e3:.0f} "
            f"ms, peak RSS {v.get('max_rss_mb') or float('nan'):.0f} MB"
            for k, v in ours["parties"].items()))
    first = next((r for r in results if r["n_per_party"] == 100_000), results[0])
    summary = {k: first[k] for k in ("n_per_party", "overlap", "seconds", "bytes",
                                     "ratio_vs_library", "correct")}
    doc = {"benchmark": "psi", "cpus": os.cpu_count(), "summary": summary,
           "results": results, "argv": sys.argv[1:],
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps({"summary": summary}))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
