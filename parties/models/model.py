"""Models, parameter server and per-worker replicas of PubSub-VFL (torch, no I/O).

* bottom model: MLP ``d_in → hidden… → embedding_dim`` with ReLU, one per party;
  its output at the cut layer is the *embedding*.
* top model (active party only): MLP ``2·embedding_dim → hidden… → 1``: a logit
  (binary task, BCE loss) or the standardised label (regression task, MSE loss).
* :class:`ParameterServer`: a party's global parameters as one flat float32
  vector. Workers push the *change* Δ of their replica since their last pull,
  then pull; the server applies θ ← θ + Δ/w (w = the party's workers): local-SGD
  model averaging, see :class:`ParameterServer`.
* Replicas: each worker trains its own copy with its own Adam state and syncs
  with the PS every ΔT_t local steps (semi-async, PubSub-VFL Sec. 4.2).
* Which models: :mod:`parties.models.zoo` (``vfl.model.bottom``: ``mlp``, the default and the two
  MLPs above; ``resnet``, the paper's large model; or a user factory).

Buffers and modes. The PS vector holds each module's parameters and then its
floating-point buffers (BatchNorm running statistics; integer buffers such as
``num_batches_tracked`` are left out), in :func:`state_tensors` order. A replica's
buffers are views of its flat vector like its parameters, so a worker's Δ includes the
change of its running statistics and the PS averages them by the same θ ← θ + Δ/w rule;
:func:`load_flat` loads them with the parameters for scoring and saving. Workers train
in ``model.train()`` mode (dropout on, batch statistics used and tracked); scoring,
embedding and prediction (:func:`embed`, :func:`predict`) switch the modules to
``model.eval()`` (dropout off, running statistics used). The default MLPs have no
buffers and no mode-dependent layers, so their vector and results are unchanged.

All compute methods are synchronous and meant to run in a worker thread;
torch releases the GIL inside its kernels, so workers overlap on the party's cores.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from parties.models.nets import (bottom_model, loss_function, make_adam, mlp,  # noqa: F401 (re-exported)
                          party_bottom, top_model)
from parties.algorithms.schedule import PS_UPDATES, sync_interval

if TYPE_CHECKING:
    from parties.config import VflConfig
    from parties.algorithms.fuse import Fuse


def party_modules(cfg: VflConfig, role: str, d_in: int) -> list[nn.Module]:
    """``role``'s models in parameter-server order: its bottom model (``vfl.model.bottom``; the
    MLP with its own widths ``cfg.model.bottom_hidden_for(role)`` by default), then, for the
    active party, the top model. Built in that order from the current torch RNG state
    (:meth:`parties.models.zoo.ModelFactory.modules`).

    Raises:
        ValueError: ``role`` is neither ``"active"`` nor ``"passive"``.
    """
    from parties.models.zoo import ModelFactory

    if role not in ("active", "passive"):
        raise ValueError(f"role must be 'active' or 'passive', got {role!r}")
    return ModelFactory(cfg).modules(role, d_in)


def state_tensors(modules: Sequence[nn.Module]) -> list[torch.Tensor]:
    """What the PS vector holds, in its order: every parameter of ``modules`` (in order),
    then every floating-point buffer (see the module docstring)."""
    params: list[torch.Tensor] = [p for m in modules for p in m.parameters()]
    return params + [b for m in modules for b in m.buffers() if b.is_floating_point()]


class ParameterServer:
    """A party's parameter server: global parameters as a flat float32 vector.

    Update rule: a worker pushes Δ = θ_k − θ_base, the change of its replica since its
    last pull, and the server applies **θ ← θ + Δ/w**, w the number of workers that push
    to it. When all w workers start from the same θ and push once, this gives exactly
    the average of their models, θ + (1/w)·ΣΔ_k = (1/w)·Σθ_k: the model averaging of
    local SGD (Stich, "Local SGD Converges Fast and Communicates Little", ICLR 2019;
    Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020; FedAvg,
    McMahan et al., AISTATS 2017). Pushes that arrive at different times (PubSub-VFL's
    semi-asynchronous sync) are the asynchronous form of the same average, each worker
    moving θ by 1/w of its own trajectory.

    The rule used before, θ ← θ + Δ (Downpour SGD's delta push, Dean et al., NIPS 2012),
    is right when every push is one gradient step; with ΔT local steps per push it adds
    all w workers' full trajectories, which overshoots by a factor of about w near a
    minimum (each Δ_k already points all the way to its worker's local optimum). Measured
    here on ``california``, 2 workers per party, ΔT0 = 5: the test RMSE rose from 0.62
    (epoch 5) to 0.75-0.89 once ΔT_t ≥ 3; see docs/explanation/algorithms.md and docs/benchmarks.md.

    Thread-safe: workers call :meth:`pull` and :meth:`push` from their threads.

    With ``update="gradient"`` the server instead holds the party's one optimizer: a
    worker pushes the gradient of each step and pulls the new θ (Downpour SGD with one
    step per push, Dean et al., NIPS 2012; the staleness of a gradient is the number of
    the party's other steps applied between the worker's pull and its push, at most
    w − 1 when each worker has one batch in flight). Every batch then moves θ by one
    optimizer step at the configured rate, as in sequential training, where averaging
    moves it by 1/w of a worker's step.

    Args:
        init: the initial flat parameter vector (copied), shape ``(P,)``.
        workers: w >= 1, the workers that push to this server.
        update: one of :data:`PS_UPDATES`.
        n_params / lr / make_optimizer: ``update="gradient"``: how many leading values of
            the vector are parameters (the rest are buffers), the optimizer's rate and
            factory (``(parameters, lr) -> Optimizer``; None: :func:`make_adam`).

    Raises:
        ValueError: ``workers < 1``, an unknown ``update``, or ``"gradient"`` without
            ``n_params`` and ``lr``.
    """

    def __init__(self, init: torch.Tensor, *, workers: int = 1, update: str = "average",
                 n_params: int | None = None, lr: float | None = None,
                 make_optimizer: Callable[[list[nn.Parameter], float],
                                          torch.optim.Optimizer] | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        if update not in PS_UPDATES:
            raise ValueError(f"update must be one of {PS_UPDATES}, got {update!r}")
        self._lock = threading.Lock()
        self.workers = workers
        self.update = update
        self.version = 0
        self.pushes = 0
        flat = init.detach()
        self.size = int(flat.numel())
        if update == "average":
            self._theta = flat.clone()
            return
        if n_params is None or not 0 <= n_params <= self.size or lr is None:
            raise ValueError("update='gradient' needs n_params (0..size) and lr")
        self.n_params = int(n_params)
        # θ's parameters are the optimizer's one flat parameter (Adam is elementwise, so
        # one flat tensor is the same rule as per-tensor, fused into one kernel); the
        # floating-point buffers after them follow the average rule
        self._p = nn.Parameter(flat[: self.n_params].clone())
        self._b = flat[self.n_params:].clone()
        self._opt = (make_optimizer or make_adam)([self._p], lr)

    def pull(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The current global parameters, shape ``(P,)``: copied into ``out`` when given
        (no allocation; ``out`` is returned), else a new copy.

        Raises:
            ValueError: ``out`` has the wrong shape.
        """
        with self._lock:
            return self._copy_out(out)

    def push(self, delta: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Apply a worker's update; return the new θ, copied into ``out`` when given (no
        allocation), else a new copy. ``out`` may be ``delta`` itself: the update is
        applied before ``out`` is written.

        ``update="average"``: ``delta`` is Δ, the change of the worker's replica since
        its last pull; θ ← θ + Δ/w. ``update="gradient"``: ``delta`` holds the gradient of
        one step for the parameters (the first ``n_params`` values), applied by the
        server's own optimizer, then Δ of the buffers (θ_buffers ← θ_buffers + Δ/w).

        Raises:
            ValueError: ``delta`` or ``out`` has the wrong shape.
        """
        if tuple(delta.shape) != (self.size,):
            raise ValueError(f"delta shape {tuple(delta.shape)} != ({self.size},)")
        with self._lock:
            if self.update == "gradient":
                n = self.n_params
                self._p.grad = delta[:n]
                self._opt.step()
                self._p.grad = None
                if n < self.size:
                    self._b.add_(delta[n:], alpha=1.0 / self.workers)
            elif self.workers == 1:
                self._theta += delta
            else:
                self._theta.add_(delta, alpha=1.0 / self.workers)
            self.version += 1
            self.pushes += 1
            return self._copy_out(out)

    def share_top(self, top: nn.Module, *, offset: int, lr: float,
                  buffer_offset: int | None = None,
                  make_optimizer: Callable[[list[nn.Parameter], float],
                                           torch.optim.Optimizer] | None = None) -> None:
        """Hold the top model here, one copy for all workers (``vfl.workers.top_update =
        "shared"``): ``top``'s parameters become views of θ from ``offset`` on (where the
        flat layout puts them, after the bottom's), updated by this server's own optimizer
        in :meth:`top_step`, one step per batch in the order the workers call it. The
        workers keep their bottom replicas (averaged as before) and never change their
        copy of the top, so their pushes carry Δ = 0 there.

        The top's floating-point buffers (batch norm's running statistics) become views of
        θ from ``buffer_offset`` on in the same way: the one top's forward passes update
        them in batch order, and the workers, which never run their copy of the top, push
        Δ = 0 there.

        Raises:
            ValueError: not ``update="average"``, ``top`` has floating-point buffers and no
                ``buffer_offset``, or its parameters or buffers do not fit θ.
        """
        if self.update != "average":
            raise ValueError("a shared top needs update='average' (gradient push already "
                             "applies every step with one optimizer)")
        params = list(top.parameters())
        n = sum(p.numel() for p in params)
        if not 0 <= offset <= self.size - n:
            raise ValueError(f"top of {n} parameters does not fit θ ({self.size}) at {offset}")
        bufs = [b for b in top.buffers() if b.is_floating_point()]
        nb = sum(b.numel() for b in bufs)
        if bufs and buffer_offset is None:
            raise ValueError("a shared top with floating-point buffers needs buffer_offset")
        if bufs and not (0 <= buffer_offset <= self.size - nb  # type: ignore[operator]
                         and (buffer_offset >= offset + n  # type: ignore[operator]
                              or buffer_offset + nb <= offset)):  # type: ignore[operator]
            raise ValueError(f"top buffers of {nb} values do not fit θ ({self.size}) at "
                             f"{buffer_offset} beside its parameters at {offset}")
        with self._lock:
            vector_to_parameters(self._theta[offset: offset + n].clone(), params)
            off = offset
            for prm in params:  # views of θ: a top step writes θ in place
                prm.data = self._theta[off: off + prm.numel()].view_as(prm)
                off += prm.numel()
            off = buffer_offset or 0
            for buf in bufs:  # running statistics: in place in θ as well
                buf.data = self._theta[off: off + buf.numel()].view_as(buf)
                off += buf.numel()
            top.train()
            self._top = top
            self._top_opt = (make_optimizer or make_adam)(params, lr)
            self.top_steps = 0

    @property
    def shares_top(self) -> bool:
        """Whether this server holds the shared top model (:meth:`share_top`)."""
        return getattr(self, "_top", None) is not None

    def top_step(self, fused: torch.Tensor, labels: torch.Tensor, loss_fn: nn.Module
                 ) -> tuple[float, torch.Tensor]:
        """One step of the shared top on a batch: forward on ``fused`` (``(B, k)``, the
        fused cut-layer input), ``loss_fn`` against ``labels``, backward, one optimizer
        step, all under the server's lock (so no top step is stale). Returns the loss and
        ``dLoss/d fused``, ``(B, k)``.

        Raises:
            RuntimeError: no shared top (:meth:`share_top` not called).
        """
        top = getattr(self, "_top", None)
        if top is None:
            raise RuntimeError("this parameter server holds no shared top")
        x = fused.detach().requires_grad_(True)
        with self._lock:
            logits = top(x).squeeze(1)
            loss = loss_fn(logits, labels)
            self._top_opt.zero_grad(set_to_none=True)
            loss.backward()
            self._top_opt.step()
            self.top_steps += 1
            self.version += 1
        assert x.grad is not None
        return float(loss.detach()), x.grad

    def _copy_out(self, out: torch.Tensor | None) -> torch.Tensor:
        if out is not None and tuple(out.shape) != (self.size,):
            raise ValueError(f"out shape {tuple(out.shape)} != ({self.size},)")
        if self.update == "average":
            return self._theta.clone() if out is None else out.copy_(self._theta)
        if out is None:
            out = torch.empty(self.size, dtype=self._p.dtype)
        with torch.no_grad():
            out[: self.n_params].copy_(self._p)
            out[self.n_params:].copy_(self._b)
        return out


def _index(rows: np.ndarray) -> torch.Tensor:
    """Row positions as a tensor. Rows that arrived over the bus are read-only views of
    the received frame, which ``torch.from_numpy`` warns about; they are copied (B int64s)."""
    return torch.from_numpy(rows if rows.flags.writeable else rows.copy())


#: How a replica syncs with its parameter server: every ΔT_t local steps (PubSub-VFL),
#: after every step (asynchronous PS), or only when the party says so (barrier sync).
SYNC_MODES = ("schedule", "step", "manual")


class Replica:
    """A worker's copy of a party's modules, its optimizer and its sync state.

    Args:
        modules: the worker's own module instances (same architecture as the PS's).
        ps: the party's parameter server.
        lr: Adam learning rate.
        delta_t0: ΔT0 of the sync schedule.
        sync_mode: ``"schedule"`` (push and pull every ΔT_t local steps, ΔT_t from
            :func:`parties.algorithms.schedule.sync_interval`), ``"step"`` (after every step) or
            ``"manual"`` (only through :meth:`sync`, :meth:`push` and :meth:`pull`).
        make_optimizer: ``(parameters, lr) -> Optimizer``; None: :func:`make_adam`.
        ps_update: the server's rule (:data:`PS_UPDATES`). ``"gradient"``: the replica
            has no optimizer of its own; :meth:`step` pushes the step's gradient and
            pulls the server's new parameters (``sync_mode`` and ΔT_t do not apply).

    Raises:
        ValueError: unknown ``sync_mode`` or ``ps_update``.
    """

    def __init__(self, modules: Sequence[nn.Module], ps: ParameterServer, *, lr: float,
                 delta_t0: int, sync_mode: str = "schedule",
                 make_optimizer: Callable[[list[nn.Parameter], float],
                                          torch.optim.Optimizer] | None = None,
                 ps_update: str = "average") -> None:
        if sync_mode not in SYNC_MODES:
            raise ValueError(f"sync_mode must be one of {SYNC_MODES}, got {sync_mode!r}")
        if ps_update not in PS_UPDATES:
            raise ValueError(f"ps_update must be one of {PS_UPDATES}, got {ps_update!r}")
        self.gradient_push = ps_update == "gradient"
        self.modules = list(modules)
        for m in self.modules:
            m.train()
        self.params = [p for m in self.modules for p in m.parameters()]
        #: parameters, then floating-point buffers: the PS vector's layout
        self.tensors = state_tensors(self.modules)
        self.ps = ps
        self.delta_t0 = delta_t0
        self.sync_mode = sync_mode
        # the parameters live as views of one flat buffer, so a sync is a few vector
        # operations on preallocated tensors: measured on the paper's small model with
        # a 250-column input (172,577 parameters), 0.70 ms per sync when the vector was
        # gathered, cloned and re-viewed each time (four 690 KB allocations).
        self.flat = ps.pull()
        vector_to_parameters(self.flat, self.tensors)
        self.opt: torch.optim.Optimizer | None = (
            None if self.gradient_push else (make_optimizer or make_adam)(self.params, lr))
        self._base = self.flat.clone()
        self._delta = torch.empty_like(self.flat)
        #: views of the pushed vector, one per parameter (gradient push)
        self._grad_views: list[torch.Tensor] = []
        off = 0
        for p in self.params:
            self._grad_views.append(self._delta[off: off + p.numel()].view_as(p))
            off += p.numel()
        self.n_params = off
        self.steps_since_sync = 0
        self.syncs = 0
        #: CPU seconds (thread time) spent in :meth:`sync`, :meth:`push` and :meth:`pull`
        self.sync_cpu_s = 0.0

    def zero_grad(self) -> None:
        """Forget the parameters' gradients (before a step's backward)."""
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        else:
            for p in self.params:
                p.grad = None

    def step(self) -> None:
        """Apply the step's gradients (in the parameters' ``.grad``): the replica's own
        optimizer step, or, with gradient push, push them to the server and load the
        server's new parameters."""
        if self.opt is not None:
            self.opt.step()
            return
        c0 = time.thread_time()
        with torch.no_grad():
            for p, view in zip(self.params, self._grad_views, strict=True):
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
            n = self.n_params
            if n < self.flat.numel():  # buffers: their change since the last pull
                torch.sub(self.flat[n:], self._base[n:], out=self._delta[n:])
            self.flat.copy_(self.ps.push(self._delta, out=self._base))
        self.syncs += 1
        self.sync_cpu_s += time.thread_time() - c0

    def after_step(self, epoch: int) -> None:
        """Count one local step; sync with the PS when the sync mode says so (with gradient
        push every step has synced already)."""
        self.steps_since_sync += 1
        if self.gradient_push:
            self.steps_since_sync = 0
            return
        if self.sync_mode == "manual":
            return
        if self.sync_mode == "step" or \
                self.steps_since_sync >= sync_interval(epoch, self.delta_t0):
            self.sync()

    def sync(self) -> None:
        """Push the local change since the last pull, then pull the new global parameters.

        Overwrites the parameters in place: no autograd graph may still hold them (every
        caller syncs after its optimizer step, which is in place too). With gradient push
        every step was pushed already: only the pull remains."""
        if self.gradient_push:
            self.pull()
            return
        c0 = time.thread_time()
        with torch.no_grad():
            # the change is computed into the base buffer, which the server's reply then
            # overwrites: one vector less to stream through the cache than with a separate
            # delta (the sync's operands no longer fit a core's L2: a ΔT_t = 1 sync took
            # 0.6 ms in a 50:14 run, 8 % of the passive step; this saves a write and a
            # read of the 690 KB vector). The PS reads the change before it writes ``out``.
            torch.sub(self.flat, self._base, out=self._base)
            self.flat.copy_(self.ps.push(self._base, out=self._base))
        self.steps_since_sync = 0
        self.syncs += 1
        self.sync_cpu_s += time.thread_time() - c0

    def push(self) -> None:
        """Push the local change since the last pull, without pulling (the first half of a
        barrier sync: every worker pushes, then every worker :meth:`pull` s). With gradient
        push there is no local change: nothing to push."""
        if self.gradient_push:
            return
        c0 = time.thread_time()
        with torch.no_grad():
            torch.sub(self.flat, self._base, out=self._delta)
            self.ps.push(self._delta)
        self.syncs += 1
        self.sync_cpu_s += time.thread_time() - c0

    def pull(self) -> None:
        """Load the global parameters (the second half of a barrier sync)."""
        c0 = time.thread_time()
        with torch.no_grad():
            self.flat.copy_(self.ps.pull(out=self._base))
        self.steps_since_sync = 0
        self.sync_cpu_s += time.thread_time() - c0


