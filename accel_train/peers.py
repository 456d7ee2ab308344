"""The other processes of a run: a watch that leaves with one line when they are gone or cannot be reached.

:func:`watch` is the one mechanism: a daemon thread polls a check, and the first line the check returns is printed
and the process leaves (after the write in progress, ``WRITE_GUARD``) with the check's exit code. The runtime
watches its launcher with it (``runtime.watch_launcher``), and :func:`join_bounded` watches the other ranks while
the process group of a run over several machines is created.

Why that creation needs a watch (measured with torch 2.14, two network namespaces, the hostname on 127.0.0.1):
in gloo's ``connectFullMesh`` every pair of ranks connects; a rank whose connect fails (a loopback address
announced by the other machine, a firewall) raises ``Gloo connectFullMesh failed ... remote=[127.0.0.1]``, but its
peer, waiting for that connection, waits for the whole process-group timeout (``--dist-timeout``, 600 s by
default), and shortening that timeout would shorten every later collective too. So, before creating the group,
each rank counts itself in the store (``arrived``); a rank whose creation fails posts its one line there
(``failed``); and every rank's watch, on its own connection to the store (``store.clone()``), leaves with exit
code 4 (:class:`~accel_train.errors.PeerLostError`'s) once a peer posted a failure, or, for gloo, once every rank
has arrived and the mesh is still not up after ``CONNECT_S`` (it takes milliseconds; NCCL's eager init can take
minutes at scale, so only a posted failure ends its wait). A rank that died before arriving still leaves its
peers waiting for the process-group timeout.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from accel_train.errors import PeerLostError
from accel_train.fsio import WRITE_GUARD
from accel_train.netif import hostname_address, ipv4_of, user_socket_ifname

POLL_S = 0.5
CONNECT_S = 60.0  # gloo's full mesh is up in milliseconds once every rank has arrived
_ARRIVED, _FAILURES, _FAILED, _READ = (f"accel_train/connect/{k}" for k in ("arrived", "failures", "line", "read"))


class PeersUnreachableError(PeerLostError):
    """The processes of a run over several machines could not connect to each other."""


Check = Callable[[], "tuple[str, int] | None"]


def watch(check: Check, name: str, done: threading.Event | None = None, poll_s: float = POLL_S) -> threading.Thread:
    """Call ``check`` every ``poll_s`` seconds in a daemon thread until ``done`` is set; the first ``(line, exit
    code)`` it returns is printed to stderr and the process exits with that code, after the write in progress."""
    done = done or threading.Event()

    def run() -> None:
        while not done.wait(poll_s):
            found = check()
            if found is not None and not done.is_set():
                WRITE_GUARD.acquire(timeout=10)
                try:  # stderr may be a pipe whose reader (the launcher) is gone: exit all the same
                    print(found[0], file=sys.stderr, flush=True)
                except OSError:
                    pass
                os._exit(found[1])
                return  # (only where os._exit is replaced: the tests)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def socket_variable(nccl: bool) -> str:
    return "NCCL_SOCKET_IFNAME" if nccl else "GLOO_SOCKET_IFNAME"


def announced_address(env: Mapping[str, str] = os.environ, nccl: bool = False) -> str:
    """The address this rank offers the others, and where it comes from: the socket interface set, or gloo's
    default, the address the hostname resolves to."""
    name = env.get(socket_variable(nccl))
    if name:
        return f"{ipv4_of(name) or '?'} ({socket_variable(nccl)}={name})"
    host = socket.gethostname()
    return f"{hostname_address(host) or '?'} (what the hostname {host} resolves to)"


def fix_hint(env: Mapping[str, str] = os.environ, nccl: bool = False) -> str:
    var = socket_variable(nccl)
    where = f"the main machine's address {env.get('MASTER_ADDR', '?')}"
    chose = "you set it" if user_socket_ifname(env) else "accel_train sets it when neither *_SOCKET_IFNAME is set"
    return (
        f"set {var} on each machine to the interface that reaches {where} ({chose}), or check main_process_ip "
        "and that no firewall blocks the ports between the machines"
    )


_REMOTE = re.compile(r"remote=\[([^\]]*)\]:?(\d*)")
_WHY = (re.compile(r"SO_ERROR: ([^,\n]+)"), re.compile(r"(timed out|Connection refused|No route to host|unreachable)"))
_CONNECTING = ("connect", "socket", "timed out", "refused", "unreachable", "No route")


def unreachable(message: str) -> str | None:
    """What a failed process-group creation (``message``: torch's error) tried: ``could not connect to another
    process of this run at ADDRESS (why)`` (gloo's ``remote=[...]``); None when it is no connection failure."""
    if not any(s.lower() in message.lower() for s in _CONNECTING):
        return None
    remote, why = _REMOTE.search(message), _WHY[0].search(message) or _WHY[1].search(message)
    tried = f" at {remote[1]}{':' + remote[2] if remote[2] else ''}" if remote else ""
    reason = f" ({why[1]})" if why else ""
    return f"could not connect to another process of this run{tried}{reason}"


def _wait_until_read(store: Any, failures: int, world_size: int, wait_s: float = 4 * POLL_S) -> None:
    """Stay until the other ranks' watches have read the posted failure (at most ``wait_s``): leaving at once would
    end this machine's launcher, and with it the store they read it from."""
    deadline = time.monotonic() + wait_s
    while store.add(_READ, 0) < world_size - failures and time.monotonic() < deadline:
        time.sleep(POLL_S / 5)


def _peer_check(store: Any, rank: int, world_size: int, connect_s: float | None, about: str) -> Check:
    """The watch's check while the group is created: a peer's posted failure, a lost store, or the deadline."""
    arrived_at: list[float] = []
    prefix = f"[rank {rank}] error:"

    def check() -> tuple[str, int] | None:
        try:
            if store.add(_FAILURES, 0):
                posted = store.get(_FAILED).decode(errors="replace")
                store.add(_READ, 1)
                return f"{prefix} {posted}, so this one stopped too; {about}", PeerLostError.exit_code
            if not arrived_at and store.add(_ARRIVED, 0) >= world_size:
                arrived_at.append(time.monotonic())
        except Exception:  # noqa: BLE001 - the store's own errors (DistNetworkError, ...): the main machine is gone
            gone = f"the main machine's store ({os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')})"
            return f"{prefix} lost {gone} before this run's processes connected; {about}", PeerLostError.exit_code
        if connect_s is not None and arrived_at and time.monotonic() - arrived_at[0] > connect_s:
            late = f"all {world_size} processes of this run started but did not connect within {connect_s:g} s"
            return f"{prefix} {late}; {about}", PeerLostError.exit_code
        return None

    return check


def join_bounded(
    store: Any, rank: int, world_size: int, init: Callable[[], None], nccl: bool = False, connect_s: float = CONNECT_S
) -> None:
    """Run ``init()`` (the process group's creation over several machines, on ``store``) under the watch: every
    rank leaves with one line, in bounded time, when any cannot connect (see the module's docstring)."""
    announced = announced_address(nccl=nccl)
    about = f"this rank announced {announced}; {fix_hint(nccl=nccl)}"
    store.add(_ARRIVED, 1)
    done = threading.Event()
    check = _peer_check(store.clone(), rank, world_size, None if nccl else connect_s, about)
    watch(check, "accel_train-connect-watch", done)
    try:
        init()
    except RuntimeError as exc:  # torch's DistBackendError and gloo's connectFullMesh failure
        done.set()  # this rank's own watch must not answer its own post
        line = unreachable(str(exc))
        with contextlib.suppress(Exception):  # the peers leave on this post; a dead store cannot be told
            store.set(_FAILED, f"rank {rank} {line or 'could not create the process group'}")
            _wait_until_read(store, store.add(_FAILURES, 1), world_size)
        if line is None:
            raise
        raise PeersUnreachableError(f"{line}; {about}") from exc
    finally:
        done.set()
