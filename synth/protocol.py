"""FedForge's wire protocol over the bus: topics, the aggregation tree, round plans, and
the arithmetic that turns a party's noisy marginals into masked ring words and the
unmasked sum back into noisy aggregate marginals. Pure: no sockets.

One measurement round ``r`` (a set of cliques; MST has three) runs these stages, each
bounded by ``round_timeout_s`` (a party that misses one is a dropout of the round):

1. ``plan``: the coordinator publishes :class:`RoundPlan` on :attr:`Topics.plan`.
2. ``keys``: each party publishes its two X25519 public keys (:meth:`Topics.pk`); the
   coordinator, as the secure-aggregation server, answers each party with its
   neighbours' keys (:meth:`Topics.nk`).
3. ``shares``: each party publishes its encrypted Shamir shares (:meth:`Topics.sh`); the
   coordinator routes each party's incoming ones (:meth:`Topics.rs`).
4. ``masked``: each party measures its marginals (counts + discrete Gaussian noise of its
   share of the variance), quantises them to ``bits`` bits (:func:`quantize_counts`),
   masks them in Z_{2^m} and sends the packed words to its leaf aggregator
   (:meth:`Topics.up`). Aggregators add what their children sent, mod 2^m, and forward the
   sum and the list of parties in it to their parent, up to the coordinator.
5. ``unmask``: the coordinator publishes who survived and who dropped (:meth:`Topics.unmask`);
   survivors reveal the shares it needs (:meth:`Topics.rv`); the coordinator removes the
   masks and decodes the sum (:func:`decode_sum`).

Topics live under ``ff/<run_id>/``. Sources: Bonawitz et al. CCS 2017 (stages), Bell et al.
CCS 2020 (sparse neighbours), McKenna et al. 2021 (MST), and this project's issue 6.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from synth.compress import QuantSpec, quantize
from synth.mechanism import party_noise_variance

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

    def unmask(self, r: int) -> str:
        """Round ``r``: survivors and dropouts."""
        return self.all() + f"unmask/{r}"

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

    def pk(self, r: int) -> str:
        """Round ``r``: a party's public keys."""
        return self.to(ROOT) + f"pk/{r}"

    def sh(self, r: int) -> str:
        """Round ``r``: a party's encrypted shares for its neighbours."""
        return self.to(ROOT) + f"sh/{r}"

    def rv(self, r: int) -> str:
        """Round ``r``: a survivor's revealed shares."""
        return self.to(ROOT) + f"rv/{r}"

    # to one node
    def nk(self, r: int, party: str) -> str:
        """Round ``r``: the neighbours' keys for ``party``."""
        return self.to(party) + f"nk/{r}"

    def rs(self, r: int, party: str) -> str:
        """Round ``r``: the shares routed to ``party``."""
        return self.to(party) + f"rs/{r}"

    def up(self, r: int, node: str) -> str:
        """Round ``r``: masked vectors or masked sums for tree node ``node``."""
        return self.to(node) + f"up/{r}"


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


def build_tree(parties: Sequence[str], fanout: int) -> Tree:
    """A balanced aggregation tree with at most ``fanout`` children per node.

    Parties are grouped in order into ``ceil(K / fanout)`` leaf aggregators; each further
    level groups the one below by ``fanout`` until at most ``fanout`` nodes remain, and
    those report to the root. The root's work and memory grow with its (≤ fanout)
    children, not with K.

    Raises:
        ValueError: no parties, duplicate ids, or ``fanout < 2``.
    """
    if fanout < 2:
        raise ValueError(f"fanout must be >= 2, got {fanout}")
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
        if len(below) <= fanout:
            break
    children[ROOT] = tuple(below)
    parent = {c: k for k, kids in children.items() for c in kids}
    return Tree(parent=parent, children=children, levels=tuple(levels))


