"""The ``psfl`` command: one console script with subcommands.

``psfl demo`` · ``psfl vfl run|predict|party|profile|plan|align|schema`` · ``psfl synth run|add-workload`` · ``psfl broker run|stats``
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pubsub.cli import add_security_arguments

DEFAULT_DEMO_OUT = "runs/demo"


def _launch(run: Callable[[], Any], *, what: str,
            bad_input: tuple[type[BaseException], ...] = ()) -> tuple[Any, int | None]:
    """Run a launcher call; ``(result, None)``, or ``(None, exit code)`` after one
    ``error: ...`` line for the launcher's expected failures (a child's exit code, a bad
    run directory or input, the job timeout, SIGTERM)."""
    from parties.cli import ExitCode, exit_code_for

    from sim.launch.vfl import JobTimeout, LaunchError, OutDirError, _Terminated, exit_code_of

    try:
        return run(), None
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, exit_code_of(exc)
    except (OutDirError, *bad_input) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, ExitCode.BAD_INPUT
    except JobTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, ExitCode.TIMEOUT
    except _Terminated:
        print(f"terminated: stopped {what}", file=sys.stderr)
        return None, 143
    except Exception as exc:
        code = exit_code_for(exc)  # bad data found by the launcher's preflight, ...
        if code is None:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return None, code


def _check_before_launch(cfg: Any) -> int | None:
    """The data checks that need no training (:func:`parties.data.launchcheck.check_before_launch`),
    before the start line and any process; None, or the exit code after one ``error:``
    line. Imports neither pandas nor torch on the way to a refusal."""
    from parties.data.launchcheck import check_before_launch

    return _refused(lambda: check_before_launch(cfg))


def _check_tables_before_launch(paths: list[str]) -> int | None:
    """``psfl synth run``: each CSV file among ``paths`` within the bounds on its lines
    and columns (:func:`parties.data.limits.check_csv_shape`, their defaults) before the
    start line and any process; None, or the exit code after one ``error:`` line."""
    from parties.data.limits import check_csv_shape

    def check() -> None:
        for path in paths:
            p = Path(path).expanduser()
            if p.name.lower().endswith((".csv", ".csv.gz")) and p.is_file():
                check_csv_shape(p)

    return _refused(check)


def _refused(check: Any) -> int | None:
    """Run ``check()``; None, or the exit code of the typed error it raised after one
    ``error:`` line (anything else propagates)."""
    from parties.runtime.exitcodes import exit_code_for

    try:
        check()
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return code
    return None


def _vfl_run(args: argparse.Namespace) -> int:
    # configuration and data checks first, before the heavy imports (torch) and the start
    # line: a bad value is refused in about a second
    from parties.config import check_run_id, load_vfl_config

    extra = {}
    if getattr(args, "dataset", None):
        extra["dataset"] = args.dataset
    if getattr(args, "algo", None):
        extra["algo"] = args.algo
    if getattr(args, "model", None):
        extra["model"] = {"bottom": args.model}
    cfg = load_vfl_config(args.config, args.set, extra)  # ConfigError: run_guarded, exit 2
    if args.run_id:
        check_run_id(args.run_id)
    from pubsub.outputs import RunDirLock

    # the run directory is this run's from here (RunDirBusy: another run holds it, exit 2
    # at once; the launcher and its parties find the hold and take nothing more)
    with RunDirLock(args.out, run_id=args.run_id, command="psfl vfl run"):
        return _vfl_run_locked(args, cfg)


def _vfl_run_locked(args: argparse.Namespace, cfg: Any) -> int:
    code = _check_before_launch(cfg)
    if code is not None:
        return code
    from parties.runtime.report import format_metric

    from sim.launch.vfl import run_vfl

    plan = None
    if getattr(args, "plan_pilots", False) and getattr(args, "plan", None) != "auto":
        from parties.cli import ExitCode

        print("error: --plan-pilots needs --plan auto (a plan.json was planned already)",
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    if getattr(args, "plan", None):
        cfg, plan, code = _vfl_run_plan(args, cfg)
        if code is not None:
            return code
    name = "PubSub-VFL" if cfg.algo == "pubsub" else f"VFL baseline {cfg.algo}"
    data = (", ".join(cfg.data.party_datasets) if cfg.data.party_datasets else cfg.dataset) + (
        ", streamed" if cfg.data.stream else "")
    print(f"{name}: {data} ({cfg.effective_task}), "
          f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}, B={cfg.batch_size}, "
          f"workers {'+'.join(str(cfg.workers_for(p)) for p in cfg.party_ids)}, "
          f"out {args.out}",
          flush=True)
    if getattr(args, "transport", "broker") == "memory":  # (a party process says it itself)
        from parties.privacy.labels import labels_line

        print(labels_line(cfg.labels, cfg.effective_task),
              file=sys.stderr if not cfg.labels.protected else sys.stdout, flush=True)
        from pubsub.config import ConfigError

        from sim.launch.local import run_vfl_in_process

        given = [o for o, v in (("--broker", args.broker), ("--keys", args.keys)) if v]
        if given:
            raise ConfigError("transport", f"{given[0]} needs --transport broker (the "
                              "memory transport has no broker and no keys)")
        res, code = _launch(lambda: run_vfl_in_process(cfg, args.out, run_id=args.run_id,
                                                       timeout_s=args.timeout_s, quiet=False),
                            what="both parties")
    else:
        res, code = _launch(lambda: run_vfl(cfg, args.out, broker=args.broker,
                                            run_id=args.run_id, timeout_s=args.timeout_s,
                                            keys_dir=args.keys, insecure=args.insecure),
                            what="the broker and both parties")
    if code is not None:
        return code
    if plan is not None:
        _record_plan(res, plan)
    m = res.metrics
    pa = m["parties"]["active"]
    pp = m["parties"].get("passive", {})
    print(f"test_{m['metric_name']} {format_metric(m['metric'])}  "
          f"job {m['wall_s']:.1f} s (launch to exit), training {m['train_window_s']:.1f} s, "
          f"{m['train_samples_per_s']:,.0f} samples/s of training"
          + (f" (positive class {m['label_positive']!r})" if m.get("label_positive") else ""))
    from parties.data.treatments import treatment_summary

    for party, pm in m["parties"].items():  # dates split, hashed and dropped columns
        said = treatment_summary(pm.get("treatments", []))
        if said:
            print(f"columns {party}: {said}")
    if any(t.get("treatment") == "dropped" for pm in m["parties"].values()
           for t in pm.get("treatments", [])):
        print("(ID-like columns: vfl.data.id_columns drops, refuses or keeps them)")
    if m.get("target_metric") is not None:
        ttt = m.get("time_to_target_s")
        print(f"time to validation {m['metric_name']} {m['target_metric']:g}: "
              + (f"{ttt:.2f} s of training" if ttt is not None else "not reached"))
    others = [p for p in m["parties"] if p not in ("active", "passive")]
    utils = " ".join(f"{p} {m['parties'][p].get('cpu_util', float('nan')):.2f}"
                     for p in others)
    print(f"cpu_util active {pa['cpu_util']:.2f} passive {pp.get('cpu_util', float('nan')):.2f}"
          f"{' ' + utils if utils else ''}  broker bytes emb {m['broker_bytes']['emb']:,} "
          f"grad {m['broker_bytes']['grad']:,}  dropped {m['dropped_batches']}")
    dp = m.get("dp") or {}
    lab = dp.get("labels")
    if isinstance(lab, dict) and lab.get("epsilon") is not None:
        print(f"labels: label DP epsilon {format_metric(lab['epsilon'])} (delta 0), "
              f"flip probability {lab['flip_probability']:.4f}")
    if dp.get("enabled"):
        target = "" if dp.get("target_mu") is None else f" (target {dp['target_mu']:g})"
        print(f"dp: spent mu {format_metric(dp.get('mu'))}{target}, epsilon "
              f"{format_metric(dp.get('epsilon'))} at delta {dp['delta']:g}; noise multiplier "
              f"{dp['noise_multiplier']:.4g}, clip {dp['clip_norm']:g}, max "
              f"{dp.get('publications_max')} publications per record")
    _print_active_only(m)
    print(f"metrics: {res.out / 'metrics.json'}")
    return 0


def _print_active_only(m: dict[str, Any]) -> None:
    """The active-only baseline line of ``psfl vfl run`` and, for a DP run that ended
    below it, one warning line on stderr (:func:`parties.algorithms.baseline.below_baseline_warning`)."""
    from parties.algorithms.baseline import below_baseline_warning

    base = m.get("active_only") or {}
    if isinstance(base.get("test_metric"), float) and isinstance(m.get("metric"), float):
        print(f"active-only baseline (the active party's columns alone, {base['model']}, "
              f"same split): test_auc {base['test_metric']:.4f}; this run "
              f"{m['metric'] - base['test_metric']:+.4f}")
    warning = below_baseline_warning(m)
    if warning:
        print(warning, file=sys.stderr)


def _vfl_profile(args: argparse.Namespace) -> int:
    """``psfl vfl profile``: single-worker compute profile and throughput ceiling."""
    from pathlib import Path

    from parties.cli import ExitCode, exit_code_for, write_json
    from parties.config import load_vfl_config

    extra = {"dataset": args.dataset} if args.dataset else {}
    cfg = load_vfl_config(args.config, args.set, extra)  # ConfigError: exit 2
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: cannot use {str(out)!r} as the output directory: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    from parties.planning.profile import ProfileError, profile_config
    from pubsub.logs import configure_logging

    configure_logging(events_path=out / "events.jsonl", role="profile")
    try:
        prof = profile_config(cfg, layout=args.layout, min_time_s=args.min_time_s)
    except (ProfileError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except Exception as exc:
        code = exit_code_for(exc)  # bad data
        if code is None:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return code
    doc = prof.to_dict()
    write_json(out / "profile.json", doc)
    for p in (*prof.parties[1:], prof.active):
        print(f"{p.party_id:<8} d_in {p.n_features:>5}  cpus {list(p.cpus)}  "
              f"{p.cpu_s_per_sample * 1e6:8.2f} us/sample CPU ({p.wall_s_per_sample * 1e6:.2f} "
              f"wall)  {p.steps} steps of B={p.batch_size}  -> {p.samples_per_s:,.0f} samples/s")
    print(f"ceiling {prof.ceiling_samples_per_s:,.0f} samples/s (bound by {prof.bound_by}, "
          f"CPU time, layout {prof.settings['layout']}); profile: {out / 'profile.json'}")
    if getattr(args, "sweep", False):
        return _vfl_profile_sweep(args, cfg, out, doc)
    return 0


def _sim_run(args: argparse.Namespace) -> int:
    """``psfl sim run SCENARIO.toml --out RUN_DIR``: a VFL run on a simulated
    heterogeneous cluster (CPU shares, links, faults; see :mod:`sim.cluster.runner`)."""
    from parties.config import VflConfig
    from pubsub.config import from_mapping

    from pubsub.logs import configure_logging

    from sim.cluster.runner import ScenarioError, format_summary, run_scenario
    from sim.cluster.scenario import load_scenario

    configure_logging(party="sim")  # warnings on stderr; the run's events go to events.jsonl
    from sim.cluster.consortium import scenario_kind

    if scenario_kind(args.scenario) == "consortium":  # ConfigError: exit 2
        return _sim_run_consortium(args)
    if args.compare_online:
        print("error: --compare-online needs a [consortium] scenario", file=sys.stderr)
        return 2
    scn, table = load_scenario(args.scenario, args.set)  # ConfigError: exit 2
    cfg = from_mapping(VflConfig, table, section="vfl")
    print(f"scenario {scn.name}: {cfg.algo} on {cfg.dataset}, out {args.out}", flush=True)
    res, code = _launch(lambda: run_scenario(scn, cfg, args.out, quiet=args.quiet,
                                             insecure=args.insecure),
                        what="the scenario's broker, relays and parties",
                        bad_input=(ScenarioError,))
    if code is not None:
        return code
    print(format_summary(res))
    print(f"metrics: {args.out}/metrics.json")
    s = res["sim"]
    if s["end_state"] == "completed":
        return 0
    if s["end_state"] == "failed":
        if any(f["kind"] == "kill" for f in s["faults"]):
            return 0  # the scheduled kill ended the run, with a clear error in time
        return int(s.get("failure", {}).get("code") or 1)
    return 1  # hung or timeout


def _sim_run_consortium(args: argparse.Namespace) -> int:
    """``psfl sim run`` of a ``[consortium]`` scenario: FedForge over sites of unequal
    size, shaped links, an offline window, a workload update (:mod:`sim.cluster.consortium_run`)."""
    from sim.cluster.consortium import load_consortium
    from sim.cluster.consortium_run import build_config, format_summary, run_consortium
    from sim.cluster.runner import ScenarioError
    from synth.domain import DomainError

    cons, table = load_consortium(args.scenario, args.set)  # ConfigError: exit 2
    cfg = build_config(cons, table)  # ConfigError: exit 2
    print(f"consortium {cons.name}: {len(cons.parties)} sites, FedForge {cfg.mechanism} on "
          f"{cfg.dataset}, {cons.hours:g} h at {cons.seconds_per_hour:g} s/h, out {args.out}"
          + (" (first with every site online, into OUT/online)" if args.compare_online
             else ""), flush=True)
    res, code = _launch(lambda: run_consortium(cons, table, args.out, quiet=args.quiet,
                                               insecure=args.insecure,
                                               compare_online=args.compare_online),
                        what="the scenario's broker, relays and FedForge processes",
                        bad_input=(ScenarioError, DomainError))
    if code is not None:
        return code
    print(format_summary(res))
    print(f"metrics: {args.out}/metrics.json; report: {args.out}/report.md")
    return 0


def _vfl_profile_sweep(args: argparse.Namespace, cfg: Any, out: Any, doc: dict[str, Any]
                       ) -> int:
    """``psfl vfl profile --sweep``: the batch-size sweep, the bus probe and the cost-model
    fits, added to ``profile.json`` (keys ``sweep`` and ``cost_model``)."""
    from parties.cli import ExitCode, write_json
    from parties.planning.sweep import (DEFAULT_SWEEP_BATCH_SIZES, QUICK_SWEEP_BATCH_SIZES,
                               format_fits, parse_batch_sizes)

    from sim.launch.sysprofile import _config_mapping, sweep_profile

    def run() -> Any:
        if args.batch_sizes:
            bs = parse_batch_sizes(args.batch_sizes)
        else:
            bs = QUICK_SWEEP_BATCH_SIZES if args.quick else DEFAULT_SWEEP_BATCH_SIZES
        print(f"sweep: B in {list(bs)}, {args.sweep_min_time_s:g} CPU s per B and party",
              flush=True)
        return sweep_profile(cfg, out, batch_sizes=bs, min_time_s=args.sweep_min_time_s,
                             broker=args.broker)

    res, code = _profile_call(run)
    if code is not None:
        return code
    extra, models = res
    doc.update(extra)
    doc["settings"]["config"] = _config_mapping(cfg)
    write_json(out / "profile.json", doc)
    for line in format_fits(models):
        print(line)
    print(f"cost model ({len(models.batch_sizes)} batch sizes, N = {models.n_train} rows): "
          f"{out / 'profile.json'}")
    return ExitCode.OK


def _profile_call(run: Callable[[], Any]) -> tuple[Any, int | None]:
    """Run a sweep/plan step; ``(result, None)`` or ``(None, exit code)`` after one
    ``error: ...`` line (bad input 2, no broker 3)."""
    from parties.cli import ExitCode, exit_code_for
    from parties.planning.commprobe import CommProbeError
    from parties.planning.profile import ProfileError

    from sim.launch.vfl import LaunchError, exit_code_of

    try:
        return run(), None
    except CommProbeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, ExitCode.BROKER_UNREACHABLE
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None, exit_code_of(exc)
    except (ProfileError, ValueError, KeyError, OSError) as exc:
        code = exit_code_for(exc)
        print(f"error: {exc}", file=sys.stderr)
        return None, ExitCode.BAD_INPUT if code is None else code
    except Exception as exc:
        code = exit_code_for(exc)  # bad data, broker unreachable
        if code is None:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return None, code


def _vfl_plan(args: argparse.Namespace) -> int:
    """``psfl vfl plan``: the planner on a profile's fitted cost models; writes
    OUT/plan.json."""
    import json
    from pathlib import Path

    from parties.cli import ExitCode, write_json
    from parties.planning.planner import batch_grid
    from parties.planning.sweep import CostModels, parse_batch_sizes

    from sim.launch.sysprofile import (format_plan, load_plan_config, load_samples_model, plan_doc,
                                plan_from_models)

    from pubsub.logs import configure_logging

    configure_logging(role="plan")  # events at warning and above on stderr
    profile = Path(args.profile)

    def run() -> Any:
        try:
            doc = json.loads(profile.read_text())
        except OSError as exc:
            raise OSError(f"cannot read the profile {str(profile)!r}: "
                          f"{exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"{str(profile)!r} is not JSON: {exc}") from None
        if not isinstance(doc, dict) or "cost_model" not in doc:
            raise ValueError(f"{str(profile)!r} has no cost_model: run psfl vfl profile "
                             "--sweep")
        try:
            models = CostModels.from_dict(doc["cost_model"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{str(profile)!r}: malformed cost_model ({exc!r})") from None
        base = (doc.get("settings") or {}).get("config")
        cfg = load_plan_config(base, args.config, args.set)
        bs = parse_batch_sizes(args.batch_sizes) if args.batch_sizes else batch_grid(16, 1024)
        limit = None if args.mem_limit_mb is None else args.mem_limit_mb * 2**20
        samples = None
        if args.samples_model:
            samples = load_samples_model(args.samples_model)
        plan, inputs = plan_from_models(models, cfg, w_max=args.w_max, batch_sizes=bs,
                                        mem_limit_bytes=limit, memory_rule=args.memory_rule,
                                        samples=samples)
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"cannot use {str(out)!r} as the output directory: "
                          f"{exc.strerror or exc}") from None
        write_json(out / "plan.json", plan_doc(plan, inputs, profile))
        return plan, inputs, out

    res, code = _profile_call(run)
    if code is not None:
        return code
    plan, inputs, out = res
    for line in format_plan(plan):
        print(line)
    if inputs["extrapolated_batch_sizes"]:
        print(f"note: B {inputs['extrapolated_batch_sizes']} lie outside the profiled range "
              "(the fits extrapolate)")
    print(f"plan: {out / 'plan.json'}")
    return ExitCode.OK


def _vfl_run_plan(args: argparse.Namespace, cfg: Any) -> tuple[Any, dict[str, Any] | None,
                                                               int | None]:
    """``psfl vfl run --plan auto|PLAN.json``: the config with the planned w_active,
    w_passive and batch_size, and the plan document (for metrics.json)."""
    import json
    from pathlib import Path

    from sim.launch.sysprofile import apply_plan, auto_plan

    def run() -> Any:
        if args.plan == "auto":
            from pubsub.logs import configure_logging

            where = Path(args.out) / "plan"
            where.mkdir(parents=True, exist_ok=True)
            configure_logging(events_path=where / "events.jsonl", role="plan")
            print(f"planning: profiling every party and the bus (files in {where}) ...",
                  flush=True)
            pilot = getattr(args, "plan_pilots", False)
            if pilot:
                print("planning for time to target: four pilot runs in this process "
                      "measure the samples-to-target model ...", flush=True)
            new, pdoc = auto_plan(cfg, where, broker=args.broker,
                                  samples="pilot" if pilot else None)
        else:
            try:
                pdoc = json.loads(Path(args.plan).read_text())
            except OSError as exc:
                raise OSError(f"cannot read the plan {args.plan!r}: "
                              f"{exc.strerror or exc}") from None
            new = apply_plan(cfg, pdoc)
            pdoc = {**pdoc, "plan_file": args.plan}
        return new, pdoc

    res, code = _profile_call(run)
    if code is not None:
        return cfg, None, code
    new, pdoc = res
    print("\n".join(format_plan_doc(pdoc)), flush=True)
    return new, pdoc, None


def format_plan_doc(pdoc: dict[str, Any]) -> list[str]:
    """One line about a plan document (``plan.json``)."""
    per_party = pdoc.get("passive_party_workers") or []
    workers = (f"passive_party_workers {list(per_party)}" if len(per_party) > 1
               else f"w_passive {pdoc['w_passive']}")
    return [f"plan: w_active {pdoc['w_active']}, {workers}, "
            f"B {pdoc['batch_size']}: predicted epoch {pdoc['epoch_s']:.3f} s "
            f"(profile {pdoc.get('profile')})"]


def _record_plan(res: Any, pdoc: dict[str, Any]) -> None:
    """Add the plan to the run's metrics.json (``metrics["plan"]``)."""
    from parties.cli import write_json

    res.metrics["plan"] = pdoc
    write_json(res.out / "metrics.json", res.metrics)


