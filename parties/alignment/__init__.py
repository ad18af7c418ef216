"""Private ID alignment: the pure PSI (``psi``), the two-party protocol over the bus
(``align``), the N-way protocol (``nway``) and a party's alignment command (``run``).

May import :mod:`parties.core`, :mod:`parties.config` and, for the command's exit
codes and result files, :mod:`parties.runtime`.
"""
