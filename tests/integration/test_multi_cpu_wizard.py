"""Issue 15, finding 6: the wizard's multi-CPU config (``distributed_type: MULTI_CPU``) just works.

accelerate 1.15 starts it with its simple launcher, ONE process without mpirun; that process reads
``accelerate launch``'s command line and config and starts the N ranks itself (``accel_train.elastic``).
The wizard's exact file is ``wizard_multi_cpu_config()`` (checked against the real wizard in
``test_wizard_configs.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from checks import free_port, running
from conftest import FAST, REPO, _env, check, fit_here, launch_cmd, max_abs_diff, run_script, summary, weights
from test_wizard_configs import wizard_multi_cpu_config

from accel_train import elastic
from accel_train.doctor.launching import child_pids, wait_for_step
from accel_train.errors import LaunchError
from accel_train.runtime import check_launch

PY = sys.executable
# the lone process's environment under accelerate's simple launcher (num_processes > 1, no mpirun)
LONE = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "PATH": "/usr/bin"}
RELAUNCH_NOTE = "accel_train starts the 2 ranks itself (torch elastic, gloo)"


@pytest.fixture
def wizard_yaml(tmp_path):
    path = tmp_path / "wizard_multi_cpu.yaml"
    wizard_multi_cpu_config(2).to_yaml_file(str(path))
    return path


def _multi_machine_yaml(tmp_path):
    path = tmp_path / "two_machines.yaml"
    wizard_multi_cpu_config(4).to_yaml_file(str(path))
    data = yaml.safe_load(path.read_text())
    data.update(num_machines=2, main_process_ip="127.0.0.1", main_process_port=free_port())
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- the parent's command line


@pytest.mark.parametrize(
    "cmdline, expected",
    [
        ([PY, "/venv/bin/accelerate", "launch", "--config_file", "c.yaml", "t.py", "--x"], ["--config_file", "c.yaml"]),
        ([PY, "-m", "accelerate.commands.accelerate_cli", "launch", "t.py", "--x"], []),
        ([PY, "/venv/bin/accelerate-launch", "--num_processes", "2", "t.py", "--x"], ["--num_processes", "2"]),
        ([PY, "-u", "-m", "accelerate.commands.launch", "t.py", "--x"], []),
        (
            [PY, "-m", "accel_train.commands.launch", "--config_file", "c.yaml", "t.py", "--x"],
            ["--config_file", "c.yaml"],
        ),
    ],
)
def test_launch_argv_finds_accelerate_launch(cmdline, expected):
    assert elastic.launch_argv(cmdline) == [*expected, "t.py", "--x"]


@pytest.mark.parametrize(
    "cmdline",
    [
        [PY, "scripts/train.py", "--max-steps", "2"],  # plain python
        ["/bin/bash", "-c", "python scripts/train.py"],
        [PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "t.py"],
        [PY, "/venv/bin/accelerate", "config"],  # accelerate, but not launch
        [],
    ],
)
def test_launch_argv_refuses_other_parents(cmdline):
    assert elastic.launch_argv(cmdline) is None
    assert elastic.request_from_parent(cmdline) is None


def test_request_reads_the_config_file_and_command_line_overrides(wizard_yaml):
    base = [PY, "/venv/bin/accelerate", "launch", "--config_file", str(wizard_yaml)]
    req = elastic.request_from_parent([*base, "scripts/train.py", "--max-steps", "2"])
    assert (req.num_processes, req.num_machines, req.main_process_port) == (2, 1, None)
    assert req.script == ("scripts/train.py", "--max-steps", "2")
    assert elastic.can_start_ranks(req)
    assert elastic.request_from_parent([*base, "--num_processes", "3", "t.py"]).num_processes == 3
    assert elastic.request_from_parent([*base, "--num-processes=3", "t.py"]).num_processes == 3  # accelerate's spelling
    module = elastic.request_from_parent([*base, "--max_restarts", "2", "-m", "pkg.train", "--x"])
    assert module.script == ("-m", "pkg.train", "--x") and module.max_restarts == 2
    two = elastic.request_from_parent([*base, "--num_machines", "2", "t.py"])
    assert two.num_machines == 2 and not elastic.can_start_ranks(two)


def test_only_cpu_ranks_are_started(tmp_path):
    """MULTI_CPU or ``--cpu`` ask for CPU ranks; a ``distributed_type: NO`` file's num_processes does not."""
    no = tmp_path / "no.yaml"
    no.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 2\nuse_cpu: true\n")
    multi_gpu = str(REPO / "accelerate_configs" / "multi_gpu.yaml")
    base = [PY, "/venv/bin/accelerate", "launch", "--config_file"]
    assert not elastic.can_start_ranks(elastic.request_from_parent([*base, str(no), "t.py"]))
    cpu = elastic.request_from_parent([*base, multi_gpu, "--cpu", "--num_processes", "3", "t.py"])
    assert elastic.can_start_ranks(cpu) and cpu.num_processes == 3
    assert elastic.relaunch_line(3, cpu.asked_by).startswith("accel_train: accelerate launch --cpu asked for 3")


