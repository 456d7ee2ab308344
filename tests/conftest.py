"""Shared helpers: run the real scripts in subprocesses and read what they wrote.

GPUs are hidden from every test that is not marked ``gpu`` or ``multigpu`` (see
``pytest_runtest_protocol``), so the CPU suite gives the same results on a GPU workstation as on
the CPU-only CI: ``python scripts/train.py`` would otherwise land on ``cuda:0`` and be compared with
CPU runs at 1e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

# Two xdist workers share the cores, each running torch with as many threads as cores (and launching children
# that do the same). Idle OpenMP threads then spin on cores the other worker needs: measured here (one run
# each), the suite took 9:53 with the default wait policy and 7:53 with threads that sleep. Set before torch
# is imported in this process; children inherit it (``child_env``). It changes how threads wait, not results.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A run without --threads leaves out the cores other work keeps busy (accel_train/cpu_load.py), and the suite keeps
# both cores busy: its runs choose as on an idle machine instead, so no result depends on the machine's load (runs
# compared with each other take the same threads). tests/unit/test_cpu_load.py tests the choice with fake loads.
os.environ.setdefault("ACCEL_TRAIN_BUSY_CORES", "0")
# Image-folder indexes are cached (accel_train/data/index_cache.py): the suite's go to a folder of its own, never
# to the user's ~/.cache; children inherit it.
if "ACCEL_TRAIN_CACHE" not in os.environ:
    import tempfile

    os.environ["ACCEL_TRAIN_CACHE"] = tempfile.mkdtemp(prefix="accel-train-cache-")

# A folder of photos without --model fetches ImageNet weights when it can (photo_defaults.py): the suite never
# downloads; the tests of that choice set it themselves.
os.environ.setdefault("ACCEL_TRAIN_OFFLINE", "1")

import pytest

from accel_train.doctor.launching import child_env, script_cmd

# Fixtures of tests/helpers_*.py that test files in both tests/unit/ and tests/integration/ use.
pytest_plugins = ("helpers_plots",)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"
# Small and fast, but the real loop: used by most end-to-end tests.
FAST = ["--report-to", "none", "--no-plots", "--no-progress"]


GPU_MARKERS = ("gpu", "multigpu")
# What a non-GPU test's children see as CUDA_VISIBLE_DEVICES. An entry that is not a device index hides
# every GPU from CUDA and from torch (both stop reading the list at the first invalid entry), like Slurm's
# "NoDevFiles". Not "" or "-1": accel_train reads those as "GPUs hidden on purpose" and then skips its
# "this machine has no CUDA device" warning, which CPU-only tests check for.
HIDDEN_GPUS = "NoDevFiles"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child run's environment: this process's, through ``child_env`` (so without GPUs unless GPU-marked)."""
    return child_env(extra)


def launch_cmd(script: str, *args: str, config: str | None = None, launch_args: tuple[str, ...] = ()) -> list[str]:
    return script_cmd(script, *args, config=config, launch_args=launch_args)


def run_script(
    script: str,
    *args: str,
    config: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    launch_args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """``python scripts/<script> args`` or, with ``config``, ``accelerate launch --config_file``."""
    cmd = launch_cmd(script, *args, config=config, launch_args=launch_args)
    return subprocess.run(cmd, cwd=REPO, env=_env(env), capture_output=True, text=True, timeout=timeout)


# scripts/<name> -> the accel_train.commands module whose ``main`` it runs
COMMANDS = {
    "train.py": "train",
    "eval.py": "evaluate",
    "predict.py": "predict",
    "convert_checkpoint.py": "convert",
    "doctor.py": "doctor",
    "plot_runs.py": "plot_runs",
}


def run_here(script: str, *args: str) -> subprocess.CompletedProcess:
    """``run_script(script, *args)`` without a new process: the script's ``main`` through ``cli.run_main``.

    The same one-line errors, exit codes and output as the script, without the ~5 s of imports (torch,
    torch._dynamo, evaluate) every new Python process pays. For tests about what the command does; tests about
    the process itself (signals, launchers, environment variables, what gets imported) keep ``run_script``.
    """
    import importlib
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO

    from accel_train.cli import run_main

    main = importlib.import_module(f"accel_train.commands.{COMMANDS[script]}").main
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            run_main(main, list(args))
            code = 0  # run_main always exits; kept for a main that returns
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess([script, *args], code, out.getvalue(), err.getvalue())


def run_on(config: str | None, script: str, *args: str) -> subprocess.CompletedProcess:
    """``script args`` on a setup: in this process (``run_here``) for one plain process, launched under
    ``accelerate launch --config_file config`` otherwise."""
    return run_script(script, *args, config=config) if config else run_here(script, *args)


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    )
    return proc


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


