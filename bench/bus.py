"""Throughput and round-trip latency of our bus against raw pyzmq, on this machine.

What is measured
----------------
1. **Throughput** (messages/s and MB/s of payload, MB = 10^6 bytes) for one
   ``numpy.uint8`` array of 64 B, 64 KiB and 1 MiB per message, publisher and
   subscriber in separate OS processes:

   * ``raw_direct``   blocking pyzmq PUB -> SUB over tcp://127.0.0.1, no broker.
   * ``raw_proxy``    blocking PUB -> ``zmq.proxy(XSUB, XPUB)`` (own process) -> blocking SUB.
   * ``ours_uvloop``  :class:`pubsub.client.Bus` publisher -> our broker
     (``python -m broker run``, i.e. ``psfl broker run`` with its defaults: per-message
     envelope validation, counters, stats topic) -> ``Bus`` subscriber, both on uvloop.
   * ``ours_asyncio`` the same with the default asyncio event loop.
   * ``raw_curve_direct`` ``raw_direct`` with CurveZMQ: the PUB is a CURVE server, the
     SUB a CURVE client pinning its key (fresh keypairs per process, no ZAP handler) -
     what libzmq's CURVE costs here, the baseline for ``ours_curve``.
   * ``ours_curve``   ``ours_uvloop`` with CURVE: the broker runs with ``--keys DIR``
     (ephemeral keys ``broker``, ``active``, ``passive`` generated per group into a
     temporary directory, mode 0700, and the default topic policy
     ``broker/default_policy.toml``); the publisher uses the ``passive`` key (which may
     publish ``emb/**``), the subscriber the ``active`` key (which may read ``emb/**``).
     Every hop is encrypted: publisher -> broker (role passive's XSUB) and broker
     (role active's XPUB) -> subscriber, so the broker decrypts and re-encrypts.

   Plaintext paths start the broker with ``--insecure`` (loopback only) and their
   ``Bus`` without keys. Our clients' topics are ``emb/bench/data/<k>`` (probes
   ``emb/bench/probe/<k>``) on every ours path, so plaintext and CURVE carry the same
   envelope and the policy admits them.

   Raw messages are ``[topic, payload]``; ours are the bus envelope
   ``[topic\\0, header, payload]``. Sends are zero-copy from 64 KiB up
   (``copy=False``; pyzmq copies smaller frames anyway), and the raw subscriber
   receives zero-copy from 64 KiB up too (our bus always receives zero-copy).
   Our publisher calls ``Bus.publish_nowait`` in a tight loop and yields to the
   event loop every ``YIELD_EVERY`` messages; our subscriber takes messages with
   ``Bus.try_next`` and, when nothing is buffered, ``Bus.next`` - only messages
   the application gets are counted.

   Everything is measured at the receiver: rate = (received - 1) / (time of the
   last - time of the first received message). The message count per size is
   fixed (see ``COUNTS_*``) and the *delivered fraction* (received / sent) is
   reported; a run that lost messages is flagged ``DROPS`` in the table.

   Ready handshake: per size, the subscriber subscribes, then the publisher
   sends probe messages every 10 ms on the data path until the subscriber
   reports (on a separate PAIR control socket) that a probe arrived; only then
   are the counted messages sent, so slow-joiner loss is excluded. After
   sending, the publisher reports "done" on the control socket and keeps its
   sockets open until the subscriber reports that it has finished.

2. **Round-trip latency** (p50 / p99, microseconds) of the VFL pattern: process
   A publishes ``emb/<i>`` (64 KiB), process B receives it and publishes
   ``grad/<i>`` (64 KiB) back, A waits for exactly that topic. ``WARMUP_RTT``
   round trips are discarded, then ``RTT_N`` are timed in A
   (``perf_counter_ns`` from before the publish to after the reply is in hand).
   Raw clients subscribe to the prefix (``emb/`` / ``grad/``) and compare the
   topic exactly; our clients subscribe every exact topic up front, as
   ``parties/runtime/party.py`` does. Paths: raw_direct, raw_proxy, ours_uvloop,
   ours_asyncio, raw_curve_direct (each side's PUB a CURVE server, the other side's SUB
   its client) and ours_curve (A uses the ``passive`` key: publishes ``emb/**``, reads
   ``grad/**``; B the ``active`` key: the reverse).

High-water marks
----------------
All raw sockets use the same HWMs as our defaults, read from ``BusConfig`` and
``BrokerConfig`` at start-up (10 000 messages at the time of writing): PUB
SNDHWM = ``BusConfig.sndhwm``, SUB RCVHWM = ``BusConfig.rcvhwm``, proxy XSUB
RCVHWM = ``BrokerConfig.rcvhwm``, XPUB SNDHWM = ``BrokerConfig.sndhwm``; SUB
SNDHWM and the proxy's subscription directions are unbounded (0), as in ours.

Fixed counts alone do not fit those HWMs: a zero-copy publisher enqueues 64 KiB
messages ~4-8x faster than any path delivers them, so 20 000 of them overflowed
the 10 000-message PUB queue (raw_proxy delivered exactly 50 %). Every
publisher therefore runs under a **credit window** (same for raw and ours): at
most ``min(HWM/2, 256 MiB / size)`` messages (5000 / 4096 / 256) may be
unacknowledged; the receiver acks every window/4 messages on the control
socket. No HWM can overflow, memory stays bounded, and the receiver-side rate
is the path's sustained rate (the window is deep enough never to starve it).
If messages are lost anyway, the window moves on after ``CREDIT_WAIT_S`` and
the loss shows in the delivered fraction.

Our subscriber's topic buffer
-----------------------------
``BusConfig.topic_max_msgs`` defaults to 64 per topic with FIFO eviction, but
the bus's reader drains up to ``BusConfig.drain_burst`` (512) messages per
wake-up before the application runs, so a consumer that keeps up with the
socket would still see evictions in a one-topic flood. By default this
benchmark therefore subscribes the data topic with
``BufferLimits(max_msgs=SUB_MAX_MSGS, max_bytes=SUB_MAX_BYTES)`` (settings are
written to the JSON); ``--default-limits`` uses the bus defaults instead, to
show that effect (evictions are in each run's ``bus_stats``).

Machine load
------------
The machine is shared. For every group of processes the parent records the CPU
that *other* processes used meanwhile (``foreign_cores``, from /proc/stat minus
our own rusage; "load" column). Before each group it waits briefly for the
machine to be quiet, and a throughput group during which others used more
than ``NOISY_CORES`` is repeated (at most ``MAX_RETRIES`` times, within a time
budget; discarded attempts are kept in the JSON under ``discarded_noisy``).
Round trips are not repeated: on this VM, busy vCPUs wake up faster, so other
load can make them faster as well as slower.

Repeats
-------
Each figure is the median over ``--runs`` runs (5; ``--quick``: 3) with fresh
processes (and a fresh broker / proxy) per run. Within a run the paths are
started alternately raw / ours, and which of the two goes first flips from run
to run (the CURVE pair last). Every row carries its ratio to ``raw_proxy`` at the
same size; the JSON ``summary`` has ``ratio_64B``, ``ratio_64KiB``, ``ratio_1MiB``
(ours_uvloop / raw_proxy, msgs/s; uvloop is the loop ``psfl`` uses by default),
``rtt_p99_ratio_64KiB`` (ours_uvloop p99 / raw_proxy p99) and
``raw_proxy_msgs_per_s`` keyed by size, as before CURVE, and then ``mb_per_s``
(path -> size -> MB/s), ``curve_ratios`` ("ours_curve / ours_uvloop",
"ours_curve / raw_curve_direct", "raw_curve_direct / raw_direct" -> size -> ratio;
also printed under the throughput table, and in each ``throughput`` row of the
numerator as ``ratio_vs_<denominator>``) and ``rtt_curve_p99_ratio_64KiB``
(ours_curve p99 / ours_uvloop p99). A ratio whose paths were not measured is null.

Usage (from the repository root)::

    python bench/bus.py --quick --json /tmp/bus_quick.json   # < 3 min
    python bench/bus.py --json bench_bus.json                # 5 runs, larger counts

Debugging subsets: ``--paths raw_proxy,ours_uvloop``, ``--sizes 1MiB``,
``--skip rtt``, ``--runs N``, ``--default-limits``.

Safety: children are re-invocations of this script with a hidden ``--role``.
Every wait has a deadline; children exit when the parent's pipe closes, get
SIGKILL if the parent dies (PR_SET_PDEATHSIG), and are killed in ``finally``
blocks, so the script neither hangs nor leaks processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- settings
SIZES: list[tuple[str, int]] = [("64B", 64), ("64KiB", 64 << 10), ("1MiB", 1 << 20)]
COUNTS_FULL = {"64B": 200_000, "64KiB": 20_000, "1MiB": 2_000}
COUNTS_QUICK = {"64B": 50_000, "64KiB": 5_000, "1MiB": 500}
RUNS_FULL, RUNS_QUICK = 5, 3
RTT_N_FULL, RTT_N_QUICK = 2000, 500
WARMUP_RTT_FULL, WARMUP_RTT_QUICK = 200, 100
RTT_BYTES = 64 << 10
ZERO_COPY_MIN = 64 << 10  # pyzmq's COPY_THRESHOLD: smaller frames are copied anyway
YIELD_EVERY = 256  # our publisher yields to its event loop every N publishes
SUB_MAX_MSGS = 4096  # our subscriber's data-topic buffer (holds several drain bursts)
SUB_MAX_BYTES = 768 << 20  # below BusConfig.total_max_bytes (1 GiB)

PATHS = ["raw_direct", "raw_proxy", "ours_uvloop", "ours_asyncio", "raw_curve_direct",
         "ours_curve"]
OURS_PATHS = ["ours_uvloop", "ours_asyncio", "ours_curve"]
DIRECT_PATHS = ["raw_direct", "raw_curve_direct"]  # PUB binds, SUB connects, no broker
CURVE_PATHS = ["raw_curve_direct", "ours_curve"]
UVLOOP_PATHS = ["ours_uvloop", "ours_curve"]
BASELINE = "raw_proxy"
HEADLINE = "ours_uvloop"
#: ``--broker-set KEY=VALUE`` items passed to our broker (e.g. ``io_threads=2``)
BROKER_SETS: list[str] = []
# CURVE comparisons, (numerator, denominator) at the same size: what CURVE costs our bus,
# how our CURVE bus compares with libzmq's own CURVE, and what CURVE costs libzmq.
CURVE_RATIOS = [("ours_curve", "ours_uvloop"), ("ours_curve", "raw_curve_direct"),
                ("raw_curve_direct", "raw_direct")]
# ours_curve identities (the broker's default policy): the publisher of the throughput
# test and A of the round trip publish emb/** (role passive); the subscriber and B read
# emb/** and publish grad/** (role active).
CURVE_PUB_IDENTITY, CURVE_SUB_IDENTITY = "passive", "active"

# Credit window: the publisher keeps at most this many unacknowledged messages in flight
# (the receiver acks every window/4 messages on the control socket), so that no
# high-water mark on the way can overflow; bounded in bytes too (memory).
WINDOW_MSGS_OF_HWM = 0.5  # window = this fraction of the smallest HWM on the path ...
WINDOW_BYTES = 256 << 20  # ... and at most this many payload bytes
CREDIT_WAIT_S = 2.0  # no ack for this long: assume loss and move the window on
CREDIT_POLL_S = 0.002  # our publisher polls the control socket this often (>= 1 ms: uvloop
# rounds shorter timers to 0 ms, which would turn the wait into a busy loop)

ACK = b"A"
PROBE_EVERY_S = 0.01
HANDSHAKE_TIMEOUT_S = 20.0  # a probe must come through within this
PHASE_TIMEOUT_S = 90.0  # one size's transfer, from ready to the last message
IDLE_END_S = 0.5  # after "done", this long without a message ends a lossy phase
RECV_POLL_MS = 250  # receive timeout between checks of the control socket
RTT_TIMEOUT_S = 5.0  # one round trip
CHILD_START_TIMEOUT_S = 30.0  # child import + bind until HELLO
QUIET_CORES = 0.3  # "quiet": other processes use less than this many cores
QUIET_SAMPLE_S = 0.25
QUIET_BUDGET_S = {"quick": 20.0, "full": 90.0}  # total waiting for quiet per invocation
QUIET_MAX_S = {"quick": 2.0, "full": 5.0}  # per group
NOISY_CORES = 0.4  # a throughput group during which others used more than this is repeated ...
MAX_RETRIES = 2  # ... at most this often ...
RETRY_BUDGET_S = {"quick": 40.0, "full": 150.0}  # ... within this much time per invocation
CHILD_MAX_S = 600.0  # a child kills itself after this long, whatever happens
HOST = "127.0.0.1"


class BenchError(RuntimeError):
    """A group of child processes failed (timeout, crash, protocol)."""


# =========================================================================== children
# Children talk to the parent with single lines: they print ``HELLO {json}`` (their
# bound endpoints) and ``RESULT {json}`` on stdout, and read one ``GO {json}`` line
# (all endpoints) from stdin. A watchdog thread keeps reading stdin: EOF means the
# parent is gone or wants us gone, and the process exits at once.


def _emit(kind: str, obj: Any) -> None:
    sys.stdout.write(f"{kind} {json.dumps(obj)}\n")
    sys.stdout.flush()


def _start_watchdog() -> queue.Queue[dict[str, Any]]:
    q: queue.Queue[dict[str, Any]] = queue.Queue()

    def _watch() -> None:
        for line in sys.stdin:
            if line.startswith("GO "):
                q.put(json.loads(line[3:]))
        os._exit(3)  # parent closed our stdin (or died)

    threading.Thread(target=_watch, name="watchdog", daemon=True).start()
    t = threading.Timer(CHILD_MAX_S, lambda: os._exit(4))
    t.daemon = True
    t.start()
    return q


def _wait_go(q: queue.Queue[dict[str, Any]]) -> dict[str, Any]:
    try:
        return q.get(timeout=CHILD_START_TIMEOUT_S * 2)
    except queue.Empty:
        raise BenchError("no GO from the parent") from None


def _ctrl_bind(zmq: Any, ctx: Any) -> tuple[Any, str]:
    s = ctx.socket(zmq.PAIR)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port(f"tcp://{HOST}")
    return s, f"tcp://{HOST}:{port}"


def _ctrl_json(ctrl: Any, timeout_s: float, what: str) -> dict[str, Any]:
    """Next JSON control message (credit acks in between are skipped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not ctrl.poll(int(remaining * 1000) + 1):
            raise BenchError(f"control: no {what} within {timeout_s} s")
        m = ctrl.recv()
        if m[:1] != ACK:
            return json.loads(m)


def _ack(ctrl: Any, count: int) -> None:
    ctrl.send(ACK + count.to_bytes(8, "little"))


def _rate(count: int, t_first: float | None, t_last: float | None) -> float:
    if count < 2 or t_first is None or t_last is None or t_last <= t_first:
        return 0.0
    return (count - 1) / (t_last - t_first)


def _phase_result(label: str, size: int, n: int, count: int,
                  t_first: float | None, t_last: float | None, timed_out: bool) -> dict[str, Any]:
    rate = _rate(count, t_first, t_last)
    return {
        "size": label, "bytes": size, "sent": n, "received": count,
        "delivered": count / n if n else 0.0, "msgs_per_s": rate,
        "mb_per_s": rate * size / 1e6,
        "window_s": (t_last - t_first) if (t_first is not None and t_last is not None) else 0.0,
        "timed_out": timed_out,
    }


def _percentiles_us(ns: list[int]) -> dict[str, float]:
    import numpy as np

    if not ns:
        return {"p50_us": float("nan"), "p99_us": float("nan"), "mean_us": float("nan")}
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "mean_us": float(a.mean()), "max_us": float(a.max())}


