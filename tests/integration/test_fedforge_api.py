"""The FedForge Python API (sim.fedforge): fit on the parties' tables, sample, reload; the
same code in process (in-memory bus) and through a broker with party processes; bad
input refused before anything runs, naming the party or the argument."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from pubsub.config import ConfigError
from sim.fedforge import FedForge, FedForgeError
from synth.saved import SavedModelError, load_model
from tests.bounds import above, below

pytest.importorskip("mbi")

SCHEMA = """
version = 1
dataset = "toy"

[columns.age]
kind = "numeric"
lo = 18
hi = 100
fill = 40

[columns.job]
kind = "categorical"
categories = ["a", "b", "c", "d"]

[columns.city]
kind = "categorical"
categories = ["x", "y", "z"]

[columns.y]
kind = "categorical"
categories = ["no", "yes"]
"""


def _table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    job = rng.choice(list("abcd"), n, p=[0.4, 0.3, 0.2, 0.1])
    city = np.where(rng.random(n) < 0.8, np.where(job == "a", "x", "y"), "z")
    age = np.clip(rng.normal(40, 12, n), 18, 100).round().astype(int)
    y = np.where((job == "a") & (age > 40) | (rng.random(n) < 0.1), "yes", "no")
    return pd.DataFrame({"age": age, "job": job, "city": city, "y": y})


@pytest.fixture(scope="module")
def schema_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    p = tmp_path_factory.mktemp("schema") / "toy.schema.toml"
    p.write_text(SCHEMA)
    return str(p)


def _parties(k: int = 3, n: int = 600) -> list[pd.DataFrame]:
    return [_table(n, seed) for seed in range(k)]


FAST = {"engine": {"iters": 60}, "data.numeric_bins": 8, "noise_seed": 5}


@pytest.mark.stochastic
@pytest.mark.parametrize("transport", ["memory", "broker"])
def test_fit_sample_reload(transport: str, schema_file: str, tmp_path: pytest.TempPathFactory
                           ) -> None:
    ff = FedForge(epsilon=1.0, delta=1e-9, mechanism="mst", engine="mbi", schema=schema_file,
                  label="y", config=FAST)
    out = tmp_path / "run"  # type: ignore[operator]
    ff.fit(_parties(), holdout=_table(400, 9), out=out, transport=transport, timeout_s=240)
    m = ff.metrics
    assert m["ledger_within_plan"] and m["ledger_agrees"]
    assert set(ff.epsilon_spent) == {"p000", "p001", "p002"}
    assert all(0.9 <= e <= 1.0 + 1e-9 for e in ff.epsilon_spent.values())
    assert m["data"]["domain_source"] == "declared"
    assert m["security"]["transport"] == ("memory" if transport == "memory" else "curve")
    assert (m["bytes_wire"] is None) == (transport == "memory")
    assert (m["bytes_wire_fixed"] is None) == (transport == "memory")
    assert m["avg_tv"] >= 0.0
    below(m["avg_tv"], 0.5, "avg TV")
    rows = ff.sample(2_000, seed=3)
    assert list(rows.columns) == ["age", "job", "city", "y"]
    assert len(rows) == 2_000 and not rows.isna().any().any()
    assert set(rows["job"]) <= {"a", "b", "c", "d", "__other__"}
    assert rows["age"].between(18, 100).all(), rows["age"].describe()
    assert set(rows["y"]) <= {"no", "yes"}
    assert m["ml_utility_skipped"] is None  # the label's declared classes: no __other__
    assert 0.5 < m["ml_utility"]["auc_synthetic"] <= 1.0
    # the learnt dependency shows: job a mostly lives in city x
    share = (rows.loc[rows["job"] == "a", "city"] == "x").mean()
    assert share > 0.5
    again = FedForge.load(out)
    pd.testing.assert_frame_equal(again.sample(500, seed=11), ff.sample(500, seed=11))
    assert again.metrics["avg_tv"] == m["avg_tv"]


def test_no_schema_warns_and_says_inferred(tmp_path: pytest.TempPathFactory) -> None:
    ff = FedForge(epsilon=math.inf, engine="neural", config={"engine.iters": 50})
    with pytest.warns(UserWarning, match="inferred"):
        ff.fit(_parties(2, 300))
    assert ff.metrics["data"]["domain_source"] == "inferred"
    assert "avg_tv" not in ff.metrics or ff.metrics["avg_tv"] is None  # no holdout
    assert len(ff.sample(10)) == 10
    assert ff.run_dir is not None and (ff.run_dir / "metrics.json").is_file()


def test_bad_input_named(schema_file: str) -> None:
    ff = FedForge(schema=schema_file, config=FAST)
    bad = _parties(3, 50)
    bad[2] = bad[2].drop(columns=["city"])
    with pytest.raises(FedForgeError, match=r"parties\[2\].*missing \['city'\]"):
        ff.fit(bad)
    with pytest.raises(FedForgeError, match="single DataFrame"):
        ff.fit(_table(10, 0))  # type: ignore[arg-type]
    empty = _parties(2, 50)
    empty[1] = empty[1].iloc[:0]
    with pytest.raises(FedForgeError, match=r"parties\[1\]: has no rows"):
        ff.fit(empty)
    with pytest.raises(FedForgeError, match=r"parties\[0\].*no such file"):
        ff.fit(["/nonexistent/party.csv"])
    with pytest.raises(FedForgeError, match="label"):
        FedForge(schema=schema_file, label="income").fit(_parties(2, 50))
    with pytest.raises(FedForgeError, match="fit"):
        FedForge().sample(5)
    with pytest.raises(FedForgeError, match="transport"):
        ff.fit(_parties(2, 50), transport="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="engine_itres"):
        FedForge(config={"engine_itres": 5})
    with pytest.raises(ConfigError, match="epsilon"):
        FedForge(epsilon=-1)
    with pytest.raises(FedForgeError, match="parties"):
        FedForge(config={"parties": 4})
    with pytest.raises(FedForgeError, match="data.schema_file"):
        FedForge(config={"data.schema_file": "s.toml"})
    with pytest.raises(ConfigError, match=r"moved to synth\.engine\.iters") as moved:
        FedForge(config={"engine_iters": 5})  # the flat layout's key: its new place named
    assert moved.value.key == "synth.engine_iters"
    with pytest.raises(ConfigError, match=r"synth\.engine\.name"):
        FedForge(config={"engine": "mbi"})


def test_engine_not_installed(monkeypatch: pytest.MonkeyPatch, schema_file: str) -> None:
    import synth.engine as engine

    def missing() -> None:
        raise engine.EngineUnavailable(engine="mbi", package="mbi",
                                       hint='pip install -e ".[mbi]"')

    monkeypatch.setattr(engine, "_import_mbi", missing)
    with pytest.raises(engine.EngineUnavailable):
        FedForge(schema=schema_file, engine="mbi").fit(_parties(2, 50))


def test_load_without_a_run(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(SavedModelError, match="schema.json"):
        load_model(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (tmp_path / "schema.json").write_text("{}")  # type: ignore[operator]
    with pytest.raises(SavedModelError):
        FedForge.load(tmp_path)  # type: ignore[arg-type]
