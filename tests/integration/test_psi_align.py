"""Private ID alignment over a real broker: exact result, nothing on the wire but points."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import zmq
import zmq.asyncio

from broker.proxy import BrokerConfig, serve_in_thread
from pubsub import Bus
from pubsub.address import BrokerAddress
from pubsub.buffer import BufferLimits

from parties.alignment.align import AlignConfig, AlignTimeout, align_over_bus
from parties.alignment.psi import DuplicateIds, demo_ids

from tests.conftest import REPO


@pytest.fixture
def thread_broker() -> Iterator[str]:
    broker, thread = serve_in_thread(BrokerConfig(bind="tcp://127.0.0.1:0"))
    try:
        yield str(broker.address)
    finally:
        broker.stop()
        thread.join(5)


def _needles(ids: list[str]) -> list[bytes]:
    """Raw ID bytes and plain hashes of them (raw and hex) that must never cross the bus."""
    out = []
    for x in ids:
        raw = x.encode()
        out.append(raw)
        for h in (hashlib.sha256, hashlib.sha1, hashlib.md5):
            d = h(raw).digest()
            out += [d, d.hex().encode(), d.hex().upper().encode()]
    return out


async def test_two_parties_align_exactly_and_the_wire_carries_no_ids(thread_broker: str
                                                                       ) -> None:
    a, b = demo_ids(300, 0.4, seed=7)
    cfg = AlignConfig(chunk_size=64, window=2, join_timeout_s=10, chunk_timeout_s=20)
    raw_frames: list[bytes] = []
    ctx = zmq.asyncio.Context()
    tap = ctx.socket(zmq.SUB)  # raw frames exactly as the broker forwards them
    tap.setsockopt(zmq.LINGER, 0)
    tap.connect(BrokerAddress.parse(thread_broker).sub_endpoint)
    tap.setsockopt(zmq.SUBSCRIBE, b"psi/")

    async def drain_tap() -> None:
        while True:
            frames = await tap.recv_multipart()
            raw_frames.extend(frames)

    async with Bus(thread_broker, name="spy") as spy:
        # a third bus client on the psi/ prefix, buffers big enough to keep everything
        await spy.subscribe_prefix("psi/", limits=BufferLimits(max_msgs=10_000,
                                                               max_bytes=1 << 26))
        await asyncio.sleep(0.2)  # the tap's and spy's subscriptions reach the broker
        tap_task = asyncio.create_task(drain_tap())
        (ra, sa), (rb, sb) = await asyncio.gather(
            align_over_bus(a, role="active", broker=thread_broker, run_id="t1", config=cfg),
            align_over_bus(b, role="passive", broker=thread_broker, run_id="t1", config=cfg))
        await asyncio.sleep(0.3)
        tap_task.cancel()
        spied = []
        for topic in list(spy._buffers):  # every topic the spy saw
            while (m := spy.try_next(topic)) is not None:
                spied.append(m)
    tap.close(0)
    ctx.term()

    want = tuple(sorted(set(a) & set(b)))
    assert ra.ids == rb.ids == want and len(want) == 120
    assert [a[r] for r in ra.rows] == list(want) and [b[r] for r in rb.rows] == list(want)
    assert sa.n_partner == 300 and sb.n_shared == 120 and sa.chunks_sent == 5

    # the spy saw every request and response chunk of both parties, and the done messages
    topics = {m.topic for m in spied}
    for role in ("active", "passive"):
        assert {f"psi/t1/{role}/req/{i}" for i in range(5)} <= topics
        assert {f"psi/t1/{role}/resp/{i}" for i in range(5)} <= topics
        assert f"psi/t1/{role}/done" in topics
    assert all(m.topic.startswith("psi/t1/") for m in spied)
    blob_spy = b"".join(m.topic.encode() + json.dumps(m.meta).encode()
                        + b"".join(x.tobytes() for x in m.arrays) for m in spied)
    blob_raw = b"".join(raw_frames)
    assert len(blob_raw) >= sa.bytes_sent + sb.bytes_sent - 1024  # the tap got it all
    for needle in _needles(a + b):
        assert needle not in blob_raw and needle not in blob_spy


async def test_partner_missing_times_out_naming_the_hello(thread_broker: str) -> None:
    cfg = AlignConfig(join_timeout_s=0.5)
    with pytest.raises(AlignTimeout) as ei:
        await align_over_bus(["x", "y"], role="active", broker=thread_broker, run_id="lonely",
                             config=cfg)
    assert ei.value.what == "passive hello" and ei.value.topic == "psi/lonely/passive/hello"


async def test_duplicates_fail_before_anything_is_sent(thread_broker: str) -> None:
    with pytest.raises(DuplicateIds):
        await align_over_bus(["x", "y", "x"], role="active", broker=thread_broker,
                             run_id="dup")


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # the launcher's children run with -P (no cwd on sys.path): point them at this checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "sim.cli", "vfl", "align", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def test_cli_launcher_aligns_two_files(tmp_path: Path) -> None:
    from sim.cli import main

    assert main(["vfl", "align", "--make-ids", "400", "--overlap", "0.25", "--seed", "3",
                 "--out", str(tmp_path)]) == 0
    a = (tmp_path / "active-ids.txt").read_text().split()
    b = (tmp_path / "passive-ids.txt").read_text().split()
    # the active party's IDs as a CSV with another column name
    pd.DataFrame({"cust": a, "v": range(len(a))}).to_csv(tmp_path / "a.csv", index=False)
    out = tmp_path / "out"
    pd.DataFrame({"cust": b}).to_csv(tmp_path / "b.csv", index=False)
    r = _cli("--active-ids", str(tmp_path / "a.csv"), "--column", "cust", "--passive-ids",
             str(tmp_path / "b.csv"), "--out", str(out), "--chunk-size", "128",
             "--job-timeout-s", "60")
    assert r.returncode == 0, r.stderr
    assert "aligned: 100 shared IDs" in r.stdout
    want = sorted(set(a) & set(b))
    for role, ids in (("active", a), ("passive", b)):
        df = pd.read_csv(out / f"aligned-{role}.csv", dtype={"id": str})
        assert df["id"].tolist() == want
        assert [ids[r] for r in df["row"]] == want
        doc = json.loads((out / f"align-{role}.json").read_text())
        assert doc["n_own"] == 400 and doc["n_shared"] == 100 and doc["chunks_sent"] == 4
        assert doc["bytes_sent"] > 400 * 33 * 2
        text = (out / f"align-{role}.json").read_text()
        assert not any(x in text for x in a + b)  # no IDs in the report
    events = (out / "events.jsonl").read_text()
    assert not any(x in events for x in a + b)  # nor in the logs


def test_cli_rejects_duplicate_ids_with_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # the launcher in this process (its own start-up is not the point; the python -m
    # sim.cli wiring is tested above), its broker and party children real: the active
    # party's exit code 2 and its one-line message come back through the launcher
    from sim.cli import main

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    (tmp_path / "a.txt").write_text("x\ny\nx\n")
    (tmp_path / "b.txt").write_text("x\nz\n")
    capfd.readouterr()
    code = main(["vfl", "align", "--active-ids", str(tmp_path / "a.txt"), "--passive-ids",
                 str(tmp_path / "b.txt"), "--out", str(tmp_path / "out"), "--timeout-s", "5",
                 "--job-timeout-s", "30"])
    err = capfd.readouterr().err
    assert code == 2, (code, err)
    assert "duplicate IDs" in err and "row 2 repeats row 0" in err
    assert "Traceback" not in err, err


async def test_an_empty_side_aligns_to_nothing(thread_broker: str) -> None:
    cfg = AlignConfig(chunk_size=4, join_timeout_s=10, chunk_timeout_s=10)
    (ra, sa), (rb, sb) = await asyncio.gather(
        align_over_bus([], role="active", broker=thread_broker, run_id="e", config=cfg),
        align_over_bus(["p", "q", "r", "s", "t"], role="passive", broker=thread_broker,
                       run_id="e", config=cfg))
    assert ra.ids == rb.ids == () and rb.rows.shape == (0,)
    assert (sa.n_partner, sb.n_partner, sa.chunks_sent, sb.chunks_sent) == (5, 0, 0, 2)


async def test_a_party_process_fed_a_forged_chunk_exits_4_naming_the_sender(
        thread_broker: str, tmp_path: Path) -> None:
    # the honest party is a real `psfl vfl align --role active` process; the passive
    # party, in this process, puts a point that is not on P-256 into its request chunk 1
    from sim.faults.psi_forge import forging

    a, b = demo_ids(60, 0.5, seed=11)
    (tmp_path / "a.txt").write_text("".join(x + "\n" for x in a))
    cfg = AlignConfig(chunk_size=16, window=2, join_timeout_s=30, chunk_timeout_s=30)
    forger = asyncio.create_task(align_over_bus(
        b, role="passive", broker=thread_broker, run_id="forged", config=cfg,
        connect=forging(lambda name: Bus(thread_broker, name=name), kind="req", chunk=1,
                        point=7)))
    try:
        r = await asyncio.to_thread(
            _cli, "--role", "active", "--broker", thread_broker, "--insecure", "--run-id",
            "forged", "--ids", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out"),
            "--chunk-size", "16", "--timeout-s", "30", timeout=120)
    finally:
        forger.cancel()
        await asyncio.gather(forger, return_exceptions=True)
    assert r.returncode == 4, r.stderr
    assert ("error (active party): malformed points from the passive party in passive req "
            "chunk 1: point 7 of the chunk is not a point of P-256") in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
