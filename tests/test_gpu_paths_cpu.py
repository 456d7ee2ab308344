"""Issue 11: the GPU paths' logic, proven on CPU analogues (no GPU has run these paths yet).

Each test names the defect it guards: DataParallel replicas' autocast dtype (threads, as torch's
``parallel_apply`` runs them), fp16 skip accounting with a real ``GradScaler`` on CPU, resume with and
without a scaler, the process-count line, FSDP's BatchNorm config and sharded checkpoints, the CUDA
RNG left alone by augmentation, NCCL bound to its device, and Slurm's signal reaching the ranks.
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import yaml

from accel_train.config import parse_config
from accel_train.errors import CheckpointError, LaunchError
from accel_train.runtime import AutocastDataParallel, check_gpu_count, wrap_data_parallel

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    "--dataset", "synthetic", "--synthetic-size", "256", "--synthetic-test-size", "64",
    "--synthetic-image-size", "16", "--model", "lenet", "--batch-size", "16",
    "--report-to", "none", "--no-plots", "--no-progress", "--log-every", "1",
]  # fmt: skip


# ---- 1. DataParallel replicas compute in the run's autocast dtype ---------------------------------------------
def _parallel_apply_like_torch(modules, inputs, kwargs_tup=None, devices=None):
    """torch's parallel_apply on CPU: one thread per replica, autocast re-entered WITHOUT a dtype.

    In torch the thread enters ``torch.amp.autocast(device_type, enabled=...)``, so the thread's default
    dtype applies (fp16 on CUDA). Here the CPU default (bf16) plays that part, and the run asks for fp16.
    """
    enabled = torch.is_autocast_enabled("cpu")
    results = [None] * len(modules)

    def work(i):
        with torch.autocast("cpu", enabled=enabled):
            results[i] = modules[i](*inputs[i], **(kwargs_tup[i] if kwargs_tup else {}))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(modules))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("dtype", [None, torch.float16])
def test_data_parallel_replicas_compute_in_the_autocast_dtype(monkeypatch, dtype):
    monkeypatch.setattr(sys.modules["torch.nn.parallel.data_parallel"], "parallel_apply", _parallel_apply_like_torch)
    model = nn.Linear(4, 3)
    dp = wrap_data_parallel(model, 2, autocast_dtype=dtype)
    assert isinstance(dp, AutocastDataParallel) and list(dp.state_dict()) == ["module.weight", "module.bias"]
    replicas = [nn.Linear(4, 3), nn.Linear(4, 3)]
    inputs = [(torch.randn(2, 4),), (torch.randn(2, 4),)]
    with torch.autocast("cpu", dtype=torch.float16):  # what accelerate's autocast does on the main thread
        outputs = dp.parallel_apply(replicas, inputs, [{}, {}])
    expected = torch.float16 if dtype else torch.bfloat16  # plain DataParallel: the thread default, not the run's
    assert [o.dtype for o in outputs] == [expected, expected]


def test_data_parallel_without_autocast_stays_fp32(monkeypatch):
    monkeypatch.setattr(sys.modules["torch.nn.parallel.data_parallel"], "parallel_apply", _parallel_apply_like_torch)
    dp = wrap_data_parallel(nn.Linear(4, 3), 2, autocast_dtype=torch.bfloat16)
    outputs = dp.parallel_apply([nn.Linear(4, 3)], [(torch.randn(2, 4),)], [{}])
    assert outputs[0].dtype == torch.float32  # the run's autocast is off: the wrapper does not switch it on


# ---- 5. fp16 skip accounting, with a real GradScaler on CPU ------------------------------------------------------
def _build(out: Path, *args: str, scaler: torch.amp.GradScaler | None = None):
    from accel_train.build import build_trainer
    from accel_train.checkpoint.state import resolve_resume
    from accel_train.run_dir import RunDir
    from accel_train.runtime import build_runtime

    cfg = parse_config([*SMALL, "--output-dir", str(out), *args])
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


# ---- 6. resume with and without a scaler ---------------------------------------------------------------------
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


# ---- 3. FSDP: the BatchNorm-safe config, and sharded checkpoints read only under FSDP ----------------------------
def test_fsdp_config_avoids_the_buffer_crash_and_the_doctor_warns_about_it(tmp_path):
    from accel_train.doctor import Environment, diagnose_config

    cfg = yaml.safe_load((REPO / "accelerate_configs" / "fsdp.yaml").read_text())
    assert cfg["fsdp_config"]["fsdp_version"] == 2
    assert cfg["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is False  # accelerate #3898

    def codes(config: dict) -> list[str]:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(config))
        env = Environment(cuda_device_count=8, cpu_count=8, port_in_use=lambda port: False,
                          cuda_device_names=[f"GPU {i}" for i in range(8)])  # fmt: skip
        return diagnose_config(path, env).codes()

    assert "fsdp2-ram-efficient-loading" not in codes(cfg)
    cfg["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] = True
    assert "fsdp2-ram-efficient-loading" in codes(cfg)


def test_sharded_checkpoint_needs_fsdp_and_fsdp_needs_shards(tmp_path):
    from accelerate.utils import DistributedType

    from accel_train.checkpoint.state import _check_setup_can_read

    sharded = tmp_path / "sharded"
    (sharded / "pytorch_model_fsdp_0").mkdir(parents=True)
    full = tmp_path / "full"
    full.mkdir()
    (full / "model.safetensors").write_bytes(b"")
    ddp, fsdp = (
        SimpleNamespace(distributed_type=DistributedType.MULTI_GPU),
        SimpleNamespace(distributed_type=DistributedType.FSDP),
    )
    with pytest.raises(CheckpointError, match="FSDP-sharded weights.*fsdp.yaml"):
        _check_setup_can_read(ddp, sharded, {})
    with pytest.raises(CheckpointError, match="written by a MULTI_GPU run"):
        _check_setup_can_read(fsdp, full, {"resolved": {"distributed_type": "MULTI_GPU"}})
    _check_setup_can_read(fsdp, sharded, {})  # the right pairs pass
    _check_setup_can_read(ddp, full, {})


# ---- 10. launch: more processes than GPUs; NCCL bound to its device ------------------------------------------
def test_more_processes_than_gpus_is_one_clear_line():
    env = {"LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "5", "WORLD_SIZE": "8"}
    with pytest.raises(LaunchError, match=r"starts 8 processes .* has 2 GPU\(s\); pass --num_processes 2"):
        check_gpu_count(env, cuda_count=2)
    check_gpu_count(env, cuda_count=8)
    check_gpu_count(env, cuda_count=0)  # CPU ranks (gloo) are another matter
    check_gpu_count({"LOCAL_WORLD_SIZE": "8"}, cuda_count=2)  # not launched: nothing to say


def test_nccl_process_group_is_bound_to_the_local_gpu(monkeypatch):
    import torch.distributed as dist

    from accel_train.runtime import init_process_group_per_attempt

    seen = {}
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "rendezvous", lambda *a, **k: iter([(dist.HashStore(), 1, 2)]))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(backend=backend, **kw))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: seen.update(set_device=device))
    init_process_group_per_attempt(cpu=False, timeout=timedelta(seconds=5))
    assert seen["backend"] == "nccl" and seen["device_id"] == torch.device("cuda", 1) == seen["set_device"]
    seen.clear()
    init_process_group_per_attempt(cpu=True, timeout=timedelta(seconds=5))
    assert seen["backend"] == "gloo" and seen["device_id"] is None


# ---- 2, 4. host-to-GPU copies do not block; compile runs after DDP wrapping ------------------------------------
def test_batches_are_copied_non_blocking_and_compile_is_left_to_prepare(tmp_path):
    from accel_train.runtime import build_runtime

    rt = build_runtime(parse_config([*SMALL, "--output-dir", str(tmp_path / "run")]))
    assert rt.accelerator.dataloader_config.non_blocking is True
    build = (REPO / "accel_train" / "build.py").read_text()
    assert "torch.compile(" not in build  # accelerate compiles inside prepare, after the DDP wrap (runtime.py)
    assert "TorchDynamoPlugin(backend=" in (REPO / "accel_train" / "runtime.py").read_text()


# ---- 9. augmentation leaves every CUDA generator alone --------------------------------------------------------
def test_augmentation_seeds_only_the_cpu_generator(monkeypatch):
    from accel_train.data.base import TensorImageDataset

    def flip(image):
        return image.flip(-1) if torch.rand(()) < 0.5 else image

    images = torch.randint(0, 255, (8, 1, 4, 4), dtype=torch.uint8)
    data = TensorImageDataset(images, torch.arange(8), transform=flip)
    first = [data[i][0] for i in range(8)]
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: pytest.fail("augmentation reseeded CUDA"))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: pytest.fail("augmentation reseeded CUDA"))
    state = torch.get_rng_state()
    again = [data[i][0] for i in range(8)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # per-sample seeds: reproducible
    assert torch.equal(state, torch.get_rng_state())  # and the global CPU stream is untouched


# ---- 11. Slurm: the preemption signal reaches the ranks, not only the batch shell --------------------------------
def test_slurm_signal_reaches_the_job_steps():
    text = (REPO / "scripts" / "slurm" / "train.sbatch").read_text()
    signal_lines = [line for line in text.splitlines() if line.startswith("#SBATCH --signal")]
    assert signal_lines and all("B:" not in line.split()[1] for line in signal_lines), signal_lines
    assert "exec accelerate launch" in text  # the launcher replaces bash: nothing in between swallows SIGTERM


# ---- issue 25: FSDP in half precision with BatchNorm in NCHW is one line --------------------------------------
def test_fsdp_half_precision_batchnorm_without_channels_last_is_refused_in_one_line():
    from accel_train.models import create_model
    from accel_train.runtime import check_fsdp_batchnorm

    bn, plain = create_model("resnet18", 10, 3, 32), create_model("lenet")
    with pytest.raises(LaunchError, match=r"FSDP in bf16 casts BatchNorm.*drop --no-channels-last") as caught:
        check_fsdp_batchnorm("DistributedType.FSDP", "bf16", "cuda", False, bn)
    assert "\n" not in str(caught.value)
    with pytest.raises(LaunchError, match="FSDP in fp16"):
        check_fsdp_batchnorm("FSDP", "fp16", "cuda", False, bn)
    for allowed in (
        ("FSDP", "bf16", "cuda", True, bn),  # channels_last: the default for conv models in bf16
        ("FSDP", "no", "cuda", False, bn),  # fp32: parameters and statistics agree
        ("FSDP", "bf16", "cuda", False, plain),  # no BatchNorm
        ("MULTI_GPU", "bf16", "cuda", False, bn),  # DDP keeps BatchNorm's parameters in fp32 (autocast)
        ("FSDP", "bf16", "cpu", False, bn),
    ):
        check_fsdp_batchnorm(*allowed)


# ---- issue 25: memory peaks start when training starts; the probe's cache goes back -----------------------------
def test_peak_memory_is_reset_before_the_first_step_and_reserved_memory_is_reported(tmp_path, monkeypatch):
    import accel_train.trainer as trainer_module

    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 8 * 2**20)
    cuda = torch.device("cuda", 0)
    trainer_module._reset_peak_memory(cuda)
    trainer_module._reset_peak_memory(torch.device("cpu"))  # nothing to reset on the CPU
    assert calls == [("reset", cuda)]
    assert (trainer_module._peak_memory_mb(cuda), trainer_module._peak_memory_mb(cuda, reserved=True)) == (3.0, 8.0)

    trainer = _build(tmp_path / "run", "--max-steps", "2")
    seen = []
    monkeypatch.setattr(trainer_module, "_reset_peak_memory", lambda device: seen.append(trainer.state.global_step))
    summary = _fit(trainer)
    assert seen == [0]  # once, before any step: set-up's peaks are not training's
    assert summary["peak_memory_mb"] is None and summary["peak_reserved_memory_mb"] is None  # CPU


def test_max_device_batch_probe_gives_its_cached_memory_back_before_the_data_is_placed(monkeypatch):
    from contextlib import nullcontext

    from accelerate.utils import DistributedType

    from accel_train.data.pipeline import plan_batches
    from accel_train.features import device_batch

    released = []
    monkeypatch.setattr(device_batch, "_release", lambda: released.append("release"))
    acc = SimpleNamespace(
        distributed_type=DistributedType.NO, device=torch.device("meta"),
        reduce=lambda t, reduction: torch.tensor([-64]),  # the ranks agree on 64 (a meta tensor holds no value)
        autocast=nullcontext, print=lambda *a: released.append("chosen"),
    )  # fmt: skip
    plan = plan_batches(1, 16, 1, 64, None)
    chosen = device_batch.fit_device_batch(acc, nn.Linear(12, 3), plan, (12,), None, even=False)
    assert chosen.micro_batch == 64  # the meta device never runs out of memory
    assert released == ["release", "chosen"]  # the cache went back after the probe, before anything else
