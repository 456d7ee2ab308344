"""``--max-device-batch auto``: the largest micro-batch that fits, agreed by every rank, the global batch kept.

accelerate's ``find_executable_batch_size`` halves each process's batch until a step fits, so the
global batch, and with it the training, depends on the memory of the machine and differs between
ranks. Here the global batch ``G`` is fixed (``--global-batch-size``, or ``--batch-size`` x processes x
accumulation) and only its split changes: each rank probes a forward and backward pass at the
divisors of ``G / processes``, largest first, catching out-of-memory errors, with room reserved for
the optimizer state (two copies of the weights, as Adam keeps). The ranks then take the smallest of
their answers (one all-reduce) and accumulate ``G / processes / micro`` micro-batches per step: the
same optimizer steps on any device, exactly as with that ``--max-device-batch`` given by hand.

The probe runs on the model before it is synchronised (``--sync-bn``) or wrapped, so no rank waits in
a collective while another runs out of memory; the model's buffers (BatchNorm statistics) and the
random state are restored afterwards, so the probe leaves no trace in the run.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn as nn

from accel_train.data.pipeline import BatchPlan
from accel_train.errors import UserError
from accel_train.features.dropout import DropoutKeys

AUTO = "auto"


def candidates(per_process: int, even: bool = False) -> list[int]:
    """The micro-batches that split ``per_process`` samples evenly, largest first (``even``: even ones only)."""
    return [m for m in range(per_process, 0, -1) if per_process % m == 0 and not (even and m % 2)]


def is_out_of_memory(exc: BaseException) -> bool:
    from accelerate.utils.memory import should_reduce_batch_size

    return isinstance(exc, torch.OutOfMemoryError) or should_reduce_batch_size(exc)


def _release() -> None:
    """Free what the failed probe held (tensors kept alive by the traceback, the allocator's cache)."""
    from accelerate.utils.memory import clear_device_cache

    gc.collect()
    clear_device_cache(garbage_collection=True)


def choose_micro_batch(
    per_process: int,
    probe: Callable[[int], None],
    agree: Callable[[int], int],
    even: bool = False,
    release: Callable[[], None] = lambda: None,
) -> int:
    """The largest candidate micro-batch ``probe`` runs without running out of memory, then ``agree``d
    (the minimum over ranks). Every rank calls ``agree`` once, even one where nothing fits. ``release``
    runs after each out-of-memory error."""
    fits = 0
    for micro in candidates(per_process, even):
        try:
            probe(micro)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            release()
            continue
        fits = micro
        break
    agreed = agree(fits)
    if agreed < 1:
        smallest = candidates(per_process, even)[-1] if candidates(per_process, even) else 1
        raise UserError(
            f"--max-device-batch auto: not even a micro-batch of {smallest} fits in device memory on every process; "
            "use a smaller model or image size, mixed precision (--mixed-precision bf16), or a device with more memory"
        )
    return agreed


def probe_step(model: nn.Module, batch: int, sample_shape: tuple[int, ...], device: torch.device, autocast) -> None:
    """One forward and backward pass of ``batch`` zero images (raises on out-of-memory)."""
    x = torch.zeros((batch, *sample_shape), device=device)
    with autocast:
        out = model(x)
    out.float().mean().backward()


def fit_device_batch(
    acc,
    model: nn.Module,
    plan: BatchPlan,
    sample_shape: tuple[int, ...],
    keys: DropoutKeys | None,
    even: bool,
    run: Callable[[int], None] | None = None,
) -> BatchPlan:
    """``plan`` with the largest micro-batch every rank can train (collective: one all-reduce). ``run(micro)``:
    the forward and backward of ``micro`` real samples (the generic task's), instead of zero images."""
    from accelerate.utils import DistributedType

    if acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise UserError(
            f"--max-device-batch auto probes the whole model on one device, which {acc.distributed_type.value} "
            "shards; pass a number instead"
        )
    device = acc.device
    per_process = plan.global_batch // plan.world_size
    model.to(device)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    devices = [device] if device.type == "cuda" else []

    def probe(batch: int) -> None:
        reserve = torch.empty(2 * weights_bytes, dtype=torch.uint8, device=device)  # the optimizer's state
        indices = torch.arange(batch, device=device)
        try:
            with keys.batch(0, indices) if keys else nullcontext():
                run(batch) if run is not None else probe_step(model, batch, sample_shape, device, acc.autocast())
        finally:
            del reserve
            model.zero_grad(set_to_none=True)

    def agree(fits: int) -> int:
        return -int(acc.reduce(torch.tensor([-fits], device=device), reduction="max").item())

    release = _release if device.type != "cpu" else lambda: None
    with torch.random.fork_rng(devices=devices):
        micro = choose_micro_batch(per_process, probe, agree, even, release)
    release()  # the probe's cached blocks go back: placing the data on the device budgets from the free memory
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    acc.print(
        f"accel_train: --max-device-batch auto: {micro} is the largest micro-batch dividing each process's "
        f"{per_process} samples that fits on every process"
    )
    return dataclasses.replace(plan, micro_batch=micro, accum_steps=per_process // micro)
