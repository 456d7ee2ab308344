"""accelerate configs written by accelerate's OWN writers: train.py and doctor.py accept each of them.

* ``accelerate config default --config_file F`` (a subprocess, like a user runs it);
* ``accelerate.utils.write_basic_config(mixed_precision="no", save_location=F)``;
* the interactive ``accelerate config`` wizard answered "This machine / No distributed training /
  CPU only / no dynamo / no DeepSpeed / mixed precision no": built with ``ClusterConfig(...)`` exactly
  as ``commands/config/cluster.py:get_cluster_input`` builds it for those answers, written with its
  ``to_yaml_file``; and the real wizard, driven through a pseudo-terminal, writes the same file.

The wizard's multi-CPU answer (``distributed_type: MULTI_CPU``, 2 processes) is checked here against the
real wizard too; how it trains is in ``test_multi_cpu_wizard.py``.
"""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, _env, check, run_script, summary

KINDS = ("default", "basic", "wizard")


def wizard_cpu_only_config(**changes):
    """What ``get_cluster_input()`` returns for: No distributed training, CPU only: yes, dynamo: no,
    DeepSpeed: no, mixed precision: no (accelerate 1.15, commands/config/cluster.py); ``changes`` replace fields."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import ComputeEnvironment, DistributedType

    config = ClusterConfig(
        compute_environment=ComputeEnvironment.LOCAL_MACHINE,
        distributed_type=DistributedType.NO,
        num_processes=1,
        gpu_ids=None,  # only asked when not CPU-only
        mixed_precision="no",
        downcast_bf16="no",  # tpu_downcast_bf16's default
        machine_rank=0,
        num_machines=1,
        main_process_ip=None,
        main_process_port=None,
        main_training_function="main",
        fp8_config=None,
        deepspeed_config={},
        fsdp_config={},
        parallelism_config={},
        megatron_lm_config={},
        mpirun_config={},
        use_cpu=True,
        rdzv_backend="static",
        same_network=True,
        commands=None,
        command_file=None,
        tpu_env=[],
        tpu_name=None,
        tpu_vm=None,
        tpu_zone=None,
        tpu_use_sudo=False,
        tpu_use_cluster=False,
        dynamo_config={},
        debug=False,
        enable_cpu_affinity=False,
    )
    return dataclasses.replace(config, **changes)


def wizard_multi_cpu_config(num_processes: int = 2):
    """``get_cluster_input()`` for: This machine, multi-CPU, 1 machine, debug checks: no, mpirun: no,
    dynamo: no, ``num_processes`` processes, mixed precision: no. The wizard sets ``use_cpu`` itself for
    multi-CPU and asks nothing else, so only the type and the process count differ from the CPU-only file."""
    from accelerate.utils import DistributedType

    return wizard_cpu_only_config(distributed_type=DistributedType.MULTI_CPU, num_processes=num_processes)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    from accelerate.utils import write_basic_config

    root = tmp_path_factory.mktemp("accelerate_writers")
    env = _env({"HF_HOME": str(root / "hf_home")})  # never touch the user's default config
    paths = {kind: root / f"{kind}.yaml" for kind in KINDS}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.accelerate_cli",
            "config",
            "default",
            "--config_file",
            str(paths["default"]),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    check(proc)
    assert write_basic_config(mixed_precision="no", save_location=str(paths["basic"]))
    wizard_cpu_only_config().to_yaml_file(str(paths["wizard"]))
    for path in paths.values():
        assert path.is_file()
    return paths


@pytest.mark.parametrize("kind", KINDS)
def test_written_config_is_single_process(generated, kind):
    data = yaml.safe_load(generated[kind].read_text())
    assert data["distributed_type"] in ("NO", "MULTI_GPU")
    assert data["mixed_precision"] == "no"
    if kind == "wizard" or not _cuda():
        assert data["distributed_type"] == "NO" and data["num_processes"] == 1 and data["use_cpu"] is True


@pytest.mark.parametrize("kind", KINDS)
def test_train_runs_under_accelerate_written_config(generated, kind, launch_once):
    """The doctor's smoke-run arguments, so files with the same contents (test_doctor.py launches
    write_basic_config's too) share one launch."""
    from accel_train.doctor.smoke import SMOKE_STEPS, TRAIN_ARGS

    num_processes = yaml.safe_load(generated[kind].read_text())["num_processes"]
    out, _ = launch_once(generated[kind], *TRAIN_ARGS)
    s = summary(out)
    assert s["global_step"] == SMOKE_STEPS
    assert s["world_size"] == num_processes
    if kind == "wizard" or not _cuda():  # a CPU-only machine: accelerate's writers choose one CPU process
        assert s["world_size"] == 1 and s["device"] == "cpu"


