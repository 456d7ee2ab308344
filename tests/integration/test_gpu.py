"""Issue 11: the GPU paths on real GPUs, and the CPU checks of the GPU tooling.

Tests marked ``gpu`` (one CUDA GPU) or ``multigpu`` (two or more) skip on the CPU-only CI; they are
the ``pytest`` check of ``scripts/gpu_acceptance.py`` on a GPU machine. Each expensive run is a
module-scoped fixture that several tests read. The unmarked tests run everywhere: GPUs are hidden
from them (``conftest.hide_gpus``). The acceptance itself is tested without a GPU in
tests/unit/test_gpu_acceptance.py.

Comparisons across devices or process layouts use SGD: Adam divides each update by the running
gradient magnitude, so where a gradient is close to zero, round-off in it changes the update by up
to the learning rate and a weights tolerance says nothing. With SGD a weight differs by about
lr x (the gradient's round-off) per step, while a real mistake (a wrong batch, a lost optimizer or
RNG state) moves weights by about lr x the gradient itself, orders of magnitude more.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading

import pytest
from conftest import FAST, HIDDEN_GPUS, _env, check, max_abs_diff, metrics, run_script, summary, weights

# TF32 off: fp32 matmuls and convolutions really are fp32 (TF32 keeps 10 mantissa bits, and would
# dominate every difference below); cuBLAS with a fixed workspace picks reproducible kernels.
DETERMINISTIC = {"NVIDIA_TF32_OVERRIDE": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
ON_CPU = {**DETERMINISTIC, "CUDA_VISIBLE_DEVICES": ""}  # the CPU side of a GPU test: no GPU visible at all
ON_GPU = {**DETERMINISTIC, "CUDA_VISIBLE_DEVICES": "0"}  # one GPU: plain train.py on several would be DataParallel

SGD_LENET = [
    "--model", "lenet", "--optimizer", "sgd", "--lr", "0.05", "--global-batch-size", "32",
    "--max-steps", "24", "--log-every", "1", *FAST,
]  # fmt: skip
# CIFAR-shaped synthetic data: resnet18 with BatchNorm at its real input size, no download.
CIFAR_SHAPED = [
    "--dataset", "synthetic", "--synthetic-channels", "3", "--synthetic-image-size", "32",
    "--synthetic-size", "512", "--synthetic-test-size", "128",
]  # fmt: skip
# CPU and GPU kernels add in different orders: with TF32 off each op differs by fp32 round-off
# (~1e-7 relative), which 24 SGD steps should grow to ~1e-6..1e-5 on lenet. 1e-4 leaves room for
# that and stays 50x below one step's update (the 24th step moves these weights by up to 5e-3,
# measured on CPU), the size of the smallest real resume mistake.
CROSS_DEVICE_TOL = 1e-4
# One GPU vs two: the same fp32 math, only the gradient sum is split (DataParallel reduces onto
# GPU 0, DDP all-reduces): differences stay at round-off.
DP_DDP_TOL = 1e-5


def _device_type(run_dir) -> str:
    return summary(run_dir)["device"].split(":")[0]


# ---- hiding GPUs from the CPU suite --------------------------------------------------------------------------
def test_tests_without_a_gpu_marker_see_no_gpu_in_process_or_in_children():
    import torch

    env = _env()
    assert env["CUDA_VISIBLE_DEVICES"] == HIDDEN_GPUS
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
    probe = "import torch; print(torch.cuda.is_available(), torch.cuda.device_count())"
    proc = check(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300))
    assert proc.stdout.split() == ["False", "0"]


def test_an_explicit_cuda_visible_devices_still_wins():
    assert _env({"CUDA_VISIBLE_DEVICES": "1"})["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.mark.gpu
def test_gpu_tests_see_the_gpus():
    import torch

    assert _env().get("CUDA_VISIBLE_DEVICES") != HIDDEN_GPUS
    assert torch.cuda.is_available() and torch.cuda.device_count() >= 1


# ---- one GPU: accuracy and mixed precision -------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_gpu_run(tmp_path_factory):
    """The default run (lenet on digits, default epochs) on one GPU."""
    out = tmp_path_factory.mktemp("single_gpu") / "default"
    check(run_script("train.py", *FAST, "--output-dir", str(out), config="single_gpu.yaml"))
    return out


@pytest.mark.gpu
def test_single_gpu_default_run_reaches_the_cpu_accuracy(default_gpu_run):
    s = summary(default_gpu_run)
    assert s["device"].startswith("cuda") and s["world_size"] == 1 and s["data_parallel"] is False
    assert s["eval_accuracy"] >= 0.95, s
    assert s["peak_memory_mb"] and s["peak_memory_mb"] > 0


@pytest.fixture(scope="module", params=["bf16", "fp16"])
def mixed_precision_run(request, tmp_path_factory):
    precision = request.param
    out = tmp_path_factory.mktemp(f"mixed_{precision}") / "run"
    args = ["--model", "lenet", "--max-steps", "60", "--log-every", "5", "--mixed-precision", precision, *FAST]
    check(run_script("train.py", *args, "--output-dir", str(out), config="single_gpu.yaml"))
    return precision, out


@pytest.mark.gpu
def test_mixed_precision_runs_finish_with_finite_loss(mixed_precision_run):
    precision, out = mixed_precision_run
    s = summary(out)
    assert s["mixed_precision"] == precision and s["device"].startswith("cuda")
    assert s["global_step"] == 60 and math.isfinite(s["eval_loss"])
    losses = [m["loss"] for m in metrics(out) if m["event"] == "train"]
    assert losses and all(math.isfinite(x) for x in losses)


@pytest.mark.gpu
def test_fp16_reports_skipped_steps_and_its_loss_scale(mixed_precision_run):
    precision, out = mixed_precision_run
    s = summary(out)
    assert type(s["fp16_skipped_steps"]) is int
    if precision == "fp16":
        assert 0 <= s["fp16_skipped_steps"] < s["global_step"] / 2, s  # a few overflow while the scale settles
        assert s["loss_scale"] > 0
    else:
        assert s["fp16_skipped_steps"] == 0 and s["loss_scale"] is None  # bf16 needs no scaler


@pytest.mark.gpu
def test_fp16_optimizer_step_does_not_sync_the_gpu():
    """Trainer._scaled_step under accelerate's fp16 GradScaler and fused Adam, with CUDA's sync check set to raise."""
    from types import SimpleNamespace

    import torch
    from accelerate import Accelerator

    from accel_train.trainer import Trainer

    acc = Accelerator(mixed_precision="fp16")
    linear = torch.nn.Linear(64, 8).to(acc.device)
    model, opt = acc.prepare(linear, torch.optim.Adam(linear.parameters(), fused=True))
    fake = SimpleNamespace(acc=acc, optimizer=opt, _fp16_skips=None)
    x = torch.randn(16, 64, device=acc.device)
    for step in range(4):
        with acc.autocast():
            loss = model(x).float().pow(2).mean() * (float("inf") if step == 1 else 1.0)
        acc.backward(loss)
        torch.cuda.set_sync_debug_mode("error")
        try:
            Trainer._scaled_step(fake)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        opt.zero_grad(set_to_none=True)
    assert int(fake._fp16_skips.item()) == 1  # the step with inf gradients, counted on the device


# ---- resume across devices -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cross_device_runs(tmp_path_factory):
    """Straight runs on each device, and runs stopped at step 11 on one device and resumed on the other."""
    root = tmp_path_factory.mktemp("cross_device")
    env = {"cpu": ON_CPU, "gpu": ON_GPU}
    for device in env:
        check(run_script("train.py", *SGD_LENET, "--output-dir", str(root / f"{device}_straight"), env=env[device]))
    for first, second in (("cpu", "gpu"), ("gpu", "cpu")):
        out = str(root / f"{first}_to_{second}")
        check(run_script("train.py", *SGD_LENET, "--stop-at-step", "11", "--output-dir", out, env=env[first]))
        proc = check(run_script("train.py", *SGD_LENET, "--resume", "auto", "--output-dir", out, env=env[second]))
        assert "resumed from" in proc.stdout, proc.stdout[-2000:]
    return root


@pytest.mark.gpu
def test_straight_runs_on_cpu_and_gpu_agree(cross_device_runs):
    cpu, gpu = cross_device_runs / "cpu_straight", cross_device_runs / "gpu_straight"
    assert (_device_type(cpu), _device_type(gpu)) == ("cpu", "cuda")
    assert max_abs_diff(weights(cpu), weights(gpu)) <= CROSS_DEVICE_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("first,second", [("cpu", "gpu"), ("gpu", "cpu")])
def test_a_checkpoint_resumes_on_the_other_device(cross_device_runs, first, second):
    moved = cross_device_runs / f"{first}_to_{second}"
    s = summary(moved)
    assert _device_type(moved) == ("cuda" if second == "gpu" else "cpu")
    assert s["global_step"] == 24 and s["samples_seen"] == 24 * 32
    for device in ("cpu", "gpu"):
        straight = cross_device_runs / f"{device}_straight"
        assert max_abs_diff(weights(straight), weights(moved)) <= CROSS_DEVICE_TOL, device


# ---- FSDP on one GPU -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """resnet18 (BatchNorm buffers) under fsdp.yaml at world size 1: stop at step 5, resume; and a plain run."""
    root = tmp_path_factory.mktemp("fsdp")
    args = ["--model", "resnet18", *CIFAR_SHAPED, "--batch-size", "32", "--max-steps", "12", "--log-every", "1", *FAST]
    one = ("--num_processes", "1")
    fsdp = str(root / "fsdp")
    check(
        run_script("train.py", *args, "--stop-at-step", "5", "--output-dir", fsdp, config="fsdp.yaml", launch_args=one)
    )
    resumed = check(
        run_script("train.py", *args, "--resume", "auto", "--output-dir", fsdp, config="fsdp.yaml", launch_args=one)
    )
    check(run_script("train.py", *args, "--output-dir", str(root / "plain"), config="single_gpu.yaml"))
    return root, resumed


@pytest.mark.gpu
def test_fsdp_world_size_one_stops_resumes_and_finishes(fsdp_runs):
    root, resumed = fsdp_runs
    assert "resumed from" in resumed.stdout, resumed.stdout[-2000:]
    s = summary(root / "fsdp")
    assert s["distributed_type"] == "FSDP" and s["world_size"] == 1 and s["device"].startswith("cuda")
    assert s["global_step"] == 12 and math.isfinite(s["eval_loss"])


@pytest.mark.gpu
def test_fsdp_export_is_full_and_matches_a_plain_runs_keys(fsdp_runs):
    import torch

    root, _ = fsdp_runs
    sharded, plain = weights(root / "fsdp"), weights(root / "plain")
    assert sharded.keys() == plain.keys()  # BatchNorm's running stats and num_batches_tracked included
    assert not any(k.startswith(("module.", "_orig_mod.", "_fsdp")) for k in sharded)
    for key, tensor in sharded.items():
        assert tensor.shape == plain[key].shape, key  # full tensors, not one rank's shard
        assert tensor.dtype == plain[key].dtype, key
        if tensor.is_floating_point():
            assert torch.isfinite(tensor).all(), key


# ---- two GPUs ------------------------------------------------------------------------------------------------
@pytest.mark.multigpu
def test_data_parallel_replicas_compute_in_the_autocast_dtype():
    """torch's parallel_apply re-enters autocast in each replica thread with its default dtype (fp16 on CUDA)."""
    import torch
    import torch.nn as nn

    from accel_train.models import create_model
    from accel_train.runtime import wrap_data_parallel

    model = create_model("lenet").cuda()
    seen, lock = [], threading.Lock()

    def record(module, inputs, output):
        with lock:
            seen.append((output.device.index, output.dtype))

    linear = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    linear.register_forward_hook(record)  # replicas share the module's hooks
    wrapped = wrap_data_parallel(model, 2, autocast_dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        wrapped(torch.randn(8, 1, 28, 28, device="cuda"))
    assert sorted({device for device, _ in seen}) == [0, 1]  # one replica ran on each GPU
    assert {dtype for _, dtype in seen} == {torch.bfloat16}, seen


@pytest.mark.multigpu
def test_data_parallel_bf16_run_trains(tmp_path):
    out = tmp_path / "run"
    args = ["--model", "lenet", "--max-steps", "20", "--mixed-precision", "bf16", *FAST, "--output-dir", str(out)]
    check(run_script("train.py", *args, config="dp.yaml", launch_args=("--gpu_ids", "0,1")))
    s = summary(out)
    assert s["data_parallel"] is True and s["mixed_precision"] == "bf16" and math.isfinite(s["eval_loss"])


@pytest.fixture(scope="module")
def dp_and_ddp_runs(tmp_path_factory):
    """The same global batch of 32 on GPUs 0 and 1: DataParallel (1 process) and DDP (2 processes)."""
    root = tmp_path_factory.mktemp("dp_ddp")
    args = [*SGD_LENET, "--max-steps", "20"]
    check(
        run_script(
            "train.py", *args, "--output-dir", str(root / "dp"), config="dp.yaml",
            launch_args=("--gpu_ids", "0,1"), env=DETERMINISTIC,
        )
    )  # fmt: skip
    check(
        run_script(
            "train.py", *args, "--output-dir", str(root / "ddp"), config="multi_gpu.yaml",
            launch_args=("--num_processes", "2", "--gpu_ids", "0,1"), env=DETERMINISTIC,
        )
    )  # fmt: skip
    return root


@pytest.mark.multigpu
def test_data_parallel_and_ddp_give_the_same_weights(dp_and_ddp_runs):
    dp, ddp = summary(dp_and_ddp_runs / "dp"), summary(dp_and_ddp_runs / "ddp")
    assert (dp["data_parallel"], dp["world_size"], dp["global_batch"]) == (True, 1, 32)
    assert (ddp["data_parallel"], ddp["world_size"], ddp["global_batch"]) == (False, 2, 32)
    assert ddp["distributed_type"] == "MULTI_GPU" and ddp["device"].startswith("cuda")
    assert max_abs_diff(weights(dp_and_ddp_runs / "dp"), weights(dp_and_ddp_runs / "ddp")) <= DP_DDP_TOL


# ---- issue 12 (4): keyed augmentation and data on the GPU -------------------------------------------------------
@pytest.mark.gpu
def test_keyed_values_and_batched_crops_are_identical_on_cpu_and_cuda():
    import torch

    from accel_train.data.augment import CropFlip
    from accel_train.keyed import keyed_bernoulli, keyed_bits, keyed_randint, keyed_uniform

    idx = torch.cat([torch.arange(1000), torch.tensor([2**31 - 1, 2**32 + 5, 2**40 + 3])])
    for draw in (
        lambda i: keyed_bits(42, 3, i, 5, "crop"),
        lambda i: keyed_uniform(42, 3, i, 5, "mixup"),
        lambda i: keyed_randint(42, 3, i, 9, 2, 7),
        lambda i: keyed_bernoulli(42, 3, i, 0.3, 4, "dropout"),
    ):
        on_gpu = draw(idx.cuda())
        assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), draw(idx))
    images = torch.randint(0, 256, (256, 3, 32, 32), dtype=torch.uint8)
    crop = CropFlip(32, 4, True)
    assert torch.equal(crop(images.cuda(), idx[:256].cuda(), 42, 3).cpu(), crop(images, idx[:256], 42, 3))


