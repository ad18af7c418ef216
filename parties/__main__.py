"""``python -m parties {active,passive} ...``: run one VFL party."""

from parties.cli import main

raise SystemExit(main())
