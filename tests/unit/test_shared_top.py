"""The shared top (``vfl.workers.top_update = "shared"``): one top model at the active party's PS,
stepped in batch order, while the workers' bottom replicas are averaged as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from parties.config import VflConfig, WorkersSection
from parties.models.model import (ActiveCompute, ParameterServer, bottom_model, flat_params,
                           make_adam, top_model)
from pubsub.config import ConfigError

D, E = 5, 4  # input columns, embedding width


def _mods(seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [bottom_model(D, (8,), E), top_model(E, (6,), d_in=2 * E)]


def _shared_ps(mods: list[nn.Module], workers: int = 2, lr: float = 1e-2) -> ParameterServer:
    ps = ParameterServer(flat_params(mods), workers=workers)
    top = top_model(E, (6,), d_in=2 * E)
    ps.share_top(top, offset=sum(p.numel() for p in mods[0].parameters()), lr=lr)
    return ps


def test_top_steps_at_the_ps_are_sequential_training_of_one_top() -> None:
    mods = _mods()
    ps = _shared_ps(mods)
    ref = top_model(E, (6,), d_in=2 * E)
    ref.load_state_dict(mods[1].state_dict())
    opt = make_adam(list(ref.parameters()), 1e-2)
    loss_fn = nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(1)
    for _ in range(5):  # as if from different workers: the order is what counts
        x = torch.from_numpy(rng.normal(size=(16, 2 * E)).astype(np.float32))
        y = torch.from_numpy((rng.random(16) > 0.5).astype(np.float32))
        loss, g = ps.top_step(x, y, loss_fn)
        xr = x.clone().requires_grad_(True)
        lr_ = loss_fn(ref(xr).squeeze(1), y)
        opt.zero_grad()
        lr_.backward()
        opt.step()
        assert loss == pytest.approx(float(lr_.detach()), abs=1e-6)
        np.testing.assert_allclose(g.numpy(), xr.grad.numpy(), atol=1e-6)
    n_bottom = sum(p.numel() for p in mods[0].parameters())
    n_top = sum(p.numel() for p in ref.parameters())
    theta = ps.pull()
    np.testing.assert_allclose(theta[n_bottom:n_bottom + n_top].numpy(),
                               flat_params([ref]).numpy(), atol=1e-6)
    assert ps.top_steps == 5


def test_worker_sync_keeps_the_shared_top_and_averages_the_bottom() -> None:
    mods = _mods()
    ps = _shared_ps(mods, workers=2)
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.normal(size=(40, D)).astype(np.float32))
    y = torch.from_numpy((rng.random(40) > 0.5).astype(np.float32))

    def make_bottom() -> nn.Module:
        return bottom_model(D, (8,), E)

    def make_top() -> nn.Module:
        return top_model(E, (6,), d_in=2 * E)

    w = ActiveCompute(x, y, make_bottom, make_top, ps, lr=1e-2, delta_t0=1, sync_mode="step")
    n_bottom = sum(p.numel() for p in mods[0].parameters())
    before = ps.pull()
    rows = np.arange(16)
    emb = rng.normal(size=(16, E)).astype(np.float32)
    loss, grad = w.top_step(w.forward_own(rows), emb, rows, epoch=0)
    after = ps.pull()
    assert np.isfinite(loss) and grad.shape == (16, E)
    # the top moved by exactly the PS's one step; the worker's own copy of it never did
    assert ps.top_steps == 1
    assert not torch.equal(after[n_bottom:], before[n_bottom:])
    # the bottom moved by half the worker's change (θ ← θ + Δ/w, w = 2)
    bottom_change = after[:n_bottom] - before[:n_bottom]
    assert float(bottom_change.abs().max()) > 0
    assert float(w.replica.flat[:n_bottom].sub(after[:n_bottom]).abs().max()) < 1e-6


def test_the_cut_gradient_matches_a_replica_top_with_the_same_parameters() -> None:
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.normal(size=(40, D)).astype(np.float32))
    y = torch.from_numpy((rng.random(40) > 0.5).astype(np.float32))
    rows = np.arange(16)
    emb = rng.normal(size=(16, E)).astype(np.float32)
    out = {}
    for shared in (False, True):
        mods = _mods(seed=4)
        ps = _shared_ps(mods) if shared else ParameterServer(flat_params(mods), workers=2)
        w = ActiveCompute(x, y, lambda: bottom_model(D, (8,), E),
                          lambda: top_model(E, (6,), d_in=2 * E), ps, lr=1e-2, delta_t0=1,
                          sync_mode="manual")
        out[shared] = w.top_step(w.forward_own(rows), emb, rows, epoch=0)
    assert out[True][0] == pytest.approx(out[False][0], abs=1e-6)
    np.testing.assert_allclose(out[True][1], out[False][1], atol=1e-6)


def test_share_top_refuses_gradient_push_and_buffers() -> None:
    mods = _mods()
    grad_ps = ParameterServer(flat_params(mods), workers=2, update="gradient",
                              n_params=sum(p.numel() for m in mods for p in m.parameters()),
                              lr=1e-3)
    with pytest.raises(ValueError, match="average"):
        grad_ps.share_top(top_model(E, (6,), d_in=2 * E), offset=0, lr=1e-3)
    ps = ParameterServer(flat_params(mods), workers=2)
    with pytest.raises(ValueError, match="buffer_offset"):
        ps.share_top(nn.Sequential(nn.BatchNorm1d(2 * E), nn.Linear(2 * E, 1)), offset=0,
                     lr=1e-3)
    with pytest.raises(ValueError, match="do not fit"):  # buffers over the parameters
        ps.share_top(nn.Sequential(nn.BatchNorm1d(2 * E), nn.Linear(2 * E, 1)), offset=0,
                     buffer_offset=0, lr=1e-3)
    with pytest.raises(ValueError, match="does not fit"):
        ps.share_top(top_model(E, (6,), d_in=2 * E), offset=ps.size, lr=1e-3)
    with pytest.raises(RuntimeError, match="no shared top"):
        ps.top_step(torch.zeros(2, 2 * E), torch.zeros(2), nn.BCEWithLogitsLoss())


def _bn_top() -> nn.Module:
    return nn.Sequential(nn.Linear(2 * E, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 1))


def test_a_batch_norm_top_keeps_its_running_statistics_in_theta() -> None:
    """A top with batch norm (``model = "resnet"``, ``resnet_norm = "batch"``) is shared
    too: its running statistics are θ's, updated by the one top's forward passes in batch
    order, as sequential training of one top would, and a worker's push (Δ = 0 there)
    leaves them alone."""
    torch.manual_seed(0)
    mods = [bottom_model(D, (8,), E), _bn_top()]
    ps = ParameterServer(flat_params(mods), workers=2)
    n_bottom = sum(p.numel() for p in mods[0].parameters())
    n_all = sum(p.numel() for m in mods for p in m.parameters())
    top = _bn_top()
    ps.share_top(top, offset=n_bottom, buffer_offset=n_all, lr=1e-2)
    ref = _bn_top()
    ref.load_state_dict(mods[1].state_dict())
    ref.train()
    opt = make_adam(list(ref.parameters()), 1e-2)
    loss_fn = nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(2)
    for _ in range(4):
        x = torch.from_numpy(rng.normal(size=(16, 2 * E)).astype(np.float32))
        y = torch.from_numpy((rng.random(16) > 0.5).astype(np.float32))
        ps.top_step(x, y, loss_fn)
        opt.zero_grad()
        loss_fn(ref(x).squeeze(1), y).backward()
        opt.step()
    ps.push(torch.zeros(ps.size))  # a worker's push: Δ = 0 on the top
    theta = ps.pull()
    want = flat_params([ref])  # the reference top's parameters, then its running stats
    n_top = n_all - n_bottom
    np.testing.assert_allclose(theta[n_bottom:n_all].numpy(), want[:n_top].numpy(),
                               atol=1e-6)
    np.testing.assert_allclose(theta[n_all:].numpy(), want[n_top:].numpy(), atol=1e-6)
    assert float(theta[n_all:].abs().sum()) > 0  # the statistics did move


@pytest.mark.parametrize(("kw", "shares"), [
    ({"algo": "pubsub", "workers.active": 2}, True),
    ({"algo": "pubsub", "workers.active": 1}, False),
    ({"algo": "pubsub", "workers.active": 2, "workers.ps_update": "gradient"}, False),
    ({"algo": "pubsub", "workers.active": 2, "workers.top_update": "replica"}, False),
    ({"algo": "avfl-ps", "workers.active": 2}, False),
    ({"algo": "vfl-ps", "workers.active": 2, "workers.passive": 2}, False),
])
def test_which_runs_share_the_top(kw: dict, shares: bool) -> None:
    from parties.config import vfl_config

    assert vfl_config({"workers.top_update": "shared", **kw}).shares_top() is shares


def test_top_update_is_checked() -> None:
    with pytest.raises(ConfigError, match="top_update"):
        VflConfig(workers=WorkersSection(top_update="global"))
