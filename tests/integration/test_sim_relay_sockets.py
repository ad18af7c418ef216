"""sim.cluster.relay with real sockets on 127.0.0.1 (ephemeral ports) and real pyzmq peers.

Most tests run the relay on its own event loop in a background thread
(:class:`RelayThread`) so the test can use blocking pyzmq sockets with timeouts and
measure times without sharing a loop with the relay.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import zmq
import zmq.asyncio

from sim.cluster.relay import LinkSpec, Relay

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(600)


class RelayThread:
    """A :class:`Relay` on its own event loop in a daemon thread."""

    def __init__(self, routes: Any, spec: LinkSpec, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.relay = Relay(routes, spec, **kw)
        self.call(self.relay.start())

    def call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stats(self) -> dict[str, Any]:
        async def get() -> dict[str, Any]:
            return self.relay.stats()
        return self.call(get())

    def close(self) -> None:
        self.call(self.relay.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def _pull(ctx: zmq.Context[Any]) -> tuple[zmq.Socket[Any], int]:
    s = ctx.socket(zmq.PULL)
    s.linger = 0
    s.rcvtimeo = 5000
    port = s.bind_to_random_port("tcp://127.0.0.1")
    return s, port


def _push(ctx: zmq.Context[Any], endpoint: str) -> zmq.Socket[Any]:
    s = ctx.socket(zmq.PUSH)
    s.linger = 0
    s.sndtimeo = 5000
    s.connect(endpoint)
    return s


def _warm_up(push: zmq.Socket[Any], pull: zmq.Socket[Any]) -> None:
    push.send(b"warm")
    assert pull.recv() == b"warm"


def _least_transfer_s(push: zmq.Socket[Any], pull: zmq.Socket[Any], payload: bytes,
                      n: int, gap_s: float = 0.01) -> float:
    """The least of ``n`` transfer times: other jobs on the machine can only delay a
    transfer (a preempted relay thread), never speed it up, so the least is the link
    model's time plus the least scheduling noise."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        push.send(payload, copy=False)
        got = pull.recv(copy=False)
        times.append(time.perf_counter() - t0)
        assert len(got) == len(payload)
        time.sleep(gap_s)  # idle link between transfers
    return min(times)


async def test_push_pull_through_relay_intact_and_in_order() -> None:
    """Async API: ``async with Relay`` on the test's loop, zmq.asyncio peers."""
    ctx = zmq.asyncio.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    try:
        async with Relay([("127.0.0.1", port)], LinkSpec(latency_s=0.002)) as relay:
            push = ctx.socket(zmq.PUSH)
            push.connect(relay.endpoint_for(("127.0.0.1", port)))
            msgs = [i.to_bytes(4, "big") + os.urandom(i * 37 % 20000) for i in range(300)]
            for m in msgs:
                await asyncio.wait_for(push.send(m), 5)
            got = [await asyncio.wait_for(pull.recv(), 5) for _ in msgs]
            assert got == msgs
            st = relay.stats()
            assert st["connections"] == 1
            assert st["bytes_up"] > sum(map(len, msgs))  # payload + ZMTP framing
            assert st["bytes_down"] > 0                   # the PULL's ZMTP greeting
            push.close(0)
        await relay.close()  # idempotent
        assert relay.stats()["active_sockets"] == 0
    finally:
        pull.close(0)
        ctx.term()


def test_round_trip_through_20ms_relay(ctx: zmq.Context[Any]) -> None:
    """DEALER -> relay (20 ms each way) -> ROUTER echo: RTT >= 40 ms and < 40 ms + 25 ms
    (slack: two ~1 ms event-loop timer roundings plus scheduling on a loaded 2-core box)."""
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.rcvtimeo = 5000
    port = router.bind_to_random_port("tcp://127.0.0.1")
    rt = RelayThread([("127.0.0.1", port)], LinkSpec(latency_s=0.020))
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.rcvtimeo = 5000
        dealer.connect(rt.relay.endpoint_for(f"127.0.0.1:{port}"))
        rtts = []
        for i in range(7):
            t0 = time.perf_counter()
            dealer.send(b"ping%d" % i)
            ident, msg = router.recv_multipart()
            router.send_multipart([ident, msg])
            assert dealer.recv() == b"ping%d" % i
            rtts.append(time.perf_counter() - t0)
        # the first round trip also carries ZeroMQ's handshake: judge the rest
        steady = rtts[1:]
        assert min(steady) >= 0.040
        assert statistics.median(steady) < 0.040 + 0.025, rtts
    finally:
        rt.close()


