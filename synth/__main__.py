"""``python -m synth {coordinator,aggregators,parties} ...``: see :mod:`synth.cli`."""

from synth.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
