"""Streaming workload updates end to end: after a FedForge run finished,
``add_workload`` reopens it, measures only the missing marginals with the stream reserve
of ρ and refits from the saved model; the parties' ledgers continue across the reopening."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from synth.config import (EngineSection, LaunchSection, SecAggSection, StreamSection, SynthConfig,
                           TimeoutsSection)
from tests.bounds import above, below

#: the mbi runs' coordinators share compiled JAX programs (conftest.jax_compile_cache)
pytestmark = pytest.mark.usefixtures("jax_compile_cache")


def _xor_table(n: int = 4000, seed: int = 0) -> pd.DataFrame:
    """z = x XOR y: every pair looks independent, only the 3-way marginal shows it (so
    the MST tree of pairs misses it and a 3-way query shows a large error before)."""
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 2, n), rng.integers(0, 2, n)
    z = np.where(rng.random(n) < 0.95, x ^ y, 1 - (x ^ y))
    w = rng.choice(["p", "q", "r"], n)
    return pd.DataFrame({"x": x, "y": y, "z": z, "w": w})


@pytest.mark.stochastic
@pytest.mark.timeout(600)
def test_add_workload_after_the_run_measures_only_what_is_missing(tmp_path: Path) -> None:
    from sim.launch.synth import add_workload, run_synth

    _xor_table().to_csv(tmp_path / "t.csv", index=False)
    cfg = SynthConfig(dataset=str(tmp_path / "t.csv"), parties=3, epsilon=4.0, seed=2, noise_seed=3,
                      secagg=SecAggSection(fanout=2), engine=EngineSection(name="mbi", iters=500),
                      stream=StreamSection(rho_frac=0.3),
                      timeouts=TimeoutsSection(round_timeout_s=10.0, handshake_timeout_s=60.0),
                      launch=LaunchSection(parties_per_process=3))
    run = tmp_path / "run"
    base = run_synth(cfg, run, timeout_s=200, quiet=True).metrics
    reserve = base["stream_rho_left"]
    assert reserve == pytest.approx(0.3 * base["rho"], rel=1e-9)
    spent0 = {p: v["rho_spent"] for p, v in base["ledger"].items()}
    assert all(v == pytest.approx(0.7 * base["rho"], rel=1e-9) for v in spent0.values())
    tree = [tuple(p) for p in base["tree_pairs"]]

    rep = add_workload(run, {"marginals": [["x", "y", "z"], list(tree[0])],
                             "rho_share": 0.5},
                       timeout_s=200, quiet=True, compare_full=True)
    m = rep.pop("metrics")
    assert rep["status"] == "measured" and rep["incremental_refit"] is True
    assert rep["missing"] == [["x", "y", "z"]]  # the tree pair was measured already
    assert [sorted(c) for c in rep["already_measured"]] == [sorted(tree[0])]
    assert rep["rho"] == pytest.approx(0.5 * reserve, rel=1e-9)
    # the 3-way interaction is learnt: the error on it drops
    above(rep["tv_before"], 0.15, "TV before the workload")
    above(rep["tv_before"] - rep["tv_after"], 0.1, "TV gained by the workload")
    assert rep["full_refit_s"] > 0 and rep["tv_after_full_refit"] is not None
    # a new session with the reopened processes; the ledgers carried on
    assert m["session"] == 1 and m["stream_rho_left"] == pytest.approx(0.5 * reserve)
    for p, led in m["ledger"].items():
        assert led["rho_spent"] == pytest.approx(spent0[p] + 0.5 * reserve, rel=1e-9)
        assert led["entries"][-1] == "round 3 (wl0)" and len(led["entries"]) == 4
    assert m["ledger_within_plan"] is True
    applied = list((run / "workload" / "applied").glob("*.json"))
    assert len(applied) == 1 and json.loads(applied[0].read_text())["report"]["name"] == "wl0"
    assert not list((run / "workload" / "pending").glob("*.json"))
    assert [u["name"] for u in m["workload_updates"]] == ["wl0"]
    assert m["reopened"] == 1 and m["restarts"] == 0 and m["wall_s"] == base["wall_s"]
    # asking again for what is measured changes nothing and reopens nothing
    before = (run / "synthetic.csv").read_bytes()
    again = add_workload(run, {"marginals": [["x", "y", "z"]]}, timeout_s=60, quiet=True)
    assert again["status"] == "nothing to measure" and again["reopened"] is False
    assert (run / "synthetic.csv").read_bytes() == before


@pytest.mark.timeout(600)
def test_a_session_of_queries_shares_its_keys_and_one_seed_batch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``psfl synth run --queries FILE``: workload updates queued before the run are
    queries of the same session: one key exchange, one seed batch covering every query's
    rounds (each round its own seeds), the bytes split into fixed and per-query figures
    that add up to the broker's count, every party's ledger equal to what the coordinator
    counted; an update refused (the reserve used up) is printed and ends the run with
    exit 1, its synthesis written."""
    from sim import cli

    _xor_table(2000).to_csv(tmp_path / "t.csv", index=False)
    updates = [{"marginals": [["x", "y", "z"]], "rho_share": 0.5},
               {"marginals": [["x", "z", "w"], ["y", "z", "w"]], "rho_share": 1.0},
               {"marginals": [["x", "y", "w"]]}]  # nothing left of the reserve
    (tmp_path / "q.json").write_text(json.dumps(updates))
    run = tmp_path / "run"
    code = cli.main(["synth", "run", "--dataset", str(tmp_path / "t.csv"), "--parties", "3",
                     "--epsilon", "4", "--out", str(run), "--queries", str(tmp_path / "q.json"),
                     "--insecure", "--timeout-s", "200",
                     *[a for kv in ("seed=2", "noise_seed=3", "secagg.fanout=2",
                                    "engine.name=mbi", "engine.iters=200",
                                    "stream.rho_frac=0.3", "timeouts.round_timeout_s=10",
                                    "launch.parties_per_process=3") for a in ("--set", kv)]])
    out = capsys.readouterr()
    assert code == 1, out.err[-2000:]
    assert "query wl0: measured" in out.out and "query wl2: refused" in out.out
    assert "1 update(s) refused (wl2)" in out.err and "Traceback" not in out.err
    assert (run / "synthetic.csv").exists()
    m = json.loads((run / "metrics.json").read_text())
    assert [u["status"] for u in m["workload_updates"]] == ["measured", "measured", "refused"]
    stages = m["bytes_wire_by_stage"]
    assert [s for s in stages if s.startswith("keys")] == ["keys"]
    assert [s for s in stages if s.startswith("seeds")] == ["seeds:0"]  # one batch
    seeds = json.loads((run / "stages" / "seeds_0.json").read_text())
    assert len(seeds["rounds"]) == len(set(seeds["rounds"])) == 3 + 3
    q = m["bytes_wire_by_query"]
    assert set(q) == {"release", "wl0", "wl1"} and m["queries"] == 3
    assert all(v["bytes_wire"] > 0 and v["bytes_naive"] > 0 for v in q.values())
    assert m["bytes_wire_session_fixed"] + sum(v["bytes_wire"] for v in q.values()) \
        == m["bytes_wire"]
    assert m["wire_over_naive_per_query"] == pytest.approx(m["bytes_wire"] / m["bytes_naive"])
    for p, led in m["ledger"].items():
        assert led["rho_spent"] == pytest.approx(m["rho_spent"][p], rel=1e-9)
    assert m["stream_rho_left"] == pytest.approx(0.0, abs=1e-12)
