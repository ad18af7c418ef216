"""The VFL algorithms, apart from any I/O: sans-IO strategies that yield actions
(``strategy``, ``actions``), the schedules (ΔT_t, batch order, validation splits, the
in-flight window: ``schedule``), how the active party fuses its partners' embeddings
(``fuse``), the batch sample model (``samples``), the active-only baseline
(``baseline``), the cut-layer tensors' wire encoding (``wire``) and the checks of what a
peer sends (``intake``).

May import :mod:`parties.core` only (no socket, event loop, bus or file: the
architecture test checks it). Driven by :mod:`parties.runtime` over the bus, by the
simulator in memory.
"""
