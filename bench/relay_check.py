"""Check sim.cluster.relay's shaping against theory on this machine.

Prints, for one 64 KiB ZeroMQ message (PUSH -> PULL over tcp://127.0.0.1):

* the median one-way transfer time direct (no relay), through the relay at
  unlimited bandwidth, and through the relay at 100 Mbit/s;
* the shaped extra time (100 Mbit/s minus unlimited relay) against the theoretical
  65 536 * 8 / 100e6 = 5.24 ms, as a ratio;
* the relay's own overhead at unlimited bandwidth (relay minus direct), also for a
  64 B message.

Each figure is the median over ``--n`` transfers (default 50) on an idle link
(``--gap-ms`` pause between transfers). The relay runs on its own event loop in a
background thread (``--uvloop`` to use uvloop there); the sender and receiver are
blocking pyzmq sockets in the main thread, so a transfer time is send() to recv().

Run: ``PYTHONPATH=. python bench/relay_check.py [--n 50] [--uvloop]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time
from typing import Any

import zmq

from pubsub.logs import configure_logging
from sim.cluster.relay import LinkSpec, Relay


def _median_s(ctx: zmq.Context[Any], endpoint: str | None, payload: bytes, n: int,
              gap_s: float, spec: LinkSpec | None, use_uvloop: bool) -> float:
    pull = ctx.socket(zmq.PULL)
    pull.linger = 0
    pull.rcvtimeo = 10000
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    loop = thread = relay = None
    target = f"tcp://127.0.0.1:{port}"
    if spec is not None:
        if use_uvloop:
            import uvloop
            loop = uvloop.new_event_loop()
        else:
            loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        relay = Relay([("127.0.0.1", port)], spec)
        asyncio.run_coroutine_threadsafe(relay.start(), loop).result(10)
        target = relay.endpoint_for(("127.0.0.1", port))
    push = ctx.socket(zmq.PUSH)
    push.linger = 0
    push.sndtimeo = 10000
    push.connect(target)
    try:
        push.send(b"warm")
        pull.recv()
        times = []
        for _ in range(n):
            time.sleep(gap_s)
            t0 = time.perf_counter()
            push.send(payload, copy=False)
            got = pull.recv(copy=False)
            times.append(time.perf_counter() - t0)
            assert len(got) == len(payload)
        return statistics.median(times)
    finally:
        push.close(0)
        pull.close(0)
        if relay is not None and loop is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(relay.close(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=50, help="transfers per figure (median)")
    p.add_argument("--gap-ms", type=float, default=5.0, help="idle pause between transfers")
    p.add_argument("--uvloop", action="store_true", help="run the relay's loop on uvloop")
    a = p.parse_args()
    configure_logging(stderr_level="warning")
    ctx = zmq.Context()
    gap = a.gap_ms / 1000
    big, small = os.urandom(65536), os.urandom(64)
    try:
        direct = _median_s(ctx, None, big, a.n, gap, None, a.uvloop)
        relay_unl = _median_s(ctx, None, big, a.n, gap, LinkSpec(), a.uvloop)
        relay_100 = _median_s(ctx, None, big, a.n, gap, LinkSpec(bandwidth_bps=100e6), a.uvloop)
        direct_s = _median_s(ctx, None, small, a.n, gap, None, a.uvloop)
        relay_s = _median_s(ctx, None, small, a.n, gap, LinkSpec(), a.uvloop)
    finally:
        ctx.destroy(linger=0)
    theory = 65536 * 8 / 100e6
    extra = relay_100 - relay_unl
    loop_name = "uvloop" if a.uvloop else "asyncio"
    print(f"relay event loop: {loop_name}; medians over {a.n} transfers, 64 KiB = 65536 B")
    print(f"64 KiB direct (no relay)          {direct * 1e3:8.3f} ms")
    print(f"64 KiB relay, unlimited           {relay_unl * 1e3:8.3f} ms")
    print(f"64 KiB relay, 100 Mbit/s          {relay_100 * 1e3:8.3f} ms")
    print(f"  vs direct                       {(relay_100 - direct) * 1e3:8.3f} ms more")
    print(f"  shaped extra (100M - unlimited) {extra * 1e3:8.3f} ms; theory {theory * 1e3:.3f} ms;"
          f" ratio {extra / theory:.3f}")
    print(f"relay overhead, 64 KiB, unlimited {(relay_unl - direct) * 1e3:8.3f} ms")
    print(f"relay overhead, 64 B, unlimited   {(relay_s - direct_s) * 1e3:8.3f} ms"
          f" (direct {direct_s * 1e3:.3f} ms, relay {relay_s * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
