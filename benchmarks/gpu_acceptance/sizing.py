"""How long each GPU acceptance check should take on an H100: the start-up of every process it starts (measured on
the CPU here), what a GPU adds to each (assumed: it cannot be measured without one) and its training FLOPs over an
assumed achievable rate. Every check's timeout is held to at least ``MARGIN`` times these and ``plan``
writes them into the plan (tests/unit/test_gpu_acceptance.py holds both). Once a GPU has run the checks, each
check's ``duration_s`` in the report replaces these estimates.

No imports beyond the standard library: ``--plan`` runs on a machine without torch.
"""

from __future__ import annotations

MARGIN = 1.3  # every timeout >= 1.3 x the expected seconds

# Measured on this CPU (2-core AMD EPYC with AVX512-BF16, torch 2.14.1, 2026-11-28): seconds from a fresh
# process's start to its exit, the fastest of 2-5 runs (other sessions shared the two cores; under their load,
# the same runs took up to twice as long).
CPU_S = {
    # scripts/train.py, bn_net, 20 steps of 32 on 512 synthetic 3x32x32 images: 3.0-4.8 s idle (2.3 s with a
    # warm cache), of which the imports are 2.5 s; the compute of such a tiny run is a fraction of a second
    "train": 3.5,
    # the same under accelerate launch multi_cpu.yaml --num_processes 1: the launcher's own imports, torchrun, its
    # rendezvous and the rank (9.5 and 10.9 s idle, 8.1-12.6 s under load); single_gpu.yaml's launch is counted so too
    "launch": 9.5,
    # python -m benchmarks.gpu_acceptance.probe imports: torch, accelerate, datasets, evaluate, accel_train
    # (3.9-5.1 s idle)
    "probe": 4.5,
    # a throughput row's start-up besides the imports: 51,200 synthetic 3x32x32 images made (3.6 s; 65,536: 3.7 s),
    # resnet18 built, its 45 MB checkpoint written (2 steps of batch 8: 9.6 s under load, less the CPU's steps)
    "resnet18_setup": 5.0,
    # --compile's own cost in a bn_net run (20 steps, an evaluation) with an empty inductor cache: 31.6 s idle
    # (26.4-37.5 s under load) against 3.5 s for the eager run; with the cache the first run filled: 4.2 s idle,
    # 7.8-11.5 s under load
    "compile_cold": 28.0,
    "compile_warm": 4.0,
    # probe.write_cifar_like: 50k/10k random images in CIFAR-10's pickled format, for the speed run
    "cifar_files": 2.4,
    # the plan's install line (pip install --no-deps --target .whl/site of the four wheels): 0.5 s
    "install": 0.5,
    # scripts/gpu_acceptance.py's own start (torch imported to count the GPUs) and its report: --plan took 1.8 s
    "driver": 3.0,
}

# Added on the GPU machine; assumed (nothing here has a GPU). The first report's duration_s replaces them.
GPU_S = {
    "cuda": 5.0,  # each process: the CUDA context, cuBLAS/cuDNN loaded with their handles, the data copied over
    "nccl": 3.0,  # each NCCL process group (world size 1; NCCL_DEBUG=INFO prints the topology)
    "autotune": 3.0,  # cudnn.benchmark's first resnet18 step: every convolution shape, forward and backward
    "triton": 10.0,  # a cold --compile: Triton compiles the kernels (in parallel workers) after inductor's Python
    "cold_disk": 15.0,  # a fresh machine's first import of torch and the CUDA libraries, off a cold disk
    "transformers": 5.0,  # evaluate imports transformers when the image has it (setup reports whether it did)
    "gemm": 1.0,  # the GEMM peak probe: 53 bf16 8192^3 products (58 TFLOP) and their buffers
}

# FLOPs of one training step per 32x32 sample: FlopCounterMode's forward x 3 (probe.model_train_flops_per_sample;
# resnet18's forward is 1.11 GFLOP = 0.56 GMAC). A unit test recounts them.
TRAIN_FLOPS = {"resnet18": 3.33e9, "airbench": 0.709e9}
# What an H100 achieves on these small convolutions, assumed and kept low on purpose (a lower rate gives a longer
# estimate): bf16 60 TFLOP/s is 18,000 resnet18 samples/s at 32x32, about 6% of the 989 TFLOP/s dense bf16 peak;
# fp32 without TF32 runs on the CUDA cores.
H100_TFLOPS = {"bf16": 60.0, "fp16": 60.0, "tf32": 30.0, "fp32": 15.0}


def train_s(model: str, samples: float, precision: str) -> float:
    """Seconds of training compute for ``samples`` samples (evaluation: a third of it, forward only)."""
    return TRAIN_FLOPS[model] * samples / (H100_TFLOPS[precision] * 1e12)


