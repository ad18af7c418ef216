"""Reading runs back: the plots of ``psfl report`` for VFL (``vfl``) and FedForge
(``synth``, ``synth_plot``) runs, what they share (``common``), and the statistics of the
empirical privacy audit (``audit``). Pure loading and series apart from the drawing.

May import :mod:`parties` (timelines, the DP accountant's ε); the runs are read
from their files.
"""
