"""N-way private ID alignment end to end: three ID files (active + two passive parties)
aligned through a CURVE broker by ``psfl vfl align`` (one process per party), then a
three-party training run on the aligned rows; and a passive party sharing no ID with
the others fails every party with a typed error naming it (exit 2, no hang)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pandas as pd
import pytest

from parties.config import DataSection, VflConfig, WorkersSection
from parties.data import load_table

PSFL = [sys.executable, "-m", "sim.cli"]


def _align(tmp_path: Path, files: list[Path], out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [*PSFL, "vfl", "align", "--active-ids", str(files[0]), "--out", str(out),
           "--timeout-s", "30", "--job-timeout-s", "90"]
    for f in files[1:]:
        cmd += ["--passive-ids", str(f)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_three_parties_align_then_train_on_the_common_rows(tmp_path: Path) -> None:
    """One 1,200-row table; the active party knows customers 0..899, passive 200..1199,
    passive2 every customer but 500..599 (in another file order). The common rows are
    200..499 and 600..899; every party trains on exactly those, in one order."""
    data = tmp_path / "bank.csv"
    load_table("bank")[0].sample(n=1200, random_state=5).to_csv(data, index=False)
    n = 1200
    a = [f"c{i:05d}" if i < 900 else f"a{i:05d}" for i in range(n)]
    p = [f"c{i:05d}" if i >= 200 else f"p{i:05d}" for i in range(n)]
    q = [f"c{i:05d}" if not 500 <= i < 600 else f"q{i:05d}" for i in range(n)][::-1]
    files = [tmp_path / "a.txt", tmp_path / "p.txt", tmp_path / "q.txt"]
    for f, ids in zip(files, (a, p, q), strict=True):
        f.write_text("\n".join(ids) + "\n")
    al = tmp_path / "align"
    res = _align(tmp_path, files, al)
    assert res.returncode == 0, res.stderr[-3000:]
    want = [f"c{i:05d}" for i in (*range(200, 500), *range(600, 900))]
    got = {party: pd.read_csv(al / f"aligned-{party}.csv", dtype={"id": str})
           for party in ("active", "passive", "passive2")}
    for party, ids in zip(got, (a, p, q), strict=True):
        assert got[party]["id"].tolist() == want, party
        assert [ids[r] for r in got[party]["row"]] == want, party
    assert (al / "members.toml").read_text().count("owned") == 1
    summary = orjson.loads((al / "align-active.json").read_bytes())
    assert summary["n_shared"] == 600 and summary["n_pair_shared"] == {"passive": 700,
                                                                       "passive2": 800}
    assert orjson.loads((al / "align-passive2.json").read_bytes())["n_pair_shared"] == {
        "active": 800}
    assert "600 shared IDs" in res.stdout
    # a party's output names no ID outside the final intersection
    for f in al.glob("*.json"):
        assert "c00100" not in f.read_text() and "c00950" not in f.read_text()

    from sim.launch.local import run_vfl_in_process

    # the rows of each party's table: q's file order is reversed, so its table is too
    table = pd.read_csv(data)
    table.iloc[::-1].reset_index(drop=True).to_csv(tmp_path / "bank-q.csv", index=False)
    # every party reads one dataset; here they share one table file, so passive2's rows
    # file is re-expressed in that table's order (its rows are positions in its own file)
    rq = got["passive2"].assign(row=n - 1 - got["passive2"]["row"])
    rq.to_csv(al / "aligned-passive2-table.csv", index=False)
    cfg = VflConfig(dataset=str(data), label="y", epochs=1, batch_size=128, passive_parties=2, seed=0, workers=WorkersSection(mode="thread"), data=DataSection(active_rows_file=str(al / "aligned-active.csv"), passive_party_rows_files=(str(al / "aligned-passive.csv"),
                                              str(al / "aligned-passive2-table.csv"))))
    out = tmp_path / "run"
    run_vfl_in_process(cfg, out, timeout_s=120)
    loaded = [orjson.loads(x) for x in (out / "events.jsonl").read_bytes().splitlines()
              if b"vfl.data_loaded" in x]
    assert sorted(r["party"] for r in loaded) == ["active", "passive", "passive2"]
    assert all(r["n_rows"] == 600 for r in loaded), loaded
    m = orjson.loads((out / "metrics.json").read_bytes())
    assert set(m["parties"]) >= {"active", "passive", "passive2"}


def test_a_passive_party_sharing_no_id_fails_every_party_naming_it(tmp_path: Path) -> None:
    files = [tmp_path / "a.txt", tmp_path / "p.txt", tmp_path / "q.txt"]
    files[0].write_text("".join(f"c{i}\n" for i in range(50)))
    files[1].write_text("".join(f"c{i}\n" for i in range(20, 90)))
    files[2].write_text("".join(f"z{i}\n" for i in range(40)))  # no ID of anyone else
    t0 = time.monotonic()
    res = _align(tmp_path, files, tmp_path / "al")
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert time.monotonic() - t0 < 60
    assert "no ID is held by every party" in res.stderr and "'passive2'" in res.stderr, \
        res.stderr[-3000:]
    assert not (tmp_path / "al" / "aligned-active.csv").exists()


@pytest.mark.parametrize("party", ["passive2"])
def test_a_party_id_beyond_the_passive_parties_is_refused(tmp_path: Path, party: str) -> None:
    (tmp_path / "ids.txt").write_text("a\nb\n")
    res = subprocess.run([*PSFL, "vfl", "align", "--role", party, "--broker",
                          "tcp://127.0.0.1:9", "--insecure", "--ids", str(tmp_path / "ids.txt"),
                          "--out", str(tmp_path / "o")], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 2 and "--passive-parties" in res.stderr, res.stderr[-2000:]
