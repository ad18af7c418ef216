"""CURVE key files, the loopback rule and the handshake classification (pure + files)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import zmq

from pubsub.errors import InsecureTransport, KeyFileError
from pubsub.security import (
    CurveClient,
    check_insecure_allowed,
    classify_handshake,
    generate_certificate,
    is_loopback,
    read_certificate,
    read_public_directory,
)
from sim.cli import main as psfl


def test_generate_writes_a_private_secret_and_a_public_file(tmp_path: Path) -> None:
    pub, sec = generate_certificate(tmp_path / "k", "passive", role="passive")
    assert stat.S_IMODE(sec.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    c = read_certificate(pub)
    assert (c.name, c.role, c.secret_key) == ("passive", "passive", None)
    s = read_certificate(sec, secret=True)
    assert s.public_key == c.public_key and s.secret_key is not None
    assert zmq.curve_public(s.secret_key) == c.public_key
    with pytest.raises(KeyFileError, match="exists"):
        generate_certificate(tmp_path / "k", "passive", role="passive")


def test_a_secret_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    _, sec = generate_certificate(tmp_path, "active", role="active")
    os.chmod(sec, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        read_certificate(sec, secret=True)


def test_bad_files_give_typed_errors_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.key"
    bad.write_text("curve\n    public-key = \"short\"\n")
    with pytest.raises(KeyFileError, match="x.key"):
        read_certificate(bad)
    with pytest.raises(KeyFileError, match="cannot read"):
        read_certificate(tmp_path / "missing.key")
    pub, _ = generate_certificate(tmp_path, "a", role="active")
    with pytest.raises(KeyFileError, match="no secret key"):
        read_certificate(pub, secret=True)
    with pytest.raises(KeyFileError, match="key name"):
        generate_certificate(tmp_path, "../evil")


def test_public_directory_skips_the_broker_and_rejects_duplicates(tmp_path: Path) -> None:
    for n in ("broker", "active", "passive"):
        generate_certificate(tmp_path, n, role="" if n == "broker" else n)
    names = [c.name for c in read_public_directory(tmp_path)]
    assert names == ["active", "passive"]
    (tmp_path / "copy.key").write_bytes((tmp_path / "active.key").read_bytes())
    with pytest.raises(KeyFileError, match="same public key|appears twice"):
        read_public_directory(tmp_path)


def test_client_keys_never_print_the_secret(tmp_path: Path) -> None:
    for n in ("broker", "active"):
        generate_certificate(tmp_path, n, role="" if n == "broker" else n)
    c = CurveClient.from_dir(tmp_path, "active")
    assert c.secret_key.decode() not in repr(c) and c.secret_key.decode() not in str(c)


@pytest.mark.parametrize(("host", "ok"), [("127.0.0.1", True), ("127.3.2.1", True),
                                          ("localhost", True), ("[::1]", True),
                                          ("0.0.0.0", False), ("*", False),
                                          ("10.0.0.5", False), ("example.org", False)])
def test_plaintext_only_on_loopback(host: str, ok: bool) -> None:
    assert is_loopback(host) is ok
    addr = f"tcp://{host}:5555"
    if ok:
        check_insecure_allowed(addr)
    else:
        with pytest.raises(InsecureTransport, match="loopback only"):
            check_insecure_allowed(addr)


E = zmq.Event


@pytest.mark.parametrize(("events", "state", "status"), [
    ([], "unreachable", 0),
    ([(E.CONNECT_DELAYED, 0), (E.CLOSED, 0), (E.CONNECT_RETRIED, 100)], "unreachable", 0),
    ([(E.CONNECTED, 20)], "pending", 0),
    ([(E.CONNECTED, 20), (E.HANDSHAKE_SUCCEEDED, 0)], "ok", 0),
    ([(E.CONNECTED, 20), (E.HANDSHAKE_FAILED_AUTH, 400), (E.DISCONNECTED, 20)], "refused", 400),
    ([(E.CONNECTED, 20), (E.HANDSHAKE_FAILED_NO_DETAIL, 32)], "pending", 0),
    ([(E.CONNECTED, 20), (E.HANDSHAKE_FAILED_NO_DETAIL, 32)] * 3, "server_key", 0),
    ([(E.CONNECTED, 20), (E.HANDSHAKE_FAILED_PROTOCOL, 0x30000000)] * 3, "server_key", 0),
    ([(E.CONNECTED, 20), (E.HANDSHAKE_FAILED_NO_DETAIL, 32),
      (E.HANDSHAKE_FAILED_PROTOCOL, int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH))],
     "mechanism", 0),
])
def test_classify_handshake(events: list[tuple[int, int]], state: str, status: int) -> None:
    v = classify_handshake([(int(e), int(val)) for e, val in events])
    assert (v.state, v.status) == (state, status)


def test_keys_generate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "keys"
    assert psfl(["keys", "generate", "broker", "active", "passive", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    for n in ("broker", "active", "passive"):
        sec = read_certificate(d / f"{n}.key_secret", secret=True)
        assert sec.secret_key is not None and sec.secret_key.decode() not in out
    assert read_certificate(d / "passive.key").role == "passive"
    assert read_certificate(d / "broker.key").role == ""
    assert psfl(["keys", "generate", "active", "--dir", str(d)]) == 2  # exists: refused


@pytest.mark.parametrize(("plaintext_answers", "kind"), [(True, "plaintext"), (False, "server_key")])
def test_vague_failures_of_a_curve_client_ask_the_plaintext_probe(
        plaintext_answers: bool, kind: str) -> None:
    """Three handshake failures without a cause: a broker that completes a plaintext
    handshake is plaintext (not "another key"), one that does not holds another key."""
    from pubsub.address import BrokerAddress
    from pubsub.control import _raise_on_handshake
    from pubsub.errors import AuthenticationFailed
    pub, sec = zmq.curve_keypair()
    sec_client = CurveClient(identity="active", public_key=pub, secret_key=sec,
                             server_key=pub, server_key_file="broker.key")
    events = [(int(E.CONNECTED), 20), (int(E.HANDSHAKE_FAILED_NO_DETAIL), 32)] * 3
    asked: list[bool] = []

    def probe() -> bool:
        asked.append(True)
        return plaintext_answers

    addr = BrokerAddress.parse("tcp://127.0.0.1:5555")
    with pytest.raises(AuthenticationFailed) as ei:
        _raise_on_handshake(events, addr, "tcp://127.0.0.1:5557", sec_client, probe)
    assert ei.value.kind == kind and asked == [True]
    # A plaintext client never pins a key: no probe, the broker requires CURVE.
    asked.clear()
    with pytest.raises(AuthenticationFailed) as ei:
        _raise_on_handshake(events, addr, "tcp://127.0.0.1:5557", None, probe)
    assert ei.value.kind == "curve_required" and asked == []
