"""Which network interface reaches the main process: the socket interface of a run over several machines.

gloo takes its own address from the hostname (``getaddrinfo(gethostname())``). Where the hostname resolves to a
loopback address (``127.0.0.1 <hostname>`` in /etc/hosts, or Debian's ``127.0.1.1 <hostname>`` line, common on
clusters), every rank announces a loopback address and the ranks of the other machines cannot connect to it:
``Gloo connectFullMesh failed ... remote=[127.0.0.1]``. ``GLOO_SOCKET_IFNAME`` (``NCCL_SOCKET_IFNAME`` for NCCL)
names the interface to use instead. :func:`choose_socket_ifname` sets it, in a run that spans machines and where
the user set neither, to the interface whose route reaches ``MASTER_ADDR``: the kernel's own routing answers
(a UDP ``connect`` sends nothing; ``getsockname`` is the source address it chose), and the address is mapped to
its interface with ``SIOCGIFADDR`` (IPv4) or ``/proc/net/if_inet6`` (IPv6); no ``ip`` command, which clusters
may lack. Where the main process is on this machine the route's source is the main address itself, so its own
interface is chosen (loopback only when ``MASTER_ADDR`` is a loopback address, i.e. every rank is here; a name
that resolves to loopback only here, Debian's ``127.0.1.1 <hostname>``, chooses nothing and says so).
Standard library only: the doctor asks the same questions before launch.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's (primary) IPv4 address
_IF_INET6 = Path("/proc/net/if_inet6")


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def resolve(host: str) -> tuple[int, str]:
    """``(family, address)`` of ``host`` (a name or an address), as a socket would connect to it; OSError if none."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0]
    return family, str(sockaddr[0])


def route_source(host: str) -> str:
    """The local address the kernel's routing uses to reach ``host`` (no packet is sent); OSError without a route."""
    family, address = resolve(host)
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))  # a UDP connect only picks the route and the source address
        return str(s.getsockname()[0])


def ipv4_of(name: str) -> str | None:
    """The IPv4 address of interface ``name`` (``SIOCGIFADDR``); None when it has none (or off Linux)."""
    import fcntl  # POSIX only: imported where it is used

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])  # struct ifreq: 16 bytes of name, then sockaddr_in (family, port, addr)


def ipv6_of(name: str, table: str | None = None) -> list[str]:
    """The IPv6 addresses of interface ``name``, from ``/proc/net/if_inet6`` (or the text given)."""
    if table is None:
        try:
            table = _IF_INET6.read_text()
        except OSError:
            return []
    found = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) == 6 and fields[5] == name:
            found.append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def interface_of(address: str) -> str | None:
    """The name of the interface that holds ``address``; None when no interface of this machine does."""
    try:
        wanted = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    for _, name in socket.if_nameindex():
        held = [ipv4_of(name)] if wanted.version == 4 else ipv6_of(name)
        if any(a is not None and ipaddress.ip_address(a) == wanted for a in held):
            return name
    return None


@dataclass(frozen=True)
class Route:
    """How this machine reaches ``host``: from address ``source`` on interface ``interface``."""

    host: str
    source: str
    interface: str | None

    @property
    def loopback(self) -> bool:
        return is_loopback(self.source)


def is_unspecified(host: str) -> bool:
    """``host`` is 0.0.0.0 or :: (bind to every interface), not an address to connect to."""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_unspecified
    except ValueError:
        return False


def is_address(host: str) -> bool:
    """``host`` is an IP address written out (not a name to resolve)."""
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


def route_to(host: str) -> Route | None:
    """The route to ``host``; None when the name does not resolve or there is no route."""
    try:
        source = route_source(host)
    except OSError:
        return None
    return Route(host, source, interface_of(source))


def hostname_address(hostname: str | None = None) -> str | None:
    """The address ``hostname`` (this machine's by default) resolves to, as gloo finds it; None if it does not."""
    try:
        return resolve(hostname or socket.gethostname())[1]
    except OSError:
        return None


def spans_machines(env: Mapping[str, str] = os.environ) -> bool:
    """torchrun's environment of a run over several machines: more ranks in all than on this machine."""
    try:
        return int(env["WORLD_SIZE"]) > int(env["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return False


def user_socket_ifname(env: Mapping[str, str] = os.environ) -> str | None:
    """``NAME=value`` of the first ``*_SOCKET_IFNAME`` the user set; None when neither is set."""
    return next((f"{k}={env[k]}" for k in SOCKET_IFNAME_VARS if env.get(k)), None)


def _choose(env: MutableMapping[str, str], master: str, names: tuple[str, ...]) -> str | None:
    """Set ``names`` to the interface that reaches ``master``, or say why none is chosen; the line to print."""
    if is_unspecified(master):  # 0.0.0.0: an address to listen on, which no other machine can connect to
        return (
            f"accel_train: warning: MASTER_ADDR {master} is the unspecified (any) address, which the other machines "
            "cannot connect to, and names no interface to choose; set main_process_ip (MASTER_ADDR) to the main "
            f"machine's address, or {names[0]} to the interface the others reach it on"
        )
    route = route_to(master)
    if route is None or route.interface is None:
        return None
    if route.loopback and not is_address(master):  # a name that is loopback only here: the others reach it elsewhere
        return (
            f"accel_train: warning: MASTER_ADDR {master} resolves to the loopback address {route.source} on this "
            f"machine, which the other machines cannot reach; set {names[0]} to the interface they reach this "
            "machine on, or main_process_ip to its address"
        )
    for name in names:
        env[name] = route.interface
    return (
        f"accel_train: {'/'.join(names)}={route.interface} ({route.source}: the interface whose route reaches "
        f"the main process at {master}); set {names[0]} yourself to choose another"
    )


def choose_socket_ifname(env: MutableMapping[str, str] = os.environ, nccl: bool = False) -> str | None:
    """In a run over several machines where neither ``*_SOCKET_IFNAME`` is set: set ``GLOO_SOCKET_IFNAME`` (and
    ``NCCL_SOCKET_IFNAME`` with ``nccl``) to the interface whose route reaches ``MASTER_ADDR``. Returns the line
    that says so, or that warns when ``MASTER_ADDR`` is a name that is loopback only here (None when there is
    nothing to say); local rank 0 of each machine prints it."""
    master = env.get("MASTER_ADDR")
    if not master or not spans_machines(env) or user_socket_ifname(env):
        return None
    names = SOCKET_IFNAME_VARS if nccl else SOCKET_IFNAME_VARS[:1]
    line = _choose(env, master, names)
    if line is None:
        return None
    if env.get("LOCAL_RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)
    return line
