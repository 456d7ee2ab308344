"""Safe resume: nothing in a checkpoint runs code, RNG state is checked, --branch keeps one timeline, old checkpoints.

One uninterrupted run (module fixture) provides the checkpoints at steps 10, 20 and 30 and the reference
weights; every test works on a copy of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shlex
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import FAST, check, max_abs_diff, metrics, run_here, run_script, summary, weights

from accel_train.checkpoint.safe_load import UnsafeCheckpointError, check_sharded_metadata, verify_checkpoint
from accel_train.config import parse_config
from accel_train.errors import CheckpointError, UserError
from accel_train.loop import fit

# lenet on digits (44 steps/epoch at batch 32): the whole run stays inside epoch 0
COMMON = ["--max-steps", "30", "--no-checkpoint-epochs", "--log-every", "5", *FAST]
BASE = [*COMMON, "--checkpoint-every", "10", "--keep-last", "5"]  # checkpoints at steps 10, 20, 30
TIMING = ("samples_per_s", "time_s", "train_time_s")
CODE_REFUSED = "would need to run code"


class Evil:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:08d}"


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def tree(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder`` with a hash of its content: equal trees mean nothing changed."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def one_error_line(proc) -> str:
    """The CLI's failure contract: exit 2, exactly one ``error:`` line on stderr, no traceback."""
    assert proc.returncode == 2, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-3000:]}"
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def train_series(run: Path) -> dict[tuple[str, int], dict]:
    records = [m for m in metrics(run) if m["event"] in ("train", "eval")]
    keys = [(m["event"], m["step"]) for m in records]
    assert len(keys) == len(set(keys)), f"a step is logged twice: {keys}"
    return {(m["event"], m["step"]): {k: v for k, v in m.items() if k not in TIMING} for m in records}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base") / "run"
    check(run_here("train.py", *BASE, "--output-dir", str(out)))
    assert names(out / "checkpoints") == ["step_00000010", "step_00000020", "step_00000030"]
    return out


