"""The harness and the tools stay in rooms of their own (issue 26): no file of accel_train/, benchmarks/ or scripts/
over 500 lines, no function of benchmarks/ or scripts/ over 80, and no import circle in benchmarks/ or in the
mutation check's package (scripts/mutation/), also counting the imports inside functions.

Lines are counted as ``tests/unit/test_packaging.py`` counts them for accel_train/ (newlines per file; a function from
its ``def`` line to its last line), and the circles are found with ``scripts/layers.py``'s import graph and floors.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from conftest import REPO

MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def _big_files(folder: Path) -> list[str]:
    return sorted(
        p.relative_to(REPO).as_posix() for p in folder.rglob("*.py") if p.read_text().count("\n") > MAX_FILE_LINES
    )


def _long_functions(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno >= MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(REPO).as_posix()}:{node.name}")
    return found


def _layers_for(package: Path):
    """A private copy of ``scripts/layers.py`` that follows the imports of ``package`` instead of accel_train."""
    spec = importlib.util.spec_from_file_location(f"layers_{package.name}", REPO / "scripts" / "layers.py")
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    layers.PACKAGE = package.name  # the one package whose imports its graph keeps
    return layers


def _circle(package: Path) -> str | None:
    """The first import circle in ``package`` (imports inside functions count, ``if TYPE_CHECKING:`` ones do not)."""
    layers = _layers_for(package)
    try:
        layers.floors(layers.import_graph(package, inside_functions=True), by_module=True)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("folder", ["accel_train", "benchmarks", "scripts"])
def test_no_file_over_500_lines(folder):
    big = _big_files(REPO / folder)
    assert not big, f"split these files (over {MAX_FILE_LINES} lines): {big}"


@pytest.mark.parametrize("folder", ["benchmarks", "scripts"])
def test_no_function_over_80_lines(folder):
    long = _long_functions(REPO / folder)
    assert not long, f"split these functions ({MAX_FUNCTION_LINES} lines or more): {long}"


@pytest.mark.parametrize("package", ["benchmarks", "scripts/mutation"])
def test_no_import_circle(package):
    root = REPO / package
    graph = _layers_for(root).import_graph(root, inside_functions=True)
    assert graph and any(graph.values()), f"the import graph of {package} is empty: layers.py no longer reads it"
    assert _circle(root) is None


def test_the_circle_check_sees_one_closed_inside_a_function(tmp_path):
    """The check can fail: the circle the harness once had (bench <-> speedrun, one side inside a function)."""
    pkg = tmp_path / "benchmarks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bench.py").write_text("from benchmarks.speedrun import run_speedrun\n")
    (pkg / "speedrun.py").write_text("def main():\n    from benchmarks.bench import one_gpu_env\n")
    assert _circle(pkg) == "import circle: benchmarks.bench -> benchmarks.speedrun -> benchmarks.bench"


HARNESS = REPO / "benchmarks"
#: benchmarks/ by purpose (issue 52): the speed benchmark, the data benchmarks, the GPU acceptance, the kill campaign.
PURPOSES = ("data", "gpu_acceptance", "kills", "speed")
#: File-name prefixes that once said a file's purpose; the folder says it now.
PURPOSE_PREFIX = re.compile(r"^(gpu|kill|data|shapes|bench|speed|photos)_")


def test_the_harness_is_a_folder_per_purpose_each_saying_what_its_files_do():
    """benchmarks/ holds one folder per purpose and the helpers they share; no file name carries its purpose as a
    prefix, and each folder's ``__init__`` docstring names every module in it (what it is for, in one place)."""
    top = sorted(p.name for p in HARNESS.iterdir() if p.name != "__pycache__")
    assert top == ["__init__.py", "__main__.py", "common.py", *PURPOSES]
    prefixed = sorted(p.relative_to(REPO).as_posix() for p in HARNESS.rglob("*.py") if PURPOSE_PREFIX.match(p.name))
    assert not prefixed, f"the folder says the purpose: rename {prefixed}"
    for folder in PURPOSES:
        doc = ast.get_docstring(ast.parse((HARNESS / folder / "__init__.py").read_text())) or ""
        unnamed = [p.stem for p in sorted((HARNESS / folder).glob("*.py")) if p.stem != "__init__" and
                   f"``{p.stem}``" not in doc]  # fmt: skip
        assert not unnamed, f"benchmarks/{folder}/__init__.py does not say what these do: {unnamed}"


def test_layers_shows_the_harness_as_its_folders():
    """``scripts/layers.py --package benchmarks``: the folders as rooms, ``__main__`` (the command line) on top."""
    import contextlib
    import io

    layers = _layers_for(HARNESS)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert layers.main(["--package", "benchmarks"]) == 0
    floors = {room: int(k) for k, *rooms in (line.strip().split("  ") for line in out.getvalue().splitlines())
              for room in rooms}  # fmt: skip
    assert set(floors) == {"__main__", "benchmarks (__init__)", "common", *PURPOSES}
    assert floors["__main__"] == max(floors.values()) and floors["common"] == 1


TESTS = REPO / "tests"
#: Names a test file takes after a review round or an issue, not after what it covers.
ROUND_NAMES = re.compile(r"_more\b|polish|user_experience|round|finding|issue_?\d|review")
#: What a unit test never does: train (a run, the Python API ``accel_train.train``, a built Trainer's ``run``),
#: launch, or start a script or processes (tests/integration/ does). ``model.train()`` only sets a mode.
TRAINS = re.compile(
    r"\b(fit|fit_here|fit_small|run_here|run_script|run_on|run_cli|run_bad|launch_cmd|script_cmd|build_trainer)\("
    r"|\btrain\((?!\))|\btrainer\.run\(|\b(spawn|start_processes)\(|Popen\("
    r"|launch_once|subprocess\.|accelerate launch"
)


def test_tests_live_by_what_they_cover():
    """Every test file is in tests/unit/ (in-process, one module's behaviour) or tests/integration/ (whole runs,
    launches, faults), none is named after a review round, and no unit test trains or starts a process."""
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test files outside tests/unit/ and tests/integration/: {loose}"
    files = sorted((TESTS / "unit").glob("test_*.py")) + sorted((TESTS / "integration").glob("test_*.py"))
    assert len(files) > 40
    rounds = [p.name for p in files if ROUND_NAMES.search(p.stem)]
    assert not rounds, f"named after a review round, not the code they test: {rounds}"
    here = Path(__file__).name  # this file names the patterns
    training = [p.name for p in (TESTS / "unit").glob("test_*.py") if p.name != here and TRAINS.search(p.read_text())]
    assert not training, f"unit tests that train or start processes (move them to tests/integration/): {training}"
