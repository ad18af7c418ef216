"""Separate hosts on one Linux machine: each host a network namespace with its own address
on a private bridge, and each command run on a host seeing only that host's directory.

:class:`NamespaceHosts` (root only) creates, for hosts ``{name: address}``, a namespace
per host and one more holding a bridge that joins them (a veth pair per host), so the
hosts reach each other only by those addresses: a host's ``127.0.0.1`` is its own
loopback, where no other host listens. :meth:`NamespaceHosts.argv` wraps a command to run
on a host: in its namespace, in a mount namespace of its own where the work directory
shows the host's own subdirectory and nothing else (the other hosts' directories, the
files the setup made, are hidden under an empty ``tmpfs``). Closing deletes the
namespaces (and with them the links).

:func:`namespaces_unavailable` says why hosts cannot be made here (not root, no ``ip``,
no ``unshare``, namespaces refused), or None.

Owns: :class:`NamespaceHosts`, :func:`namespaces_unavailable`. May import the standard
library only.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: the hosts' subnet prefix length (the addresses a caller gives must share it)
PREFIX = 24
#: where a host's own directory is mounted while the work directory is hidden
_STASH = "/mnt"
_WRAP = ('set -e; own="$1"; work="$2"; name="$3"; shift 3; '
         'mount --bind "$own" ' + _STASH + '; mount -t tmpfs -o size=1m,mode=0755 psfl-hidden "$work"; '
         'mkdir "$work/$name"; mount --move ' + _STASH + ' "$work/$name"; cd "$work/$name"; exec "$@"')


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=check)


def namespaces_unavailable() -> str | None:
    """Why :class:`NamespaceHosts` cannot run here, or None when it can."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "not a Linux host"
    if os.geteuid() != 0:
        return "network and mount namespaces need root (euid is not 0)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command"
    if not Path(_STASH).is_dir():
        return f"no {_STASH} directory to stash a host's directory in"
    probe = f"psfl-probe-{os.getpid()}"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"`ip netns add` refused: {res.stderr.strip() or res.returncode}"
    try:
        res = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--mount",
                              "--propagation", "private", "true"], capture_output=True,
                             text=True, timeout=30)
        if res.returncode != 0:
            return f"`unshare --mount` refused: {res.stderr.strip() or res.returncode}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class NamespaceHosts:
    """Hosts ``{name: IPv4 address}`` (one subnet /24) whose directories are
    ``work/<name>``; a context manager (closing deletes every namespace; idempotent).

    Raises (on entry):
        RuntimeError: :func:`namespaces_unavailable`'s reason, or a failing ``ip`` command.
        ValueError: an address outside the first host's /24, or twice.
    """

    def __init__(self, work: str | Path, hosts: Mapping[str, str]) -> None:
        self.work = Path(work).resolve()
        self.hosts = dict(hosts)
        nets = {ipaddress.ip_interface(f"{a}/{PREFIX}").network for a in self.hosts.values()}
        if len(nets) != 1 or len(set(self.hosts.values())) != len(self.hosts):
            raise ValueError(f"host addresses must be distinct, in one /{PREFIX}: {self.hosts}")
        tag = f"{os.getpid() % 100000:05d}"
        self.ns = {name: f"psfl-{tag}-{i}" for i, name in enumerate(self.hosts)}
        self.hub = f"psfl-{tag}-hub"
        self._tag = tag
        self._made: list[str] = []

    def __enter__(self) -> NamespaceHosts:
        why = namespaces_unavailable()
        if why:
            raise RuntimeError(why)
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _up(self) -> None:
        def ip(*args: str) -> None:
            res = _ip(*args, check=False)
            if res.returncode != 0:
                raise RuntimeError(f"`ip {' '.join(args)}`: {res.stderr.strip()}")

        for ns in (self.hub, *self.ns.values()):
            ip("netns", "add", ns)
            self._made.append(ns)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for i, (name, addr) in enumerate(self.hosts.items()):
            ns, here, there = self.ns[name], f"v{self._tag}{i}h", f"v{self._tag}{i}b"
            ip("link", "add", here, "type", "veth", "peer", "name", there)
            ip("link", "set", here, "netns", ns)
            ip("link", "set", there, "netns", self.hub)
            ip("-n", self.hub, "link", "set", there, "master", "br0")
            ip("-n", self.hub, "link", "set", there, "up")
            ip("-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", here)
            ip("-n", ns, "link", "set", here, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            (self.work / name).mkdir(parents=True, exist_ok=True)

    def argv(self, host: str, command: Sequence[str]) -> list[str]:
        """``command`` as run on ``host``: in its network namespace, its working directory
        ``work/<host>``, every other entry of ``work`` hidden."""
        own = self.work / host
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--mount", "--propagation",
                "private", "sh", "-c", _WRAP, "psfl-host", str(own), str(self.work), host,
                *command]

    def close(self) -> None:
        """Delete the namespaces (their links go with them)."""
        while self._made:
            _ip("netns", "del", self._made.pop(), check=False)


__all__ = ["NamespaceHosts", "PREFIX", "namespaces_unavailable"]
