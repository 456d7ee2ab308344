"""Fine-tuning: --pretrained from torchvision's cache or a file, --freeze, --head-lr (issue 28).

No network here: each test writes a torchvision-format weights file where torchvision looks for it
(``$TORCH_HOME/hub/checkpoints/<file of the URL>``), as an offline machine would have it, or passes a file.
The weights are random (not ImageNet's): what is checked is that they arrive, bit for bit, and stay.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from accel_train.config import parse_config
from accel_train.errors import UserError

FAST = ["--report-to", "none", "--no-plots", "--no-progress"]
SYNTH_RGB = [
    "--dataset",
    "synthetic",
    "--synthetic-channels",
    "3",
    "--synthetic-image-size",
    "32",
    "--synthetic-size",
    "64",
    "--synthetic-test-size",
    "16",
    "--batch-size",
    "16",
]
HEAD = ("fc.weight", "fc.bias")


def _resnet18_file(seed: int = 0) -> dict[str, torch.Tensor]:
    """A resnet18 state dict as torchvision ships it (1000 classes), with non-trivial BatchNorm statistics."""
    import torchvision.models as tvm

    torch.manual_seed(seed)
    model = tvm.resnet18(num_classes=1000)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.num_batches_tracked.fill_(7)
    return model.state_dict()


@pytest.fixture
def cached_resnet18(tmp_path, monkeypatch) -> dict[str, torch.Tensor]:
    """resnet18's default weights file placed in torchvision's cache under a private TORCH_HOME."""
    import torchvision.models as tvm

    from accel_train.models.pretrained import cache_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # a real refusal if anything tried to download
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    sd = _resnet18_file()
    path = cache_path(tvm.ResNet18_Weights.DEFAULT)
    assert str(path).startswith(str(tmp_path))
    path.parent.mkdir(parents=True)
    torch.save(sd, path)
    return sd


def _fit(out: Path, *args: str) -> dict:
    from accel_train.loop import fit

    return fit(parse_config([*args, *FAST, "--output-dir", str(out)]))


def _export(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model" / "model.safetensors"))


def _assert_backbone_as_loaded(exported: dict, source: dict) -> None:
    backbone = [k for k in exported if k not in HEAD]
    assert len(backbone) == 120  # resnet18: every parameter and BatchNorm buffer but the head
    changed = [k for k in backbone if not torch.equal(exported[k], source[k])]
    assert not changed, f"frozen tensors changed: {changed[:5]}"
    assert exported["fc.weight"].shape == (10, 512)


def test_pretrained_from_the_cache_trains_the_head_and_keeps_the_backbone_bit_identical(tmp_path, cached_resnet18):
    out = tmp_path / "run"
    _fit(out, "--model", "tv:resnet18", "--pretrained", "--freeze", "backbone", "--max-steps", "3", *SYNTH_RGB)
    exported = _export(out)
    _assert_backbone_as_loaded(exported, cached_resnet18)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["mean"] == pytest.approx([0.485, 0.456, 0.406]) and config["std"] == pytest.approx(
        [0.229, 0.224, 0.225]
    )
    # random weights under torchvision's file name are recorded as the file they are, with its hash (issue 45)
    cached = Path(os.environ["TORCH_HOME"]) / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    assert config["pretrained"].startswith(f"{cached} (a file under the name of ResNet18_Weights.IMAGENET1K_V1")
    assert "not torchvision's" in config["pretrained"] and config["pretrained_file"] == str(cached)
    assert config["pretrained_sha256"] == hashlib.sha256(cached.read_bytes()).hexdigest()
    # the head was trained: it is not the fresh head the same seed builds without training
    from accel_train.models import create_model

    torch.manual_seed(0)
    assert not torch.equal(exported["fc.weight"], create_model("tv:resnet18", 10, 3, 32).state_dict()["fc.weight"])


def test_pretrained_from_a_file_is_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_home"))  # nothing cached: the file alone is read
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    sd = _resnet18_file(seed=3)
    weights = tmp_path / "mine.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(weights))
    out = tmp_path / "run"
    _fit(
        out,
        "--model",
        "tv:resnet18",
        "--pretrained",
        str(weights),
        "--freeze",
        "backbone",
        "--max-steps",
        "2",
        *SYNTH_RGB,
    )
    _assert_backbone_as_loaded(_export(out), sd)
    assert not (tmp_path / "empty_home").exists()  # torchvision's cache was never touched


@pytest.mark.parametrize(
    "damage,shown",
    [
        (lambda sd: sd.pop("layer1.0.conv1.weight"), "tensor layer1.0.conv1.weight is missing"),
        (lambda sd: sd.update({"layer4.1.bn2.bias": torch.zeros(3)}), "tensor layer4.1.bn2.bias is (3,), the model"),
    ],
    ids=["missing", "misshapen"],
)
def test_weights_without_a_backbone_tensor_are_refused_naming_it(tmp_path, monkeypatch, damage, shown):
    """Only the head may start fresh: a backbone tensor the file lacks (or has in another shape) would stay random
    and train as if it were pretrained, so the run refuses before it starts, naming the tensor."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_home"))
    sd = _resnet18_file()
    damage(sd)
    weights = tmp_path / "damaged.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items()}, str(weights))
    with pytest.raises(UserError) as info:
        _fit(tmp_path / "run", "--model", "tv:resnet18", "--pretrained", str(weights), "--max-steps", "1", *SYNTH_RGB)
    message = str(info.value)
    assert shown in message and "do not fit this architecture" in message and "\n" not in message
    assert not (tmp_path / "run" / "model").exists()


