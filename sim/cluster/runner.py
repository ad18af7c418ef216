"""``psfl sim run SCENARIO.toml --out RUN_DIR``: a VFL run (the active party and one to
nine passive parties) on a simulated heterogeneous cluster (one machine).

What it launches and enforces (every child is a separate OS process):

* the broker (``python -m broker run``, not limited: it stands for the network);
* per party with a shaped link or a ``disconnect`` fault, a relay process
  (``python -m sim.cluster.relay --broker ...``) between the party and the broker; the party is
  simply given the relay's address (parties never import ``sim/``); the slowest
  bandwidth-limited link's rate goes to the parties as ``vfl.wire.link_mbps`` (unless the
  config sets it), so that ``vfl.wire.dtype = "auto"`` compresses the cut-layer tensors
  for a thin link (:mod:`parties.algorithms.wire`);
* every passive party and the active party (``python -m parties PARTY_ID``), each in its own
  CPU-share group (:class:`sim.cluster.cpu.CpuLimiter`: cgroup quota, or an honest fallback
  recorded in the metadata) and, when configured, memory cgroup
  (:class:`sim.cluster.memory.MemoryLimit`), from the very start (``preexec_fn``), so worker
  processes and threads they start later are inside the share too.

Faults fire at ``at_s`` seconds after every party logged ``vfl.partner_found`` (training
starts then), or, with ``after_epochs = k``, ``at_s`` seconds after the active party logged
its k-th ``vfl.epoch_done`` (tied to progress, so a faster run cannot end first): ``kill`` (SIGKILL to the party and its children), ``pause`` (SIGSTOP, then
SIGCONT ``duration_s`` later) and ``disconnect`` (the relay aborts the party's
connections and refuses new ones for ``duration_s``). Every fault and its outcome is
written to ``events.jsonl`` (``party = "sim"``, events ``sim.fault.*``) beside the
parties' own events (drops, reassignments, partner lost ...).

End states (``metrics.json["sim"]["end_state"]``): ``"completed"`` (the active party
finished), ``"failed"`` (a party exited non-zero: its code and the seconds from the fault
to that exit are recorded), ``"hung"`` (after a kill, no clear end within
``max(T_ddl, liveness timeout) + end_margin_s``: the job is stopped; this is a bug) or
``"timeout"`` (the scenario's ``timeout_s``).

CPU verification: each party's group CPU time (cgroup ``cpuacct`` or psutil) is sampled
every 0.25 s; ``metrics.json["sim"]["cpu"][role]`` reports the quota, the measured CPU
seconds per wall second over the training window (from both parties connected to the
party's last ``vfl.epoch_done``) and the ratio of the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import orjson
import psutil
import structlog

from parties.cli import write_json
from parties.config import VflConfig, dump_vfl_config
from parties.data.preflight import preflight
from parties.core.sysinfo import CORES_ENV
from pubsub.config import ConfigError, to_mapping
from pubsub.outputs import append_to, write_atomic

from sim.cluster.cpu import CpuLimiter, machine_cores
from parties.core import zygote
from sim.launch.vfl import (OutDirError, _stop, run_members, run_security, spawn_party_cli,
                        start_broker, vfl_identities)
from sim.cluster.memory import MemoryLimit
from sim.cluster.scenario import LinkConfig, Scenario, describe, party_cores, path_mbps

log = structlog.get_logger(__name__)

POLL_S = 0.05
CPU_SAMPLE_S = 0.25
RELAY_READY_S = 20.0


class ScenarioError(RuntimeError):
    """The scenario could not be set up (a relay did not start, ...)."""


@dataclass(slots=True)
class _Relay:
    proc: subprocess.Popen[bytes]
    lines: queue.Queue[dict[str, Any] | None]
    address: str

    def command(self, cmd: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any] | None:
        """Send one JSON command; the answer line, or None (no answer within timeout_s)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(orjson.dumps(cmd) + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if msg is None:
                return None
            if msg.get("cmd") == cmd["cmd"] or "ok" in msg:
                return msg
        return None

    def stop(self) -> dict[str, Any] | None:
        """Stop the relay; its final ``stopped`` line (stats, events), or None."""
        final = None
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(b'{"cmd":"stop"}\n')
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                try:
                    msg = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if msg is None:
                    break
                if msg.get("event") == "stopped":
                    final = msg
                    break
        _stop(self.proc)
        return final


def _reader(stream: IO[bytes], out: queue.Queue[dict[str, Any] | None]) -> None:
    for line in stream:
        try:
            out.put(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    out.put(None)


def start_relay(broker: str, role: str, scn: Scenario, out: Path, *, ports: int = 3) -> _Relay:
    """Start the relay process of ``role``'s link; return it once it listens.

    Raises:
        ScenarioError: it exited or did not print its ready line within 20 s.
    """
    return start_link_relay(broker, role, scn.party(role).link, out, ports=ports)


def start_link_relay(broker: str, role: str, link: LinkConfig, out: Path, *,
                     ports: int = 3) -> _Relay:
    """Start a relay process shaping ``link`` in front of ``broker`` (its events go to
    ``out/relay-<role>.jsonl``); return it once it listens.

    Raises:
        ScenarioError: it exited or did not print its ready line within 20 s.
    """
    args = [sys.executable, "-m", "sim.cluster.relay", "--broker", broker,
            "--latency-s", repr(link.latency_s), "--loss", repr(link.loss),
            "--seed", str(link.seed), "--events", str(out / f"relay-{role}.jsonl"),
            "--log-level", "warning", "--broker-ports", str(ports)]
    if link.bandwidth_mbps > 0:
        args += ["--bandwidth-mbps", repr(link.bandwidth_mbps)]
    proc = subprocess.Popen([args[0], "-P", *args[1:]], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    lines: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1024)
    assert proc.stdout is not None
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True,
                     name=f"relay-{role}-reader").start()
    deadline = time.monotonic() + RELAY_READY_S
    while time.monotonic() < deadline:
        try:
            msg = lines.get(timeout=0.1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if msg is None:
            break
        if msg.get("event") == "ready":
            return _Relay(proc=proc, lines=lines, address=msg["broker_address"])
    _stop(proc)
    raise ScenarioError(f"the {role} party's relay did not start within {RELAY_READY_S:.0f} s "
                        f"(exit code {proc.poll()})")


@dataclass(slots=True)
class _EventTail:
    """Incremental reader of the run's ``events.jsonl`` (parties append to it)."""

    path: Path
    pos: int = 0
    partial: bytes = b""
    found: set[str] = field(default_factory=set)
    last_epoch_unix: dict[str, float] = field(default_factory=dict)
    #: Unix time of a party's ``vfl.epoch_done`` that completed its ``epochs`` epochs
    trained_unix: dict[str, float] = field(default_factory=dict)
    epochs: int = 0
    first_found_unix: float | None = None
    #: epochs the active party has logged as done (``vfl.epoch_done``'s ``epochs_done``)
    active_epochs_done: float = 0.0
    #: the run's party ids (``active`` first)
    parties: tuple[str, ...] = ("active", "passive")

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.pos)
                data = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        for line in lines:
            try:
                ev = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            name, party = ev.get("event"), ev.get("party")
            if name == "vfl.partner_found" and party in self.parties:
                self.found.add(party)
            elif name == "vfl.epoch_done" and party in self.parties:
                self.last_epoch_unix[party] = _unix(ev.get("timestamp"))
                done = ev.get("epochs_done")
                if party == "active" and isinstance(done, (int, float)):
                    self.active_epochs_done = max(self.active_epochs_done, float(done))
                if self.epochs and isinstance(done, (int, float)) \
                        and done >= self.epochs - 1e-6:
                    self.trained_unix[party] = self.last_epoch_unix[party]

    @property
    def started(self) -> bool:
        return self.found >= set(self.parties)


def _unix(ts: Any) -> float:
    if not isinstance(ts, str):
        return time.time()
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def _emit(events: Path, event: str, **kw: Any) -> dict[str, Any]:
    rec = {"event": event, "party": "sim", "level": "info",
           "timestamp": datetime.utcnow().isoformat(timespec="microseconds") + "Z", **kw}
    append_to(events, orjson.dumps(rec) + b"\n")  # one whole line beside the parties' own
    log.info(event, **kw)
    return rec


def _family(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_family(pid: int, sig: int) -> int:
    n = 0
    for p in _family(pid):
        try:
            p.send_signal(sig)
            n += 1
        except psutil.NoSuchProcess:
            pass
    return n


def run_scenario(scn: Scenario, cfg: VflConfig, out: str | Path, *,
                 quiet: bool = False, insecure: bool = False) -> dict[str, Any]:
    """Run ``cfg`` under ``scn``; write and return ``out/metrics.json``.

    The returned dict is the active party's metrics (when it finished) plus a ``sim``
    object: the scenario with resolved cores, how shares were enforced, measured CPU
    use per party against its quota, relay statistics, the faults as fired, the end
    state, exit codes and, after a fault, the time to the end state.

    The bus is CURVE-secured with keys made for the run (``insecure``: plaintext); the
    relays pass the encrypted bytes through, as a network would.

    Raises:
        OutDirError: ``out`` cannot be created or written.
        sim.cluster.scenario / pubsub ConfigError: the cores do not fit on this machine; a fault
            names a party the run does not have.
        ScenarioError: a relay did not start.
        parties.data.DataError: the data or column split is invalid (checked first).
        sim.cluster.cpu.CpuLimitUnavailable: a CPU method was requested explicitly and is not
            available here.
    """
    from pubsub.outputs import RunDirLock

    # the run directory is this run's (its parties, started below, write into it)
    with RunDirLock(out, command="psfl sim run"):
        return _run_scenario(scn, cfg, out, quiet=quiet, insecure=insecure)


def _run_scenario(scn: Scenario, cfg: VflConfig, out: str | Path, *,
                  quiet: bool = False, insecure: bool = False) -> dict[str, Any]:
    """:func:`run_scenario` under the run directory's lock."""
    t0 = time.perf_counter()
    ids = cfg.party_ids
    for f in scn.faults:
        if f.party not in ids:
            raise ConfigError("scenario.faults.party",
                              f"{f.party!r} is not a party of this run ({', '.join(ids)}; "
                              f"vfl.passive_parties = {cfg.passive_parties})")
    if cfg.wire.link_mbps == 0 and (mbps := path_mbps(scn, ids)) > 0:
        # what the run knows of its links, for vfl.wire.dtype = "auto" (parties.algorithms.wire)
        cfg = dataclasses.replace(cfg, wire=dataclasses.replace(cfg.wire, link_mbps=mbps))
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        events = out / "events.jsonl"
        events.write_text("")
        for stale in ("metrics.json", "broker.addr", *(f"{p}.json" for p in ids[1:]),
                      *(f"timeline-{p}.json" for p in ids)):
            (out / stale).unlink(missing_ok=True)
        write_atomic(out / "config.toml", dump_vfl_config(cfg))
    except OSError as exc:
        raise OutDirError(f"cannot use {str(out)!r} as the run directory: "
                          f"{exc.strerror or exc}") from None
    zygote.warm()  # the parties' fork server imports while the data is checked
    preflight(cfg)
    cores = party_cores(scn, machine_cores(), ids)
    run_id = uuid.uuid4().hex[:8]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    relays: dict[str, _Relay] = {}
    limiters: dict[str, CpuLimiter] = {}
    stack = contextlib.ExitStack()
    mems: dict[str, MemoryLimit] = {}
    sim: dict[str, Any] = {"scenario": describe(scn, cores), "run_id": run_id,
                           "faults": [], "exit_codes": {}}
    samples: dict[str, list[tuple[float, float]]] = {r: [] for r in ids}
    end_state = "completed"
    try:
        for role in ids:
            limiters[role] = CpuLimiter.create(role, cores[role], method=scn.cpu_method,
                                               period_us=scn.cpu_period_us)
            if scn.party(role).memory_mb > 0:
                mems[role] = MemoryLimit(role, scn.party(role).memory_mb)
        sec = stack.enter_context(run_security(vfl_identities(cfg), insecure=insecure))
        sim["security"] = sec.describe()
        procs["broker"], broker = start_broker(out, events, security=sec,
                                               **run_members(run_id, ids))
        needs_relay = {f.party for f in scn.faults if f.kind == "disconnect"}
        for role in ids:
            if scn.party(role).link.shaped or role in needs_relay:
                relays[role] = start_relay(broker, role, scn, out, ports=sec.n_ports)
        for role in (*ids[1:], "active"):
            addr = relays[role].address if role in relays else broker
            args = [role, "--config", str(out / "config.toml"), "--broker", addr,
                    "--run-id", run_id, "--out", str(out), "--events", str(events),
                    *sec.client_args]
            if quiet or role != "active":
                args.append("--quiet")
            # the party forks from the party fork server (parties.core.zygote: imports paid
            # once) and joins its CPU and memory groups itself before it runs
            setup = [*limiters[role].child_setup(),
                     *([mems[role].preexec()] if role in mems else [])]
            env = None
            if limiters[role].method == "duty-cycle":
                # no cgroup quota for the party to read: it is told its share, or it
                # would take its ⌈share⌉ pinned CPUs as its cores (cpu_util's denominator)
                env = {CORES_ENV: repr(cores[role])}
            procs[role] = spawn_party_cli(args, name=f"psfl-{role}", setup=setup, env=env)
            if limiters[role].tracks_pids():
                limiters[role].add(procs[role].pid)
        end_state = _supervise(scn, cfg, procs, relays, limiters, events, sim, samples)
    finally:
        for role in ids:
            if role in procs and procs[role].poll() is None:
                _signal_family(procs[role].pid, signal.SIGCONT)  # never leave it stopped
                _stop(procs[role])
        finals = {r: rel.stop() or {} for r, rel in relays.items()}
        sim["relays"] = {r: f.get("stats") for r, f in finals.items()}
        sim["relay_events"] = {r: f.get("events") for r, f in finals.items()}
        if "broker" in procs:
            _stop(procs["broker"])
        sim["cpu_limits"] = {r: lim.describe() for r, lim in limiters.items()}
        sim["memory_limits"] = {r: m.describe() for r, m in mems.items()}
        for lim in limiters.values():
            lim.close()
        for m in mems.values():
            m.close()
        stack.close()
    for role in ids:
        if role in procs:
            sim["exit_codes"][role] = procs[role].returncode
    sim["end_state"] = end_state
    fired = {(f["at_s"], f["after_epochs"], f["party"], f["kind"]) for f in sim["faults"]}
    sim["faults_not_fired"] = [
        {"at_s": f.at_s, "after_epochs": f.after_epochs, "party": f.party, "kind": f.kind,
         "duration_s": f.duration_s}
        for f in scn.faults if (f.at_s, f.after_epochs, f.party, f.kind) not in fired]
    if sim["faults_not_fired"]:
        log.warning("sim.faults_not_fired", faults=sim["faults_not_fired"],
                    reason="the run ended before their time")
    for f in mark_after_training(sim["faults"], sim.pop("trained_unix", {})):
        log.warning("sim.fault_after_training", kind=f["kind"], party=f["party"],
                    at_s=f["at_s"])
    sim["cpu"] = _cpu_report(cores, samples, sim)
    metrics_path = out / "metrics.json"
    metrics: dict[str, Any] = (orjson.loads(metrics_path.read_bytes())
                               if metrics_path.exists() else {"algo": cfg.algo,
                                                              "dataset": cfg.dataset})
    metrics["wall_s"] = time.perf_counter() - t0
    metrics["config"] = to_mapping(cfg)
    metrics["sim"] = sim
    write_json(metrics_path, metrics)
    return metrics


def _supervise(scn: Scenario, cfg: VflConfig, procs: dict[str, subprocess.Popen[bytes]],
               relays: dict[str, _Relay], limiters: dict[str, CpuLimiter], events: Path,
               sim: dict[str, Any], samples: dict[str, list[tuple[float, float]]]) -> str:
    """Fire the faults, sample CPU use, and wait for a clear end state."""
    tail = _EventTail(events, epochs=cfg.epochs, parties=cfg.party_ids)
    sim["last_epoch_unix"] = tail.last_epoch_unix  # filled as the run goes
    sim["trained_unix"] = tail.trained_unix
    start_mono: float | None = None
    epoch_mono: list[float] = []
    pending = list(scn.faults)
    resume: list[tuple[float, str, dict[str, Any]]] = []  # (mono time, role, fault record)
    killed_at: float | None = None
    deadline = time.monotonic() + scn.timeout_s
    end_bound = max(cfg.timeouts.t_ddl_s, cfg.timeouts.liveness_timeout_s) + scn.end_margin_s
    next_sample = 0.0
    while True:
        now = time.monotonic()
        tail.poll()
        if start_mono is None and tail.started:
            start_mono = now
            sim["training_started_unix"] = time.time()
            epoch_mono = [now]
            _emit(events, "sim.training_started")
        if now >= next_sample:
            next_sample = now + CPU_SAMPLE_S
            for role, lim in limiters.items():
                try:
                    samples[role].append((time.time(), lim.usage_s()))
                except OSError:
                    pass
        if start_mono is not None:
            while tail.active_epochs_done >= len(epoch_mono) - 1e-6:
                epoch_mono.append(now)  # epoch_mono[k]: when k epochs were seen done
            for f in [f for f in pending if f.after_epochs < len(epoch_mono)
                      and now >= epoch_mono[f.after_epochs] + f.at_s]:
                pending.remove(f)
                rec = _fire(f, procs, relays, events)
                sim["faults"].append(rec)
                if f.kind == "pause":
                    resume.append((now + f.duration_s, f.party, rec))
                if f.kind == "kill":
                    killed_at = now
        for when, role, rec in list(resume):
            if now >= when:
                n = _signal_family(procs[role].pid, signal.SIGCONT)
                rec["resumed_unix"] = time.time()
                _emit(events, "sim.fault.resumed", target=role, kind="pause", processes=n)
                resume.remove((when, role, rec))
        active = procs["active"].poll()
        passive = {p: procs[p].poll() for p in cfg.party_ids[1:]}
        if active is not None:
            if active == 0:
                for p, code in passive.items():
                    if code is None:  # a passive party exits right after "done"
                        _wait_exit(procs[p], 10.0)
                return "completed"
            return _failed(sim, events, "active", active, killed_at)
        for p, code in passive.items():
            if code is not None and code != 0 and killed_at is None:
                return _failed(sim, events, p, code, killed_at)
        if procs["broker"].poll() is not None:
            _emit(events, "sim.broker_died", code=procs["broker"].returncode)
            return "failed"
        if killed_at is not None and now - killed_at > end_bound:
            _emit(events, "sim.hung", waited_s=now - killed_at, bound_s=end_bound)
            return "hung"
        if now > deadline:
            _emit(events, "sim.timeout", timeout_s=scn.timeout_s)
            return "timeout"
        time.sleep(POLL_S)


def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass


def _failed(sim: dict[str, Any], events: Path, role: str, code: int,
            killed_at: float | None) -> str:
    rec: dict[str, Any] = {"party": role, "code": code}
    if killed_at is not None:
        rec["s_after_kill"] = time.monotonic() - killed_at
    sim["failure"] = rec
    _emit(events, "sim.party_exited", **rec)
    return "failed"


def _fire(f: Any, procs: dict[str, subprocess.Popen[bytes]], relays: dict[str, _Relay],
          events: Path) -> dict[str, Any]:
    rec: dict[str, Any] = {"at_s": f.at_s, "after_epochs": f.after_epochs, "party": f.party,
                           "kind": f.kind, "duration_s": f.duration_s,
                           "fired_unix": time.time()}
    pid = procs[f.party].pid
    if f.kind == "kill":
        rec["processes"] = _signal_family(pid, signal.SIGKILL)
    elif f.kind == "pause":
        rec["processes"] = _signal_family(pid, signal.SIGSTOP)
    else:
        ans = relays[f.party].command({"cmd": "disconnect", "duration_s": f.duration_s})
        rec["relay_answer"] = ans
    _emit(events, f"sim.fault.{f.kind}", target=f.party, at_s=f.at_s,
          duration_s=f.duration_s)
    return rec


def _cpu_report(cores: dict[str, float], samples: dict[str, list[tuple[float, float]]],
                sim: dict[str, Any]) -> dict[str, Any]:
    """Per party: quota, measured CPU s per wall s over the training window, ratio."""
    out: dict[str, Any] = {}
    t_start = sim.get("training_started_unix")
    for role, pts in samples.items():
        rec: dict[str, Any] = {"quota_cores": cores[role], "method":
                               sim.get("cpu_limits", {}).get(role, {}).get("method")}
        t_end = sim.get("last_epoch_unix", {}).get(role, float("inf"))
        window = [p for p in pts if (t_start is None or p[0] >= t_start) and p[0] <= t_end]
        if len(window) >= 2:
            (ta, ua), (tb, ub) = window[0], window[-1]
            rate = (ub - ua) / (tb - ta) if tb > ta else float("nan")
            rec.update({"measured_cores": rate, "measured_over_quota": rate / cores[role],
                        "window_s": tb - ta})
        rec["cpu_s_total"] = pts[-1][1] if pts else None  # whole life of the group
        out[role] = rec
    return out


def mark_after_training(faults: list[dict[str, Any]],
                        trained_unix: dict[str, float]) -> list[dict[str, Any]]:
    """Set ``after_training`` on each fired fault record: True when it fired (``fired_unix``,
    Unix seconds) after its party had finished training (``trained_unix[party]``: the
    ``vfl.epoch_done`` of its last epoch; absent for a party that never finished, e.g.
    killed), i.e. it hit scoring or shutdown, not training, and a run with too few epochs
    would otherwise look like a survived fault. Returns the records marked True."""
    late = []
    for f in faults:
        t_end = trained_unix.get(f["party"])
        f["after_training"] = t_end is not None and f.get("fired_unix", 0.0) > t_end
        if f["after_training"]:
            late.append(f)
    return late


def format_summary(m: dict[str, Any]) -> str:
    """A few human-readable lines about a scenario run."""
    s = m["sim"]
    lines = [f"scenario {s['scenario']['name']}: end state {s['end_state']}"]
    for role, c in s["cpu"].items():
        meas = c.get("measured_cores")
        lines.append(f"  {role:<8} quota {c.get('quota_cores', 0):.4g} cores "
                     f"({c.get('method')}), measured "
                     + (f"{meas:.4g} cores ({c['measured_over_quota']:.1%} of quota)"
                        if meas is not None else "n/a"))
    for f in s["faults"]:
        lines.append(f"  fault {f['kind']} {f['party']} at {f['at_s']:g} s"
                     + (f" after epoch {f['after_epochs']}" if f.get("after_epochs") else "")
                     + (f" for {f['duration_s']:g} s" if f["kind"] != "kill" else "")
                     + (" AFTER TRAINING ENDED (it hit scoring or shutdown, not training: "
                        "give it more epochs or an earlier at_s)"
                        if f.get("after_training") else ""))
    for f in s.get("faults_not_fired", []):
        lines.append(f"  NOT FIRED: {f['kind']} {f['party']} at {f['at_s']:g} s (the run "
                     "ended before that time: give it more epochs or an earlier at_s)")
    if "failure" in s:
        fl = s["failure"]
        lines.append(f"  {fl['party']} exited with code {fl['code']}"
                     + (f", {fl['s_after_kill']:.1f} s after the kill" if "s_after_kill" in fl
                        else ""))
    if "metric" in m:
        lines.append(f"  test {m.get('metric_name')} {m['metric']:.4f}, "
                     f"{m.get('train_samples_per_s', 0):,.0f} samples/s, dropped "
                     f"{m.get('dropped_batches')}, reassigned {m.get('reassigned_batches')}")
    return "\n".join(lines)


__all__ = ["ScenarioError", "format_summary", "run_scenario", "start_link_relay", "start_relay"]
