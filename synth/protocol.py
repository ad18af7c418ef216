"""FedForge's wire protocol over the bus: topics, the aggregation tree, round plans, and
the arithmetic that turns a party's noisy marginals into masked ring words and the
unmasked sum back into noisy aggregate marginals. Pure: no sockets.

A run is one secure-aggregation *session* (:class:`SessionPlan`, sent with the schema),
with stages bounded by ``timeouts.round_timeout_s`` (a party that misses one is a dropout):

1. ``keys`` (once per session): each party publishes its two X25519 public keys
   (:meth:`Topics.pk`); the coordinator, as the secure-aggregation server, answers each
   party with its neighbours' keys (:meth:`Topics.nk`).
2. ``seeds`` (once per batch of rounds; MST's three rounds are one batch): the coordinator
   names the batch's rounds (:attr:`Topics.seeds`); each party publishes its encrypted
   Shamir shares of a fresh self-mask seed per round (:meth:`Topics.sh`); the coordinator
   routes each party's incoming ones (:meth:`Topics.rs`).

Then each measurement round ``r`` (a set of cliques):

3. ``plan``: the coordinator publishes :class:`RoundPlan` on :attr:`Topics.plan`.
4. ``masked``: each party checks the plan against its session and own configuration
   (:func:`synth.plancheck.verify_plan`), measures its marginals (integer counts + integer
   Skellam noise it calibrates itself, :func:`synth.mechanism.measure_party`), reduces
   them mod 2^w per cell (:func:`quantize_counts`: exact, nothing is rounded), masks each
   cell in its ring Z_(2^w) (:func:`cell_windows`) and sends the packed words to its
   leaf aggregator (:meth:`Topics.up`). Aggregators add what their children sent, cell by
   cell in its ring, and forward the sum and the list of parties in it to their parent,
   up to the coordinator.
5. ``unmask``: the coordinator publishes who survived and who dropped (:meth:`Topics.unmask`);
   survivors reveal the seed shares and round keys it needs (:meth:`Topics.rv`), unless
   fewer than their S_min survived (:func:`synth.mechanism.check_survivors`: they refuse,
   and the round is not released); the coordinator removes the masks and decodes the
   exact integer sum (:func:`decode_sum`).

Topics live under ``ff/<run_id>/``. Sources: Bonawitz et al. CCS 2017 (stages), Bell et al.
CCS 2020 (sparse neighbours), McKenna et al. 2021 (MST); the protocol as a whole: docs/explanation/fedforge-protocol.md.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from synth.secagg import RoundSpec, SecAggConfig, cell_modmask

#: The coordinator's node id in the aggregation tree.
ROOT = "root"


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names of one run.

    Everything addressed to one participant lives under its own prefix
    ``ff/<run>/to/<node>/`` and everything broadcast under ``ff/<run>/all/``, so each
    participant subscribes to two prefixes once, before it says hello, and can never
    miss a message sent to it later (the bus keeps no history).
    """

    run_id: str

    def all(self) -> str:
        """Prefix of broadcasts (schema, plans, unmask lists, done)."""
        return f"ff/{self.run_id}/all/"

    def to(self, node: str) -> str:
        """Prefix of messages addressed to ``node`` (a party, an aggregator or ``root``)."""
        return f"ff/{self.run_id}/to/{node}/"

    # broadcasts
    @property
    def schema(self) -> str:
        """The coordinator's public schema."""
        return self.all() + "schema"

    @property
    def plan(self) -> str:
        """Round plans."""
        return self.all() + "plan"

    @property
    def seeds(self) -> str:
        """Seed batches: the round ids the parties share self-mask seeds for next."""
        return self.all() + "seeds"

    def unmask(self, r: int) -> str:
        """Round ``r``: survivors and dropouts."""
        return self.all() + f"unmask/{r}"

    @property
    def resume(self) -> str:
        """A restarted coordinator asks for the last message of a stage again (meta
        ``stage``: ``schema``, ``keys`` or ``seeds:<b>``)."""
        return self.all() + "resume"

    @property
    def done(self) -> str:
        """The run is over (carries ``ok`` and, on failure, the reason)."""
        return self.all() + "done"

    # to the coordinator
    @property
    def hello(self) -> str:
        """Parties and aggregators announce themselves."""
        return self.to(ROOT) + "hello"

    @property
    def error(self) -> str:
        """A participant's fatal error."""
        return self.to(ROOT) + "error"

    def pk(self, s: int) -> str:
        """Session ``s``: a party's public keys."""
        return self.to(ROOT) + f"pk/{s}"

    def sh(self, b: int) -> str:
        """Seed batch ``b``: a party's encrypted seed shares for its neighbours."""
        return self.to(ROOT) + f"sh/{b}"

    def rv(self, r: int) -> str:
        """Round ``r``: a survivor's revealed seed shares and round keys."""
        return self.to(ROOT) + f"rv/{r}"

    # to one node
    def nk(self, s: int, party: str) -> str:
        """Session ``s``: the neighbours' keys for ``party``."""
        return self.to(party) + f"nk/{s}"

    def rs(self, b: int, party: str) -> str:
        """Seed batch ``b``: the seed shares routed to ``party``."""
        return self.to(party) + f"rs/{b}"

    def up(self, r: int, node: str) -> str:
        """Round ``r``: masked vectors or masked sums for tree node ``node``."""
        return self.to(node) + f"up/{r}"

    def rvs(self, r: int, leaf: str) -> str:
        """Round ``r``: a survivor's revealed seed shares of the parties under ``leaf``
        (a leaf aggregator), which removes their self masks."""
        return self.to(leaf) + f"rv/{r}"

    def sm(self, r: int, node: str) -> str:
        """Round ``r``: the sum of a subtree's self masks, for tree node ``node``."""
        return self.to(node) + f"sm/{r}"


