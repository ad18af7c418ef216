"""sim: launches the broker and the parties as processes, shapes them into a simulated
heterogeneous cluster, injects faults and reads runs back. Subpackages, each importing
only those below it (``tests/unit/test_architecture.py``): ``cluster`` (CPU and memory
quotas, shaped links, scenarios, the discrete-event model), ``launch`` (a run's
processes, or a run in this process), ``faults`` and ``reports``. ``sim.cli`` is the
``psfl`` command; ``sim.api`` and ``sim.fedforge`` are the Python API.
"""
