"""What a FedForge party releases in a round, and what it keeps of it.

:func:`noisy_counts` is the party's measurement of a plan: its marginals with integer
Skellam noise, as ring elements (masked next by :class:`synth.secagg.SecAggClient`).
:class:`ReleaseCache` keeps each round's masked vector with the identity of the plan it
answered: a plan for a round already released (a restarted coordinator re-publishes the
plan of the round it died in) is answered with the same vector, without spending budget,
and the same round id with another plan is refused (measuring one round twice under the
same masks would leak the difference). :func:`reveal_messages` lays out a survivor's
unmask-stage reveals as bare bytes, as :meth:`synth.secagg.SecAggServer.reveal_layout`
reads them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from synth.domain import Domain, marginals
from synth.mechanism import measure_party
from synth.protocol import RoundPlan, Topics, Tree, quantize_counts
from synth.secagg import SHARE_BYTES, RevealedShare


def noisy_counts(codes: np.ndarray, domain: Domain, plan: RoundPlan, *, mu: float,
                 rng: np.random.Generator) -> np.ndarray:
    """A party's integer noisy marginals for ``plan``: its counts of each clique over
    ``codes`` (in ``domain``, the compressed domain the plan counts in), plus Skellam noise
    of its own ``mu`` per cell (:func:`synth.mechanism.measure_party`), mod 2^w per cell
    (uint64, :func:`synth.protocol.quantize_counts`)."""
    counts = marginals(codes, domain, plan.cliques)
    parts = [measure_party(counts[tuple(clique)].ravel(), mu=mu, rng=rng)
             for clique in plan.cliques]
    noisy = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return quantize_counts(noisy, plan)


def plan_identity(plan: RoundPlan) -> bytes:
    """A digest of everything the plan says (its message metadata and arrays)."""
    meta, arrays = plan.to_message()
    h = hashlib.sha256(repr(sorted(meta.items())).encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


class ReleaseCache:
    """Round id -> (the identity of the plan answered, the masked vector sent for it)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[bytes, np.ndarray]] = {}

    def __contains__(self, round_id: object) -> bool:
        return round_id in self._kept

    def keep(self, plan: RoundPlan, vector: np.ndarray) -> None:
        """Record the masked vector released for ``plan``."""
        self._kept[plan.round_id] = (plan_identity(plan), vector)

    def matches(self, plan: RoundPlan) -> bool:
        """Whether ``plan`` is the plan the kept vector of its round answered."""
        return self._kept[plan.round_id][0] == plan_identity(plan)

    def vector(self, round_id: str) -> np.ndarray:
        """The masked vector released for the round."""
        return self._kept[round_id][1]


def reveal_messages(shares: Mapping[str, RevealedShare], *, party: str, round: int,
                    tree: Tree, topics: Topics, unmask: str
                    ) -> list[tuple[str, list[np.ndarray], dict[str, Any]]]:
    """A survivor's reveals for the unmask stage, as ``(topic, arrays, meta)`` messages.

    Bare bytes in owner order: a seed share is a field element (``SHARE_BYTES``), a round
    key with a dropped partner 32 bytes; the receivers know the owners, kinds and
    abscissa. With ``unmask = "tree"`` (hierarchical unmasking) the seed shares of each
    surviving owner go to the owner's leaf aggregator, which removes its children's self
    masks, and round keys go to the coordinator; otherwise everything goes to the
    coordinator.
    """
    t, r = topics, round
    out: list[tuple[str, list[np.ndarray], dict[str, Any]]] = []
    if unmask == "tree":
        by_leaf: dict[str, list[tuple[str, int]]] = {}
        pair = b""
        for owner, s in shares.items():
            if s.kind == "seed":
                by_leaf.setdefault(tree.parent[owner], []).append((owner, s.y))
            else:
                pair += s.y.to_bytes(32, "big")
        for leaf, items in by_leaf.items():
            raw = b"".join(y.to_bytes(SHARE_BYTES, "big") for _, y in items)
            out.append((t.rvs(r, leaf), [np.frombuffer(raw, np.uint8)],
                        {"from": party, "owners": [o for o, _ in items]}))
        if pair:  # the coordinator knows the owners (SecAggServer.reveal_layout)
            out.append((t.rv(r), [np.frombuffer(pair, np.uint8)], {"from": party}))
    else:
        raw = b"".join(s.y.to_bytes(SHARE_BYTES if s.kind == "seed" else 32, "big")
                       for s in shares.values())
        out.append((t.rv(r), [np.frombuffer(raw, np.uint8)], {"from": party}))
    return out


__all__ = ["ReleaseCache", "noisy_counts", "plan_identity", "reveal_messages"]
