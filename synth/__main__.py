"""``python -m synth {coordinator,aggregators,parties} ...``: see :mod:`synth.cli`."""

import logging
import os
import sys

from synth.cli import main

if __name__ == "__main__":
    code = main()
    # Everything is written by now (atomic files, the event log's handle flushed below);
    # skip the interpreter's teardown, which with torch loaded takes about 0.5 s.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
