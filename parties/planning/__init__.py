"""Choosing a run's settings from measurements: compute profiles (``profile``), the
cost model of a step (``costmodel``), sweeps over batch sizes (``sweep``), the planner
(``planner``) and the bus's communication probe (``commprobe``).

May import everything below :mod:`parties.runtime` (core, algorithms, config, privacy,
data, models); the runtime uses the planner, not the reverse.
"""
