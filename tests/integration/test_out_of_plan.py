"""A partner's messages outside the run's plan: a copy of an embedding claiming
epoch 10^9 is dropped and counted at intake and costs no batch; a partner that keeps
sending such copies ends the run (exit 4) naming it. Both parties in this process over
the in-memory bus (:mod:`sim.launch.local`), the passive party's client publishing the
forged copies under its own client id (the partner's: only the intake can refuse them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from parties.config import DataSection, TimeoutsSection, VflConfig, WorkersSection
from parties.core.errors import PartnerMisbehaved
from parties.runtime.exitcodes import ExitCode, exit_code_for
from pubsub.memory import MemoryBroker, MemoryBus
from sim.launch.local import run_vfl_in_process

FAR = 10**9


def forging(monkeypatch: pytest.MonkeyPatch, copies: int, role: str = "passive") -> None:
    """``role``'s bus client publishes, with its first embedding (passive) or gradient
    (active), a copy of it claiming epoch ``FAR`` on each of the first ``copies``
    channels."""
    plain = MemoryBroker.connect
    kind = "emb/" if role == "passive" else "grad/"

    class Forger(MemoryBus):
        forged = False

        def publish_nowait(self, topic: str, arrays: Sequence[Any] = (),
                           meta: Any = None, *, copy: bool = True) -> int:
            n = super().publish_nowait(topic, arrays, meta, copy=copy)
            if topic.startswith(kind) and not Forger.forged and arrays:
                Forger.forged = True
                run = topic.split("/")[1]
                for c in range(copies):
                    super().publish_nowait(f"{kind}{run}/{c}", arrays,
                                           {**dict(meta), "e": FAR, "b": c})
            return n

    def connect(self: MemoryBroker, name: str = "client", *, config: Any = None) -> MemoryBus:
        if name == role:
            return Forger(self, name=name, config=config)
        return plain(self, name, config=config)

    monkeypatch.setattr(MemoryBroker, "connect", connect)


def config(max_bad: int) -> VflConfig:
    # 8 batches an epoch (the training split's 1,0xx rows); T_ddl long enough that only a bug could drop a batch here
    return VflConfig(algo="pubsub", dataset="synthetic", epochs=3, batch_size=128,
                     data=DataSection(synthetic_rows=1500, synthetic_features=8,
                                      synthetic_informative=4),
                     workers=WorkersSection(mode="inline"),
                     timeouts=TimeoutsSection(t_ddl_s=5.0, heartbeat_interval_s=0.2,
                                              peer_max_bad_messages=max_bad))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("forger", "victim"), [("passive", "active"), ("active", "passive")])
def test_a_far_future_copy_is_rejected_and_costs_no_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forger: str, victim: str) -> None:
    forging(monkeypatch, copies=6, role=forger)
    run_vfl_in_process(config(max_bad=16), tmp_path / "run", timeout_s=100)
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    hit, other = m["parties"][victim], m["parties"][forger]
    assert hit["rejected_out_of_plan"] == 6 and hit["rejected_messages"] == 6
    assert list(hit["rejected_by_sender"].values()) == [6]
    # nothing waited for, nothing dropped: every batch of every epoch trained on both sides
    planned = 3 * 8
    assert hit["batches"] == other["batches"] == planned
    assert hit["dropped_batches"] == other["dropped_batches"] == 0
    assert hit["untrained_batches"] == other["untrained_batches"] == {}
    assert other["rejected_messages"] == 0 and hit["bus"]["evicted"] == 0


@pytest.mark.timeout(120)
def test_a_partner_past_the_limit_ends_the_run_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forging(monkeypatch, copies=10)
    with pytest.raises(PartnerMisbehaved) as err:
        run_vfl_in_process(config(max_bad=4), tmp_path / "run", timeout_s=100)
    assert err.value.partner == "passive" and err.value.publisher
    assert err.value.count == 4 and f"epoch {FAR}" in err.value.reason
    assert exit_code_for(err.value) == ExitCode.PARTNER == 4
    assert not (tmp_path / "run" / "metrics.json").exists()
