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
from fuzz_values import RNG_SEED, _export_values, _refused, invalid_values

from accel_train.config import TrainConfig, parse_config

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
