"""Issue 29, start-up: a run imports nothing before its first step that the step does not use.

``evaluate`` (with ``datasets``, ``scipy.stats``, ``pandas``), ``matplotlib`` and ``datasets`` for an in-memory
dataset cost seconds each. A run on in-memory data never imports ``evaluate`` and its stack at all (its
evaluations count accuracy on the tensors), and imports matplotlib where its plots need it, after the last step.
Checked in a real ``scripts/train.py`` process that records ``sys.modules`` when ``Trainer.step`` is first
called and again when the run ends."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, _env

from accel_train import install_check

NEVER = ("evaluate", "datasets", "scipy", "pandas", "pyarrow")
LATER = (*NEVER, "matplotlib")

_RECORDER = """
import json, runpy, sys
import accel_train.trainer as T
seen = {}
step = T.Trainer.step
def first_step(self, *a, **k):
    seen.setdefault("first_step", sorted(sys.modules))
    return step(self, *a, **k)
T.Trainer.step = first_step
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    seen["end"] = sorted(sys.modules)
    open(OUT, "w").write(json.dumps(seen))
"""


def _modules(tmp_path, *args: str) -> dict[str, set[str]]:
    out = tmp_path / "modules.json"
    code = f"OUT = {str(out)!r}\n" + _RECORDER
    cmd = [sys.executable, "-c", code, str(REPO / "scripts" / "train.py"), *args, "--no-progress"]
    cmd += ["--output-dir", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k: {m.split(".")[0] for m in v} for k, v in json.loads(out.read_text()).items()}


@pytest.mark.parametrize(
    "args",
    [
        ["--max-steps", "3", "--eval-every", "2"],  # the default data (digits) with an evaluation and the plots
        ["--dataset", "synthetic", "--synthetic-size", "256", "--max-steps", "3", "--eval-every", "2"],
    ],
    ids=["digits", "synthetic"],
)
def test_nothing_the_first_step_does_not_use_is_imported_before_it(tmp_path, args):
    seen = _modules(tmp_path, *args)
    assert not seen["first_step"] & set(LATER), sorted(seen["first_step"] & set(LATER))
    # ...nor after it: the run evaluated without evaluate's stack, and plotted (matplotlib) once it needed to
    assert not seen["end"] & set(NEVER), sorted(seen["end"] & set(NEVER))
    assert "matplotlib" in seen["end"] and (tmp_path / "run" / "curves.png").is_file()
    events = [json.loads(line)["event"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert events.count("eval") >= 2, events  # at step 2 and at the end


_HEAP = """
import atexit, gc, json, runpy, sys
import accel_train.trainer as tr
seen = {}
step = tr.Trainer.step
def first_step(self, *args, **kwargs):
    if "first_step" not in seen:
        seen["first_step"] = {"frozen": gc.get_freeze_count(), "unfrozen": len(gc.get_objects())}
    return step(self, *args, **kwargs)
tr.Trainer.step = first_step
def record():  # registered before the command's own handlers, so it runs after them
    seen["exit"] = {"frozen": gc.get_freeze_count(), "unfrozen": len(gc.get_objects())}
    seen["dynamo"] = "torch._dynamo" in sys.modules
    open(OUT, "w").write(json.dumps(seen))
atexit.register(record)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_collector_never_walks_the_imports_and_exit_skips_the_last_walk(tmp_path):
    """Python's collector walked the whole heap each time a full collection came due while torch, torch._dynamo and
    sympy loaded (six walks of 25-155 ms, 0.55 s of a run's start-up here), and once more at exit (about 0.9 s).
    At the first step the imports are frozen (gc.get_objects() no longer lists them: no collection walks them),
    and at exit everything is, after the atexit handlers ran; the run's files are complete."""
    out, run = tmp_path / "heap.json", tmp_path / "run"
    code = f"OUT = {str(out)!r}\n" + _HEAP
    cmd = [sys.executable, "-c", code, str(REPO / "scripts" / "train.py"), "--dataset", "synthetic"]
    cmd += ["--synthetic-size", "256", "--max-steps", "3", "--no-progress", "--output-dir", str(run)]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(out.read_text())
    first, last = seen["first_step"], seen["exit"]
    assert seen["dynamo"] and first["frozen"] > 200_000, seen  # torch and the optimizer's torch._dynamo, frozen
    assert first["unfrozen"] < 50_000, seen  # what the collector still walks: the run's own objects
    assert last["unfrozen"] < 100 and last["frozen"] > first["frozen"], seen  # and at exit, everything
    assert json.loads((run / "summary.json").read_text())["global_step"] == 3
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line) for line in lines)  # every line whole


def test_a_torchvision_that_does_not_fit_torch_is_one_line_before_anything_runs(tmp_path):
    """A torchvision whose compiled operators do not load into this torch (what pip leaves when the CPU index of
    torch was out of reach and PyPI's torchvision came instead): one line naming both and the fix, exit 2, before
    the run starts (the default run never imports torchvision, so it went unnoticed until a tv: model)."""
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    (fake / "_C.so").write_bytes(b"\x7fELF not a library built for this torch")
    env = _env({"PYTHONPATH": f"{fake.parent}:{REPO}"})
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), "--output-dir", str(tmp_path / "run")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "does not work with torch" in lines[0] and "--force-reinstall torch torchvision" in lines[0]
    torch_v, vision_v = install_check.TESTED_PAIR  # a pair that works, from PyPI alone: no loop through the index
    assert f"--force-reinstall torch=={torch_v} torchvision=={vision_v} (the pair" in lines[0], lines[0]
    assert not (tmp_path / "run").exists()
