"""What each GPU acceptance check measures (``measure_*``: reads the runs) and how it is judged (``judge_*``).

A judge takes the measurements alone and returns ``(status, one-line detail)``, so a unit test without a
GPU can hand it a deliberately wrong result and see it fail (tests/test_gpu_acceptance.py). Where a
comparison could pass without proving anything, the check carries its own control and the judge demands
it: the resume's RNG must have advanced (else nothing used it), the unsynchronised BatchNorm run must
differ (else --sync-bn's agreement says nothing), the compiled run must have left inductor's kernels.

Comparisons between runs use SGD with TF32 off: a weight then differs by about lr x (the gradient's
round-off) per step, while a real mistake (a wrong batch, a lost optimizer or RNG state) moves it by about
lr x the gradient itself, orders of magnitude more.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from benchmarks.gpu_runner import FAIL, NOT_RUN, PASS

RESUME_TOL = 1e-5  # same GPU, same kernels, TF32 off: bitwise unless cuDNN picked an atomics-based kernel
ORDER_REL_TOL = 1e-9  # the same batch gives the same float64 checksum; another batch differs in the 2nd digit
FSDP_TOL = 1e-5  # bn_net under FSDP at world size 1, fp32, deterministic cuDNN, the same kernels in both runs
EXPORT_TOL = 0.0  # the exported weights are the checkpoint's tensors, gathered: nothing may change them
COMPILE_TOL = 1e-5  # compiled straight vs compiled stop+resume: the same kernels
COMPILE_VS_EAGER_TOL = 1e-2  # inductor fuses and reorders fp32 math; round-off grows over steps but stays far
# below what wrong gradients do (O(lr) per step, and the loss would differ)
DDP_TOL = 1e-5  # DDP over NCCL at world size 1 vs one plain process: the same math
SYNC_BN_TOL = 1e-4  # SyncBatchNorm's gathered statistics vs one process's, summed in another order
SYNC_BN_RATIO = 10  # the unsynchronised control must be at least this many times farther from one process
# (on the CPU analogue, bn_net after 6 steps: synced 1.8e-7, unsynced 2.2e-3 from one process)
DP_TOL = 1e-5  # DataParallel's reduced gradient vs one module's, fp32 with TF32 off
FP16_MAX_SKIPPED = 0.1  # more overflowed steps than this share means the loss scale never settled
THROUGHPUT_ROWS = ("fp32", "tf32", "bf16", "fp16")
SPEEDRUN_STEPS = 648  # configs/airbench_cifar10.yaml's max_steps (13.5 epochs of 48 batches of 1024)
SPEEDRUN_PUBLISHED_S = 5.5  # airbench's A100 seconds for that recipe (benchmarks/speedrun.py, PUBLISHED)
_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")


# ---- reading runs -----------------------------------------------------------------------------------------------
def summary(run: Path) -> dict[str, Any]:
    return json.loads((Path(run) / "summary.json").read_text())


def resolved(run: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((Path(run) / "config.yaml").read_text()).get("resolved") or {}


def weights(run: Path, sub: str = "model") -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(run) / sub / "model.safetensors"))


def _unwrapped(key: str) -> str:
    while key.startswith(_PREFIXES):
        key = key.split(".", 1)[1]
    return key


def tensor_diff(a: dict, b: dict) -> float:
    """Largest |a - b| over every tensor; infinity when the key sets or shapes differ (no comparison possible)."""
    a = {_unwrapped(k): v for k, v in a.items()}
    b = {_unwrapped(k): v for k, v in b.items()}
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


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _verdict(problems: list[str], ok: str) -> tuple[str, str]:
    return (FAIL, "; ".join(problems)) if problems else (PASS, ok)


def _g(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _run_facts(run: Path) -> dict[str, Any]:
    s, r = summary(run), resolved(run)
    keys = ("global_step", "eval_loss", "device", "mixed_precision", "distributed_type", "world_size")
    facts = {k: s.get(k) for k in keys}
    facts.update({k: r.get(k) for k in ("tf32", "channels_last", "data_on_device", "micro_batch", "accum_steps")})
    facts.update(global_batch=r.get("global_batch"), augment=r.get("augment"))
    return facts


def _run_problems(name: str, f: dict[str, Any], steps: int, device: str = "cuda") -> list[str]:
    problems = []
    if f.get("global_step") != steps:
        problems.append(f"{name}: {f.get('global_step')} steps, expected {steps}")
    if not _finite(f.get("eval_loss")):
        problems.append(f"{name}: eval_loss {f.get('eval_loss')!r} is not finite")
    if not str(f.get("device", "")).startswith(device):
        problems.append(f"{name}: ran on {f.get('device')!r}, not {device}")
    return problems


# ---- setup: the carried wheels import, CUDA is there ------------------------------------------------------------
def measure_setup(ctx, outputs, check) -> dict[str, Any]:
    return json.loads(Path(check.step("imports").argv[-1]).read_text())


def judge_setup(m: dict[str, Any]) -> tuple[str, str]:
    problems = [f"import {k} failed: {v}" for k, v in m.get("errors", {}).items()]
    if not m.get("cuda", {}).get("available"):
        problems.append("torch sees no CUDA GPU")
    if not (_finite(m.get("metric_accuracy")) and abs(m["metric_accuracy"] - 2 / 3) < 1e-9):
        problems.append(f"the accuracy metric computed {m.get('metric_accuracy')!r} for 2 of 3 right")
    secs = m.get("seconds", {})
    times = ", ".join(f"{k} {v:.1f} s" for k, v in secs.items())
    extra = " (imports transformers)" if m.get("transformers_imported_by_evaluate") else ""
    return _verdict(problems, f"imports: {times}{extra}; {m.get('cuda', {}).get('device')}")


# ---- pytest -------------------------------------------------------------------------------------------------------
_OUTCOME = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def measure_pytest(ctx, outputs, check) -> dict[str, Any]:
    out = outputs["pytest"]
    return pytest_counts(out.output, out.returncode)


def pytest_counts(output: str, returncode: int | None) -> dict[str, Any]:
    """Counts from pytest's last line; from its per-test lines (``-v``) when it was killed before that line."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors", "deselected")}
    final = [line for line in output.splitlines() if re.match(r"^=+ .*\bin [\d.]+s", line)]
    if final:
        for n, word in _SUMMARY.findall(final[-1]):
            key = "errors" if word.startswith("error") else word
            if key in counts:
                counts[key] = int(n)
    else:
        words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}
        for line in output.splitlines():
            hit = _OUTCOME.search(line) if "::" in line else None
            if hit and hit.group(1) in words:
                counts[words[hit.group(1)]] += 1
    failed = sorted({m for m in re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)})
    return {**counts, "returncode": returncode, "finished": bool(final), "failed_tests": failed[:20]}


