"""``python -m parties {active,passive} ...``: run one VFL party."""

import logging
import os
import sys

from parties.cli import main

if __name__ == "__main__":  # guard: spawned worker processes re-import __main__
    code = main()
    # Everything is written by now (metrics and models closed, the event log flushed per
    # line, worker processes joined and their data directory removed, the bus closed);
    # skip the interpreter's teardown, which with torch, scikit-learn and pandas loaded
    # takes 1.5-3 s of CPU (a full garbage collection of their module graphs, then
    # torch's operator registry destructors), as python -m synth does.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
