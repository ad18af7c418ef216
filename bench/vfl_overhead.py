"""Per-batch overhead of PubSub-VFL against a minimal synchronous split-learning loop.

What is measured
----------------
Training wall time per batch of two-party vertical split learning on the
bundled ``bank`` data (default column split, seed 0, test_frac 0.3, B = 256,
bottom ``d_in -> 64 -> 32`` per party, top ``64 -> 32 -> 1``, Adam lr 1e-3,
one torch thread per party process), for three set-ups run in the same
invocation:

* ``lockstep`` - the reference: the smallest thing that can do split learning
  between two OS processes. One ZeroMQ PAIR socket over tcp://127.0.0.1, no
  broker, no asyncio, no threads, no parameter server, one batch in flight.
  Per batch the passive party forwards its bottom model and sends the
  embedding (a small struct header + raw float32 bytes); the active party
  forwards its own bottom model, receives the embedding, runs the top model
  and the backward pass, sends the cut-layer gradient back and steps Adam;
  the passive party back-propagates it and steps Adam. Batch order is the
  same per-epoch order as our system (``parties.algorithms.schedule.epoch_batches``) and
  the models are initialised from the same seeds, so its test AUC is directly
  comparable.
* ``ours_w{1,2}_{process,thread}`` - the real system via ``sim.launch.vfl.run_vfl``
  (broker + two party processes, W workers per party, each worker a thread of
  the party process (the default) or a child process).

Why
---
Absolute timings on a shared, noisy 2-core machine mean little, so the
reference runs in the same invocation, interleaved with ours, and the result
is reported as a ratio of per-batch times (``overhead_ratio_w*`` = ours /
lockstep). ``w=1`` isolates the cost of the machinery (broker hop, asyncio,
worker hand-offs, PS syncs); ``w=2`` shows whether pipelining wins it back.
Summary keys without a suffix are for thread workers (the default when a party is not pinned to one core); ``_process``
keys are for process workers.

Timing boundaries
-----------------
* lockstep: from the active party's "go" (both parties have loaded their data
  and built their models) until the passive party reports that its last
  backward step is done. Data loading, process start-up and the final test
  evaluation are excluded.
* ours: ``metrics["train_wall_s"]`` (the active party's training wall time:
  the per-epoch training segments and their parameter-server syncs; the
  validation scoring after each epoch and the final test scoring are
  excluded) divided by ``metrics["parties"]["active"]["batches"]``. The
  per-repeat ``runs`` detail also records ``train_s_sum`` (the sum of the
  per-epoch ``train_s``), which now equals it.

Usage::

    python bench/vfl_overhead.py --quick --json /tmp/ovh.json   # 1 repeat, 3 epochs
    python bench/vfl_overhead.py                                # 3 repeats, 10 epochs

Every wait (socket receive, child process) has a deadline; child processes
are killed when anything fails, so the script never hangs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- settings
# Shared by the reference loop and by the VflConfig of our system.
DATASET = "bank"
SEED = 0
TEST_FRAC = 0.3
BATCH = 256
BOTTOM_HIDDEN = (64,)
EMB_DIM = 32
TOP_HIDDEN = (32,)
LR = 1e-3
DEFAULT_W = 2  # VflConfig's default workers per party

HANDSHAKE_TIMEOUT_S = 120.0  # both children load and encode the table first
RECV_TIMEOUT_S = 30.0  # any single message of the reference loop
LINGER_MS = 2000  # how long a closing socket may keep flushing queued messages

# --------------------------------------------------------------------------- wire format
# Every message of the reference loop is [header, payload]; the header is
# (kind, epoch, batch, rows) as four little-endian int32 and the payload is a
# C-contiguous (rows, EMB_DIM) float32 array as raw bytes (empty for control).
HEADER = struct.Struct("<4i")
READY, GO, EMB, GRAD, END, TEST = range(6)
KIND_NAMES = ("READY", "GO", "EMB", "GRAD", "END", "TEST")


class ProtocolError(RuntimeError):
    """The partner sent something other than what strict lock-step expects."""


def _send(sock: Any, kind: int, epoch: int = 0, batch: int = 0, arr: Any = None) -> None:
    rows = 0 if arr is None else int(arr.shape[0])
    payload = b"" if arr is None else memoryview(arr).cast("B")
    sock.send_multipart([HEADER.pack(kind, epoch, batch, rows), payload])


def _recv(sock: Any, kind: int, epoch: int = 0, batch: int = 0, *, dim: int = EMB_DIM) -> Any:
    """Receive the expected message; return its payload as a (rows, dim) array or None.

    The socket's RCVTIMEO makes this raise ``zmq.Again`` on a timeout.
    """
    import numpy as np

    header, payload = sock.recv_multipart()
    got = HEADER.unpack(header)
    if got[:3] != (kind, epoch, batch):
        name = KIND_NAMES[got[0]] if 0 <= got[0] < len(KIND_NAMES) else str(got[0])
        raise ProtocolError(f"expected {KIND_NAMES[kind]} e={epoch} b={batch}, "
                            f"got {name} e={got[1]} b={got[2]}")
    if not payload:
        return None
    # copy: bytes are read-only and torch.from_numpy wants a writable array
    return np.frombuffer(payload, dtype=np.float32).reshape(got[3], dim).copy()


# --------------------------------------------------------------------------- reference parties


def default_config() -> Any:
    """The reference settings above as a VflConfig (what ``run_ours`` uses, too)."""
    from parties.config import DataSection, ModelSection, VflConfig

    return VflConfig(dataset=DATASET, seed=SEED, batch_size=BATCH, lr=LR,
                     data=DataSection(test_frac=TEST_FRAC),
                     model=ModelSection(bottom_hidden=BOTTOM_HIDDEN, embedding_dim=EMB_DIM, top_hidden=TOP_HIDDEN))


def _setup(role: str, config: str) -> tuple[Any, Any]:
    """Config and this party's encoded data, exactly as our party loads them; pins the
    process to the party's configured CPUs and sets the torch threads."""
    import torch

    from parties.config import load_vfl_config
    from parties.data.party import load_party_data
    from parties.core.sysinfo import pin_process

    cfg = load_vfl_config(config)
    if cfg.workers.cpus(role):
        pin_process(cfg.workers.cpus(role))
    torch.set_num_threads(cfg.workers.torch_threads)
    return cfg, load_party_data(cfg, role)


