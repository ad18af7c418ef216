"""Shared fixtures: real broker processes on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hypothesis import settings

import zmq

from pubsub import Bus, DeadlineExceeded
from pubsub.address import BrokerAddress
from pubsub.logs import configure_logging

configure_logging(stderr_level="warning")

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=100)
settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
#: the packages the suite's processes import (compiled once per run: see pytest_configure)
PACKAGES = ("pubsub", "broker", "parties", "synth", "sim")


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode caches for the run, also where ``PYTHONDONTWRITEBYTECODE`` is set (as on
    this project's CI machines). The suite starts about 200 Python processes (brokers,
    launchers, fork servers, parties, coordinators); without ``.pyc`` files each compiles
    the modules it imports from source (1 s of CPU for a party's fork server), and each
    xdist worker re-applies pytest's assertion rewriting to every test module at
    collection (6 s of CPU). So the first process (the xdist controller, or the one
    process without xdist) compiles the packages once, before any worker starts, and
    every process of the run lets pytest cache its rewritten test modules. The caches
    are ``__pycache__`` directories in the checkout (git-ignored), checked against the
    sources' modification times as Python always does; where the checkout is read-only
    nothing is written and nothing fails."""
    sys.dont_write_bytecode = False  # this process only; its children keep the environment
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        import compileall

        for pkg in PACKAGES:
            compileall.compile_dir(REPO / pkg, quiet=2, workers=1)


class _MachineLock:
    """This xdist worker's side of a writer-preferring readers-writer lock over two
    ``flock`` files in the run's shared temporary root: every test passes a turnstile,
    then holds the machine lock shared; an exclusive test holds the turnstile (so no new
    test starts) while it waits for and holds the machine lock exclusively. A worker keeps
    the exclusive hold across consecutive exclusive tests (released before its next
    shared test or after its last), so a block of them waits once for the other worker
    to finish its test, not once per test."""

    def __init__(self) -> None:
        self.files: tuple[Any, Any] | None = None
        self.exclusive = False

    def _open(self, root: Path) -> tuple[Any, Any]:
        if self.files is None:
            self.files = (open(root / "psfl-turnstile.lock", "a"),  # noqa: SIM115
                          open(root / "psfl-machine.lock", "a"))  # noqa: SIM115
        return self.files

    def acquire(self, root: Path, *, exclusive: bool) -> None:
        import fcntl

        gate, machine = self._open(root)
        if exclusive:
            if not self.exclusive:
                fcntl.flock(gate, fcntl.LOCK_EX)
                fcntl.flock(machine, fcntl.LOCK_EX)
                self.exclusive = True
            return
        self.release_exclusive()
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)

    def release_shared(self) -> None:
        import fcntl

        if self.files is not None and not self.exclusive:
            fcntl.flock(self.files[1], fcntl.LOCK_UN)

    def release_exclusive(self) -> None:
        import fcntl

        if self.files is not None and self.exclusive:
            fcntl.flock(self.files[1], fcntl.LOCK_UN)
            fcntl.flock(self.files[0], fcntl.LOCK_UN)
            self.exclusive = False


_MACHINE = _MachineLock()