def _synth_schema(args: argparse.Namespace) -> int:
    """``psfl synth schema --dataset BRANCH.csv --out S.toml``: a draft of every column of a
    horizontal table (the label included) in the kinds FedForge declares (numeric,
    categorical); a date or many-level column is left out, named, with what to do."""
    import textwrap

    from parties.cli import ExitCode
    from parties.data import load_table
    from parties.data.schema import (DRAFT_WARNING, CategoricalColumn, NumericColumn,
                                     PublicSchema, draft_party_schema, dump_schema)
    from pubsub.outputs import write_atomic

    out = Path(args.out)
    if out.exists() and not args.force:
        print(f"error: {str(out)!r} exists (a reviewed schema?); use --force to overwrite",
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    got: dict[str, Any] = {}

    def read() -> None:
        got["frame"], _ = load_table(args.dataset)
        got["draft"] = draft_party_schema(got["frame"], [str(c) for c in got["frame"].columns],
                                          min_count=args.min_count, dataset=str(args.dataset))

    code = _refused(read)  # a typed error: one line, its exit code
    if code is not None:
        return code
    frame, draft = got["frame"], got["draft"]
    left_out = dict(draft.left_out)
    kept = []
    for col in draft.schema.columns:
        if isinstance(col, NumericColumn | CategoricalColumn):
            kept.append(col)
        else:
            left_out[col.name] = (f"drafted as {col.kind!r}, which FedForge does not "
                                  "synthesise (numeric and categorical columns only): leave "
                                  f"it out of every branch's file (--set 'data.drop_columns="
                                  f'["{col.name}"]\'), or turn it into a numeric or '
                                  "categorical column first")
    if not kept:
        print("error: no numeric or categorical column to declare", file=sys.stderr)
        return ExitCode.BAD_INPUT
    schema = PublicSchema(columns=tuple(kept), dataset=draft.schema.dataset,
                          description=draft.schema.description)
    header = DRAFT_WARNING + "\n\n" + textwrap.fill(
        f"Drafted by `psfl synth schema` from {str(args.dataset)!r} ({len(frame):,} rows), "
        "one branch's file: every column FedForge can declare, the label included. Other "
        "branches review it or draft their own; `psfl data schema-merge` takes the widest "
        "of each column.", width=86)
    for name, why in left_out.items():
        header += "\n" + textwrap.fill(f"Left out {name!r}: {why}.", width=86)
    notes = {k: v for k, v in draft.notes.items() if k in schema.names}
    write_atomic(out, dump_schema(schema, header=header, notes=notes))
    for name, why in left_out.items():
        print(f"left out {name!r}: {why}", file=sys.stderr)
    print(f"draft schema of {len(schema.columns)} columns: {out}\nreview it (its REVIEW "
          f"lines), then psfl synth run --party-files ... --schema {out}")
    return ExitCode.OK


def _synth_add_workload(args: argparse.Namespace) -> int:
    """``psfl synth add-workload RUN_DIR queries.json``: apply a workload update
    (:func:`sim.launch.synth.add_workload`) and print its report."""
    import json

    from sim.launch.synth import add_workload
    from synth.workload import WorkloadError

    try:
        queries = json.loads(Path(args.queries).read_text())
    except (OSError, ValueError) as exc:
        what = "is not JSON" if isinstance(exc, ValueError) else "cannot be read"
        print(f"error: {args.queries} {what}: {exc}", file=sys.stderr)
        return 2
    if args.rho_share is not None and isinstance(queries, dict):
        queries["rho_share"] = args.rho_share
    res, code = _launch(lambda: add_workload(args.run_dir, queries, timeout_s=args.timeout_s,
                                             compare_full=args.compare_full,
                                             keys_dir=args.keys, insecure=args.insecure),
                        what="every process", bad_input=(WorkloadError, TimeoutError))
    if code is not None:
        return code

    def f(v: Any) -> str:
        return "n/a" if v is None else f"{v:.4f}"

    print(f"update {res.get('name')}: {res.get('status')}"
          + (f" ({res['reason']})" if res.get("reason") else ""))
    if res.get("reopened") is False:
        print("  the run was not reopened: its model, synthetic data and metrics are "
              "unchanged (the answer is in workload/applied/)")
        return 1 if res.get("status") == "refused" else 0
    print(f"  measured {len(res.get('missing', []))} new marginal(s) "
          f"{res.get('missing')}, already measured {res.get('already_measured')}, "
          f"rho {res.get('rho', 0):.4g}")
    print(f"  TV on its marginals: before {f(res.get('tv_before'))}, after "
          f"{f(res.get('tv_after'))}; incremental refit {res.get('refit_s', 0):.2f} s "
          f"({res.get('refit_iters')} iterations)")
    if "full_refit_s" in res:
        print(f"  from-scratch refit {res['full_refit_s']:.2f} s "
              f"({res['full_refit_iters']} iterations), TV {f(res.get('tv_after_full_refit'))}")
    print(f"  report: {Path(args.run_dir) / 'workload' / 'applied'}")
    return 1 if res.get("status") == "refused" else 0


def _synth_run(args: argparse.Namespace) -> int:
    """``psfl synth run``: FedForge on one machine (broker, coordinator, aggregators and
    parties as processes)."""
    from synth.config import load_synth_config  # light: a bad value is refused before torch

    extra: dict[str, object] = {}
    for key in ("dataset", "parties", "epsilon", "mechanism"):
        if getattr(args, key, None) is not None:
            extra[key] = getattr(args, key)
    if getattr(args, "engine", None) is not None:
        extra["engine"] = {"name": args.engine}  # [synth.engine] name
    if args.party_files:
        if getattr(args, "queries", None):
            from pubsub.config import ConfigError

            raise ConfigError("--queries", "goes with a --dataset run (with --party-files, "
                              "queue them with psfl synth add-workload)")
        return _synth_run_party_files(args, extra)
    for flag in ("schema", "holdout"):
        if getattr(args, flag, None):
            from pubsub.config import ConfigError

            raise ConfigError(f"--{flag}", "goes with --party-files (a --dataset run splits "
                              "its own holdout and takes its schema from data.schema_file)")
    cfg = load_synth_config(args.config, args.set, extra)  # ConfigError: exit 2
    args.updates = _read_queries(getattr(args, "queries", None), cfg)
    code = _check_tables_before_launch([cfg.dataset])
    if code is not None:
        return code
    from pubsub.outputs import RunDirLock

    # the run directory is this run's from here (RunDirBusy: exit 2 at once, before the
    # start line and the heavy imports)
    with RunDirLock(args.out, run_id=args.run_id, command="psfl synth run"):
        return _synth_run_locked(args, cfg)


def _read_queries(path: str | None, cfg: Any) -> list[dict[str, Any]]:
    """``--queries FILE``: its workload updates (a JSON list of them, or one), checked
    for shape before anything starts (their columns once the schema is known).

    Raises:
        ConfigError: the file cannot be read, is not a list of objects, or the run holds
            no reserve of ρ for them (``stream.rho_frac = 0``).
    """
    from pubsub.config import ConfigError

    if path is None:
        return []
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("--queries", f"cannot read {path!r}: {exc}") from None
    updates = [doc] if isinstance(doc, dict) else doc
    if not isinstance(updates, list) or not updates or not all(isinstance(u, dict)
                                                                for u in updates):
        raise ConfigError("--queries", f"{path!r} must hold a workload update (an object) "
                          "or a non-empty list of them")
    if cfg.stream.rho_frac == 0:
        raise ConfigError("--queries", "the run holds no reserve of rho for its queries: "
                          "set stream.rho_frac > 0 (e.g. --set stream.rho_frac=0.3)")
    return updates


def _synth_run_locked(args: argparse.Namespace, cfg: Any) -> int:
    from sim.launch.synth import run_synth
    from synth.domain import DomainError

    if cfg.engine.name == "auto" and cfg.resolved_engine() == "neural":
        print("note: mbi is not installed, so the engine is 'neural' (a relaxed synthetic "
              "dataset fitted with torch); pip install -e \".[mbi]\" for Private-PGM",
              file=sys.stderr)
    print(f"FedForge: {cfg.dataset}, K={cfg.parties} parties, epsilon {cfg.epsilon:g} "
          f"(delta {cfg.delta:g}), {cfg.mechanism} + {cfg.resolved_engine()}, "
          f"{cfg.secagg.noise_model} noise, ring cap {cfg.secagg.bits or 'none'} bits, "
          f"min_survivors {cfg.secagg.min_survivors or 'ceil(0.7 K)'}, "
          f"fan-out {cfg.secagg.fanout}, "
          f"out {args.out}", flush=True)
    res, code = _launch(lambda: run_synth(cfg, args.out, broker=args.broker,
                                          run_id=args.run_id, timeout_s=args.timeout_s,
                                          keys_dir=args.keys, insecure=args.insecure,
                                          kill_coordinator_at=args.kill_coordinator_at,
                                          kill_parties=args.kill_party,
                                          workload=getattr(args, "updates", None) or None),
                        what="every process", bad_input=(DomainError, ValueError))
    if code is not None:
        return code
    m = res.metrics
    ml = m.get("ml_utility") or {}
    tv = m.get("avg_tv")
    print(f"avg TV over {m.get('n_workload')} {m.get('workload', 'workload')}: "
          f"{tv:.4f} (max {m['max_tv']:.4f})" if tv is not None else "no quality report")
    if not ml:
        print(f"ML utility: skipped ({m.get('ml_utility_skipped') or 'no quality report'})")
    else:
        print(f"ML utility (gradient boosting, real holdout): AUC synthetic "
              f"{ml.get('auc_synthetic', float('nan')):.3f} vs real {ml.get('auc_real', float('nan')):.3f}")
    if m.get("bytes_wire"):
        print(f"wire bytes {m['bytes_wire']:,} vs naive float32 {m['bytes_naive']:,} "
              f"({m['bytes_wire'] / m['bytes_naive']:.2f}x)")
    updates = m.get("workload_updates") or []
    for u in updates:  # --queries: each update's outcome, never only in the log
        why = f": {u['reason']}" if u.get("reason") else ""
        print(f"query {u['name']}: {u['status']}{why} (marginals measured "
              f"{len(u.get('missing') or [])}, already measured "
              f"{len(u.get('already_measured') or [])}, rho {u.get('rho', 0.0):.3g})")
    if (m.get("queries") or 0) > 1:
        print(f"session: the release and {m['queries'] - 1} update(s) measured, "
              f"{m['bytes_wire_session_fixed']:,} B fixed once, wire/naive "
              f"{m['wire_over_naive_per_query']:.2f}x over the queries "
              f"(metrics: bytes_wire_by_query)")
    for d in m.get("party_deaths") or []:
        how = f"signal {d['signal']}" if d.get("signal") else f"exit code {d['exit_code']}"
        print(f"dropout: party process {d['process']} ({', '.join(d['parties'])}) died "
              f"({how}) at {d['at_s']:.1f} s; the run completed with the others")
    print(f"wall {m['wall_s']:.1f} s; synthetic rows: {res.out / 'synthetic.csv'}; "
          f"metrics: {res.out / 'metrics.json'}")
    refused = [u["name"] for u in updates if u.get("status") == "refused"]
    if refused:  # the synthesis is whole, but not every query asked for was measured
        print(f"error: --queries: {len(refused)} update(s) refused ({', '.join(refused)}); "
              "the synthesis is written without them", file=sys.stderr)
        return 1
    return 0


def _synth_run_party_files(args: argparse.Namespace, extra: dict[str, object]) -> int:
    """``psfl synth run --party-files A B ...``: each branch's own table, one party process
    each (the Python API's :meth:`sim.fedforge.FedForge.fit` over the broker)."""
    from pubsub.config import ConfigError
    from synth.config import load_synth_config

    for key in ("dataset", "parties"):
        if key in extra:
            raise ConfigError(f"--{key}", "give --party-files or --dataset/--parties, not both "
                              "(with --party-files K is the number of files)")
    if args.broker or args.keys or args.kill_coordinator_at or args.kill_party:
        raise ConfigError("--party-files", "runs its own broker with fresh keys; --broker, "
                          "--keys and the faults go with --dataset")
    # K is the number of files (the secure-aggregation thresholds are checked against it)
    cfg = load_synth_config(args.config, args.set, {**extra, "parties": len(args.party_files)})
    code = _check_tables_before_launch(list(args.party_files))
    if code is not None:
        return code
    from pubsub.outputs import RunDirLock

    with RunDirLock(args.out, command="psfl synth run --party-files"):  # RunDirBusy: exit 2
        return _synth_run_party_files_locked(args, cfg)


def _synth_run_party_files_locked(args: argparse.Namespace, cfg: Any) -> int:
    from pubsub.config import to_mapping
    from sim.fedforge import FedForge
    from synth.domain import DomainError

    settings = to_mapping(cfg)
    for key in ("dataset", "parties", "epsilon", "delta", "mechanism", "label", "seed"):
        settings.pop(key, None)
    settings["engine"] = {k: v for k, v in settings["engine"].items() if k != "name"}
    settings["data"] = {k: v for k, v in settings["data"].items()
                        if k not in ("schema_file", "domain")}
    print(f"FedForge: {len(args.party_files)} branch files ({', '.join(args.party_files)}), "
          f"epsilon {cfg.epsilon:g} (delta {cfg.delta:g}), {cfg.mechanism} + "
          f"{cfg.resolved_engine()}, schema {args.schema or 'inferred (outside the guarantee)'}"
          f", out {args.out}", flush=True)

    def fit() -> FedForge:
        fed = FedForge(epsilon=cfg.epsilon, delta=cfg.delta, mechanism=cfg.mechanism,
                       engine=cfg.engine.name, schema=args.schema, label=cfg.label,
                       config=settings, seed=cfg.seed)
        return fed.fit(args.party_files, holdout=args.holdout, out=args.out,
                       transport="broker", timeout_s=args.timeout_s)

    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", UserWarning)
        fed, code = _launch(fit, what="every process", bad_input=(DomainError, ValueError))
    for w in seen:
        print(f"warning: {w.message}", file=sys.stderr)
    if code is not None:
        return code
    m = fed.metrics
    tv = m.get("avg_tv")
    print(f"avg TV over {m.get('n_workload')} {m.get('workload', 'workload')}: "
          f"{tv:.4f} (max {m['max_tv']:.4f})" if tv is not None else
          "no quality report (give --holdout)")
    print(f"wall {m['wall_s']:.1f} s; metrics: {Path(args.out) / 'metrics.json'}")
    return 0


def job_membership(job: Any) -> str:
    """The run membership (``pubsub.membership`` TOML) of a job: its runs (training
    ``<run_id>``, its alignment, a prediction and its alignment) admit the job's parties
    (identities named by party id, as ``psfl keys generate`` names them); with several
    passive parties each owns its topics."""
    from pubsub.membership import inline_membership

    ids, run = list(job.vfl.party_ids), job.job.run_id
    owned = {run: ids[1:]} if len(ids) > 2 else None
    return inline_membership([f"{run}={','.join(ids)}"], owned=owned).as_toml()


def _broker_run(args: argparse.Namespace) -> int:
    """``psfl broker run``, with ``--job``: the job's membership (:func:`job_membership`)."""
    import tempfile

    from broker.cli import cmd_run

    if not args.job:
        return int(cmd_run(args))
    from parties.config import load_job
    from pubsub.config import ConfigError

    if args.members or args.run or args.open_runs:
        raise ConfigError("--job", "makes the run membership: give --job, or --members, "
                          "--run or --open-runs")

    job = load_job(args.job)  # ConfigError: exit 2
    with tempfile.TemporaryDirectory(prefix="psfl-members-") as d:
        path = Path(d) / "members.toml"
        path.write_text(job_membership(job))
        args.members = str(path)
        print(f"broker for job {job.job.run_id} (digest {job.digest}): runs "
              f"{job.job.run_id}, {job.job.run_id}-align, -predict, -predict-align admit "
              f"{', '.join(job.vfl.party_ids)} only", file=sys.stderr, flush=True)
        return int(cmd_run(args))


def _bench(args: argparse.Namespace) -> int:
    """Run ``bench/NAME.py`` of this checkout with the remaining arguments."""
    import subprocess
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parents[1] / "bench"
    script = bench_dir / f"{args.name}.py"
    if not script.is_file():
        names = sorted(p.stem for p in bench_dir.glob("*.py")) if bench_dir.is_dir() else []
        print(f"error: no benchmark {args.name!r}"
              + (f" (available: {', '.join(names)})" if names else
                 " (benchmarks live in the source checkout's bench/ folder)"), file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(script), *args.rest])


