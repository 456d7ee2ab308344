"""The airbench CIFAR-10 recipe (configs/airbench_cifar10.yaml): its network, optimizer groups, schedule,
test-time augmentation and one short run of the whole recipe on CIFAR-10's on-disk format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, SMALL_RUN, fit_here, metrics, run_here, summary
from datafiles import write_cifar10

RECIPE = REPO / "configs" / "airbench_cifar10.yaml"


# ---- the network ------------------------------------------------------------------------------------------------
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


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--nesterov", "--optimizer", "adam"], "--nesterov needs --optimizer sgd"),
        (["--nesterov", "--optimizer", "sgd", "--momentum", "0"], "--nesterov needs --optimizer sgd"),
        (["--warmup-from", "1"], "--warmup-from"),
        (["--crop-padding", "-1"], "--crop-padding must be >= 0"),
        (["--tta", "five-crop"], "--tta"),
    ],
)
def test_recipe_flags_are_checked(flags, message):
    proc = run_here("train.py", *flags)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


# ---- the recipe, end to end on CIFAR-10's file format ---------------------------------------------------------------
@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    """configs/airbench_cifar10.yaml, shortened: 12 steps of 32 on 4 x 48 + 64 CIFAR-format images."""
    root = tmp_path_factory.mktemp("airbench")
    write_cifar10(root / "data", n_per_batch=48, n_test=64)
    out = root / "run"
    fit_here(
        "--config", str(RECIPE), "--data-dir", str(root / "data"), "--output-dir", str(out),
        "--batch-size", "32", "--global-batch-size", "32", "--max-steps", "12", "--warmup-steps", "2",
        "--report-to", "none", "--no-plots", "--no-progress", "--log-every", "1",
    )  # fmt: skip
    return out, root / "data"


def test_the_recipe_trains_with_its_settings(recipe_run):
    out, _ = recipe_run
    s, config = summary(out), yaml.safe_load((out / "config.yaml").read_text())
    assert s["global_step"] == 12 and config["model"] == "airbench" and config["tta"] == "flip"
    train = [r for r in metrics(out) if r["event"] == "train"]
    from accel_train.schedule import lr_factor

    # the LR after each step: warm-up from 0.2 over 2 steps, then linearly down to 0 at step 12
    expected = [1.304348 * lr_factor(step, 12, "linear", 2, warmup_from=0.2) for step in range(1, 13)]
    assert [r["lr"] for r in train] == pytest.approx(expected) and expected[-1] == 0.0
    assert config["resolved"]["augment"] == "random_crop(32, padding=2, padding_mode=reflect)+hflip"
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())  # none per epoch


def test_training_time_is_recorded_with_every_evaluation(recipe_run):
    out, _ = recipe_run
    evals = [r for r in metrics(out) if r["event"] == "eval"]
    times = [r["train_time_s"] for r in evals]
    assert len(evals) >= 2 and 0 < times[0] < times[-1]
    assert all(t < r["time_s"] for t, r in zip(times, evals, strict=True))  # excludes start-up and evaluations
    assert summary(out)["train_time_s"] == pytest.approx(times[-1])


def test_whitening_layer_stays_what_the_training_images_gave(recipe_run):
    """Frozen for the whole run: the exported filters equal a fresh computation from the same images."""
    from safetensors.torch import load_file

    from accel_train.config import parse_config
    from accel_train.data import build_dataset
    from accel_train.data.folder import unaugmented_sample
    from accel_train.data.pipeline import BatchNormalizer
    from accel_train.models.airbench import AirbenchNet

    out, data = recipe_run
    exported = load_file(str(out / "model" / "model.safetensors"))
    cfg = parse_config(["--config", str(RECIPE), "--data-dir", str(data)])
    splits = build_dataset(cfg.data_config())
    fresh = AirbenchNet(10, 3, 32)
    fresh.init_from_data(BatchNormalizer(splits.info.mean, splits.info.std)(unaugmented_sample(splits.train, 5000)))
    assert torch.equal(exported["whiten.weight"], fresh.whiten.weight)
    assert all(torch.equal(v, torch.ones_like(v)) for k, v in exported.items() if ".norm" in k and k.endswith("weight"))


def test_evaluate_with_flip_tta_averages_the_mirrored_logits(recipe_run):
    out, data = recipe_run
    plain, flipped = (
        json.loads(Path(p).read_text()) for p in (_evaluate(out, data, "none"), _evaluate(out, data, "flip"))
    )
    assert (plain["tta"], flipped["tta"]) == ("none", "flip") and plain["samples"] == flipped["samples"] == 64
    last = [r for r in metrics(out) if r["event"] == "eval"][-1]  # training evaluated with flip TTA too
    assert flipped["accuracy"] == pytest.approx(last["eval_accuracy"])


def _evaluate(run: Path, data: Path, tta: str) -> Path:
    report = run / f"eval_{tta}.json"
    args = ("--weights", str(run / "model"), "--data-dir", str(data), "--tta", tta, "--out", str(report))
    proc = run_here("eval.py", *args)
    assert proc.returncode == 0, proc.stderr
    return report


def test_crop_settings_without_augmentation_are_a_warning(tmp_path):
    args = ("--output-dir", str(tmp_path / "run"), "--max-steps", "2", "--crop-padding", "3")
    proc = run_here("train.py", *SMALL_RUN, *args)
    assert proc.returncode == 0, proc.stderr
    assert "warning: --crop-padding/--crop-padding-mode change the random crop, but synthetic is not" in proc.stderr
