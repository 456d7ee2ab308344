"""``accel_train/fsio.py``: files written whole (atomically), with the modes the umask gives."""

from __future__ import annotations

import os
import stat

import pytest


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_atomic_writes_and_exports_follow_the_umask(tmp_path, umask):
    from accel_train.checkpoint.weights import export_weights
    from accel_train.fsio import write_json_atomic
    from accel_train.models import create_model

    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "summary.json", {"a": 1})
        export_weights(create_model("lenet").state_dict(), tmp_path / "model", {"model": "lenet"})
    finally:
        os.umask(old)
    for path in (
        tmp_path / "summary.json",
        tmp_path / "model" / "model.safetensors",
        tmp_path / "model" / "config.json",
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
