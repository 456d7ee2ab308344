"""The package installs with console scripts, and the scripts are thin and never patch sys.path.

The in-process tests; whole runs and launches are in ../integration/test_packaging_runs.py.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest
from conftest import REPO

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


CONSOLE_SCRIPTS = PYPROJECT["project"]["scripts"]


USER_SCRIPTS = {
    "train.py": "accel-train",
    "eval.py": "accel-evaluate",
    "predict.py": "accel-predict",
    "convert_checkpoint.py": "accel-convert",
    "doctor.py": "accel-doctor",
    "plot_runs.py": "accel-plot-runs",
}


def test_every_console_script_points_at_a_callable():
    assert set(USER_SCRIPTS.values()) <= set(CONSOLE_SCRIPTS)
    for name, target in CONSOLE_SCRIPTS.items():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), name


def test_scripts_are_thin_and_leave_sys_path_alone():
    for script in sorted((REPO / "scripts").glob("*.py")):
        text = script.read_text()
        assert "sys.path" not in text, f"{script.name} patches sys.path"
    for script, console in USER_SCRIPTS.items():
        module = CONSOLE_SCRIPTS[console].partition(":")[0]
        assert f"from {module} import cli_main" in (REPO / "scripts" / script).read_text(), script


def test_no_script_shadows_a_library():
    """``python scripts/X.py`` puts scripts/ first on sys.path: a scripts/evaluate.py would hide ``evaluate``."""
    libraries = {"evaluate", "datasets", "torch", "torchvision", "accelerate", "safetensors", "yaml", "tqdm"}
    assert not {p.stem for p in (REPO / "scripts").glob("*.py")} & libraries


def test_package_files_and_functions_stay_small():
    """No file of accel_train/ over 500 lines, no function over 80 (ruff's C901 limits complexity to 12)."""
    import ast

    big_files, big_functions = set(), set()
    for path in sorted((REPO / "accel_train").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text()
        if text.count("\n") > 500:
            big_files.add(rel)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                big_functions.add(f"{rel}:{node.name}")
    assert not big_files, f"split these files (over 500 lines): {sorted(big_files)}"
    assert not big_functions, f"split these functions (80 lines or more): {sorted(big_functions)}"


def _layers():
    """``scripts/layers.py``: the import graph and its floors (the script that prints the package's layers)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("layers", REPO / "scripts" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("inside_functions", [False, True], ids=["module-level", "counting-imports-in-functions"])
def test_accel_train_has_no_import_cycles(inside_functions):
    """The package's import graph is acyclic, also counting the imports inside functions (kept there to make
    --help and refusals fast, never to hide a circle): every module sits on a floor above what it uses."""
    layers = _layers()
    try:
        layers.floors(layers.import_graph(inside_functions=inside_functions), by_module=True)
    except ValueError as exc:
        pytest.fail(str(exc))


def test_the_cycle_check_sees_a_cycle_through_a_function(tmp_path):
    """The check can fail: a circle closed by an import inside a function is found, one at module level too."""
    layers = _layers()
    pkg = tmp_path / "accel_train"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from accel_train import b\n")
    (pkg / "b.py").write_text("def f():\n    from accel_train.a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from accel_train import a\n")
    lazy = layers.import_graph(pkg, inside_functions=True)
    with pytest.raises(ValueError, match=r"accel_train\.a -> accel_train\.b -> accel_train\.a"):
        layers.floors(lazy, by_module=True)
    assert layers.import_graph(pkg, inside_functions=False)["accel_train.b"] == set()  # only the lazy import
    assert lazy["accel_train.c"] == set()  # type-checking imports never run


#: Who may see the whole run config: the config layer itself (resume reconciles two configs), the run's entry
#: (api, loop, build), the loop that runs it, and the commands. Everything else gets its slice or plain values.
CONFIG_READERS = {"config", "resume", "api", "loop", "build", "trainer", "saved_eval", "photo_defaults"}


#: Who may name ``output_dir``: the config (the flag), the run's entry (which hands it to ``RunDir``, the run
#: folder's owner) and the commands.
OUTPUT_DIR_NAMERS = {"config", "api", "loop", "saved_eval"}


def _package_modules():
    for path in sorted((REPO / "accel_train").rglob("*.py")):
        name = ".".join(path.relative_to(REPO / "accel_train").with_suffix("").parts)
        yield name.removesuffix(".__init__"), path


def _allowed(name: str, allowed: set[str]) -> bool:
    return name in allowed or name.startswith("commands.")


def test_only_the_top_sees_the_whole_config_and_only_the_run_folder_names_its_path():
    """The config is the top of the library, not its hub: no module outside ``CONFIG_READERS`` imports
    ``TrainConfig`` (in a function or for type checking too), and ``output_dir`` (a name, an attribute, a
    keyword) appears only in ``OUTPUT_DIR_NAMERS``; every other part takes a ``RunDir`` or a path it gives."""
    import ast

    readers, namers = [], []
    for name, path in _package_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("config"):
                if any(a.name == "TrainConfig" for a in node.names) and not _allowed(name, CONFIG_READERS):
                    readers.append(f"{name}:{node.lineno}")
            named = (
                (isinstance(node, ast.Name) and node.id == "output_dir")
                or (isinstance(node, ast.Attribute) and node.attr == "output_dir")
                or (isinstance(node, (ast.keyword, ast.arg)) and node.arg == "output_dir")
            )
            if named and not _allowed(name, OUTPUT_DIR_NAMERS):
                namers.append(f"{name}:{node.lineno}")
    assert not readers, f"TrainConfig imported below the top: {readers}; pass the part's slice or plain values"
    assert not namers, f"output_dir named outside the run's entry: {namers}; take a RunDir (run_dir.py)"
    layers = _layers()
    placed = layers.floors(layers.import_graph(), by_module=True)
    below = [m for m in CONFIG_READERS - {"config"} if placed[f"accel_train.{m}"] <= placed["accel_train.config"]]
    assert not below, f"{below} read the whole config but sit on or below its floor"


def test_readme_commands_and_ci_install_through_the_constraints():
    """The README's two set-up commands and .ci/run install through constraints.txt, which pins every package the
    requirements name (but the platform builds it leaves out, named in its header) to one exact version."""
    import re

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    readme = (REPO / "README.md").read_text()
    train = "python3 -m pip install -c constraints.txt -r requirements.txt -e . && python3 scripts/train.py"
    tests = "python3 -m pip install -c constraints.txt -r requirements-dev.txt && python3 -m pytest"
    assert f"```bash\n{train}\n```" in readme and f"```bash\n{tests}\n```" in readme
    assert tests in (REPO / ".ci" / "run").read_text()
    text = (REPO / "constraints.txt").read_text()
    pins = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and re.fullmatch(r"[\w.+!-]+", version), f"not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = version
    left_out = {"torch", "torchvision"}  # platform builds: named in the header instead
    assert all(name in text.split("\n\n")[0] for name in left_out)
    platform = [n for n in pins if n in left_out or n == "triton" or n.startswith(("nvidia-", "cuda-"))]
    assert not platform, f"platform builds pinned (a GPU machine or a CPU wheel would conflict): {platform}"
    for req_file in ("requirements.txt", "requirements-dev.txt"):
        for line in (REPO / req_file).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-"):
                name = canonicalize_name(Requirement(line).name)
                assert name in pins or name in left_out, f"{name} ({req_file}) is not pinned in constraints.txt"
                if name in pins:
                    assert Requirement(line).specifier.contains(pins[name]), f"{name}=={pins[name]} outside {line}"
