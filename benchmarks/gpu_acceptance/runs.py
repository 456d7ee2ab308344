"""The children a GPU check runs and what they leave: the command of one ``scripts/train.py`` run (plainly on GPU 0,
or launched) or one ``probe`` program, with the flags the checks share; then, for the judges, a run's
``summary.json``, resolved config, exported weights and checkpoints, tensors compared across runs whatever wrapper
prefixes their keys carry, and the facts and problems every judge checks of a training run (its steps, a finite
loss, the device it ran on)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance.runner import FAIL, PASS, Context, Step

# ---- the children: train.py runs and probes -----------------------------------------------------------------------
FAST = ["--report-to", "none", "--no-plots", "--no-progress"]
# For comparisons: no TF32 (fp32 stays fp32), cuBLAS kernels that give the same result every time.
DETERMINISTIC = {"NVIDIA_TF32_OVERRIDE": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
GPU0 = {"CUDA_VISIBLE_DEVICES": "0"}  # a plain train.py on several visible GPUs would be DataParallel
CIFAR_SHAPED = ["--dataset", "synthetic", "--synthetic-channels", "3", "--synthetic-image-size", "32"]
SMALL_CIFAR = [*CIFAR_SHAPED, "--synthetic-size", "512", "--synthetic-test-size", "128"]
SGD = ["--optimizer", "sgd", "--lr", "0.05"]
BN_NET = "benchmarks.gpu_acceptance.models:bn_net"  # BatchNorm, deterministic cuDNN: runs compare at round-off


def train_step(
    label: str, ctx: Context, check: str, *args: str, run: str | None = None, config: str | None = None,
    launch_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
) -> Step:  # fmt: skip
    """``scripts/train.py`` writing to ``work/<check>/<run or label>``: plainly on GPU 0, or launched."""
    from accel_train.doctor.launching import script_cmd

    out = ctx.work / check / (run or label)
    argv = script_cmd("train.py", *args, *FAST, "--output-dir", str(out), config=config, launch_args=launch_args)
    return Step(label, argv, {**(GPU0 if config is None else {}), **(env or {})}, out)


def probe_step(label: str, ctx: Context, check: str, probe: str, *args: str, env: dict[str, str] | None = None) -> Step:
    """``python -m benchmarks.gpu_acceptance.probe PROBE ARGS --out work/<check>/<label>.json`` (``--out`` last)."""
    out = ctx.work / check / f"{label}.json"
    return Step(
        label,
        [sys.executable, "-m", "benchmarks.gpu_acceptance.probe", probe, *args, "--out", str(out)],
        {**GPU0, **(env or {})},
    )


# ---- what they leave ----------------------------------------------------------------------------------------------
PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")


def summary(run: Path) -> dict[str, Any]:
    return json.loads((Path(run) / "summary.json").read_text())


def resolved(run: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((Path(run) / "config.yaml").read_text()).get("resolved") or {}


def weights(run: Path, sub: str = "model") -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(run) / sub / "model.safetensors"))


def unwrapped(key: str) -> str:
    while key.startswith(PREFIXES):
        key = key.split(".", 1)[1]
    return key


def tensor_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over every tensor; infinity when the key sets or shapes differ (no comparison possible)."""
    a = {unwrapped(k): v for k, v in a.items()}
    b = {unwrapped(k): v for k, v in b.items()}
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        return math.inf
    return max(((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel()), default=0.0)


def flat_tensors(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor in nested dicts and lists, keyed by its path (an optimizer state dict)."""
    import torch

    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    found: dict[str, Any] = {}
    for k, v in items:
        found.update(flat_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    return found


def checkpoints(run: Path) -> list[tuple[int, Path]]:
    from accel_train.checkpoint.state import list_checkpoints

    return list_checkpoints(run)


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def verdict(problems: list[str], ok: str) -> tuple[str, str]:
    return (FAIL, "; ".join(problems)) if problems else (PASS, ok)


def fmt(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def run_facts(run: Path) -> dict[str, Any]:
    s, r = summary(run), resolved(run)
    keys = ("global_step", "eval_loss", "device", "mixed_precision", "distributed_type", "world_size")
    facts = {k: s.get(k) for k in keys}
    facts.update({k: r.get(k) for k in ("tf32", "channels_last", "data_on_device", "micro_batch", "accum_steps")})
    facts.update(global_batch=r.get("global_batch"), augment=r.get("augment"))
    return facts


def run_problems(name: str, f: dict[str, Any], steps: int, device: str = "cuda") -> list[str]:
    problems = []
    if f.get("global_step") != steps:
        problems.append(f"{name}: {f.get('global_step')} steps, expected {steps}")
    if not finite(f.get("eval_loss")):
        problems.append(f"{name}: eval_loss {f.get('eval_loss')!r} is not finite")
    if not str(f.get("device", "")).startswith(device):
        problems.append(f"{name}: ran on {f.get('device')!r}, not {device}")
    return problems
