"""``psfl sim run consortium.toml --out RUN_DIR``: the consortium scenario
(:mod:`sim.cluster.consortium`) as a FedForge run on one machine.

What it adds to :func:`sim.launch.synth.run_synth`:

* **sizes**: one party per site, the table's rows cut in proportion to the sites'
  ``rows_equiv`` (``split = "sizes"``); ``metrics.json`` says how many real rows stand
  for one "equivalent" row.
* **links**: a relay process (:mod:`sim.cluster.relay`) between each shaped site's party process
  and the broker; the party is given the relay's address. Before the run, the same link
  model is measured with a ZeroMQ message through an identical in-process relay
  (``probe``: one-way time of 64 B and 64 KiB, the goodput they imply); after it, the
  relay's byte counters (``relay``).
* **offline window**: the site's process is stopped (SIGSTOP) and continued (SIGCONT) at
  the scenario's times (simulated hours after the ``schema`` stage started, at
  ``seconds_per_hour``, or coordinator stage events). SIGSTOP and not a relay disconnect:
  FedForge's rounds are pub/sub, and a disconnect would lose the plans sent meanwhile
  for good; a stopped site keeps its connections, finds the stale plans queued when it
  comes back, skips them unpaid and rejoins (the party's tested recovery path). The
  rounds it missed are listed from the coordinator's ``rounds[...].dropped`` and the
  dropout recovery (cached or survivors-only marginals).
* **workload update**: ``synth.workload.submit_workload(RUN_DIR, queries)`` at its time;
  when that module is not available the update is recorded as not available and the run
  goes on.
* **coordinator kill**: ``run_synth``'s ``kill_coordinator_at`` (kill -9, restart with
  ``--resume``).
* **report**: ``report.md`` and ``timeline.png`` (stages, the offline window, missed
  rounds, the workload update, kill/restart on one time axis); with ``compare_online``
  the same scenario first runs with every site online into ``RUN_DIR/online`` and the
  report puts the two TV errors side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from pubsub.config import ConfigError, from_mapping
from pubsub.outputs import write_atomic

from sim.cluster.consortium import Consortium, When, describe, synth_table, when_stage
from sim.cluster.scenario import LinkConfig

POLL_S = 0.05


def _unix(ts: Any) -> float | None:
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def read_events(path: Path) -> list[dict[str, Any]]:
    """The run's events (bad lines skipped), each with ``t_unix``."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            t = _unix(ev.get("timestamp"))
            if t is not None:
                ev["t_unix"] = t
                out.append(ev)
    return out


# ----------------------------------------------------------------------------- link probe

def measure_link(link: LinkConfig, *, n: int = 3) -> dict[str, Any]:
    """One-way times of a 64 B and a 64 KiB ZeroMQ message through an in-process relay
    shaped like ``link`` (medians of ``n``), and the goodput they imply."""
    import zmq

    from sim.cluster.relay import LinkSpec, Relay

    spec = LinkSpec(latency_s=link.latency_s, loss=link.loss, seed=link.seed,
                    bandwidth_bps=link.bandwidth_mbps * 1e6 if link.bandwidth_mbps else None)
    ctx = zmq.Context()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="link-probe")
    thread.start()
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    relay = None
    try:
        for s in (pull, push):
            s.linger = 0
        pull.rcvtimeo = push.sndtimeo = 30_000
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        relay = Relay([("127.0.0.1", port)], spec)
        asyncio.run_coroutine_threadsafe(relay.start(), loop).result(10)
        push.connect(relay.endpoint_for(("127.0.0.1", port)))
        push.send(b"warm")
        pull.recv()

        def one_way(size: int) -> float:
            times = []
            for _ in range(n):
                payload = os.urandom(size)
                t = time.perf_counter()
                push.send(payload)
                pull.recv()
                times.append(time.perf_counter() - t)
                time.sleep(0.05)
            return statistics.median(times)

        small, big = one_way(64), one_way(65_536)
        return {"one_way_64B_s": round(small, 4), "one_way_64KiB_s": round(big, 4),
                "goodput_mbps": round(65_472 * 8 / max(big - small, 1e-9) / 1e6, 3),
                "n": n, "method": "ZeroMQ PUSH->PULL through an in-process sim.cluster.relay with "
                                  "the same link model, medians"}
    finally:
        if relay is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(relay.close(), loop).result(10)
        push.close()
        pull.close()
        ctx.term()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


