"""``python -m synth {coordinator,aggregators,parties} ...``: see :mod:`synth.cli`."""

from pubsub.cli import exit_now
from synth.cli import main

if __name__ == "__main__":
    # Everything is written when main returns (atomic files, the event log flushed by
    # exit_now): skip the interpreter's teardown (pubsub.cli.exit_now).
    exit_now(main())
