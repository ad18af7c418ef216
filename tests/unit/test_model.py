"""Parameter-server rule, barrier sync, AVFL's snapshot backward, the early cut-layer gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parties.models.model import (
    ActiveCompute,
    ParameterServer,
    PassiveCompute,
    bottom_model,
    flat_params,
    top_model,
)


def test_ps_averages_the_workers_changes() -> None:
    ps = ParameterServer(torch.zeros(3), workers=2)
    ps.push(torch.tensor([2.0, 0.0, 4.0]))
    theta = ps.push(torch.tensor([0.0, 2.0, 4.0]))
    # both workers started from 0: the result is the average of their models
    assert torch.equal(theta, torch.tensor([1.0, 1.0, 4.0]))
    one = ParameterServer(torch.zeros(2))
    assert torch.equal(one.push(torch.ones(2)), torch.ones(2))
    with pytest.raises(ValueError, match="workers"):
        ParameterServer(torch.zeros(2), workers=0)
    with pytest.raises(ValueError, match="shape"):
        ps.push(torch.zeros(4))


def test_ps_copies_into_a_given_buffer() -> None:
    ps = ParameterServer(torch.zeros(3), workers=2)
    buf = torch.full((3,), 9.0)
    assert ps.push(torch.tensor([2.0, 0.0, 4.0]), out=buf) is buf
    assert torch.equal(buf, torch.tensor([1.0, 0.0, 2.0]))
    buf.zero_()  # the caller's buffer is a copy, not the server's state
    assert torch.equal(ps.pull(out=buf), torch.tensor([1.0, 0.0, 2.0]))
    with pytest.raises(ValueError, match=r"out shape \(2,\)"):
        ps.pull(out=torch.zeros(2))


def test_scheduled_sync_keeps_the_parameters_views_of_one_flat_buffer() -> None:
    torch.manual_seed(0)
    x = torch.randn(40, 4)
    ps = ParameterServer(flat_params([bottom_model(4, (8,), 3)]), workers=2)
    a, b = _passive(ps, x, "step"), _passive(ps, x, "step")
    flat = a.replica.flat
    for step in range(3):
        for w in (a, b):
            g, _ = w.forward(np.arange(step * 8, step * 8 + 8))
            w.backward(g, np.ones((8, 3), np.float32), epoch=0)
            # the last pusher holds exactly the server's parameters
            torch.testing.assert_close(flat_params([w.bottom]), ps.pull(), rtol=0, atol=0)
    assert a.replica.flat is flat and a.replica.syncs == 3
    assert a.replica.sync_cpu_s > 0.0  # the syncs' CPU is counted (thread time)
    # the modules compute with the flat buffer itself: no stale copies after syncs
    assert all(p.data_ptr() >= flat.data_ptr() and
               p.data_ptr() < flat.data_ptr() + flat.numel() * 4 for p in a.replica.params)


def _passive(ps: ParameterServer, x: torch.Tensor, mode: str) -> PassiveCompute:
    torch.manual_seed(0)
    return PassiveCompute(x, lambda: bottom_model(4, (8,), 3), ps, lr=1e-2, delta_t0=5,
                          sync_mode=mode)


def test_barrier_sync_gives_the_mean_of_the_replicas() -> None:
    torch.manual_seed(0)
    x = torch.randn(20, 4)
    ps = ParameterServer(flat_params([bottom_model(4, (8,), 3)]), workers=2)
    theta0 = ps.pull()
    a, b = _passive(ps, x, "manual"), _passive(ps, x, "manual")
    for w, rows in ((a, np.arange(0, 10)), (b, np.arange(10, 20))):
        g, _ = w.forward(rows)
        w.backward(g, np.ones((10, 3), np.float32), epoch=0)
    assert torch.equal(ps.pull(), theta0)  # manual: nothing pushed yet
    wa, wb = flat_params([a.bottom]), flat_params([b.bottom])
    a.replica.push()
    b.replica.push()
    a.replica.pull()
    b.replica.pull()
    torch.testing.assert_close(ps.pull(), (wa + wb) / 2)
    torch.testing.assert_close(flat_params([a.bottom]), (wa + wb) / 2)


def test_snapshot_forward_gives_the_stale_gradient_at_the_old_parameters() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 4)
    ps = ParameterServer(flat_params([bottom_model(4, (8,), 3)]))
    w = _passive(ps, x, "manual")
    ref = _passive(ps, x, "manual")  # same init, live graphs
    rows0, rows1 = np.arange(8), np.arange(8, 16)
    grad = np.full((8, 3), 0.5, np.float32)
    g0, h0 = w.forward(rows0, snapshot=True)
    g1, _ = w.forward(rows1, snapshot=True)
    w.backward(g1, grad, epoch=0)  # batch 1's update happens first ...
    w.backward(g0, grad, epoch=0)  # ... and batch 0's gradient is still the one at θ_0
    r0, rh0 = ref.forward(rows0)
    np.testing.assert_allclose(h0, rh0, atol=1e-6)
    r0.h.backward(torch.from_numpy(grad))
    expected = [p.grad.clone() for p in ref.replica.params]
    ref.replica.opt.zero_grad()
    g0b, _ = ref.forward(rows0, snapshot=True)
    got = torch.autograd.grad(g0b.h, g0b.snapshot, torch.from_numpy(grad))
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(e, g)


def test_active_publishes_the_cut_layer_gradient_before_its_own_backward() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(8, 4), (torch.rand(8) > 0.5).float()
    mods = [bottom_model(4, (8,), 3), top_model(3, (4,))]
    ps = ParameterServer(flat_params(mods))
    a = ActiveCompute(x, y, lambda: bottom_model(4, (8,), 3), lambda: top_model(3, (4,)), ps,
                      lr=1e-2, delta_t0=5)
    seen: list[np.ndarray] = []
    before = flat_params([a.bottom])

    def on_grad(g: np.ndarray) -> None:
        seen.append(g.copy())
        assert torch.equal(flat_params([a.bottom]), before)  # own step not taken yet

    rows = np.arange(8)
    emb = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    loss, grad = a.top_step(a.forward_own(rows), emb, rows, epoch=0, on_grad=on_grad)
    assert len(seen) == 1 and np.array_equal(seen[0], grad) and grad.shape == (8, 3)
    assert not torch.equal(flat_params([a.bottom]), before) and loss > 0


def test_a_party_with_one_worker_does_not_sync_every_step() -> None:
    from parties.config import ModelSection, WorkersSection, VflConfig
    from parties.models.compute import make_compute, sync_mode_for

    assert sync_mode_for("pubsub", 2) == "schedule" and sync_mode_for("avfl-ps", 3) == "step"
    assert sync_mode_for("pubsub", 1) == "manual" and sync_mode_for("vfl-ps", 2) == "manual"
    x = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    cfg = VflConfig(algo="pubsub", batch_size=8, workers=WorkersSection(active=1, passive=2),
                    model=ModelSection(bottom_hidden=(8,), embedding_dim=3))
    ps = ParameterServer(flat_params([bottom_model(4, (8,), 3)]))
    solo = make_compute("passive", VflConfig(algo="pubsub", batch_size=8,
                                             workers=WorkersSection(active=2, passive=1),
                                             model=ModelSection(bottom_hidden=(8,), embedding_dim=3)), x, None, ps)
    pair = make_compute("passive", cfg, x, None, ps)
    assert solo.replica.sync_mode == "manual" and pair.replica.sync_mode == "schedule"
    # the flush at the end of a segment still brings the server up to date
    g, _ = solo.forward(np.arange(8))
    solo.backward(g, np.ones((8, 3), np.float32), epoch=0)
    assert solo.replica.syncs == 0
    solo.replica.sync()
    torch.testing.assert_close(ps.pull(), flat_params([solo.bottom]))


@pytest.mark.parametrize("mode", ["concat", "sum", "mean"])
def test_active_step_with_several_passive_parties_returns_each_its_own_gradient(mode) -> None:
    """Two passive embeddings fused with the own part: each party's gradient is the loss's
    gradient with respect to its own embedding (checked against a direct autograd), given
    to on_grad (as a list, in order) before the own backward."""
    from parties.algorithms.fuse import Fuse

    torch.manual_seed(0)
    d = 3
    fuse = Fuse(mode=mode, widths=(d, d, d))
    x, y = torch.randn(8, 4), (torch.rand(8) > 0.5).float()
    top_in = fuse.out_width
    make_top = (lambda: torch.nn.Sequential(torch.nn.Linear(top_in, 4), torch.nn.ReLU(),
                                            torch.nn.Linear(4, 1)))
    torch.manual_seed(1)
    mods = [bottom_model(4, (8,), d), make_top()]
    ps = ParameterServer(flat_params(mods))
    a = ActiveCompute(x, y, lambda: bottom_model(4, (8,), d), make_top, ps, lr=1e-2,
                      delta_t0=5, fuse=fuse)
    rng = np.random.default_rng(0)
    embs = [rng.normal(size=(8, d)).astype(np.float32) for _ in range(2)]
    rows = np.arange(8)
    # the expected gradients, from the replica's parameters before the step
    h = a.forward_own(rows).detach()
    es = [torch.from_numpy(e).requires_grad_(True) for e in embs]
    loss_ref = a.loss_fn(a.top(fuse([h, *es])).squeeze(1), y)
    expected = torch.autograd.grad(loss_ref, es)
    seen: list[list[np.ndarray]] = []
    before = flat_params([a.bottom])

    def on_grad(g: list[np.ndarray]) -> None:
        seen.append([x.copy() for x in g])
        assert torch.equal(flat_params([a.bottom]), before)

    loss, grads = a.top_step(a.forward_own(rows), embs, rows, epoch=0, on_grad=on_grad)
    assert loss == pytest.approx(float(loss_ref.detach()), abs=1e-6)
    assert isinstance(grads, list) and len(grads) == 2 and len(seen) == 1
    for g, s, e in zip(grads, seen[0], expected, strict=True):
        np.testing.assert_allclose(g, e.numpy(), atol=1e-6)
        np.testing.assert_array_equal(g, s)
    if mode == "sum":
        np.testing.assert_array_equal(grads[0], grads[1])


def test_active_step_names_the_passive_embedding_of_the_wrong_shape() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(8, 4), (torch.rand(8) > 0.5).float()
    ps = ParameterServer(flat_params([bottom_model(4, (8,), 3), top_model(3, (4,))]))
    a = ActiveCompute(x, y, lambda: bottom_model(4, (8,), 3), lambda: top_model(3, (4,)), ps,
                      lr=1e-2, delta_t0=5)
    rows = np.arange(8)
    good, bad = np.zeros((8, 3), np.float32), np.zeros((8, 2), np.float32)
    with pytest.raises(ValueError, match="passive embedding 1 shape \\(8, 2\\)"):
        a.top_step(a.forward_own(rows), [good, bad], rows, epoch=0)


# ---------------------------------------------------------------------------- gradient push
def test_gradient_push_applies_every_workers_gradient_with_one_optimizer() -> None:
    """``update="gradient"``: the server's one Adam applies each pushed gradient in turn,
    exactly as one sequential Adam over the same gradients would; buffers (after the
    ``n_params`` parameters) are averaged as Δ/w."""
    init = torch.tensor([1.0, -2.0, 0.5, 3.0])  # 3 parameters, then 1 buffer value
    ps = ParameterServer(init, workers=2, update="gradient", n_params=3, lr=0.1)
    ref = torch.nn.Parameter(init[:3].clone())
    opt = torch.optim.Adam([ref], lr=0.1)
    for g in ([0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-1.0, 1.0, 1.0]):
        theta = ps.push(torch.tensor([*g, 2.0]))
        ref.grad = torch.tensor(g)
        opt.step()
        torch.testing.assert_close(theta[:3], ref.detach(), rtol=1e-6, atol=1e-7)
    assert theta[3].item() == pytest.approx(3.0 + 3 * 2.0 / 2)  # buffer: +Δ/w per push
    assert ps.pushes == 3
    with pytest.raises(ValueError, match="n_params"):
        ParameterServer(init, workers=2, update="gradient")
    with pytest.raises(ValueError, match="update"):
        ParameterServer(init, update="sum")


def test_gradient_push_replicas_follow_the_server_after_each_step() -> None:
    """Two passive workers with gradient push: each step is one server step (the same as
    one replica stepping alone on the same batches when nothing is in flight), and a
    worker's parameters are the server's right after its step."""
    torch.manual_seed(0)
    x = torch.randn(48, 4)
    init = flat_params([bottom_model(4, (8,), 3)])
    n = init.numel()
    ps = ParameterServer(init, workers=2, update="gradient", n_params=n, lr=1e-2)
    a = PassiveCompute(x, lambda: bottom_model(4, (8,), 3), ps, lr=1e-2, delta_t0=5,
                       ps_update="gradient")
    b = PassiveCompute(x, lambda: bottom_model(4, (8,), 3), ps, lr=1e-2, delta_t0=5,
                       ps_update="gradient")
    solo_ps = ParameterServer(init, workers=1)
    solo = PassiveCompute(x, lambda: bottom_model(4, (8,), 3), solo_ps, lr=1e-2,
                          delta_t0=5, sync_mode="manual")
    assert a.replica.opt is None and solo.replica.opt is not None
    g = np.ones((8, 3), np.float32)
    for step in range(4):
        w = (a, b)[step % 2]
        w.replica.pull()  # (nothing in flight: it has missed the other's step)
        rows = np.arange(step * 8, step * 8 + 8)
        graph, _ = w.forward(rows)
        w.backward(graph, g, epoch=0)
        torch.testing.assert_close(flat_params([w.bottom]), ps.pull(), rtol=0, atol=0)
        sg, _ = solo.forward(rows)
        solo.backward(sg, g, epoch=0)
    # each batch moved θ by one Adam step at the unscaled rate, as sequential training
    torch.testing.assert_close(ps.pull(), flat_params([solo.bottom]), rtol=1e-5, atol=1e-6)
