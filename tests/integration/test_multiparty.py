"""PubSub-VFL with several passive parties (docs/dev/multiparty.md): every
algorithm trains in process over the in-memory bus; a three-party run through a CURVE
broker as real processes; a passive party that dies or never comes is named in the
active party's error; bad column lists are refused before anything starts."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import orjson
import pandas as pd
import pytest

from parties.config import DataSection, DpSection, TimeoutsSection, VflConfig, WorkersSection
from parties.core.errors import HandshakeTimeout
from sim.launch.vfl import spawn_party_cli
from tests.conftest import bank_sample_csv, psfl_in_process, wait_for_event


@pytest.fixture(scope="module")
def bank_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bank_sample_csv(tmp_path_factory, 4000)


def _metrics(out: Path) -> dict:
    return orjson.loads((out / "metrics.json").read_bytes())


@pytest.mark.parametrize(("algo", "fuse"), [("pubsub", "concat"), ("vfl", "concat"),
                                            ("vfl-ps", "mean"), ("avfl", "sum"),
                                            ("avfl-ps", "concat")])
def test_every_algorithm_trains_with_three_passive_parties_in_process(
        bank_sample: Path, tmp_path: Path, algo: str, fuse: str) -> None:
    from sim.launch.local import run_vfl_in_process

    cfg = VflConfig(dataset=str(bank_sample), label="y", algo=algo, epochs=3, batch_size=128,
                    lr=3e-3, passive_parties=3, fuse=fuse, seed=0,
                    workers=WorkersSection(mode="thread"))
    run_vfl_in_process(cfg, tmp_path)
    m = _metrics(tmp_path)
    parties = ("active", "passive", "passive2", "passive3")
    assert sorted(m["parties"]) == sorted(parties)
    assert 0.7 < m["test_auc"] <= 1.0, m["test_auc"]
    assert m["reports_missing"] == [] and not m["passive_report_missing"]
    cols = [set(m["parties"][p]["columns"]) for p in parties]
    assert all(cols) and sum(len(c) for c in cols) == len(set().union(*cols)) == 16
    for p in parties:
        assert m["parties"][p]["party"] == p
        assert (tmp_path / "model" / p / "weights.pt").is_file()
    assert "missed_by_party" in m["parties"]["active"]
    # every passive party trained every batch the active party trained
    active_batches = m["parties"]["active"]["batches"]
    if algo != "vfl-ps":  # (vfl-ps counts a batch per party once, in its first pair)
        assert all(m["parties"][p]["batches"] == active_batches for p in parties[1:])


def test_a_missing_passive_party_is_named_by_the_handshake(bank_sample: Path,
                                                          tmp_path: Path) -> None:
    """Only the active party and the first passive party start: the active party's
    handshake times out naming the absent one."""
    from parties.runtime.serve import serve_party
    from pubsub.memory import MemoryBroker

    cfg = VflConfig(dataset=str(bank_sample), label="y", epochs=1, passive_parties=2,
                    timeouts=TimeoutsSection(handshake_timeout_s=2.0),
                    workers=WorkersSection(mode="inline"))

    async def main() -> None:
        async with MemoryBroker() as hub:
            passive = asyncio.create_task(serve_party("passive", cfg, run_id="m", out=None,
                                                      connect=hub.connect))
            try:
                await serve_party("active", cfg, run_id="m", out=None, connect=hub.connect)
            finally:
                passive.cancel()
                with pytest.raises((asyncio.CancelledError, HandshakeTimeout)):
                    await passive

    with pytest.raises(HandshakeTimeout, match="passive2"):
        asyncio.run(main())


def test_three_parties_through_a_curve_broker_as_processes(
        bank_sample: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    res = psfl_in_process(capfd, "vfl", "run", "--dataset", str(bank_sample), "--out",
                          str(tmp_path), "--set", "label=y", "--set", "passive_parties=2",
                          "--set", "epochs=3", "--set", "batch_size=128", "--set", "lr=3e-3",
                          "--set", "timeouts.connect_timeout_s=60")
    assert res.returncode == 0, res.stderr[-2000:]
    m = _metrics(tmp_path)
    assert m["security"]["transport"] == "curve"
    assert sorted(m["parties"]) == ["active", "passive", "passive2"]
    assert 0.7 < m["test_auc"] <= 1.0
    assert (tmp_path / "passive2.json").is_file() and (tmp_path / "timeline-passive2.json").is_file()
    # each passive party published embeddings (bytes by topic namespace)
    for p in ("passive", "passive2"):
        assert m["parties"][p]["bytes_sent"]["emb"] > 0, m["parties"][p]["bytes_sent"]
    # prediction: one process per party (each its own key; the broker's run membership
    # keeps each passive party's topics its own) reproduces the run's test AUC
    pred = tmp_path / "pred"
    res = psfl_in_process(capfd, "vfl", "predict", str(tmp_path), "--out", str(pred),
                          "--timeout-s", "200")
    assert res.returncode == 0, res.stderr[-2000:]
    s = orjson.loads((pred / "predict.json").read_bytes())
    assert s["test_auc"] == pytest.approx(m["test_auc"], abs=1e-6)
    assert s["parties"] == ["active", "passive", "passive2"]
    assert sorted(s["dp_by_party"]) == ["passive", "passive2"] and not s["dp"]["enabled"]
    assert 'owned = ["passive", "passive2"]' in (pred / "members.toml").read_text()
    # and in process (sim.api.predict over the in-memory bus): the same predictions
    from sim.api import predict

    mem = predict(tmp_path, tmp_path / "pred_mem", transport="memory")
    assert mem.summary["test_auc"] == pytest.approx(m["test_auc"], abs=1e-6)
    a, b = (pd.read_csv(d / "predictions.csv") for d in (pred, tmp_path / "pred_mem"))
    assert a["row"].tolist() == b["row"].tolist() and len(a) == s["rows"]
    assert (a["prediction"] - b["prediction"]).abs().max() < 1e-6


def test_a_dead_passive_party_is_named_in_the_active_partys_error(
        broker, bank_sample: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    liveness = 2.0
    sets = [f"dataset={bank_sample}", "label=y", "epochs=1000", "batch_size=64",
            "passive_parties=2", f"timeouts.liveness_timeout_s={liveness}",
            "timeouts.heartbeat_interval_s=0.25", "timeouts.handshake_timeout_s=60"]
    common = ["--broker", broker.address, "--run-id", "kill-mp", "--insecure"]
    for s in sets:
        common += ["--set", s]
    capfd.readouterr()
    procs = {p: spawn_party_cli([p, *common, "--out", str(tmp_path / p), "--quiet"],
                                name=f"kill-{p}")
             for p in ("passive", "passive2", "active")}
    try:
        wait_for_event(tmp_path / "active" / "events.jsonl", "vfl.epoch_done", 90)
        assert all(p.poll() is None for p in procs.values())
        os.kill(procs["passive2"].pid, signal.SIGKILL)
        t_kill = time.monotonic()
        code = procs["active"].wait(liveness + 30)
        # the other passive party hears the active party's abort and stops too, naming
        # the lost one (it does not wait for its own liveness timeout on the active)
        other = procs["passive"].wait(30)
        err = capfd.readouterr().err
        assert code == 4 and other == 4, err[-2000:]
        assert "Traceback" not in err, err[-2000:]
        lines = [ln for ln in err.splitlines() if ln.startswith("error (")]
        assert any(ln.startswith("error (active party)") and "passive2" in ln for ln in lines)
        assert any(ln.startswith("error (passive party)") and "passive2" in ln for ln in lines)
        assert time.monotonic() - t_kill < liveness + 15
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)


@pytest.mark.parametrize(("sets", "named"), [
    (["passive_parties=2", "data.active_columns=age,job", "data.passive_party_columns=[]"],
     "passive_party_columns"),
    (["passive_parties=3", "data.passive_columns=age"], "passive_columns"),
    (["passive_parties=2", "fuse=max"], "fuse"),
])
def test_bad_multiparty_settings_are_refused_before_anything_starts(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], sets: list[str], named: str) -> None:
    args = ["vfl", "run", "--dataset", "bank", "--out", str(tmp_path)]
    for s in sets:
        args += ["--set", s]
    res = psfl_in_process(capfd, *args)
    assert res.returncode == 2, res.stderr[-1000:]
    assert named in res.stderr and "Traceback" not in res.stderr


def test_a_column_of_two_passive_parties_names_both(tmp_path: Path) -> None:
    from parties.data import InvalidSplit
    from parties.data.preflight import preflight

    cfg = VflConfig(dataset="bank", passive_parties=2,
                    data=DataSection(active_columns=("age", "job"), passive_party_columns=(("balance", "day"), ("day", "month"))))
    with pytest.raises(InvalidSplit, match="both the passive and the passive2 party: \\['day'\\]"):
        preflight(cfg)


def test_three_parties_by_hand_with_keys_and_a_run_membership(
        bank_sample: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """As docs/tutorials/several-parties.md shows for several hosts: keys for each party id (passive2 with the
    passive role), a broker with those keys and the run's membership, and each party
    started by hand (``python -m parties PARTY_ID --keys DIR``)."""
    from pubsub.membership import membership
    from pubsub.security import generate_certificate
    from tests.conftest import BrokerProcess

    keys = tmp_path / "keys"
    generate_certificate(keys, "broker")
    for name, role in (("active", "active"), ("passive", "passive"),
                       ("passive2", "passive")):
        generate_certificate(keys, name, role=role)
    members = tmp_path / "members.toml"
    members.write_text(membership({"r3": ["active", "passive", "passive2"]},
                                  {"r3": ["passive", "passive2"]}).as_toml())
    b = BrokerProcess(tmp_path, "--members", str(members), keys=keys)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[vfl]\ndataset = "{bank_sample}"\nlabel = "y"\npassive_parties = 2\n'
                   'epochs = 2\nbatch_size = 128\nlr = 3e-3\ntimeouts.connect_timeout_s = 60.0\n')
    capfd.readouterr()
    procs = {p: spawn_party_cli([p, "--broker", b.address, "--keys", str(keys), "--run-id",
                                 "r3", "--config", str(cfg), "--out", str(tmp_path / p),
                                 "--quiet"], name=f"hand-{p}")
             for p in ("passive2", "passive", "active")}
    try:
        codes = {p: proc.wait(240) for p, proc in procs.items()}
        err = capfd.readouterr().err
        assert codes == {"passive2": 0, "passive": 0, "active": 0}, err[-2000:]
        m = _metrics(tmp_path / "active")
        assert m["security"]["transport"] == "curve" and m["security"]["identity"] == "active"
        assert sorted(m["parties"]) == ["active", "passive", "passive2"]
        assert 0.7 < m["test_auc"] <= 1.0
        assert (tmp_path / "passive2" / "passive2.json").is_file()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
        b.stop()


def test_each_passive_party_keeps_its_own_privacy_ledger(tmp_path: Path) -> None:
    """DP on: every passive party calibrates, clips and noises its own embeddings from its
    own columns' public schema, and reports its own guarantee (dp_by_party)."""
    from sim.launch.local import run_vfl_in_process

    cfg = VflConfig(dataset="bank", algo="pubsub", epochs=1, batch_size=256, passive_parties=2,
                    eval_every=1, dp=DpSection(mu=8.0, noise_seed=1),
                    workers=WorkersSection(mode="inline"))
    run_vfl_in_process(cfg, tmp_path)
    m = _metrics(tmp_path)
    by = m["dp_by_party"]
    assert sorted(by) == ["passive", "passive2"]
    for p in ("passive", "passive2"):
        assert by[p]["enabled"] and 0 < by[p]["mu"] <= 8.0 + 1e-9, by[p]
        assert m["parties"][p]["feature_encoding"] == "public_schema"
    # the first passive party's guarantee, and the active party's own label protection
    assert {k: v for k, v in m["dp"].items() if k != "labels"} == by["passive"]
    assert m["dp"]["labels"] == "unprotected"
    # prediction: each passive party noises its own release and charges its own ledger
    from sim.launch.local import predict_in_process

    s = predict_in_process(tmp_path, tmp_path / "pred").summary
    assert sorted(s["dp_by_party"]) == ["passive", "passive2"]
    assert s["dp"] == s["dp_by_party"]["passive"]
    for p in ("passive", "passive2"):
        dp = s["dp_by_party"][p]
        assert dp["enabled"] and dp["continues"] == "test" and dp["publications_max_test"] == 2
        assert dp["mu"] >= by[p]["mu"] - 1e-9
        led = orjson.loads((tmp_path / "model" / p / "ledger.json").read_bytes())
        assert len(led["predictions"]) == 1 and max(led["counts"]["test"]) == 2


