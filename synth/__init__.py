"""synth: FedForge, federated differentially private tabular synthesis.

Parties measure noisy marginals of their own rows, secure aggregation sums them through an
aggregation tree, and the coordinator fits a synthesis model to the noisy aggregate only.
The user-facing entry points are :class:`sim.fedforge.FedForge` and ``psfl synth run``;
docs/explanation/fedforge-protocol.md describes the protocol, docs/results/fedforge.md its
measurements. Main modules:

* :mod:`synth.party`: a data-holding party (with ``party_release``, ``party_ledger``).
* :mod:`synth.aggregator`: a node of the aggregation tree.
* :mod:`synth.coordinator`: orchestrates a run over the stage objects of
  :mod:`synth.coord` (session, rounds, recovery, driver and planners, synthesis,
  workload updates, evaluation, checkpoint store).
* :mod:`synth.secagg`: secure aggregation of integer vectors over many rounds.
* :mod:`synth.mechanism`, :mod:`synth.skellam`, :mod:`synth.accounting`: the Skellam
  measurement mechanism and its zCDP / Rényi accounting.
* :mod:`synth.engine`, :mod:`synth.diffusion`: synthesis engines fitted to the noisy
  aggregate marginals.
* :mod:`synth.quality`: marginal distances and ML utility of synthetic data.
* :mod:`synth.baselines`: the weight-based and ensemble baselines (DP-SGD via opacus).

Also: domains and encoding (``domain``), compression (``compress``), clique selection
(``select``), wire protocol (``protocol``), row splits (``split``), configuration
(``config``), workload updates (``workload``, ``gum``) and the processes' entry points
(``cli``, ``python -m synth``).
"""
