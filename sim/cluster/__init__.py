"""The heterogeneous-cluster simulator: per-party CPU quotas (``cpu``) and memory
limits (``memory``), shaped links (``relay``), the scenario files (``scenario``,
``consortium``) and their runs (``runner``, ``consortium_run``), and the discrete-event
model of the algorithms' schedules (``des``).

May import :mod:`sim.launch` (it shapes what the launchers start), :mod:`sim.reports`
and everything below them.
"""
