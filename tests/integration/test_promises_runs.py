"""Promises that a plausible one-line bug would break silently (issue 32): each test here fails when its promise does.

Planted by hand before these tests existed, none of these bugs failed the default suite: clipping switched off,
the best checkpoint chosen in reverse, exports keeping ``_orig_mod.``/``module.`` prefixes, every rank writing the
run files, retention keeping one checkpoint too many between saves after a resume, and a mid-epoch resume under
gradient accumulation. ``scripts/mutation_check.py`` plants them (and more) again and checks that they fail here.


Whole runs and launches; the in-process tests are in ../unit/test_promises.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from conftest import FAST, REPO, _env, check, fit_small, max_abs_diff, metrics, run_script, summary, weights

from accel_train.trainer import Trainer

PREFIXES = ("module.", "_orig_mod.")


def _grad_norm(model: torch.nn.Module) -> float:
    grads = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0


@pytest.fixture
def step_grad_norms(monkeypatch) -> list[float]:
    """The total gradient norm each optimizer step is about to apply (after clipping), in order."""
    norms: list[float] = []
    step = Trainer._scaled_step

    def spy(self):
        if self.acc.sync_gradients:  # the optimizer steps only here under gradient accumulation
            norms.append(_grad_norm(self.model))
        return step(self)

    monkeypatch.setattr(Trainer, "_scaled_step", spy)
    return norms


@pytest.mark.parametrize("accumulate", [False, True])
def test_clipping_bounds_the_gradient_norm_at_every_optimizer_step(tmp_path, step_grad_norms, accumulate):
    batch = ["--global-batch-size", "32", "--max-device-batch", "16"] if accumulate else []  # 2 micro-batches
    s = fit_small(tmp_path / "clip", "--max-steps", "6", "--max-grad-norm", "1e-3", *batch)
    assert s["accum_steps"] == (2 if accumulate else 1)
    assert len(step_grad_norms) == 6
    assert all(n <= 1e-3 * (1 + 1e-4) for n in step_grad_norms), step_grad_norms
    # clipped to the norm (the direction kept), not switched off and not clamped element-wise
    assert all(n >= 1e-3 * (1 - 1e-4) for n in step_grad_norms), step_grad_norms


def test_max_grad_norm_zero_really_does_not_clip(tmp_path, step_grad_norms):
    fit_small(tmp_path / "off", "--max-steps", "6", "--max-grad-norm", "0")
    assert len(step_grad_norms) == 6
    assert min(step_grad_norms) > 1e-2, step_grad_norms  # lenet's raw gradients: ~0.1..1 on this data


def test_best_step_is_the_best_eval_and_best_holds_its_weights(tmp_path):
    out = tmp_path / "run"
    every = ["--eval-every", "2", "--checkpoint-every", "2", "--keep-last", "100"]
    s = fit_small(out, "--max-steps", "16", "--lr", "0.01", *every)
    evals = [(m["eval_accuracy"], m["step"]) for m in metrics(out) if m["event"] == "eval"]
    assert len(evals) >= 8
    best_accuracy = max(a for a, _ in evals)
    best_step = next(step for a, step in evals if a == best_accuracy)  # the first to reach it
    assert evals[0][1] != best_step, "a run whose first evaluation is its best cannot tell the order apart"
    assert s["best_step"] == best_step and s["best_eval_accuracy"] == best_accuracy, (s, evals)
    at_best = weights(out, f"checkpoints/step_{best_step:08d}")  # what the model held at that step
    assert max_abs_diff(weights(out, "best"), at_best) == 0.0
    assert max_abs_diff(weights(out, "model"), weights(out, "best")) > 0  # the final model moved on


def test_the_loss_is_a_mean_so_accumulation_changes_nothing(tmp_path):
    """One micro-batch of 32 against two of 16 accumulated, with plain SGD and no clipping (which would rescale
    a summed loss's gradients back): the same update. A summed loss would double it."""
    args = ["--optimizer", "sgd", "--lr", "0.05", "--max-grad-norm", "0", "--global-batch-size", "32"]
    one = fit_small(tmp_path / "one", *args, "--max-steps", "6")
    two = fit_small(tmp_path / "two", *args, "--max-steps", "6", "--max-device-batch", "16")
    assert (one["accum_steps"], two["accum_steps"]) == (1, 2)
    assert max_abs_diff(weights(tmp_path / "one"), weights(tmp_path / "two")) <= 1e-6  # round-off only
    assert abs(one["eval_loss"] - two["eval_loss"]) <= 1e-5


def test_retention_after_a_resume_keeps_exactly_keep_last_after_every_save(tmp_path, monkeypatch):
    out = tmp_path / "run"
    kept: list[list[int]] = []
    checkpoint = Trainer.checkpoint

    def spy(self):
        saves = self.saves
        checkpoint(self)
        if self.saves > saves:  # a call at the position just saved writes nothing
            kept.append(sorted(int(p.name[5:]) for p in (out / "checkpoints").glob("step_*")))

    monkeypatch.setattr(Trainer, "checkpoint", spy)
    every = ["--max-steps", "14", "--checkpoint-every", "2", "--keep-last", "2"]
    fit_small(out, *every, "--stop-at-step", "6")
    assert kept[-1] == [4, 6]
    kept.clear()
    fit_small(out, *every, "--resume", "auto")
    assert kept == [[6, 8], [8, 10], [10, 12], [12, 14]], kept


def test_mid_epoch_resume_with_gradient_accumulation_is_bit_identical(tmp_path):
    args = ["--global-batch-size", "32", "--max-device-batch", "16", "--max-steps", "12", "--lr-schedule", "cosine"]
    straight = fit_small(tmp_path / "straight", *args)
    assert straight["accum_steps"] == 2
    fit_small(tmp_path / "resumed", *args, "--stop-at-step", "3")  # mid-epoch (8 steps each), 6 micro-batches in
    resumed = fit_small(tmp_path / "resumed", *args, "--resume", "auto")
    assert resumed["global_step"] == 12 and resumed["samples_seen"] == straight["samples_seen"]
    assert max_abs_diff(weights(tmp_path / "straight"), weights(tmp_path / "resumed")) == 0.0


TWO_RANKS = [
    "--model", "mnist_cnn", "--image-size", "12", "--batch-size", "16", "--log-every", "1", *FAST,
    "--max-steps", "30", "--global-batch-size", "16", "--optimizer", "sgd", "--lr", "0.05",
    "--checkpoint-every", "10", "--eval-every", "10",
]  # fmt: skip


# what a non-main rank may do under the run folder: accelerate's save_state creates the checkpoint folder on
# every rank (exist_ok), and each rank writes its own RNG state into it (natively, unseen by the audit)
RANK_MAY = re.compile(r"os\.mkdir .*/checkpoints/\.tmp-step_\d{8}$")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """2 gloo ranks straight through, and stopped at step 13 then resumed; rank 1's writes audited in both."""
    root = tmp_path_factory.mktemp("two_ranks")
    audit = {
        # its sitecustomize.py installs the audit hook; added to the runs' own path (the repository first), not
        # in place of it: a copy of the repository (scripts/mutation_check.py) must still import its own package
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "write_audit"), _env()["PYTHONPATH"]]),
        "ACCEL_TRAIN_AUDIT_ROOT": str(root / "runs"),
        "ACCEL_TRAIN_AUDIT_LOG": str(root / "audit"),
    }
    straight, resumed = root / "runs" / "straight", root / "runs" / "resumed"
    launch = ("train.py", *TWO_RANKS)
    check(run_script(*launch, "--output-dir", str(straight), config="multi_cpu.yaml", env=audit))
    check(run_script(*launch, "--stop-at-step", "13", "--output-dir", str(resumed), config="multi_cpu.yaml", env=audit))
    proc = check(
        run_script(*launch, "--resume", "auto", "--output-dir", str(resumed), config="multi_cpu.yaml", env=audit)
    )
    assert "resumed from" in proc.stdout
    return straight, resumed, root / "audit.rank1"


