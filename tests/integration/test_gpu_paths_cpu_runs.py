"""Issue 11: the GPU paths' logic, proven on CPU analogues (no GPU has run these paths yet).

Each test names the defect it guards: DataParallel replicas' autocast dtype (threads, as torch's
``parallel_apply`` runs them), fp16 skip accounting with a real ``GradScaler`` on CPU, resume with and
without a scaler, the process-count line, FSDP's BatchNorm config and sharded checkpoints, the CUDA
RNG left alone by augmentation, NCCL bound to its device, and Slurm's signal reaching the ranks.


Whole runs and launches; the in-process tests are in ../unit/test_gpu_paths_cpu.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import SMALL_RUN

from accel_train.config import parse_config


def _build(out: Path, *args: str, scaler: torch.amp.GradScaler | None = None):
    from accel_train.build import build_trainer
    from accel_train.checkpoint.state import resolve_resume
    from accel_train.run_dir import RunDir
    from accel_train.runtime import build_runtime

    cfg = parse_config([*SMALL_RUN, "--output-dir", str(out), *args])
    rt = build_runtime(cfg)
    rt.accelerator.scaler = scaler  # what Accelerator(mixed_precision="fp16") sets up on CUDA
    resume_path = resolve_resume(cfg.resume, cfg.output_dir)  # as loop.fit resolves it, once
    return build_trainer(cfg, rt, RunDir(cfg.output_dir), resume_path)


def _fit(trainer) -> dict:
    """``Trainer.run`` and the lock release that ``loop.fit`` does around it."""
    try:
        return trainer.run(0.0)
    finally:
        trainer.run_dir.lock.release()


def _inject_inf_at(trainer, steps: set[int]) -> None:
    """Make the gradients of the given (1-based) optimizer steps overflow, as fp16 does."""
    calls = {"n": 0}

    def hook(grad):
        calls["n"] += 1
        return grad * float("inf") if calls["n"] in steps else grad

    next(trainer.model.parameters()).register_hook(hook)


def _progress(out: Path, step: int) -> dict:
    return json.loads((out / "checkpoints" / f"step_{step:08d}" / "progress.json").read_text())


# fused Adam skips inside its kernel (accelerate cannot see it); SGD is skipped by the scaler
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_fp16_skipped_steps_are_counted_and_the_schedule_follows_the_steps(tmp_path, optimizer):
    out = tmp_path / optimizer
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    trainer = _build(out, "--optimizer", optimizer, "--max-steps", "6", "--lr-schedule", "linear", scaler=scaler)
    first = next(trainer.model.parameters())
    weights = []
    trainer.features.after_optimizer_step = lambda: weights.append(first.detach().clone())
    _inject_inf_at(trainer, {2, 5})
    summary = _fit(trainer)
    assert summary["global_step"] == 6
    assert summary["fp16_skipped_steps"] == 2
    assert summary["loss_scale"] == 256.0  # halved once per skipped step
    progress = _progress(out, 6)
    assert progress["state"]["fp16_skipped_steps"] == 2  # travels in the checkpoint
    # the schedule advances on every optimizer step (PyTorch's AMP recipe): no host sync to hold it
    assert progress["scheduler"]["last_epoch"] == 6
    lrs = {m["step"]: m["lr"] for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
           if m["event"] == "train"}  # fmt: skip
    assert all(lrs[k + 1] < lrs[k] for k in range(1, 6)), lrs
    # the skipped steps really left the weights alone; the others moved them
    moved = [not torch.equal(a, b) for a, b in zip(weights, weights[1:], strict=False)]
    assert moved == [False, True, True, False, True], moved  # steps 2 and 5 after 1 and 4


def test_fp16_skip_count_needs_no_host_sync_per_step(tmp_path):
    """The skip is counted on the device: no .item()/bool() in the step (fused Adam never syncs itself)."""
    from torch.overrides import TorchFunctionMode

    syncs: list[str] = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("item", "__bool__", "tolist", "__float__", "__int__"):
                syncs.append(func.__name__)
            return func(*args, **(kwargs or {}))

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    trainer = _build(tmp_path / "run", "--optimizer", "adam", "--max-steps", "4", scaler=scaler)
    _inject_inf_at(trainer, {2})
    step = trainer._scaled_step

    def spied():
        with Spy():
            step()

    trainer._scaled_step = spied
    summary = _fit(trainer)
    assert summary["fp16_skipped_steps"] == 1  # still counted, read once at the end
    assert syncs == [], syncs


def test_no_scaler_means_no_fp16_fields(tmp_path):
    summary = _fit(_build(tmp_path / "run", "--max-steps", "2"))
    assert summary["fp16_skipped_steps"] == 0 and summary["loss_scale"] is None
    assert summary["peak_memory_mb"] is None  # CUDA only


@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory) -> Path:
    """A run stopped at step 3 without a scaler (what a CPU, 'no' or bf16 run writes)."""
    out = tmp_path_factory.mktemp("plain") / "run"
    _fit(_build(out, "--max-steps", "6", "--stop-at-step", "3"))
    assert not (out / "checkpoints" / "step_00000003" / "scaler.pt").exists()
    return out


def test_fp16_resumes_a_checkpoint_written_without_a_scaler(plain_checkpoint, tmp_path, capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(plain_checkpoint, out)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    trainer = _build(out, "--max-steps", "6", "--resume", "auto", scaler=scaler)
    assert trainer.state.global_step == 3 and trainer.acc.scaler is scaler  # put back after the load
    assert "holds no fp16 loss scale" in capsys.readouterr().err
    summary = _fit(trainer)
    assert summary["global_step"] == 6 and summary["loss_scale"] == 512.0
    assert (out / "checkpoints" / "step_00000006" / "scaler.pt").is_file()


def test_scaler_state_resumes_and_a_run_without_scaler_ignores_it(tmp_path, capsys):
    out = tmp_path / "run"
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    trainer = _build(out, "--max-steps", "6", "--stop-at-step", "3", scaler=scaler)
    _inject_inf_at(trainer, {1})
    _fit(trainer)
    again = torch.amp.GradScaler("cpu", init_scale=1.0)
    resumed = _build(out, "--max-steps", "6", "--resume", "auto", scaler=again)
    assert again.get_scale() == 512.0 and resumed.state.fp16_skipped_steps == 1
    resumed.run_dir.lock.release()  # built, never fitted: fit() would release it
    capsys.readouterr()
    plain = _build(out, "--max-steps", "6", "--resume", "auto", "--branch")  # e.g. continued in fp32 on CPU
    assert plain.state.global_step == 3 and "loss scale" not in capsys.readouterr().err
    plain.run_dir.lock.release()


def test_peak_memory_is_reset_before_the_first_step_and_reserved_memory_is_reported(tmp_path, monkeypatch):
    import accel_train.trainer as trainer_module
    from accel_train.meters import peak_memory_mb, reset_peak_memory

    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 8 * 2**20)
    cuda = torch.device("cuda", 0)
    reset_peak_memory(cuda)
    reset_peak_memory(torch.device("cpu"))  # nothing to reset on the CPU
    assert calls == [("reset", cuda)]
    assert (peak_memory_mb(cuda), peak_memory_mb(cuda, reserved=True)) == (3.0, 8.0)

    trainer = _build(tmp_path / "run", "--max-steps", "2")
    seen = []
    monkeypatch.setattr(trainer_module, "reset_peak_memory", lambda device: seen.append(trainer.state.global_step))
    summary = _fit(trainer)
    assert seen == [0]  # once, before any step: set-up's peaks are not training's
    assert summary["peak_memory_mb"] is None and summary["peak_reserved_memory_mb"] is None  # CPU
