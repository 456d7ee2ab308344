"""``--config FILE.yaml`` is safe to read: duplicate keys, alias bombs, huge files and huge values are refused.

All but one case run in-process (``load_yaml_config`` / ``parse_config``); one subprocess proves the
one-line ``error:`` format and exit code 2 for an alias bomb through ``scripts/train.py``.


Whole runs and launches; the in-process tests are in ../unit/test_yaml_safety.py.
"""

from __future__ import annotations

from conftest import run_script
from helpers_yaml_safety import billion_laughs, write


def test_alias_bomb_through_train_script(tmp_path):
    """The real script refuses it in one line. Expanded, the bomb would take gigabytes and far longer than the
    60 s timeout (which is the guard here: start-up time depends on the machine's load, the refusal does not);
    the in-process tests above measure the refusal's time and memory."""
    path = write(tmp_path, billion_laughs(final_key="lr"), "bomb.yaml")
    proc = run_script("train.py", "--config", str(path), "--output-dir", str(tmp_path / "run"), timeout=60)
    out = f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-2000:]}\nSTDERR:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 2, out
    assert "Traceback" not in proc.stderr + proc.stdout, out
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.count("\n") == 1, out
    assert "anchors/aliases expand too far" in errors[0] and str(path) in errors[0], out
    assert not (tmp_path / "run").exists()


def test_yaml_trap_through_the_script_is_one_line(tmp_path):
    from checks import assert_one_line_error
    from conftest import run_here

    path = write(tmp_path, "max_steps: 1:30\n")
    assert_one_line_error(run_here("train.py", "--config", str(path), "--output-dir", str(tmp_path / "r")),
                          "max_steps must be a number")  # fmt: skip
    assert not (tmp_path / "r").exists()
