"""A party's bookkeeping, apart from its I/O loop (:mod:`parties.runtime.party`): the
training clock and CPU figures of each history entry's span, the history itself (and the
active party's progress line), and the party's figures for ``metrics.json``.

Owns: :class:`Mark`, :class:`RunBook`, :func:`party_metrics`. May import
:mod:`parties.core` and :mod:`parties.algorithms` (the message kinds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parties.algorithms.actions import EMB, GRAD
from parties.core.sysinfo import CpuMeter, run_delay_s


@dataclass(slots=True)
class Mark:
    """The counters and clocks at the start of a history entry's span (mutable: reset
    at each validation point scored in flight)."""

    before: tuple[float, ...]
    meter: CpuMeter
    delay0: float | None
    cc0: float
    sc0: float
    t0: float

    @classmethod
    def start(cls, before: tuple[float, ...], cc0: float, sc0: float,
              t0: float) -> Mark:
        """A mark at ``t0``, its CPU meter started now."""
        meter = CpuMeter()
        meter.start()
        return cls(before=before, meter=meter, delay0=run_delay_s(), cc0=cc0, sc0=sc0, t0=t0)

    def reset(self, other: Mark) -> None:
        """Take ``other``'s counters and clocks (the next span of the same segment)."""
        self.before, self.meter, self.delay0 = other.before, other.meter, other.delay0
        self.cc0, self.sc0, self.t0 = other.cc0, other.sc0, other.t0


class RunBook:
    """The party's training clock, CPU figures and history.

    Args:
        role: ``"active"`` or ``"passive"``.
        workers: the party's workers (its wait time is per worker).
        epochs: the run's epochs (the progress line).
        metric: the task's metric name (``auc``, ``rmse``).
        progress: print the active party's progress line per history entry.
        log: the party's bound logger.
        counters: the strategy's counters (loss, samples, drops, reassignments).
        wait_s / compute_cpu_s / sync_cpu_s: the workers' wait, compute CPU and sync CPU
            seconds so far.
    """

    def __init__(self, *, role: str, workers: int, epochs: int, metric: str, progress: bool,
                 log: Any, counters: Any, wait_s: Callable[[], float],
                 compute_cpu_s: Callable[[], float], sync_cpu_s: Callable[[], float]) -> None:
        self.role = role
        self.workers = workers
        self.epochs = epochs
        self.metric = metric
        self.progress = progress
        self.log = log
        self.c = counters
        #: the workers' wait seconds so far (a callable)
        self.wait_s = wait_s
        self._compute_cpu_s = compute_cpu_s
        self._sync_cpu_s = sync_cpu_s
        self.train_s = 0.0  # training wall time, evaluation excluded
        self.run_delay_s = 0.0  # of it, threads runnable but waiting for a CPU
        self.eval_s = 0.0
        #: training segments run (each ends in a drain and PS sync) and validation
        #: points scored while a segment trained (``vfl.val_overlap``)
        self.segments = 0
        self.points_in_flight = 0
        self.train_cpu_s = 0.0  # CPU seconds of the training segments (scoring excluded)
        self.train_compute_cpu_s = 0.0  # of which in the workers' compute calls
        self.train_sync_cpu_s = 0.0  # of which in their parameter-server syncs
        self.t0 = time.perf_counter()
        self.history: list[dict[str, Any]] = []

    def open_mark(self, cc0: float | None = None, sc0: float | None = None,
                   t0: float | None = None) -> Mark:
        """The counters and clocks at the start of a history entry's span (the CPU
        meters and the clock read now unless given)."""
        c = self.c
        return Mark.start(
            (c.loss_sum, c.loss_n, c.samples, self.wait_s(), c.dropped, c.reassigned),
            self._compute_cpu_s() if cc0 is None else cc0,
            self._sync_cpu_s() if sc0 is None else sc0,
            time.perf_counter() if t0 is None else t0)

    def close_mark(self, mark: Mark, epoch: int, s: int, n_segs: int, t1: float,
                    done: float) -> dict[str, Any]:
        """A history entry for the span from ``mark`` to ``t1`` (training time), ``done``
        of the epoch's ``n_segs`` segments done; ``mark`` is reset to ``t1`` for the next
        span of the same segment."""
        c, before = self.c, mark.before
        dt = t1 - mark.t0
        delay1 = run_delay_s()
        delay = (delay1 - mark.delay0) \
            if mark.delay0 is not None and delay1 is not None else None
        if delay is not None:
            self.run_delay_s += delay
        _, seg_cpu, _, util = mark.meter.read()
        self.train_cpu_s += seg_cpu
        cc1, sc1 = self._compute_cpu_s(), self._sync_cpu_s()
        self.train_compute_cpu_s += cc1 - mark.cc0
        self.train_sync_cpu_s += sc1 - mark.sc0
        self.train_s += dt
        entry: dict[str, Any] = {
            "epoch": epoch, "segment": s,
            "epochs_done": round(epoch + done, 6),
            "train_s": dt, "train_wall_s": self.train_s,
            "samples_per_s": (c.samples - before[2]) / dt if dt > 0 else 0.0,
            "wait_s": (self.wait_s() - before[3]) / self.workers,
            "cpu_util": util, "run_delay_s": delay,
            "dropped": c.dropped - before[4], "reassigned": c.reassigned - before[5],
        }
        if self.role == "active":
            entry["loss"] = (c.loss_sum - before[0]) / max(1, c.loss_n - before[1])
        mark.reset(self.open_mark(cc1, sc1, t1))
        return entry

    def append_entry(self, entry: dict[str, Any], at: float | None = None) -> None:
        """Record a history entry, ``wall_s`` at ``at`` (``perf_counter``; default now)."""
        entry["wall_s"] = (time.perf_counter() if at is None else at) - self.t0
        self.history.append(entry)
        self.log.info("vfl.epoch_done", **entry)
        if self.progress and self.role == "active":
            key = f"val_{self.metric}"
            shown = f"  {key} {entry[key]:.4f}" if key in entry else ""
            part = f" ({entry['epochs_done'] - entry['epoch']:.2f})" \
                if entry["epochs_done"] - entry["epoch"] < 1 else ""
            print(f"epoch {entry['epoch'] + 1:>3}/{self.epochs}{part}  loss "
                  f"{entry['loss']:.4f}"
                  f"{shown}  {entry['samples_per_s']:,.0f} samples/s  wait "
                  f"{entry['wait_s']:.2f} s  dropped {entry['dropped']}", flush=True)


