"""Two "machines" on one box: network namespaces joined by a veth pair (root only), for the multi-host tests.

Each namespace has its own interfaces (``lo`` and one end of the pair), routes and ports, and shares everything
else with this box: the file system (so both "machines" see one run folder) and the hostname, which resolves to a
loopback address here (/etc/hosts), as Debian's ``127.0.1.1 <hostname>`` line does on real clusters.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count

import pytest

SUBNET = "10.213.0"
_serial = count()


@dataclass(frozen=True)
class Host:
    netns: str
    interface: str
    address: str

    def cmd(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _remove(netns: str) -> None:
    pids = _ip("netns", "pids", netns).stdout.split()
    for pid in pids:  # processes a failed test left running in the namespace (ours: started by the test)
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", netns)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Two namespaces (unique names: this pid and a counter) joined by a veth pair, ``SUBNET.1`` and ``SUBNET.2``,
    ``lo`` up in both; removed on the way out, failed or not. Skips (with the reason) where that is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the two hosts are network namespaces (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("needs the ip command (iproute2) to make network namespaces")
    tag = f"{os.getpid()}x{next(_serial)}"
    hosts = tuple(Host(f"accel_train_{tag}{s}", f"v{tag}{s}"[:15], f"{SUBNET}.{i}") for i, s in ((1, "a"), (2, "b")))
    made: list[str] = []
    try:
        for host in hosts:
            added = _ip("netns", "add", host.netns)
            if added.returncode:
                pytest.skip(f"ip netns add is refused here: {added.stderr.strip()}")
            made.append(host.netns)
        steps = [("link", "add", hosts[0].interface, "type", "veth", "peer", "name", hosts[1].interface)]
        for host in hosts:
            steps += [
                ("link", "set", host.interface, "netns", host.netns),
                ("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.interface),
                ("-n", host.netns, "link", "set", host.interface, "up"),
                ("-n", host.netns, "link", "set", "lo", "up"),
            ]
        for step in steps:
            done = _ip(*step)
            if done.returncode:
                pytest.skip(f"ip {' '.join(step)} is refused here: {done.stderr.strip()}")
        yield hosts  # type: ignore[misc]
    finally:
        for netns in made:
            _remove(netns)