@pytest.fixture
def run_copy(base, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(base, out)
    return out


@pytest.fixture
def ckpt_copy(base, tmp_path) -> Path:
    """A copy of the last checkpoint folder alone (for the in-process checks)."""
    out = tmp_path / "checkpoints" / "step_00000030"
    shutil.copytree(ckpt(base, 30), out)
    return out


# ---- 1. resume never runs code ------------------------------------------------------------------------------------


def test_malicious_custom_checkpoint_is_refused_end_to_end(run_copy, tmp_path):
    """A checkpoint of an earlier version carried custom_checkpoint_0.pkl, which accelerate unpickles unsafely."""
    marker = tmp_path / "MARKER"
    torch.save({"x": Evil(marker)}, ckpt(run_copy, 30) / "custom_checkpoint_0.pkl")
    before = tree(run_copy)
    # --extend: the run is finished, and a plain resume of a finished run loads nothing at all
    args = [*BASE, "--resume", "auto", "--extend", "--max-steps", "40", "--output-dir", str(run_copy)]
    line = one_error_line(run_here("train.py", *args))
    assert "custom_checkpoint_0.pkl" in line and CODE_REFUSED in line, line
    assert not marker.exists()
    assert tree(run_copy) == before  # refused before anything was written


def test_malicious_rng_state_is_refused_even_with_resume_inexact(run_copy, tmp_path):
    """--resume-inexact accepts a missing or broken RNG file, never one that carries code."""
    marker = tmp_path / "MARKER"
    torch.save({"x": Evil(marker)}, ckpt(run_copy, 30) / "random_states_0.pkl")
    resume = ["--resume", str(ckpt(run_copy, 30)), "--extend", "--max-steps", "40", "--resume-inexact"]
    args = [*BASE, *resume, "--output-dir", str(run_copy)]
    line = one_error_line(run_here("train.py", *args))
    assert "random_states_0.pkl" in line and CODE_REFUSED in line, line
    assert not marker.exists()


@pytest.mark.parametrize(
    "name,inexact_ok,plain_pickle",
    [
        ("custom_checkpoint_0.pkl", False, False),
        ("random_states_0.pkl", False, False),
        ("random_states_0.pkl", True, False),
        ("optimizer.bin", False, False),
        ("optimizer.bin", False, True),  # a plain pickle, not torch's zip format
        ("scaler.pt", False, False),
    ],
)
def test_malicious_state_file_is_refused(ckpt_copy, tmp_path, name, inexact_ok, plain_pickle):
    marker = tmp_path / "MARKER"
    target = ckpt_copy / name
    if plain_pickle:
        target.write_bytes(pickle.dumps({"x": Evil(marker)}))
    else:
        torch.save({"x": Evil(marker)}, target)
    with pytest.raises(UnsafeCheckpointError) as info:
        verify_checkpoint(ckpt_copy, written_world_size=1, inexact_ok=inexact_ok)
    message = str(info.value)
    assert name in message and CODE_REFUSED in message and "\n" not in message, message
    assert not marker.exists()


@pytest.mark.parametrize("name,is_dir", [("evil.py", False), ("notes.txt", False), ("extra", True)])
def test_unknown_entry_in_checkpoint_is_refused(ckpt_copy, name, is_dir):
    verify_checkpoint(ckpt_copy, written_world_size=1)  # the real checkpoint passes
    if is_dir:
        (ckpt_copy / name).mkdir()
    else:
        (ckpt_copy / name).write_text("import os\nos.system('true')\n")
    with pytest.raises(CheckpointError, match=rf"{name} is an unexpected (file|folder)"):
        verify_checkpoint(ckpt_copy, written_world_size=1)


def _sharded(folder: Path, state: dict) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "torch.distributed is disabled ...: assuming ... a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    assert (folder / ".metadata").is_file() and list(folder.glob("*.distcp"))
    return folder


def test_sharded_metadata_written_by_torch_passes_and_pickled_code_is_refused(ckpt_copy, tmp_path):
    marker = tmp_path / "MARKER"
    model_sd = {"model": {"w": torch.randn(4, 3), "b": torch.zeros(3, dtype=torch.bfloat16), "n": torch.tensor(5)}}
    optim_sd = {
        "optimizer": {
            "state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.ones(4, 3)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "fused": True, "params": ["w"]}],
        }
    }
    model_dir = _sharded(ckpt_copy / "pytorch_model_fsdp_0", model_sd)
    _sharded(ckpt_copy / "optimizer_0", optim_sd)
    check_sharded_metadata(model_dir / ".metadata")
    check_sharded_metadata(ckpt_copy / "optimizer_0" / ".metadata")
    assert verify_checkpoint(ckpt_copy, written_world_size=1) == {}

    (model_dir / ".metadata").write_bytes(pickle.dumps(Evil(marker)))
    with pytest.raises(UnsafeCheckpointError, match=CODE_REFUSED):
        check_sharded_metadata(model_dir / ".metadata")
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata would need to run code"):
        verify_checkpoint(ckpt_copy, written_world_size=1, inexact_ok=True)
    assert not marker.exists()

    (model_dir / ".metadata").unlink()
    (model_dir / "evil.py").write_text("")
    with pytest.raises(CheckpointError, match="evil.py is not part of a sharded checkpoint"):
        verify_checkpoint(ckpt_copy, written_world_size=1)


def test_code_in_a_sharded_shard_is_refused(ckpt_copy, tmp_path):
    marker = tmp_path / "MARKER"
    _sharded(ckpt_copy / "optimizer_0", {"optimizer": {"param_groups": [{"lr": Evil(marker)}]}})
    with pytest.raises(CheckpointError):
        verify_checkpoint(ckpt_copy, written_world_size=1)
    assert not marker.exists()


# ---- 2. the RNG state ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_unusable_rng_state_needs_resume_inexact(run_copy, base, damage, capsys):
    shutil.rmtree(ckpt(run_copy, 30))  # --resume auto now continues from step 20
    rng = ckpt(run_copy, 20) / "random_states_0.pkl"
    if damage == "missing":
        rng.unlink()
    else:
        rng.write_bytes(rng.read_bytes()[:10])
    args = [*BASE, "--resume", "auto", "--output-dir", str(run_copy)]
    before = tree(run_copy)
    if damage == "missing":  # the CLI's contract (exit 2, one error line) once, through the script
        line = one_error_line(run_script("train.py", *args))
    else:  # the same refusal in this process: no start-up per run
        with pytest.raises(UserError) as refused:
            fit(parse_config(args))
        line = str(refused.value)
    assert "random_states_0.pkl" in line and "--resume-inexact" in line, line
    assert tree(run_copy) == before

    capsys.readouterr()
    fit(parse_config([*args, "--resume-inexact"]))
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if line.startswith("warning: resume is not exact")]
    assert len(warned) == 1 and "random_states_0.pkl" in warned[0], err
    assert summary(run_copy)["global_step"] == 30
    # lenet draws no random numbers while training: weights, optimizer, schedule and data order are still exact
    assert max_abs_diff(weights(base), weights(run_copy)) <= 1e-6


