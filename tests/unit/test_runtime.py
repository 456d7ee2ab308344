"""runtime.py: launch traps, DataParallel wrapping (CUDA device count mocked), threads, batch plans."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from accel_train.checkpoint.keys import strip_key
from accel_train.data.pipeline import EpochSampler, plan_batches
from accel_train.errors import LaunchError, UserError
from accel_train.models import create_model
from accel_train.runtime import (
    check_launch,
    gpus_hidden_on_purpose,
    launched_world_size,
    should_use_data_parallel,
    wants_cpu_ranks,
    wrap_data_parallel,
)
from accel_train.schedule import lr_factor


@pytest.mark.parametrize(
    "dist,device,count,expected",
    [
        ("DistributedType.NO", "cuda", 4, True),  # dp.yaml on a 4-GPU box
        ("NO", "cuda", 2, True),
        ("NO", "cuda", 1, False),  # single_gpu.yaml
        ("NO", "cpu", 4, False),  # cpu.yaml on a GPU box: stays on the CPU
        ("MULTI_GPU", "cuda", 8, False),  # DDP: one GPU per process
        ("FSDP", "cuda", 8, False),
    ],
)
def test_data_parallel_only_for_one_process_seeing_several_gpus(dist, device, count, expected):
    assert should_use_data_parallel(dist, device, count) is expected


def test_data_parallel_wrapper_uses_every_visible_gpu_and_checkpoints_stay_unwrapped(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    model = create_model("lenet")
    wrapped = wrap_data_parallel(model, torch.cuda.device_count())
    assert isinstance(wrapped, nn.DataParallel) and wrapped.module is model
    keys = list(wrapped.state_dict())
    assert all(k.startswith("module.") for k in keys)
    assert {strip_key(k) for k in keys} == set(model.state_dict())
    # torch.compile on top of DataParallel, in either order
    assert strip_key("_orig_mod.module.net.0.weight") == "net.0.weight"
    assert strip_key("module._orig_mod.net.0.weight") == "net.0.weight"


def test_runtime_wraps_the_model_when_one_process_sees_several_gpus(monkeypatch):
    from accel_train.runtime import Runtime

    class FakeAccelerator:
        distributed_type = "DistributedType.NO"
        device = torch.device("cpu")
        is_main_process = True
        mixed_precision = "bf16"

        def print(self, *args, **kwargs):
            self.printed = " ".join(map(str, args))

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr("accel_train.runtime.should_use_data_parallel", lambda d, t, n: n > 1)
    acc = FakeAccelerator()
    rt = Runtime(acc, threads=1)
    out = rt.prepare_model(create_model("lenet"))
    assert isinstance(out, nn.DataParallel) and rt.data_parallel
    assert out.autocast_dtype == torch.bfloat16  # replicas compute in the run's dtype
    assert "DataParallel" in acc.printed and "preferred" in acc.printed


def test_multi_cpu_without_mpirun_is_detected():
    # accelerate's simple launcher: ACCELERATE_USE_CPU + MASTER_PORT when >1 process was asked, no WORLD_SIZE
    with pytest.raises(LaunchError, match="started only one"):
        check_launch({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    check_launch({"ACCELERATE_USE_CPU": "True"})  # cpu.yaml: one process asked, one started
    check_launch({"ACCELERATE_USE_CPU": "True", "MASTER_PORT": "1", "PMI_SIZE": "2"})  # mpirun did start 2
    check_launch({})  # plain python


def test_torchrun_ranks_without_cuda_become_gloo_cpu_ranks():
    assert wants_cpu_ranks({"WORLD_SIZE": "2"}, cuda_available=False)
    assert not wants_cpu_ranks({"WORLD_SIZE": "2"}, cuda_available=True)
    assert not wants_cpu_ranks({}, cuda_available=False)
    assert launched_world_size({"OMPI_COMM_WORLD_SIZE": "4"}) == 4
    assert gpus_hidden_on_purpose({"CUDA_VISIBLE_DEVICES": "-1,-1"})
    assert gpus_hidden_on_purpose({"CUDA_VISIBLE_DEVICES": ""})
    assert not gpus_hidden_on_purpose({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert not gpus_hidden_on_purpose({})


@pytest.mark.parametrize(
    "world,batch,accum,G,cap,expected",
    [
        (1, 32, 1, None, None, (32, 32, 1)),
        (2, 16, 1, None, None, (32, 16, 1)),
        (2, 16, 2, None, None, (64, 16, 2)),
        (1, 99, 1, 32, None, (32, 32, 1)),
        (2, 99, 1, 32, None, (32, 16, 1)),
        (1, 99, 1, 32, 8, (32, 8, 4)),
        (8, 99, 1, 256, 16, (256, 16, 2)),
        (3, 99, 1, 48, 5, (48, 4, 4)),  # 16 per process, cap 5 -> smallest even split: 4 x 4
        (1, 99, 1, 12, 5, (12, 4, 3)),  # 12 under a cap of 5: 3 x 4, never 2 x 6 (over the cap)
        (2, 99, 1, 14, 3, (14, 1, 7)),  # 7 per process, cap 3: a prime needs micro-batches of 1
    ],
)
def test_batch_plans(world, batch, accum, G, cap, expected):
    plan = plan_batches(world, batch, accum, G, cap)
    assert (plan.global_batch, plan.micro_batch, plan.accum_steps) == expected
    assert plan.micro_batch * plan.accum_steps * world == plan.global_batch
    if cap is not None:
        assert plan.micro_batch <= cap  # --max-device-batch is a promise: what one device takes


def test_global_batch_must_divide_by_processes():
    with pytest.raises(UserError, match="not divisible"):
        plan_batches(4, 16, 1, 30)


def test_sampler_order_depends_on_seed_and_epoch_only():
    a, b = EpochSampler(100, seed=1, multiple_of=32), EpochSampler(100, seed=1, multiple_of=32)
    a.set_epoch(3), b.set_epoch(3)
    assert list(a) == list(b) and len(list(a)) == 96
    b.set_epoch(4)
    assert list(a) != list(b)
    assert list(EpochSampler(10, shuffle=False)) == list(range(10))


def test_lr_schedule_is_a_pure_function_of_the_step():
    assert lr_factor(0, 100, "cosine") == 1.0
    assert lr_factor(100, 100, "cosine") == pytest.approx(0.0)
    assert lr_factor(50, 100, "linear") == pytest.approx(0.5)
    assert lr_factor(0, 100, "constant", warmup_steps=4) == pytest.approx(0.25)
    assert lr_factor(80, 100, "step") == pytest.approx(0.01)
    # after warm-up the decay starts from the peak and spans the remaining steps
    assert lr_factor(10, 110, "cosine", warmup_steps=10) == 1.0
    assert lr_factor(60, 110, "cosine", warmup_steps=10) == pytest.approx(0.5)
    assert lr_factor(35, 110, "linear", warmup_steps=10) == pytest.approx(0.75)
    assert lr_factor(110, 110, "linear", warmup_steps=10) == pytest.approx(0.0)


def test_augmentation_depends_on_seed_epoch_and_index_only():
    """Per-sample crops/flips are the same whatever ran before (other batches, dropout, a resume)."""
    from torchvision.transforms import v2

    from accel_train.data.base import TensorImageDataset

    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    ds = TensorImageDataset(
        images, torch.arange(8), transform=v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])
    )
    ds.augment_seed, state = 7, torch.get_rng_state()
    first = ds.__getitems__([1, 2, 3])[0]
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    torch.rand(100)
    ds.__getitems__([5, 6])  # other batches in between (skipped on a resume) change nothing
    assert torch.equal(ds.__getitems__([1, 2, 3])[0], first)
    assert torch.equal(ds[2][0], first[1])  # per-sample and batched paths agree
    ds.set_epoch(1)
    assert not torch.equal(ds.__getitems__([1, 2, 3])[0], first)  # a new epoch, new crops


def test_a_lone_cpu_process_names_the_unquoted_no_and_the_doctor():
    """An unquoted ``distributed_type: NO`` with num_processes > 1 (a wizard file) starts one process through
    accelerate's simple launcher, the same trap as MULTI_CPU without mpirun: the one line says to quote it."""
    from accel_train.errors import LaunchError
    from accel_train.runtime import check_launch

    with pytest.raises(LaunchError) as info:
        check_launch({"ACCELERATE_USE_CPU": "True", "MASTER_PORT": "29500"})
    message = str(info.value)
    assert "\n" not in message and "write 'NO'" in message and "scripts/doctor.py --config_file" in message
    check_launch({"ACCELERATE_USE_CPU": "True"})  # one process asked for: nothing to say


# ---- --threads beyond the cores --------------------------------------------------------------------------------------


def test_threads_beyond_the_cores_are_capped(capsys):
    import torch

    from accel_train.runtime import available_cores, configure_threads

    before = torch.get_num_threads()
    try:
        assert configure_threads(1_000_000).threads == available_cores() == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: --threads 1000000 is more than the"), err
