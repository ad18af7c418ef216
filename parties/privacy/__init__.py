"""The passive party's differential privacy: the plan and accountant of its releases
(``dp``: Gaussian DP, the embedding privatizer, the per-record ledger) and DP-SGD for
its bottom model (``dpsgd``), and a passive party's DP state at the start of a run
(``party``).

May import :mod:`parties.core` and :mod:`parties.config`.
"""
