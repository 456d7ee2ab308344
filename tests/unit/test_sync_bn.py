"""``--sync-bn`` (issue 11, item 7): BatchNorm statistics over the global batch, on CPU/gloo too.

Unit tests of :mod:`accel_train.sync_bn` in one process. Two gloo ranks against one process with the whole
batch, and the issue's "Done when" (resnet18 trained as 1 x 16 and as 2 x 8 ends with the same weights and
BatchNorm buffers with ``--sync-bn``, and visibly different ones without), are in
../integration/test_sync_bn_runs.py.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from helpers_sync_bn import RESNET18_BN_LAYERS, assert_close, randomise_affine

from accel_train.models import create_model
from accel_train.sync_bn import (
    CpuSyncBatchNorm,
    apply_sync_bn,
    convert_sync_batchnorm,
    count_batchnorm,
    revert_sync_batchnorm,
    to_cpu_sync_batchnorm,
)

CASES = [
    (nn.BatchNorm1d, (7, 4), {}),
    (nn.BatchNorm1d, (5, 4, 3), {"momentum": None}),
    (nn.BatchNorm2d, (6, 4, 5, 5), {}),
    (nn.BatchNorm2d, (6, 4, 5, 5), {"momentum": None}),
    (nn.BatchNorm2d, (6, 4, 5, 5), {"affine": False}),
    (nn.BatchNorm2d, (6, 4, 5, 5), {"track_running_stats": False, "eps": 1e-3}),
    (nn.BatchNorm3d, (3, 4, 2, 3, 2), {"momentum": 0.3}),
]


@pytest.mark.parametrize(("cls", "shape", "kwargs"), CASES)
def test_world_size_one_equals_batchnorm(cls, shape, kwargs):
    """No process group: forward, backward, running stats and the step count are nn.BatchNorm's."""
    ref = cls(shape[1], **kwargs)
    randomise_affine(ref)
    mine = to_cpu_sync_batchnorm(copy.deepcopy(ref))
    assert isinstance(mine, CpuSyncBatchNorm)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(shape, generator=g) * 3 + 2
        w = torch.randn(shape, generator=g)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ref(xa), mine(xb)
        (ya * w).sum().backward()
        (yb * w).sum().backward()
        assert_close(yb, ya)
        assert_close(xb.grad, xa.grad)
    for pa, pb in zip(ref.parameters(), mine.parameters(), strict=True):
        assert_close(pb.grad, pa.grad)
    for (name, ba), (_, bb) in zip(ref.named_buffers(), mine.named_buffers(), strict=True):
        assert ba.dtype == bb.dtype, name
        assert_close(bb, ba)
    if ref.track_running_stats:
        assert int(mine.num_batches_tracked) == int(ref.num_batches_tracked) == 3
    ref.eval(), mine.eval()
    x = torch.randn(shape, generator=g)
    assert_close(mine(x), ref(x))


def test_bf16_autocast_matches_batchnorm():
    ref = nn.BatchNorm2d(4)
    mine = to_cpu_sync_batchnorm(copy.deepcopy(ref))
    x = torch.randn(8, 4, 5, 5).bfloat16()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ya, yb = ref(xa), mine(xb)
    assert yb.dtype == ya.dtype == torch.bfloat16
    assert (ya.float() - yb.float()).abs().max().item() <= 0.05
    w = torch.randn(x.shape)
    (ya.float() * w).sum().backward()
    (yb.float() * w).sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and mine.weight.grad.dtype == torch.float32
    assert (xa.grad.float() - xb.grad.float()).abs().max().item() <= 0.05
    assert_close(mine.running_mean, ref.running_mean, 1e-3)


def test_state_dict_keys_are_batchnorms_and_load_both_ways():
    torch.manual_seed(0)
    plain = create_model("resnet18", 10, 1, 8)
    converted = to_cpu_sync_batchnorm(copy.deepcopy(plain))
    assert list(converted.state_dict()) == list(plain.state_dict())
    assert any(k.endswith("num_batches_tracked") for k in converted.state_dict())
    converted(torch.randn(4, 1, 8, 8))  # changes the running stats
    fresh = create_model("resnet18", 10, 1, 8)
    fresh.load_state_dict(converted.state_dict(), strict=True)  # a checkpoint moves to a plain model
    for k, v in converted.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    back = to_cpu_sync_batchnorm(create_model("resnet18", 10, 1, 8))
    back.load_state_dict(fresh.state_dict(), strict=True)


