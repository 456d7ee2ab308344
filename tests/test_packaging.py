"""The package installs with console scripts, and the scripts are thin and never patch sys.path."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

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


def _installed() -> bool:
    try:
        importlib.metadata.distribution("accel_train")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH: only what is installed can be imported."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


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


@pytest.mark.skipif(not _installed(), reason="accel_train is not installed (pip install -e .)")
def test_installed_console_script_and_script_run_from_anywhere(tmp_path):
    bin_dir = Path(sysconfig.get_path("scripts"))
    console = bin_dir / "accel-evaluate"
    if not console.exists():
        pytest.skip(f"console scripts are not in {bin_dir}")
    out = subprocess.run([str(console), "--help"], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True)
    assert out.returncode == 0 and "--weights" in out.stdout, out.stderr
    # benchmark.py runs the harness (benchmarks/, not installed) from any folder, without PYTHONPATH
    for script, needle in (("eval.py", "--weights"), ("benchmark.py", "--speedrun")):
        out = subprocess.run(
            [sys.executable, str(REPO / "scripts" / script), "--help"],
            cwd=tmp_path,
            env=_clean_env(),
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0 and needle in out.stdout, (script, out.stderr)


def test_training_imports_no_harness():
    """A training run imports neither the benchmark, the doctor, nor the launch helpers of tests and tools."""
    code = (
        "import sys, accel_train.loop, accel_train.commands.train; "
        "print([m for m in sys.modules if m.startswith(('benchmarks', 'accel_train.doctor', 'accel_train.launch'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


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


def test_ruff_holds_the_package_to_its_limits():
    """``ruff check`` (pyproject.toml: complexity <= 12, <= 50 statements per function, style) passes on the code."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (requirements-dev.txt installs it)")
    cmd = [ruff, "check", "accel_train", "scripts", "benchmarks"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def _module_imports(path: Path, module: str, inside_functions: bool = False) -> set[str]:
    """accel_train modules that ``module`` imports when it is imported (module level, not under TYPE_CHECKING);
    ``inside_functions``: also those its functions import when they run."""
    import ast

    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("accel_train"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                if base.startswith("accel_train"):
                    found.add(base)
                    found.update(f"{base}.{a.name}" for a in node.names)
            elif inside_functions:
                visit(list(ast.iter_child_nodes(node)))

    visit(tree.body)
    return found


def _import_graph(inside_functions: bool) -> dict[str, set[str]]:
    root = REPO / "accel_train"
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return {
        name: {m for m in _module_imports(path, name, inside_functions) if m in modules and m != name}
        for name, path in modules.items()
    }


def _first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := dfs(name)):
            return found
    return None


@pytest.mark.parametrize("inside_functions", [False, True], ids=["module-level", "counting-imports-in-functions"])
def test_accel_train_has_no_import_cycles(inside_functions):
    """The package's import graph is acyclic, also counting the imports inside functions (kept there to make
    --help and refusals fast, never to hide a circle): every module sits on a floor above what it uses."""
    cycle = _first_cycle(_import_graph(inside_functions))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_a_cycle_through_a_function():
    """The check can fail: a circle closed by an import inside a function is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _first_cycle(graph) == ["a", "b", "c", "a"]
    assert _first_cycle({"a": {"b"}, "b": set()}) is None


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