def test_a_plan_gives_each_passive_party_its_own_workers(
        bank_sample: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``psfl vfl run --plan PLAN.json`` with two passive parties: each runs its planned
    count, and metrics.json records the plan; a plan for another number of passive
    parties is refused naming vfl.passive_parties."""
    plan = tmp_path / "plan.json"
    plan.write_text(orjson.dumps({"w_active": 2, "w_passive": 1,
                                  "passive_party_workers": [1, 3], "batch_size": 256,
                                  "epoch_s": 0.5, "profile": "hand-made"}).decode())
    common = ["vfl", "run", "--transport", "memory", "--dataset", str(bank_sample),
              "--set", "label=y", "--set", "passive_parties=2", "--set", "epochs=1",
              "--set", "workers.mode=inline", "--plan", str(plan)]
    res = psfl_in_process(capfd, *common, "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "passive_party_workers [1, 3]" in res.stdout and "workers 2+1+3" in res.stdout
    m = _metrics(tmp_path / "run")
    assert m["config"]["workers"]["per_passive_party"] == [1, 3]
    assert m["config"]["batch_size"] == 256
    assert [m["parties"][p]["workers"] for p in ("active", "passive", "passive2")] == [2, 1, 3]
    assert m["plan"]["passive_party_workers"] == [1, 3]
    res = psfl_in_process(capfd, *common[:-4], "--set", "passive_parties=3",
                          "--plan", str(plan), "--out", str(tmp_path / "bad"))
    assert res.returncode == 2 and "vfl.passive_parties" in res.stderr, res.stderr[-500:]


def test_a_two_party_run_with_a_mean_fuse_predicts_its_own_test_auc(bank_sample: Path,
                                                                    tmp_path: Path) -> None:
    from sim.launch.local import predict_in_process, run_vfl_in_process

    cfg = VflConfig(dataset=str(bank_sample), label="y", epochs=2, batch_size=128, lr=3e-3,
                    fuse="mean", workers=WorkersSection(mode="inline"))
    run_vfl_in_process(cfg, tmp_path / "run")
    m = _metrics(tmp_path / "run")
    res = predict_in_process(tmp_path / "run", tmp_path / "pred")
    assert res.summary["test_auc"] == pytest.approx(m["test_auc"], abs=1e-6)


@pytest.fixture(scope="module")
def three_party_run(bank_sample: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small run with two passive parties, trained in process (its saved parts)."""
    from sim.launch.local import run_vfl_in_process

    run = tmp_path_factory.mktemp("mp") / "run"
    cfg = VflConfig(dataset=str(bank_sample), label="y", epochs=1, batch_size=128, lr=3e-3,
                    passive_parties=2, fuse="sum", workers=WorkersSection(mode="inline"))
    run_vfl_in_process(cfg, run)
    return run


def _predict_by_hand(dirs: dict[str, Path], out: Path, timeout_s: float,
                     stall: str | None = None) -> dict:  # type: ignore[type-arg]
    """The prediction's parties in this process, each loading its part from its own run
    directory (as parties started by hand on their own hosts); ``stall``: a passive
    party that meets the active party but never publishes its embeddings."""
    from parties.runtime.predict import PredictParty
    from pubsub.memory import MemoryBroker
    from sim.launch.local import run_predict_parties

    class Stalled(PredictParty):
        async def _passive(self, bus):  # type: ignore[no-untyped-def]
            await asyncio.sleep(3 * timeout_s)

    async def main() -> dict:  # type: ignore[type-arg]
        async with MemoryBroker() as hub:
            parties = {p: (Stalled if p == stall else PredictParty)(
                p, d, run_id="byhand", out=out if p == "active" else None,
                timeout_s=timeout_s, connect=hub.connect) for p, d in dirs.items()}
            return await run_predict_parties(parties)

    return asyncio.run(main())


def test_a_part_of_another_run_among_the_passive_parties_is_refused_naming_it(
        three_party_run: Path, tmp_path: Path) -> None:
    from parties.core.errors import PartnerStalled
    from parties.runtime.saved import SavedModelMismatch
    from sim.api import predict

    run = three_party_run
    other = tmp_path / "other"
    shutil.copytree(run, other)
    mpath = other / "model" / "passive2" / "manifest.json"
    mpath.write_bytes(orjson.dumps({**orjson.loads(mpath.read_bytes()), "run_id": "someother"}))
    # before anything starts: the launcher checks every party's manifest
    with pytest.raises(SavedModelMismatch, match="passive2 party.*someother") as ei:
        predict(other, tmp_path / "refused")
    assert ei.value.party == "passive2"
    assert not (tmp_path / "refused").exists()
    # parties started by hand: the active party's handshake refuses it, naming it
    dirs = {"passive": run, "passive2": other, "active": run}
    with pytest.raises(SavedModelMismatch, match="passive2 party.*someother") as ei:
        _predict_by_hand(dirs, tmp_path / "byhand", timeout_s=10.0)
    assert ei.value.party == "passive2"
    assert not (tmp_path / "byhand" / "predictions.csv").exists()
    # one that never comes, or meets the active party but sends nothing: named at the
    # deadline
    with pytest.raises(HandshakeTimeout, match="passive2"):
        _predict_by_hand({"passive": run, "active": run}, tmp_path / "byhand", timeout_s=1.0)
    with pytest.raises(PartnerStalled, match="passive2") as es:
        _predict_by_hand({"passive": run, "passive2": run, "active": run},
                         tmp_path / "byhand", timeout_s=1.0, stall="passive2")
    assert es.value.partner == "passive2"
