"""scripts/mutation_check.py (issue 32): its mutant list cannot go stale silently, and its runner judges right.

No mutant of accel_train is run here (the check itself takes tens of minutes): the list is checked against the
code at this commit (each ``old`` snippet exactly once, the mutated file still compiles, the named tests exist,
every promise covered), and the runner is run end to end on a tiny git repository of its own with one mutant
its tests catch, one they do not, and one whose code is gone.


Whole runs and launches; the in-process tests are in ../unit/test_mutation_check.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO
from helpers_mutation import SCRIPT, M


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_list_prints_every_mutant_and_runs_nothing():
    proc = _run("--list", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)["mutants"]
    assert [m["name"] for m in listed] == [m.name for m in M.MUTANTS]
    assert all(m["stale"] is None and m["tests"] and m["file"] and m["promise"] for m in listed)
    text = _run("--list")
    assert text.returncode == 0 and all(m.name in text.stdout for m in M.MUTANTS)


def test_an_unknown_name_is_one_line_and_exit_2():
    proc = _run("--only", "no-such-mutant")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--list shows the names" in proc.stderr


TINY_TEST = """
from accel_train.calc import add


def test_add():
    assert add(2, 3) == 5
"""


def _tiny_repo(root: Path, test: str = TINY_TEST) -> Path:
    (root / "accel_train").mkdir(parents=True)
    (root / "accel_train" / "__init__.py").write_text("")
    (root / "accel_train" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(textwrap.dedent(test))
    subprocess.run(["git", "init", "-q", str(root)], check=True)  # the copy is made from git's file list
    return root


def _mutants(path: Path, *mutants: tuple[str, str, str]) -> Path:
    common = {"promise": "sums", "file": "accel_train/calc.py", "tests": ["tests/test_calc.py"]}
    items = [{"name": n, "old": o, "new": w, **common} for n, o, w in mutants]
    path.write_text(json.dumps(items))
    return path


def test_runner_end_to_end_caught_survived_and_stale(tmp_path):
    """In a private copy (the tiny repo's file is never touched), with the copy's package imported, not ours."""
    repo = _tiny_repo(tmp_path / "tiny")
    listed = _mutants(
        tmp_path / "mutants.json",
        ("minus", "return a + b", "return a - b"),  # the test catches it
        ("swapped", "return a + b", "return b + a"),  # equivalent: nothing can catch it
        ("gone", "return a * b", "return a / b"),  # the code is not there: stale
    )
    proc = _run("--repo", str(repo), "--mutants", str(listed), "--json", "--timeout", "120")
    assert proc.returncode == 2, proc.stderr  # a stale mutant: the list needs fixing
    report = json.loads(proc.stdout)
    by_name = {m["name"]: m for m in report["mutants"]}
    assert list(by_name) == ["minus", "swapped", "gone"]
    assert by_name["minus"]["caught"] is True and by_name["minus"]["by"] == "tests/test_calc.py::test_add"
    assert by_name["swapped"]["caught"] is False and by_name["swapped"]["by"] is None
    assert by_name["swapped"]["status"] == "survived"
    assert by_name["gone"]["caught"] is False and by_name["gone"]["status"] == "stale"
    assert all(set(m) >= {"name", "promise", "caught", "by", "seconds"} for m in report["mutants"])
    assert report["baseline_s"] > 0 and report["total_s"] >= report["baseline_s"]
    assert (repo / "accel_train" / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert "mutation check: 1 of 3 mutants caught (1 survived, 1 stale)" in proc.stderr


def test_a_failing_baseline_stops_the_check_in_one_line(tmp_path):
    repo = _tiny_repo(tmp_path / "tiny", TINY_TEST.replace("== 5", "== 6"))
    listed = _mutants(tmp_path / "mutants.json", ("minus", "return a + b", "return a - b"))
    proc = _run("--repo", str(repo), "--mutants", str(listed), "--timeout", "120")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the baseline fails" in errors[0] and "tests/test_calc.py::test_add" in errors[0]
    assert "mutants caught" not in proc.stdout  # no mutant was run
