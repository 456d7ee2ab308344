"""Shared helpers: run the real scripts in subprocesses and read what they wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"
# Small and fast, but the real loop: used by most end-to-end tests.
FAST = ["--report-to", "none", "--no-plots", "--no-progress"]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_EVALUATE_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(extra or {})
    return env


def launch_cmd(script: str, *args: str, config: str | None = None, launch_args: tuple[str, ...] = ()) -> list[str]:
    path = str(REPO / script) if "/" in script else str(REPO / "scripts" / script)
    if config is None:
        return [sys.executable, path, *args]
    cfg = config if os.path.isabs(config) else str(CONFIGS / config)
    return [
        sys.executable,
        "-m",
        "accelerate.commands.accelerate_cli",
        "launch",
        "--config_file",
        cfg,
        *launch_args,
        path,
        *args,
    ]


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
