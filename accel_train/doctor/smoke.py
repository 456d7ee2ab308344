"""``--smoke``: launch 2 real optimizer steps of ``scripts/train.py`` under a config and compare with the plan.

The run is the real thing (``accelerate launch --config_file F scripts/train.py``, small synthetic data);
what it recorded (``summary.json``, else ``config.yaml``'s ``resolved``) is set beside the plan's ``run``.
A disagreement or a failed launch is an error finding, so the doctor exits 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from accel_train.doctor.configfile import Diagnosis
from accel_train.doctor.report import RUN_KEYS

SMOKE_STEPS = 2
TRAIN_ARGS = (
    "--max-steps", str(SMOKE_STEPS), "--dataset", "synthetic", "--synthetic-size", "64",
    "--synthetic-test-size", "32", "--synthetic-image-size", "16", "--model", "lenet", "--batch-size", "8",
    "--report-to", "none", "--no-plots", "--no-progress", "--no-checkpoint-epochs",
)  # fmt: skip


def observed(run_dir: Path) -> dict[str, Any]:
    """What the run recorded about itself: summary.json, else config.yaml's ``resolved`` section."""
    try:
        recorded = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        try:
            recorded = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")).get("resolved") or {}
        except (OSError, AttributeError, yaml.YAMLError):
            recorded = {}
    return {key: recorded[key] for key in RUN_KEYS if key in recorded}


def disagreements(expected: dict[str, Any], seen: dict[str, Any]) -> list[str]:
    """Keys where the run differs from the plan; a device compares by its type (``cpu:0`` is ``cpu``)."""

    def same(key: str) -> bool:
        want, got = expected.get(key), seen[key]
        if key == "device":
            return str(got).split(":")[0] == want
        return got == want

    return [key for key in RUN_KEYS if key in seen and not same(key)]


def _run_dir(root: Path, stem: str) -> Path:
    path, n = root / stem, 1
    while path.exists():
        n += 1
        path = root / f"{stem}-{n}"
    return path


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (proc.stderr or "").splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line.lower() or "Error" in line]
    return (errors or lines or ["no output"])[-1][:500]


def run_smoke(
    diag: Diagnosis, root: Path, launch_args: Sequence[str] = (), timeout: float = 600, *, kept: bool = True
) -> None:
    """Launch the 2 steps for ``diag``'s config into ``root`` and record the comparison in ``diag``.

    ``kept``: whether the run folder outlives the doctor (the report says so).
    """
    from accel_train.doctor.launching import REPO, child_env, script_cmd
    from accel_train.errors import UserError

    if not (REPO / "scripts" / "train.py").is_file():
        raise UserError(f"--smoke launches scripts/train.py of an accel_train checkout, not found in {REPO}")
    expected = diag.plan.get("run")
    if diag.errors or not expected:
        diag.smoke = {"skipped": "the config has errors; fix them first"}
        return
    if diag.plan.get("num_machines", 1) > 1:
        diag.smoke = {"skipped": f"it needs {diag.plan['num_machines']} machines; launch each machine's run by hand"}
        return
    run_dir = _run_dir(root, Path(diag.path).stem)
    config = os.path.abspath(diag.path)
    cmd = script_cmd("train.py", *TRAIN_ARGS, "--output-dir", str(run_dir), config=config, launch_args=launch_args)
    shown = "accelerate " + " ".join(cmd[cmd.index("launch") :]).replace(str(REPO) + os.sep, "")
    diag.smoke = {"command": shown, "run_dir": str(run_dir), "kept": kept, "expected": expected}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        diag.smoke.update(exit_code=None, seconds=round(time.monotonic() - start, 1), observed={}, differs=[])
        diag.add("error", "smoke-failed", f"the {SMOKE_STEPS}-step launch did not finish in {timeout:g} s")
        return
    seen = observed(run_dir)
    differs = disagreements(expected, seen)
    diag.smoke.update(exit_code=proc.returncode, seconds=round(time.monotonic() - start, 1), observed=seen)
    diag.smoke["differs"] = differs
    if proc.returncode != 0:
        diag.add(
            "error", "smoke-failed", f"the {SMOKE_STEPS}-step launch exited {proc.returncode}: {_error_line(proc)}"
        )
    elif not seen:
        diag.add("error", "smoke-failed", f"the {SMOKE_STEPS}-step launch recorded nothing in {run_dir}")
    elif differs:
        told = ", ".join(f"{key} {expected.get(key)!r} planned, {seen[key]!r} seen" for key in differs)
        diag.add("error", "smoke-mismatch", f"the run disagrees with the plan: {told}")
