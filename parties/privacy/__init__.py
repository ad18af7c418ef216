"""The passive party's differential privacy: the plan and accountant of its releases
(``dp``: Gaussian DP, the embedding privatizer, the per-record ledger) and DP-SGD for
its bottom model (``dpsgd``), a party's DP state at the start of a run (``party``), and
the active party's protection of its labels (``labels``: label DP by randomised response,
the Marvell-style gradient noise).

May import :mod:`parties.core` and :mod:`parties.config`.
"""
