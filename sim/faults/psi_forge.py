"""A partner that forges PSI points: a bus client wrapper that replaces one point of one
published chunk (``psi/.../req/<i>`` or ``.../resp/<i>``) by an x-coordinate that is not
on P-256, and the helpers to build such points. Used by the alignment tests and
``bench/hostile.py``'s off-curve case."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import numpy as np

#: P-256's field prime and curve constant b (y^2 = x^3 - 3x + b), FIPS 186-4 D.1.2.3.
P256_P = 2**256 - 2**224 + 2**192 + 2**96 - 1
P256_B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B


def off_curve_x() -> int:
    """The smallest x >= 1 for which no point of P-256 has that x-coordinate
    (``x^3 - 3x + b`` is not a square mod p: Euler's criterion)."""
    x = 1
    while pow((x ** 3 - 3 * x + P256_B) % P256_P, (P256_P - 1) // 2, P256_P) != P256_P - 1:
        x += 1
    return x


def off_curve_point(kind: str = "off-curve") -> np.ndarray:
    """A 33-byte compressed encoding that does not decode: ``off-curve`` (an x with no
    point) or ``x>=p`` (an x-coordinate at or above the field prime)."""
    x = off_curve_x() if kind == "off-curve" else P256_P + 1
    return np.frombuffer(b"\x02" + x.to_bytes(32, "big"), np.uint8).copy()


class ForgingBus:
    """Forwards everything to ``inner``; ``publish`` on a topic ending in
    ``/<kind>/<chunk>`` sends the chunk with point ``point`` replaced by ``bad``."""

    def __init__(self, inner: Any, *, kind: str, chunk: int, point: int,
                 bad: np.ndarray) -> None:
        self._inner = inner
        self._pattern = re.compile(rf"/{kind}/{chunk}$")
        self._point = point
        self._bad = bad
        self.forged = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def publish(self, topic: str, arrays: Any = (), meta: Any = None, *,
                      copy: bool = True) -> int:
        if self._pattern.search(topic):
            pts = np.array(arrays[0], copy=True)
            pts[self._point] = self._bad
            arrays = [pts]
            self.forged += 1
        return await self._inner.publish(topic, arrays, meta, copy=copy)


def forging(connect: Callable[[str], AbstractAsyncContextManager[Any]], *, kind: str = "req",
            chunk: int = 0, point: int = 0, bad: np.ndarray | None = None
            ) -> Callable[[str], AbstractAsyncContextManager[ForgingBus]]:
    """``connect`` wrapped so that the client forges as :class:`ForgingBus` does."""
    pt = off_curve_point() if bad is None else bad

    @contextlib.asynccontextmanager
    async def wrapped(name: str) -> AsyncIterator[ForgingBus]:
        async with connect(name) as bus:
            yield ForgingBus(bus, kind=kind, chunk=chunk, point=point, bad=pt)

    return wrapped