def _report(args: argparse.Namespace) -> int:
    """``psfl report RUN_DIR``: PNG plots of the VFL and FedForge runs below RUN_DIR
    (sim/reports/vfl.py, sim/report_synth*.py)."""
    from sim.reports.vfl import ReportError, make_report

    try:
        make_report(args.run_dir, args.out, max_batches=args.max_batches,
                    window_s=args.window_s)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _vfl_predict(args: argparse.Namespace) -> int:
    """``psfl vfl predict RUN_DIR --out OUT``: score rows with a run's saved model."""
    from parties.config import check_run_id
    from parties.runtime.report import format_metric

    from sim.launch.predict import run_predict

    if args.job:
        from parties.cli import run_job_predict

        if not args.role:
            print("error: --job goes with --role (this party's id)", file=sys.stderr)
            return 2
        return run_job_predict(args.role, args)
    if args.role:
        print("error: --role goes with --job", file=sys.stderr)
        return 2
    if args.run_id:
        check_run_id(args.run_id)
    res, code = _launch(lambda: run_predict(args.run_dir, args.out, data=args.data,
                                            id_column=args.id_column, broker=args.broker,
                                            run_id=args.run_id, timeout_s=args.timeout_s,
                                            wait_s=args.wait_s, keys_dir=args.keys,
                                            insecure=args.insecure),
                        what="the broker and the prediction parties")
    if code is not None:
        return code
    s = res.summary
    line = f"predicted {s['rows']} rows ({s['source']}): {res.predictions}"
    if s.get("metric") is not None:
        line += f"; {s['metric_name']} {format_metric(s['metric'])}"
    print(line)
    by_party = s.get("dp_by_party") or {"passive": s.get("dp") or {}}
    for party, dp in by_party.items():
        if dp.get("enabled"):
            who = "" if len(by_party) == 1 else f" ({party})"
            k = dp.get("prediction_releases_max")
            print(f"dp{who}: this release mu {dp['release_mu']:.4g} per row, composed "
                  f"{format_metric(dp['prediction_mu'])} for the most predicted row"
                  + ("" if k is None else f" ({k} of {dp.get('max_releases')} prediction "
                     "releases)")
                  + f"; spent mu {format_metric(dp['mu'])}, epsilon "
                  f"{format_metric(dp['epsilon'])} at delta {dp['delta']:g} (ledger "
                  f"continued: {dp.get('continues') or 'new rows'})")
    return 0


