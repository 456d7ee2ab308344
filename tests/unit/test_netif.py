"""netif.py (the interface that reaches the main process, on this box's real interfaces) and peers.py (the watch
while the process group of a run over several machines is created, on a real TCPStore). The two-machine runs,
and the routes inside network namespaces, are in ../integration/test_multi_host_netns.py."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from accel_train import netif, peers

# what torch 2.14's gloo raised on the rank whose connect was refused (tests/integration/test_multi_host_netns.py)
GLOO_REFUSED = (
    "Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] timed "
    "out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:4006$0"
)
MULTI = {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}


def test_loopback_routes_through_lo_and_its_addresses_are_found():
    assert netif.route_to("127.0.0.1") == netif.Route("127.0.0.1", "127.0.0.1", "lo")
    assert netif.route_to("127.0.0.1").loopback
    assert netif.ipv4_of("lo") == "127.0.0.1" and netif.interface_of("127.0.0.1") == "lo"
    assert netif.ipv4_of("no-such-if0") is None and netif.interface_of("192.0.2.254") is None
    assert netif.route_to("name.that.does.not.resolve.invalid") is None


def test_every_interface_of_this_box_is_found_from_its_own_address():
    """Each interface with an IPv4 address routes to itself: the main process on this machine (a non-loopback
    address) is reached through its own interface, not lo."""
    seen = 0
    for _, name in socket.if_nameindex():
        address = netif.ipv4_of(name)
        if address is None:
            continue
        seen += 1
        assert netif.interface_of(address) == name
        route = netif.route_to(address)
        assert route is not None and route.source == address and route.interface == name
        assert route.loopback == (name == "lo")
    assert seen >= 1


def test_ipv6_addresses_come_from_proc_net_if_inet6():
    table = "00000000000000000000000000000001 01 80 10 80       lo\nfd000000000000000000000000000002 04 40 00 82 eth0\n"
    assert netif.ipv6_of("lo", table) == ["::1"] and netif.ipv6_of("eth0", table) == ["fd00::2"]
    assert netif.ipv6_of("vt1", table) == []
    if netif.ipv6_of("lo"):  # this box has IPv6 on lo
        assert netif.interface_of("::1") == "lo"


def test_interface_is_chosen_only_across_machines_and_never_over_the_users_choice(capsys):
    assert netif.spans_machines(MULTI) and not netif.spans_machines({**MULTI, "LOCAL_WORLD_SIZE": "2"})
    assert not netif.spans_machines({"WORLD_SIZE": "2"})  # not torchrun's environment: nothing to tell
    no_master = {k: v for k, v in MULTI.items() if k != "MASTER_ADDR"}
    one_machine, users = {**MULTI, "LOCAL_WORLD_SIZE": "2"}, {**MULTI, "GLOO_SOCKET_IFNAME": "eth9"}
    for env in (one_machine, users, {**MULTI, "NCCL_SOCKET_IFNAME": "ib0"}, no_master):
        before = dict(env)
        assert netif.choose_socket_ifname(env) is None and env == before
    assert capsys.readouterr().err == ""


def test_interface_that_reaches_the_main_process_is_set_and_said_once_per_machine(capsys):
    env = dict(MULTI)
    line = netif.choose_socket_ifname(env)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and "NCCL_SOCKET_IFNAME" not in env
    assert line.startswith("accel_train: GLOO_SOCKET_IFNAME=lo (127.0.0.1: ") and "127.0.0.1" in line
    assert capsys.readouterr().err == line + "\n"
    env = {**MULTI, "LOCAL_RANK": "1"}
    said = netif.choose_socket_ifname(env, nccl=True)
    assert said.startswith("accel_train: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME=lo")
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "lo"
    assert capsys.readouterr().err == ""  # local rank 1: said by local rank 0 only


def test_an_empty_socket_ifname_is_no_choice_of_the_users(capsys):
    """``GLOO_SOCKET_IFNAME=""`` (an export left blank in a job script) names no interface: the interface that reaches
    the main process is chosen as if it were unset, for NCCL too, and no hint says the user set it."""
    env = {**MULTI, "GLOO_SOCKET_IFNAME": ""}
    line = netif.choose_socket_ifname(env)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and line.startswith("accel_train: GLOO_SOCKET_IFNAME=lo (127.0.0.1: ")
    assert netif.user_socket_ifname({"GLOO_SOCKET_IFNAME": ""}) is None  # the doctor's "you set ..." asks this
    env = {**MULTI, "GLOO_SOCKET_IFNAME": "", "NCCL_SOCKET_IFNAME": ""}
    netif.choose_socket_ifname(env, nccl=True)
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
    assert "accel_train sets it" in peers.fix_hint({"GLOO_SOCKET_IFNAME": "", "MASTER_ADDR": "10.213.0.1"})
    assert "what the hostname" in peers.announced_address({"GLOO_SOCKET_IFNAME": ""})
    capsys.readouterr()


def test_a_main_host_name_that_is_loopback_only_here_chooses_nothing_and_says_so(capsys):
    """Debian's ``127.0.1.1 <hostname>``: main_process_ip given as the main machine's name resolves to loopback on
    that machine only; lo would make it announce a loopback address, so nothing is set (an address written out,
    127.0.0.1, means every rank is here, and lo is right)."""
    env = {**MULTI, "MASTER_ADDR": "localhost"}
    line = netif.choose_socket_ifname(env)
    assert "GLOO_SOCKET_IFNAME" not in env and line.startswith("accel_train: warning: MASTER_ADDR localhost resolves")
    assert "set GLOO_SOCKET_IFNAME to the interface" in line and capsys.readouterr().err == line + "\n"
    assert netif.is_address("127.0.0.1") and netif.is_address("::1") and not netif.is_address("localhost")


@pytest.mark.parametrize("master", ["0.0.0.0", "::"])
def test_the_any_address_as_main_host_chooses_nothing_and_says_so(capsys, master):
    """MASTER_ADDR=0.0.0.0 routes through lo here, and choosing lo would make every rank announce a loopback address
    the other machines cannot reach (it was chosen silently): nothing is set, one warning says what to set."""
    env = {**MULTI, "MASTER_ADDR": master}
    line = netif.choose_socket_ifname(env)
    assert "GLOO_SOCKET_IFNAME" not in env
    assert line.startswith(f"accel_train: warning: MASTER_ADDR {master} is the unspecified (any) address")
    assert "main_process_ip" in line and capsys.readouterr().err == line + "\n"


def test_a_failed_connect_names_the_address_tried_and_the_variable():
    assert peers.unreachable(GLOO_REFUSED) == (
        "could not connect to another process of this run at 127.0.0.1:4006 (Connection refused)"
    )
    assert peers.unreachable("some other failure of init") is None
    env = {"MASTER_ADDR": "10.213.0.1"}
    assert "set GLOO_SOCKET_IFNAME on each machine" in peers.fix_hint(env) and "10.213.0.1" in peers.fix_hint(env)
    assert "main_process_ip" in peers.fix_hint(env) and "NCCL_SOCKET_IFNAME" in peers.fix_hint(env, nccl=True)
    assert peers.announced_address({"GLOO_SOCKET_IFNAME": "lo"}) == "127.0.0.1 (GLOO_SOCKET_IFNAME=lo)"
    assert f"what the hostname {socket.gethostname()} resolves to" in peers.announced_address({})


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    yield dist.PrefixStore("accel_train/attempt_0", server)


def test_the_watch_leaves_on_a_peers_posted_failure(store):
    check = peers._peer_check(store.clone(), 1, 2, 60.0, "this rank announced X")
    assert check() is None
    store.set(peers._FAILED, "rank 0 could not connect to another process of this run at 127.0.0.1:4006")
    store.add(peers._FAILURES, 1)
    line, code = check()
    assert line == (
        "[rank 1] error: rank 0 could not connect to another process of this run at 127.0.0.1:4006, so this one "
        "stopped too; this rank announced X"
    )
    assert code == 4 and store.add(peers._READ, 0) == 1  # the poster waits for this read before it leaves


def test_the_watch_gives_gloo_a_deadline_once_every_rank_has_arrived(store):
    check = peers._peer_check(store.clone(), 0, 2, 0.2, "about")
    store.add(peers._ARRIVED, 1)
    time.sleep(0.3)
    assert check() is None  # one of two arrived: the other may still be importing torch
    store.add(peers._ARRIVED, 1)
    assert check() is None
    time.sleep(0.3)
    line, code = check()
    assert "all 2 processes of this run started but did not connect within 0.2 s; about" in line and code == 4
    nccl = peers._peer_check(store.clone(), 0, 2, None, "about")  # NCCL: only a posted failure ends the wait
    nccl(), time.sleep(0.3)
    assert nccl() is None


def test_the_watch_leaves_when_the_main_machines_store_is_gone():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=2))
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=timedelta(seconds=2))
    check = peers._peer_check(client, 1, 2, 60.0, "about")
    del server
    line, code = check()
    assert line.startswith("[rank 1] error: lost the main machine's store") and code == 4


def test_a_failed_creation_posts_its_line_and_raises_one_line(store, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.213.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")

    def refused() -> None:
        raise RuntimeError(GLOO_REFUSED)

    with pytest.raises(peers.PeersUnreachableError) as caught:
        peers.join_bounded(store, 0, 1, refused)
    assert str(caught.value).startswith(
        "could not connect to another process of this run at 127.0.0.1:4006 (Connection refused); this rank "
        "announced 127.0.0.1 (GLOO_SOCKET_IFNAME=lo); set GLOO_SOCKET_IFNAME on each machine"
    )
    assert caught.value.exit_code == 4 and store.add(peers._FAILURES, 0) == 1
    assert store.get(peers._FAILED).decode().startswith("rank 0 could not connect to another process of this run at")

    def bug() -> None:
        raise RuntimeError("an internal assertion failed")

    with pytest.raises(RuntimeError, match="an internal assertion failed"):  # a bug keeps its traceback
        peers.join_bounded(store, 0, 1, bug)
    peers.join_bounded(store, 0, 1, lambda: None)  # connected: the watch stops
    assert store.add(peers._ARRIVED, 0) == 3


def test_the_watch_prints_the_checks_line_and_leaves_with_its_code(monkeypatch, capfd):
    left = threading.Event()
    codes = []
    monkeypatch.setattr(peers.os, "_exit", lambda code: (codes.append(code), left.set()))
    monkeypatch.setattr(peers, "WRITE_GUARD", threading.RLock())  # the watch keeps it: not the one writes share
    answers = iter([None, ("[rank 3] error: gone", 7)])
    peers.watch(lambda: next(answers, None), "test-watch", poll_s=0.01)
    assert left.wait(5) and codes == [7]
    assert "[rank 3] error: gone\n" in capfd.readouterr().err
    done = threading.Event()
    done.set()
    peers.watch(lambda: ("never", 1), "test-watch", done, poll_s=0.01).join(1)
    assert codes == [7]
