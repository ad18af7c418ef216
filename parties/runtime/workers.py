"""Worker handles: how a party's worker coroutine reaches its compute.

A PubSub-VFL worker (Sec. 4) owns a replica of the party's model and trains it
on the batches its parameter server assigns. The coroutine that drives the
worker (waiting on channels, publishing) lives on the party's event loop; the
compute itself runs behind a :class:`WorkerHandle`:

* :class:`ProcessWorker` (``worker_mode = "process"``): a child process per worker, so workers
  really run in parallel on the party's cores (tiny MLP steps are bound by
  Python per-op overhead, which threads serialise on the GIL). The parent
  talks to it over a ZeroMQ PAIR socket (``ipc://``) with the bus codec. The
  parameter server stays in the parent: the child's replica pushes its update
  over the same socket and gets the new parameters back.
* :class:`ThreadWorker`: the same compute on a thread of the party process
  (cheaper to start; no parallel speed-up for small models).
* :class:`InlineWorker`: the same compute on the party's event-loop thread itself, run
  between the I/O: no thread hand-offs and no GIL contention between the loop and
  compute threads. Meant for a party with one core, where threads cannot run compute
  in parallel anyway; the workers still pipeline (each has its own batch, replica
  and Adam state), their waits overlap the other workers' compute.

Both take batches by ``(epoch, batch_id)``; the row positions come from
:meth:`parties.config.VflConfig.batch_order`, identical on both parties.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import psutil
import structlog
import torch
import zmq
import zmq.asyncio

from pubsub.codec import Message, decode, encode
from pubsub.config import to_mapping

from parties.models.compute import make_compute
from parties.config import VflConfig
from parties.core.errors import WorkerFailed
from parties.models.model import ActiveCompute, ParameterServer, PassiveCompute
from parties.models.zoo import ModelFactory
from parties.data.rowstore import DiskRows

log = structlog.get_logger(__name__)


class WorkerHandle(Protocol):
    """What a worker coroutine needs from its compute (shapes in the method docs).

    ``rows`` (optional) gives a batch's row positions explicitly (VFL-PS sub-batches);
    by default they are batch ``b`` of ``epoch``'s plan. ``key`` (default ``b``) names
    the kept graph of a batch when several parts of one batch are in flight.

    ``compute_s`` is the wall time of the compute calls so far (seconds),
    ``compute_cpu_s`` their CPU time (thread time of the thread or worker process that
    ran them) and ``sync_cpu_s`` the part of it in parameter-server syncs.
    """

    compute_s: float
    compute_cpu_s: float
    sync_cpu_s: float

    async def start(self) -> None:
        """Get ready (spawn, load data, pull parameters)."""

    async def forward(self, epoch: int, b: int, *, rows: np.ndarray | None = None,
                      key: int | None = None, snapshot: bool = False) -> np.ndarray:
        """Passive: embedding ``(B, d)`` float32 of batch ``b``; keeps the graph for backward
        (on a parameter snapshot with ``snapshot``, see :meth:`PassiveCompute.forward`)."""

    async def backward(self, epoch: int, key: int, grad: np.ndarray) -> None:
        """Passive: back-propagate the cut-layer gradient ``(B, d)`` of graph ``key``; Adam
        step."""

    async def discard(self, key: int) -> None:
        """Passive: forget graph ``key`` (its gradient never came)."""

    async def prefetch(self, epoch: int, b: int, *, rows: np.ndarray | None = None,
                       key: int | None = None) -> None:
        """Active: compute the own bottom embedding of batch ``b`` now (while waiting for
        the passive embedding); :meth:`step` with the same key uses it."""

    async def step(self, epoch: int, b: int, emb: np.ndarray, *,
                   rows: np.ndarray | None = None, key: int | None = None,
                   on_grad: Callable[[np.ndarray], None] | None = None
                   ) -> tuple[float, np.ndarray]:
        """Active: own bottom (unless prefetched) + top forward/backward with the passive
        embedding ``(B, d)``; ``on_grad`` is called on the event loop with the cut-layer
        gradient as soon as it exists, before the own bottom's backward.

        Returns ``(loss, grad)`` with ``grad`` the ``(B, d)`` float32 cut-layer gradient.
        """

    async def flush(self) -> None:
        """Push any pending update to the parameter server and pull."""

    async def push(self) -> None:
        """Push the local change, without pulling (barrier sync, first half)."""

    async def pull(self) -> None:
        """Load the global parameters (barrier sync, second half)."""

    async def close(self) -> None:
        """Stop; idempotent."""


class _Rows:
    """Cache of one epoch's batch row positions."""

    def __init__(self, n_train: int, cfg: VflConfig) -> None:
        self.n_train = n_train
        self.cfg = cfg
        self._epoch = -1
        self._batches: Any = []

    def __call__(self, epoch: int, b: int) -> np.ndarray:
        if epoch != self._epoch:
            self._batches = self.cfg.batch_order(self.n_train, epoch)
            self._epoch = epoch
        return self._batches[b]