@pytest.mark.parametrize(
    "damage",
    [
        "first_10_bytes",
        "half",
        "empty",
        "digits",
        "zeros",
    ],
)
def test_corrupt_rng_state_is_corrupt_not_code(ckpt_copy, damage):
    rng = ckpt_copy / "random_states_0.pkl"
    data = rng.read_bytes()
    damaged = {
        "first_10_bytes": data[:10],
        "half": data[: len(data) // 2],
        "empty": b"",
        "digits": b"0123456789",
        "zeros": bytes(10),
    }
    rng.write_bytes(damaged[damage])
    with pytest.raises(CheckpointError, match="--resume-inexact") as info:
        verify_checkpoint(ckpt_copy, written_world_size=1)
    assert not isinstance(info.value, UnsafeCheckpointError)
    notes = verify_checkpoint(ckpt_copy, written_world_size=1, inexact_ok=True)
    assert list(notes) == [0] and "random_states_0.pkl is truncated or corrupt" in notes[0]


# ---- 3. lineage and retention -------------------------------------------------------------------------------------


def test_resume_from_older_checkpoint_needs_branch_and_keeps_one_timeline(run_copy, base):
    """The issue: resume step 10 of a run that has 20 and 30, save step 25 with --keep-last 2."""
    older = ckpt(run_copy, 10)
    # checkpoint flags change nothing in the training, so the finished run is still the uninterrupted reference;
    # a resume keeps the run's cadence (every 10) unless told otherwise: here only the stop saves
    args = [*COMMON, "--keep-last", "2", "--checkpoint-every", "0", "--output-dir", str(run_copy)]
    before = tree(run_copy)
    line = one_error_line(run_here("train.py", *args, "--resume", str(older), "--stop-at-step", "25"))
    assert "step 20" in line and "step 30" in line and "--branch" in line, line
    assert tree(run_copy) == before

    proc = check(run_here("train.py", *args, "--resume", str(older), "--stop-at-step", "25", "--branch"))
    assert "stopped at step 25" in proc.stdout
    abandoned = list((run_copy / "abandoned").glob("*-after-step_10"))
    assert len(abandoned) == 1, names(run_copy / "abandoned")
    assert names(abandoned[0] / "checkpoints") == ["step_00000020", "step_00000030"]
    # the resumed-from checkpoint and the just-saved one both survive --keep-last 2
    assert names(run_copy / "checkpoints") == ["step_00000010", "step_00000025"]
    # the old timeline's log goes with its checkpoints; the run's log holds only the new timeline after step 10
    assert (abandoned[0] / "metrics.jsonl").read_text() == (base / "metrics.jsonl").read_text()
    steps = [m["step"] for m in metrics(run_copy)]
    assert steps == sorted(steps), steps
    assert [m["step"] for m in metrics(run_copy) if m["event"] == "checkpoint"] == [10, 25]

    proc = check(run_here("train.py", *args, "--resume", "auto"))
    assert f"resumed from {ckpt(run_copy, 25)} at step 25" in proc.stdout
    # the LR schedule restored from progress.json (twice) continues exactly: same LR, loss and weights
    assert train_series(run_copy) == train_series(base)
    assert max_abs_diff(weights(base), weights(run_copy)) <= 1e-6


def test_a_checkpoint_copied_under_a_newer_name_is_refused_for_what_it_is(run_copy):
    """step_00000010 copied as step_00000040: its progress.json says step 10. Resuming it named it "at step 10" with
    "newer" checkpoints at steps 10, 20, 30 (a contradiction); --resume auto now names the copy too."""
    shutil.copytree(ckpt(run_copy, 10), run_copy / "checkpoints" / "step_00000040")
    before = tree(run_copy)
    args = [*COMMON, "--output-dir", str(run_copy)]
    for resume in (str(run_copy / "checkpoints" / "step_00000040"), "auto"):
        line = one_error_line(run_here("train.py", *args, "--resume", resume))
        assert "step_00000040 holds step 10 (its progress.json), not step 40: the folder was copied or renamed" in line
        assert "rename it to step_00000010" in line
    assert tree(run_copy) == before


# ---- 4. checkpoints of the previous version ---------------------------------------------------------------------


def test_legacy_checkpoint_with_pickled_scheduler_resumes_exactly(base, tmp_path):
    """Earlier versions kept LambdaLR.state_dict() in custom_checkpoint_0.pkl and no "scheduler" in progress.json."""
    from accel_train.schedule import ScheduleFn

    legacy = tmp_path / "legacy" / "step_00000020"
    shutil.copytree(ckpt(base, 20), legacy)
    progress = json.loads((legacy / "progress.json").read_text())
    state = progress.pop("scheduler")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=state["base_lrs"][0])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, ScheduleFn(1, "constant", 0))
    scheduler.load_state_dict(state)
    torch.save(scheduler.state_dict(), legacy / "custom_checkpoint_0.pkl")
    (legacy / "progress.json").write_text(json.dumps(progress))

    out = tmp_path / "continued"
    proc = check(run_here("train.py", *COMMON, "--resume", str(legacy), "--output-dir", str(out)))
    assert f"resumed from {legacy} at step 20" in proc.stdout
    assert "warning" not in proc.stderr, proc.stderr
    reference = train_series(base)
    continued = train_series(out)
    assert continued and all(continued[k] == reference[k] for k in continued), continued
    assert max_abs_diff(weights(base), weights(out)) <= 1e-6
