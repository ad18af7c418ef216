"""What this machine allows: the efficiency a bare two-process pipeline reaches.

`bench/vfl_table.py` judges each algorithm's training throughput against a ceiling from
a single-worker compute profile (``psfl vfl profile``: one party at a time, no messages,
an otherwise idle core). This script measures, in the same invocation and with the same
worker compute (:func:`parties.models.compute.make_compute`, the table's model, B, data and
core pinning), how much of that ceiling is reachable at all once two party processes run
at once and exchange embeddings and gradients:

* ``concurrent``: both parties' compute loops at once, each pinned to its core, no
  messages (active: own bottom forward + top step on a fixed partner embedding;
  passive: bottom forward + backward from a fixed gradient). What running side by side
  costs (shared caches and memory bandwidth, the hypervisor).
* ``bare_zmq``: the smallest pipelined split-learning loop: the two processes talk
  directly over ZeroMQ PUSH/PULL on tcp://127.0.0.1 (no broker, no asyncio, no codec,
  no parameter server, no evaluation). The passive party embeds up to ``window``
  batches ahead of the gradients it has applied (the AVFL staleness bound), the
  active party trains each embedding as it arrives and sends the cut-layer gradient
  as soon as it exists. What the transport costs: ZeroMQ's I/O thread wakes on the
  party's core twice per batch, and TCP copies every message.
* ``bare_broker``: the same loop, but both directions go through a ``zmq.proxy``
  XSUB/XPUB process (PUB/SUB sockets, one topic per direction): what the broker hop the
  design requires costs, without any of our own code.
* ``avfl``, ``pubsub``: the real system (``sim.launch.vfl.run_vfl``: broker and two party
  processes, the table's settings and worker counts), training samples/s over
  training time as ``bench/vfl_table.py`` computes it.

Every figure is samples/s of the bottleneck (active) party over its timed window ÷
the ceiling (the mean of a profile taken before and one after each repeat), so
``bare_zmq`` is the best efficiency a design on this bus can expect here and the gap
from it to ``pubsub`` is our own overhead (broker hop, asyncio, codec, schedules).

``--split A:P`` (e.g. ``50:14``, the paper's split) asks the same question under
``bench/hetero.py``'s CPU quotas instead of one pinned core per party: each child joins
a CPU-share group of its split's cores, the models are hetero's balanced widths, and the
ceiling is hetero's quota profile (mean of one before and one after each repeat). The
set-ups there are ``bare_broker``; ``bare_broker_sync``, the same loop with the passive
party's parameter-server sync after every step (what PubSub-VFL's ΔT_t = 1 costs: with
ΔT0 = 5 a worker syncs after every step for the first four epochs); and ``pubsub``, the
real run as hetero runs it. Each figure is samples/s ÷ the ceiling; the bare loops also
report the passive party's CPU use of its quota.

Usage::

    python bench/vfl_bound.py --quick --json /tmp/bound.json   # 1 repeat, ~2 minutes
    python bench/vfl_bound.py --reps 3                          # interleaved repeats
    python bench/vfl_bound.py --split 50:14 --reps 2            # under hetero's quotas

Every wait has a deadline (socket polls, child joins); children are killed on failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

WINDOW = 5  # batches the passive party may run ahead (avfl's default staleness bound)
RECV_TIMEOUT_MS = 30_000
MODES = ("concurrent", "bare_zmq", "bare_broker", "avfl", "pubsub")
SPLIT_MODES = ("bare_broker", "bare_broker_sync", "pubsub")


def _bench(name: str) -> Any:
    """The sibling bench script ``name``.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table() -> Any:
    return _bench("vfl_table")