def _add_predict_parser(vsub: Any) -> None:
    """``psfl vfl predict``."""
    pr = vsub.add_parser("predict", help="predict with a run's saved model (broker + every "
                         "party; each loads its own part): predictions.csv, predict.json")
    pr.add_argument("run_dir", help="the training run's directory (psfl vfl run --out)")
    pr.add_argument("--out", required=True, help="output directory")
    pr.add_argument("--data", help="CSV/Parquet of new rows with an ID column (default: "
                    "the run's test split, re-derived from its saved config)")
    pr.add_argument("--id-column", default="id", help="ID column of --data (default id)")
    pr.add_argument("--job", help="one party of a cross-organisation prediction: the job "
                    "file (RUN_DIR is then this party's training --out, --data its own file "
                    "of new records, aligned on the job's join key first)")
    pr.add_argument("--role", choices=["active", "passive",
                                       *(f"passive{k}" for k in range(2, 10))],
                    metavar="PARTY", help="with --job: this party's id")
    pr.add_argument("--quiet", action="store_true", help="with --job: no result line")
    pr.add_argument("--broker", help="use a running broker tcp://HOST:PORT")
    pr.add_argument("--run-id", help="topic namespace of the prediction; default random")
    pr.add_argument("--timeout-s", type=float, default=None,
                    help="kill the job after this many seconds")
    pr.add_argument("--wait-s", type=float, default=60.0,
                    help="each party's deadline for each wait on its partners")
    add_security_arguments(pr, kind="launcher")
    pr.set_defaults(func=_vfl_predict)


