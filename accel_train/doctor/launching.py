"""Launching the repository's scripts as users do: ``accelerate launch`` command lines, clean environments for
child runs, and watching a launched run (its steps, its ranks).

The doctor's ``--smoke`` and its launch plan use it; so do the benchmark, ``scripts/soak.py`` and the tests,
which all start the real scripts. It lives in the doctor's room, not on the training path: a run never imports
it (``tests/integration/test_packaging_runs.py``). ``REPO``: the checkout the scripts are in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from accel_train.run_dir import METRICS

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "accelerate_configs"
_LAUNCHER_VARS = ("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC_")


def accelerate_launch(config: str | os.PathLike, launch_args: Sequence[str] = ()) -> list[str]:
    """``accelerate launch --config_file CONFIG [launch_args]``; a bare name is looked up in accelerate_configs/."""
    path = Path(config) if os.path.isabs(config) else CONFIG_DIR / config
    return [
        sys.executable,
        "-m",
        "accelerate.commands.accelerate_cli",
        "launch",
        "--config_file",
        str(path),
        *launch_args,
    ]


def script_cmd(
    script: str, *args: str, config: str | os.PathLike | None = None, launch_args: Sequence[str] = ()
) -> list[str]:
    """Run ``scripts/<script>`` (or a repo-relative path) plainly, or under ``accelerate launch`` with ``config``."""
    path = str(REPO / script) if "/" in script else str(REPO / "scripts" / script)
    prefix = [sys.executable] if config is None else accelerate_launch(config, launch_args)
    return [*prefix, path, *args]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without inherited launcher variables, with the HF libraries offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_EVALUATE_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
    )
    env.update(extra or {})
    return env


def wait_for_step(run_dir: str | os.PathLike, step: int, proc, timeout: float = 300) -> bool:
    """Poll ``run_dir/metrics.jsonl`` until a train event at ``step`` or later; False if ``proc`` ended first."""
    import json
    import time

    path = Path(run_dir) / METRICS
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record["event"] == "train" and record["step"] >= step:
                    return True
        except (OSError, ValueError):
            pass  # not written yet, or a line being written
        time.sleep(0.02)
    return False


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (the ranks started by an ``accelerate launch`` process)."""
    import subprocess

    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]
