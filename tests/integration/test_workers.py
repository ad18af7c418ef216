"""Worker handles: process and thread workers compute the same thing; a dead worker is an error."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import asyncio

import numpy as np
import pytest
import torch

from parties.config import DpSection, ModelSection, VflConfig, WorkersSection
from parties.models.model import ParameterServer, bottom_model, flat_params, top_model
from parties.models.model import ActiveCompute
from parties.runtime.workers import InlineWorker, ProcessWorker, ThreadWorker, WorkerFailed

CFG = VflConfig(batch_size=32, seed=1, model=ModelSection(embedding_dim=8, bottom_hidden=(16,)))


def _setup(tmp_path: Path) -> tuple[np.ndarray, ParameterServer]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 5)).astype(np.float32)
    np.save(tmp_path / "x_train.npy", x)
    ps = ParameterServer(flat_params([bottom_model(5, (16,), 8)]))
    return x, ps


async def test_process_worker_matches_thread_worker_and_syncs_with_the_ps(tmp_path: Path) -> None:
    x, ps = _setup(tmp_path)
    proc = ProcessWorker("passive", 0, CFG, tmp_path, ps)
    thread = ThreadWorker("passive", CFG, x, None, ps)
    await proc.start()
    await thread.start()
    try:
        e_proc = await proc.forward(0, 1)
        e_thread = await thread.forward(0, 1)
        assert e_proc.shape == (32, 8) and e_proc.dtype == np.float32
        np.testing.assert_allclose(e_proc, e_thread, atol=1e-6)
        v0 = ps.version
        await proc.backward(0, 1, np.ones((32, 8), np.float32))
        assert ps.version == v0 + 1  # ΔT_0 = 1: every step is pushed to the PS
        assert proc.compute_s > 0
    finally:
        await proc.close()
        await thread.close()
        await proc.close()  # idempotent


async def test_inline_worker_matches_thread_worker(tmp_path: Path) -> None:
    """Same replica seed, same batches: the inline worker computes exactly what a thread
    worker does (passive forward/backward and the active step with its early gradient)."""
    x, _ = _setup(tmp_path)
    y = (x[:, 0] > 0).astype(np.float32)
    grads: dict[str, list[np.ndarray]] = {"thread": [], "inline": []}
    out: dict[str, tuple[np.ndarray, float, np.ndarray]] = {}
    for name, kind in (("thread", ThreadWorker), ("inline", InlineWorker)):
        torch.manual_seed(3)
        ps_p = ParameterServer(flat_params([bottom_model(5, (16,), 8)]))
        mods = [bottom_model(5, (16,), 8), top_model(8, (32,))]
        ps_a = ParameterServer(flat_params(mods))
        passive = kind("passive", CFG, x, None, ps_p)
        active = kind("active", CFG, x, y, ps_a)
        assert isinstance(active.compute, ActiveCompute)
        try:
            emb = await passive.forward(0, 1)
            await active.prefetch(0, 1)
            loss, grad = await active.step(0, 1, emb, on_grad=grads[name].append)
            await asyncio.sleep(0.01)  # the thread worker's early gradient is scheduled
            await passive.backward(0, 1, grad)
            out[name] = (emb, loss, ps_p.pull().numpy())
        finally:
            await passive.close()
            await active.close()
    np.testing.assert_allclose(out["inline"][0], out["thread"][0], atol=1e-6)
    assert out["inline"][1] == pytest.approx(out["thread"][1], abs=1e-6)
    np.testing.assert_allclose(out["inline"][2], out["thread"][2], atol=1e-6)
    assert len(grads["inline"]) == len(grads["thread"]) == 1
    np.testing.assert_allclose(grads["inline"][0], grads["thread"][0], atol=1e-6)


async def test_dead_worker_process_raises_within_seconds(tmp_path: Path) -> None:
    _, ps = _setup(tmp_path)
    w = ProcessWorker("passive", 3, CFG, tmp_path, ps)
    await w.start()
    try:
        assert w._proc is not None
        os.kill(w._proc.pid, signal.SIGKILL)
        t0 = time.perf_counter()
        with pytest.raises(WorkerFailed) as ei:
            await w.forward(0, 0)
        assert time.perf_counter() - t0 < 5.0
        assert ei.value.worker == 3
    finally:
        await w.close()


async def test_both_worker_modes_clip_and_noise_what_they_publish(tmp_path: Path) -> None:
    """With DP on, thread and process workers publish the clipped, noised embedding (the
    same one for the same secret seed), and the backward step goes through the clipping."""
    x, ps = _setup(tmp_path)
    clip, sigma = 0.05, 0.01
    cfg = VflConfig(batch_size=32, seed=1,
                    model=ModelSection(embedding_dim=8, bottom_hidden=(16,)),
                    dp=DpSection(noise_multiplier=sigma, sgd_noise_multiplier=1.0, clip_norm=clip))
    plain = ThreadWorker("passive", CFG, x, None, ps)
    proc = ProcessWorker("passive", 0, cfg, tmp_path, ps, noise_seed=11)
    thread = ThreadWorker("passive", cfg, x, None, ps, noise_seed=11)
    other = ThreadWorker("passive", cfg, x, None, ps, noise_seed=12)
    await proc.start()
    try:
        raw = await plain.forward(0, 1)
        e_proc = await proc.forward(0, 1)
        e_thread = await thread.forward(0, 1)
        e_other = await other.forward(0, 1)
        np.testing.assert_allclose(e_proc, e_thread, atol=1e-6)
        assert not np.allclose(e_other, e_thread)
        assert np.linalg.norm(raw, axis=1).max() > 2 * clip  # clipping really bites here
        # published = clip(raw) + N(0, (σC)²): row norms stay near C
        noise_bound = 6 * sigma * clip * np.sqrt(8)
        assert np.linalg.norm(e_proc, axis=1).max() <= clip + noise_bound
        v0 = ps.version
        await proc.backward(0, 1, np.ones((32, 8), np.float32))
        await thread.backward(0, 1, np.ones((32, 8), np.float32))
        assert ps.version == v0 + 2
    finally:
        for w in (proc, plain, thread, other):
            await w.close()


def test_dp_without_a_noise_seed_is_refused(tmp_path: Path) -> None:
    x, ps = _setup(tmp_path)
    with pytest.raises(ValueError, match="noise seed"):
        ThreadWorker("passive", VflConfig(dp=DpSection(mu=1.0)), x, None, ps)


async def test_a_process_worker_idle_for_seconds_still_answers(tmp_path: Path) -> None:
    """A worker with nothing to do for a few seconds (its partner is slow to start) keeps
    serving: its orphan check looks for the party process, not for its own parent (the
    fork server). Before, it quit after one idle second and the party then waited."""
    _, ps = _setup(tmp_path)
    w = ProcessWorker("passive", 1, CFG, tmp_path, ps)
    await w.start()
    try:
        await asyncio.sleep(2.5)
        assert w._proc is not None and w._proc.is_alive()
        emb = await w.forward(0, 0)
        assert emb.shape == (32, 8)
    finally:
        await w.close()


async def test_a_process_worker_steps_the_shared_top_at_the_party_ps(tmp_path: Path) -> None:
    """``top_update = "shared"``: an active process worker's top step is done by the
    parent's PS (an RPC over the worker socket), as a thread worker's is in process."""
    x, _ = _setup(tmp_path)
    y = (x[:, 0] > 0).astype(np.float32)
    np.save(tmp_path / "y_train.npy", y)
    cfg = VflConfig(batch_size=32, seed=1, algo="pubsub",
                    model=ModelSection(embedding_dim=8, bottom_hidden=(16,), top_hidden=(32,)),
                    workers=WorkersSection(active=2, top_update="shared"))
    assert cfg.shares_top()
    emb = np.random.default_rng(5).normal(size=(32, 8)).astype(np.float32)
    out = {}
    for name in ("thread", "process"):
        torch.manual_seed(3)
        mods = [bottom_model(5, (16,), 8), top_model(8, (32,))]
        ps = ParameterServer(flat_params(mods), workers=2)
        ps.share_top(top_model(8, (32,)), offset=sum(p.numel() for p in mods[0].parameters()),
                     lr=cfg.lr)
        worker = (ThreadWorker("active", cfg, x, y, ps) if name == "thread"
                  else ProcessWorker("active", 0, cfg, tmp_path, ps))
        await worker.start()
        try:
            await worker.prefetch(0, 1)
            loss, grad = await worker.step(0, 1, emb)
            out[name] = (loss, np.array(grad), ps.pull().numpy(), ps.top_steps)
        finally:
            await worker.close()
    assert out["process"][3] == out["thread"][3] == 1
    assert out["process"][0] == pytest.approx(out["thread"][0], abs=1e-6)
    np.testing.assert_allclose(out["process"][1], out["thread"][1], atol=1e-6)
    np.testing.assert_allclose(out["process"][2], out["thread"][2], atol=1e-6)
