"""Benchmark the portable loop on this machine against a hand-written floor.

``python -m benchmarks`` is the command line; everything is measured here:

* **portable loop**: ``scripts/train.py`` launched as users launch it (``python
  scripts/train.py``; ``--mixed-precision bf16`` or ``accelerate launch`` with
  ``cpu_bf16.yaml``; ``accelerate launch`` with ``multi_cpu.yaml`` for 2 gloo
  ranks) on MNIST-shaped synthetic data. Steady-state ``train_samples_per_s``
  and ``data_wait_fraction`` come from its ``summary.json``; peak RSS from a
  tiny wrapper that runs ``train.py`` through ``runpy`` and writes
  ``ru_maxrss`` of each rank before the process exits.
* **plain loop** (the floor): a hand-written PyTorch loop in a fresh process,
  same model, same synthetic uint8 tensors in memory, same global batch, same
  threads, Adam, cross-entropy (and the same gradient clipping as the loop's
  default), timed per phase: data, forward+backward, optimizer and, for DDP,
  gradient synchronisation (``no_sync`` steps vs synced steps).
* **bf16 study**: all precision/memory-format variants of a model stepped
  round-robin in ONE process (so machine noise hits them alike), plus a
  profile of where forward+backward time goes.
* **time to accuracy**: launch to 97% test accuracy, ``scripts/train.py``
  defaults vs the seed-000 recipe (per-sample PIL images + ``ToTensor``, a
  DataLoader with 2 workers, a ``.to(device)`` per step, mnist_cnn).
* machine: cores, versions, fp32/bf16 GEMM peak (same threads), load average.

Children are started with ``python -m benchmarks.bench --child KIND SPEC``.
Nothing here asserts a goal: goals are evaluated and reported.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel_train.launch import CONFIG_DIR, REPO, accelerate_launch, child_env
from accel_train.run_dir import pid_alive
from accel_train.runtime import available_cores

TRAIN_SCRIPT = REPO / "scripts" / "train.py"
MODELS = ("mnist_cnn", "lenet", "resnet18", "tv_resnet18")
STUDY_MODELS = ("mnist_cnn", "resnet18")  # the bf16 investigation
# --quick (without --models/--setups) measures these cells only: every train.py launch costs ~6 s of imports
# and set-up on a 2-core machine, so all 12 cells plus time to accuracy cannot fit in 3 minutes.
QUICK_CELLS = {
    "cpu_fp32": MODELS,  # portable vs plain, every model
    "cpu_bf16": STUDY_MODELS,  # the bf16 question
    "gloo_2proc": ("mnist_cnn", "lenet"),  # DDP scaling on MNIST-sized models
    "cuda_fp32": MODELS,  # only where a GPU is visible
    "cuda_bf16": STUDY_MODELS,
}
WARMUP_STEPS = 5  # == accel_train.trainer.WARMUP_STEPS_EXCLUDED: the plain loop excludes the same steps
WINDOW_STEPS = 10  # == TrainConfig.log_every's default: the portable logs samples/s over such windows
TARGET_ACCURACY = 0.97
SYNTHETIC_SEED = 42  # TrainConfig.seed's default: the portable's synthetic data are generated from it
SYNTHETIC_MEAN, SYNTHETIC_STD = 0.5, 0.25  # accel_train.data.synthetic's normalisation
DEFAULT_LR = 2e-3  # TrainConfig.lr
DEFAULT_CLIP = 1.0  # TrainConfig.max_grad_norm
SEED000_LR, SEED000_BATCH, SEED000_WORKERS = 1e-3, 64, 2
GOAL_RATIO_VS_PLAIN = 0.97
GOAL_DATA_WAIT = 0.05
GOAL_DDP_SCALING = 0.9
GOAL_BF16_SPEEDUP = 1.3
GOAL_T2A_SPEEDUP = 5.0
GOAL_HELP_S = 2.0


# --------------------------------------------------------------------------- what is measured


@dataclass(frozen=True)
class Setup:
    """One way of running: processes, precision, memory format, device."""

    name: str
    processes: int
    precision: str  # "fp32" | "bf16"
    channels_last: bool = False
    device: str = "cpu"
    study_only: bool = False  # only for STUDY_MODELS (the bf16 investigation)

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"


SETUPS: tuple[Setup, ...] = (
    Setup("cpu_fp32", 1, "fp32"),
    Setup("cpu_bf16", 1, "bf16"),
    Setup("gloo_2proc", 2, "fp32"),
    Setup("cpu_fp32_cl", 1, "fp32", channels_last=True, study_only=True),
    Setup("cpu_bf16_cl", 1, "bf16", channels_last=True, study_only=True),
)
CUDA_SETUPS: tuple[Setup, ...] = (
    Setup("cuda_fp32", 1, "fp32", device="cuda"),
    Setup("cuda_bf16", 1, "bf16", device="cuda"),
)


@dataclass(frozen=True)
class ModelPlan:
    """Global batch and measured steps (after WARMUP_STEPS) per mode."""

    batch: int
    steps_quick: int
    steps_full: int
    steps_smoke: int = 5


MODEL_PLANS: dict[str, ModelPlan] = {
    "mnist_cnn": ModelPlan(32, 4, 40),
    "lenet": ModelPlan(32, 20, 300),
    "resnet18": ModelPlan(16, 2, 20),  # 28x28 with no stem downsampling: ~2.7 GFLOP/sample
    "tv_resnet18": ModelPlan(32, 4, 50),
}


@dataclass
class BenchOptions:
    out: Path
    quick: bool = False
    smoke: bool = False  # tiny: lenet, cpu_fp32, a few steps, no time to accuracy, no study (tests)
    data_dir: str | None = None
    models: tuple[str, ...] | None = None
    setups: tuple[str, ...] | None = None
    repeats: int | None = None
    time_to_accuracy: bool = True
    keep_runs: bool = False
    log: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr, flush=True))

    @property
    def mode(self) -> str:
        return "smoke" if self.smoke else "quick" if self.quick else "full"

    def steps(self, model: str) -> int:
        plan = MODEL_PLANS[model]
        return {"smoke": plan.steps_smoke, "quick": plan.steps_quick, "full": plan.steps_full}[self.mode]

    def n_repeats(self) -> int:
        return self.repeats or (2 if self.mode == "full" else 1)


# --------------------------------------------------------------------------- small helpers


def _median(values: Sequence[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- the machine


def cpu_description() -> dict[str, Any]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "cpu": model,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "avx512f": "avx512f" in flags,
    }


def measure_gemm_peak(threads: int, n: int = 2048, reps: int = 5, device: str = "cpu") -> dict[str, float]:
    """Best-of-``reps`` GFLOP/s of an n x n matmul in fp32 and bf16, interleaved (same noise for both)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
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
            "threads": threads,
        }
    finally:
        torch.set_num_threads(previous)


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


def time_train_help(runs: int = 3) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(TRAIN_SCRIPT), "--help"],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            return {"error": _tail(proc.stderr), "runs_s": times}
    return {"median_s": statistics.median(times), "runs_s": times}


def machine_info(threads: int, mode: str, with_cuda: bool) -> dict[str, Any]:
    import accelerate
    import torch

    reps = {"smoke": 1, "quick": 4, "full": 10}[mode]
    n = 512 if mode == "smoke" else 2048
    peak = measure_gemm_peak(threads, n=n, reps=reps)
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
        "cuda": torch.cuda.get_device_name(0) if with_cuda else None,
    }
    if with_cuda:
        gpu = measure_gemm_peak(threads, n=4096, reps=reps, device="cuda")
        info["peak_gflops_fp32_cuda"], info["peak_gflops_bf16_cuda"] = gpu["fp32"], gpu["bf16"]
    return info


# --------------------------------------------------------------------------- the portable loop

_WRAPPER = '''\
"""Generated by benchmarks.bench: run scripts/train.py exactly as launched, then record peak memory."""
import json, os, resource, runpy, sys

TRAIN = {train!r}
sys.path.insert(0, {repo!r})


def _record():
    out = os.environ.get("ACCEL_BENCH_MEM_DIR")
    if not out:
        return
    rank = int(os.environ.get("RANK", "0") or 0)
    info = {{"rank": rank, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        info["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    with open(os.path.join(out, "rank%d.json" % rank), "w") as fh:
        json.dump(info, fh)


import accel_train.runtime as _runtime  # multi-process runs leave through finish_process (os._exit)

_finish = _runtime.finish_process


def _finish_and_record(exit_code=0):
    _record()
    _finish(exit_code)


_runtime.finish_process = _finish_and_record
sys.argv[0] = TRAIN
try:
    runpy.run_path(TRAIN, run_name="__main__")
finally:
    _record()
'''


def write_wrapper(directory: Path) -> Path:
    path = directory / "train_with_memory.py"
    path.write_text(_WRAPPER.format(train=str(TRAIN_SCRIPT), repo=str(REPO)))
    return path


