"""Out-of-core pieces without a socket: the block-shuffled batch order, the hashed row
split, the on-disk row store, shard checks, the streamed encoder fit and the
Criteo-shaped generator."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parties.data.criteo import CriteoSpec, party_columns, write_criteo
from parties.data import DataError
from parties.data.rowstore import DiskRows, RowStoreError, RowWriter
from parties.algorithms.schedule import BlockBatches, batch_order, num_batches
from parties.data.stream import (HashSplit, ShardError, fit_encoder, hash_split, inspect,
                            iter_chunks, write_cache)
from parties.data.treatments import TreatmentPolicy
from tests.bounds import above, below


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), b=st.integers(1, 300), k=st.integers(1, 700),
       w=st.integers(1, 3000), epoch=st.integers(0, 3))
def test_block_order_covers_every_row_once_in_whole_batches(n: int, b: int, k: int, w: int,
                                                            epoch: int) -> None:
    bb = BlockBatches(n, b, seed=7, epoch=epoch, block_rows=k, window_rows=w)
    assert len(bb) == num_batches(n, b)
    batches = [bb[i] for i in range(len(bb))]
    rows = np.concatenate(batches)
    assert np.array_equal(np.sort(rows), np.arange(n))
    assert all(len(x) == b for x in batches[:-1])
    # a batch reads few blocks of the file: at most a window's worth plus its two ends
    per_window = max(b, w // b * b)
    assert max(len(np.unique(x // k)) for x in batches) <= per_window // k + 2


def test_block_order_is_shared_and_reshuffled_each_epoch() -> None:
    a = BlockBatches(10_000, 64, seed=3, epoch=1, block_rows=512, window_rows=4096)
    b = BlockBatches(10_000, 64, seed=3, epoch=1, block_rows=512, window_rows=4096)
    c = BlockBatches(10_000, 64, seed=3, epoch=2, block_rows=512, window_rows=4096)
    assert all(np.array_equal(a[i], b[i]) for i in range(len(a)))
    assert not np.array_equal(a[0], c[0])
    assert np.array_equal(a[-1], a[len(a) - 1])
    with pytest.raises(IndexError):
        a[len(a)]
    assert isinstance(batch_order(100, 10, seed=0, epoch=0, shuffle="full"), list)
    with pytest.raises(ValueError, match="shuffle"):
        batch_order(100, 10, seed=0, epoch=0, shuffle="random")


@pytest.mark.stochastic
def test_hash_split_fractions_caps_and_determinism() -> None:
    pos = np.arange(200_000)
    where = hash_split(pos, seed=1, test_frac=0.3)
    below(abs((where == 2).mean() - 0.3), 0.01, "test fraction error")
    below(abs((where == 1).mean() - 0.07), 0.01, "validation fraction error")
    assert np.array_equal(where, hash_split(pos, seed=1, test_frac=0.3))
    assert not np.array_equal(where, hash_split(pos, seed=2, test_frac=0.3))
    capped = HashSplit.for_rows(200_000, seed=1, test_frac=0.3, val_frac=0.1,
                                val_max_rows=1000, test_max_rows=5000)(pos)
    assert abs((capped == 2).sum() - 5000) < 400 and abs((capped == 1).sum() - 1000) < 150
    assert ((capped == 0) == (where == 0)).all()  # caps never move rows into training


def test_disk_rows_read_what_was_written(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10_001, 5)).astype(np.float32)
    with RowWriter(tmp_path / "x.f32", 5) as w:
        for i in range(0, len(x), 999):
            w.append(x[i:i + 999])
    rows = DiskRows(tmp_path / "x.f32", len(x), 5, block_rows=128, cache_blocks=3)
    pick = rng.integers(0, len(x), 700)
    assert np.array_equal(rows[pick].numpy(), x[pick])
    again = pickle.loads(pickle.dumps(rows))
    assert np.array_equal(again[pick[:5]].numpy(), x[pick[:5]])
    rows.save_descriptor(tmp_path / "d.json")
    assert DiskRows.load_descriptor(tmp_path / "d.json").shape == (10_001, 5)
    with pytest.raises(IndexError):
        rows.read(np.array([len(x)]))
    with pytest.raises(RowStoreError, match="x.f32.*bytes"):
        DiskRows(tmp_path / "x.f32", len(x) + 1, 5)
    with pytest.raises(RowStoreError, match="cannot open"):
        DiskRows(tmp_path / "absent.f32", 1, 1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "zz", None]), min_size=0, max_size=60),
       st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(float("nan"))), min_size=60,
                max_size=60))
def test_packed_rows_expand_to_the_dense_encoding(cats: list, nums: list) -> None:
    from parties.data.encoders import ColumnCode, FittedEncoder

    enc = FittedEncoder(columns=(
        ColumnCode(name="n", kind="numeric", fill=1.5, mean=0.5, scale=2.0, lo=-10, hi=10),
        ColumnCode(name="c", kind="categorical", categories=("__missing__", "a", "b")),
        ColumnCode(name="d", kind="categorical", categories=("b", "c")),
        ColumnCode(name="h", kind="hashed", buckets=64)))
    frame = pd.DataFrame({"n": nums[:len(cats)], "c": cats, "d": cats[::-1], "h": cats})
    packed = enc.transform(frame, packed=True)
    assert packed.shape == (len(cats), 4)  # "zz" and None in "d" are unknown: index -1
    assert np.array_equal(enc.packing().apply(packed), enc.transform(frame))
    with pytest.raises(ValueError, match="slot 1"):
        enc.packing().apply(np.array([[0.0, 3.0, 0.0, 0.0]], dtype=np.float32))


@pytest.fixture(scope="module")
def criteo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_criteo(tmp_path_factory.mktemp("criteo"),
                        CriteoSpec(rows=30_000, shard_rows=10_000, row_group_rows=4096,
                                   max_levels=50_000))


@pytest.mark.stochastic
def test_generator_writes_aligned_shards_per_party(criteo: dict[str, Path]) -> None:
    cols = party_columns()
    a, p = inspect(criteo["active"]), inspect(criteo["passive"])
    assert a.rows == p.rows == 30_000 and len(a.files) == 3
    assert list(a.columns) == cols["active"] and list(p.columns) == cols["passive"]
    assert len(cols["active"]) + len(cols["passive"]) == 1 + 13 + 26
    labels = pd.read_parquet(criteo["active"], columns=["label"])["label"]
    above(labels.mean(), 0.15, "positive rate")
    below(labels.mean(), 0.35, "positive rate")
    # the same spec again: kept; another spec in the same place: refused
    root = criteo["active"].parent
    write_criteo(root, CriteoSpec(rows=30_000, shard_rows=10_000, row_group_rows=4096,
                                  max_levels=50_000))
    with pytest.raises(ValueError, match="another table"):
        write_criteo(root, CriteoSpec(rows=1000))


def test_a_bad_shard_is_named(criteo: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(criteo["passive"], bad)
    pd.DataFrame({"I7": ["x"]}).to_parquet(bad / "part-00009.parquet")
    with pytest.raises(ShardError, match="part-00009.parquet.*schema differs"):
        inspect(bad)
    (bad / "part-00009.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ShardError, match="part-00009.parquet.*not a readable Parquet"):
        inspect(bad)
    (bad / "part-00009.parquet").unlink()
    good = bad / "part-00001.parquet"
    good.write_bytes(good.read_bytes()[:-200] + b"\0" * 200)  # a damaged footer
    with pytest.raises(ShardError, match="part-00001.parquet"):
        inspect(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no .parquet files"):
        inspect(empty)


def test_streamed_encoder_and_cache(criteo: dict[str, Path], tmp_path: Path) -> None:
    info = inspect(criteo["passive"])
    cols = list(info.columns)
    split = HashSplit(seed=0, test_frac=0.3, val_frac=0.1)
    enc = fit_encoder(info, cols, split, policy=TreatmentPolicy(onehot_max_levels=32),
                      chunk_rows=5000, clip_quantile=0.001)
    kinds = {t.column: t.kind for t in enc.treatments}
    assert {kinds[f"I{j}"] for j in range(7, 14)} == {"numeric"}
    assert "hashed" in set(kinds.values())
    num = [c for c in enc.columns if c.kind == "numeric"]
    assert all(np.isfinite(c.lo) and c.hi >= c.lo for c in num)
    rows = write_cache(info, cols, split, enc, chunk_rows=7000, cache_dir=tmp_path / "c")
    where = split(np.arange(info.rows))
    assert rows.x_train.n == (where == 0).sum() and len(rows.x_test) == (where == 2).sum()
    # the cache holds exactly what the encoder gives for the training rows, in row order
    frame = pd.concat([f for _, f in iter_chunks(info, cols, 10_000)], ignore_index=True)
    want = enc.transform(frame.iloc[np.flatnonzero(where == 0)[:50]])
    assert np.array_equal(rows.x_train[np.arange(50)].numpy(), want)
    # one-hot columns are stored packed: one float per raw column on disk
    assert "onehot" in set(kinds.values()) and rows.x_train.stored_width < enc.width
    assert (rows.x_train.path and Path(rows.x_train.path).stat().st_size
            == rows.x_train.n * len(enc.columns) * 4)
    again = pickle.loads(pickle.dumps(rows.x_train))
    assert again.unpack == rows.x_train.unpack
    assert np.array_equal(again[np.arange(50)].numpy(), want)
    assert np.array_equal(rows.x_test[:50], enc.transform(
        frame.iloc[np.flatnonzero(where == 2)[:50]]))
    # standardised numeric outputs of the training rows: mean 0, sd 1 (after clipping)
    first = rows.x_train.read(np.arange(rows.x_train.n))[:, 0]
    assert abs(first.mean()) < 1e-3 and abs(first.std() - 1) < 1e-3
    d = enc.to_dict()
    assert type(enc).from_dict(d) == enc


def test_convert_csv_to_party_shards(tmp_path: Path) -> None:
    from parties.data.convert import convert_csv

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"y": rng.integers(0, 2, 2500), "a": rng.normal(size=2500),
                          "b": rng.choice(["u", "v"], 2500), "c": rng.integers(0, 9, 2500)})
    src = tmp_path / "t.tsv"
    frame.to_csv(src, sep="\t", index=False, header=False)
    got = convert_csv(src, tmp_path / "out", parties={"active": ["y", "a"],
                                                      "passive": ["b", "c"]},
                      shard_rows=1000, delimiter="\t", names=["y", "a", "b", "c"],
                      block_mb=1)
    assert got["rows"] == 2500
    act, pas = inspect(tmp_path / "out" / "active"), inspect(tmp_path / "out" / "passive")
    assert act.columns == ("y", "a") and pas.columns == ("b", "c") and pas.rows == 2500
    back = pd.read_parquet(tmp_path / "out" / "passive")
    assert back["b"].tolist() == frame["b"].tolist()  # row order kept
    with pytest.raises(DataError, match="already holds"):
        convert_csv(src, tmp_path / "out", parties={"active": ["y"]}, delimiter="\t",
                    names=["y", "a", "b", "c"])
    with pytest.raises(DataError, match="'z'"):
        convert_csv(src, tmp_path / "o2", parties={"active": ["z"]}, delimiter="\t",
                    names=["y", "a", "b", "c"])
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n3,4,5\n")
    with pytest.raises(DataError, match="bad.csv"):
        convert_csv(bad, tmp_path / "o3")


def test_a_streamed_run_sizes_its_broker_subscriptions(criteo: dict[str, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A party subscribes one topic per batch of an epoch: the launcher's own broker
    allows that many for a streamed run (45 million rows at B = 256 are 175,782 batches,
    past the broker's default 65,536: the full Criteo run failed on it)."""
    from types import SimpleNamespace

    import parties.data.stream as stream
    from parties.config import DataSection, VflConfig
    from sim.launch.vfl import BROKER_SUBSCRIPTIONS, subscriptions_needed

    cfg = VflConfig(label="label", batch_size=256,
                    data=DataSection(row_split="hash", stream=True, party_datasets=(str(criteo["active"]), str(criteo["passive"]))))
    assert subscriptions_needed(cfg) == BROKER_SUBSCRIPTIONS  # 30,000 rows: 118 batches
    monkeypatch.setattr(stream, "inspect", lambda path: SimpleNamespace(rows=45_000_000))
    assert subscriptions_needed(cfg) == 175_782 + 4096
    assert subscriptions_needed(VflConfig(label="label", data=DataSection(stream=False))) == \
        BROKER_SUBSCRIPTIONS