def _f3(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _batches(n_train: int, batch: int, seed: int, count: int) -> list[Any]:
    from parties.algorithms.schedule import epoch_batches

    out: list[Any] = []
    epoch = 0
    while len(out) < count:
        out += [b for b in epoch_batches(n_train, batch, seed=seed, epoch=epoch) if len(b) == batch]
        epoch += 1
    return out[:count]


def _party(role: str, cfg: Any, mode: str, steps: int, warmup: int, ports: tuple[int, int],
           ready: Any, go: Any, results: Any) -> None:
    """One party process: pin, load, build the compute, then run ``mode`` for ``steps``
    timed steps after ``warmup`` untimed ones; puts a result dict on ``results``."""
    import numpy as np
    import torch
    import zmq

    from parties.models.model import ParameterServer, flat_params, party_modules
    from parties.data.party import load_party_data
    from parties.models.compute import make_compute

    try:
        if cfg.workers.cpus(role):
            os.sched_setaffinity(0, set(cfg.workers.cpus(role)))
        torch.set_num_threads(cfg.workers.torch_threads)
        data = load_party_data(cfg, role)
        d_in = data.x_train.shape[1]
        torch.manual_seed(cfg.seed + (0 if role == "active" else 1))
        mods = party_modules(cfg, role, d_in)
        compute = make_compute(role, cfg, data.x_train, data.y_train,
                               ParameterServer(flat_params(mods)), sync_mode="manual")
        B = cfg.batch_size
        total = warmup + steps
        batches = _batches(data.x_train.shape[0], B, cfg.seed, total)
        fixed = (np.random.default_rng(cfg.seed).standard_normal((B, cfg.model.embedding_dim))
                 .astype(np.float32) * 0.01)
        ctx = zmq.Context()
        tx = rx = None
        topic_in, topic_out = (b"e", b"g") if role == "active" else (b"g", b"e")
        if mode == "bare_zmq":
            tx, rx = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
            for s in (tx, rx):
                s.setsockopt(zmq.LINGER, 0)
            mine, theirs = ports if role == "active" else ports[::-1]
            rx.bind(f"tcp://127.0.0.1:{mine}")
            tx.connect(f"tcp://127.0.0.1:{theirs}")
        elif mode in ("bare_broker", "bare_broker_sync"):  # PUB/SUB through a zmq.proxy
            tx, rx = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
            for s in (tx, rx):
                s.setsockopt(zmq.LINGER, 0)
            tx.connect(f"tcp://127.0.0.1:{ports[0]}")
            rx.connect(f"tcp://127.0.0.1:{ports[1]}")
            rx.setsockopt(zmq.SUBSCRIBE, topic_in)
            time.sleep(1.0)  # let the subscription reach the proxy
        ready.put(role)
        if not go.wait(120):
            raise TimeoutError("no go signal within 120 s")

        pubsub_mode = mode in ("bare_broker", "bare_broker_sync")
        sync = mode == "bare_broker_sync"

        def recv() -> list[Any]:
            assert rx is not None
            if not rx.poll(RECV_TIMEOUT_MS):
                raise TimeoutError(f"{role}: no message within {RECV_TIMEOUT_MS} ms")
            frames = rx.recv_multipart(copy=False)
            return frames[1:] if pubsub_mode else frames

        def send(frames: list[Any], **kw: Any) -> None:
            assert tx is not None
            tx.send_multipart([topic_out, *frames] if pubsub_mode else frames, **kw)

        cpu = 0.0
        step_cpu = sync_cpu = 0.0  # passive: its thread's CPU in compute and in PS syncs
        t0 = r0 = None
        if mode == "concurrent":
            for i in range(total):
                if i == warmup:
                    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                c0 = time.thread_time()
                rows = batches[i]
                if role == "passive":
                    graph, _h = compute.forward(rows)
                    compute.backward(graph, fixed, 0)
                else:
                    compute.top_step(compute.forward_own(rows), fixed, rows, 0)
                if i >= warmup:
                    cpu += time.thread_time() - c0
        elif role == "passive":
            assert tx is not None
            graphs: dict[int, Any] = {}
            sent = applied = 0
            while applied < total:
                while sent < total and sent - applied < WINDOW:
                    c0 = time.thread_time()
                    graph, h = compute.forward(batches[sent])
                    step_cpu += time.thread_time() - c0
                    graphs[sent] = graph
                    send([sent.to_bytes(4, "little"), h], copy=False)
                    sent += 1
                    if rx is not None and rx.poll(0):
                        break
                frames = recv()
                b = int.from_bytes(frames[0].bytes, "little")
                grad = np.frombuffer(frames[1].buffer, dtype=np.float32).reshape(B, -1)
                if b == warmup:
                    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                c0 = time.thread_time()
                compute.backward(graphs.pop(b), grad, 0)
                c1 = time.thread_time()
                step_cpu += c1 - c0
                if sync:  # push the step's change to the PS and pull (Replica.sync)
                    compute.replica.sync()
                    sync_cpu += time.thread_time() - c1
                applied += 1
        else:
            assert tx is not None
            for i in range(total):
                frames = recv()
                if i == warmup:
                    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                b = int.from_bytes(frames[0].bytes, "little")
                emb = np.frombuffer(frames[1].buffer, dtype=np.float32).reshape(B, -1)
                head = frames[0].bytes
                c0 = time.thread_time()
                compute.top_step(compute.forward_own(batches[b]), emb, batches[b], 0,
                                 on_grad=lambda g, head=head: send([head, g]))
                if i >= warmup:
                    cpu += time.thread_time() - c0
        wall = time.perf_counter() - t0 if t0 is not None else float("nan")
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = ((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
                 if r0 is not None else float("nan"))
        results.put({"role": role, "wall_s": wall, "samples_per_s": steps * B / wall,
                     "cpu_s": cpu_s,
                     # passive, bare loops: mean over all (warm-up included) steps
                     "passive_step_cpu_ms": 1e3 * step_cpu / total if step_cpu else None,
                     "passive_sync_cpu_ms": 1e3 * sync_cpu / total if sync_cpu else None,
                     "step_cpu_ms": 1e3 * cpu / steps if cpu else None,
                     "invol_switches_per_step": (r1.ru_nivcsw - r0.ru_nivcsw) / steps
                     if r0 is not None else None})
        time.sleep(0.3)  # let the last message leave before LINGER=0 drops it
        ctx.destroy(linger=0)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails
        results.put({"role": role, "error": f"{type(exc).__name__}: {exc}"})


def run_pair(cfg: Any, mode: str, steps: int, warmup: int = 30,
             timeout_s: float = 300.0, cores: dict[str, float] | None = None,
             period_us: int = 10_000) -> dict[str, Any]:
    """Run ``mode`` (``concurrent``, ``bare_zmq``, ``bare_broker``, ``bare_broker_sync``)
    in two child processes, pinned as ``cfg`` says, and each in a CPU-share group of
    ``cores[role]`` cores when ``cores`` is given (:class:`sim.cluster.cpu.CpuLimiter`, periods of
    ``period_us`` µs; the proxy is not limited, like the broker of a sim run).

    Returns ``{"active": {...}, "passive": {...}}`` with ``samples_per_s``, ``cpu_s``
    (the process's CPU seconds in the timed window), ``step_cpu_ms`` (active),
    ``invol_switches_per_step``, and ``cpu_method`` when limited.

    Raises:
        RuntimeError: a child failed or missed the deadline (``timeout_s`` seconds).
    """
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    proxy = None
    lims: dict[str, Any] = {}
    if mode in ("bare_broker", "bare_broker_sync"):
        import subprocess

        code = ("import zmq,sys; c=zmq.Context(); a=c.socket(zmq.XSUB); b=c.socket(zmq.XPUB); "
                f"a.bind('tcp://127.0.0.1:{ports[0]}'); b.bind('tcp://127.0.0.1:{ports[1]}'); "
                "zmq.proxy(a, b)")
        proxy = subprocess.Popen([sys.executable, "-c", code])
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_party, args=(role, cfg, mode, steps, warmup, tuple(ports),
                                              ready, go, results), daemon=True)
             for role in ("passive", "active")]
    deadline = time.monotonic() + timeout_s
    try:
        if cores is not None:
            from sim.cluster.cpu import CpuLimiter

            lims = {r: CpuLimiter.create(f"bound-{r}", cores[r], period_us=period_us)
                    for r in ("passive", "active")}
        for p, role in zip(procs, ("passive", "active"), strict=True):
            p.start()
            if role in lims:
                lims[role].add(p.pid)
        for _ in procs:
            ready.get(timeout=max(1.0, deadline - time.monotonic()))
        go.set()
        out: dict[str, Any] = {}
        for _ in procs:
            r = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if "error" in r:
                raise RuntimeError(f"{mode} {r['role']}: {r['error']}")
            out[r["role"]] = r
            if lims:
                r["cpu_method"] = lims[r["role"]].method
                r["cpu_util"] = r["cpu_s"] / (r["wall_s"] * cores[r["role"]])  # type: ignore[index]
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        return out
    except Exception as exc:
        raise RuntimeError(f"{mode}: {exc}") from exc
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        if proxy is not None:
            proxy.kill()
            proxy.wait(5)
        for lim in lims.values():
            lim.close()


