"""What the portable step costs beyond the model's own work (issue 29): ``Trainer.step`` against a plain step.

Both sides run in ONE child process, on the same model (the portable's, copied), the same uint8 batches of
synthetic MNIST-shaped data, the same SGD (lr 0.01 and the run's momentum, 0.9), batch 64 and the same threads,
with clipping on both sides (``--max-grad-norm 1.0``, the default; the plain step calls
``torch.nn.utils.clip_grad_norm_``) or off on both (``--max-grad-norm 0``). (Until 2026-11-25 the plain side's SGD
had no momentum: the portable's momentum buffer counted as loop overhead.)
The portable side is the loop as a run drives it: its DataLoader, ``Trainer.step``
with its defaults (keyed bookkeeping, the log window, a train record every ``--log-every`` steps to
metrics.jsonl and TensorBoard, the stop checks). The plain side is the ten lines a user writes: a shuffled
index into the tensors, normalise, forward, cross-entropy, backward, clip, step, zero_grad, and a ``.item()``
every ``--log-every`` steps. Blocks of each alternate (A B A B ...), so other work on the machine hits both
alike. The goal is judged on ``ratio_paired``, the median over rounds of each round's plain/portable (a round's two
blocks run back to back, so a drift in the machine's speed cancels); the fastest block of each side (``ratio``)
and the medians of each side are beside it.

``overhead_us`` = the median over rounds of each round's portable minus plain time per step, in µs (paired like
the goal's ratio; the fastest blocks' difference of a 300 ms step can be off by 10 ms on a busy machine). The
``tiny`` row (one Linear layer) is nearly all overhead: there the model costs microseconds, so what is left is the
loop's own.

``python -m benchmarks.speed.step_overhead`` prints the table; ``benchmarks.speed.run`` puts it in the report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCH = 64
LR = 0.01
GOAL_STEP_RATIO = 0.97  # issue 29: portable/plain per step, lenet and mnist_cnn, clipping on both sides and off
MODELS = ("lenet", "mnist_cnn", "tiny")
CLIPS = (1.0, 0.0)


def _build(model: str, clip: float, out: Path, threads: int | None):
    """A real run's Trainer (as ``loop.fit`` builds it), before its first step."""
    import torch

    from accel_train.build import build_trainer
    from accel_train.config import parse_config
    from accel_train.run_dir import RunDir
    from accel_train.runtime import build_runtime
    from accel_train.tracking import trackers_for

    argv = ["--model", "lenet" if model == "tiny" else model, "--dataset", "synthetic", "--synthetic-size", "6400"]
    argv += ["--global-batch-size", str(BATCH), "--optimizer", "sgd", "--lr", str(LR), "--max-grad-norm", str(clip)]
    argv += ["--eval-every", "0", "--checkpoint-every", "0", "--no-plots", "--no-progress", "--no-augment"]
    argv += ["--max-steps", "1000000", "--output-dir", str(out)] + (["--threads", str(threads)] if threads else [])
    cfg = parse_config(argv)
    run_dir = RunDir(cfg.output_dir)
    run_dir.check(cfg.resume, cfg.overwrite)
    rt = build_runtime(cfg, log_with=trackers_for(cfg.report_to, run_dir, None) or None, project_dir=run_dir.path)
    given = {}
    if model == "tiny":
        torch.manual_seed(cfg.seed)
        given["model"] = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))
    return cfg, build_trainer(cfg, rt, run_dir, None, {}, **given)


class _Plain:
    """The hand-written step on a copy of the portable's model and the same data."""

    def __init__(self, trainer, clip: float, log_every: int):
        import copy

        import torch

        self.torch = torch
        self.model = copy.deepcopy(trainer.acc.unwrap_model(trainer.model)).train()
        cfg = trainer.cfg  # the portable's SGD as configured (momentum 0.9 by default): like with like
        self.opt = torch.optim.SGD(
            self.model.parameters(), lr=LR, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay
        )
        data = trainer.train_dl.dataset.dataset  # WithIndices -> the TensorImageDataset
        self.images, self.labels = data.images, data.labels
        self.order = torch.randperm(len(self.labels))
        mean, std = trainer.info.mean[0], trainer.info.std[0]
        self.scale, self.shift = 1.0 / (255.0 * std), -mean / std
        self.clip, self.log_every, self.i, self.running = clip, log_every, 0, None

    def steps(self, n: int) -> None:
        torch, F = self.torch, self.torch.nn.functional
        for _ in range(n):
            start = (self.i * BATCH) % (len(self.order) - BATCH)
            idx = self.order[start : start + BATCH]
            x = self.images[idx].float().mul_(self.scale).add_(self.shift)
            loss = F.cross_entropy(self.model(x), self.labels[idx])
            loss.backward()
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.running = loss.detach() if self.running is None else self.running + loss.detach()
            self.i += 1
            if self.i % self.log_every == 0:
                self.running.item()
                self.running = None


class _Portable:
    """``Trainer.step`` over the run's own loader, as ``Trainer.train_epoch`` drives it."""

    def __init__(self, trainer):
        import torch

        self.tr = trainer
        trainer.model.train()
        trainer._nonfinite = torch.zeros((), device=trainer.acc.device)
        trainer._last_log = (time.perf_counter(), trainer.state.samples_seen)
        trainer._t_prev = time.perf_counter()
        self.batches = iter(())

    def steps(self, n: int) -> None:
        for _ in range(n):
            batch = next(self.batches, None)
            if batch is None:
                self.tr.state.epoch += 1
                self.tr.state.step_in_epoch = 0
                self.tr.train_dl.set_epoch(self.tr.state.epoch)
                self.batches = iter(self.tr.train_dl)
                batch = next(self.batches)
            self.tr.step(*batch)