@pytest.mark.exclusive  # transfer times: no other test may run meanwhile
def test_64kib_at_100mbit_adds_about_5_24_ms(ctx: zmq.Context[Any]) -> None:
    """The least of 15 transfers of 64 KiB through a 100 Mbit/s relay minus the least
    through an unlimited relay must be 5.24 ms +- 40 % (timer granularity is ~1 ms, i.e.
    ~20 % of the figure). The least, not the median: with two CPU-bound jobs beside the
    suite the median read 9.9 ms (the relay thread waiting for a core), a loaded
    machine's timing rather than the link model's; charging the bytes twice would still
    read about 10.5 ms."""
    payload = os.urandom(65536)
    least = {}
    for name, bps in (("unlimited", None), ("100mbit", 100e6)):
        pull, port = _pull(ctx)
        rt = RelayThread([("127.0.0.1", port)], LinkSpec(bandwidth_bps=bps))
        try:
            push = _push(ctx, rt.relay.endpoint_for(("127.0.0.1", port)))
            _warm_up(push, pull)
            least[name] = _least_transfer_s(push, pull, payload, 15)
            push.close(0)
        finally:
            rt.close()
            pull.close(0)
    extra = least["100mbit"] - least["unlimited"]
    theory = 65536 * 8 / 100e6
    assert theory * 0.6 < extra < theory * 1.4, least


def test_1mib_at_10mbit_takes_about_0_84_s(ctx: zmq.Context[Any]) -> None:
    pull, port = _pull(ctx)
    rt = RelayThread([("127.0.0.1", port)], LinkSpec(bandwidth_bps=10e6))
    try:
        push = _push(ctx, rt.relay.endpoint_for(("127.0.0.1", port)))
        _warm_up(push, pull)
        payload = os.urandom(1 << 20)
        t0 = time.perf_counter()
        push.send(payload, copy=False)
        assert pull.recv() == payload
        dt = time.perf_counter() - t0
        theory = (1 << 20) * 8 / 10e6  # 0.839 s
        assert theory * 0.85 < dt < theory * 1.15, dt
    finally:
        rt.close()
        pull.close(0)


def test_loss_keeps_messages_intact_and_in_order(ctx: zmq.Context[Any]) -> None:
    pull, port = _pull(ctx)
    spec = LinkSpec(latency_s=0.001, loss=0.1, seed=11, min_rto_s=0.05)
    rt = RelayThread([("127.0.0.1", port)], spec)
    try:
        push = _push(ctx, rt.relay.endpoint_for(("127.0.0.1", port)))
        msgs = [i.to_bytes(4, "big") + os.urandom(3000 + i * 97) for i in range(60)]
        for m in msgs:
            push.send(m)
        got = [pull.recv() for _ in msgs]
        assert got == msgs
        st = rt.stats()
        assert st["segments_lost"] > 0
        assert st["segments"] > 100
    finally:
        rt.close()
        pull.close(0)


