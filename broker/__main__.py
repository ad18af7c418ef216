"""``python -m broker run|stats``: the same as ``psfl broker run|stats``."""

from broker.cli import main

raise SystemExit(main())
