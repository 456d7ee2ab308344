"""Precision and device pinning, the same for every measurement: the TF32 choice for matmuls and convolutions
(set, scoped to a block, recorded), and the ``CUDA_VISIBLE_DEVICES`` each child gets, so that a one-GPU run
never becomes accel_train's ``nn.DataParallel`` on a host with several GPUs."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from accel_train.doctor.launching import child_env
from benchmarks.speed.setups import Setup


def precision_flags() -> dict[str, Any]:
    """The fp32 math settings in effect in this process (TF32 applies to CUDA only; CPUs ignore it)."""
    import torch

    return {
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def set_tf32(enabled: bool) -> None:
    """The same TF32 choice for matmuls and convolutions.

    PyTorch's defaults differ (matmuls off, cuDNN convolutions on), so an "fp32" GEMM peak
    measured with the defaults is a true-fp32 peak while the model's convolutions run in TF32.
    """
    import torch

    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


@contextmanager
def tf32_mode(enabled: bool | None) -> Iterator[None]:
    """``set_tf32(enabled)`` for the block, then the previous settings; ``None`` leaves them alone."""
    import torch

    if enabled is None:
        yield
        return
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    set_tf32(enabled)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn


def first_visible_gpu(env: Mapping[str, str] | None = None) -> str:
    """The GPU that ``cuda:0`` is in this process: the first ``CUDA_VISIBLE_DEVICES`` entry, else ``0``."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "")
    first = visible.split(",")[0].strip()
    return first or "0"


def visible_devices(setup: Setup, env: Mapping[str, str] | None = None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a child of ``setup``; None: leave the launcher's choice.

    CPU: no GPU. One CUDA process: exactly ONE GPU (the one this process measures as ``cuda:0``),
    because accel_train wraps a single process that sees several GPUs in ``nn.DataParallel``:
    without the pin a "1-GPU" run on a multi-GPU host silently becomes a DataParallel run.
    """
    if setup.device == "cpu":
        return ""
    if setup.processes == 1:
        return first_visible_gpu(env)
    return None


def one_gpu_env(parent_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``child_env()`` for the time-to-accuracy runs (one process on the default device): at most ONE GPU.

    Without it, ``scripts/train.py`` on a multi-GPU host would run ``nn.DataParallel`` while the
    seed-000 recipe uses one GPU. ``CUDA_VISIBLE_DEVICES=""`` (no GPU) is kept as it is.
    """
    env = child_env()
    if (os.environ if parent_env is None else parent_env).get("CUDA_VISIBLE_DEVICES") != "":
        env["CUDA_VISIBLE_DEVICES"] = first_visible_gpu(parent_env)
    return env
