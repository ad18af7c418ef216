"""A campaign of broken and hostile peers against a live PubSub-VFL training run.

    python bench/hostile.py [--quick] [--json OUT.json]

The victim: bank, ``pubsub``, seed 0, DP off, Adam at ``VICTIM_LR`` (a tenth of the default,
so that the epochs a ``--attack-s`` campaign needs stay on the validation plateau instead
of overfitting, where two undisturbed runs differ by more than the tolerance), both parties as processes through a CURVE
broker this script owns (``python -m broker run --keys DIR --members FILE``; keys for
``active`` and ``passive``, the run's members, and for the attackers ``mallory``,
``flooder`` (passive role) and ``replayer`` (active role): valid keys of the right roles
that are not members of the victim's run). ``--insecure`` runs the same campaign against a
plaintext broker (no identities: only the parties' own checks). Two undisturbed runs give
the AUC spread; one attacked run is hit for the whole of its training (at least
``--attack-s``) by:

- malformed frames (random multipart messages on the broker's publisher port),
- malformed embeddings and gradients on the run's channels: NaN, wrong width, float64,
  two arrays, non-integer metadata, more rows than a batch,
- well-formed embeddings and gradients of the right shape from a foreign client,
- embeddings under the passive identity's publisher id (``passive/...``; CURVE only),
- replays of the partner's own captured embeddings (old epochs, later),
- ``far_future_epochs``: once, a copy of a captured embedding claiming epoch 10^9 on each
  of channels 0-9, under the partner's own publisher id (what once made those channels
  wait T_ddl three times in every later epoch: 20 of 336 batches untrained, nothing
  rejected). Sent only where the replayer could read an embedding to copy, so only on
  plaintext (with CURVE it is no member of the run and the broker refuses the spoofed id
  anyway): the victim's intake must reject and count them (``rejected_out_of_plan``) and
  lose no batch to them,
- control-socket garbage (requests of several frames, non-JSON),
- a subscription flood (``--subscriptions`` topics from one client),
- oversize messages (``--oversize-mb``, above the broker's 64 MiB bound).

Then the cases of :mod:`hostile_cases` (``--cases`` picks some; ``--skip-attack`` runs
only them): ``--restart-runs`` runs whose broker is killed (SIGKILL) as the run enters a
phase and restarted on the same port 2 s later, one per phase in turn (training,
validation, test scoring, the end-of-run report, a prediction); far-future epochs (on a
plaintext broker, where a non-member can copy the partner's publisher id); a PSI partner's
point off P-256 and lopsided sides (10^5 against 10 IDs; 10^6 without ``--quick``); a
2 MB filesystem under a VFL and a FedForge run (a tmpfs in a mount namespace, root only);
absurd settings and shapes (a 20 MB line; 1.07 GB without ``--quick``); two runs into one
directory; a non-member key against a default CURVE broker; an external SIGKILL of a
FedForge party process. A case this machine cannot set up is listed in
``summary.skipped`` with the reason, never counted as held.

``summary``: ``broker_alive`` (the broker still answers ``ping`` after the campaign);
``victim_completed`` (both parties exit 0); ``crashes`` (non-zero exits or tracebacks of
victim or broker processes in the attacked run, and processes of the cases killed by a
signal, timed out or ending with an undocumented exit code); ``tracebacks`` (processes
that ended with an uncaught traceback); ``silent_corruptions`` (a metric that is not
finite, a party that rejected none of the attacker's messages: they were then either
used or never seen, or ``far_future_epochs`` copies sent and none rejected as out of
plan); ``silent_losses`` (runs, results or files of the cases lost or truncated without a
typed error); ``victim_auc_delta`` (median undisturbed minus attacked) against
``auc_tolerance`` = max(0.005, 2 x the undisturbed spread); ``broker_rss_growth_mb``;
``broker_refused`` (the broker's own refusals during the attack: forbidden, spoofed,
not_member, not_member_reads, capped, rejected); ``far_future_epochs`` (copies sent, the
victim's ``rejected_out_of_plan`` and ``untrained_batches`` on each side, its
``dropped_batches`` beside the undisturbed runs'); ``restart_runs`` /
``restart_runs_completed`` (the restart cases whose runs, restarted, ended 0);
``held`` / ``not_held`` (case names); ``skipped`` (case -> reason); ``cases`` (each
case's record).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil
import zmq

from pubsub import Bus, BusConfig
from pubsub.address import BrokerAddress
from pubsub.control import control_request
from pubsub.outputs import write_atomic
from pubsub.membership import membership, run_family
from pubsub.policy import load_policy
from pubsub.security import CurveClient, generate_certificate

import hostile_cases  # noqa: E402 - bench/ is on the path when run as a script

PSFL = [sys.executable, "-m", "sim.cli"]
REPO = Path(__file__).resolve().parents[1]


#: identities of the campaign: name -> role (the first two are the victim run's members)
IDENTITIES = {"active": "active", "passive": "passive", "mallory": "passive",
              "flooder": "passive", "replayer": "active"}
#: the victim's learning rate: bank at the default 1e-3 overfits within the 150-250 epochs
#: a 60 s attack needs on 2 cores (undisturbed test AUC 0.895 at 199 epochs, 0.915 at 100);
#: at 2e-4 the validation AUC was flat (0.940-0.941) from epoch 60 to 150 (2026-12-02)
VICTIM_LR = 1e-4
#: the epoch the ``far_future_epochs`` copies claim
FAR_EPOCH = 10**9
#: the runs the campaign's membership admits active and passive to (each with its
#: alignment and prediction runs): the victim, the undisturbed runs, the restart cases
RUNS = ["victim", "plain0", "plain1",
        *(f"restart-{phase}" for phase in hostile_cases.RESTART_PHASES)]


def make_keys(root: Path) -> Path:
    """Keys of the broker and every identity, and the membership of the victim's runs."""
    keys = root / "keys"
    keys.mkdir()
    generate_certificate(keys, "broker")
    for name, role in IDENTITIES.items():
        generate_certificate(keys, name, role=role)
    (root / "members.toml").write_text(
        membership({f: ["active", "passive"] for r in RUNS for f in run_family(r)}).as_toml())
    return keys


