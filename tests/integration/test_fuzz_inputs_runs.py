"""Fuzzing the input layers (issue 16): random invalid values for every ``TrainConfig`` field (as a flag and as a
``--config`` YAML key), every field of an export's ``config.json`` and every field of a checkpoint's
``progress.json``.

Each value must be refused with a UserError (exit code 2) whose message is one line, never another exception
type (which the scripts would print as "unexpected failure" with a traceback), and the files must be left as
they were. The generator is seeded (``random.Random(0)``): the cases are the same on every run, and a failure
names its case. In-process only, so the whole module takes seconds.


Whole runs and launches; the in-process tests are in ../unit/test_fuzz_inputs.py.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
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


_STATE_VALUES = {
    "epoch": [-1, "3", 1.5, None],
    "step_in_epoch": [-4, "x", [1]],
    "global_step": [-5, "2", 2.0, None, True, 2**70],
    "samples_seen": [-32, "32", {}],
    "best_metric": ["0.9", float("nan"), float("inf"), [0.9]],
    "best_step": [-1, "2", 1.5],
    "nonfinite_skipped": [-1, "0"],
    "fp16_skipped_steps": [-2, 0.5],
    "extra": [[1], "x", 3],
}


_TOP_VALUES = {
    "state": [None, [], "x", 5],
    "scheduler": [[1, 2], "cosine", 3],
    "resolved": [[], "x"],
    "model_config": [[], "lenet"],
    "config": [["lr"], "x"],
}


_RESOLVED_VALUES = {
    "world_size": [-1, "2", 1.5],
    "global_batch": [-32, "32"],
    "micro_batch": ["16", None],
    "accum_steps": [-1, 2.5],
    "total_steps": ["100", -1],
    "steps_per_epoch": [-3, "3"],
    "lr": ["0.1", float("nan"), float("inf"), None],
}


def _progress_cases(rng: random.Random) -> list[tuple[str, Any]]:
    """(path of the field in progress.json, invalid value) for every field it has."""
    cases: list[tuple[str, Any]] = [(f"state.{k}", v) for k, vs in _STATE_VALUES.items() for v in vs]
    cases += [(k, v) for k, vs in _TOP_VALUES.items() for v in vs]
    cases += [(f"resolved.{k}", v) for k, vs in _RESOLVED_VALUES.items() for v in vs]
    cases += [(f"model_config.{k}", v) for k, vs in _export_values(rng).items() for v in vs]
    for f in fields(TrainConfig):
        # a saved --resume is never restored (it is per attempt): only its form is checked, not that it exists
        values = invalid_values(f, rng) if f.name != "resume" else ["", "a\x00b"]
        cases += [(f"config.{f.name}", v) for v in rng.sample(values, min(3, len(values)))]
    return cases


def _set(data: dict, dotted: str, value: Any) -> None:
    *parents, key = dotted.split(".")
    for parent in parents:
        data = data[parent]
    data[key] = value


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory) -> Path:
    """A real 2-step run (in-process) with its checkpoint."""
    from accel_train.loop import fit

    run = tmp_path_factory.mktemp("fuzz") / "run"
    small = ["--dataset", "synthetic", "--synthetic-size", "64", "--synthetic-test-size", "16"]
    small += ["--synthetic-image-size", "16", "--batch-size", "16", "--max-steps", "2"]
    fit(parse_config([*small, "--report-to", "none", "--no-plots", "--no-progress", "--output-dir", str(run)]))
    return run


def test_fuzz_every_progress_json_field(tmp_path, checkpoint_run):
    from accel_train.checkpoint.state import read_progress, resolve_resume
    from accel_train.config import check_saved_config
    from accel_train.loop import _restore_resumed_config
    from accel_train.run_dir import RunDir

    run = tmp_path / "run"
    resume_auto = parse_config(["--resume", "auto", "--output-dir", str(run)])
    shutil.copytree(checkpoint_run, run)
    ckpt = run / "checkpoints" / "step_00000002"
    progress = ckpt / "progress.json"
    good = progress.read_text()
    read_progress(ckpt)  # the untouched checkpoint reads
    rng = random.Random(RNG_SEED)
    cases = _progress_cases(rng)
    for dotted, value in cases:
        data = json.loads(good)
        _set(data, dotted, value)
        progress.write_text(json.dumps(data))
        before = snapshot(run)
        case = f"progress.json {dotted}: {value!r}"
        if dotted.startswith("config."):  # the run config: checked by the config layer when a resume reads it
            message = _refused(lambda: check_saved_config(read_progress(ckpt)["config"], str(progress)), case)
            assert str(progress) in message, message
            # --resume auto refuses it too, instead of starting over
            auto = _refused(lambda: _restore_resumed_config(resume_auto, RunDir(run)), f"--resume auto with {case}")
            assert str(progress) in auto and "the checkpoint is damaged" in auto, auto
            assert snapshot(run) == before, f"{case}: files changed"
            continue
        message = _refused(lambda: read_progress(ckpt), case)
        assert str(progress) in message, message
        # --resume auto refuses it too, instead of starting over
        auto = _refused(lambda: resolve_resume("auto", run), f"--resume auto with {case}")
        assert auto.startswith("--resume auto: the newest checkpoint cannot be used"), auto
        assert snapshot(run) == before, f"{case}: files changed"
    assert len(cases) > 150
