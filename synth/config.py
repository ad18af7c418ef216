"""The FedForge run configuration: one frozen dataclass, loaded from TOML ``[synth]`` plus ``--set``.

Defaults follow the issue and the AIM/MST literature: ε = 1, δ = 1e-9, MST cliques, all
3-way marginals as the workload, numeric columns coarsened to about 10 bins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pubsub.config import ConfigError, dump_toml, load_section, to_mapping

#: Columns a named dataset leaves out of synthesis unless ``drop_columns`` is set.
DEFAULT_DROP: dict[str, tuple[str, ...]] = {"adult": ("education",)}
MECHANISMS = ("mst", "aim")
ENGINES = ("auto", "mbi", "neural", "diffusion")
NOISE_MODELS = ("distributed", "local")
SPLITS = ("iid", "dirichlet", "sizes")


@dataclass(frozen=True, slots=True, kw_only=True)
class SynthConfig:
    """Settings of one FedForge run (the coordinator sends the shared ones to every party).

    Attributes:
        dataset: the table: a named dataset (resolved by the launcher, e.g. ``adult``) or a
            CSV/Parquet path readable by every party process.
        label: the label column used for the ML-utility score ('' = none: no ML utility).
        drop_columns: columns left out of the synthesis; None = the named dataset's
            default (:data:`DEFAULT_DROP`: ``adult`` drops ``education``, an exact
            duplicate of ``educational-num``, as private-pgm's Adult benchmark does).
        parties: K, the number of data-holding parties.
        epsilon / delta: the (ε, δ) target of the whole release, per party (each
            record lives at one party); converted to zCDP ρ with the tight conversion
            (:func:`synth.accounting.cdp_rho`). ``epsilon = inf`` runs without noise.
        mechanism: clique selection: ``mst`` (1-way marginals, all 2-way marginals
            measured for the selection, then the maximum spanning tree's 2-way marginals;
            ρ split in thirds) or ``aim`` (1-way marginals, all 2-way marginals measured
            as answers, then ``aim_rounds`` adaptive rounds, each measuring the
            ``aim_batch`` cliques the current model explains worst, scored AIM's way from
            the noisy answers; :func:`synth.select.aim_select_batch`).
        mst_extra_mb: MST hands the engine, beyond the tree, the selection round's answers
            of further pairs (best scored first) while the graphical model stays within
            this many MB (``mbi`` engine; the ``diffusion`` engine gets every further
            answer whatever the size, the ``neural`` engine none; 0 = the tree only for
            every engine). They are paid for already:
            post-processing. Adult, K = 10, ε = 1, 3 noise draws: avg TV 0.0755 → 0.0495
            at 1 MB; bank 0.0452 → 0.0347 (8 MB: 0.0337, twice the fit time).
        aim_rounds / aim_batch: ``aim``'s adaptive rounds, and the cliques each measures
            (0 = ⌈d/2⌉ for d attributes).
        aim_split: relative ρ shares of ``aim``'s 1-way round, its all-pairs answer round
            (the noisy answers its selection scores) and all adaptive rounds together.
        aim_max_model_mb: ``aim`` skips a clique that would make the graphical model
            larger than this (as AIM's ``max_model_size``; with the ``mbi`` engine).
        mst_split: relative ρ shares of MST's three rounds (1-way marginals, the
            all-pairs selection round, the tree's 2-way marginals); the reference MST
            splits in thirds.
        engine: ``mbi`` (Private-PGM graphical model; the optional extra
            ``pip install -e ".[mbi]"``), ``neural`` (a torch relaxed-dataset generator fit
            to the marginals), ``diffusion`` (discrete diffusion with an absorbing kernel,
            trained through its reverse chain by the same marginal loss,
            :mod:`synth.diffusion`) or ``auto``
            (the default: ``mbi`` when it is installed, else
            ``neural``; ``metrics.json`` names the one used).
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
        secagg_threshold: the lowest Shamir threshold t this party accepts in a
            secure-aggregation session (fewer than t colluding neighbours cannot rebuild
            its self-mask seed or mask key). 0 (the default) = the SecAgg+ default
            ``k // 2 + 1`` for the degree k of its own K and ``secagg_degree``; the
            coordinator's session uses this value (0: that default). A session whose
            threshold is below it, or whose party count is not ``parties``, is refused.
        bits: a cap on the ring width (bits per masked cell); 0 (the default) = no cap.
            Parties send exact integer counts + integer noise (never rounded), so the
            ring must hold the whole sum (public count bound + 12 noise std); a round
            whose cells need wider rings than ``bits`` is refused.
        ring: ``cell`` (the default: each cell is masked in a ring just wide enough for
            the window its sum lies in, from public bounds on its count; see
            :func:`synth.protocol.cell_windows`) or ``uniform`` (one ring width for all
            cells of a round, the widest; for comparison).
        secagg_degree: k, neighbours per party in the secure-aggregation graph (0 = the
            default ``ceil(log2 K) + 1``, rounded up to even; see
            :func:`synth.protocol.secagg_degree`).
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
        synthetic_rows: rows to sample (0 = as many as the parties hold together).
        workload_k: the workload is all ``workload_k``-way marginals (quality report).
        seed: split, graph and sampling seed (the noise itself comes from OS entropy
            unless ``noise_seed`` is set).
        noise_seed: seed of the parties' noise generators, for reproducible tests only.
        round_timeout_s: deadline of each protocol stage (keys, shares, masked vectors,
            reveals), seconds; a party that misses it is a dropout of that round.
        handshake_timeout_s: deadline for every party and aggregator to say hello, seconds.
        connect_timeout_s: broker handshake deadline, seconds.
        max_cells: the largest marginal (cells) a clique may have; larger pairs are
            refused before any memory is used.
        engine_iters: fitting iterations of the engine (0 = the engine's default).
        engine_threads: intra-op threads of torch in the coordinator process (the neural
            engine), and the OpenMP threads of the ML-utility classifiers in its quality
            stage. 1 by default: its matrices are small, and OpenMP threads that spin
            after each parallel region fought the party processes and scikit-learn's own
            OpenMP pool: bank, K = 3, the neural engine took 571 s with torch's default
            threads on a loaded machine and 29 s with one (the ML utility of 2,400 rows
            on 2 loaded cores: 2.7 to 8.2 s, against 0.7 s with one).
        parties_per_process: party tasks hosted by one OS process (each with its own bus
            connection); the launcher starts ceil(K / this) party processes.
        stream_rho_frac: fraction of the total ρ held back from the mechanism for
            streaming workload updates (``psfl synth add-workload``): the
            mechanism's rounds spend ``(1 - this) ρ``, updates the rest. 0: none.
        stream_refit: how a finished run is refitted after a workload update: ``warm``
            (default: the engine continues from the saved model; with mbi about the time
            of a full fit, which is JAX compiling the new junction tree) or ``gum`` (the
            current synthetic records are moved towards the new marginals,
            :mod:`synth.gum`: no model fit, a few seconds, but less accurate on the new
            marginals: ``bench/synth_stream.py``).
        stream_iters: passes of ``gum`` (0: 20), or fitting iterations of ``warm`` (0: an
            eighth of the engine's default).
        stream_compare_full: after an incremental refit also refit from scratch (timed),
            to report the incremental refit's time and error against it.
    """

    dataset: str = "adult"
    label: str = ""
    drop_columns: tuple[str, ...] | None = None
    parties: int = 10
    epsilon: float = 1.0
    delta: float = 1e-9
    mechanism: str = "mst"
    mst_split: tuple[float, ...] = (1.0, 1.0, 1.0)
    mst_extra_mb: float = 1.0
    aim_rounds: int = 4
    aim_batch: int = 0
    aim_split: tuple[float, ...] = (0.1, 0.3, 0.6)
    aim_max_model_mb: float = 25.0
    engine: str = "auto"
    noise_model: str = "distributed"
    min_survivors: int = 0
    min_honest: int = 0
    secagg_threshold: int = 0
    bits: int = 0
    ring: str = "cell"
    secagg_degree: int = 0
    fanout: int = 4
    root_children: int = 0
    unmask: str = "root"
    split: str = "iid"
    split_column: str = ""
    dirichlet_alpha: float = 1.0
    party_weights: tuple[float, ...] = ()
    numeric_bins: int = 10
    binning: str = "uniform"
    domain: str = "auto"
    schema_file: str = ""
    holdout_frac: float = 0.2
    synthetic_rows: int = 0
    workload_k: int = 3
    seed: int = 0
    noise_seed: int | None = None
    round_timeout_s: float = 60.0
    handshake_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    max_cells: int = 1_000_000
    engine_iters: int = 0
    engine_threads: int = 1
    parties_per_process: int = 5
    stream_rho_frac: float = 0.0
    stream_refit: str = "warm"
    stream_iters: int = 0
    stream_compare_full: bool = False

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"synth.{key}", why)

        if not self.dataset:
            raise bad("dataset", "must name a dataset or a file")
        if not 1 <= self.parties <= 10_000:
            raise bad("parties", f"must be in [1, 10000], got {self.parties}")
        if not (self.epsilon > 0):  # also rejects NaN
            raise bad("epsilon", f"must be > 0 (inf = no noise), got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise bad("delta", f"must be in (0, 1), got {self.delta}")
        for key, value, allowed in (("mechanism", self.mechanism, MECHANISMS),
                                    ("engine", self.engine, ENGINES),
                                    ("noise_model", self.noise_model, NOISE_MODELS),
                                    ("split", self.split, SPLITS),
                                    ("binning", self.binning, ("quantile", "uniform")),
                                    ("domain", self.domain, ("auto", "declared", "inferred")),
                                    ("ring", self.ring, ("cell", "uniform"))):
            if value not in allowed:
                raise bad(key, f"must be one of {allowed}, got {value!r}")
        for key in ("mst_split", "aim_split"):
            v = getattr(self, key)
            if len(v) != 3 or not all(w > 0 and math.isfinite(w) for w in v):
                raise bad(key, f"must be three positive weights, got {v}")
        if not (0 <= self.mst_extra_mb < math.inf):
            raise bad("mst_extra_mb", f"must be finite and >= 0, got {self.mst_extra_mb}")
        if not 1 <= self.aim_rounds <= 100:
            raise bad("aim_rounds", f"must be in [1, 100], got {self.aim_rounds}")
        if self.aim_batch < 0:
            raise bad("aim_batch", f"must be >= 0 (0 = auto), got {self.aim_batch}")
        if not (self.aim_max_model_mb > 0 and math.isfinite(self.aim_max_model_mb)):
            raise bad("aim_max_model_mb", f"must be finite and > 0, got {self.aim_max_model_mb}")
        if not 0 <= self.bits <= 62:
            raise bad("bits", f"must be 0 (no cap) or a ring width cap in [1, 62], "
                      f"got {self.bits}")
        if not 0 <= self.min_survivors <= self.parties:
            raise bad("min_survivors", f"must be 0 (default ceil(0.7 K)) or in [1, K = "
                      f"{self.parties}], got {self.min_survivors}")
        if self.secagg_degree < 0:
            raise bad("secagg_degree", f"must be >= 0, got {self.secagg_degree}")
        if not 0 <= self.min_honest <= self.parties:
            raise bad("min_honest", f"must be 0 (default ceil(0.7 K)) or in [1, K = "
                      f"{self.parties}], got {self.min_honest}")
        from synth.mechanism import TrustModelError, resolve_trust
        try:
            resolve_trust(self.parties, self.min_survivors, self.min_honest,
                          noise_model=self.noise_model)
        except TrustModelError as exc:
            raise bad("min_honest", str(exc)) from None
        from synth.protocol import secagg_degree
        k_deg = secagg_degree(self.parties, self.secagg_degree)
        if not 0 <= self.secagg_threshold <= k_deg + 1:
            raise bad("secagg_threshold", f"must be 0 (default k // 2 + 1) or in [1, degree "
                      f"+ 1 = {k_deg + 1}], got {self.secagg_threshold}")
        if self.fanout < 2:
            raise bad("fanout", f"must be >= 2, got {self.fanout}")
        if self.unmask not in ("root", "tree"):
            raise bad("unmask", f"must be 'root' or 'tree', got {self.unmask!r}")
        if not 0 <= self.root_children <= self.fanout:
            raise bad("root_children", f"must be in [0, fanout = {self.fanout}], "
                      f"got {self.root_children}")
        if not (self.dirichlet_alpha > 0 and math.isfinite(self.dirichlet_alpha)):
            raise bad("dirichlet_alpha", f"must be finite and > 0, got {self.dirichlet_alpha}")
        if self.split == "sizes" and len(self.party_weights) != self.parties:
            raise bad("party_weights", f"the sizes split needs one weight per party "
                      f"({self.parties}), got {len(self.party_weights)}")
        if not all(w > 0 and math.isfinite(w) for w in self.party_weights):
            raise bad("party_weights", f"must be finite and > 0, got {self.party_weights}")
        if not 2 <= self.numeric_bins <= 1000:
            raise bad("numeric_bins", f"must be in [2, 1000], got {self.numeric_bins}")
        if not 0 < self.holdout_frac < 0.9:
            raise bad("holdout_frac", f"must be in (0, 0.9), got {self.holdout_frac}")
        if self.synthetic_rows < 0:
            raise bad("synthetic_rows", f"must be >= 0, got {self.synthetic_rows}")
        if not 1 <= self.workload_k <= 4:
            raise bad("workload_k", f"must be in [1, 4], got {self.workload_k}")
        for key in ("round_timeout_s", "handshake_timeout_s", "connect_timeout_s"):
            v = getattr(self, key)
            if not (v > 0 and math.isfinite(v)):
                raise bad(key, f"must be finite and > 0 seconds, got {v}")
        if self.max_cells < 1:
            raise bad("max_cells", f"must be >= 1, got {self.max_cells}")
        if self.engine_threads < 1:
            raise bad("engine_threads", f"must be >= 1, got {self.engine_threads}")
        if self.engine_iters < 0:
            raise bad("engine_iters", f"must be >= 0, got {self.engine_iters}")
        if not 0.0 <= self.stream_rho_frac < 1.0:
            raise bad("stream_rho_frac", f"must be in [0, 1), got {self.stream_rho_frac}")
        if self.stream_refit not in ("gum", "warm"):
            raise bad("stream_refit", f"must be 'gum' or 'warm', got {self.stream_refit!r}")
        if self.stream_iters < 0:
            raise bad("stream_iters", f"must be >= 0, got {self.stream_iters}")
        if self.parties_per_process < 1:
            raise bad("parties_per_process", f"must be >= 1, got {self.parties_per_process}")

    @property
    def private(self) -> bool:
        """False when ``epsilon`` is infinite (the no-privacy upper bound)."""
        return math.isfinite(self.epsilon)

    def resolved_drop(self) -> tuple[str, ...]:
        """``drop_columns``, or the named dataset's default when it is None."""
        if self.drop_columns is not None:
            return self.drop_columns
        return DEFAULT_DROP.get(self.dataset, ())

    def resolved_engine(self) -> str:
        """``engine`` with ``auto`` resolved: ``mbi`` if the package imports, else ``neural``."""
        if self.engine != "auto":
            return self.engine
        import importlib.util

        return "mbi" if importlib.util.find_spec("mbi") is not None else "neural"

    def party_ids(self) -> tuple[str, ...]:
        """``("p000", "p001", ...)``: the K party ids, zero-padded so they sort in order."""
        width = max(3, len(str(self.parties - 1)))
        return tuple(f"p{i:0{width}d}" for i in range(self.parties))


def load_synth_config(path: str | Path | None = None, sets: Sequence[str] = (),
                      extra: Mapping[str, Any] | None = None) -> SynthConfig:
    """Effective config: defaults, then the TOML file's ``[synth]`` table, then ``--set``.

    ``--set`` keys may be written ``synth.parties=10`` or just ``parties=10``; ``extra``
    (from dedicated CLI flags) is applied last.

    Raises:
        ConfigError: unknown section or key, wrong type, or an invalid value.
    """
    return load_section(SynthConfig, "synth", path, sets, extra)


def dump_synth_config(cfg: SynthConfig) -> str:
    """The config as TOML text (a ``[synth]`` table) that :func:`load_synth_config` reads."""
    return dump_toml({"synth": to_mapping(cfg)})


__all__ = ["DEFAULT_DROP", "ENGINES", "MECHANISMS", "NOISE_MODELS", "SPLITS", "SynthConfig",
           "dump_synth_config", "load_synth_config"]
