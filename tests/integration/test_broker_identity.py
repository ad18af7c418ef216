"""Identity-scoped publishing at a real CURVE broker process (issue 27, case 4): a
message's publisher id must be its sender's own, and with a run membership only a run's
members publish on its topics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from conftest import BrokerProcess
from pubsub import Bus, BusConfig, DeadlineExceeded
from pubsub.address import BrokerAddress
from pubsub.codec import encode
from pubsub.control import request_stats
from pubsub.membership import membership
from pubsub.security import CurveClient, generate_certificate

CFG = BusConfig(connect_timeout_s=5.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Path]]:
    """A CURVE broker with identities active, passive and mallory (role passive, a
    legitimate key); run r1 has members active and passive, run r2 all three."""
    keys = tmp_path_factory.mktemp("idkeys")
    generate_certificate(keys, "broker")
    for name, role in (("active", "active"), ("passive", "passive"), ("mallory", "passive")):
        generate_certificate(keys, name, role=role)
    members = keys.parent / "members.toml"
    members.write_text(membership({"r1": ["active", "passive"],
                                   "r2": ["active", "passive", "mallory"]}).as_toml())
    b = BrokerProcess(tmp_path_factory.mktemp("idbroker"), "--members", str(members),
                      keys=keys)
    yield b, keys
    b.stop()
    assert b.proc.returncode == 0


def _pub(ctx: zmq.Context[Any], keys: Path, who: str, endpoint: str) -> zmq.Socket:
    s = ctx.socket(zmq.PUB)
    s.setsockopt(zmq.LINGER, 0)
    CurveClient.from_dir(keys, who).apply(s)
    s.connect(endpoint)
    return s


async def _drain(bus: Bus, topic: str) -> list[Any]:
    got = []
    while True:
        try:
            got.append(await bus.next(topic, timeout_s=0.5))
        except DeadlineExceeded:
            return got


async def test_publisher_ids_carry_the_identity_and_forgeries_are_dropped(
        setup: tuple[BrokerProcess, Path]) -> None:
    """mallory (a valid passive key, member of r2) publishes embeddings under the passive
    party's publisher id: the broker drops them (``spoofed``, by identity); the same
    messages under mallory's own id are delivered, and so are the passive party's."""
    b, keys = setup
    async with Bus(b.address, name="a", config=CFG,
                   security=CurveClient.from_dir(keys, "active")) as a, \
            Bus(b.address, name="p", config=CFG,
                security=CurveClient.from_dir(keys, "passive")) as p:
        assert p.publisher_id == f"passive/{p.client_id}"
        assert a.publisher_id.startswith("active/")
        await a.subscribe("emb/r2/0")
        await asyncio.sleep(0.3)
        ctx = zmq.Context()
        raw = _pub(ctx, keys, "mallory", BrokerAddress.parse(b.address).endpoint(p.hello.pub_offset))
        try:
            await asyncio.sleep(0.5)  # the PUB learns the broker's subscriptions
            for i in range(4):
                raw.send_multipart(encode("emb/r2/0", [np.full((2, 3), i, np.float32)],
                                          {"forged": True}, seq=i + 1,
                                          publisher=p.publisher_id))
            for i in range(3):
                raw.send_multipart(encode("emb/r2/0", [np.zeros((2, 3), np.float32)],
                                          {"own": True}, seq=i + 1,
                                          publisher=f"mallory/x-{i}"))
            await p.publish("emb/r2/0", [np.ones((2, 3), np.float32)], {"real": True})
            got = await _drain(a, "emb/r2/0")
        finally:
            raw.close(0)
            ctx.term()
        assert not any(m.meta.get("forged") for m in got)
        assert sum(1 for m in got if m.meta.get("own")) == 3
        assert [m.publisher for m in got if m.meta.get("real")] == [p.publisher_id]
        stats = request_stats(b.address, security=CurveClient.from_dir(keys, "active"))
        assert stats["spoofed"] == {"mallory": 4}


async def test_only_a_runs_members_publish_in_it(setup: tuple[BrokerProcess, Path]) -> None:
    """mallory may publish in r2 but not in r1 (``not_member``); nobody may publish in a
    run the membership does not list (r9), not even the active party; the members'
    messages in r1 pass."""
    b, keys = setup
    async with Bus(b.address, name="a", config=CFG,
                   security=CurveClient.from_dir(keys, "active")) as a, \
            Bus(b.address, name="p", config=CFG,
                security=CurveClient.from_dir(keys, "passive")) as p, \
            Bus(b.address, name="m", config=CFG,
                security=CurveClient.from_dir(keys, "mallory")) as m:
        before = request_stats(b.address, security=CurveClient.from_dir(keys, "active"))
        await a.subscribe("emb/r1/7")
        await p.subscribe("grad/r9/7")
        await asyncio.sleep(0.3)
        for i in range(3):
            await m.publish("emb/r1/7", [np.zeros((1, 2), np.float32)], {"i": i})
        await p.publish("emb/r1/7", [np.ones((1, 2), np.float32)], {"member": True})
        await a.publish("grad/r9/7", [np.ones((1, 2), np.float32)], {"r9": True})
        got = await _drain(a, "emb/r1/7")
        assert [x.meta for x in got] == [{"member": True}]
        assert await _drain(p, "grad/r9/7") == []
        after = request_stats(b.address, security=CurveClient.from_dir(keys, "active"))
        nm = {k: after["not_member"].get(k, 0) - before["not_member"].get(k, 0)
              for k in ("mallory", "active", "passive")}
        assert nm == {"mallory": 3, "active": 1, "passive": 0}


def test_a_membership_naming_an_unknown_identity_stops_the_broker(
        tmp_path: Path) -> None:
    """A typo in the membership file is refused at start, naming the identity."""
    keys = tmp_path / "keys"
    keys.mkdir()
    generate_certificate(keys, "broker")
    generate_certificate(keys, "active", role="active")
    members = tmp_path / "m.toml"
    members.write_text('[runs.r1]\nidentities = ["active", "pasive"]\n')
    with pytest.raises(RuntimeError, match="did not start"):
        BrokerProcess(tmp_path, "--members", str(members), keys=keys)
