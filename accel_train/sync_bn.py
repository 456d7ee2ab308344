"""``--sync-bn``: BatchNorm statistics over the GLOBAL batch, on CUDA and on CPU/gloo.

Under DDP every rank normalises its own micro-batch, so "1 process x batch 16" and "2 processes x
batch 8" train different models as soon as the model has BatchNorm: the batch statistics, the
gradients through them and the running statistics all differ. Synchronising the statistics makes
each rank normalise with the mean and variance of the whole global batch, which is what one process
computes, so the runs agree again (up to floating-point summation order).

torch's ``nn.SyncBatchNorm`` does this on CUDA only: it raises ``ValueError`` for CPU tensors. On
CPU/gloo :class:`CpuSyncBatchNorm` does the same with ``torch.distributed.all_reduce``: one
all-reduce of the per-channel count, sum and sum of squares in the forward, one of the per-channel
sums of ``grad_output`` and ``grad_output * x_hat`` in the backward. Its ``state_dict`` is a plain
BatchNorm's (same keys), so checkpoints and exports load into the unconverted model, on any setup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from accel_train.runtime import should_use_data_parallel

if TYPE_CHECKING:
    from accel_train.runtime import Runtime


def _world_size() -> int:
    """Processes in the default group; 1 when torch.distributed is missing or not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if _world_size() > 1:
        dist.all_reduce(t)
    return t


def _shape(v: torch.Tensor, ndim: int) -> torch.Tensor:
    """Per-channel ``(C,)`` -> ``(1, C, 1, ...)``, broadcastable against an ``ndim``-D input."""
    return v.reshape(1, -1, *([1] * (ndim - 2)))


