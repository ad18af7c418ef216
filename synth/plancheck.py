"""A party's check of a round plan against the session it joined and its OWN configuration
(pure logic, no I/O).

A coordinator (buggy or malicious) must not be able to make a party under-noise or
overspend. So a party never takes its noise from the plan: it computes μ itself from the
plan's ρ share per clique and its own S_min (:func:`synth.skellam.party_mu`), and it
refuses a plan whose fields disagree with what it knows:

* the session must hold exactly its own ``parties`` (K comes from the party's
  configuration, never from the session: a session inflated with sybil IDs would
  otherwise lower each party's noise share) and a Shamir threshold at least its own
  floor (``secagg.threshold``): :func:`verify_session`, refused with
  :class:`SessionRefused`;
* ``n_parties`` must be K, the parties of the session it joined;
* ``min_survivors`` must be its own S_min (``secagg.min_survivors`` of its config, or ⌈0.7 K⌉);
* ``min_honest`` must be at least its own (a plan may not assume fewer honest,
  non-colluding parties than the party does); the party's μ is Λ/d with d =
  ``S_min + min_honest − K`` from its OWN configuration
  (:func:`synth.mechanism.resolve_trust`);
* ``noise_model`` must be its own; ``step`` must be 1 (no rounding of noisy values);
* ``rho`` (per clique) must be positive and finite when the party is private (0 only
  when its own config is ε = ∞), and ``len(cliques)·rho`` within its remaining budget;
* the cliques must be non-empty tuples of distinct attributes of its domain, with the
  domain's cell counts;
* ``sigma2_central`` (the variance the coordinator will assume for a sum of S_min
  parties) must not exceed what the party's own noise gives that sum (a coordinator that
  believes in more noise than is there would under-report the error; informational
  only: the noise is the party's own).

A refused plan raises :class:`PlanRefused`, a refused session :class:`SessionRefused` (a
subclass), naming the field and both values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from synth.mechanism import resolve_trust
from synth.skellam import party_mu

#: relative slack for float fields compared with the party's own figures
REL_TOL = 1e-9


class PlanRefused(ValueError):
    """A party refuses a round plan (nothing is measured, spent or released).

    Attributes:
        field: the plan field that disagrees.
        got: the plan's value.
        expected: what the party's own session/config allow.
    """

    def __init__(self, field: str, got: Any, expected: Any, why: str = "") -> None:
        self.field = field
        self.got = got
        self.expected = expected
        super().__init__(f"plan refused: {field} = {got!r}, expected {expected!r}"
                         + (f" ({why})" if why else ""))


class SessionRefused(PlanRefused):
    """A party refuses the secure-aggregation session it was handed (nothing is sent
    after its hello: no keys, no seed shares, no measurement). Same fields as
    :class:`PlanRefused` (``field`` is ``parties`` or ``threshold``)."""

    def __init__(self, field: str, got: Any, expected: Any, why: str = "") -> None:
        super().__init__(field, got, expected, why)
        self.args = (f"session refused: {field} = {got!r}, expected {expected!r}"
                     + (f" ({why})" if why else ""),)

    def __str__(self) -> str:
        return str(self.args[0])


def verify_session(*, session_parties: Sequence[str], threshold: int, own_parties: int,
                   own_threshold_floor: int) -> None:
    """Check a session against the party's own configuration.

    Args:
        session_parties: the session's party IDs.
        threshold: the session's resolved Shamir threshold
            (:attr:`synth.secagg.SecAggConfig.t`).
        own_parties: K, the party's configured ``parties``.
        own_threshold_floor: the lowest threshold it accepts
            (:func:`synth.protocol.secagg_threshold_floor`).

    Raises:
        SessionRefused: more or fewer parties than configured (``parties``), or a
            threshold below the floor (``threshold``).
    """
    k = len(tuple(session_parties))
    if k != int(own_parties):
        raise SessionRefused("parties", k, int(own_parties),
                             "K comes from the party's own configuration; extra IDs "
                             "would be parties it cannot see (sybils) and lower its noise "
                             "share")
    if int(threshold) < int(own_threshold_floor):
        raise SessionRefused("threshold", int(threshold), f">= {int(own_threshold_floor)}",
                             "fewer colluding neighbours could unmask a party's own vector")


def verify_plan(*, n_parties: int, min_survivors: int, min_honest: int, noise_model: str,
                step: float, rho: float, sigma2_central: float,
                cliques: Sequence[Sequence[str]], sizes: Sequence[int],
                session_parties: Sequence[str], domain_shape: Mapping[str, int],
                own_parties: int, own_min_survivors: int, own_min_honest: int,
                own_noise_model: str, private: bool, remaining_rho: float) -> float:
    """Check a plan's fields against the party's session and own configuration, and return
    the Skellam μ the party adds per cell (0.0 for a non-private run).

    Args:
        n_parties ... sizes: the plan's fields (:class:`synth.protocol.RoundPlan`).
        session_parties: the parties of the session the party joined (K = their number).
        domain_shape: attribute -> cells of the domain the party counts in.
        own_parties: K, the party's configured ``parties`` (the session must hold
            exactly as many).
        own_min_survivors: the party's configured ``min_survivors`` (0 = default for K).
        own_min_honest: the party's configured ``min_honest`` (0 = default for K).
        own_noise_model: the party's configured noise model.
        private: whether the party's own ε is finite.
        remaining_rho: ρ left in the party's own ledger.

    Returns:
        μ for :func:`synth.mechanism.measure_party`.

    Raises:
        PlanRefused: a field disagrees; the message names it and both values
            (:class:`SessionRefused` when the session's size is not ``own_parties``).
        synth.mechanism.TrustModelError: the party's own S_min and min_honest leave no
            honest party guaranteed in a release (d < 1).
        synth.skellam.SkellamAccountingError: the ρ share cannot be accounted.
    """
    k = len(tuple(session_parties))
    if k != int(own_parties):
        raise SessionRefused("parties", k, int(own_parties), "the session's parties are not "
                             "the party's configured K")
    if int(n_parties) != k:
        raise PlanRefused("n_parties", n_parties, k, "K is the parties of the joined session")
    trust = resolve_trust(int(own_parties), own_min_survivors, own_min_honest,
                          noise_model=own_noise_model)
    s_min = trust.min_survivors
    if int(min_survivors) != s_min:
        raise PlanRefused("min_survivors", min_survivors, s_min, "the party's own S_min")
    if int(min_honest) < trust.min_honest:
        raise PlanRefused("min_honest", min_honest, f">= {trust.min_honest}",
                          "the plan assumes fewer honest, non-colluding parties than the "
                          "party's own min_honest")
    if noise_model != own_noise_model:
        raise PlanRefused("noise_model", noise_model, own_noise_model)
    if float(step) != 1.0:
        raise PlanRefused("step", step, 1.0, "noisy values are never rounded per party")
    cl = [tuple(c) for c in cliques]
    if not cl or len(cl) != len(tuple(sizes)):
        raise PlanRefused("cliques", len(cl), f"{len(tuple(sizes))} (one per size, >= 1)")
    for c, n in zip(cl, sizes, strict=True):
        if not c or len(set(c)) != len(c) or any(a not in domain_shape for a in c):
            raise PlanRefused("cliques", c, "distinct attributes of the party's domain")
        cells = math.prod(int(domain_shape[a]) for a in c)
        if int(n) != cells:
            raise PlanRefused("sizes", n, cells, f"cells of clique {c}")
    rho = float(rho)
    if not private:
        if rho != 0.0:
            raise PlanRefused("rho", rho, 0.0, "the party runs without noise (epsilon = inf)")
        return 0.0
    if not (0.0 < rho < math.inf):
        raise PlanRefused("rho", rho, "> 0 and finite", "a private party never releases "
                          "without noise")
    total = rho * len(cl)
    if total > remaining_rho * (1.0 + REL_TOL) + 1e-15:
        raise PlanRefused("rho", total, f"<= {remaining_rho!r} (the party's remaining budget)")
    mu = party_mu(rho, trust.honest_in_release, model=own_noise_model)
    own_s2 = 2.0 * mu * (1 if own_noise_model == "local" else s_min)
    if float(sigma2_central) > own_s2 * (1.0 + 1e-6):
        raise PlanRefused("sigma2_central", sigma2_central, f"<= {own_s2!r}",
                          "the coordinator assumes more noise than the party adds")
    return mu


__all__ = ["PlanRefused", "REL_TOL", "SessionRefused", "verify_plan", "verify_session"]