def test_doctor_accepts_accelerate_written_configs(generated):
    """One doctor run over the three files (exit 0 = every config is OK), then each file's own verdict."""
    proc = check(run_script("doctor.py", "--config_file", *(str(generated[kind]) for kind in KINDS)))
    sections = proc.stdout.split("\n\n")
    for kind in KINDS:
        section = next((s for s in sections if s.startswith(f"== {generated[kind]} ==")), None)
        assert section is not None, proc.stdout
        assert "1 process on cpu" in section or _cuda(), section
        # a file accelerate wrote itself must not draw advice to edit it: no warnings either
        assert "verdict: OK (0 errors, 0 warnings)" in section, section


# --------------------------------------------------------------------------- the real wizard

_HIDE_CURSOR = b"\x1b[?25l"  # BulletMenu hides the cursor right before it switches the tty to raw mode
_SHOW_CURSOR = b"\x1b[?25h"  # ... and shows it again once a key chose


class _Pty:
    def __init__(self, cmd: list[str], env: dict[str, str]):
        import fcntl
        import pty
        import struct
        import termios

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        self.proc = subprocess.Popen(
            cmd, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO, close_fds=True, start_new_session=True
        )
        os.close(slave)
        self.seen = b""  # everything read so far
        self.pos = 0  # what expect() has consumed

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the child closed the terminal
            data = b""
        if not data:
            raise EOFError
        self.seen += data
        return True

    def expect(self, pattern: bytes, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while pattern not in self.seen[self.pos :]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                self._read(min(remaining, 0.5))
            except EOFError:
                return False
        self.pos = self.seen.index(pattern, self.pos) + len(pattern)
        return True

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> int | None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        return self.proc.returncode


def answer_wizard(tmp_path: Path, out: Path, script: list[tuple[bytes, bytes, bool]]) -> bytes:
    """Drive ``accelerate config --config_file out`` through a pty: ``script`` is (prompt, answer, menu?) in
    the order ``get_user_input()``/``get_cluster_input()`` ask them. Returns what the terminal showed."""
    try:
        import pty  # noqa: F401

        os.close(os.openpty()[0])
    except (ImportError, OSError) as exc:
        pytest.skip(f"no pseudo-terminal here: {exc}")
    env = _env({"HF_HOME": str(tmp_path / "hf_home"), "TERM": "xterm"})
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "config", "--config_file", str(out)]
    term = _Pty(cmd, env)
    try:
        for i, (prompt, answer, menu) in enumerate(script):
            assert term.expect(prompt, 90 if i == 0 else 30), f"no prompt {prompt!r}; got:\n{term.seen[-2000:]!r}"
            if menu:
                # tty.setraw() flushes typed-ahead input: answer once the menu waits for a key, and re-send
                # only if the menu never closed (it shows the cursor again once it took the key). A key re-sent
                # to a menu that was only slow would answer the next question: so wait long before that.
                assert term.expect(_HIDE_CURSOR, 30)
                time.sleep(0.2)
                term.send(answer)
                for _ in range(3):
                    if term.expect(_SHOW_CURSOR, 20):
                        break
                    term.send(answer)
            else:
                term.send(answer)
        assert term.expect(b"configuration saved", 30), term.seen[-2000:]
    finally:
        code = term.close()
    assert code == 0, term.seen[-2000:]
    return term.seen


def test_interactive_wizard_writes_the_same_config(tmp_path, generated):
    """Drive ``accelerate config`` through a pty with the answers above; its file equals ClusterConfig's."""
    out = tmp_path / "wizard_interactive.yaml"
    script = [
        (b"In which compute environment", b"\r", True),  # 0: This machine
        (b"Which type of machine", b"\r", True),  # 0: No distributed training
        (b"run your training on CPU only", b"yes\r", False),
        (b"torch dynamo", b"no\r", False),
        (b"use DeepSpeed", b"no\r", False),
        (b"mixed precision?", b"\r", True),  # 0: no
    ]
    answer_wizard(tmp_path, out, script)
    assert yaml.safe_load(out.read_text()) == yaml.safe_load(generated["wizard"].read_text())
    assert out.read_text() == generated["wizard"].read_text()  # same writer, same bytes


def test_interactive_wizard_multi_cpu_answer(tmp_path):
    """The wizard's obvious multi-CPU answers write what ``wizard_multi_cpu_config()`` writes."""
    out = tmp_path / "wizard_multi_cpu.yaml"
    script = [
        (b"In which compute environment", b"\r", True),  # 0: This machine
        (b"Which type of machine", b"1\r", True),  # 1: multi-CPU (the number key moves, enter selects)
        (b"How many different machines", b"\r", False),  # [1]
        (b"checked while running for errors", b"\r", False),  # [NO]
        (b"launch mpirun", b"\r", False),  # [NO]
        (b"torch dynamo", b"no\r", False),
        (b"How many processes should be used", b"2\r", False),
        (b"mixed precision?", b"\r", True),  # 0: no
    ]
    answer_wizard(tmp_path, out, script)
    expected = tmp_path / "expected.yaml"
    wizard_multi_cpu_config(2).to_yaml_file(str(expected))
    data = yaml.safe_load(out.read_text())
    assert data["distributed_type"] == "MULTI_CPU" and data["num_processes"] == 2 and data["use_cpu"] is True
    assert out.read_text() == expected.read_text()  # same writer, same bytes