# --------------------------------------------------------------------------- the tree


@dataclass(frozen=True, slots=True, kw_only=True)
class Tree:
    """The aggregation tree: parties → leaf aggregators → inner aggregators → root.

    Attributes:
        parent: node id → its parent's id (parties, aggregators; the top level's parent
            is :data:`ROOT`).
        children: node id → its children, in order (aggregators and the root).
        levels: aggregator ids per level, leaves first.
    """

    parent: Mapping[str, str]
    children: Mapping[str, tuple[str, ...]]
    levels: tuple[tuple[str, ...], ...]

    @property
    def aggregators(self) -> tuple[str, ...]:
        """Every aggregator id, leaves first."""
        return tuple(a for level in self.levels for a in level)

    def level_of(self, node: str) -> int:
        """0 for leaf aggregators, 1 for their parents, ...

        Raises:
            KeyError: ``node`` is not an aggregator.
        """
        for i, level in enumerate(self.levels):
            if node in level:
                return i
        raise KeyError(node)

    def parties_under(self, node: str) -> tuple[str, ...]:
        """The parties whose vectors reach ``node`` (all of them for the root)."""
        kids = self.children.get(node)
        if kids is None:
            return (node,)
        return tuple(p for k in kids for p in self.parties_under(k))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for the round plan)."""
        return {"levels": [list(level) for level in self.levels],
                "children": {k: list(v) for k, v in self.children.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Tree:
        """Inverse of :meth:`to_dict`."""
        children = {k: tuple(v) for k, v in d["children"].items()}
        parent = {c: k for k, kids in children.items() for c in kids}
        return cls(parent=parent, children=children,
                   levels=tuple(tuple(level) for level in d["levels"]))


def build_tree(parties: Sequence[str], fanout: int, root_children: int = 0) -> Tree:
    """A balanced aggregation tree with at most ``fanout`` children per node.

    Parties are grouped in order into ``ceil(K / fanout)`` leaf aggregators; each further
    level groups the one below by ``fanout`` until at most ``root_children`` nodes remain
    (0: ``fanout``), and those report to the root. The root's work and memory grow with
    its (≤ ``root_children``) children, not with K; with ``root_children = 1`` a single
    top aggregator does all the root's summing, so the root's cost depends on neither K
    nor the fan-out (one more hop for K > fanout).

    Raises:
        ValueError: no parties, duplicate ids, ``fanout < 2`` or ``root_children``
            outside [0, fanout].
    """
    if fanout < 2:
        raise ValueError(f"fanout must be >= 2, got {fanout}")
    if not 0 <= root_children <= fanout:
        raise ValueError(f"root_children must be in [0, fanout], got {root_children}")
    top = root_children or fanout
    if not parties:
        raise ValueError("an aggregation tree needs at least one party")
    if len(set(parties)) != len(parties):
        raise ValueError("duplicate party ids")
    children: dict[str, tuple[str, ...]] = {}
    levels: list[tuple[str, ...]] = []
    below: list[str] = list(parties)
    while True:
        level = len(levels)
        ids = []
        for j in range(0, len(below), fanout):
            node = f"a{level}_{j // fanout}"
            children[node] = tuple(below[j:j + fanout])
            ids.append(node)
        levels.append(tuple(ids))
        below = ids
        if len(below) <= top:
            break
    children[ROOT] = tuple(below)
    parent = {c: k for k, kids in children.items() for c in kids}
    return Tree(parent=parent, children=children, levels=tuple(levels))


# --------------------------------------------------------------------------- rounds


def round_id(r: int) -> str:
    """The secure-aggregation id of measurement round ``r``."""
    return f"r{r}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPlan:
    """The secure-aggregation session and aggregation tree every participant shares for a
    run: keys are agreed once per session (:mod:`synth.secagg`), not once per round.

    Attributes:
        session_id: binds keys, nonces and AAD.
        party_ids: the parties (sorted).
        threshold: Shamir threshold t (None: ⌊k/2⌋ + 1).
        degree: k, each party's neighbours in the secure-aggregation graph.
        graph_seed: public seed (hex) of the neighbour graph.
        timeout_s: each stage's deadline, seconds.
        tree: :meth:`Tree.to_dict`.
    """

    session_id: str
    party_ids: tuple[str, ...]
    threshold: int | None
    degree: int
    graph_seed: str
    timeout_s: float
    tree: Mapping[str, Any]

    def to_meta(self) -> dict[str, Any]:
        """JSON-safe form (bus message metadata)."""
        return {"session_id": self.session_id, "party_ids": list(self.party_ids),
                "threshold": self.threshold, "degree": self.degree,
                "graph_seed": self.graph_seed, "timeout_s": self.timeout_s,
                "tree": dict(self.tree)}

    @classmethod
    def from_meta(cls, d: Mapping[str, Any]) -> SessionPlan:
        """Inverse of :meth:`to_meta`.

        Raises:
            KeyError, TypeError, ValueError: a malformed session.
        """
        return cls(session_id=str(d["session_id"]), party_ids=tuple(d["party_ids"]),
                   threshold=None if d["threshold"] is None else int(d["threshold"]),
                   degree=int(d["degree"]), graph_seed=str(d["graph_seed"]),
                   timeout_s=float(d["timeout_s"]), tree=d["tree"])

    @property
    def index(self) -> int:
        """The session's number in its run (``<run>/<index>``): 0 for the run's own
        session, 1, 2, ... when a finished run is reopened for a workload update."""
        tail = self.session_id.rsplit("/", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    def secagg(self) -> SecAggConfig:
        """The :class:`synth.secagg.SecAggConfig` of the session."""
        return SecAggConfig(session_id=self.session_id, party_ids=self.party_ids,
                            threshold=self.threshold, degree=self.degree,
                            graph_seed=bytes.fromhex(self.graph_seed))


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundPlan:
    """What every participant needs to know about measurement round ``round``.

    Attributes:
        round: round number (0, 1, ...).
        name: what the round measures (``one_way``, ``select``, ``tree``).
        cliques: the cliques, in the order their flattened marginals are concatenated.
        sizes: cells of each clique's marginal (same order).
        sigma2_central: the noise variance per cell of a sum over exactly
            ``min_survivors`` parties, ``2·S_min·μ`` (``2μ`` for local noise; 0 = no
            noise); informational: each party computes its μ itself from ``rho``.
        noise_model: ``distributed`` or ``local`` (:mod:`synth.mechanism`).
        n_parties: K, the parties of the session.
        step: always 1: parties send their exact integer noisy counts mod 2^w (kept in
            the message so a party can refuse anything else).
        rho: the zCDP ρ share of each clique (0 = no noise); the round costs
            ``len(cliques)·rho``.
        min_survivors: S_min, the fewest parties whose sum may be released.
        min_honest: the fewest honest, non-colluding parties the plan assumes among the
            K (:func:`synth.mechanism.resolve_trust`); a party refuses a plan that assumes
            fewer than its own ``min_honest`` (0: a plan that states none).
        cell_bits: the ring width of each cell (one byte per cell, in the cliques'
            order): cell ``i`` is masked and summed in Z_(2^cell_bits[i]), just wide
            enough for the window the sum of codes lies in (:func:`cell_windows`).
        timeout_s: each stage's deadline, seconds.
        maps: MST's domain compression from this round on (attribute -> compressed code
            of each original code; empty: none), or None when it is the previous round's
            (sent once, not with every plan): the cliques' sizes are those of the
            compressed domain, and parties map their codes before counting.
        maps_round: the round whose plan carried the compression in force.
    """

    round: int
    name: str
    cliques: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    sigma2_central: float
    noise_model: str
    n_parties: int
    step: float
    cell_bits: bytes = field(repr=False)
    timeout_s: float
    maps: Mapping[str, tuple[int, ...]] | None = None
    maps_round: int = 0
    rho: float = 0.0
    min_survivors: int = 1
    min_honest: int = 0

    @property
    def vector_len(self) -> int:
        """Cells of all the round's marginals together."""
        return int(sum(self.sizes))

    @property
    def ring_bits(self) -> int:
        """m, the widest cell's ring width (bits)."""
        return int(max(self.cell_bits)) if self.cell_bits else 1

    @property
    def widths(self) -> np.ndarray:
        """The cells' ring widths, uint8 ``(vector_len,)``."""
        return np.frombuffer(self.cell_bits, dtype=np.uint8)

    def spec(self) -> RoundSpec:
        """The :class:`synth.secagg.RoundSpec` of the round."""
        return RoundSpec(round_id=self.round_id, vector_len=self.vector_len,
                         ring_bits=self.ring_bits, cell_bits=self.cell_bits)

    @property
    def round_id(self) -> str:
        """The secure-aggregation round id within the session (:func:`round_id`)."""
        return round_id(self.round)

    def to_message(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        """Bus form: ``(meta, [body])``. The body is one zlib stream (uint8) of the cell
        widths followed by the JSON of the cliques, sizes and maps: attribute names and
        widths repeat a lot, and a plan of all pairs is otherwise kilobytes of JSON."""
        body: dict[str, Any] = {"cliques": [list(c) for c in self.cliques],
                                "sizes": list(self.sizes)}
        if self.maps is not None:
            body["maps"] = {a: list(v) for a, v in self.maps.items()}
        meta = {"round": self.round, "name": self.name,
                "sigma2_central": self.sigma2_central, "noise_model": self.noise_model,
                "n_parties": self.n_parties, "step": self.step, "timeout_s": self.timeout_s,
                "maps_round": self.maps_round, "cells": len(self.cell_bits),
                "rho": self.rho, "min_survivors": self.min_survivors,
                "min_honest": self.min_honest}
        raw = self.cell_bits + json.dumps(body, separators=(",", ":")).encode()
        return meta, [np.frombuffer(zlib.compress(raw, 9), dtype=np.uint8)]

    @classmethod
    def from_message(cls, d: Mapping[str, Any], arrays: Sequence[np.ndarray]) -> RoundPlan:
        """Inverse of :meth:`to_message`.

        Raises:
            KeyError, TypeError, ValueError, zlib.error: a malformed plan.
        """
        raw = zlib.decompress(np.ascontiguousarray(arrays[0], dtype=np.uint8).tobytes())
        n = int(d["cells"])
        cell_bits = raw[:n]
        try:
            body = json.loads(raw[n:])
        except ValueError as exc:
            raise ValueError(f"malformed plan body after {n} cell widths: {exc}") from None
        sizes = tuple(int(s) for s in body["sizes"])
        if len(cell_bits) != sum(sizes):
            raise ValueError(f"{len(cell_bits)} cell widths for {sum(sizes)} cells")
        maps = body.get("maps")
        return cls(round=int(d["round"]), name=str(d["name"]),
                   cliques=tuple(tuple(c) for c in body["cliques"]), sizes=sizes,
                   sigma2_central=float(d["sigma2_central"]), noise_model=str(d["noise_model"]),
                   n_parties=int(d["n_parties"]), step=float(d["step"]), cell_bits=cell_bits,
                   timeout_s=float(d["timeout_s"]),
                   maps=None if maps is None else
                   {a: tuple(int(x) for x in v) for a, v in maps.items()},
                   maps_round=int(d.get("maps_round", 0)), rho=float(d.get("rho", 0.0)),
                   min_survivors=int(d.get("min_survivors", 1)),
                   min_honest=int(d.get("min_honest", 0)))


def secagg_degree(n_parties: int, configured: int = 0) -> int:
    """k, the neighbours of each party in the secure-aggregation graph.

    ``configured`` > 0 is used as given (capped at K − 1). 0 means ``ceil(log2 K) + 1``
    rounded up to even (the graph is a Harary graph; capped at K − 1): O(log K) as in
    SecAgg+ (Bell et al. 2020), with threshold ``k // 2 + 1``. It tolerates up to
    ``k // 2 - 1`` dropped neighbours of any one party.
    """
    if n_parties <= 1:
        return 0
    k = configured if configured > 0 else math.ceil(math.log2(n_parties)) + 1
    if k % 2 and k < n_parties - 1:
        k += 1
    return min(k, n_parties - 1)


def secagg_threshold_floor(n_parties: int, configured_degree: int = 0,
                           configured: int = 0) -> int:
    """The lowest Shamir threshold t a party accepts in a session: ``configured`` (> 0,
    its ``secagg.threshold``) or the SecAgg+ default ``k // 2 + 1`` for the degree k it
    expects (:func:`secagg_degree` of its own K and ``secagg.degree``), the threshold
    :class:`synth.secagg.SecAggConfig` picks when a session names none. A lower t lets
    fewer colluding neighbours rebuild a party's self-mask seed and mask key and unmask
    its own vector."""
    if configured:
        return int(configured)
    return secagg_degree(int(n_parties), int(configured_degree)) // 2 + 1


def party_sigma2(plan: RoundPlan) -> float:
    """The noise variance one party adds per cell, as the plan states it:
    ``sigma2_central / S_min`` (distributed) or ``sigma2_central`` (local)."""
    if plan.noise_model == "local":
        return plan.sigma2_central
    return plan.sigma2_central / max(1, plan.min_survivors)


def cell_windows(upper: np.ndarray, *, sigma_sum: float, tails: float = 12.0,
                 uniform: bool = False, max_bits: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The window each cell's exact integer sum lies in, and the ring width that holds it.

    Each party sends its integer noisy count ``c + z`` mod 2^w; the sum over the
    ``S ≤ K`` parties that survive is ``T = C + Z``: ``C`` the true count over those
    parties, ``0 ≤ C ≤ upper`` (a public bound: the rows, or a bound from earlier noisy
    marginals, :func:`cell_upper_bounds`), ``Z`` their summed Skellam noise, whose std is
    at most ``sigma_sum`` (all K parties surviving). So ``T ∈ [lo, hi]`` with
    ``lo = floor(−tails·σ)`` and ``hi = ceil(upper + tails·σ)``, and ``T mod 2^w`` with
    ``2^w ≥ hi − lo + 1`` determines ``T`` (:func:`decode_sum`). Tail bound: Skellam noise
    is sub-exponential with P(|Z| > tσ) ≤ 2·exp(−t²/(2(1 + t/(3σ)))) (Bernstein, for the
    difference of two Poissons); at the default 12σ with σ ≥ 1 that is below 1e-20 per cell.
    Masked words are uniformly random in Z_(2^w), so ``w`` is what each cell costs on the
    wire. Fewer survivors only shrink the window.

    Args:
        upper: float64 ``(n_cells,)``, public upper bounds on the cells' true counts.
        sigma_sum: the std of the summed noise when every party survives.
        tails: standard deviations of noise the window covers (>= 12 recommended).
        uniform: one width for all cells (the widest), as a plain Z_(2^m) ring would use.
        max_bits: ``secagg.bits`` of the config: a cap on the ring width (0 = none); a window
            that needs more is refused.

    Returns:
        ``(lo, widths)``: int64 ``(n_cells,)`` window starts and uint8 ``(n_cells,)`` ring
        widths in [1, 62].

    Raises:
        ValueError: a negative or non-finite bound, a window wider than 2^62 or than
            ``max_bits``.
    """
    u = np.asarray(upper, dtype=np.float64)
    if u.size and (not np.all(np.isfinite(u)) or u.min() < 0):
        raise ValueError("upper bounds must be finite and >= 0")
    pad = tails * max(sigma_sum, 0.0) + 1.0
    lo = np.full(u.shape, math.floor(-pad), dtype=np.int64)
    hi = np.ceil(u + pad).astype(np.int64)
    span = (hi - lo + 1).astype(np.float64)
    widths = np.maximum(1, np.ceil(np.log2(span))).astype(np.int64)
    if widths.size and int(widths.max()) > 62:
        raise ValueError(f"a window of {span.max():.3g} values exceeds 2^62")
    if max_bits and widths.size and int(widths.max()) > max_bits:
        raise ValueError(f"a cell needs a ring of {int(widths.max())} bits to hold its sum "
                         f"with {tails:g} noise std of tails, more than bits = {max_bits}")
    if uniform and widths.size:
        widths[:] = widths.max()
    return lo, widths.astype(np.uint8)


def cell_upper_bounds(cliques: Sequence[tuple[str, ...]], shape: Mapping[str, int],
                      known: Sequence[tuple[tuple[str, ...], np.ndarray, np.ndarray]],
                      total_rows: float, *, tails: float = 6.0) -> np.ndarray:
    """Public upper bounds on the true counts of the cells of ``cliques``, from noisy
    marginals already released (post-processing: no privacy cost).

    A cell's count is at most the count of any marginal on a sub-clique at the cell's
    projection, and that is at most the noisy answer plus ``tails`` standard deviations
    (exceeded with probability about 10⁻⁹). Every cell is also bounded by the rows.

    Args:
        cliques: the cliques to bound (attribute names), in the round's order.
        shape: attribute -> domain size (of the domain the cliques are counted in).
        known: ``(clique, noisy flat values, per-cell noise std)`` of released marginals
            on the same domain.
        total_rows: the rows of all parties together.

    Returns:
        float64 ``(Σ cells,)``: the bounds, concatenated in the cliques' order.
    """
    out = []
    for c in cliques:
        dims = [int(shape[a]) for a in c]
        u = np.full(dims, float(total_rows))
        for s, vals, sd in known:
            if not set(s) <= set(c):
                continue
            arr = np.maximum(np.asarray(vals, dtype=np.float64)
                             + tails * np.asarray(sd, dtype=np.float64), 0.0)
            arr = arr.reshape([int(shape[a]) for a in s])
            perm = sorted(range(len(s)), key=lambda i: c.index(s[i]))
            arr = arr.transpose(perm).reshape([int(shape[a]) if a in s else 1 for a in c])
            u = np.minimum(u, arr)
        out.append(u.ravel())
    return np.concatenate(out) if out else np.zeros(0)


def quantize_counts(noisy: np.ndarray, plan: RoundPlan) -> np.ndarray:
    """A party's integer noisy counts, shape ``(vector_len,)``, as ring elements (uint64):
    each cell's value mod 2^w (negative values wrap around). Exact: no rounding.

    Raises:
        ValueError: a non-integer value, or a plan with ``step`` other than 1.
    """
    if plan.step != 1.0:
        raise ValueError(f"step must be 1 (noisy values are never rounded), got {plan.step}")
    arr = np.asarray(noisy)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError("noisy counts must be finite integers")
    q = arr.astype(np.int64)
    return q.view(np.uint64) & cell_modmask(plan.widths)


def decode_sum(total: np.ndarray, lo: np.ndarray, plan: RoundPlan) -> np.ndarray:
    """The exact integer aggregate (counts + noise) from the unmasked sum mod 2^w.

    ``T = lo + ((total − lo) mod 2^w)`` recovers the sum from its residue (it lies in
    ``[lo, lo + 2^w)``, :func:`cell_windows`).

    Args:
        total: uint64 ``(vector_len,)``, the sum mod 2^w per cell.
        lo: int64 ``(vector_len,)``, the windows' starts.

    Returns:
        float64 ``(vector_len,)`` (integer values).

    Raises:
        ValueError: wrong lengths.
    """
    if total.shape != (plan.vector_len,) or np.shape(lo) != (plan.vector_len,):
        raise ValueError(f"sum has shape {total.shape} and windows {np.shape(lo)}, "
                         f"expected ({plan.vector_len},)")
    lo_u = np.asarray(lo, dtype=np.int64).view(np.uint64)
    s = lo + ((total - lo_u) & cell_modmask(plan.widths)).astype(np.int64)
    return s.astype(np.float64)


def aggregate_sigma(plan: RoundPlan, n_summed: int) -> float:
    """The noise std per cell of the decoded sum of ``n_summed`` parties' Skellam noise."""
    return math.sqrt(n_summed * party_sigma2(plan))


def plans_epsilon(plans: Sequence[RoundPlan], delta: float) -> float:
    """ε at δ claimed for a party that measured ``plans``: each round costs
    ``len(cliques)·rho`` zCDP (the Skellam charge, :func:`synth.skellam.skellam_rho`,
    of any sum over at least ``min_survivors`` parties), composed additively and
    converted tightly (:func:`synth.accounting.cdp_epsilon`)."""
    from synth.accounting import cdp_epsilon

    return cdp_epsilon(math.fsum(len(p.cliques) * p.rho for p in plans), delta)


def split_marginals(vector: np.ndarray, plan: RoundPlan) -> dict[tuple[str, ...], np.ndarray]:
    """The round's concatenated vector cut back into one flat array per clique."""
    out: dict[tuple[str, ...], np.ndarray] = {}
    at = 0
    for clique, size in zip(plan.cliques, plan.sizes, strict=True):
        out[clique] = vector[at:at + size]
        at += size
    return out


def pack_blobs(blobs: Mapping[str, bytes]) -> tuple[dict[str, Any], np.ndarray]:
    """Several named byte strings as one message: ``(meta, uint8 array)``.

    Keys, encrypted shares and revealed shares travel as raw bytes in one array frame,
    not as hex in the JSON header (which would double them on the wire).
    """
    ids = sorted(blobs)
    data = b"".join(blobs[i] for i in ids)
    lens = [len(blobs[i]) for i in ids]
    meta: dict[str, Any] = {"ids": ids}
    if len(set(lens)) <= 1:
        meta["len"] = lens[0] if lens else 0  # the usual case: one length for all
    else:
        meta["lens"] = lens
    return meta, np.frombuffer(data, np.uint8)


def unpack_blobs(meta: Mapping[str, Any], arr: np.ndarray) -> dict[str, bytes]:
    """Inverse of :func:`pack_blobs`.

    Raises:
        ValueError: the lengths do not add up to the array's size.
    """
    ids = list(meta["ids"])
    lens = ([int(n) for n in meta["lens"]] if "lens" in meta
            else [int(meta["len"])] * len(ids))
    raw = np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
    if len(ids) != len(lens) or sum(lens) != len(raw):
        raise ValueError(f"blob lengths {sum(lens)} do not match {len(raw)} bytes")
    out: dict[str, bytes] = {}
    at = 0
    for i, n in zip(ids, lens, strict=True):
        out[i] = raw[at:at + n]
        at += n
    return out


__all__ = ["ROOT", "SessionPlan", "round_id", "cell_modmask", "cell_upper_bounds",
           "cell_windows", "secagg_degree", "secagg_threshold_floor", "RoundPlan", "Topics",
           "Tree", "aggregate_sigma",
           "build_tree", "pack_blobs", "unpack_blobs", "decode_sum", "party_sigma2", "plans_epsilon",
           "quantize_counts", "split_marginals"]