@pytest.mark.exclusive  # "nothing during the outage" is a timing claim: three full-suite
# runs on 2 loaded cores saw the first message after the abort pass; alone it passes
def test_disconnect_blocks_then_zeromq_reconnects(ctx: zmq.Context[Any]) -> None:
    """What is asserted:

    * while the 1 s outage lasts (from the abort until the relay's ``disconnect.end``
      event), the PULL receives nothing, although the PUSH keeps sending;
    * after it, ZeroMQ reconnects by itself and a message sent after the outage
      arrives within 5 s;
    * everything received is intact and in send order (no duplicates). Messages sent
      during the outage MAY arrive afterwards (ZeroMQ queues them in the PUSH's
      pipe) and messages in flight at the abort MAY be lost: neither is asserted.
    """
    pull, port = _pull(ctx)
    pull.rcvtimeo = 20
    rt = RelayThread([("127.0.0.1", port)], LinkSpec(latency_s=0.002))
    try:
        push = _push(ctx, rt.relay.endpoint_for(("127.0.0.1", port)))
        push.setsockopt(zmq.RECONNECT_IVL, 100)
        push.send(b"warm")
        pull.rcvtimeo = 5000
        assert pull.recv() == b"warm"
        pull.rcvtimeo = 20
        received: list[tuple[float, int]] = []

        def drain(until: float) -> None:
            while time.monotonic() < until:
                try:
                    m = pull.recv()
                except zmq.Again:
                    continue
                assert m[:4] == b"seq:" and len(m) == 12 + 1000
                received.append((time.monotonic(), int(m[4:12])))

        fut = rt.submit(rt.relay.disconnect(1.0))
        # wait for the abort itself (a fixed 50 ms sleep was too short on a loaded host:
        # a message sent before the relay thread ran arrived "during" the outage)
        deadline = time.monotonic() + 5.0
        while not any(e["event"] == "disconnect.start" for e in rt.relay.events()):
            assert time.monotonic() < deadline, "the relay never started the disconnect"
            time.sleep(0.005)
        # and for the aborted connection's handler to end: an abort closes the socket only
        # at the relay loop's next turn, which a loaded host can delay (two full-suite dry
        # runs saw messages pass "during" the outage; the file alone passes)
        while rt.relay.stats()["active_sockets"]:
            assert time.monotonic() < deadline, "the aborted connection never ended"
            time.sleep(0.005)
        t_abort = time.monotonic()
        seq = 0
        while not fut.done():
            push.send(b"seq:%08d" % seq + b"x" * 1000, flags=zmq.NOBLOCK)
            seq += 1
            drain(time.monotonic() + 0.05)
        fut.result(1)
        # the outage ends at the relay's disconnect.end (its loop clock is time.monotonic):
        # the messages ZeroMQ queued meanwhile flush right after it, often before this
        # thread sees the future done (a full-suite dry run counted 0..16 "during" it)
        t_end = next(e["t_mono"] for e in rt.relay.events() if e["event"] == "disconnect.end")
        during = [s for t, s in received if t_abort <= t < t_end]
        assert during == [], f"received during the outage: {during}"
        first_after = seq
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(s >= first_after for _, s in received):
            push.send(b"seq:%08d" % seq + b"x" * 1000, flags=zmq.NOBLOCK)
            seq += 1
            drain(time.monotonic() + 0.05)
        seqs = [s for _, s in received]
        assert any(s >= first_after for s in seqs), "no message after the outage"
        assert seqs == sorted(set(seqs))
        ev = rt.relay.events()
        assert [e["event"] for e in ev] == ["disconnect.start", "disconnect.end"]
        assert ev[1]["t_mono"] - ev[0]["t_mono"] >= 1.0
        st = rt.stats()
        assert st["disconnects"] == 1 and st["connections"] >= 2
    finally:
        rt.close()
        pull.close(0)


# ----------------------------------------------------------------------------- CLI

