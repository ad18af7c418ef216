"""Launch a VFL run as separate OS processes: broker, passive party, active party.

The launcher owns the child processes: if any child fails, the others are
terminated and the failure is reported with the child's exit code; every wait
has a deadline; children never outlive the launcher.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from parties.cli import ExitCode, write_json
from parties.config import VflConfig, dump_vfl_config, role_of
from parties.data.preflight import preflight
from parties.models.zoo import preflight_models
from pubsub.cli import INSECURE_WARNING
from pubsub.config import ConfigError, to_mapping
from pubsub.control import control_request
from pubsub.membership import membership
from pubsub.outputs import RunDirLock, write_atomic
from pubsub.policy import load_policy
from pubsub.security import BROKER_KEY_NAME, CurveClient, check_insecure_allowed
from pubsub.security import generate_certificate
from parties.core import zygote


class JobTimeout(RuntimeError):
    """The job ran past ``timeout_s``; every child was stopped.

    Attributes:
        timeout_s: the limit, seconds.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        super().__init__(f"the job was still running after --timeout-s {timeout_s:g} s; "
                         "stopped the broker and both parties")


class OutDirError(OSError):
    """The run directory cannot be created or written."""


class _Terminated(BaseException):
    """SIGTERM arrived: stop the children and exit. A BaseException, like
    KeyboardInterrupt: callers that catch ``Exception`` to go on after a failed run
    (``bench/vfl_table.py``) must not swallow a request to stop."""