def judge_pytest(m: dict[str, Any]) -> tuple[str, str]:
    line = f"{m['passed']} passed, {m['failed']} failed, {m['errors']} errors, {m['skipped']} skipped"
    ok = m.get("returncode") == 0 and m["passed"] > 0 and m["failed"] == m["errors"] == 0
    if ok:
        return PASS, line
    why = f" ({', '.join(m['failed_tests'][:5])})" if m.get("failed_tests") else ""
    if m["passed"] == 0 and not m["failed"]:
        why += " (nothing passed: were the GPU tests skipped?)"
    return FAIL, f"{line}, pytest exit {m.get('returncode')}{why}"


# ---- throughput: fp32 (TF32 off), tf32, bf16, fp16 as separate rows ----------------------------------------------
def measure_throughput(ctx, outputs, check) -> dict[str, Any]:
    gemm = json.loads(Path(check.step("gemm").argv[-1]).read_text())
    runs = {}
    for row in THROUGHPUT_ROWS:
        run = check.step(row).out_dir
        s = summary(run)
        runs[row] = {
            **_run_facts(run),
            "samples_per_s": s.get("train_samples_per_s"),
            "peak_memory_mb": s.get("peak_memory_mb"),
            "reserved_memory_mb": s.get("peak_reserved_memory_mb"),
            "data_wait_fraction": s.get("data_wait_fraction"),
            "fp16_skipped_steps": s.get("fp16_skipped_steps"),
            "loss_scale": s.get("loss_scale"),
        }
    return throughput_metrics(gemm, runs, check.expected_steps)


