"""Issue 50, in process: the photo rule and recipe (``defaults.looks_like_photos``, ``Defaults.for_photos``), the
from-scratch default without batch statistics (``small_cnn_gn``), ``--bn-stats loaded``, and the line a model
with BatchNorm gets where the batch is split (``sync_bn.split_batch_warning``). The runs are in
../integration/test_photo_defaults_runs.py and test_defaults_parity_runs.py."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn as nn

from accel_train import defaults
from accel_train.features.finetune import keep_statistics
from accel_train.models import create_model
from accel_train.sync_bn import split_batch_warning


@pytest.mark.parametrize(
    "channels, sides, photos",
    [
        (3, {375: 100, 500: 80, 333: 65}, True),  # the tutorial's ants and bees
        (3, {96: 1}, True),
        (3, {95: 4}, False),  # below the rule's side
        (3, {64: 120}, False),  # the shapes folder
        (3, {32: 50000}, False),  # CIFAR
        (1, {28: 10000}, False),  # MNIST
        (1, {512: 10, 640: 3}, False),  # grey photos: ImageNet's weights see colour
        (3, {}, False),
        (3, {32: 72, 300: 1, 400: 1}, False),  # icons with two stray photos: the median image is an icon
        (3, {300: 16, 32: 1, 40: 1, 48: 1}, True),  # photos with three thumbnails: the median image is a photo
    ],
)
def test_which_images_are_photos(channels, sides, photos):
    why = defaults.looks_like_photos(channels, sides)
    assert bool(why) is photos
    if photos:
        assert why.startswith("colour images, ") and "pixels a side (median)" in why


def test_the_photo_recipe_keeps_what_the_user_set():
    picked = defaults.choose("imagefolder:x", {"lr"})
    photo = picked.for_photos({"lr"}, "they look like photos")
    assert photo.model == defaults.PHOTO_MODEL and photo.pretrained == "DEFAULT" and photo.lr is None
    assert (photo.optimizer, photo.bn_stats, photo.image_size) == ("sgd", "loaded", 224)
    assert photo.min_steps == defaults.PHOTO_MIN_STEPS and photo.epochs(8, 8) == 25
    assert "lr" not in photo.settings() and photo.settings()["pretrained"] == "DEFAULT"
    line = photo.describe(25, 8)
    assert "--model tv:resnet18 --pretrained" in line and "they look like photos" in line
    assert "--lr" not in line.split("--optimizer")[1].split(",")[0]  # the user's lr: not the recipe's
    given_length = defaults.choose("imagefolder:x", {"max_steps"}).for_photos({"max_steps"}, "photos")
    assert given_length.min_steps is None  # --max-steps given: the length is the user's
    assert not defaults.choose("imagefolder:x", {"model"})  # a picked model: nothing chosen, nothing for photos


def test_the_default_model_has_no_batch_statistics():
    """small_cnn_gn: GroupNorm, whose output for an image does not depend on the other images of its batch."""
    assert defaults.MODEL == "small_cnn_gn"
    torch.manual_seed(0)
    model = create_model(defaults.MODEL, num_classes=3, in_channels=3, image_size=48).train()
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    x = torch.randn(8, 3, 48, 48)
    whole, halves = model(x), torch.cat([model(x[:4]), model(x[4:])])
    assert torch.allclose(whole, halves, atol=1e-6)
    bn = create_model("small_cnn", num_classes=3, in_channels=3, image_size=48).train()
    assert not torch.allclose(bn(x), torch.cat([bn(x[:4]), bn(x[4:])]), atol=1e-3)  # the BatchNorm one does


def test_bn_stats_loaded_normalises_each_image_alone_and_stays_so_after_train():
    torch.manual_seed(0)
    model = create_model("tv:resnet18", num_classes=3, in_channels=3, image_size=32)
    kept = keep_statistics(model)
    assert len(kept) == 20
    model.train()  # the loop's call every epoch
    assert all(not m.training for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    x = torch.randn(4, 3, 32, 32)
    before = model.bn1.running_mean.clone()
    out = torch.cat([model(x[:2]), model(x[2:])])
    assert torch.allclose(model(x), out, atol=1e-5) and torch.equal(model.bn1.running_mean, before)
    assert model.bn1.weight.requires_grad  # its scale and shift still train


def _rt(processes: int):
    acc = types.SimpleNamespace(num_processes=processes, distributed_type="MULTI_CPU", device=torch.device("cpu"))
    return types.SimpleNamespace(accelerator=acc)


def test_a_batchnorm_model_on_several_processes_gets_one_line():
    bn = create_model("small_cnn", num_classes=3, in_channels=3, image_size=48)
    line = split_batch_warning(bn, _rt(2), 16)
    assert line and "\n" not in line and "each process's own 16 images" in line and "--sync-bn" in line
    assert split_batch_warning(bn, _rt(1), 32) is None  # one process normalises the whole batch
    assert split_batch_warning(create_model(defaults.MODEL, 3, 3, 48), _rt(2), 16) is None  # no BatchNorm
    keep_statistics(bn)
    assert split_batch_warning(bn, _rt(2), 16) is None  # --bn-stats loaded: no batch statistics


@pytest.mark.parametrize(
    "mode, described", [("RGB", "random_crop(16, padding=2)+hflip"), ("L", "random_crop(16, padding=2)")]
)
def test_augment_flips_colour_images_and_not_grey_ones(tmp_path, mode, described):
    """A mirrored digit or letter is another symbol: grey folders (MNIST's) get the crop alone."""
    from datafiles import write_image_folder

    from accel_train.config import parse_config
    from accel_train.data import build_dataset

    root = write_image_folder(tmp_path / mode, mode=mode, with_splits=True)
    splits = build_dataset(parse_config(["--dataset", f"imagefolder:{root}", "--augment"]).data_config())
    assert splits.extra["augment"] == described


def test_bitwise_takes_batchnorm_on_its_loaded_statistics_and_refuses_it_on_batch_statistics():
    from checks import raises_user_error

    from accel_train.bitwise import refuse_unless_bitwise

    acc = types.SimpleNamespace(mixed_precision="no", distributed_type=types.SimpleNamespace(value="MULTI_CPU"))
    model = create_model("tv:resnet18", num_classes=3, in_channels=3, image_size=32)
    raises_user_error(lambda: refuse_unless_bitwise(acc, model, False, 8, 8), "on batch statistics")
    keep_statistics(model)
    refuse_unless_bitwise(acc, model, False, 8, 8)  # each image normalised alone: accepted
    refuse_unless_bitwise(acc, create_model(defaults.MODEL, 3, 3, 32), False, 8, 8)


def test_randomness_not_keyed_on_the_sample_gets_one_line_on_several_processes():
    """nn.Dropout's masks are keyed on the sample (swapped at build time); Dropout2d and stochastic depth draw from
    each process's generator: a multi-process run says so, a 1-process run and a keyed model say nothing."""
    from accel_train.features import use_keyed_dropout
    from accel_train.sync_bn import unkeyed_randomness, warn_parity_breakers

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout2d(0.2), nn.Flatten(), nn.Dropout(0.5), nn.LazyLinear(2))
    model, _ = use_keyed_dropout(model, 0)
    assert unkeyed_randomness(model) == ["Dropout2d"]
    assert unkeyed_randomness(use_keyed_dropout(create_model("tv:efficientnet_b0", 3, 3, 32), 0)[0]) == [
        "StochasticDepth"
    ]
    assert unkeyed_randomness(nn.Sequential(nn.Dropout2d(0.0))) == []  # p = 0 draws nothing
    said: list[str] = []
    rt = _rt(2)
    rt.warn = said.append
    warn_parity_breakers(model, rt, 16, "mine", sync_bn=False)
    assert len(said) == 1 and said[0].startswith("mine: Dropout2d draw their randomness from each process's own")
    said.clear()
    rt1 = _rt(1)
    rt1.warn = said.append
    warn_parity_breakers(model, rt1, 32, "mine", sync_bn=False)
    assert said == []


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, (f"touch {os.environ['EVIL_MARK']}",))


