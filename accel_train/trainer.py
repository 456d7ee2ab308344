"""The training loop as a ``Trainer``: ``run`` drives ``train_epoch`` (one ``step`` per micro-batch), ``evaluate``
and ``checkpoint``.

Written once against ``accelerate.Accelerator``; the launcher and its config decide whether it runs on one CPU, one
GPU, DataParallel, DDP or many machines. :func:`accel_train.build.build_trainer` builds it all; the trainer only runs.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from accel_train.attempts import Attempts
from accel_train.checkpoint.state import TrainState, save_checkpoint
from accel_train.checkpoint.weights import export_weights
from accel_train.config import TrainConfig
from accel_train.data.base import DatasetInfo
from accel_train.data.pipeline import BatchPlan
from accel_train.errors import NonFiniteLossError, peer_lost
from accel_train.features import TrainFeatures
from accel_train.features.early_stop import improves
from accel_train.fsio import write_json_atomic
from accel_train.memorisation import check_memorised
from accel_train.meters import StepTimer, Window, peak_memory_mb, reset_peak_memory
from accel_train.optim import GradClipper
from accel_train.run_dir import BEST, MODEL, MODEL_EMA, SUMMARY, RunDir
from accel_train.runtime import Runtime, ignore_stop_signals
from accel_train.tracking import TRACKER_RUNS, RunLogger, tracker_run_ids

SIGNAL_VOTE_EVERY = 10  # steps between the ranks' votes on SIGTERM/SIGINT
WARMUP_STEPS_EXCLUDED = 5  # steady-state throughput ignores the first steps (allocation, caches)
SETUP = ("world_size", "distributed_type", "mixed_precision", "device", "global_batch", "micro_batch", "accum_steps")


class StopTraining(Exception):
    """Raised inside the epoch loop to stop at a step boundary (stop-at-step, SIGTERM/SIGINT, early stopping).

    ``final``: the run is over (early stopping), so it is evaluated, exported and summarised as a finished run.
    """

    def __init__(self, reason: str, final: bool = False):
        super().__init__(reason)
        self.reason, self.final = reason, final


def _give_up(signum: int, grace: float) -> None:
    try:  # stderr may be a pipe whose reader (the launcher) is gone: the exit must not depend on the write
        print(
            f"accel_train: no step boundary reached {grace:g}s after {signal.Signals(signum).name}; "
            "exiting without a new checkpoint (the previous one is intact)",
            file=sys.stderr,
            flush=True,
        )
    except OSError:
        pass
    os._exit(128 + signum)


@dataclass
class Trainer:
    """The prepared objects of one run and the state it advances."""

    cfg: TrainConfig
    rt: Runtime
    model: nn.Module
    optimizer: Any
    scheduler: Any
    train_dl: Any
    eval_dl: Any
    task: Any  # accel_train.tasks: what a batch is (images, or any model's), how the run is scored
    plan: BatchPlan
    info: DatasetInfo
    total_steps: int
    steps_per_epoch: int
    logger: RunLogger
    meta: dict[str, Any]
    run_dir: RunDir
    state: TrainState
    resume_path: Path | None = None
    features: TrainFeatures = field(default_factory=TrainFeatures)  # EMA, mixup, label smoothing, early stop
    timer: StepTimer = field(default_factory=StepTimer)
    attempts: Attempts = field(default_factory=Attempts)  # this attempt's steps and time, and the run's (resumes)
    window: Window | None = None
    stop_signal: int | None = None
    last_saved: tuple[int, int] | None = None
    saves: int = 0  # checkpoints this run (attempt) has saved
    exit_code: int = 0  # of a stop: 128 + the signal that stopped the run (any rank's), 0 for --stop-at-step
    stop_after_epoch: str | None = None  # --stop-at-step on an epoch's last step: stop once that epoch has ended
    _watchdog: list[threading.Timer] = field(default_factory=list)
    _fp16_skips: torch.Tensor | None = None  # the scaler's skipped steps not yet read back (a device tensor)
    _nonfinite: torch.Tensor | None = None  # --skip-nonfinite: non-finite losses of the open optimizer step
    _t_prev: float | None = None  # when the last micro-batch was done (host clock): the step timer's origin
    _last_log: tuple[float, int] = (0.0, 0)  # (time, samples seen) of the last train record: its throughput
    clip: GradClipper | None = None  # --max-grad-norm (build.py)
    direct: bool = False  # optim.direct_backward: loss.backward() without accelerate's per-step bookkeeping
    bitwise: Any = None  # --bitwise: a bitwise.BitwiseStep takes every micro-batch

    @property
    def acc(self):
        return self.rt.accelerator

    def _step_epoch(self) -> int:
        """The epoch the current step belongs to, as train, eval and checkpoint records show it.

        ``state.epoch`` counts completed epochs: it is already 1 at the last step of epoch 0 once
        that epoch has ended, where the records still say epoch 0. (The ``epoch`` event, logged
        when an epoch ends, carries ``state.epoch``: the number of epochs completed.)
        """
        state = self.state
        return state.epoch - 1 if state.step_in_epoch == 0 and state.global_step > 0 else state.epoch

    # ---- running -------------------------------------------------------------------------------------------
    def run(self, t_launch: float) -> dict[str, Any]:
        """Train to ``total_steps`` (or a stop), then evaluate, export and summarise; returns the summary."""
        state, cfg = self.state, self.cfg
        epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        self.attempts.started = t_launch
        reset_peak_memory(self.acc.device)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        stopped = None
        if self.resume_path is not None:  # its checkpoint holds this position: not saved (replaced, logged) again
            self.last_saved = (state.global_step, state.epoch)
        try:
            self._stop_if_stopped_early()
            while state.global_step < self.total_steps and state.epoch < epochs:
                self.train_epoch()
                if state.step_in_epoch >= self.steps_per_epoch:  # the epoch is complete
                    self._end_epoch()
            # a run that ends mid-epoch (--max-steps) still leaves a resumable final state
            if (cfg.checkpoint_epochs or cfg.checkpoint_every) and state.step_in_epoch:
                self.checkpoint()
        except StopTraining as stop:
            stopped = stop
            self.checkpoint()
            then = "the run is complete" if stop.final else "continue with --resume auto"
            self.logger.write(
                f"accel_train: stopped at step {state.global_step} ({stop.reason}); checkpoint saved, {then}"
            )
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if peer_lost(sys.exc_info()[1], self.acc.process_index, self.acc.num_processes):
                ignore_stop_signals()  # leaving with exit 4: the launcher's SIGTERM must not end it as -15
            for timer in self._watchdog:
                timer.cancel()
            self.logger.close()
        if stopped and not stopped.final:  # a signal's stop exits 128 + signal (130 SIGINT, 143 SIGTERM)
            summary = {"stopped": stopped.reason, "global_step": state.global_step, "exit_code": self.exit_code}
        else:
            summary = self.finish(t_launch, stopped.reason if stopped else None)
        self.rt.end()
        return summary

    def _end_epoch(self) -> None:
        """Its evaluation (unless --eval-every did this step), event and checkpoint, then a stop that waited."""
        state = self.state
        state.epoch += 1
        state.step_in_epoch = 0
        # --eval-every may have evaluated this very step (the same weights): once is enough
        early = self._evaluate_in_training() if state.last_eval_step != state.global_step else None
        self.logger.event("epoch", state.global_step, state.epoch)
        if early:
            raise StopTraining(early, final=True)
        if self.cfg.checkpoint_epochs:
            self.checkpoint()
        if self.stop_after_epoch:  # saved above or by the stop, at the next epoch's start
            raise StopTraining(self.stop_after_epoch)

    def _stop_if_stopped_early(self) -> None:
        """A resumed run that had stopped early (and is resumed with the same patience) is over: finish it."""
        reason = self.features.stopped_early()
        if reason:  # its checkpoint is the one resumed from (``last_saved``): nothing new to save
            raise StopTraining(reason, final=True)

    def _evaluate_in_training(self) -> str | None:
        """Evaluate and log; returns the early-stopping reason when this evaluation ends the run."""
        self._wait_for_device()  # steps still queued on a GPU are training time, not evaluation time
        result = self.evaluate()
        self.log_eval(result)
        return self.features.observe_eval(result, self.state.global_step)

    def _wait_for_device(self) -> None:
        """Steps queued on a GPU since the last host sync belong in the throughput: wait for them."""
        if self.acc.device.type == "cuda" and self._t_prev is not None:
            torch.cuda.synchronize(self.acc.device)
            now = time.perf_counter()
            if self.timer.samples:
                self.timer.total += now - self._t_prev
            self.timer.train_s += now - self._t_prev
            self._t_prev = now

    def _on_signal(self, signum, frame) -> None:
        # Stop at the next step boundary with a checkpoint. If this rank is stuck (a peer died or hangs
        # in a collective), leave before the launcher's SIGKILL instead of ignoring the signal.
        if self.stop_signal is None:  # the first one says why: Ctrl-C's SIGINT, not the launcher's SIGTERM after it
            self.stop_signal = signum
        if not self._watchdog:
            timer = threading.Timer(self.cfg.stop_grace, _give_up, args=(signum, self.cfg.stop_grace))
            timer.daemon = True
            timer.start()
            self._watchdog.append(timer)

    def train_epoch(self) -> None:
        """Train until the epoch ends or ``total_steps`` is reached."""
        state = self.state
        self.train_dl.set_epoch(state.epoch)
        loader = self.train_dl
        if state.step_in_epoch:  # mid-epoch resume: skip what this epoch already consumed
            loader = self.acc.skip_first_batches(self.train_dl, state.step_in_epoch * self.plan.accum_steps)
            loader.set_epoch(state.epoch)
        self.model.train()
        self._nonfinite = torch.zeros((), device=self.acc.device)
        self._last_log = (time.perf_counter(), state.samples_seen)
        self._t_prev = time.perf_counter()
        for inputs, labels, indices in loader:
            if self.step(inputs, labels, indices) and (state.global_step >= self.total_steps or self.stop_after_epoch):
                break
        self._wait_for_device()  # before the epoch-end evaluation, which is not training time

    def step(self, inputs: Any, labels: torch.Tensor, indices: torch.Tensor) -> bool:
        """One micro-batch, top to bottom; True when it completed an optimizer step.

        Forward and loss (with --label-smoothing, --mixup/--cutmix; dropout masks keyed on the samples'
        indices), backward, and on the last micro-batch of an optimizer step: the --skip-nonfinite vote,
        clipping, the optimizer, the LR schedule and the EMA, then logging, evaluation, checkpoint and the
        stop vote (:meth:`_after_optimizer_step`). A step skipped for a non-finite loss leaves the schedule
        and the EMA where they were, and is counted. A step the fp16 loss scaler skips (inf/NaN gradients, a
        few while the scale settles) advances them, as in PyTorch's AMP recipe: knowing it on the host would
        cost a GPU sync every step. It is counted on the device (:meth:`_scaled_step`).
        """
        if self.bitwise is not None:  # each micro-batch's own gradient, summed in one fixed order
            return self.bitwise.step(self, inputs, labels, indices)
        cfg, acc, model, state = self.cfg, self.acc, self.model, self.state
        t_data = time.perf_counter()
        with nullcontext() if self.direct else acc.accumulate(model):
            outputs, loss = self.task.forward(self.features, model, inputs, labels, indices, state.epoch)
            loss.backward() if self.direct else acc.backward(loss)
            skip = False
            if cfg.skip_nonfinite:  # opt-in: one small all-reduce per optimizer step
                self._nonfinite += (~torch.isfinite(loss.detach())).float()
                if acc.sync_gradients:
                    skip = acc.reduce(self._nonfinite, reduction="sum").item() > 0
                    self._nonfinite.zero_()
            if acc.sync_gradients and self.clip is not None and not skip:
                self.clip()
            if not skip:
                self._scaled_step()
            if acc.sync_gradients:  # accelerate's zero_grad does the same, after an inspect.signature per step
                self.optimizer.optimizer.zero_grad(set_to_none=True)
        self.window.add(loss, *self.task.counted(outputs, labels), finite_only=cfg.skip_nonfinite)
        if not acc.sync_gradients:  # a micro-batch of an accumulated step
            self._account(t_data, optimizer_step=False)
            return False
        self._after_optimizer_step(t_data, skipped=skip)
        return True

    def _scaled_step(self) -> None:
        """``optimizer.step()``; under an fp16 loss scaler, counts a skipped update on the device.

        The scaler lowers its scale after, and only after, a step with inf/NaN gradients, also
        when fused Adam/AdamW skips inside its kernel where accelerate's
        ``optimizer_step_was_skipped`` cannot see it. The comparison stays a device tensor, read
        when a checkpoint or the summary needs the count (:meth:`_settle_fp16_skips`): no host
        sync per step (GradScaler with a fused optimizer never syncs either).
        """
        scaler = self.acc.scaler if self.acc.sync_gradients else None
        scale = getattr(scaler, "_scale", None)  # GradScaler's device tensor, set by scaler.scale(loss)
        if scaler is None or not isinstance(scale, torch.Tensor):
            self.optimizer.step()
            return
        before = scale.clone()
        self.optimizer.step()  # accelerate: scaler.step + scaler.update (in place on scaler._scale)
        skipped = (scaler._scale < before).to(torch.int64)
        self._fp16_skips = skipped if self._fp16_skips is None else self._fp16_skips + skipped

    def _settle_fp16_skips(self) -> None:
        """Fold the device-side count of the scaler's skipped steps into ``state`` (one host sync)."""
        if self._fp16_skips is not None:
            self.state.fp16_skipped_steps += int(self._fp16_skips.item())
            self._fp16_skips = None

    def _after_optimizer_step(self, t_data: float, skipped: bool = False) -> None:
        """Schedule and EMA (a ``skipped`` step is only counted), counters, logs, evaluation, checkpoint, stop vote."""
        cfg, state = self.cfg, self.state
        if skipped:
            state.nonfinite_skipped += 1
        else:
            self.scheduler.step()
            self.features.after_optimizer_step()  # --ema
        state.global_step += 1
        state.step_in_epoch += 1
        state.samples_seen += self.plan.global_batch
        self.logger.advance()
        reason = self.stop_requested()
        if reason and not self.exit_code and state.step_in_epoch >= self.steps_per_epoch:  # --stop-at-step (not a
            self.stop_after_epoch, reason = reason, None  # signal: its grace may not cover an evaluation): epoch first
        save_now = bool(reason) or bool(cfg.checkpoint_every and state.global_step % cfg.checkpoint_every == 0)
        if cfg.log_every and state.global_step % cfg.log_every == 0:
            self._log_train()
        elif save_now:  # never checkpoint a NaN state: check (and keep) the open window first
            self.check_finite(self.window.reduce(self.acc)[0])
        self._account(t_data, optimizer_step=True)  # evaluations and checkpoints are not training time
        evaluate = bool(cfg.eval_every and state.global_step % cfg.eval_every == 0)
        early = self._evaluate_in_training() if evaluate else None
        if early:  # the run ends here: check the open window as for any save
            self.check_finite(self.window.reduce(self.acc)[0])
        if save_now or early:
            self.checkpoint()
        if evaluate or save_now:
            self._t_prev = time.perf_counter()
        if reason or early:
            raise StopTraining(early or reason, final=bool(early))

    def _log_train(self) -> None:
        state = self.state
        tot_loss, tot_correct, tot_seen = self.window.reduce(self.acc)
        self.check_finite(tot_loss)
        now = time.perf_counter()
        last_t, last_samples = self._last_log
        rate = (state.samples_seen - last_samples) / max(now - last_t, 1e-9)
        self._last_log = (now, state.samples_seen)
        values = {
            **self.task.train_values(tot_loss, tot_correct, tot_seen),  # loss, accuracy (a classification's)
            "lr": self.scheduler.get_last_lr()[0],
            "samples_per_s": rate,
        }
        self.logger.log("train", state.global_step, self._step_epoch(), values)
        self.window.restore(None, self.acc.is_main_process)

    def _account(self, t_data: float, optimizer_step: bool) -> None:
        """Host-side time split of the steady state: waiting for data vs everything else."""
        now = time.perf_counter()
        self.timer.train_s += now - self._t_prev
        if self.state.global_step >= WARMUP_STEPS_EXCLUDED:
            self.timer.data_wait += t_data - self._t_prev
            self.timer.total += now - self._t_prev
            self.timer.samples += self.plan.global_batch if optimizer_step else 0
        self._t_prev = now

    def stop_requested(self) -> str | None:
        """Agree across ranks on whether to stop now (a signal may reach only some ranks).

        Several processes vote with one small all-reduce every ``SIGNAL_VOTE_EVERY`` steps
        (at most ``--log-every``), not every step: on gloo a per-step vote cost up to 1 ms.
        """
        acc, cfg, step = self.acc, self.cfg, self.state.global_step
        if cfg.stop_at_step is not None and step >= cfg.stop_at_step:
            return f"--stop-at-step {cfg.stop_at_step}"
        flag = self.stop_signal or 0
        if acc.num_processes > 1:
            every = max(1, min(cfg.log_every, SIGNAL_VOTE_EVERY))
            if step % every:
                return None
            flag = int(acc.reduce(torch.tensor([flag], device=acc.device), reduction="max").item())
        if not flag:
            return None
        self.exit_code = 128 + flag  # the shell's convention for "ended by this signal", after a clean save
        return f"received {signal.Signals(flag).name}"

    def check_finite(self, loss_sum: float) -> None:
        if not math.isfinite(loss_sum):
            raise NonFiniteLossError(
                f"training loss became {loss_sum} by step {self.state.global_step}; stopping. The last good "
                f"checkpoint in {self.run_dir.checkpoints} is kept. Lower --lr, keep "
                "--max-grad-norm on, or pass --skip-nonfinite to skip such steps"
            )

    # ---- evaluation, checkpoints, exports ------------------------------------------------------------------
    def evaluate(self, with_confusion: bool = False) -> dict[str, Any]:
        """The model's eval metrics; with ``--ema`` also the average's, as ``eval_ema_accuracy``, ``eval_ema_loss``."""
        tta, full = self.cfg.tta, self.bitwise is not None  # --bitwise: full batches on any setup
        result = self.task.evaluate(self.acc, self.model, self.eval_dl, with_confusion, tta=tta, full_batches=full)
        if self.features.ema is not None:
            ema = self.task.evaluate(self.acc, self.features.ema.module, self.eval_dl, tta=tta, full_batches=full)
            result.update(self.features.ema_results(ema))
        if not math.isfinite(result["eval_loss"]):  # NaN/Inf outputs: no metric of this model means anything
            raise NonFiniteLossError(
                f"evaluation loss is {result['eval_loss']} at step {self.state.global_step}: the model's outputs on "
                f"the test images are not finite; the last good checkpoint in {self.run_dir.checkpoints} is kept. "
                "Lower --lr or keep --max-grad-norm on"
            )
        return result

    def log_eval(self, result: dict[str, Any]) -> None:
        state = self.state
        values = {k: v for k, v in result.items() if k != "confusion"}
        values["train_time_s"] = self.timer.train_s  # training only: no start-up, evaluations or checkpoints
        self.logger.log("eval", state.global_step, self._step_epoch(), values)
        state.last_eval_step = state.global_step
        value, best = result[self.task.monitor], state.best_metric  # eval_accuracy for images
        if improves(value, best, self.task.higher):
            state.best_metric, state.best_step = value, state.global_step
            self.export(self.run_dir / BEST)

    def checkpoint(self) -> None:
        state, cfg = self.state, self.cfg
        position = (state.global_step, state.epoch)
        if self.last_saved == position:  # e.g. --checkpoint-every fired on the step we stop at
            return
        state.extra["log_window"] = self.window.reduce(self.acc)
        self.check_finite(state.extra["log_window"][0])  # never checkpoint (or finish) a NaN state
        self._settle_fp16_skips()
        state.extra["train_time_s"] = self.timer.train_s
        state.extra.update(self.attempts.record())  # the run's wall time over its attempts, to this save
        state.extra.update(self.features.checkpoint_extra())  # EMA updates, early-stopping counter
        state.extra[TRACKER_RUNS] = tracker_run_ids(self.acc, state.extra.get(TRACKER_RUNS))  # a resume reopens them
        path = save_checkpoint(
            self.acc,
            self.run_dir,
            state,
            self.meta,
            cfg.keep_last,
            scheduler_state=self.scheduler.state_dict(),
            # the checkpoint this run resumed from stays until the run has saved --keep-last of its own
            protect=self.resume_path if self.saves + 1 < cfg.keep_last else None,
            tensors=self.features.checkpoint_files(),  # --ema: ema.safetensors
        )
        self.saves += 1
        if self.rt.is_main:
            self.run_dir.commit_replace()  # the new run now has something worth keeping
        self.last_saved = position
        self.logger.event("checkpoint", state.global_step, self._step_epoch(), path=str(path))

    def export(self, out_dir: Path) -> None:
        """Unwrapped safetensors + config.json (main process writes; every rank must call)."""
        state_dict = self.acc.get_state_dict(self.model)  # collective under FSDP/DeepSpeed
        if self.rt.is_main:
            export_weights(state_dict, out_dir, self.meta["model_config"])

    def finish(self, t_launch: float, stopped: str | None = None) -> dict[str, Any]:
        """Final evaluation, export, summary.json, confusion matrix and plots (``stopped``: why it ended early)."""
        state, acc, rt = self.state, self.acc, self.rt
        final = self.evaluate(with_confusion=True)
        self._settle_fp16_skips()
        if state.last_eval_step != state.global_step:  # else the evaluation of this step is already logged
            self.log_eval(final)
        self.export(self.run_dir / MODEL)
        if rt.is_main:
            self.features.export_ema(self.run_dir / MODEL_EMA, self.meta["model_config"])
        summary = {
            **({"stopped": stopped} if stopped else {}),
            **self.task.summary(final),  # eval_accuracy and eval_loss for images; eval_loss and the metrics
            **self.features.ema_summary(final),
            "eval_samples": final["eval_samples"],
            "global_step": state.global_step,
            "epochs_completed": state.epoch,
            "samples_seen": state.samples_seen,
            f"best_{self.task.monitor}": state.best_metric,
            "best_step": state.best_step,
            **self.task.best_note(state.best_step, state.best_metric, state.global_step, self.run_dir / BEST),
            "nonfinite_skipped": state.nonfinite_skipped,
            "fp16_skipped_steps": state.fp16_skipped_steps,
            "loss_scale": acc.scaler.get_scale() if acc.scaler is not None else None,
            **{key: self.meta["resolved"][key] for key in SETUP},  # as build resolved them (config.yaml)
            "data_parallel": rt.data_parallel,
            "threads_per_process": rt.threads,
            "wall_time_s": (wall := time.perf_counter() - t_launch),  # this attempt's
            **self.attempts.summary(state.global_step, wall),  # attempts, attempt_steps, total_wall_time_s
            "setup_s": self.logger.started - t_launch,  # runtime, data and model before the first step
            "train_time_s": self.timer.train_s,  # every step's time, without evaluations and checkpoints
            "train_samples_per_s": self.timer.samples / self.timer.total if self.timer.total > 0 else None,
            "data_wait_fraction": self.timer.fraction(),
            "peak_memory_mb": peak_memory_mb(acc.device),  # since training began (set-up's peaks are not in it)
            "peak_reserved_memory_mb": peak_memory_mb(acc.device, reserved=True),
        }
        open_window = self.window.record(acc, state.global_step)  # steps no train record holds; every rank
        if rt.is_main:
            self._write_results(summary, final.get("confusion"), open_window)
        return summary

    def _write_results(self, summary: dict[str, Any], confusion: torch.Tensor | None, open_window: dict | None) -> None:
        """The confusion matrix and plots, then summary.json, last: it marks the run finished (``--resume auto``
        then touches nothing), so a run killed before it is finished again, not left without its plots."""
        out = self.run_dir.path
        self.task.write_results(out, confusion, self.info.class_names, self.cfg.plots)  # images: the confusion
        if self.cfg.plots:
            from accel_train.plots import plot_curves

            plot_curves(out)
        summary.update(check_memorised(self.run_dir.metrics, self.meta["resolved"], self.cfg.pretrained, open_window))
        write_json_atomic(out / SUMMARY, summary, "the run summary")
        self.run_dir.commit_replace()
        self.rt.print(
            f"accel_train: {self.task.result_line(summary)} | "
            f"{self.attempts.line(self.state.global_step, summary['wall_time_s'])} | wrote {out}"
            + (f"\naccel_train: note: {summary['best_note']}" if "best_note" in summary else "")
        )