def throughput_metrics(gemm: dict[str, Any], runs: dict[str, dict[str, Any]], steps: int) -> dict[str, Any]:
    """MFU and speed-ups of each row, from the GEMM probe's peak and the model's FLOPs per sample."""
    flops, peak = gemm.get("train_flops_per_sample"), gemm.get("peak_bf16_tflops")
    for run in runs.values():
        rate = run.get("samples_per_s")
        if _finite(rate) and _finite(flops) and _finite(peak) and peak > 0:
            run["achieved_tflops"] = round(flops * rate / 1e12, 2)
            run["mfu"] = round(flops * rate / (peak * 1e12), 4)
    speedups = {}
    for base in ("fp32", "tf32"):
        base_rate = runs.get(base, {}).get("samples_per_s")
        if _finite(base_rate) and base_rate > 0:
            speedups[base] = {
                row: round(r["samples_per_s"] / base_rate, 3)
                for row, r in runs.items()
                if _finite(r.get("samples_per_s"))
            }
    return {
        "peak_bf16_tflops": peak,
        "train_flops_per_sample": flops,
        "expected_steps": steps,
        "runs": runs,
        "speedup_vs_fp32": speedups.get("fp32", {}),
        "speedup_vs_tf32": speedups.get("tf32", {}),
    }


def judge_throughput(m: dict[str, Any]) -> tuple[str, str]:
    runs, problems = m.get("runs", {}), []
    for row in THROUGHPUT_ROWS:
        if row not in runs:
            problems.append(f"no {row} row")
            continue
        problems += _row_problems(row, runs[row], m.get("expected_steps"))
    if not _finite(m.get("peak_bf16_tflops")):
        problems.append("no GEMM peak measured")
    if problems:
        return FAIL, "; ".join(problems)
    rates = ", ".join(f"{row} {runs[row]['samples_per_s']:,.0f}" for row in THROUGHPUT_ROWS)
    best = max(THROUGHPUT_ROWS, key=lambda r: runs[r]["samples_per_s"])
    mfu = runs[best].get("mfu")
    return PASS, (
        f"samples/s: {rates}; best {best}, MFU {mfu:.1%} of the measured {m['peak_bf16_tflops']} TFLOP/s bf16 peak; "
        f"fp16 loss scale {runs['fp16']['loss_scale']:g}"
    )


def _row_problems(row: str, r: dict[str, Any], steps: int | None) -> list[str]:
    problems = _run_problems(row, r, steps) if steps else []
    precision = row if row in ("bf16", "fp16") else "no"
    if r.get("mixed_precision") != precision:
        problems.append(f"{row}: mixed_precision {r.get('mixed_precision')!r}, expected {precision!r}")
    if row in ("fp32", "tf32") and r.get("tf32") is not (row == "tf32"):
        problems.append(f"{row}: the run says tf32 {r.get('tf32')!r}")
    if not (_finite(r.get("samples_per_s")) and r["samples_per_s"] > 0):
        problems.append(f"{row}: no samples/s")
    scale, skipped = r.get("loss_scale"), r.get("fp16_skipped_steps")
    if row != "fp16":
        if scale is not None:
            problems.append(f"{row}: a loss scale ({scale}) without fp16")
        return problems
    if not (_finite(scale) and scale >= 1 and math.log2(scale).is_integer()):
        problems.append(f"fp16: loss scale {scale!r} is not a real GradScaler scale (a power of two >= 1)")
    if not isinstance(skipped, int) or isinstance(skipped, bool):
        problems.append(f"fp16: fp16_skipped_steps is {skipped!r}, not a count")
    elif steps and skipped > FP16_MAX_SKIPPED * steps:
        problems.append(f"fp16: {skipped} of {steps} steps overflowed and were skipped")
    return problems


# ---- resume: weights, optimizer state, data order and the device's RNG, vs the straight run -----------------------
def measure_resume(ctx, outputs, check) -> dict[str, Any]:
    records = [check.step(label).env["GPU_PROBE_RECORD"] for label in ("straight", "stopped", "resumed")]
    return resume_measurements(
        check.step("straight").out_dir, check.step("resumed").out_dir, outputs["resumed"].output, records,
        check.stop_at, check.expected_steps,
    )  # fmt: skip


def resume_measurements(
    straight: Path, resumed: Path, resumed_output: str, records: list[str], stop_at: int, steps: int
) -> dict[str, Any]:
    from accel_train.checkpoint.verify import safe_torch_load

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
    from accel_train.checkpoint.verify import RNG_FILE, safe_torch_load

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