def run_split(split: str, *, rows: int, epochs: int, reps: int) -> dict[str, Any]:
    """``--split``: the bare loops and the real ``pubsub`` run under hetero's quotas for
    ``split``, with hetero's balanced models; ``reps`` interleaved repeats, each judged
    against the mean of a quota profile before and one after it.

    Returns the JSON document: ``settings``, ``reps`` (per repeat: ceiling, efficiency
    and detail per set-up) and ``summary`` (median efficiency per set-up, and the
    passive party's median CPU use of its quota in the bare loops).

    Raises:
        SystemExit: a run failed or no profile could be taken.
    """
    import dataclasses
    import tempfile

    from parties.planning.profile import mean_profile

    from sim.cluster.cpu import machine_cores
    from sim.cluster.scenario import Scenario, party_cores

    het = _bench("hetero")
    cores = party_cores(Scenario(cpu_ratio=split, ratio_of=het.RATIO_OF), machine_cores())
    cfg, _bal, model = het.split_config(het.base_config(rows, epochs), split, cores)
    n_train = int(rows * (1 - cfg.data.test_frac) * 0.9)  # 10 % of the rest is validation
    steps = max(200, epochs * n_train // cfg.batch_size)
    wa, wp = het.workers_for("pubsub", cores, split)
    print(f"{split}: cores {cores}, {model}, synthetic {rows:,} rows, B={cfg.batch_size}, "
          f"{steps} timed steps of the bare loops, pubsub {wa}+{wp} workers, "
          f"{reps} repeat(s)", flush=True)
    reps_out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bound_") as tmp:
        for rep in range(reps):
            before = het.quota_profile(cfg, cores, min_time_s=1.5)
            got: dict[str, Any] = {}
            for mode in ("bare_broker", "bare_broker_sync"):
                got[mode] = run_pair(cfg, mode, steps, cores=cores, period_us=het.PERIOD_US)
            r = het.run_algo(dataclasses.replace(cfg, algo="pubsub",
                                                 workers=dataclasses.replace(cfg.workers, active=wa, passive=wp)),
                             split, Path(tmp) / f"pubsub-{rep}", 600.0)
            if r["status"] != "ok":
                raise SystemExit(f"error: pubsub run failed: {r.get('error')}")
            got["pubsub"] = {"active": {"samples_per_s": r["train_samples_per_s"]},
                             "passive": {"cpu_util": r["cpu_util_train"]["passive"]},
                             "efficiency_inrun": het._inrun_eff(r), "metric": r["metric"],
                             "cpu_ms_per_batch": {
                                 k: 1e3 * cfg.batch_size * v for k, v in (
                                     ("step", (r.get("step_cpu_s_per_sample") or {})
                                      .get("passive")),
                                     ("sync", (r.get("sync_cpu_s_per_sample") or {})
                                      .get("passive"))) if v is not None}}
            for mode in ("bare_broker", "bare_broker_sync"):
                # against the in-run ceiling, as hetero's: the quota ÷ the step CPU per
                # sample the loop's own passive thread spent (this machine drifts 10-30 %
                # between profiles, and the in-run figure shares the run's seconds)
                ms = got[mode]["passive"].get("passive_step_cpu_ms")
                got[mode]["efficiency_inrun"] = (
                    got[mode]["active"]["samples_per_s"] * ms / 1e3 / cfg.batch_size
                    / cores["passive"] if ms else None)
            after = het.quota_profile(cfg, cores, min_time_s=1.5)
            prof = mean_profile([before, after])
            ceiling = prof.ceiling_samples_per_s
            eff = {m: got[m]["active"]["samples_per_s"] / ceiling for m in SPLIT_MODES}
            inrun = {m: got[m]["efficiency_inrun"] for m in SPLIT_MODES}
            reps_out.append({"ceiling_samples_per_s": ceiling, "bound_by": prof.bound_by,
                             "efficiency": eff, "efficiency_inrun": inrun, "detail": got})
            print(f"repeat {rep}: ceiling {ceiling:,.0f} samples/s (bound by "
                  f"{prof.bound_by}; before {before.ceiling_samples_per_s:,.0f}, after "
                  f"{after.ceiling_samples_per_s:,.0f})", flush=True)
            for m in SPLIT_MODES:
                util = got[m]["passive"].get("cpu_util")
                step = got[m]["passive"].get("passive_step_cpu_ms")
                sync = got[m]["passive"].get("passive_sync_cpu_ms")
                if m == "pubsub":
                    step = got[m]["cpu_ms_per_batch"].get("step")
                    sync = got[m]["cpu_ms_per_batch"].get("sync")
                print(f"  {m:<17} {got[m]['active']['samples_per_s']:>9,.0f} samples/s  "
                      f"efficiency {eff[m]:.3f} (in-run {_f3(inrun[m])})  passive: CPU use "
                      f"of its quota {_f3(util)}, ms/batch step {_f3(step)} sync "
                      f"{_f3(sync)}", flush=True)
    summary: dict[str, Any] = {m: statistics.median(r["efficiency"][m] for r in reps_out)
                               for m in SPLIT_MODES}
    summary["inrun"] = {m: statistics.median(r["efficiency_inrun"][m] for r in reps_out)
                        for m in SPLIT_MODES
                        if all(r["efficiency_inrun"][m] is not None for r in reps_out)}
    # the real system over the bare loop through a broker, per repeat (the same
    # invocation, the same quotas), median over the repeats
    pairs = [(r["efficiency_inrun"]["pubsub"], r["efficiency_inrun"]["bare_broker"])
             for r in reps_out]
    if all(a is not None and b for a, b in pairs):
        summary["inrun"]["pubsub_vs_bare_broker"] = statistics.median(a / b for a, b in pairs)
    summary["passive_cpu_util"] = {
        m: statistics.median(r["detail"][m]["passive"]["cpu_util"] for r in reps_out)
        for m in SPLIT_MODES if all(r["detail"][m]["passive"].get("cpu_util") is not None
                                    for r in reps_out)}
    print("median efficiency: " + ", ".join(
        f"{m} {summary[m]:.3f} (in-run {_f3(summary['inrun'].get(m))})" for m in SPLIT_MODES)
        + f"; pubsub / bare_broker in-run {_f3(summary['inrun'].get('pubsub_vs_bare_broker'))}",
        flush=True)
    widths = {r: cfg.model.bottom_hidden_for(r)[0] for r in ("active", "passive")}
    return {"settings": {"split": split, "cores": cores, "widths": widths, "rows": rows,
                         "epochs": epochs, "steps": steps, "reps": reps, "window": WINDOW,
                         "pubsub_workers": [wa, wp]},
            "reps": reps_out, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat (default: 3)")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repeats")
    ap.add_argument("--rows", type=int, default=None,
                    help="synthetic rows (default: vfl_table's quick size, 60,000)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs of the real runs (default 6; with --split 4)")
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    ap.add_argument("--split", default=None, metavar="A:P",
                    help="under bench/hetero.py's CPU quotas for this split of 64 cores "
                         "(e.g. 50:14) instead of one pinned core per party; hetero's "
                         "balanced models, 30,000 rows and 4 epochs unless given")
    args = ap.parse_args(argv)
    reps = args.reps or (1 if args.quick else 3)
    if args.split is not None:
        from pubsub.config import ConfigError
        from pubsub.logs import configure_logging

        from sim.cluster.cpu import machine_cores
        from sim.cluster.scenario import Scenario, party_cores

        try:
            party_cores(Scenario(cpu_ratio=args.split, ratio_of=_bench("hetero").RATIO_OF),
                        machine_cores())
        except (ConfigError, ValueError) as exc:
            ap.error(f"--split: {exc}")
        configure_logging(stderr_level="error")
        doc = run_split(args.split, rows=args.rows or 30_000, epochs=args.epochs or 4,
                        reps=reps)
        if args.json:
            args.json.write_text(json.dumps(doc, indent=1))
        return 0
    args.epochs = args.epochs or 6
    table = _table()
    active_cpus, passive_cpus = table.pick_cpus()
    rows = args.rows or table.QUICK_SYNTHETIC_ROWS
    settings = {"active_cpus": active_cpus, "passive_cpus": passive_cpus, "synthetic_rows": rows}

    def cfg_for(algo: str) -> Any:
        wa, wp = table.main_workers(algo, "synthetic")
        cfg, why = table.make_config(algo, "synthetic", seed=0, epochs=args.epochs,
                                     settings=settings,
                                     **{"workers.active": wa, "workers.passive": wp})
        if cfg is None:
            raise SystemExit(f"error: {why}")
        return cfg

    base = cfg_for("avfl")
    n_train = int(rows * (1 - base.data.test_frac) * 0.9)
    steps = max(200, args.epochs * n_train // base.batch_size)  # as many as the real runs
    print(f"synthetic {rows:,} x {table.SYNTHETIC_FEATURES}, B={base.batch_size}, "
          f"cores active {active_cpus} passive {passive_cpus}, {steps} timed steps, "
          f"{reps} repeat(s)", flush=True)
    reps_out: list[dict[str, Any]] = []
    for rep in range(reps):
        before = table.run_profile(base)
        got: dict[str, Any] = {}
        for mode in ("concurrent", "bare_zmq", "bare_broker"):
            got[mode] = run_pair(base, mode, steps)
        for algo in ("avfl", "pubsub"):
            r = table.run_one(cfg_for(algo), table.run_timeout_s("synthetic", args.epochs, rows))
            if r["status"] != "ok":
                raise SystemExit(f"error: {algo} run failed: {r.get('error')}")
            got[algo] = {"active": {"samples_per_s": r["train_samples_per_s"]}, "metric": r["metric"]}
        after = table.run_profile(base)
        prof = table.combine_profiles([p for p in (before, after) if p is not None])
        if prof is None:
            raise SystemExit("error: no profile could be taken")
        ceiling = prof["ceiling_samples_per_s"]
        eff = {m: got[m]["active"]["samples_per_s"] / ceiling for m in MODES}
        reps_out.append({"ceiling_samples_per_s": ceiling, "efficiency": eff, "detail": got,
                         "profile_active_cpu_ms": 1e3 * prof["parties"]["active"]["cpu_s_per_step"]})
        print(f"repeat {rep}: ceiling {ceiling:,.0f} samples/s (active step "
              f"{reps_out[-1]['profile_active_cpu_ms']:.2f} ms CPU)", flush=True)
        for m in MODES:
            a = got[m]["active"]
            extra = ""
            if a.get("step_cpu_ms") is not None:
                extra = (f"  active step {a['step_cpu_ms']:.2f} ms CPU, "
                         f"{a['invol_switches_per_step']:.2f} preemptions/step")
            print(f"  {m:<11} {a['samples_per_s']:>9,.0f} samples/s  efficiency "
                  f"{eff[m]:.3f}{extra}", flush=True)
    summary = {m: statistics.median(r["efficiency"][m] for r in reps_out) for m in MODES}
    summary["pubsub_vs_bare_zmq"] = statistics.median(
        r["efficiency"]["pubsub"] / r["efficiency"]["bare_zmq"] for r in reps_out)
    summary["bare_broker_vs_bare_zmq"] = statistics.median(
        r["efficiency"]["bare_broker"] / r["efficiency"]["bare_zmq"] for r in reps_out)
    summary["bare_zmq_vs_concurrent"] = statistics.median(
        r["efficiency"]["bare_zmq"] / r["efficiency"]["concurrent"] for r in reps_out)
    print("median efficiency: " + ", ".join(f"{m} {summary[m]:.3f}" for m in MODES)
          + f"; pubsub / bare_zmq {summary['pubsub_vs_bare_zmq']:.3f}, bare_zmq / concurrent "
          f"{summary['bare_zmq_vs_concurrent']:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"settings": {"rows": rows, "steps": steps,
                                                      "reps": reps, "window": WINDOW},
                                         "reps": reps_out, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