# --------------------------------------------------------------------------- raw roles
def _raw_curve_server(zmq: Any, sock: Any) -> str:
    """Make ``sock`` a CURVE server with a fresh keypair (before ``bind``); its public key.

    No ZAP handler is installed, so libzmq admits any client key (encryption without an
    allow-list): the cost measured is CURVE's handshake and per-message crypto only.
    """
    public, secret = zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    return public.decode()


def _raw_curve_client(zmq: Any, sock: Any, server_key: str) -> None:
    """Make ``sock`` a CURVE client of ``server_key`` with a fresh keypair (before ``connect``)."""
    public, secret = zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)


def _raw_socket(zmq: Any, ctx: Any, kind: int, *, sndhwm: int | None = None,
                rcvhwm: int | None = None, linger_ms: int = 0) -> Any:
    s = ctx.socket(kind)
    s.setsockopt(zmq.LINGER, linger_ms)
    if sndhwm is not None:
        s.setsockopt(zmq.SNDHWM, sndhwm)
    if rcvhwm is not None:
        s.setsockopt(zmq.RCVHWM, rcvhwm)
    return s


def role_proxy(cfg: dict[str, Any]) -> None:
    """``zmq.proxy`` XSUB/XPUB device with the broker's HWMs; runs until killed."""
    import zmq

    _start_watchdog()  # only for the exit on EOF
    ctx = zmq.Context()
    xsub = _raw_socket(zmq, ctx, zmq.XSUB, sndhwm=0, rcvhwm=cfg["broker_rcvhwm"])
    xpub = _raw_socket(zmq, ctx, zmq.XPUB, sndhwm=cfg["broker_sndhwm"], rcvhwm=0)
    p1 = xsub.bind_to_random_port(f"tcp://{HOST}")
    p2 = xpub.bind_to_random_port(f"tcp://{HOST}")
    _emit("HELLO", {"xsub": f"tcp://{HOST}:{p1}", "xpub": f"tcp://{HOST}:{p2}"})
    zmq.proxy(xsub, xpub)


