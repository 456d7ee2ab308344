"""The optimizer and its LR schedule (a pure function of the optimizer step, see ``schedule.py``)."""

from __future__ import annotations

import torch
import torch.nn as nn

from accel_train.config import TrainConfig
from accel_train.schedule import ScheduleFn


def build_optimizer(cfg: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    # fused kernels (CPU and CUDA): one pass over each tensor instead of a chain of foreach ops;
    # measured 1.3-1.6x faster steps for mnist_cnn on this CPU (Adam was half of its step time)
    adam = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
    return adam(params, lr=lr, weight_decay=cfg.weight_decay, fused=True)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    """``LambdaLR`` over the raw optimizer, stepped once per real optimizer step by the trainer.

    Never passed to ``accelerator.prepare`` (its prepared scheduler steps once per process per
    call) nor registered for checkpointing (its state travels as JSON in ``progress.json``).
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, ScheduleFn(total_steps, cfg.lr_schedule, cfg.warmup_steps))
