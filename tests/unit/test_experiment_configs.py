"""configs/*.yaml: the seed experiments as hyperparameter files for ``--config``.

Each file parses to the seed's hyperparameters, and each really trains: two optimizer
steps on synthetic stand-in data of the same shape (1x28x28, 10 classes).


The in-process tests; whole runs and launches are in ../integration/test_experiment_configs_runs.py.
"""

from __future__ import annotations

import pytest
from helpers_experiment_configs import CONFIG_DIR, EXPECTED

from accel_train.config import parse_config


def test_every_config_file_parses():
    names = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))
    assert set(EXPECTED) <= set(names), names
    for name in names:
        assert (CONFIG_DIR / name).read_text().startswith("#"), f"{name}: a comment header says what it is"
        parse_config(["--config", str(CONFIG_DIR / name)])


def test_yaml_exponent_numbers_are_numbers(tmp_path):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; ``--lr 1e-3`` is a float, so the file must agree."""
    path = tmp_path / "exp.yaml"
    path.write_text("lr: 1e-3\nweight_decay: 5e-4\n")
    cfg = parse_config(["--config", str(path)])
    assert cfg.lr == pytest.approx(1e-3) and cfg.weight_decay == pytest.approx(5e-4)
