"""The airbench CIFAR-10 recipe (configs/airbench_cifar10.yaml): its network, optimizer groups, schedule,
test-time augmentation and one short run of the whole recipe on CIFAR-10's on-disk format.

The in-process tests; whole runs and launches are in ../integration/test_airbench_runs.py.
"""

from __future__ import annotations

import pytest
import torch


def test_whitening_layer_decorrelates_the_patches_it_was_computed_from():
    from accel_train.models import create_model

    model = create_model("airbench", 10, 3, 32)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(200, 3, 32, 32, generator=gen) * torch.tensor([1.0, 2.0, 0.5]).view(1, 3, 1, 1)
    images[:, 1] += 0.8 * images[:, 0]  # correlated channels, as in real photographs
    model.init_from_data(images)
    out = torch.nn.functional.conv2d(images, model.whiten.weight)  # without the bias
    first = out[:, :12].permute(0, 2, 3, 1).reshape(-1, 12)
    covariance = first.T @ first / len(first)
    # whitened: the identity up to the epsilon added to each eigenvalue (lambda / (lambda + 5e-4) >= 0.997 here)
    assert torch.allclose(covariance, torch.eye(12), atol=5e-3)
    assert torch.equal(model.whiten.weight[12:], -model.whiten.weight[:12])  # the second half: negated filters
    assert model.whiten.weight.requires_grad is False and model.whiten.bias.requires_grad is True
    assert model(images[:4]).shape == (4, 10)


def test_convolutions_start_as_identity_and_batchnorm_learns_only_its_bias():
    from accel_train.models.airbench import AirbenchNet

    model = AirbenchNet(10, 3, 32)
    conv = model.groups[0].conv1  # 24 -> 64: the first 24 filters pass their input channel through
    x = torch.randn(2, 24, 8, 8)
    assert torch.allclose(torch.nn.functional.conv2d(x, conv.weight[:24], padding=1), x, atol=1e-6)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 6 and all(not n.weight.requires_grad and n.bias.requires_grad for n in norms)
    assert sorted(model.lr_scales()) == sorted(f"groups.{g}.norm{i}.bias" for g in range(3) for i in (1, 2)) and set(
        model.lr_scales().values()
    ) == {64.0}


def test_lr_scales_make_groups_whose_decay_per_step_is_unchanged():
    from accel_train.models.airbench import AirbenchNet
    from accel_train.optim import param_groups

    model = AirbenchNet(10, 3, 32)
    base, scaled = param_groups(model, lr=1.3, weight_decay=0.00153)
    assert (base["lr"], scaled["lr"]) == pytest.approx((1.3, 1.3 * 64))
    assert base["lr"] * base["weight_decay"] == pytest.approx(scaled["lr"] * scaled["weight_decay"])
    norm_biases = {id(p) for n, p in model.named_parameters() if ".norm" in n and n.endswith("bias")}
    assert {id(p) for p in scaled["params"]} == norm_biases
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(base["params"]) + len(scaled["params"]) == len(trainable)
    [only] = param_groups(torch.nn.Linear(2, 2), lr=0.1, weight_decay=0.01)  # models without lr_scales: one group
    assert (only["lr"], only["weight_decay"], len(only["params"])) == (0.1, 0.01, 2)


def test_warmup_from_rises_from_the_given_factor():
    from accel_train.schedule import lr_factor

    f = [lr_factor(s, 648, "linear", 129, warmup_from=0.2) for s in (0, 64, 128, 129, 388, 648)]
    assert f == pytest.approx([0.2 + 0.8 / 129, 0.2 + 0.8 * 65 / 129, 1.0, 1.0, 1 - 259 / 519, 0.0], abs=1e-9)
    assert lr_factor(0, 100, "constant", 4) == pytest.approx(0.25)  # warmup_from 0: as before
