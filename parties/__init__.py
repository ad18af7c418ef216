"""The VFL parties (the active party with the labels, one to nine passive parties), as
subpackages by concern, each importing only those below it (checked by
``tests/unit/test_architecture.py``):

========================  ==============================================================
``parties.core``          errors, tasks, party and run ids, CPU meters, the fork server
``parties.algorithms``    strategies and actions, schedules, fusing, the wire encoding,
                          intake checks (no I/O)
``parties.datasets``      the bundled tables and their registry
``parties.config``        the run configuration (``[vfl]``) and model specs
``parties.privacy``       DP plans, accountants and ledgers; DP-SGD
``parties.data``          tables, encoders, schemas, treatments, streaming, row stores
``parties.models``        networks, the zoo, the parameter server, a worker's compute
``parties.planning``      profiles, the cost model, sweeps, the planner, probes
``parties.runtime``       the party process: I/O loop, driver, workers, outputs
``parties.alignment``     private ID alignment (PSI, over the bus, N-way)
``parties.cli``           ``python -m parties PARTY ...``
========================  ==============================================================
"""
