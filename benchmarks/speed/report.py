"""Everything written from a finished report: ``benchmark.md`` (the tables, goals, time to accuracy, the speed
run, the default run, the 2-process and bf16 findings), the README's block between the benchmark markers
(``--readme``), and the chart ``benchmark.png``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks.common import _f, _met, _pct
from benchmarks.speed.goals import GOAL_RATIO_VS_PLAIN
from benchmarks.speed.report_bf16 import BF16_BACKGROUND, _bf16_findings, _study_md
from benchmarks.speed.setups import WINDOW_STEPS
from benchmarks.speed.speedrun import markdown as speedrun_markdown
from benchmarks.speed.step_overhead import markdown as step_overhead_markdown
from benchmarks.speed.time_to_accuracy import TARGET_ACCURACY


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
        *_gpu_md(m),
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
        "data, global batch, threads; Adam, cross-entropy and the loop's default grad-norm clipping; like the "
        f"portable loop it waits for the device only at log points, every {WINDOW_STEPS} steps). *best win.*: "
        f"ratio of the best {WINDOW_STEPS}-step windows of both sides (only with >= {2 * WINDOW_STEPS} steps). "
        "*Breakdown*: plain loop, ms per step: data / forward+backward / optimizer / gradient all-reduce (DDP: "
        "synced minus no_sync backward; on CUDA from extra steps synced after each phase). MFU: FLOPs of "
        "forward+backward (FlopCounterMode) x samples/s over the GEMM "
        "peak of the same dtype. *load*: highest 1-minute load average around the portable run(s) (this "
        f"benchmark's own threads count; {m['cores']} cores).",
        "",
    ]
    lines += _results_table(report)
    errors = [(r["model"], r["setup"], e) for r in report["results"] for e in r.get("errors", [])]
    if errors:
        lines += ["", "Errors:", ""] + [f"* {mo} / {se}: {e[:400]}" for mo, se, e in errors]
    lines += ["", "Portable commands (OUT: a temporary run folder):", ""]
    seen = set()
    for r in report["results"]:
        if r.get("command") and r["setup"] not in seen:
            seen.add(r["setup"])
            lines.append(f"* {r['setup']}: `{r['command']}`")
    lines += ["", "## Goals (reported, not asserted)", "", *_goals_table(report)]
    lines += _t2a_md(report.get("time_to_accuracy") or {})
    lines += _mnist_md((report.get("time_to_accuracy") or {}).get("mnist_vs_examples"), m.get("cpu_bf16_kind"))
    lines += ["", *speedrun_markdown(report.get("speedrun") or {"skipped": "not in this report"})]
    lines += _rest_of_report(report)
    return "\n".join(lines) + "\n"


def _results_table(report: dict[str, Any]) -> list[str]:
    gpu_mem = any(r.get("peak_memory_mb") or r.get("plain_peak_memory_mb") for r in report["results"])
    lines = [
        "| model | setup | batch | portable samples/s | plain samples/s | ratio | best win. | data wait | "
        "breakdown ms | GFLOP/s | MFU | peak RSS MB | load |" + (" peak GPU MB portable/plain |" if gpu_mem else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|" + ("---:|" if gpu_mem else ""),
    ]
    for r in report["results"]:
        b = r.get("step_breakdown_ms") or {}
        bd = "/".join(_f(b.get(k), ".1f") for k in ("data_wait", "forward_backward", "optimizer", "sync")) if b else "-"
        mem = f" {_f(r.get('peak_memory_mb'), '.0f')}/{_f(r.get('plain_peak_memory_mb'), '.0f')} |" if gpu_mem else ""
        lines.append(
            f"| {r['model']} | {r['setup']} | {r['global_batch']} | {_f(r['samples_per_s'], '.0f')} | "
            f"{_f(r['plain_samples_per_s'], '.0f')} | {_f(r['ratio_vs_plain'], '.3f')} | "
            f"{_f(r.get('ratio_vs_plain_best_window'), '.3f')} | {_pct(r['data_wait_fraction'])} | {bd} | "
            f"{_f(r['achieved_gflops'], '.1f')} | {_pct(r['mfu'])} | {_f(r['peak_rss_mb'], '.0f')} | "
            f"{_f(r.get('loadavg_1min'), '.1f')} |{mem}"
        )
    return lines


def _goals_table(report: dict[str, Any]) -> list[str]:
    lines = ["| goal | measured | best windows | met |", "|---|---:|---:|---|"]
    for g in report["goals"]:
        lines.append(
            f"| {g['goal']} | {_f(g['value'], '.3f')} | {_f(g.get('value_best_window'), '.3f')} | {_met(g['met'])} |"
        )
    return lines


def _rest_of_report(report: dict[str, Any]) -> list[str]:
    m = report["machine"]
    help_t = report.get("train_help_s", {})
    lines = [
        "",
        f"`python scripts/train.py --help`: {_f(help_t.get('median_s'), '.2f')} s (median of "
        f"{len(help_t.get('runs_s', []))}).",
    ]
    lines += _default_run_md(report.get("default_run"))
    lines += _startup_md(report.get("default_run"), m.get("cpu_bf16_kind", "unknown"))
    lines += step_overhead_markdown(report.get("step_overhead"))
    ddp = _ddp_findings(report)
    if ddp:
        lines += ["", "## 2 gloo processes on this CPU", ""] + ddp
    lines += ["", "## bf16 on this CPU", ""] + _bf16_findings(report) + _study_md(report.get("bf16_study", []))
    lines += ["", BF16_BACKGROUND.format(amx="yes" if m.get("amx_bf16") else "no", gemm_ratio=m["gemm_bf16_over_fp32"])]
    return lines


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


def _default_run_md(run: dict[str, Any] | None) -> list[str]:
    if not run:
        return []
    if "error" in run:
        return ["", "## The default run", "", f"failed: {run['error']}"]
    return [
        "",
        "## The default run, from process start",
        "",
        f"`{run['command']}` (lenet on digits, 8 epochs): **{run['process_wall_s']:.1f} s** "
        f"(median of {len(run['runs_s'])}: {', '.join(f'{x:.1f}' for x in run['runs_s'])}), "
        f"eval_accuracy {_f(run.get('eval_accuracy'), '.4f')}.",
        "",
        "| interpreter, imports, arguments | set-up (data, model, Accelerator, run folder) | training, evaluations, "
        "export (to the last metrics event) | after it (plots, summary) |",
        "|---:|---:|---:|---:|",
        f"| {run['before_fit_s']:.2f} s | {run['setup_s']:.2f} s | {run['train_s']:.2f} s | {run['finish_s']:.2f} s |",
    ]


def _startup_md(run: dict[str, Any] | None, kind: str) -> list[str]:
    """The default run against the plain script doing its work (issue 29): both from process start, interleaved."""
    plain = (run or {}).get("plain")
    if not plain:
        return []
    if "error" in plain:
        return ["", f"The plain script doing the default run's work failed: {plain['error']}"]
    runs = ", ".join(f"{o:.1f}/{p:.1f}" for o, p in zip(run["runs_s"], plain["runs_s"], strict=False))
    return [
        "",
        f"### Against the plain script doing the same work (CPU kind `{kind}`)",
        "",
        f"`{plain['command']}`: the default run's work ({plain['steps']} LeNet steps, {plain['evals']} evaluations, "
        "same digits, batch, Adam, cosine schedule, clipping) in a script that imports torch and numpy only. "
        f"Launched alternately with `{run['command']}`, {len(plain['runs_s'])} of each (ours/plain, s: {runs}). "
        f"**Ratio {run['ratio_vs_plain']:.2f}x** (median/median; fastest/fastest {run['ratio_vs_plain_min']:.2f}x; "
        f"goal <= 1.25x); plain eval_accuracy {_f(plain.get('eval_accuracy'), '.4f')}.",
        "",
        "| | from process start | interpreter, imports | set-up | training, evaluations | after the last step |",
        "|---|---:|---:|---:|---:|---:|",
        f"| ours | {run['process_wall_s']:.2f} s | {run['before_fit_s']:.2f} s | {run['setup_s']:.2f} s | "
        f"{run['train_s']:.2f} s | {run['finish_s']:.2f} s |",
        f"| plain | {plain['process_wall_s']:.2f} s | {plain['imports_s']:.2f} s | {plain['setup_s']:.2f} s | "
        f"{plain['train_s']:.2f} s | {plain['finish_s']:.2f} s |",
        "",
        "Ours: the process wall minus `fit`'s (interpreter, imports and arguments, and the interpreter's exit); "
        "set-up includes the imports `fit` does lazily; training runs to the last metrics event (its exports and "
        "checkpoints included). Plain: stamps the script writes (its exit is in the last column). Each row is its "
        "side's median run; other processes on the CPU move every figure, so read the ratio.",
    ]


def _mnist_md(row: dict[str, Any] | None, kind: str | None) -> list[str]:
    """Time to 98% on MNIST-format data: scripts/train.py with its defaults and with the speed-run recipe vs
    pytorch/examples' recipe (issue 29)."""
    if not row:
        return []
    target = row["target_accuracy"]
    lines = [
        "",
        f"## Time to {target:.0%} on MNIST-format data, from process start: vs pytorch/examples (CPU kind `{kind}`)",
        "",
        f"Data: {row['data']}. {row['repeats']} run(s) of each, interleaved (defaults, recipe, rival, ...); seconds "
        "from launch to the first evaluation at or above the target, timestamped as it appears.",
        "",
        "| recipe | reached | seconds (median) | runs | at | best accuracy |",
        "|---|---|---:|---|---|---:|",
    ]
    sides = [("ours, defaults", "ours"), ("ours, speed-run recipe", "recipe"), ("rival", "rival")]
    for name, key in [(n, k) for n, k in sides if k in row]:
        e, median = row[key], row[f"{key}_median_s"]
        at = (
            (f"step {e.get('step')}, epoch {e.get('epoch')}" if key != "rival" else f"epoch {e.get('epoch')}")
            if (e.get("reached"))
            else (e.get("stopped") or str(e.get("error", "-"))[:80])
        )
        runs = ", ".join(_f(x) for x in e.get("runs_s", []))
        lines.append(
            f"| {name} | {'yes' if e.get('reached') else 'no'} | {_f(median)} | {runs} | {at} | "
            f"{_f(e.get('best_accuracy'), '.4f')} |"
        )
    rival_evals = ", ".join(f"{e['epoch']}: {e['accuracy']:.3f} @ {e['time_s']:.0f}s" for e in row["rival"]["evals"])
    for label, prefix in (("speed-run recipe", "recipe_"), ("defaults", "")):
        if f"{prefix}speedup" not in row:
            continue
        value = row[f"{prefix}speedup"]
        speedup = f"**{value:.1f}x**" if value else "- (a side did not reach the target)"
        pairs = ", ".join(f"{x:.1f}x" for x in row.get(f"{prefix}pair_speedups", [])) or "-"
        lines += ["", f"Speedup of ours with its {label} (rival median / ours median): {speedup}; per pair: {pairs}."]
    recipe = (
        f" *ours, speed-run recipe*: `{row['recipe'].get('command', '')}` (the file's own evaluation every 50 steps)."
        if "recipe" in row
        else ""
    )
    return lines + [
        "",
        f"Caps: {row.get('caps')}. *ours, defaults*: `{row['ours'].get('command', '')}` (its defaults; "
        "`--eval-every 100` evaluates every 100 steps as well as at epoch ends, `--no-plots`)."
        + recipe
        + " *rival*: `"
        + str(row["rival"].get("command", ""))
        + "`, "
        f"{row['rival'].get('recipe', '')}; it evaluates once per epoch (as the original), so its time is that of "
        f"the first epoch end at the target. Rival per epoch: {rival_evals or '-'}.",
    ]