def weights(run_dir: Path, sub: str = "model") -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(run_dir) / sub / "model.safetensors"))


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


# The in-process runs: config -> build -> Trainer in the test process, about a second each.
SMALL_RUN = [
    "--dataset", "synthetic", "--synthetic-size", "256", "--synthetic-test-size", "64",
    "--synthetic-image-size", "16", "--model", "lenet", "--batch-size", "16",
    "--report-to", "none", "--no-plots", "--no-progress", "--log-every", "1",
]  # fmt: skip


def fit_here(*args: str) -> dict:
    """``loop.fit`` on these command-line flags, in this process: what scripts/train.py runs, without the ~5 s
    of imports a new process pays (``run_here`` also gives the script's exit code and output)."""
    from accel_train.config import parse_config
    from accel_train.loop import fit

    return fit(parse_config(list(args)))


def fit_small(out: Path, *args: str) -> dict:
    """``fit_here`` on SMALL_RUN (later flags win) into ``out``; with another ``--dataset``, without SMALL_RUN's
    synthetic-data flags (flags that do not apply to a dataset are refused)."""
    base = SMALL_RUN
    if "--dataset" in args:
        drop = {i for i, a in enumerate(SMALL_RUN) if a in ("--dataset",) or a.startswith("--synthetic-")}
        base = [a for i, a in enumerate(SMALL_RUN) if i not in drop and i - 1 not in drop]
    return fit_here(*base, "--output-dir", str(out), *args)


def copy_run(run: Path, tmp_path: Path) -> Path:
    import shutil

    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


@pytest.fixture(scope="session")
def launch_once(tmp_path_factory):
    """``launch_once(config, *args, launch_args=())``: ``accelerate launch`` of train.py, run once per session
    for each (config file contents, launch flags, args) and shared by every test that asks for the same run.

    Returns ``(run folder, the checked CompletedProcess)``. Tests only read what it wrote.
    """
    done: dict[tuple, tuple[Path, subprocess.CompletedProcess]] = {}

    def launch(config: str | Path, *args: str, launch_args: tuple[str, ...] = ()):
        path = Path(config) if Path(config).is_absolute() else CONFIGS / config
        key = (path.read_text(), tuple(launch_args), args)
        if key not in done:
            out = tmp_path_factory.mktemp("launched") / "run"
            cmd = ("train.py", *args, "--output-dir", str(out))
            done[key] = (out, check(run_script(*cmd, config=str(path), launch_args=launch_args)))
        return done[key]

    return launch


@pytest.fixture
def repo() -> Path:
    return REPO


