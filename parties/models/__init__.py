"""The models and their training arithmetic (torch, no I/O): the built-in networks
(``nets``), the model zoo and user factories (``zoo``), the parameter server, replicas
and the per-worker compute (``model``), and a worker's compute built from the run's
configuration (``compute``).

May import :mod:`parties.core`, :mod:`parties.algorithms`, :mod:`parties.config`,
:mod:`parties.privacy` and :mod:`parties.data`.
"""
