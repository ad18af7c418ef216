"""Bounded memory under a flood: broker and client RSS stay under their configured bounds.

Two scenarios, each a flood of 1 MiB messages for ``--seconds`` (60 by default):

* **stalled subscriber process** (SIGSTOP): nothing is read on its socket, so the broker
  queues towards it until its high-water marks. The broker's configured bound is
  ``(sndhwm + rcvhwm) × max_message_bytes`` (one subscriber, one publisher).
* **stalled application** (the subscriber's reader runs but the application never takes
  a message): the client's topic buffers fill; its bound is ``total_max_bytes`` plus
  libzmq's receive queue (``rcvhwm`` messages).

The publisher calls ``publish_nowait`` as fast as it can; its own high-water mark drops
most of those calls at the source, so the table shows what reached the broker (``in``).
RSS is sampled with psutil every 50 ms; the figure is peak RSS minus the RSS before the
flood. ``--min-bytes-in B`` floods on past ``--seconds`` (up to 120 s more) until B bytes
have reached the broker, so a loaded machine still pushes a known volume through it.
Usage: ``python bench/soak_memory.py [--quick] [--seconds S] [--min-bytes-in B] [--json PATH]``
(``--quick``: 8 s per scenario). Exit code 1 if a bound is exceeded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

MIB = 1 << 20
BROKER_HWM = 64  # messages, each direction
MAX_MSG = MIB + 4096  # 1 MiB payload + envelope
CLIENT_TOTAL = 128 * MIB
CLIENT_RCVHWM = 64


def _start_broker(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready = tmp / "broker.addr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "run", "--insecure", "--bind", "tcp://127.0.0.1:0", "--ready-file",
         str(ready), "--log-level", "error", "--set", f"sndhwm={BROKER_HWM}",
         "--set", f"rcvhwm={BROKER_HWM}", "--set", f"max_message_bytes={MAX_MSG}"],
        stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("broker did not start")
        time.sleep(0.02)
    return proc, ready.read_text().strip()


async def _subscriber(addr: str, ready: Path) -> None:
    from pubsub import Bus, BusConfig

    cfg = BusConfig(total_max_bytes=CLIENT_TOTAL, topic_max_bytes=CLIENT_TOTAL,
                    topic_max_msgs=1 << 20, rcvhwm=CLIENT_RCVHWM)
    async with Bus(addr, name="soak-sub", config=cfg) as bus:
        await bus.subscribe("soak/1")
        await bus.subscribe("soak/ready")
        await bus.next("soak/ready", timeout_s=30)  # the publisher reached us
        ready.write_text("ok")
        await asyncio.sleep(3600)  # never take a message: the application is stalled


async def _publisher(addr: str, stop: Path, max_seconds: float) -> int:
    """Flood until the orchestrator writes ``stop`` (or ``max_seconds``, a hang bound)."""
    from pubsub import Bus

    payload = np.ones(MIB, np.uint8)
    sent = 0
    async with Bus(addr, name="soak-pub") as bus:
        t_end = time.monotonic() + max_seconds
        while time.monotonic() < t_end:
            if sent % 256 == 0 and stop.exists():
                break
            bus.publish_nowait("soak/1", [payload], copy=False)
            sent += 1
            if sent % 16 == 0:
                await asyncio.sleep(0)
    return sent


def _sample(procs: dict[str, psutil.Process], peak: dict[str, int]) -> None:
    for name, p in procs.items():
        try:
            peak[name] = max(peak[name], p.memory_info().rss)
        except psutil.Error:
            pass


def bounds() -> tuple[int, int]:
    """The broker's and the client's configured memory bounds (bytes)."""
    return 2 * BROKER_HWM * MAX_MSG, CLIENT_TOTAL + CLIENT_RCVHWM * MAX_MSG


EXTRA_S = 120.0  # how long a flood may go on past ``seconds`` to reach ``min_bytes_in``


def run_scenario(stall_process: bool, seconds: float, min_bytes_in: int = 0) -> dict[str, Any]:
    """One flood of at least ``seconds`` and (within ``EXTRA_S`` more) ``min_bytes_in``
    bytes into the broker; returns peak RSS growth of broker and subscriber and their
    bounds (bytes)."""
    from pubsub.control import request_stats

    with tempfile.TemporaryDirectory(prefix="soak-") as tmpd:
        tmp = Path(tmpd)
        broker, addr = _start_broker(tmp)
        sub_ready = tmp / "sub.ready"
        sub = subprocess.Popen([sys.executable, __file__, "--role", "sub", "--addr", addr,
                                "--ready", str(sub_ready)])
        pub = None
        try:
            # handshake: publish on soak/ready until the subscriber confirms
            ready_pub = subprocess.Popen([sys.executable, __file__, "--role", "ready",
                                          "--addr", addr, "--ready", str(sub_ready)])
            ready_pub.wait(60)
            if not sub_ready.exists():
                raise RuntimeError("subscriber never confirmed")
            procs = {"broker": psutil.Process(broker.pid), "client": psutil.Process(sub.pid)}
            time.sleep(0.5)
            base = {n: p.memory_info().rss for n, p in procs.items()}
            peak = dict(base)
            if stall_process:
                os.kill(sub.pid, signal.SIGSTOP)
            stop = tmp / "pub.stop"
            pub = subprocess.Popen([sys.executable, __file__, "--role", "pub", "--addr", addr,
                                    "--stop", str(stop), "--seconds",
                                    str(seconds + EXTRA_S + 30)], stdout=subprocess.PIPE)
            t0 = time.monotonic()
            next_poll = t0 + seconds
            while pub.poll() is None:
                now = time.monotonic()
                if now > t0 + seconds + EXTRA_S + 60:
                    raise RuntimeError("publisher did not finish")
                if now >= next_poll and not stop.exists():
                    got = request_stats(addr, timeout_s=10)["bytes_in"].get("soak", 0)
                    if got >= min_bytes_in or now > t0 + seconds + EXTRA_S:
                        stop.write_text("stop")
                    next_poll = now + 0.25
                _sample(procs, peak)
                time.sleep(0.05)
            flood_s = time.monotonic() - t0
            out = (pub.stdout.read() if pub.stdout else b"").split()
            sent = int(out[-1]) if out else 0
            _sample(procs, peak)
            bstats = request_stats(addr, timeout_s=10)
            broker_in = bstats["bytes_in"].get("soak", 0)
            broker_out = bstats["bytes_out"].get("soak", 0)
        finally:
            for p in (pub, sub):
                if p is not None and p.poll() is None:
                    with_cont = stall_process and p is sub
                    if with_cont:
                        os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                    p.wait(10)
            broker.terminate()
            try:
                broker.wait(10)
            except subprocess.TimeoutExpired:
                broker.kill()
    broker_bound, client_bound = bounds()
    growth = {n: peak[n] - base[n] for n in peak}
    return {
        "scenario": "stalled_process" if stall_process else "stalled_application",
        "seconds": seconds,
        "flood_s": round(flood_s, 2),
        "min_bytes_in": min_bytes_in,
        "publish_calls": sent,
        "broker_bytes_in": broker_in,
        "broker_bytes_out": broker_out,
        "broker_rss_growth_bytes": growth["broker"],
        "broker_bound_bytes": broker_bound,
        "client_rss_growth_bytes": growth["client"],
        "client_bound_bytes": client_bound,
        "ok": growth["broker"] <= broker_bound and growth["client"] <= client_bound,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 s per scenario")
    ap.add_argument("--seconds", type=float, help="flood duration per scenario (default 60)")
    ap.add_argument("--min-bytes-in", type=int, default=0, metavar="B",
                    help="flood on past --seconds (up to 120 s more) until B bytes reached "
                         "the broker")
    ap.add_argument("--json", metavar="PATH", help="write the results here (overwrites)")
    ap.add_argument("--role", choices=["sub", "pub", "ready"], help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--ready", help=argparse.SUPPRESS)
    ap.add_argument("--stop", help=argparse.SUPPRESS)  # the publisher's stop file
    args = ap.parse_args(argv)
    from pubsub.logs import configure_logging
    from pubsub.runner import run

    configure_logging(stderr_level="warning")
    if args.role == "sub":
        run(_subscriber(args.addr, Path(args.ready)))
        return 0
    if args.role == "pub":
        print(run(_publisher(args.addr, Path(args.stop), args.seconds)))
        return 0
    if args.role == "ready":
        return run(_ready(args.addr, Path(args.ready)))
    seconds = args.seconds or (8.0 if args.quick else 60.0)
    results = [run_scenario(True, seconds, args.min_bytes_in),
               run_scenario(False, seconds, args.min_bytes_in)]
    print(f"{'scenario':<22}{'in MiB':>10}{'broker +RSS MiB':>17}{'bound':>8}"
          f"{'client +RSS MiB':>17}{'bound':>8}  ok")
    for r in results:
        print(f"{r['scenario']:<22}{r['broker_bytes_in'] / MIB:>10,.0f}"
              f"{r['broker_rss_growth_bytes'] / MIB:>17.1f}{r['broker_bound_bytes'] / MIB:>8.0f}"
              f"{r['client_rss_growth_bytes'] / MIB:>17.1f}{r['client_bound_bytes'] / MIB:>8.0f}"
              f"  {r['ok']}")
    summary = {
        "broker_rss_growth_bytes": max(r["broker_rss_growth_bytes"] for r in results),
        "broker_bound_bytes": results[0]["broker_bound_bytes"],
        "client_rss_growth_bytes": max(r["client_rss_growth_bytes"] for r in results),
        "client_bound_bytes": results[0]["client_bound_bytes"],
        "within_bounds": all(r["ok"] for r in results),
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": results}, indent=2))
    return 0 if summary["within_bounds"] else 1


async def _ready(addr: str, ready: Path) -> int:
    from pubsub import Bus

    async with Bus(addr, name="soak-ready") as bus:
        for _ in range(1500):
            bus.publish_nowait("soak/ready", [], {})
            await asyncio.sleep(0.02)
            if ready.exists():
                return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
