"""``psfl vfl run`` and ``psfl synth run`` refuse a bad configuration value, a CSV file
given for streaming, a streamed regression task, a missing file, an unknown column,
an empty named column (CSV or Parquet), a setting or input shape beyond its bound (a
width or worker count past its cap, a run needing more memory than this machine has,
a file of 100,000 columns, a 20 MB line) before the start line and before any process starts: exit code 2, one line
naming the key or column, and neither torch nor pandas imported on the way (the
refusal's cost is the configuration's light imports, not the training stack's)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parties.runtime.exitcodes import ExitCode

REPO = Path(__file__).resolve().parents[2]

#: runs ``psfl ARGS`` (sim.cli.main) and says which heavy modules it imported
_WRAPPER = """
import sys
from sim.cli import main
try:
    code = main(sys.argv[1:])
finally:
    heavy = sorted(m for m in ("torch", "pandas", "sklearn") if m in sys.modules)
    print("imported:", ",".join(heavy) or "-", file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("checks")
    rows = [[f"{i * 0.5}", f"{-i}", f"{i % 7}", f"{i % 3}", str(i % 2), ""] for i in range(50)]
    paths = {"csv": d / "data.csv"}
    with paths["csv"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "d", "y", "empty"])
        w.writerows(rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths["parquet"] = d / "data.parquet"
    pq.write_table(pa.table({"a": [float(i) for i in range(50)], "c": list(range(50)),
                             "y": [i % 2 for i in range(50)],
                             "empty": pa.array([None] * 50, type=pa.float64())}),
                   paths["parquet"])
    paths["wide"] = d / "wide.csv"  # 200 rows x 100,000 columns of zeros (40 MB)
    row = ",".join(["0"] * 100_000) + "\n"
    paths["wide"].write_text(",".join(f"c{i}" for i in range(100_000)) + "\n" + row * 200)
    paths["long"] = d / "long.csv"  # line 3 is 20 MB, above the 16 MiB bound
    with paths["long"].open("w") as f:
        f.write("a,b,y\n1,2,0\n3,")
        for _ in range(20):
            f.write("9" * 1_000_000)
        f.write(",1\n4,5,0\n")
    return paths


def _cases(files: dict[str, Path]) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (psfl arguments, what the error line must say)."""
    data = str(files["csv"])
    split = ["--set", "label=y", "--set", 'data.passive_columns=["c", "d"]']
    return {
        "epochs": (["vfl", "run", "--set", "epochs=0"], ["vfl.epochs"]),
        "label epsilon": (["vfl", "run", "--set", "labels.epsilon=0"], ["vfl.labels.epsilon"]),
        "unknown key": (["vfl", "run", "--set", "no_such_key=1"], ["vfl.no_such_key"]),
        "stream csv": (["vfl", "run", "--set", f"dataset={data}", "--set", "label=y",
                        "--set", "data.stream=true"], ["Parquet", data]),
        "stream regression": (["vfl", "run", "--set", f"dataset={data}", "--set", "label=y",
                               "--set", "task=regression", "--set", "data.stream=true"],
                              ["vfl.data.stream", "regression"]),
        "unknown column": (["vfl", "run", "--set", f"dataset={data}", *split,
                            "--set", 'data.active_columns=["a", "zz"]'], ["'zz'"]),
        "empty column": (["vfl", "run", "--set", f"dataset={data}", *split,
                          "--set", 'data.active_columns=["a", "empty"]'],
                         ["'empty'", "active party", "no values"]),
        "empty parquet column": (["vfl", "run", "--set", f"dataset={files['parquet']}",
                                  "--set", "label=y", "--set", 'data.active_columns=["a"]',
                                  "--set", 'data.passive_columns=["empty", "c"]'],
                                 ["'empty'", "passive party"]),
        "missing file": (["vfl", "run", "--set", f"dataset={data}.gone", "--set", "label=y"],
                         ["not found", f"{data}.gone"]),
        "synth epsilon": (["synth", "run", "--set", "epsilon=0"], ["synth.epsilon"]),
        # the bounds on settings and input shapes (parties.data.limits)
        "embedding_dim 10^9": (["vfl", "run", "--set", "model.embedding_dim=1000000000"],
                               ["vfl.model.embedding_dim", "1,048,576"]),
        "workers 10^4": (["vfl", "run", "--set", "workers.passive=10000"],
                         ["vfl.workers.passive", "1,024"]),
        "memory": (["vfl", "run", "--set", "model.embedding_dim=1000000",
                    "--set", "model.bottom_hidden=[1000000]"],
                   ["vfl.model.embedding_dim", "GiB of memory", "this machine has"]),
        "100,000 columns": (["vfl", "run", "--set", f"dataset={files['wide']}",
                             "--set", "label=c0"],
                            ["100,000 columns", str(files["wide"]), "vfl.data.max_columns"]),
        "a 20 MB line": (["vfl", "run", "--set", f"dataset={files['long']}",
                          "--set", "label=y"],
                         ["line 3", str(files["long"]), "vfl.data.max_line_bytes"]),
        "a long line, bound lowered": (["vfl", "run", "--set", f"dataset={data}",
                                        "--set", "label=y",
                                        "--set", "data.max_line_bytes=1024",
                                        "--set", "data.max_columns=5"],
                                       ["6 columns", "more than 5"]),
        "synth 20 MB line": (["synth", "run", "--set", f"dataset={files['long']}"],
                             ["line 3", str(files["long"])]),
    }


def test_bad_input_is_refused_before_any_start_without_torch(files: dict[str, Path],
                                                            tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    procs = {}
    for name, (args, _) in _cases(files).items():  # all at once: each is one interpreter start
        out = tmp_path / name.replace(" ", "_")
        procs[name] = (out, subprocess.Popen(
            [sys.executable, "-c", _WRAPPER, *args, "--out", str(out)], env=env, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for name, (args, said) in _cases(files).items():
        out, proc = procs[name]
        stdout, stderr = proc.communicate(timeout=120)
        lines = stderr.strip().splitlines()
        assert proc.returncode == ExitCode.BAD_INPUT, (name, stdout, stderr)
        assert lines[-1] == "imported: -", (name, stderr)  # no torch, pandas or sklearn
        error = [ln for ln in lines if ln.startswith("error:")]
        assert len(error) == 1 and all(s in error[0] for s in said), (name, stderr)
        assert "Traceback" not in stderr, name
        assert stdout == "", (name, stdout)  # refused before the start line
        assert not out.exists(), name  # and before the run directory


def test_the_launchers_own_checks_refuse_an_empty_named_column(files: dict[str, Path]) -> None:
    """The Python API's path (:func:`parties.data.preflight.preflight`) keeps the same
    refusal."""
    from parties.config import load_vfl_config
    from parties.data import EmptyColumn
    from parties.data.preflight import preflight

    cfg = load_vfl_config(None, [f"dataset={files['csv']}", "label=y",
                                 'data.active_columns=["a", "b"]',
                                 'data.passive_columns=["empty", "c"]'])
    with pytest.raises(EmptyColumn) as err:
        preflight(cfg)
    assert (err.value.column, err.value.party) == ("empty", "passive")


def test_a_party_of_a_job_refuses_its_own_bad_file_or_value_before_joining(
        files: dict[str, Path], tmp_path: Path) -> None:
    """``psfl vfl party --job job.toml --data OWN_FILE`` (each organisation on its host):
    a missing file, a file without the join key, the label in a passive party's file, a
    bad value, DP on a passive party without its public schema: exit 2 naming it, before the start line, the alignment or any import of
    torch or pandas."""
    job = tmp_path / "job.toml"
    job.write_text('[job]\nrun_id = "r1"\nbroker = "tcp://10.77.0.1:5555"\n'
                   'join_key = "a"\n\n[vfl]\nlabel = "y"\n')
    no_key = tmp_path / "no_key.toml"
    no_key.write_text(job.read_text().replace('join_key = "a"', 'join_key = "cust"'))
    data = str(files["csv"])
    partner = tmp_path / "partner.csv"
    partner.write_text("a,b,c\n" + "".join(f"{i},{i * 2},x{i % 3}\n" for i in range(20)))
    dp_job = tmp_path / "dp_job.toml"
    dp_job.write_text(job.read_text() + "\n[vfl.dp]\nmu = 8.0\n")
    party = ["vfl", "party", "--insecure", "--job"]
    cases = {
        "dp without the partner's schema": ([*party, str(dp_job), "--role", "passive",
                                             "--data", str(partner)], ["vfl.dp.schema"]),
        "missing file": ([*party, str(job), "--role", "active", "--data", data + ".gone"],
                         ["not found", data + ".gone"]),
        "no join key": ([*party, str(no_key), "--role", "active", "--data", data],
                        ["'cust'"]),
        "label on the passive side": ([*party, str(job), "--role", "passive", "--data", data],
                                      ["holds the label 'y'"]),
        "bad value": ([*party, str(job), "--role", "active", "--data", data, "--set",
                       "epochs=0"], ["vfl.epochs"]),
        "not a party": ([*party, str(job), "--role", "passive2", "--data", data],
                        ["'passive2'"]),
        "100,000 columns": ([*party, str(job), "--role", "active", "--data",
                             str(files["wide"])], ["100,000 columns", str(files["wide"])]),
        "a 20 MB line": ([*party, str(job), "--role", "active", "--data", str(files["long"])],
                         ["line 3", str(files["long"])]),
        "10^4 workers": ([*party, str(job), "--role", "passive", "--data", str(partner),
                          "--set", "workers.passive=10000"], ["vfl.workers.passive"]),
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    procs = {name: subprocess.Popen([sys.executable, "-c", _WRAPPER, *args, "--out",
                                     str(tmp_path / name.replace(" ", "_"))],
                                    env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, (args, _) in cases.items()}
    for name, (_, said) in cases.items():
        stdout, stderr = procs[name].communicate(timeout=120)
        lines = stderr.strip().splitlines()
        assert procs[name].returncode == ExitCode.BAD_INPUT, (name, stdout, stderr)
        assert lines[-1] == "imported: -", (name, stderr)
        error = [ln for ln in lines if ln.startswith("error")]
        assert len(error) == 1 and all(s in error[0] for s in said), (name, stderr)
        assert "Traceback" not in stderr and stdout == "", (name, stdout, stderr)
        assert not (tmp_path / name.replace(" ", "_")).exists(), name
