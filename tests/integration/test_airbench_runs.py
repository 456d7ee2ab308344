"""The airbench CIFAR-10 recipe (configs/airbench_cifar10.yaml): its network, optimizer groups, schedule,
test-time augmentation and one short run of the whole recipe on CIFAR-10's on-disk format.

Whole runs and launches; the in-process tests are in ../unit/test_airbench.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, SMALL_RUN, fit_here, metrics, run_here, summary
from datafiles import write_cifar10

RECIPE = REPO / "configs" / "airbench_cifar10.yaml"


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