# ----------------------------------------------------------------------------- the hooks

class _Hooks:
    """:class:`sim.launch.synth.LaunchHooks` of a consortium run: relays for the shaped
    sites, and a scheduler thread for the offline window and the workload update."""

    def __init__(self, cons: Consortium, out: Path) -> None:
        self.cons, self.out = cons, out
        self.relays: dict[int, Any] = {}
        self.relay_final: dict[int, Any] = {}
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.events: Path = out / "events.jsonl"
        self.hour0_unix: float | None = None
        self.fired: dict[str, dict[str, Any]] = {}
        self.stopped_pid: int | None = None

    # LaunchHooks
    def party_broker(self, index: int, broker: str, ports: int) -> str:
        from sim.cluster.runner import start_link_relay

        link = self.cons.parties[index].link
        if not link.shaped:
            return broker
        self.relays[index] = start_link_relay(broker, self.cons.parties[index].name, link,
                                              self.out, ports=ports)
        return str(self.relays[index].address)

    def started(self, procs: dict[str, subprocess.Popen[bytes]], events: Path) -> None:
        self.procs, self.events = procs, events
        self.thread = threading.Thread(target=self._run, daemon=True, name="consortium")
        self.thread.start()

    def stopped(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(10)
        self._resume("the run ended")
        for i, rel in self.relays.items():
            self.relay_final[i] = rel.stop() or {}

    # the scheduler
    def _emit(self, event: str, **kw: Any) -> None:
        from sim.cluster.runner import _emit

        _emit(self.events, event, **kw)

    def _due(self, when: When, seen: set[tuple[str, str]]) -> bool:
        if isinstance(when, float):
            return (self.hour0_unix is not None
                    and time.time() >= self.hour0_unix + self.cons.wall_s(when))
        stage, _, what = when.rpartition(" ")
        return (stage, what) in seen

    def _hour(self) -> float | None:
        if self.hour0_unix is None:
            return None
        return round((time.time() - self.hour0_unix) / self.cons.seconds_per_hour, 3)

    def _run(self) -> None:
        pos, partial = 0, b""
        seen: set[tuple[str, str]] = set()
        cons = self.cons
        todo: list[tuple[str, When]] = []
        if cons.offline is not None:
            todo += [("offline_start", cons.offline.start), ("offline_end", cons.offline.end)]
        if cons.workload_update is not None:
            todo.append(("workload_update", cons.workload_update.at))
        while not self.stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                with self.events.open("rb") as f:
                    f.seek(pos)
                    data = partial + f.read()
                    pos = f.tell()
                *lines, partial = data.split(b"\n")
                for line in lines:
                    if b"stage." not in line:
                        continue
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    name = ev.get("event")
                    if name in ("stage.started", "stage.done"):
                        seen.add((str(ev.get("stage")), name.split(".")[1]))
                        if (self.hour0_unix is None and name == "stage.started"
                                and ev.get("stage") == "schema"):
                            self.hour0_unix = _unix(ev.get("timestamp")) or time.time()
                            self._emit("sim.cluster.consortium.hour0", seconds_per_hour=
                                       cons.seconds_per_hour, hours=cons.hours)
            for what, when in list(todo):
                if what == "offline_end" and "offline_start" not in self.fired:
                    continue
                if self._due(when, seen):
                    todo.remove((what, when))
                    getattr(self, f"_{what}")(when)
            self.stop.wait(POLL_S)

    def _offline_start(self, when: When) -> None:
        off = self.cons.offline
        assert off is not None
        i = self.cons.index(off.party)
        proc = self.procs.get(f"parties{i}")
        rec = {"at": when, "hour": self._hour(), "t_unix": time.time(), "party": off.party,
               "index": i}
        if proc is None or proc.poll() is not None:
            rec["note"] = "the site's process had exited"
        else:
            os.kill(proc.pid, signal.SIGSTOP)
            self.stopped_pid = proc.pid
        self.fired["offline_start"] = rec
        self._emit("sim.offline.start", site=off.party, index=i, hour=rec["hour"],
                   kind=off.kind)

    def _resume(self, why: str) -> None:
        if self.stopped_pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.stopped_pid, signal.SIGCONT)
        self.stopped_pid = None
        off = self.cons.offline
        assert off is not None
        rec = {"hour": self._hour(), "t_unix": time.time(), "why": why}
        self.fired["offline_end"] = rec
        self._emit("sim.offline.end", site=off.party, hour=rec["hour"], why=why)

    def _offline_end(self, when: When) -> None:
        self._resume(f"scheduled at {when!r}")

    def _workload_update(self, when: When) -> None:
        upd = self.cons.workload_update
        assert upd is not None
        rec: dict[str, Any] = {"at": when, "hour": self._hour(), "t_unix": time.time(),
                               **upd.queries()}
        try:
            from synth.workload import submit_workload  # another developer's module
        except ImportError as exc:
            rec.update(status="not available", reason=f"synth.workload: {exc}")
            self._emit("sim.workload_update", status="not available", hour=rec["hour"],
                       reason=rec["reason"])
        else:
            rec["module"] = getattr(sys.modules.get("synth.workload"), "__file__", None)
            try:
                path = submit_workload(self.out, upd.queries())
            except Exception as exc:  # noqa: BLE001 -- record any refusal, keep running
                rec.update(status="refused", reason=f"{type(exc).__name__}: {exc}")
            else:
                rec.update(status="submitted", path=str(path))
            self._emit("sim.workload_update", status=rec["status"], hour=rec["hour"],
                       reason=rec.get("reason"), path=rec.get("path"))
        self.fired["workload_update"] = rec


