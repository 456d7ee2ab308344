"""Shared helpers: run the real scripts in subprocesses and read what they wrote."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from accel_train.launch import child_env, script_cmd

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"
# Small and fast, but the real loop: used by most end-to-end tests.
FAST = ["--report-to", "none", "--no-plots", "--no-progress"]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return child_env(extra)


def launch_cmd(script: str, *args: str, config: str | None = None, launch_args: tuple[str, ...] = ()) -> list[str]:
    return script_cmd(script, *args, config=config, launch_args=launch_args)


def run_script(
    script: str,
    *args: str,
    config: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    launch_args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """``python scripts/<script> args`` or, with ``config``, ``accelerate launch --config_file``."""
    cmd = launch_cmd(script, *args, config=config, launch_args=launch_args)
    return subprocess.run(cmd, cwd=REPO, env=_env(env), capture_output=True, text=True, timeout=timeout)


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    )
    return proc


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


def weights(run_dir: Path, sub: str = "model") -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / sub / "model.safetensors"))


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture
def repo() -> Path:
    return REPO


def pytest_collection_modifyitems(config, items):
    """Real-GPU tests skip on machines without enough CUDA devices (CI has none)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs at least 2 CUDA GPUs"))
