"""Fault injection for FedForge runs: a coordinator killed at a chosen point
(``synth_crash``) and parties that fail at a stage (``synth_party``). The VFL faults of a
scenario are scheduled by :mod:`sim.cluster.runner`.

May import :mod:`synth` only.
"""