# ----------------------------------------------------------------------------- the run

def build_config(cons: Consortium, table: dict[str, Any]) -> Any:
    """The run's :class:`synth.config.SynthConfig`.

    Raises:
        ConfigError: a bad ``[synth]`` key or value, or a kill stage this run has not.
    """
    from sim.launch.synth import coordinator_stages
    from synth.config import SynthConfig

    cfg = from_mapping(SynthConfig, synth_table(cons, table), section="synth")
    for when in ([cons.offline.start, cons.offline.end] if cons.offline else []) + (
            [cons.workload_update.at] if cons.workload_update else []):
        st = when_stage(when)
        if st is not None and st not in coordinator_stages(cfg):
            raise ConfigError("consortium", f"{when!r}: {st!r} is not a stage of this run: "
                                            f"{coordinator_stages(cfg)}")
    kill = cons.kill_coordinator
    if kill is not None and kill.at.split("@")[0] not in coordinator_stages(cfg):
        raise ConfigError("consortium.kill_coordinator.at",
                          f"{kill.at!r} is not a stage of this run: {coordinator_stages(cfg)}")
    return cfg


def run_one(cons: Consortium, cfg: Any, out: Path, *, quiet: bool = False,
            insecure: bool = False) -> dict[str, Any]:
    """Run the scenario once into ``out``; return its ``metrics.json`` (FedForge's fields
    plus ``consortium``)."""
    from sim.launch.synth import run_synth

    probes = {i: measure_link(p.link) for i, p in enumerate(cons.parties) if p.link.shaped}
    hooks = _Hooks(cons, out)
    kill = cons.kill_coordinator
    res = run_synth(cfg, out, timeout_s=cons.timeout_s, quiet=quiet, insecure=insecure,
                    kill_coordinator_at=kill.at if kill else None,
                    kill_delay_s=kill.delay_s if kill else 0.0,
                    restart_after_s=kill.restart_after_s if kill else 1.0, hooks=hooks)
    m = res.metrics
    wu = hooks.fired.get("workload_update")
    if wu and wu.get("status") == "submitted":
        # did the coordinator take it up? (it moves or removes the pending file)
        wu["taken_up"] = not Path(wu["path"]).exists()
        if not wu["taken_up"]:
            wu["status"] = "submitted, still pending at the end (the coordinator did not take it up)"
    m["consortium"] = summarize(cons, cfg, m, hooks, probes, read_events(out / "events.jsonl"))
    write_atomic(out / "metrics.json", json.dumps(m, indent=1, default=str))
    return m