def synthetic_size(batch: int, total_steps: int) -> int:
    """One spare batch: the measured steps never reach an epoch end (no epoch-end evaluation)."""
    return batch * (total_steps + 1)


def portable_command(
    setup: Setup, model: str, batch: int, steps: int, run_dir: Path, wrapper: Path, mode: str
) -> list[str]:
    total = WARMUP_STEPS + steps
    args = [
        "--dataset",
        "synthetic",
        "--model",
        model,
        "--max-steps",
        str(total),
        "--global-batch-size",
        str(batch),
        "--synthetic-size",
        str(synthetic_size(batch, total)),
        "--synthetic-test-size",
        "64",
        "--report-to",
        "none",
        "--no-plots",
        "--no-progress",
        "--no-checkpoint-epochs",
        "--output-dir",
        str(run_dir),
        "--overwrite",
    ]
    if setup.channels_last:
        args.append("--channels-last")
    if setup.processes > 1:
        return [*accelerate_launch("multi_cpu.yaml"), str(wrapper), *args]
    if setup.bf16 and mode == "full" and setup.device == "cpu":
        return [*accelerate_launch("cpu_bf16.yaml"), str(wrapper), *args]
    if setup.bf16:
        args += ["--mixed-precision", "bf16"]
    return [sys.executable, str(wrapper), *args]


def _display_command(cmd: list[str]) -> str:
    """The command as a user would type it (the memory wrapper shown as scripts/train.py)."""
    shown = []
    for part in cmd:
        if part == sys.executable:
            shown.append("python")
        elif part.endswith("train_with_memory.py"):
            shown.append("scripts/train.py")
        elif part.startswith(str(CONFIG_DIR)):
            shown.append(str(Path(part).relative_to(REPO)))
        elif "/" in part and ("portable_" in part or part.startswith(tempfile.gettempdir())):
            shown.append("OUT")
        else:
            shown.append(part)
    text = " ".join(shown)
    return text.replace("python -m accelerate.commands.accelerate_cli launch", "accelerate launch")


