"""A party process at work: the party's I/O loop (``party``), its session with its
partners (``session``: subscriptions, handshake, heartbeats, aborts), its scoring and
evaluation releases (``evaluation``), its bookkeeping (``bookkeeping``: the training
clock, history and metrics), what those pieces read of it (``context``), the driver that interprets a strategy's actions over the
bus (``driver``), the workers
(``workers``), serving a run and writing its outputs (``serve``), the timeline
(``timeline``), saved model parts (``saved``), prediction (``predict``), reports and exit
codes (``report``, ``exitcodes``), and what the fork server preloads (``preload``).

May import every other part of :mod:`parties` but :mod:`parties.alignment` and
:mod:`parties.cli`.
"""
