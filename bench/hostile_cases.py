"""The cases of ``bench/hostile.py`` beyond its attacked run: faults and absurd input that
must each end in a result or a typed error, never a traceback, a lost result or a
truncated file.

Each case returns a record: ``held`` (the system did what it promises), ``tracebacks``
(processes that ended with an uncaught traceback), ``silent_losses`` (runs, results or
files lost or truncated without a typed error), ``crashes`` (a process killed by a signal
or ending with an exit code no error is documented with), ``wall_s`` and what it saw; or
``skipped`` with the reason where this machine cannot set it up (never counted as held).

- ``restart_<phase>``: a run's broker killed (SIGKILL) as the run enters ``phase``
  (training, validation, test scoring, the end-of-run report; a prediction with a trained
  model as its parties meet) and restarted on the same port 2 s later: the run ends 0
  with every figure (no report missing, a prediction for every row);
- ``far_future_epochs``: on a plaintext broker, copies of one of the passive party's
  embeddings claiming epoch 10^9 on channels 0-9 under its own publisher id: rejected as
  out of plan and counted, no batch lost to them;
- ``psi_off_curve``: a partner's request chunk holding a point off P-256: the honest
  party exits 4 naming it; ``psi_lopsided``: 10^5 IDs (10^6 in the full mode) against 10
  aligns within its stated time;
- ``full_disk_vfl`` / ``full_disk_synth``: a run into a 2 MB tmpfs (a mount namespace,
  ``unshare -m``, as root): a typed error naming the path (exit 2) and nothing partial
  under a result's name, or a whole result;
- ``absurd_settings``: ``embedding_dim = 10^9``, ``workers.passive = 10^4``, a CSV of
  200 x 100,000 columns, a CSV with one 20 MB line (1.07 GB in the full mode): each
  refused with exit 2 before anything starts;
- ``two_runs_one_dir``: a second run into a running run's directory is refused at once
  naming the holder, and the first run's results are its own;
- ``non_member_default_broker``: a CURVE broker started without its runs' members
  refuses to start; on a broker that declares a run's members, a valid key of the
  passive role that is not one of them is told (``NotRunMember``) and, reading with a
  client that ignores that, receives nothing of the run;
- ``synth_party_sigkill``: a FedForge party process SIGKILLed from outside mid-run: a
  dropout, the run exits 0 and reports the death.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil

REPO = Path(__file__).resolve().parents[1]
PSFL = [sys.executable, "-m", "sim.cli"]
#: the phases a restart case kills the broker in, and the event that marks each
RESTART_PHASES = {"training": '"event":"vfl.epoch_done"',
                  "validation": '"phase":"validation"',
                  "test": '"phase":"test"',
                  "report": '"phase":"report"',
                  "prediction": '"event":"predict.partner_found"'}
#: exit codes a typed error ends with (docs/reference/exit-codes.md)
TYPED_EXITS = {2, 3, 4, 5}
FAR_EPOCH = 10**9


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _run(argv: list[str], timeout_s: float, cwd: Path | None = None) -> dict[str, Any]:
    """Run a command to its end; its exit code, whether it printed a traceback, its last
    stderr line and its wall time."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=_env(),
                           cwd=cwd)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    return {"code": code, "traceback": "Traceback" in out + err,
            "last_stderr": (err.strip().splitlines() or [""])[-1][:300],
            "stderr": err, "wall_s": round(time.monotonic() - t0, 2)}


def _typed(res: dict[str, Any]) -> bool:
    """Ended with a documented exit code and an ``error`` line, no traceback."""
    return (res["code"] in TYPED_EXITS and not res["traceback"]
            and res["last_stderr"].lower().startswith("error"))


def _crash(res: dict[str, Any]) -> int:
    """1 for a process killed by a signal, timed out, or ending 1 (an unmapped error)."""
    return int(res["code"] is None or res["code"] < 0 or res["code"] == 1)


