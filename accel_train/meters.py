"""What the loop measures between two log steps, without a host sync per step; its peak CUDA memory."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class StepTimer:
    """Host-side time split: waiting for data vs everything else (no device syncs)."""

    data_wait: float = 0.0
    total: float = 0.0  # after the first WARMUP_STEPS_EXCLUDED steps: the steady state's throughput
    samples: int = 0
    train_s: float = 0.0  # every step since the run began (kept in checkpoints): eval events' train_time_s

    def fraction(self) -> float:
        return self.data_wait / self.total if self.total > 0 else 0.0


class Window:
    """Train loss/accuracy summed on the device between two log steps: no host sync per step.

    The reduced sums travel inside checkpoints, so the logged values after a
    resume equal those of an uninterrupted run.
    """

    def __init__(self, device: torch.device):
        self.sums = torch.zeros(3, device=device, dtype=torch.float64)  # loss*n, correct, n
        self._loss, self._correct, self._n = self.sums.unbind()  # views: added to in place, no stack per step

    def add(self, loss: torch.Tensor, correct: torch.Tensor, n: int | torch.Tensor, finite_only: bool) -> None:
        """One micro-batch: its mean ``loss``, its ``correct`` predictions (a device tensor) of ``n`` samples (or
        labelled tokens: a device tensor, counted without a host sync)."""
        if not finite_only:  # three in-place adds: the fewest kernels a step pays for its logged loss and accuracy
            if isinstance(n, torch.Tensor):
                self._loss.add_(loss.detach().double() * n)
            else:
                self._loss.add_(loss.detach(), alpha=n)
            self._correct.add_(correct)
            self._n.add_(n)
            return
        loss = loss.detach().double()
        ok = torch.isfinite(loss).double()  # a skipped non-finite step must not poison the logged average
        loss = torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0)
        self.sums += torch.stack([loss * n * ok, correct.double() * ok, n * ok])

    def reduce(self, acc) -> list[float]:
        """Global sums over all ranks (collective)."""
        return acc.reduce(self.sums.clone(), reduction="sum").tolist()

    def record(self, acc, step: int) -> dict[str, float] | None:
        """The window as a train record at ``step`` (``loss`` left out when not finite), None when it holds no
        sample (the last step was logged); collective, like :meth:`reduce`."""
        loss, correct, seen = self.reduce(acc)
        if seen <= 0:
            return None
        return {"step": step, "accuracy": correct / seen, **({"loss": loss / seen} if math.isfinite(loss) else {})}

    def restore(self, sums: list[float] | None, is_main: bool) -> None:
        self.sums.zero_()
        if sums and is_main:  # the global sums live on one rank; the reduce adds the others' zeros
            self.sums += torch.tensor(sums, dtype=torch.float64, device=self.sums.device)


def peak_memory_mb(device: torch.device, reserved: bool = False) -> float | None:
    """Peak CUDA memory allocated (``reserved``: held by the caching allocator) since training began; None on CPU."""
    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_reserved(device) if reserved else torch.cuda.max_memory_allocated(device)
    return round(peak / 2**20, 1)


def reset_peak_memory(device: torch.device) -> None:
    """Set-up's peaks (the --max-device-batch probe, data placement, cuDNN's first workspaces) are not training's:
    the peaks start again from what is held now (the model, its optimizer and a dataset kept on the GPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
