"""``python -m broker run|stats``: the same as ``psfl broker run|stats``."""

from broker.cli import main

if __name__ == "__main__":  # guard: spawned worker processes re-import __main__
    raise SystemExit(main())
