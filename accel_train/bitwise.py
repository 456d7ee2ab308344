"""--bitwise: the same weights, bit for bit, on 1 process or N (issue 43).

Each micro-batch's gradient is computed alone (same micro-batch size and one thread in every setup, no
all-reduce: DDP's ``no_sync``) and kept as one fp32 vector. At the optimizer step every rank gathers all of them
and adds them in the order of the global batch's micro-batches, left to right from zeros, then divides once by
their number: the gradient no longer depends on how the micro-batches were dealt to processes, so clipping, the
optimizer, the EMA and the weights are the same bits everywhere. The trainer hands each micro-batch to
:meth:`BitwiseStep.step` instead of its own accumulate/all-reduce path.

The micro-batches of a global batch are dealt round-robin (accelerate's ``BatchSamplerShard`` without
``split_batches``): rank ``r``'s ``j``-th micro-batch of an optimizer step is the global batch's micro-batch
``j * world + r``.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn

from accel_train.errors import UserError


def refuse_unless_bitwise(acc, model: nn.Module, data_parallel: bool, micro_batch: int, wanted: int) -> None:
    """One line for what --bitwise cannot make bitwise in this setup (the config's own refusals: config.py)."""
    if str(acc.mixed_precision) != "no":
        raise UserError(
            f"--bitwise trains in fp32: mixed precision {acc.mixed_precision} rounds differently per setup; "
            "use --mixed-precision no"
        )
    if data_parallel or acc.distributed_type.value not in ("NO", "MULTI_CPU", "MULTI_GPU"):
        raise UserError(f"--bitwise needs one model per process (DDP or one process), not {acc.distributed_type.value}")
    norms = [
        type(m).__name__
        for m in model.modules()
        if (isinstance(m, nn.modules.batchnorm._NormBase) or "BatchNorm" in type(m).__name__)
        and m.training  # --bn-stats loaded: in eval mode, each image alone
    ]
    if norms:
        raise UserError(
            f"--bitwise cannot train a BatchNorm model ({norms[0]}) on batch statistics: a micro-batch's (and "
            "--sync-bn's, summed over the processes) differ from one setup to another; use a model without "
            "BatchNorm, or --bn-stats loaded with --pretrained weights"
        )
    if micro_batch != wanted:
        raise UserError(
            f"--bitwise needs the micro-batch --max-device-batch {wanted} on every setup, but this one splits "
            f"the global batch into micro-batches of {micro_batch}; use a --global-batch-size that is a multiple "
            f"of {wanted} x the processes"
        )


def _no_sync(model: nn.Module):
    return model.no_sync() if hasattr(model, "no_sync") else nullcontext()


class BitwiseStep:
    """Keeps each micro-batch's gradient; sums all of them in the global order at the optimizer step."""

    def __init__(self, acc, model: nn.Module, accum_steps: int):
        self.acc, self.model, self.accum = acc, model, accum_steps
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grads: list[torch.Tensor] = []

    def _keep_grad(self) -> None:
        """This micro-batch's gradient as one fp32 vector (zeros for a parameter it did not reach)."""
        parts = [
            p.grad.detach().reshape(-1).float() if p.grad is not None else p.new_zeros(p.numel(), dtype=torch.float32)
            for p in self.params
        ]
        self.grads.append(torch.cat(parts))
        for p in self.params:
            p.grad = None

    def reduce(self) -> None:
        """The mean gradient of the global batch, summed in its micro-batches' order, into every ``p.grad``."""
        local = torch.stack(self.grads)  # [accum, P]
        self.grads = []
        world = self.acc.num_processes
        if world > 1:
            ranks = [torch.empty_like(local) for _ in range(world)]
            dist.all_gather(ranks, local.contiguous())
        else:
            ranks = [local]
        total = torch.zeros_like(local[0])
        for j in range(self.accum):  # micro-batch j * world + r of the global batch
            for r in range(world):
                total.add_(ranks[r][j])
        total.div_(self.accum * world)
        offset = 0
        for p in self.params:
            n = p.numel()
            grad = torch.empty_like(p)  # the parameter's layout (channels_last): fused optimizers pair by memory
            grad.copy_(total[offset : offset + n].view(p.shape))
            p.grad = grad
            offset += n

    def step(self, trainer, inputs, labels: torch.Tensor, indices: torch.Tensor) -> bool:
        """``Trainer.step`` for --bitwise: one micro-batch; True when it completed an optimizer step."""
        state, model = trainer.state, self.model
        t_data = time.perf_counter()
        with _no_sync(model):  # no all-reduce: the gradients are summed in reduce()
            outputs, loss = trainer.task.forward(trainer.features, model, inputs, labels, indices, state.epoch)
            loss.backward()
        self._keep_grad()
        trainer.window.add(loss, *trainer.task.counted(outputs, labels), finite_only=False)
        if len(self.grads) < self.accum:
            trainer._account(t_data, optimizer_step=False)
            return False
        self.reduce()
        if trainer.clip is not None:
            trainer.clip()
        trainer.optimizer.step()
        trainer.optimizer.optimizer.zero_grad(set_to_none=True)
        trainer._after_optimizer_step(t_data)  # schedule, EMA, counters, logging, as the normal step
        return True