class LaunchError(RuntimeError):
    """A child process failed.

    Attributes:
        role: ``"broker"``, ``"active"`` or ``"passive"``.
        code: its exit code (or None on a launcher timeout).
    """

    def __init__(self, role: str, code: int | None, detail: str = "") -> None:
        self.role = role
        self.code = code
        super().__init__(f"{role} exited with code {code}{': ' + detail if detail else ''}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResult:
    """Outcome of :func:`run_vfl`.

    Attributes:
        metrics: the run's metrics (also in ``out/metrics.json``).
        out: the run directory.
    """

    metrics: dict[str, Any]
    out: Path


#: identities (and their roles) of a local two-party VFL run's ephemeral keys
VFL_IDENTITIES = {"active": "active", "passive": "passive"}


def vfl_identities(cfg: VflConfig | Sequence[str]) -> dict[str, str]:
    """Identity -> broker role of every party of ``cfg``'s run (or of these party ids):
    the party ids, each with its role."""
    ids = cfg.party_ids if isinstance(cfg, VflConfig) else tuple(cfg)
    return {party: role_of(party) for party in ids}


def run_members(run_id: str, party_ids: Sequence[str]) -> dict[str, Any]:
    """:func:`start_broker`'s ``members`` and ``owned`` for a run (training or
    prediction) of these parties (``active`` first): every party is a member; with
    several passive parties they are owned, so none may read another's topics."""
    passive = [p for p in party_ids if p != "active"]
    return {"members": {run_id: list(party_ids)},
            "owned": {run_id: passive} if len(passive) > 1 else None}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSecurity:
    """How a launcher's children secure their bus connections.

    Attributes:
        mode: ``"curve"`` or ``"plaintext"``.
        keys_dir: the keys directory (CURVE), "" in plaintext.
        ephemeral: the keys were generated for this run and are deleted after it.
        broker_args: extra ``python -m broker run`` arguments.
        client_args: extra arguments of every client process (``--keys DIR`` or
            ``--insecure``).
        n_ports: consecutive broker ports from the base (3 plaintext, more with CURVE).
    """

    mode: str
    keys_dir: str = ""
    ephemeral: bool = False
    broker_args: tuple[str, ...] = field(default_factory=tuple)
    client_args: tuple[str, ...] = field(default_factory=tuple)
    n_ports: int = 3

    def client(self, identity: str) -> CurveClient | None:
        """The launcher's own CURVE keys for ``identity`` (None in plaintext)."""
        return CurveClient.from_dir(self.keys_dir, identity) if self.mode == "curve" else None

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary for ``metrics.json`` (no key material, no paths of secrets)."""
        return {"transport": self.mode, "keys": ("ephemeral" if self.ephemeral else
                                                 "given" if self.mode == "curve" else None)}


@contextlib.contextmanager
def run_security(identities: Mapping[str, str], *, keys_dir: str | None = None,
                 insecure: bool = False, broker: str | None = None) -> Iterator[RunSecurity]:
    """Security of a locally launched run: CURVE by default.

    Without ``keys_dir`` and ``insecure``, a fresh keypair per identity plus the
    broker's is written to a private temporary directory (mode 0700, secret files
    0600, deleted on exit) and used by the broker and every child: a local run is
    authenticated and encrypted like a multi-host one, with the same topic policy.

    Args:
        identities: identity name -> broker role, e.g. ``{"active": "active", ...}``.
        keys_dir: use these keys instead (``psfl keys generate``; must hold
            ``broker.key_secret`` when the launcher starts the broker).
        insecure: plaintext (loopback only; prints a warning).
        broker: an external broker's address (then keys come from ``keys_dir`` or
            ``insecure`` is required, since its keys are not ours to make).

    Raises:
        ConfigError: both ``keys_dir`` and ``insecure``; or an external broker with neither.
        InsecureTransport: ``insecure`` with a non-loopback external broker.
    """
    if keys_dir and insecure:
        raise ConfigError("insecure", "give --keys DIR or --insecure, not both")
    if insecure:
        if broker:
            check_insecure_allowed(broker)
        print(INSECURE_WARNING, file=sys.stderr)
        yield RunSecurity(mode="plaintext", broker_args=("--insecure",),
                          client_args=("--insecure",))
        return
    from broker.proxy import DEFAULT_POLICY_FILE

    n_ports = 3 + 2 * len(load_policy(DEFAULT_POLICY_FILE).roles)
    if keys_dir:
        yield RunSecurity(mode="curve", keys_dir=str(keys_dir),
                          broker_args=("--keys", str(keys_dir)),
                          client_args=("--keys", str(keys_dir)), n_ports=n_ports)
        return
    if broker:
        raise ConfigError("keys", f"the broker at {broker} was started elsewhere: give its "
                          "clients' keys with --keys DIR, or --insecure on loopback")
    tmp = tempfile.mkdtemp(prefix="psfl-keys-")  # mode 0700
    try:
        generate_certificate(tmp, BROKER_KEY_NAME)
        for name, role in identities.items():
            generate_certificate(tmp, name, role=role)
        yield RunSecurity(mode="curve", keys_dir=tmp, ephemeral=True,
                          broker_args=("--keys", tmp), client_args=("--keys", tmp),
                          n_ports=n_ports)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _spawn(args: list[str], *, quiet: bool = False,
           env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a child process. A ``python -m PKG`` child gets ``-P``: without it the
    current directory comes first on ``sys.path``, so a stray ``synth/`` or ``parties/``
    directory there (an older checkout, say) would run instead of the installed code
    while the launcher runs the installed one."""
    if len(args) > 2 and args[0] == sys.executable and args[1] == "-m":
        args = [args[0], "-P", *args[1:]]
    return subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=None,
        start_new_session=False,
        env=None if env is None else {**os.environ, **env},
    )


#: The broker's default ``max_subscriptions_per_identity`` (broker.proxy.BrokerConfig).
BROKER_SUBSCRIPTIONS = 65_536


