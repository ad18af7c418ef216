"""bench/doc_tables.py: the benchmark tables page is generated from committed JSON (a
stale page fails here), and the envelope and renderers (loaded by path: ``bench`` is not
a package)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dt() -> Any:
    spec = importlib.util.spec_from_file_location("doc_tables", REPO / "bench" / "doc_tables.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["doc_tables"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_committed_tables_page_is_what_render_gives(dt):
    # the page is generated: after changing docs/benchmarks/data/ (or a renderer), run
    # python bench/doc_tables.py render
    assert dt.DATA.is_dir() and list(dt.DATA.glob("*.json"))
    assert dt.TABLES.read_text() == dt.render(), (
        "docs/benchmarks/tables.md is stale: run python bench/doc_tables.py render")


def test_committed_data_files_are_envelopes(dt):
    for f in sorted(dt.DATA.glob("*.json")):
        doc = json.loads(f.read_text())
        assert {"date", "machine", "command", "git", "result"} <= set(doc), f
        assert doc["date"].endswith("Z") and len(doc["git"]["commit"]) == 40, f
        assert {"cores_logical", "cpu_model", "ram_gib", "python", "torch"} <= set(
            doc["machine"]), f
        assert dt.bench_of(doc["command"]) in dt.RENDERERS, f  # each seeded bench has one


# ---------------------------------------------------------------- command lines


def test_json_path_and_bench_of_a_command(dt):
    cmd = "PYTHONPATH=. python bench/bus.py --quick --json /tmp/b.json"
    assert dt.json_path_of(cmd) == Path("/tmp/b.json")
    assert dt.json_path_of("python bench/x.py --json=out/x.json") == Path("out/x.json")
    with pytest.raises(dt.DocTablesError, match="no --json"):
        dt.json_path_of("python bench/x.py --quick")
    assert dt.bench_of(cmd) == "bus"
    assert dt.bench_of("psfl bench synth_wire --quick") == "synth_wire"
    assert dt.bench_of("make bench") == ""
    assert dt.default_name(cmd) == "bus_quick"
    assert dt.default_name("python bench/synth_wire.py --bank8 --quick --json o") == \
        "synth_wire_bank8_quick"
    assert dt.default_name("echo") == "bench"


# ---------------------------------------------------------------- formatting


@pytest.mark.parametrize(("value", "text"), [
    (None, "n/a"), (float("nan"), "n/a"), (float("inf"), "∞"), (True, "yes"), (False, "no"),
    (12345, "12,345"), (0.123456, "0.1235"), (1.5, "1.5"), (999.94, "999.9"),
    (1234.6, "1,235"), (55940.0, "55,940"), (-0.5, "-0.5"), (2e-7, "2e-07"), ("a|b", "a\\|b")])
def test_fmt(dt, value, text):
    assert dt.fmt(value) == text


def test_table_and_flatten(dt):
    assert dt.table(["a", "b"], [["`x`", 1.0], ["y", None]]) == (
        "| a | b |\n|---|---|\n| `x` | 1 |\n| y | n/a |\n")
    flat = dt.flatten_numbers({"a": 1, "b": {"c": [0.5, "s", None]}, "d": "text", "e": True})
    assert flat == [("a", 1), ("b.c[0]", 0.5), ("b.c[2]", None), ("e", True)]


def test_render_generic(dt):
    assert dt.render_generic({"summary": {"k": {"x": 2}}, "runs": [9]}) == (
        "| summary key | value |\n|---|---|\n| `k.x` | 2 |\n")
    assert "value" in dt.render_generic({"n": 3})  # no summary: the whole result
    assert dt.render_generic({"summary": {"s": "text"}}).startswith("No numbers")


# ---------------------------------------------------------------- renderers


def test_render_bus(dt):
    sizes = {"64B": 1.0, "64KiB": 700.0, "1MiB": 1500.25}
    summary = {"ratio_64B": 0.52, "ratio_64KiB": 1.0, "ratio_1MiB": None,
               "rtt_p99_ratio_64KiB": 1.48, "raw_proxy_msgs_per_s": {},
               "mb_per_s": {"raw_proxy": sizes, "ours_uvloop": dict(sizes, **{"1MiB": None})},
               "curve_ratios": {"ours_curve / ours_uvloop": {"64B": 1.03, "64KiB": 0.44,
                                                             "1MiB": 0.34}},
               "rtt_curve_p99_ratio_64KiB": 0.9}
    out = dt.render_bus({"summary": summary})
    assert "| path | 64B | 64KiB | 1MiB |" in out
    assert "| `raw_proxy` | 1 | 700 | 1,500 |" in out
    assert "| `ours_uvloop` | 1 | 700 | n/a |" in out
    assert "| ours_uvloop / raw_proxy, msgs/s, 1 MiB | n/a |" in out
    assert "| ours_curve / ours_uvloop | 1.03 | 0.44 | 0.34 |" in out


def test_render_des_validate(dt):
    res = {"validation": [{"setting": "pubsub 1+4 B=128", "predicted_epoch_s": 1.23456,
                           "measured_epoch_s": 1.5, "rel_err": 0.177}],
           "calibration": {"in_sample_prediction": {
               "setting": "pubsub 1+4 B=256", "predicted_epoch_s": 0.7,
               "measured_epoch_s": 0.75, "rel_err": 0.0667}},
           "max_rel_err": 0.177, "within_15pct": False}
    out = dt.render_des_validate(res)
    assert "| `pubsub 1+4 B=256` | calibration (in sample) | 0.7 | 0.75 | 0.0667 |" in out
    assert "| `pubsub 1+4 B=128` | validation | 1.235 | 1.5 | 0.177 |" in out
    assert out.index("calibration") < out.index("| validation")
    assert "| every validation error within 15 % | no |" in out
    # a failed calibration run (null) leaves its row out
    assert "calibration" not in dt.render_des_validate({"calibration": None})


def test_render_synth_wire(dt):
    row = {"avg_tv": 0.0212, "wire_vs_naive": 1.307, "saving_vs_naive": -0.307,
           "bytes_wire": 55940.0, "bytes_naive": 42796.0, "fixed_vs_naive": 0.58,
           "rounds_vs_naive": 0.726, "bytes_by_kind": {"up": 21778.0, "rv": 7140.0}, "runs": 1}
    out = dt.render_synth_wire({"summary": {"compressed": dict(row, tv_cost_vs_fine=0.0),
                                            "fine": row, "uniform_ring": None}})
    assert "| `compressed` | 0.0212 | 0 | 1.307 | 0.58 | 0.726 | 55,940 | 42,796 | 1 |" in out
    assert "| `fine` | 0.0212 | n/a |" in out
    assert "| `uniform_ring` | failed |" in out
    assert "| `up` | 21,778 | 21,778 |" in out


def test_render_synth_table(dt):
    fed = {"avg_tv": 0.0557, "ml_auc": 0.902, "bytes_wire": 154592, "bytes_naive": 274456,
           "wall_s": 32.2}
    base = {"avg_tv": 0.8504, "ml_auc": 0.571, "bytes_wire": None, "wall_s": 73.4}
    summary = {"adult": {"1": {
        "fedforge_k10": fed, "dpfedavg_gan_k10": base, "central_aim": {"error": "boom"},
        "noniid": {"fedforge_k10": {"avg_tv": 0.0508}},
        "eps_inf": {"dpfedavg_gan_k10": {"avg_tv": 0.6033}},
        "noniid_over_iid": {"fedforge_k10": 0.912}, "diffusion_over_mbi": 1.122}}}
    out = dt.render_synth_table({"summary": summary})
    assert "| adult | 1 | `fedforge_k10` | 0.0557 | 0.0508 | 0.902 | n/a | 0.5633 | 32.2 |" \
        in out
    assert "| adult | 1 | `dpfedavg_gan_k10` | 0.8504 | n/a | 0.571 | 0.6033 | n/a | 73.4 |" \
        in out
    assert "| adult | 1 | `central_aim` | failed |" in out
    assert "| adult | 1 | `noniid_over_iid` | `fedforge_k10` | 0.912 |" in out
    assert "| adult | 1 | `diffusion_over_mbi` |  | 1.122 |" in out
    assert "`noniid`" not in out.split("Ratios")[0]  # sub-tables are columns, not rows


# ---------------------------------------------------------------- record and render


def _bench_json(path: Path, summary: dict) -> None:
    path.write_text(json.dumps({"summary": summary, "runs": []}))
    os.utime(path, (1_780_000_000, 1_780_000_000))


def test_record_wraps_a_bench_json(dt, tmp_path):
    out_json = tmp_path / "b.json"
    _bench_json(out_json, {"x": 1.5})
    cmd = f"python bench/mystery.py --quick --json {out_json}"
    path = dt.record(cmd, data_dir=tmp_path / "data", wall_s=12.34)
    assert path == tmp_path / "data" / "mystery_quick.json"
    doc = json.loads(path.read_text())
    assert list(doc) == ["date", "machine", "command", "git", "wall_s", "result"]
    assert doc["date"] == "2026-05-28T20:26:40Z"  # the JSON's mtime, UTC
    assert doc["command"] == cmd and doc["wall_s"] == 12.3
    assert doc["result"] == {"summary": {"x": 1.5}, "runs": []}
    assert doc["machine"]["cores_logical"] >= 1 and doc["machine"]["python"]
    assert len(doc["git"]["commit"]) == 40
    # an explicit path and name
    path = dt.record("python bench/other.py", out_json, name="n1", data_dir=tmp_path / "data")
    assert path.name == "n1.json"
    with pytest.raises(dt.DocTablesError, match="cannot read"):
        dt.record(f"python bench/x.py --json {tmp_path / 'missing.json'}", data_dir=tmp_path)


def test_record_run_times_the_command(dt, tmp_path):
    out_json = tmp_path / "r.json"
    code = f"import json; open({str(out_json)!r}, 'w').write(json.dumps({{'summary': {{}}}}))"
    cmd = f"{sys.executable} -c \"{code}\" --json {out_json}"
    path = dt.record(cmd, name="ran", run=True, data_dir=tmp_path / "data")
    doc = json.loads(path.read_text())
    assert doc["wall_s"] >= 0 and doc["result"] == {"summary": {}}
    with pytest.raises(dt.DocTablesError, match="exited 3"):
        dt.record(f"{sys.executable} -c 'raise SystemExit(3)' --json {out_json}", run=True,
                  data_dir=tmp_path / "data")


def test_render_and_check(dt, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    env = {"date": "2026-12-06T07:00:00Z", "git": {"commit": "a" * 40, "dirty": True},
           "machine": {"cores_logical": 2, "cores_physical": 1, "cpu_model": "Xeon",
                       "ram_gib": 7.8, "os": "Linux", "python": "3.11.7", "torch": "2.1"}}
    (data / "b_other.json").write_text(json.dumps(
        {**env, "command": "python bench/mystery.py --json o", "result": {"summary": {"k": 2}}}))
    (data / "a_bus.json").write_text(json.dumps(
        {**env, "command": "python bench/bus.py --json o", "wall_s": 61.0,
         "result": {"summary": {"mb_per_s": {"raw": {"64B": 1.0}}}}}))
    text = dt.render(data)
    assert text.startswith(dt.HEADER)
    assert text.index("## a_bus") < text.index("## b_other")
    assert ("- bench: `bus`; date (UTC): 2026-12-06T07:00:00Z; wall time 61 s") in text
    assert ("- machine: 2 logical cores (1 physical), Xeon, 7.8 GiB RAM, Linux, "
            "Python 3.11.7, torch 2.1") in text
    assert "- git: `aaaaaaaaaa` (with uncommitted changes)" in text
    assert "| `k` | 2 |" in text  # generic
    page = tmp_path / "tables.md"
    args = ["render", "--data-dir", str(data), "--out", str(page)]
    assert dt.main([*args, "--check"]) == 1  # no page yet
    assert dt.main(args) == 0 and page.read_text() == text
    assert dt.main([*args, "--check"]) == 0
    (data / "c.json").write_text(json.dumps({"result": {}}))
    with pytest.raises(dt.DocTablesError, match="c.json: no 'date'"):
        dt.render(data)
    assert dt.main(args) == 2