def test_one_channel_data_gets_the_rgb_filters_summed(tmp_path, cached_resnet18):
    out = tmp_path / "run"
    args = ["--model", "tv:resnet18", "--pretrained", "--freeze", "backbone", "--dataset", "digits"]
    _fit(out, *args, "--image-size", "32", "--max-steps", "1", "--batch-size", "16")
    exported = _export(out)
    assert exported["conv1.weight"].shape == (64, 1, 7, 7)
    assert torch.equal(exported["conv1.weight"], cached_resnet18["conv1.weight"].sum(dim=1, keepdim=True))
    assert torch.equal(exported["layer1.0.conv1.weight"], cached_resnet18["layer1.0.conv1.weight"])
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["mean"] == pytest.approx([(0.485 + 0.456 + 0.406) / 3])


def test_a_missing_file_offline_is_one_line_naming_where_to_put_it(tmp_path, monkeypatch):
    """A real refused connection (a proxy on a closed port), not a mocked download."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    with pytest.raises(UserError) as info:
        _fit(tmp_path / "run", "--model", "tv:resnet18", "--pretrained", "--max-steps", "1", *SYNTH_RGB)
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path / "torch_home" / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in message
    assert "https://download.pytorch.org/models/resnet18-f37072fd.pth" in message


def test_resume_needs_no_weights_file_and_refuses_another_head_lr(tmp_path, cached_resnet18, monkeypatch):
    out = tmp_path / "run"
    args = ["--model", "tv:resnet18", "--pretrained", "--freeze", "backbone", "--head-lr", "0.01", *SYNTH_RGB]
    _fit(out, *args, "--max-steps", "4", "--stop-at-step", "2")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "gone"))  # the cache is gone: the checkpoint has the weights
    _fit(out, *args, "--max-steps", "4", "--resume", "auto")
    _assert_backbone_as_loaded(_export(out), cached_resnet18)
    other = ["--model", "tv:resnet18", "--pretrained", "--freeze", "backbone", "--head-lr", "0.5", *SYNTH_RGB]
    with pytest.raises(UserError, match="--head-lr"):
        _fit(out, *other, "--max-steps", "6", "--resume", "auto", "--extend")


def test_a_resume_needs_no_weights_file_after_it_moved(tmp_path, monkeypatch, capsys):
    """The checkpoint holds every weight: a moved --pretrained file is a note on resume, not a "damaged
    checkpoint" (with or without the flag repeated); a fresh run still needs the file."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_home"))
    weights = tmp_path / "mine.safetensors"
    save_file({k: v.contiguous() for k, v in _resnet18_file(seed=5).items()}, str(weights))
    out = tmp_path / "run"
    args = ["--model", "tv:resnet18", "--pretrained", str(weights), "--freeze", "backbone", *SYNTH_RGB]
    _fit(out, *args, "--max-steps", "4", "--stop-at-step", "2")
    weights.rename(tmp_path / "moved.safetensors")
    capsys.readouterr()
    _fit(out, "--resume", "auto", "--stop-at-step", "3")  # the saved config names the file
    _fit(out, *args, "--max-steps", "4", "--resume", "auto")
    assert "is gone; the checkpoint holds the weights" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["global_step"] == 4
    with pytest.raises(UserError, match="no such file"):
        _fit(tmp_path / "fresh", *args, "--max-steps", "1")