@pytest.mark.gpu
def test_in_memory_data_moves_to_the_gpu_once_and_leaves_every_rng_alone():
    import torch

    from accel_train.data.augment import CropFlip
    from accel_train.data.base import TensorImageDataset
    from accel_train.data.pipeline import place_on_device

    def dataset():
        images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        return TensorImageDataset(images, torch.arange(64), CropFlip(32, 4))

    host, device = dataset(), dataset()
    gpu = torch.device("cuda", torch.cuda.current_device())
    assert place_on_device([device], gpu, 0.25) == [device] and device.images.is_cuda
    cpu_state, cuda_state = torch.get_rng_state(), torch.cuda.get_rng_state()
    for data in (host, device):
        data.set_epoch(2)
    images, labels = device.__getitems__([5, 60, 7])
    assert images.is_cuda and labels.is_cuda
    assert torch.equal(images.cpu(), host.__getitems__([5, 60, 7])[0]) and labels.tolist() == [5, 60, 7]
    assert torch.equal(torch.get_rng_state(), cpu_state) and torch.equal(torch.cuda.get_rng_state(), cuda_state)


@pytest.fixture(scope="module")
def augmented_gpu_and_cpu_runs(tmp_path_factory):
    """CIFAR-format data (augmented by default) on one GPU and on the CPU, recording the model's inputs."""
    from datafiles import write_cifar10
    from test_device_data import RUN

    root = tmp_path_factory.mktemp("device_data_gpu")
    write_cifar10(root / "data", n_per_batch=10, n_test=8)
    for device, env in (("gpu", ON_GPU), ("cpu", ON_CPU)):
        (root / f"rec_{device}").mkdir()
        args = [*RUN, "--data-dir", str(root / "data"), "--output-dir", str(root / device), *FAST]
        check(
            run_script(
                "tests/integration/test_device_data.py", *args, env={**env, "RECORD_DIR": str(root / f"rec_{device}")}
            )
        )
    return root


