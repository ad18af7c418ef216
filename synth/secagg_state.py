"""The secure-aggregation server's checkpoint codec: :class:`synth.secagg.SecAggServer`'s
session state to and from a JSON-safe document.

The state is what a resumed coordinator needs to go on with the same session: the
parties' public keys, the ciphertexts of the seed shares routed per batch of rounds and
which stages closed. Everything in it is public or encrypted to its receiver; rounds in
progress are not kept (a resumed coordinator re-runs them). Bytes travel as hex.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synth.secagg import PartyKeys, ProtocolError, SecAggServer


def server_state(server: SecAggServer) -> dict[str, Any]:
    """JSON-safe session state (public keys, the ciphertexts of seed shares routed per
    batch, which stages closed), for the coordinator's checkpoint."""
    return {
        "session_id": server.config.session_id,
        "keys": {p: [k.mask_public.hex(), k.enc_public.hex()]
                 for p, k in server._keys.items()},
        "keys_closed": server._keys_closed,
        "batches": [{"rounds": list(b), "closed": b in server._batch_closed,
                     "shares": {s: {r: blob.hex() for r, blob in msgs.items()}
                                for s, msgs in server._shares.get(b, {}).items()}}
                    for b in sorted({*server._shares, *server._batch_closed})],
    }


def restore_server(server: SecAggServer, state: Mapping[str, Any]) -> None:
    """Restore :func:`server_state` into a fresh server of the same session.

    Raises:
        ProtocolError: another session's state, or the server already has state.
        ValueError: malformed state.
    """
    if state.get("session_id") != server.config.session_id:
        raise ProtocolError("", f"checkpoint of session {state.get('session_id')!r}, "
                            f"not {server.config.session_id!r}")
    if server._keys or server._shares or server._rounds:
        raise ProtocolError("", "load_state_dict into a server that already has state")
    try:
        keys = {str(p): PartyKeys(party=str(p), mask_public=bytes.fromhex(m),
                                  enc_public=bytes.fromhex(e))
                for p, (m, e) in state["keys"].items()}
        batches = [(tuple(str(r) for r in b["rounds"]), bool(b["closed"]),
                    {str(s): {str(r): bytes.fromhex(x) for r, x in msgs.items()}
                     for s, msgs in b["shares"].items()})
                   for b in state["batches"]]
        keys_closed = bool(state["keys_closed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed secure-aggregation state: {exc!r}") from None
    unknown = sorted(p for p in keys if p not in server.config.index)
    if unknown:
        raise ValueError(f"secure-aggregation state names unknown parties {unknown[:5]}")
    server._keys, server._keys_closed = keys, keys_closed
    for batch, closed, shares in batches:
        if shares:
            server._shares[batch] = shares
        if closed:
            server._batch_closed.add(batch)
        for r in batch:
            server._batch_of[r] = batch


__all__ = ["restore_server", "server_state"]