def test_request_without_config_file_uses_accelerates_default_one(wizard_yaml, monkeypatch, tmp_path):
    import accelerate.commands.config as config_pkg
    from accelerate.commands.config import config_args

    monkeypatch.setattr(config_pkg, "default_config_file", str(wizard_yaml))
    monkeypatch.setattr(config_args, "default_config_file", str(wizard_yaml))
    base = [PY, "/venv/bin/accelerate", "launch"]
    assert elastic.request_from_parent([*base, "t.py"]).num_processes == 2
    # --cpu without --config_file: accelerate ignores the default file (its _validate_launch_command)
    assert elastic.request_from_parent([*base, "--cpu", "t.py"]).num_processes == 1
    monkeypatch.setattr(config_pkg, "default_config_file", str(tmp_path / "none.yaml"))
    assert elastic.request_from_parent([*base, "--num_processes", "2", "t.py"]).num_processes == 2


def test_unusable_parent_command_lines_give_no_request(tmp_path):
    base = [PY, "/venv/bin/accelerate", "launch"]
    assert elastic.request_from_parent(None) is None  # no /proc
    assert elastic.request_from_parent([*base, "--num_processes", "two", "t.py"]) is None  # accelerate refuses it
    assert elastic.request_from_parent([*base, "--config_file", str(tmp_path / "gone.yaml"), "t.py"]) is None
    assert elastic.request_from_parent(base) is None  # no script
    assert elastic.parent_cmdline(2**22 + 12345) is None  # no such process
    assert elastic.parent_cmdline()  # this process's parent, from /proc (Linux)


def test_rendezvous_port():
    req = elastic.Request(2, 1, None, 0, 0.1, ("t.py",))
    assert elastic.rendezvous_port(req) == 0  # the c10d store picks a free port
    explicit = elastic.Request(2, 1, 29511, 0, 0.1, ("t.py",))
    assert elastic.rendezvous_port(explicit, in_use=lambda port: False) == 29511
    assert elastic.rendezvous_port(explicit, in_use=lambda port: True) == 0  # as accelerate does: a free one


# --------------------------------------------------------------------------- relaunch, or not


class _Execed(Exception):
    pass


@pytest.fixture
def execve(monkeypatch):
    calls = []

    def fake(path, argv, env):
        calls.append((path, argv, env))
        raise _Execed

    monkeypatch.setattr(elastic.os, "execve", fake)
    return calls


def test_lone_process_becomes_the_launcher_of_its_ranks(wizard_yaml, execve, capsys):
    cmdline = [PY, "/venv/bin/accelerate", "launch", "--config_file", str(wizard_yaml), "scripts/train.py", "--a"]
    with pytest.raises(_Execed):
        elastic.relaunch_as_ranks({**LONE, "CUDA_VISIBLE_DEVICES": "0"}, cmdline)
    path, argv, env = execve[0]
    assert path == PY and argv[:3] == [PY, "-m", "accel_train.elastic"]
    assert argv[argv.index("--nproc_per_node") + 1] == "2" and argv[argv.index("--nnodes") + 1] == "1"
    assert argv[argv.index("--rdzv_endpoint") + 1] == "127.0.0.1:0"
    assert argv[-2:] == ["scripts/train.py", "--a"]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env[elastic.RELAUNCHED] == "1"  # gloo on CPU, never again
    assert "MASTER_PORT" not in env and "MASTER_ADDR" not in env and env["ACCELERATE_USE_CPU"] == "True"
    assert capsys.readouterr().err.strip() == elastic.relaunch_line(2)
    assert RELAUNCH_NOTE in elastic.relaunch_line(2)


def test_relaunch_leaves_every_other_process_alone(wizard_yaml, tmp_path, execve):
    cmdline = [PY, "/venv/bin/accelerate", "launch", "--config_file", str(wizard_yaml), "t.py"]
    for env in (
        {},  # plain python
        {"ACCELERATE_USE_CPU": "True"},  # cpu.yaml: one process asked for
        {**LONE, "WORLD_SIZE": "2", "RANK": "0"},  # a torchrun rank
        {**LONE, "PMI_SIZE": "2"},  # mpirun did start them
        {**LONE, elastic.RELAUNCHED: "1"},  # already the relaunch
    ):
        elastic.relaunch_as_ranks(env, cmdline)
    assert execve == []


@pytest.mark.parametrize("why", ["several machines", "not accelerate", "no /proc"])
def test_impossible_cases_keep_the_refusal(why, tmp_path, wizard_yaml, execve, monkeypatch):
    cmdline = {
        "several machines": [PY, "/venv/bin/accelerate", "launch", "--config_file", str(_multi_machine_yaml(tmp_path))],
        "not accelerate": [PY, "/opt/my_launcher.py", "--config_file", str(wizard_yaml)],
    }.get(why)
    if cmdline is None:
        monkeypatch.setattr(elastic, "parent_cmdline", lambda pid=None: None)
        elastic.relaunch_as_ranks(dict(LONE))
    else:
        elastic.relaunch_as_ranks(dict(LONE), [*cmdline, "t.py"])
    assert execve == []
    with pytest.raises(LaunchError, match="started only one"):
        check_launch(dict(LONE))