def _evals(run: Path) -> list[dict]:
    """The eval records without the measured times."""
    return [{k: v for k, v in m.items() if not k.endswith("time_s")} for m in metrics(run) if m["event"] == "eval"]


def test_two_process_resume_is_bit_identical(two_ranks):
    """A resume reproduces the straight run's arithmetic exactly at the same layout (2 ranks, 1 thread each).

    Against 1 process the weights differ by round-off, and that is the thread count, not the resume: on an
    AVX2-only EPYC, 30 SGD steps of this run end 2.87e-6 apart between 1 process with 2 threads and 1 with 1
    thread, 3e-8 apart between 1 process and 2 ranks at 1 thread each, and 0.0 apart between the 2-rank straight
    and resumed runs (measured). tests/integration/test_resume.py checks 1 against 2 processes at a tolerance.
    """
    straight, resumed, _ = two_ranks
    assert summary(resumed)["world_size"] == 2 and summary(resumed)["global_step"] == 30
    assert max_abs_diff(weights(straight), weights(resumed)) == 0.0
    assert max_abs_diff(weights(straight, "best"), weights(resumed, "best")) == 0.0
    assert _evals(straight) == _evals(resumed) != []  # the same evaluations at the same steps


def test_only_rank_0_writes_the_run_files(two_ranks):
    *_, audit = two_ranks
    events = audit.read_text().splitlines()
    assert events, "rank 1 recorded nothing: the audit hook did not run, so this test could not fail"
    assert any(RANK_MAY.match(e) for e in events)  # what rank 1 does do, seen
    assert [e for e in events if not RANK_MAY.match(e)] == []


def test_ddp_exports_load_without_prefix_with_plain_safetensors(two_ranks):
    from safetensors.torch import load_file

    straight, resumed, _ = two_ranks
    for run in (straight, resumed):
        for sub in ("model", "best"):
            keys = load_file(str(run / sub / "model.safetensors")).keys()
            assert keys and not any(k.startswith(PREFIXES) for k in keys), (run, sub, sorted(keys)[:3])


def test_a_caller_compiled_model_checkpoints_without_prefix_and_resumes(tmp_path):
    """accelerate saves what the caller passed: a model compiled before ``train`` reaches the checkpoint hook
    as ``OptimizedModule``, whose keys carry ``_orig_mod.``; the checkpoint stays unwrapped and resumes."""
    from safetensors.torch import load_file
    from torch.utils.data import TensorDataset

    import accel_train
    from accel_train.models import create_model

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.rand(64, 1, 16, 16, generator=g), torch.arange(64) % 4)
    options = {"max_steps": 4, "batch_size": 16, "report_to": "none", "plots": False, "progress": False}
    out = str(tmp_path / "run")

    def compiled():
        return torch.compile(create_model("lenet", num_classes=4, in_channels=1, image_size=16), backend="eager")

    accel_train.train(compiled(), data, data, output_dir=out, stop_at_step=2, **options)
    saved = load_file(str(tmp_path / "run" / "checkpoints" / "step_00000002" / "model.safetensors"))
    assert saved and not any(k.startswith(PREFIXES) for k in saved), sorted(saved)[:3]
    resumed = accel_train.train(compiled(), data, data, output_dir=out, resume="auto", **options)
    assert resumed["global_step"] == 4
