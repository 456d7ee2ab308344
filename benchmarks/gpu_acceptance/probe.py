"""Programs the GPU acceptance (``scripts/gpu_acceptance.py``) runs on the GPU machine, one JSON file each.

    python -m benchmarks.gpu_acceptance.probe imports --out FILE          # import times; datasets/evaluate/CUDA usable?
    python -m benchmarks.gpu_acceptance.probe gemm --out FILE             # bf16 GEMM peak, resnet18's FLOPs per sample
    python -m benchmarks.gpu_acceptance.probe speedrun --work DIR --out FILE   # airbench's recipe after a warm-up run
    python -m benchmarks.gpu_acceptance.probe data-parallel --out FILE    # AutocastDataParallel with device_ids=[0, 0]
    python -m torch.distributed.run --nproc_per_node 2 -m benchmarks.gpu_acceptance.probe shared-gpu-rank TRAIN_ARGS

torch is imported inside each probe, so ``imports`` times it too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FAST = ["--report-to", "none", "--no-plots", "--no-progress"]


# ---- imports: what every training process pays, and whether the carried wheels work ----------------------------
def _timed(results: dict[str, Any], name: str, fn) -> Any:
    t0 = time.perf_counter()
    try:
        value = fn()
        results["seconds"][name] = round(time.perf_counter() - t0, 3)
        return value
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the report says what failed
        results["errors"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return None


def probe_imports(out: Path) -> int:
    import importlib

    results: dict[str, Any] = {"seconds": {}, "errors": {}, "versions": {}}
    for name in ("torch", "accelerate", "datasets", "evaluate", "accel_train.trainer"):
        before = "transformers" in sys.modules
        module = _timed(results, name, lambda n=name: importlib.import_module(n))
        if name == "evaluate":
            results["transformers_imported_by_evaluate"] = "transformers" in sys.modules and not before
        if module is not None and hasattr(module, "__version__"):
            results["versions"][name] = module.__version__

    def metric() -> float:
        from accel_train.metrics import load_metric

        m = load_metric("accuracy")
        m.add_batch(predictions=[0, 1, 1], references=[0, 1, 0])
        return m.compute()["accuracy"]

    results["metric_accuracy"] = _timed(results, "accuracy metric (build + compute)", metric)
    results["cuda"] = _cuda_info()
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _cuda_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"available": torch.cuda.is_available(), "torch": torch.__version__}
    if not info["available"]:
        return info
    facts = {
        "device": lambda: torch.cuda.get_device_name(0),
        "count": torch.cuda.device_count,
        "capability": lambda: list(torch.cuda.get_device_capability(0)),
        "memory_gib": lambda: round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        "cuda": lambda: torch.version.cuda,
        "cudnn": torch.backends.cudnn.version,
        "nccl": lambda: str(torch.cuda.nccl.version()),
    }
    for name, read in facts.items():
        try:
            info[name] = read()
        except Exception as exc:  # noqa: BLE001 - one unreadable fact is reported, the rest still are
            info[name] = f"unreadable: {type(exc).__name__}"
    return info


# ---- gemm: the peak MFU is measured against, and the model's FLOPs ---------------------------------------------
def model_train_flops_per_sample(model: str = "resnet18", channels: int = 3, size: int = 32) -> float:
    """FLOPs of one training step per sample: the forward pass counted by FlopCounterMode, times 3."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from accel_train.models import create_model

    with torch.device("meta"):
        net = create_model(model, num_classes=10, in_channels=channels, image_size=size)
        x = torch.randn(8, channels, size, size)
    with FlopCounterMode(display=False) as counter:
        net(x)
    return 3.0 * counter.get_total_flops() / 8


