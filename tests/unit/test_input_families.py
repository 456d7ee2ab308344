"""Issue 24, item 7: every family of bad input ends in one line, never a traceback.

* Hugging Face datasets (``--dataset hf:PATH``) with unusual columns: no rows, lists or fractions or
  nothing (None/NaN/-1) as labels, None or text as images. Written with the real ``datasets`` library.
* A DataLoader worker's error: one line naming the file and the worker, not torch's "Original Traceback".
* YAML 1.1's surprising numbers in ``--config`` (``010``; ``1:30`` and ``!!binary`` are in test_yaml_safety.py).
* A rank whose peer process was SIGKILLed: one line (exit 4, ``PeerLostError``), the checkpoints kept.

Each bad case asserts the exit code, exactly one ``error:`` line, no "Traceback", and the watched folders
unchanged by hash (``test_bad_inputs.snapshot``).


The in-process tests; whole runs and launches are in ../integration/test_input_families_runs.py.
"""

from __future__ import annotations

import signal
import sys

import numpy as np
import pytest

from accel_train.errors import PeerLostError, UserError, peer_lost


def _images(n: int, size: int = 16) -> list:
    from PIL import Image

    return [Image.fromarray(np.full((size, size, 3), 20 * i % 250, dtype=np.uint8)) for i in range(n)]


def _hf(columns: dict, features: dict | None = None):
    import datasets

    return datasets.Dataset.from_dict(columns, features=datasets.Features(features) if features else None)


def test_hf_label_types_that_are_supported(tmp_path):
    """Strings, whole-number floats, booleans and plain ints are classes (sorted unique values): not refused."""
    from accel_train.data import build_dataset
    from accel_train.data.base import DataConfig

    labels = {
        "strings": (["dog", "cat", "bird"], ["bird", "cat", "dog"]),
        "whole-floats": ([2.0, 0.0, 1.0], ["0.0", "1.0", "2.0"]),
        "bools": ([True, False, True], ["False", "True"]),
        "ints": ([7, -1, 3], ["-1", "3", "7"]),
    }
    for kind, (values, classes) in labels.items():
        path = tmp_path / kind
        _hf({"image": _images(12), "label": [values[i % len(values)] for i in range(12)]}).save_to_disk(str(path))
        splits = build_dataset(DataConfig(dataset=f"hf:{path}", val_split=0.5))
        assert splits.info.class_names == classes, kind
        assert sorted({int(y) for _, y in splits.train}) == list(range(len(classes))), kind


def test_worker_error_is_unwrapped_to_its_own_line():
    """torch re-raises a worker's exception as ``type(exc)("Caught ... Original Traceback ...")``."""
    import pickle

    from torch._utils import ExceptionWrapper

    try:
        raise UserError("cannot decode image x.png: broken data stream; remove or replace it")
    except UserError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 1")
    with pytest.raises(UserError) as info:
        wrapped.reraise()
    expected = "cannot decode image x.png: broken data stream; remove or replace it (in DataLoader worker process 1)"
    assert str(info.value) == expected
    assert str(pickle.loads(pickle.dumps(info.value))) == expected
    assert str(UserError("Caught nothing: a plain message\nOriginal Traceback")) == (
        "Caught nothing: a plain message\nOriginal Traceback"
    )


@pytest.mark.parametrize(("text", "expected"), [("epochs: 010\n", 10), ("seed: -010\n", -10), ("seed: 0x1f\n", 31)])
def test_yaml_leading_zero_ints_are_decimal(tmp_path, text, expected):
    """YAML 1.1 reads 010 as the octal 8; --epochs 010 (and YAML 1.2) read 10. A config file reads 10 too."""
    from accel_train.config import TrainConfig
    from accel_train.config_yaml import load_yaml_config

    path = tmp_path / "hp.yaml"
    path.write_text(text)
    assert list(load_yaml_config(path, TrainConfig).values()) == [expected]


GLOO_RESET = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:18649: Connection reset by "
    "peer. This is typically caused by a remote worker hanging or bugs in the application."
)


def test_peer_lost_is_recognised_only_for_a_collective_of_several_processes():
    lost = peer_lost(RuntimeError(GLOO_RESET), rank=0, world_size=2)
    assert isinstance(lost, PeerLostError) and lost.exit_code == 4
    assert "(rank 1) died or lost its connection (Connection reset by peer)" in str(lost)
    assert "--resume auto" in str(lost) and "\n" not in str(lost)
    assert "fix what that process's own error line names" in str(lost)  # a bad input fails the resume again
    assert "one of its other 3 processes" in str(peer_lost(RuntimeError(GLOO_RESET), rank=2, world_size=4))
    assert peer_lost(RuntimeError(GLOO_RESET), rank=0, world_size=1) is None  # one process: no peer to lose
    assert peer_lost(RuntimeError("shape mismatch"), rank=0, world_size=2) is None  # a bug keeps its traceback
    assert peer_lost(ValueError(GLOO_RESET), rank=0, world_size=2) is None
    try:
        try:
            raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:5")
        except RuntimeError as inner:
            raise KeyError("while saving") from inner
    except KeyError as outer:
        assert "(rank 0)" in str(peer_lost(outer, rank=1, world_size=2))


def test_run_main_prints_one_line_for_a_lost_peer(monkeypatch, capsys):
    from accel_train import runtime
    from accel_train.cli import run_main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(runtime, "finish_process", lambda code: sys.exit(code))  # not os._exit in pytest

    def main(argv):
        raise RuntimeError(GLOO_RESET)

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as info:
            run_main(main, [])
        # leaving with exit 4: the launcher's SIGTERM for the same lost peer must not turn it into -15 (issue 31)
        assert signal.getsignal(signal.SIGTERM) == signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    err = capsys.readouterr().err
    assert info.value.code == 4, err
    assert err.count("\n") == 1 and err.startswith("[rank 1] error: another process of this run (rank 0) died"), err


def test_a_ranks_error_line_is_one_write(monkeypatch):
    """The ranks of a run share stderr: a line written as two pieces (print's text, then its newline) had the other
    rank's line between them, and a test reading one line per rank saw one (CI, a 2-process refusal)."""
    from accel_train import runtime
    from accel_train.cli import run_main
    from accel_train.errors import UserError

    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)
            return len(text)

        def flush(self):
            pass

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(runtime, "finish_process", lambda code: sys.exit(code))
    monkeypatch.setattr(sys, "stderr", Recorder())

    def main(argv):
        raise UserError("the data changed")

    with pytest.raises(SystemExit) as info:
        run_main(main, [])
    assert info.value.code == 2
    assert [w for w in writes if w] == ["[rank 1] error: the data changed\n"], writes
