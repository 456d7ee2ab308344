"""Shared helpers: run the real scripts in subprocesses and read what they wrote.

GPUs are hidden from every test that is not marked ``gpu`` or ``multigpu`` (see
``pytest_runtest_protocol``), so the CPU suite gives the same results on a GPU workstation as on
the CPU-only CI: ``python scripts/train.py`` would otherwise land on ``cuda:0`` and be compared with
CPU runs at 1e-5.
"""

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


GPU_MARKERS = ("gpu", "multigpu")
# What a non-GPU test's children see as CUDA_VISIBLE_DEVICES. An entry that is not a device index hides
# every GPU from CUDA and from torch (both stop reading the list at the first invalid entry), like Slurm's
# "NoDevFiles". Not "" or "-1": accel_train reads those as "GPUs hidden on purpose" and then skips its
# "this machine has no CUDA device" warning, which CPU-only tests check for.
HIDDEN_GPUS = "NoDevFiles"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child run's environment: this process's, through ``child_env`` (so without GPUs unless GPU-marked)."""
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


# The in-process runs: config -> build -> Trainer in the test process, about a second each.
SMALL_RUN = [
    "--dataset", "synthetic", "--synthetic-size", "256", "--synthetic-test-size", "64",
    "--synthetic-image-size", "16", "--model", "lenet", "--batch-size", "16",
    "--report-to", "none", "--no-plots", "--no-progress", "--log-every", "1",
]  # fmt: skip


def fit_small(out: Path, *args: str) -> dict:
    """``loop.fit`` on SMALL_RUN (later flags win) into ``out``."""
    from accel_train.config import parse_config
    from accel_train.loop import fit

    return fit(parse_config([*SMALL_RUN, "--output-dir", str(out), *args]))


def copy_run(run: Path, tmp_path: Path) -> Path:
    import shutil

    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


@pytest.fixture
def repo() -> Path:
    return REPO


def wants_gpu(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in GPU_MARKERS)


def pytest_collection_modifyitems(config, items):
    """Real-GPU tests skip on machines without enough CUDA devices (CI has none).

    The count is taken here, before any test runs and so before ``hide_gpus`` patches anything.
    """
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs at least 2 CUDA GPUs"))


def hide_gpus(mp: pytest.MonkeyPatch) -> None:
    """Make this process and every child it starts see no GPU.

    Children: ``CUDA_VISIBLE_DEVICES`` in ``os.environ``, which ``child_env`` copies (an explicit
    ``env={"CUDA_VISIBLE_DEVICES": ...}`` still wins). This process: CUDA may already be initialised
    (the device count above), after which the variable changes nothing, so ``torch.cuda``'s answers
    are patched too; accelerate asks the same functions when it picks the device of an in-process
    ``Accelerator``.
    """
    import torch

    mp.setenv("CUDA_VISIBLE_DEVICES", HIDDEN_GPUS)
    mp.setattr(torch.cuda, "is_available", lambda: False)
    mp.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Hide GPUs for the whole protocol of a non-GPU test: setup, call and teardown.

    A hook rather than an autouse fixture, because module-scoped fixtures (they start the expensive
    runs) are set up before any function-scoped fixture and must not see a GPU either. (An
    old-style hookwrapper: the GPU machines may have an older pytest.)
    """
    if wants_gpu(item):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        hide_gpus(mp)
        yield
