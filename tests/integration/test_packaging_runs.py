"""The package installs with console scripts, and the scripts are thin and never patch sys.path.

Whole runs and launches; the in-process tests are in ../unit/test_packaging.py.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO, _env


def _installed() -> bool:
    try:
        importlib.metadata.distribution("accel_train")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH: only what is installed can be imported."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.skipif(not _installed(), reason="accel_train is not installed (pip install -e .)")
def test_installed_console_script_and_script_run_from_anywhere(tmp_path):
    bin_dir = Path(sysconfig.get_path("scripts"))
    console = bin_dir / "accel-evaluate"
    if not console.exists():
        pytest.skip(f"console scripts are not in {bin_dir}")
    out = subprocess.run([str(console), "--help"], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True)
    assert out.returncode == 0 and "--weights" in out.stdout, out.stderr
    # benchmark.py runs the harness (benchmarks/, not installed) from any folder, without PYTHONPATH
    for script, needle in (("eval.py", "--weights"), ("benchmark.py", "--speedrun")):
        out = subprocess.run(
            [sys.executable, str(REPO / "scripts" / script), "--help"],
            cwd=tmp_path,
            env=_clean_env(),
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0 and needle in out.stdout, (script, out.stderr)


def test_training_imports_no_harness():
    """A training run imports neither the benchmark, the doctor, nor the launch helpers of tests and tools."""
    code = (
        "import sys, accel_train.loop, accel_train.commands.train; "
        "print([m for m in sys.modules if m.startswith(('benchmarks', 'accel_train.doctor'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_ruff_holds_the_package_to_its_limits():
    """``ruff check`` (pyproject.toml: complexity <= 12, <= 50 statements per function, style) passes on the code."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (requirements-dev.txt installs it)")
    cmd = [ruff, "check", "accel_train", "scripts", "benchmarks"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


# ---- --help imports no torch -----------------------------------------------------------------------------------------


def test_help_does_not_import_torch():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(REPO / "scripts" / "train.py"), "--help"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--max-steps" in proc.stdout and "--config" in proc.stdout
    modules = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert len(modules) > 20, proc.stderr[:2000]  # importtime output was captured
    heavy = [m for m in modules if m == "torch" or m.startswith("torch.")]
    assert not heavy, f"--help imported {heavy[:5]}"
