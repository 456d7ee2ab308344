"""Every output path of eval.py, predict.py, plot_runs.py and convert is checked before the work (issue 24).

Each refusal: exit 2, one line, no traceback, nothing changed on disk (hashes of the test folder and the run), and
no work started first: loading the weights, evaluating, reading a run raise here if they are reached, and nothing
is printed on stdout. Also: the eval report is valid JSON for NaN weights, writes are whole or absent, and
integer (quantized) weights for floating-point tensors are refused.


Whole runs and launches; the in-process tests are in ../unit/test_output_paths.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from checks import assert_one_line_error
from conftest import SMALL_RUN, check, run_here
from datafiles import write_image_folder


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every path under ``roots`` -> (kind, ...): folders with their mtime (an entry made or removed inside changes
    it), files with size, mtime and sha256, symbolic links (broken ones too) with their target, never followed."""
    state: dict[str, tuple] = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            state[folder] = ("dir", os.lstat(folder).st_mtime_ns)
            for name in [*dirs, *files]:
                path = Path(folder, name)
                if path.is_symlink():
                    state[str(path)] = ("link", os.readlink(path))
                elif path.is_file():
                    st = path.stat()
                    state[str(path)] = ("file", st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).digest())
    return state


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One finished run (3 steps of lenet on synthetic 16 px images), shared by the module."""
    out = tmp_path_factory.mktemp("trained") / "run"
    check(run_here("train.py", *SMALL_RUN, "--output-dir", str(out), "--max-steps", "3"))
    return out


@pytest.fixture
def no_work(monkeypatch):
    """Loading weights, evaluating, reading or plotting runs fail the test: refusals come before all of it."""
    import accel_train.checkpoint.weights as weights
    import accel_train.plots as plots
    import accel_train.saved_eval as evaluation

    def started(*args, **kwargs):
        raise AssertionError("the work started before the output path was checked")

    for module, name in ((evaluation, "run_evaluation"), (weights, "load_model"), (weights, "read_state_dict"),
                         (plots, "plot_runs"), (plots, "compare_runs_table")):  # fmt: skip
        monkeypatch.setattr(module, name, started)


def _refused(tmp_path: Path, run: Path, script: str, args: list[str], *needles: str) -> str:
    before = snapshot(tmp_path, run)
    proc = run_here(script, *args)
    line = assert_one_line_error(proc, *needles)
    assert proc.stdout == "", f"work was done before the refusal: {proc.stdout[:500]}"
    assert snapshot(tmp_path, run) == before
    return line


COMMANDS = {  # name -> (script, flag, extension)
    "eval --out": ("eval.py", "--out", ".json"),
    "eval --confusion-png": ("eval.py", "--confusion-png", ".png"),
    "predict --sheet": ("predict.py", "--sheet", ".png"),
    "plot_runs --out": ("plot_runs.py", "--out", ".png"),
}


def _args(command: str, run: Path, tmp_path: Path, value: str) -> list[str]:
    script, flag, _ = COMMANDS[command]
    if script == "eval.py":
        return ["--weights", str(run / "model"), flag, value]
    if script == "predict.py":
        images = write_image_folder(tmp_path / "imgs", classes=("a",), per_class=2, size=16)
        return ["--weights", str(run / "model"), "--raw", str(images), flag, value]
    return [str(run), flag, value]


def _family(name: str, tmp_path: Path, run: Path, ext: str) -> tuple[str, tuple[str, ...]]:
    """The output path of one family of mistakes, made real on disk, and what its one line must say."""
    if name == "existing file":
        (tmp_path / f"exists{ext}").write_text("mine\n")
        return str(tmp_path / f"exists{ext}"), ("already exists", "--overwrite")
    if name == "a folder":
        (tmp_path / f"folder{ext}").mkdir()
        return str(tmp_path / f"folder{ext}"), ("is a directory", "give a file name")
    if name == "under a file":
        (tmp_path / "plain_file").write_text("x\n")
        return str(tmp_path / "plain_file" / f"r{ext}"), ("which is a file",)
    if name == "wrong extension":
        return str(tmp_path / "report.txt"), (f"must end in {ext}",)
    if name == "symlink loop":
        (tmp_path / f"loop{ext}").symlink_to(tmp_path / f"loop{ext}")
        return str(tmp_path / f"loop{ext}"), ("symbolic link loop",)
    if name == "dangling link":
        (tmp_path / f"dangling{ext}").symlink_to(tmp_path / "nowhere" / f"x{ext}")
        return str(tmp_path / f"dangling{ext}"), ("broken symbolic link",)
    if name == "dangling link folder":
        (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
        return str(tmp_path / "gone" / f"x{ext}"), ("broken symbolic link", "its folder")
    if name == "a run's own file":
        own = run / ("summary.json" if ext == ".json" else "confusion.png")
        return str(own), ("files of the run", own.name, "write beside it")
    if name == "link into a run's folder":
        (tmp_path / "into").symlink_to(run / "checkpoints")
        return str(tmp_path / "into" / f"x{ext}"), ("files of the run", "checkpoints")
    raise AssertionError(name)


FAMILIES = ["existing file", "a folder", "under a file", "wrong extension", "symlink loop", "dangling link",
            "dangling link folder", "a run's own file", "link into a run's folder"]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_output_path_is_refused_before_any_work(tmp_path, run, no_work, command, family):
    _, flag, ext = COMMANDS[command]
    value, needles = _family(family, tmp_path, run, ext)
    args = _args(command, run, tmp_path, value)
    line = _refused(tmp_path, run, COMMANDS[command][0], args, flag, *needles)
    assert value in line, line


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_runs_own_files_are_refused_even_with_overwrite(tmp_path, run, no_work, command):
    script, flag, ext = COMMANDS[command]
    own = {".json": ["summary.json", "checkpoints/x.json", "model_ema/x.json", "abandoned/a/x.json"],
           ".png": ["curves.png", "confusion.png", "best/x.png", "tb/x.png"]}[ext]  # fmt: skip
    for name in own:
        args = [*_args(command, run, tmp_path, str(run / name)), "--overwrite"]
        _refused(tmp_path, run, script, args, flag, "files of the run", "--overwrite or not")


def test_eval_refuses_the_runs_weights_and_the_input_folder(tmp_path, run, no_work):
    ckpt = next((run / "checkpoints").iterdir())
    # the README's example: --out onto the run's weights, here while evaluating a checkpoint of the same run
    args = ["--weights", str(ckpt), "--out", str(run / "model" / "model.safetensors"), "--overwrite"]
    _refused(tmp_path, run, "eval.py", args, "--out", "files of the run", "model")
    for target in (run / "model" / "config.json", run / "model" / "eval.json"):  # inside --weights
        args = ["--weights", str(run / "model"), "--out", str(target), "--overwrite"]
        _refused(tmp_path, run, "eval.py", args, "--out", "this command's input", str(run / "model"))
    export = tmp_path / "export"  # a bare export (no run): its config.json is read with the weights file
    shutil.copytree(run / "model", export)
    args = ["--weights", str(export / "model.safetensors"), "--out", str(export / "config.json"), "--overwrite"]
    _refused(tmp_path, run, "eval.py", args, "--out", "is this command's input", "config.json")
    args = ["--weights", str(run / "model"), "--confusion-png", str(run / "model" / "c.png")]
    _refused(tmp_path, run, "eval.py", args, "--confusion-png", "this command's input")


def test_predict_refuses_an_input_image_and_a_place_in_an_image_folder(tmp_path, run, no_work):
    images = write_image_folder(tmp_path / "imgs", classes=("a",), per_class=2, size=16)
    one = sorted(images.rglob("*.png"))[0]
    weights = ["--weights", str(run / "model")]
    _refused(tmp_path, run, "predict.py", [*weights, str(one), "--sheet", str(one), "--overwrite"], "--sheet",
             "is this command's input")  # fmt: skip
    _refused(tmp_path, run, "predict.py", [*weights, str(images), "--sheet", str(images / "sheet.png")],
             "is inside this command's input")  # fmt: skip


def test_plot_runs_refuses_a_run_dirs_own_files_without_the_marker(tmp_path, run, no_work):
    """A RUN_DIR given to plot_runs is a run even without the marker (an older run): curves.png is its own."""
    old = tmp_path / "old_run"
    old.mkdir()
    shutil.copy(run / "metrics.jsonl", old / "metrics.jsonl")
    args = [str(old), "--out", str(old / "curves.png"), "--overwrite"]
    _refused(tmp_path, run, "plot_runs.py", args, "--out", "files of the run", "curves.png")
    _refused(tmp_path, run, "plot_runs.py", [str(old), "--out", str(old)], "--out", "is a directory")


@pytest.fixture
def read_only_place(tmp_path):
    """A folder nothing can be written into: chmod 0o555 for a user; a read-only tmpfs for root (whom
    permissions do not stop)."""
    place = tmp_path / "ro"
    place.mkdir()
    if os.geteuid() != 0:
        place.chmod(0o555)
        yield place, "no write permission"
        place.chmod(0o755)
        return
    if shutil.which("mount") is None:
        pytest.skip("root, and no mount command to make a read-only file system")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(place)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"root, and a read-only tmpfs cannot be mounted here: {mounted.stderr.decode().strip()}")
    try:
        yield place, "read-only file system"
    finally:
        subprocess.run(["umount", "-l", str(place)], check=False)


@pytest.mark.parametrize("command", [*COMMANDS, "convert --out"])
def test_a_read_only_place_is_refused_before_any_work(tmp_path, run, no_work, read_only_place, command):
    place, why = read_only_place
    if command == "convert --out":
        args = [str(run / "model"), "--out", str(place / "export")]
        _refused(tmp_path, run, "convert_checkpoint.py", args, "--out", "cannot be written", why)
        return
    script, flag, ext = COMMANDS[command]
    for value in (place / f"r{ext}", place / "new" / "sub" / f"r{ext}"):
        _refused(tmp_path, run, script, _args(command, run, tmp_path, str(value)), flag, "cannot be written", why)


def test_convert_out_folder_is_checked_first(tmp_path, run, no_work):
    (tmp_path / "file").write_text("x")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    src = [str(run / "model"), "--out"]
    cases = [
        (tmp_path / "file", "is a file, not a folder"),
        (tmp_path / "file" / "x", "which is a file"),
        (tmp_path / "gone", "broken symbolic link"),
        (run / "model", "is this command's input"),  # the export onto itself
        (run / "best", "files of the run"),
        (run / "checkpoints" / "export", "files of the run"),
    ]
    for out, needle in cases:
        _refused(tmp_path, run, "convert_checkpoint.py", [*src, str(out), "--overwrite"], "--out", needle)
    export = tmp_path / "export"  # the weights file's own folder: model.safetensors would be written onto it
    shutil.copytree(run / "model", export)
    args = [str(export / "model.safetensors"), "--out", str(export), "--overwrite"]
    _refused(tmp_path, run, "convert_checkpoint.py", args, "--out", "writing model.safetensors there would overwrite")


def test_overwrite_replaces_each_commands_output(tmp_path, run):
    report, png, sheet, chart = (tmp_path / n for n in ("r.json", "c.png", "s.png", "cmp.png"))
    for path in (report, png, sheet, chart):
        path.write_bytes(b"old")
    weights = ["--weights", str(run / "model")]
    check(run_here("eval.py", *weights, "--out", str(report), "--confusion-png", str(png), "--overwrite"))
    assert json.loads(report.read_text())["samples"] > 0 and png.read_bytes()[:4] == b"\x89PNG"
    images = write_image_folder(tmp_path / "imgs", classes=("a",), per_class=2, size=16)
    check(run_here("predict.py", *weights, "--raw", str(images), "--sheet", str(sheet), "--overwrite"))
    check(run_here("plot_runs.py", str(run), "--out", str(chart), "--overwrite"))
    assert sheet.read_bytes()[:4] == chart.read_bytes()[:4] == b"\x89PNG"
    export = tmp_path / "export"
    check(run_here("convert_checkpoint.py", str(run / "model"), "--out", str(export)))
    assert_one_line_error(run_here("convert_checkpoint.py", str(run / "model"), "--out", str(export)), "--overwrite")
    check(run_here("convert_checkpoint.py", str(run / "model"), "--out", str(export), "--overwrite"))
    assert not [p for p in tmp_path.rglob("*.tmp")], "a temporary file was left behind"


def test_new_files_beside_a_run_and_through_links_are_fine(tmp_path, run):
    check(run_here("eval.py", "--weights", str(run / "model"), "--out", str(run / "eval.json")))
    assert json.loads((run / "eval.json").read_text())["samples"] > 0
    check(run_here("plot_runs.py", str(run), "--out", str(run / "compare.png")))
    assert (run / "compare.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    nested = tmp_path / "new" / "sub" / "r.json"  # missing folders are made
    check(run_here("eval.py", "--weights", str(run / "model"), "--out", str(tmp_path / "link.json"), "--overwrite"))
    check(run_here("eval.py", "--weights", str(run / "model"), "--out", str(nested)))
    assert (tmp_path / "link.json").is_symlink(), "the link stays a link; the file it leads to is replaced"
    assert json.loads((tmp_path / "real.json").read_text())["samples"] > 0 and nested.is_file()
    for name in ("eval.json", "compare.png"):
        (run / name).unlink()


def test_a_failed_report_write_is_one_line_and_keeps_the_old_file(tmp_path, run, monkeypatch):
    report = tmp_path / "r.json"
    report.write_text('{"old": 1}\n')
    real_write = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name.startswith(".r.json."):
            real_write(self, "{half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    proc = run_here("eval.py", "--weights", str(run / "model"), "--out", str(report), "--overwrite")
    assert_one_line_error(proc, "cannot write the evaluation report", "no space left")
    assert report.read_text() == '{"old": 1}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def _rewritten(run: Path, tmp_path: Path, change) -> Path:
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "weights"
    shutil.copytree(run / "model", bad)
    tensors = load_file(str(bad / "model.safetensors"))
    save_file(
        {k: change(t) if t.is_floating_point() else t for k, t in tensors.items()}, str(bad / "model.safetensors")
    )
    return bad


def test_eval_report_is_valid_json_when_the_weights_are_nan(tmp_path, run):
    bad = _rewritten(run, tmp_path, lambda t: t.fill_(math.nan))
    for out in ([], ["--out", str(tmp_path / "r.json")]):
        proc = check(run_here("eval.py", "--weights", str(bad), *out))
        text = (tmp_path / "r.json").read_text() if out else proc.stdout
        report = json.loads(text, parse_constant=lambda c: pytest.fail(f"invalid JSON constant {c}"))
        assert report["loss"] is None
        assert proc.stderr.startswith("warning: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "not finite" in proc.stderr and str(bad) in proc.stderr


def test_integer_weights_for_float_tensors_are_refused(tmp_path, run):
    import torch

    bad = _rewritten(run, tmp_path, lambda t: t.round().to(torch.int8))
    for script, extra in (("eval.py", []), ("predict.py", ["--raw", str(write_image_folder(tmp_path / "i"))])):
        proc = run_here(script, "--weights", str(bad), *extra)
        line = assert_one_line_error(proc, "int8", "float32", "model.safetensors", "floating-point weights")
        assert "tensor " in line and proc.stdout == ""


def test_plot_runs_writes_the_format_its_extension_names(tmp_path, run):
    for name, magic in (("cmp.pdf", b"%PDF"), ("cmp.svg", b"<?xml"), ("cmp.png", b"\x89PNG")):
        check(run_here("plot_runs.py", str(run), "--out", str(tmp_path / name)))
        assert (tmp_path / name).read_bytes().startswith(magic), name