def _global_mean_var(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-channel mean and biased variance of ``x`` over every rank's batch, and the global count.

    The local parts go through the all-reduce in float64 and the sum of squares is built from the
    local (centered, exact) variance, so ``E[x^2] - mean^2`` does not lose the digits that a float32
    sum of squares would.
    """
    dims = [0, *range(2, x.dim())]
    n = x.numel() // x.shape[1]
    if n:
        var, mean = torch.var_mean(x, dim=dims, correction=0)
    else:  # an empty local batch still joins the all-reduce
        var = mean = x.new_zeros(x.shape[1])
    mean64, var64 = mean.double(), var.double()
    stats = torch.cat([mean64.new_full((1,), float(n)), n * mean64, n * (var64 + mean64 * mean64)])
    stats = _all_reduce(stats)
    count = int(round(stats[0].item()))
    if count <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
    channels = x.shape[1]
    g_mean = stats[1 : 1 + channels] / count
    g_var = (stats[1 + channels :] / count - g_mean * g_mean).clamp_min(0.0)
    return g_mean, g_var, count


class _SyncBatchNormFunction(torch.autograd.Function):
    """Training-mode batch norm with statistics (and their gradients) over the default process group."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum: float, eps: float):
        x_in, x = x, x.float()
        mean64, var64, count = _global_mean_var(x)
        if running_mean is not None:  # exactly nn.BatchNorm's update: unbiased variance over the global count
            running_mean.mul_(1 - momentum).add_((momentum * mean64).to(running_mean.dtype))
            unbiased = var64 * count / (count - 1)
            running_var.mul_(1 - momentum).add_((momentum * unbiased).to(running_var.dtype))
        mean, invstd = mean64.float(), torch.rsqrt(var64 + eps).float()
        scale = invstd if weight is None else invstd * weight.float()
        shift = -mean * scale if bias is None else bias.float() - mean * scale
        y = x * _shape(scale, x.dim()) + _shape(shift, x.dim())
        ctx.save_for_backward(x_in, weight, mean, invstd)  # the input as given: a bf16 one stays bf16 until then
        ctx.count, ctx.has_bias = count, bias is not None
        return y.to(x_in.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x_in, weight, mean, invstd = ctx.saved_tensors
        x, g = x_in.float(), grad_out.float()
        nd, dims = x.dim(), [0, *range(2, x.dim())]
        x_hat = (x - _shape(mean, nd)) * _shape(invstd, nd)
        sum_g = g.sum(dims)
        sum_g_xhat = (g * x_hat).sum(dims)
        # this rank's share: DDP reduces the parameter gradients itself
        grad_weight = sum_g_xhat.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_g.to(weight.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            # d(sum of every rank's loss)/dx: the statistics saw every rank's inputs
            sums = _all_reduce(torch.cat([sum_g, sum_g_xhat]))
            channels = x.shape[1]
            mean_g, mean_g_xhat = sums[:channels] / ctx.count, sums[channels:] / ctx.count
            scale = invstd if weight is None else invstd * weight.float()
            grad_x = (g - _shape(mean_g, nd) - x_hat * _shape(mean_g_xhat, nd)) * _shape(scale, nd)
            grad_x = grad_x.to(x_in.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None


def _sync_batch_norm_body(x, weight, bias, running_mean, running_var, momentum: float, eps: float):
    with torch.autocast(x.device.type, enabled=False):
        return _SyncBatchNormFunction.apply(x, weight, bias, running_mean, running_var, momentum, eps)


_sync_batch_norm = None  # the body under torch.compiler.disable, made by the first CpuSyncBatchNorm


def _eager_sync_batch_norm():
    """Collectives inside a custom Function run eagerly: the compiler breaks the graph here. Made on first use, not
    at import: ``torch.compiler.disable`` imports torch._dynamo (over a second), which a run without
    --sync-bn never needs before its first step (issue 29)."""
    global _sync_batch_norm
    if _sync_batch_norm is None:
        _sync_batch_norm = torch.compiler.disable(_sync_batch_norm_body)
    return _sync_batch_norm


class CpuSyncBatchNorm(_BatchNorm):
    """BatchNorm for any input of shape ``(N, C, ...)`` whose training statistics span all ranks.

    The CPU/gloo counterpart of ``nn.SyncBatchNorm`` (which is CUDA-only). Training mode normalises
    with the mean and biased variance of the global batch and updates the running statistics with the
    unbiased variance over the global count, with ``nn.BatchNorm``'s momentum rules (``momentum=None``
    is a cumulative average) and ``num_batches_tracked``. Without an initialised process group, or
    with one process, nothing is communicated and the result is ``nn.BatchNorm``'s. Eval mode is
    ``nn.BatchNorm``'s. Parameters and buffers are ``_BatchNorm``'s, so ``state_dict`` keys match.
    """

    original_class: type[_BatchNorm] = nn.BatchNorm2d  # what :func:`revert_sync_batchnorm` turns it back into

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _eager_sync_batch_norm()  # before any compile traces forward: it then finds the disabled function

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:  # running statistics (or, untracked, this rank's batch): no communication
            return super().forward(input)
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        track = self.track_running_stats and self.running_mean is not None
        running_mean, running_var = (self.running_mean, self.running_var) if track else (None, None)
        fn = _sync_batch_norm or _eager_sync_batch_norm()  # set by __init__ (a module unpickled here skips it)
        return fn(input, self.weight, self.bias, running_mean, running_var, factor, self.eps)


def _copy_bn(source: _BatchNorm, target: _BatchNorm) -> _BatchNorm:
    """``target`` takes over ``source``'s parameters and buffers (the same tensors) and its mode."""
    if source.affine:
        target.weight, target.bias = source.weight, source.bias
    if source.track_running_stats:
        target.running_mean, target.running_var = source.running_mean, source.running_var
        target.num_batches_tracked = source.num_batches_tracked
    if hasattr(source, "qconfig"):
        target.qconfig = source.qconfig
    return target.train(source.training)


def _same_settings(bn: _BatchNorm) -> dict:
    return {
        "eps": bn.eps,
        "momentum": bn.momentum,
        "affine": bn.affine,
        "track_running_stats": bn.track_running_stats,
    }


def _replace(module: nn.Module, convert) -> nn.Module:
    out = convert(module)
    for name, child in module.named_children():
        out.add_module(name, _replace(child, convert))
    return out


def to_cpu_sync_batchnorm(model: nn.Module) -> nn.Module:
    """Every plain BatchNorm1d/2d/3d (a ``_BatchNorm`` not yet synchronised) -> :class:`CpuSyncBatchNorm`."""

    def convert(m: nn.Module) -> nn.Module:
        if not isinstance(m, _BatchNorm) or isinstance(m, (CpuSyncBatchNorm, nn.SyncBatchNorm)):
            return m
        new = CpuSyncBatchNorm(m.num_features, **_same_settings(m))
        new.original_class = type(m)
        return _copy_bn(m, new)

    return _replace(model, convert)


def revert_sync_batchnorm(model: nn.Module) -> nn.Module:
    """Every :class:`CpuSyncBatchNorm` back to the BatchNorm class it was converted from."""

    def convert(m: nn.Module) -> nn.Module:
        if not isinstance(m, CpuSyncBatchNorm):
            return m
        return _copy_bn(m, m.original_class(m.num_features, **_same_settings(m)))

    return _replace(model, convert)


def convert_sync_batchnorm(model: nn.Module, device_type: str) -> nn.Module:
    """Synchronised BatchNorm for ``device_type``: torch's ``nn.SyncBatchNorm`` on CUDA, else :class:`CpuSyncBatchNorm`.

    Returns the model (a new object only when the model itself is a BatchNorm layer); a model without
    BatchNorm comes back unchanged. :func:`count_batchnorm` tells how many layers there are.
    """
    if device_type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return to_cpu_sync_batchnorm(model)


def count_batchnorm(model: nn.Module) -> int:
    """BatchNorm layers of any kind (plain, ``nn.SyncBatchNorm``, :class:`CpuSyncBatchNorm`)."""
    return sum(isinstance(m, _BatchNorm) for m in model.modules())


def apply_sync_bn(model: nn.Module, rt: Runtime) -> nn.Module:
    """``--sync-bn`` for this run: convert when several DDP processes train, say what happened otherwise."""
    acc = rt.accelerator
    layers = count_batchnorm(model)
    if not layers:
        rt.warn("--sync-bn: the model has no BatchNorm layers; nothing to synchronise")
        return model
    if should_use_data_parallel(acc.distributed_type, acc.device.type, torch.cuda.device_count()):
        rt.warn(
            "--sync-bn has no effect under nn.DataParallel (one process, several GPUs): each GPU normalises its "
            "own slice of the batch. Launch one process per GPU (accelerate_configs/multi_gpu.yaml) to synchronise."
        )
        return model
    if acc.num_processes < 2:
        rt.print("sync-bn: one process normalises the whole batch already; BatchNorm left as it is")
        return model
    model = convert_sync_batchnorm(model, acc.device.type)
    kind = "torch SyncBatchNorm" if acc.device.type == "cuda" else "all-reduce (gloo) batch norm"
    rt.print(f"sync-bn: converted {layers} BatchNorm layers ({kind}, {acc.num_processes} processes)")
    return model


def split_batch_warning(model: nn.Module, rt: Runtime, micro_batch: int) -> str | None:
    """The line a run with BatchNorm on batch statistics and no ``--sync-bn`` prints where the batch is split
    (several processes, or ``nn.DataParallel``): it does not train the 1-process run's weights. None elsewhere."""
    acc = rt.accelerator
    live = sum(isinstance(m, _BatchNorm) and m.training for m in model.modules())
    data_parallel = should_use_data_parallel(acc.distributed_type, acc.device.type, torch.cuda.device_count())
    if not live or (acc.num_processes < 2 and not data_parallel):
        return None
    if data_parallel:
        return (
            f"{live} BatchNorm layers normalise each GPU's slice of the batch under nn.DataParallel: the weights "
            "differ from one device's run; launch one process per GPU with --sync-bn (docs/parity.md)"
        )
    return (
        f"{live} BatchNorm layers normalise each process's own {micro_batch} images: the weights differ from a "
        "1-process run's at the same global batch; --sync-bn keeps them the same, or --bn-stats loaded with "
        "--pretrained weights (docs/parity.md)"
    )


def unkeyed_randomness(model: nn.Module) -> list[str]:
    """Random layers whose draws are not keyed on the sample (every ``nn.Dropout`` was swapped for a keyed one,
    ``features/dropout.py``): Dropout1d/2d/3d, alpha dropout, torchvision's stochastic depth. Each process draws
    them from its own generator."""
    random = (
        m
        for m in model.modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth"
    )
    return sorted({type(m).__name__ for m in random if getattr(m, "p", 0)})


def warn_parity_breakers(model: nn.Module, rt: Runtime, micro_batch: int, name: str, sync_bn: bool) -> None:
    """One ``warning:`` line for each part of ``model`` that makes a split batch train other weights than one
    process would (the README's promise; docs/parity.md), where the batch is split."""
    split = None if sync_bn else split_batch_warning(model, rt, micro_batch)
    if split:
        rt.warn(f"{name}: {split}")
    acc = rt.accelerator
    random = unkeyed_randomness(model) if acc.num_processes > 1 else []
    if random:
        rt.warn(
            f"{name}: {', '.join(random)} draw their randomness from each process's own generator (only "
            "nn.Dropout's masks are keyed on the sample): the weights differ from a 1-process run's (docs/parity.md)"
        )
