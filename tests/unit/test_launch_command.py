"""accel_train/commands/launch.py (the launcher scripts/slurm/train.sbatch runs) checks its config file as the launch
doctor does before accelerate reads it: a file accelerate's launch would crash on (a traceback, exit 1) ends with one
line and exit code 2. The same refusals from a real process: tests/integration/test_slurm.py."""

from __future__ import annotations

import pytest
from checks import raises_user_error
from conftest import REPO

from accel_train.commands import launch

BAD = [
    (None, "missing.yaml", ["file not found", "accelerate_configs/multi_cpu.yaml"]),
    ("- a\n- b\n", "list.yaml", ["must be a mapping of keys"]),
    ("distributed_type: BOGUS\nnum_processes: 1\n", "bogus.yaml", ["'BOGUS' is not a valid DistributedType"]),
    ("distributed_type: NO\nnum_processes: 1\n", "unquoted.yaml", ["distributed_type: 'NO'"]),
    ("distributed_type: MULTI_CPU\nnum_proceses: 2\n", "typo.yaml", ["did you mean 'num_processes'"]),
]


@pytest.mark.parametrize(("text", "name", "needles"), BAD, ids=[b[1] for b in BAD])
def test_a_config_file_accelerate_would_crash_on_is_one_line_and_exit_2(tmp_path, capsys, text, name, needles):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    raises_user_error(lambda: launch.check_config(str(path)), str(path), *needles)
    assert launch.main(["--config_file", str(path), "scripts/train.py", "--max-steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    if text is not None:
        assert "scripts/doctor.py --config_file" in err  # where the whole list is


def test_the_repository_configs_pass(monkeypatch, tmp_path):
    for path in sorted((REPO / "accelerate_configs").glob("*.yaml")):
        launch.check_config(str(path))
    import accelerate.commands.config.config_args as config_args

    monkeypatch.setattr(config_args, "default_config_file", str(tmp_path / "none.yaml"))
    launch.check_config(None)  # no file given and no default file: accelerate's defaults, nothing to check
    (tmp_path / "none.yaml").write_text("- a\n")
    raises_user_error(lambda: launch.check_config(None), "none.yaml", "mapping")  # the default file is checked
