"""``accel_train/fsio.py``: files written whole (atomically), with the modes the umask gives."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

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


@pytest.mark.parametrize("writer", ["text", "json", "export"])
def test_atomic_writes_are_synced_before_the_rename(tmp_path, monkeypatch, writer):
    """The temporary is written, closed and fsynced before it is renamed into place: otherwise a crash of the
    machine can leave summary.json (config.yaml, a checkpoint's progress.json, an export) empty under its name.
    The calls are recorded in order, the synced file's content read at the moment of the fsync."""
    from accel_train import fsio

    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        calls.append(("fsync", path, Path(path).read_text(encoding="utf-8")))
        real_fsync(fd)

    def replace(src, dst, **kwargs):
        calls.append(("replace", os.path.realpath(src), os.path.realpath(dst)))
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "summary.json"
    target.write_text("old")
    if writer == "text":
        fsio.write_text_atomic(target, "new text")
        expected = "new text"
    elif writer == "export":  # what weight exports, ONNX files and eval.py's report are written with
        fsio.atomic_write(target, lambda tmp: Path(tmp).write_text("exported", encoding="utf-8"))
        expected = "exported"
    else:
        fsio.write_json_atomic(target, {"a": 1})
        expected = json.dumps({"a": 1}, indent=2)
    assert [c[0] for c in calls] == ["fsync", "replace"], calls
    (_, synced, content), (_, src, dst) = calls
    assert synced == src and dst == os.path.realpath(target)  # the temporary, then renamed onto the target
    assert content == expected  # the whole text was in the file (flushed) when it was synced
    assert target.read_text() == expected