def _socket(port: int, *, bind: bool) -> tuple[Any, Any]:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.SNDTIMEO, int(RECV_TIMEOUT_S * 1000))
    sock.setsockopt(zmq.RCVTIMEO, int(HANDSHAKE_TIMEOUT_S * 1000))
    addr = f"tcp://127.0.0.1:{port}"
    if bind:
        sock.bind(addr)
    else:
        sock.connect(addr)
    return ctx, sock


def _passive(port: int, epochs: int, config: str) -> None:
    import torch
    import zmq

    from parties.models.model import bottom_model, embed
    from parties.algorithms.schedule import epoch_batches

    cfg, data = _setup("passive", config)
    x_train = torch.from_numpy(data.x_train)
    x_test = torch.from_numpy(data.x_test)
    torch.manual_seed(cfg.seed + 1)  # our passive party's seed: both start from the same weights
    bottom = bottom_model(x_train.shape[1], cfg.model.bottom_hidden_for("passive"), cfg.model.embedding_dim)
    opt = torch.optim.Adam(bottom.parameters(), lr=cfg.lr)
    ctx, sock = _socket(port, bind=False)
    try:
        _send(sock, READY)
        _recv(sock, GO)
        sock.setsockopt(zmq.RCVTIMEO, int(RECV_TIMEOUT_S * 1000))
        n_train = x_train.shape[0]
        for epoch in range(epochs):
            for b, rows in enumerate(epoch_batches(n_train, cfg.batch_size, seed=cfg.seed,
                                                   epoch=epoch)):
                h = bottom(x_train[torch.from_numpy(rows)])
                _send(sock, EMB, epoch, b, h.detach().numpy())
                grad = _recv(sock, GRAD, epoch, b, dim=cfg.model.embedding_dim)
                opt.zero_grad(set_to_none=True)
                h.backward(torch.from_numpy(grad))
                opt.step()
        _send(sock, END)  # stops the active party's training clock
        _send(sock, TEST, arr=embed(bottom, x_test))
    finally:
        sock.close()  # lingers up to LINGER_MS to deliver the test embeddings
        ctx.term()