# ---------------------------------------------------------------------------- threads
class ThreadWorker:
    """A worker whose compute runs on a thread of the party process.

    Args:
        noise_seed, models, party: see :func:`make_compute`.
    """

    def __init__(self, role: str, cfg: VflConfig, x_train: np.ndarray,
                 y_train: np.ndarray | None, ps: ParameterServer, *,
                 noise_seed: int | None = None, models: ModelFactory | None = None,
                 party: str | None = None) -> None:
        self.role = role
        self.compute = make_compute(role, cfg, x_train, y_train, ps, noise_seed=noise_seed,
                                    models=models, party=party)
        self.rows = _Rows(x_train.shape[0], cfg)
        self._pool = self._new_pool(role)
        self._graphs: dict[int, Any] = {}
        self.compute_s = 0.0
        self.compute_cpu_s = 0.0

    @property
    def sync_cpu_s(self) -> float:
        """CPU seconds of the replica's parameter-server syncs (part of ``compute_cpu_s``)."""
        return self.compute.replica.sync_cpu_s

    @staticmethod
    def _new_pool(role: str) -> ThreadPoolExecutor | None:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{role}-worker")

    async def start(self) -> None:
        return None

    async def _call(self, fn: Any, *args: Any) -> Any:
        def timed() -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args)
            finally:
                self.compute_s += time.perf_counter() - t0
                self.compute_cpu_s += time.thread_time() - c0

        return await asyncio.get_running_loop().run_in_executor(self._pool, timed)

    async def forward(self, epoch: int, b: int, *, rows: np.ndarray | None = None,
                      key: int | None = None, snapshot: bool = False) -> np.ndarray:
        compute = self.compute
        assert isinstance(compute, PassiveCompute)
        r = self.rows(epoch, b) if rows is None else rows
        graph, h_np = await self._call(lambda: compute.forward(r, snapshot=snapshot))
        self._graphs[b if key is None else key] = graph
        return h_np

    async def backward(self, epoch: int, key: int, grad: np.ndarray) -> None:
        assert isinstance(self.compute, PassiveCompute)
        await self._call(self.compute.backward, self._graphs.pop(key), grad, epoch)

    async def discard(self, key: int) -> None:
        self._graphs.pop(key, None)

    async def prefetch(self, epoch: int, b: int, *, rows: np.ndarray | None = None,
                       key: int | None = None) -> None:
        compute = self.compute
        assert isinstance(compute, ActiveCompute)
        r = self.rows(epoch, b) if rows is None else rows
        self._graphs[b if key is None else key] = await self._call(compute.forward_own, r)

    async def step(self, epoch: int, b: int, emb: np.ndarray, *,
                   rows: np.ndarray | None = None, key: int | None = None,
                   on_grad: Callable[[np.ndarray], None] | None = None
                   ) -> tuple[float, np.ndarray]:
        compute = self.compute
        assert isinstance(compute, ActiveCompute)
        r = self.rows(epoch, b) if rows is None else rows
        h_own = self._graphs.pop(b if key is None else key, None)
        early = self._early(on_grad)

        def run() -> tuple[float, np.ndarray]:
            h = compute.forward_own(r) if h_own is None else h_own
            return compute.top_step(h, emb, r, epoch, on_grad=early)

        return await self._call(run)

    def _early(self, on_grad: Callable[[np.ndarray], None] | None
               ) -> Callable[[np.ndarray], None] | None:
        """``on_grad`` as the compute thread may call it (scheduled on the loop)."""
        if on_grad is None:
            return None
        loop = asyncio.get_running_loop()
        return lambda g: loop.call_soon_threadsafe(on_grad, g)

    async def flush(self) -> None:
        await self._call(self.compute.replica.sync)

    async def push(self) -> None:
        await self._call(self.compute.replica.push)

    async def pull(self) -> None:
        await self._call(self.compute.replica.pull)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class InlineWorker(ThreadWorker):
    """A worker whose compute runs on the event-loop thread (``worker_mode = "inline"``).

    Each call computes synchronously when the worker coroutine reaches it, then the
    coroutine goes on (e.g. publishes the embedding) without first yielding to the
    loop; it yields when it waits for its partner. The cut-layer gradient of a step is
    handed to ``on_grad`` (the publisher) directly, before the own bottom's backward.
    Messages that arrive meanwhile wait in ZeroMQ's queue (its I/O thread needs no GIL)
    and are read when the loop runs next, so a wait's deadline may be noticed up to one
    compute call late.

    Args:
        noise_seed, models: see :func:`make_compute`.
    """

    @staticmethod
    def _new_pool(role: str) -> None:
        return None  # no thread: the compute runs on the loop

    async def _call(self, fn: Any, *args: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args)
        finally:
            self.compute_s += time.perf_counter() - t0
            self.compute_cpu_s += time.thread_time() - c0

    def _early(self, on_grad: Callable[[np.ndarray], None] | None
               ) -> Callable[[np.ndarray], None] | None:
        return on_grad  # already on the loop thread

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------------------- processes
class ProcessWorker:
    """A worker in a child process, driven over a ZeroMQ PAIR socket.

    Args:
        role: ``"active"`` or ``"passive"``.
        index: worker index (for names and errors).
        cfg: run config.
        data_dir: directory holding ``x_train.npy`` (and ``y_train.npy``), shared by
            the party's workers; the IPC endpoint is created there too.
        ps: the party's parameter server (in this process).
        noise_seed: see :func:`make_compute` (handed to the child as an argument, never
            over the bus).
        models: a model factory with Python callables (pickled to the child: they must
            be module-level); None: the child rebuilds ``ModelFactory(cfg)`` from the
            config mapping.
        party: the party id (see :func:`make_compute`); None = ``role``.
        start_timeout_s: deadline for the child to start and pull, seconds.
        reply_timeout_s: deadline for any reply, seconds (a child that dies is
            noticed within about a second regardless).
    """

    def __init__(self, role: str, index: int, cfg: VflConfig, data_dir: Path,
                 ps: ParameterServer, *, noise_seed: int | None = None,
                 start_timeout_s: float = 120.0, reply_timeout_s: float = 300.0,
                 models: ModelFactory | None = None, party: str | None = None) -> None:
        self.role = role
        self.party = party or role
        self.models = models
        self.index = index
        self.cfg = cfg
        self.data_dir = data_dir
        self.ps = ps
        self.noise_seed = noise_seed
        self.start_timeout_s = start_timeout_s
        self.reply_timeout_s = reply_timeout_s
        self.compute_s = 0.0
        self.compute_cpu_s = 0.0
        self.sync_cpu_s = 0.0
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._proc: Any = None
        self._closed = False
        self._on_grad: Callable[[np.ndarray], None] | None = None
        self._loss: Any = None

    async def start(self) -> None:
        endpoint = f"ipc://{self.data_dir}/worker-{self.role}-{self.index}.sock"
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.PAIR)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        self._sock = sock
        ctx = mp_context()
        await asyncio.to_thread(ensure_forkserver)
        self._proc = ctx.Process(
            target=worker_main,
            args=(endpoint, self.role, self.index, to_mapping(self.cfg), str(self.data_dir),
                  os.getpid(), self.noise_seed,
                  self.models, self.party),
            name=f"psfl-{self.role}-worker-{self.index}",
            daemon=True,
        )
        # off the event loop: the fork server round trip (and its preload, when it is
        # still starting) must not stall the party's bus (heartbeats, broker probes)
        await asyncio.to_thread(self._proc.start)
        msg = await self._recv(self.start_timeout_s)
        if msg.topic != "ready":
            raise WorkerFailed(self.index, f"unexpected first message {msg.topic!r}")

    async def _send(self, cmd: str, arrays: tuple[Any, ...] = (), meta: dict[str, Any] | None
                    = None) -> None:
        assert self._sock is not None
        await self._sock.send_multipart(encode(cmd, arrays, meta, copy=False), copy=False)

    async def _recv(self, timeout_s: float) -> Message:
        """Next reply; serves the child's parameter-server requests on the way."""
        sock = self._sock
        assert sock is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if not await sock.poll(1000, zmq.POLLIN):
                if self._proc is not None and not self._proc.is_alive():
                    raise WorkerFailed(self.index, f"process exited with code "
                                                   f"{self._proc.exitcode}")
                if time.monotonic() > deadline:
                    raise WorkerFailed(self.index, f"no reply within {timeout_s:.0f} s")
                continue
            msg = decode(await sock.recv_multipart(copy=False))
            if msg.topic == "pull":
                await self._send("params", (self.ps.pull().numpy(),))
                continue
            if msg.topic == "push":
                theta = self.ps.push(torch.from_numpy(np.array(msg.arrays[0])))
                await self._send("params", (theta.numpy(),))
                continue
            if msg.topic == "top":  # a step of the shared top (vfl.workers.top_update = "shared")
                fused, labels = (torch.from_numpy(np.array(a)) for a in msg.arrays[:2])
                loss, g = await asyncio.to_thread(self.ps.top_step, fused, labels,
                                                  self._loss_fn())
                await self._send("topgrad", (g.numpy(),), {"loss": loss})
                continue
            if msg.topic == "error":
                raise WorkerFailed(self.index, str(msg.meta.get("error")))
            if msg.topic == "early_grad":
                if self._on_grad is not None:
                    grads = [np.array(a) for a in msg.arrays]
                    self._on_grad(grads if msg.meta.get("n") else grads[0])
                continue
            self.compute_s = float(msg.meta.get("cs", self.compute_s))
            self.compute_cpu_s = float(msg.meta.get("cc", self.compute_cpu_s))
            self.sync_cpu_s = float(msg.meta.get("sc", self.sync_cpu_s))
            return msg

    def _loss_fn(self) -> Any:
        """The training loss the shared top steps with (the run's model factory's)."""
        if self._loss is None:
            models = self.models if self.models is not None else ModelFactory(self.cfg)
            self._loss = models.loss(self.cfg.effective_task)
        return self._loss

    async def _rpc(self, cmd: str, arrays: tuple[Any, ...] = (),
                   meta: dict[str, Any] | None = None) -> Message:
        await self._send(cmd, arrays, meta)
        return await self._recv(self.reply_timeout_s)

    @staticmethod
    def _meta(epoch: int, b: int, key: int | None, rows: np.ndarray | None
              ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        meta: dict[str, Any] = {"e": epoch, "b": b, "k": b if key is None else key}
        if rows is None:
            return (), meta
        meta["r"] = True
        return (np.ascontiguousarray(rows, dtype=np.int64),), meta

    async def forward(self, epoch: int, b: int, *, rows: np.ndarray | None = None,
                      key: int | None = None, snapshot: bool = False) -> np.ndarray:
        arrays, meta = self._meta(epoch, b, key, rows)
        meta["s"] = snapshot
        return (await self._rpc("forward", arrays, meta)).arrays[0]

    async def backward(self, epoch: int, key: int, grad: np.ndarray) -> None:
        await self._rpc("backward", (grad,), {"e": epoch, "k": key})

    async def discard(self, key: int) -> None:
        await self._rpc("discard", (), {"k": key})

    async def prefetch(self, epoch: int, b: int, *, rows: np.ndarray | None = None,
                       key: int | None = None) -> None:
        arrays, meta = self._meta(epoch, b, key, rows)
        await self._rpc("prefetch", arrays, meta)

    async def step(self, epoch: int, b: int, emb: np.ndarray, *,
                   rows: np.ndarray | None = None, key: int | None = None,
                   on_grad: Callable[[np.ndarray], None] | None = None
                   ) -> tuple[float, np.ndarray]:
        arrays, meta = self._meta(epoch, b, key, rows)
        meta["g"] = on_grad is not None
        embs = tuple(emb) if isinstance(emb, (list, tuple)) else (emb,)
        if len(embs) > 1:
            meta["n"] = len(embs)  # one embedding per passive party; the reply as many
        self._on_grad = on_grad
        try:
            msg = await self._rpc("step", (*embs, *arrays), meta)
        finally:
            self._on_grad = None
        grads = msg.arrays
        return float(msg.meta["loss"]), (list(grads) if len(embs) > 1 else grads[0])

    async def flush(self) -> None:
        await self._rpc("flush")

    async def push(self) -> None:
        await self._rpc("sync_push")

    async def pull(self) -> None:
        await self._rpc("sync_pull")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sock is not None and self._proc is not None and self._proc.is_alive():
            try:
                await asyncio.wait_for(self._send("stop"), 1.0)
            except (TimeoutError, zmq.ZMQError):
                pass
        if self._proc is not None:
            await asyncio.to_thread(self._proc.join, 3.0)
            if self._proc.is_alive():
                self._proc.kill()
                await asyncio.to_thread(self._proc.join, 3.0)
        if self._sock is not None:
            self._sock.close(0)
        if self._ctx is not None:
            self._ctx.term()


_MP_CTX: Any = None


def mp_context() -> Any:
    """The multiprocessing context for worker processes: a fork server that has already
    imported torch and this module, so each worker starts in milliseconds, not seconds,
    and no worker is forked from a process whose torch threads are running.

    ``torch._dynamo`` (which every ``torch.optim`` optimizer imports at its first ``step``,
    about 1,900 modules) is not preloaded: the first worker's start waits for the preload
    and blocks the party's event loop meanwhile; with it preloaded, parties with process
    workers missed the 10 s broker-hello deadline on a loaded machine (three times in
    four suite runs; the likely cause, not proven)."""
    global _MP_CTX
    if _MP_CTX is None:
        from parties.core.zygote import short_socket_dir

        short_socket_dir()  # a long TMPDIR would not bind the server's socket
        _MP_CTX = mp.get_context("forkserver")
        _MP_CTX.set_forkserver_preload(["parties.runtime.workers"])
    return _MP_CTX


def ensure_forkserver() -> None:
    """Start the fork server now (blocking, ~1-2 s: it imports torch once)."""
    mp_context()
    from multiprocessing import forkserver

    forkserver.ensure_running()


class _Stopped(Exception):
    """The parent asked the worker to stop while it waited for the parameter server."""


class _RemotePS:
    """The child's view of the parent's parameter server (blocking, over the PAIR socket)."""

    def __init__(self, sock: zmq.Socket, *, shares_top: bool = False) -> None:
        self.sock = sock
        #: the parent's PS holds the shared top: :meth:`top_step` asks it
        self.shares_top = shares_top

    def _params(self, out: torch.Tensor | None) -> torch.Tensor:
        msg = decode(self.sock.recv_multipart(copy=False))
        if msg.topic == "stop":
            raise _Stopped
        if msg.topic != "params":
            raise RuntimeError(f"expected params from the parameter server, got {msg.topic!r}")
        if out is None:
            return torch.from_numpy(np.array(msg.arrays[0], dtype=np.float32))
        return out.copy_(torch.from_numpy(msg.arrays[0]))  # the read-only frame, copied once

    def pull(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """As :meth:`parties.models.model.ParameterServer.pull`."""
        self.sock.send_multipart(encode("pull"))
        return self._params(out)

    def push(self, delta: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """As :meth:`parties.models.model.ParameterServer.push`."""
        self.sock.send_multipart(encode("push", (delta.numpy(),)))
        return self._params(out)

    def top_step(self, fused: torch.Tensor, labels: torch.Tensor, loss_fn: Any
                 ) -> tuple[float, torch.Tensor]:
        """As :meth:`parties.models.model.ParameterServer.top_step`, in the parent (which uses
        the run's own loss; ``loss_fn`` is this process's copy of it)."""
        del loss_fn
        self.sock.send_multipart(encode("top", (fused.detach().numpy(),
                                                np.ascontiguousarray(labels.numpy()))))
        msg = decode(self.sock.recv_multipart(copy=False))
        if msg.topic == "stop":
            raise _Stopped
        if msg.topic != "topgrad":
            raise RuntimeError(f"expected the top step's gradient, got {msg.topic!r}")
        return float(msg.meta["loss"]), torch.from_numpy(np.array(msg.arrays[0],
                                                                  dtype=np.float32))


def worker_main(endpoint: str, role: str, index: int, cfg_map: dict[str, Any], data_dir: str,
                parent_pid: int, noise_seed: int | None = None,
                models: ModelFactory | None = None, party: str | None = None) -> None:
    """Body of a worker process: serve compute requests until ``stop`` or the parent is gone.

    ``models``: the party's model factory, pickled (its Python callables must be importable
    here); None: the config's model specs. ``party``: the party id (None: ``role``)."""
    import dataclasses

    from pubsub.config import from_mapping

    cfg = from_mapping(VflConfig, cfg_map)
    models = ModelFactory(cfg) if models is None else dataclasses.replace(models, cfg=cfg)
    torch.set_num_threads(cfg.workers.threads_for(role))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        _serve_worker(sock, role, cfg, data_dir, parent_pid, noise_seed, models, party)
    except _Stopped:
        pass
    except Exception as exc:  # noqa: BLE001 - reported to the parent instead of a traceback
        with contextlib.suppress(zmq.ZMQError):
            sock.send_multipart(encode("error", (), {"error": f"{type(exc).__name__}: {exc}"}),
                                zmq.NOBLOCK)
    finally:
        sock.close(0)
        ctx.term()


def _load_rows(data_dir: Path, name: str) -> Any:
    """A worker's rows: the party's saved array, or its streamed cache's descriptor."""
    desc = data_dir / f"{name}.rows.json"
    if desc.exists():
        return DiskRows.load_descriptor(desc)
    return np.load(data_dir / f"{name}.npy")


def _serve_worker(sock: zmq.Socket, role: str, cfg: VflConfig, data_dir: str,
                  parent_pid: int, noise_seed: int | None, models: ModelFactory,
                  party: str | None = None) -> None:
    """Load data, build the compute, then answer requests until ``stop``."""
    x_train = _load_rows(Path(data_dir), "x_train")
    y_train = _load_rows(Path(data_dir), "y_train") if role == "active" else None
    compute = make_compute(role, cfg, x_train, y_train, _RemotePS(sock, shares_top=role == "active" and cfg.shares_top()),
                           noise_seed=noise_seed,
                           models=models, party=party)
    rows = _Rows(x_train.shape[0], cfg)
    graphs: dict[int, Any] = {}
    compute_s = compute_cpu_s = 0.0
    sock.send_multipart(encode("ready"))
    while True:
        if not sock.poll(1000):
            # orphaned: the party process is gone. (Not ``os.getppid() != parent_pid``: a
            # forkserver child's parent is the fork server, so that test took every worker
            # idle for a second for an orphan, and it quit while its party waited for it.)
            if not psutil.pid_exists(parent_pid):
                return
            continue
        msg = decode(sock.recv_multipart(copy=False))
        cmd, meta = msg.topic, msg.meta
        t0, c0 = time.perf_counter(), time.thread_time()
        if cmd == "stop":
            return
        try:
            out: tuple[Any, ...] = ()
            reply: dict[str, Any] = {}
            n_emb = int(meta.get("n", 1)) if cmd == "step" else 0
            if cmd in ("forward", "prefetch", "step"):
                arrays = msg.arrays[n_emb:]
                r = (np.array(arrays[0], dtype=np.int64) if meta.get("r")
                     else rows(meta["e"], meta["b"]))
            if cmd == "forward":
                assert isinstance(compute, PassiveCompute)
                graph, h_np = compute.forward(r, snapshot=bool(meta.get("s")))
                graphs[meta["k"]] = graph
                out = (h_np,)
            elif cmd == "backward":
                assert isinstance(compute, PassiveCompute)
                compute.backward(graphs.pop(meta["k"]), msg.arrays[0], meta["e"])
            elif cmd == "discard":
                graphs.pop(meta["k"], None)
            elif cmd == "prefetch":
                assert isinstance(compute, ActiveCompute)
                graphs[meta["k"]] = compute.forward_own(r)
            elif cmd == "step":
                assert isinstance(compute, ActiveCompute)
                h_own = graphs.pop(meta["k"], None)
                if h_own is None:
                    h_own = compute.forward_own(r)

                many = "n" in meta

                def early(g: Any) -> None:
                    sock.send_multipart(encode("early_grad", tuple(g) if many else (g,),
                                               {"n": n_emb} if many else None))

                emb = list(msg.arrays[:n_emb]) if many else msg.arrays[0]
                loss, grad = compute.top_step(h_own, emb, r, meta["e"],
                                              on_grad=early if meta.get("g") else None)
                out, reply = (tuple(grad) if many else (grad,)), {"loss": loss}
            elif cmd == "flush":
                compute.replica.sync()
            elif cmd == "sync_push":
                compute.replica.push()
            elif cmd == "sync_pull":
                compute.replica.pull()
            else:
                raise ValueError(f"unknown worker command {cmd!r}")
        except Exception as exc:  # noqa: BLE001 - reported to the parent, then exit
            sock.send_multipart(encode("error", (), {"error": f"{type(exc).__name__}: {exc}"}))
            return
        compute_s += time.perf_counter() - t0
        compute_cpu_s += time.thread_time() - c0
        reply["cs"], reply["cc"] = compute_s, compute_cpu_s
        reply["sc"] = compute.replica.sync_cpu_s
        sock.send_multipart(encode(cmd, out, reply, copy=False), copy=False)
