"""Hosts made of namespaces: the pure parts (addresses, the wrapped command line); the
namespaces themselves are exercised by tests/integration/test_tutorials.py::test_bank_and_partner."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.launch.hosts import NamespaceHosts


def test_host_addresses_must_be_distinct_and_share_a_subnet(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one /24"):
        NamespaceHosts(tmp_path, {"a": "10.77.0.1", "b": "10.78.0.2"})
    with pytest.raises(ValueError, match="distinct"):
        NamespaceHosts(tmp_path, {"a": "10.77.0.1", "b": "10.77.0.1"})


def test_a_command_runs_in_its_hosts_namespace_seeing_its_own_directory(tmp_path: Path) -> None:
    h = NamespaceHosts(tmp_path, {"broker": "10.77.0.1", "bank": "10.77.0.3"})
    argv = h.argv("bank", ["python", "-c", "print(1)"])
    assert argv[:4] == ["ip", "netns", "exec", h.ns["bank"]]
    assert h.ns["bank"] != h.ns["broker"] and h.hub not in h.ns.values()
    assert argv[-3:] == ["python", "-c", "print(1)"]
    assert str(tmp_path.resolve() / "bank") in argv and "--mount" in argv
    h.close()  # nothing made: closing is a no-op, and idempotent
    h.close()
