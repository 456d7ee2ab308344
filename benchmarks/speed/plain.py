"""The plain loop, the floor the portable loop is measured against: a hand-written PyTorch loop over the same
synthetic uint8 tensors in memory (Adam, cross-entropy, the loop's default clipping) that waits for the device
only at log points, and its measurement with a breakdown per phase. It runs in the plain-loop server's
processes (``benchmarks.speed.plain_server``)."""

from __future__ import annotations

import os
import statistics
import time
from contextlib import nullcontext
from typing import Any

from benchmarks.speed.devices import precision_flags, set_tf32
from benchmarks.speed.setups import WARMUP_STEPS, WINDOW_STEPS, synthetic_size

SYNTHETIC_SEED = 42  # TrainConfig.seed's default: the portable's synthetic data are generated from it
SYNTHETIC_MEAN, SYNTHETIC_STD = 0.5, 0.25  # accel_train.data.synthetic's normalisation
DEFAULT_LR = 2e-3  # TrainConfig.lr
DEFAULT_CLIP = 1.0  # TrainConfig.max_grad_norm


class PlainTrainer:
    """The hand-written loop: synthetic uint8 tensors in memory, normalised per batch, Adam, cross-entropy.

    ``batch`` is the global batch; under DDP each rank takes its contiguous share of
    every global batch (as Accelerate shards batches). ``train_step`` never waits for the
    device; ``log_point`` (every ``log_every`` steps, as the portable loop logs) is the one
    host sync. ``step`` times each phase with a device sync after it (the breakdown probes).
    """

    def __init__(
        self,
        model: str,
        batch: int,
        total_steps: int,
        *,
        bf16: bool = False,
        channels_last: bool = False,
        fused: bool | None = None,
        clip: float = DEFAULT_CLIP,
        device: str = "cpu",
        seed: int = SYNTHETIC_SEED,
        channels: int = 1,
        image_size: int = 28,
    ):
        import torch
        import torch.distributed as dist

        from accel_train.data.synthetic import make_synthetic
        from accel_train.models import create_model

        self.torch = torch
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.device = torch.device(device)
        self.batch, self.micro = batch, batch // self.world
        self.bf16, self.clip = bf16, clip
        n = synthetic_size(batch, total_steps)
        self.images, self.labels = make_synthetic(n, 10, channels, image_size, seed=seed)  # the portable's data
        self.order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        torch.manual_seed(seed)
        net = create_model(model, 10, channels, image_size).to(self.device)
        if channels_last:
            net = net.to(memory_format=torch.channels_last)
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(net)
        self.model = net
        kwargs = {} if fused is None else {"fused": fused}
        self.optimizer = torch.optim.Adam(net.parameters(), lr=DEFAULT_LR, **kwargs)
        self.scale = 1.0 / (255.0 * SYNTHETIC_STD)
        self.shift = -SYNTHETIC_MEAN / SYNTHETIC_STD
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self._loss_sum = None  # the open log window's loss, on the device
        self.host_syncs = 0  # log points: .item() reads of the running loss

    def batch_at(self, step: int):
        start = step * self.batch + self.rank * self.micro
        idx = self.order[start : start + self.micro]
        images, labels = self.images.index_select(0, idx), self.labels.index_select(0, idx)
        if self.device.type == "cuda":  # as accel_train's loader (pin_memory on CUDA): the copy stays asynchronous
            images, labels = images.pin_memory(), labels.pin_memory()
        return images, labels

    def forward_backward(self, images, labels, sync: bool = True):
        import torch.nn.functional as F

        torch = self.torch
        images, labels = images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
        no_sync = self.world > 1 and not sync
        with self.model.no_sync() if no_sync else nullcontext():
            x = images.to(torch.float32).mul_(self.scale).add_(self.shift).contiguous(memory_format=self.memory_format)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model(x)
            loss = F.cross_entropy(logits.float(), labels)
            loss.backward()
        return loss

    def optimizer_step(self) -> None:
        if self.clip > 0:
            self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def train_step(self, step: int) -> tuple[float, float, float]:
        """One step without waiting for the device: host seconds (data, forward+backward, optimizer).

        On CPU the host seconds are the phase times; on CUDA they are launch times (see ``step``).
        """
        t0 = time.perf_counter()
        images, labels = self.batch_at(step)
        t1 = time.perf_counter()
        loss = self.forward_backward(images, labels).detach()
        t2 = time.perf_counter()
        self.optimizer_step()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    def log_point(self) -> float | None:
        """What a hand-written loop does every ``log_every`` steps: read its running loss (waits for the device)."""
        if self._loss_sum is None:
            return None
        self.host_syncs += 1
        value = self._loss_sum.item()
        self._loss_sum = None
        return value

    def step(self, step: int, sync: bool = True) -> tuple[float, float, float]:
        """One step timed per phase, with a device sync after each: (data, forward+backward, optimizer) seconds."""
        t0 = time.perf_counter()
        images, labels = self.batch_at(step)
        t1 = time.perf_counter()
        self.forward_backward(images, labels, sync)
        self._sync()
        t2 = time.perf_counter()
        self.optimizer_step()
        self._sync()
        return t1 - t0, t2 - t1, time.perf_counter() - t2


