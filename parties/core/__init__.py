"""The vocabulary every part of a party shares, and the machine it runs on.

Owns: the party's errors (``errors``), the learning tasks and their metrics (``tasks``),
party and run ids (``ids``), the CPU meters and quotas (``sysinfo``) and the fork server
party processes start from (``zygote``). May import nothing of :mod:`parties` (only
:mod:`pubsub` and the standard library, numpy, scikit-learn's metrics).
"""