def subscriptions_needed(cfg: VflConfig) -> int:
    """The subscriptions per identity a run's own broker should allow: a party holds one
    per batch of an epoch plus a few, so a streamed run of ``n`` rows needs about
    ``n / batch_size`` (``n`` from the Parquet footers; an upper bound, every row
    counted as a training row), never fewer than the broker's default."""
    if not cfg.data.stream:
        return BROKER_SUBSCRIPTIONS
    from parties.data.stream import inspect

    rows = inspect(cfg.dataset_for(cfg.party_ids[0])).rows
    return max(BROKER_SUBSCRIPTIONS, -(-rows // cfg.batch_size) + 4096)


def start_broker(out: Path, events: Path, *, timeout_s: float = 20.0,
                 host: str = "127.0.0.1",
                 security: RunSecurity | None = None,
                 members: Mapping[str, Sequence[str]] | None = None,
                 owned: Mapping[str, Sequence[str]] | None = None,
                 max_subscriptions: int = BROKER_SUBSCRIPTIONS,
                 ) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m broker run`` on free ports; return the process and its address.

    ``security`` gives its ``--keys DIR`` or ``--insecure`` (None: ``--insecure``, for
    callers that measure the plaintext bus). ``members`` (run id -> identities), with
    CURVE: the broker lets only these identities publish in these runs
    (``out/members.toml``, :mod:`pubsub.membership`); ``owned`` (run id -> members
    isolated from one another: the passive parties of a run with several);
    ``max_subscriptions``: the broker's ``max_subscriptions_per_identity``.

    Raises:
        LaunchError: it exited or did not become ready within ``timeout_s``.
    """
    ready = out / "broker.addr"
    ready.unlink(missing_ok=True)
    extra: list[str] = []
    if members is not None and security is not None and security.mode == "curve":
        path = out / "members.toml"
        path.write_text(membership(members, owned).as_toml())
        extra = ["--members", str(path)]
    if max_subscriptions != BROKER_SUBSCRIPTIONS:
        extra += ["--set", f"max_subscriptions_per_identity={int(max_subscriptions)}"]
    proc = _spawn([sys.executable, "-m", "broker", "run", "--bind", f"tcp://{host}:0",
                   "--ready-file", str(ready), "--events", str(events),
                   "--log-level", "warning",
                   *(security.broker_args if security is not None else ("--insecure",)),
                   *extra],
                  quiet=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready.exists():
            return proc, ready.read_text().strip()
        code = proc.poll()
        if code is not None:
            raise LaunchError("broker", code)
        time.sleep(0.02)
    proc.kill()
    raise LaunchError("broker", None, f"not ready within {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


def prepare_run(cfg: VflConfig, out: Path, models: Any = None) -> Path:
    """Refuse what can be refused before any party starts (an unmeetable DP target, a
    broken model factory or a DP-incompatible model), then make ``out`` a clean run
    directory holding the config; returns its (emptied) ``events.jsonl``.

    Raises:
        OutDirError: ``out`` cannot be created or written.
        parties.privacy.dp.UnmeetableTarget, parties.models.zoo.ModelSpecError,
            parties.privacy.dpsgd.DpIncompatibleModel: see :func:`run_vfl`.
    """
    if cfg.dp.enabled:  # parties.privacy.dp imports torch and SciPy: only when there is a plan
        from parties.privacy.dp import plan_from_config
        plan_from_config(cfg)  # an unmeetable DP target (a ConfigError) refuses before any start
    preflight_models(cfg, models)  # a broken model factory or a DP-incompatible model
    # results of an earlier run in this directory go, so it never mixes two runs
    events = clean_out_dir(out, ("metrics.json", "passive.json", "broker.addr"),
                           what="the run directory")
    try:
        shutil.rmtree(out / "model", ignore_errors=True)  # saved parts of an earlier run
        write_atomic(out / "config.toml", dump_vfl_config(cfg))
    except OSError as exc:
        raise OutDirError(f"cannot use {str(out)!r} as the run directory: "
                          f"{exc.strerror or exc}") from None
    return events


def clean_out_dir(out: Path, stale: tuple[str, ...], *, what: str) -> Path:
    """Create ``out``, delete the ``stale`` files of an earlier job there and empty its
    ``events.jsonl``, which is returned.

    Raises:
        OutDirError: ``out`` cannot be created or written (``what`` names it).
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        events = out / "events.jsonl"
        events.write_text("")
        for name in stale:
            (out / name).unlink(missing_ok=True)
    except OSError as exc:
        raise OutDirError(f"cannot use {str(out)!r} as {what}: "
                          f"{exc.strerror or exc}") from None
    return events


def finish_run(cfg: VflConfig, out: Path, t0: float,
               security: Mapping[str, Any]) -> LaunchResult:
    """Read the run's ``metrics.json``, add the job's wall time, config and security, and
    write it back."""
    metrics = orjson.loads((out / "metrics.json").read_bytes())
    metrics["wall_s"] = time.perf_counter() - t0
    metrics["config"] = to_mapping(cfg)
    metrics["security"] = {**metrics.get("security", {}), **security}
    write_json(out / "metrics.json", metrics)
    return LaunchResult(metrics=metrics, out=out)


def _spawn_party(role: str, cfg: VflConfig, models: Any, *, broker: str, run_id: str,
                 out: Path, events: Path, sec: RunSecurity, quiet: bool) -> Any:
    """Fork ``role`` from the party fork server (:mod:`parties.core.zygote`) with the pickled model
    factory (:func:`parties.runtime.serve.party_process_main`)."""
    from parties.runtime.serve import party_process_main

    return zygote.start(party_process_main, args=(role, cfg, models),
                        kwargs={"broker": broker, "run_id": run_id, "out": str(out),
                                "events": str(events),
                                "keys_dir": sec.keys_dir or None, "quiet": quiet},
                        name=f"psfl-{role}")


def spawn_party_cli(argv: Sequence[str], *, name: str,
                    setup: Sequence[Callable[[], Any]] = (),
                    env: Mapping[str, str] | None = None) -> zygote.Child:
    """``python -m parties ARGV`` as a process forked from the party fork server
    (:mod:`parties.core.zygote`): same arguments, exit codes and output, without paying the
    party's imports once per party (``setup`` and ``env``: :func:`parties.core.zygote.start`)."""
    from parties.cli import child_main

    return zygote.start(child_main, args=(list(argv),), name=name, setup=setup, env=env)


def run_vfl(cfg: VflConfig, out: str | Path, *, broker: str | None = None,
            run_id: str | None = None, quiet: bool = False,
            timeout_s: float | None = None, keys_dir: str | None = None,
            insecure: bool = False, models: Any = None) -> LaunchResult:
    """Run a VFL job as processes (the broker, each passive party, the active party) and
    collect ``out/metrics.json``.

    Args:
        cfg: effective config (written to ``out/config.toml``).
        out: run directory (created; an existing one is reused, files overwritten).
        broker: use this running broker instead of starting one.
        run_id: topic namespace (default: random).
        quiet: no per-epoch lines from the active party.
        timeout_s: kill everything after this long (default: no job-level limit;
            the parties' own deadlines still apply).
        keys_dir: CURVE keys (``psfl keys generate broker active passive``); default:
            ephemeral keys made for this run (see :func:`run_security`).
        insecure: plaintext on loopback instead (prints a warning).
        models: a :class:`parties.models.zoo.ModelFactory` with Python callables (the Python API,
            :mod:`sim.api`): the parties then start as ``multiprocessing`` spawn
            processes that receive it pickled (its callables must be module-level in an
            importable module or in the main script, behind ``if __name__ ==
            "__main__":``). None: ``python -m parties`` with the config's model specs.

    Returns:
        :class:`LaunchResult`.

    Raises:
        LaunchError: a child failed (its code is carried; its stderr went to ours).
        JobTimeout: ``timeout_s`` passed.
        OutDirError: ``out`` cannot be created or written.
        pubsub.BrokerUnreachable: ``broker`` was given and does not answer.
        parties.data.DataError: the data or column split is invalid (checked first).
        parties.privacy.dp.UnmeetableTarget: the DP target cannot be met (a ConfigError).
        parties.models.zoo.ModelSpecError: a model factory cannot be imported, raises, or has the
            wrong widths (a ConfigError; :func:`parties.models.zoo.preflight_models`).
        parties.privacy.dpsgd.DpIncompatibleModel: DP on and BatchNorm in the passive bottom.
    """
    t0 = time.perf_counter()
    out = Path(out)
    run_id = run_id or uuid.uuid4().hex[:8]
    with RunDirLock(out, run_id=run_id, command="psfl vfl run"):  # the run's life
        events = prepare_run(cfg, out, models)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        previous = signal.getsignal(signal.SIGTERM)

        def _on_term(*_: Any) -> None:
            raise _Terminated

        if threading_main():
            signal.signal(signal.SIGTERM, _on_term)
        stack = contextlib.ExitStack()
        zygote.warm()
        try:
            identities = vfl_identities(cfg)
            sec = stack.enter_context(run_security(identities, keys_dir=keys_dir,
                                                   insecure=insecure, broker=broker))
            if broker is None:
                procs["broker"], broker = start_broker(out, events, security=sec,
                                                       max_subscriptions=subscriptions_needed(cfg),
                                                       **run_members(run_id, cfg.party_ids))
            else:
                # fail fast, with one line, if nobody answers there
                control_request(broker, "ping", timeout_s=cfg.timeouts.connect_timeout_s,
                                security=sec.client("active"))
            # Check the data here while the fork server imports what the parties need
            # (zygote.warm above): a bad file or column is reported once, by us, before any
            # party starts.
            preflight(cfg)
            common = ["--config", str(out / "config.toml"), "--broker", broker, "--run-id", run_id,
                      "--out", str(out), "--events", str(events), *sec.client_args]
            for role in (*cfg.party_ids[1:], "active"):
                extra = ["--quiet"] if (quiet or role != "active") else []
                if models is None:
                    procs[role] = spawn_party_cli([role, *common, *extra], name=f"psfl-{role}")
                else:
                    procs[role] = _spawn_party(role, cfg, models, broker=broker, run_id=run_id,
                                               out=out, events=events, sec=sec,
                                               quiet=bool(extra))
            wait_children({r: procs[r] for r in cfg.party_ids},
                          watch={"broker": procs["broker"]} if "broker" in procs else None,
                          timeout_s=timeout_s)
        finally:
            for role in (*cfg.party_ids, "broker"):
                if role in procs:
                    _stop(procs[role])
            stack.close()
            if threading_main():
                signal.signal(signal.SIGTERM, previous)
        return finish_run(cfg, out, t0, sec.describe())


def wait_children(procs: dict[str, subprocess.Popen[bytes]], *,
                  watch: dict[str, subprocess.Popen[bytes]] | None = None,
                  timeout_s: float | None = None, poll_s: float = 0.05,
                  tick: Callable[[], None] | None = None) -> None:
    """Wait until every process in ``procs`` has exited with code 0.

    Args:
        procs: role -> process; all must finish.
        watch: role -> process that must stay alive meanwhile (e.g. the broker).
        timeout_s: overall deadline, seconds (None: no limit).
        poll_s: polling period, seconds.
        tick: called once per poll before the processes are checked (a fault injector;
            it may replace a process in ``procs`` under the same role).

    Raises:
        LaunchError: a process in ``procs`` exited non-zero, or one in ``watch`` exited.
        JobTimeout: ``timeout_s`` passed first.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pending = set(procs)
    while pending:
        if tick is not None:
            tick()
        for role in sorted(pending):
            code = procs[role].poll()
            if code is None:
                continue
            pending.discard(role)
            if code != 0:
                raise LaunchError(role, code)
        for role, proc in (watch or {}).items():
            if proc.poll() is not None:
                raise LaunchError(role, proc.returncode, "died during the run")
        if deadline is not None and time.monotonic() > deadline:
            assert timeout_s is not None
            raise JobTimeout(timeout_s)
        time.sleep(poll_s)


def threading_main() -> bool:
    """True in the main thread (only there may signal handlers be installed)."""
    import threading

    return threading.current_thread() is threading.main_thread()


def exit_code_of(err: LaunchError) -> int:
    """The launcher's exit code for a child failure (the child's own code when it has one)."""
    if err.code in {int(c) for c in ExitCode}:
        return int(err.code)  # type: ignore[arg-type]
    return int(ExitCode.FAILED)


__all__ = ["JobTimeout", "LaunchError", "LaunchResult", "OutDirError", "RunSecurity",
           "VFL_IDENTITIES", "clean_out_dir", "exit_code_of", "finish_run", "prepare_run",
           "run_members", "run_security", "run_vfl", "start_broker", "vfl_identities",
           "wait_children"]
