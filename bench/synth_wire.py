"""FedForge on the wire: bytes by message kind, against naive float32, and what the
compression costs in workload TV.

What is measured
----------------
Real federated runs (``sim.launch.synth.run_synth``: broker, coordinator, aggregators and
K party processes) on one dataset and ε, through a broker this script starts, with a
tap: a plain ZeroMQ SUB socket on the broker's subscriber port, subscribed to ``ff/``,
that counts every frame the broker forwards, by message kind (``up`` masked vectors and
sums, ``pk``/``nk`` keys, ``sh``/``rs`` seed shares, ``rv`` reveals, ``plan``, ``hello``,
...). The broker's own count (``bytes_wire`` in ``metrics.json``) is the headline figure;
the tap's total must match it.

Variants, each run with the same parties' noise seeds (``noise_seed`` = 11, 12, ...).
Parties send exact integer counts + integer Skellam noise (nothing is rounded), so the
released aggregate is the same in every variant; only the ring widths differ:

* ``compressed``: the default protocol: per-cell rings from public bounds and 12 noise
  std of tails (``ring = "cell"``), no ring cap (``bits = 0``), one key exchange and one
  seed batch per run.
* ``uniform_ring``: the same, but every cell of a round in the widest cell's ring.
* ``fine``: ``bits = 24``, now a ring-width cap that the default rings stay under: the
  same output as ``compressed`` (kept as the TV-cost reference, which is 0 by
  construction).

``bytes_naive`` is each run's own naive figure: every noisy marginal as float32, sent by
each party and forwarded by each aggregator, without masking, quantisation or keys.

Usage::

    python bench/synth_wire.py --json /tmp/wire.json       # adult, K=10, eps 1, 3 seeds
    python bench/synth_wire.py --quick                     # 1 seed, compressed and fine
    python bench/synth_wire.py --dataset bank --epsilon 10 --seeds 2
    python bench/synth_wire.py --mechanism aim --seeds 2
    python bench/synth_wire.py --bank8 --quick   # bank, 8 of its categorical columns
    python bench/synth_wire.py --bank8 --queries 10 --quick --json /tmp/wire.json

Each run's ``bytes_wire`` is also split (``metrics.json``) into ``fixed`` (schema and
hellos, keys, seed shares: once per run) and ``rounds`` (plans, masked vectors and sums,
unmasking and reveals), each over ``bytes_naive``.

Queries in one session (``--queries Q``): the run is a consortium session whose keys are
set up once: the mechanism's release is the first query and ``Q - 1`` workload updates
queued before the run are the others (each ``--query-marginals`` 3-way marginals no other
update asks for, in a fixed order; ``synth.stream.rho_frac`` = ``--stream-frac`` of ρ
held back for them, split evenly). The session's bytes are split into ``fixed`` (schema
and hellos, keys, the end of the run: once per session) and per query (its seed batch,
plan, masked vectors and sums, reveals), each query beside its own naive float32 bytes;
``summary.wire_over_naive_per_query`` = (fixed + Σ per-query bytes) / Σ per-query naive
bytes, of the ``compressed`` variant (the default protocol), ``summary.fixed_bytes`` its
fixed bytes.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import zmq  # noqa: E402

from pubsub.address import BrokerAddress  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "compressed": {},
    "uniform_ring": {"ring": "uniform"},  # [synth.secagg] keys
    "fine": {"bits": 24},
}


class Tap:
    """Counts the frames the broker forwards on ``ff/`` topics, by message kind.

    A background thread owns its SUB socket (LINGER 0) and polls with a 200 ms deadline,
    so :meth:`close` returns within a poll period.
    """

    def __init__(self, broker: str) -> None:
        self.msgs: collections.Counter[str] = collections.Counter()
        self.bytes: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._endpoint = BrokerAddress.parse(broker).sub_endpoint
        self._thread = threading.Thread(target=self._run, name="tap", daemon=True)
        self._thread.start()
        if not self._ready.wait(10.0):
            raise RuntimeError("the tap did not connect within 10 s")

    def _run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.SUB)
        sock.linger = 0
        try:
            sock.connect(self._endpoint)
            sock.subscribe(b"ff/")
            self._ready.set()
            while not self._stop.is_set():
                if not sock.poll(200):
                    continue
                frames = sock.recv_multipart(copy=True)
                topic = frames[0].split(b"\0", 1)[0].decode("utf-8", "replace")
                parts = topic.split("/")  # ff/<run>/all/<kind> or ff/<run>/to/<node>/<kind>/...
                kind = parts[3] if len(parts) > 3 and parts[2] == "all" else (
                    parts[4] if len(parts) > 4 else "?")
                self.msgs[kind] += 1
                self.bytes[kind] += sum(len(f) for f in frames)
        finally:
            sock.close()

    def reset(self) -> None:
        """Start counting afresh (between runs; the thread only ever adds)."""
        self.msgs.clear()
        self.bytes.clear()

    def close(self) -> None:
        """Stop the thread (idempotent)."""
        self._stop.set()
        self._thread.join(timeout=5.0)


def query_updates(columns: list[str], queries: int, per_query: int) -> list[dict[str, Any]]:
    """``queries - 1`` workload updates, each ``per_query`` 3-way marginals of
    ``columns`` that no other update asks for (a fixed shuffle), the stream reserve of ρ
    split evenly among them (each takes 1 / (updates left) of what is left)."""
    import itertools
    import random

    triples = [list(c) for c in itertools.combinations(columns, 3)]
    random.Random(0).shuffle(triples)
    n = queries - 1
    if n * per_query > len(triples):
        raise SystemExit(f"--queries {queries} x --query-marginals {per_query} needs "
                         f"{n * per_query} distinct 3-way marginals; {len(columns)} columns "
                         f"have {len(triples)}")
    return [{"marginals": triples[i * per_query:(i + 1) * per_query], "rho_share": 1.0 / (n - i)}
            for i in range(n)]


def run_variant(cfg: Any, out: Path, broker: str, tap: Tap, timeout_s: float,
                updates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One federated run through ``broker`` (with ``updates`` queued: a session of
    queries); returns its figures and the tap's counts."""
    from sim.launch.synth import run_synth

    tap.reset()
    # plaintext on loopback: the tap is a plain SUB socket (CURVE adds the same bytes
    # per frame to every variant; the runs' bytes are what the broker forwards)
    res = run_synth(cfg, out, broker=broker, timeout_s=timeout_s, quiet=True, insecure=True,
                    workload=updates or None)
    time.sleep(0.5)  # the last frames reach the tap
    m = res.metrics
    return {"avg_tv": m["avg_tv"], "max_tv": m["max_tv"], "bytes_wire": m["bytes_wire"],
            "bytes_naive": m["bytes_naive"], "wire_vs_naive": m["wire_vs_naive"],
            "bytes_wire_fixed": m.get("bytes_wire_fixed"),
            "bytes_wire_rounds": m.get("bytes_wire_rounds"),
            "bytes_wire_by_stage": m.get("bytes_wire_by_stage"),
            "bytes_wire_session_fixed": m.get("bytes_wire_session_fixed"),
            "bytes_wire_by_query": m.get("bytes_wire_by_query"),
            "wire_over_naive_per_query": m.get("wire_over_naive_per_query"),
            "wall_s": m["wall_s"], "tap_bytes": dict(tap.bytes), "tap_msgs": dict(tap.msgs),
            "tap_total": int(sum(tap.bytes.values())),
            "ring_bits_mean": {k: r["ring_bits_mean"] for k, r in m["rounds"].items()},
            "ring_bits_max": {k: r["ring_bits_max"] for k, r in m["rounds"].items()},
            "cells": {k: r["cells"] for k, r in m["rounds"].items()}}


