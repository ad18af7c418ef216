"""Assemble a run's ``metrics.json`` from the two parties' metrics and the broker's counters."""

from __future__ import annotations

from typing import Any

from parties.config import VflConfig


def format_metric(value: object) -> str:
    """A test metric for one-line summaries: 4 decimals, or ``undefined`` (None/NaN)."""
    if isinstance(value, float) and value == value:
        return f"{value:.4f}"
    return "undefined"


def _sum_dicts(*ds: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in ds:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def training_window_s(active_history: list[dict[str, Any]],
                      passive_history: list[dict[str, Any]] | None,
                      *more: list[dict[str, Any]] | None) -> float:
    """Seconds of training: per training segment, the longer of the two parties' own
    segment clocks (``train_s`` of each history entry, matched by position), summed.

    Each party's clock runs over its own share of a segment, and the two shares are
    offset: the passive party starts on the active party's word and ends after the last
    gradient's backward and its flush. With the passive party the slower, up to
    ``w_passive`` gradients wait for it when the active party's clock has stopped: at
    50:14 (``bench/hetero.py --quick``, 18 batches a segment) the passive clocks were 17 %
    longer in all, and a throughput over the active party's clock alone overstated
    PubSub-VFL's by as much. The longer clock is a lower bound of the segment's span
    from the first party's start to the last one's end (the clocks of two processes,
    possibly on two hosts, are not compared). Without the passive party's history (it
    never reported) the active party's clocks are used.

    Args:
        active_history / passive_history: the parties' ``history`` lists (entries with
            ``train_s``, seconds).
        more: the other passive parties' histories (several passive parties: per segment
            the longest of all the clocks).

    Returns:
        Seconds (float, >= 0).
    """
    a = [float(h["train_s"]) for h in active_history]
    others = [[float(h["train_s"]) for h in (hist or [])] for hist in (passive_history, *more)]
    return sum(max([x, *(p[i] for p in others if i < len(p))]) for i, x in enumerate(a))


def assemble_metrics(cfg: VflConfig, run_id: str, active: dict[str, Any],
                     passive: dict[str, Any] | None, *,
                     reports: dict[str, dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """The run's metrics (see docs/reference/metrics.md).

    Args:
        cfg: effective config.
        run_id: run id (topic namespace).
        active: the active party's metrics, including ``task``, ``metric_name``
            (``"auc"`` or ``"rmse"``), ``metric``, the same value as ``test_<metric_name>``,
            and ``broker``.
        passive: the passive party's report, or None if it never arrived.
        reports: several passive parties: each one's report by party id (None: never
            arrived); ``passive`` is then ignored. ``parties`` gets one entry per party,
            the drop counts add up, the training window is the longest clock per
            segment, ``dp`` is the first passive party's and ``dp_by_party`` each one's
            own (each passive party keeps its own ledger).

    Returns:
        A JSON-ready dict with ``algo``, ``dataset``, ``task``, ``test_auc`` (binary)
        or ``test_rmse`` (regression), ``metric_name``, ``metric``, ``epochs``,
        ``wall_s``, ``train_wall_s`` (the active party's training clock),
        ``train_window_s`` (both parties' training, :func:`training_window_s`) and
        ``train_samples_per_s`` (samples ÷ ``train_window_s``; training only: the
        validation and test scoring is excluded, and reported as ``eval_s``),
        ``target_metric`` and ``time_to_target_s`` (training seconds until the
        validation metric first reached the target; None if never, or no target),
        ``history`` (one entry per validation point), ``model`` (the model specs,
        :meth:`parties.models.zoo.ModelFactory.describe`), per-party ``cpu_util`` (CPU
        seconds ÷ (wall seconds × allotted cores) from the handshake with the partner to the
        party's end, validation and test scoring included), ``cpu_util_train`` (the same over the
        party's own training segments only) and
        ``wait_s_per_epoch``, ``bytes_sent`` by channel, ``broker_bytes``,
        ``dropped_batches``, ``reassigned_batches``, ``security`` (the active party's
        transport, identity and role) and ``dp``
        (the privacy spent, from the passive party's ledger: see
        :func:`parties.privacy.dp.report`; ``dp.labels``: the active party's label
        protection from its own ledger, :func:`parties.privacy.labels.labels_report`).
    """
    # imported here: parties.privacy.dp needs torch, and this module is also imported by the
    # launcher's command line, which should start without it
    from parties.privacy.dp import plan_from_config
    from parties.privacy.dp import report as dp_report
    from parties.privacy.labels import labels_report

    broker = active.get("broker") or {}
    ns = broker.get("namespace_bytes", {})
    name = active["metric_name"]
    key = f"test_{name}"
    top_level = ("broker", "task", key, "metric_name", "metric", "target_metric",
                 "time_to_target_s", "history", "model", "active_only", "labels")
    parties = {"active": {k: v for k, v in active.items() if k not in top_level}}
    got = dict(reports) if reports is not None else {"passive": passive}
    present = {p: r for p, r in got.items() if r is not None}
    for party, rep in present.items():
        parties[party] = {k: v for k, v in rep.items() if k != "dp"}  # top-level dp
    bytes_sent = _sum_dicts(*(p.get("bytes_sent", {}) for p in parties.values()))
    train_wall = active["train_wall_s"]
    window = (training_window_s(active.get("history", []),
                                *(r.get("history") for r in present.values()))
              if present and active.get("history") else train_wall)
    first = got.get(next(iter(got))) if got else None
    extra: dict[str, Any] = {}
    # a report lost (its party gone, or past every request for it again) is named here
    extra["reports_missing"] = sorted(p for p, r in got.items() if r is None)
    if reports is not None:
        extra["dp_by_party"] = {p: (r or {}).get("dp") or dp_report(plan_from_config(cfg), None)
                                for p, r in got.items()}
        extra["link_by_party"] = {p: (r or {}).get("link") for p, r in got.items()}
    return {
        "algo": cfg.algo,
        "dataset": cfg.dataset if not cfg.data.party_datasets else ", ".join(cfg.data.party_datasets),
        "streamed": bool(cfg.data.stream),
        "run_id": run_id,
        "security": active.get("security", {}),
        "task": active["task"],
        key: active[key],
        "metric_name": name,
        "metric": active["metric"],
        # binary task: the label value counted as positive (what the AUC ranks)
        "label_positive": active.get("label_positive"),
        "epochs": cfg.epochs,
        "model": active.get("model"),
        "wall_s": train_wall,
        "train_wall_s": train_wall,
        "train_window_s": window,
        "train_samples_per_s": active["samples"] / window if window > 0 else 0.0,
        "eval_s": active.get("eval_s", 0.0),
        "target_metric": active.get("target_metric"),
        "time_to_target_s": active.get("time_to_target_s"),
        "parties": parties,
        "bytes_sent": bytes_sent,
        "broker_bytes": {
            "emb": ns.get(f"emb/{run_id}", 0),
            "grad": ns.get(f"grad/{run_id}", 0),
            "eval": ns.get(f"eval/{run_id}", 0),
            "ctl": ns.get(f"ctl/{run_id}", 0),
            "ids": ns.get(f"ids/{run_id}", 0),
        },
        "dropped_batches": active["dropped_batches"]
        + sum(r.get("dropped_batches", 0) for r in present.values()),
        "reassigned_batches": active["reassigned_batches"]
        + sum(r.get("reassigned_batches", 0) for r in present.values()),
        "history": active.get("history", []),
        "broker": broker or None,
        "passive_report_missing": len(present) < len(got),
        "dp": {**((first or {}).get("dp") or dp_report(plan_from_config(cfg), None)),
               # the active party's labels (parties.privacy.labels): its own ledger
               "labels": active.get("labels") or labels_report(cfg.labels)},
        # the active party's own columns alone (parties.algorithms.baseline); None when not asked for
        "active_only": active.get("active_only"),
        # pubsub: what the (first) passive party measured of its link: round trips, the
        # in-flight window's depth over time, bytes per sample (parties.algorithms.schedule.InflightWindow)
        "link": (first or {}).get("link"),
        **extra,
    }