def plain_throughput(
    trainer: PlainTrainer, steps: int, log_every: int = WINDOW_STEPS, warmup: int = WARMUP_STEPS
) -> dict[str, Any]:
    """``warmup`` steps, then ``steps`` measured steps that sync the host only at log points.

    Log points fall where the portable loop logs (global step % ``log_every`` == 0, warm-up
    steps counted); the clock starts after the warm-up's work has drained and stops after
    the last step's. ``window_samples_per_s``: the full windows between two log points (the
    portable reports the same windows). ``phase_s``: host seconds per phase, summed.
    """
    for i in range(warmup):
        trainer.train_step(i)
    trainer.log_point()
    data = fb = opt = 0.0
    windows: list[float] = []
    t_start = time.perf_counter()
    last_log: tuple[int, float] | None = None  # (global step, time) of the last log point in the measurement
    for i in range(warmup, warmup + steps):
        d, f, o = trainer.train_step(i)
        data, fb, opt = data + d, fb + f, opt + o
        global_step = i + 1
        if log_every and global_step % log_every == 0:
            trainer.log_point()
            now = time.perf_counter()
            if last_log is not None:
                windows.append(trainer.batch * (global_step - last_log[0]) / (now - last_log[1]))
            last_log = (global_step, now)
    trainer.log_point()  # the tail after the last log point (nothing when the last step was one)
    seconds = time.perf_counter() - t_start
    return {
        "seconds": seconds,
        "samples_per_s": trainer.batch * steps / seconds,
        "window_samples_per_s": windows,
        "phase_s": {"data_wait": data, "forward_backward": fb, "optimizer": opt},
        "log_every": log_every,
    }


def _scalar_allreduce_ms(trainer: PlainTrainer) -> float:
    """What one extra scalar collective per step costs (e.g. a stop-flag all-reduce), in ms."""
    import torch.distributed as dist

    flag = trainer.torch.zeros(1)
    dist.all_reduce(flag)
    t0 = time.perf_counter()
    for _ in range(20):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return (time.perf_counter() - t0) / 20 * 1000


def _plain_measure(run: dict[str, Any]) -> dict[str, Any]:
    import gc

    import torch

    steps, probe = run["steps"], run.get("sync_probe_steps", 0)
    device = run.get("device", "cpu")
    cuda = device == "cuda"
    phase_steps = min(steps, WINDOW_STEPS) if cuda else 0  # CUDA: the breakdown needs synced steps of its own
    total = WARMUP_STEPS + steps + 2 * probe + phase_steps
    if cuda:
        if run.get("tf32") is not None:
            set_tf32(run["tf32"])
        gc.collect()  # this server measured other models before: their peak must not count
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = PlainTrainer(
        run["model"],
        run["batch"],
        total,
        bf16=run.get("bf16", False),
        channels_last=run.get("channels_last", False),
        device=device,
        channels=run.get("channels", 1),
        image_size=run.get("image_size", 28),
    )
    timing = plain_throughput(trainer, steps, log_every=run.get("log_every", WINDOW_STEPS))
    next_step = WARMUP_STEPS + steps
    phase = timing["phase_s"]
    data, fb, opt = phase["data_wait"], phase["forward_backward"], phase["optimizer"]
    sync_s = 0.0
    if trainer.world > 1 and probe:
        # gradient synchronisation: backward with DDP's all-reduce vs backward under no_sync, alternated
        synced, local = [], []
        for j in range(2 * probe):
            _, f, _ = trainer.step(next_step + j, sync=j % 2 == 0)
            (synced if j % 2 == 0 else local).append(f)
        next_step += 2 * probe
        sync_s = max(0.0, statistics.median(synced) - statistics.median(local))
        sync_s = min(sync_s, fb / steps)  # a noisy probe must not claim more than the whole backward
    breakdown_source = "host time of the measured steps (CPU: the host waits for every op)"
    if phase_steps:
        probes = [trainer.step(next_step + j) for j in range(phase_steps)]
        data, fb, opt = (sum(p[k] for p in probes) * steps / phase_steps for k in range(3))
        breakdown_source = f"{phase_steps} extra steps with a device sync after each phase"
    scalar_allreduce_ms = _scalar_allreduce_ms(trainer) if trainer.world > 1 else None
    total_s = timing["seconds"]
    per_step = {
        k: 1000.0 * v / steps
        for k, v in (
            ("data_wait", data),
            ("forward_backward", fb - sync_s * steps),
            ("sync", sync_s * steps),
            ("optimizer", opt),
            ("total", total_s),
        )
    }
    return {
        "model": run["model"],
        "samples_per_s": timing["samples_per_s"],
        "window_samples_per_s": timing["window_samples_per_s"],
        "data_wait_fraction": min(1.0, phase["data_wait"] / total_s),
        "step_breakdown_ms": per_step,
        "breakdown_source": breakdown_source,
        "scalar_allreduce_ms": scalar_allreduce_ms,
        "threads": trainer.torch.get_num_threads(),
        "world_size": trainer.world,
        "log_every": timing["log_every"],
        "host_syncs": trainer.host_syncs,  # log points, not steps
        "precision_flags": precision_flags(),
        "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES") if cuda else None,
    }