def _active(port: int, epochs: int, result: Path, config: str) -> None:
    import torch
    import zmq

    from parties.models.model import bottom_model, loss_function, predict, top_model
    from parties.algorithms.schedule import epoch_batches
    from parties.core.tasks import compute_metric, metric_name

    cfg, data = _setup("active", config)
    x_train = torch.from_numpy(data.x_train)
    y_train = torch.from_numpy(data.y_train)
    torch.manual_seed(cfg.seed)  # our active party's seed; bottom first, then top, as ours does
    bottom = bottom_model(x_train.shape[1], cfg.model.bottom_hidden_for("active"), cfg.model.embedding_dim)
    top = top_model(cfg.model.embedding_dim, cfg.model.top_hidden)
    opt = torch.optim.Adam([*bottom.parameters(), *top.parameters()], lr=cfg.lr)
    loss_fn = loss_function(data.task)
    n_train = x_train.shape[0]
    ctx, sock = _socket(port, bind=True)
    history: list[dict[str, float]] = []
    try:
        _recv(sock, READY)
        sock.setsockopt(zmq.RCVTIMEO, int(RECV_TIMEOUT_S * 1000))
        t0 = time.perf_counter()
        _send(sock, GO)
        batches = 0
        for epoch in range(epochs):
            t_epoch, loss_sum = time.perf_counter(), 0.0
            plan = epoch_batches(n_train, cfg.batch_size, seed=cfg.seed, epoch=epoch)
            for b, rows in enumerate(plan):
                idx = torch.from_numpy(rows)
                h_own = bottom(x_train[idx])
                emb = torch.from_numpy(_recv(sock, EMB, epoch, b, dim=cfg.model.embedding_dim)
                                       ).requires_grad_(True)
                loss = loss_fn(top(torch.cat([h_own, emb], dim=1)).squeeze(1), y_train[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                assert emb.grad is not None
                # send before stepping: the passive backward overlaps our Adam step, the
                # usual minimal split-learning loop (still one batch in flight)
                _send(sock, GRAD, epoch, b, emb.grad.numpy())
                opt.step()
                loss_sum += float(loss.detach())
                batches += 1
            history.append({"epoch": epoch, "loss": loss_sum / len(plan),
                            "train_s": time.perf_counter() - t_epoch})
        _recv(sock, END)  # the passive party's last backward step is done
        train_s = time.perf_counter() - t0
        # the last epoch's train_s should include the passive party's final step, too
        history[-1]["train_s"] += train_s - sum(h["train_s"] for h in history)
        emb_test = _recv(sock, TEST, dim=cfg.model.embedding_dim)
    finally:
        sock.close()
        ctx.term()
    pred = predict(bottom, top, torch.from_numpy(data.x_test), emb_test, task=data.task)
    if data.task == "regression":
        pred = pred.astype("float64") * data.label_std + data.label_mean
    assert data.y_test is not None
    value = compute_metric(data.task, data.y_test, pred)
    out = {"train_s": train_s, "batches": batches, "samples": epochs * n_train,
           "metric_name": metric_name(data.task), "metric": value,
           f"test_{metric_name(data.task)}": value, "history": history}
    result.write_text(json.dumps(out))


# --------------------------------------------------------------------------- orchestration


def _free_port() -> int:
    # Tiny race (the port could be taken before the active child binds); harmless here.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass


def run_lockstep(epochs: int, timeout_s: float, cfg: Any = None) -> dict[str, Any]:
    """One reference run in two child processes; returns the active party's result.

    Args:
        epochs: epochs to train.
        timeout_s: deadline of the whole run, seconds.
        cfg: a :class:`parties.config.VflConfig` whose data, split, seed, B, model, lr,
            torch threads and CPU pinning the loop uses (default: :func:`default_config`;
            its ``epochs``, workers, schedule and ``algo`` are ignored).

    Raises:
        sim.launch.vfl.LaunchError: a child failed; sim.launch.vfl.JobTimeout: past ``timeout_s``.
    """
    from parties.config import dump_vfl_config

    from sim.launch.vfl import wait_children

    with tempfile.TemporaryDirectory(prefix="vfl_lockstep_") as tmp:
        result = Path(tmp) / "active.json"
        config = Path(tmp) / "config.toml"
        config.write_text(dump_vfl_config(cfg if cfg is not None else default_config()))
        port = _free_port()
        base = [sys.executable, os.path.abspath(__file__), "--port", str(port),
                "--epochs", str(epochs), "--config", str(config)]
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            procs["passive"] = subprocess.Popen([*base, "--role", "passive"],
                                                stdout=subprocess.DEVNULL)
            procs["active"] = subprocess.Popen([*base, "--role", "active",
                                                "--result", str(result)],
                                               stdout=subprocess.DEVNULL)
            # raises LaunchError (a RuntimeError) on a failed party, JobTimeout on the deadline
            wait_children(procs, timeout_s=timeout_s, poll_s=0.02)
        finally:
            _kill(list(procs.values()))
        res = json.loads(result.read_text())
    res["ms_per_batch"] = 1e3 * res["train_s"] / res["batches"]
    res["samples_per_s"] = res["samples"] / res["train_s"]
    return res


def run_ours(epochs: int, workers: int, timeout_s: float, mode: str) -> dict[str, Any]:
    """One run of our system (broker + two parties) with ``workers`` workers per party,
    as worker processes or threads (``mode``)."""
    from parties.config import ModelSection, WorkersSection, VflConfig
    from sim.launch.vfl import run_vfl

    cfg = VflConfig(epochs=epochs, batch_size=BATCH,
                    model=ModelSection(bottom_hidden=BOTTOM_HIDDEN, embedding_dim=EMB_DIM, top_hidden=TOP_HIDDEN),
                    workers=WorkersSection(active=workers, passive=workers, mode=mode))
    with tempfile.TemporaryDirectory(prefix=f"vfl_ours_w{workers}_") as tmp:
        m = run_vfl(cfg, out=tmp, quiet=True, timeout_s=timeout_s).metrics
    act, pas = m["parties"]["active"], m["parties"].get("passive", {})
    batches = act["batches"]
    train_s_sum = sum(h["train_s"] for h in m["history"])
    return {
        "train_s": m["train_wall_s"], "batches": batches, "samples": act["samples"],
        "ms_per_batch": 1e3 * m["train_wall_s"] / batches,
        "samples_per_s": m["train_samples_per_s"], "test_auc": m["test_auc"],
        # evaluation-free variant of the same measure (see the module docstring)
        "train_s_sum": train_s_sum, "ms_per_batch_excl_eval": 1e3 * train_s_sum / batches,
        "cpu_util": {"active": act["cpu_util"], "passive": pas.get("cpu_util")},
        "wait_s_per_epoch": {"active": act["wait_s_per_epoch"],
                             "passive": pas.get("wait_s_per_epoch")},
        "worker_parallelism": {"active": act.get("worker_parallelism"),
                               "passive": pas.get("worker_parallelism")},
        "ps_pushes": act["ps_pushes"], "dropped_batches": m["dropped_batches"],
        "reassigned_batches": m["reassigned_batches"], "launch_wall_s": m["wall_s"],
        "history": m["history"],
    }


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repeat of 3 epochs (< 3 min)")
    ap.add_argument("--json", metavar="PATH", help="write summary + per-repeat runs (overwrites)")
    ap.add_argument("--epochs", type=int, metavar="N", help="epochs per run (default: 10, --quick: 3)")
    ap.add_argument("--repeats", type=int, metavar="N", help="repeats per set-up (default: 3, --quick: 1)")
    # hidden: one party of the reference loop (this script re-invokes itself)
    ap.add_argument("--role", choices=["active", "passive"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    epochs = args.epochs if args.epochs is not None else (3 if args.quick else 10)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if epochs < 1 or repeats < 1:
        ap.error("--epochs and --repeats must be >= 1")

    if args.role is not None:
        if args.port is None or not args.config or (args.role == "active" and not args.result):
            ap.error("--role needs --port and --config (and --result for the active party)")
        if args.role == "active":
            _active(args.port, epochs, Path(args.result), args.config)
        else:
            _passive(args.port, epochs, args.config)
        return 0

    # generous per-run deadline: start-up + data loading + ~0.5 s/epoch, times 10
    timeout_s = 120.0 + 30.0 * epochs
    setups: list[tuple[str, Any]] = [("lockstep", lambda: run_lockstep(epochs, timeout_s))]
    for mode in ("thread", "process"):
        for w in (1, DEFAULT_W):
            setups.append((f"ours_w{w}_{mode}",
                           lambda w=w, mode=mode: run_ours(epochs, w, timeout_s, mode)))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in setups}
    t_start = time.perf_counter()
    for rep in range(repeats):
        # rotate the order each repeat so no set-up always runs first (warm caches, drift)
        for k in range(len(setups)):
            name, fn = setups[(rep + k) % len(setups)]
            res = fn()
            res["repeat"] = rep
            runs[name].append(res)
            print(f"  repeat {rep + 1}/{repeats}  {name:<16} {res['ms_per_batch']:6.3f} ms/batch"
                  f"  auc {res['test_auc']:.4f}", file=sys.stderr, flush=True)

    ref_ms = _median(runs["lockstep"], "ms_per_batch")
    summary = {"lockstep_ms_per_batch": ref_ms}
    for mode in ("thread", "process"):
        sfx = "" if mode == "thread" else "_process"  # thread workers: the default for unpinned parties
        for w in (1, DEFAULT_W):
            ms = _median(runs[f"ours_w{w}_{mode}"], "ms_per_batch")
            summary[f"ours_ms_per_batch_w{w}{sfx}"] = ms
            summary[f"overhead_ratio_w{w}{sfx}"] = ms / ref_ms
    summary["lockstep_test_auc"] = _median(runs["lockstep"], "test_auc")
    summary[f"ours_test_auc_w{DEFAULT_W}"] = _median(runs[f"ours_w{DEFAULT_W}_thread"],
                                                      "test_auc")

    n_batches = runs["lockstep"][0]["batches"] // epochs
    print(f"\nVFL per-batch overhead: {DATASET}, B={BATCH}, {n_batches} batches/epoch, "
          f"{epochs} epochs, median of {repeats} repeat(s), "
          f"{time.perf_counter() - t_start:.0f} s total")
    print(f"{'setup':<20}{'epochs':>7}{'ms/batch':>10}{'samples/s':>12}{'test AUC':>10}"
          f"{'ratio':>8}{'excl.eval':>11}")
    for name, _ in setups:
        ms = _median(runs[name], "ms_per_batch")
        excl = (f"{_median(runs[name], 'ms_per_batch_excl_eval'):>11.3f}"
                if "ms_per_batch_excl_eval" in runs[name][0] else f"{'':>11}")
        print(f"{name:<20}{epochs:>7}{ms:>10.3f}{_median(runs[name], 'samples_per_s'):>12,.0f}"
              f"{_median(runs[name], 'test_auc'):>10.4f}{ms / ref_ms:>8.2f}{excl}")
    print("ratio = per-batch time / lockstep per-batch time (median over repeats); "
          "excl.eval = ms/batch without the per-epoch test evaluation")

    if args.json:
        doc = {"summary": summary,
               "settings": {"dataset": DATASET, "seed": SEED, "test_frac": TEST_FRAC,
                            "batch_size": BATCH, "bottom_hidden": list(BOTTOM_HIDDEN),
                            "embedding_dim": EMB_DIM, "top_hidden": list(TOP_HIDDEN), "lr": LR,
                            "epochs": epochs, "repeats": repeats, "cpu_count": os.cpu_count()},
               "runs": runs}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
