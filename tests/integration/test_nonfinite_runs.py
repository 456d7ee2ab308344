"""No NaN reaches a result: weights that hold NaN are refused before training, a run whose loss turns non-finite
before its first log or whose evaluation is non-finite exits 3 (never 0), and every JSON file or line holds null,
never the bare word NaN (which is not JSON)."""

from __future__ import annotations

import json
import math

from conftest import FAST, check, run_here

STEPS3 = ["--max-steps", "3", *FAST, "--log-every", "50"]


def _strict(text: str):
    """JSON as a strict parser reads it: NaN/Infinity are errors."""

    def refuse(word):
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_pretrained_weights_with_nan_are_refused_in_one_line(tmp_path):
    import torch
    import torchvision

    state = torchvision.models.mobilenet_v3_small().state_dict()
    state["features.0.0.weight"][0, 0, 0, 0] = float("nan")
    torch.save(state, tmp_path / "nan.pth")
    proc = run_here("train.py", "--model", "tv:mobilenet_v3_small", "--pretrained", str(tmp_path / "nan.pth"),
                    "--image-size", "32", *STEPS3, "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "NaN or Inf" in line and "features.0.0.weight" in line and "nan.pth" in line


def test_a_loss_that_diverges_before_the_first_log_exits_3_and_saves_nothing_of_it(tmp_path):
    out = tmp_path / "run"
    proc = run_here("train.py", "--optimizer", "sgd", "--lr", "1e12", "--max-grad-norm", "0", *STEPS3,
                    "--output-dir", str(out))  # fmt: skip
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-500:])
    assert "training loss became nan" in proc.stderr
    assert not (out / "summary.json").exists()
    assert not list((out / "checkpoints").glob("step_*")) if (out / "checkpoints").exists() else True


def test_json_files_and_lines_hold_null_for_nan(tmp_path, capsys):
    from accel_train.fsio import write_json_atomic
    from accel_train.tracking import RunLogger

    write_json_atomic(tmp_path / "s.json", {"eval_loss": math.nan, "ok": 1.0, "per_class": [0.5, math.inf]})
    assert _strict((tmp_path / "s.json").read_text()) == {"eval_loss": None, "ok": 1.0, "per_class": [0.5, None]}
    err = capsys.readouterr().err
    assert "eval_loss, per_class not finite (NaN or Inf), written as null" in err

    class Acc:
        is_main_process = True

    logger = RunLogger.__new__(RunLogger)  # only its metrics line: no trackers, no progress bar
    logger.is_main, logger.path, logger._t0 = True, tmp_path / "metrics.jsonl", 0.0
    logger.event("eval", 3, 0, eval_loss=math.nan, eval_accuracy=0.1)
    record = _strict((tmp_path / "metrics.jsonl").read_text())
    assert record["eval_loss"] is None and record["eval_accuracy"] == 0.1


def test_predict_json_of_nan_weights_is_json(tmp_path):
    from safetensors.torch import load_file, save_file

    from accel_train.checkpoint import load_weights  # noqa: F401  (the export's layout, as predict reads it)

    out = tmp_path / "run"
    check(run_here("train.py", "--max-steps", "2", *FAST, "--output-dir", str(out)))
    weights = out / "model" / "model.safetensors"
    tensors = load_file(str(weights))
    for name in tensors:
        if tensors[name].is_floating_point():
            tensors[name] = torch_nan(tensors[name])
    save_file(tensors, str(weights))
    from PIL import Image

    Image.new("L", (8, 8), 128).save(tmp_path / "x.png")
    proc = run_here("predict.py", "--weights", str(out / "model"), "--json", str(tmp_path / "x.png"))
    assert proc.returncode == 0, proc.stderr
    results = _strict(proc.stdout)
    assert results[0]["top_k"][0]["prob"] is None
    assert "written as null" in proc.stderr


def torch_nan(t):
    return t.clone().fill_(float("nan"))