def judge_resume(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    if m.get("global_steps") != [steps, steps]:
        problems.append(f"global steps {m.get('global_steps')}, expected {steps} and {steps}")
    if not m.get("resume_reported"):
        problems.append("the resumed run did not say 'resumed from'")
    problems += [f"restore error: {line}" for line in m.get("restore_errors", [])[:2]]
    for what, key in (("weights", "weights_max_abs_diff"), ("optimizer state", "optimizer_max_abs_diff")):
        if not m.get(key, math.inf) <= RESUME_TOL:
            problems.append(f"{what} differ from the straight run's by {_g(m.get(key))} (> {RESUME_TOL:g})")
    order = m.get("data_order", {})
    if not order.get("max_rel_diff", math.inf) <= ORDER_REL_TOL:
        problems.append(f"data order differs (batches {order.get('batches')}, max rel {_g(order.get('max_rel_diff'))})")
    kind = "cuda" if str(m.get("device", "")).startswith("cuda") else "cpu"
    rng = m.get("rng", {}).get(kind)
    if rng is None:
        problems.append(f"no {kind} RNG state in the checkpoints")
    elif not rng["advanced"]:
        problems.append(f"the {kind} RNG never advanced, so nothing used it and the RNG check proves nothing")
    elif not rng["equal"]:
        problems.append(f"the {kind} RNG state at the end differs from the straight run's: it was not restored")
    return _verdict(problems, (
        f"weights {_g(m['weights_max_abs_diff'])}, optimizer {_g(m['optimizer_max_abs_diff'])} from the straight "
        f"run; {order.get('batches', [0])[0]} batches in the same order; the {kind} RNG (F.dropout) restored"
    ))  # fmt: skip


# ---- FSDP: resumed vs straight, and the export vs the sharded checkpoint -----------------------------------------
def measure_fsdp(ctx, outputs, check) -> dict[str, Any]:
    straight, resumed = check.step("straight").out_dir, check.step("resumed").out_dir
    m = {"straight": _run_facts(straight), "resumed": _run_facts(resumed), "expected_steps": check.expected_steps}
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
    got = {_unwrapped(k): v for k, v in exported.items()}
    wrong = [f"missing {k}" for k in own if k not in got] + [f"extra {k}" for k in got if k not in own]
    wrong += [f"{k}: {tuple(got[k].shape)} {got[k].dtype}" for k in own if k in got and
              (got[k].shape, got[k].dtype) != (own[k].shape, own[k].dtype)]  # fmt: skip
    return wrong[:10]


def judge_fsdp(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    for name in ("straight", "resumed"):
        f = m.get(name, {})
        problems += _run_problems(name, f, steps)
        if (f.get("distributed_type"), f.get("world_size")) != ("FSDP", 1):
            problems.append(f"{name}: {f.get('distributed_type')} at world size {f.get('world_size')}, not FSDP at 1")
    if not m.get("resume_reported"):
        problems.append("the resumed run did not say 'resumed from'")
    if not m.get("resumed_vs_straight", math.inf) <= FSDP_TOL:
        problems.append(f"resumed vs straight FSDP run: {_g(m.get('resumed_vs_straight'))} (> {FSDP_TOL:g})")
    if not m.get("export_vs_checkpoint", math.inf) <= EXPORT_TOL:
        why = m.get("merge_error") or _g(m.get("export_vs_checkpoint"))
        problems.append(f"model/model.safetensors vs the sharded checkpoint: {why}")
    if m.get("keys_vs_model"):
        problems.append(f"the export does not match the model's state dict: {', '.join(m['keys_vs_model'][:3])}")
    return _verdict(problems, (
        f"resumed vs straight FSDP {_g(m['resumed_vs_straight'])}; export = sharded checkpoint at step "
        f"{m.get('checkpoint_step')} ({_g(m['export_vs_checkpoint'])}); the model's keys, shapes and dtypes"
    ))  # fmt: skip


# ---- compile: stop and resume under --compile, vs an eager straight run ------------------------------------------
def measure_compile(ctx, outputs, check) -> dict[str, Any]:
    eager, straight, compiled = (check.step(k).out_dir for k in ("eager", "straight", "resumed"))
    exported = weights(compiled)
    cache = Path(check.step("stopped").env["TORCHINDUCTOR_CACHE_DIR"])
    return {
        "eager": _run_facts(eager),
        "straight": _run_facts(straight),
        "compiled": _run_facts(compiled),
        "compile_flag": _config(compiled).get("compile"),
        "expected_steps": check.expected_steps,
        "resume_reported": "resumed from" in outputs["resumed"].output,
        "resumed_vs_straight": tensor_diff(weights(straight), exported),
        "compiled_vs_eager": tensor_diff(weights(eager), exported),
        "wrapped_keys": [k for k in exported if k.startswith(_PREFIXES)][:5],
        "inductor_files": sum(1 for p in cache.rglob("*.py")) if cache.is_dir() else 0,
    }


def _config(run: Path) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load((Path(run) / "config.yaml").read_text()) or {}
    return {k: v for k, v in data.items() if k != "resolved"}


def judge_compile(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    for name in ("eager", "straight", "compiled"):
        problems += _run_problems(name, m.get(name, {}), steps)
    if m.get("compile_flag") is not True:
        problems.append(f"the resumed run's config says compile {m.get('compile_flag')!r}")
    if not m.get("inductor_files"):
        problems.append("inductor wrote no kernels: nothing was compiled")
    if not m.get("resume_reported"):
        problems.append("the resumed run did not say 'resumed from'")
    if m.get("wrapped_keys"):
        problems.append(f"the export keeps wrapper prefixes: {m['wrapped_keys'][:3]}")
    if not m.get("resumed_vs_straight", math.inf) <= COMPILE_TOL:
        problems.append(f"compiled stop+resume vs compiled straight: {_g(m.get('resumed_vs_straight'))} "
                        f"(> {COMPILE_TOL:g})")  # fmt: skip
    if not m.get("compiled_vs_eager", math.inf) <= COMPILE_VS_EAGER_TOL:
        problems.append(f"compiled vs eager: {_g(m.get('compiled_vs_eager'))} (> {COMPILE_VS_EAGER_TOL:g})")
    return _verdict(problems, (
        f"compiled stop+resume vs compiled straight {_g(m['resumed_vs_straight'])}, vs eager "
        f"{_g(m['compiled_vs_eager'])}; {m['inductor_files']} inductor kernel files; export unwrapped"
    ))  # fmt: skip


# ---- DDP over NCCL at world size 1 -----------------------------------------------------------------------------
def measure_ddp(ctx, outputs, check) -> dict[str, Any]:
    plain, ddp = check.step("plain").out_dir, check.step("ddp").out_dir
    return {
        "plain": _run_facts(plain),
        "ddp": _run_facts(ddp),
        "expected_steps": check.expected_steps,
        "nccl_initialised": bool(re.search(r"NCCL INFO", outputs["ddp"].output)),
        "ddp_vs_plain": tensor_diff(weights(plain), weights(ddp)),
    }


def judge_ddp(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    problems += _run_problems("plain", m.get("plain", {}), steps) + _run_problems("ddp", m.get("ddp", {}), steps)
    d = m.get("ddp", {})
    if (d.get("distributed_type"), d.get("world_size")) != ("MULTI_GPU", 1):
        problems.append(f"ddp: {d.get('distributed_type')} at world size {d.get('world_size')}, not MULTI_GPU at 1")
    if not m.get("nccl_initialised"):
        problems.append("no NCCL INFO line: NCCL was not initialised (NCCL_DEBUG=INFO)")
    if not m.get("ddp_vs_plain", math.inf) <= DDP_TOL:
        problems.append(f"DDP vs one plain process: {_g(m.get('ddp_vs_plain'))} (> {DDP_TOL:g})")
    return _verdict(problems, f"NCCL DDP at world size 1 = one plain process ({_g(m['ddp_vs_plain'])})")


# ---- --sync-bn: two ranks on GPU 0 vs one process at the same global batch ----------------------------------------
def measure_sync_bn(ctx, outputs, check) -> dict[str, Any]:
    one, synced, control = (check.step(k).out_dir for k in ("one", "synced", "unsynced"))
    return {
        "one": _run_facts(one),
        "synced": _run_facts(synced),
        "unsynced": _run_facts(control),
        "expected_steps": check.expected_steps,
        "converted": bool(re.search(r"sync-bn: converted \d+ BatchNorm layers", outputs["synced"].output)),
        "synced_vs_one": tensor_diff(weights(one), weights(synced)),
        "unsynced_vs_one": tensor_diff(weights(one), weights(control)),
    }


def judge_sync_bn(m: dict[str, Any]) -> tuple[str, str]:
    steps, problems = m.get("expected_steps"), []
    for name, size in (("one", 1), ("synced", 2), ("unsynced", 2)):
        f = m.get(name, {})
        problems += _run_problems(name, f, steps)
        if f.get("world_size") != size:
            problems.append(f"{name}: world size {f.get('world_size')}, expected {size}")
    if len({m.get(k, {}).get("global_batch") for k in ("one", "synced", "unsynced")}) != 1:
        problems.append("the runs' global batches differ")
    if not m.get("converted"):
        problems.append("the synced run did not convert its BatchNorm layers")
    synced, control = m.get("synced_vs_one", math.inf), m.get("unsynced_vs_one", 0.0)
    if not synced <= SYNC_BN_TOL:
        problems.append(f"2 synced ranks vs 1 process: {_g(synced)} (> {SYNC_BN_TOL:g})")
    if not control >= max(SYNC_BN_TOL, SYNC_BN_RATIO * synced):
        problems.append(
            f"the control (2 ranks without --sync-bn) is {_g(control)} from 1 process, not {SYNC_BN_RATIO}x farther "
            f"than the synced ranks ({_g(synced)}) and {SYNC_BN_TOL:g}: the comparison cannot tell them apart"
        )
    return _verdict(problems, (
        f"2 ranks on GPU 0 with --sync-bn vs 1 process: {_g(m['synced_vs_one'])}; without --sync-bn: "
        f"{_g(m['unsynced_vs_one'])}"
    ))  # fmt: skip


# ---- DataParallel with device_ids=[0, 0] -----------------------------------------------------------------------
def measure_data_parallel(ctx, outputs, check) -> dict[str, Any]:
    return json.loads(Path(check.step("probe").argv[-1]).read_text())


def judge_data_parallel(m: dict[str, Any]) -> tuple[str, str]:
    if m.get("refused"):
        return NOT_RUN, f"torch refused DataParallel(device_ids=[0, 0]): {m['refused']}"
    problems = []
    if m.get("replica_calls") != 2 or m.get("replica_threads") != 2:
        problems.append(
            f"{m.get('replica_calls')} replica calls in {m.get('replica_threads')} threads, expected 2 in 2"
        )
    if m.get("main_thread_ran_a_replica"):
        problems.append("a replica ran on the main thread, not in parallel_apply's threads")
    if m.get("replica_devices") != ["cuda:0"]:
        problems.append(f"replicas ran on {m.get('replica_devices')}, not cuda:0")
    if m.get("replica_dtypes") != ["torch.bfloat16"]:
        problems.append(f"replicas computed in {m.get('replica_dtypes')} under bf16 autocast")
    if not m.get("grad_max_abs_diff", math.inf) <= DP_TOL:
        problems.append(f"gradients vs one module: {_g(m.get('grad_max_abs_diff'))} (> {DP_TOL:g})")
    return _verdict(problems, (
        f"2 replica threads on cuda:0 in bf16; fp32 gradients = one module's ({_g(m['grad_max_abs_diff'])} of "
        f"{_g(m.get('grad_max_abs'))})"
    ))  # fmt: skip


# ---- --max-device-batch auto with the data on the device --------------------------------------------------------
_AUTO = re.compile(r"--max-device-batch auto: (\d+) is the largest micro-batch")


def measure_device_batch(ctx, outputs, check) -> dict[str, Any]:
    run = check.step("auto").out_dir
    s = summary(run)
    hit = _AUTO.search(outputs["auto"].output)
    return {
        **_run_facts(run),
        "expected_steps": check.expected_steps,
        "expected_global_batch": check.global_batch,
        "probed_micro_batch": int(hit.group(1)) if hit else None,
        "peak_memory_mb": s.get("peak_memory_mb"),
        "reserved_memory_mb": s.get("peak_reserved_memory_mb"),
    }


def judge_device_batch(m: dict[str, Any]) -> tuple[str, str]:
    problems = _run_problems("auto", m, m.get("expected_steps"))
    micro, accum, glob = m.get("micro_batch"), m.get("accum_steps"), m.get("global_batch")
    if m.get("probed_micro_batch") is None:
        problems.append("no '--max-device-batch auto: N is the largest micro-batch' line: the probe did not run")
    elif micro != m["probed_micro_batch"]:
        problems.append(f"the run used micro-batch {micro}, the probe chose {m['probed_micro_batch']}")
    if glob != m.get("expected_global_batch") or not (micro and accum and micro * accum == glob):
        problems.append(
            f"micro {micro} x accumulation {accum} != global batch {glob} (asked {m.get('expected_global_batch')})"
        )
    if m.get("data_on_device") is not True:
        problems.append("the dataset stayed on the host after the probe (resolved.data_on_device is false)")
    return _verdict(problems, (
        f"probe chose micro-batch {micro} x {accum} for global {glob}; data on the GPU; peak "
        f"{m.get('peak_memory_mb')} MB allocated, {m.get('reserved_memory_mb')} MB reserved"
    ))  # fmt: skip


# ---- speed run: real augmentation on the device, timed after a warm-up --------------------------------------------
def measure_speedrun(ctx, outputs, check) -> dict[str, Any]:
    probe = json.loads(Path(check.step("speedrun").argv[-1]).read_text())
    run = Path(probe["run_dir"])
    s = summary(run)
    return {
        **_run_facts(run),
        "probe": probe,
        "train_time_s": s.get("train_time_s"),
        "setup_s": s.get("setup_s"),
        "samples_per_s": s.get("train_samples_per_s"),
        "peak_memory_mb": s.get("peak_memory_mb"),
        "airbench_published_a100_train_s": SPEEDRUN_PUBLISHED_S,
    }


def judge_speedrun(m: dict[str, Any]) -> tuple[str, str]:
    problems = _run_problems("speedrun", m, SPEEDRUN_STEPS)
    if m.get("mixed_precision") != "bf16":
        problems.append(f"mixed_precision {m.get('mixed_precision')!r}, expected bf16")
    if m.get("data_on_device") is not True:
        problems.append("the dataset was not on the GPU, so its augmentation did not run there")
    if not m.get("augment"):
        problems.append("the run did not augment (resolved.augment is empty)")
    probe = m.get("probe", {})
    if not (probe.get("same_process") and (probe.get("warmup_steps") or 0) >= 10 and probe.get("cudnn_benchmark")):
        problems.append(f"no warm-up in the same process before the timed run (probe: {probe})")
    if not (_finite(m.get("train_time_s")) and m["train_time_s"] > 0):
        problems.append(f"train_time_s {m.get('train_time_s')!r}")
    return _verdict(problems, (
        f"{SPEEDRUN_STEPS} steps in {_g(m.get('train_time_s'))} s of training after a {probe.get('warmup_steps')}-step "
        f"warm-up ({_g(m.get('samples_per_s'))} samples/s, augment {m.get('augment')}); airbench publishes "
        f"{SPEEDRUN_PUBLISHED_S} s on an A100"
    ))  # fmt: skip


# ---- two GPUs: DataParallel vs DDP ------------------------------------------------------------------------------
def measure_dp_ddp(ctx, outputs, check) -> dict[str, Any]:
    dp, ddp = check.step("dp").out_dir, check.step("ddp").out_dir
    s_dp, s_ddp = summary(dp), summary(ddp)
    return {
        "layout": [s_dp.get("data_parallel"), s_dp.get("world_size"), s_ddp.get("world_size")],
        "dp_vs_ddp": tensor_diff(weights(dp), weights(ddp)),
    }


def judge_dp_ddp(m: dict[str, Any]) -> tuple[str, str]:
    problems = []
    if m.get("layout") != [True, 1, 2]:
        problems.append(f"expected DataParallel in 1 process and DDP in 2, got {m.get('layout')}")
    if not m.get("dp_vs_ddp", math.inf) <= DDP_TOL:
        problems.append(f"DataParallel vs DDP: {_g(m.get('dp_vs_ddp'))} (> {DDP_TOL:g})")
    return _verdict(problems, f"DataParallel on GPUs 0,1 = DDP on 2 processes ({_g(m['dp_vs_ddp'])})")