def role_raw_thr_pub(cfg: dict[str, Any]) -> None:
    import numpy as np
    import zmq

    q = _start_watchdog()
    ctx = zmq.Context()
    ctrl, ctrl_ep = _ctrl_bind(zmq, ctx)
    pub = _raw_socket(zmq, ctx, zmq.PUB, sndhwm=cfg["bus_sndhwm"], linger_ms=2000)
    hello = {"ctrl": ctrl_ep}
    if cfg["path"] in DIRECT_PATHS:
        if cfg["path"] in CURVE_PATHS:
            hello["server_key"] = _raw_curve_server(zmq, pub)
        hello["pub"] = f"tcp://{HOST}:{pub.bind_to_random_port(f'tcp://{HOST}')}"
    _emit("HELLO", hello)
    go = _wait_go(q)
    if cfg["path"] == "raw_proxy":
        pub.connect(go["xsub"])
    out = []
    for k, (label, size, n, window) in enumerate(cfg["phases"]):
        payload = np.full(size, k + 1, dtype=np.uint8)
        zc = size >= ZERO_COPY_MIN
        probe = [b"p%d" % k, b""]
        topic = b"d%d" % k
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        while True:
            pub.send_multipart(probe)
            if ctrl.poll(int(PROBE_EVERY_S * 1000)):
                msg = json.loads(ctrl.recv())
                if msg.get("ready") == k:
                    break
            if time.monotonic() > deadline:
                raise BenchError(f"phase {label}: subscriber never saw a probe")
        acked = stalls = credit_timeouts = 0
        wait_ms = int(CREDIT_WAIT_S * 1000)
        t0 = time.perf_counter()
        for i in range(n):
            if i - acked >= window:  # credit window full: wait for the receiver's ack
                stalls += 1
                while i - acked >= window:
                    if not ctrl.poll(wait_ms):
                        credit_timeouts += 1  # lost messages are never acked: move on
                        acked = i - window + 1
                        break
                    m = ctrl.recv()
                    if m[:1] == ACK:
                        acked = max(acked, int.from_bytes(m[1:], "little"))
            pub.send_multipart([topic, payload], copy=not zc)
        t1 = time.perf_counter()
        ctrl.send(json.dumps({"done": k, "sent": n}).encode())
        fin = _ctrl_json(ctrl, PHASE_TIMEOUT_S + 10, "finished")
        out.append({"size": label, "send_s": t1 - t0, "send_msgs_per_s": n / (t1 - t0),
                    "window": window, "credit_stalls": stalls,
                    "credit_timeouts": credit_timeouts, "receiver": fin.get("received")})
    _emit("RESULT", {"phases": out})
    pub.close(linger=0)
    ctrl.close()
    ctx.term()


