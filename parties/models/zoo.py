"""Model factories of a VFL party: which bottom and top models a run builds (torch, no I/O).

One picklable :class:`ModelFactory` builds the models everywhere they are built: the
party's parameter server and scoring copies (:class:`parties.runtime.party.Party`), thread and
inline workers and worker processes (:func:`parties.models.compute.make_compute`; a worker
process rebuilds the factory from the config mapping, or receives the pickled factory).

Model specs (``vfl.model.bottom`` for the bottom models, ``vfl.model.top`` for the top model):

* ``"mlp"`` (the default): today's Linear/ReLU stacks (:func:`parties.models.nets.party_bottom`,
  :func:`parties.models.nets.top_model`), built with exactly the same initialisation order and
  RNG use, so default runs are unchanged bit for bit.
* ``"resnet"``: the paper's large model (PubSub-VFL, Table 7), :class:`ResidualMlp`: an
  input projection ``Linear(d_in, width)``, ``depth`` residual blocks ``x + f(x)`` with
  ``f = Linear → Norm → ReLU → (Dropout) → Linear → Norm``, a ReLU after each block, and
  an output ``Linear(width, d_out)`` (no activation after it). Settings:
  ``vfl.model.resnet_depth`` (blocks, default 4), ``vfl.model.resnet_width`` (default 256),
  ``vfl.model.resnet_norm`` (``"layer"``, the default; ``"batch"``, ``"group"`` with
  :data:`GROUPS` groups, or ``"none"``), ``vfl.model.resnet_dropout`` (default 0.0).
* ``"pkg.module:callable"``: a user factory, importable in every process (worker
  processes too: it must be on ``sys.path`` there, e.g. an installed package), called
  as ``bottom(d_in: int, d_out: int) -> nn.Module`` (bottom: ``d_out = embedding_dim``)
  or ``top(d_in: int, d_out: int) -> nn.Module`` (top: ``d_in = 2·embedding_dim``,
  ``d_out = 1``).
* The Python API also takes the callables themselves (``ModelFactory(cfg,
  bottom=fn, top=fn)``); they must be picklable (module-level) for worker processes.

Hashed columns (:mod:`parties.data.treatments`: a categorical column with more than
``vfl.data.onehot_max_levels`` levels): the encoder puts each one's bucket, as an exact integer,
in the last columns of the party's matrix; the factory then wraps the bottom in
:class:`HashedBottom`, which looks each bucket up in one embedding table (``nn.Embedding``,
one row per bucket of every hashed column, ``vfl.data.hash_embedding_dim`` wide) and feeds the
dense columns and the embeddings, concatenated, to the bottom model (whose ``d_in`` is
then ``dense + hashed x hash_embedding_dim``). The table is ordinary parameters: every
worker replica holds a copy and the parameter server averages or steps it with the rest
(dense gradients). DP never meets a hashed column: with DP on the passive party's
features come from its public schema (one-hot only), and a factory asked for a hashed
passive bottom under DP refuses (:class:`pubsub.config.ConfigError`).

``vfl.model.top = ""`` (the default) means: a ``resnet`` top when ``model = "resnet"``
(same depth, width, norm, dropout), else the MLP top of ``vfl.model.top_hidden``.

:func:`check_models` builds and probes both models with a dummy batch of two rows before
any process starts and raises :class:`ModelSpecError` (a :class:`ConfigError`) naming the
value for a factory that cannot be imported or raises, a bottom whose output width is not
``embedding_dim``, or a top model that rejects the fused width ``2·embedding_dim``.

DP (the passive party's bottom, DP on): BatchNorm mixes records (its batch statistics and
running statistics), so DP-SGD refuses it (:class:`parties.privacy.dpsgd.DpIncompatibleModel`)
unless ``vfl.dp.batchnorm = "groupnorm"``, which replaces every BatchNorm of that model
with a GroupNorm of the same width (:func:`batchnorm_to_groupnorm`). Dropout is refused
under DP too (per-example gradients are taken with ``torch.func.vmap``, which draws no
per-example dropout masks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from parties.config.modelspec import (BUILTINS, DP_BATCHNORM, GROUPS, NORMS, ModelSpecError,
                               check_spec, import_callable)
from parties.models.nets import loss_function, make_adam, party_bottom, top_model
from parties.data.preflight import feature_widths
from pubsub.config import ConfigError

if TYPE_CHECKING:
    from parties.config import VflConfig

ModuleFn = Callable[[int, int], nn.Module]
#: ``(parameters, lr) -> torch.optim.Optimizer``: builds a worker's optimizer
OptimizerFn = Callable[[list[nn.Parameter], float], torch.optim.Optimizer]
#: ``(task) -> nn.Module``: builds the top model's training loss, called as
#: ``loss(logits (B,), labels (B,))`` (labels 0/1 for ``"binary"``, standardised for
#: ``"regression"``), returning a scalar
LossFn = Callable[[str], nn.Module]


def _groups(width: int) -> int:
    return max(g for g in range(1, min(GROUPS, width) + 1) if width % g == 0)


def norm_layer(norm: str, width: int) -> nn.Module:
    """The normalisation layer ``norm`` (one of :data:`NORMS`) over ``width`` features.

    Raises:
        ValueError: unknown ``norm``.
    """
    if norm == "layer":
        return nn.LayerNorm(width)
    if norm == "batch":
        return nn.BatchNorm1d(width)
    if norm == "group":
        return nn.GroupNorm(_groups(width), width)
    if norm == "none":
        return nn.Identity()
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")


class ResidualBlock(nn.Module):
    """``relu(x + f(x))``, ``f = Linear → Norm → ReLU → (Dropout) → Linear → Norm``."""

    def __init__(self, width: int, *, norm: str, dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(width, width), norm_layer(norm, width), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers += [nn.Linear(width, width), norm_layer(norm, width)]
        self.f = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.f(x))


class ResidualMlp(nn.Module):
    """The paper's large model (Table 7): ``(B, d_in) → (B, d_out)``.

    Input projection ``Linear(d_in, width)`` + ReLU, ``depth`` :class:`ResidualBlock`
    s, output ``Linear(width, d_out)``.

    Args:
        d_in / d_out: input and output widths.
        depth: residual blocks (>= 0).
        width: hidden width (>= 1).
        norm: one of :data:`NORMS`.
        dropout: dropout probability inside each block, in [0, 1).
    """

    def __init__(self, d_in: int, d_out: int, *, depth: int = 4, width: int = 256,
                 norm: str = "layer", dropout: float = 0.0) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*(ResidualBlock(width, norm=norm, dropout=dropout)
                                      for _ in range(depth)))
        self.out = nn.Linear(width, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(torch.relu(self.inp(x))))


def batchnorm_to_groupnorm(model: nn.Module) -> nn.Module:
    """Replace every ``BatchNorm1d`` of ``model`` (in place) by a ``GroupNorm`` of the same
    width (:data:`GROUPS` groups at most, affine), so its forward treats rows
    independently; returns ``model`` (a root BatchNorm is returned replaced).

    Raises:
        parties.privacy.dpsgd.DpIncompatibleModel: a BatchNorm that is not 1-d (2-d/3-d
            BatchNorm is left to the user's model).
    """
    from parties.privacy.dpsgd import DpIncompatibleModel

    def convert(mod: nn.Module, name: str) -> nn.Module:
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            if not isinstance(mod, nn.BatchNorm1d):
                raise DpIncompatibleModel(name, type(mod).__name__)
            return nn.GroupNorm(_groups(mod.num_features), mod.num_features,
                                eps=mod.eps, affine=True)
        for child_name, child in list(mod.named_children()):
            new = convert(child, f"{name}.{child_name}" if name else child_name)
            if new is not child:
                setattr(mod, child_name, new)
        return mod

    return convert(model, "")


def _qualname(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


class HashedBottom(nn.Module):
    """``body`` over the dense columns of ``x`` and the embeddings of its hashed ones.

    ``x``: ``(B, dense + len(buckets))``; its last ``len(buckets)`` columns hold bucket
    ids (``0 <= id < buckets[j]``, exact in float32). Output: ``body(cat(x_dense,
    emb_0, ..., emb_k))``.
    """

    def __init__(self, dense: int, buckets: tuple[int, ...], dim: int, body: nn.Module) -> None:
        super().__init__()
        if dense < 0 or not buckets or min(buckets) < 1 or dim < 1:
            raise ValueError(f"bad hashed layout: dense={dense}, buckets={buckets}, "
                             f"dim={dim}")
        self.dense = dense
        self.buckets = tuple(int(b) for b in buckets)
        self.table = nn.Embedding(sum(self.buckets), dim)
        starts = [0]
        for b in self.buckets[:-1]:
            starts.append(starts[-1] + b)
        self._starts = torch.tensor(starts, dtype=torch.long)  # not a buffer: not in θ
        self._top = torch.tensor(self.buckets, dtype=torch.long) - 1
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x[:, self.dense:].long()
        ids = torch.minimum(ids.clamp_(min=0), self._top) + self._starts
        emb = self.table(ids).flatten(1)
        return self.body(torch.cat([x[:, :self.dense], emb], dim=1))


@dataclass(frozen=True, slots=True)
class ModelFactory:
    """Builds ``role``'s bottom model and the top model of a run (picklable).

    Args:
        cfg: the run config (``model``, ``top_model``, ``resnet_*``, widths).
        bottom_fn / top_fn: callables ``(d_in, d_out) -> nn.Module`` that replace
            ``cfg.model.bottom`` / ``cfg.model.top`` (Python API; picklable for worker
            processes). None: the config's.
        passive_bottom_fn: the passive party's bottom, when it differs from
            ``bottom_fn`` (which then builds the active party's).
        optimizer_fn: ``(parameters, lr) -> torch.optim.Optimizer`` for every worker
            replica (``lr`` is the worker's scaled learning rate,
            :meth:`parties.config.VflConfig.worker_lr`). None: Adam
            (:func:`parties.models.nets.make_adam`). Under DP the passive optimizer only sees
            DP-SGD's noised gradients (post-processing: the accounting is unchanged).
        loss_fn: ``(task) -> nn.Module``, the top model's training loss. None: mean
            BCE-with-logits (binary) or MSE (regression).
        hashed: the buckets of each hashed input column (the last ``len(hashed)`` input
            columns; :class:`HashedBottom`), set by :meth:`with_hashed` from the party's
            encoder; () for none.
    """

    cfg: VflConfig
    bottom_fn: ModuleFn | None = None
    top_fn: ModuleFn | None = None
    passive_bottom_fn: ModuleFn | None = None
    optimizer_fn: OptimizerFn | None = None
    loss_fn: LossFn | None = None
    hashed: tuple[int, ...] = ()

    def with_hashed(self, buckets: tuple[int, ...] | list[int]) -> ModelFactory:
        """This factory for a party whose last ``len(buckets)`` input columns are hashed."""
        from dataclasses import replace

        return replace(self, hashed=tuple(int(b) for b in buckets))

    def _bottom_fn(self, role: str) -> ModuleFn | None:
        if role == "passive" and self.passive_bottom_fn is not None:
            return self.passive_bottom_fn
        return self.bottom_fn

    def optimizer(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        """A worker's optimizer over ``params`` at learning rate ``lr``.

        Raises:
            ModelSpecError: key ``optimizer``: the factory raises or returns no optimizer.
        """
        if self.optimizer_fn is None:
            return make_adam(params, lr)
        try:
            opt = self.optimizer_fn(params, lr)
        except Exception as exc:  # noqa: BLE001 - a user factory may raise anything
            raise ModelSpecError("optimizer", _qualname(self.optimizer_fn),
                                 f"raised {type(exc).__name__}: {exc}") from None
        if not isinstance(opt, torch.optim.Optimizer):
            raise ModelSpecError("optimizer", _qualname(self.optimizer_fn),
                                 f"returned a {type(opt).__name__}, not a "
                                 "torch.optim.Optimizer")
        return opt

    def loss(self, task: str) -> nn.Module:
        """The top model's training loss for ``task``.

        Raises:
            ModelSpecError: key ``loss``: the factory raises or returns no module.
        """
        if self.loss_fn is None:
            return loss_function(task)
        return _build("loss", _qualname(self.loss_fn), lambda: self.loss_fn(task))

    def _resnet(self, d_in: int, d_out: int) -> nn.Module:
        c = self.cfg
        return ResidualMlp(d_in, d_out, depth=c.model.resnet_depth, width=c.model.resnet_width,
                           norm=c.model.resnet_norm, dropout=c.model.resnet_dropout)

    def bottom_spec(self, role: str = "active") -> str:
        """``role``'s bottom spec as text (a callable as ``module:qualname``)."""
        fn = self._bottom_fn(role)
        return self.cfg.model.bottom if fn is None else _qualname(fn)

    def top_spec(self) -> str:
        """The top spec as text, ``""`` resolved (``"mlp"`` or ``"resnet"``)."""
        if self.top_fn is not None:
            return _qualname(self.top_fn)
        if self.cfg.model.top:
            return self.cfg.model.top
        return "resnet" if self.cfg.model.bottom == "resnet" and self.bottom_fn is None \
            and self.passive_bottom_fn is None else "mlp"

    def _raw_bottom(self, role: str, d_in: int) -> nn.Module:
        cfg = self.cfg
        fn = self._bottom_fn(role)
        if fn is not None:
            return fn(d_in, cfg.model.embedding_dim)
        if cfg.model.bottom == "mlp":
            return party_bottom(cfg, role, d_in)
        if cfg.model.bottom == "resnet":
            return self._resnet(d_in, cfg.model.embedding_dim)
        return import_callable("model.bottom", cfg.model.bottom)(d_in, cfg.model.embedding_dim)

    def bottom(self, role: str, d_in: int) -> nn.Module:
        """``role``'s bottom model ``(B, d_in) → (B, embedding_dim)``; for the passive party
        under DP with ``dp_batchnorm = "groupnorm"``, its BatchNorms become GroupNorms;
        with hashed columns, the bottom inside a :class:`HashedBottom`.

        Raises:
            ConfigError: hashed columns in the passive bottom with DP on.
        """
        if self.hashed:
            cfg = self.cfg
            if role == "passive" and cfg.dp.enabled:
                raise ConfigError("vfl.data.hash_buckets", "DP is on: the passive bottom cannot "
                                  "hold hashed embedding tables (DP-SGD would materialise "
                                  "their per-example gradients densely); its features come "
                                  f"from the public schema, got hashed columns {self.hashed}")
            dense = d_in - len(self.hashed)
            body = self._raw_bottom(role, dense + len(self.hashed) * cfg.data.hash_embedding_dim)
            return HashedBottom(dense, self.hashed, cfg.data.hash_embedding_dim, body)
        model = self._raw_bottom(role, d_in)
        if role == "passive" and self.cfg.dp.enabled and self.cfg.dp.batchnorm == "groupnorm":
            model = batchnorm_to_groupnorm(model)
        return model

    def top(self) -> nn.Module:
        """The top model ``(B, top_input_width) → (B, 1)`` (``2·embedding_dim`` in a
        two-party run; :attr:`parties.config.VflConfig.top_input_width`)."""
        cfg = self.cfg
        d_in = cfg.top_input_width
        if self.top_fn is not None:
            return self.top_fn(d_in, 1)
        spec = self.top_spec()
        if spec == "mlp":
            return top_model(cfg.model.embedding_dim, cfg.model.top_hidden, d_in=d_in)
        if spec == "resnet":
            return self._resnet(d_in, 1)
        return import_callable("model.top", spec)(d_in, 1)

    def modules(self, role: str, d_in: int) -> list[nn.Module]:
        """``role``'s models in parameter-server order: bottom, then (active) top; built in
        that order from the current torch RNG state."""
        mods = [self.bottom(role, d_in)]
        if role == "active":
            mods.append(self.top())
        return mods

    def describe(self, role: str | None = None) -> dict[str, Any]:
        """The spec as JSON-ready data (for manifests and reports): ``role``'s bottom as
        ``model`` (None: the active party's, and ``passive_model`` when the passive
        party's differs)."""
        c = self.cfg
        out: dict[str, Any] = {"model": self.bottom_spec(role or "active"),
                               "top_model": self.top_spec()}
        if role is None and self.passive_bottom_fn is not None:
            out["passive_model"] = self.bottom_spec("passive")
        if self.optimizer_fn is not None:
            out["optimizer"] = _qualname(self.optimizer_fn)
        if self.loss_fn is not None:
            out["loss"] = _qualname(self.loss_fn)
        if "resnet" in (out["model"], out["top_model"]):
            out["resnet"] = {"depth": c.model.resnet_depth, "width": c.model.resnet_width,
                             "norm": c.model.resnet_norm, "dropout": c.model.resnet_dropout}
        if c.dp.enabled:
            out["dp_batchnorm"] = c.dp.batchnorm
        if self.hashed:
            out["hashed"] = {"buckets": list(self.hashed), "dim": c.data.hash_embedding_dim,
                             "table": "nn.Embedding, one per bottom replica (dense updates)"}
        return out


def _build(key: str, spec: str, fn: Callable[[], nn.Module]) -> nn.Module:
    try:
        mod = fn()
    except ModelSpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user factory may raise anything
        raise ModelSpecError(key, spec, f"raised {type(exc).__name__}: {exc}") from None
    if not isinstance(mod, nn.Module):
        raise ModelSpecError(key, spec, f"returned a {type(mod).__name__}, not a torch "
                             "nn.Module")
    return mod


def _probe(key: str, spec: str, mod: nn.Module, d_in: int, d_out: int, what: str) -> None:
    was = mod.training
    mod.eval()
    try:
        with torch.no_grad():
            out = mod(torch.zeros(2, d_in))
    except Exception as exc:  # noqa: BLE001 - the model rejects the input width
        raise ModelSpecError(key, spec, f"{what} rejects a (2, {d_in}) input "
                             f"({type(exc).__name__}: {exc})") from None
    finally:
        mod.train(was)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, d_out):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelSpecError(key, spec, f"{what} maps a (2, {d_in}) input to {shape}, "
                             f"expected (2, {d_out})"
                             + (" (its output width must be vfl.model.embedding_dim)"
                                if key == "model.bottom" else ""))


def check_models(factory: ModelFactory, d_in: dict[str, int]) -> None:
    """Build and probe each role's bottom (input width ``d_in[role]``) and the top model
    with a dummy batch of two rows, in eval mode (no RNG state is kept: the torch RNG
    is restored afterwards); with DP on, the passive bottom must pass DP-SGD's check.

    Raises:
        ModelSpecError: a factory cannot be imported, raises or returns no module; a
            bottom's output width is not ``embedding_dim``; the top rejects
            ``2·embedding_dim`` or its output is not one column.
        parties.privacy.dpsgd.DpIncompatibleModel: DP on, and the passive bottom has BatchNorm
            (with ``dp_batchnorm = "refuse"``).
        ConfigError: key ``vfl.model.resnet_dropout``: dropout in the passive bottom under DP.
    """
    from parties.core.ids import role_of

    cfg = factory.cfg
    rng = torch.get_rng_state()
    try:
        for party, width in d_in.items():
            role = role_of(party)
            spec = factory.bottom_spec(role)
            mod = _build("model.bottom", spec, lambda r=role, w=width: factory.bottom(r, w))
            _probe("model.bottom", spec, mod, width, cfg.model.embedding_dim, f"the {party} bottom model")
            if role == "passive" and cfg.dp.enabled:
                from parties.privacy.dpsgd import check_dp_compatible

                check_dp_compatible(mod)
                if any(isinstance(m, nn.Dropout) and m.p > 0 for m in mod.modules()):
                    raise ConfigError("vfl.model.resnet_dropout", "DP is on: the passive bottom "
                                      "model must have no dropout (DP-SGD's per-example "
                                      f"gradients draw no dropout masks), got {mod!r}"[:400])
        if "active" in d_in:
            top = _build("model.top", factory.top_spec(), factory.top)
            _probe("model.top", factory.top_spec(), top, cfg.top_input_width, 1,
                   "the top model")
            factory.optimizer([p for m in (mod, top) for p in m.parameters()], cfg.lr)
            factory.loss(cfg.effective_task)
    finally:
        torch.set_rng_state(rng)


def float_buffers(module: nn.Module) -> list[torch.Tensor]:
    """``module``'s floating-point buffers (BatchNorm running statistics), in
    ``named_buffers`` order; integer buffers (``num_batches_tracked``) are left out."""
    return [b for b in module.buffers() if b.is_floating_point()]


def default_models(cfg: VflConfig) -> bool:
    """True when ``cfg`` builds the default MLPs (nothing to probe before the start)."""
    return cfg.model.bottom == "mlp" and cfg.model.top in ("", "mlp")


def preflight_models(cfg: VflConfig, models: Any = None) -> None:
    """Build and probe both parties' models before any process starts
    (:func:`check_models`); nothing to do for the default MLPs.

    Args:
        models: a :class:`ModelFactory` (e.g. with Python callables); None:
            the config's.

    Raises:
        parties.models.zoo.ModelSpecError: a factory cannot be imported or raises, or a width is
            wrong (a ConfigError).
        parties.privacy.dpsgd.DpIncompatibleModel: DP on and BatchNorm in the passive bottom.
        ConfigError, parties.data.DataError: see :func:`parties.data.preflight.feature_widths`.
    """
    if models is None and default_models(cfg):
        return
    check_models(models if models is not None else ModelFactory(cfg), feature_widths(cfg))


__all__ = ["BUILTINS", "DP_BATCHNORM", "GROUPS", "NORMS", "HashedBottom", "ModelFactory", "ModelSpecError",
           "ResidualBlock", "ResidualMlp", "batchnorm_to_groupnorm", "check_models",
           "check_spec", "default_models", "float_buffers", "import_callable", "norm_layer",
           "preflight_models"]