def _peak_rss_mb() -> float:
    import resource

    kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
             resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return round(kb / 1024.0, 1)


def party_metrics(party: Any, meter: CpuMeter) -> dict[str, Any]:
    """This party's figures for ``metrics.json`` (``party``: a
    :class:`parties.runtime.party.Party` after its run; ``meter``: its CPU meter since
    the start)."""
    book = party.book
    wall, cpu, cores, util = meter.read()
    assert party.bus is not None
    st = party.bus.stats()
    wait_s = book.wait_s()
    compute_s = sum(h.compute_s for h in party.handles)
    out = {
        "role": party.role,
        "party": party.party,
        "algo": party.cfg.algo,
        "workers": party.workers,
        "train_wall_s": book.train_s,
        "eval_s": book.eval_s,
        "segments": book.segments,
        "points_in_flight": book.points_in_flight,
        "val_overlap": {"on": party.overlap, "reason": party.overlap_reason},
        "party_wall_s": wall,
        "cpu_s": cpu,
        "cores_allotted": cores,
        "cpu_util": util,
        "cpu_s_train": book.train_cpu_s,
        "cpu_util_train": (book.train_cpu_s / (book.train_s * cores)
                           if book.train_s > 0 else None),
        "security": party.security_info,
        "run_delay_s": book.run_delay_s,
        "wait_s_total": wait_s,
        "wait_s_per_epoch": wait_s / (party.workers * party.cfg.epochs),
        "bytes_sent": dict(st.sent_bytes),
        "msgs_sent": dict(st.sent_msgs),
        # how this party's emb / eval / grad tensors travelled (parties.algorithms.wire)
        "wire_dtype": party.cfg.effective_wire_dtype,
        "bytes_recv": dict(st.recv_bytes),
        "dropped_batches": party.c.dropped,
        "reassigned_batches": party.c.reassigned,
        "skipped_batches": party.c.skipped,
        # batches given up for their epoch, by cause (parties.algorithms.strategy.CAUSES)
        "untrained_batches": dict(party.c.untrained),
        "stale_messages": party.c.stale,
        # the partner's malformed embeddings/gradients dropped, by sender (parties.algorithms.intake)
        "rejected_messages": party.intake.rejected,
        # of them, those outside the run's plan (epoch, batch id or channel; RunPlan)
        "rejected_out_of_plan": party.intake.out_of_plan,
        # messages on the partner's topics from other bus clients, dropped on arrival
        "foreign_messages": st.foreign,
        "rejected_by_sender": dict(list(party.intake.bad.items())[:64]),
        "switched_waits": party.c.switched,
        "max_staleness": party.c.max_staleness,
        "bus": {k: v for k, v in st.as_dict().items() if not isinstance(v, dict)},
        "ps_pushes": party.ps.pushes,
        "worker_mode": party.worker_mode,
        "model": party.models.describe(),
        "compute_s": compute_s,
        "compute_cpu_s_train": book.train_compute_cpu_s,
        "sync_cpu_s_train": book.train_sync_cpu_s,
        "step_cpu_s_per_sample": ((book.train_compute_cpu_s - book.train_sync_cpu_s)
                                  / party.c.samples if party.c.samples else None),
        "worker_parallelism": compute_s / wall if wall > 0 else 0.0,
        "batches": party.c.batches,
        "samples": party.c.samples,
        "history": book.history,
        # under DP the passive width is the public schema's (a function of it alone)
        "n_features": int(party.data.x_train.shape[1]),
        "feature_encoding": ("public_schema" if party.role == "passive"
                             and party.cfg.dp.enabled else "fitted"),
        "columns": list(party.data.columns),
        # each raw column's treatment (numeric, onehot, hashed, datetime, dropped)
        # lifetime peak resident set of this party process (loading included) and
        # of its largest finished worker process, MiB (ru_maxrss)
        "peak_rss_mb": _peak_rss_mb(),
        "treatments": (party.data.encoder.treatments_dict()
                       if hasattr(party.data.encoder, "treatments_dict") else []),
    }
    if party.role == "active" and party.data.task == "binary":
        out["label"] = party.data.label
        out["label_positive"] = party.data.label_positive
    if party.multi and party.role == "active":
        out["missed_by_party"] = dict(party.c.missed_by_party)
    link = getattr(party.strategy, "link_report", None)
    link = link() if link is not None else None
    if link is not None:  # pubsub's passive party: what it measured of its link
        wire = st.sent_bytes.get(EMB, 0) + st.recv_bytes.get(GRAD, 0)
        link["bytes_per_sample"] = wire / party.c.samples if party.c.samples else None
        out["link"] = link
    return out


__all__ = ["Mark", "RunBook", "party_metrics"]
