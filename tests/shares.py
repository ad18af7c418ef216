"""The order of the collection under pytest-xdist's worksteal scheduler (tests/conftest.py).

worksteal first hands each of its N workers a contiguous share of the collection (share
sizes as its scheduler computes them), then lets an idle worker steal the second half of
the longest queue *by count*. A worker whose share ends in a few long tests (the tutorials
module: six commands-driving tests, minutes each beside other work) keeps them to itself
while the others drain their many short ones, and the run waits for it. So:

* the ``exclusive`` tests come first (they drain the machine once, early, on one worker);
* each ``heavy(seconds=S)`` test is assigned to a share greedily, longest first, to the
  share with the least heavy seconds so far (the exclusive block counts against the
  first), and placed near the head of its share, where no steal takes it and it runs while
  the others' short tests fill in. Not at the very head when there are exclusive tests:
  the exclusive block waits for every test already running to end (conftest.py's machine
  lock), so each other share first runs :data:`LEAD` light tests (a heavy test first
  there made the block, and every worker behind it, wait 90 s for one tutorial);
* the other tests keep their module order between them (module-scoped fixtures are set up
  once per share as before).

Pure: it orders opaque items by the callables given, so it is unit-tested without pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

#: seconds charged to the first share for the exclusive block, when it has exclusive tests
EXCLUSIVE_BLOCK_S = 60.0
#: light tests that lead each share but the first before its heavy ones, when the
#: collection has exclusive tests
LEAD = 5


def share_sizes(total: int, workers: int) -> list[int]:
    """The initial share of each of ``workers`` idle workers out of ``total`` items, as
    worksteal deals them (each takes ``pending // workers_remaining``)."""
    sizes, left = [], total
    for i in range(workers):
        n = left // (workers - i)
        sizes.append(n)
        left -= n
    return sizes


def order_for_shares(items: Sequence[T], workers: int, *, exclusive: Callable[[T], bool],
                     heavy_s: Callable[[T], float | None]) -> list[T]:
    """``items`` reordered for ``workers`` worksteal shares (see the module docstring).

    ``heavy_s(item)`` is the item's seconds if it is heavy, else None. With one worker (or
    none) only the exclusive-first rule applies.
    """
    excl = [it for it in items if exclusive(it)]
    rest = [it for it in items if not exclusive(it)]
    if workers <= 1:
        return excl + rest
    heavy = sorted((it for it in rest if heavy_s(it) is not None),
                   key=lambda it: -float(heavy_s(it) or 0.0))
    light = [it for it in rest if heavy_s(it) is None]
    load = [0.0] * workers
    if excl:
        load[0] = EXCLUSIVE_BLOCK_S
    heads: list[list[T]] = [[] for _ in range(workers)]
    for it in heavy:
        j = min(range(workers), key=lambda k: (load[k], k))
        heads[j].append(it)
        load[j] += float(heavy_s(it) or 0.0)
    out: list[T] = []
    sizes = share_sizes(len(items), workers)
    for j, size in enumerate(sizes):
        lead: list[T] = []
        if excl and j > 0:
            lead, light = light[:LEAD], light[LEAD:]
        share = (excl if j == 0 else lead) + heads[j]
        fill = max(0, size - len(share))
        out += share + light[:fill]
        del light[:fill]
    return out + light