def measure(model: str, clip: float, rounds: int, block: int, threads: int | None = None) -> dict[str, Any]:
    """One (model, clipping) cell: per-step milliseconds of each side, interleaved blocks."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        cfg, trainer = _build(model, clip, Path(tmp) / "run", threads)
        plain, portable = _Plain(trainer, clip, cfg.log_every), _Portable(trainer)
        plain.steps(block)  # warm-up: allocator, kernels' first calls, the loader's workers
        portable.steps(block)
        times: dict[str, list[float]] = {"portable": [], "plain": []}
        for _ in range(rounds):
            for name, side in (("plain", plain), ("portable", portable)):
                t0 = time.perf_counter()
                side.steps(block)
                times[name].append((time.perf_counter() - t0) / block * 1e3)
        trainer.rt.end()
    best = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = statistics.median(p / q for p, q in zip(times["plain"], times["portable"], strict=True))
    return {
        "model": model,
        "clip": clip,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "block_steps": block,
        "portable_ms": best["portable"],
        "plain_ms": best["plain"],
        "ratio_paired": paired,  # median of the rounds' plain/portable: what the goal judges
        "ratio": best["plain"] / best["portable"],  # portable steps/s over plain steps/s, fastest blocks
        "overhead_us": statistics.median(p - q for p, q in zip(times["portable"], times["plain"], strict=True)) * 1e3,
        "portable_rounds_ms": times["portable"],
        "plain_rounds_ms": times["plain"],
        "portable_median_ms": med["portable"],
        "plain_median_ms": med["plain"],
        "ratio_median": med["plain"] / med["portable"],
    }


def run_step_overhead(
    models=MODELS, clips=CLIPS, rounds: int = 15, block: int = 20, threads: int | None = None
) -> list[dict[str, Any]]:
    """Each cell in a fresh child process (nothing of one cell's run warms the next)."""
    from accel_train.doctor.launching import REPO, child_env

    rows = []
    for model in models:
        for clip in clips:
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.speed.step_overhead",
                "--child",
                model,
                str(clip),
                str(rounds),
                str(block),
            ]
            cmd += [str(threads)] if threads else []
            proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=900)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                rows.append({"model": model, "clip": clip, "error": proc.stderr.strip()[-800:]})
                continue
            rows.append(json.loads(lines[-1]))
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| model | clipping (both sides) | threads | portable ms/step (fastest block) | plain ms/step (fastest block) "
        "| portable/plain, paired rounds | overhead µs/step, paired rounds | fastest blocks: portable/plain "
        "| medians: portable/plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        clip = f"--max-grad-norm {r['clip']:g}" if r["clip"] else "off (--max-grad-norm 0)"
        if "error" in r:
            out.append(f"| {r['model']} | {clip} | - | error: {r['error'].splitlines()[-1][:80]} | | | | | |")
            continue
        out.append(
            f"| {r['model']} | {clip} | {r['threads']} | {r['portable_ms']:.3f} | {r['plain_ms']:.3f} | "
            f"{r.get('ratio_paired', r['ratio']):.3f} | {r['overhead_us']:.0f} | {r['ratio']:.3f} | "
            f"{r['ratio_median']:.3f} |"
        )
    return out


def step_overhead_goals(rows: list[dict[str, Any]], cpu_kind: str) -> list[dict[str, Any]]:
    """portable/plain >= GOAL_STEP_RATIO for lenet and mnist_cnn, clipping on both sides and off on both."""
    from benchmarks.speed.goals import _goal

    goals = []
    for r in rows:
        if r["model"] not in ("lenet", "mnist_cnn"):
            continue
        clip = "clipping on both sides" if r["clip"] else "no clipping on either side"
        goals.append(
            _goal(
                f"portable step >= {GOAL_STEP_RATIO}x plain step ({r['model']}, batch {BATCH}, SGD, {clip}; "
                f"CPU kind: {cpu_kind})",
                r.get("ratio_paired", r.get("ratio")),
                GOAL_STEP_RATIO,
                best_window=r.get("ratio"),
            )
        )
    return goals


def markdown(rows: list[dict[str, Any]] | None) -> list[str]:
    """The report's section (nothing when the rows were not measured)."""
    if not rows:
        return []
    intro = (
        "One child process per row: `Trainer.step` over the run's loader against a hand-written step on the same "
        f"model, data, batch {BATCH}, SGD and threads, in alternating blocks; the ratio is the median of the "
        "rounds' paired ratios (the fastest blocks' and the medians' ratios beside it). "
        "*tiny*: one Linear layer, so the step is nearly all loop overhead. "
        "`python -m benchmarks.speed.step_overhead` measures it alone."
    )
    return ["", "## Per-step overhead: portable step vs plain step", "", intro, "", *render(rows)]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        model, clip, rounds, block, *rest = argv[1:]
        row = measure(model, float(clip), int(rounds), int(block), int(rest[0]) if rest else None)
        print(json.dumps(row), flush=True)
        return
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.speed.step_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=15, help="blocks per side (default 15)")
    parser.add_argument("--block", type=int, default=20, help="steps per block (default 20)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the run's own choice)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = run_step_overhead(args.models.split(","), CLIPS, args.rounds, args.block, args.threads)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    from accel_train.runtime import cpu_bf16_kind

    print(f"CPU kind: {cpu_bf16_kind()}; {os.cpu_count()} cores")
    print("\n".join(render(rows)))


if __name__ == "__main__":
    main()
