"""``convert_checkpoint.py`` (``accel_train/commands/convert.py``): a checkpoint or export becomes clean weights and
its saved config without building the model; the model is built only to check the weights, and user code is
imported only with ``--allow-import``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from checks import assert_one_line_error, raises_user_error
from conftest import REPO, check, run_here
from safetensors.torch import load_file

from accel_train.checkpoint.weights import export_weights, load_model, load_weights
from accel_train.doctor.launching import child_env
from accel_train.errors import UserError
from accel_train.models import create_model

# The README's API pattern: the model is defined in the script that trains it, so it lives in that run's __main__.
USER_SCRIPT = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    import accel_train


    class TinyNet(nn.Module):
        def __init__(self, num_classes: int, in_channels: int, image_size: int):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten()
            )
            self.head = nn.Linear(4 * image_size * image_size, num_classes)

        def forward(self, x):
            return self.head(self.features(x))


    if __name__ == "__main__":
        g = torch.Generator().manual_seed(0)
        images, labels = torch.rand(64, 1, 8, 8, generator=g), torch.arange(64) % 3
        accel_train.train(
            TinyNet, TensorDataset(images, labels), output_dir="run", max_steps=4, batch_size=16,
            checkpoint_epochs=True, report_to="none", plots=False, progress=False,
        )
"""
SIZES = {"num_classes": 3, "in_channels": 1, "image_size": 8}


def _import_script(path: Path):
    """The user's script as a module of its own (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location("user_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def main_run(tmp_path_factory) -> Path:
    """A run of ``USER_SCRIPT`` by ``python script.py``: the checkpoints name the model ``__main__:TinyNet``."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "train_tiny.py").write_text(textwrap.dedent(USER_SCRIPT))
    run = [sys.executable, "train_tiny.py"]
    check(subprocess.run(run, cwd=folder, env=child_env(), capture_output=True, text=True, timeout=600))
    return folder


def test_a_model_defined_in_main_converts_without_importing_it(main_run, tmp_path):
    checkpoint = sorted((main_run / "run" / "checkpoints").iterdir())[-1]
    progress = json.loads((checkpoint / "progress.json").read_text())
    assert progress["model_config"]["model"] == "__main__:TinyNet"

    out = tmp_path / "clean"
    script = [sys.executable, str(REPO / "scripts" / "convert_checkpoint.py"), str(checkpoint), "--out", str(out)]
    proc = check(subprocess.run(script, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300))
    assert "without building the model" in proc.stdout and "load_weights(model, " in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text()) == progress["model_config"]  # the saved config, as saved
    saved, converted = load_file(str(checkpoint / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert saved.keys() == converted.keys() and all(torch.equal(saved[k], converted[k]) for k in saved)

    user = _import_script(main_run / "train_tiny.py")
    trained, fresh = user.TinyNet(**SIZES).eval(), user.TinyNet(**SIZES).eval()
    trained.load_state_dict(saved)  # torch's own loader on the checkpoint's file
    load_weights(fresh, out)
    x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(trained(x), fresh(x))


def test_allow_import_and_other_programs_say_why_main_cannot_be_built(main_run, tmp_path):
    """--allow-import cannot import a script's __main__: convert still copies; loaders say what to do instead."""
    checkpoint = sorted((main_run / "run" / "checkpoints").iterdir())[-1]
    proc = check(run_here("convert_checkpoint.py", str(checkpoint), "--out", str(tmp_path / "c"), "--allow-import"))
    assert "defined in the script that trained it" in proc.stdout
    proc = check(run_here("convert_checkpoint.py", str(checkpoint), "--out", str(tmp_path / "j"), "--json"))
    result = json.loads(proc.stdout)
    assert result["model_built"] is False and "__main__:TinyNet" in result["not_built_because"]

    main_script = r"__main__:TinyNet .*defined in the script that trained it.*load_weights\(model, path\)"
    with pytest.raises(UserError, match=main_script):
        load_model(tmp_path / "c", allow_import=True)
    named = run_here(
        "convert_checkpoint.py", str(checkpoint), "--out", str(tmp_path / "n"), "--model", "__main__:TinyNet"
    )
    assert_one_line_error(named, "__main__:TinyNet", "defined in the script that trained it")
    assert not (tmp_path / "n").exists()


def test_a_model_object_given_to_train_converts_as_saved(tmp_path):
    export = tmp_path / "export"
    sizes = {"num_classes": 10, "in_channels": 1, "image_size": 28}
    model = create_model("lenet", **sizes)
    config = {"model": "instance:mymodels.Net", **sizes, "mean": [0.5], "std": [0.25]}
    export_weights(model, export, config)
    proc = check(run_here("convert_checkpoint.py", str(export), "--out", str(tmp_path / "c")))
    assert "nn.Module object given to accel_train.train()" in proc.stdout
    assert json.loads((tmp_path / "c" / "config.json").read_text()) == config
    fresh = create_model("lenet", **sizes)
    load_weights(fresh, tmp_path / "c")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))


def test_sizes_that_nothing_would_check_are_refused(tmp_path):
    export = tmp_path / "export"
    export_weights(create_model("lenet", 10, 1, 28), export, {"model": "__main__:Net", "num_classes": 10})
    proc = run_here("convert_checkpoint.py", str(export), "--out", str(tmp_path / "c"), "--num-classes", "5")
    assert_one_line_error(proc, "--num-classes 5 differs from the saved config (num_classes=10)", "drop --num-classes")
    assert not (tmp_path / "c").exists()
    same = run_here("convert_checkpoint.py", str(export), "--out", str(tmp_path / "d"), "--num-classes", "10")
    check(same)


def test_built_in_models_are_still_built_and_checked(tmp_path):
    """A config naming a built-in model: the weights are loaded strictly into it before anything is written."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    export_weights(create_model("lenet", 10, 1, 28), good, {"model": "lenet", "num_classes": 10, "image_size": 28})
    export_weights(create_model("lenet", 10, 1, 28), bad, {"model": "lenet", "num_classes": 3, "image_size": 28})
    proc = check(run_here("convert_checkpoint.py", str(good), "--out", str(tmp_path / "g"), "--json"))
    result = json.loads(proc.stdout)
    assert result["model_built"] is True and result["not_built_because"] is None
    assert result["model_config"] == {"model": "lenet", "num_classes": 10, "in_channels": 1, "image_size": 28}
    assert_one_line_error(run_here("convert_checkpoint.py", str(bad), "--out", str(tmp_path / "b")), "do not fit")
    assert not (tmp_path / "b").exists()


# ---- --out refuses to replace an export without --overwrite ----------------------------------------------------------


def test_convert_refuses_an_existing_export_without_overwrite(tmp_path):
    from accel_train.commands.convert import main
    from accel_train.models import create_model

    source = tmp_path / "model.pt"
    torch.save(create_model("lenet").state_dict(), source)
    out = tmp_path / "export"
    args = [str(source), "--out", str(out), "--model", "lenet"]
    assert main(args) == 0
    before = (out / "model.safetensors").read_bytes()
    torch.save(create_model("lenet").state_dict(), source)  # other weights (a new random init)
    raises_user_error(lambda: main(args), f"--out {out} already holds an export", "--overwrite")
    assert (out / "model.safetensors").read_bytes() == before
    assert main([*args, "--overwrite"]) == 0
    assert (out / "model.safetensors").read_bytes() != before
