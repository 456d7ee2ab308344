"""The GPU checks that stop, save and resume, each what it runs, what it must show and how that is judged:
``bf16-resume`` and ``resume`` (weights, optimizer state, data order and the CUDA RNG against a straight run; in bf16
with channels_last, and in fp32), ``fsdp`` (the resumed FSDP run, and its export against the sharded checkpoint)
and ``compile`` (a compiled stop and resume against compiled and eager straight runs).

Comparisons between runs use SGD with TF32 off: a weight then differs by about lr x (the gradient's round-off) per
step, while a real mistake (a wrong batch, a lost optimizer or RNG state) moves it by about lr x the gradient
itself, orders of magnitude more. Where a comparison could pass without proving anything, the check demands its
control: the resume's RNG must have advanced (else nothing used it), the compiled run must have left inductor's
kernels.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance.runner import Check, Context, Step
from benchmarks.gpu_acceptance.runs import (
    BN_NET,
    CIFAR_SHAPED,
    DETERMINISTIC,
    PREFIXES,
    SGD,
    SMALL_CIFAR,
    checkpoints,
    flat_tensors,
    fmt,
    run_facts,
    run_problems,
    summary,
    tensor_diff,
    train_step,
    unwrapped,
    verdict,
    weights,
)

# ---- resume and bf16-resume: weights, optimizer state, data order and the device's RNG, vs the straight run -------
RESUME_TOL = 1e-5  # same GPU, same kernels, TF32 off: bitwise unless cuDNN picked an atomics-based kernel
# bf16 autocast keeps fp32 master weights and momentum; the straight and the resumed run compute the same ops in the
# same order on one GPU (deterministic cuDNN and cuBLAS), so they are bitwise equal, as on the CPU (measured: 0.0,
# bn_dropout_net in bf16 with channels_last, 40 steps, stopped at 17). A reordered reduction is not small in bf16:
# one thread instead of two moved that CPU run by 7.5e-3, more than a real mistake does (a valid but wrong RNG state
# restored at the stop: 8.6e-4; the momentum lost: 7.4e-2). So only near-bitwise can pass: 1e-4, 8x below the
# smallest mistake measured.
BF16_RESUME_TOL = 1e-4
ORDER_REL_TOL = 1e-9  # the same batch gives the same float64 checksum; another batch differs in the 2nd digit
RESUME_STEPS, RESUME_STOP = 40, 17  # 2048 samples of 64: the epoch ends at step 32, between the stop and the end
BN_DROPOUT_NET = "benchmarks.gpu_acceptance.models:bn_dropout_net"  # BatchNorm and F.dropout: the CUDA RNG in a CNN
DROPOUT_NET = "benchmarks.gpu_acceptance.models:dropout_net"  # F.dropout in forward: the CUDA RNG


def _stop_resume_steps(ctx: Context, check: str, args: list[str]) -> list[Step]:
    """Straight to the end; stopped at RESUME_STOP and resumed in one folder. Each records its inputs' checksums
    (``$GPU_PROBE_RECORD``, read by the data-order comparison); deterministic cuBLAS, TF32 off."""

    def env(label: str) -> dict[str, str]:
        return {**DETERMINISTIC, "GPU_PROBE_RECORD": str(ctx.work / check / f"{label}.jsonl")}

    stop = ("--stop-at-step", str(RESUME_STOP))
    return [
        train_step("straight", ctx, check, *args, env=env("straight")),
        train_step("stopped", ctx, check, *args, *stop, run="resumed", env=env("stopped")),
        train_step("resumed", ctx, check, *args, "--resume", "auto", env=env("resumed")),
    ]


def bf16_resume_check(ctx: Context) -> Check:
    args = ["--model", BN_DROPOUT_NET, *CIFAR_SHAPED, "--synthetic-size", "2048", "--synthetic-test-size", "256"]
    args += [*SGD, "--mixed-precision", "bf16", "--batch-size", "64", "--max-steps", str(RESUME_STEPS)]
    args += ["--log-every", "5"]  # no --channels-last: the default a CNN gets under bf16 on CUDA is what is checked
    return Check(
        "bf16-resume",
        f"one GPU trains a BatchNorm CNN with F.dropout in bf16 (channels_last by default), checkpoints at step "
        f"{RESUME_STOP} and resumes to {RESUME_STEPS} (across an epoch end), vs straight to {RESUME_STEPS}; SGD",
        f"both runs are bf16 in channels_last on the GPU; weights and optimizer state within {BF16_RESUME_TOL:g} "
        "of the straight run's (the same kernels in both: bitwise expected), the same batches in the same order, "
        "the CUDA RNG advanced by dropout and equal at the end, no RNG-restore error",
        45, _stop_resume_steps(ctx, "bf16-resume", args), measure_bf16_resume,
        judge_bf16_resume, exercises="training, a checkpoint and its resume on one GPU in the CUDA default for CNNs "
        "(bf16 autocast, channels_last weights through safetensors, the CUDA RNG)",
        expected_steps=RESUME_STEPS, stop_at=RESUME_STOP, model=BN_DROPOUT_NET,
    )  # fmt: skip


def resume_check(ctx: Context) -> Check:
    args = ["--model", DROPOUT_NET, "--dataset", "synthetic", "--synthetic-size", "2048"]
    args += ["--synthetic-test-size", "256", *SGD, "--batch-size", "64", "--max-steps", str(RESUME_STEPS)]
    args += ["--log-every", "5"]
    return Check(
        "resume",
        f"a model with F.dropout in forward (the CUDA RNG) stopped at step {RESUME_STOP} and resumed to "
        f"{RESUME_STEPS} (across an epoch end), vs straight to {RESUME_STEPS}; SGD, TF32 off",
        f"weights and optimizer state within {RESUME_TOL:g} of the straight run's, the same batches in the same "
        "order (input checksums), the CUDA RNG advanced by dropout and equal at the end, no RNG-restore error",
        35, _stop_resume_steps(ctx, "resume", args), measure_resume, judge_resume,
        exercises="checkpoint/resume on the GPU in fp32 with state that really uses the CUDA RNG",
        expected_steps=RESUME_STEPS, stop_at=RESUME_STOP,
    )  # fmt: skip


def measure_resume(ctx, outputs, check) -> dict[str, Any]:
    records = [check.step(label).env["GPU_PROBE_RECORD"] for label in ("straight", "stopped", "resumed")]
    return resume_measurements(
        check.step("straight").out_dir, check.step("resumed").out_dir, outputs["resumed"].output, records,
        check.stop_at, check.expected_steps,
    )  # fmt: skip


def resume_measurements(
    straight: Path, resumed: Path, resumed_output: str, records: list[str], stop_at: int, steps: int
) -> dict[str, Any]:
    from accel_train.checkpoint.safe_load import safe_torch_load

    s, r = summary(straight), summary(resumed)
    m: dict[str, Any] = {"device": s.get("device"), "global_steps": [s.get("global_step"), r.get("global_step")]}
    m["expected_steps"], m["stop_at"] = steps, stop_at
    m["weights_max_abs_diff"] = tensor_diff(weights(straight), weights(resumed))
    (a_step, a), (b_step, b) = checkpoints(straight)[-1], checkpoints(resumed)[-1]
    m["checkpoint_steps"] = [a_step, b_step]
    opt_a, opt_b = safe_torch_load(a / "optimizer.bin"), safe_torch_load(b / "optimizer.bin")
    m["optimizer_max_abs_diff"] = tensor_diff(flat_tensors(opt_a["state"]), flat_tensors(opt_b["state"]))
    m["optimizer_tensors"] = len(flat_tensors(opt_a["state"]))
    m["rng"] = rng_comparison(straight, resumed)
    m["data_order"] = order_comparison(records, stop_at)
    m["resume_reported"] = "resumed from" in resumed_output
    restore = r"random state is not restored|Could not load random states|starts from a fresh seed"
    m["restore_errors"] = [line.strip()[:200] for line in resumed_output.splitlines() if re.search(restore, line)]
    return m


def rng_comparison(straight: Path, resumed: Path) -> dict[str, dict[str, bool]]:
    """For the CPU and the CUDA generator: did it advance between the straight run's last two checkpoints
    (something used it), and is it the same at the end of both runs (the resume restored it)?"""
    from accel_train.checkpoint.safe_load import RNG_FILE, safe_torch_load

    (_, before), (_, after) = checkpoints(straight)[-2:]
    resumed_last = checkpoints(resumed)[-1][1]
    states = [safe_torch_load(p / RNG_FILE.format(0)) for p in (before, after, resumed_last)]
    found = {}
    for kind, key in (("cpu", "torch_manual_seed"), ("cuda", "torch_cuda_manual_seed")):
        if all(key in st for st in states):
            b, a, r = (flat_tensors(st[key]) for st in states)
            found[kind] = {"advanced": tensor_diff(b, a) > 0, "equal": tensor_diff(a, r) == 0}
    return found


def _read_records(path: str) -> list[dict[str, float]]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines() if line] if p.is_file() else []


def order_comparison(records: list[str], stop_at: int) -> dict[str, Any]:
    """The batches the stopped and resumed runs trained on, against the straight run's steps 1..stop and
    stop+1..: the largest relative difference of their checksums (infinity when the counts differ)."""
    straight, stopped, resumed = (_read_records(p) for p in records)
    pairs = list(zip(straight[:stop_at], stopped, strict=False)) + list(zip(straight[stop_at:], resumed, strict=False))
    counts = [len(straight), len(stopped), len(resumed)]
    ok_counts = len(straight) == len(stopped) + len(resumed) and len(stopped) == stop_at and straight
    worst = 0.0
    for x, y in pairs:
        for k in ("sum", "sq"):
            worst = max(worst, abs(x[k] - y[k]) / max(abs(x[k]), 1e-30))
        worst = max(worst, 0.0 if x["n"] == y["n"] else math.inf)
    return {"batches": counts, "max_rel_diff": worst if ok_counts else math.inf}


def _resume_problems(m: dict[str, Any], tol: float) -> list[str]:
    steps, problems = m.get("expected_steps"), []
    if m.get("global_steps") != [steps, steps]:
        problems.append(f"global steps {m.get('global_steps')}, expected {steps} and {steps}")
    if not m.get("resume_reported"):
        problems.append("the resumed run did not say 'resumed from'")
    problems += [f"restore error: {line}" for line in m.get("restore_errors", [])[:2]]
    for what, key in (("weights", "weights_max_abs_diff"), ("optimizer state", "optimizer_max_abs_diff")):
        if not m.get(key, math.inf) <= tol:
            problems.append(f"{what} differ from the straight run's by {fmt(m.get(key))} (> {tol:g})")
    order = m.get("data_order", {})
    if not order.get("max_rel_diff", math.inf) <= ORDER_REL_TOL:
        problems.append(
            f"data order differs (batches {order.get('batches')}, max rel {fmt(order.get('max_rel_diff'))})"
        )
    kind = _device_kind(m)
    rng = m.get("rng", {}).get(kind)
    if rng is None:
        problems.append(f"no {kind} RNG state in the checkpoints")
    elif not rng["advanced"]:
        problems.append(f"the {kind} RNG never advanced, so nothing used it and the RNG check proves nothing")
    elif not rng["equal"]:
        problems.append(f"the {kind} RNG state at the end differs from the straight run's: it was not restored")
    return problems


def _device_kind(m: dict[str, Any]) -> str:
    return "cuda" if str(m.get("device", "")).startswith("cuda") else "cpu"


def _resume_detail(m: dict[str, Any]) -> str:
    return (
        f"weights {fmt(m['weights_max_abs_diff'])}, optimizer {fmt(m['optimizer_max_abs_diff'])} from the straight "
        f"run; {m.get('data_order', {}).get('batches', [0])[0]} batches in the same order; the {_device_kind(m)} "
        "RNG (F.dropout) restored"
    )


def judge_resume(m: dict[str, Any]) -> tuple[str, str]:
    return verdict(_resume_problems(m, RESUME_TOL), _resume_detail(m))


def measure_bf16_resume(ctx, outputs, check) -> dict[str, Any]:
    m = measure_resume(ctx, outputs, check)
    m["runs"] = {label: run_facts(check.step(label).out_dir) for label in ("straight", "resumed")}
    return m


def judge_bf16_resume(m: dict[str, Any]) -> tuple[str, str]:
    """The resume judge at BF16_RESUME_TOL, and both runs in the CUDA default for a CNN: bf16, channels_last."""
    problems = _resume_problems(m, BF16_RESUME_TOL)
    for name in ("straight", "resumed"):
        f = m.get("runs", {}).get(name, {})
        if (f.get("mixed_precision"), f.get("channels_last")) != ("bf16", True):
            problems.append(f"{name}: mixed_precision {f.get('mixed_precision')!r}, channels_last "
                            f"{f.get('channels_last')!r}; expected bf16 in channels_last")  # fmt: skip
    bitwise = m.get("weights_max_abs_diff") == 0 and m.get("optimizer_max_abs_diff") == 0
    return verdict(problems, f"bf16, channels_last: {'bitwise equal' if bitwise else 'near'}; {_resume_detail(m)}")


# ---- FSDP: resumed vs straight, and the export vs the sharded checkpoint ------------------------------------------
FSDP_TOL = 1e-5  # bn_net under FSDP at world size 1, fp32, deterministic cuDNN, the same kernels in both runs
EXPORT_TOL = 0.0  # the exported weights are the checkpoint's tensors, gathered: nothing may change them
FSDP_STEPS, FSDP_STOP = 12, 5


def fsdp_check(ctx: Context) -> Check:
    args = ["--model", BN_NET, *SMALL_CIFAR, *SGD, "--mixed-precision", "no", "--batch-size", "32"]
    args += ["--max-steps", str(FSDP_STEPS), "--log-every", "1"]
    kw: dict[str, Any] = {"config": "fsdp.yaml", "launch_args": ("--num_processes", "1"), "env": DETERMINISTIC}
    steps = [
        train_step("straight", ctx, "fsdp", *args, **kw),
        train_step("stopped", ctx, "fsdp", *args, "--stop-at-step", str(FSDP_STOP), run="resumed", **kw),
        train_step("resumed", ctx, "fsdp", *args, "--resume", "auto", **kw),
    ]
    return Check(
        "fsdp",
        f"fsdp.yaml at world size 1 on a small BatchNorm CNN, fp32 SGD: sharded checkpoint at step {FSDP_STOP}, "
        f"resume to {FSDP_STEPS}, vs a straight FSDP run",
        f"the resumed run within {FSDP_TOL:g} of the straight one, model/model.safetensors equal to the "
        "sharded checkpoint's tensors (merged on the CPU) and to the model's own keys, shapes and dtypes",
        75, steps, measure_fsdp, judge_fsdp,
        exercises="FSDP2 save/resume/export at world size 1 (a shard is the whole tensor: no sharding across ranks)",
        expected_steps=FSDP_STEPS, stop_at=FSDP_STOP, model=BN_NET,
    )  # fmt: skip


def measure_fsdp(ctx, outputs, check) -> dict[str, Any]:
    straight, resumed = check.step("straight").out_dir, check.step("resumed").out_dir
    m = {"straight": run_facts(straight), "resumed": run_facts(resumed), "expected_steps": check.expected_steps}
    m["resume_reported"] = "resumed from" in outputs["resumed"].output
    exported = weights(resumed)
    m["resumed_vs_straight"] = tensor_diff(weights(straight), exported)
    step, last = checkpoints(resumed)[-1]
    m["checkpoint_step"] = step
    try:
        m["export_vs_checkpoint"] = tensor_diff(exported, merged_fsdp_weights(last))
    except Exception as exc:  # noqa: BLE001 - reported: the export could not be compared
        m["export_vs_checkpoint"], m["merge_error"] = math.inf, f"{type(exc).__name__}: {exc}"[:300]
    m["keys_vs_model"] = keys_vs_model(exported, check.model, 3, 32)
    return m


def merged_fsdp_weights(checkpoint: Path) -> dict:
    """The model tensors of an FSDP sharded checkpoint (``pytorch_model_fsdp_0/``), gathered on the CPU as
    ``accelerate merge-weights`` gathers them (torch's distributed-checkpoint reader, no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner, _load_state_dict

    shards = sorted(p for p in checkpoint.iterdir() if p.is_dir() and p.name.startswith("pytorch_model_fsdp"))
    if not shards:
        raise FileNotFoundError(f"no pytorch_model_fsdp_* folder in {checkpoint}")
    state: dict = {}
    _load_state_dict(state, storage_reader=dcp.FileSystemReader(str(shards[0])),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)  # fmt: skip
    while len(state) == 1 and isinstance(next(iter(state.values())), dict):  # {"model": {...}}
        state = next(iter(state.values()))
    return state


def keys_vs_model(exported: dict, model: str, channels: int, size: int) -> list[str]:
    """Keys, shapes and dtypes the export gets wrong against the model's own state dict (empty: none)."""
    import torch

    from accel_train.models import create_model

    with torch.device("meta"):
        own = create_model(model, num_classes=10, in_channels=channels, image_size=size).state_dict()
    got = {unwrapped(k): v for k, v in exported.items()}
    wrong = [f"missing {k}" for k in own if k not in got] + [f"extra {k}" for k in got if k not in own]
    wrong += [f"{k}: {tuple(got[k].shape)} {got[k].dtype}" for k in own if k in got and
              (got[k].shape, got[k].dtype) != (own[k].shape, own[k].dtype)]  # fmt: skip
    return wrong[:10]


def judge_fsdp(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    for name in ("straight", "resumed"):
        f = m.get(name, {})
        problems += run_problems(name, f, steps)
        if (f.get("distributed_type"), f.get("world_size")) != ("FSDP", 1):
            problems.append(f"{name}: {f.get('distributed_type')} at world size {f.get('world_size')}, not FSDP at 1")
    if not m.get("resume_reported"):
        problems.append("the resumed run did not say 'resumed from'")
    if not m.get("resumed_vs_straight", math.inf) <= FSDP_TOL:
        problems.append(f"resumed vs straight FSDP run: {fmt(m.get('resumed_vs_straight'))} (> {FSDP_TOL:g})")
    if not m.get("export_vs_checkpoint", math.inf) <= EXPORT_TOL:
        why = m.get("merge_error") or fmt(m.get("export_vs_checkpoint"))
        problems.append(f"model/model.safetensors vs the sharded checkpoint: {why}")
    if m.get("keys_vs_model"):
        problems.append(f"the export does not match the model's state dict: {', '.join(m['keys_vs_model'][:3])}")
    return verdict(problems, (
        f"resumed vs straight FSDP {fmt(m['resumed_vs_straight'])}; export = sharded checkpoint at step "
        f"{m.get('checkpoint_step')} ({fmt(m['export_vs_checkpoint'])}); the model's keys, shapes and dtypes"
    ))  # fmt: skip


# ---- compile: stop and resume under --compile, vs an eager straight run -------------------------------------------
COMPILE_TOL = 1e-5  # compiled straight vs compiled stop+resume: the same kernels
COMPILE_VS_EAGER_TOL = 1e-2  # inductor fuses and reorders fp32 math; round-off grows over steps but stays far
COMPILE_STEPS, COMPILE_STOP = 20, 8


def compile_check(ctx: Context) -> Check:
    args = ["--model", BN_NET, "--dataset", "synthetic", "--synthetic-size", "1024", "--synthetic-test-size", "128"]
    args += [*SGD, "--batch-size", "64", "--max-steps", str(COMPILE_STEPS), "--log-every", "4"]
    env = {**DETERMINISTIC, "TORCHINDUCTOR_CACHE_DIR": str(ctx.work / "compile" / "inductor")}
    stop = ("--stop-at-step", str(COMPILE_STOP))
    steps = [
        train_step("eager", ctx, "compile", *args, env=DETERMINISTIC),
        train_step("straight", ctx, "compile", *args, "--compile", env=env),
        train_step("stopped", ctx, "compile", *args, "--compile", *stop, run="resumed", env=env),
        train_step("resumed", ctx, "compile", *args, "--compile", "--resume", "auto", env=env),
    ]
    return Check(
        "compile",
        f"--compile on CUDA (inductor): straight to {COMPILE_STEPS}, and stopped at {COMPILE_STOP} then resumed "
        "across an epoch end; an eager straight run beside them",
        f"inductor wrote kernels, the compiled stop+resume is within {COMPILE_TOL:g} of the compiled straight "
        f"run and within {COMPILE_VS_EAGER_TOL:g} of the eager one (fusion changes round-off, not training), "
        "and its export has no _orig_mod. prefix",
        150, steps, measure_compile, judge_compile,
        exercises="torch.compile on CUDA through accelerate, with a checkpoint in between",
        expected_steps=COMPILE_STEPS, stop_at=COMPILE_STOP,
    )  # fmt: skip


def measure_compile(ctx, outputs, check) -> dict[str, Any]:
    eager, straight, compiled = (check.step(k).out_dir for k in ("eager", "straight", "resumed"))
    exported = weights(compiled)
    cache = Path(check.step("stopped").env["TORCHINDUCTOR_CACHE_DIR"])
    return {
        "eager": run_facts(eager),
        "straight": run_facts(straight),
        "compiled": run_facts(compiled),
        "compile_flag": _config(compiled).get("compile"),
        "expected_steps": check.expected_steps,
        "resume_reported": "resumed from" in outputs["resumed"].output,
        "resumed_vs_straight": tensor_diff(weights(straight), exported),
        "compiled_vs_eager": tensor_diff(weights(eager), exported),
        "wrapped_keys": [k for k in exported if k.startswith(PREFIXES)][:5],
        "inductor_files": sum(1 for p in cache.rglob("*.py")) if cache.is_dir() else 0,
    }


def _config(run: Path) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load((Path(run) / "config.yaml").read_text()) or {}
    return {k: v for k, v in data.items() if k != "resolved"}


def judge_compile(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    for name in ("eager", "straight", "compiled"):
        problems += run_problems(name, m.get(name, {}), steps)
    if m.get("compile_flag") is not True:
        problems.append(f"the resumed run's config says compile {m.get('compile_flag')!r}")
    if not m.get("inductor_files"):
        problems.append("inductor wrote no kernels: nothing was compiled")
    if not m.get("resume_reported"):
        problems.append("the resumed run did not say 'resumed from'")
    if m.get("wrapped_keys"):
        problems.append(f"the export keeps wrapper prefixes: {m['wrapped_keys'][:3]}")
    if not m.get("resumed_vs_straight", math.inf) <= COMPILE_TOL:
        problems.append(f"compiled stop+resume vs compiled straight: {fmt(m.get('resumed_vs_straight'))} "
                        f"(> {COMPILE_TOL:g})")  # fmt: skip
    if not m.get("compiled_vs_eager", math.inf) <= COMPILE_VS_EAGER_TOL:
        problems.append(f"compiled vs eager: {fmt(m.get('compiled_vs_eager'))} (> {COMPILE_VS_EAGER_TOL:g})")
    return verdict(problems, (
        f"compiled stop+resume vs compiled straight {fmt(m['resumed_vs_straight'])}, vs eager "
        f"{fmt(m['compiled_vs_eager'])}; {m['inductor_files']} inductor kernel files; export unwrapped"
    ))  # fmt: skip