@pytest.mark.gpu
def test_gpu_run_holds_its_data_on_the_device_and_sees_the_cpu_runs_batches(augmented_gpu_and_cpu_runs):
    import torch
    import yaml
    from test_device_data import recorded

    root = augmented_gpu_and_cpu_runs
    resolved = yaml.safe_load((root / "gpu" / "config.yaml").read_text())["resolved"]
    assert resolved["device"].startswith("cuda") and resolved["data_on_device"] is True
    assert resolved["cudnn_benchmark"] is True and resolved["tf32"] is False  # NVIDIA_TF32_OVERRIDE=0 (ON_GPU)
    assert yaml.safe_load((root / "cpu" / "config.yaml").read_text())["resolved"]["data_on_device"] is False
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    std = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)

    def pixels(x):  # normalisation rounds differently on each device; the uint8 pixels behind it may not differ
        return ((x * std + mean) * 255).round().to(torch.uint8)

    gpu, cpu = recorded(root / "rec_gpu"), recorded(root / "rec_cpu")
    assert len(gpu) == len(cpu) == 7
    assert all(torch.equal(pixels(a), pixels(b)) for a, b in zip(gpu, cpu, strict=True))


@pytest.mark.gpu
def test_conv_models_under_mixed_precision_default_to_channels_last(mixed_precision_run):
    import yaml

    precision, out = mixed_precision_run
    resolved = yaml.safe_load((out / "config.yaml").read_text())["resolved"]
    assert resolved["channels_last"] is True and resolved["cudnn_benchmark"] is True, resolved