# The suite's own parallelism: most of a test's time is a child process importing torch (one core busy, one
# idle), so two pytest-xdist workers use a 2-core machine fully. Tests that share a run (a module- or
# session-scoped fixture) go to one worker together, so the run is made once (see ``shared_run_groups``); the
# rest are handed out one by one. Choose otherwise with -n N, or -p no:xdist for one process.
WORKERS = 2


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Run on ``WORKERS`` xdist workers when pytest-xdist is installed and no -n was given."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return None
    if config.getoption("numprocesses", None) is None and not config.getoption("collectonly"):
        config.option.numprocesses = WORKERS
        if config.getoption("dist") == "no":
            config.option.dist = "loadgroup"
    return None


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown (and unused) without xdist
def pytest_configure_node(node):
    """(xdist, on the controller) Tell each worker the distribution mode: a worker reads --dist from the
    command line, which does not hold the mode ``pytest_cmdline_main`` chose, and groups only under loadgroup."""
    node.workerinput["accel_train_loadgroup"] = node.config.getvalue("dist") == "loadgroup"


def pytest_configure(config):
    if getattr(config, "workerinput", {}).get("accel_train_loadgroup"):
        config.option.loadgroup = True  # what xdist sets from --dist loadgroup: honour the xdist_group marks


def _shared_fixtures(item: pytest.Item) -> list:
    """This suite's module- and session-scoped fixtures that ``item`` uses, directly or through others."""
    defs = [d for ds in item._fixtureinfo.name2fixturedefs.values() for d in ds]
    here = Path(__file__).resolve().parent
    return [
        d for d in defs if d.scope in ("module", "session") and Path(d.func.__code__.co_filename).is_relative_to(here)
    ]


def shared_run_groups(items: list[pytest.Item]) -> dict[str, str]:
    """``nodeid -> xdist group`` for the tests that share a run (a module- or session-scoped fixture): tests
    linked through any chain of shared fixtures get one group, so each shared run is made once, on one worker."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    keys = {item.nodeid: [f"{d.baseid}::{d.argname}" for d in _shared_fixtures(item)] for item in items}
    for linked in keys.values():
        for key in linked[1:]:
            parent[root(key)] = root(linked[0])
    return {nodeid: root(linked[0]) for nodeid, linked in keys.items() if linked}


def wants_gpu(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in GPU_MARKERS)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks on each worker
def pytest_collection_modifyitems(config, items):
    """Real-GPU tests skip on machines without enough CUDA devices (CI has none).

    The count is taken here, before any test runs and so before ``hide_gpus`` patches anything.
    """
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    groups = shared_run_groups(items) if getattr(config.option, "loadgroup", False) else {}  # on xdist workers
    for item in items:
        if item.nodeid in groups:
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs at least 2 CUDA GPUs"))


def hide_gpus(mp: pytest.MonkeyPatch) -> None:
    """Make this process and every child it starts see no GPU.

    Children: ``CUDA_VISIBLE_DEVICES`` in ``os.environ``, which ``child_env`` copies (an explicit
    ``env={"CUDA_VISIBLE_DEVICES": ...}`` still wins). This process: CUDA may already be initialised
    (the device count above), after which the variable changes nothing, so ``torch.cuda``'s answers
    are patched too; accelerate asks the same functions when it picks the device of an in-process
    ``Accelerator``.
    """
    import torch

    mp.setenv("CUDA_VISIBLE_DEVICES", HIDDEN_GPUS)
    mp.setattr(torch.cuda, "is_available", lambda: False)
    mp.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Hide GPUs for the whole protocol of a non-GPU test: setup, call and teardown.

    A hook rather than an autouse fixture, because module-scoped fixtures (they start the expensive
    runs) are set up before any function-scoped fixture and must not see a GPU either. (An
    old-style hookwrapper: the GPU machines may have an older pytest.)
    """
    if wants_gpu(item):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        hide_gpus(mp)
        yield


@pytest.fixture(autouse=True)
def _collector_left_as_it_was():
    """``cli.run_main`` in this process (``run_here``, the doctor's smoke run...) marks it a one-command process,
    whose heavy imports freeze the heap (``accel_train/heap.py``): right for a command's own process, a leak in
    pytest's, where each test's garbage would be frozen with it. After each test the mark is taken back and what
    was frozen becomes collectable again."""
    import gc

    from accel_train import heap

    yield
    heap._ONE_COMMAND = False
    gc.unfreeze()
