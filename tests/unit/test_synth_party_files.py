"""FedForge from the branches' own files on the command line: ``psfl synth run
--party-files`` hands each file to the Python API's fit (one party each, K = the count),
and ``python -m synth parties --data FILE`` reads one branch's own table; bad
combinations are refused naming the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pubsub.config import ConfigError
from sim import cli


def test_party_files_reach_fit_with_k_from_their_count(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    class Fake:
        def __init__(self, **kw: Any) -> None:
            seen["init"] = kw

        def fit(self, parties: Any, **kw: Any) -> Any:
            seen["fit"] = (list(parties), kw)
            return self

        metrics = {"avg_tv": 0.1, "max_tv": 0.2, "n_workload": 3, "wall_s": 1.0}

    import sim.fedforge

    monkeypatch.setattr(sim.fedforge, "FedForge", Fake)
    code = cli.main(["synth", "run", "--party-files", "a.csv", "b.csv", "c.csv", "--holdout",
                     "h.csv", "--set", "label=income", "--epsilon", "2",
                     "--out", str(tmp_path / "run")])
    assert code == 0
    parties, kw = seen["fit"]
    assert parties == ["a.csv", "b.csv", "c.csv"] and kw["holdout"] == "h.csv"
    assert kw["transport"] == "broker"
    assert seen["init"]["epsilon"] == 2.0 and seen["init"]["label"] == "income"
    assert "parties" not in seen["init"]["config"]


@pytest.mark.parametrize("argv, key", [
    (["--party-files", "a.csv", "--parties", "3"], "--parties"),
    (["--party-files", "a.csv", "--dataset", "adult"], "--dataset"),
    (["--dataset", "adult", "--holdout", "h.csv"], "--holdout"),
])
def test_bad_combinations_name_the_flag(argv: list[str], key: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["synth", "run", *argv, "--out", str(tmp_path / "run")]) == 2
    assert f"config '{key}'" in capsys.readouterr().err


def test_a_branch_reads_its_own_file(tmp_path: Path) -> None:
    import asyncio
    import argparse

    from synth import cli as synth_cli
    from synth.config import SynthConfig

    f = tmp_path / "branch.csv"
    f.write_text("a,b\n1,x\n2,y\n")
    args = argparse.Namespace(ids="p000,p001", data=str(f), data_dir=None, state_dir=None,
                              broker="tcp://127.0.0.1:1", run_id="r", security=None)
    with pytest.raises(ConfigError, match="one party's own file") as exc:
        asyncio.run(synth_cli._parties(SynthConfig(), args))
    assert exc.value.key == "--data"
    assert list(synth_cli.read_table(f).columns) == ["a", "b"]


def test_a_branch_drafts_a_schema_fedforge_takes(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``psfl synth schema``: every column FedForge can declare, the label included; a
    date and a many-level column left out by name with what to do."""
    import numpy as np
    import pandas as pd

    from parties.data.schema import load_schema

    rng = np.random.default_rng(0)
    n = 400
    pd.DataFrame({"age": rng.integers(18, 90, n), "kind": rng.choice(["a", "b"], n),
                  "when": pd.date_range("2021-01-01", periods=n, freq="D").strftime("%Y-%m-%d"),
                  "shop": [f"S{i:04d}" for i in rng.integers(0, 300, n)],
                  "y": rng.choice(["no", "yes"], n)}).to_csv(tmp_path / "b1.csv", index=False)
    out = tmp_path / "s.toml"
    assert cli.main(["synth", "schema", "--dataset", str(tmp_path / "b1.csv"),
                     "--out", str(out)]) == 0
    assert load_schema(out).names == ("age", "kind", "y")
    err = capsys.readouterr().err
    assert "left out 'when'" in err and "left out 'shop'" in err and "drop_columns" in err
    assert cli.main(["synth", "schema", "--dataset", str(tmp_path / "b1.csv"),
                     "--out", str(out)]) == 2  # a reviewed schema is not overwritten


def test_drop_columns_naming_no_column_is_refused_before_the_run(tmp_path: Path) -> None:
    import pandas as pd

    from sim.fedforge import FedForge, FedForgeError

    frame = pd.DataFrame({"a": [1, 2, 3], "y": ["n", "y", "n"]})
    fed = FedForge(epsilon=1.0, label="y", config={"data": {"drop_columns": ["zz"]}})
    with pytest.raises(FedForgeError, match=r"\['zz'\]"):
        fed.fit([frame, frame])


@pytest.mark.parametrize("doc,extra,says", [
    ('[{"marginals": [["job", "y", "loan"]]}]', [], "stream.rho_frac"),
    ('{"marginals": [["job", "y", "loan"]]', ["--set", "stream.rho_frac=0.3"], "cannot read"),
    ('[]', ["--set", "stream.rho_frac=0.3"], "non-empty list"),
    ('[{"marginals": [["job", "y", "loan"]]}]', ["--party-files", "a.csv", "b.csv"],
     "--dataset run"),
])
def test_queries_refused_before_anything_starts(doc: str, extra: list[str], says: str,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """``psfl synth run --queries FILE``: a file that is not a list of updates, a run
    without a reserve of rho for them, or --party-files: exit 2 naming --queries."""
    (tmp_path / "q.json").write_text(doc)
    args = ["synth", "run", *extra, "--queries", str(tmp_path / "q.json"),
            "--out", str(tmp_path / "run")]
    if "--party-files" not in extra:
        args[2:2] = ["--dataset", "bank"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "config '--queries'" in err and says in err, err
    assert not (tmp_path / "run").exists()
