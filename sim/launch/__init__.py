"""Launchers: a run's processes on this machine (the broker, each party, FedForge's
coordinator, aggregators and parties) or in this process over the in-memory bus, for
training (``vfl``, ``local``, ``synth``, ``synth_local``), prediction (``predict``), ID
alignment (``align``), profiling and planning (``sysprofile``, ``pilot``).

May import :mod:`pubsub`, :mod:`broker`'s command line (as a process), :mod:`parties`,
:mod:`synth` and :mod:`sim.faults`.
"""
