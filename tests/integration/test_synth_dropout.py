"""FedForge dropout recovery over the bus: a party that misses rounds is
unmasked out, and the engine gets estimates of the all-rows marginals: the cached row
share of the party's earlier aggregate where there is one, else the survivors' sum
rescaled to all rows."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import synth_table
from synth.config import (AimSection, EngineSection, LaunchSection, SecAggSection, SynthConfig,
                          TimeoutsSection)




@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dropout_data") / "table.csv"
    synth_table().to_csv(path, index=False)
    return path


@pytest.mark.timeout(600)
def test_dropouts_in_round_0_and_the_tree_round_use_both_recovery_rules(
        csv: Path, tmp_path: Path) -> None:
    """p002 sends nothing in round 0 (its 1-way marginals were never released: the
    survivors' sum, rescaled) nor in round 2 (the tree's pairs were released with p002 in
    the all-pairs round 1: its row share of that release is added, staleness 1)."""
    from sim.launch.vfl import _stop, start_broker
    from sim.launch.synth import prepare_data
    from synth.aggregator import Aggregator
    from synth.coordinator import Coordinator
    from synth.domain import Schema
    from synth.party import SynthParty
    from synth.protocol import RoundPlan, build_tree

    class Flaky(SynthParty):
        async def _round(self, bus, plan: RoundPlan) -> None:  # type: ignore[no-untyped-def]
            if plan.round in (0, 2):
                self.rounds.append({"round": plan.round, "status": "crashed before masking"})
                return
            await super()._round(bus, plan)

    # epsilon 10: noise small enough that an all-rows sum is told from a survivors' one
    cfg = SynthConfig(dataset=str(csv), label="income", parties=5, epsilon=10.0, seed=2,
                      secagg=SecAggSection(fanout=2),
                      engine=EngineSection(name="neural", iters=100),
                      timeouts=TimeoutsSection(round_timeout_s=3.0, handshake_timeout_s=30.0))
    out = tmp_path / "run"
    out.mkdir()
    cfg, _ = prepare_data(cfg, out)
    schema = Schema.from_dict(json.loads((out / "schema.json").read_text()))
    frames = {p: pd.read_parquet(out / "data" / "parties" / f"{p}.parquet")
              for p in cfg.party_ids()}
    rows = {p: len(f) for p, f in frames.items()}
    n_all, n_s = sum(rows.values()), sum(rows.values()) - rows["p002"]
    broker, addr = start_broker(out, out / "events.jsonl")
    coord = Coordinator(cfg, schema, broker=addr, run_id="drop2", out=out)
    try:
        async def main():  # type: ignore[no-untyped-def]
            tree = build_tree(cfg.party_ids(), cfg.secagg.fanout)
            aggs = [Aggregator(a, cfg=cfg, broker=addr, run_id="drop2")
                    for a in tree.aggregators]
            ps = [(Flaky if p == "p002" else SynthParty)(p, f, cfg=cfg, broker=addr,
                                                         run_id="drop2", noise_seed=i)
                  for i, (p, f) in enumerate(frames.items())]
            return await asyncio.gather(coord.run(), *(a.run() for a in aggs),
                                        *(p.run() for p in ps))

        metrics, *_ = asyncio.run(main())
    finally:
        _stop(broker)
    rounds = metrics["rounds"]
    assert rounds["one_way"]["dropped"] == rounds["tree"]["dropped"] == ["p002"]
    assert rounds["select"]["dropped"] == []
    assert rounds["one_way"]["coverage_rows"] == rounds["tree"]["coverage_rows"] == n_s
    assert rounds["select"]["coverage_rows"] == n_all
    rec = metrics["dropout_recovery"]
    tree_pairs = [list(c) for c in metrics["tree_pairs"]]
    assert sorted(e["clique"] for e in rec["cached"]) == sorted(tree_pairs)
    assert all(e == {"round": "tree", "clique": e["clique"], "parties": ["p002"],
                     "from_round": "select", "staleness_rounds": 1} for e in rec["cached"])
    assert sorted(e["clique"] for e in rec["survivors_only"]) == sorted(
        [a] for a in schema.names)
    assert all(e["round"] == "one_way" and e["parties"] == ["p002"]
               and e["coverage_rows"] == n_s and e["rows"] == n_all
               for e in rec["survivors_only"])
    # both rules give all-rows estimates: each marginal sums to about N, not N_S
    # (p002 holds about a fifth of the rows: 6 sigma of the cell sum is far less)
    for name in ("one_way", "tree"):
        for m in coord._recovered[name].values():
            tol = 6 * m.sigma * np.sqrt(m.values.size)
            assert abs(m.values.sum() - n_all) < tol < (n_all - n_s) / 2, (name, m.clique)
    assert metrics["synthesis"]["total"] == n_all


@pytest.mark.timeout(600)
def test_a_paused_party_misses_a_round_skips_it_unpaid_and_rejoins(csv: Path,
                                                                   tmp_path: Path) -> None:
    """Real processes, one per party; p001's process is stopped (SIGSTOP) while the
    coordinator picks AIM's first adaptive pairs and resumed (SIGCONT) once that round is
    closed. The round is completed from the cache (the pairs were released with p001 in
    the all-pairs round); p001 finds the stale plan and the round's unmask queued, skips
    the round without spending budget, and counts the next round again."""
    from sim.launch.synth import run_synth
    from synth.accounting import cdp_rho

    cfg = SynthConfig(dataset=str(csv), label="income", parties=4, epsilon=1.0, mechanism="aim",
                      seed=3, noise_seed=5, secagg=SecAggSection(fanout=2),
                      aim=AimSection(rounds=2, batch=2),
                      engine=EngineSection(name="neural", iters=100),
                      timeouts=TimeoutsSection(round_timeout_s=3.0, handshake_timeout_s=60.0),
                      launch=LaunchSection(parties_per_process=1))
    res = run_synth(cfg, tmp_path / "run", timeout_s=140, quiet=True,
                    pauses=[(1, "select:aim0 started", "round:aim0 done")])
    m = res.metrics
    assert m["pauses"][0]["paused_s"] > 0
    rounds = m["rounds"]
    assert rounds["aim0"]["dropped"] == ["p001"] and rounds["aim0"]["survivors"] == 3
    assert all(rounds[r]["survivors"] == 4 for r in ("one_way", "select", "aim1"))
    assert rounds["aim0"]["coverage_rows"] == sum(m["rows"].values()) - m["rows"]["p001"]
    rec = m["dropout_recovery"]
    assert rec["survivors_only"] == []
    assert len(rec["cached"]) == rounds["aim0"]["cliques"] == 2
    assert all(e["round"] == "aim0" and e["parties"] == ["p001"]
               and e["from_round"] == "select" and e["staleness_rounds"] == 1
               for e in rec["cached"])
    # p001's own report: aim0 skipped and not paid for, aim1 counted again
    events = [json.loads(x) for x in (res.out / "events.jsonl").read_text().splitlines()
              if x.strip()]
    mine = [e for e in events if e.get("party") == "p001"]
    skipped = [e for e in mine if e["event"] == "synth.round_skipped"]
    assert [e["name"] for e in skipped] == ["aim0"]
    (done,) = [e for e in mine if e["event"] == "synth.party_done"]
    status = {r["name"]: r["status"] for r in done["rounds"] if "name" in r}
    assert status["aim0"] == "skipped: round closed while this party was away"
    assert status["aim1"] == "counted"
    paid = [what for what, _ in done["ledger"]]
    assert paid == ["round 0 (one_way)", "round 1 (select)", "round 3 (aim1)"]
    rho = cdp_rho(1.0, 1e-9)
    aim0_cost = rho * cfg.aim.split[2] / sum(cfg.aim.split) / cfg.aim.rounds
    assert done["rho_spent"] == pytest.approx(rho - aim0_cost, rel=1e-6)
    assert (res.out / "synthetic.csv").stat().st_size > 0