def summarize(cons: Consortium, cfg: Any, m: dict[str, Any], hooks: _Hooks,
              probes: dict[int, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``consortium`` object of ``metrics.json``."""
    ids = list(cfg.party_ids())
    rows = m.get("data", {}).get("rows", m.get("rows", {}))
    n_rows = sum(rows.values()) or 1
    w_total = sum(p.rows_equiv for p in cons.parties)
    sites = []
    for i, p in enumerate(cons.parties):
        r = int(rows.get(ids[i], 0))
        sites.append({"site": p.name, "party": ids[i], "rows_equiv": p.rows_equiv,
                      "rows": r, "equiv_per_row": round(p.rows_equiv / r, 2) if r else None})
    links = {}
    for i, p in enumerate(cons.parties):
        if p.link.shaped:
            fin = hooks.relay_final.get(i, {})
            links[p.name] = {"party": ids[i], "configured": dataclasses.asdict(p.link),
                             "probe": probes.get(i), "relay": fin.get("stats")}
    hour0 = hooks.hour0_unix
    rounds = m.get("rounds", {}) or {}
    offline = None
    if cons.offline is not None:
        pid = ids[cons.index(cons.offline.party)]
        missed = sorted(name for name, r in rounds.items() if pid in (r.get("dropped") or [])
                        or pid in (r.get("missing") or []))
        skipped = [e.get("name") for e in events
                   if e.get("event") == "synth.round_skipped" and e.get("party") == pid]
        cached = [e for e in (m.get("dropout_recovery") or {}).get("cached", [])
                  if pid in e.get("parties", [])]
        surv = [e for e in (m.get("dropout_recovery") or {}).get("survivors_only", [])
                if pid in e.get("parties", [])]
        start, end = hooks.fired.get("offline_start"), hooks.fired.get("offline_end")
        overlap = rounds_in_window(events, rounds, start and start["t_unix"],
                                   end and end["t_unix"])
        offline = {"site": cons.offline.party, "party": pid, "kind": cons.offline.kind,
                   "planned": {"start": cons.offline.start, "end": cons.offline.end},
                   "start_hour": start and start["hour"], "end_hour": end and end["hour"],
                   "wall_s": round(end["t_unix"] - start["t_unix"], 3)
                   if start and end else None,
                   "rounds_missed": missed, "rounds_total": len(rounds),
                   "fraction_of_rounds": round(len(missed) / len(rounds), 3) if rounds else None,
                   "rounds_skipped_by_party": skipped,
                   "rounds_in_window": overlap,
                   "cached_cliques": len(cached), "survivors_only_cliques": len(surv),
                   "fired": start is not None}
    wall_hours = None
    done = [e for e in events if e.get("event") == "stage.done"
            and e.get("stage") == "synthesis"]
    if hour0 is not None and done:
        wall_hours = round((done[-1]["t_unix"] - hour0) / cons.seconds_per_hour, 2)
    return {
        "scenario": describe(cons),
        "sites": sites,
        "scaling": {"train_rows": n_rows, "rows_equiv_total": w_total,
                    "equiv_per_row": round(w_total / n_rows, 3),
                    "how": f"the sites' sizes ({', '.join(f'{p.rows_equiv:,.0f}' for p in cons.parties)}) "
                           f"are weights: the {n_rows:,} training rows are cut in proportion "
                           f"(split = 'sizes'), one real row per "
                           f"{w_total / n_rows:.1f} equivalent rows"},
        "time": {"hour0_unix": hour0, "seconds_per_hour": cons.seconds_per_hour,
                 "hours_planned": cons.hours, "synthesis_done_hour": wall_hours},
        "links": links,
        "offline": offline,
        "workload_update": hooks.fired.get("workload_update") if cons.workload_update
        else None,
        "kill_coordinator": [f for f in m.get("faults", [])
                             if f.get("kind") == "kill_coordinator"] or None,
        "timeline": timeline(events, hour0, cons.seconds_per_hour),
    }


def rounds_in_window(events: list[dict[str, Any]], rounds: dict[str, Any],
                     t0: float | None, t1: float | None) -> list[dict[str, Any]]:
    """The measurement rounds that were open while the site was away (``t0`` .. ``t1``,
    Unix seconds; ``t1`` None = to the end): name, seconds, survivors. A round that
    waits for a site that comes back before its deadline completes with everyone, only
    later."""
    if t0 is None:
        return []
    t1 = float("inf") if t1 is None else t1
    opened: dict[str, float] = {}
    out = []
    for e in sorted(events, key=lambda e: e["t_unix"]):
        st = str(e.get("stage", ""))
        if not st.startswith("round:"):
            continue
        if e.get("event") == "stage.started":
            opened[st] = e["t_unix"]
        elif e.get("event") == "stage.done" and st in opened:
            a, b = opened.pop(st), e["t_unix"]
            if a < t1 and b > t0:
                name = st.split(":", 1)[1]
                r = rounds.get(name, {})
                out.append({"round": name, "seconds": round(b - a, 3),
                            "survivors": r.get("survivors"), "dropped": r.get("dropped")})
    return out


#: events drawn on the timeline besides the coordinator's stages
TIMELINE_EVENTS = ("sim.offline.start", "sim.offline.end", "sim.workload_update",
                   "sim.coordinator_killed", "sim.coordinator_restarted",
                   "synth.round_skipped", "synth.dropout_recovery", "sim.cluster.consortium.hour0")


def timeline(events: list[dict[str, Any]], hour0: float | None,
             seconds_per_hour: float) -> list[dict[str, Any]]:
    """The scenario's events in order, with seconds (``t_s``) and simulated hours after
    hour 0 (the run's first event when the synthesis never started)."""
    base = hour0 if hour0 is not None else (events[0]["t_unix"] if events else 0.0)
    out = []
    for e in sorted(events, key=lambda e: e["t_unix"]):  # several writers: order by time
        name = str(e.get("event"))
        if not (name in ("stage.started", "stage.done") or name in TIMELINE_EVENTS
                or "workload" in name):
            continue
        t = e["t_unix"] - base
        rec = {"t_s": round(t, 3), "hour": round(t / seconds_per_hour, 3), "event": name,
               "party": e.get("party")}
        for k in ("stage", "seconds", "site", "round", "name", "status", "reason", "why",
                  "cached", "survivors_only"):
            if k in e and e[k] is not None:
                rec[k] = e[k]
        out.append(rec)
    return out


def run_consortium(cons: Consortium, table: dict[str, Any], out: str | Path, *,
                   quiet: bool = False, insecure: bool = False,
                   compare_online: bool = False) -> dict[str, Any]:
    """Run the scenario (first, with ``compare_online``, with every site online into
    ``out/online``); write ``metrics.json``, ``report.md`` and ``timeline.png``.

    Raises:
        ConfigError: a bad ``[synth]`` table; and whatever :func:`run_synth` raises.
    """
    out = Path(out)
    cfg = build_config(cons, table)
    online = None
    if compare_online:
        base = dataclasses.replace(cons, offline=None, kill_coordinator=None,
                                   name=f"{cons.name} (all online)")
        online = run_one(base, cfg, out / "online", quiet=quiet, insecure=insecure)
        write_report(online, out / "online")
    m = run_one(cons, cfg, out, quiet=quiet, insecure=insecure)
    if online is not None:
        m["consortium"]["comparison"] = compare(online, m)
        write_atomic(out / "metrics.json", json.dumps(m, indent=1, default=str))
    write_report(m, out)
    return m


def compare(online: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The two runs' errors side by side."""
    def pick(m: dict[str, Any]) -> dict[str, Any]:
        off = m.get("consortium", {}).get("offline") or {}
        return {"avg_tv": m.get("avg_tv"), "max_tv": m.get("max_tv"),
                "wall_s": round(float(m.get("wall_s", 0.0)), 1),
                "rounds_missed": off.get("rounds_missed", []),
                "fraction_of_rounds": off.get("fraction_of_rounds", 0.0)}

    a, b = pick(online), pick(run)
    ratio = (b["avg_tv"] / a["avg_tv"]) if a["avg_tv"] and b["avg_tv"] is not None else None
    return {"all_online": a, "scenario": b,
            "tv_ratio": round(ratio, 4) if ratio is not None else None,
            "note": "one noise draw each; the difference includes the runs' noise"}


# ----------------------------------------------------------------------------- report

def format_summary(m: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    c = m["consortium"]
    lines = [f"consortium {c['scenario']['name']}: avg TV {m.get('avg_tv', float('nan')):.4f}"
             f", wall {m.get('wall_s', 0):.1f} s, {c['scaling']['how']}"]
    for s in c["sites"]:
        lines.append(f"  {s['site']:<14} {s['party']} {s['rows_equiv']:>9,.0f} equiv -> "
                     f"{s['rows']:>6,} rows")
    for name, ln in c["links"].items():
        pr, rel = ln.get("probe") or {}, ln.get("relay") or {}
        lines.append(f"  link {name}: {ln['configured']['latency_s']:g} s one way, "
                     f"{ln['configured']['bandwidth_mbps']:g} Mbit/s; probe 64 B "
                     f"{pr.get('one_way_64B_s')} s, 64 KiB {pr.get('one_way_64KiB_s')} s "
                     f"({pr.get('goodput_mbps')} Mbit/s); relay carried "
                     f"{rel.get('bytes_up', 0):,} B up, {rel.get('bytes_down', 0):,} B down")
    off = c.get("offline")
    if off:
        lines.append(f"  offline {off['site']} ({off['party']}) hours {off['start_hour']} -> "
                     f"{off['end_hour']}: missed {len(off['rounds_missed'])}/"
                     f"{off['rounds_total']} rounds {off['rounds_missed']}; open meanwhile: "
                     f"{_rounds_text(off.get('rounds_in_window', []))}"
                     + ("" if off["fired"] else " (NOT FIRED: the run ended first)"))
    wu = c.get("workload_update")
    if wu:
        lines.append(f"  workload update at hour {wu.get('hour')}: {wu.get('status')}"
                     + (f" ({wu['reason']})" if wu.get("reason") else ""))
    for k in c.get("kill_coordinator") or []:
        lines.append(f"  coordinator killed at {k.get('killed_at_s')} s ({k.get('stage')}), "
                     f"restarted at {k.get('restarted_at_s')} s")
    cmp_ = c.get("comparison")
    if cmp_:
        lines.append(f"  avg TV all online {cmp_['all_online']['avg_tv']:.4f} vs this scenario "
                     f"{cmp_['scenario']['avg_tv']:.4f} (ratio {cmp_['tv_ratio']})")
    lines.append(f"  ledger within plan: {m.get('ledger_within_plan')}")
    return "\n".join(lines)


def write_report(m: dict[str, Any], out: Path) -> Path:
    """``out/report.md`` (and ``out/timeline.png`` when matplotlib is there)."""
    c = m["consortium"]
    png = None
    with contextlib.suppress(ImportError):
        png = plot_timeline(m, out / "timeline.png")
    lines = [f"# Consortium scenario: {c['scenario']['name']}", "",
             f"avg TV {_f4(m.get('avg_tv'))}, max TV {_f4(m.get('max_tv'))}, wall "
             f"{m.get('wall_s', 0):.1f} s; ledger within plan: {m.get('ledger_within_plan')}",
             "", f"Rows: {c['scaling']['how']}.", "",
             "| site | party | equivalent rows | real rows | equiv per row |",
             "|---|---|---|---|---|"]
    lines += [f"| {s['site']} | {s['party']} | {s['rows_equiv']:,.0f} | {s['rows']:,} | "
              f"{s['equiv_per_row']} |" for s in c["sites"]]
    t = c["time"]
    lines += ["", f"Time: {t['hours_planned']:g} simulated hours at {t['seconds_per_hour']:g} s "
                  f"per hour (hour 0 = the coordinator's schema stage); the synthesis was "
                  f"done at hour {t['synthesis_done_hour']}.", ""]
    if c["links"]:
        lines += ["| link | configured | probe 64 B / 64 KiB one way | goodput | relay bytes "
                  "up / down |", "|---|---|---|---|---|"]
        for name, ln in c["links"].items():
            pr, rel, cf = ln.get("probe") or {}, ln.get("relay") or {}, ln["configured"]
            lines.append(f"| {name} | {cf['latency_s']:g} s, {cf['bandwidth_mbps']:g} Mbit/s "
                         f"| {pr.get('one_way_64B_s')} s / {pr.get('one_way_64KiB_s')} s | "
                         f"{pr.get('goodput_mbps')} Mbit/s | {rel.get('bytes_up')} / "
                         f"{rel.get('bytes_down')} |")
        lines.append("")
    off = c.get("offline")
    if off:
        lines += [f"Offline: {off['site']} ({off['party']}, {off['kind']}) from hour "
                  f"{off['start_hour']} to {off['end_hour']} ({off['wall_s']} s); rounds "
                  f"missed {off['rounds_missed']} = {off['fraction_of_rounds']} of "
                  f"{off['rounds_total']}; rounds open while it was away: "
                  f"{_rounds_text(off.get('rounds_in_window', []))}; skipped by the site "
                  f"after it came back "
                  f"{off['rounds_skipped_by_party']}; completed from the cache: "
                  f"{off['cached_cliques']} cliques, survivors only: "
                  f"{off['survivors_only_cliques']}.", ""]
    wu = c.get("workload_update")
    if wu:
        lines += [f"Workload update at hour {wu.get('hour')} ({wu.get('at')!r}): "
                  f"{wu.get('status')}" + (f" ({wu['reason']})" if wu.get("reason") else "")
                  + f"; marginals {wu.get('marginals')}.", ""]
    for k in c.get("kill_coordinator") or []:
        lines += [f"Coordinator kill at {k.get('stage')!r}: killed at {k.get('killed_at_s')} s, "
                  f"restarted at {k.get('restarted_at_s')} s.", ""]
    cmp_ = c.get("comparison")
    if cmp_:
        a, b = cmp_["all_online"], cmp_["scenario"]
        lines += ["| run | avg TV | max TV | rounds missed | wall s |", "|---|---|---|---|---|",
                  f"| all online | {_f4(a['avg_tv'])} | {_f4(a['max_tv'])} | 0 | {a['wall_s']} |",
                  f"| this scenario | {_f4(b['avg_tv'])} | {_f4(b['max_tv'])} | "
                  f"{len(b['rounds_missed'])} ({b['fraction_of_rounds']}) | {b['wall_s']} |",
                  "", f"TV ratio {cmp_['tv_ratio']} ({cmp_['note']}).", ""]
    ledger = m.get("ledger") or {}
    if ledger:
        lines += [f"Privacy ledgers (persisted, `state/<id>.ledger.json`): planned ρ "
                  f"{m.get('rho')}; within plan for every party: "
                  f"{m.get('ledger_within_plan')}.", "",
                  "| party | ρ spent | of planned | rounds paid |", "|---|---|---|---|"]
        rho = float(m.get("rho") or 0) or float("nan")
        lines += [f"| {p} | {v['rho_spent']:.6g} | {v['rho_spent'] / rho:.3f} | "
                  f"{len(v.get('entries', []))} |" for p, v in sorted(ledger.items())]
        lines.append("")
    lines += ["## Timeline", "", "| hour | s | event | detail |", "|---|---|---|---|"]
    for e in c["timeline"]:
        if e["event"] == "stage.started":
            continue
        detail = ", ".join(f"{k}={e[k]}" for k in ("stage", "seconds", "site", "name", "status",
                                                  "reason", "why") if k in e)
        lines.append(f"| {e['hour']} | {e['t_s']} | {e['event']} ({e['party']}) | {detail} |")
    if png is not None:
        lines += ["", f"![timeline]({png.name})"]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _rounds_text(rs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['round']} ({r['seconds']:g} s, {r['survivors']} survivors)"
                     for r in rs) or "none"


def _f4(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, int | float) else str(x)


def plot_timeline(m: dict[str, Any], path: Path) -> Path:
    """``timeline.png``: the coordinator's stages, each site's lane (offline window,
    rounds it missed), the workload update and a kill/restart, in simulated hours."""
    from sim.reports.common import DPI, _pyplot, _save

    plt = _pyplot()
    c = m["consortium"]
    tl = c["timeline"]
    sites = c["sites"]
    fig, ax = plt.subplots(figsize=(14.0, 2.0 + 0.6 * len(sites)), dpi=DPI)
    lanes = ["coordinator", *[f"{s['site']} ({s['party']})" for s in sites]]
    y = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}
    starts: dict[str, float] = {}
    for e in tl:
        if e["event"] == "stage.started":
            starts[e["stage"]] = e["hour"]
        elif e["event"] == "stage.done" and e.get("stage") in starts:
            st = str(e["stage"])
            h0 = starts.pop(st)
            color = ("#d62728" if st.startswith("round:") else "#7f7f7f"
                     if st.startswith("select") else "#1f77b4")
            ax.barh(y["coordinator"], max(e["hour"] - h0, 0.05), left=h0, height=0.5,
                    color=color, edgecolor="black", linewidth=0.3)
            if st.startswith("round:"):
                ax.text(e["hour"], y["coordinator"] + 0.32, st.split(":")[1], fontsize=7,
                        ha="center")
    by_party = {s["party"]: f"{s['site']} ({s['party']})" for s in sites}
    end_h = max([e["hour"] for e in tl] or [0.0])
    for lane in by_party.values():
        ax.barh(y[lane], end_h, left=0.0, height=0.25, color="#c7e9c0", label="site online")
    off = c.get("offline")
    if off and off.get("start_hour") is not None:
        end = off.get("end_hour") if off.get("end_hour") is not None else tl[-1]["hour"]
        lane = by_party[off["party"]]
        ax.barh(y[lane], end - off["start_hour"], left=off["start_hour"], height=0.5,
                color="#ff9896", edgecolor="#d62728", label="offline (SIGSTOP)")
        round_done = {e["stage"].split(":")[1]: e["hour"] for e in tl
                      if e["event"] == "stage.done" and str(e.get("stage")).startswith("round:")}
        xs = [round_done[r] for r in off["rounds_missed"] if r in round_done]
        if xs:
            ax.plot(xs, [y[lane]] * len(xs), "kx", markersize=10, label="round missed")
    for ln in c["links"].values():
        lane = by_party[ln["party"]]
        cf = ln["configured"]
        ax.text(0, y[lane] - 0.42, f"link {cf['latency_s'] * 1000:g} ms, "
                f"{cf['bandwidth_mbps']:g} Mbit/s", fontsize=8, color="#9467bd")
    styles = {"sim.workload_update": ("green", "-", "workload update"),
              "sim.coordinator_killed": ("black", "-", "coordinator kill -9"),
              "sim.coordinator_restarted": ("black", "--", "coordinator restart")}
    for e in tl:
        if e["event"] in styles:
            col, ls, lab = styles[e["event"]]
            ax.axvline(e["hour"], color=col, linestyle=ls, linewidth=1.5, label=lab)
    ax.axvline(c["time"]["hours_planned"], color="0.4", linestyle=":", linewidth=1.5,
               label=f"planned end ({c['time']['hours_planned']:g} h)")
    ax.set_yticks([y[n] for n in lanes], lanes)
    ax.set_xlabel(f"simulated hours ({c['time']['seconds_per_hour']:g} s of wall time per hour)")
    ax.set_xlim(left=min([0.0] + [e["hour"] for e in tl]))
    ax.grid(True, axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=True))
    if uniq:
        ax.legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0),
                  fontsize=8)
    ax.set_title(f"{c['scenario']['name']}: stages (red: measurement rounds, grey: AIM "
                 f"selection fits, blue: other), avg TV {m.get('avg_tv', float('nan')):.4f}")
    return _save(fig, path)


__all__ = ["build_config", "compare", "format_summary", "measure_link", "run_consortium",
           "run_one", "timeline", "write_report"]