def _gpu_md(m: dict[str, Any]) -> list[str]:
    """What the CUDA rows mean: which GPU, which precision, which peak."""
    if not m.get("cuda"):
        return []
    flags = m.get("cuda_precision_flags") or {}
    tf32 = m.get("cuda_tf32")
    return [
        "",
        f"GPU: {m['cuda']} ({m.get('cuda_device_count', '?')} visible to the benchmark). Every CUDA run is pinned "
        f"to ONE GPU: `CUDA_VISIBLE_DEVICES={m.get('cuda_pinned_device')}` in the environment of the portable and "
        "the plain loop (the GPU the GEMM peak ran on), so the portable loop never wraps the model in "
        "`nn.DataParallel`, as it does when one process sees several GPUs. Precision: TF32 "
        f"**{'on' if tf32 else 'off'}** for matmuls AND convolutions (`torch.backends.cuda.matmul.allow_tf32="
        f"{flags.get('matmul_allow_tf32')}`, `torch.backends.cudnn.allow_tf32={flags.get('cudnn_allow_tf32')}`), "
        "set the same way for the GEMM peak, the plain loop and the portable loop (the portable through the "
        "benchmark's wrapper; the flags it ended with are checked). PyTorch's defaults differ (matmuls off, "
        "convolutions on): an fp32 peak taken with them is a true-fp32 peak while the convolutions run in TF32. "
        + (
            "With TF32 on, `cuda_fp32` means fp32 storage with TF32 tensor-core math, what a ResNet gets by "
            "default anyway (its FLOPs are convolutions), and its MFU is over the TF32 GEMM peak "
            if tf32
            else "With TF32 off (`--no-tf32`), `cuda_fp32` is strict fp32 math and its MFU is over the fp32 GEMM peak "
        )
        + f"({_f(m.get('peak_gflops_fp32_cuda'), '.0f')} GFLOP/s; bf16: {_f(m.get('peak_gflops_bf16_cuda'), '.0f')}).",
    ]


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