class Broker:
    """A broker process on 127.0.0.1 (restartable on the same port): CURVE with the
    campaign's keys and membership, or plaintext (``keys`` None)."""

    def __init__(self, root: Path, keys: Path | None,
                 members: list[str] | None = None) -> None:
        self.root = root
        self.keys = keys
        #: the run membership's arguments (default: the campaign's members.toml)
        self.members = members if members is not None else [
            "--members", str(root / "members.toml")]
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.start()

    def sec(self, who: str) -> CurveClient | None:
        return CurveClient.from_dir(self.keys, who) if self.keys is not None else None

    def start(self) -> None:
        ready = self.root / f"broker-{time.monotonic_ns()}.addr"
        security = (["--keys", str(self.keys), *self.members]
                    if self.keys is not None else ["--insecure"])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "run", *security, "--bind",
             f"tcp://127.0.0.1:{self.port}", "--ready-file", str(ready), "--log-level",
             "error"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the broker did not start: "
                                   + (self.proc.stderr.read().decode()[-500:]
                                      if self.proc.stderr else ""))
            time.sleep(0.02)
        self.address = ready.read_text().strip()
        self.port = BrokerAddress.parse(self.address).port

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def rss_mb(self) -> float:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).memory_info().rss / 2**20

    def ping(self) -> bool:
        try:
            return control_request(self.address, "ping", timeout_s=5.0,
                                   security=self.sec("active")).get("ok") is True
        except Exception:  # noqa: BLE001 - no answer is the finding
            return False

    def refused(self) -> dict[str, int]:
        """The broker's refusals so far, by kind (summed over roles and identities)."""
        st = control_request(self.address, "stats", timeout_s=5.0,
                             security=self.sec("active"))["stats"]
        out = {"rejected": int(st.get("rejected", 0))}
        for k in ("forbidden", "spoofed", "not_member", "not_member_reads", "capped"):
            out[k] = int(sum((st.get(k) or {}).values()))
        return out


