"""Fault injection and adversaries: for FedForge runs, a coordinator killed at a chosen
point (``synth_crash``) and parties that fail at a stage (``synth_party``); for VFL runs,
an eavesdropper on a passive party's gradients (``eavesdrop``) and the label-inference
attacks run on what it records (``label_attacks``); for ID alignment, a partner
that forges a point off P-256 (``psi_forge``). The VFL faults of a scenario are
scheduled by :mod:`sim.cluster.runner`.

May import :mod:`synth`, :mod:`parties` (the eavesdropper: the configuration and the wire
format) and :mod:`pubsub`.
"""
