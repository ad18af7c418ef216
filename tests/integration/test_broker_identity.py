"""Identity-scoped publishing at a real CURVE broker process: a
message's publisher id must be its sender's own, and with a run membership only a run's
members publish on its topics."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
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
from pubsub.errors import NotRunMember, TooManySubscriptions
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
                                   "r2": ["active", "passive", "mallory"],
                                   "r3": ["active", "passive", "mallory"]},
                                  {"r3": ["passive", "mallory"]}).as_toml())
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


@contextlib.asynccontextmanager
async def _clients(address: str, keys: Path, *names: str,
                   lax: bool = False) -> AsyncIterator[list[Bus]]:
    """One connected bus client per identity in ``names``; ``lax``: clients that ignore
    the run membership the broker told them (as a hostile client would), so the
    broker's own enforcement is what the test sees."""
    async with contextlib.AsyncExitStack() as stack:
        buses = [await stack.enter_async_context(
            Bus(address, name=n[0], config=CFG, security=CurveClient.from_dir(keys, n)))
            for n in names]
        for bus in buses if lax else ():
            assert bus.hello is not None and bus.hello.runs is not None
            bus.hello = dataclasses.replace(bus.hello, runs=None)
        yield buses


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
    async with _clients(b.address, keys, "active", "passive", "mallory", lax=True) as (a, p, m):
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
        # r9's gradients: nobody may read them (the subscription is refused), so the
        # active party's publisher never even sends them
        assert nm == {"mallory": 3, "active": 0, "passive": 0}
        reads = after["not_member_reads"].get("passive", 0) - before["not_member_reads"].get(
            "passive", 0)
        assert reads == 1


async def test_owned_members_use_only_their_own_topics(setup: tuple[BrokerProcess, Path]
                                                        ) -> None:
    """Run r3 isolates its owned members (two passive parties, "passive" and "mallory"):
    mallory's embeddings on the passive party's channel are dropped (``not_member``) and
    its subscription to the passive party's gradients refused (``not_member_reads``); its
    own channel and the active party's traffic to each work."""
    b, keys = setup
    async with _clients(b.address, keys, "active", "passive", "mallory", lax=True) as (a, p, m):
        before = request_stats(b.address, security=CurveClient.from_dir(keys, "active"))
        await a.subscribe("emb/r3/passive/0")
        await a.subscribe("emb/r3/mallory/0")
        await m.subscribe("grad/r3/passive/0")  # another owned member's: refused
        await p.subscribe("grad/r3/passive/0")
        await m.subscribe("grad/r3/mallory/0")
        await asyncio.sleep(0.3)
        await m.publish("emb/r3/passive/0", [np.zeros((1, 2), np.float32)], {"forged": 1})
        await m.publish("emb/r3/mallory/0", [np.zeros((1, 2), np.float32)], {"own": 1})
        await p.publish("emb/r3/passive/0", [np.ones((1, 2), np.float32)], {"real": 1})
        await a.publish("grad/r3/passive/0", [np.ones((1, 2), np.float32)], {"to": "p"})
        await a.publish("grad/r3/mallory/0", [np.ones((1, 2), np.float32)], {"to": "m"})
        assert [x.meta for x in await _drain(a, "emb/r3/passive/0")] == [{"real": 1}]
        assert [x.meta for x in await _drain(a, "emb/r3/mallory/0")] == [{"own": 1}]
        assert [x.meta for x in await _drain(p, "grad/r3/passive/0")] == [{"to": "p"}]
        assert await _drain(m, "grad/r3/passive/0") == []
        assert [x.meta for x in await _drain(m, "grad/r3/mallory/0")] == [{"to": "m"}]
        after = request_stats(b.address, security=CurveClient.from_dir(keys, "active"))
        assert after["not_member"].get("mallory", 0) - before["not_member"].get(
            "mallory", 0) == 1
        assert after["not_member_reads"].get("mallory", 0) - before[
            "not_member_reads"].get("mallory", 0) == 1


async def test_a_client_is_told_which_runs_admit_it(setup: tuple[BrokerProcess, Path]
                                                    ) -> None:
    """The hello tells each identity the runs it is a member of; a subscription or a
    publish the broker would refuse raises NotRunMember at once, naming the run, the
    identity and its runs (not silence); a member's goes through."""
    b, keys = setup
    async with _clients(b.address, keys, "passive", "mallory") as (p, m):
        assert m.hello is not None and m.hello.runs is not None
        assert sorted(m.hello.runs.runs) == ["r2", "r3"]
        with pytest.raises(NotRunMember) as exc:
            await m.subscribe("grad/r1/3")
        assert (exc.value.run, exc.value.identity, exc.value.runs) == ("r1", "mallory",
                                                                      ("r2", "r3"))
        assert "'r1'" in str(exc.value) and "mallory" in str(exc.value)
        with pytest.raises(NotRunMember) as exc:
            await m.subscribe_prefix("grad/")  # spans runs
        assert exc.value.run == ""
        with pytest.raises(NotRunMember):
            await m.publish("emb/r1/7", [np.zeros((1, 2), np.float32)])
        with pytest.raises(NotRunMember):  # r3: another owned member's gradients
            await m.subscribe("grad/r3/passive/0")
        await m.subscribe("grad/r3/mallory/0")
        await m.subscribe_prefix("grad/r2/")
        await p.subscribe("grad/r1/3")
        await p.publish("emb/r1/7", [np.zeros((1, 2), np.float32)])