@pytest.mark.parametrize("content", ["evil", "empty", "tensor"])
def test_a_cached_weights_file_is_read_as_tensors_only_and_a_bad_one_is_one_line(tmp_path, monkeypatch, content):
    """A default photo run reads torchvision's cache without any flag: a file there must never run code (torch.hub
    would unpickle it), and an empty or foreign one is one line naming it, not a traceback."""
    import torchvision.models as tvm
    from checks import raises_user_error

    from accel_train.models import pretrained

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EVIL_MARK", str(tmp_path / "ran"))
    weights = tvm.ResNet18_Weights.DEFAULT
    path = pretrained.cache_path(weights)
    path.parent.mkdir(parents=True)
    if content == "evil":
        torch.save({"conv1.weight": _Evil()}, path)
    elif content == "empty":
        path.write_bytes(b"")
    else:
        torch.save(torch.zeros(3), path)
    raises_user_error(lambda: pretrained._enum_state_dict(weights), str(path))
    assert not (tmp_path / "ran").exists()


def test_weights_of_a_larger_architecture_under_the_name_are_refused():
    """resnet34 holds every tensor of resnet18 with the same shape, and more: not resnet18's weights."""
    import torchvision.models as tvm
    from checks import raises_user_error

    from accel_train.models import pretrained

    model = create_model("tv:resnet18", num_classes=3, in_channels=3, image_size=32)
    info = pretrained.describe("tv:resnet18", "DEFAULT", 3, 32, 3)
    source = tvm.resnet34().state_dict()
    raises_user_error(lambda: pretrained.load_pretrained(model, "tv:resnet18", "x.pth", info, source),
                      "another architecture's")  # fmt: skip
    pretrained.load_pretrained(model, "tv:resnet18", "x.pth", info, tvm.resnet18().state_dict())  # its own: loads


