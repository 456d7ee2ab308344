"""The machine the numbers come from: the CPU's model and bf16 features, the versions, the fp32 and bf16 GEMM
peak (on the CPU and, where one is visible, the GPU) that MFU is measured against, and each model's
forward+backward FLOPs per sample."""

from __future__ import annotations

import platform
import time
from typing import Any

from accel_train.runtime import available_cores
from benchmarks.common import cpu_description
from benchmarks.speed.devices import first_visible_gpu, precision_flags, tf32_mode


def measure_gemm_peak(
    threads: int, n: int = 2048, reps: int = 5, device: str = "cpu", tf32: bool | None = None
) -> dict[str, Any]:
    """Best-of-``reps`` GFLOP/s of an n x n matmul in fp32 and bf16, interleaved (same noise for both).

    ``tf32`` (CUDA): measured under ``set_tf32(tf32)``, the setting the loops run with, so the
    "fp32" peak is the TF32 tensor-core peak when TF32 is on and the true-fp32 peak when it is off.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tf32_mode(tf32):
            return _gemm_peak(torch, n, reps, device)
    finally:
        torch.set_num_threads(previous)


def _gemm_peak(torch: Any, n: int, reps: int, device: str) -> dict[str, Any]:
    """Best-of-``reps`` n x n matmul seconds per dtype on ``device``, as GFLOP/s."""
    dev = torch.device(device)
    mats = {
        dt: (torch.randn(n, n, device=dev).to(dt), torch.randn(n, n, device=dev).to(dt))
        for dt in (torch.float32, torch.bfloat16)
    }
    best = {dt: float("inf") for dt in mats}
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for a, b in mats.values():  # warm-up: kernel selection, page faults
        a @ b
    sync()
    for _ in range(reps):
        for dt, (a, b) in mats.items():
            t0 = time.perf_counter()
            a @ b
            sync()
            best[dt] = min(best[dt], time.perf_counter() - t0)
    flops = 2.0 * n**3
    return {
        "fp32": flops / best[torch.float32] / 1e9,
        "bf16": flops / best[torch.bfloat16] / 1e9,
        "n": n,
        "reps": reps,
        "threads": torch.get_num_threads(),
        "precision_flags": precision_flags(),
    }


def flops_per_sample(model: str, batch: int, in_channels: int = 1, image_size: int = 28) -> float:
    """Forward+backward FLOPs per sample (matmuls and convolutions), counted on the meta device."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from accel_train.models import create_model

    with torch.device("meta"):
        net = create_model(model, 10, in_channels, image_size)
        x = torch.randn(batch, in_channels, image_size, image_size)
        y = torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(net(x), y).backward()
    return counter.get_total_flops() / batch


def machine_info(threads: int, mode: str, with_cuda: bool, tf32: bool = True) -> dict[str, Any]:
    import accelerate
    import torch

    reps = {"smoke": 1, "quick": 4, "full": 10}[mode]
    n = 512 if mode == "smoke" else 2048
    peak = measure_gemm_peak(threads, n=n, reps=reps)  # CPU: the TF32 flags do not apply, left as they are
    info: dict[str, Any] = {
        "cores": available_cores(),
        "threads": threads,
        **cpu_description(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerate": accelerate.__version__,
        "peak_gflops_fp32": peak["fp32"],
        "peak_gflops_bf16": peak["bf16"],
        "gemm_bf16_over_fp32": peak["bf16"] / peak["fp32"],
        "gemm_size": n,
        "precision_flags": peak["precision_flags"],  # this process's defaults (the CPU runs leave them alone)
        "cuda": torch.cuda.get_device_name(0) if with_cuda else None,
        "cuda_tf32": tf32 if with_cuda else None,
    }
    if with_cuda:
        gpu = measure_gemm_peak(threads, n=4096, reps=reps, device="cuda", tf32=tf32)
        info["peak_gflops_fp32_cuda"], info["peak_gflops_bf16_cuda"] = gpu["fp32"], gpu["bf16"]
        info["cuda_precision_flags"] = gpu["precision_flags"]  # == what both loops are given
        info["cuda_device_count"] = torch.cuda.device_count()
        info["cuda_pinned_device"] = first_visible_gpu()  # this process's cuda:0, where the GEMM peak ran
    return info
