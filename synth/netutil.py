"""Bus helpers shared by FedForge's participants (party, aggregator, coordinator)."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from pubsub import BufferLimits, Bus, BusConfig
from pubsub.security import CurveClient
from pubsub.transport import Connect, Transport
from synth.compress import pack_varbits, unpack_varbits
from synth.config import SynthConfig


def topic_limits(cfg: SynthConfig) -> BufferLimits:
    """Bounds of a participant's per-topic buffers: the coordinator's ``pk``/``sh``/``rv``
    and ``hello`` topics receive one message per party (and aggregator), so the message
    bound grows with K; masked vectors of a big round are the largest messages."""
    return BufferLimits(max_msgs=2 * cfg.parties + 64, max_bytes=256 << 20)


def bus_config(cfg: SynthConfig) -> BusConfig:
    """The bus settings of every FedForge participant."""
    return BusConfig(connect_timeout_s=cfg.timeouts.connect_timeout_s, total_max_bytes=1 << 30,
                     topic_max_bytes=256 << 20)


def open_bus(cfg: SynthConfig, name: str, *, broker: str | None,
             security: CurveClient | None, connect: Connect | None
             ) -> contextlib.AbstractAsyncContextManager[Transport] | Any:
    """A participant's bus connection (an async context manager): ``connect(name)`` when
    the participant was handed one (in process, :class:`pubsub.memory.MemoryBroker`), else
    a :class:`pubsub.Bus` to ``broker``."""
    if connect is not None:
        return connect(name, config=bus_config(cfg))
    if not broker:
        raise ValueError(f"{name}: give the broker's address or a connect function")
    return Bus(broker, name=name, config=bus_config(cfg), security=security)


class ParticipantError(RuntimeError):
    """A participant cannot go on (bad data, a refused budget, a protocol failure).

    Attributes:
        who: the participant's id.
        reason: what went wrong (sent to the coordinator, never data).
        code: the process exit code it maps to (2: bad input, 4: a peer missing, 1: other).
    """

    def __init__(self, who: str, reason: str, *, code: int = 1) -> None:
        self.who = who
        self.reason = reason
        self.code = code
        super().__init__(f"{who}: {reason}")


def words_to_array(words: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Masked ring words (uint64) packed as uint8 bytes ready to publish, word ``i`` in
    ``widths[i]`` bits (per-cell rings, :func:`synth.compress.pack_varbits`)."""
    return np.frombuffer(pack_varbits(words, widths), dtype=np.uint8)


def array_to_words(arr: np.ndarray, widths: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`words_to_array`.

    Raises:
        ValueError: the byte count does not fit ``n`` words of those widths.
    """
    if widths.shape[0] != n:
        raise ValueError(f"{widths.shape[0]} widths for {n} words")
    return unpack_varbits(np.ascontiguousarray(arr, dtype=np.uint8).tobytes(), widths)


__all__ = ["ParticipantError", "array_to_words", "peak_rss_bytes", "words_to_array"]


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size, bytes (``VmHWM`` of ``/proc/self/status``;
    not ``ru_maxrss``, which survives ``execve``, so a child of a large launcher would
    report the launcher's size). None where ``/proc`` is missing."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None