class PassiveGraph:
    """A passive batch's forward, kept for its backward.

    Attributes:
        h: ``(B, d)`` embedding with graph (clipped, with DP on).
        snapshot: None, or the parameter copies the forward ran on (see
            :meth:`PassiveCompute.forward`).
    """

    __slots__ = ("h", "snapshot", "x")

    def __init__(self, h: torch.Tensor, snapshot: list[torch.Tensor] | None,
                 x: torch.Tensor | None = None) -> None:
        self.h = h
        self.snapshot = snapshot
        #: the batch's inputs, kept for DP-SGD's per-example gradients (None without DP)
        self.x = x


class PassiveCompute:
    """The passive party's per-worker compute: bottom forward and backward.

    Args:
        x_train: ``(n_train, d_p)`` float32 tensor of the party's features.
        make_bottom: factory of a fresh bottom model.
        ps: the party's parameter server.
        lr, delta_t0, sync_mode, make_optimizer, ps_update: see :class:`Replica`.
        privatize: with DP on, maps the ``(B, d)`` embedding to ``(clipped with graph,
            clipped + noise)`` (:class:`parties.privacy.dp.EmbeddingPrivatizer`); None: publish
            the embedding as is.
        make_dp_sgd: with DP on, builds the worker's DP-SGD gradient maker from its bottom
            model (:class:`parties.privacy.dpsgd.DpSgd`); the backward then applies per-example
            clipped, noised gradients instead of the plain ones. Required with
            ``privatize`` (a private release of embeddings from a non-private model
            protects nothing).

    Raises:
        ValueError: ``privatize`` without ``make_dp_sgd`` or the reverse.
    """

    def __init__(self, x_train: torch.Tensor, make_bottom: Callable[[], nn.Module],
                 ps: ParameterServer, *, lr: float, delta_t0: int,
                 privatize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
                 | None = None, sync_mode: str = "schedule",
                 make_dp_sgd: Callable[[nn.Module], Any] | None = None,
                 make_optimizer: Callable[[list[nn.Parameter], float],
                                          torch.optim.Optimizer] | None = None,
                 ps_update: str = "average") -> None:
        if (privatize is None) != (make_dp_sgd is None):
            raise ValueError("DP needs both the embedding privatizer and DP-SGD, or neither")
        self.x = x_train
        self.bottom = make_bottom()
        self.replica = Replica([self.bottom], ps, lr=lr, delta_t0=delta_t0,
                               sync_mode=sync_mode, make_optimizer=make_optimizer,
                               ps_update=ps_update)
        self.privatize = privatize
        self.dp_sgd = None if make_dp_sgd is None else make_dp_sgd(self.bottom)
        self._names = [n for n, _ in self.bottom.named_parameters()]

    def forward(self, rows: np.ndarray, *, snapshot: bool = False
                ) -> tuple[PassiveGraph, np.ndarray]:
        """Embeddings of a batch: ``(graph, what to publish as (B, d) float32)``.

        With DP on, the graph's ``h`` is the row-clipped embedding (the gradient flows
        back through the clipping) and the published array is ``h`` plus Gaussian noise.

        Args:
            rows: ``(B,)`` int64 row positions.
            snapshot: run the forward on copies of the current parameters, so that other
                batches' updates may happen before this batch's backward (AVFL: its
                gradient is then the stale gradient at the copied parameters, applied
                to the current ones). Without it the graph holds the live parameters,
                which must not change before :meth:`backward`.
        """
        x = self.x[_index(rows)]
        snap: list[torch.Tensor] | None = None
        if snapshot:
            snap = [p.detach().clone().requires_grad_(True) for p in self.replica.params]
            h = torch.func.functional_call(self.bottom, dict(zip(self._names, snap,
                                                                strict=True)), (x,))
        else:
            h = self.bottom(x)
        if self.privatize is None:
            return PassiveGraph(h, snap), h.detach().numpy()
        clipped, published = self.privatize(h)
        return PassiveGraph(clipped, snap, x), published.numpy()

    def backward(self, graph: PassiveGraph, grad: np.ndarray, epoch: int) -> None:
        """Back-propagate the cut-layer gradient ``(B, d)`` and take an Adam step (with DP
        on: a DP-SGD step, per-example clipped and noised, at the parameters the forward
        ran on)."""
        self.replica.zero_grad()
        g = torch.from_numpy(np.array(grad, dtype=np.float32))
        if self.dp_sgd is not None:
            if g.shape != tuple(graph.h.shape):
                raise ValueError(f"gradient shape {tuple(g.shape)} != embedding shape "
                                 f"{tuple(graph.h.shape)}")
            at = graph.snapshot if graph.snapshot is not None else self.replica.params
            params = dict(zip(self._names, at, strict=True))
            grads = self.dp_sgd.grads(params, graph.x, g)
            for n, p in zip(self._names, self.replica.params, strict=True):
                p.grad = grads[n]
            graph.h = None  # type: ignore[assignment]  # a graph is consumed once
        elif graph.snapshot is None:
            graph.h.backward(g)
        else:
            grads = torch.autograd.grad(graph.h, graph.snapshot, g, allow_unused=True)
            for p, gp in zip(self.replica.params, grads, strict=True):
                p.grad = None if gp is None else gp
        self.replica.step()
        self.replica.after_step(epoch)