README_BEGIN = "<!-- benchmark:begin"
README_END = "<!-- benchmark:end -->"


def readme_block(report: dict[str, Any], full_report: str = "docs/benchmark/benchmark.md") -> str:
    """The benchmark figures of a page (``--readme``), written from ``report``: nobody copies numbers by hand.
    ``full_report``: the link to the whole report, relative to that page."""
    m, s = report["machine"], report["settings"]
    kind = m.get("cpu_bf16_kind", "unknown")
    lines = [
        f"{README_BEGIN}: written by `{s.get('command', 'python scripts/benchmark.py')}`; rerun it, do not edit -->",
        f"Latest run (`{s.get('command', 'python scripts/benchmark.py')}`, {report['total_wall_s']:.0f} s, "
        f"{m['cores']}-core **{m['cpu']}, CPU kind `{kind}`** (AMX: {'yes' if m.get('amx_bf16') else 'no'}), "
        f"torch {m['torch']}, accelerate {m['accelerate']}; the whole report, JSON and chart are in "
        f"[`docs/benchmark/`]({full_report})). *portable*: `scripts/train.py` launched as users launch "
        "it; *plain*: a hand-written loop with the same model, in-memory data, batch and threads, measured right "
        "before and after it. The breakdown is the plain loop's ms per step: data / forward+backward / optimizer / "
        "gradient all-reduce.",
        "",
        *_results_table(report),
        "",
        *_goals_table(report),
    ]
    run = report.get("default_run")
    if run and "error" not in run:
        lines += [
            "",
            f"The default run (`{run['command']}`, median of {len(run['runs_s'])} in the same benchmark run), "
            "from process start:",
            "",
            *_default_run_md(run)[-3:],
            *_startup_md(run, kind),
        ]
    lines += _mnist_md((report.get("time_to_accuracy") or {}).get("mnist_vs_examples"), kind)
    return "\n".join([*lines, README_END])


def update_readme(path: Path, report: dict[str, Any], report_dir: Path | None = None) -> None:
    """Replace the block between the benchmark markers of ``path`` with :func:`readme_block`, its link to the
    whole report (``report_dir/benchmark.md``, default ``docs/benchmark/``) relative to ``path``'s folder."""
    text = path.read_text()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        from accel_train.errors import UserError

        raise UserError(f"{path} has no '{README_BEGIN} ... {README_END}' block for --readme to replace")
    target = Path(report_dir or Path("docs") / "benchmark").resolve() / "benchmark.md"
    link = Path(os.path.relpath(target, Path(path).resolve().parent)).as_posix()
    path.write_text(text[:begin] + readme_block(report, link) + text[end + len(README_END) :])


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
