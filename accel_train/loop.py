"""The training loop: ``train_one_epoch``, ``evaluate`` and the ``fit`` that drives them.

Written once against ``accelerate.Accelerator``; the launcher and its config
decide whether it runs on one CPU, one GPU, DataParallel, DDP or many machines.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from accel_train.checkpoint.state import (
    CHECKPOINT_DIR,
    TrainState,
    install_unwrapped_weight_hooks,
    load_checkpoint,
    read_progress,
    resolve_resume,
    save_checkpoint,
)
from accel_train.config import TrainConfig, save_config
from accel_train.data import build_dataset
from accel_train.data.pipeline import BatchNormalizer, BatchPlan, make_loader, plan_batches
from accel_train.errors import CheckpointError, NonFiniteLossError
from accel_train.evaluation import evaluate_model
from accel_train.fsio import write_json_atomic, writing
from accel_train.meters import StepTimer, Window
from accel_train.metrics import load_metric
from accel_train.models import check_model_name, create_model
from accel_train.run_dir import CONFIG, CONFUSION_JSON, CONFUSION_PNG, SUMMARY, RunDir
from accel_train.runtime import Runtime, build_runtime
from accel_train.schedule import ScheduleFn
from accel_train.tracking import RunLogger, trackers_for

SIGNAL_VOTE_EVERY = 10  # steps between the ranks' votes on SIGTERM/SIGINT
PREEMPT_GRACE_S = 25.0  # torchrun and Slurm send SIGKILL ~30 s after SIGTERM
WARMUP_STEPS_EXCLUDED = 5  # steady-state throughput ignores the first steps (allocation, caches)


@dataclass
class Context:
    """What the loop functions need; built once by ``fit``."""

    cfg: TrainConfig
    rt: Runtime
    model: nn.Module
    optimizer: Any
    scheduler: Any
    train_dl: Any
    eval_dl: Any
    normalizer: BatchNormalizer
    plan: BatchPlan
    total_steps: int
    steps_per_epoch: int
    num_classes: int
    logger: RunLogger
    meta: dict[str, Any]
    metric: Any
    run_dir: RunDir
    resume_path: Path | None = None
    timer: StepTimer = field(default_factory=StepTimer)
    window: Window | None = None
    stop_signal: int | None = None
    last_saved: tuple[int, int] | None = None
    last_eval_step: int | None = None
    saves: int = 0  # checkpoints this run (attempt) has saved


class StopTraining(Exception):
    """Raised inside the epoch loop to stop at a step boundary (stop-at-step, SIGTERM/SIGINT)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def build_optimizer(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    # fused kernels (CPU and CUDA): one pass over each tensor instead of a chain of foreach ops;
    # measured 1.3-1.6x faster steps for mnist_cnn on this CPU (Adam was half of its step time)
    adam = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
    return adam(params, lr=lr, weight_decay=cfg.weight_decay, fused=True)


def evaluate(ctx: Context, with_confusion: bool = False) -> dict[str, Any]:
    return evaluate_model(
        ctx.rt.accelerator, ctx.model, ctx.eval_dl, ctx.normalizer, ctx.metric, ctx.num_classes, with_confusion
    )


def _checkpoint(ctx: Context, state: TrainState) -> None:
    position = (state.global_step, state.epoch)
    if ctx.last_saved == position:  # e.g. --checkpoint-every fired on the step we stop at
        return
    state.extra["log_window"] = ctx.window.reduce(ctx.rt.accelerator)
    path = save_checkpoint(
        ctx.rt.accelerator,
        ctx.cfg.output_dir,
        state,
        ctx.meta,
        ctx.cfg.keep_last,
        scheduler_state=ctx.scheduler.state_dict(),
        # the checkpoint this run resumed from stays until the run has saved --keep-last of its own
        protect=ctx.resume_path if ctx.saves + 1 < ctx.cfg.keep_last else None,
    )
    ctx.saves += 1
    if ctx.rt.is_main:
        ctx.run_dir.commit_replace()  # the new run now has something worth keeping
    ctx.last_saved = position
    ctx.logger.event("checkpoint", state.global_step, state.epoch, path=str(path))


def _stop_requested(ctx: Context, state: TrainState) -> str | None:
    """Agree across ranks on whether to stop now (a signal may reach only some ranks).

    Several processes vote with one small all-reduce every ``SIGNAL_VOTE_EVERY`` steps
    (at most ``--log-every``), not every step: on gloo a per-step vote cost up to 1 ms.
    """
    acc = ctx.rt.accelerator
    if ctx.cfg.stop_at_step is not None and state.global_step >= ctx.cfg.stop_at_step:
        return f"--stop-at-step {ctx.cfg.stop_at_step}"
    flag = ctx.stop_signal or 0
    if acc.num_processes > 1:
        every = max(1, min(ctx.cfg.log_every, SIGNAL_VOTE_EVERY))
        if state.global_step % every:
            return None
        flag = int(acc.reduce(torch.tensor([flag], device=acc.device), reduction="max").item())
    return f"received {signal.Signals(flag).name}" if flag else None


def _check_finite(ctx: Context, state: TrainState, loss_sum: float) -> None:
    if not math.isfinite(loss_sum):
        raise NonFiniteLossError(
            f"training loss became {loss_sum} by step {state.global_step}; stopping. The last good checkpoint in "
            f"{Path(ctx.cfg.output_dir) / CHECKPOINT_DIR} is kept. Lower --lr, keep --max-grad-norm on, or pass "
            "--skip-nonfinite to skip such steps"
        )


def train_one_epoch(ctx: Context, state: TrainState) -> None:
    """Train until the epoch ends or ``total_steps`` is reached."""
    cfg, acc, model, plan = ctx.cfg, ctx.rt.accelerator, ctx.model, ctx.plan
    ctx.train_dl.set_epoch(state.epoch)
    loader = ctx.train_dl
    if state.step_in_epoch:  # mid-epoch resume: skip what this epoch already consumed
        loader = acc.skip_first_batches(ctx.train_dl, state.step_in_epoch * plan.accum_steps)
        loader.set_epoch(state.epoch)
    model.train()
    window, bad = ctx.window, torch.zeros((), device=acc.device)
    last_log_t, last_log_samples = time.perf_counter(), state.samples_seen
    timer = ctx.timer
    t_prev = time.perf_counter()

    def account(t_data: float, optimizer_step: bool) -> None:
        nonlocal t_prev
        now = time.perf_counter()
        if state.global_step >= WARMUP_STEPS_EXCLUDED:  # steady state only
            timer.data_wait += t_data - t_prev
            timer.total += now - t_prev
            timer.samples += plan.global_batch if optimizer_step else 0
        t_prev = now

    for images, labels in loader:
        t_data = time.perf_counter()
        with acc.accumulate(model):
            logits = model(ctx.normalizer(images))
            loss = F.cross_entropy(logits.float(), labels)
            acc.backward(loss)
            skip = False
            if cfg.skip_nonfinite:  # opt-in: one small all-reduce per optimizer step
                bad += (~torch.isfinite(loss.detach())).float()
                if acc.sync_gradients:
                    skip = acc.reduce(bad, reduction="sum").item() > 0
                    bad.zero_()
            if acc.sync_gradients and cfg.max_grad_norm > 0 and not skip:
                acc.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            if not skip:
                ctx.optimizer.step()
            ctx.optimizer.zero_grad(set_to_none=True)
        window.add(loss, logits, labels, finite_only=cfg.skip_nonfinite)
        if not acc.sync_gradients:
            account(t_data, optimizer_step=False)
            continue
        # ---- one optimizer step done ----
        if skip:
            state.nonfinite_skipped += 1
        elif not acc.optimizer_step_was_skipped:
            ctx.scheduler.step()
        state.global_step += 1
        state.step_in_epoch += 1
        state.samples_seen += plan.global_batch
        ctx.logger.advance()
        reason = _stop_requested(ctx, state)
        save_now = bool(reason) or bool(cfg.checkpoint_every and state.global_step % cfg.checkpoint_every == 0)
        if cfg.log_every and state.global_step % cfg.log_every == 0:
            tot_loss, tot_correct, tot_seen = window.reduce(acc)
            _check_finite(ctx, state, tot_loss)
            now = time.perf_counter()
            rate = (state.samples_seen - last_log_samples) / max(now - last_log_t, 1e-9)
            last_log_t, last_log_samples = now, state.samples_seen
            values = {
                "loss": tot_loss / max(tot_seen, 1),
                "accuracy": tot_correct / max(tot_seen, 1),
                "lr": ctx.scheduler.get_last_lr()[0],
                "samples_per_s": rate,
            }
            ctx.logger.log("train", state.global_step, state.epoch, values)
            window.restore(None, acc.is_main_process)
        elif save_now:  # never checkpoint a NaN state: check (and keep) the open window first
            _check_finite(ctx, state, window.reduce(acc)[0])
        if cfg.eval_every and state.global_step % cfg.eval_every == 0:
            _log_eval(ctx, state, evaluate(ctx))
        if save_now:
            _checkpoint(ctx, state)
        account(t_data, optimizer_step=True)
        if reason:
            raise StopTraining(reason)
        if state.global_step >= ctx.total_steps:
            break


def _log_eval(ctx: Context, state: TrainState, result: dict[str, Any]) -> None:
    values = {k: v for k, v in result.items() if k != "confusion"}
    ctx.logger.log("eval", state.global_step, state.epoch, values)
    ctx.last_eval_step = state.global_step
    if state.best_metric is None or result["eval_accuracy"] > state.best_metric:
        state.best_metric, state.best_step = result["eval_accuracy"], state.global_step
        export_model(ctx, Path(ctx.cfg.output_dir) / "best")


def export_model(ctx: Context, out_dir: Path) -> None:
    """Unwrapped safetensors + config.json (main process writes; every rank must call)."""
    from accel_train.checkpoint.weights import export_weights

    state_dict = ctx.rt.accelerator.get_state_dict(ctx.model)  # collective under FSDP/DeepSpeed
    if ctx.rt.is_main:
        export_weights(state_dict, out_dir, ctx.meta["model_config"])


def prepare_output_dir(cfg: TrainConfig, rt: Runtime, run_dir: RunDir) -> None:
    """Create, lock and (with --overwrite) stage the folder once every input has loaded (collective)."""
    if rt.is_main:
        for note in run_dir.prepare(overwrite=cfg.overwrite and cfg.resume == "none"):
            rt.print(f"accel_train: {note}")
    rt.accelerator.wait_for_everyone()


def branch_if_older(cfg: TrainConfig, rt: Runtime, run_dir: RunDir, resume_path: Path, move: bool) -> None:
    """A resume from an older checkpoint: refuse, or with --branch move the newer timeline aside (main)."""
    step = read_progress(resume_path)["state"]["global_step"]
    newer = run_dir.newer_checkpoints(step, resume_path)
    if not newer:
        return
    if not cfg.branch:
        listed = ", ".join(f"step {s}" for s in newer[:5])
        raise CheckpointError(
            f"--resume {resume_path} is at step {step}, but {run_dir / CHECKPOINT_DIR} holds newer checkpoints "
            f"({listed}) of the timeline you would leave; pass --branch to move them to "
            f"{run_dir / 'abandoned'}/ and continue from step {step}, or resume into another --output-dir"
        )
    if move and rt.is_main:
        dest = run_dir.abandon_after(step, resume_path)
        rt.print(f"accel_train: --branch: moved the checkpoints after step {step} and their metrics to {dest}")


def _give_up(signum: int) -> None:
    print(
        f"accel_train: no step boundary reached {PREEMPT_GRACE_S:.0f}s after {signal.Signals(signum).name}; "
        "exiting without a new checkpoint (the previous one is intact)",
        file=sys.stderr,
        flush=True,
    )
    os._exit(128 + signum)


def fit(cfg: TrainConfig) -> dict[str, Any]:
    """Train, evaluate, checkpoint and export according to ``cfg``; returns the summary.

    The output folder is locked for the whole run. With ``--overwrite`` the previous run
    is put back if this one fails before its first checkpoint.
    """
    t_launch = time.perf_counter()
    run_dir = RunDir(cfg.output_dir)
    run_dir.check(cfg.resume, cfg.overwrite)  # before anything is loaded or written
    rt = build_runtime(cfg, log_with=trackers_for(cfg.report_to, cfg.output_dir) or None)
    try:
        if rt.is_main:
            run_dir.refuse_if_locked()  # a second writer is refused before it loads anything
        return _fit(cfg, rt, run_dir, t_launch)
    except BaseException:
        if rt.is_main and run_dir.restore_replaced():
            print(
                f"accel_train: this run failed before saving a checkpoint; the previous run in {run_dir.path} "
                "is restored",
                file=sys.stderr,
                flush=True,
            )
        raise
    finally:
        run_dir.lock.release()


def _fit(cfg: TrainConfig, rt: Runtime, run_dir: RunDir, t_launch: float) -> dict[str, Any]:
    acc = rt.accelerator
    check_model_name(cfg.model)  # before a possibly long dataset load
    resume_path = resolve_resume(cfg.resume, cfg.output_dir)
    if resume_path is not None:
        branch_if_older(cfg, rt, run_dir, resume_path, move=False)  # refuse early, move only once all loaded

    with acc.main_process_first():  # downloads and caches happen once
        splits = build_dataset(cfg.data_config())
        metric = load_metric("accuracy")
    info = splits.info
    plan = plan_batches(
        acc.num_processes, cfg.batch_size, cfg.grad_accum_steps, cfg.global_batch_size, cfg.max_device_batch
    )
    acc.gradient_accumulation_steps = plan.accum_steps
    lr = cfg.lr * plan.global_batch / cfg.batch_size if cfg.scale_lr else cfg.lr

    from accelerate.utils import set_seed

    set_seed(cfg.seed)  # identical init on every rank and setup
    if hasattr(splits.train, "augment_seed"):
        splits.train.augment_seed = cfg.seed
    model = create_model(cfg.model, info.num_classes, info.in_channels, info.image_size)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model = rt.prepare_model(model)
    if cfg.compile:
        model = torch.compile(model)
    optimizer = build_optimizer(cfg, model, lr)
    pin = acc.device.type == "cuda"
    train_dl = make_loader(
        splits.train,
        plan.micro_batch,
        shuffle=True,
        seed=cfg.seed,
        drop_to_multiple_of=plan.global_batch,
        num_workers=0 if splits.in_memory else cfg.num_workers,  # in-memory batches are one index op
        pin_memory=pin,
    )
    eval_dl = make_loader(
        splits.test,
        cfg.eval_batch_size or 2 * plan.micro_batch,
        shuffle=False,
        seed=cfg.seed,
        num_workers=0 if splits.in_memory else cfg.num_workers,
        pin_memory=pin,
    )
    model, optimizer, train_dl, eval_dl = acc.prepare(model, optimizer, train_dl, eval_dl)

    steps_per_epoch = len(train_dl) // plan.accum_steps
    total_steps = cfg.max_steps or steps_per_epoch * cfg.epochs
    epochs = math.ceil(total_steps / steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer.optimizer, ScheduleFn(total_steps, cfg.lr_schedule, cfg.warmup_steps)
    )
    install_unwrapped_weight_hooks(acc)  # nothing is registered for checkpointing: see checkpoint.verify

    model_config = {
        "model": cfg.model,
        "num_classes": info.num_classes,
        "in_channels": info.in_channels,
        "image_size": info.image_size,
        "mean": list(info.mean),
        "std": list(info.std),
        "class_names": info.class_names,
        "dataset": cfg.dataset,
    }
    resolved = {
        "world_size": acc.num_processes,
        "distributed_type": acc.distributed_type.value,
        "mixed_precision": acc.mixed_precision,
        "device": str(acc.device),
        "global_batch": plan.global_batch,
        "micro_batch": plan.micro_batch,
        "accum_steps": plan.accum_steps,
        "lr": lr,
        "total_steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
    }
    meta = {"model_config": model_config, "config": cfg.to_dict(), "resolved": resolved}

    state = TrainState()
    if resume_path is not None:
        state, progress, notes = load_checkpoint(acc, resume_path, scheduler, cfg.resume_inexact, cfg.seed)
        for note in notes:
            rt.warn(f"resume is not exact: {note}")
        acc.step = 0  # micro-step counter: re-aligned to the (maybe different) accumulation of this setup
        old = progress.get("resolved", {})
        if old.get("global_batch") not in (None, plan.global_batch):
            rt.warn(
                f"resuming a run trained with global batch {old['global_batch']} at global batch "
                f"{plan.global_batch}: pass --global-batch-size {old['global_batch']} to continue it exactly"
            )
    prepare_output_dir(cfg, rt, run_dir)  # locked from here on
    if resume_path is not None:
        branch_if_older(cfg, rt, run_dir, resume_path, move=True)
    if rt.is_main:
        with writing(run_dir / CONFIG, "the run config"):
            save_config(cfg, run_dir / CONFIG, extra=resolved)
    if cfg.report_to != "none":
        acc.init_trackers(
            "tb", config={k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool))}
        )

    # before the progress bar exists, so the header does not end up on the bar's line
    rt.print(
        f"accel_train: {cfg.model} on {cfg.dataset} ({len(splits.train)} train / {len(splits.test)} test) | "
        f"{acc.num_processes} process(es), {acc.distributed_type.value}, device {acc.device}, "
        f"mixed precision {acc.mixed_precision}, {rt.threads} thread(s)/process\n"
        f"accel_train: {plan.describe()}; lr {lr:g}; {total_steps} steps ({steps_per_epoch}/epoch)"
        + (f"; resumed from {resume_path} at step {state.global_step}" if resume_path else "")
    )
    logger = RunLogger(acc, cfg.output_dir, total_steps, state.global_step, cfg.progress, cfg.report_to != "none")
    ctx = Context(
        cfg,
        rt,
        model,
        optimizer,
        scheduler,
        train_dl,
        eval_dl,
        BatchNormalizer(info.mean, info.std, cfg.channels_last),
        plan,
        total_steps,
        steps_per_epoch,
        info.num_classes,
        logger,
        meta,
        metric,
        run_dir,
        resume_path,
        window=Window(acc.device),
    )
    ctx.window.restore(state.extra.get("log_window"), acc.is_main_process)
    if resume_path is not None:
        logger.event("resume", state.global_step, state.epoch, path=str(resume_path))

    watchdog: list[threading.Timer] = []

    def on_signal(signum, frame):
        # Stop at the next step boundary with a checkpoint. If this rank is stuck (a peer died or hangs
        # in a collective), leave before the launcher's SIGKILL instead of ignoring the signal.
        ctx.stop_signal = signum
        if not watchdog:
            timer = threading.Timer(PREEMPT_GRACE_S, _give_up, args=(signum,))
            timer.daemon = True
            timer.start()
            watchdog.append(timer)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    stopped = None
    try:
        while state.global_step < total_steps and state.epoch < epochs:
            train_one_epoch(ctx, state)
            if state.step_in_epoch >= steps_per_epoch:  # the epoch is complete
                state.epoch += 1
                state.step_in_epoch = 0
                _log_eval(ctx, state, evaluate(ctx))
                logger.event("epoch", state.global_step, state.epoch)
                if cfg.checkpoint_epochs:
                    _checkpoint(ctx, state)
        # a run that ends mid-epoch (--max-steps) still leaves a resumable final state
        if (cfg.checkpoint_epochs or cfg.checkpoint_every) and state.step_in_epoch:
            _checkpoint(ctx, state)
    except StopTraining as stop:
        stopped = stop.reason
        _checkpoint(ctx, state)
        logger.write(
            f"accel_train: stopped at step {state.global_step} ({stop.reason}); checkpoint saved, "
            f"continue with --resume auto"
        )
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for timer in watchdog:
            timer.cancel()
        logger.close()

    if stopped:
        summary = {"stopped": stopped, "global_step": state.global_step}
        rt.end()
        return summary

    final = evaluate(ctx, with_confusion=True)
    if ctx.last_eval_step != state.global_step:  # else the epoch-end eval at this step is already logged
        _log_eval(ctx, state, final)
    export_model(ctx, Path(cfg.output_dir) / "model")
    timer = ctx.timer
    steady = timer.samples / timer.total if timer.total > 0 else None
    summary = {
        "eval_accuracy": final["eval_accuracy"],
        "eval_loss": final["eval_loss"],
        "eval_samples": final["eval_samples"],
        "global_step": state.global_step,
        "epochs_completed": state.epoch,
        "samples_seen": state.samples_seen,
        "best_eval_accuracy": state.best_metric,
        "best_step": state.best_step,
        "nonfinite_skipped": state.nonfinite_skipped,
        "world_size": acc.num_processes,
        "distributed_type": acc.distributed_type.value,
        "mixed_precision": acc.mixed_precision,
        "device": str(acc.device),
        "data_parallel": rt.data_parallel,
        "global_batch": plan.global_batch,
        "micro_batch": plan.micro_batch,
        "accum_steps": plan.accum_steps,
        "threads_per_process": rt.threads,
        "wall_time_s": time.perf_counter() - t_launch,
        "train_samples_per_s": steady,
        "data_wait_fraction": timer.fraction(),
    }
    if rt.is_main:
        out = run_dir.path
        write_json_atomic(out / SUMMARY, summary, "the run summary")
        confusion = {"class_names": info.class_names, "matrix": final["confusion"].tolist()}
        write_json_atomic(out / CONFUSION_JSON, confusion, "the confusion matrix")
        run_dir.commit_replace()
        if cfg.plots:
            from accel_train.plots import plot_confusion_matrix, plot_curves

            plot_curves(out)
            plot_confusion_matrix(final["confusion"].numpy(), info.class_names, out / CONFUSION_PNG)
        rt.print(
            f"accel_train: eval_accuracy {summary['eval_accuracy']:.4f} | eval_loss {summary['eval_loss']:.4f} | "
            f"{state.global_step} steps in {summary['wall_time_s']:.1f}s | wrote {out}"
        )
    rt.end()
    return summary