def _median_ratio(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] / r["bytes_naive"] for r in rows if r.get(key) is not None and r["bytes_naive"]]
    return statistics.median(vals) if vals else None


#: ``--bank8``: bank with 8 of its categorical columns (the issue's small all-discrete table)
BANK8_DROP = ("age", "balance", "day", "month", "duration", "campaign", "pdays", "previous",
              "poutcome")


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per variant, and the paired relative TV cost of each variant vs ``fine``."""
    out: dict[str, Any] = {}
    for name, rows in runs.items():
        ok = [r for r in rows if r.get("avg_tv") is not None]
        if not ok:
            out[name] = None
            continue
        kinds = sorted({k for r in ok for k in r["tap_bytes"]})
        out[name] = {
            "avg_tv": statistics.median(r["avg_tv"] for r in ok),
            "wire_vs_naive": statistics.median(r["wire_vs_naive"] for r in ok),
            "saving_vs_naive": 1.0 - statistics.median(r["wire_vs_naive"] for r in ok),
            "bytes_wire": statistics.median(r["bytes_wire"] for r in ok),
            "bytes_naive": statistics.median(r["bytes_naive"] for r in ok),
            "fixed_vs_naive": _median_ratio(ok, "bytes_wire_fixed"),
            "rounds_vs_naive": _median_ratio(ok, "bytes_wire_rounds"),
            "bytes_by_kind": {k: statistics.median(r["tap_bytes"].get(k, 0) for r in ok)
                              for k in kinds},
            "runs": len(ok)}
    main = [r for r in runs.get("compressed", []) if r.get("wire_over_naive_per_query")]
    if main:  # the session's figures, of the default protocol
        out["wire_over_naive_per_query"] = statistics.median(
            r["wire_over_naive_per_query"] for r in main)
        out["fixed_bytes"] = statistics.median(r["bytes_wire_session_fixed"] for r in main)
        out["queries"] = len(main[0]["bytes_wire_by_query"])
        out["per_query"] = main[0]["bytes_wire_by_query"]
        out["bytes_by_stage"] = main[0]["bytes_wire_by_stage"]
    fine = runs.get("fine", [])
    for name, rows in runs.items():
        if name == "fine" or out.get(name) is None:
            continue
        pairs = [(r["avg_tv"], f["avg_tv"]) for r, f in zip(rows, fine, strict=False)
                 if r.get("avg_tv") is not None and f.get("avg_tv") is not None]
        if pairs:
            rel = [a / b - 1.0 for a, b in pairs]
            out[name]["tv_cost_vs_fine"] = statistics.mean(rel)
            out[name]["tv_cost_vs_fine_each"] = rel
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    """Run the variants and print the table; returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--parties", type=int, default=10)
    ap.add_argument("--mechanism", default="mst", choices=("mst", "aim"))
    ap.add_argument("--quick", action="store_true",
                    help="one noise seed, the compressed and fine variants (about 1 minute "
                    "for MST)")
    ap.add_argument("--seeds", type=int, default=3, help="noise seeds 11, 12, ...")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, default=None, help="run directories (default: temp)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per run")
    ap.add_argument("--drop-columns", default=None,
                    help="comma-separated columns left out (default: the dataset's own)")
    ap.add_argument("--queries", type=int, default=1,
                    help="queries in the session: the release and QUERIES - 1 workload updates")
    ap.add_argument("--query-marginals", type=int, default=3,
                    help="3-way marginals per workload update (--queries)")
    ap.add_argument("--stream-frac", type=float, default=0.5,
                    help="with --queries > 1: the fraction of rho held back for the updates")
    ap.add_argument("--bank8", action="store_true",
                    help="bank restricted to 8 categorical columns (job, marital, education, "
                    "default, housing, loan, contact, y)")
    args = ap.parse_args(argv)
    if args.bank8:
        args.dataset, args.drop_columns = "bank", ",".join(BANK8_DROP)
    if args.quick:
        args.seeds, args.variants = 1, "compressed,fine"

    from sim.launch.vfl import _stop, start_broker
    from synth.config import DataSection, StreamSection, SynthConfig

    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    drop = (tuple(c for c in args.drop_columns.split(",") if c)
            if args.drop_columns is not None else None)
    if args.queries < 1:
        ap.error(f"--queries must be >= 1, got {args.queries}")
    base = SynthConfig(dataset=args.dataset, parties=args.parties, epsilon=args.epsilon,
                       mechanism=args.mechanism, data=DataSection(drop_columns=drop),
                       stream=StreamSection(rho_frac=args.stream_frac if args.queries > 1
                                            else 0.0))
    updates: list[dict[str, Any]] = []
    if args.queries > 1:
        from parties.data import load_table

        frame, _ = load_table(base.dataset)
        columns = [str(c) for c in frame.columns if c not in set(base.resolved_drop())]
        updates = query_updates(columns, args.queries, args.query_marginals)
    root = args.out or Path(tempfile.mkdtemp(prefix="synth_wire_"))
    root.mkdir(parents=True, exist_ok=True)
    broker_proc, broker = start_broker(root, root / "broker_events.jsonl")
    tap = Tap(broker)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    t0 = time.perf_counter()
    try:
        for s in range(args.seeds):
            for name in names:  # interleaved: the machine's drift hits every variant alike
                cfg = replace(base, noise_seed=11 + s,
                              secagg=replace(base.secagg, **VARIANTS[name]))
                try:
                    row = run_variant(cfg, root / f"{name}_{s}", broker, tap, args.timeout_s,
                                      updates)
                except Exception as exc:  # noqa: BLE001 - record, go on with the others
                    row = {"error": repr(exc)}
                row["noise_seed"] = 11 + s
                runs[name].append(row)
                print(f"{name:13s} seed {11 + s}: " + (
                    f"TV {row['avg_tv']:.4f}  wire/naive {row['wire_vs_naive']:.3f}  "
                    f"fixed {row['bytes_wire_session_fixed'] or 0:,} B  "
                    f"({row['bytes_wire']:,} / {row['bytes_naive']:,} B, tap "
                    f"{row['tap_total']:,} B)  {row['wall_s']:.1f} s"
                    if "error" not in row else row["error"]), flush=True)
    finally:
        tap.close()
        _stop(broker_proc)
    summary = summarise(runs)
    print(f"\n{args.dataset}, {args.mechanism}, K = {args.parties}, epsilon = {args.epsilon:g}, "
          f"{args.seeds} noise seed(s), {time.perf_counter() - t0:.0f} s\n")
    print("| variant | avg TV | TV cost vs fine | wire / naive | fixed / naive | "
          "rounds / naive | saving | wire B | naive B |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        r = summary.get(name)
        if r is None:
            print(f"| {name} | failed | | | | | | | |")
            continue
        cost = r.get("tv_cost_vs_fine")
        print(f"| {name} | {r['avg_tv']:.4f} | {'' if cost is None else f'{cost:+.1%}'} | "
              f"{r['wire_vs_naive']:.3f} | {_fmt(r['fixed_vs_naive'])} | "
              f"{_fmt(r['rounds_vs_naive'])} | {r['saving_vs_naive']:.1%} | "
              f"{r['bytes_wire']:,.0f} | {r['bytes_naive']:,.0f} |")
    if summary.get("wire_over_naive_per_query") is not None:
        print(f"\nsession of {summary['queries']} quer{'y' if summary['queries'] == 1 else 'ies'}"
              f" (compressed): wire/naive per query {summary['wire_over_naive_per_query']:.3f}"
              f", fixed {summary['fixed_bytes']:,.0f} B once")
        for q, r in summary["per_query"].items():
            print(f"  {q}: wire {r['bytes_wire']:,} B, naive {r['bytes_naive']:,} B, "
                  f"wire/naive {_fmt(r['wire_over_naive'])}")
    print("\nbytes by kind (median):")
    for name in names:
        r = summary.get(name)
        if r:
            print(f"  {name}: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(
                r["bytes_by_kind"].items(), key=lambda kv: -kv[1])))
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"out": str(root),
                                                                    "json": str(args.json)},
                                         "summary": summary, "runs": runs}, indent=1,
                                        default=str))
    return 0 if all(summary.get(n) for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