def test_named_weights_are_recorded_only_when_the_hash_is_torchvisions(tmp_path, monkeypatch):
    """torchvision's cached file name carries the first hex digits of its sha256: a file that has them is recorded
    as the named weights (with file and hash), another one under the same name as the file it is."""
    from accel_train.models import pretrained

    data = b"weights"
    prefix = hashlib.sha256(data).hexdigest()[:8]
    good = tmp_path / f"resnet18-{prefix}.pth"
    good.write_bytes(data)
    monkeypatch.setattr(pretrained, "cache_path", lambda weights: good)
    info = pretrained.describe("tv:resnet18", "DEFAULT", 3, 32, 10)
    assert info.record() == {"pretrained": "ResNet18_Weights.IMAGENET1K_V1", "pretrained_file": str(good),
                             "pretrained_sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    good.write_bytes(b"other weights")
    assert "not torchvision's" in pretrained.describe("tv:resnet18", "DEFAULT", 3, 32, 10).source
    assert "convention" in pretrained.describe("tv:resnet18", str(good), 3, 32, 10).norm_from


def test_head_lr_is_the_heads_group_lr():
    from accel_train.features.finetune import head_lr_scales
    from accel_train.models import create_model
    from accel_train.optim import build_optimizer

    model = create_model("tv:resnet18", 10, 3, 32)
    for name, p in model.named_parameters():
        p.requires_grad_(name in HEAD)
    opt = build_optimizer(model, 0.001, "sgd", scales=head_lr_scales(model, HEAD, 0.001, 0.05))
    assert [(g["lr"], len(g["params"])) for g in opt.param_groups] == [(pytest.approx(0.05), 2)]
    both = build_optimizer(model.requires_grad_(True), 0.001, "sgd", scales=head_lr_scales(model, HEAD, 0.001, 0.05))
    assert sorted((round(g["lr"], 6), len(g["params"])) for g in both.param_groups) == [(0.001, 60), (0.05, 2)]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--model", "lenet", "--pretrained"], "--pretrained works with torchvision models"),
        (["--model", "tv:resnet18", "--pretrained", "NOPE"], "IMAGENET1K_V1"),
        (["--model", "tv:resnet18", "--pretrained", "/no/such/file.pth"], "no such file"),
        (["--model", "tv:resnet18", "--freeze", "backbone"], "--freeze backbone needs --pretrained"),
        (["--model", "tv:resnet18", "--head-lr", "0.1"], "pass it with --pretrained"),
        (["--model", "tv:resnet18", "--pretrained", "--head-lr", "0"], "--head-lr must be a positive number"),
    ],
)
def test_fine_tuning_flags_are_checked_before_anything_loads(argv, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")) as info:
        parse_config(argv)
    assert "\n" not in str(info.value)


def test_a_freeze_pattern_that_matches_nothing_is_one_line():
    from accel_train.features.finetune import freeze, frozen_names
    from accel_train.models import create_model

    model = create_model("tv:resnet18", 10, 3, 32)
    with pytest.raises(UserError, match="matches no parameter"):
        frozen_names(model, "layer9.*", HEAD)
    with pytest.raises(UserError, match="matches every parameter of the model: nothing would train"):
        frozen_names(model, "*", HEAD)  # an empty optimizer's ValueError traceback before
    names = frozen_names(model, "conv1.*,bn1.*", HEAD)
    assert names == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert freeze(model, names) == ["bn1"]
    model.train()
    assert not model.bn1.training and model.layer1[0].bn1.training  # the frozen BatchNorm stays in eval mode


def test_the_readmes_fine_tuning_command_runs_on_a_folder(tmp_path, cached_resnet18, monkeypatch):
    """The README's how-to, as written there (plus a short length), on a generated folder, offline."""
    import re
    import shlex

    import numpy as np
    from PIL import Image

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"<!-- readme-test: finetune -->\n```\w*\n(.*?)^```", readme, re.S | re.M)
    assert block, "README.md has no fenced block after '<!-- readme-test: finetune -->'"
    argv = shlex.split(block.group(1).replace("\\\n", " "))
    assert argv[:2] == ["python3", "scripts/train.py"] and "--pretrained" in argv
    rng = np.random.default_rng(0)
    for cls, value in (("dark", 40), ("light", 200)):
        (tmp_path / "my_images" / cls).mkdir(parents=True)
        for i in range(30):
            pixels = np.clip(rng.normal(value, 30, (20, 20, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(tmp_path / "my_images" / cls / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    _fit(Path(argv[argv.index("--output-dir") + 1]), *argv[2:], "--max-steps", "2")
    exported = load_file("runs/finetuned/model/model.safetensors")
    assert exported["fc.weight"].shape == (2, 512)
    assert all(torch.equal(exported[k], cached_resnet18[k]) for k in exported if k not in HEAD)
