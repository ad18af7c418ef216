"""Socket-level helpers for envelopes (I/O; the pure codec is :mod:`pubsub.codec`)."""

from __future__ import annotations

from typing import Any

import zmq

_RCVMORE = zmq.RCVMORE


def recv_envelope(sock: zmq.Socket, flags: int = 0) -> list[Any]:
    """Receive one multipart message: topic and header as ``bytes``, payload frames as
    ``zmq.Frame`` (zero-copy).

    Small frames are cheaper to handle as bytes than as Frame objects (about 1 µs each
    saved on the hot path); payloads stay zero-copy whatever their size.

    Raises:
        zmq.Again: with ``zmq.NOBLOCK`` and nothing to read.
    """
    frames: list[Any] = [sock.recv(flags)]
    if sock.getsockopt(_RCVMORE):
        frames.append(sock.recv())  # the rest of a multipart message is already here
        while sock.getsockopt(_RCVMORE):
            frames.append(sock.recv(copy=False))
    return frames