async def test_only_a_runs_members_read_it(setup: tuple[BrokerProcess, Path]) -> None:
    """mallory (passive role, not a member of r1) asks for r1's gradients, exactly and by a
    prefix that spans runs: both refused (``not_member_reads``), nothing delivered; the
    passive party (a member) gets them."""
    b, keys = setup
    async with _clients(b.address, keys, "active", "passive", "mallory", lax=True) as (a, p, m):
        before = request_stats(b.address, security=CurveClient.from_dir(keys, "active"))
        await m.subscribe("grad/r1/3")
        await m.subscribe_prefix("grad/")
        await p.subscribe("grad/r1/3")
        await asyncio.sleep(0.3)
        for i in range(3):
            await a.publish("grad/r1/3", [np.ones((1, 2), np.float32)], {"i": i})
        assert [x.meta["i"] for x in await _drain(p, "grad/r1/3")] == [0, 1, 2]
        assert await _drain(m, "grad/r1/3") == []
        after = request_stats(b.address, security=CurveClient.from_dir(keys, "active"))
        reads = after["not_member_reads"].get("mallory", 0) - before["not_member_reads"].get(
            "mallory", 0)
        assert reads == 2
        # mallory leaves: libzmq releases its refused requests, which must not withdraw
        # the passive party's subscription upstream
        await m.close()
        await asyncio.sleep(0.5)
        await a.publish("grad/r1/3", [np.ones((1, 2), np.float32)], {"i": 3})
        assert [x.meta["i"] for x in await _drain(p, "grad/r1/3")] == [3]


def test_subscriptions_per_identity_are_capped_and_freed_on_disconnect(
        tmp_path: Path) -> None:
    """With ``max_subscriptions_per_identity = 40``, a client asking for 70 topics holds 40
    (30 counted as ``capped``); once it disconnects, its 40 are freed and a new
    connection of the same identity gets 40 again."""
    keys = tmp_path / "keys"
    keys.mkdir()
    generate_certificate(keys, "broker")
    generate_certificate(keys, "active", role="active")
    generate_certificate(keys, "passive", role="passive")
    b = BrokerProcess(tmp_path, "--set", "broker.max_subscriptions_per_identity=40",
                      "--open-runs", keys=keys)
    try:
        admin = CurveClient.from_dir(keys, "active")
        ctx = zmq.Context()
        ep = BrokerAddress.parse(b.address)

        def flood(n: int) -> int:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            CurveClient.from_dir(keys, "passive").apply(sub)
            sub.connect(ep.endpoint(4 + 2 * 1))  # the passive role's read endpoint
            for i in range(n):
                sub.setsockopt(zmq.SUBSCRIBE, f"grad/r/{i}\0".encode())
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                st = request_stats(b.address, security=admin)
                if st["subscribe_events"] >= n + seen[0]:
                    break
                time.sleep(0.05)
            seen[0] = st["subscribe_events"]
            sub.close(0)
            return st["capped"].get("passive", 0)

        seen = [0]
        assert flood(70) == 30
        deadline = time.monotonic() + 10
        while request_stats(b.address, security=admin)["subscriptions"] > 0:
            assert time.monotonic() < deadline, "the closed connection's subscriptions stay"
            time.sleep(0.05)
        assert flood(40) == 30  # all 40 accepted again: nothing capped this time
        ctx.term()

        async def bus_client() -> None:  # our client knows the limit from the hello
            async with Bus(b.address, name="p", config=CFG,
                           security=CurveClient.from_dir(keys, "passive")) as p:
                assert p.hello is not None and p.hello.max_subscriptions == 40
                await p.subscribe_many([f"grad/r/{i}" for i in range(40)])
                with pytest.raises(TooManySubscriptions) as err:
                    await p.subscribe("grad/r/40")
                assert err.value.limit == 40 and err.value.topic == "grad/r/40"

        asyncio.run(bus_client())
    finally:
        b.stop()
    assert b.proc.returncode == 0


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


def test_a_curve_broker_without_a_membership_refuses_to_start(tmp_path: Path) -> None:
    """Isolation by default: ``--keys`` with no run membership (``--job``, ``--members``,
    ``--run``) and no explicit ``--open-runs`` exits 2 before binding, naming them."""
    import subprocess
    import sys

    keys = tmp_path / "keys"
    keys.mkdir()
    generate_certificate(keys, "broker")
    generate_certificate(keys, "active", role="active")
    res = subprocess.run([sys.executable, "-m", "broker", "run", "--keys", str(keys),
                          "--bind", "tcp://127.0.0.1:0"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, res.stderr
    for option in ("--job", "--members", "--run", "--open-runs"):
        assert option in res.stderr, res.stderr


async def test_an_inline_run_admits_its_members_to_its_family(tmp_path: Path) -> None:
    """``--run r7=active,passive``: both members read and publish in r7 and its alignment
    (r7-align); mallory (a valid key of the passive role) is told it is not a member."""
    keys = tmp_path / "keys"
    keys.mkdir()
    generate_certificate(keys, "broker")
    for name, role in (("active", "active"), ("passive", "passive"), ("mallory", "passive")):
        generate_certificate(keys, name, role=role)
    b = BrokerProcess(tmp_path, "--run", "r7=active,passive", keys=keys)
    try:
        async with _clients(b.address, keys, "active", "passive", "mallory") as (a, p, m):
            await p.subscribe("psi/r7-align/x")
            await asyncio.sleep(0.3)
            await a.publish("psi/r7-align/x", [np.ones((1, 2), np.float32)], {"i": 1})
            assert [x.meta for x in await _drain(p, "psi/r7-align/x")] == [{"i": 1}]
            with pytest.raises(NotRunMember) as exc:
                await m.subscribe("psi/r7-align/x")
            assert exc.value.runs == ()
    finally:
        b.stop()
    assert b.proc.returncode == 0