# ---- issue 25: the GPU side of the source defects ----------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_nchw_batch_norm_rejects_bf16_weights_with_fp32_statistics():
    """Why FSDP in bf16 with BatchNorm needs channels_last (runtime.check_fsdp_batchnorm). If this starts to pass,
    torch accepts the mix and the refusal can go."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(8, 4, 6, 6, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.ones(4, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bias = torch.zeros(4, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mean, var = torch.zeros(4, device="cuda"), torch.ones(4, device="cuda")
    with pytest.raises(RuntimeError, match="running_mean|dtype|type"):
        F.batch_norm(x, mean, var, weight, bias, training=True).float().sum().backward()
        torch.cuda.synchronize()


@pytest.mark.gpu
def test_fsdp_bf16_batchnorm_without_channels_last_is_one_line(tmp_path):
    args = ["--model", "resnet18", *CIFAR_SHAPED, "--batch-size", "32", "--max-steps", "2", "--no-channels-last", *FAST]
    proc = run_script("train.py", *args, "--output-dir", str(tmp_path / "run"), config="fsdp.yaml",
                      launch_args=("--num_processes", "1"))  # fmt: skip
    out = proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.returncode != 0 and "Expected running_mean" not in proc.stderr, out  # refused, not crashed
    errors = [line for line in proc.stderr.splitlines() if "error: FSDP in bf16" in line]
    assert errors and "drop --no-channels-last" in errors[0], out


@pytest.mark.gpu
def test_peak_memory_counts_training_and_reserved_memory_is_reported(default_gpu_run):
    s = summary(default_gpu_run)
    assert s["peak_reserved_memory_mb"] >= s["peak_memory_mb"] > 0
