"""Issue 11: the GPU paths' logic, proven on CPU analogues (no GPU has run these paths yet).

Each test names the defect it guards: DataParallel replicas' autocast dtype (threads, as torch's
``parallel_apply`` runs them), fp16 skip accounting with a real ``GradScaler`` on CPU, resume with and
without a scaler, the process-count line, FSDP's BatchNorm config and sharded checkpoints, the CUDA
RNG left alone by augmentation, NCCL bound to its device, and Slurm's signal reaching the ranks.


The in-process tests; whole runs and launches are in ../integration/test_gpu_paths_cpu_runs.py.
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import yaml
from conftest import REPO, SMALL_RUN

from accel_train.config import parse_config
from accel_train.errors import CheckpointError, LaunchError
from accel_train.runtime import AutocastDataParallel, check_gpu_count, wrap_data_parallel


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


def test_batches_are_copied_non_blocking_and_compile_is_left_to_prepare(tmp_path):
    from accel_train.runtime import build_runtime

    rt = build_runtime(parse_config([*SMALL_RUN, "--output-dir", str(tmp_path / "run")]))
    assert rt.accelerator.dataloader_config.non_blocking is True
    build = (REPO / "accel_train" / "build.py").read_text()
    assert "torch.compile(" not in build  # accelerate compiles inside prepare, after the DDP wrap (runtime.py)
    assert "TorchDynamoPlugin(backend=" in (REPO / "accel_train" / "runtime.py").read_text()


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
