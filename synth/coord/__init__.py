"""The FedForge coordinator's parts; :class:`synth.coordinator.Coordinator` wires them.

A run is a sequence of stage objects over one checkpoint store, sharing a run context:

* :mod:`~synth.coord.types`: the error, the evaluation data and a round's result.
* :mod:`~synth.coord.store`: the checkpoint store (``stages/checkpoint.json`` and its
  arrays; the fingerprint a resumed run must match).
* :mod:`~synth.coord.context`: the state the stages share, the stage timer, the artifact
  writer and the crash-point observer.
* :mod:`~synth.coord.collect`: one message per participant from the bus, with resume
  requests.
* :mod:`~synth.coord.session`: the ``schema``, ``budget``, ``keys`` and ``seeds:<b>``
  stages.
* :mod:`~synth.coord.planners`: MST's and AIM's pure planners (what each round measures,
  with which ρ), the budget split and the domain compression; no bus, no I/O.
* :mod:`~synth.coord.rounds`: one secure-aggregation round (plan, masked sums, unmask).
* :mod:`~synth.coord.recovery`: dropout recovery of the released rounds.
* :mod:`~synth.coord.driver`: the mechanism's rounds, driven by a planner.
* :mod:`~synth.coord.synthesis`, :mod:`~synth.coord.updates`,
  :mod:`~synth.coord.evaluation`: the ``synthesis`` stage, workload updates and the
  ``quality`` stage.
* :mod:`~synth.coord.metrics`: stage timing, wire-byte accounting and ``metrics.json``.
"""
