"""The two-host scenario of ``bench/cross_org.py``: a bank and its partner, each on its own
host (a network namespace of :mod:`sim.launch.hosts`, its own address and directory;
plain processes on this machine's loopback where namespaces cannot be made), running the
commands of ``docs/tutorials/bank-and-partner.md``: the partner drafts its public schema
from its own file, both parties align their files on ``customer_id`` (PSI), train, and
predict for a file of new customers; without DP, then with the partner's records at µ =
8 (five noise seeds; at 20,000 customers one, three without --quick). The reference: the
same settings on the merged table neither organisation holds (``reference/merged.csv``,
the shared customers sorted by ID: the rows and split the aligned files give), one
process per party on this machine.

Not a benchmark of its own: ``bench/cross_org.py`` imports :func:`two_host_figures`.
"""

from __future__ import annotations

import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from parties.data.bank_partner import BANK_COLUMNS, PARTNER_COLUMNS  # noqa: E402
from sim.launch.hosts import NamespaceHosts, namespaces_unavailable  # noqa: E402

#: the hosts' addresses (a private subnet inside the namespaces)
ADDRESSES = {"broker": "10.77.0.1", "partner": "10.77.0.2", "bank": "10.77.0.3"}
PORT = 5555
#: the run's settings (as the tutorial's job file; more epochs without DP)
SETTINGS = {"label": "responded", "positive_class": "yes", "batch_size": 64}
EPOCHS_PLAIN, EPOCHS_DP, MU = 8, 2, 8.0
COMMAND_TIMEOUT_S = 300.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _psfl(*args: str) -> list[str]:
    return [sys.executable, "-P", "-m", "sim.cli", *args]


