"""parties.runtime.predict's DP accounting of predictions: the per-record prediction ledger
(salted ID keys, composition across files, the budget refused before any release, atomic
writes) and ``charge`` on a saved part's ledgers (no bus, no model)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pandas as pd
import pytest

from parties.config import DpSection, TimeoutsSection, VflConfig
from parties.data import UnknownColumn
from parties.privacy.dp import accountant_for, plan_from_config, release_mu
from parties.runtime.predict import (
    PREDICTION_LEDGER,
    PredictionBudgetExceeded,
    PredictionIdsRequired,
    PredictionLedger,
    charge,
    select_rows,
)
from parties.runtime.saved import ledger_to_json

IDS = [f"customer-{i:04d}" for i in range(5)]


def test_ledger_composes_a_records_releases_across_files(tmp_path: Path) -> None:
    path = tmp_path / PREDICTION_LEDGER
    led = PredictionLedger(path)
    assert led.commit(IDS[:3], 4, release_mu=1.0, source="a.csv") == dict.fromkeys(
        led.keys(IDS[:3]), 1)
    # another file, other rows in another order, one ID twice (two releases of it)
    after = PredictionLedger(path).commit([IDS[4], IDS[2], IDS[1], IDS[2]], 4,
                                          release_mu=1.0, source="b.csv")
    k = dict(zip(IDS, PredictionLedger(path).keys(IDS), strict=True))
    assert after == {k[IDS[4]]: 1, k[IDS[2]]: 3, k[IDS[1]]: 2}
    again = PredictionLedger(path)
    assert again.max_count == 3 and again.counts[k[IDS[0]]] == 1
    assert [r["source"] for r in again.releases] == ["a.csv", "b.csv"]


def test_ledger_keys_are_salted_hashes_never_raw_ids(tmp_path: Path) -> None:
    a, b = PredictionLedger(tmp_path / "a.json"), PredictionLedger(tmp_path / "b.json")
    a.commit(IDS, 1, release_mu=1.0, source="f")
    b.commit(IDS, 1, release_mu=1.0, source="f")
    text = (tmp_path / "a.json").read_text()
    assert not any(i in text for i in IDS)
    # a per-model random salt: the same ID has another key in another model's ledger
    assert a.salt != b.salt and set(a.counts).isdisjoint(b.counts)
    assert PredictionLedger(tmp_path / "a.json").keys(IDS) == a.keys(IDS)
    assert len(set(a.keys(IDS))) == len(IDS) and all(len(x) == 32 for x in a.keys(IDS))


def test_ledger_refuses_past_the_budget_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / PREDICTION_LEDGER
    led = PredictionLedger(path)
    led.commit(IDS, 2, release_mu=1.0, source="f")
    led.commit(IDS[:2], 2, release_mu=1.0, source="f")
    before = path.read_bytes()
    with pytest.raises(PredictionBudgetExceeded) as ei:
        led.commit(IDS[1:4], 2, release_mu=1.0, source="f")
    e = ei.value
    assert (e.key, e.limit, e.worst, e.over) == ("vfl.dp.predict_max_releases", 2, 3, 1)
    assert "dp_predict_max_releases" in str(e) and "1 record(s)" in str(e)
    assert path.read_bytes() == before  # nothing charged
    led.commit(IDS[2:], 2, release_mu=1.0, source="f")  # the others still have one left


def test_ledger_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / PREDICTION_LEDGER
    PredictionLedger(path).commit(IDS[:1], 5, release_mu=1.0, source="f")
    before = path.read_bytes()

    def crash(*_: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        PredictionLedger(path).commit(IDS, 5, release_mu=1.0, source="f")
    monkeypatch.undo()
    assert path.read_bytes() == before  # the old ledger, whole
    # the temporary file lies in the ledger's own directory (a rename, not a copy)
    assert {p.name for p in tmp_path.iterdir()} <= {
        PREDICTION_LEDGER, PREDICTION_LEDGER + ".lock", f"{PREDICTION_LEDGER}.tmp{os.getpid()}"}


def _part(tmp_path: Path, **kw: Any) -> SimpleNamespace:
    """A passive saved part as ``charge`` reads it: config, ledger.json, manifest."""
    cfg = VflConfig(epochs=1, dp=DpSection(mu=1.0, **kw),
                    timeouts=TimeoutsSection(max_reassign=0))
    plan = plan_from_config(cfg)
    acct = accountant_for(plan, {"train": 4, "val": 2, "test": 3})
    acct.record("test")  # the test split's release at the end of training
    led = ledger_to_json(acct.state_dict())
    (tmp_path / "ledger.json").write_bytes(orjson.dumps(led))
    return SimpleNamespace(cfg=cfg, ledger=led, path=tmp_path, party="passive",
                           manifest={"dp": {"ledger": "ledger.json"}, "columns": ["x"],
                                     "label": {}})


def test_charge_composes_repeated_predictions_of_the_same_rows(tmp_path: Path) -> None:
    part = _part(tmp_path, predict_max_releases=4)
    mu_one = release_mu(plan_from_config(part.cfg).eval_noise_multipliers["test"])
    assert mu_one == pytest.approx(1.0)  # the test split's release: the whole target
    mus = []
    for n in range(4):
        privatize, dp = charge(part, 3, f"new{n}.csv", IDS[:3])
        assert privatize is not None and dp["continues"] == "prediction_ledger"
        mus.append(dp["prediction_mu"])
        assert dp["prediction_releases_max"] == n + 1 and dp["max_releases"] == 4
    # µ_one·sqrt(k): four releases of the same rows are 2·µ_one, not µ_one each
    assert mus == pytest.approx([mu_one * math.sqrt(k) for k in (1, 2, 3, 4)])
    # the run's worst record composed with the worst ID, as if they were one record
    assert dp["mu"] == pytest.approx(math.hypot(1.0, 2 * mu_one))
    before = sorted(p.read_bytes() for p in tmp_path.iterdir() if p.suffix == ".json")
    with pytest.raises(PredictionBudgetExceeded):  # the budget: refused, nothing written
        charge(part, 2, "new4.csv", [IDS[4], IDS[0]], dry_run=True)
    with pytest.raises(PredictionBudgetExceeded):
        charge(part, 2, "new4.csv", [IDS[4], IDS[0]])
    assert sorted(p.read_bytes() for p in tmp_path.iterdir() if p.suffix == ".json") == before
    _, dp = charge(part, 1, "new5.csv", [IDS[4]])  # another record is still within it
    assert dp["prediction_mu"] == pytest.approx(mu_one)


def test_charge_budgets_test_split_predictions_after_the_runs_own_release(
        tmp_path: Path) -> None:
    part = _part(tmp_path)  # dp_predict_max_releases = 1 (the default)
    assert part.cfg.dp.predict_max_releases == 1
    _, dp = charge(part, 3, "test_split")
    assert dp["continues"] == "test" and dp["publications_max_test"] == 2
    assert dp["prediction_mu"] == pytest.approx(math.sqrt(2) * dp["release_mu"])
    assert dp["mu"] == pytest.approx(dp["prediction_mu"])  # no file predictions yet
    with pytest.raises(PredictionBudgetExceeded) as ei:
        charge(part, 3, "test_split", dry_run=True)
    assert (ei.value.worst, ei.value.over) == (2, 3)
    led = orjson.loads((tmp_path / "ledger.json").read_bytes())
    assert max(led["counts"]["test"]) == 2 and len(led["predictions"]) == 1


def test_a_prediction_file_without_ids_is_refused_under_dp(tmp_path: Path) -> None:
    data = tmp_path / "new.csv"
    pd.DataFrame({"x": [1.0, 2.0], "ref": ["a", "b"]}).to_csv(data, index=False)
    part = _part(tmp_path)
    with pytest.raises(PredictionIdsRequired) as ei:
        select_rows(part, str(data), "id")
    assert ei.value.column == "id" and "--id-column" in str(ei.value)
    off = SimpleNamespace(**{**vars(part), "cfg": VflConfig()})
    with pytest.raises(UnknownColumn):  # DP off: the plain missing-column error
        select_rows(off, str(data), "id")
    pd.DataFrame({"x": [1.0, 2.0], "id": ["a", None]}).to_csv(data, index=False)
    with pytest.raises(PredictionIdsRequired, match="1 row"):
        select_rows(part, str(data), "id")
    assert select_rows(off, str(data), "id").ids is not None
    with pytest.raises(PredictionIdsRequired):  # and charge never counts rows without IDs
        charge(part, 2, str(data), None)
