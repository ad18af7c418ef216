"""The job file of a cross-organisation run, each party's own-file checks, and the
bank-and-partner scenario generator (pure: no process, no socket)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from parties.alignment.own_file import with_own_rows_file
from parties.config import load_job, vfl_config
from parties.data import DataError, EmptyColumn, InvalidSplit, UnknownColumn
from parties.data.bank_partner import (BANK_COLUMNS, JOIN_KEY, LABEL, PARTNER_COLUMNS,
                                       make_bank_partner)
from parties.data.launchcheck import check_own_file
from parties.data.stream import own_columns
from pubsub.config import ConfigError

JOB = """
[job]
run_id = "bank-partner"
broker = "tcp://10.77.0.1:5555"
join_key = "customer_id"
organisations = ["bank", "partner"]

[vfl]
label = "responded"
epochs = 2
"""


def _job(tmp_path: Path, text: str = JOB, name: str = "job.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_job_file_gives_the_run_its_join_key_and_each_party_its_own_file(tmp_path: Path) -> None:
    job = load_job(_job(tmp_path), ["dp.mu=8"], data="partner.csv")
    assert job.job.broker == "tcp://10.77.0.1:5555" and job.job.run_id == "bank-partner"
    assert job.vfl.data.join_key == "customer_id" and job.vfl.dataset == "partner.csv"
    assert job.vfl.dp.mu == 8.0 and job.organisation("passive") == "partner"
    # the file's digest: the same for both organisations whatever their own file and sets
    assert load_job(_job(tmp_path), data="bank.csv").digest == job.digest
    other = load_job(_job(tmp_path, JOB.replace("epochs = 2", "epochs = 3")))
    assert other.digest != job.digest
    # the join key is a shared setting: parties with other keys refuse at the handshake
    shared = job.vfl.shared_settings(100)
    assert shared["join_key"] == "customer_id"
    assert vfl_config({"epochs": 2, "label": "responded"}).shared_settings(100)["digest"] \
        != shared["digest"]


@pytest.mark.parametrize("edit, key", [
    (("[job]\n", "[job]\nnope = 1\n"), "job.nope"),
    (('broker = "tcp://10.77.0.1:5555"', 'broker = "10.77.0.1:5555"'), "job.broker"),
    (('broker = "tcp://10.77.0.1:5555"', 'broker = "tcp://h:70000"'), "job.broker"),
    (('run_id = "bank-partner"', 'run_id = "a b"'), "job.run_id"),
    (('join_key = "customer_id"', 'join_key = ""'), "job.join_key"),
    (('organisations = ["bank", "partner"]', 'organisations = ["bank"]'), "job.organisations"),
    (('organisations = ["bank", "partner"]', 'organisations = ["x", "x"]'), "job.organisations"),
    (("epochs = 2", "epochs = -1"), "vfl.epochs"),
    (("epochs = 2", 'epochs = 2\n[vfl.data]\njoin_key = "other"'), "vfl.data.join_key"),
    (("[vfl]", "[synth]\n[vfl]"), "synth"),
])
def test_a_bad_job_file_is_refused_naming_the_key(tmp_path: Path, edit: tuple[str, str],
                                                  key: str) -> None:
    text = JOB.replace(*edit)
    assert text != JOB
    with pytest.raises(ConfigError) as ei:
        load_job(_job(tmp_path, text))
    assert ei.value.key == key


def test_a_job_file_without_its_job_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no \[job\] table"):
        load_job(_job(tmp_path, "[vfl]\nepochs = 1\n"))


def _files(tmp_path: Path, n: int = 300) -> tuple[Path, Path]:
    t = make_bank_partner(n, new_customers=0, seed=1)
    bank, partner = tmp_path / "bank.csv", tmp_path / "partner.csv"
    t.bank.to_csv(bank, index=False)
    t.partner.to_csv(partner, index=False)
    return bank, partner


def test_each_party_checks_its_own_file_before_joining(tmp_path: Path) -> None:
    bank, partner = _files(tmp_path)
    job = _job(tmp_path)
    assert check_own_file(load_job(job, data=str(bank)).vfl, "active") == BANK_COLUMNS
    assert check_own_file(load_job(job, data=str(partner)).vfl, "passive") == PARTNER_COLUMNS
    # the bank's file as the partner's: it holds the label
    with pytest.raises(InvalidSplit, match="holds the label 'responded'"):
        check_own_file(load_job(job, data=str(bank)).vfl, "passive")
    # the partner's file as the bank's: no label
    with pytest.raises(UnknownColumn) as ei:
        check_own_file(load_job(job, data=str(partner)).vfl, "active")
    assert list(ei.value.columns) == [LABEL]
    # another join key, a named column missing, an empty column: each named
    other_key = _job(tmp_path, JOB.replace('join_key = "customer_id"', 'join_key = "cid"'),
                     "other.toml")
    with pytest.raises(UnknownColumn) as ei:
        check_own_file(load_job(other_key, data=str(partner)).vfl, "passive")
    assert list(ei.value.columns) == ["cid"]
    frame = pd.read_csv(partner)
    frame["spend_90d"] = float("nan")
    frame.to_csv(partner, index=False)
    with pytest.raises(EmptyColumn, match="spend_90d"):
        check_own_file(load_job(job, data=str(partner)).vfl, "passive")
    with pytest.raises(DataError, match="bundled dataset"):
        check_own_file(load_job(job, data="bank").vfl, "active")


def test_the_join_key_is_never_a_feature() -> None:
    cfg = vfl_config({"label": "y", "data.join_key": "id"})
    assert own_columns(cfg, "passive", ["id", "a", "b"]) == ("a", "b")
    assert own_columns(cfg, "active", ["id", "c", "y"]) == ("c",)
    # the own aligned-rows file of each party id
    assert with_own_rows_file(cfg, "active", "al/a.csv").data.active_rows_file == "al/a.csv"
    assert with_own_rows_file(cfg, "passive", "al/p.csv").data.passive_rows_file == "al/p.csv"
    three = vfl_config({"label": "y", "passive_parties": 2})
    assert with_own_rows_file(three, "passive2", "x.csv").rows_file("passive2") == "x.csv"


def test_the_generated_files_are_what_the_scenario_promises() -> None:
    t = make_bank_partner(2000, new_customers=500, seed=3)
    again = make_bank_partner(2000, new_customers=500, seed=3)
    pd.testing.assert_frame_equal(t.bank, again.bank)
    assert len(t.bank) == len(t.partner) == 2000 and len(t.merged) == 1800
    assert len(t.bank_new) == len(t.partner_new) == 500
    bank_ids, partner_ids = set(t.bank[JOIN_KEY]), set(t.partner[JOIN_KEY])
    assert len(bank_ids & partner_ids) == 1800 and len(bank_ids) == 2000
    assert not (set(t.bank_new[JOIN_KEY]) & bank_ids)  # new customers are new
    assert list(t.merged[JOIN_KEY]) == sorted(bank_ids & partner_ids)
    assert LABEL not in t.partner.columns and "merchant_id" not in t.bank.columns
    assert list(t.bank[JOIN_KEY]) != sorted(t.bank[JOIN_KEY])  # each in its own order
    assert t.partner["merchant_id"].nunique() > 500  # many levels: hashed, not one-hot
    pd.to_datetime(t.partner["last_purchase"], format="ISO8601")
    for frame, col in ((t.bank, "balance"), (t.partner, "spend_90d"),
                       (t.partner, "visits_90d")):
        assert 0.03 < frame[col].isna().mean() < 0.07, col  # 5 % missing
    with pytest.raises(ValueError, match="unshared"):
        make_bank_partner(200, unshared=0.6)


def test_a_brokers_job_membership_admits_the_jobs_parties_to_its_runs_only(
        tmp_path: Path) -> None:
    from pubsub.membership import load_membership
    from sim.cli import job_membership

    path = tmp_path / "m.toml"
    path.write_text(job_membership(load_job(_job(tmp_path))))
    m = load_membership(path)
    for run in ("bank-partner", "bank-partner-align", "bank-partner-predict",
                "bank-partner-predict-align"):
        assert m.allows("passive", f"emb/{run}/3") and m.allows("active", f"grad/{run}/3")
        assert not m.allows("mallory", f"emb/{run}/3")
    assert not m.allows("active", "emb/another-run/3")  # a run the job does not name
    three = _job(tmp_path, JOB.replace('organisations = ["bank", "partner"]',
                                      'organisations = ["bank", "p1", "p2"]')
                 + "passive_parties = 2\n", "three.toml")
    path.write_text(job_membership(load_job(three)))
    m = load_membership(path)
    assert m.allows("passive2", "emb/bank-partner/passive2/3")
    assert not m.allows("passive", "emb/bank-partner/passive2/3")  # each owns its topics