def test_short_sides_count_every_image():
    from collections import Counter

    from accel_train.data.folder import short_sides

    assert short_sides(Counter({(300, 400): 16, (400, 300): 2, (32, 32): 1})) == {300: 18, 32: 1}


def test_the_photo_recipe_s_lr_follows_its_optimizer_and_the_batch():
    """The red-team's finding: --optimizer adam kept the SGD recipe's lr 0.008; --batch-size 4 kept lr 0.008."""
    picked = defaults.choose("imagefolder:x", {"optimizer"})
    assert picked.for_photos({"optimizer"}, "photos").lr is None  # the user's optimizer: its own lr
    picked = defaults.choose("imagefolder:x", {"batch_size"})
    assert picked.for_photos({"batch_size"}, "photos", batch=4).lr == pytest.approx(0.001)  # the tutorial's
    assert picked.for_photos(set(), "photos").lr == pytest.approx(0.008)


def test_bn_stats_loaded_says_when_it_changes_nothing():
    from accel_train.features.finetune import keep_statistics_said

    said, warning = keep_statistics_said(create_model("small_cnn", 3, 3, 32), "small_cnn", untrained=True)
    assert said.endswith("3 BatchNorm layers on their statistics") and "normalises nothing" in warning
    assert keep_statistics_said(create_model("small_cnn", 3, 3, 32), "small_cnn", untrained=False)[1] is None
    assert "no BatchNorm layer" in keep_statistics_said(create_model(defaults.MODEL, 3, 3, 32), "x", False)[1]


@pytest.mark.parametrize("value, offline", [("1", True), ("yes", True), ("0", False), ("false", False), ("", False)])
def test_the_offline_switch_reads_as_people_write_it(monkeypatch, tmp_path, value, offline):
    from accel_train import photo_defaults

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setenv("ACCEL_TRAIN_OFFLINE", value)
    seen = {}
    monkeypatch.setattr("accel_train.models.pretrained.fetch_default_weights",
                        lambda model, download=True: (seen.update(download=download), (None, "x"))[1])  # fmt: skip
    photo_defaults._weights_here()
    assert seen["download"] is (not offline)


def test_a_cached_file_with_another_hash_is_not_called_torchvision_s(tmp_path):
    from accel_train.models.pretrained import is_torchvisions

    path = tmp_path / "resnet18-f37072fd.pth"
    path.write_bytes(b"not the weights")
    assert not is_torchvisions(path)
    import hashlib

    good = tmp_path / f"x-{hashlib.sha256(b'abc').hexdigest()[:8]}.pth"
    good.write_bytes(b"abc")
    assert is_torchvisions(good)


@pytest.mark.parametrize("odd", ["meta", "complex", "int-key"])
def test_weights_that_are_not_named_real_tensors_are_one_line(odd):
    """The second red-team's finds: meta tensors and non-name keys gave tracebacks, complex ones trained."""
    import torchvision.models as tvm
    from checks import raises_user_error

    from accel_train.models import pretrained

    model = create_model("tv:resnet18", num_classes=3, in_channels=3, image_size=32)
    info = pretrained.describe("tv:resnet18", "DEFAULT", 3, 32, 3)
    source = tvm.resnet18().state_dict()
    if odd == "meta":
        source = {k: v.to("meta") for k, v in source.items()}
    elif odd == "complex":
        source["conv1.weight"] = source["conv1.weight"].to(torch.complex64)
    else:
        source[0] = torch.zeros(1)
    raises_user_error(lambda: pretrained.load_pretrained(model, "tv:resnet18", "x.pth", info, source),
                      "not named real tensors")  # fmt: skip
