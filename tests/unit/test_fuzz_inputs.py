"""Fuzzing the input layers (issue 16): random invalid values for every ``TrainConfig`` field (as a flag and as a
``--config`` YAML key), every field of an export's ``config.json`` and every field of a checkpoint's
``progress.json``.

Each value must be refused with a UserError (exit code 2) whose message is one line, never another exception
type (which the scripts would print as "unexpected failure" with a traceback), and the files must be left as
they were. The generator is seeded (``random.Random(0)``): the cases are the same on every run, and a failure
names its case. In-process only, so the whole module takes seconds.


The in-process tests; whole runs and launches are in ../integration/test_fuzz_inputs_runs.py.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from checks import snapshot

from accel_train.config import TrainConfig, parse_config
from accel_train.errors import UserError
from accel_train.flags import field_type

RNG_SEED = 0


# the lower bound of every int field (all have one), and the floats that must be > 0 rather than >= 0
_POSITIVE_FLOATS = {"lr", "lr_gamma", "dist_timeout", "val_split", "head_lr"}


_FREE_TEXT = {"data_dir", "output_dir", "image_column", "label_column"}  # any non-empty text without NUL is valid


def _junk(rng: random.Random) -> str:
    return "".join(rng.choice("abcxyz_-!@ ") for _ in range(rng.randint(1, 12))).strip() or "junk"


def _int_values(name: str, rng: random.Random) -> list[Any]:
    """Invalid values for an int field: text, fractions, negatives, beyond int64 (and seeds beyond 2**32)."""
    values: list[Any] = [
        -rng.randint(1, 10**6),
        rng.randint(2**63, 2**80),
        rng.randint(1, 100) + 0.5,
        _junk(rng),
        "1e3",
        float("nan"),
    ]
    if name == "seed":
        values.append(2**32 + rng.randint(0, 10**6))
    return values


def _float_values(name: str, rng: random.Random) -> list[Any]:
    values: list[Any] = [float("nan"), float("inf"), -float("inf"), -rng.uniform(1e-6, 1e6), _junk(rng)]
    if name in _POSITIVE_FLOATS:
        values.append(0.0)
    if name == "val_split":
        values.append(1.0 + rng.uniform(0, 5))
    return values


def _str_values(f, rng: random.Random) -> list[Any]:
    values: list[Any] = ["", f"a\x00{_junk(rng)}"]
    if "choices" in f.metadata:
        values += [f"{_junk(rng)}{rng.randint(0, 99)}" for _ in range(3)]
    elif f.name == "model":
        values += [f"net_{_junk(rng)}", "LeNet"]
    elif f.name == "dataset":
        values += [f"{_junk(rng)}", "imagefolder:", f"zip:{_junk(rng)}"]
    elif f.name == "resume":
        values += [f"/no/such/{_junk(rng)}/step_1"]
    elif f.name == "lr_milestones":
        values += ["0.75,0.5", "1.5", f"{_junk(rng)}", "0.5,nan", ","]
    elif f.name == "pretrained":  # the default model is lenet: weights for a tv: model only, and ones that exist
        values += ["DEFAULT", f"/no/such/{_junk(rng)}.pth", f"{_junk(rng)}_V1"]
    elif f.name == "report_to":  # any of accelerate's trackers, comma-separated; 'none' alone
        values += [f"{_junk(rng)}{rng.randint(0, 99)}", "none,csv", "csv,,tensorboard"]
    elif f.name == "freeze":
        values += ["backbone"]  # without --pretrained (a pattern is checked against the built model)
    else:
        assert f.name in _FREE_TEXT, f"new text field {f.name}: say which of its values are invalid"
    return values


def invalid_values(f, rng: random.Random) -> list[Any]:
    """Values of field ``f`` that the config must refuse (each one, whatever the other fields hold)."""
    typ = field_type(f)
    if typ is bool:
        return ["maybe", 2, [True], {"a": 1}, 1.5]
    if typ is int:
        return _int_values(f.name, rng)
    if typ is float:
        return _float_values(f.name, rng)
    return _str_values(f, rng)


def _as_flag(name: str, value: Any, typ: type) -> list[str] | None:
    """The flag form of ``value`` (None for values a command line cannot carry)."""
    flag = "--" + name.replace("_", "-")
    if typ is bool:
        return [f"{flag}={value}"]  # BooleanOptionalAction takes no value: refused
    if isinstance(value, (list, dict)):
        return None
    text = str(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return [f"{flag}={text}"]  # '=': a value starting with '-' stays a value


def _refused(action, case: str) -> str:
    try:
        action()
    except UserError as exc:
        message = str(exc)
        assert message and "\n" not in message, f"{case}: not one line: {message!r}"
        return message
    except Exception as exc:  # noqa: BLE001 - the point: any other type is a traceback for the user
        raise AssertionError(f"{case}: {type(exc).__name__} instead of a UserError: {exc}") from exc
    raise AssertionError(f"{case}: accepted")


def test_fuzz_every_train_config_field(tmp_path):
    rng = random.Random(RNG_SEED)
    config = tmp_path / "hp.yaml"
    cases = 0
    for f in fields(TrainConfig):
        typ = field_type(f)
        for value in invalid_values(f, rng):
            argv = _as_flag(f.name, value, typ)
            if argv is not None:
                _refused(lambda argv=argv: parse_config(argv), f"flag {argv}")
                cases += 1
            config.write_text(yaml.safe_dump({f.name: value}, allow_unicode=False))
            before = snapshot(tmp_path)
            _refused(lambda: parse_config(["--config", str(config)]), f"YAML {f.name}: {value!r}")
            assert snapshot(tmp_path) == before, f"YAML {f.name}: {value!r} changed files"
            cases += 1
    assert cases > 10 * len(fields(TrainConfig))


def _export_values(rng: random.Random) -> dict[str, list[Any]]:
    n = rng.randint(2, 50)
    return {
        "model": [f"vit_{_junk(rng)}", 7, ["lenet"], None],
        "num_classes": ["ten", float("inf"), 0, -n, 10**9, 2.5, True, [10], None],
        "in_channels": ["1", 0, -1, 1000, float("nan"), False],
        "image_size": ["28", 0, 5, 10**12, 28.5, -28, None, {"side": 28}],
        "mean": [None, "0.5", [], ["0.1"], [0.1, 0.2, 0.3], float("nan"), {"r": 0.1}, True],
        "std": [None, "0.3", [0.0], [-0.3], [float("inf")], [0.1, 0.2], [], False],
        "class_names": ["0123456789", [str(i) for i in range(n % 9 + 1)], [{"name": "x"}] * 10, 10, {"0": "a"}],
        "dataset": [5, ["digits"], {"name": "digits"}],
    }


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """A lenet export (10 classes, 1 channel, 16 x 16), written directly: no training needed to load it."""
    from accel_train.checkpoint.weights import export_weights
    from accel_train.models import create_model

    path = tmp_path_factory.mktemp("export") / "model"
    config = {
        "model": "lenet",
        "num_classes": 10,
        "in_channels": 1,
        "image_size": 16,
        "mean": [0.5],
        "std": [0.25],
        "class_names": [str(i) for i in range(10)],
        "dataset": "digits",
    }
    export_weights(create_model("lenet", 10, 1, 16), path, config)
    return path


def test_fuzz_every_export_config_field(tmp_path, export):
    from PIL import Image

    from accel_train.checkpoint.weights import load_model
    from accel_train.commands.predict import _load_images

    image = tmp_path / "digit.png"
    Image.new("L", (16, 16)).save(image)
    rng = random.Random(RNG_SEED)
    good = json.loads((export / "config.json").read_text())
    load_model(export)  # the untouched export loads
    cases = 0
    for key, values in _export_values(rng).items():
        for value in values:
            folder = tmp_path / f"case{cases}"
            shutil.copytree(export, folder)
            (folder / "config.json").write_text(json.dumps({**good, key: value}))
            before = snapshot(folder)

            def load_and_read(folder=folder):
                _, config = load_model(folder)  # what accel-evaluate and accel-predict do first
                _load_images([str(image)], config)  # then predict reads images with its sizes and statistics

            message = _refused(load_and_read, f"config.json {key}: {value!r}")
            assert str(folder) in message and (key in message or "model" in message), message
            assert snapshot(folder) == before
            cases += 1
    assert cases >= 40
