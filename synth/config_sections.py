"""The nested tables of the FedForge run configuration (``[synth.mst]``, ``[synth.aim]``,
``[synth.engine]``, ``[synth.secagg]``, ``[synth.data]``, ``[synth.stream]``,
``[synth.timeouts]``, ``[synth.launch]``).

Each is a small frozen dataclass that checks its own values; checks that need a key of
another table (K, the split, the mechanism) are :class:`synth.config.SynthConfig`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from pubsub.config import ConfigError

ENGINES = ("auto", "mbi", "neural", "diffusion")
NOISE_MODELS = ("distributed", "local")
SPLITS = ("iid", "dirichlet", "sizes")


def _bad(section: str, key: str, why: str) -> ConfigError:
    return ConfigError(f"{section}.{key}", why)


def _three_weights(section: str, key: str, v: tuple[float, ...]) -> None:
    if len(v) != 3 or not all(w > 0 and math.isfinite(w) for w in v):
        raise _bad(section, key, f"must be three positive weights, got {v}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MstSection:
    """``[synth.mst]``: the ``mst`` mechanism's knobs.

    Attributes:
        split: relative ρ shares of MST's three rounds (1-way marginals, the
            all-pairs selection round, the tree's 2-way marginals); the reference MST
            splits in thirds.
        extra_mb: MST hands the engine, beyond the tree, the selection round's answers
            of further pairs (best scored first) while the graphical model stays within
            this many MB (``mbi`` engine; the ``diffusion`` engine gets every further
            answer whatever the size, the ``neural`` engine none; 0 = the tree only for
            every engine). They are paid for already:
            post-processing. Adult, K = 10, ε = 1, 3 noise draws: avg TV 0.0755 → 0.0495
            at 1 MB; bank 0.0452 → 0.0347 (8 MB: 0.0337, twice the fit time).
    """

    SECTION: ClassVar[str] = "synth.mst"
    split: tuple[float, ...] = (1.0, 1.0, 1.0)
    extra_mb: float = 1.0

    def __post_init__(self) -> None:
        _three_weights(self.SECTION, "split", self.split)
        if not (0 <= self.extra_mb < math.inf):
            raise _bad(self.SECTION, "extra_mb", f"must be finite and >= 0, got {self.extra_mb}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AimSection:
    """``[synth.aim]``: the ``aim`` mechanism's knobs.

    Attributes:
        rounds / batch: ``aim``'s adaptive rounds, and the cliques each measures
            (0 = ⌈d/2⌉ for d attributes).
        split: relative ρ shares of ``aim``'s 1-way round, its all-pairs answer round
            (the noisy answers its selection scores) and all adaptive rounds together.
        max_model_mb: ``aim`` skips a clique that would make the graphical model
            larger than this (as AIM's ``max_model_size``; with the ``mbi`` engine).
    """

    SECTION: ClassVar[str] = "synth.aim"
    rounds: int = 4
    batch: int = 0
    split: tuple[float, ...] = (0.1, 0.3, 0.6)
    max_model_mb: float = 25.0

    def __post_init__(self) -> None:
        s = self.SECTION
        if not 1 <= self.rounds <= 100:
            raise _bad(s, "rounds", f"must be in [1, 100], got {self.rounds}")
        if self.batch < 0:
            raise _bad(s, "batch", f"must be >= 0 (0 = auto), got {self.batch}")
        _three_weights(s, "split", self.split)
        if not (self.max_model_mb > 0 and math.isfinite(self.max_model_mb)):
            raise _bad(s, "max_model_mb", f"must be finite and > 0, got {self.max_model_mb}")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSection:
    """``[synth.engine]``: the synthesis engine fitted to the released marginals.

    Attributes:
        name: ``mbi`` (Private-PGM graphical model; the optional extra
            ``pip install -e ".[mbi]"``), ``neural`` (a torch relaxed-dataset generator fit
            to the marginals), ``diffusion`` (discrete diffusion with an absorbing kernel,
            trained through its reverse chain by the same marginal loss,
            :mod:`synth.diffusion`) or ``auto``
            (the default: ``mbi`` when it is installed, else
            ``neural``; ``metrics.json`` names the one used).
        iters: fitting iterations of the engine (0 = the engine's default).
        threads: intra-op threads of torch in the coordinator process (the neural
            engine), and the OpenMP threads of the ML-utility classifiers in its quality
            stage. 1 by default: its matrices are small, and OpenMP threads that spin
            after each parallel region fought the party processes and scikit-learn's own
            OpenMP pool: bank, K = 3, the neural engine took 571 s with torch's default
            threads on a loaded machine and 29 s with one (the ML utility of 2,400 rows
            on 2 loaded cores: 2.7 to 8.2 s, against 0.7 s with one).
    """

    SECTION: ClassVar[str] = "synth.engine"
    name: str = "auto"
    iters: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        s = self.SECTION
        if self.name not in ENGINES:
            raise _bad(s, "name", f"must be one of {ENGINES}, got {self.name!r}")
        if self.threads < 1:
            raise _bad(s, "threads", f"must be >= 1, got {self.threads}")
        if self.iters < 0:
            raise _bad(s, "iters", f"must be >= 0, got {self.iters}")

    def resolved(self) -> str:
        """``name`` with ``auto`` resolved: ``mbi`` if the package imports, else ``neural``."""
        if self.name != "auto":
            return self.name
        import importlib.util

        return "mbi" if importlib.util.find_spec("mbi") is not None else "neural"


@dataclass(frozen=True, slots=True, kw_only=True)
class SecAggSection:
    """``[synth.secagg]``: the trust model, the noise it calls for, and the secure
    aggregation (masking, ring widths, the aggregation tree) that sums the parties' vectors.

    Attributes:
        noise_model: ``distributed`` (each party adds Skellam noise Sk(Λ/d), d =
            ``min_survivors + min_honest − parties``: any released sum holds at least d
            honest parties, whose noise alone carries the charged Sk(Λ), however the
            others collude) or ``local`` (each party adds Sk(Λ): its vector is DP on its own;
            the sum's noise std grows by √K). Λ is calibrated from the exact Skellam RDP
            (:mod:`synth.skellam`).
        min_survivors: S_min, the fewest parties whose sum may be released; each party
            calibrates its noise for S_min and refuses to help unmask a round with fewer
            survivors. 0 (the default) = ⌈0.7·K⌉ (tolerates 30 % dropouts); must be
            <= K. Larger S_min = less noise per party, less dropout tolerance.
        min_honest: the fewest honest, non-colluding parties this party assumes among the
            K (the other ``K − min_honest``, sybils included, may collude with the
            coordinator and the aggregators). 0 (the default) = ⌈0.7·K⌉; must be in
            [1, K]. A coordinator colluding with ``K − min_honest`` parties chooses the
            survivor set (it can declare honest parties dropped), so a released sum is
            guaranteed only d = ``min_survivors + min_honest − K`` honest parties, and
            each party adds 1/d of the charged noise; d < 1 is refused (distributed
            noise). A plan assuming fewer honest parties than this is refused. Lower =
            more colluders tolerated, more noise: adult, ε = 1, K = 10 in
            docs/results/fedforge.md.
        threshold: the lowest Shamir threshold t this party accepts in a
            secure-aggregation session (fewer than t colluding neighbours cannot rebuild
            its self-mask seed or mask key). 0 (the default) = the SecAgg+ default
            ``k // 2 + 1`` for the degree k of its own K and ``degree``; the
            coordinator's session uses this value (0: that default). A session whose
            threshold is below it, or whose party count is not ``synth.parties``, is
            refused.
        degree: k, neighbours per party in the secure-aggregation graph (0 = the
            default ``ceil(log2 K) + 1``, rounded up to even; see
            :func:`synth.protocol.secagg_degree`).
        bits: a cap on the ring width (bits per masked cell); 0 (the default) = no cap.
            Parties send exact integer counts + integer noise (never rounded), so the
            ring must hold the whole sum (public count bound + 12 noise std); a round
            whose cells need wider rings than ``bits`` is refused.
        ring: ``cell`` (the default: each cell is masked in a ring just wide enough for
            the window its sum lies in, from public bounds on its count; see
            :func:`synth.protocol.cell_windows`) or ``uniform`` (one ring width for all
            cells of a round, the widest; for comparison).
        fanout: children per aggregator in the aggregation tree (parties report to leaf
            aggregators, leaves to inner ones, up to the coordinator).
        root_children: the most children the coordinator (the tree's root) has; 0 = up
            to ``fanout``. 1 puts a single top aggregator under the root, so the
            coordinator's aggregation cost depends on neither K nor the fan-out (one more
            hop when K > fanout).
        unmask: who removes the masks of a round's sum. ``root`` (default; SecAgg+ as
            published): the coordinator, from every survivor's seed shares and round
            keys; no aggregator learns any seed; the coordinator's work per round grows
            with K. ``tree``: each leaf aggregator recovers its surviving children's
            self-mask seeds and sends up the sum of their self masks; the coordinator
            gets only the round keys of dropped parties' partners, so its work depends on
            the fan-out, not K (``bench/synth_scale.py``). A leaf then learns its
            children's round seeds; their vectors stay hidden under the pair masks, but an
            aggregator and the coordinator colluding learn what the SecAgg+ server would
            (the parties' refusal to reveal both a seed share and a round key of one
            party holds per receiver only).
    """

    SECTION: ClassVar[str] = "synth.secagg"
    noise_model: str = "distributed"
    min_survivors: int = 0
    min_honest: int = 0
    threshold: int = 0
    degree: int = 0
    bits: int = 0
    ring: str = "cell"
    fanout: int = 4
    root_children: int = 0
    unmask: str = "root"

    def __post_init__(self) -> None:
        s = self.SECTION
        for key, value, allowed in (("noise_model", self.noise_model, NOISE_MODELS),
                                    ("ring", self.ring, ("cell", "uniform")),
                                    ("unmask", self.unmask, ("root", "tree"))):
            if value not in allowed:
                raise _bad(s, key, f"must be one of {allowed}, got {value!r}")
        for key in ("min_survivors", "min_honest", "threshold", "degree"):
            if getattr(self, key) < 0:
                raise _bad(s, key, f"must be >= 0 (0 = the default), got {getattr(self, key)}")
        if not 0 <= self.bits <= 62:
            raise _bad(s, "bits", f"must be 0 (no cap) or a ring width cap in [1, 62], "
                       f"got {self.bits}")
        if self.fanout < 2:
            raise _bad(s, "fanout", f"must be >= 2, got {self.fanout}")
        if not 0 <= self.root_children <= self.fanout:
            raise _bad(s, "root_children", f"must be in [0, fanout = {self.fanout}], "
                       f"got {self.root_children}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSection:
    """``[synth.data]``: which columns are synthesised, how the rows are spread over the
    parties, and the public domain they are counted in.

    Attributes:
        drop_columns: columns left out of the synthesis; None = the named dataset's
            default (:data:`synth.config.DEFAULT_DROP`: ``adult`` drops ``education``, an
            exact duplicate of ``educational-num``, as private-pgm's Adult benchmark
            does).
        split: how the rows are spread over the parties: ``iid``, ``dirichlet``
            (non-IID: per class of ``split_column``, party shares ~ Dirichlet(α)) or
            ``sizes`` (IID rows, unequal party sizes in proportion to ``party_weights``).
        party_weights: the K relative party sizes of the ``sizes`` split (e.g. rows
            "equivalent" to 10k ... 500k patients; the table's rows are cut in proportion).
        split_column / dirichlet_alpha: the column and α of the ``dirichlet`` split
            ('' = the label).
        numeric_bins / binning: how numeric columns are coarsened (public domain):
            ``uniform`` (the default: equal-width bins, as in the centralised references)
            or ``quantile`` (equal-mass bins; a value holding more than 1/bins of the rows
            gets its own). Measured on Adult at ε = 1: central MST's 3-way TV is 0.070 with
            uniform bins and 0.079 with quantile bins (spread-out mass is harder to model).
        domain: where the public domain comes from: ``declared`` (the data owners'
            reviewed schema: ``schema_file``, or the one bundled for ``bank`` and
            ``adult``: categorical columns get their declared levels plus ``__other__``
            for anything else, numeric ones ``numeric_bins`` equal-width bins over the
            declared range, in log space for declared long tails, so one record cannot
            change the domain), ``inferred`` (read off the pooled rows by the launcher:
            levels and bin edges then depend on the records and are OUTSIDE the privacy
            guarantee, which the ``dp`` block says), or ``auto`` (the default: declared
            when a schema is available, else inferred).
        schema_file: a public schema TOML (the format of ``psfl vfl schema``, every
            synthesised column declared) for ``domain = declared``.
        holdout_frac: share of the rows kept out of every party: the real test set of the
            ML-utility score.
        max_cells: the largest marginal (cells) a clique may have; larger pairs are
            refused before any memory is used.
    """

    SECTION: ClassVar[str] = "synth.data"
    drop_columns: tuple[str, ...] | None = None
    split: str = "iid"
    split_column: str = ""
    dirichlet_alpha: float = 1.0
    party_weights: tuple[float, ...] = ()
    numeric_bins: int = 10
    binning: str = "uniform"
    domain: str = "auto"
    schema_file: str = ""
    holdout_frac: float = 0.2
    max_cells: int = 1_000_000

    def __post_init__(self) -> None:
        s = self.SECTION
        for key, value, allowed in (("split", self.split, SPLITS),
                                    ("binning", self.binning, ("quantile", "uniform")),
                                    ("domain", self.domain, ("auto", "declared", "inferred"))):
            if value not in allowed:
                raise _bad(s, key, f"must be one of {allowed}, got {value!r}")
        if not (self.dirichlet_alpha > 0 and math.isfinite(self.dirichlet_alpha)):
            raise _bad(s, "dirichlet_alpha", f"must be finite and > 0, got "
                       f"{self.dirichlet_alpha}")
        if not all(w > 0 and math.isfinite(w) for w in self.party_weights):
            raise _bad(s, "party_weights", f"must be finite and > 0, got {self.party_weights}")
        if not 2 <= self.numeric_bins <= 1000:
            raise _bad(s, "numeric_bins", f"must be in [2, 1000], got {self.numeric_bins}")
        if not 0 < self.holdout_frac < 0.9:
            raise _bad(s, "holdout_frac", f"must be in (0, 0.9), got {self.holdout_frac}")
        if self.max_cells < 1:
            raise _bad(s, "max_cells", f"must be >= 1, got {self.max_cells}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSection:
    """``[synth.stream]``: workload updates after the run (``psfl synth add-workload``).

    Attributes:
        rho_frac: fraction of the total ρ held back from the mechanism for
            streaming workload updates (``psfl synth add-workload``): the
            mechanism's rounds spend ``(1 - this) ρ``, updates the rest. 0: none.
        refit: how a finished run is refitted after a workload update: ``warm``
            (default: the engine continues from the saved model; with mbi about the time
            of a full fit, which is JAX compiling the new junction tree) or ``gum`` (the
            current synthetic records are moved towards the new marginals,
            :mod:`synth.gum`: no model fit, a few seconds, but less accurate on the new
            marginals: ``bench/synth_stream.py``).
        iters: passes of ``gum`` (0: 20), or fitting iterations of ``warm`` (0: an
            eighth of the engine's default).
        compare_full: after an incremental refit also refit from scratch (timed),
            to report the incremental refit's time and error against it.
    """

    SECTION: ClassVar[str] = "synth.stream"
    rho_frac: float = 0.0
    refit: str = "warm"
    iters: int = 0
    compare_full: bool = False

    def __post_init__(self) -> None:
        s = self.SECTION
        if not 0.0 <= self.rho_frac < 1.0:
            raise _bad(s, "rho_frac", f"must be in [0, 1), got {self.rho_frac}")
        if self.refit not in ("gum", "warm"):
            raise _bad(s, "refit", f"must be 'gum' or 'warm', got {self.refit!r}")
        if self.iters < 0:
            raise _bad(s, "iters", f"must be >= 0, got {self.iters}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutsSection:
    """``[synth.timeouts]``: how long the coordinator, aggregators and parties wait.

    Attributes:
        round_timeout_s: deadline of each protocol stage (keys, shares, masked vectors,
            reveals), seconds; a party that misses it is a dropout of that round.
        handshake_timeout_s: deadline for every party and aggregator to say hello, seconds.
        connect_timeout_s: broker handshake deadline, seconds.
    """

    SECTION: ClassVar[str] = "synth.timeouts"
    round_timeout_s: float = 60.0
    handshake_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for key in ("round_timeout_s", "handshake_timeout_s", "connect_timeout_s"):
            v = getattr(self, key)
            if not (v > 0 and math.isfinite(v)):
                raise _bad(self.SECTION, key, f"must be finite and > 0 seconds, got {v}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSection:
    """``[synth.launch]``: how the launcher lays the parties out in OS processes.

    Attributes:
        parties_per_process: party tasks hosted by one OS process (each with its own bus
            connection); the launcher starts ceil(K / this) party processes.
    """

    SECTION: ClassVar[str] = "synth.launch"
    parties_per_process: int = 5

    def __post_init__(self) -> None:
        if self.parties_per_process < 1:
            raise _bad(self.SECTION, "parties_per_process",
                       f"must be >= 1, got {self.parties_per_process}")


__all__ = ["ENGINES", "NOISE_MODELS", "SPLITS", "AimSection", "DataSection", "EngineSection",
           "LaunchSection", "MstSection", "SecAggSection", "StreamSection", "TimeoutsSection"]
