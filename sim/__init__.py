"""sim: launches the broker and parties as OS processes (and, later, shapes them).

:func:`sim.launch.run_vfl` is what ``psfl vfl run`` and ``psfl demo`` call.
"""
