"""The "bf16 on this CPU" section of benchmark.md: the study's tables and profiles, findings written from this
run's numbers, a conclusion (does any bf16 variant beat fp32, does channels_last help, does fused Adam), and
the background that explains them."""

from __future__ import annotations

from typing import Any

from benchmarks.common import _f
from benchmarks.speed.setups import STUDY_MODELS

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