class ActiveCompute:
    """The active party's per-worker compute: own bottom forward, top forward/backward.

    Args:
        x_train: ``(n_train, d_a)`` float32 tensor of the active party's features.
        y_train: ``(n_train,)`` float32 tensor: 0/1 labels (binary task) or
            standardised labels (regression task).
        make_bottom / make_top: factories of fresh modules.
        ps: the party's parameter server over (bottom, top) parameters.
        lr, delta_t0, sync_mode, make_optimizer, ps_update: see :class:`Replica`.
        task: ``"binary"`` (BCE-with-logits loss) or ``"regression"`` (MSE loss).
        loss_fn: the training loss ``(logits (B,), labels (B,)) -> scalar``; None: the
            task's (:func:`loss_function`).
        fuse: how the own part and the passive parties' embeddings are fused
            (:class:`parties.algorithms.fuse.Fuse`); None: concatenated (the top model's input is
            ``[h_own | e_1 | ...]``).
        labels: the active party's label protection
            (:class:`parties.privacy.labels.LabelProtection`; None: unprotected): with
            ``flips``, every step trains on the randomised labels (label DP); with
            ``noise``, each cut-layer gradient sent to a passive party is perturbed
            (the own bottom's backward uses the exact one).

    Raises:
        ValueError: unknown ``task``.
    """

    def __init__(self, x_train: torch.Tensor, y_train: torch.Tensor,
                 make_bottom: Callable[[], nn.Module], make_top: Callable[[], nn.Module],
                 ps: ParameterServer, *, lr: float, delta_t0: int,
                 task: str = "binary", sync_mode: str = "schedule",
                 make_optimizer: Callable[[list[nn.Parameter], float],
                                          torch.optim.Optimizer] | None = None,
                 loss_fn: nn.Module | None = None, fuse: Fuse | None = None,
                 ps_update: str = "average", labels: Any = None) -> None:
        self.x = x_train
        self.y = y_train
        flips = getattr(labels, "flips", None)
        #: rows whose label the randomised response flipped (None: no label DP)
        self._flips = torch.from_numpy(flips) if flips is not None else None
        #: the gradient defence (None: the gradients go as computed)
        self._noise = getattr(labels, "noise", None)
        self.fuse = fuse
        self.bottom = make_bottom()
        self.top = make_top()
        self.replica = Replica([self.bottom, self.top], ps, lr=lr, delta_t0=delta_t0,
                               sync_mode=sync_mode, make_optimizer=make_optimizer,
                               ps_update=ps_update)
        self.loss_fn = loss_fn if loss_fn is not None else loss_function(task)

    def forward_own(self, rows: np.ndarray) -> torch.Tensor:
        """The active party's own bottom embedding of a batch, ``(B, d)`` with graph."""
        return self.bottom(self.x[_index(rows)])

    def labels_of(self, rows: np.ndarray) -> torch.Tensor:
        """The labels a batch trains on: the true ones, or with label DP the randomised
        ones (each row's flip drawn once for the run)."""
        idx = _index(rows)
        y = self.y[idx]
        if self._flips is not None:
            y = torch.where(self._flips[idx], 1.0 - y, y)
        return y

    def top_step(self, h_own: torch.Tensor, emb: np.ndarray | Sequence[np.ndarray],
                 rows: np.ndarray, epoch: int, on_grad: Callable[[Any], None] | None = None
                 ) -> tuple[float, Any]:
        """Top forward/backward on ``[h_own, passive embedding(s)]``, own bottom backward;
        one Adam step.

        The cut-layer gradient is complete once the top model's backward is done, before
        the own bottom's backward: ``on_grad`` gets it then, so the caller can publish it
        while this party back-propagates through its own bottom model (both parties'
        backward passes run concurrently).

        Args:
            h_own: ``(B, d)`` own embedding with graph.
            emb: ``(B, d)`` float32 passive embedding, or a list of them, one per passive
                party (fused with ``fuse``, by default concatenated after ``h_own``).
            rows: the batch's row positions (for labels).
            epoch: current epoch (for the sync schedule).
            on_grad: called with ``dLoss/d emb`` (a list for a list) as soon as it
                exists (on this thread).

        Returns:
            ``(loss, grad)``: the batch's mean loss (BCE, or MSE of standardised labels) and
            ``dLoss/d emb``, ``(B, d)`` float32 (a list of them for a list).

        Raises:
            ValueError: an embedding's shape does not match the batch.
        """
        many = isinstance(emb, (list, tuple))
        embs = list(emb) if many else [emb]
        for i, e_np in enumerate(embs):
            if e_np.shape != tuple(h_own.shape):
                which = f"passive embedding {i}" if many else "passive embedding"
                raise ValueError(f"{which} shape {e_np.shape} != own {tuple(h_own.shape)}")
        es = [torch.from_numpy(np.array(e_np, dtype=np.float32)).requires_grad_(True)
              for e_np in embs]
        h_cut = h_own.detach().requires_grad_(True)
        parts = [h_cut, *es]
        fused = torch.cat(parts, dim=1) if self.fuse is None else self.fuse(parts)
        self.replica.zero_grad()
        ps = self.replica.ps
        y = self.labels_of(rows)
        if getattr(ps, "shares_top", False):  # one top for every worker, at the PS
            loss_v, g_fused = ps.top_step(fused, y, self.loss_fn)
            fused.backward(g_fused)
            loss = torch.tensor(loss_v)
        else:
            logits = self.top(fused).squeeze(1)
            loss = self.loss_fn(logits, y)
            loss.backward()
        assert h_cut.grad is not None and all(e.grad is not None for e in es)
        grads = [e.grad.numpy() for e in es]  # type: ignore[union-attr]
        if self._noise is not None:  # what the passive parties get: perturbed
            r = np.asarray(rows, dtype=np.int64)
            yb = y.numpy()
            grads = [self._noise(g, yb, r, epoch=epoch, party=j) for j, g in enumerate(grads)]
        grad: Any = grads if many else grads[0]
        if on_grad is not None:
            on_grad(grad)
        h_own.backward(h_cut.grad)
        self.replica.step()
        self.replica.after_step(epoch)
        return float(loss.detach()), grad