def test_launcher_exit_code_is_the_failed_ranks():
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    def failed(code):
        return ChildFailedError("t.py", {1: ProcessFailure(1, 10, code, "/nonexistent/error.json")})

    assert elastic.exit_code_of(failed(2)) == 2  # a UserError on a rank: its code, not torchrun's 1
    assert elastic.exit_code_of(failed(-9)) == 128 + 9
    assert elastic.exit_code_of(SignalException("stop", signal.SIGTERM)) == 128 + 15


# --------------------------------------------------------------------------- end to end

LENET = ["--model", "lenet", "--seed", "7", *FAST]
# SGD: 1 and 2 processes then agree to ~1e-8 (Adam amplifies the all-reduce's summation order to ~1e-5)
RUN = [*LENET, "--max-steps", "6", "--global-batch-size", "64", "--optimizer", "sgd", "--lr", "0.02"]


def test_wizard_multi_cpu_config_trains_two_ranks_like_multi_cpu_yaml(wizard_yaml, tmp_path):
    """The wizard's MULTI_CPU file trains 2 real gloo ranks: the weights of one process with the whole batch
    (test_train_e2e.py shows multi_cpu.yaml does the same), not of two rank-0 copies."""
    out, ref = tmp_path / "wizard", tmp_path / "one_process"
    proc = check(run_script("train.py", *RUN, "--output-dir", str(out), config=str(wizard_yaml)))
    assert RELAUNCH_NOTE in proc.stderr
    assert "Traceback" not in proc.stderr and "no CUDA device" not in proc.stderr  # GPUs hidden on purpose
    s = summary(out)
    assert s["world_size"] == 2 and s["global_step"] == 6 and s["device"].startswith("cpu")
    assert s["micro_batch"] == 32
    fit_here(*RUN, "--output-dir", str(ref))
    assert max_abs_diff(weights(out), weights(ref)) <= 1e-6


def test_failing_rank_code_reaches_accelerate_without_torchrun_traceback(wizard_yaml, tmp_path):
    """A rank's own error line, then accelerate's CalledProcessError naming the rank's code (3: NaN loss)."""
    proc = run_script(
        "tests/fault_train.py",
        "--model",
        "nan_lenet",
        "--max-steps",
        "3",
        "--log-every",
        "1",
        "--output-dir",
        str(tmp_path / "run"),
        *FAST,
        config=str(wizard_yaml),
        env={"FAULT_NAN_FROM": "2"},
        timeout=300,
    )
    assert proc.returncode == 1  # accelerate's simple launcher turns every failure into 1
    assert "error: training loss became nan" in proc.stderr
    assert "returned non-zero exit status 3" in proc.stderr  # the launcher passed the rank's code on
    assert "ChildFailedError" not in proc.stderr


def test_multi_machine_refusal_is_one_line_with_accelerate_q(tmp_path):
    """Several machines cannot be started from here: the refusal; ``accelerate launch -q`` drops its traceback."""
    out = tmp_path / "run"
    proc = run_script(
        "train.py", *RUN, "--output-dir", str(out), config=str(_multi_machine_yaml(tmp_path)), launch_args=("-q",)
    )
    assert proc.returncode == 1, proc.stderr
    assert "started only one" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "summary.json").exists()


def test_killed_accelerate_launch_stops_the_ranks_with_a_checkpoint(wizard_yaml, tmp_path):
    """accelerate's simple launcher passes no signal on: once it is gone, the launcher SIGTERMs the ranks."""
    out = tmp_path / "run"
    cmd = launch_cmd(
        "train.py", *LENET, "--max-steps", "400", "--log-every", "1", "--output-dir", str(out), config=str(wizard_yaml)
    )
    with open(tmp_path / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    started: list[int] = []
    try:
        assert wait_for_step(out, 3, proc, timeout=240), (tmp_path / "log.txt").read_text()[-3000:]
        started += child_pids(proc.pid)  # the lone process, now the launcher of the ranks
        started += child_pids(started[0])
        assert len(started) == 3
        proc.kill()
        proc.wait()
        deadline = time.time() + 90
        while time.time() < deadline and any(map(running, started)):
            time.sleep(0.5)
        assert not any(map(running, started)), (tmp_path / "log.txt").read_text()[-3000:]
    finally:
        for pid in [proc.pid, *started]:  # what this test started, if it is still there
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    text = (tmp_path / "log.txt").read_text()
    assert "received SIGTERM" in text and "checkpoint saved" in text, text[-3000:]
    assert any((out / "checkpoints").iterdir())
