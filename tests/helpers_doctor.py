"""Helpers shared by tests/unit/test_doctor.py and tests/integration/test_doctor_runs.py: config files written
from text, findings and run views of a diagnosis, and the shape accelerate_configs/multi_cpu.yaml must have."""

from __future__ import annotations

import textwrap
from pathlib import Path

from accel_train.doctor import RUN_KEYS


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def finding(diag, code: str):
    matches = [f for f in diag.findings if f.code == code]
    assert matches, f"no {code!r} in {diag.findings}"
    return matches[0]


def run_view(world_size, distributed_type, device, mixed_precision, data_parallel=False) -> dict:
    """What a run records in summary.json (``RUN_KEYS``), as ``diag.plan["run"]`` predicts it."""
    return dict(zip(RUN_KEYS, (world_size, distributed_type, device, mixed_precision, data_parallel), strict=True))


# what accelerate_configs/multi_cpu.yaml must look like: torchrun ranks, GPUs hidden
MULTI_CPU_STYLE = textwrap.dedent("""
    compute_environment: LOCAL_MACHINE
    distributed_type: MULTI_GPU
    num_processes: 2
    gpu_ids: '-1,-1'
    mixed_precision: 'no'
""").lstrip()
