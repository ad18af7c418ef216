"""A FedForge party refuses a session that disagrees with its own configuration, and the
run releases nothing: the coordinator and the parties as asyncio tasks over one
in-memory hub (the classes the processes run), the coordinator's session with a Shamir
threshold of 1 against the parties' default floor."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from conftest import synth_table
from synth.config import EngineSection, SecAggSection, SynthConfig, TimeoutsSection


@pytest.mark.timeout(60)
def test_a_session_below_the_threshold_floor_is_refused_and_nothing_is_released(
        tmp_path: Path) -> None:
    from pubsub.memory import MemoryBroker
    from synth.aggregator import Aggregator
    from sim.launch.synth import prepare_data
    from synth.cli import read_table
    from synth.coordinator import Coordinator, CoordinatorError
    from synth.domain import Schema
    from synth.netutil import ParticipantError
    from synth.party import SynthParty
    from synth.protocol import build_tree

    csv = tmp_path / "table.csv"
    synth_table(n=300).to_csv(csv, index=False)
    cfg = SynthConfig(dataset=str(csv), label="income", parties=3, secagg=SecAggSection(fanout=2),
                      timeouts=TimeoutsSection(round_timeout_s=5.0, handshake_timeout_s=10.0),
                      engine=EngineSection(name="neural"))
    out = tmp_path / "run"
    cfg, _ = prepare_data(cfg, out)
    schema = Schema.from_dict(json.loads((out / "schema.json").read_text()))
    coord_cfg = replace(cfg, secagg=replace(cfg.secagg, threshold=1))  # parties' floor: 2 (K = 3)
    ids = cfg.party_ids()

    async def main() -> BaseException:
        async with MemoryBroker() as hub:
            coord = Coordinator(coord_cfg, schema, broker="memory", run_id="t", out=out,
                                connect=hub.connect)
            aggs = [Aggregator(a, cfg=cfg, broker="memory", run_id="t", connect=hub.connect)
                    for a in build_tree(ids, cfg.secagg.fanout,
                                        cfg.secagg.root_children).aggregators]
            parties = [SynthParty(i, read_table(out / "data" / "parties" / f"{i}.parquet"),
                                  cfg=cfg, broker="memory", run_id="t", connect=hub.connect,
                                  ledger_file=str(tmp_path / f"{i}.ledger.json"))
                       for i in ids]
            try:
                async with asyncio.timeout(50), asyncio.TaskGroup() as tg:
                    tg.create_task(coord.run())
                    for a in aggs:
                        tg.create_task(a.run())
                    for p in parties:
                        tg.create_task(p.run())
            except BaseExceptionGroup as eg:
                assert all(not p.sent.get("keys") and not p.rounds for p in parties)
                return eg
        raise AssertionError("the run went on")

    with capture_logs() as logs:
        eg = asyncio.run(main())
    errors = eg.exceptions  # type: ignore[attr-defined]
    # the parties refuse (exit code 2); in one process the first refusal cancels the
    # other tasks, so the coordinator (and a later party) may be cancelled before they
    # raise: every error raised is the refusal, with code 2
    assert errors
    for e in errors:
        assert isinstance(e, ParticipantError | CoordinatorError), repr(e)
        assert "session refused: threshold = 1" in str(e) and e.code == 2
    refused = [x for x in logs if x["event"] == "synth.session_refused"]
    assert refused and all(x["field"] == "threshold" for x in refused)
    assert not (out / "metrics.json").exists() and not (out / "synthetic.csv").exists()
    assert not list((out / "stages").glob("round_*")) if (out / "stages").exists() else True
    for i in ids:  # no party spent anything: no ledger was ever written
        assert not (tmp_path / f"{i}.ledger.json").exists()