def _vfl_party(args: argparse.Namespace) -> int:
    from parties.cli import run_party

    return int(run_party(args.role, args))


def _vfl_align(args: argparse.Namespace) -> int:
    """``psfl vfl align``: private ID alignment (mutual ECDH PSI over the bus). With
    ``--role PARTY``: one party against ``--broker`` (``--passive-parties N`` for N-way
    alignment); without: broker and every party as processes on this machine
    (``--active-ids``, ``--passive-ids`` once per passive party)."""
    from parties.alignment.align import AlignConfig
    from parties.alignment.run import run_align_party, write_demo_ids
    from parties.cli import ExitCode

    if args.make_ids is not None:
        try:
            pa, pb = write_demo_ids(args.out, args.make_ids, args.overlap, args.seed)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return ExitCode.BAD_INPUT
        print(f"wrote {args.make_ids:,} IDs each ({round(args.make_ids * args.overlap):,} "
              f"shared, seed {args.seed}): {pa} {pb}")
        return ExitCode.OK
    kw = {k: getattr(args, k) for k in ("chunk_size", "window") if getattr(args, k)}
    if args.timeout_s is not None:
        kw["chunk_timeout_s"] = kw["join_timeout_s"] = kw["final_timeout_s"] = args.timeout_s
    try:
        cfg = AlignConfig(**kw)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.role:
        if not args.broker or not args.ids:
            print("error: --role needs --broker and --ids", file=sys.stderr)
            return ExitCode.BAD_INPUT
        from pubsub.cli import security_from_args

        security = security_from_args(args, args.broker, identity=args.role)
        return run_align_party(role=args.role, broker=args.broker, ids_path=args.ids,
                               out=args.out, run_id=args.run_id or "align",
                               column=args.column, config=cfg, events=args.events,
                               quiet=args.quiet, security=security,
                               passive_parties=args.passive_parties or 1)
    if not args.active_ids or not args.passive_ids:
        print("error: give --role (one party) or --active-ids and --passive-ids (local "
              "launcher; --passive-ids once per passive party), or --make-ids N",
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    from parties.config import MAX_PASSIVE_PARTIES

    passive_ids = args.passive_ids
    if len(passive_ids) > MAX_PASSIVE_PARTIES:
        print(f"error: at most {MAX_PASSIVE_PARTIES} --passive-ids, got {len(passive_ids)}",
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.passive_parties not in (None, len(passive_ids)):
        print(f"error: --passive-parties {args.passive_parties} but {len(passive_ids)} "
              "--passive-ids", file=sys.stderr)
        return ExitCode.BAD_INPUT
    from sim.launch.align import run_align

    res, code = _launch(lambda: run_align(
        active_ids=args.active_ids,
        passive_ids=passive_ids[0] if len(passive_ids) == 1 else passive_ids, out=args.out,
        column=args.column, broker=args.broker, run_id=args.run_id,
        chunk_size=args.chunk_size, window=args.window, timeout_s=args.job_timeout_s,
        quiet=args.quiet, keys_dir=args.keys, insecure=args.insecure),
        what="the broker and every alignment party")
    if code is not None:
        return code
    from parties.config import passive_party_ids

    a = res["active"]
    each = [res[p] for p in ("active", *passive_party_ids(len(passive_ids)))]
    owns = ", ".join(f"{p} {res[p]['n_own']:,}"
                     for p in ("active", *passive_party_ids(len(passive_ids))))
    print(f"aligned: {a['n_shared']:,} shared IDs ({owns}); alignment "
          f"{max(r['seconds'] for r in each):.2f} s, job {res['wall_s']:.2f} s; bus bytes "
          f"{sum(r['bytes_sent'] for r in each):,}; out {args.out}")
    return ExitCode.OK


def _add_align_parser(vsub: Any) -> None:
    """``psfl vfl align``."""
    al = vsub.add_parser("align", help="private ID alignment (PSI): find the shared record "
                         "IDs without revealing the others; writes OUT/aligned-ROLE.csv")
    # the party ids of parties.config (not imported here: it is slow to import)
    al.add_argument("--role", choices=["active", "passive",
                                       *(f"passive{k}" for k in range(2, 10))],
                    metavar="PARTY",
                    help="run one party, by party id: active, passive, passive2 .. passive9 "
                    "(with --broker and --ids); without it, start a broker and every party "
                    "here")
    al.add_argument("--ids", help="this party's ID file (CSV/Parquet column, or text, one "
                    "ID per line)")
    al.add_argument("--active-ids", help="launcher: the active party's ID file")
    al.add_argument("--passive-ids", action="append", metavar="FILE",
                    help="launcher: a passive party's ID file; repeat for several passive "
                    "parties (the k-th is party passive, passive2, ...: N-way alignment)")
    al.add_argument("--passive-parties", type=int, metavar="N",
                    help="how many passive parties align (default 1; with --role, every "
                    "party of an N-way alignment must be given the same N)")
    al.add_argument("--column", help="ID column of CSV/Parquet files (default id)")
    al.add_argument("--out", required=True, help="output directory")
    al.add_argument("--broker", help="broker tcp://HOST:PORT (launcher default: start one)")
    al.add_argument("--run-id", help="topic namespace, the same on both parties "
                    "(party default 'align', launcher default random)")
    al.add_argument("--chunk-size", type=int, help="IDs per chunk (default 16384)")
    al.add_argument("--window", type=int, help="request chunks in flight (default 4)")
    al.add_argument("--timeout-s", type=float, help="deadline of each wait for the partner "
                    "(default 120)")
    al.add_argument("--job-timeout-s", type=float, help="launcher: stop everything after "
                    "this many seconds")
    al.add_argument("--events", help="party: append JSON log lines here "
                    "(default OUT/events.jsonl)")
    al.add_argument("--quiet", action="store_true", help="no per-party lines")
    add_security_arguments(al)
    al.add_argument("--make-ids", type=int, metavar="N", help="instead: write demo ID files "
                    "OUT/active-ids.txt and OUT/passive-ids.txt of N IDs each")
    al.add_argument("--overlap", type=float, default=0.5, help="with --make-ids: shared "
                    "share (default 0.5)")
    al.add_argument("--seed", type=int, default=0, help="with --make-ids: seed")
    al.set_defaults(func=_vfl_align)


def _vfl_schema(args: argparse.Namespace) -> int:
    """``psfl vfl schema``: draft a public feature schema FROM THE DATA, for review."""
    from parties.cli import ExitCode, exit_code_for
    from parties.config import load_vfl_config
    from parties.data.preflight import load_configured_table, resolve_columns
    import textwrap

    from parties.data.schema import DRAFT_WARNING, draft_party_schema, save_schema

    if args.job:  # the cross-organisation path: this party's own file, the job's settings
        from parties.config import load_job

        if args.dataset or args.config:
            print("error: --job goes with --data (not --dataset or --config)", file=sys.stderr)
            return ExitCode.BAD_INPUT
        if not args.data:
            print("error: --job needs --data (this party's own file)", file=sys.stderr)
            return ExitCode.BAD_INPUT
        cfg = load_job(args.job, args.set, data=args.data).vfl  # ConfigError: exit 2
    elif args.data:
        print("error: --data goes with --job (else --dataset)", file=sys.stderr)
        return ExitCode.BAD_INPUT
    else:
        extra = {"dataset": args.dataset} if args.dataset else {}
        cfg = load_vfl_config(args.config, args.set, extra)  # ConfigError: exit 2
    out = Path(args.out)
    if out.exists() and not args.force:
        print(f"error: {str(out)!r} exists (a reviewed schema?); use --force to overwrite",
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        frame, default_label = load_configured_table(cfg, args.role)
        label = cfg.label or default_label
        if cfg.data.join_key:  # one party's own file: every column but the key (and label)
            from parties.data.launchcheck import check_own_file

            columns = check_own_file(cfg, args.role) or tuple(
                str(c) for c in frame.columns if c not in (cfg.data.join_key, label))
        elif args.role == "passive" and cfg.data.passive_columns:
            columns = tuple(cfg.data.passive_columns)
        elif args.role == "passive" and (not label or label not in frame.columns):
            # the passive party's own file: no label; every column (an ID column, the
            # join key, is recognised and left out)
            columns = tuple(str(c) for c in frame.columns)
        else:  # a table with the label (the active party's, or a merged one)
            _label, active, passive = resolve_columns(cfg, frame, default_label)
            columns = passive if args.role == "passive" else active
        draft = draft_party_schema(frame, columns, min_count=args.min_count,
                                   dataset=cfg.dataset, id_columns=cfg.data.id_columns,
                                   onehot_max_levels=cfg.data.onehot_max_levels)
        schema = draft.schema
    except Exception as exc:
        code = exit_code_for(exc)  # bad data or schema: exit 2
        if code is None:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return code
    header = DRAFT_WARNING + "\n\n" + textwrap.fill(
        f"Drafted by `psfl vfl schema` from {cfg.dataset!r}, the {args.role} party's "
        f"columns ({len(columns)}), {len(frame):,} rows; categories seen fewer than "
        f"{args.min_count} times were left out. Each column's REVIEW line says what to "
        "check.", width=86)
    left_out = dict(draft.left_out)
    if cfg.data.join_key:
        left_out.setdefault(cfg.data.join_key, "the join key (vfl.data.join_key): it "
                            "aligns the parties' files and is never a feature")
    for name, why in left_out.items():
        header += "\n" + textwrap.fill(f"Left out {name!r}: {why}.", width=86)
    try:
        save_schema(schema, out, header=header, notes=draft.notes)
    except OSError as exc:
        print(f"error: cannot write {str(out)!r}: {exc.strerror or exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    banner = "!" * 78
    print(f"{banner}\n{DRAFT_WARNING}\n{banner}", file=sys.stderr)
    for name, why in left_out.items():
        print(f"left out {name!r}: {why}", file=sys.stderr)
    print(f"draft schema of the {args.role} party's {len(schema.columns)} columns "
          f"({schema.width} encoded features): {out}\nreview it (its REVIEW lines), then run "
          f"with --set dp.schema={out}")
    return ExitCode.OK


def _add_schema_parser(vsub: Any) -> None:
    """``psfl vfl schema``."""
    sch = vsub.add_parser("schema", help="DRAFT a public feature schema (declared ranges and "
                          "categories, for DP runs) from a party's data; it reads the data, "
                          "so the draft is NOT private: review it before use")
    sch.add_argument("--dataset", help="dataset (as for vfl run); with --role passive it may "
                     "be the passive party's own file, without a label: every column is "
                     "drafted (dates as parts, many-level values hashed) except an ID-like "
                     "join key")
    sch.add_argument("--job", help="the job file of a cross-organisation run (with --data: "
                     "this party's own file; the join key is left out)")
    sch.add_argument("--data", help="with --job: this party's own file (CSV or Parquet)")
    sch.add_argument("--role", choices=["active", "passive"], default="passive",
                     help="whose columns (default passive, the party DP protects)")
    sch.add_argument("--out", required=True, help="schema TOML file to write")
    sch.add_argument("--config", help="TOML file with a [vfl] table")
    sch.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set label=y (repeatable)")
    sch.add_argument("--min-count", type=int, default=10,
                     help="leave out categories seen fewer times (default 10)")
    sch.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    sch.set_defaults(func=_vfl_schema)


def _add_vfl_run_args(p: argparse.ArgumentParser, *, demo: bool) -> None:
    if not demo:
        p.add_argument("--dataset", help="a named dataset (bank, adult, california, synthetic) "
                       "or a CSV/Parquet path (then also --set label=COL, optionally "
                       "task=regression and data.active_columns/data.passive_columns)")
        p.add_argument("--algo", help="coordination algorithm: pubsub (default), vfl, vfl-ps, "
                       "avfl, avfl-ps (same as --set algo=...)")
        p.add_argument("--model", help="bottom models: mlp (default), resnet (the paper's "
                       "large model; model.resnet_* keys) or package.module:callable (same as "
                       "--set model.bottom=...; see docs/tutorials/your-own-model.md)")
    p.add_argument("--out", default=DEFAULT_DEMO_OUT if demo else None, required=not demo,
                   help="run directory (may exist; files are overwritten)")
    p.add_argument("--config", help="TOML file with a [vfl] table")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set epochs=3 (repeatable)")
    p.add_argument("--broker", help="use a running broker tcp://HOST:PORT instead of starting one")
    p.add_argument("--transport", choices=["broker", "memory"], default="broker",
                   help="broker (default): a broker and one process per party over TCP; "
                   "memory: both parties in this process over an in-memory bus (quick "
                   "experiments; speed figures are not those of separate processes)")
    p.add_argument("--run-id", help="run id (topic namespace); default random")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="kill the job after this many seconds")
    add_security_arguments(p, kind="launcher")


def _add_sweep_args(prof: argparse.ArgumentParser) -> None:
    """``psfl vfl profile`` options of the batch-size sweep and the cost-model fits."""
    prof.add_argument("--sweep", action="store_true", help="also sweep batch sizes, probe "
                      "the bus and fit the cost model (profile.json: sweep, cost_model)")
    prof.add_argument("--batch-sizes", metavar="B,B,...", help="swept batch sizes (default "
                      "16,32,...,1024 capped by the training rows)")
    prof.add_argument("--quick", action="store_true", help="sweep B in 16,64,256,1024 only")
    prof.add_argument("--sweep-min-time-s", type=float, default=0.25,
                      help="CPU seconds timed per swept B and party")
    prof.add_argument("--broker", help="probe the bus through this running broker "
                      "tcp://HOST:PORT (default: start one on 127.0.0.1)")


def _add_plan_parser(vsub: Any) -> None:
    """``psfl vfl plan``."""
    plan = vsub.add_parser("plan", help="choose each party's workers and B minimising the "
                           "predicted epoch time from a profile's cost model "
                           "(writes OUT/plan.json)")
    plan.add_argument("--profile", required=True, help="profile.json of psfl vfl profile "
                      "--sweep")
    plan.add_argument("--config", help="TOML file with a [vfl] table (applied over the "
                      "profiled config)")
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config key (repeatable)")
    plan.add_argument("--w-max", type=int, default=8, help="most workers per party")
    plan.add_argument("--batch-sizes", metavar="B,B,...",
                      help="candidate batch sizes (default 16,32,...,1024)")
    plan.add_argument("--mem-limit-mb", type=float, help="each party's memory budget, MiB")
    plan.add_argument("--memory-rule", choices=["shared", "per_worker"],
                      help="memory of w workers (default: per_worker for process workers, "
                      "else shared)")
    plan.add_argument("--samples-model", metavar="FILE.json", help="plan for time to target "
                      "with this samples-to-target model (a plan.json with pilots from "
                      "psfl vfl run --plan auto --plan-pilots, or the model's own JSON)")
    plan.add_argument("--out", required=True, help="output directory (plan.json)")
    plan.set_defaults(func=_vfl_plan)


def _data_bank_partner(args: argparse.Namespace) -> int:
    """``psfl data bank-partner``: :func:`parties.data.bank_partner.make_bank_partner`'s
    files, each written whole (a temporary file renamed)."""
    from parties.cli import ExitCode
    from parties.data.bank_partner import make_bank_partner
    from pubsub.outputs import write_atomic

    out = Path(args.out)
    files = {"bank/bank.csv": "bank", "bank/bank-new.csv": "bank_new",
             "partner/partner.csv": "partner", "partner/partner-new.csv": "partner_new",
             "reference/merged.csv": "merged"}
    there = [name for name in files if (out / name).exists()]
    if there:
        print(f"error: {str(out / there[0])!r} exists: give another --out", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        t = make_bank_partner(args.customers, new_customers=args.new_customers,
                              seed=args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    for name, attr in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, getattr(t, attr).to_csv(index=False))
    print(f"bank {len(t.bank):,} customers, partner {len(t.partner):,} ({len(t.merged):,} "
          f"shared); new customers {len(t.bank_new):,} and {len(t.partner_new):,}: {out}")
    return ExitCode.OK


def _data_schema_merge(args: argparse.Namespace) -> int:
    """``psfl data schema-merge A.toml B.toml ... --out S.toml``
    (:func:`parties.data.schema_merge.merge_schemas`)."""
    from parties.cli import ExitCode
    from parties.data.schema import dump_schema, load_schema
    from parties.data.schema_merge import merge_schemas
    from pubsub.outputs import write_atomic

    out = Path(args.out)
    if out.exists() and not args.force:
        print(f"error: {str(out)!r} exists; use --force to overwrite", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        merged, notes = merge_schemas([(p, load_schema(p)) for p in args.schemas])
    except (ValueError, OSError) as exc:  # SchemaError, SchemaMergeError: a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    header = ("MERGED PUBLIC SCHEMA: it lists every category and range each source "
              "declared,\nso whoever receives it learns them. Merged from: "
              + ", ".join(args.schemas))
    write_atomic(out, dump_schema(merged, header=header, notes=notes))
    print(f"merged {len(args.schemas)} schemas: {len(merged.columns)} columns, "
          f"{len(notes)} changed or not declared by every source: {out}")
    return ExitCode.OK


def _data_convert(args: argparse.Namespace) -> int:
    from parties.cli import ExitCode
    from parties.data.convert import convert_csv
    from parties.data import DataError

    parties: dict[str, list[str]] = {}
    for spec in args.party:
        name, sep, cols = spec.partition("=")
        if not sep or not name or not cols:
            print(f"error: --party {spec!r}: expected NAME=COL,COL,...", file=sys.stderr)
            return ExitCode.BAD_INPUT
        parties[name] = [c for c in cols.split(",") if c]
    delim = "\t" if args.delimiter in ("\\t", "tab") else args.delimiter
    names = [n for n in args.names.split(",") if n]
    try:
        got = convert_csv(args.src, args.out, parties=parties or None,
                          shard_rows=args.shard_rows, delimiter=delim, names=names)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print(f"{got['rows']:,} rows in {got['shards']} shard(s): "
          + ", ".join(f"{p} {d}" for p, d in got["dirs"].items()))
    return ExitCode.OK


def build_parser() -> argparse.ArgumentParser:
    """The ``psfl`` argument parser."""
    from broker.cli import add_subcommands as add_broker
    from parties.cli import PARTY_IDS, add_party_arguments

    parser = argparse.ArgumentParser(prog="psfl", description="PubSub-VFL and FedForge on a "
                                     "ZeroMQ message bus.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train PubSub-VFL on the bundled Bank Marketing data")
    _add_vfl_run_args(demo, demo=True)
    demo.set_defaults(func=_vfl_run, dataset="bank", algo=None)

    vfl = sub.add_parser("vfl", help="vertical federated learning (the active party and 1-9 passive parties)")
    vsub = vfl.add_subparsers(dest="vfl_command", required=True)
    run = vsub.add_parser("run", help="start the broker and every party as processes and train")
    _add_vfl_run_args(run, demo=False)
    run.add_argument("--plan", metavar="auto|PLAN.json", help="auto: profile (sweep), plan "
                     "and train with the planned workers per party and batch_size; or "
                     "the plan.json of psfl vfl plan (recorded in metrics.json)")
    run.add_argument("--plan-pilots", action="store_true", help="with --plan auto: plan "
                     "for time to target, measuring the samples-to-target model with four "
                     "short pilot trainings in this process first (docs/how-to/profiling-and-planner.md)")
    run.set_defaults(func=_vfl_run)
    _add_predict_parser(vsub)
    party = vsub.add_parser("party", help="run one party (for multi-host runs)")
    party.add_argument("--role", required=True, choices=PARTY_IDS, metavar="PARTY",
                       help="the party's id: active, passive, or passive2 .. passive9 "
                       "(several passive parties: vfl.passive_parties)")
    add_party_arguments(party)
    party.set_defaults(func=_vfl_party)
    prof = vsub.add_parser("profile", help="single-worker compute profile of each party and "
                           "the throughput ceiling (writes OUT/profile.json)")
    prof.add_argument("--config", help="TOML file with a [vfl] table")
    prof.add_argument("--dataset", help="dataset (as for vfl run)")
    prof.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config key (repeatable)")
    prof.add_argument("--out", required=True, help="output directory (profile.json)")
    prof.add_argument("--min-time-s", type=float, default=3.0,
                      help="time each party's steps for at least this many CPU seconds")
    prof.add_argument("--layout", choices=["auto", "concurrent", "alone"], default="auto",
                      help="concurrent: both parties at once, each in its own pinned process "
                      "(the run's layout; auto picks it when both are pinned to disjoint "
                      "CPUs); alone: one party at a time")
    _add_sweep_args(prof)
    prof.set_defaults(func=_vfl_profile)
    _add_plan_parser(vsub)
    _add_align_parser(vsub)
    _add_schema_parser(vsub)

    syn = sub.add_parser("synth", help="FedForge: federated differentially private synthesis")
    ssub = syn.add_subparsers(dest="synth_command", required=True)
    srun = ssub.add_parser("run", help="start broker, coordinator, aggregators and parties as "
                           "processes; write RUN_DIR/synthetic.csv and metrics.json")
    srun.add_argument("--dataset", help="a named dataset (adult, bank) or a CSV/Parquet path, "
                      "split over --parties parties (a simulation)")
    srun.add_argument("--parties", type=int, help="K, data-holding parties (default 10)")
    srun.add_argument("--party-files", nargs="+", metavar="FILE",
                      help="instead of --dataset/--parties: each branch's own table (CSV or "
                      "Parquet, the same columns), one party process each, K = their count")
    srun.add_argument("--schema", help="with --party-files: the public schema (a reviewed "
                      "TOML file, `psfl vfl schema`); without it the domain is inferred from "
                      "the rows, outside the privacy guarantee (a warning)")
    srun.add_argument("--holdout", help="with --party-files: real rows no party holds, for "
                      "the quality report (evaluation only)")
    srun.add_argument("--epsilon", type=float, help="epsilon of the release (default 1)")
    srun.add_argument("--mechanism", help="clique selection: mst (default) or aim (adaptive rounds)")
    srun.add_argument("--engine", help="synthesis engine: auto (default: mbi if installed, "
                      "else neural), mbi, neural or diffusion")
    srun.add_argument("--out", required=True, help="run directory (may exist; overwritten)")
    srun.add_argument("--config", help="TOML file with a [synth] table")
    srun.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config key, e.g. --set secagg.bits=10 (repeatable)")
    srun.add_argument("--broker", help="use a running broker tcp://HOST:PORT")
    srun.add_argument("--run-id", help="run id (topic namespace); default random")
    srun.add_argument("--timeout-s", type=float, default=None,
                      help="kill the job after this many seconds")
    srun.add_argument("--kill-coordinator-at", metavar="STAGE[@POINT]",
                      help="fault: kill -9 the coordinator at this stage (e.g. round:select, "
                      "or round:select@unmask for an exact point) and restart it with --resume")
    srun.add_argument("--kill-party", action="append", default=[], metavar="ID@STAGE",
                      help="fault: kill -9 party ID (p000, p001, ...) when the coordinator "
                      "starts STAGE (e.g. p002@round:select); the run completes with the "
                      "survivors, or fails (exit 1) below secagg.min_survivors (repeatable)")
    srun.add_argument("--queries", metavar="FILE",
                      help="JSON: a list of workload updates (each as for add-workload) "
                      "measured after the mechanism's rounds as queries of the run's "
                      "secure-aggregation session (its keys and first seed batch serve "
                      "them all); needs stream.rho_frac > 0")
    add_security_arguments(srun, kind="launcher")
    srun.set_defaults(func=_synth_run)
    ssch = ssub.add_parser("schema", help="DRAFT the public schema of a FedForge table from "
                           "one branch's file (every column, the label included; numeric and "
                           "categorical kinds only): NOT private until reviewed")
    ssch.add_argument("--dataset", required=True, help="one branch's file (CSV or Parquet)")
    ssch.add_argument("--out", required=True, help="schema TOML file to write")
    ssch.add_argument("--min-count", type=int, default=10,
                      help="leave out categories seen fewer times (default 10)")
    ssch.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    ssch.set_defaults(func=_synth_schema)
    swl = ssub.add_parser("add-workload", help="add queries (marginals, weights) to a run in "
                          "progress or finished: measure only what is missing, refit from "
                          "the current model")
    swl.add_argument("run_dir", help="the run directory (psfl synth run --out)")
    swl.add_argument("queries", help='JSON: {"marginals": [["a","b","c"], ...], '
                     '"weights": {"a,b": 2.0}, "rho_share": 0.5}')
    swl.add_argument("--rho-share", type=float, help="fraction of the remaining stream "
                     "reserve of rho to spend (overrides the file's rho_share)")
    swl.add_argument("--compare-full", action="store_true",
                     help="also refit from scratch and report both refits' time and error")
    swl.add_argument("--timeout-s", type=float, default=None,
                     help="kill the reopened job after this many seconds")
    add_security_arguments(swl, kind="launcher")
    swl.set_defaults(func=_synth_add_workload)

    dat = sub.add_parser("data", help="data files: convert a CSV to Parquet shards")
    dsub = dat.add_subparsers(dest="data_command", required=True)
    conv = dsub.add_parser("convert", help="CSV/TSV (gzip or not) to Parquet shards, "
                           "streamed; --party NAME=COL,COL... writes one directory per party "
                           "(aligned by row order, for vfl.data.party_datasets)")
    conv.add_argument("src", help="the CSV file")
    conv.add_argument("out", help="the output directory (empty)")
    conv.add_argument("--party", action="append", default=[], metavar="NAME=COL,COL",
                      help="a party's directory and its columns (repeat per party)")
    conv.add_argument("--shard-rows", type=int, default=1_000_000)
    conv.add_argument("--delimiter", default=",", help="field separator (\\t for TSV)")
    conv.add_argument("--names", default="", help="comma-separated column names for a file "
                      "without a header row")
    conv.set_defaults(func=_data_convert)

    bp = dsub.add_parser("bank-partner", help="generate the 'a bank and its partner' files: "
                         "OUT/bank/{bank,bank-new}.csv, OUT/partner/{partner,partner-new}.csv "
                         "(keyed by customer_id) and OUT/reference/merged.csv")
    bp.add_argument("--out", required=True, help="output directory (must not hold the files)")
    bp.add_argument("--customers", type=int, default=5000, help="customers per organisation "
                    "(default 5000; 10 %% of each side's are not in the other's file)")
    bp.add_argument("--new-customers", type=int, default=1000,
                    help="new customers per organisation to predict (default 1000)")
    bp.add_argument("--seed", type=int, default=0)
    bp.set_defaults(func=_data_bank_partner)

    sm = dsub.add_parser("schema-merge", help="merge the public schemas of several holders "
                         "of one table (FedForge branches): union of categories, widest "
                         "ranges, most buckets; different kinds refused")
    sm.add_argument("schemas", nargs="+", help="the schema TOML files (each reviewed)")
    sm.add_argument("--out", required=True, help="the merged schema TOML to write")
    sm.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    sm.set_defaults(func=_data_schema_merge)

    simp = sub.add_parser("sim", help="heterogeneous clusters on one machine")
    simsub = simp.add_subparsers(dest="sim_command", required=True)
    srun2 = simsub.add_parser("run", help="run a scenario: CPU shares, shaped links and faults "
                              "per party; writes RUN_DIR/metrics.json with a 'sim' object")
    srun2.add_argument("scenario", help="scenario TOML: [scenario] and [vfl] tables, or [consortium] "
                       "and [synth] (sim/scenarios/consortium.toml)")
    srun2.add_argument("--out", required=True, help="run directory")
    srun2.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override scenario.* or vfl.* (consortium.* or synth.*) keys "
                       "(repeatable)")
    srun2.add_argument("--insecure", action="store_true", help="plaintext bus (default: CURVE "
                       "with keys made for the run); prints a warning")
    srun2.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    srun2.add_argument("--compare-online", action="store_true",
                       help="[consortium] scenarios: first run it with every site online "
                       "(into RUN_DIR/online) and report both errors side by side")
    srun2.set_defaults(func=_sim_run)

    bench = sub.add_parser("bench", help="run bench/NAME.py (e.g. psfl bench bus --quick)")
    bench.add_argument("name", help="benchmark name: bench/NAME.py of this checkout, e.g. "
                       "bus, vfl_table, synth_table (an unknown name lists them all)")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    bench.set_defaults(func=_bench)

    rep = sub.add_parser("report", help="PNG plots of the runs in or below RUN_DIR: VFL "
                         "(metric vs time, CPU use, worker Gantt), FedForge (stage "
                         "timeline, TV per marginal, privacy budget per party)")
    rep.add_argument("run_dir", metavar="RUN_DIR", help="a run directory or a benchmark "
                     "directory of runs (every metrics.json below it)")
    rep.add_argument("--out", help="output directory (default RUN_DIR/plots)")
    rep.add_argument("--max-batches", type=int, default=40, metavar="N",
                     help="Gantt window: the first N batches after training start (default 40)")
    rep.add_argument("--window-s", metavar="A:B", help="Gantt window: A to B seconds after "
                     "training start instead (B alone means 0:B)")
    rep.set_defaults(func=_report)

    br = sub.add_parser("broker", help="the XSUB/XPUB broker")
    bsub = br.add_subparsers(dest="broker_command", required=True)
    add_broker(bsub)
    brun = bsub.choices["run"]
    brun.add_argument("--job", help="serve one cross-organisation job (job.toml): only its "
                      "parties' identities may take part in its runs (training, alignment, "
                      "prediction), every other run is refused (a run membership made from "
                      "the job; not with --members or --run)")
    brun.set_defaults(func=_broker_run)

    from pubsub.cli import add_keys_subcommands

    keys = sub.add_parser("keys", help="CURVE keypairs for the broker and the clients")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    add_keys_subcommands(ksub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``psfl``."""
    from broker.cli import main as _unused  # noqa: F401  (import errors surface early)
    from pubsub.cli import run_guarded

    parser = build_parser()
    args = parser.parse_args(argv)
    return run_guarded(lambda: args.func(args))


if __name__ == "__main__":
    # ``python -m sim.cli``: every launcher has stopped its children and written its
    # files when main returns; skip the interpreter's teardown (pubsub.cli.exit_now).
    # The ``psfl`` console script keeps the normal exit.
    from pubsub.cli import exit_now

    exit_now(main())
