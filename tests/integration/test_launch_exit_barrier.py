"""The end of a launch over several machines (accel_train.commands.launch, which scripts/slurm/train.sbatch runs):
no traceback after a finished run when machine 0's launcher, which holds the rendezvous store, passes torch elastic's
exit barrier last while another launcher is between the barrier's two requests (pytorch/pytorch#69520; it failed a
two-node Slurm test once). Two real processes, a real TCPStore, torch's own barrier; the moment is made to happen
(tests/exit_barrier_agent.py), and torch alone shows the failure there."""

from __future__ import annotations

import subprocess
import sys

import pytest
from checks import free_port
from conftest import REPO, _env

AGENT = str(REPO / "tests" / "exit_barrier_agent.py")


def _two_launchers(fix: bool) -> list[subprocess.CompletedProcess]:
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, AGENT, str(rank), str(port), "1" if fix else "0"],
            cwd=REPO,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]  # read while they run: a full pipe never blocks them
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outputs, strict=True)]


@pytest.mark.parametrize("fix", [False, True], ids=["torch-alone", "accel_train"])
def test_the_store_holder_waits_for_the_other_launchers(fix):
    rank0, rank1 = _two_launchers(fix)
    assert rank0.returncode == 0 and "past the exit barrier" in rank0.stdout, rank0.stderr
    assert rank1.returncode == 0 and "past the exit barrier" in rank1.stdout, rank1.stderr
    if fix:
        assert "Traceback" not in rank0.stderr + rank1.stderr, rank0.stderr + rank1.stderr
        assert "exit barrier" not in rank1.stderr and "Failed to recv" not in rank1.stderr, rank1.stderr
    else:  # the failure this guards against: torch logs it with a traceback, the launch still exits 0
        assert "Error waiting on exit barrier" in rank1.stderr and "Traceback" in rank1.stderr, rank1.stderr