class _Hosts:
    """Run a command on a host: in its namespace (``NamespaceHosts``) or, without
    namespaces, as a plain process in the host's directory."""

    def __init__(self, work: Path, ns: NamespaceHosts | None) -> None:
        self.work, self.ns = work, ns

    def argv(self, host: str, argv: list[str]) -> tuple[list[str], Path]:
        if self.ns is not None:
            return self.ns.argv(host, argv), self.work
        return argv, self.work / host

    def start(self, host: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        cmd, cwd = self.argv(host, argv)
        with log.open("wb") as f:
            return subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def run(self, host: str, argv: list[str], log: Path) -> None:
        p = self.start(host, argv, log)
        _wait(p, f"{host}: {shlex.join(argv)}", log)


def _wait(p: subprocess.Popen[bytes], what: str, log: Path) -> None:
    try:
        code = p.wait(COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop(p)
        raise RuntimeError(f"{what}: ran past {COMMAND_TIMEOUT_S:.0f} s") from None
    if code != 0:
        raise RuntimeError(f"{what}: exit {code}\n{log.read_text(errors='replace')[-2000:]}")


def _stop(p: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
            p.wait(10)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _job(path: Path, broker: str, run_id: str, *, epochs: int, dp: bool) -> None:
    lines = ["[job]", f'run_id = "{run_id}"', f'broker = "{broker}"',
             'join_key = "customer_id"', 'organisations = ["bank", "partner"]', "", "[vfl]",
             *(f"{k} = {orjson.dumps(v).decode()}" for k, v in SETTINGS.items()),
             f"epochs = {epochs}"]
    if dp:
        lines += ["", "[vfl.dp]", f"mu = {MU}"]
    path.write_text("\n".join(lines) + "\n")


def _session(hosts: _Hosts, work: Path, broker: str, tag: str, *, dp: bool, noise_seed: int,
             predict: bool) -> dict[str, Any]:
    """One training (and prediction) of both hosts through a fresh broker."""
    keys = ["--keys", "keys"]
    for org in ("bank", "partner"):
        _job(work / org / f"job-{tag}.toml", broker, f"bp-{tag}",
             epochs=EPOCHS_DP if dp else EPOCHS_PLAIN, dp=dp)
    logs = work / "logs"
    bind = "tcp://0.0.0.0:5555" if hosts.ns is not None else broker
    ready = work / "broker" / f"ready-{tag}"
    ready.unlink(missing_ok=True)
    b = hosts.start("broker", _psfl("broker", "run", "--bind", bind, *keys, "--ready-file",
                                    ready.name), logs / f"broker-{tag}.log")
    out: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text().strip()):
            if b.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"broker did not start: {(logs / f'broker-{tag}.log').read_text()}")
            time.sleep(0.05)
        sets = ["--set", f"dp.noise_seed={noise_seed}"] if dp else []
        partner_sets = [*sets, "--set", "dp.schema=partner-schema.toml"] if dp else []
        t0 = time.perf_counter()
        runs = {org: hosts.start(org, _psfl(
            "vfl", "party", "--job", f"job-{tag}.toml", "--role", role, "--data", f"{org}.csv",
            *keys, "--out", f"run-{tag}", "--quiet", *(partner_sets if org == "partner" else sets)),
            logs / f"{org}-{tag}.log") for org, role in (("partner", "passive"), ("bank", "active"))}
        for org, p in runs.items():
            _wait(p, f"{org} training ({tag})", logs / f"{org}-{tag}.log")
        out["train_wall_s"] = time.perf_counter() - t0
        if predict:
            t0 = time.perf_counter()
            preds = {org: hosts.start(org, _psfl(
                "vfl", "predict", f"run-{tag}", "--job", f"job-{tag}.toml", "--role", role,
                "--data", f"{org}-new.csv", *keys, "--out", f"pred-{tag}", "--quiet"),
                logs / f"{org}-pred-{tag}.log")
                for org, role in (("partner", "passive"), ("bank", "active"))}
            for org, p in preds.items():
                _wait(p, f"{org} prediction ({tag})", logs / f"{org}-pred-{tag}.log")
            out["predict_wall_s"] = time.perf_counter() - t0
            out["predict"] = orjson.loads((work / "bank" / f"pred-{tag}" / "predict.json")
                                          .read_bytes())
    finally:
        _stop(b)
    out["metrics"] = orjson.loads((work / "bank" / f"run-{tag}" / "metrics.json").read_bytes())
    out["align"] = orjson.loads((work / "bank" / f"run-{tag}" / "align" / "align-active.json")
                                .read_bytes())
    return out


def _merged(work: Path) -> dict[str, Any]:
    """The same settings on the merged table, broker and parties as processes here."""
    ref = work / "reference"
    args = ["vfl", "run", "--dataset", str(ref / "merged.csv"), "--out", str(ref / "run"),
            "--set", "data.join_key=customer_id", "--set", f"epochs={EPOCHS_PLAIN}",
            "--set", f"data.active_columns={orjson.dumps(list(BANK_COLUMNS)).decode()}",
            "--set", f"data.passive_columns={orjson.dumps(list(PARTNER_COLUMNS)).decode()}"]
    for k, v in SETTINGS.items():
        args += ["--set", f"{k}={v}"]
    res = subprocess.run(_psfl(*args), cwd=work, env=_env(), capture_output=True, text=True,
                         timeout=COMMAND_TIMEOUT_S)
    if res.returncode != 0:
        raise RuntimeError(f"merged run: exit {res.returncode}\n{res.stderr[-2000:]}")
    return orjson.loads((ref / "run" / "metrics.json").read_bytes())


def _dropped(work: Path, tag: str) -> list[str]:
    """The partner's columns its DP encoding left out (its file's columns but the key,
    against the columns its data load used), from its own events."""
    used: set[str] = set()
    dropped: list[str] = []
    for line in (work / "partner" / f"run-{tag}" / "events.jsonl").read_bytes().splitlines():
        ev = orjson.loads(line)
        if ev.get("event") == "vfl.data_loaded":
            dropped += list(ev.get("dropped") or [])
            used.add(ev.get("dataset", ""))
    manifest = orjson.loads((work / "partner" / f"run-{tag}" / "model" / "passive" /
                             "manifest.json").read_bytes())
    kept = set(manifest.get("columns", []))
    return sorted(set(dropped) | {c for c in PARTNER_COLUMNS if c not in kept})


def _scenario(work: Path, customers: int, *, plain: bool, dp_repeats: int
              ) -> dict[str, Any]:
    """One scenario size in ``work``: files, keys, the partner's schema, then the runs
    (without DP with a prediction, if ``plain``; ``dp_repeats`` with DP, the first
    predicting too)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    setup = subprocess.run(_psfl("data", "bank-partner", "--out", str(work), "--customers",
                                 str(customers), "--new-customers", str(customers // 5)),
                           env=_env(), capture_output=True, text=True, timeout=120)
    if setup.returncode != 0:
        raise RuntimeError(setup.stderr)
    subprocess.run(_psfl("keys", "generate", "broker", "active", "passive", "--dir",
                         str(work / "keys")), env=_env(), check=True, capture_output=True,
                   timeout=60)
    k = work / "keys"
    for host, names in (("broker", ["broker.key_secret", "broker.key", "active.key",
                                    "passive.key"]),
                        ("bank", ["broker.key", "active.key_secret"]),
                        ("partner", ["broker.key", "passive.key_secret"])):
        (work / host / "keys").mkdir(parents=True, exist_ok=True)
        for n in names:
            dst = work / host / "keys" / n
            dst.write_bytes((k / n).read_bytes())
            dst.chmod((k / n).stat().st_mode & 0o777)
    why = namespaces_unavailable()
    ns = NamespaceHosts(work, ADDRESSES) if why is None else None
    if ns is not None:
        ns.__enter__()
        broker = f"tcp://{ADDRESSES['broker']}:{PORT}"
    else:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            broker = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    out: dict[str, Any] = {"netns": ns is not None, "namespaces": why or "used"}
    try:
        hosts = _Hosts(work, ns)
        _job(work / "partner" / "job-schema.toml", broker, "bp-schema", epochs=1, dp=False)
        t0 = time.perf_counter()
        hosts.run("partner", _psfl("vfl", "schema", "--job", "job-schema.toml", "--role",
                                   "passive", "--data", "partner.csv", "--out",
                                   "partner-schema.toml", "--force"),
                  work / "logs" / "schema.log")
        out["schema_s"] = time.perf_counter() - t0
        if plain:
            out["plain"] = _session(hosts, work, broker, "plain", dp=False, noise_seed=0,
                                    predict=True)
        out["dp"] = [_session(hosts, work, broker, f"dp{r}", dp=True, noise_seed=r,
                              predict=(r == 0)) for r in range(dp_repeats)]
    finally:
        if ns is not None:
            ns.close()
    return out


def _baseline(metrics: dict[str, Any]) -> dict[str, Any]:
    """The run's active-only baseline: the model chosen by validation AUC and each
    candidate's test AUC."""
    base = metrics.get("active_only") or {}
    return {"model": base.get("model"), "test_auc": base.get("test_metric"),
            "candidates_test_auc": {n: c.get("test_metric")
                                    for n, c in (base.get("candidates") or {}).items()}}


def two_host_figures(work: Path, quick: bool, *, customers: int = 5000,
                     large_customers: int = 20000) -> dict[str, Any]:
    """The scenario's figures (``summary``): ``two_hosts_netns``, ``auc_two_hosts``,
    ``auc_merged``, ``auc_dp_two_hosts`` (median over five noise seeds),
    ``auc_active_only`` (the run's own active-only baseline: the bank's columns alone, the
    stronger by validation AUC of gradient boosting and an MLP, the same split),
    ``dp_columns_dropped``; ``auc_dp_two_hosts_large`` and ``auc_active_only_large`` the
    same with ``large_customers`` per side (1 noise seed quick, 3 otherwise); and
    ``details``."""
    work = Path(work).resolve()
    small = _scenario(work / f"c{customers}", customers, plain=True, dp_repeats=5)
    large = _scenario(work / f"c{large_customers}", large_customers, plain=False,
                      dp_repeats=1 if quick else 3)
    merged = _merged(work / f"c{customers}")
    plain, dps = small["plain"], small["dp"]
    dp_aucs = [d["metrics"]["test_auc"] for d in dps]
    large_aucs = [d["metrics"]["test_auc"] for d in large["dp"]]
    base, base_large = _baseline(dps[0]["metrics"]), _baseline(large["dp"][0]["metrics"])
    summary = {
        "two_hosts_netns": small["netns"] and large["netns"],
        "auc_two_hosts": plain["metrics"]["test_auc"],
        "auc_merged": merged["test_auc"],
        "auc_dp_two_hosts": statistics.median(dp_aucs),
        "auc_active_only": base["test_auc"],
        "dp_columns_dropped": _dropped(work / f"c{customers}", "dp0"),
        "auc_dp_two_hosts_large": statistics.median(large_aucs),
        "auc_active_only_large": base_large["test_auc"],
    }
    details: dict[str, Any] = {
        "customers": customers, "large_customers": large_customers,
        "namespaces": small["namespaces"], "epochs_plain": EPOCHS_PLAIN,
        "epochs_dp": EPOCHS_DP, "settings": SETTINGS, "mu": MU,
        "auc_two_hosts_minus_merged": summary["auc_two_hosts"] - summary["auc_merged"],
        "auc_dp_two_hosts_repeats": dp_aucs,
        "auc_dp_two_hosts_large_repeats": large_aucs,
        "auc_dp_minus_active_only": summary["auc_dp_two_hosts"] - (base["test_auc"] or 0.0),
        "auc_dp_minus_active_only_large": summary["auc_dp_two_hosts_large"]
        - (base_large["test_auc"] or 0.0),
        "active_only": base, "active_only_large": base_large,
        "aligned": {k: plain["align"][k] for k in ("n_own", "n_partner", "n_shared")},
        "predict_plain": {k: plain["predict"].get(k) for k in ("rows", "metric_name", "metric")},
        "predict_dp": {k: dps[0]["predict"].get(k) for k in ("rows", "metric_name", "metric")},
        "predict_dp_report": dps[0]["predict"].get("dp"),
        "dp": {k: dps[0]["metrics"]["dp"].get(k) for k in ("mu", "epsilon", "delta",
                                                          "noise_multiplier")},
        "security": plain["metrics"].get("security", {}).get("transport"),
        "schema_s": small["schema_s"],
        "wall_s": {"plain_train": plain["train_wall_s"],
                   "dp_train": [d["train_wall_s"] for d in dps],
                   "dp_train_large": [d["train_wall_s"] for d in large["dp"]]},
    }
    return {"summary": summary, "details": details}


if __name__ == "__main__":  # python bench/cross_org_hosts.py WORK_DIR
    import json

    res = two_host_figures(Path(sys.argv[1]), quick=True)
    print(json.dumps(res, indent=1, default=str))
