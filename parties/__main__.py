"""``python -m parties {active,passive} ...``: run one VFL party."""

from parties.cli import main
from pubsub.cli import exit_now

if __name__ == "__main__":  # guard: spawned worker processes re-import __main__
    # Everything is written when main returns (metrics and models closed, the event log
    # flushed per line, worker processes joined and their data directory removed, the
    # bus closed): skip the interpreter's teardown (pubsub.cli.exit_now).
    exit_now(main())
