"""Broken and hostile peers (the full list: docs/explanation/architecture.md): a partner's NaN
embeddings end the run with exit code 4 naming the partner; a diverging model stops the
run instead of reporting a NaN model; malformed and foreign embeddings and gradients
published into a run by another bus client are dropped and counted, and the run completes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import torch

from parties.data import load_table
from parties.core.errors import NonFiniteTraining, PartnerMisbehaved
from pubsub import Bus
from sim.api import VflJob, train
from sim.launch.vfl import spawn_party_cli
from tests.conftest import wait_for_event
from tests.bounds import above, below


class NanBottom(torch.nn.Module):
    """A bottom model whose output is NaN (a broken partner's model)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * float("nan")


def nan_bottom(d_in: int, d_out: int) -> torch.nn.Module:
    return NanBottom(d_in, d_out)


@pytest.fixture(scope="module")
def bank_frame() -> pd.DataFrame:
    frame, _ = load_table("bank")
    return frame.sample(n=3000, random_state=0).reset_index(drop=True)


def test_a_partner_sending_nan_embeddings_ends_the_run_naming_it(
        bank_frame: pd.DataFrame, tmp_path: Path) -> None:
    job = VflJob(data=bank_frame, label="y", passive_bottom=nan_bottom,
                 config={"epochs": 2, "timeouts.t_ddl_s": 0.5, "timeouts.peer_max_bad_messages": 4,
                         "workers.mode": "inline"})
    with pytest.raises(PartnerMisbehaved) as err:
        train(job, tmp_path / "run", timeout_s=120)
    assert err.value.partner == "passive" and err.value.count == 4
    assert "not finite" in err.value.reason and err.value.publisher
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_diverging_model_stops_the_run_instead_of_reporting_nan(
        bank_frame: pd.DataFrame, tmp_path: Path) -> None:
    job = VflJob(data=bank_frame, label="y", bottom=nan_bottom, passive_bottom=None,
                 config={"epochs": 1, "workers.mode": "inline", "timeouts.t_ddl_s": 0.5})
    with pytest.raises((NonFiniteTraining, PartnerMisbehaved)) as err:
        train(job, tmp_path / "run", timeout_s=120)
    assert "not finite" in str(err.value)
    assert not (tmp_path / "run" / "metrics.json").exists()


async def _attack(address: str, run: str, n_channels: int, seconds: float) -> int:
    """Publish every kind of malformed (and one well-formed but foreign) embedding and
    gradient on the run's channels for ``seconds``; returns how many were sent."""
    rng = np.random.default_rng(0)
    good = rng.normal(size=(64, 32)).astype(np.float32)  # right shape: must still be refused
    payloads: list[tuple[list[np.ndarray], dict]] = [  # type: ignore[type-arg]
        ([good], {"e": 0, "b": 0, "u": 1}),
        ([np.full((64, 32), np.nan, np.float32)], {"e": 0, "b": 0}),
        ([np.zeros((64, 7), np.float32)], {"e": 0, "b": 0}),
        ([np.zeros((64, 32), np.float64)], {"e": 0, "b": 0}),
        ([good, good], {"e": 0, "b": 0}),
        ([good], {"e": "0", "b": None}),
        ([np.zeros((5000, 32), np.float32)], {"e": 0, "b": 0}),
    ]
    sent = 0
    async with Bus(address, name="mallory") as bus:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for b in range(n_channels):
                for kind in ("emb", "grad"):
                    arrays, meta = payloads[sent % len(payloads)]
                    bus.publish_nowait(f"{kind}/{run}/{b}", arrays, {**meta, "b": b}
                                       if isinstance(meta.get("b"), int) else meta)
                    sent += 1
            await asyncio.sleep(0.05)
    return sent


@pytest.mark.stochastic
@pytest.mark.timeout(600)
def test_foreign_and_malformed_messages_are_dropped_and_the_run_completes(
        broker, bank_frame: pd.DataFrame, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "bank.csv"
    bank_frame.to_csv(data, index=False)
    run = "victim"
    sets = [f"dataset={data}", "label=y", "epochs=3", "batch_size=64", "model.embedding_dim=32",
            "timeouts.handshake_timeout_s=60", "timeouts.connect_timeout_s=60"]
    common = ["--broker", broker.address, "--run-id", run, "--insecure", "--quiet"]
    for s in sets:
        common += ["--set", s]
    # both parties real processes (python -m parties ROLE forked from this test process's
    # party fork server), writing to this test's captured output
    capfd.readouterr()
    procs = {role: spawn_party_cli([role, *common, "--out", str(tmp_path / role)],
                                   name=f"victim-{role}")
             for role in ("passive", "active")}
    try:
        wait_for_event(tmp_path / "active" / "events.jsonl", "vfl.partner_found", 120)
        sent = asyncio.run(_attack(broker.address, run, n_channels=8, seconds=3.0))
        codes = {role: p.wait(150) for role, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
    err = capfd.readouterr().err
    assert codes == {"passive": 0, "active": 0}, (codes, err[-3000:])
    assert "Traceback" not in err
    m = orjson.loads((tmp_path / "active" / "metrics.json").read_bytes())
    assert sent > 100
    above(m["test_auc"], 0.8, "test AUC")
    for role in ("active", "passive"):
        p = m["parties"][role]
        # the attacker's messages were dropped on arrival (not the partner's client id)
        # and none of the partner's was refused
        assert p["foreign_messages"] > 0, (role, p)
        assert p["rejected_messages"] == 0 and p["rejected_by_sender"] == {}, p