def load_flat(modules: Sequence[nn.Module], theta: torch.Tensor) -> None:
    """Copy a flat PS vector into ``modules`` (parameters, then floating-point buffers:
    :func:`state_tensors`).

    Raises:
        ValueError: ``theta`` has the wrong length.
    """
    tensors = state_tensors(modules)
    n = sum(t.numel() for t in tensors)
    if theta.numel() != n:
        raise ValueError(f"parameter vector of {theta.numel()} values != the modules' {n}")
    with torch.no_grad():
        vector_to_parameters(theta.clone(), tensors)


def flat_params(modules: Sequence[nn.Module]) -> torch.Tensor:
    """The modules' parameters and floating-point buffers as one flat vector (copy;
    :func:`state_tensors` order)."""
    with torch.no_grad():
        return parameters_to_vector(state_tensors(modules)).clone()


@torch.no_grad()
def embed(bottom: nn.Module, x: torch.Tensor, *, chunk: int = 8192) -> np.ndarray:
    """Embeddings of all rows of ``x`` ``(n, d_in)`` → ``(n, embedding_dim)`` float32, no
    grad, in eval mode (``bottom`` is left in eval mode)."""
    bottom.eval()
    parts = [bottom(x[i : i + chunk]) for i in range(0, x.shape[0], chunk)]
    return torch.cat(parts).numpy()


@torch.no_grad()
def predict(bottom: nn.Module, top: nn.Module, x: torch.Tensor,
            emb: np.ndarray | Sequence[np.ndarray], *, task: str = "binary",
            fuse: Fuse | None = None) -> np.ndarray:
    """Predictions ``(n,)`` float32 from own features ``x`` ``(n, d_a)`` and passive
    embeddings ``emb`` ``(n, d)`` (or a list, one per passive party, fused by ``fuse``;
    None: concatenated): positive-class probabilities (``"binary"``) or
    standardised labels (``"regression"``; ``p * std + mean`` in the label's units).
    Runs in eval mode (both modules are left in eval mode).

    Raises:
        ValueError: unknown ``task``.
    """
    if task not in ("binary", "regression"):
        raise ValueError(f"task must be 'binary' or 'regression', got {task!r}")
    bottom.eval()
    top.eval()
    h = bottom(x)
    embs = list(emb) if isinstance(emb, (list, tuple)) else [emb]
    parts = [h, *(torch.from_numpy(np.array(e, dtype=np.float32)) for e in embs)]
    out = top(torch.cat(parts, dim=1) if fuse is None else fuse(parts)).squeeze(1)
    return (torch.sigmoid(out) if task == "binary" else out).numpy()