def _readline(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> dict[str, Any]:
    assert proc.stdout is not None
    r, _, _ = select.select([proc.stdout], [], [], timeout)
    assert r, "no line from relay process"
    line = proc.stdout.readline()
    assert line, "relay process closed stdout"
    return orjson.loads(line)


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "sim.cluster.relay", *args], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _send(proc: subprocess.Popen[bytes], cmd: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdin is not None
    proc.stdin.write(orjson.dumps(cmd) + b"\n")
    proc.stdin.flush()
    return _readline(proc)


def test_cli_ready_disconnect_stats_and_clean_exit(ctx: zmq.Context[Any]) -> None:
    pull, port = _pull(ctx)
    proc = _spawn("--upstream", f"127.0.0.1:{port}", "--latency-s", "0.002",
                  "--bandwidth-mbps", "100", "--seed", "1")
    try:
        ready = _readline(proc)
        assert ready["event"] == "ready"
        ep = ready["endpoints"][f"127.0.0.1:{port}"]
        push = _push(ctx, ep)
        _warm_up(push, pull)
        ans = _send(proc, {"cmd": "disconnect", "duration_s": 0.3})
        assert ans == {"ok": True, "cmd": "disconnect", "duration_s": 0.3}
        assert _send(proc, {"cmd": "bogus"})["ok"] is False
        time.sleep(0.5)
        push.send(b"after")
        assert pull.recv() == b"after"
        st = _send(proc, {"cmd": "stats"})["stats"]
        assert st["disconnects"] == 1 and st["bytes_up"] > 0 and st["connections"] >= 2
        ev = _send(proc, {"cmd": "events"})["events"]
        assert [e["event"] for e in ev] == ["disconnect.start", "disconnect.end"]
        push.close(0)
        assert proc.stdin is not None
        proc.stdin.close()  # EOF -> final stats line, exit 0
        final = _readline(proc)
        assert final["event"] == "stopped" and final["reason"] == "eof"
        assert final["stats"]["disconnects"] == 1
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        pull.close(0)
    assert proc.poll() is not None


def test_cli_sigterm_and_broker_mode_exit_cleanly() -> None:
    proc = _spawn("--broker", "tcp://127.0.0.1:5550", "--latency-s", "0.01")
    try:
        ready = _readline(proc)
        ports = [int(ready["endpoints"][k].rsplit(":", 1)[1]) for k in ("pub", "sub", "control")]
        assert ports == [ports[0], ports[0] + 1, ports[0] + 2]
        assert ready["broker_address"] == ready["endpoints"]["pub"]
        proc.send_signal(signal.SIGTERM)
        final = _readline(proc)
        assert final["event"] == "stopped" and final["reason"] == "sigterm"
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_backpressure_bounds_the_shaped_queue(ctx: zmq.Context[Any]) -> None:
    """A 4 MiB message into a 20 Mbit/s relay with a 64 KiB buffer: the relay never
    holds more than buffer + one 64 KiB read chunk; the rest waits in the sender's
    and the kernel's buffers (TCP flow control), and the message still arrives intact."""
    pull, port = _pull(ctx)
    pull.rcvtimeo = 15000
    rt = RelayThread([("127.0.0.1", port)], LinkSpec(bandwidth_bps=20e6),
                     buffer_bytes=65536)
    try:
        push = _push(ctx, rt.relay.endpoint_for(("127.0.0.1", port)))
        _warm_up(push, pull)
        payload = os.urandom(4 << 20)
        push.send(payload, copy=False)
        time.sleep(0.5)
        mid = rt.stats()
        assert mid["queued_up"] > 0                      # still shaping
        assert pull.recv() == payload
        st = rt.stats()
        assert 0 < st["peak_queued_up"] <= 65536 + 65536, st
        assert st["queued_up"] == 0
    finally:
        rt.close()
        pull.close(0)


async def test_bus_publisher_through_broker_relay(broker: Any) -> None:
    """A real broker and our Bus: a publisher given ``relay.broker_address`` (three
    consecutive relay ports for PORT, PORT+1, PORT+2) reaches a direct subscriber; a
    64 KiB array takes at least the model's 10 ms + 5.24 ms one way."""
    import numpy as np

    from pubsub import Bus
    from tests.conftest import wait_subscribed

    spec = LinkSpec(latency_s=0.010, bandwidth_bps=100e6)
    async with Relay.for_broker(broker.address, spec) as relay:
        async with Bus(relay.broker_address, name="shaped-pub") as pub, \
                Bus(broker.address, name="direct-sub") as sub:
            await sub.subscribe("emb/relay")
            await wait_subscribed(pub, sub, "emb/relay")
            arr = np.arange(16384, dtype=np.float32)  # 64 KiB
            times = []
            for i in range(3):
                t0 = time.perf_counter()
                await pub.publish("emb/relay", [arr], {"i": i})
                msg = await sub.next("emb/relay", timeout_s=5.0)
                while msg.meta == {}:  # a probe of wait_subscribed, late through the link
                    msg = await sub.next("emb/relay", timeout_s=5.0)
                times.append(time.perf_counter() - t0)
                assert msg.meta == {"i": i}
                assert np.array_equal(msg.arrays[0], arr)
            assert min(times) >= spec.transfer_time_s(65536), times
        st = relay.stats()
        assert st["connections"] >= 1 and st["bytes_up"] > 3 * 65536