# --------------------------------------------------------------------------- rounds


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundPlan:
    """What every participant needs to know about measurement round ``round``.

    Attributes:
        round: round number (0, 1, ...).
        name: what the round measures (``one_way``, ``select``, ``tree``).
        cliques: the cliques, in the order their flattened marginals are concatenated.
        sizes: cells of each clique's marginal (same order).
        sigma2_central: σ² of the Gaussian noise the aggregate of all K parties carries
            per cell (0 = no noise).
        noise_model: ``distributed`` or ``local`` (:mod:`synth.mechanism`).
        n_parties: K, the parties the noise was split over.
        h_min / h_max / bits: the quantisation of each party's noisy counts.
        ring_bits: m, the width of a masked word.
        party_ids: the parties taking part (sorted).
        threshold: Shamir threshold t of the secure aggregation (None: ⌊k/2⌋ + 1).
        degree: k, each party's neighbours in the secure-aggregation graph.
        graph_seed: public seed (hex) of the neighbour graph.
        timeout_s: each stage's deadline, seconds.
        tree: :meth:`Tree.to_dict`.
        maps: MST's domain compression in force (attribute -> compressed code of each
            original code; empty in the first round): the cliques' sizes are those of the
            compressed domain, and parties map their codes before counting.
    """

    round: int
    name: str
    cliques: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    sigma2_central: float
    noise_model: str
    n_parties: int
    h_min: float
    h_max: float
    bits: int
    ring_bits: int
    party_ids: tuple[str, ...]
    threshold: int | None
    degree: int
    graph_seed: str
    timeout_s: float
    tree: Mapping[str, Any]
    maps: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def vector_len(self) -> int:
        """Cells of all the round's marginals together."""
        return int(sum(self.sizes))

    @property
    def quant(self) -> QuantSpec:
        """The quantisation spec."""
        return QuantSpec(bits=self.bits, h_min=self.h_min, h_max=self.h_max)

    @property
    def round_id(self) -> str:
        """The secure-aggregation round id (binds keys, nonces and AAD)."""
        return f"r{self.round}-{self.graph_seed}"

    def to_meta(self) -> dict[str, Any]:
        """JSON-safe form (bus message metadata)."""
        return {"round": self.round, "name": self.name,
                "cliques": [list(c) for c in self.cliques], "sizes": list(self.sizes),
                "sigma2_central": self.sigma2_central, "noise_model": self.noise_model,
                "n_parties": self.n_parties, "h_min": self.h_min, "h_max": self.h_max,
                "bits": self.bits, "ring_bits": self.ring_bits,
                "party_ids": list(self.party_ids), "threshold": self.threshold,
                "degree": self.degree,
                "graph_seed": self.graph_seed, "timeout_s": self.timeout_s,
                "tree": dict(self.tree), "maps": {a: list(v) for a, v in self.maps.items()}}

    @classmethod
    def from_meta(cls, d: Mapping[str, Any]) -> RoundPlan:
        """Inverse of :meth:`to_meta`.

        Raises:
            KeyError, TypeError: a malformed plan.
        """
        return cls(round=int(d["round"]), name=str(d["name"]),
                   cliques=tuple(tuple(c) for c in d["cliques"]),
                   sizes=tuple(int(s) for s in d["sizes"]),
                   sigma2_central=float(d["sigma2_central"]), noise_model=str(d["noise_model"]),
                   n_parties=int(d["n_parties"]), h_min=float(d["h_min"]),
                   h_max=float(d["h_max"]), bits=int(d["bits"]), ring_bits=int(d["ring_bits"]),
                   party_ids=tuple(d["party_ids"]),
                   threshold=None if d["threshold"] is None else int(d["threshold"]),
                   degree=int(d["degree"]),
                   graph_seed=str(d["graph_seed"]), timeout_s=float(d["timeout_s"]),
                   tree=d["tree"],
                   maps={a: tuple(int(x) for x in v) for a, v in d.get("maps", {}).items()})


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


def party_sigma2(plan: RoundPlan) -> float:
    """σ² of the noise one party adds per cell: σ²/K (distributed) or σ² (local)
    (:func:`synth.mechanism.party_noise_variance`)."""
    return party_noise_variance(plan.sigma2_central, plan.n_parties, plan.noise_model)


def quant_range(max_party_rows: int, sigma2_party: float, *, tails: float = 6.0
                ) -> tuple[float, float]:
    """``(h_min, h_max)`` for a party's noisy counts: a count lies in [0, rows], and the
    noise stays within ``tails`` standard deviations (clipped beyond; at 6σ that is about
    one cell in 5·10⁸).

    ``max_party_rows`` (the largest party's row count) is treated as public: the parties
    announce their row counts in their hello (not protected by DP; say so in reports).
    """
    pad = math.ceil(tails * math.sqrt(sigma2_party)) if sigma2_party > 0 else 0
    return float(-pad), float(max_party_rows + pad)


def auto_bits(h_min: float, h_max: float, sigma2_party: float, *, lo: int = 4,
              hi: int = 24) -> int:
    """The quantisation width that makes the step Δ no coarser than a party's noise std:
    ``ceil(log2((h_max − h_min)/σ_party + 1))``, clipped to ``[lo, hi]`` (``hi`` without
    noise). The quantisation error (variance Δ²/12 per party) then adds at most 1/12 of
    the noise variance, whatever ε: at ε = 1 on Adult (K = 10) that is 8-9 bits, at ε = 10
    about 12.
    """
    if sigma2_party <= 0:
        return hi
    levels = (h_max - h_min) / math.sqrt(sigma2_party) + 1.0
    return int(min(hi, max(lo, math.ceil(math.log2(levels)))))


def quantize_counts(noisy: np.ndarray, plan: RoundPlan) -> np.ndarray:
    """A party's noisy counts, shape ``(vector_len,)``, as ``bits``-bit codes (uint64)."""
    return quantize(noisy, plan.quant).astype(np.uint64)


def decode_sum(total: np.ndarray, n_summed: int, plan: RoundPlan) -> np.ndarray:
    """The aggregate noisy counts from the unmasked sum of ``n_summed`` parties' codes.

    Each party sent ``q = round((x - h_min) / Δ)``, so ``Σ x ≈ n·h_min + Δ·Σ q``.

    Args:
        total: uint64 ``(vector_len,)``, the sum mod 2^m (exact: m leaves room for it).
        n_summed: how many parties' vectors it holds.

    Returns:
        float64 ``(vector_len,)``.

    Raises:
        ValueError: wrong length, or ``n_summed < 1``.
    """
    if total.shape != (plan.vector_len,):
        raise ValueError(f"sum has shape {total.shape}, expected ({plan.vector_len},)")
    if n_summed < 1:
        raise ValueError(f"n_summed must be >= 1, got {n_summed}")
    spec = plan.quant
    return n_summed * spec.h_min + spec.step * total.astype(np.float64)


def aggregate_sigma(plan: RoundPlan, n_summed: int) -> float:
    """The noise std per cell of the decoded aggregate of ``n_summed`` parties: their
    Gaussian noise plus the uniform quantisation error (Δ²/12 per party)."""
    noise = n_summed * party_sigma2(plan)
    quant = n_summed * plan.quant.step ** 2 / 12.0
    return math.sqrt(noise + quant)


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


__all__ = ["ROOT", "auto_bits", "secagg_degree", "RoundPlan", "Topics", "Tree", "aggregate_sigma", "build_tree", "pack_blobs",
           "unpack_blobs",
           "decode_sum", "party_sigma2", "quant_range", "quantize_counts", "split_marginals"]
