"""System profiling and planning for the ``psfl`` commands (PubSub-VFL, arXiv
2510.12494, Sec. 4): the batch-size sweep of every party, the communication probe
through a real broker, the cost-model fits, and the planner's choice of
``(w_active, w_passive, B)`` (with several passive parties, one worker count per passive
party: ``passive_party_workers``).

``psfl vfl profile --sweep`` calls :func:`sweep_profile`; ``psfl vfl plan`` calls
:func:`plan_from_profile`; ``psfl vfl run --plan auto`` calls :func:`auto_plan` and
then trains with the planned configuration.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from parties.config import VflConfig
from parties.planning.planner import DEFAULT_BATCH_SIZES, DEFAULT_W_MAX, Plan, plan_for_config
from parties.algorithms.samples import SamplesModel
from parties.planning.sweep import DEFAULT_SWEEP_BATCH_SIZES, CostModels

log = structlog.get_logger(__name__)

#: Default CPU seconds (forward + backward) timed per swept B and party.
DEFAULT_SWEEP_MIN_TIME_S = 0.25
#: Timed round trips per message size of the communication probe.
DEFAULT_COMM_REPS = 30


def sweep_profile(cfg: VflConfig, out: Path, *,
                  batch_sizes: Sequence[int] = DEFAULT_SWEEP_BATCH_SIZES,
                  min_time_s: float = DEFAULT_SWEEP_MIN_TIME_S, broker: str | None = None,
                  comm_reps: int = DEFAULT_COMM_REPS) -> tuple[dict[str, Any], CostModels]:
    """Sweep every party, probe the bus, fit the cost models.

    Args:
        cfg: the run's config (model, data, CPUs, threads).
        out: directory for the broker's files (``broker.addr``, ``broker-events.jsonl``)
            when one is started here.
        batch_sizes: swept B values (capped by the training rows).
        min_time_s: CPU seconds timed per B and party.
        broker: probe through this running broker instead of starting one on 127.0.0.1.
        comm_reps: timed round trips per message size.

    Returns:
        ``(doc, models)``: ``doc`` holds ``"sweep"`` (the raw measurements) and
        ``"cost_model"`` (:meth:`CostModels.to_dict`) for ``profile.json``.

    Raises:
        parties.planning.sweep.BadBatchSizes / SweepError: bad B values, a failed child.
        parties.planning.commprobe.CommProbeError: no pong through the broker.
        parties.planning.costmodel.CostModelError: a fit is impossible.
        sim.launch.vfl.LaunchError: the broker did not start.
        pubsub.BrokerUnreachable: ``broker`` does not answer.
    """
    from parties.planning.commprobe import cut_layer_sizes, measure_comm
    from parties.planning.sweep import fit_cost_models, sweep_config

    from sim.launch.vfl import _stop, start_broker

    sweeps = sweep_config(cfg, batch_sizes, min_time_s=min_time_s)
    swept = sweeps["active"].batch_sizes
    sizes = cut_layer_sizes(swept, cfg.model.embedding_dim)
    proc = None
    try:
        if broker is None:
            proc, broker = start_broker(out, out / "broker-events.jsonl")
        comm = measure_comm(sizes, broker, reps=comm_reps)
    finally:
        if proc is not None:
            _stop(proc)
            (out / "broker.addr").unlink(missing_ok=True)
    models = fit_cost_models(sweeps["active"], sweeps["passive"], comm.fit(),
                             embedding_dim=cfg.model.embedding_dim,
                             more_passive=[sweeps[p] for p in cfg.party_ids[2:]])
    doc = {"sweep": {**{p: sweeps[p].to_dict() for p in cfg.party_ids},
                     "comm": comm.to_dict(), "min_time_s": min_time_s,
                     "comm_reps": comm_reps},
           "cost_model": models.to_dict()}
    return doc, models


def default_memory_rule(cfg: VflConfig, models: CostModels) -> str:
    """``"per_worker"`` when the parties' workers are processes (each its own baseline),
    else ``"shared"`` (see :mod:`parties.planning.planner`)."""
    modes = {cfg.workers.resolved_mode(m.cores) for m in (models.active, *models.passives)}
    return "per_worker" if "process" in modes else "shared"


def plan_from_models(models: CostModels, cfg: VflConfig, *, w_max: int = DEFAULT_W_MAX,
                     batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                     mem_limit_bytes: float | None = None,
                     memory_rule: str | None = None,
                     samples: SamplesModel | None = None) -> tuple[Plan, dict[str, Any]]:
    """:func:`parties.planning.planner.plan_for_config` on fitted models.

    B values above the training rows are dropped. ``mem_limit_bytes`` is each party's
    budget M̄ (None: unlimited; one budget, so every passive party gets it). The models
    must be of ``cfg``'s parties: one passive party, or ``vfl.passive_parties`` of them.
    ``samples``: a measured samples-to-target model: plan for time to target
    (:func:`parties.planning.planner.plan`).

    Returns:
        ``(plan, inputs)``: the plan and the planner's inputs (for ``plan.json``).

    Raises:
        parties.planning.planner.NoFeasiblePlan / PlannerError: as the planner.
        pubsub.config.ConfigError: the profile's passive parties are not ``cfg``'s.
    """
    from parties.planning.planner import PlannerError, mean_sync_interval
    from pubsub.config import ConfigError

    if len(models.passives) != cfg.passive_parties:
        raise ConfigError("vfl.passive_parties", f"the profile has cost models of "
                          f"{len(models.passives)} passive part"
                          f"{'ies' if len(models.passives) > 1 else 'y'}; profile the "
                          f"planned parties (psfl vfl profile --sweep), got "
                          f"{cfg.passive_parties}")

    bs = tuple(sorted({int(b) for b in batch_sizes if int(b) <= models.n_train}))
    if not bs:
        raise PlannerError(f"no candidate batch size in {list(batch_sizes)} is at most the "
                           f"{models.n_train} training rows")
    rule = memory_rule or default_memory_rule(cfg, models)
    active = dataclasses.replace(models.active, mem_limit_bytes=mem_limit_bytes)
    passives = [dataclasses.replace(m, mem_limit_bytes=mem_limit_bytes)
                for m in models.passives]
    plan = plan_for_config(active, passives, cfg, models.n_train, w_max=w_max,
                           batch_sizes=bs, memory_rule=rule, samples=samples)
    swept = models.batch_sizes
    inputs = {"n_rows": models.n_train, "embedding_dim": cfg.model.embedding_dim,
              "threads": cfg.workers.torch_threads, "w_max": w_max, "batch_sizes": list(bs),
              "delta_t": mean_sync_interval(cfg.epochs, cfg.workers.delta_t0),
              "memory_rule": rule, "mem_limit_bytes": mem_limit_bytes,
              "samples_model": None if samples is None else samples.to_dict(),
              "cores": {party: m.cores for party, m in
                        zip(cfg.party_ids, (active, *passives), strict=True)},
              "extrapolated_batch_sizes": [b for b in bs
                                           if b < min(swept) or b > max(swept)]}
    log.info("vfl.plan", w_active=plan.w_active, w_passive=plan.w_passive,
             passive_party_workers=plan.passive_party_workers,
             batch_size=plan.batch_size, epoch_s=plan.epoch_s)
    return plan, inputs


def plan_doc(plan: Plan, inputs: Mapping[str, Any], profile_path: Path | str) -> dict[str, Any]:
    """``plan.json``: the plan's :meth:`~parties.planning.planner.Plan.to_dict`, the planner's
    inputs and the profile it came from."""
    return {**plan.to_dict(), "inputs": dict(inputs), "profile": str(profile_path)}


def format_plan(plan: Plan) -> list[str]:
    """Readable lines: the per-B table and the choice."""
    def s(v: float) -> str:
        return "      inf" if not math.isfinite(v) else f"{v:9.3f}"

    if len(plan.passive_party_workers) > 1:
        return _format_plan_parties(plan)
    lines = ["     B  w_a  w_p  T_active s  T_passive s    epoch s"]
    for r in plan.table:
        mark = "  <- plan" if r.batch_size == plan.batch_size else ""
        lines.append(f"{r.batch_size:>6} {r.w_active:>4} {r.w_passive:>4}  {s(r.t_active_s)}"
                     f"    {s(r.t_passive_s)}  {s(r.epoch_s)}"
                     + ("  (memory)" if not r.feasible else "") + mark)
    lines.append(f"plan: w_active {plan.w_active}, w_passive {plan.w_passive}, "
                 f"B {plan.batch_size}: predicted epoch {plan.epoch_s:.3f} s "
                 f"(bound by {plan.bound_by}; idle active {plan.idle_active:.0%}, passive "
                 f"{plan.idle_passive:.0%})")
    if plan.samples_model is not None:
        lines.append(f"planned for time to target: predicted samples to target x"
                     f"{plan.samples_ratio:.2f} of 1 + 1 workers at B "
                     f"{plan.samples_model['batch_size_ref']}, so the table's rows are each "
                     "B's fastest to target")
    return lines


def _format_plan_parties(plan: Plan) -> list[str]:
    """:func:`format_plan` with several passive parties: workers and times per party."""
    def s(v: float) -> str:
        return "inf" if not math.isfinite(v) else f"{v:.3f}"

    lines = ["     B  workers (active, passive, passive2, ...)  T_p s (same order)  epoch s"]
    for r in plan.table:
        mark = "  <- plan" if r.batch_size == plan.batch_size else ""
        ws = ",".join(str(w) for w in (r.w_active, *r.passive_party_workers))
        ts = ",".join(s(t) for t in (r.t_active_s, *r.t_passive_party_s))
        lines.append(f"{r.batch_size:>6}  {ws:<40} {ts:<19} {s(r.epoch_s):>8}"
                     + ("  (memory)" if not r.feasible else "") + mark)
    idle = ", ".join(f"{p.party} {p.idle:.0%}" for p in plan.parties)
    lines.append(f"plan: w_active {plan.w_active}, passive_party_workers "
                 f"{list(plan.passive_party_workers)}, B {plan.batch_size}: predicted epoch "
                 f"{plan.epoch_s:.3f} s (bound by {plan.bound_by}; idle {idle})")
    return lines


def auto_plan(cfg: VflConfig, out: Path, *, broker: str | None = None,
              min_time_s: float = DEFAULT_SWEEP_MIN_TIME_S,
              sweep_batch_sizes: Sequence[int] = DEFAULT_SWEEP_BATCH_SIZES,
              w_max: int = DEFAULT_W_MAX, samples: SamplesModel | str | None = None
              ) -> tuple[VflConfig, dict[str, Any]]:
    """Profile (sweep with ``cfg``'s model and data), plan, and return ``cfg`` with the
    planned ``w_active``, ``w_passive`` (``passive_party_workers`` with several passive
    parties) and ``batch_size`` (:func:`apply_plan`), and the plan's document.

    ``samples``: None plans for throughput; a samples-to-target model, or ``"pilot"`` to
    measure one first (:func:`sim.launch.pilot.pilot_samples_model`, four training runs on
    ``cfg`` in this process, files in ``out/pilots``), plans for time to target.

    Writes ``out/profile.json`` and ``out/plan.json`` (``out`` is created).

    Raises:
        as :func:`sweep_profile` and :func:`plan_from_models`; OSError: ``out``.
    """
    from parties.cli import write_json

    out.mkdir(parents=True, exist_ok=True)
    doc, models = sweep_profile(cfg, out, batch_sizes=sweep_batch_sizes,
                                min_time_s=min_time_s, broker=broker)
    doc["settings"] = {"config": _config_mapping(cfg)}
    write_json(out / "profile.json", doc)
    pilots = None
    if samples == "pilot":
        from sim.launch.pilot import pilot_samples_model

        samples, pilots = pilot_samples_model(cfg, out / "pilots")
    elif isinstance(samples, str):
        raise ValueError(f"samples must be a SamplesModel, 'pilot' or None, got {samples!r}")
    plan, inputs = plan_from_models(models, cfg, w_max=w_max, samples=samples)
    pdoc = plan_doc(plan, inputs, out / "profile.json")
    if pilots is not None:
        pdoc["pilots"] = pilots
    write_json(out / "plan.json", pdoc)
    return apply_plan(cfg, plan), pdoc


def load_samples_model(path: str | Path) -> SamplesModel:
    """A samples-to-target model from a JSON file: the model itself
    (:meth:`parties.algorithms.samples.SamplesModel.to_dict`), or a plan.json or pilot document that
    holds one (``samples_model``, or ``pilots.model``).

    Raises:
        OSError: the file cannot be read (naming it).
        ValueError: not JSON, or no valid model in it (naming the file).
    """
    import json

    from parties.algorithms.samples import SamplesModelError

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise OSError(f"cannot read the samples model {str(p)!r}: "
                      f"{exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{str(p)!r} is not JSON: {exc}") from None
    if isinstance(doc, dict):
        for key in ("samples_model", "model"):
            if isinstance(doc.get(key), dict):
                doc = doc[key]
                break
        else:
            if isinstance(doc.get("pilots"), dict) and isinstance(doc["pilots"].get("model"),
                                                                  dict):
                doc = doc["pilots"]["model"]
    try:
        return SamplesModel.from_dict(doc)
    except SamplesModelError as exc:
        raise ValueError(f"{str(p)!r}: no samples model ({exc})") from None


def apply_plan(cfg: VflConfig, plan: Plan | Mapping[str, Any]) -> VflConfig:
    """``cfg`` with the plan's ``w_active``, ``w_passive`` and ``batch_size``, and with
    several passive parties each one's count (``passive_party_workers``; ``w_passive``
    is then the first's). ``vfl-ps`` pairs every active worker with one worker of every
    passive party, so it runs the fewest planned passive workers on every passive party
    (as it runs ``min(w_active, w_passive)`` pairs with two parties).

    A plan without ``passive_party_workers`` (a two-party plan.json written before it
    existed) plans one passive party.

    Raises:
        pubsub.config.ConfigError: the plan's passive parties are not ``cfg``'s (key
            ``vfl.passive_parties``), or the planned values are invalid.
    """
    from pubsub.config import ConfigError

    d = plan.to_dict() if isinstance(plan, Plan) else plan
    w_p = int(d["w_passive"])
    per_party = tuple(int(w) for w in d.get("passive_party_workers") or (w_p,))
    if len(per_party) != cfg.passive_parties:
        raise ConfigError("vfl.passive_parties", f"the plan is for {len(per_party)} "
                          f"passive part{'ies' if len(per_party) > 1 else 'y'} "
                          f"(passive_party_workers {list(per_party)}), got "
                          f"{cfg.passive_parties}")
    if cfg.algo == "vfl-ps":
        per_party = (min(per_party),) * len(per_party)
    return dataclasses.replace(cfg, batch_size=int(d["batch_size"]),
                               workers=dataclasses.replace(
                                   cfg.workers, active=int(d["w_active"]), passive=per_party[0],
                                   per_passive_party=per_party if len(per_party) > 1 else ()))


def _config_mapping(cfg: VflConfig) -> dict[str, Any]:
    from pubsub.config import to_mapping

    return dict(to_mapping(cfg))


def load_plan_config(base: Mapping[str, Any] | None, path: str | Path | None = None,
                     sets: Sequence[str] = ()) -> VflConfig:
    """The planning config: ``base`` (the profiled run's config from ``profile.json``;
    None: the defaults), then the TOML file's ``[vfl]`` table, then ``--set`` items.

    Raises:
        pubsub.config.ConfigError: unknown section or key, or an invalid value.
    """
    from pubsub.config import ConfigError, deep_merge, from_mapping, load_toml
    from pubsub.config import parse_overrides

    data: dict[str, Any] = load_toml(path) if path else {}
    unknown = set(data) - {"vfl"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown section (expected [vfl])")
    over = parse_overrides(sets)
    from parties.config import migrate_saved

    # a profile.json written before the configuration's sections: its flat keys migrated
    table = deep_merge(migrate_saved(base or {}), dict(data.get("vfl", {})))
    table = deep_merge(table, over.get("vfl", {}))
    table = deep_merge(table, {k: v for k, v in over.items() if k != "vfl"})
    return from_mapping(VflConfig, table, section="vfl")


__all__ = ["DEFAULT_COMM_REPS", "DEFAULT_SWEEP_MIN_TIME_S", "apply_plan", "auto_plan",
           "default_memory_rule", "format_plan", "load_plan_config", "plan_doc",
           "plan_from_models",
           "sweep_profile"]
