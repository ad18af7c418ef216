"""The bounds checked before any process starts (:mod:`parties.data.limits`): the line
scan in chunks, the column cap, the workers per core, the memory estimate and its
refusal, and the configuration's sanity caps (pure: no process, no socket)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from parties.config import load_vfl_config
from parties.config.sections import MAX_WIDTH, MAX_WORKERS
from parties.core.sysinfo import memory_available
from parties.data import LineTooLong, TooManyColumns, load_table
from parties.data.launchcheck import csv_header
from parties.data.limits import (PARAM_STATE_BYTES, PROCESS_BYTES, check_columns,
                                 check_csv_shape, check_memory, check_workers,
                                 estimate_memory, first_line, mlp_params, resnet_params,
                                 scan_lines)
from pubsub.config import ConfigError

GIB = 1 << 30


def test_the_scan_counts_lines_and_refuses_the_first_long_one_by_number(tmp_path: Path) -> None:
    ok = tmp_path / "ok.csv"
    ok.write_bytes(b"a,b\n" + b"1,2\n" * 1000 + b"3,4")  # no newline at the end
    assert scan_lines(ok, 1024).lines == 1002
    # a line of exactly the bound passes, one byte more is refused, across chunk edges
    for extra, refused in ((0, False), (1, True)):
        f = tmp_path / f"long{extra}.csv"
        f.write_bytes(b"a,b\n1,2\n" + b"x" * (5000 + extra) + b"\n1,2\n")
        if refused:
            with pytest.raises(LineTooLong) as err:
                scan_lines(f, 5000)
            assert (err.value.line, err.value.limit, err.value.path) == (3, 5000, str(f))
            assert "line 3" in str(err.value) and str(f) in str(err.value)
        else:
            assert scan_lines(f, 5000).lines == 4
    tail = tmp_path / "tail.csv"  # the long line is the last, without a newline
    tail.write_bytes(b"a\n" + b"9" * 3000)
    with pytest.raises(LineTooLong) as err:
        scan_lines(tail, 2048)
    assert err.value.line == 2
    gz = tmp_path / "long.csv.gz"
    with gzip.open(gz, "wb") as out:
        out.write(b"a,b\n" + b"7" * 4096 + b"\n")
    with pytest.raises(LineTooLong) as err:
        scan_lines(gz, 2048)
    assert err.value.line == 2


def test_a_header_is_read_up_to_its_bound_only(tmp_path: Path) -> None:
    f = tmp_path / "h.csv"
    f.write_bytes(b"\xef\xbb\xbfa,b,y\n1,2,0\n")
    assert first_line(f, 1024) == "a,b,y"
    assert csv_header(f, 1024) == ["a", "b", "y"]
    wide = tmp_path / "wide.csv"
    wide.write_bytes(b",".join(b"c%d" % i for i in range(2000)) + b"\n")
    with pytest.raises(LineTooLong) as err:
        csv_header(wide, 1024)
    assert err.value.line == 1


def test_columns_above_the_cap_are_refused_naming_the_count(tmp_path: Path) -> None:
    check_columns("t.csv", 20_000, 20_000)
    with pytest.raises(TooManyColumns) as err:
        check_columns("t.csv", 100_000, 20_000)
    assert (err.value.count, err.value.limit) == (100_000, 20_000)
    assert "100,000 columns" in str(err.value) and "'t.csv'" in str(err.value)
    f = tmp_path / "wide.csv"
    f.write_text(",".join(f"c{i}" for i in range(300)) + "\n" + ",".join("0" * 300) + "\n")
    with pytest.raises(TooManyColumns):
        check_csv_shape(f, 1 << 20, 299)
    assert check_csv_shape(f, 1 << 20, 300).lines == 2


def test_the_pandas_read_path_is_bounded_too(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("a,b,y\n1,2,0\n3," + "9" * 5000 + ",1\n")
    with pytest.raises(LineTooLong):
        load_table(str(f), max_line_bytes=2048)
    with pytest.raises(TooManyColumns):
        load_table(str(f), max_columns=2)
    frame, _ = load_table(str(f))
    assert frame.shape == (2, 3)


def test_more_workers_than_the_cores_run_are_refused_naming_the_key() -> None:
    check_workers(load_vfl_config(None, ["workers.passive=64", "workers.active=64"]), cores=2)
    with pytest.raises(ConfigError) as err:
        check_workers(load_vfl_config(None, ["workers.passive=65"]), cores=2)
    assert err.value.key == "vfl.workers.passive" and "2 cores" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_workers(load_vfl_config(None, ["workers.active=40"]), cores=1)
    assert err.value.key == "vfl.workers.active"
    cfg = load_vfl_config(None, ["passive_parties=2", "workers.per_passive_party=[2, 100]"])
    with pytest.raises(ConfigError) as err:
        check_workers(cfg, cores=2)
    assert err.value.key == "vfl.workers.per_passive_party"
    check_workers(cfg, cores=2, parties=["active", "passive"])  # a job party: its own only


@pytest.mark.parametrize("setting, key", [
    (f"model.embedding_dim={10**9}", "vfl.model.embedding_dim"),
    (f"model.bottom_hidden=[64, {MAX_WIDTH + 1}]", "vfl.model.bottom_hidden"),
    ("model.resnet_width=2000000", "vfl.model.resnet_width"),
    (f"workers.passive={10**4}", "vfl.workers.passive"),
    (f"workers.per_passive_party=[2, {MAX_WORKERS + 1}]", "vfl.workers.per_passive_party"),
    ("workers.p=100000", "vfl.workers.p"),
    ("data.max_columns=0", "vfl.data.max_columns"),
    ("data.max_line_bytes=10", "vfl.data.max_line_bytes"),
])
def test_the_sanity_caps_refuse_a_value_naming_its_key(setting: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_vfl_config(None, [setting, "passive_parties=2"] if "per_passive" in setting
                        else [setting])
    assert err.value.key == key


def test_the_estimate_adds_up_its_documented_parts() -> None:
    """A tiny run worked by hand: ``vfl`` (one worker a party), 3 columns a party,
    bottom 3→4→2, top (concat) 4→5→1, B = 10, p = q = 5, inflight_max 4."""
    cfg = load_vfl_config(None, ["algo=vfl", "model.bottom_hidden=[4]", "model.embedding_dim=2",
                                 "model.top_hidden=[5]", "batch_size=10"])
    est = estimate_memory(cfg, columns={"active": 3, "passive": 3}, rows=100, table_columns=7)
    bottom, top = mlp_params([3, 4, 2]), mlp_params([4, 5, 1])
    assert (bottom, top) == (26, 31)
    acts_a, acts_p = 2 * 10 * (3 + 4 + 2 + 4 + 5) * 4, 2 * 10 * (3 + 4 + 2) * 4
    buffers = (5 + 5) * 10 * 2 * 4
    models = (bottom + top) * PARAM_STATE_BYTES + bottom * PARAM_STATE_BYTES
    batches = acts_a + acts_p + 2 * buffers
    replicas = ((bottom + top) * PARAM_STATE_BYTES + acts_a
                + bottom * PARAM_STATE_BYTES + acts_p + 3 * bottom * 4)
    table = 2 * 100 * (7 + 3) * 8
    assert est.parts == (
        ("vfl.model.top_hidden", models, est.parts[0][2]),  # 5 is the widest layer
        ("vfl.batch_size", batches, est.parts[1][2]),
        ("vfl.dataset", table, est.parts[2][2]),
        ("vfl.workers.active", replicas, est.parts[3][2]),
        ("", 3 * PROCESS_BYTES, est.parts[4][2]))
    assert est.total == models + batches + replicas + table + 3 * PROCESS_BYTES
    one = estimate_memory(cfg, columns={"passive": 3}, rows=100, table_columns=7,
                          parties=["passive"], broker=False)
    assert one.total < est.total and one.parts[4][1] == PROCESS_BYTES
    assert resnet_params(10, 2, depth=0, width=8) == 10 * 8 + 8 + 8 * 2 + 2
    # per-party files: each party's own table
    own = estimate_memory(cfg, columns={"active": 3, "passive": 3},
                          rows={"active": 100, "passive": 50},
                          table_columns={"active": 7, "passive": 4})
    assert own.parts[2][1] == (100 * (7 + 3) + 50 * (4 + 3)) * 8


def test_the_estimate_grows_with_widths_workers_and_the_table() -> None:
    def total(*sets: str, rows: int = 1000) -> int:
        cfg = load_vfl_config(None, list(sets))
        return estimate_memory(cfg, columns={"active": 10, "passive": 10}, rows=rows,
                               table_columns=21).total

    small = total()
    assert total("model.embedding_dim=4096") > small
    assert total("workers.passive=8") > total("workers.passive=2") > total("workers.passive=1")
    assert total(rows=10**6) - small == 2 * (10**6 - 1000) * (21 + 10) * 8
    assert total("workers.mode=process", "workers.passive=4") - total("workers.passive=4") \
        == (2 + 4) * PROCESS_BYTES


def test_a_run_beyond_the_memory_available_is_refused_naming_what_to_change() -> None:
    cols = {"active": 10, "passive": 10}
    wide = load_vfl_config(None, ["model.embedding_dim=1000000", "model.bottom_hidden=[100000]"])
    est = estimate_memory(wide, columns=cols, rows=1000, table_columns=21)
    with pytest.raises(ConfigError) as err:
        check_memory(est, (8 * GIB, "cgroup memory limit"))
    assert err.value.key == "vfl.model.embedding_dim"
    said = str(err.value)
    assert f"about {est.total / GIB:,.1f} GiB" in said and "8.0 GiB" in said
    assert "cgroup memory limit" in said
    check_memory(est, (est.total, "available memory"))  # exactly what is there: fits
    # the replicas push it over: name the workers
    many = load_vfl_config(None, ["model.bottom_hidden=[4096, 4096]", "workers.passive=64"])
    est = estimate_memory(many, columns=cols, rows=1000, table_columns=21)
    replicas = est.parts[3][1]
    with pytest.raises(ConfigError) as err:
        check_memory(est, (est.total - replicas // 2, "available memory"))
    assert err.value.key == "vfl.workers.passive"
    # the table alone does not fit: name the dataset
    default = load_vfl_config(None, [])
    est = estimate_memory(default, columns=cols, rows=10**9, table_columns=21)
    with pytest.raises(ConfigError) as err:
        check_memory(est, (16 * GIB, "MemAvailable"))
    assert err.value.key == "vfl.dataset" and "1,000,000,000 rows" in str(err.value)
    # a batch that does not fit: name the batch size
    big = load_vfl_config(None, [f"batch_size={10**8}"])
    est = estimate_memory(big, columns=cols, rows=1000, table_columns=21)
    with pytest.raises(ConfigError) as err:
        check_memory(est, (16 * GIB, "MemAvailable"))
    assert err.value.key == "vfl.batch_size"


def test_a_named_dataset_is_estimated_before_launch_and_the_generated_one_by_its_rows() -> None:
    from parties.data.launchcheck import check_before_launch

    free = memory_available()[0]
    rows = free // (150 * 8) + 1  # 100 + 50 columns a cell of 8 bytes, in each of 2 parties
    cfg = load_vfl_config(None, ["dataset=synthetic", f"data.synthetic_rows={rows}"])
    with pytest.raises(ConfigError) as err:
        check_before_launch(cfg)
    assert err.value.key == "vfl.data.synthetic_rows"
    check_before_launch(load_vfl_config(None, []))  # bank: fits
    with pytest.raises(ConfigError) as err:
        check_before_launch(load_vfl_config(None, ["model.embedding_dim=1000000",
                                                   "model.top_hidden=[1000000]"]))
    assert err.value.key == "vfl.model.embedding_dim"


def test_the_default_run_fits_and_memory_is_read_from_this_machine() -> None:
    free, source = memory_available()
    assert free > 0 and source in ("available memory", "MemAvailable", "cgroup memory limit")
    cfg = load_vfl_config(None, [])
    est = estimate_memory(cfg, columns={"active": 8, "passive": 8}, rows=45_211,
                          table_columns=17)
    assert est.total < 1 * GIB  # the demo fits any machine that runs the suite


def test_a_field_longer_than_the_csv_modules_default_is_read_within_the_line_bound(
        tmp_path: Path) -> None:
    """A 200 KB field in the first row (the csv module stops at 128 KiB) is no
    traceback: the empty-column check reads fields up to ``max_line_bytes``."""
    import csv

    from parties.data import EmptyColumn
    from parties.data.launchcheck import check_empty_columns

    f = tmp_path / "fat.csv"
    f.write_text("a,b,c\n1," + "x" * 200_000 + ",\n2,3,\n")
    limit = csv.field_size_limit()
    with pytest.raises(EmptyColumn) as err:
        check_empty_columns(f, ["a", "b", "c"], {"active": ("a", "b"), "passive": ("c",)})
    assert err.value.column == "c"
    assert csv.field_size_limit() == limit  # the module's limit restored


def test_the_id_reader_and_fedforges_file_reader_are_bounded_too(tmp_path: Path) -> None:
    from parties.alignment.align import IdFileError, load_ids
    from sim.fedforge import FedForgeError, _table

    ids = tmp_path / "ids.csv"
    with ids.open("wb") as f:
        f.write(b"id\n7\n")
        f.write(b"9" * (17 << 20))  # one 17 MiB line: past the 16 MiB bound
    with pytest.raises(IdFileError) as err:
        load_ids(ids)
    assert "line 3" in str(err.value) and str(ids) in str(err.value)
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(20_001)) + "\n")
    with pytest.raises(FedForgeError) as ferr:
        _table(str(wide), "parties")
    assert "20,001 columns" in str(ferr.value)


def test_the_launchers_preflight_keeps_the_memory_refusal_for_the_python_api() -> None:
    from parties.data.preflight import preflight

    with pytest.raises(ConfigError) as err:
        preflight(load_vfl_config(None, ["model.embedding_dim=1000000",
                                         "model.top_hidden=[1000000]"]))
    assert err.value.key == "vfl.model.embedding_dim" and "GiB" in str(err.value)
