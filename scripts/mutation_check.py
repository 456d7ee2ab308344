#!/usr/bin/env python
"""Mutation check (issue 32): plant small plausible bugs in the code that carries the project's promises, one at a
time, and check that the default tests catch each of them.

    python3 scripts/mutation_check.py                       # every mutant: a table and a summary line
    python3 scripts/mutation_check.py --json > mutation.json
    python3 scripts/mutation_check.py --list                # the mutants (and whether any is stale); runs nothing
    python3 scripts/mutation_check.py --only clipping-switched-off best-chosen-in-reverse --timeout 300

Why: a green suite says the tests pass, not that they would fail on a broken promise. Before the tests of
tests/test_promises.py existed, clipping switched off, the best checkpoint chosen in reverse or exports keeping
``module.`` prefixes all passed the default suite. Each mutant below is one such bug; a mutant the tests do not
catch is a promise nothing checks.

How: the tracked and untracked-not-ignored files of the working tree (so uncommitted work is checked too) are
copied into a temporary folder; there, each mutant replaces its ``old`` snippet (which must occur exactly once
in its file, else the mutant is "stale": the code moved and the list must follow) with ``new``, runs
``python3 -m pytest -x -q -p no:cacheprovider -rfE -n 0 <its tests>`` with the copy first on PYTHONPATH (the
tests' child processes inherit it: ``accel_train.launch.child_env`` keeps PYTHONPATH), and puts the file back.
First the union of all the mutants' tests runs once unmutated (the baseline): a mutant "caught" by a test that
already fails means nothing, so a failing baseline stops the check.

Results: "caught" (pytest exit 1: a test failed), "survived" (exit 0), "timeout" (over --timeout; not caught),
"error" (exit 2-5: collection or usage error, no tests; not caught), "stale" (not run). A mutant whose
``equivalent`` field argues that it cannot change behaviour is listed but not run.

Exit status: 0 every mutant run was caught; 1 a mutant survived, timed out or errored; 2 the check itself cannot
be trusted (a stale mutant, a failing baseline, the copy importing another accel_train, bad arguments).
Standard library only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "accel_train"
DEFAULT_TIMEOUT = 600.0
DEFAULT_BASELINE_TIMEOUT = 3600.0
#: The promises every mutant list must cover (tests/test_mutation_check.py checks each has a mutant).
PROMISES = (
    "unwrapping and export",
    "resume state",
    "data order",
    "global batch and accumulation",
    "distributed evaluation",
    "main-process writes",
    "run-folder replacement",
    "safe loading",
    "schedule",
    "clipping",
    "best and early stopping",
    "retention",
    "parity",
)


class CheckError(Exception):
    """The check cannot run or cannot be trusted (exit 2); the message is one line that says what to do."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug: ``old`` (exactly once in ``file``, a path from the repository root) becomes ``new``.

    ``tests``: pytest arguments (node ids or files, cheapest first: ``-x`` stops at the first failure) that
    should fail. ``equivalent``: a non-empty argument that the mutant cannot change behaviour; it is then listed
    but not run.
    """

    name: str
    promise: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    equivalent: str = ""


@dataclass
class Result:
    name: str
    promise: str
    status: str  # caught | survived | timeout | error | stale
    by: str | None = None
    seconds: float = 0.0
    detail: str = ""
    file: str = ""
    tests: list[str] = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return self.status == "caught"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "promise": self.promise,
            "caught": self.caught,
            "by": self.by,
            "seconds": round(self.seconds, 1),
            "status": self.status,
            "detail": self.detail,
        }


def _m(name: str, promise: str, file: str, old: str, new: str, *tests: str, equivalent: str = "") -> Mutant:
    return Mutant(name, promise, f"{PACKAGE}/{file}", old, new, tuple(tests), equivalent)


T_PROMISES = "tests/test_promises.py"
# fmt: off
MUTANTS: tuple[Mutant, ...] = (
    # ---- unwrapping and export -------------------------------------------------------------------------------------
    _m("export-keeps-wrapper-prefix", "unwrapping and export", "checkpoint/weights.py",
       "    sd, _ = _strip_uniform(dict(sd))\n", "    sd = dict(sd)\n",
       f"{T_PROMISES}::test_a_compiled_models_export_has_no_wrapper_prefix"),
    _m("reader-keeps-wrapper-prefix", "unwrapping and export", "checkpoint/read.py",
       "    sd, prefixes = _strip_uniform(raw)\n", "    sd, prefixes = dict(raw), []\n",
       "tests/test_weights.py::test_prefixes_reported_in_order"),
    # matters where accelerate's save_state sees a wrapper: DataParallel (rt.prepare_model wraps before accelerate)
    # and a model the caller compiled (accel_train.train(torch.compile(m))); under DDP it saves the inner module
    _m("checkpoint-keeps-wrapper-prefix", "unwrapping and export", "checkpoint/state.py",
       "weights[i] = {strip_key(k): v for k, v in sd.items()}", "weights[i] = dict(sd)",
       "tests/test_promises.py::test_a_caller_compiled_model_checkpoints_without_prefix_and_resumes"),
    _m("strip-key-strips-one-prefix", "unwrapping and export", "checkpoint/keys.py",
       "    while key.startswith(WRAPPER_PREFIXES):", "    if key.startswith(WRAPPER_PREFIXES):",
       "tests/test_runtime.py::test_data_parallel_wrapper_uses_every_visible_gpu_and_checkpoints_stay_unwrapped"),
    # ---- resume state ----------------------------------------------------------------------------------------------
    _m("scheduler-not-restored", "resume state", "checkpoint/state.py",
       "    if scheduler is not None:\n        _restore_scheduler(",
       "    if scheduler is None:\n        _restore_scheduler(",
       "tests/test_trainer.py::test_stop_at_step_then_resume_logs_what_an_uninterrupted_run_logs",
       "tests/test_resume.py::test_exact_resume_one_process_is_bitwise"),
    _m("log-window-not-restored", "resume state", "build.py",
       'window.restore(state.extra.get("log_window"), acc.is_main_process)',
       "window.restore(None, acc.is_main_process)",
       "tests/test_trainer.py::test_stop_at_step_then_resume_logs_what_an_uninterrupted_run_logs"),
    _m("early-stop-counter-not-restored", "resume state", "features/__init__.py",
       'self.early.restore(extra.get("early_stop"), str(checkpoint))', "self.early.restore(None, str(checkpoint))",
       "tests/test_features.py::test_early_stopping_stops_cleanly_and_resumes_to_the_same_step"),
    # ---- data order ------------------------------------------------------------------------------------------------
    _m("sampler-ignores-epoch", "data order", "data/pipeline.py",
       "manual_seed(self.seed * 100_003 + self.epoch)", "manual_seed(self.seed * 100_003)",
       "tests/test_runtime.py::test_sampler_order_depends_on_seed_and_epoch_only"),
    _m("loader-epoch-not-set", "data order", "trainer.py",
       "        self.train_dl.set_epoch(state.epoch)\n        loader = self.train_dl\n",
       "        loader = self.train_dl\n",
       "tests/test_resume.py::test_exact_resume_one_process_is_bitwise"),
    _m("resume-skips-steps-not-micro-batches", "data order", "trainer.py",
       "state.step_in_epoch * self.plan.accum_steps)", "state.step_in_epoch)",
       f"{T_PROMISES}::test_mid_epoch_resume_with_gradient_accumulation_is_bit_identical"),
    # ---- global batch and accumulation -----------------------------------------------------------------------------
    _m("global-batch-ignores-accumulation", "global batch and accumulation", "data/pipeline.py",
       "BatchPlan(batch_size * world_size * grad_accum_steps, batch_size,",
       "BatchPlan(batch_size * world_size, batch_size,",
       "tests/test_runtime.py::test_batch_plans"),
    # 12 per process under a cap of 5: ceil gives 3 x 4, the floor 2 x 6, a micro-batch over the cap (a GPU OOM)
    _m("accumulation-steps-rounded-down", "global batch and accumulation", "data/pipeline.py",
       "accum = math.ceil(per_process / cap)", "accum = per_process // cap",
       "tests/test_runtime.py::test_batch_plans"),
    _m("accelerator-accumulation-not-set", "global batch and accumulation", "build.py",
       "    acc.gradient_accumulation_steps = plan.accum_steps\n", "    acc.gradient_accumulation_steps = 1\n",
       f"{T_PROMISES}::test_mid_epoch_resume_with_gradient_accumulation_is_bit_identical",
       "tests/test_data_e2e.py::test_global_batch_gives_the_same_weights_on_every_setup"),
    _m("samples-seen-counts-micro-batches", "global batch and accumulation", "trainer.py",
       "state.samples_seen += self.plan.global_batch", "state.samples_seen += self.plan.micro_batch",
       "tests/test_trainer.py::test_step_accounting_with_accumulation_and_checkpoint_cadence"),
    # ---- distributed evaluation ------------------------------------------------------------------------------------
    _m("eval-counts-padded-samples", "distributed evaluation", "evaluation.py",
       "acc.gather_for_metrics((preds, labels, losses))", "acc.gather((preds, labels, losses))",
       "tests/test_train_e2e.py::test_parity_one_process_vs_two_and_exact_eval"),
    # eval_loss becomes about eval_loss / batch size, and depends on the eval batch and the number of processes
    _m("eval-loss-averages-batch-means", "distributed evaluation", "evaluation.py",
       "loss_sum += losses.double().sum()", "loss_sum += losses.double().mean()",
       "tests/test_promises.py::test_eval_loss_is_the_mean_over_samples_with_uneven_batches"),
    # ---- main-process writes ---------------------------------------------------------------------------------------
    _m("export-on-every-rank", "main-process writes", "trainer.py",
       '        if self.rt.is_main:\n            export_weights(state_dict, out_dir, self.meta["model_config"])\n',
       '        export_weights(state_dict, out_dir, self.meta["model_config"])\n',
       f"{T_PROMISES}::test_only_rank_0_writes_the_run_files"),
    _m("summary-on-every-rank", "main-process writes", "trainer.py",
       '        if rt.is_main:\n            self._write_results(summary, final["confusion"])\n',
       '        self._write_results(summary, final["confusion"])\n',
       f"{T_PROMISES}::test_only_rank_0_writes_the_run_files"),
    # ---- run-folder replacement ------------------------------------------------------------------------------------
    _m("overwrite-discards-before-first-checkpoint", "run-folder replacement", "run_dir.py",
       "                self._stage()\n", "                self._stage()\n                self.commit_replace()\n",
       "tests/test_run_folder.py::test_overwrite_that_fails_leaves_the_previous_run_intact"),
    _m("overwrite-never-discards", "run-folder replacement", "run_dir.py",
       "        if not self.staged:\n            return\n", "        if self.staged:\n            return\n",
       "tests/test_run_folder.py::test_overwrite_removes_exactly_what_a_run_wrote"),
    _m("overwrite-takes-a-foreign-folder", "run-folder replacement", "run_dir.py",
       "if present and not self.holds_run():", "if present and not overwrite and not self.holds_run():",
       "tests/test_run_folder.py::test_roots_home_and_foreign_folders_are_refused"),
    # ---- safe loading ----------------------------------------------------------------------------------------------
    _m("weights-reader-unpickles-code", "safe loading", "checkpoint/read.py",
       'return torch.load(path, map_location="cpu", weights_only=True)',
       'return torch.load(path, map_location="cpu", weights_only=False)',
       "tests/test_weights.py::test_malicious_pickle_is_refused_and_never_runs"),
    _m("checkpoint-verify-unpickles-code", "safe loading", "checkpoint/verify.py",
       'torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)',
       'torch.load(source, map_location="cpu", weights_only=False, mmap=mmap)',
       "tests/test_checkpoint_integrity.py::test_malicious_state_file_is_refused"),
    _m("checkpoint-verify-accepts-unknown-files", "safe loading", "checkpoint/verify.py",
       "if not entry.is_file() or not _KNOWN_FILE.match(entry.name):",
       "if not entry.is_file() and not _KNOWN_FILE.match(entry.name):",
       "tests/test_checkpoint_integrity.py::test_unknown_entry_in_checkpoint_is_refused"),
    # PyYAML's full loader runs `!!python/object/apply:os.system [...]` while constructing the document
    _m("yaml-config-full-loader", "safe loading", "config_yaml.py",
       'base = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader',
       'base = getattr(yaml, "CLoader", None) or yaml.Loader',
       "tests/test_yaml_safety.py", "tests/test_input_families.py::test_yaml_surprises_for_text_fields_are_one_line"),
    # ---- schedule --------------------------------------------------------------------------------------------------
    _m("cosine-half-period", "schedule", "schedule.py",
       "math.cos(math.pi * progress)", "math.cos(0.5 * math.pi * progress)",
       "tests/test_runtime.py::test_lr_schedule_is_a_pure_function_of_the_step"),
    _m("warmup-starts-a-step-late", "schedule", "schedule.py",
       "(1.0 - warmup_from) * (step + 1) / warmup_steps", "(1.0 - warmup_from) * step / warmup_steps",
       "tests/test_runtime.py::test_lr_schedule_is_a_pure_function_of_the_step"),
    # after a warm-up the LR drops at once to the value warmup_steps later (test_airbench derives its expected LRs
    # from lr_factor itself, so it moves with the mutant)
    _m("decay-counts-warmup-steps", "schedule", "schedule.py",
       "progress = min(1.0, (step - warmup_steps) / span)", "progress = min(1.0, step / span)",
       "tests/test_runtime.py::test_lr_schedule_is_a_pure_function_of_the_step",
       "tests/test_airbench.py::test_the_recipe_trains_with_its_settings"),
    # ---- clipping --------------------------------------------------------------------------------------------------
    _m("clipping-switched-off", "clipping", "trainer.py",
       "cfg.max_grad_norm > 0", "cfg.max_grad_norm < 0",
       f"{T_PROMISES}::test_clipping_bounds_the_gradient_norm_at_every_optimizer_step"),
    _m("clipping-by-value", "clipping", "trainer.py",
       "acc.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)",
       "acc.clip_grad_value_(model.parameters(), cfg.max_grad_norm)",
       f"{T_PROMISES}::test_clipping_bounds_the_gradient_norm_at_every_optimizer_step"),
    _m("max-grad-norm-zero-clips", "clipping", "trainer.py",
       "cfg.max_grad_norm > 0", "cfg.max_grad_norm >= 0",
       f"{T_PROMISES}::test_max_grad_norm_zero_really_does_not_clip"),
    # ---- best and early stopping -----------------------------------------------------------------------------------
    _m("best-chosen-in-reverse", "best and early stopping", "trainer.py",
       'result["eval_accuracy"] > state.best_metric', 'result["eval_accuracy"] < state.best_metric',
       f"{T_PROMISES}::test_best_step_is_the_best_eval_and_best_holds_its_weights"),
    _m("early-stop-patience-off-by-one", "best and early stopping", "features/early_stop.py",
       "if self.bad_evals < self.patience:", "if self.bad_evals <= self.patience:",
       "tests/test_features.py::test_early_stopping_counts_each_step_once_and_refuses_a_corrupt_state",
       "tests/test_features.py::test_early_stopping_stops_cleanly_and_resumes_to_the_same_step"),
    _m("early-stop-ignores-min-delta", "best and early stopping", "features/early_stop.py",
       "accuracy > self.best + self.min_delta", "accuracy > self.best",
       "tests/test_features.py::test_early_stopping_stops_cleanly_and_resumes_to_the_same_step",
       "tests/test_features.py::test_early_stopping_counts_each_step_once_and_refuses_a_corrupt_state"),
    # ---- retention -------------------------------------------------------------------------------------------------
    _m("keep-last-keeps-one-more", "retention", "checkpoint/state.py",
       "ckpts[: max(0, len(ckpts) - keep_last)]", "ckpts[: max(0, len(ckpts) - keep_last - 1)]",
       "tests/test_resume.py::test_checkpoint_naming_after_resume_and_keep_last"),
    _m("resumed-checkpoint-protected-one-save-longer", "retention", "trainer.py",
       "self.saves + 1 < cfg.keep_last", "self.saves < cfg.keep_last",
       f"{T_PROMISES}::test_retention_after_a_resume_keeps_exactly_keep_last_after_every_save"),
    # ---- parity (same global batch, same weights on any number of processes) ---------------------------------------
    _m("global-batch-not-split-across-processes", "parity", "data/pipeline.py",
       "per_process = global_batch_size // world_size", "per_process = global_batch_size",
       "tests/test_runtime.py::test_batch_plans"),
    # 1 x 32 sums 32 losses, 2 x 16 sums 16 per rank and DDP averages the ranks: gradients half as large (hidden by
    # clipping, which rescales both to --max-grad-norm, and by Adam, which is scale-invariant)
    _m("loss-summed-not-averaged", "parity", "features/__init__.py",
       "return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)",
       'return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing, reduction="sum")',
       "tests/test_promises.py::test_the_loss_is_a_mean_so_accumulation_changes_nothing"),
    _m("dropout-keyed-on-batch-position", "parity", "features/dropout.py",
       "keyed_bits(self.keys.seed, self.keys.epoch, indices, per_sample,",
       "keyed_bits(self.keys.seed, self.keys.epoch, torch.arange(x.shape[0], device=x.device), per_sample,",
       "tests/test_features.py::test_keyed_dropout_masks_follow_the_sample_not_the_batch"),
)
# fmt: on


# ---- the mutant list -------------------------------------------------------------------------------------------------
def load_mutants(path: Path) -> tuple[Mutant, ...]:
    """Mutants from a JSON list of objects with the fields of :class:`Mutant` (``file`` from the repository root)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        mutants = tuple(Mutant(**{**item, "tests": tuple(item["tests"])}) for item in data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckError(
            f"--mutants {path}: {exc}; pass a JSON list of {{name, promise, file, old, new, tests}}"
        ) from None
    return mutants


def occurrences(repo: Path, mutant: Mutant) -> int:
    """How often ``mutant.old`` occurs in its file (-1: no such file)."""
    path = repo / mutant.file
    if not path.is_file():
        return -1
    return path.read_text(encoding="utf-8").count(mutant.old)


def stale_reason(repo: Path, mutant: Mutant) -> str:
    """Why the mutant cannot be planted at this commit ("" when its snippet occurs exactly once)."""
    found = occurrences(repo, mutant)
    if found == 1:
        return ""
    where = "its file does not exist" if found < 0 else f"its old snippet occurs {found} times, not once"
    return f"{mutant.file}: {where}; update the mutant in scripts/mutation_check.py to where the code moved"


def select(mutants: tuple[Mutant, ...], only: list[str] | None) -> tuple[Mutant, ...]:
    names = [m.name for m in mutants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CheckError(f"mutant names must be unique: {', '.join(duplicates)}; rename one")
    if not only:
        return mutants
    unknown = [n for n in only if n not in names]
    if unknown:
        raise CheckError(f"unknown mutant {', '.join(unknown)}; --list shows the names")
    return tuple(m for m in mutants if m.name in only)


# ---- the private copy ------------------------------------------------------------------------------------------------
def working_tree_files(repo: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files of ``repo``'s working tree (uncommitted work included)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CheckError(f"cannot list the files of {repo} with git ({exc}); run it in a git checkout") from None
    return sorted({name for name in os.fsdecode(out).split("\0") if name})


def make_copy(repo: Path, dest: Path, files: list[str]) -> None:
    """Copy ``files`` (relative to ``repo``) into ``dest``; files deleted in the working tree stay deleted."""
    for name in files:
        src, dst = repo / name, dest / name
        if not os.path.lexists(src) or src.is_dir():
            continue  # deleted but still tracked, or a submodule
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def child_env(copy: Path, repo: Path) -> dict[str, str]:
    """This environment with the copy first on PYTHONPATH, nothing of ``repo`` on it, and no bytecode written.

    No .pyc: a mutant and the original of the same size written within one second would share a cached one.
    No PYTEST_* variables: an outer pytest's (PYTEST_ADDOPTS, xdist's worker ids) would change how the runs go.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not _inside(Path(p), repo)]
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *keep])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


_PROBE = (
    "import importlib.util, json, subprocess, sys\n"
    f'child = "import importlib.util; print(importlib.util.find_spec({PACKAGE!r}).origin)"\n'
    f"here = importlib.util.find_spec({PACKAGE!r}).origin\n"
    "there = subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip()\n"
    "print(json.dumps([here, there]))\n"
)


def check_isolation(copy: Path, repo: Path) -> None:
    """The copy's package is what a run there imports, in its own process and in a child it starts.

    The checkout may be installed in editable mode (a finder that maps the package to ``repo``); it comes after
    PYTHONPATH on the import path, which this proves instead of assuming.
    """
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=copy, env=child_env(copy, repo), capture_output=True, text=True
    )
    try:
        origins = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " ".join(proc.stderr.split())[-300:]
        raise CheckError(
            f"cannot import {PACKAGE} in the copy {copy}: {tail}; check that the copy is complete"
        ) from None
    wrong = [o for o in origins if not o or not _inside(Path(o), copy)]
    if wrong:
        raise CheckError(
            f"the copy {copy} imports {PACKAGE} from {wrong[0]}, not from the copy: a mutant there would "
            "test other code; remove what puts that path before PYTHONPATH (a .pth file or PYTHONHOME)"
        )


# ---- running pytest --------------------------------------------------------------------------------------------------
def pytest_cmd(tests: list[str]) -> list[str]:
    """Sequential (xdist's ``-n 0``), deterministic (no random order), stop at the first failure, list failures."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "0"]
    if importlib.util.find_spec("pytest_randomly") is not None:
        cmd += ["-p", "no:randomly"]
    return [*cmd, *tests]


_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


def run_pytest(copy: Path, repo: Path, tests: list[str], timeout: float, log: Path) -> tuple[int | None, float, str]:
    """``(exit code or None on timeout, seconds, output)`` of pytest on ``tests`` in ``copy``.

    pytest runs in its own session so that a timeout ends it with every process it started (the tests launch
    ``accelerate launch`` ranks); its output goes to ``log`` (a pipe could be held open by a stray grandchild).
    """
    basetemp = log.with_suffix(".tmp")
    shutil.rmtree(basetemp, ignore_errors=True)
    cmd = [*pytest_cmd(tests), f"--basetemp={basetemp}"]
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd, cwd=copy, env=child_env(copy, repo), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            code = None
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
    seconds = time.perf_counter() - start
    shutil.rmtree(basetemp, ignore_errors=True)
    return code, seconds, log.read_text(encoding="utf-8", errors="replace")


def _kill(proc: subprocess.Popen) -> None:
    """End ``proc``'s whole process group (it leads its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def kill_running() -> None:
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _kill(proc)


_OUTCOME = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$")


def first_failure(output: str) -> str | None:
    """The node id of the first FAILED line of pytest's short summary (``-rfE``), else of the first ERROR line."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        match = _OUTCOME.match(line.strip())
        if match and match.group(1) not in found:
            found[match.group(1)] = match.group(2).strip()
    return found.get("FAILED") or found.get("ERROR")


def _tail(output: str, lines: int = 3) -> str:
    kept = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-400:]


def judge(mutant: Mutant, code: int | None, seconds: float, output: str) -> Result:
    """What a run of ``mutant``'s tests says: exit 1 (a test failed) is the only "caught"."""
    result = Result(mutant.name, mutant.promise, "error", seconds=seconds, file=mutant.file, tests=list(mutant.tests))
    if code is None:
        result.status, result.detail = "timeout", f"its tests ran past {seconds:.0f} s"
    elif code == 1:
        result.status, result.by = "caught", first_failure(output)
    elif code == 0:
        result.status, result.detail = "survived", "its tests pass with the bug planted"
    else:
        result.detail = f"pytest exit {code}: {_tail(output)}"
    return result


def plant(copy: Path, mutant: Mutant) -> bytes:
    """Replace ``old`` by ``new`` in the copy; returns the file's original bytes for :func:`restore`."""
    path = copy / mutant.file
    original = path.read_bytes()
    text = original.decode("utf-8")
    path.write_bytes(text.replace(mutant.old, mutant.new, 1).encode("utf-8"))
    return original


def restore(copy: Path, mutant: Mutant, original: bytes) -> None:
    (copy / mutant.file).write_bytes(original)


# ---- the check -------------------------------------------------------------------------------------------------------
def baseline_groups(mutants: tuple[Mutant, ...]) -> list[list[str]]:
    """The union of the mutants' tests as pytest invocations: plain node ids and files together (a node id inside
    a file that runs whole is dropped), each selection that carries options (``-k ...``) on its own."""
    plain: list[str] = []
    with_options: list[list[str]] = []
    for mutant in mutants:
        if any(arg.startswith("-") for arg in mutant.tests):
            if list(mutant.tests) not in with_options:
                with_options.append(list(mutant.tests))
            continue
        plain += [t for t in mutant.tests if t not in plain]
    whole = {t for t in plain if "::" not in t}
    plain = [t for t in plain if "::" not in t or t.split("::")[0] not in whole]
    return ([plain] if plain else []) + with_options


def run_baseline(copy: Path, repo: Path, mutants: tuple[Mutant, ...], timeout: float, logs: Path) -> float:
    """Run the union of the tests unmutated; a failure ends the check (exit 2) with one line."""
    total = 0.0
    for i, tests in enumerate(baseline_groups(mutants)):
        code, seconds, output = run_pytest(copy, repo, tests, timeout, logs / f"baseline-{i}.log")
        total += seconds
        if code != 0:
            what = "ran past the baseline timeout" if code is None else f"fails (pytest exit {code})"
            failed = first_failure(output) or _tail(output, 1)
            raise BaselineError(
                f"the baseline {what} without any mutant: {failed}; fix the suite first (a mutant 'caught' by a "
                f"failing test means nothing), or raise --baseline-timeout"
            )
    return total


class BaselineError(CheckError):
    """The unmutated tests fail: no mutant result could be trusted."""


def run_check(
    repo: Path, mutants: tuple[Mutant, ...], timeout: float, baseline_timeout: float, jobs: int, logs: Path | None
) -> dict[str, Any]:
    """Baseline, then each mutant in a private copy; returns the report (see ``--json``)."""
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="mutation-check-"))
    try:
        log_dir = logs or work / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        files = working_tree_files(repo)
        copies: queue.Queue[Path] = queue.Queue()
        for i in range(max(1, jobs)):
            copy = work / f"copy-{i}"
            make_copy(repo, copy, files)
            copies.put(copy)
        first = work / "copy-0"
        check_isolation(first, repo)
        stale = {m.name: stale_reason(first, m) for m in mutants}
        to_run = [m for m in mutants if not stale[m.name] and not m.equivalent]
        _progress(f"baseline: {sum(len(g) for g in baseline_groups(tuple(to_run)))} test selections, unmutated")
        baseline_s = run_baseline(first, repo, tuple(to_run), baseline_timeout, log_dir) if to_run else 0.0
        _progress(f"baseline passed in {baseline_s:.0f} s")
        done: list[str] = []

        def one(mutant: Mutant) -> Result:
            copy = copies.get()
            try:
                original = plant(copy, mutant)
                try:
                    log = log_dir / f"{mutant.name}.log"
                    code, seconds, output = run_pytest(copy, repo, list(mutant.tests), timeout, log)
                finally:
                    restore(copy, mutant, original)
            finally:
                copies.put(copy)
            result = judge(mutant, code, seconds, output)
            with _RUNNING_LOCK:
                done.append(mutant.name)
                _progress(
                    f"[{len(done)}/{len(to_run)}] {mutant.name}: {result.status} {result.by or ''} ({seconds:.0f} s)"
                )
            return result

        ran = {r.name: r for r in run_all(one, to_run, jobs)}
        results = []
        for m in mutants:
            if stale[m.name]:
                results.append(
                    Result(m.name, m.promise, "stale", detail=stale[m.name], file=m.file, tests=list(m.tests))
                )
            elif m.name in ran:
                results.append(ran[m.name])
        return {
            "mutants": [r.to_json() for r in results],
            "equivalent": [
                {"name": m.name, "promise": m.promise, "why": m.equivalent} for m in mutants if m.equivalent
            ],
            "baseline_s": round(baseline_s, 1),
            "total_s": round(time.perf_counter() - start, 1),
            "timeout_s": timeout,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_all(one, mutants: list[Mutant], jobs: int) -> list[Result]:
    """``one(mutant)`` for each mutant, ``jobs`` at a time. An interruption (Ctrl-C, SIGTERM) cancels the mutants
    not started and ends the pytest runs under way, instead of waiting for them."""
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = [pool.submit(one, m) for m in mutants]
        results = [f.result() for f in futures]
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        kill_running()
        raise
    pool.shutdown()
    return results


def _progress(line: str) -> None:
    print(f"mutation check: {line}", file=sys.stderr, flush=True)


def exit_status(report: dict[str, Any]) -> int:
    statuses = [m["status"] for m in report["mutants"]]
    if "stale" in statuses:
        return 2
    return 0 if all(s == "caught" for s in statuses) else 1


def summary_line(report: dict[str, Any]) -> str:
    statuses = [m["status"] for m in report["mutants"]]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("survived", "timeout", "error", "stale") if s in statuses)
    return (
        f"mutation check: {statuses.count('caught')} of {len(statuses)} mutants caught"
        + (f" ({counts})" if counts else "")
        + f" in {report['total_s']:.0f} s (baseline {report['baseline_s']:.0f} s)"
    )


def table(report: dict[str, Any]) -> str:
    rows = [("mutant", "promise", "result", "seconds", "caught by / why not")]
    for m in report["mutants"]:
        rows.append((m["name"], m["promise"], m["status"], f"{m['seconds']:.0f}", m["by"] or m["detail"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(c.ljust(w) if i != 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False)))
        for r in rows
    ]
    lines = [f"{line}  {r[4]}" for line, r in zip(lines, rows, strict=True)]
    for e in report.get("equivalent", []):
        lines.append(f"{e['name']}  (not run: argued equivalent: {e['why']})")
    return "\n".join(lines)


def list_mutants(repo: Path, mutants: tuple[Mutant, ...], as_json: bool) -> int:
    """``--list``: the mutants and whether each is stale at this commit; exit 2 if any is."""
    entries = []
    for m in mutants:
        entry = {k: v for k, v in asdict(m).items() if k not in ("old", "new")}
        entry["tests"] = list(m.tests)
        entry["stale"] = stale_reason(repo, m) or None
        entries.append(entry)
    if as_json:
        print(json.dumps({"mutants": entries}, indent=2))
    else:
        for e in entries:
            mark = f"  STALE: {e['stale']}" if e["stale"] else ""
            mark += "  (argued equivalent: not run)" if e["equivalent"] else ""
            print(f"{e['name']}  [{e['promise']}]  {e['file']}  -> {' '.join(e['tests'])}{mark}")
        print(f"{len(entries)} mutants")
    return 2 if any(e["stale"] for e in entries) else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON (progress goes to stderr)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    p.add_argument("--list", action="store_true", help="list the mutants and check they are not stale; run nothing")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per mutant (default %(default)g)")
    p.add_argument(
        "--baseline-timeout", type=float, default=DEFAULT_BASELINE_TIMEOUT, help="seconds for the unmutated run"
    )
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)")
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout to copy (default: this script's)")
    p.add_argument("--mutants", type=Path, help="a JSON list of mutants to use instead of the built-in list")
    p.add_argument("--logs", type=Path, help="keep each pytest run's output in this folder")
    args = p.parse_args(argv)
    if args.timeout <= 0 or args.baseline_timeout <= 0 or args.jobs < 1:
        p.error("--timeout and --baseline-timeout must be > 0 and --jobs >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repo = args.repo.resolve()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        mutants = select(load_mutants(args.mutants) if args.mutants else MUTANTS, args.only)
        if args.list:
            return list_mutants(repo, mutants, args.json)
        report = run_check(repo, mutants, args.timeout, args.baseline_timeout, args.jobs, args.logs)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(exc), "mutants": []}))
        return 2
    finally:
        kill_running()
    if args.json:
        print(json.dumps(report, indent=2))
        print(summary_line(report), file=sys.stderr)
    else:
        print(table(report))
        print(summary_line(report))
    return exit_status(report)


if __name__ == "__main__":
    sys.exit(main())