def _wait_text(path: Path, needle: str, proc: subprocess.Popen[Any], after: int = 0,
               timeout_s: float = 240.0) -> int | None:
    """Wait until ``path`` holds ``needle`` past byte ``after``; the end of its line, or
    None when the process ended or the time ran out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            text = path.read_bytes()
        except OSError:
            text = b""
        i = text.find(needle.encode(), after)
        if i >= 0:
            return text.find(b"\n", i) + 1 or len(text)
        time.sleep(0.02)
    return None


def _result(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return {"code": proc.returncode, "traceback": "Traceback" in out + err,
            "last_stderr": (err.strip().splitlines() or [""])[-1][:300], "stderr": err}


def _metrics(out: Path) -> dict[str, Any] | None:
    try:
        return orjson.loads((out / "metrics.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _untrained(m: dict[str, Any] | None) -> dict[str, Any]:
    parties = (m or {}).get("parties", {})
    return {r: parties.get(r, {}).get("untrained_batches") for r in ("active", "passive")}


# ----------------------------------------------------------------------- restarts
def restart_case(broker: Any, root: Path, phase: str, epochs: int,
                 launch: Callable[..., subprocess.Popen[str]]) -> dict[str, Any]:
    """One run whose broker is killed as it enters ``phase`` and restarted on the same
    port 2 s later (``prediction``: an undisturbed run, then its prediction's broker)."""
    t0 = time.monotonic()
    out = root / f"restart-{phase}"
    run_id = f"restart-{phase}"
    extra = ["eval_every=1", "timeouts.resend_interval_s=2.0"]
    proc = launch(broker, out, run_id, epochs, extra)
    restarted = False
    if phase != "prediction":
        if _wait_text(out / "events.jsonl", RESTART_PHASES[phase], proc) is not None:
            broker.kill()
            time.sleep(2.0)
            broker.start()  # the same port
            restarted = True
    res = _result(proc, 600)
    m = _metrics(out)
    rec: dict[str, Any] = {"phase": phase, "code": res["code"], "traceback": res["traceback"],
                           "last_stderr": res["last_stderr"],
                           "test_auc": (m or {}).get("test_auc"),
                           "reports_missing": (m or {}).get("reports_missing"),
                           "scoring_resends": (m or {}).get("parties", {}).get(
                               "active", {}).get("scoring_resends"),
                           "untrained_batches": _untrained(m)}
    lost = res["code"] == 0 and (m is None or m.get("reports_missing")
                                 or not np.isfinite(m.get("test_auc") or float("nan")))
    codes = [res["code"]]
    tracebacks = int(res["traceback"])
    if phase == "prediction" and res["code"] == 0:
        pred = root / "restart-prediction-out"
        sec = ["--keys", str(broker.keys)] if broker.keys is not None else ["--insecure"]
        job = subprocess.Popen(
            [*PSFL, "vfl", "predict", str(out), "--broker", broker.address, *sec,
             "--run-id", f"{run_id}-predict", "--out", str(pred), "--wait-s", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        if _wait_text(pred / "events.jsonl", RESTART_PHASES["prediction"], job) is not None:
            broker.kill()
            time.sleep(2.0)
            broker.start()
            restarted = True
        pres = _result(job, 300)
        codes.append(pres["code"])
        tracebacks += int(pres["traceback"])
        try:
            summary = orjson.loads((pred / "predict.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            summary = None
        rec.update(predict_code=pres["code"], predict_last_stderr=pres["last_stderr"],
                   predict_rows=(summary or {}).get("rows"),
                   predict_resends_asked=(summary or {}).get("resends_asked"),
                   predict_auc=(summary or {}).get("test_auc"))
        lost = lost or (pres["code"] == 0 and not (summary or {}).get("rows"))
    completed = restarted and all(c == 0 for c in codes)
    rec.update(restarted=restarted, completed=completed, held=completed and not lost,
               tracebacks=tracebacks, silent_losses=int(bool(lost)),
               crashes=sum(_crash({"code": c}) for c in codes),
               wall_s=round(time.monotonic() - t0, 1))
    return rec


# ------------------------------------------------------------------ far-future epochs
async def _far_future(address: str, run_id: str, stop: threading.Event,
                      sent: dict[str, int]) -> None:
    """Capture one of the passive party's embeddings, then publish copies claiming epoch
    10^9 on channels 0-9 under its publisher id (plaintext: no identities)."""
    from pubsub import Bus

    async with Bus(address, name="replayer") as rep:
        seen = [f"emb/{run_id}/{b}" for b in range(16)]
        await rep.subscribe_many(seen)
        while not stop.is_set() and not sent["copies"]:
            for t in seen:
                m = rep.try_next(t)
                if m is not None and m.publisher.startswith("passive"):
                    own = rep.publisher_id
                    rep.publisher_id = m.publisher
                    for c in range(10):
                        rep.publish_nowait(f"emb/{run_id}/{c}", list(m.arrays),
                                           {**dict(m.meta), "e": FAR_EPOCH, "b": c})
                        sent["copies"] += 1
                    rep.publisher_id = own
                    break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)


def far_future_case(plain_broker: Any, root: Path, epochs: int,
                    launch: Callable[..., subprocess.Popen[str]]) -> dict[str, Any]:
    t0 = time.monotonic()
    out = root / "far-future"
    proc = launch(plain_broker, out, "farfuture", epochs, [])
    sent = {"copies": 0}
    stop = threading.Event()
    th = threading.Thread(target=lambda: asyncio.run(_far_future(
        plain_broker.address, "farfuture", stop, sent)))
    if _wait_text(out / "events.jsonl", '"event":"vfl.partner_found"', proc) is not None:
        th.start()
    res = _result(proc, 600)
    stop.set()
    if th.is_alive():
        th.join(30)
    m = _metrics(out)
    active = (m or {}).get("parties", {}).get("active", {})
    rejected = active.get("rejected_out_of_plan") or 0
    untrained = _untrained(m)
    unnamed = sum(v for u in untrained.values() for k, v in (u or {}).items()
                  if k in ("", "unknown"))
    held = res["code"] == 0 and sent["copies"] > 0 and rejected >= sent["copies"] \
        and not unnamed
    return {"held": held, "code": res["code"], "sent": sent["copies"],
            "rejected_out_of_plan": rejected, "untrained_batches": untrained,
            "dropped_batches": (m or {}).get("dropped_batches"),
            "test_auc": (m or {}).get("test_auc"), "tracebacks": int(res["traceback"]),
            "silent_losses": int(res["code"] == 0 and sent["copies"] > 0 and rejected == 0),
            "crashes": _crash(res), "wall_s": round(time.monotonic() - t0, 1)}


# --------------------------------------------------------------------------- PSI
def psi_off_curve_case(plain_broker: Any, root: Path) -> dict[str, Any]:
    """The honest party a real ``psfl vfl align`` process; the partner, in a thread of
    this process, puts a point off P-256 into its request chunk 1."""
    from parties.alignment.align import AlignConfig, align_over_bus
    from parties.alignment.psi import demo_ids
    from pubsub import Bus
    from sim.faults.psi_forge import forging

    t0 = time.monotonic()
    a, b = demo_ids(60, 0.5, seed=11)
    d = root / "psi-forged"
    d.mkdir(exist_ok=True)
    (d / "a.txt").write_text("".join(x + "\n" for x in a))
    cfg = AlignConfig(chunk_size=16, window=2, join_timeout_s=60, chunk_timeout_s=60)
    addr = plain_broker.address

    async def forger() -> None:
        await align_over_bus(b, role="passive", broker=addr, run_id="forged", config=cfg,
                             connect=forging(lambda name: Bus(addr, name=name), kind="req",
                                             chunk=1, point=7))

    th = threading.Thread(target=lambda: asyncio.run(_quiet(forger())), daemon=True)
    th.start()
    res = _run([*PSFL, "vfl", "align", "--role", "active", "--broker", addr, "--insecure",
                "--run-id", "forged", "--ids", str(d / "a.txt"), "--out", str(d / "out"),
                "--chunk-size", "16", "--timeout-s", "60"], 180)
    named = "malformed points" in res["stderr"] and "P-256" in res["stderr"]
    return {"held": res["code"] == 4 and named and not res["traceback"], "code": res["code"],
            "last_stderr": res["last_stderr"], "tracebacks": int(res["traceback"]),
            "silent_losses": int(res["code"] == 0), "crashes": _crash(res),
            "wall_s": round(time.monotonic() - t0, 1)}


async def _quiet(coro: Any) -> None:
    try:
        await coro
    except Exception:  # noqa: BLE001 - the forger's own end is not the finding
        pass


def psi_lopsided_case(plain_broker: Any, root: Path, big: int) -> dict[str, Any]:
    """``big`` IDs against 10, both sides real processes: the alignment completes."""
    t0 = time.monotonic()
    d = root / "psi-lopsided"
    d.mkdir(exist_ok=True)
    (d / "big.txt").write_text("".join(f"id{i}\n" for i in range(big)))
    (d / "small.txt").write_text("".join(f"id{i * 997}\n" for i in range(10)))
    limit = 60 + big * 2e-4 * 4  # ~80 CPU s per 10^6 on each side here, 4x slack
    addr = plain_broker.address
    common = ["--broker", addr, "--insecure", "--run-id", "lopsided", "--timeout-s",
              str(int(limit))]
    procs = [subprocess.Popen([*PSFL, "vfl", "align", "--role", role, *common, "--ids",
                               str(d / f), "--out", str(d / role)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env())
             for role, f in (("active", "small.txt"), ("passive", "big.txt"))]
    res = [_result(p, limit + 120) for p in procs]
    try:  # aligned-active.csv: a header, then one line per shared ID
        shared: int | None = len((d / "active" / "aligned-active.csv").read_text()
                                 .splitlines()) - 1
    except OSError:
        shared = None
    expected = sum(1 for i in range(10) if i * 997 < big)
    ok = all(r["code"] == 0 for r in res) and shared == expected
    return {"held": ok, "ids": [10, big], "codes": [r["code"] for r in res],
            "shared": shared, "expected_shared": expected, "limit_s": limit,
            "last_stderr": [r["last_stderr"] for r in res],
            "tracebacks": sum(int(r["traceback"]) for r in res), "silent_losses": 0,
            "crashes": sum(_crash(r) for r in res), "wall_s": round(time.monotonic() - t0, 1)}


# ----------------------------------------------------------------------- full disk
def namespace_skip_reason() -> str | None:
    """Why a tmpfs in a mount namespace cannot be set up here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root for a tmpfs in a mount namespace (unshare -m)"
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    p = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs "
                        "/mnt && umount /mnt"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"unshare -m / mount -t tmpfs failed: {p.stderr.strip()[:200]}"
    return None


#: run inside the namespace after the job: every file of the run directory, and whether
#: a result is whole (JSON parses, every JSON line parses, a CSV ends with a newline)
_CHECK = r"""
import json, os, sys
root = sys.argv[1]
out = []
for d, _, files in os.walk(root):
    for f in files:
        p = os.path.join(d, f)
        rec = {"path": os.path.relpath(p, root), "bytes": os.path.getsize(p)}
        data = open(p, "rb").read()
        ok = True
        try:
            if f.endswith(".json"):
                json.loads(data)
            elif f.endswith(".jsonl"):
                for line in data.splitlines():
                    json.loads(line)
                ok = not data or data.endswith(b"\n")
            elif f.endswith(".csv"):
                ok = data.endswith(b"\n")
        except ValueError:
            ok = False
        rec["whole"] = ok
        out.append(rec)
print("FILES " + json.dumps(out))
"""


def full_disk_case(kind: str, root: Path, size: str = "2m") -> dict[str, Any]:
    """A run whose output directory is a ``size`` tmpfs of its own (``unshare -m``)."""
    t0 = time.monotonic()
    mnt = root / f"disk-{kind}-{size}"
    mnt.mkdir(exist_ok=True)
    run = mnt / "run"
    if kind == "vfl":
        job = [*PSFL, "vfl", "run", "--dataset", "bank", "--set", "epochs=2", "--out", str(run)]
    else:
        job = [*PSFL, "synth", "run", "--dataset", "adult", "--parties", "4", "--epsilon",
               "1", "--engine", "neural", "--set", "engine.iters=40", "--out", str(run)]
    script = (f"mount -t tmpfs -o size={size} tmpfs {mnt} || exit 97; "
              + " ".join(_sh(a) for a in job) + "; rc=$?; "
              + f"{_sh(sys.executable)} -c {_sh(_CHECK)} {_sh(str(run))}; echo RC=$rc")
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                       timeout=900, env=_env())
    code = None
    files: list[dict[str, Any]] = []
    for line in p.stdout.splitlines():
        if line.startswith("RC="):
            code = int(line[3:])
        elif line.startswith("FILES "):
            files = json.loads(line[6:])
    err = p.stderr
    res = {"code": code, "traceback": "Traceback" in err + p.stdout,
           "last_stderr": (err.strip().splitlines() or [""])[-1][:300]}
    broken = [f["path"] for f in files if not f["whole"]]
    temps = [f["path"] for f in files if f["path"].rsplit("/", 1)[-1].endswith(".tmp")]
    results = {"vfl": "metrics.json", "synth": "metrics.json"}[kind]
    whole_result = any(f["path"] == results and f["whole"] for f in files)
    named = "No space left" in err or "ENOSPC" in err or "no space" in err.lower()
    typed = _typed(res) and named
    lost = bool(broken) or (code == 0 and not whole_result) or (code != 0 and not typed)
    return {"held": (typed or (code == 0 and whole_result)) and not broken,
            "code": code, "last_stderr": res["last_stderr"], "names_enospc": named,
            "files": len(files), "broken_files": broken, "temp_files_left": temps,
            "tracebacks": int(res["traceback"]), "silent_losses": int(lost),
            "crashes": _crash(res), "size": size, "wall_s": round(time.monotonic() - t0, 1)}


def _sh(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


# ------------------------------------------------------------------- absurd input
def absurd_case(root: Path, full: bool) -> dict[str, Any]:
    """Settings and shapes past what the machine holds: each refused (exit 2) before
    anything starts."""
    t0 = time.monotonic()
    d = root / "absurd"
    d.mkdir(exist_ok=True)
    wide = d / "wide.csv"
    cols = 100_000
    with wide.open("w") as f:
        f.write(",".join(f"c{i}" for i in range(cols)) + ",y\n")
        row = ",".join("0" for _ in range(cols))
        for i in range(200):
            f.write(f"{row},{i % 2}\n")
    long_line = d / "long.csv"
    n = (1_070 << 20) if full else (20 << 20)
    with long_line.open("w") as f:
        f.write("a,b,y\n1,2,0\n")
        f.write("1," + "9" * n + ",1\n")
        f.write("3,4,0\n")
    variants = {
        "embedding_dim_1e9": ["--dataset", "bank", "--set", "model.embedding_dim=1000000000"],
        "workers_passive_1e4": ["--dataset", "bank", "--set", "workers.passive=10000"],
        "csv_200x100000": ["--dataset", str(wide), "--set", "label=y"],
        f"csv_line_{n >> 20}MB": ["--dataset", str(long_line), "--set", "label=y"],
    }
    out: dict[str, Any] = {}
    for name, args in variants.items():
        res = _run([*PSFL, "vfl", "run", *args, "--out", str(d / name)], 300)
        out[name] = {"code": res["code"], "last_stderr": res["last_stderr"],
                     "wall_s": res["wall_s"], "typed": _typed(res),
                     "traceback": res["traceback"]}
    return {"held": all(v["typed"] and v["code"] == 2 for v in out.values()),
            "variants": out, "tracebacks": sum(int(v["traceback"]) for v in out.values()),
            "silent_losses": sum(int(v["code"] == 0) for v in out.values()),
            "crashes": sum(_crash(v) for v in out.values()),
            "wall_s": round(time.monotonic() - t0, 1)}


# ----------------------------------------------------------------- two runs, one dir
def two_runs_case(root: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    out = root / "shared-dir"
    a = subprocess.Popen([*PSFL, "vfl", "run", "--dataset", "bank", "--set", "epochs=3",
                          "--run-id", "run-a", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    started = _wait_text(out / "events.jsonl", '"event":"vfl.partner_found"', a) is not None
    b = _run([*PSFL, "vfl", "run", "--dataset", "bank", "--set", "epochs=3", "--run-id",
              "run-b", "--out", str(out)], 120)
    ra = _result(a, 600)
    m = _metrics(out)
    own = (m or {}).get("run_id") == "run-a"
    holder = f"pid {a.pid}" in b["stderr"]
    held = started and b["code"] == 2 and holder and ra["code"] == 0 and own
    return {"held": held, "second_code": b["code"], "second_wall_s": b["wall_s"],
            "second_last_stderr": b["last_stderr"], "names_holder": holder,
            "first_code": ra["code"], "first_result_is_its_own": own,
            "tracebacks": int(b["traceback"]) + int(ra["traceback"]),
            "silent_losses": int(ra["code"] == 0 and not own) + int(b["code"] == 0),
            "crashes": _crash(b) + _crash(ra), "wall_s": round(time.monotonic() - t0, 1)}


# ------------------------------------------------------------ non-member key, default
def non_member_case(root: Path, keys: Path, broker_cls: Any, epochs: int,
                    launch: Callable[..., subprocess.Popen[str]]) -> dict[str, Any]:
    """A default CURVE broker (no membership) refuses to start; a broker declaring run
    ``nm``'s members tells a non-member key so, and a client of that key that ignores it
    receives nothing of the run."""
    t0 = time.monotonic()
    refused = _run([sys.executable, "-m", "broker", "run", "--keys", str(keys), "--bind",
                    "tcp://127.0.0.1:0"], 60)
    says = all(o in refused["stderr"] for o in ("--job", "--members", "--run"))
    broker = broker_cls(root, keys, members=["--run", "nm=active,passive"])
    out = root / "non-member"
    proc = launch(broker, out, "nm", epochs, [])
    got = {"told": False, "received": 0, "error": ""}
    stop = threading.Event()

    async def eavesdrop() -> None:
        from pubsub import Bus
        from pubsub.errors import NotRunMember

        async with Bus(broker.address, name="m", security=broker.sec("mallory")) as honest:
            try:
                await honest.subscribe("grad/nm/0")
            except NotRunMember as exc:
                got["told"], got["error"] = True, str(exc)[:200]
        async with Bus(broker.address, name="m2", security=broker.sec("mallory")) as bus:
            assert bus.hello is not None
            bus.hello = dataclasses.replace(bus.hello, runs=None)  # ignores the hello
            topics = [f"grad/nm/{b}" for b in range(16)] + ["ctl/nm/done", "ctl/nm/scored",
                                                            "ctl/nm/hb/active"]
            await bus.subscribe_many(topics)
            await bus.subscribe_prefix("ctl/nm/")
            while not stop.is_set():
                for t in topics:
                    while bus.try_next(t) is not None:
                        got["received"] += 1
                await asyncio.sleep(0.05)

    th = threading.Thread(target=lambda: asyncio.run(eavesdrop()))
    th.start()
    res = _result(proc, 600)
    stop.set()
    th.join(30)
    broker.stop()
    held = (refused["code"] == 2 and says and got["told"] and got["received"] == 0
            and res["code"] == 0)
    return {"held": held, "default_broker_code": refused["code"],
            "default_broker_says": refused["last_stderr"], "told": got["told"],
            "told_error": got["error"], "messages_received": got["received"],
            "victim_code": res["code"],
            "tracebacks": int(refused["traceback"]) + int(res["traceback"]),
            "silent_losses": 0, "crashes": _crash(res),
            "wall_s": round(time.monotonic() - t0, 1)}


# ---------------------------------------------------------------- FedForge SIGKILL
def synth_kill_case(root: Path) -> dict[str, Any]:
    """``psfl synth run`` with K = 6 in processes of two; the process hosting p002 and
    p003 is SIGKILLed from outside once the first round starts (4 of 6 remain, S_min =
    3)."""
    t0 = time.monotonic()
    out = root / "synth-kill"
    out.mkdir(exist_ok=True)
    events = out / "events.jsonl"
    proc = subprocess.Popen(
        [*PSFL, "synth", "run", "--dataset", "adult", "--parties", "6", "--epsilon", "1",
         "--engine", "neural", "--set", "engine.iters=40", "--set",
         "launch.parties_per_process=2", "--set", "secagg.min_survivors=3", "--set",
         "secagg.fanout=8", "--set", "timeouts.round_timeout_s=2.0", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    killed = None
    if _wait_text(events, '"stage":"round:select"', proc) is not None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                argv = child.cmdline()
            except psutil.Error:
                continue
            if "--ids" in argv and "p002" in argv[argv.index("--ids") + 1] \
                    and "parties" in argv:
                os.kill(child.pid, signal.SIGKILL)
                killed = child.pid
                break
    res = _result(proc, 900)
    m = _metrics(out)
    deaths = (m or {}).get("party_deaths")
    held = killed is not None and res["code"] == 0 and bool(deaths)
    return {"held": held, "killed_pid": killed, "code": res["code"],
            "last_stderr": res["last_stderr"], "party_deaths": deaths,
            "tracebacks": int(res["traceback"]),
            "silent_losses": int(res["code"] == 0 and m is None),
            "crashes": _crash(res), "wall_s": round(time.monotonic() - t0, 1)}


__all__ = ["RESTART_PHASES", "absurd_case", "far_future_case", "full_disk_case",
           "namespace_skip_reason", "non_member_case", "psi_lopsided_case",
           "psi_off_curve_case", "restart_case", "synth_kill_case", "two_runs_case"]