def run_portable(setup: Setup, model: str, opts: BenchOptions, work: Path, wrapper: Path, tag: str) -> dict[str, Any]:
    plan = MODEL_PLANS[model]
    run_dir = work / f"portable_{model}_{setup.name}_{tag}"
    mem_dir = work / f"mem_{model}_{setup.name}_{tag}"
    mem_dir.mkdir(parents=True, exist_ok=True)
    cmd = portable_command(setup, model, plan.batch, opts.steps(model), run_dir, wrapper, opts.mode)
    env = child_env({"ACCEL_BENCH_MEM_DIR": str(mem_dir)})
    load_before = os.getloadavg()[0]
    if setup.device == "cpu" and setup.processes == 1:  # multi_cpu.yaml hides the GPUs itself
        env["CUDA_VISIBLE_DEVICES"] = ""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800 if opts.mode == "full" else 400
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "command": _display_command(cmd)}
    out: dict[str, Any] = {
        "command": _display_command(cmd),
        "wall_s": time.perf_counter() - t0,
        "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    summary_path = run_dir / "summary.json"
    if proc.returncode != 0 or not summary_path.is_file():
        out["error"] = f"exit {proc.returncode}: {_tail(proc.stderr)}"
        return out
    summary = _load_json(summary_path)
    expected = "bf16" if setup.bf16 else "no"
    if summary.get("mixed_precision") != expected or summary.get("world_size") != setup.processes:
        out["error"] = (
            f"the run did not use the intended setup: mixed_precision {summary.get('mixed_precision')}, "
            f"world_size {summary.get('world_size')}"
        )
    ranks = [_load_json(p) for p in sorted(mem_dir.glob("rank*.json"))]
    windows = []  # train events every log_every (10) steps; the first window holds the warm-up steps
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "train" and record.get("step", 0) > WINDOW_STEPS and "samples_per_s" in record:
                windows.append(record["samples_per_s"])
    out.update(
        {
            "samples_per_s": summary.get("train_samples_per_s"),
            "window_samples_per_s": windows,
            "data_wait_fraction": summary.get("data_wait_fraction"),
            "threads_per_process": summary.get("threads_per_process"),
            "global_batch": summary.get("global_batch"),
            "peak_rss_mb": max((r["peak_rss_mb"] for r in ranks), default=None),
            "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in ranks],
            "peak_cuda_mb": max((r["peak_cuda_mb"] for r in ranks if "peak_cuda_mb" in r), default=None),
        }
    )
    if not opts.keep_runs:
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(mem_dir, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- the plain loop (runs in children)


class PlainTrainer:
    """The hand-written loop: synthetic uint8 tensors in memory, normalised per batch, Adam, cross-entropy.

    ``batch`` is the global batch; under DDP each rank takes its contiguous share of
    every global batch (as Accelerate shards batches).
    """

    def __init__(
        self,
        model: str,
        batch: int,
        total_steps: int,
        *,
        bf16: bool = False,
        channels_last: bool = False,
        fused: bool | None = None,
        clip: float = DEFAULT_CLIP,
        device: str = "cpu",
        seed: int = SYNTHETIC_SEED,
    ):
        import torch
        import torch.distributed as dist

        from accel_train.data.synthetic import make_synthetic
        from accel_train.models import create_model

        self.torch = torch
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.device = torch.device(device)
        self.batch, self.micro = batch, batch // self.world
        self.bf16, self.clip = bf16, clip
        n = synthetic_size(batch, total_steps)
        self.images, self.labels = make_synthetic(n, 10, 1, 28, seed=seed)  # the portable's training data
        self.order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        torch.manual_seed(seed)
        net = create_model(model, 10, 1, 28).to(self.device)
        if channels_last:
            net = net.to(memory_format=torch.channels_last)
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(net)
        self.model = net
        kwargs = {} if fused is None else {"fused": fused}
        self.optimizer = torch.optim.Adam(net.parameters(), lr=DEFAULT_LR, **kwargs)
        self.scale = 1.0 / (255.0 * SYNTHETIC_STD)
        self.shift = -SYNTHETIC_MEAN / SYNTHETIC_STD
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

    def batch_at(self, step: int):
        start = step * self.batch + self.rank * self.micro
        idx = self.order[start : start + self.micro]
        return self.images.index_select(0, idx), self.labels.index_select(0, idx)

    def forward_backward(self, images, labels, sync: bool = True):
        import torch.nn.functional as F

        torch = self.torch
        images, labels = images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
        no_sync = self.world > 1 and not sync
        with self.model.no_sync() if no_sync else nullcontext():
            x = images.to(torch.float32).mul_(self.scale).add_(self.shift).contiguous(memory_format=self.memory_format)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model(x)
            loss = F.cross_entropy(logits.float(), labels)
            loss.backward()
        return loss

    def optimizer_step(self) -> None:
        if self.clip > 0:
            self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self, step: int, sync: bool = True) -> tuple[float, float, float]:
        """One timed step: (data, forward+backward, optimizer) seconds."""
        t0 = time.perf_counter()
        images, labels = self.batch_at(step)
        t1 = time.perf_counter()
        self.forward_backward(images, labels, sync)
        self._sync()
        t2 = time.perf_counter()
        self.optimizer_step()
        self._sync()
        return t1 - t0, t2 - t1, time.perf_counter() - t2


def _window_rates(step_times: Sequence[float], batch: int, window: int = WINDOW_STEPS) -> list[float]:
    """samples/s of consecutive ``window``-step windows (the portable logs such windows every log_every steps)."""
    return [batch * window / sum(step_times[i : i + window]) for i in range(0, len(step_times) - window + 1, window)]


def _plain_measure(run: dict[str, Any]) -> dict[str, Any]:
    steps, probe = run["steps"], run.get("sync_probe_steps", 0)
    total = WARMUP_STEPS + steps + 2 * probe
    trainer = PlainTrainer(
        run["model"],
        run["batch"],
        total,
        bf16=run.get("bf16", False),
        channels_last=run.get("channels_last", False),
        device=run.get("device", "cpu"),
    )
    for i in range(WARMUP_STEPS):
        trainer.step(i)
    data = fb = opt = 0.0
    step_times = []
    for i in range(WARMUP_STEPS, WARMUP_STEPS + steps):
        d, f, o = trainer.step(i)
        data, fb, opt = data + d, fb + f, opt + o
        step_times.append(d + f + o)
    sync_s = 0.0
    if trainer.world > 1 and probe:
        # gradient synchronisation: backward with DDP's all-reduce vs backward under no_sync, alternated
        synced, local = [], []
        for j in range(2 * probe):
            _, f, _ = trainer.step(WARMUP_STEPS + steps + j, sync=j % 2 == 0)
            (synced if j % 2 == 0 else local).append(f)
        sync_s = max(0.0, statistics.median(synced) - statistics.median(local))
        sync_s = min(sync_s, fb / steps)  # a noisy probe must not claim more than the whole backward
    scalar_allreduce_ms = None
    if trainer.world > 1:  # what one extra scalar collective per step costs (e.g. a stop-flag all-reduce)
        import torch.distributed as dist

        flag = trainer.torch.zeros(1)
        dist.all_reduce(flag)
        t0 = time.perf_counter()
        for _ in range(20):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        scalar_allreduce_ms = (time.perf_counter() - t0) / 20 * 1000
    total_s = data + fb + opt
    per_step = {
        k: 1000.0 * v / steps
        for k, v in (
            ("data_wait", data),
            ("forward_backward", fb - sync_s * steps),
            ("sync", sync_s * steps),
            ("optimizer", opt),
            ("total", total_s),
        )
    }
    out = {
        "model": run["model"],
        "samples_per_s": run["batch"] * steps / total_s,
        "window_samples_per_s": _window_rates(step_times, run["batch"]),
        "data_wait_fraction": data / total_s,
        "step_breakdown_ms": per_step,
        "scalar_allreduce_ms": scalar_allreduce_ms,
        "threads": trainer.torch.get_num_threads(),
        "world_size": trainer.world,
    }
    if trainer.device.type == "cuda":
        out["peak_cuda_mb"] = trainer.torch.cuda.max_memory_allocated() / 2**20
    return out


def _write_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _child_server(spec: dict[str, Any]) -> None:
    """A plain-loop process (or DDP rank) that stays up and measures on request.

    The parent writes ``cmd_<k>.json``; every rank runs it and writes
    ``res_<k>.rank<r>.json``. One start-up per setup, yet each plain measurement
    is taken right next to the portable run it is compared with.
    """
    import resource

    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    torch.set_num_threads(spec.get("threads") or max(1, available_cores() // local_world))  # == runtime's rule
    if world > 1:
        dist.init_process_group("gloo")
    rank = int(os.environ.get("RANK", "0") or 0)
    directory, parent = Path(spec["dir"]), int(spec["parent_pid"])
    k = 0
    while True:
        cmd_path = directory / f"cmd_{k}.json"
        while not cmd_path.exists():
            if not pid_alive(parent):
                os._exit(1)
            time.sleep(0.05)
        command = _load_json(cmd_path)
        if command.get("exit"):
            break
        try:
            result = _study(command) if command.get("kind") == "study" else _plain_measure(command)
        except Exception as exc:  # report it, keep serving
            result = {"model": command.get("model"), "error": f"{type(exc).__name__}: {exc}"}
        result["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        _write_atomic(directory / f"res_{k}.rank{rank}.json", result)
        k += 1
    if world > 1:
        from accel_train.runtime import finish_process

        dist.barrier()
        dist.destroy_process_group()
        finish_process(0)


class PlainServer:
    """The parent's handle on one plain-loop process (1 process, or ``processes`` torchrun ranks)."""

    def __init__(self, setup: Setup, work: Path, tag: str, threads: int | None = None):
        self.setup = setup
        self.dir = work / f"plain_{setup.name}_{tag}"
        self.dir.mkdir(parents=True, exist_ok=True)
        spec_path = self.dir / "spec.json"
        _write_atomic(spec_path, {"dir": str(self.dir), "parent_pid": os.getpid(), "threads": threads})
        child = ["-m", "benchmarks.bench", "--child", "server", str(spec_path)]
        if setup.processes > 1:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(setup.processes),
                *child,
            ]
        else:
            cmd = [sys.executable, *child]
        env = child_env()
        if setup.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        self.log_path = self.dir / "output.txt"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.k = 0

    def _output_tail(self) -> str:
        try:
            return _tail(self.log_path.read_text())
        except OSError:
            return ""

    def request(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        k = self.k
        self.k += 1
        if self.proc.poll() is not None:
            return {
                "model": command.get("model"),
                "error": f"plain loop process exited {self.proc.returncode}: {self._output_tail()}",
            }
        _write_atomic(self.dir / f"cmd_{k}.json", command)
        wanted = [self.dir / f"res_{k}.rank{r}.json" for r in range(self.setup.processes)]
        deadline = time.monotonic() + timeout
        while not all(p.exists() for p in wanted):
            if self.proc.poll() is not None:
                return {
                    "model": command.get("model"),
                    "error": f"plain loop process exited {self.proc.returncode}: {self._output_tail()}",
                }
            if time.monotonic() > deadline:
                self.proc.kill()
                return {"model": command.get("model"), "error": f"timed out after {timeout:.0f}s"}
            time.sleep(0.02)
        return _load_json(wanted[0])  # rank 0: global samples/s; its phase times

    def close(self) -> None:
        if self.proc.poll() is None:
            _write_atomic(self.dir / f"cmd_{self.k}.json", {"exit": True})
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class ServerPool:
    """One plain-loop server per (processes, device): fp32, bf16 and channels_last are per-request flags."""

    def __init__(self, work: Path):
        self.work = work
        self.servers: dict[tuple[int, str], PlainServer] = {}

    def get(self, setup: Setup) -> PlainServer:
        key = (setup.processes, setup.device)
        if key not in self.servers:
            self.servers[key] = PlainServer(setup, self.work, f"{setup.processes}p_{setup.device}")
        return self.servers[key]

    def close(self, processes: int | None = None) -> None:
        for key in [k for k in self.servers if processes is None or k[0] == processes]:
            self.servers.pop(key).close()


def plain_command(setup: Setup, model: str, opts: BenchOptions) -> dict[str, Any]:
    return {
        "model": model,
        "batch": MODEL_PLANS[model].batch,
        "steps": opts.steps(model),
        "bf16": setup.bf16,
        "channels_last": setup.channels_last,
        "device": setup.device,
        "sync_probe_steps": (6 if opts.mode == "full" else 1) if setup.processes > 1 else 0,
    }


# --------------------------------------------------------------------------- the bf16 study

STUDY_VARIANTS: tuple[dict[str, Any], ...] = (
    {"name": "fp32", "bf16": False, "channels_last": False},
    {"name": "bf16", "bf16": True, "channels_last": False},
    {"name": "fp32+channels_last", "bf16": False, "channels_last": True},
    {"name": "bf16+channels_last", "bf16": True, "channels_last": True},
    {"name": "fp32+fused_adam", "bf16": False, "channels_last": False, "fused": True},
    {"name": "bf16+channels_last+fused_adam", "bf16": True, "channels_last": True, "fused": True},
)
PROFILED_VARIANTS = ("fp32", "bf16", "bf16+channels_last")


def _op_category(name: str) -> str:
    if "conv" in name:
        return "convolution"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "matmul"
    if name in ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous"):
        return "cast/copy"
    if "batch_norm" in name:
        return "batch_norm"
    return "other"


def _study(spec: dict[str, Any]) -> dict[str, Any]:
    """All variants of one model stepped round-robin in this process (same noise for all); fwd+bwd profile."""
    from torch.profiler import ProfilerActivity, profile

    model, batch, rounds = spec["model"], spec["batch"], spec["rounds"]
    per_round, warm = 1, 2  # variants alternate every step: machine noise hits all of them alike
    total = warm + rounds * per_round + 1
    trainers = {
        v["name"]: PlainTrainer(
            model, batch, total, bf16=v["bf16"], channels_last=v["channels_last"], fused=v.get("fused")
        )
        for v in spec["variants"]
    }
    times: dict[str, dict[str, list[float]]] = {k: {"step": [], "fb": [], "opt": []} for k in trainers}
    for trainer in trainers.values():
        for i in range(warm):
            trainer.step(i)
    step = warm
    for _ in range(rounds):
        for name, trainer in trainers.items():
            for i in range(per_round):
                d, f, o = trainer.step(step + i)
                times[name]["step"].append(d + f + o)
                times[name]["fb"].append(f)
                times[name]["opt"].append(o)
        step += per_round
    results = []
    for v in spec["variants"]:
        t = times[v["name"]]
        results.append(
            {
                **v,
                "step_ms": 1000 * statistics.median(t["step"]),
                "forward_backward_ms": 1000 * statistics.median(t["fb"]),
                "optimizer_ms": 1000 * statistics.median(t["opt"]),
            }
        )
    profiles: dict[str, Any] = {}
    for name in PROFILED_VARIANTS if spec.get("profile") else ():
        if name not in trainers:
            continue
        trainer = trainers[name]
        images, labels = trainer.batch_at(step)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.forward_backward(images, labels)
        trainer.optimizer_step()
        events = [(e.key, e.self_cpu_time_total / 1000.0) for e in prof.key_averages()]
        categories: dict[str, float] = {}
        for key, ms in events:
            categories[_op_category(key)] = categories.get(_op_category(key), 0.0) + ms
        top = sorted(events, key=lambda e: -e[1])[:6]
        profiles[name] = {
            "forward_backward_ms": sum(ms for _, ms in events),
            "categories_ms": {k: round(v, 2) for k, v in sorted(categories.items())},
            "top_ops_ms": [[k, round(ms, 2)] for k, ms in top],
        }
    return {
        "model": model,
        "batch": batch,
        "rounds": rounds,
        "steps_per_round": per_round,
        "variants": results,
        "profiles": profiles,
    }


def _study_variants(model: str, mode: str) -> list[dict[str, Any]]:
    if mode == "full":
        return list(STUDY_VARIANTS)
    chosen = [v for v in STUDY_VARIANTS if not v.get("fused")]
    if model == "mnist_cnn":  # its step is dominated by Adam on a 25.7M-parameter dense layer
        chosen.append(next(v for v in STUDY_VARIANTS if v["name"] == "fp32+fused_adam"))
    return chosen


def run_study(models: Sequence[str], opts: BenchOptions, pool: ServerPool) -> list[dict[str, Any]]:
    rounds = {"smoke": 1, "quick": 2, "full": 8}[opts.mode]
    server = pool.get(SETUPS[0])  # 1 process, all cores
    out = []
    for model in models:
        opts.log(f"bench: bf16 study ({model}: fp32/bf16 x NCHW/channels_last, round-robin in one process)")
        variants = _study_variants(model, opts.mode)
        result = server.request(
            {
                "kind": "study",
                "model": model,
                "batch": MODEL_PLANS[model].batch,
                "rounds": rounds,
                "variants": variants,
                "profile": True,
            },
            timeout=1800,
        )
        result.setdefault("model", model)
        base = next((v["step_ms"] for v in result.get("variants", []) if v["name"] == "fp32"), None)
        for v in result.get("variants", []):
            v["speedup_vs_fp32"] = _ratio(base, v["step_ms"])
        out.append(result)
    return out


# --------------------------------------------------------------------------- time to accuracy


def mnist_available(data_dir: str | None) -> bool:
    if not data_dir:
        return False
    from accel_train.data.vision import MNIST_FILES

    raw = Path(data_dir).expanduser() / "MNIST" / "raw"
    names = [n for pair in MNIST_FILES.values() for n in pair]
    return all((raw / n).is_file() or (raw / f"{n}.gz").is_file() for n in names)


def time_to_accuracy_portable(dataset: str, data_dir: str | None, work: Path, cap_s: float) -> dict[str, Any]:
    """``python scripts/train.py`` with its defaults; seconds from launch to the first eval >= target.

    metrics.jsonl is polled while the run trains; each eval line is timestamped when it
    appears (its ``time_s`` counts from the run's logger start, after imports and data).
    The run is stopped (SIGTERM: it checkpoints and exits) once the target is reached.
    """
    run_dir = work / f"t2a_portable_{dataset}"
    eval_every = 5 if dataset == "digits" else 100
    args = ["--output-dir", str(run_dir), "--overwrite", "--eval-every", str(eval_every), "--no-plots"]
    if dataset != "digits":
        args += ["--dataset", dataset, "--data-dir", str(data_dir)]
    cmd = [sys.executable, str(TRAIN_SCRIPT), *args]
    metrics = run_dir / "metrics.jsonl"
    evals: list[dict[str, Any]] = []
    reached: dict[str, Any] | None = None
    t_launch = time.perf_counter()
    err_path = work / f"t2a_portable_{dataset}.err"
    with open(err_path, "w") as err:  # a file, not a pipe: a chatty child can never block on it
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL, stderr=err)
    offset = 0
    stopped_by = None
    while True:
        done = proc.poll() is not None
        now = time.perf_counter() - t_launch
        if metrics.is_file():
            with open(metrics) as fh:
                fh.seek(offset)
                chunk = fh.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete)
            for line in complete.splitlines():
                record = json.loads(line)
                if record.get("event") != "eval":
                    continue
                entry = {
                    "step": record["step"],
                    "epoch": record["epoch"],
                    "accuracy": record["eval_accuracy"],
                    "time_s": now,
                    "logger_time_s": record.get("time_s"),
                }
                evals.append(entry)
                if reached is None and record["eval_accuracy"] >= TARGET_ACCURACY:
                    reached = entry
        if done:
            break
        if reached is not None or now > cap_s:
            stopped_by = "target reached" if reached is not None else f"cap of {cap_s:.0f}s"
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            continue
        time.sleep(0.05)
    stderr = err_path.read_text(errors="replace")
    out: dict[str, Any] = {
        "recipe": "scripts/train.py defaults (lenet, batch 32, Adam 2e-3 cosine, in-memory uint8 batches)",
        "command": " ".join(["python", "scripts/train.py", *[("OUT" if a == str(run_dir) else a) for a in args]]),
        "reached": reached is not None,
        "time_to_target_s": reached["time_s"] if reached else None,
        "train_time_to_target_s": reached["logger_time_s"] if reached else None,
        "step": reached["step"] if reached else None,
        "epoch": reached["epoch"] if reached else None,
        "best_accuracy": max((e["accuracy"] for e in evals), default=None),
        "evals": len(evals),
        "stopped": stopped_by,
        "wall_s": time.perf_counter() - t_launch,
    }
    if proc.returncode not in (0, None) and stopped_by is None:
        out["error"] = f"exit {proc.returncode}: {_tail(stderr)}"
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def time_to_accuracy_seed000(
    dataset: str, data_dir: str | None, work: Path, cap_s: float, max_epochs: int
) -> dict[str, Any]:
    out_path = work / f"t2a_seed000_{dataset}.json"
    spec_path = work / f"t2a_seed000_{dataset}_spec.json"
    t_launch = time.time()
    spec = {
        "dataset": dataset,
        "data_dir": data_dir,
        "t_launch": t_launch,
        "cap_s": cap_s,
        "max_epochs": max_epochs,
        "out": str(out_path),
    }
    spec_path.write_text(json.dumps(spec))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench", "--child", "seed000", str(spec_path)],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=cap_s + 300,
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "reached": False}
    if proc.returncode != 0 or not out_path.is_file():
        return {"error": f"exit {proc.returncode}: {_tail(proc.stderr)}", "reached": False}
    result = _load_json(out_path)
    result["wall_s"] = time.time() - t_launch
    return result


def _child_seed000(spec: dict[str, Any]) -> None:
    """The seed-000 recipe: torchvision-style per-sample PIL dataset, ToTensor, DataLoader workers, .to(device)."""
    t_launch, cap_s = spec["t_launch"], spec["cap_s"]
    import torch
    import torch.nn.functional as F
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset
    from torchvision import transforms

    from accel_train.data.base import DataConfig
    from accel_train.models import create_model

    if spec["dataset"] == "digits":
        from accel_train.data.digits import build_digits

        splits = build_digits(DataConfig())  # load_digits_dataset(), resized to 28x28 like the package
    else:
        from accel_train.data.vision import build_mnist

        splits = build_mnist(DataConfig(dataset="mnist", data_dir=spec["data_dir"]))

    class PILDataset(Dataset):
        """Like torchvision.datasets.MNIST: uint8 storage, one PIL image + transform per sample."""

        def __init__(self, split, transform):
            self.data = split.images[:, 0].numpy()
            self.targets = split.labels.tolist()
            self.transform = transform

        def __len__(self) -> int:
            return len(self.targets)

        def __getitem__(self, index: int):
            return self.transform(Image.fromarray(self.data[index])), self.targets[index]

    torch.manual_seed(0)
    to_tensor = transforms.ToTensor()
    train_dl = DataLoader(
        PILDataset(splits.train, to_tensor), batch_size=SEED000_BATCH, shuffle=True, num_workers=SEED000_WORKERS
    )
    test_dl = DataLoader(
        PILDataset(splits.test, to_tensor), batch_size=1000, shuffle=False, num_workers=SEED000_WORKERS
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = create_model("mnist_cnn", 10, 1, 28).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=SEED000_LR)
    epochs: list[dict[str, Any]] = []
    reached, capped = None, False
    for epoch in range(1, spec["max_epochs"] + 1):
        model.train()
        for images, labels in train_dl:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            if time.time() - t_launch > cap_s:
                capped = True
                break
        if capped:
            break
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in test_dl:
                images, labels = images.to(device), labels.to(device)
                correct += (model(images).argmax(1) == labels).sum().item()
                total += labels.numel()
        accuracy = correct / total
        epochs.append({"epoch": epoch, "time_s": time.time() - t_launch, "accuracy": accuracy})
        if accuracy >= TARGET_ACCURACY:
            reached = epochs[-1]
            break
    result = {
        "recipe": (
            f"per-sample PIL + ToTensor, DataLoader(num_workers={SEED000_WORKERS}, shuffle=True), .to(device) "
            f"per step, mnist_cnn, Adam {SEED000_LR:g}, batch {SEED000_BATCH}, eval after each epoch"
        ),
        "reached": reached is not None,
        "time_to_target_s": reached["time_s"] if reached else None,
        "epoch": reached["epoch"] if reached else None,
        "best_accuracy": max((e["accuracy"] for e in epochs), default=None),
        "epochs": epochs,
        "cap_s": cap_s,
        "max_epochs": spec["max_epochs"],
        "stopped": "target reached" if reached else (f"cap of {cap_s:.0f}s" if capped else "max epochs"),
        "elapsed_s": time.time() - t_launch,
    }
    Path(spec["out"]).write_text(json.dumps(result))


def time_to_accuracy(opts: BenchOptions, work: Path) -> dict[str, Any]:
    full = opts.mode == "full"
    caps = {"portable": 600.0 if full else 60.0, "seed000": 600.0 if full else 30.0, "epochs": 20 if full else 8}
    out: dict[str, Any] = {"target_accuracy": TARGET_ACCURACY, "caps": caps}
    datasets = ["digits"]
    if mnist_available(opts.data_dir):
        if full:
            datasets.append("mnist")
        else:
            out["mnist"] = {"skipped": "--quick: MNIST time to accuracy only in a full run"}
    else:
        out["mnist"] = {
            "skipped": (
                "no --data-dir given" if not opts.data_dir else f"no MNIST IDX files under {opts.data_dir}/MNIST/raw"
            )
        }
    for ds in datasets:
        opts.log(f"bench: time to {TARGET_ACCURACY:.0%} on {ds}: portable loop")
        portable = time_to_accuracy_portable(ds, opts.data_dir, work, caps["portable"])
        opts.log(f"bench: time to {TARGET_ACCURACY:.0%} on {ds}: seed-000 recipe")
        seed = time_to_accuracy_seed000(ds, opts.data_dir, work, caps["seed000"], caps["epochs"])
        entry: dict[str, Any] = {"portable": portable, "seed000": seed}
        if portable.get("reached"):
            if seed.get("reached"):
                entry["speedup"] = seed["time_to_target_s"] / portable["time_to_target_s"]
                entry["speedup_is_lower_bound"] = False
            elif "elapsed_s" in seed:  # not reached in its budget: the speedup is at least this
                entry["speedup"] = seed["elapsed_s"] / portable["time_to_target_s"]
                entry["speedup_is_lower_bound"] = True
        out[ds] = entry
    return out


# --------------------------------------------------------------------------- the run


def _cells(opts: BenchOptions, setups: Sequence[Setup]) -> list[tuple[Setup, str]]:
    models = opts.models or MODELS
    subset = opts.mode == "quick" and not opts.models and not opts.setups
    cells = []
    for setup in setups:
        for model in models:
            if setup.study_only and model not in STUDY_MODELS:
                continue
            if subset and model not in QUICK_CELLS.get(setup.name, ()):
                continue
            cells.append((setup, model))
    return cells


def _select_setups(opts: BenchOptions, with_cuda: bool) -> list[Setup]:
    """Smoke: cpu_fp32. Quick: the three main setups (channels_last is covered by the bf16 study). Full: all."""
    available = list(SETUPS) + (list(CUDA_SETUPS) if with_cuda else [])
    if opts.smoke:
        return [SETUPS[0]]
    if opts.setups:
        names = {s.name for s in available}
        unknown = [n for n in opts.setups if n not in names]
        if unknown:
            from accel_train.errors import UserError

            raise UserError(f"unknown or unavailable setup(s) {', '.join(unknown)}; choose from {', '.join(names)}")
        return [s for s in available if s.name in opts.setups]
    return [s for s in available if opts.mode == "full" or not s.study_only]


def measure_grid(
    opts: BenchOptions, setups: Sequence[Setup], work: Path, wrapper: Path, pool: ServerPool
) -> dict[tuple[str, str], dict[str, list[dict[str, Any]]]]:
    """Per cell: the plain loop right before the portable run (and right after it in full mode).

    The plain loop runs in long-lived servers (one start-up per process layout), so each
    plain measurement sits next to the portable run it is compared with.
    """
    cells = _cells(opts, setups)
    raw: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {
        (s.name, m): {"plain": [], "portable": []} for s, m in cells
    }
    timeout = 1800.0 if opts.mode == "full" else 400.0
    for rep in range(opts.n_repeats()):
        for setup in setups:
            models = [m for s, m in cells if s is setup]
            for model in models:
                server = pool.get(setup)
                prefix = f"bench: [{rep + 1}/{opts.n_repeats()}] {setup.name} {model}:"
                cell = raw[(setup.name, model)]
                opts.log(f"{prefix} plain loop")
                cell["plain"].append(server.request(plain_command(setup, model, opts), timeout))
                opts.log(f"{prefix} portable loop")
                cell["portable"].append(run_portable(setup, model, opts, work, wrapper, f"r{rep}"))
                if opts.mode == "full":
                    opts.log(f"{prefix} plain loop (after)")
                    cell["plain"].append(server.request(plain_command(setup, model, opts), timeout))
        pool.close(processes=2)  # the 2-rank server is not needed by the study; free its memory
    return raw


def aggregate(
    raw: dict[tuple[str, str], dict[str, list[dict[str, Any]]]],
    setups: Sequence[Setup],
    machine: dict[str, Any],
    opts: BenchOptions,
) -> list[dict[str, Any]]:
    by_name = {s.name: s for s in setups}
    results = []
    for (setup_name, model), runs in raw.items():
        setup = by_name[setup_name]
        portable = [r for r in runs["portable"] if "error" not in r]
        plain = [r for r in runs["plain"] if "error" not in r]
        errors = [r["error"] for r in runs["portable"] + runs["plain"] if "error" in r]
        sps = _median([r["samples_per_s"] for r in portable])
        plain_sps = _median([r["samples_per_s"] for r in plain])
        best = max((w for r in portable for w in r.get("window_samples_per_s", [])), default=None)
        plain_best = max((w for r in plain for w in r.get("window_samples_per_s", [])), default=None)
        fps = flops_per_sample(model, MODEL_PLANS[model].batch)
        peak_key = "peak_gflops_bf16" if setup.bf16 else "peak_gflops_fp32"
        if setup.device == "cuda":
            peak_key += "_cuda"
        peak = machine.get(peak_key)
        breakdown = None
        if plain:
            keys = plain[0]["step_breakdown_ms"].keys()
            breakdown = {k: _median([r["step_breakdown_ms"][k] for r in plain]) for k in keys}
        entry: dict[str, Any] = {
            "model": model,
            "setup": setup_name,
            "processes": setup.processes,
            "precision": setup.precision,
            "channels_last": setup.channels_last,
            "device": setup.device,
            "global_batch": MODEL_PLANS[model].batch,
            "steps_measured": opts.steps(model),
            "warmup_steps": WARMUP_STEPS,
            "repeats": len(portable),
            "samples_per_s": sps,
            "samples_per_s_runs": [r["samples_per_s"] for r in portable],
            "plain_samples_per_s": plain_sps,
            "plain_samples_per_s_runs": [r["samples_per_s"] for r in plain],
            "ratio_vs_plain": _ratio(sps, plain_sps),
            "best_window_samples_per_s": best,
            "plain_best_window_samples_per_s": plain_best,
            "ratio_vs_plain_best_window": _ratio(best, plain_best),
            "data_wait_fraction": _median([r["data_wait_fraction"] for r in portable]),
            "plain_data_wait_fraction": _median([r["data_wait_fraction"] for r in plain]),
            "step_breakdown_ms": breakdown,
            "scalar_allreduce_ms": _median([r.get("scalar_allreduce_ms") for r in plain]),
            "gflop_per_sample": fps / 1e9,
            "achieved_gflops": sps * fps / 1e9 if sps else None,
            "mfu": sps * fps / 1e9 / peak if sps and peak else None,
            "plain_mfu": plain_sps * fps / 1e9 / peak if plain_sps and peak else None,
            "mfu_peak": peak_key,
            "peak_rss_mb": max((r["peak_rss_mb"] for r in portable if r.get("peak_rss_mb")), default=None),
            "peak_rss_mb_per_rank": portable[0]["peak_rss_mb_per_rank"] if portable else None,
            "threads_per_process": portable[0]["threads_per_process"] if portable else None,
            "loadavg_1min": max((max(r["loadavg_1min"]) for r in portable if r.get("loadavg_1min")), default=None),
            "command": (runs["portable"][0].get("command") if runs["portable"] else None),
        }
        if any(r.get("peak_cuda_mb") for r in portable):
            entry["peak_cuda_mb"] = max(r["peak_cuda_mb"] for r in portable if r.get("peak_cuda_mb"))
        if errors:
            entry["errors"] = errors
        results.append(entry)
    index = {(r["setup"], r["model"]): r for r in results}
    for r in results:
        base = index.get(("cpu_fp32", r["model"]))
        if base and r["setup"] != "cpu_fp32":
            r["speedup_vs_cpu_fp32"] = _ratio(r["samples_per_s"], base["samples_per_s"])
            r["plain_speedup_vs_cpu_fp32"] = _ratio(r["plain_samples_per_s"], base["plain_samples_per_s"])
    return results


def _goal(
    goal: str, value: float | None, threshold: float, higher_is_better: bool = True, best_window: float | None = None
) -> dict[str, Any]:
    met = None if value is None else (value >= threshold if higher_is_better else value <= threshold)
    return {"goal": goal, "value": value, "value_best_window": best_window, "threshold": threshold, "met": met}


def evaluate_goals(
    results: list[dict[str, Any]], t2a: dict[str, Any] | None, help_timing: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each goal of the issue with the measured value; reported, never asserted.

    ``value`` uses the steady-state means (summary.json); ``value_best_window`` the best
    10-step windows of both sides (less sensitive to other processes on the CPU), where measured.
    """
    goals = []
    index = {(r["setup"], r["model"]): r for r in results}
    for r in results:
        if r["setup"] == "cpu_fp32":
            goals.append(
                _goal(
                    f"portable >= {GOAL_RATIO_VS_PLAIN}x plain samples/s ({r['model']}, 1 CPU process)",
                    r["ratio_vs_plain"],
                    GOAL_RATIO_VS_PLAIN,
                    best_window=r.get("ratio_vs_plain_best_window"),
                )
            )
    waits = [r for r in results if r["data_wait_fraction"] is not None]
    if waits:
        worst = max(waits, key=lambda r: r["data_wait_fraction"])
        goals.append(
            _goal(
                f"data wait <= {GOAL_DATA_WAIT:.0%} of step time (worst: {worst['model']}, {worst['setup']})",
                worst["data_wait_fraction"],
                GOAL_DATA_WAIT,
                higher_is_better=False,
            )
        )
    for r in results:
        base = index.get(("cpu_fp32", r["model"]))
        if r["setup"] == "gloo_2proc" and base:
            goals.append(
                _goal(
                    f"2-process gloo >= {GOAL_DDP_SCALING}x 1-process samples/s ({r['model']}, same global batch)",
                    r.get("speedup_vs_cpu_fp32"),
                    GOAL_DDP_SCALING,
                    best_window=_ratio(r.get("best_window_samples_per_s"), base.get("best_window_samples_per_s")),
                )
            )
    for setup in ("cpu_bf16", "cpu_bf16_cl"):
        r, base = index.get((setup, "resnet18")), index.get(("cpu_fp32", "resnet18"))
        if r and base:
            goals.append(
                _goal(
                    f"bf16 >= {GOAL_BF16_SPEEDUP}x fp32 samples/s for resnet18 ({setup} vs cpu_fp32)",
                    r.get("speedup_vs_cpu_fp32"),
                    GOAL_BF16_SPEEDUP,
                    best_window=_ratio(r.get("best_window_samples_per_s"), base.get("best_window_samples_per_s")),
                )
            )
    digits = (t2a or {}).get("digits") or {}
    if digits.get("speedup") is not None:
        lower = bool(digits.get("speedup_is_lower_bound"))
        g = _goal(
            f"time to {TARGET_ACCURACY:.0%} on digits >= {GOAL_T2A_SPEEDUP:g}x faster than the seed-000 recipe"
            + (" (lower bound: seed-000 did not reach it in its budget)" if lower else ""),
            digits["speedup"],
            GOAL_T2A_SPEEDUP,
        )
        if lower and not g["met"]:
            g["met"] = None  # a lower bound below the goal decides nothing
        goals.append(g)
    if "median_s" in help_timing:
        goals.append(
            _goal(
                f"python scripts/train.py --help < {GOAL_HELP_S:g} s",
                help_timing["median_s"],
                GOAL_HELP_S,
                higher_is_better=False,
            )
        )
    return goals


def run_benchmark(opts: BenchOptions) -> dict[str, Any]:
    """Measure everything and write ``benchmark.json``, ``benchmark.md`` and ``benchmark.png`` into ``opts.out``."""
    import torch

    t_start = time.perf_counter()
    load_start = os.getloadavg()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in opts.models or ():
        if name not in MODELS:
            from accel_train.errors import UserError

            raise UserError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    with_cuda = torch.cuda.is_available()
    setups = _select_setups(opts, with_cuda)
    if opts.smoke:
        opts.models = ("lenet",)
    threads = available_cores()
    opts.log(f"bench: {opts.mode} mode; measuring the machine (GEMM peak, {threads} threads)")
    machine = machine_info(threads, opts.mode, with_cuda)
    machine["loadavg_start"] = [round(x, 2) for x in load_start]
    if load_start[0] > 0.5 * threads:
        opts.log(
            f"bench: note: load average {load_start[0]:.1f} on {threads} cores before starting: other processes "
            "are using the CPU, so timings will be noisy (compare the ratios)"
        )
    opts.log("bench: timing python scripts/train.py --help")
    help_timing = time_train_help(1 if opts.smoke else 3)
    work = Path(tempfile.mkdtemp(prefix="accel_bench_"))
    pool = ServerPool(work)
    try:
        wrapper = write_wrapper(work)
        raw = measure_grid(opts, setups, work, wrapper, pool)
        results = aggregate(raw, setups, machine, opts)
        study: list[dict[str, Any]] = []
        study_models = [m for m in STUDY_MODELS if m in (opts.models or MODELS)]
        if not opts.smoke and study_models and any(s.device == "cpu" and s.processes == 1 for s in setups):
            study = run_study(study_models, opts, pool)
        pool.close()
        t2a = time_to_accuracy(opts, work) if opts.time_to_accuracy and not opts.smoke else None
    finally:
        pool.close()
        if opts.keep_runs:
            opts.log(f"bench: kept the children's folders in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report = {
        "machine": machine,
        "settings": {
            "mode": opts.mode,
            "repeats": opts.n_repeats(),
            "warmup_steps_excluded": WARMUP_STEPS,
            "models": {
                m: {"global_batch": MODEL_PLANS[m].batch, "steps_measured": opts.steps(m)}
                for m in (opts.models or MODELS)
            },
            "setups": [s.name for s in setups],
            "cells": [f"{s.name}/{m}" for s, m in _cells(opts, setups)],
            "quick_subset": opts.mode == "quick" and not opts.models and not opts.setups,
            "data": "synthetic MNIST-shaped 1x28x28 uint8, in memory (same tensors for portable and plain)",
        },
        "results": results,
        "goals": evaluate_goals(results, t2a, help_timing),
        "bf16_study": study,
        "time_to_accuracy": t2a if t2a is not None else {"skipped": "smoke run" if opts.smoke else "disabled"},
        "train_help_s": help_timing,
        "total_wall_s": time.perf_counter() - t_start,
    }
    (out / "benchmark.json").write_text(json.dumps(report, indent=2))
    (out / "benchmark.md").write_text(render_markdown(report))
    write_chart(report, out / "benchmark.png")
    opts.log(f"bench: wrote {out / 'benchmark.json'}, benchmark.md, benchmark.png in {report['total_wall_s']:.0f}s")
    return report


# --------------------------------------------------------------------------- reports


def _f(value: Any, spec: str = ".1f", none: str = "-") -> str:
    if value is None:
        return none
    return format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[met]


BF16_BACKGROUND = """\
Background (what the numbers above are consistent with; the measurements decide):

* **The bf16 arithmetic itself.** This CPU has AVX512-BF16 but AMX-BF16 is `{amx}` here. Without AMX, oneDNN
  runs `avx512_core_bf16` kernels (`vdpbf16ps`): the GEMM measured in this run gives bf16 at
  {gemm_ratio:.2f}x fp32. Large bf16-over-fp32 GEMM factors (such as ~4.8x) are what AMX tiles give; an fp32
  timing without warm-up, or taken while other processes load the CPU, can also inflate the factor. Here the two
  dtypes are timed interleaved, best of several, after a warm-up.
* **Autocast casts per op, every step.** Weights stay fp32 (the optimizer's master copy) and are cast to bf16
  in every forward, and the weight gradients come back through the cast (`cast/copy` in the profiles). For
  mnist_cnn the 25.7M-parameter dense layer makes this large, while its batch-32 matmul, bound by reading
  that weight, gains little or nothing from bf16 (compare `matmul` in the two profiles).
* **NCHW means reorders.** oneDNN computes convolutions in blocked (`nChw16c`) or NHWC layouts; NCHW tensors are
  reordered before and after each bf16 convolution (forward, backward-data, backward-weights).
  `--channels-last` keeps activations NHWC end to end and removes most of them; the study rows show what that
  is worth here, in fp32 and in bf16.
* **Small problems.** 28x28 inputs, batch 16-32 and 1-channel stems leave little work per kernel call, so
  per-op costs (casts, reorders, primitive creation, Python) weigh more than the arithmetic.
* **The optimizer does not change.** Adam updates fp32 master weights whatever the autocast dtype; for
  mnist_cnn the unfused per-parameter Adam is a large part of the step, which `torch.optim.Adam(fused=True)`
  removes (study row `fp32+fused_adam`).
"""


def _study_md(study: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for s in study:
        if "error" in s:
            lines.append(f"* {s['model']}: study failed: {s['error'][:300]}")
            continue
        lines += [
            "",
            f"**{s['model']}** (plain loop, batch {s['batch']}; all variants in one process, stepped "
            f"round-robin, {s['rounds']} round(s) x {s.get('steps_per_round', 2)} steps; medians):",
            "",
            "| variant | step ms | fwd+bwd ms | optimizer ms | speedup vs fp32 |",
            "|---|---:|---:|---:|---:|",
        ]
        for v in s["variants"]:
            lines.append(
                f"| {v['name']} | {_f(v['step_ms'])} | {_f(v['forward_backward_ms'])} | "
                f"{_f(v['optimizer_ms'])} | {_f(v.get('speedup_vs_fp32'), '.2f')}x |"
            )
        if s.get("profiles"):
            lines += ["", "Forward+backward, one profiled step (self CPU ms by category; top ops):", ""]
            for name, p in s["profiles"].items():
                cats = ", ".join(f"{k} {v:.1f}" for k, v in p["categories_ms"].items())
                top = ", ".join(f"`{k}` {ms:.1f}" for k, ms in p["top_ops_ms"][:4])
                lines.append(f"* {name}: {p['forward_backward_ms']:.1f} ms = {cats}; top: {top}")
    return lines


def _bf16_findings(report: dict[str, Any]) -> list[str]:
    """Findings written from this run's numbers."""
    index = {(r["setup"], r["model"]): r for r in report["results"]}
    m = report["machine"]
    lines = [
        f"* GEMM {m['gemm_size']}^2, {m['threads']} threads, in this run: bf16 {m['peak_gflops_bf16']:.0f} "
        f"vs fp32 {m['peak_gflops_fp32']:.0f} GFLOP/s = **{m['gemm_bf16_over_fp32']:.2f}x**; AVX512-BF16 "
        f"{'yes' if m.get('avx512_bf16') else 'no'}, AMX-BF16 {'yes' if m.get('amx_bf16') else 'no'}."
    ]
    for model in STUDY_MODELS:
        parts = [
            f"{setup} {r['speedup_vs_cpu_fp32']:.2f}x"
            for setup in ("cpu_bf16", "cpu_fp32_cl", "cpu_bf16_cl")
            if (r := index.get((setup, model))) and r.get("speedup_vs_cpu_fp32") is not None
        ]
        if parts:
            lines.append(
                f"* {model}, portable loop (scripts/train.py), samples/s relative to cpu_fp32: "
                + ", ".join(parts)
                + "."
            )
    for s in report.get("bf16_study", []):
        if "error" in s or not s.get("variants"):
            continue
        by = {v["name"]: v for v in s["variants"]}
        best = max(s["variants"], key=lambda v: v.get("speedup_vs_fp32") or 0)
        text = f"* {s['model']}, plain-loop study: fastest **{best['name']}** ({best['speedup_vs_fp32']:.2f}x fp32)"
        extras = [
            f"{name} {by[name]['speedup_vs_fp32']:.2f}x"
            for name in ("bf16", "fp32+channels_last", "bf16+channels_last")
            if name in by
        ]
        if extras:
            text += "; " + ", ".join(extras)
        if "bf16+channels_last" in by and "fp32+channels_last" in by:
            text += (
                f"; bf16 vs fp32 with both channels_last: "
                f"{by['fp32+channels_last']['step_ms'] / by['bf16+channels_last']['step_ms']:.2f}x"
            )
        lines.append(text + ".")
        prof = s.get("profiles", {})
        if "bf16" in prof and "fp32" in prof:
            pb, pf = prof["bf16"]["categories_ms"], prof["fp32"]["categories_ms"]
            lines.append(
                f"  Profile, bf16 vs fp32 (NCHW): convolutions {pb.get('convolution', 0):.1f} vs "
                f"{pf.get('convolution', 0):.1f} ms, matmuls {pb.get('matmul', 0):.1f} vs "
                f"{pf.get('matmul', 0):.1f} ms, casts/copies {pb.get('cast/copy', 0):.1f} vs "
                f"{pf.get('cast/copy', 0):.1f} ms."
            )
    verdict = _bf16_verdict(report)
    if verdict:
        lines.append(f"* **Conclusion from this run:** {verdict}")
    return lines


def _bf16_verdict(report: dict[str, Any]) -> str | None:
    study = {
        s["model"]: {v["name"]: v for v in s.get("variants", [])}
        for s in report.get("bf16_study", [])
        if "error" not in s
    }
    if not study:
        return None
    faster: dict[str, list[str]] = {}
    for model, by in study.items():  # each bf16 variant against the fastest fp32 one with the same optimizer
        faster[model] = []
        for name, v in by.items():
            rivals = [w for w in by.values() if not w.get("bf16") and bool(w.get("fused")) == bool(v.get("fused"))]
            if v.get("bf16") and rivals:
                rival = min(rivals, key=lambda w: w["step_ms"])
                if v["step_ms"] < rival["step_ms"] / 1.05:
                    faster[model].append(f"{name}: {rival['step_ms'] / v['step_ms']:.2f}x {rival['name']}")
    cl_helps = {
        model: by["bf16+channels_last"]["step_ms"] < 0.95 * by["bf16"]["step_ms"]
        for model, by in study.items()
        if "bf16" in by and "bf16+channels_last" in by
    }
    parts = []
    for model, names in faster.items():
        if names:
            parts.append(f"bf16 beats fp32 for {model} ({', '.join(names)})")
        else:
            parts.append(f"no bf16 variant beats fp32 for {model}")
    for model, helps in cl_helps.items():
        parts.append(f"channels_last {'speeds up' if helps else 'does not speed up'} bf16 for {model}")
    fused = [
        model
        for model, by in study.items()
        if "fp32+fused_adam" in by and (by["fp32+fused_adam"].get("speedup_vs_fp32") or 0) >= 1.05
    ]
    if fused:
        factors = ", ".join(f"{study[m]['fp32+fused_adam']['speedup_vs_fp32']:.2f}x" for m in fused)
        parts.append(f"fused Adam speeds up {', '.join(fused)} ({factors})")
    advice = (
        "bf16 helps for the variants listed; make them the recommendation for those models on CPUs like this one"
        if any(faster.values())
        else "keep fp32 (plus --channels-last where its row is faster) as the CPU recommendation on CPUs like this "
        "one; recommend cpu_bf16.yaml only where this benchmark shows a bf16 GEMM and step speedup (e.g. with AMX)"
    )
    rounds = min((s.get("rounds", 0) for s in report.get("bf16_study", []) if "error" not in s), default=0)
    caveat = (
        f" (from {rounds} round(s) of the study: indicative only; a run without --quick takes 8)" if rounds < 4 else ""
    )
    return "; ".join(parts) + f"{caveat}. So: {advice}."


def _ddp_findings(report: dict[str, Any]) -> list[str]:
    lines = []
    index = {(r["setup"], r["model"]): r for r in report["results"]}
    for r in report["results"]:
        if r["setup"] != "gloo_2proc" or not r.get("step_breakdown_ms"):
            continue
        b = r["step_breakdown_ms"]
        base = index.get(("cpu_fp32", r["model"]))
        text = (
            f"* {r['model']}: plain DDP step {b['total']:.1f} ms = data {b['data_wait']:.1f}, fwd+bwd "
            f"{b['forward_backward']:.1f}, gradient all-reduce ~{b['sync']:.1f}, optimizer {b['optimizer']:.1f}"
        )
        if base and base.get("step_breakdown_ms"):
            text += f" (1 process, 2 threads: {base['step_breakdown_ms']['total']:.1f} ms)"
        if r.get("scalar_allreduce_ms") is not None:
            text += (
                f"; one scalar all-reduce costs {r['scalar_allreduce_ms']:.2f} ms (the loop does one every 10 steps "
                "to agree on stop signals)"
            )
        lines.append(text + ".")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        "# accel_train benchmark",
        "",
        f"Mode **{s['mode']}**: {s['repeats']} repeat(s) per measurement (median), {s['warmup_steps_excluded']} "
        f"warm-up steps excluded. Machine: {m['cpu']}, {m['cores']} core(s), torch {m['torch']}, accelerate "
        f"{m['accelerate']}, Python {m['python']}. GEMM peak ({m['gemm_size']}^2, {m['threads']} threads): fp32 "
        f"{m['peak_gflops_fp32']:.0f} GFLOP/s, bf16 {m['peak_gflops_bf16']:.0f} GFLOP/s. Load average at start "
        f"{m.get('loadavg_start')}, at end {m.get('loadavg_end')}: when other processes share the CPU, absolute "
        "numbers are noisy; each plain measurement is taken right next to its portable run and the RATIO is the "
        f"result. Total time {report['total_wall_s']:.0f} s.",
        "",
        "## Throughput: portable loop vs plain PyTorch loop",
        "",
        *(
            [
                f"`--quick` measures a subset of the cells ({', '.join(s['cells'])}); a run without `--quick` measures "
                "every model on every setup, with repeats.",
                "",
            ]
            if s.get("quick_subset")
            else []
        ),
        f"Data: {s['data']}. *Portable*: `scripts/train.py` launched as users do (commands below), steady-state "
        "samples/s and data wait from its summary.json. *Plain*: a hand-written loop in its own process (same model, "
        "data, global batch, threads; Adam, cross-entropy and the loop's default grad-norm clipping). *best win.*: "
        f"ratio of the best {WINDOW_STEPS}-step windows of both sides (only with >= {2 * WINDOW_STEPS} steps). "
        "*Breakdown*: plain loop, ms per step: data / forward+backward / optimizer / gradient all-reduce (DDP: "
        "synced minus no_sync backward). MFU: FLOPs of forward+backward (FlopCounterMode) x samples/s over the GEMM "
        "peak of the same dtype. *load*: highest 1-minute load average around the portable run(s) (this "
        f"benchmark's own threads count; {m['cores']} cores).",
        "",
        "| model | setup | batch | portable samples/s | plain samples/s | ratio | best win. | data wait | "
        "breakdown ms | GFLOP/s | MFU | peak RSS MB | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        b = r.get("step_breakdown_ms") or {}
        bd = "/".join(_f(b.get(k), ".1f") for k in ("data_wait", "forward_backward", "optimizer", "sync")) if b else "-"
        lines.append(
            f"| {r['model']} | {r['setup']} | {r['global_batch']} | {_f(r['samples_per_s'], '.0f')} | "
            f"{_f(r['plain_samples_per_s'], '.0f')} | {_f(r['ratio_vs_plain'], '.3f')} | "
            f"{_f(r.get('ratio_vs_plain_best_window'), '.3f')} | {_pct(r['data_wait_fraction'])} | {bd} | "
            f"{_f(r['achieved_gflops'], '.1f')} | {_pct(r['mfu'])} | {_f(r['peak_rss_mb'], '.0f')} | "
            f"{_f(r.get('loadavg_1min'), '.1f')} |"
        )
    errors = [(r["model"], r["setup"], e) for r in report["results"] for e in r.get("errors", [])]
    if errors:
        lines += ["", "Errors:", ""] + [f"* {mo} / {se}: {e[:400]}" for mo, se, e in errors]
    lines += ["", "Portable commands (OUT: a temporary run folder):", ""]
    seen = set()
    for r in report["results"]:
        if r.get("command") and r["setup"] not in seen:
            seen.add(r["setup"])
            lines.append(f"* {r['setup']}: `{r['command']}`")
    lines += [
        "",
        "## Goals (reported, not asserted)",
        "",
        "| goal | measured | best windows | met |",
        "|---|---:|---:|---|",
    ]
    for g in report["goals"]:
        lines.append(
            f"| {g['goal']} | {_f(g['value'], '.3f')} | {_f(g.get('value_best_window'), '.3f')} | {_met(g['met'])} |"
        )
    lines += _t2a_md(report.get("time_to_accuracy") or {})
    help_t = report.get("train_help_s", {})
    lines += [
        "",
        f"`python scripts/train.py --help`: {_f(help_t.get('median_s'), '.2f')} s (median of "
        f"{len(help_t.get('runs_s', []))}).",
    ]
    ddp = _ddp_findings(report)
    if ddp:
        lines += ["", "## 2 gloo processes on this CPU", ""] + ddp
    lines += ["", "## bf16 on this CPU", ""] + _bf16_findings(report) + _study_md(report.get("bf16_study", []))
    lines += ["", BF16_BACKGROUND.format(amx="yes" if m.get("amx_bf16") else "no", gemm_ratio=m["gemm_bf16_over_fp32"])]
    return "\n".join(lines) + "\n"


def _t2a_md(t2a: dict[str, Any]) -> list[str]:
    lines = ["", f"## Time to {TARGET_ACCURACY:.0%} test accuracy, from launch", ""]
    if "skipped" in t2a:
        return lines + [f"Skipped: {t2a['skipped']}."]
    lines += [
        "| dataset | recipe | reached | seconds from launch | at | best accuracy |",
        "|---|---|---|---:|---|---:|",
    ]
    for ds in ("digits", "mnist"):
        entry = t2a.get(ds)
        if not entry:
            continue
        if "skipped" in entry:
            lines.append(f"| {ds} | - | skipped: {entry['skipped']} | - | - | - |")
            continue
        for name in ("portable", "seed000"):
            e = entry[name]
            if e.get("reached"):
                at = f"step {e.get('step')}, epoch {e.get('epoch')}" if name == "portable" else f"epoch {e['epoch']}"
            else:
                at = e.get("stopped") or str(e.get("error", "-"))[:80]
            lines.append(
                f"| {ds} | {name} | {'yes' if e.get('reached') else 'no'} | "
                f"{_f(e.get('time_to_target_s'))} | {at} | {_f(e.get('best_accuracy'), '.4f')} |"
            )
        if entry.get("speedup") is not None:
            bound = ">= " if entry.get("speedup_is_lower_bound") else ""
            lines.append(f"| {ds} | **speedup** | | {bound}{entry['speedup']:.1f}x | | |")
    digits = t2a.get("digits") or {}
    portable = digits.get("portable") or {}
    if portable.get("reached") and portable.get("train_time_to_target_s") is not None:
        startup = portable["time_to_target_s"] - portable["train_time_to_target_s"]
        lines += [
            "",
            f"Of the portable loop's {portable['time_to_target_s']:.1f} s, {startup:.1f} s pass before its "
            "run "
            "logger starts (interpreter, imports, dataset, model, Accelerator); training and evaluation "
            f"to {TARGET_ACCURACY:.0%} take {portable['train_time_to_target_s']:.1f} s.",
        ]
    if digits.get("seed000", {}).get("recipe"):
        epochs = ", ".join(
            f"{e['epoch']}: {e['accuracy']:.3f} @ {e['time_s']:.0f}s" for e in digits["seed000"].get("epochs", [])
        )
        lines += [
            "",
            f"seed-000 recipe: {digits['seed000']['recipe']}; per epoch: {epochs or '-'}.",
            f"Portable: {digits.get('portable', {}).get('recipe', '')}, `--eval-every 5`; "
            f"`{digits.get('portable', {}).get('command', '')}`. Caps: {t2a.get('caps')}.",
        ]
    return lines


def write_chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"]]
    labels = [f"{r['model']}\n{r['setup']}" for r in rows]
    portable = [r["samples_per_s"] or 0.0 for r in rows]
    plain = [r["plain_samples_per_s"] or 0.0 for r in rows]
    ratio = [r["ratio_vs_plain"] or 0.0 for r in rows]
    x = list(range(len(rows)))
    width = 0.4
    fig, (ax1, ax2) = plt.subplots(
        2, 1, figsize=(max(8.0, 0.9 * len(rows) + 2), 8), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    ax1.bar([i - width / 2 for i in x], portable, width, label="portable loop (scripts/train.py)")
    ax1.bar([i + width / 2 for i in x], plain, width, label="plain PyTorch loop")
    if any(v > 0 for v in portable + plain):
        ax1.set_yscale("log")
    ax1.set_ylabel("samples/s (log)")
    ax1.set_title(f"accel_train benchmark ({report['settings']['mode']}) - {report['machine']['cpu']}")
    ax1.legend()
    colors = ["tab:green" if v >= GOAL_RATIO_VS_PLAIN else "tab:red" for v in ratio]
    ax2.bar(x, ratio, 0.6, color=colors)
    ax2.axhline(GOAL_RATIO_VS_PLAIN, color="black", linestyle="--", linewidth=1, label=f"goal {GOAL_RATIO_VS_PLAIN}")
    ax2.axhline(1.0, color="grey", linewidth=0.8)
    ax2.set_ylabel("portable / plain")
    ax2.legend(loc="lower right")
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- child entry point


def _child_main(argv: Sequence[str]) -> None:
    kind, spec_path = argv[1], argv[2]
    spec = _load_json(Path(spec_path))
    {"server": _child_server, "seed000": _child_seed000}[kind](spec)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        _child_main(sys.argv[1:])
    else:
        sys.exit("usage: python -m benchmarks --help (this module's command line is for its children)")
