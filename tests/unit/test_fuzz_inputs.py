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
from fuzz_values import RNG_SEED, _export_values, _refused, invalid_values

from accel_train.config import TrainConfig, parse_config
from accel_train.flags import field_type


def _as_flag(name: str, value: Any, typ: type) -> list[str] | None:
    """The flag form of ``value`` (None for values a command line cannot carry)."""
    flag = "--" + name.replace("_", "-")
    if typ is bool:
        return [f"{flag}={value}"]  # BooleanOptionalAction takes no value: refused
    if isinstance(value, (list, dict)):
        return None
    text = str(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return [f"{flag}={text}"]  # '=': a value starting with '-' stays a value


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
