"""scripts/mutation_check.py (issue 32): its mutant list cannot go stale silently, and its runner judges right.

No mutant of accel_train is run here (the check itself takes tens of minutes): the list is checked against the
code at this commit (each ``old`` snippet exactly once, the mutated file still compiles, the named tests exist,
every promise covered), and the runner is run end to end on a tiny git repository of its own with one mutant
its tests catch, one they do not, and one whose code is gone.


The in-process tests; whole runs and launches are in ../integration/test_mutation_check_runs.py.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
from conftest import REPO
from helpers_mutation import REP, RUN, M


@pytest.mark.parametrize("mutant", M.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_is_planted_exactly_once_and_still_compiles(mutant):
    """A restructuring that moves code makes this fail: update the mutant to where the code went."""
    assert M.stale_reason(REPO, mutant) == ""
    assert mutant.file.startswith("accel_train/") and mutant.new != mutant.old
    source = (REPO / mutant.file).read_text(encoding="utf-8")
    compile(source.replace(mutant.old, mutant.new, 1), mutant.file, "exec")  # a planted bug, not a syntax error


def test_names_are_unique_and_the_list_is_long_enough():
    names = [m.name for m in M.MUTANTS]
    assert len(names) == len(set(names)) >= 20
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", n) for n in names), names


def test_every_promise_has_a_mutant_and_every_mutant_a_promise():
    promises = {m.promise for m in M.MUTANTS}
    assert promises == set(M.PROMISES)
    for promise in ("unwrapping and export", "resume state", "clipping", "retention", "parity"):
        assert promise in promises


def test_every_named_test_exists():
    for mutant in M.MUTANTS:
        assert mutant.tests, mutant.name
        for arg in mutant.tests:
            file, _, function = arg.partition("::")
            assert (REPO / file).is_file(), (mutant.name, arg)
            name = function.split("[")[0]
            if name:
                assert re.search(rf"^def {name}\(", (REPO / file).read_text(), re.M), (mutant.name, arg)


def test_stale_mutants_are_named_with_the_reason(tmp_path):
    (tmp_path / "accel_train").mkdir()
    (tmp_path / "accel_train" / "m.py").write_text("x = 1\nx = 1\n")
    twice = M.Mutant("twice", "p", "accel_train/m.py", "x = 1", "x = 2", ("t",))
    gone = M.Mutant("gone", "p", "accel_train/other.py", "x = 1", "x = 2", ("t",))
    assert "occurs 2 times, not once" in M.stale_reason(tmp_path, twice)
    assert "does not exist" in M.stale_reason(tmp_path, gone)


def test_pytest_runs_sequentially_and_stops_at_the_first_failure():
    cmd = RUN.pytest_cmd(["tests/test_x.py"])
    assert cmd[1:3] == ["-m", "pytest"] and "-x" in cmd and "-rfE" in cmd and cmd[-1] == "tests/test_x.py"
    assert ["-p", "no:cacheprovider"] == cmd[cmd.index("no:cacheprovider") - 1 : cmd.index("no:cacheprovider") + 1]
    if importlib.util.find_spec("xdist") is not None:
        assert cmd[cmd.index("-n") + 1] == "0"  # the suite's conftest would otherwise start 2 workers


OUTPUT = """
F
=========================== short test summary info ============================
FAILED tests/test_a.py::test_one[x-1] - AssertionError: assert 1 == 2
!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!
1 failed in 0.12s
"""


def test_judge_calls_only_a_failing_test_caught():
    m = M.Mutant("m", "p", "accel_train/m.py", "a", "b", ("tests/test_a.py",))
    caught = RUN.judge(m, 1, 3.0, OUTPUT)
    assert (caught.status, caught.by, caught.caught) == ("caught", "tests/test_a.py::test_one[x-1]", True)
    assert RUN.judge(m, 1, 1.0, "ERROR tests/test_a.py::test_two - fixture failed\n").by == "tests/test_a.py::test_two"
    assert RUN.judge(m, 0, 1.0, "1 passed").status == "survived"
    assert RUN.judge(m, None, 600.0, "").status == "timeout"
    for code in (2, 3, 4, 5):  # collection error, internal error, usage error, no tests: not caught
        result = RUN.judge(m, code, 1.0, "ERROR collecting tests/test_a.py\nno tests ran")
        assert result.status == "error" and not result.caught and f"exit {code}" in result.detail


def test_exit_status_and_summary():
    def report(*statuses):
        return {"mutants": [{"status": s} for s in statuses], "total_s": 10.0, "baseline_s": 2.0}

    assert REP.exit_status(report("caught", "caught")) == 0
    assert REP.exit_status(report("caught", "survived")) == 1
    assert REP.exit_status(report("caught", "timeout")) == 1
    assert REP.exit_status(report("caught", "error")) == 1
    assert REP.exit_status(report("caught", "survived", "stale")) == 2
    line = REP.summary_line(report("caught", "survived", "timeout"))
    assert line.startswith("mutation check: 1 of 3 mutants caught (1 survived, 1 timeout)")


def test_baseline_runs_the_union_of_the_tests_once():
    def mutant(*tests):
        return M.Mutant("m", "p", "accel_train/m.py", "a", "b", tests)

    groups = RUN.baseline_groups(
        (mutant("tests/a.py::t1", "tests/b.py"), mutant("tests/a.py::t1", "tests/b.py::t2"), mutant("tests/c.py"))
    )
    assert groups == [["tests/a.py::t1", "tests/b.py", "tests/c.py"]]  # b.py::t2 runs with b.py
    assert RUN.baseline_groups((mutant("tests/a.py", "-k", "x"),)) == [["tests/a.py", "-k", "x"]]