def _plain(n: int = 1) -> float:
    return n * (CPU_S["train"] + GPU_S["cuda"])


def _launched(n: int = 1, nccl: bool = True) -> float:
    return n * (CPU_S["launch"] + GPU_S["cuda"] + (GPU_S["nccl"] if nccl else 0.0))


def _gemm() -> float:
    return CPU_S["probe"] + GPU_S["cuda"] + GPU_S["gemm"]


def _throughput_row(precision: str) -> float:
    """One row of 200 steps of 512 and an evaluation of 2,560 (speed._throughput_steps)."""
    compute = train_s("resnet18", 200 * 512, precision) + train_s("resnet18", 2560, precision) / 3
    return CPU_S["train"] + CPU_S["resnet18_setup"] + GPU_S["cuda"] + GPU_S["autotune"] + compute


# Each check: (what, seconds) terms, in the order it runs them. Tiny models' compute (bn_net: 10 MFLOP a sample) is
# inside the measured start-up.
TERMS = {
    "setup": [("the imports probe", CPU_S["probe"]), ("CUDA", GPU_S["cuda"]),
              ("transformers, if evaluate imports it", GPU_S["transformers"])],
    "bf16-resume": [("3 runs of bn_dropout_net: straight, stopped, resumed", _plain(3))],
    "ddp": [("1 plain run", _plain()), ("1 launched DDP run with NCCL", _launched())],
    "throughput-bf16": [("the GEMM peak probe", _gemm()), ("the bf16 row", _throughput_row("bf16"))],
    "compile": [("4 runs: eager, straight, stopped, resumed", _plain(4)),
                ("a cold compile (the straight run)", CPU_S["compile_cold"] + GPU_S["triton"]),
                ("2 compiles from the cache", 2 * CPU_S["compile_warm"])],
    # 4 GPU and 4 CPU runs, 4 single_gpu.yaml launches, 3 fsdp.yaml launches (tests/integration/test_gpu.py), on 4
    # xdist workers (x1.5 for groups of unequal length), after the workers' start; the in-process CUDA tests
    "pytest": [("4 xdist workers start and collect", CPU_S["probe"] + GPU_S["cuda"]),
               ("15 runs over 4 workers, x1.5", 1.5 / 4 * (_plain(4) + 4 * CPU_S["train"] + _launched(4, nccl=False)
                                                           + _launched(3))),
               ("in-process CUDA tests", 10.0)],
    "fsdp": [("3 fsdp.yaml launches: straight, stopped, resumed", _launched(3)),
             ("sharded checkpoints and the merge on the CPU", 3.0)],
    "device-batch": [("1 resnet18 run on 65,536 images", CPU_S["train"] + CPU_S["resnet18_setup"] + GPU_S["cuda"]),
                     ("cuDNN autotuning at the probe's and the run's batch", 2 * GPU_S["autotune"]),
                     ("2 probe steps and 2 steps of 32,768 in bf16", train_s("resnet18", 4 * 32768, "bf16"))],
    "throughput": [("the GEMM peak probe", _gemm())] + [(f"the {p} row", _throughput_row(p))
                                                         for p in ("fp32", "tf32", "bf16", "fp16")],
    "resume": [("3 runs of dropout_net: straight, stopped, resumed", _plain(3))],
    "sync-bn": [("1 plain run", _plain()), ("2 torchruns of 2 ranks on GPU 0 (gloo)", _launched(2))],
    "speedrun": [("CIFAR-10-format files", CPU_S["cifar_files"]), ("1 process", _plain()),
                 ("2 runs' data, whitening init and evaluation", 2 * 5.0), ("cuDNN autotuning", GPU_S["autotune"]),
                 ("60 + 648 steps of 1024 in bf16", train_s("airbench", (60 + 648) * 1024, "bf16"))],
    "dp": [("the data-parallel probe", CPU_S["probe"] + GPU_S["cuda"])],
    "dp_ddp": [("a dp.yaml launch and a 2-process DDP launch", _launched(2) + GPU_S["cuda"])],
}  # fmt: skip


def expected_s(name: str) -> float:
    """The seconds check ``name`` should take on an H100."""
    return round(sum(s for _, s in TERMS[name]), 1)


def breakdown(name: str) -> list[dict[str, float | str]]:
    return [{"what": what, "s": round(s, 1)} for what, s in TERMS[name]]


def command_overhead_s(first: bool) -> float:
    """A device command's own seconds besides its checks: the install, this script's start and its report; the
    first command of a fresh machine also reads torch off a cold disk."""
    return CPU_S["install"] + CPU_S["driver"] + GPU_S["cuda"] + (GPU_S["cold_disk"] if first else 0.0)
