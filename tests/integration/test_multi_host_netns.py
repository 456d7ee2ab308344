"""Issue 31: a run over two machines where the hostname resolves to a loopback address (tests/netns.py).

``multi_node_rank0.yaml`` in one network namespace and ``multi_node_rank1.yaml`` in the other, ``--main_process_ip``
the first one's veth address, no ``*_SOCKET_IFNAME`` set: accel_train chooses the interface that reaches it
(``netif.choose_socket_ifname``), and the run trains like ``multi_cpu.yaml`` on one box. Where the ranks still
cannot connect, or a peer is killed, every rank leaves in bounded time with one line (``peers.py``).
Root only (network namespaces); elsewhere each test skips and says why.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FAST, REPO, _env, check, launch_cmd, max_abs_diff, run_script, summary, weights
from netns import Host, two_hosts

from accel_train.doctor.launching import child_pids, wait_for_step

# --threads 1: one process per "machine" would otherwise use both cores, which changes the float summation order
# compared with multi_cpu.yaml's one thread per rank (test_faults.py's two-machine test does the same)
ARGS = ["--model", "lenet", "--global-batch-size", "32", "--log-every", "1", "--threads", "1", *FAST]
STEPS = "20"
PARITY = 1e-6  # two processes, SGD: the tolerance of test_faults.py's multi-node and restart parity tests
# once one rank of a run that cannot connect has left, the others follow within this (peers.py: a 0.5 s poll, the
# poster waits 2 s for it to be read); the old code's other rank hung for the process-group timeout, 600 s
BOUND_S = 20


pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root: the two hosts are network namespaces"
)


@pytest.fixture(scope="module")
def netns_allowed():
    """Skips before the reference run where ``ip netns add`` is refused (root without CAP_SYS_ADMIN)."""
    with two_hosts():
        pass


@pytest.fixture(scope="module")
def one_box(tmp_path_factory, netns_allowed):
    """The same run as 2 processes on this box (multi_cpu.yaml over loopback)."""
    out = tmp_path_factory.mktemp("one_box")
    check(run_script("train.py", *ARGS, "--max-steps", STEPS, "--output-dir", str(out), config="multi_cpu.yaml"))
    return out


def _launch(host: Host, rank: int, main: Host, log: Path, args: list[str], env: dict | None = None):
    cmd = launch_cmd(
        "train.py",
        *args,
        config=f"multi_node_rank{rank}.yaml",
        launch_args=("--main_process_ip", main.address, "--main_process_port", "29555"),
    )
    with log.open("w") as fh:  # a file, not a pipe: two runs' output read after both ended
        return subprocess.Popen(host.cmd(*cmd), cwd=REPO, env=_env(env), stdout=fh, stderr=subprocess.STDOUT)


def _finish(procs: list, timeout: float) -> list[float]:
    """Wait for every process; returns the seconds each took to end. Kills them (and fails) after ``timeout``."""
    start, ended = time.monotonic(), [None] * len(procs)
    try:
        while None in ended:
            if time.monotonic() - start > timeout:
                alive = [p.args[3] for p in procs if p.poll() is None]
                pytest.fail(f"still running after {timeout:g} s in {alive} (the hang of issue 31)")
            for i, p in enumerate(procs):
                if ended[i] is None and p.poll() is not None:
                    ended[i] = time.monotonic() - start
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return ended


def _rank_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.match(r"\[rank \d+\] error:", line)]


ROUTES = """
import json, sys
from accel_train import netif
env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "1", "MASTER_ADDR": sys.argv[1]}
netif.choose_socket_ifname(env)
print(json.dumps([[netif.route_to(h).interface for h in sys.argv[1:]], env.get("GLOO_SOCKET_IFNAME")]))
"""


def test_the_interface_whose_route_reaches_the_main_host_is_chosen_in_each_namespace():
    """netif.py on a real veth: from the second host the main host's address goes out through its veth; on the
    main host its own (non-loopback) address is reached through the veth too, not lo; 127.0.0.1 through lo."""
    import json

    with two_hosts() as (main, other):
        for host in (main, other):
            cmd = host.cmd(sys.executable, "-c", ROUTES, main.address, other.address, "127.0.0.1")
            done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            routes, chosen = json.loads(done.stdout)
            assert routes == [host.interface, host.interface, "lo"] and chosen == host.interface


def test_two_hosts_with_a_loopback_hostname_train_like_one_box(tmp_path, one_box):
    out = tmp_path / "run"
    args = [*ARGS, "--max-steps", STEPS, "--output-dir", str(out)]
    logs = [tmp_path / "host0.log", tmp_path / "host1.log"]
    with two_hosts() as hosts:
        procs = [_launch(h, r, hosts[0], logs[r], args) for r, h in enumerate(hosts)]
        _finish(procs, 300)
    text = [log.read_text() for log in logs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(t[-4000:] for t in text)
    for host, t in zip(hosts, text, strict=True):  # said once per machine: the interface that reaches host 0
        chosen = [line for line in t.splitlines() if "GLOO_SOCKET_IFNAME=" in line]
        assert len(chosen) == 1 and chosen[0].startswith(f"accel_train: GLOO_SOCKET_IFNAME={host.interface} "), t
        print(chosen[0])
    assert summary(out)["world_size"] == 2 and summary(out)["global_step"] == int(STEPS)
    diff = max_abs_diff(weights(one_box), weights(out))
    print(f"max |two hosts - one box| = {diff:.3g}")
    assert diff <= PARITY


def test_ranks_that_cannot_connect_all_leave_in_bounded_time_with_one_line(tmp_path):
    """The user's GLOO_SOCKET_IFNAME=lo on both machines (a user's setting wins): each announces 127.0.0.1, as
    gloo's own choice from the hostname did before issue 31; one rank's connect is refused, the other waits."""
    logs = [tmp_path / "host0.log", tmp_path / "host1.log"]
    args = [*ARGS, "--max-steps", STEPS, "--output-dir", str(tmp_path / "run")]
    with two_hosts() as hosts:
        procs = [_launch(h, r, hosts[0], logs[r], args, {"GLOO_SOCKET_IFNAME": "lo"}) for r, h in enumerate(hosts)]
        ended = _finish(procs, 180)  # starting both (importing torch) takes most of it, and long under load
    text = [log.read_text() for log in logs]
    shown = "\n".join(t[-3000:] for t in text)
    print(f"the machines left {ended[0]:.1f} s and {ended[1]:.1f} s after they were started")
    for t, p in zip(text, procs, strict=True):
        lines = _rank_errors(t)
        assert p.returncode != 0 and len(lines) == 1, shown
        assert "127.0.0.1" in lines[0] and "set GLOO_SOCKET_IFNAME" in lines[0] and "main_process_ip" in lines[0], shown
        assert "unexpected failure" not in t and str(REPO / "accel_train") not in t, shown  # no rank traceback
        assert re.search(r"exitcode\s*:\s*4 \(pid", t), shown  # each rank's own exit code (PeerLostError's)
    assert any("could not connect to another process of this run at 127.0.0.1:" in _rank_errors(t)[0] for t in text)
    assert max(ended) - min(ended) < BOUND_S, ended


def test_survivor_on_the_other_host_of_a_sigkilled_peer_leaves_with_one_line(tmp_path):
    out = tmp_path / "run"
    args = [*ARGS, "--max-steps", "400", "--checkpoint-every", "4", "--output-dir", str(out)]
    logs = [tmp_path / "host0.log", tmp_path / "host1.log"]
    with two_hosts() as hosts:
        procs = [_launch(h, r, hosts[0], logs[r], args) for r, h in enumerate(hosts)]
        try:
            assert wait_for_step(out, 6, procs[0], timeout=180), "step 6 never reached before the run ended"
            ranks = child_pids(procs[1].pid)
            assert len(ranks) == 1, ranks
            os.kill(ranks[0], signal.SIGKILL)  # rank 1, on the second host
            took = max(_finish(procs, 60))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    text = logs[0].read_text()
    print(f"the survivor left {took:.1f} s after its peer was killed")
    lines = _rank_errors(text)
    assert len(lines) == 1 and lines[0].startswith("[rank 0] error: another process of this run (rank 1) died"), text
    assert "--resume auto" in lines[0] and "unexpected failure" not in text and str(REPO / "accel_train") not in text
    assert re.search(r"exitcode\s*:\s*4 \(pid", text), text
    # the checkpoints are kept (which ones depends on how far the run got before the kill: --keep-last retires)
    assert sorted((out / "checkpoints").glob("step_*")), list((out / "checkpoints").iterdir())