@pytest.fixture(autouse=True)
def _share_the_machine(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under pytest-xdist, a test marked ``exclusive`` (it measures CPU time, CPU shares or
    idleness) runs while no other worker runs a test; other tests share the machine
    (:class:`_MachineLock`). Without xdist it is a no-op."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield
        return
    root = tmp_path_factory.getbasetemp().parent  # shared by this run's workers
    exclusive = request.node.get_closest_marker("exclusive") is not None
    _MACHINE.acquire(root, exclusive=exclusive)
    try:
        yield
    finally:
        _MACHINE.release_shared()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Exclusive tests first. pytest-xdist's worksteal scheduler gives each worker a
    contiguous share of the collection, so the exclusive tests then run as one block on
    the first worker while the others start their shares' first (unit) tests: the
    machine drains once, early, instead of once per exclusive module in the middle of
    the long integration runs (each drain idles the other workers until their longest
    running test ends)."""
    items.sort(key=lambda item: item.get_closest_marker("exclusive") is None)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One line per ``cross_host`` test (parties on hosts made of network namespaces): that
    it ran, or why it skipped, so that a CI log shows which."""
    for outcome in ("passed", "failed", "skipped", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            if rep.when not in ("call", "setup") or "cross_host" not in rep.keywords:
                continue
            if outcome == "passed" and rep.when != "call":
                continue
            why = ""
            if outcome == "skipped" and isinstance(rep.longrepr, tuple):
                why = f": {rep.longrepr[2]}"
            terminalreporter.write_line(f"cross-host (network namespaces): {rep.nodeid} "
                                        f"{outcome.upper()} in {rep.duration:.1f} s{why}")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Give the machine back after a block of exclusive tests (see :class:`_MachineLock`)."""
    if nextitem is None or nextitem.get_closest_marker("exclusive") is None:
        _MACHINE.release_exclusive()


class BrokerProcess:
    """A ``python -m broker run`` child process; ``.address`` is its base address.

    Plaintext (``--insecure``) unless ``keys`` names a keys directory (CURVE).
    """

    def __init__(self, tmp: Path, *extra: str, keys: Path | None = None) -> None:
        ready = tmp / f"broker-{time.monotonic_ns()}.addr"
        security = ["--keys", str(keys)] if keys is not None else ["--insecure"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "run", *security, "--bind", "tcp://127.0.0.1:0",
             "--ready-file", str(ready), "--log-level", "error", *extra],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("broker process did not start")
            time.sleep(0.02)
        self.address = ready.read_text().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A validating broker process shared by a test module."""
    b = BrokerProcess(tmp_path_factory.mktemp("broker"))
    yield b
    b.stop()
    assert b.proc.returncode == 0, "broker did not exit cleanly on SIGTERM"


@pytest.fixture(scope="module")
def raw_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with envelope validation off, to deliver malformed frames to subscribers."""
    b = BrokerProcess(tmp_path_factory.mktemp("rawbroker"), "--set", "broker.validate=false")
    yield b
    b.stop()


@pytest.fixture(scope="session", autouse=True)
def _party_fork_server() -> None:
    """Start this test process's party fork server (:mod:`parties.core.zygote`) at once: the
    launches made in this process (``run_vfl``, ``sim.api``, ``sim.cli.main``) and the
    process workers of in-memory runs then fork from one server that imported torch once,
    instead of a server with a shorter preload that whichever came first would start."""
    from parties.core import zygote

    zygote.warm()


@pytest.fixture(autouse=True)
def _no_open_cpu_limiters() -> Iterator[None]:
    """Fail a test that leaves a CPU limiter open: a duty-cycle limiter's thread would
    go on stopping and continuing the processes it tracks during later tests."""
    from sim.cluster.cpu import _open_limiters

    before = set(_open_limiters)
    yield
    left = [lim.describe() for lim in set(_open_limiters) - before if not lim.closed]
    for lim in set(_open_limiters) - before:
        lim.close()
    assert not left, f"CPU limiters left open: {left}"


@pytest.fixture(autouse=True)
def _no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves child processes (brokers, parties, workers) behind.

    Module-scoped broker fixtures are exempt: they are children by design until their
    module ends.
    """
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 5.0
    while True:
        extra = [p for p in me.children(recursive=True)
                 if p.pid not in before and p.is_running()
                 and p.status() != psutil.STATUS_ZOMBIE
                 # multiprocessing's per-process singletons (fork server, resource
                 # tracker) live as long as the test session, by design; what a fork
                 # server forked (parties, workers: they carry its command line) does not
                 and not (p.ppid() == me.pid and "forkserver" in " ".join(p.cmdline()))
                 and "resource_tracker" not in " ".join(p.cmdline())]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    module_brokers = {b.proc.pid for name in ("broker", "raw_broker", "blocking_broker",
                                                 "dropping_broker")
                      if name in request.fixturenames
                      for b in [request.getfixturevalue(name)]}
    leaked = [p for p in extra if p.pid not in module_brokers]
    assert not leaked, "leaked child processes: " + ", ".join(
        f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in leaked)


def wait_for_event(path: Path, event: str, timeout_s: float) -> None:
    """Wait until the JSON-lines log ``path`` holds an ``event`` line (AssertionError after
    ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and f'"event":"{event}"' in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"no {event} in {path} within {timeout_s} s")


async def wait_subscribed(pub: Bus, sub: Bus, topic: str) -> None:
    """Publish on ``topic`` until ``sub`` receives one (the subscription has reached the
    publisher through the broker), then drain what the probing left in ``sub``'s buffer."""
    for _ in range(200):
        await pub.publish(topic, [], {})
        try:
            await sub.next(topic, timeout_s=0.02)
        except DeadlineExceeded:
            continue
        await asyncio.sleep(0.01)
        while sub.try_next(topic) is not None:
            pass
        return
    raise AssertionError("subscription never propagated")


@contextmanager
def raw_publisher(address: str) -> Iterator[zmq.Socket]:
    """A bare pyzmq PUB socket connected to a broker's publisher port (to send frames the
    bus itself would never produce)."""
    ctx = zmq.Context()
    raw = ctx.socket(zmq.PUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(BrokerAddress.parse(address).pub_endpoint)
    try:
        yield raw
    finally:
        raw.close(0)
        ctx.term()


def psfl_in_process(capfd: pytest.CaptureFixture[str], *args: str
                    ) -> subprocess.CompletedProcess[str]:
    """``psfl ARGS`` through :func:`sim.cli.main` in this process, as a
    ``CompletedProcess`` (code, stdout, stderr). The launcher runs here; the broker and the
    parties it starts are still real processes (the parties forked from this test
    process's party fork server, :mod:`parties.core.zygote`, writing to this test's captured
    output), so a job costs no interpreter start and no per-job import of torch. The
    ``python -m sim.cli`` wiring keeps subprocess tests of its own. An uncaught exception
    propagates and fails the test (a child process would print a traceback); argparse's
    own exit is returned as a code."""
    from sim.cli import main

    capfd.readouterr()  # drop anything printed before
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["psfl", *args], code, out, err)


def bank_sample_csv(tmp_path_factory: pytest.TempPathFactory, n: int) -> Path:
    """``n`` rows of the bundled bank table, sampled with a fixed seed, as a CSV file."""
    from parties.data import load_table

    frame, _ = load_table("bank")
    path = tmp_path_factory.mktemp("data") / f"bank_{n}.csv"
    frame.sample(n=n, random_state=0).to_csv(path, index=False)
    return path


def synth_table(n: int = 3000, seed: int = 0) -> Any:
    """A small table with planted dependencies for FedForge runs: ``b`` depends on ``a``,
    ``income`` on ``b``; ``age`` and ``hours`` are independent (pandas DataFrame)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    a = rng.choice(["x", "y", "z"], n, p=[0.5, 0.3, 0.2])
    b = np.where(a == "x", rng.choice(["u", "v"], n, p=[0.9, 0.1]),
                 rng.choice(["u", "v"], n, p=[0.2, 0.8]))  # b depends on a
    age = rng.integers(18, 80, n)
    income = (rng.random(n) < np.where(b == "u", 0.7, 0.2)).astype(int)  # depends on b
    hours = np.round(rng.normal(40, 8, n), 1)
    return pd.DataFrame({"a": a, "b": b, "age": age, "hours": hours, "income": income})


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    """torch's intra-op pool at one thread for the module's in-process fits (as FedForge's
    coordinator runs them: ``SynthConfig.engine.threads`` = 1), restored afterwards. Its
    small fits gain nothing from more threads, and OpenMP threads that spin for cores the
    other xdist worker and its processes hold slowed them many times over. No-op without
    torch."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def synth_mst_run(tmp_path_factory: pytest.TempPathFactory,
                  jax_compile_cache: Path) -> tuple[Any, Any]:
    """One uninterrupted FedForge MST run as processes, K = 3 on :func:`synth_table`, with
    fixed split and noise seeds: ``(SynthConfig, LaunchResult)``. Shared (read-only) by
    the end-to-end test (tests/integration/test_synth.py) and the crash-recovery tests'
    baseline (tests/integration/test_synth_recovery.py, which rerun this config)."""
    from sim.launch.synth import run_synth
    from synth.config import (EngineSection, LaunchSection, SecAggSection, SynthConfig,
                              TimeoutsSection)

    d = tmp_path_factory.mktemp("synth_mst")
    synth_table().to_csv(d / "table.csv", index=False)
    cfg = SynthConfig(dataset=str(d / "table.csv"), label="income", parties=3, epsilon=1.0, seed=1,
                      noise_seed=5, secagg=SecAggSection(fanout=2),
                      engine=EngineSection(name="mbi", iters=300),
                      timeouts=TimeoutsSection(round_timeout_s=20.0, handshake_timeout_s=60.0),
                      launch=LaunchSection(parties_per_process=2))
    return cfg, run_synth(cfg, d / "uninterrupted", timeout_s=200, quiet=True)


@pytest.fixture(scope="session")
def dp_audit() -> Any:
    """``bench/dp_audit.py`` loaded as a module (bench scripts are not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "dp_audit.py"
    spec = importlib.util.spec_from_file_location("dp_audit", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dp_audit"] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


#: JAX settings for FedForge's processes under :func:`jax_compile_cache` (JAX reads its
#: flags from upper-case environment variables when it is imported). Every compiled
#: program is stored, however quick its compile: mbi's many small ones add up. A size
#: cap turns on the cache's file lock around each read and write (xdist workers' processes
#: share the directory; without it an entry is written in place, unlocked); this suite
#: writes a few MB.
_JAX_CACHE_ENV = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                  "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
                  "JAX_COMPILATION_CACHE_MAX_SIZE": str(1 << 30)}


@pytest.fixture(scope="session")
def jax_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A JAX persistent compilation cache for the FedForge processes this session starts
    (the ``mbi`` engine compiles its junction tree's programs in every coordinator
    process, about 8 s of a run on a small table; a later process fitting the same model
    structure loads them instead). Compilation is deterministic, so the fitted models and
    every figure a test checks are the same with or without the cache.

    The directory is this run's (shared by its xdist workers, fresh for each run: no
    state crosses runs); the environment is restored when the session ends. Processes
    already running (and this one, if JAX is imported) are not affected."""
    root = (tmp_path_factory.getbasetemp().parent
            if os.environ.get("PYTEST_XDIST_WORKER") is not None
            else tmp_path_factory.getbasetemp())
    path = root / "jax-compile-cache"
    path.mkdir(exist_ok=True)
    env = {"JAX_COMPILATION_CACHE_DIR": str(path), **_JAX_CACHE_ENV}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield path
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
