"""Issue 50: without --model, a folder of photos fine-tunes ImageNet weights when they are at hand, and says so;
offline without them it trains from scratch with one line saying what the weights would bring and where to put
them. No network here: the weights file is written where torchvision looks for it (``$TORCH_HOME/hub/
checkpoints/``), with random values (what is checked is the choice, the record and that the file is read)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import yaml
from conftest import FAST, check, run_here, summary

from accel_train.defaults import MODEL, PHOTO_MODEL

PHOTO_LINE = "your images look like photos"


def _photo_folder(root, sides=(120, 150, 136), per_class: int = 4, test_per_class: int = 2):
    """Colour JPEGs of several sizes (the shorter side 120 to 150 pixels), two classes: photos as far as the
    rule can tell (``defaults.looks_like_photos``)."""
    from PIL import Image

    for split, count in (("train", per_class), ("test", test_per_class)):
        for c, name in enumerate(("ants", "bees")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                rng = np.random.default_rng([c, i, len(split)])
                side = sides[i % len(sides)]
                pixels = rng.integers(0, 256, (side, side + 20 * (i % 2), 3), dtype=np.uint8)
                pixels[..., c] //= 2  # the classes differ in colour
                Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return root


@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    home = tmp_path / "torch_home"
    monkeypatch.setenv("TORCH_HOME", str(home))
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # a real refusal if anything tried to download
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    return home


def _place_weights(home) -> str:
    """resnet18's default weights file (random values, torchvision's format) in the cache; its sha256."""
    import torch
    import torchvision.models as tvm

    from accel_train.models.pretrained import cache_path

    path = cache_path(tvm.ResNet18_Weights.DEFAULT)
    assert str(path).startswith(str(home))
    path.parent.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(tvm.resnet18(num_classes=1000).state_dict(), path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_photos_with_weights_in_the_cache_fine_tune_them_and_record_their_hash(tmp_path, torch_home, monkeypatch):
    monkeypatch.delenv("ACCEL_TRAIN_OFFLINE", raising=False)  # the cache is read offline too
    sha = _place_weights(torch_home)
    folder, out = _photo_folder(tmp_path / "photos"), tmp_path / "run"
    proc = check(run_here("train.py", "--dataset", f"imagefolder:{folder}", "--max-steps", "2", "--batch-size", "4",
                          "--output-dir", str(out), *FAST))  # fmt: skip
    chose = [line for line in proc.stdout.splitlines() if "defaults for your data" in line]
    assert len(chose) == 1, proc.stdout
    assert f"--model {PHOTO_MODEL} --pretrained" in chose[0] and "--bn-stats loaded" in chose[0]
    assert "look like photos (colour images, 136 pixels a side (median))" in chose[0]
    assert str(torch_home) in chose[0] and f"--model {MODEL} trains from scratch instead" in chose[0]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    record = saved["resolved"]["defaults"]
    assert record["model"] == PHOTO_MODEL and record["image_size"] == 224 and record["pretrained_sha256"] == sha
    assert "not torchvision's: its sha256 differs" in record["pretrained"]  # random values under its name
    assert saved["model"] == PHOTO_MODEL and saved["bn_stats"] == "loaded" and saved["optimizer"] == "sgd"
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["image_size"] == 224 and config["pretrained_sha256"] == sha
    assert config["mean"] == pytest.approx([0.485, 0.456, 0.406])  # the weights' normalisation
    assert summary(out)["global_step"] == 2
    assert PHOTO_LINE not in proc.stdout  # the offline line is for runs without the weights


def test_photos_offline_without_weights_train_from_scratch_and_say_what_they_miss(tmp_path, torch_home, monkeypatch):
    monkeypatch.delenv("ACCEL_TRAIN_OFFLINE", raising=False)  # the download is tried, and refused by the proxy
    folder, out = _photo_folder(tmp_path / "photos"), tmp_path / "run"
    proc = check(run_here("train.py", "--dataset", f"imagefolder:{folder}", "--max-steps", "2", "--batch-size", "4",
                          "--output-dir", str(out), *FAST))  # fmt: skip
    said = [line for line in proc.stdout.splitlines() if PHOTO_LINE in line]
    assert len(said) == 1, proc.stdout
    assert "cannot be downloaded" in said[0] and "download https://download.pytorch.org/models/" in said[0]
    assert str(torch_home) in said[0] and "about 94%" in said[0]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["model"] == MODEL and saved["resolved"]["defaults"]["model"] == MODEL
    assert summary(out)["global_step"] == 2


def test_the_switch_off_skips_the_download_and_the_user_s_flags_win(tmp_path, torch_home, monkeypatch):
    """ACCEL_TRAIN_OFFLINE=1 (the suite's own setting) names itself; --model picks: no photo choice at all."""
    monkeypatch.setenv("ACCEL_TRAIN_OFFLINE", "1")
    folder = _photo_folder(tmp_path / "photos")
    args = ["--dataset", f"imagefolder:{folder}", "--max-steps", "1", "--batch-size", "4", *FAST]
    proc = check(run_here("train.py", *args, "--output-dir", str(tmp_path / "a")))
    said = [line for line in proc.stdout.splitlines() if PHOTO_LINE in line]
    assert len(said) == 1 and "ACCEL_TRAIN_OFFLINE is set" in said[0], proc.stdout
    proc = check(run_here("train.py", *args, "--model", "small_cnn_gn", "--output-dir", str(tmp_path / "b")))
    assert PHOTO_LINE not in proc.stdout and "defaults for your data" not in proc.stdout


def test_a_resume_records_the_weights_the_run_started_from_not_the_cache_s_file_now(tmp_path, torch_home):
    """The red-team's finding: a resume after the cached file was replaced wrote the new file's hash into the
    export's config.json. The weights the run started from are its first attempt's."""
    import torch
    import torchvision.models as tvm

    sha = _place_weights(torch_home)
    folder, out = _photo_folder(tmp_path / "photos"), tmp_path / "run"
    args = ["train.py", "--dataset", f"imagefolder:{folder}", "--max-steps", "2", "--batch-size", "4",
            "--output-dir", str(out), *FAST]  # fmt: skip
    check(run_here(*args, "--stop-at-step", "1"))
    from accel_train.models.pretrained import cache_path

    torch.manual_seed(1)
    torch.save(tvm.resnet18(num_classes=1000).state_dict(), cache_path(tvm.ResNet18_Weights.DEFAULT))  # another
    check(run_here(*args, "--resume", "auto"))
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["pretrained_sha256"] == sha and summary(out)["global_step"] == 2