def test_convert_revert_round_trip_and_count():
    torch.manual_seed(0)
    model = nn.Sequential(create_model("resnet18", 10, 1, 8), nn.BatchNorm1d(10, eps=1e-3, momentum=None))
    model[1].weight.requires_grad_(False)
    model.eval()
    n_plain = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert count_batchnorm(model) == n_plain + 1 == RESNET18_BN_LAYERS + 1
    keys = list(model.state_dict())
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    x = torch.randn(3, 1, 8, 8)
    y_plain = model(x)

    converted = convert_sync_batchnorm(model, "cpu")
    syncs = [m for m in converted.modules() if isinstance(m, CpuSyncBatchNorm)]
    assert len(syncs) == count_batchnorm(converted) == RESNET18_BN_LAYERS + 1
    assert not any(type(m) in (nn.BatchNorm1d, nn.BatchNorm2d) for m in converted.modules())
    last = converted[1]
    assert (last.eps, last.momentum, last.affine, last.track_running_stats) == (1e-3, None, True, True)
    assert not last.weight.requires_grad and last.bias.requires_grad
    assert not any(m.training for m in syncs)
    for name, p in converted.named_parameters():  # the same tensors: an optimizer built before still works
        assert p is params[name], name
    for name, b in converted.named_buffers():
        assert b is buffers[name], name
    assert torch.equal(converted(x), y_plain)

    reverted = revert_sync_batchnorm(converted)
    assert type(reverted[1]) is nn.BatchNorm1d
    assert sum(type(m) is nn.BatchNorm2d for m in reverted.modules()) == n_plain
    assert not any(isinstance(m, CpuSyncBatchNorm) for m in reverted.modules())
    assert list(converted.state_dict()) == list(reverted.state_dict()) == keys
    assert torch.equal(reverted(x), y_plain)


def test_conversion_edge_cases():
    lenet = create_model("lenet", 10, 1, 28)
    assert count_batchnorm(lenet) == 0
    assert convert_sync_batchnorm(lenet, "cpu") is lenet  # nothing to convert: unchanged
    root = nn.BatchNorm2d(3)
    assert isinstance(convert_sync_batchnorm(root, "cpu"), CpuSyncBatchNorm)  # a BatchNorm model itself
    cuda = convert_sync_batchnorm(create_model("resnet18", 10, 1, 8), "cuda")  # building needs no GPU
    assert sum(isinstance(m, nn.SyncBatchNorm) for m in cuda.modules()) == RESNET18_BN_LAYERS
    twice = to_cpu_sync_batchnorm(to_cpu_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(2))))
    assert isinstance(twice[0], CpuSyncBatchNorm)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        to_cpu_sync_batchnorm(nn.BatchNorm1d(3))(torch.randn(1, 3))


class _FakeRuntime:
    def __init__(self, num_processes: int, device: str = "cpu", distributed_type: str = "MULTI_CPU"):
        self.accelerator = SimpleNamespace(
            num_processes=num_processes, device=torch.device(device), distributed_type=distributed_type
        )
        self.printed: list[str] = []
        self.warned: list[str] = []

    def print(self, message: str) -> None:
        self.printed.append(message)

    def warn(self, message: str) -> None:
        self.warned.append(message)


def test_apply_sync_bn_says_what_it_did(monkeypatch):
    rt = _FakeRuntime(2)
    model = apply_sync_bn(create_model("resnet18", 10, 1, 8), rt)
    assert count_batchnorm(model) == sum(isinstance(m, CpuSyncBatchNorm) for m in model.modules())
    assert rt.printed == [
        f"sync-bn: converted {RESNET18_BN_LAYERS} BatchNorm layers (all-reduce (gloo) batch norm, 2 processes)"
    ]

    rt = _FakeRuntime(2)
    lenet = create_model("lenet", 10, 1, 28)
    assert apply_sync_bn(lenet, rt) is lenet
    assert rt.warned == ["--sync-bn: the model has no BatchNorm layers; nothing to synchronise"]

    rt = _FakeRuntime(1, distributed_type="NO")
    model = apply_sync_bn(create_model("resnet18", 10, 1, 8), rt)
    assert not any(isinstance(m, CpuSyncBatchNorm) for m in model.modules())
    assert "one process" in rt.printed[0] and not rt.warned

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # one process, two GPUs: nn.DataParallel
    rt = _FakeRuntime(1, device="cuda", distributed_type="NO")
    model = apply_sync_bn(create_model("resnet18", 10, 1, 8), rt)
    assert not any(isinstance(m, (CpuSyncBatchNorm, nn.SyncBatchNorm)) for m in model.modules())
    assert "no effect under nn.DataParallel" in rt.warned[0]