def _launch(broker: Broker, out: Path, run_id: str, epochs: int,
            extra: list[str] | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    security = ["--keys", str(broker.keys)] if broker.keys is not None else ["--insecure"]
    sets = ["seed=0", f"epochs={epochs}", "eval_every=1000", "timeouts.liveness_timeout_s=30",
            f"lr={VICTIM_LR}", *(extra or [])]
    return subprocess.Popen(
        [*PSFL, "vfl", "run", "--dataset", "bank", "--algo", "pubsub", "--out", str(out),
         "--broker", broker.address, *security, "--run-id", run_id,
         *(a for s in sets for a in ("--set", s))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_event(path: Path, event: str, proc: subprocess.Popen[str], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and f'"event":"{event}"' in path.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def _result(proc: subprocess.Popen[str], out: Path, timeout_s: float) -> dict[str, Any]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    metrics = {}
    if (out / "metrics.json").exists():
        metrics = orjson.loads((out / "metrics.json").read_bytes())
    last = (stderr.strip().splitlines() or [""])[-1]
    return {"code": proc.returncode, "traceback": "Traceback" in stderr + stdout,
            "last_stderr": last[:300], "metrics": metrics}


# --------------------------------------------------------------------------- attack
async def _attack_bus(broker: Broker, run_id: str, stop: threading.Event,
                      counts: dict[str, int], n_channels: int, subs: int,
                      oversize_mb: int) -> None:
    address = broker.address
    rng = np.random.default_rng(1)
    good = rng.normal(size=(256, 32)).astype(np.float32)
    bad_payloads: list[tuple[list[Any], dict[str, Any]]] = [
        ([np.full((256, 32), np.nan, np.float32)], {"e": 0}),
        ([np.zeros((256, 7), np.float32)], {"e": 0}),
        ([np.zeros((256, 32), np.float64)], {"e": 0}),
        ([good, good], {"e": 0}),
        ([good], {"e": "0"}),
        ([np.zeros((5000, 32), np.float32)], {"e": 0}),
        ([good], {"e": 0, "u": 1}),  # well-formed, foreign
    ]
    cfg = BusConfig(max_message_bytes=(oversize_mb + 8) << 20)  # lowered by the hello
    async with Bus(address, name="mallory", config=cfg, security=broker.sec("mallory")) as bus, \
            Bus(address, name="flooder", security=broker.sec("flooder")) as flood, \
            Bus(address, name="replayer", config=cfg,
                security=broker.sec("replayer")) as rep:
        for client in (bus, flood, rep):  # attackers ignore the runs the hello names
            if client.hello is not None:
                client.hello = dataclasses.replace(client.hello, runs=None)
        seen = [f"emb/{run_id}/{b}" for b in range(n_channels)]
        await rep.subscribe_many(seen)  # with CURVE the broker refuses a non-member these
        topics = [f"grad/{run_id}/f{i}" for i in range(subs)]  # the run's own namespace
        for i in range(0, subs, 500):
            await flood.subscribe_many(topics[i:i + 500])
        counts["subscriptions"] = subs
        captured: list[Any] = []
        real: Any = None  # an embedding of the passive party's own client
        i = 0
        big_sent = False
        while not stop.is_set():
            for b in range(n_channels):
                # embeddings from a passive-role key, gradients from an active-role key
                for kind, client in (("emb", bus), ("grad", rep)):
                    arrays, meta = bad_payloads[i % len(bad_payloads)]
                    client.publish_nowait(f"{kind}/{run_id}/{b}", arrays, {**meta, "b": b})
                    counts["bad_messages"] += 1
                    i += 1
            for t in seen:  # the partner's real embeddings, to replay later
                m = rep.try_next(t)
                if m is not None and len(captured) < 64:
                    captured.append(m)
                while real is None and m is not None:  # one of the partner's own
                    if m.publisher.startswith("passive"):
                        real = m
                    m = rep.try_next(t)
            for m in captured[: max(0, len(captured) - 8)][:4]:  # replay old ones
                rep.publish_nowait(m.topic, list(m.arrays), dict(m.meta))
                counts["replays"] += 1
            if real is not None and not counts["far_future"]:
                # one copy claiming epoch 10^9 on channels 0-9, as the partner (the
                # passive party's client id: the captures hold mallory's messages too)
                m, own = real, rep.publisher_id
                rep.publisher_id = m.publisher
                for c in range(min(10, n_channels)):
                    rep.publish_nowait(f"emb/{run_id}/{c}", list(m.arrays),
                                       {**dict(m.meta), "e": FAR_EPOCH, "b": c})
                    counts["far_future"] += 1
                rep.publisher_id = own
            if broker.keys is not None:  # claim the passive identity's publisher id
                own = bus.publisher_id
                bus.publisher_id = f"passive/forged-{i}"
                bus.publish_nowait(f"emb/{run_id}/0", [good], {"e": 0, "b": 0})
                bus.publisher_id = own
                counts["spoofed"] += 1
            if not big_sent:
                # a bus client learns the broker's bound from its hello and refuses to
                # send more (MessageTooLarge); the raw attacker below sends it anyway
                try:
                    bus.publish_nowait(f"emb/{run_id}/0",
                                       [np.zeros((oversize_mb << 20) // 4, np.float32)])
                    counts["oversize_sent_by_bus"] = 1
                except Exception:  # noqa: BLE001 - the client's refusal is the point
                    pass
                big_sent = True
            await asyncio.sleep(0.05)


def _attack_raw(broker: Broker, stop: threading.Event, counts: dict[str, int],
                oversize_mb: int) -> None:
    """Malformed frames on the publisher port, one frame of ``oversize_mb`` MB there,
    and garbage on the control socket."""
    addr = BrokerAddress.parse(broker.address)
    ctx = zmq.Context()
    rng = random.Random(2)
    sec = broker.sec("mallory")
    if sec is not None:
        from broker.proxy import DEFAULT_POLICY_FILE

        pub_offset = 3 + 2 * load_policy(DEFAULT_POLICY_FILE).index("passive")
    else:
        pub_offset = 0
    try:
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        if sec is not None:
            sec.apply(pub)
        pub.connect(addr.endpoint(pub_offset))
        big = False
        while not stop.is_set():
            if not big:
                time.sleep(0.5)  # connected (and, with CURVE, handshaken) first
                pub.send(b"emb/victim/0\0" + bytes(oversize_mb << 20))
                counts["oversize"] += 1
                big = True
            for k in range(20):
                # a subscribed topic first (a PUB socket sends only what someone reads:
                # the victim's own channels), then garbage where the envelope should be
                head = b"emb/victim/%d\0" % (k % 16) + rng.randbytes(rng.randrange(0, 64))
                pub.send_multipart([head, *(rng.randbytes(rng.randrange(0, 64))
                                            for _ in range(rng.randrange(0, 4)))])
                counts["malformed_frames"] += 1
            req = ctx.socket(zmq.REQ)
            req.setsockopt(zmq.LINGER, 0)
            if sec is not None:
                sec.apply(req)
            req.connect(addr.control_endpoint)
            req.send_multipart([b'{"cmd":"stats"}', rng.randbytes(16)])
            counts["control_garbage"] += 1
            req.poll(1000, zmq.POLLIN)
            req.close()
            time.sleep(0.05)
    finally:
        ctx.destroy(linger=0)


def attacked_run(root: Path, keys: Path | None, epochs: int, attack_s: float, subs: int,
                 oversize_mb: int) -> dict[str, Any]:
    broker = Broker(root, keys)
    rss0 = broker.rss_mb()
    out = root / "attacked"
    victim = _launch(broker, out, "victim", epochs)
    counts = {"bad_messages": 0, "replays": 0, "oversize": 0, "malformed_frames": 0,
              "control_garbage": 0, "subscriptions": 0, "spoofed": 0, "far_future": 0}
    stop = threading.Event()
    started = _wait_event(out / "events.jsonl", "vfl.partner_found", victim, 180)
    t0 = time.monotonic()
    threads = [threading.Thread(target=_attack_raw, args=(broker, stop, counts, oversize_mb)),
               threading.Thread(target=lambda: asyncio.run(_attack_bus(
                   broker, "victim", stop, counts, 16, subs, oversize_mb)))]
    if started:
        for t in threads:
            t.start()
    rss_max = rss0
    while victim.poll() is None or time.monotonic() - t0 < min(attack_s, 5):
        rss_max = max(rss_max, broker.rss_mb())
        if victim.poll() is not None:
            break
        time.sleep(0.5)
    attack_wall = time.monotonic() - t0
    stop.set()
    for t in threads:
        if t.is_alive():
            t.join(30)
    res = _result(victim, out, 60)
    alive = broker.proc is not None and broker.proc.poll() is None and broker.ping()
    broker_refused = broker.refused() if alive else {}
    broker_code = broker.stop()
    m = res["metrics"]
    parties = m.get("parties", {})
    rejected = {r: parties.get(r, {}).get("rejected_messages", 0)
                + parties.get(r, {}).get("foreign_messages", 0) for r in ("active", "passive")}
    auc = m.get("test_auc")
    # an attack nobody refused (neither the broker nor a party) was used or never seen
    refused_anywhere = sum(broker_refused.values()) + sum(rejected.values())
    corruptions = int(auc is None or not np.isfinite(auc)) + int(
        counts["bad_messages"] > 0 and refused_anywhere == 0) + int(
        # the partner-id copies claiming epoch 10^9 reached the active party unrefused
        counts["far_future"] > 0
        and not parties.get("active", {}).get("rejected_out_of_plan"))
    return {"started": started, "attack_s": attack_wall, "counts": counts,
            "victim": {k: v for k, v in res.items() if k != "metrics"}, "test_auc": auc,
            "train_wall_s": m.get("train_wall_s"), "rejected": rejected,
            "rejected_by_sender": {r: parties.get(r, {}).get("rejected_by_sender", {})
                                   for r in ("active", "passive")},
            "far_future_epochs": {
                "sent": counts["far_future"],
                "rejected_out_of_plan": {r: parties.get(r, {}).get("rejected_out_of_plan")
                                         for r in ("active", "passive")},
                "untrained_batches": {r: parties.get(r, {}).get("untrained_batches")
                                      for r in ("active", "passive")},
                "dropped_batches": m.get("dropped_batches")},
            "broker_alive": alive, "broker_exit": broker_code,
            "broker_refused": broker_refused,
            "broker_rss_growth_mb": rss_max - rss0, "silent_corruptions": corruptions,
            "crashes": int(res["code"] != 0) + int(res["traceback"])
            + int(not alive)}


def plain_run(root: Path, keys: Path | None, name: str, epochs: int) -> dict[str, Any]:
    broker = Broker(root, keys)
    out = root / name
    res = _result(_launch(broker, out, name, epochs), out, 600)
    broker.stop()
    return {"code": res["code"], "test_auc": res["metrics"].get("test_auc"),
            "train_wall_s": res["metrics"].get("train_wall_s"),
            "dropped_batches": res["metrics"].get("dropped_batches")}


def run_cases(root: Path, keys: Path | None, epochs: int, *, quick: bool,
              only: set[str] | None, restart_runs: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The restart runs (one per phase, cycling) and the cases of
    :mod:`hostile_cases`; returns ``(cases, skipped)``."""
    hc = hostile_cases
    cases: dict[str, Any] = {}
    skipped: dict[str, str] = {}

    def want(name: str) -> bool:
        return only is None or name in only or name.split("_")[0] in only

    def case(name: str, fn: Any, *args: Any) -> None:
        if not want(name):
            return
        t0 = time.monotonic()
        try:
            cases[name] = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the bench's own failure is a finding too
            cases[name] = {"held": False, "error": f"{type(exc).__name__}: {exc}",
                           "tracebacks": 0, "silent_losses": 0, "crashes": 0}
        r = cases[name]
        print(f"case {name}: {'held' if r.get('held') else 'NOT HELD'} in "
              f"{time.monotonic() - t0:.0f} s", flush=True)

    phases = list(hc.RESTART_PHASES)
    short = max(6, epochs // 8)
    for k in range(restart_runs):
        phase = phases[k % len(phases)]
        name = f"restart_{phase}" + (f"_{k // len(phases)}" if k >= len(phases) else "")
        broker = Broker(root, keys)
        try:
            case(name, hc.restart_case, broker, root, phase, short, _launch)
        finally:
            broker.stop()
    plain = Broker(root, None)
    try:
        case("far_future_epochs", hc.far_future_case, plain, root, short, _launch)
        case("psi_off_curve", hc.psi_off_curve_case, plain, root)
        case("psi_lopsided", hc.psi_lopsided_case, plain, root,
             100_000 if quick else 1_000_000)
    finally:
        plain.stop()
    reason = hc.namespace_skip_reason()
    # 2 MB as the issue sets it (a short VFL run fits: its results must then be whole),
    # and 192 KB, where the VFL run cannot fit (what the campaign's disk had free)
    for kind, size in (("vfl", "2m"), ("vfl", "192k"), ("synth", "2m")):
        name = f"full_disk_{kind}" + ("" if size == "2m" else f"_{size}")
        if reason is not None and want(name):
            skipped[name] = reason
        elif reason is None:
            case(name, hc.full_disk_case, kind, root, size)
    case("absurd_settings", hc.absurd_case, root, not quick)
    case("two_runs_one_dir", hc.two_runs_case, root)
    if keys is None:
        if want("non_member_default_broker"):
            skipped["non_member_default_broker"] = "a plaintext campaign has no keys"
    else:
        case("non_member_default_broker", hc.non_member_case, root, keys, Broker, short,
             _launch)
    case("synth_party_sigkill", hc.synth_kill_case, root)
    return cases, skipped


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="at most about 20 minutes")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--epochs", type=int, default=None, help="victim epochs")
    p.add_argument("--attack-s", type=float, default=60.0)
    p.add_argument("--subscriptions", type=int, default=10_000)
    p.add_argument("--oversize-mb", type=int, default=80)
    p.add_argument("--restart-runs", type=int, default=5,
                   help="runs whose broker is killed and restarted, one per phase in turn "
                   "(training, validation, test, report, prediction)")
    p.add_argument("--cases", default=None,
                   help="comma-separated cases (names or prefixes: restart, full, psi, ...) "
                   "to run besides the attacked run; default all")
    p.add_argument("--skip-attack", action="store_true",
                   help="only the cases (no undisturbed or attacked runs)")
    p.add_argument("--insecure", action="store_true",
                   help="a plaintext broker (no identities; the parties' checks only)")
    args = p.parse_args()
    if args.restart_runs > 16:
        p.error("--restart-runs: at most 16")
    from pubsub.logs import configure_logging

    configure_logging(stderr_level="error")  # the attacker's own clients stay quiet
    # without --epochs a short first run sizes the victim (see below)
    epochs = args.epochs or (30 if args.quick else 150)
    root = Path(tempfile.mkdtemp(prefix="psfl-hostile-"))
    keys = None if args.insecure else make_keys(root)
    t0 = time.monotonic()
    only = set(args.cases.split(",")) if args.cases else None
    if args.skip_attack:
        cases, skipped = run_cases(root, keys, epochs, quick=args.quick, only=only,
                                   restart_runs=args.restart_runs)
        summary = _case_summary(cases, skipped)
        summary["wall_s"] = time.monotonic() - t0
        print(json.dumps(summary, indent=2, default=str))
        if args.json:
            write_atomic(args.json, json.dumps({"summary": summary, "cases": cases},
                                               indent=2, default=str))
        return
    plain = [plain_run(root, keys, "plain0", epochs)]
    if args.epochs is None:
        # the campaign lasts as long as the victim trains: enough epochs for --attack-s
        # of undisturbed training with a tenth to spare on this machine (bank at B = 256
        # trains 0.3-0.6 s per epoch on 2 cores; the attacked victim trains slower, and
        # the campaign also spans its start and its test scoring), the same for every
        # run that is compared. (With a quarter to spare and a 100-epoch first run,
        # --quick took 648 s on a slow hour of this VM, over its 10 minutes.)
        per_epoch = (plain[0]["train_wall_s"] or 0.0) / epochs
        need = math.ceil(1.1 * args.attack_s / per_epoch) if per_epoch > 0 else epochs
        if need > epochs:
            print(f"{epochs} epochs trained in {per_epoch * epochs:.0f} s: {need} epochs "
                  f"for an attack of {args.attack_s:.0f} s", flush=True)
            epochs = need
            plain = [plain_run(root, keys, "plain0", epochs)]
    plain.append(plain_run(root, keys, "plain1", epochs))
    print(f"undisturbed: test_auc {[r['test_auc'] for r in plain]}, train "
          f"{[r['train_wall_s'] for r in plain]} s", flush=True)
    att = attacked_run(root, keys, epochs, args.attack_s, args.subscriptions,
                       args.oversize_mb)
    print(f"attacked: test_auc {att['test_auc']}, attack {att['attack_s']:.0f} s, "
          f"counts {att['counts']}, rejected {att['rejected']}, crashes {att['crashes']}",
          flush=True)
    cases, skipped = run_cases(root, keys, epochs, quick=args.quick, only=only,
                               restart_runs=args.restart_runs)
    aucs = [r["test_auc"] for r in plain if r["test_auc"] is not None]
    spread = (max(aucs) - min(aucs)) if len(aucs) == 2 else float("nan")
    base = float(np.median(aucs)) if aucs else float("nan")
    delta = base - att["test_auc"] if att["test_auc"] is not None else float("nan")
    per_case = _case_summary(cases, skipped)
    summary = {
        "broker_alive": att["broker_alive"],
        "victim_completed": att["victim"]["code"] == 0,
        "crashes": att["crashes"] + per_case["crashes"],
        "silent_corruptions": att["silent_corruptions"],
        "tracebacks": int(att["victim"]["traceback"]) + per_case["tracebacks"],
        "silent_losses": per_case["silent_losses"],
        "victim_auc_delta": delta,
        "auc_tolerance": max(0.005, 2 * spread),
        "attack_s": att["attack_s"],
        "broker_rss_growth_mb": att["broker_rss_growth_mb"],
        "broker_refused": att["broker_refused"],
        "far_future_epochs": {**att["far_future_epochs"],
                              "dropped_batches_undisturbed": [r["dropped_batches"]
                                                              for r in plain]},
        "transport": "plaintext" if args.insecure else "curve",
        "restart_runs": per_case["restart_runs"],
        "restart_runs_completed": per_case["restart_runs_completed"],
        "held": per_case["held"],
        "not_held": per_case["not_held"],
        "skipped": per_case["skipped"],
        "cases": per_case["cases"],
        "wall_s": time.monotonic() - t0,
    }
    print(json.dumps(summary, indent=2, default=str))
    if args.json:
        write_atomic(args.json, json.dumps({"summary": summary, "undisturbed": plain,
                                            "attacked": att, "cases": cases,
                                            "epochs": epochs}, indent=2, default=str))


def _case_summary(cases: dict[str, Any], skipped: dict[str, str]) -> dict[str, Any]:
    """The cases' part of the summary: their counters summed, what held, and each case's
    record less its bulkier fields."""
    restarts = {k: v for k, v in cases.items() if k.startswith("restart_")}
    slim = {k: {f: x for f, x in v.items() if f not in ("stderr",)} for k, v in cases.items()}
    return {
        "crashes": sum(int(v.get("crashes", 0)) for v in cases.values()),
        "tracebacks": sum(int(v.get("tracebacks", 0)) for v in cases.values()),
        "silent_losses": sum(int(v.get("silent_losses", 0)) for v in cases.values()),
        "restart_runs": len(restarts),
        "restart_runs_completed": sum(bool(v.get("completed")) for v in restarts.values()),
        "held": sorted(k for k, v in cases.items() if v.get("held")),
        "not_held": sorted(k for k, v in cases.items() if not v.get("held")),
        "skipped": skipped,
        "cases": slim,
    }


if __name__ == "__main__":
    main()