def bf16_gemm_peak_tflops(n: int = 8192, trials: int = 10, per_trial: int = 5) -> float:
    """This GPU's bf16 matmul rate: best of ``trials`` timings of ``per_trial`` n^3 products (CUDA events)."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    for _ in range(3):  # warm-up: kernel choice, clocks
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_trial):
            torch.matmul(a, b, out=c)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / per_trial)
    return 2.0 * n**3 / best / 1e12


def probe_gemm(out: Path, model: str) -> int:
    import torch

    result = {"model": model, "train_flops_per_sample": model_train_flops_per_sample(model)}
    result["peak_bf16_tflops"] = round(bf16_gemm_peak_tflops(), 1)
    result["device"] = torch.cuda.get_device_name(0)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


# ---- speedrun: real CIFAR-format files (so the recipe's crop+flip runs on the GPU), timed after a warm-up --------
def write_cifar_like(root: Path, n_train: int = 50000, n_test: int = 10000, seed: int = 0) -> Path:
    """``root/cifar-10-batches-py`` in CIFAR-10's own format (random pixels and labels): ``--dataset cifar10``
    reads it like the real files, so the run holds it on the GPU and augments it there (crop + flip)."""
    import pickle

    import numpy as np

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [(f"data_batch_{i}", n_train // 5) for i in range(1, 6)] + [("test_batch", n_test)]
    for name, n in names:
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(n)],
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    meta = {b"num_cases_per_batch": n_train // 5, b"label_names": [f"class{i}".encode() for i in range(10)]}
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({**meta, b"num_vis": 3072}, f, protocol=2)
    return folder


def probe_speedrun(
    work: Path, out: Path, warmup_steps: int, sizes: tuple[int, int] = (50000, 10000), extra: tuple[str, ...] = ()
) -> int:
    """The recipe twice in this process: ``warmup_steps`` steps (cuDNN autotunes every training and evaluation
    shape), then the full run, whose ``train_time_s`` is the figure. Both on the same CIFAR-format files.
    ``sizes`` (train, test) and ``extra`` flags make it small for the CPU test."""
    import torch

    from accel_train.config import parse_config
    from accel_train.loop import fit

    t0 = time.perf_counter()
    write_cifar_like(work / "data", *sizes)
    data_s = time.perf_counter() - t0
    common = ["--config", str(REPO / "configs" / "airbench_cifar10.yaml"), "--data-dir", str(work / "data")]
    common += ["--mixed-precision", "bf16", *FAST, *extra]
    warm_args = ["--max-steps", str(warmup_steps), "--warmup-steps", str(max(1, warmup_steps // 5))]
    t0 = time.perf_counter()
    warm = fit(parse_config([*common, *warm_args, "--output-dir", str(work / "warmup")]))
    warm_wall = time.perf_counter() - t0
    fit(parse_config([*common, "--output-dir", str(work / "run")]))
    result = {
        "data_write_s": round(data_s, 2),
        "warmup_steps": warm.get("global_step"),
        "warmup_train_time_s": warm.get("train_time_s"),
        "warmup_wall_s": round(warm_wall, 2),
        "same_process": True,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "run_dir": str(work / "run"),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


# ---- DataParallel through accel_train's wrapper, two replicas on GPU 0 -----------------------------------------
def probe_data_parallel(out: Path) -> int:
    """``AutocastDataParallel(device_ids=[0, 0])``: a bf16 forward (replica threads, their dtype) and an fp32
    training step whose gradients must equal one plain module's. torch's refusal is recorded, not raised."""
    import copy
    import threading

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from accel_train.models import create_model
    from accel_train.runtime import AutocastDataParallel

    torch.manual_seed(0)
    model = create_model("lenet", 10, 1, 28).cuda()
    ref = copy.deepcopy(model)
    seen, lock = [], threading.Lock()

    def hook(module, inputs, output):
        with lock:
            seen.append((threading.get_ident(), output.device.type, output.device.index, str(output.dtype)))

    [m for m in model.modules() if isinstance(m, nn.Linear)][-1].register_forward_hook(hook)
    x, y = torch.randn(64, 1, 28, 28, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
    result: dict[str, Any] = {"device_ids": [0, 0], "torch": torch.__version__}
    try:
        dp = AutocastDataParallel(model, device_ids=[0, 0], autocast_dtype=torch.bfloat16)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            dp(x)
        bf16 = list(seen)
        dp.autocast_dtype = None
        F.cross_entropy(dp(x), y).backward()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - torch refusing duplicate device ids is an answer, not a crash
        result["refused"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
        out.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    F.cross_entropy(ref(x), y).backward()
    pairs = list(zip(model.parameters(), ref.parameters(), strict=True))
    result.update(
        replica_calls=len(bf16),
        replica_threads=len({t for t, *_ in bf16}),
        main_thread_ran_a_replica=threading.get_ident() in {t for t, *_ in bf16},
        replica_devices=sorted({f"{kind}:{index}" for _, kind, index, _ in bf16}),
        replica_dtypes=sorted({dtype for *_, dtype in bf16}),
        grad_max_abs_diff=max((p.grad - q.grad).abs().max().item() for p, q in pairs),
        grad_max_abs=max(q.grad.abs().max().item() for _, q in pairs),
    )
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


# ---- two torchrun ranks on one GPU ----------------------------------------------------------------------------
def shared_gpu_rank(train_args: list[str]) -> None:
    """One rank of ``torchrun --nproc_per_node N`` where every rank trains on GPU 0: ``scripts/train.py``'s own
    code, with the process group on gloo (NCCL refuses two ranks on one device) and accelerate told so.

    accelerate puts rank ``LOCAL_RANK`` on ``cuda:LOCAL_RANK``, so each rank is told it is local rank 0 of 1;
    ``RANK`` and ``WORLD_SIZE`` stay, and the group is joined here, before accel_train would join it with NCCL.
    """
    import torch
    import torch.distributed as dist
    from accelerate.state import PartialState

    os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = "0", "1"
    if torch.cuda.is_available():  # (without CUDA, as in a CPU try-out, accel_train trains gloo ranks on the CPU)
        torch.cuda.set_device(0)
    dist.init_process_group("gloo")  # env:// from torchrun
    prepare = PartialState._prepare_backend

    def gloo(self, *args, **kwargs):  # accelerate's gathers take gloo's path (no all_gather_into_tensor)
        backend, kind = prepare(self, *args, **kwargs)
        return ("gloo" if backend == "nccl" else backend), kind

    PartialState._prepare_backend = gloo
    from accel_train.commands.train import cli_main

    sys.argv = ["train.py", *train_args]
    cli_main()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["shared-gpu-rank"]:
        shared_gpu_rank(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=["imports", "gemm", "speedrun", "data-parallel"])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--work", help="speedrun: folder for the data and the runs")
    parser.add_argument("--warmup-steps", type=int, default=60)
    parser.add_argument("--model", default="resnet18", help="gemm: the model whose FLOPs per sample are counted")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.probe == "imports":
        return probe_imports(out)
    if args.probe == "gemm":
        return probe_gemm(out, args.model)
    if args.probe == "speedrun":
        return probe_speedrun(Path(args.work), out, args.warmup_steps)
    return probe_data_parallel(out)


if __name__ == "__main__":
    sys.exit(main())
