"""Network namespaces as the nodes of a test cluster.

One bridge on this host, `clbr0` at 10.201.0.1/24, and per node a namespace `cl-NAME` with one
veth (`cl-vNAME`) into the bridge. A process started on a node (`Node.command`) also gets its
own hostname, an /etc/hosts naming every node, and its own mount namespace in which:
- /var/tmp is the node's private directory (`Node.local` on this host): node-local disk, so
  what one node writes there no other node sees;
- the directories given as `hidden` are empty tmpfs mounts: the submitting host's files
  (config, keys) are not there, so a test proves they travel through the launcher.

Every name carries the `cl-` prefix (and only 10.201.0.0/24 is used), so nothing here touches
another test's namespaces. A namespace left by a killed run is removed with the processes in
it (`remove_stale`); the processes of a namespace are ended by pid (`ip netns pids`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PREFIX = "cl-"
BRIDGE = "clbr0"
HOST_ADDR = "10.201.0.1"
SUBNET_BITS = 24
LOCK = Path("/run/lock/cl-clusters.lock")
"""Held while a test owns the bridge and the cl- namespaces (one such test at a time)."""
LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


@dataclass(frozen=True)
class Node:
    """One node: a namespace named like its host, an address on the bridge, a private disk."""

    name: str
    addr: str
    local: Path
    hosts_file: Path

    @property
    def netns(self) -> str:
        return f"/run/netns/{self.name}"

    def command(self, argv: list[str], hidden: tuple[Path, ...] = ()) -> list[str]:
        """`argv` run on this node (its namespace, hostname, /etc/hosts and private mounts)."""
        mounts = [
            f"hostname {self.name}",
            f"mount --bind {self.hosts_file} /etc/hosts",
            f"mount --bind {self.local} /var/tmp",
            *(f"mount -t tmpfs -o size=64m,mode=0755 cl-hidden {path}" for path in hidden),
        ]
        script = " && ".join(mounts) + ' && exec "$@"'
        return ["nsenter", f"--net={self.netns}", "unshare", "--uts", "--mount",
                "sh", "-c", script, "sh", *argv]  # fmt: skip

    def pids(self) -> list[int]:
        """Every process whose network namespace is this node's."""
        out = _ip("netns", "pids", self.name, check=False).stdout
        return sorted(int(p) for p in out.split() if p.strip().isdigit())

    def listening(self) -> list[int]:
        """TCP ports listening in this node's namespace."""
        ports: set[int] = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            out = subprocess.run(
                ["nsenter", f"--net={self.netns}", "cat", table],
                capture_output=True, text=True, timeout=30,
            ).stdout  # fmt: skip
            for line in out.splitlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[3] == LISTEN:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        return sorted(ports)


def kill_pids(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM each pid, SIGKILL whatever is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (one ended but not yet reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def remove_node(name: str) -> None:
    """End every process in namespace `name` (by pid) and delete it with its veth."""
    out = _ip("netns", "pids", name, check=False).stdout
    kill_pids([int(p) for p in out.split() if p.strip().isdigit()])
    _ip("netns", "delete", name, check=False)


def remove_stale() -> None:
    """Remove cl- namespaces and the bridge a killed run left behind."""
    listed = _ip("netns", "list", check=False).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            remove_node(name)
    _ip("link", "delete", BRIDGE, check=False)


def add_bridge() -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HOST_ADDR}/{SUBNET_BITS}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def add_node(name: str, addr: str, local: Path, hosts_file: Path) -> Node:
    """Namespace `name` at `addr` on the bridge (veth cl-v<suffix> <-> its eth0)."""
    veth = f"cl-v{name.removeprefix(PREFIX)}"[:15]  # interface names are at most 15 chars
    _ip("netns", "add", name)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
    _ip("link", "set", veth, "master", BRIDGE, "up")
    _ip("-n", name, "addr", "add", f"{addr}/{SUBNET_BITS}", "dev", "eth0")
    _ip("-n", name, "link", "set", "eth0", "up")
    _ip("-n", name, "link", "set", "lo", "up")
    local.mkdir(parents=True, exist_ok=True)
    return Node(name, addr, local, hosts_file)


def write_hosts(path: Path, nodes: dict[str, str]) -> Path:
    """An /etc/hosts naming `nodes` (name -> address) and this host on the bridge."""
    lines = ["127.0.0.1 localhost", f"{HOST_ADDR} cl-host"]
    lines += [f"{addr} {name}" for name, addr in nodes.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def cluster_lock() -> Iterator[None]:
    """One cluster test at a time on this machine (they share the bridge and names)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def nodes(root: Path, names: dict[str, str]) -> Iterator[list[Node]]:
    """The bridge and one namespace per entry of `names` (name -> address), removed after."""
    remove_stale()
    hosts = write_hosts(root / "hosts", names)
    made: list[Node] = []
    try:
        try:
            add_bridge()
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot create a bridge here: {exc.stderr.strip()}")
        for name, addr in names.items():
            made.append(add_node(name, addr, root / "nodes" / name, hosts))
        yield made
    finally:
        for node in made:
            remove_node(node.name)
        _ip("link", "delete", BRIDGE, check=False)