def role_raw_thr_sub(cfg: dict[str, Any]) -> None:
    import zmq

    q = _start_watchdog()
    ctx = zmq.Context()
    sub = _raw_socket(zmq, ctx, zmq.SUB, sndhwm=0, rcvhwm=cfg["bus_rcvhwm"])
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, RECV_POLL_MS)
    ctrl = _raw_socket(zmq, ctx, zmq.PAIR)
    _emit("HELLO", {})
    go = _wait_go(q)
    if cfg["path"] in CURVE_PATHS:
        _raw_curve_client(zmq, sub, go["server_key"])
    sub.connect(go["pub"] if cfg["path"] in DIRECT_PATHS else go["xpub"])
    ctrl.connect(go["ctrl"])
    again = zmq.Again
    perf = time.perf_counter
    out = []
    for k, (label, size, n, window) in enumerate(cfg["phases"]):
        probe, topic = b"p%d" % k, b"d%d" % k
        copy = size < ZERO_COPY_MIN
        ack_every = max(1, window // 4)
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        while True:
            try:
                fr = sub.recv_multipart()
            except again:
                if time.monotonic() > deadline:
                    raise BenchError(f"phase {label}: no probe") from None
                continue
            if fr[0] == probe:
                break
        ctrl.send(json.dumps({"ready": k}).encode())
        count = 0
        t_first = t_last = None
        done = None
        timed_out = False
        hard = time.monotonic() + PHASE_TIMEOUT_S
        last_activity = perf()
        while count < n:
            try:
                fr = sub.recv_multipart(copy=copy)
            except again:
                if done is None and ctrl.poll(0):
                    done = json.loads(ctrl.recv())
                if done is not None and perf() - last_activity > IDLE_END_S:
                    break
                if time.monotonic() > hard:
                    timed_out = True
                    break
                continue
            t = fr[0] if copy else fr[0].bytes
            if t != topic:
                continue
            now = perf()
            if t_first is None:
                t_first = now
            t_last = last_activity = now
            count += 1
            if count % ack_every == 0:
                _ack(ctrl, count)
        if done is None:
            done = _ctrl_json(ctrl, 30.0, "done")
        res = _phase_result(label, size, n, count, t_first, t_last, timed_out)
        ctrl.send(json.dumps({"finished": k, "received": count}).encode())
        out.append(res)
    _emit("RESULT", {"phases": out})
    sub.close(linger=0)
    ctrl.close()
    ctx.term()


def role_raw_rtt_a(cfg: dict[str, Any]) -> None:
    import numpy as np
    import zmq

    q = _start_watchdog()
    ctx = zmq.Context()
    ctrl, ctrl_ep = _ctrl_bind(zmq, ctx)
    pub = _raw_socket(zmq, ctx, zmq.PUB, sndhwm=cfg["bus_sndhwm"], linger_ms=1000)
    sub = _raw_socket(zmq, ctx, zmq.SUB, sndhwm=0, rcvhwm=cfg["bus_rcvhwm"])
    sub.setsockopt(zmq.SUBSCRIBE, b"grad/")
    hello = {"ctrl": ctrl_ep}
    if cfg["path"] in DIRECT_PATHS:
        if cfg["path"] in CURVE_PATHS:
            hello["server_key_a"] = _raw_curve_server(zmq, pub)
        hello["pub_a"] = f"tcp://{HOST}:{pub.bind_to_random_port(f'tcp://{HOST}')}"
    _emit("HELLO", hello)
    go = _wait_go(q)
    if cfg["path"] in DIRECT_PATHS:
        if cfg["path"] in CURVE_PATHS:
            _raw_curve_client(zmq, sub, go["server_key_b"])
        sub.connect(go["pub_b"])
    else:
        pub.connect(go["xsub"])
        sub.connect(go["xpub"])
    emb = np.full(RTT_BYTES, 1, dtype=np.uint8)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    while True:  # ready handshake: probe until B's answer comes back
        pub.send_multipart([b"emb/probe", b""])
        if sub.poll(int(PROBE_EVERY_S * 1000)):
            if sub.recv_multipart()[0] == b"grad/probe":
                break
        if time.monotonic() > deadline:
            raise BenchError("rtt: no probe answer")
    while sub.poll(50):  # stray probe answers
        sub.recv_multipart()
    sub.setsockopt(zmq.RCVTIMEO, int(RTT_TIMEOUT_S * 1000))
    warm, n = cfg["warmup"], cfg["rtt_n"]
    rtts: list[int] = []
    lost = 0
    ns = time.perf_counter_ns
    for i in range(warm + n):
        want = b"grad/%d" % i
        t0 = ns()
        pub.send_multipart([b"emb/%d" % i, emb], copy=False)
        try:
            while True:
                fr = sub.recv_multipart(copy=False)
                if fr[0].bytes == want:
                    break
        except zmq.Again:
            lost += 1
            if lost > 10:
                raise BenchError("rtt: more than 10 round trips lost") from None
            continue
        dt = ns() - t0
        if i >= warm:
            rtts.append(dt)
    ctrl.send(b'{"bye": 1}')
    _emit("RESULT", {"n": len(rtts), "lost": lost, **_percentiles_us(rtts)})
    time.sleep(0.05)
    for s in (pub, sub, ctrl):
        s.close(linger=0)
    ctx.term()


def role_raw_rtt_b(cfg: dict[str, Any]) -> None:
    import numpy as np
    import zmq

    q = _start_watchdog()
    ctx = zmq.Context()
    pub = _raw_socket(zmq, ctx, zmq.PUB, sndhwm=cfg["bus_sndhwm"], linger_ms=1000)
    sub = _raw_socket(zmq, ctx, zmq.SUB, sndhwm=0, rcvhwm=cfg["bus_rcvhwm"])
    sub.setsockopt(zmq.SUBSCRIBE, b"emb/")
    sub.setsockopt(zmq.RCVTIMEO, RECV_POLL_MS)
    ctrl = _raw_socket(zmq, ctx, zmq.PAIR)
    hello = {}
    if cfg["path"] in DIRECT_PATHS:
        if cfg["path"] in CURVE_PATHS:
            hello["server_key_b"] = _raw_curve_server(zmq, pub)
        hello["pub_b"] = f"tcp://{HOST}:{pub.bind_to_random_port(f'tcp://{HOST}')}"
    _emit("HELLO", hello)
    go = _wait_go(q)
    ctrl.connect(go["ctrl"])
    if cfg["path"] in DIRECT_PATHS:
        if cfg["path"] in CURVE_PATHS:
            _raw_curve_client(zmq, sub, go["server_key_a"])
        sub.connect(go["pub_a"])
    else:
        pub.connect(go["xsub"])
        sub.connect(go["xpub"])
    grad = np.full(RTT_BYTES, 2, dtype=np.uint8)
    hard = time.monotonic() + PHASE_TIMEOUT_S + HANDSHAKE_TIMEOUT_S
    answered = 0
    while True:
        try:
            fr = sub.recv_multipart(copy=False)
        except zmq.Again:
            if ctrl.poll(0):
                break  # bye
            if time.monotonic() > hard:
                raise BenchError("rtt B: no bye from A") from None
            continue
        t = fr[0].bytes
        if t == b"emb/probe":
            pub.send_multipart([b"grad/probe", b""])
        else:
            pub.send_multipart([b"grad/" + t[4:], grad], copy=False)
            answered += 1
    _emit("RESULT", {"answered": answered})
    for s in (pub, sub, ctrl):
        s.close(linger=0)
    ctx.term()


# --------------------------------------------------------------------------- our roles
def _ours_setup() -> None:
    from pubsub.logs import configure_logging

    configure_logging(stderr_level="warning", party="bench")  # keep stdout for the protocol


def _ours_security(cfg: dict[str, Any], go: dict[str, Any], identity: str) -> Any:
    """ours_curve: the ``CurveClient`` of ``identity`` from the run's keys; else None
    (plaintext to the ``--insecure`` broker on loopback)."""
    if cfg["path"] not in CURVE_PATHS:
        return None
    from pubsub.security import CurveClient

    return CurveClient.from_dir(go["keys_dir"], identity)


def role_ours_thr_pub(cfg: dict[str, Any]) -> None:
    import zmq

    _ours_setup()
    q = _start_watchdog()
    cctx = zmq.Context()
    ctrl, ctrl_ep = _ctrl_bind(zmq, cctx)
    _emit("HELLO", {"ctrl": ctrl_ep})
    go = _wait_go(q)

    async def main() -> dict[str, Any]:
        import asyncio

        import numpy as np

        from pubsub.client import Bus

        out = []
        async with Bus(go["broker"], name="bench-pub",
                       security=_ours_security(cfg, go, CURVE_PUB_IDENTITY)) as bus:
            for k, (label, size, n, window) in enumerate(cfg["phases"]):
                arr = np.full(size, k + 1, dtype=np.uint8)
                copy = size < ZERO_COPY_MIN  # large arrays: zero-copy, never mutated
                probe, topic = f"emb/bench/probe/{k}", f"emb/bench/data/{k}"
                deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
                while True:
                    bus.publish_nowait(probe)
                    await asyncio.sleep(PROBE_EVERY_S)
                    if ctrl.poll(0) and json.loads(ctrl.recv()).get("ready") == k:
                        break
                    if time.monotonic() > deadline:
                        raise BenchError(f"phase {label}: subscriber never saw a probe")
                pub = bus.publish_nowait
                would_block = acked = stalls = credit_timeouts = 0
                t0 = time.perf_counter()
                for i in range(n):
                    if i - acked >= window:  # credit window full: wait for the receiver's ack
                        stalls += 1
                        wait_until = time.monotonic() + CREDIT_WAIT_S
                        while i - acked >= window:
                            if ctrl.poll(0):
                                m = ctrl.recv()
                                if m[:1] == ACK:
                                    acked = max(acked, int.from_bytes(m[1:], "little"))
                            elif time.monotonic() > wait_until:
                                credit_timeouts += 1
                                acked = i - window + 1
                            else:
                                await asyncio.sleep(CREDIT_POLL_S)
                    while True:
                        try:
                            pub(topic, (arr,), None, copy=copy)
                            break
                        except BlockingIOError:  # PublishWouldBlock (overflow="block" only)
                            would_block += 1
                            await asyncio.sleep(0.0002)
                    if i % YIELD_EVERY == YIELD_EVERY - 1:
                        await asyncio.sleep(0)
                t1 = time.perf_counter()
                ctrl.send(json.dumps({"done": k, "sent": n}).encode())
                hard = time.monotonic() + PHASE_TIMEOUT_S + 10
                while True:
                    if ctrl.poll(0):
                        m = ctrl.recv()
                        if m[:1] != ACK:
                            fin = json.loads(m)
                            break
                    elif time.monotonic() > hard:
                        raise BenchError(f"phase {label}: subscriber never finished")
                    else:
                        await asyncio.sleep(0.005)
                out.append({"size": label, "send_s": t1 - t0, "send_msgs_per_s": n / (t1 - t0),
                            "window": window, "credit_stalls": stalls,
                            "credit_timeouts": credit_timeouts, "would_block": would_block,
                            "receiver": fin.get("received")})
            stats = bus.stats().as_dict()
        return {"phases": out, "bus_stats": stats}

    from pubsub.runner import run

    _emit("RESULT", run(main(), event_loop=cfg["loop"]))
    ctrl.close()
    cctx.term()


def role_ours_thr_sub(cfg: dict[str, Any]) -> None:
    import zmq

    _ours_setup()
    q = _start_watchdog()
    cctx = zmq.Context()
    ctrl = _raw_socket(zmq, cctx, zmq.PAIR)
    _emit("HELLO", {})
    go = _wait_go(q)
    ctrl.connect(go["ctrl"])

    async def main() -> dict[str, Any]:
        from pubsub.buffer import BufferLimits
        from pubsub.client import Bus
        from pubsub.errors import DeadlineExceeded

        limits = None
        if cfg["sub_limits"] is not None:
            limits = BufferLimits(max_msgs=cfg["sub_limits"][0], max_bytes=cfg["sub_limits"][1])
        perf = time.perf_counter
        poll_s = RECV_POLL_MS / 1000
        out = []

        def dropped(bus: Bus) -> int:
            """Messages the bus itself dropped (evicted / overflow): never delivered."""
            st = bus.stats()
            return st.evicted + st.overflow_dropped

        async with Bus(go["broker"], name="bench-sub",
                       security=_ours_security(cfg, go, CURVE_SUB_IDENTITY)) as bus:
            for k, (label, size, n, window) in enumerate(cfg["phases"]):
                probe, topic = f"emb/bench/probe/{k}", f"emb/bench/data/{k}"
                ack_every = max(1, window // 4)
                await bus.subscribe(topic, limits=limits)
                await bus.subscribe(probe)  # after the data topic: a probe proves both
                try:
                    await bus.next(probe, timeout_s=HANDSHAKE_TIMEOUT_S)
                except DeadlineExceeded:
                    raise BenchError(f"phase {label}: no probe") from None
                ctrl.send(json.dumps({"ready": k}).encode())
                count = acked = 0
                t_first = t_last = None
                done = None
                timed_out = False
                hard = time.monotonic() + PHASE_TIMEOUT_S
                last_activity = perf()
                try_next, nxt = bus.try_next, bus.next
                # With the default (small) topic buffers the bus evicts messages; the
                # credit acks then count them as processed (checked every 64 messages,
                # in that diagnostic mode only), or the publisher would stall.
                drop0 = dropped(bus)
                check_every = ack_every if limits is not None else min(64, ack_every)
                while count < n:
                    msg = try_next(topic)
                    if msg is None:
                        try:
                            msg = await nxt(topic, poll_s)
                        except DeadlineExceeded:
                            processed = count + dropped(bus) - drop0
                            if processed > acked:
                                _ack(ctrl, processed)
                                acked = processed
                            if done is None and ctrl.poll(0):
                                done = json.loads(ctrl.recv())
                            if done is not None and perf() - last_activity > IDLE_END_S:
                                break
                            if time.monotonic() > hard:
                                timed_out = True
                                break
                            continue
                    now = perf()
                    if t_first is None:
                        t_first = now
                    t_last = last_activity = now
                    count += 1
                    if count % check_every == 0:
                        processed = count if limits is not None else count + dropped(bus) - drop0
                        if processed - acked >= ack_every:
                            _ack(ctrl, processed)
                            acked = processed
                if done is None:
                    if not ctrl.poll(30_000):
                        raise BenchError(f"phase {label}: no done")
                    done = json.loads(ctrl.recv())
                await bus.unsubscribe(probe)
                await bus.unsubscribe(topic)
                out.append(_phase_result(label, size, n, count, t_first, t_last, timed_out))
                ctrl.send(json.dumps({"finished": k, "received": count}).encode())
            stats = bus.stats().as_dict()
        return {"phases": out, "bus_stats": stats}

    from pubsub.runner import run

    _emit("RESULT", run(main(), event_loop=cfg["loop"]))
    ctrl.close()
    cctx.term()


def role_ours_rtt_a(cfg: dict[str, Any]) -> None:
    import zmq

    _ours_setup()
    q = _start_watchdog()
    cctx = zmq.Context()
    ctrl, ctrl_ep = _ctrl_bind(zmq, cctx)
    _emit("HELLO", {"ctrl": ctrl_ep})
    go = _wait_go(q)
    warm, n = cfg["warmup"], cfg["rtt_n"]

    async def main() -> dict[str, Any]:
        import numpy as np

        from pubsub.client import Bus
        from pubsub.errors import DeadlineExceeded

        emb = np.full(RTT_BYTES, 1, dtype=np.uint8)
        rtts: list[int] = []
        lost = 0
        async with Bus(go["broker"], name="bench-a",
                       security=_ours_security(cfg, go, CURVE_PUB_IDENTITY)) as bus:
            await bus.subscribe_many([f"grad/{i}" for i in range(warm + n)])
            await bus.subscribe("grad/probe")  # last: its answer proves the others
            deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
            while True:
                bus.publish_nowait("emb/probe")
                try:
                    await bus.next("grad/probe", timeout_s=0.02)
                    break
                except DeadlineExceeded:
                    if time.monotonic() > deadline:
                        raise BenchError("rtt: no probe answer") from None
            ns = time.perf_counter_ns
            for i in range(warm + n):
                topic = f"grad/{i}"
                t0 = ns()
                bus.publish_nowait(f"emb/{i}", (emb,), None, copy=False)
                try:
                    await bus.next(topic, RTT_TIMEOUT_S)
                except DeadlineExceeded:
                    lost += 1
                    if lost > 10:
                        raise BenchError("rtt: more than 10 round trips lost") from None
                    continue
                dt = ns() - t0
                if i >= warm:
                    rtts.append(dt)
            ctrl.send(b'{"bye": 1}')
            stats = bus.stats().as_dict()
        return {"n": len(rtts), "lost": lost, **_percentiles_us(rtts), "bus_stats": stats}

    from pubsub.runner import run

    _emit("RESULT", run(main(), event_loop=cfg["loop"]))
    ctrl.close()
    cctx.term()


def role_ours_rtt_b(cfg: dict[str, Any]) -> None:
    import zmq

    _ours_setup()
    q = _start_watchdog()
    cctx = zmq.Context()
    ctrl = _raw_socket(zmq, cctx, zmq.PAIR)
    _emit("HELLO", {})
    go = _wait_go(q)
    ctrl.connect(go["ctrl"])
    warm, n = cfg["warmup"], cfg["rtt_n"]

    async def main() -> dict[str, Any]:
        import numpy as np

        from pubsub.client import Bus
        from pubsub.errors import DeadlineExceeded

        grad = np.full(RTT_BYTES, 2, dtype=np.uint8)
        answered = 0
        hard = time.monotonic() + PHASE_TIMEOUT_S + HANDSHAKE_TIMEOUT_S
        async with Bus(go["broker"], name="bench-b",
                       security=_ours_security(cfg, go, CURVE_SUB_IDENTITY)) as bus:
            await bus.subscribe_many([f"emb/{i}" for i in range(warm + n)])
            await bus.subscribe("emb/probe")
            i = 0
            bye = False
            while i < warm + n and not bye:
                while bus.try_next("emb/probe") is not None:
                    bus.publish_nowait("grad/probe")
                try:
                    await bus.next(f"emb/{i}", 0.05)
                except DeadlineExceeded:
                    if ctrl.poll(0):
                        bye = True
                    elif time.monotonic() > hard:
                        raise BenchError("rtt B: no bye from A") from None
                    continue
                bus.publish_nowait(f"grad/{i}", (grad,), None, copy=False)
                answered += 1
                i += 1
            if not bye and not ctrl.poll(int((RTT_TIMEOUT_S + 10) * 1000)):
                raise BenchError("rtt B: no bye from A")
            stats = bus.stats().as_dict()
        return {"answered": answered, "bus_stats": stats}

    from pubsub.runner import run

    _emit("RESULT", run(main(), event_loop=cfg["loop"]))
    ctrl.close()
    cctx.term()


ROLES = {
    "proxy": role_proxy,
    "raw_thr_pub": role_raw_thr_pub, "raw_thr_sub": role_raw_thr_sub,
    "raw_rtt_a": role_raw_rtt_a, "raw_rtt_b": role_raw_rtt_b,
    "ours_thr_pub": role_ours_thr_pub, "ours_thr_sub": role_ours_thr_sub,
    "ours_rtt_a": role_ours_rtt_a, "ours_rtt_b": role_ours_rtt_b,
}


# =========================================================================== parent
def _pdeathsig() -> None:
    """In the child before exec: get SIGKILL when the parent dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort (non-Linux)
        pass


_LIVE: list[Child] = []  # every child not yet reaped, for the last-resort cleanup


class Child:
    """A child process with line-based stdout reading under deadlines."""

    def __init__(self, name: str, argv: list[str], *, stdin: bool = True) -> None:
        self.name = name
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=self.err, preexec_fn=_pdeathsig,
            cwd=Path(__file__).resolve().parent.parent,
        )
        _LIVE.append(self)
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            self.err.seek(0)
            return self.err.read().decode("utf-8", "replace")[-n:]
        except (OSError, ValueError):
            return ""

    def read(self, kind: str, deadline: float) -> dict[str, Any]:
        """The JSON of the next ``KIND {json}`` line (other lines are skipped)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        prefix = kind.encode() + b" "
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.startswith(prefix):
                    return json.loads(line[len(prefix):])
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"{self.name}: no {kind} in time; stderr: {self.stderr_tail()}")
            r, _, _ = select.select([fd], [], [], min(remaining, 0.5))
            if r:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    try:
                        self.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                    raise BenchError(f"{self.name} exited (rc={self.proc.returncode}) before "
                                     f"{kind}; stderr: {self.stderr_tail()}")
                self._buf += chunk

    def send(self, kind: str, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{kind} {json.dumps(obj)}\n".encode())
        self.proc.stdin.flush()

    def stop(self, sig: int = signal.SIGKILL, grace_s: float = 2.0) -> None:
        """End the child (closing stdin first lets our own roles exit on their own)."""
        p = self.proc
        try:
            if p.stdin is not None and not p.stdin.closed:
                p.stdin.close()
        except OSError:
            pass
        if p.poll() is None:
            try:
                p.send_signal(sig)
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
            except ProcessLookupError:
                pass
        if p.stdout is not None:
            p.stdout.close()
        self.err.close()
        if self in _LIVE:
            _LIVE.remove(self)


def _kill_all() -> None:
    for c in list(_LIVE):
        try:
            c.stop(signal.SIGKILL, 1.0)
        except Exception:  # noqa: BLE001 - last resort
            pass


def _spawn_role(role: str, cfg: dict[str, Any]) -> Child:
    argv = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--cfg", json.dumps(cfg)]
    return Child(role, argv)


def _make_keys(tmp: str) -> str:
    """Ephemeral CURVE keys for ours_curve, as ``psfl keys generate broker active passive``
    would write them, in ``TMP/keys`` (mode 0700; deleted with ``tmp``)."""
    from pubsub.security import BROKER_KEY_NAME, generate_certificate

    keys = Path(tmp) / "keys"
    generate_certificate(keys, BROKER_KEY_NAME)
    for name in (CURVE_SUB_IDENTITY, CURVE_PUB_IDENTITY):
        generate_certificate(keys, name, role=name)
    os.chmod(keys, 0o700)
    return str(keys)


def _start_broker(tmp: str, keys_dir: str | None = None) -> tuple[Child, str]:
    """Our broker exactly as ``psfl broker run`` starts it by default (bar the bind/ready file):
    ``--keys keys_dir`` (CURVE and the default topic policy), or ``--insecure`` without."""
    ready = Path(tmp) / "broker.addr"
    # the bus's throughput: runs open to every key (isolation is not what is measured)
    security = ["--keys", keys_dir, "--open-runs"] if keys_dir else ["--insecure"]
    argv = [sys.executable, "-m", "broker", "run", *security, "--bind", f"tcp://{HOST}:0",
            "--ready-file", str(ready), "--log-level", "warning",
            *[a for kv in BROKER_SETS for a in ("--set", kv)]]
    child = Child("broker", argv, stdin=False)
    deadline = time.monotonic() + CHILD_START_TIMEOUT_S
    while not ready.exists():
        if child.proc.poll() is not None:
            raise BenchError(f"broker exited rc={child.proc.returncode}: {child.stderr_tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"broker not ready in {CHILD_START_TIMEOUT_S} s")
        time.sleep(0.02)
    return child, ready.read_text().strip()


def run_group(kind: str, path: str, base: dict[str, Any], timeout_s: float,
              on_start: Any = None) -> dict[str, Any]:
    """Start the processes of one measurement (kind "thr" or "rtt") and collect results."""
    cfg = dict(base, path=path, loop="uvloop" if path in UVLOOP_PATHS else "asyncio")
    family = "ours" if path in OURS_PATHS else "raw"
    roles = ("thr_pub", "thr_sub") if kind == "thr" else ("rtt_a", "rtt_b")
    children: list[Child] = []
    infra: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="bench_bus_") as tmp:
        try:
            endpoints: dict[str, Any] = {}
            if path == "raw_proxy":
                proxy = _spawn_role("proxy", cfg)
                infra.append(proxy)
            workers = [_spawn_role(f"{family}_{r}", cfg) for r in roles]
            children.extend(workers)
            if family == "ours":
                keys_dir = None
                if path in CURVE_PATHS:
                    keys_dir = endpoints["keys_dir"] = _make_keys(tmp)
                broker, addr = _start_broker(tmp, keys_dir)
                infra.append(broker)
                endpoints["broker"] = addr
            start_deadline = time.monotonic() + CHILD_START_TIMEOUT_S
            for c in infra + workers:
                if c.name != "broker":
                    endpoints.update(c.read("HELLO", start_deadline))
            for c in workers:
                c.send("GO", endpoints)
            if on_start is not None:
                on_start({c.name: c.pid for c in infra + workers})
            deadline = time.monotonic() + timeout_s
            return {c.name.split("_", 1)[1]: c.read("RESULT", deadline) for c in workers}
        finally:
            for c in children:
                c.stop(signal.SIGKILL, 1.0)
            for c in infra:  # broker: SIGTERM = its clean shutdown
                c.stop(signal.SIGTERM if c.name == "broker" else signal.SIGKILL, 3.0)


# --------------------------------------------------------------------------- machine load
# The machine is shared (2 cores): other processes' CPU use during a measurement is
# recorded per group ("foreign_cores", averaged over the group's wall time), and before
# each group the parent waits (within a budget) for the machine to be quiet.
def _busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    busy = f[0] + f[1] + f[2] + sum(f[5:8])  # user nice system irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def wait_quiet(max_s: float) -> tuple[float, float]:
    """Wait up to ``max_s`` for other processes to use < QUIET_CORES; (their cores, waited s)."""
    t0 = time.monotonic()
    while True:
        b0, o0, w0 = _busy_s(), _own_cpu_s(), time.monotonic()
        time.sleep(QUIET_SAMPLE_S)
        cores = max(0.0, (_busy_s() - b0) - (_own_cpu_s() - o0)) / (time.monotonic() - w0)
        waited = time.monotonic() - t0
        if cores != cores or cores < QUIET_CORES or waited >= max_s:
            return cores, waited


def measure_group(kind: str, path: str, base: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """:func:`run_group` plus the CPU other processes used meanwhile."""
    b0, o0, w0 = _busy_s(), _own_cpu_s(), time.monotonic()
    res = run_group(kind, path, base, timeout_s)
    wall = time.monotonic() - w0
    ours = _own_cpu_s() - o0
    res["load"] = {"wall_s": wall, "own_cpu_s": ours,
                   "foreign_cores": max(0.0, (_busy_s() - b0) - ours) / wall}
    return res


# --------------------------------------------------------------------------- orchestration
def _order(r: int) -> list[str]:
    """Raw and ours alternate; who goes first flips every run."""
    if r % 2 == 0:
        return ["raw_proxy", "ours_uvloop", "raw_direct", "ours_asyncio", "raw_curve_direct",
                "ours_curve"]
    return ["ours_uvloop", "raw_proxy", "ours_asyncio", "raw_direct", "ours_curve",
            "raw_curve_direct"]


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]  # drop NaN
    return statistics.median(xs) if xs else float("nan")


def _thr_timeout(phases: list[Any]) -> float:
    # generous: the slowest plausible path at ~2 k msg/s for 64 B, ~300 msg/s at 1 MiB
    est = sum(3.0 + n / (2000 if size < 4096 else (1500 if size < (1 << 20) else 300))
              for _, size, n, _ in phases)
    return min(PHASE_TIMEOUT_S * len(phases), est + 20)


def _versions() -> dict[str, Any]:
    import numpy
    import zmq

    out = {"python": platform.python_version(), "pyzmq": zmq.__version__,
           "libzmq": zmq.zmq_version(), "numpy": numpy.__version__,
           "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        import uvloop

        out["uvloop"] = uvloop.__version__
    except ImportError:
        out["uvloop"] = None
    try:
        out["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).resolve().parent.parent).stdout.strip() or None
        # the measured library is the working tree: note uncommitted changes to it
        out["uncommitted_library_files"] = subprocess.run(
            ["git", "status", "--porcelain", "--", "pubsub", "broker"], capture_output=True,
            text=True, timeout=5, cwd=Path(__file__).resolve().parent.parent).stdout.split("\n")
        out["uncommitted_library_files"] = [x for x in out["uncommitted_library_files"] if x]
    except (OSError, subprocess.SubprocessError):
        out["git_commit"] = None
    return out


def _no_nan(obj: Any) -> Any:
    """NaN (a missing figure) becomes null, so the JSON stays standard."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _no_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_no_nan(v) for v in obj]
    return obj


def _fmt_ratio(x: float) -> str:
    return "-" if x != x else f"{x:.2f}x"


def _ratio(thr: dict[str, Any], num: str, den: str, label: str) -> float:
    """msgs/s of path ``num`` / msgs/s of path ``den`` at size ``label`` (NaN if missing);
    the same as the MB/s ratio, both being at the same message size."""
    a = thr.get(num, {}).get(label, {}).get("msgs_per_s", float("nan"))
    b = thr.get(den, {}).get(label, {}).get("msgs_per_s", float("nan"))
    return a / b if (a == a and b == b and b > 0) else float("nan")


def curve_ratios(thr: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{"num / den": {size: ratio}}`` for :data:`CURVE_RATIOS` (pure)."""
    return {f"{num} / {den}": {label: _ratio(thr, num, den, label) for label, _ in SIZES}
            for num, den in CURVE_RATIOS}


def aggregate(thr_runs: dict[str, list[dict[str, Any]]], rtt_runs: dict[str, list[dict[str, Any]]],
              paths: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    thr: dict[str, Any] = {}
    for path in paths:
        thr[path] = {}
        for label, _size in SIZES:
            rows = [dict(ph, foreign_cores=run["load"]["foreign_cores"])
                    for run in thr_runs.get(path, []) for ph in run["thr_sub"]["phases"]
                    if ph["size"] == label]
            if not rows:
                continue
            thr[path][label] = {
                "msgs_per_s": _median([r["msgs_per_s"] for r in rows]),
                "mb_per_s": _median([r["mb_per_s"] for r in rows]),
                "delivered_median": _median([r["delivered"] for r in rows]),
                "delivered_min": min(r["delivered"] for r in rows),
                "runs_ok": len(rows),
                "runs": [{k: r[k] for k in ("msgs_per_s", "mb_per_s", "sent", "received",
                                             "delivered", "window_s", "timed_out",
                                             "foreign_cores")} for r in rows],
            }
    for path in thr:
        for label, row in thr[path].items():
            base = thr.get(BASELINE, {}).get(label, {}).get("msgs_per_s", float("nan"))
            ok = base == base and base > 0
            row["ratio_vs_raw_proxy"] = row["msgs_per_s"] / base if ok else float("nan")
    for num, den in CURVE_RATIOS:
        for label, row in thr.get(num, {}).items():
            row[f"ratio_vs_{den}"] = _ratio(thr, num, den, label)
    rtt: dict[str, Any] = {}
    for path in paths:
        rows = [dict(run["rtt_a"], foreign_cores=run["load"]["foreign_cores"])
                for run in rtt_runs.get(path, [])]
        if not rows:
            continue
        rtt[path] = {
            "p50_us": _median([r["p50_us"] for r in rows]),
            "p99_us": _median([r["p99_us"] for r in rows]),
            "mean_us": _median([r["mean_us"] for r in rows]),
            "lost_total": sum(r["lost"] for r in rows),
            "runs_ok": len(rows),
            "runs": [{k: r.get(k) for k in ("p50_us", "p99_us", "mean_us", "max_us", "n", "lost",
                                            "foreign_cores")} for r in rows],
        }
    b = rtt.get(BASELINE)
    for row in rtt.values():
        row["p50_ratio_vs_raw_proxy"] = row["p50_us"] / b["p50_us"] if b else float("nan")
        row["p99_ratio_vs_raw_proxy"] = row["p99_us"] / b["p99_us"] if b else float("nan")
    return thr, rtt


def print_tables(thr: dict[str, Any], rtt: dict[str, Any], runs: int, counts: dict[str, int],
                 rtt_n: int) -> None:
    """The human-readable tables ("load" = cores other processes used meanwhile, median)."""
    if any(thr.values()):
        print()
        print(f"Throughput, PUB -> SUB in separate processes, measured at the receiver "
              f"(median of {runs} runs; ratio = msgs/s / raw_proxy msgs/s at the same size)")
        print("  counts per run: " + ", ".join(f"{k} x {v:,}" for k, v in counts.items())
              + "; delivered = worst run")
        hdr = (f"  {'path':<16} {'size':>6} {'msgs/s':>11} {'MB/s':>9} {'delivered':>10} "
               f"{'ratio':>7} {'load':>5}")
        print(hdr)
        print("  " + "-" * (len(hdr) - 2))
        for label, _ in SIZES:
            for path, rows in thr.items():
                row = rows.get(label)
                if row is None:
                    continue
                flag = "" if row["delivered_min"] >= 1.0 else "  DROPS"
                if row["runs_ok"] < runs:
                    flag += f"  ({row['runs_ok']}/{runs} runs ok)"
                load = _median([r["foreign_cores"] for r in row["runs"]])
                dl = row["delivered_min"] * 100
                print(f"  {path:<16} {label:>6} {row['msgs_per_s']:>11,.0f} "
                      f"{row['mb_per_s']:>9,.1f} {dl:>9.{1 if dl >= 100 else 2}f}% "
                      f"{_fmt_ratio(row['ratio_vs_raw_proxy']):>7} {load:>5.2f}{flag}")
            print()
        shown = [(num, den) for num, den in CURVE_RATIOS if num in thr and den in thr]
        if shown:
            print("  CURVE ratios (throughput, same size; median of runs)")
            for num, den in shown:
                cells = "  ".join(f"{label} {_fmt_ratio(_ratio(thr, num, den, label)):>6}"
                                  for label, _ in SIZES
                                  if label in thr[num] and label in thr[den])
                print(f"  {num + ' / ' + den:<30} {cells}")
            print()
    if rtt:
        print(f"Round trip emb/<i> -> grad/<i>, 64 KiB each way, {rtt_n} timed round trips "
              f"(median of {runs} runs; ratios vs raw_proxy)")
        hdr = (f"  {'path':<16} {'p50 us':>8} {'p99 us':>8} {'p50 ratio':>10} {'p99 ratio':>10} "
               f"{'lost':>5} {'load':>5}")
        print(hdr)
        print("  " + "-" * (len(hdr) - 2))
        for path, row in rtt.items():
            flag = "" if row["runs_ok"] == runs else f"  ({row['runs_ok']}/{runs} runs ok)"
            load = _median([r["foreign_cores"] for r in row["runs"]])
            print(f"  {path:<16} {row['p50_us']:>8.0f} {row['p99_us']:>8.0f} "
                  f"{_fmt_ratio(row['p50_ratio_vs_raw_proxy']):>10} "
                  f"{_fmt_ratio(row['p99_ratio_vs_raw_proxy']):>10} {row['lost_total']:>5} "
                  f"{load:>5.2f}{flag}")
        print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 runs and smaller counts (< 3 min)")
    ap.add_argument("--json", help="write results here (overwritten)")
    ap.add_argument("--runs", type=int, help="override the number of runs")
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of paths")
    ap.add_argument("--skip", choices=["thr", "rtt"], help="skip one of the two measurements")
    ap.add_argument("--sizes", default=",".join(label for label, _ in SIZES),
                    help="comma-separated subset of throughput sizes")
    ap.add_argument("--default-limits", action="store_true",
                    help="our subscriber keeps BusConfig's default per-topic buffer limits")
    ap.add_argument("--broker-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker setting for our paths, e.g. io_threads=2 (repeatable)")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    BROKER_SETS[:] = args.broker_set
    if args.role:
        ROLES[args.role](json.loads(args.cfg))
        return 0

    from broker.proxy import BrokerConfig
    from pubsub.client import BusConfig

    bus_cfg, broker_cfg = BusConfig(), BrokerConfig()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    bad = [p for p in paths if p not in PATHS]
    if bad:
        ap.error(f"unknown path(s) {bad}; choose from {PATHS}")
    sizes = [x.strip() for x in args.sizes.split(",") if x.strip()]
    if not sizes or any(x not in dict(SIZES) for x in sizes):
        ap.error(f"--sizes: choose from {[label for label, _ in SIZES]}")
    runs = args.runs or (RUNS_QUICK if args.quick else RUNS_FULL)
    counts = COUNTS_QUICK if args.quick else COUNTS_FULL
    rtt_n = RTT_N_QUICK if args.quick else RTT_N_FULL
    warm = WARMUP_RTT_QUICK if args.quick else WARMUP_RTT_FULL
    sub_limits = None if args.default_limits else [SUB_MAX_MSGS, SUB_MAX_BYTES]
    min_hwm = min(h for h in (bus_cfg.sndhwm, bus_cfg.rcvhwm, broker_cfg.sndhwm,
                              broker_cfg.rcvhwm) if h > 0)
    phases = [[label, size, counts[label],
               max(16, min(int(min_hwm * WINDOW_MSGS_OF_HWM), WINDOW_BYTES // size))]
              for label, size in SIZES if label in sizes]
    base = {
        "phases": phases, "rtt_n": rtt_n, "warmup": warm, "sub_limits": sub_limits,
        "bus_sndhwm": bus_cfg.sndhwm, "bus_rcvhwm": bus_cfg.rcvhwm,
        "broker_sndhwm": broker_cfg.sndhwm, "broker_rcvhwm": broker_cfg.rcvhwm,
    }

    def _on_term(*_: Any) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, _on_term)
    t_start = time.monotonic()
    mode = "quick" if args.quick else "full"
    quiet_waited = retry_spent = 0.0
    discarded: list[dict[str, Any]] = []
    thr_runs: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    rtt_runs: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    errors: list[dict[str, Any]] = []
    thr_timeout = _thr_timeout(phases)
    rtt_timeout = HANDSHAKE_TIMEOUT_S + (warm + rtt_n) * 0.01 + 30
    try:
        for r in range(runs):
            order = [p for p in _order(r) if p in paths]
            for kind in ("thr", "rtt"):
                if args.skip == kind:
                    continue
                for path in order:
                    attempt = 0
                    while True:
                        budget = max(0.0, QUIET_BUDGET_S[mode] - quiet_waited)
                        bg, waited = wait_quiet(min(QUIET_MAX_S[mode], budget))
                        quiet_waited += waited
                        t0 = time.monotonic()
                        try:
                            res = measure_group(kind, path, base,
                                                thr_timeout if kind == "thr" else rtt_timeout)
                        except BenchError as exc:
                            errors.append({"run": r, "kind": kind, "path": path,
                                           "error": str(exc)})
                            print(f"[run {r + 1}/{runs}] {kind} {path}: FAILED: {exc}",
                                  file=sys.stderr, flush=True)
                            res = None
                            break
                        spent = time.monotonic() - t0
                        load = res["load"]
                        load["foreign_cores_before"] = bg
                        load["attempt"] = attempt
                        if kind == "thr":
                            desc = "  ".join(f"{ph['size']} {ph['msgs_per_s']:,.0f}/s"
                                             + ("" if ph["delivered"] >= 1 else
                                                f" ({ph['delivered'] * 100:.1f}%)")
                                             for ph in res["thr_sub"]["phases"])
                        else:
                            a = res["rtt_a"]
                            desc = f"p50 {a['p50_us']:.0f} us  p99 {a['p99_us']:.0f} us"
                        noisy = load["foreign_cores"] > NOISY_CORES
                        # (throughput only: on this VM, other load can make round trips faster
                        # as well as slower - busy vCPUs wake up sooner - so it is just recorded)
                        retry = (kind == "thr" and noisy and attempt < MAX_RETRIES
                                 and retry_spent + spent <= RETRY_BUDGET_S[mode])
                        print(f"[run {r + 1}/{runs}] {kind} {path:<12} {desc}  ({spent:.1f} s, "
                              f"other load {load['foreign_cores']:.2f} cores"
                              f"{'; noisy, repeating' if retry else ''})",
                              file=sys.stderr, flush=True)
                        if not retry:
                            break
                        retry_spent += spent
                        discarded.append({"run": r, "kind": kind, "path": path, "result": res})
                        attempt += 1
                    if res is not None:
                        (thr_runs if kind == "thr" else rtt_runs)[path].append(res)
    finally:
        _kill_all()

    thr, rtt = aggregate(thr_runs, rtt_runs, paths)
    print_tables(thr, rtt, runs, counts, rtt_n)

    def _get(d: dict[str, Any], *keys: str) -> float:
        for k in keys:
            if not isinstance(d, dict) or k not in d:
                return float("nan")
            d = d[k]
        return float(d)  # type: ignore[arg-type]

    summary = {
        "ratio_64B": _get(thr, HEADLINE, "64B", "ratio_vs_raw_proxy"),
        "ratio_64KiB": _get(thr, HEADLINE, "64KiB", "ratio_vs_raw_proxy"),
        "ratio_1MiB": _get(thr, HEADLINE, "1MiB", "ratio_vs_raw_proxy"),
        "rtt_p99_ratio_64KiB": _get(rtt, HEADLINE, "p99_ratio_vs_raw_proxy"),
        "raw_proxy_msgs_per_s": {label: _get(thr, BASELINE, label, "msgs_per_s")
                                 for label, _ in SIZES},
        # CURVE (added after the keys above, which keep their meaning)
        "mb_per_s": {path: {label: _get(thr, path, label, "mb_per_s") for label, _ in SIZES}
                     for path in paths},
        "curve_ratios": curve_ratios(thr),
        "rtt_curve_p99_ratio_64KiB": (_get(rtt, "ours_curve", "p99_us")
                                      / _get(rtt, HEADLINE, "p99_us")),
    }
    print("summary: " + json.dumps(summary))
    elapsed = time.monotonic() - t_start
    print(f"elapsed: {elapsed:.0f} s" + (f"; {len(errors)} failed group(s)" if errors else ""))
    if args.json:
        doc = {
            "summary": summary,
            "throughput": thr,
            "rtt": rtt,
            "settings": {
                "mode": "quick" if args.quick else "full", "runs": runs,
                "counts": counts, "rtt_n": rtt_n, "rtt_warmup": warm, "rtt_bytes": RTT_BYTES,
                "paths": paths, "baseline": BASELINE, "headline": HEADLINE,
                "hwm": {"pub_sndhwm": bus_cfg.sndhwm, "sub_rcvhwm": bus_cfg.rcvhwm,
                        "sub_sndhwm": 0, "proxy_xsub_rcvhwm": broker_cfg.rcvhwm,
                        "proxy_xpub_sndhwm": broker_cfg.sndhwm,
                        "note": "raw sockets use our BusConfig/BrokerConfig defaults"},
                "zero_copy_from_bytes": ZERO_COPY_MIN,
                "credit_window_msgs": {ph[0]: ph[3] for ph in phases},
                "credit_ack_every": {ph[0]: max(1, ph[3] // 4) for ph in phases},
                "ours_publisher_yield_every": YIELD_EVERY,
                "ours_sub_topic_limits": (
                    {"max_msgs": sub_limits[0], "max_bytes": sub_limits[1]} if sub_limits
                    else "BusConfig defaults"),
                "bus_config": {"topic_max_msgs": bus_cfg.topic_max_msgs,
                               "drain_burst": bus_cfg.drain_burst,
                               "total_max_bytes": bus_cfg.total_max_bytes},
                "broker": "python -m broker run --insecure --bind tcp://127.0.0.1:0 "
                          "--ready-file F --log-level warning (BrokerConfig defaults: "
                          f"validate=True, drain_burst={broker_cfg.drain_burst}, "
                          f"stats_interval_s={broker_cfg.stats_interval_s}); ours_curve: "
                          "--keys DIR instead of --insecure",
                "curve": {
                    "raw_curve_direct": "PUB = CURVE server, SUB = CURVE client, fresh "
                                        "keypairs per process, no ZAP handler",
                    "ours_curve": "ephemeral keys broker/active/passive in a temp dir (0700), "
                                  "broker --keys DIR with broker/default_policy.toml; "
                                  f"throughput publisher and RTT A = {CURVE_PUB_IDENTITY!r} "
                                  f"(emb/...), subscriber and RTT B = {CURVE_SUB_IDENTITY!r} "
                                  "(reads emb/..., publishes grad/...); uvloop",
                    "ratios": [f"{n} / {d}" for n, d in CURVE_RATIOS],
                },
                "order": "per run: raw/ours alternate; who goes first flips every run",
                "mb": "payload bytes / 1e6",
                "machine_load": {
                    "quiet_cores": QUIET_CORES, "noisy_cores": NOISY_CORES,
                    "max_retries": MAX_RETRIES, "retry_budget_s": RETRY_BUDGET_S[mode],
                    "quiet_waited_s": quiet_waited, "retry_spent_s": retry_spent,
                    "note": "foreign_cores = CPU used by other processes during a group / "
                            "its wall time; noisy groups are repeated within the budget"},
            },
            "raw_results": {"thr": thr_runs, "rtt": rtt_runs},
            "discarded_noisy": discarded,
            "errors": errors,
            "versions": _versions(),
            "elapsed_s": elapsed,
        }
        Path(args.json).write_text(json.dumps(_no_nan(doc), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
