"""Two "hosts" on one machine: two network namespaces joined by a veth pair.

Each host has its own loopback and one interface on 10.213.0.0/24, and its own
``/etc/hosts`` (``ip netns exec`` bind-mounts ``/etc/netns/<ns>/hosts`` over it) that maps
the machine's hostname to the host's address, as a container runtime writes a
container's ``/etc/hosts``: ``hostname -i`` there gives the host's own address. A process
started in a namespace reaches the other host only over the veth, never over the
machine's loopback.

Needs root and ``ip netns``; :func:`unavailable` says why not, and :func:`two_hosts`
removes the namespaces (which removes the veth) and kills every process left in them,
even when the test failed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.213.0"
NETNS_ETC = Path("/etc/netns")


@dataclass(frozen=True)
class Host:
    """One network namespace: its name, its veth end and that end's address."""

    ns: str
    ifname: str
    addr: str

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def pids(self) -> list[int]:
        done = subprocess.run(
            ["ip", "netns", "pids", self.ns], capture_output=True, text=True, check=False
        )
        return [int(p) for p in done.stdout.split()]

    def kill_all(self) -> list[int]:
        """SIGKILL every process in the namespace (the host dies); the pids killed."""
        pids = self.pids()
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why two network namespaces cannot be made here; None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    probe = f"efprobe{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"ip netns add is refused here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


@contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Two hosts, 10.213.0.1 and 10.213.0.2, names unique to this call; torn down after."""
    tag = secrets.token_hex(3)
    hosts = tuple(
        Host(ns=f"ef{tag}n{i}", ifname=f"ef{tag}v{i}", addr=f"{SUBNET}.{i + 1}") for i in (0, 1)
    )
    made: list[Host] = []
    try:
        for host in hosts:
            _ip("netns", "add", host.ns)
            made.append(host)
            etc = NETNS_ETC / host.ns
            etc.mkdir(parents=True, exist_ok=True)
            name = socket.gethostname()
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{host.addr} {name}\n")
        a, b = hosts
        _ip("link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname)
        for host in hosts:
            _ip("link", "set", host.ifname, "netns", host.ns)
            _ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
            _ip("-n", host.ns, "link", "set", "lo", "up")
            _ip("-n", host.ns, "link", "set", host.ifname, "up")
        yield hosts  # type: ignore[misc]
    finally:
        for host in made:
            host.kill_all()
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True, check=False)
            shutil.rmtree(NETNS_ETC / host.ns, ignore_errors=True)
        # deleting a namespace deletes its veth end and so the pair; one never moved stays
        subprocess.run(["ip", "link", "del", hosts[0].ifname], capture_output=True, check=False)
