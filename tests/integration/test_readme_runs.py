"""The README a newcomer reads first (issue 27, item 5): short, navigable, every link lands, and its example runs.

The end-to-end example (an image folder -> train -> predict -> evaluate -> the weights in your own script) is read
out of README.md by its ``<!-- readme-test: NAME -->`` markers, so this runs what the README says, not a copy.


Whole runs and launches; the in-process tests are in ../unit/test_readme.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO, check, run_here

README = REPO / "README.md"


# Appended to the README's train command: the generated folder is tiny, and a test needs only a few steps.
TRAIN_TAIL = ("--max-steps", "2", "--report-to", "none", "--no-plots", "--no-progress")


CLASSES = ("circle", "square")


def readme() -> str:
    return README.read_text()


def fenced_block(text: str, name: str) -> str:
    """The fenced code block right after ``<!-- readme-test: name -->``."""
    m = re.search(rf"<!-- readme-test: {re.escape(name)} -->\n```\w*\n(.*?)^```", text, re.S | re.M)
    assert m, f"README.md has no fenced block after '<!-- readme-test: {name} -->'"
    return m.group(1)


def _image(cls: str, rng) -> object:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (32, 32), "black")
    x, y, r = (int(v) for v in rng.integers([8, 8, 4], [24, 24, 9]))
    shape = ImageDraw.Draw(image).ellipse if cls == "circle" else ImageDraw.Draw(image).rectangle
    shape([x - r, y - r, x + r, y + r], fill="white")
    return image


def write_image_folder(root: Path) -> None:
    """``my_images/{train,test}/<class>/*.png`` as the README describes it, and one ``photo.png``."""
    import numpy as np

    rng = np.random.default_rng(0)
    for split, n in (("train", 20), ("test", 3)):
        for cls in CLASSES:
            (root / "my_images" / split / cls).mkdir(parents=True)
            for i in range(n):
                _image(cls, rng).save(root / "my_images" / split / cls / f"{i}.png")
    _image("circle", rng).save(root / "photo.png")


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> tuple[Path, list]:
    """The README's example commands, run in order in a folder holding a generated ``my_images/``."""
    root = tmp_path_factory.mktemp("readme_example")
    write_image_folder(root)
    done = []
    with contextlib.chdir(root):
        for line in fenced_block(readme(), "commands").splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            argv = shlex.split(line)
            assert argv[:1] == ["python3"] and argv[1].startswith("scripts/"), f"not a script command: {line}"
            script, args = Path(argv[1]).name, argv[2:]
            if script == "train.py":
                args += TRAIN_TAIL
            done.append((line, run_here(script, *args)))
    return root, done


def test_the_readme_example_trains_predicts_and_evaluates(example):
    root, done = example
    assert [Path(shlex.split(line)[1]).name for line, _ in done] == ["train.py", "predict.py", "eval.py"]
    for _, proc in done:
        check(proc)
    predicted = done[1][1].stdout
    for cls in CLASSES:
        assert f"my_images/test/{cls}/0.png:" in predicted
    report = json.loads((root / "runs" / "mine" / "eval.json").read_text())
    assert report["samples"] == 3 * len(CLASSES) and 0.0 <= report["accuracy"] <= 1.0


def test_the_readme_snippet_loads_the_weights_into_a_model_of_your_own(example, capsys):
    import torch

    from accel_train.checkpoint import load_model

    root, _ = example
    snippet = fenced_block(readme(), "python")
    namespace: dict = {}
    with contextlib.chdir(root):
        exec(compile(snippet, "README.md (readme-test: python)", "exec"), namespace)
        exported = load_model("runs/mine/model")[0]
    name, probability = capsys.readouterr().out.split()
    assert name in CLASSES and 0.5 <= float(probability) <= 1.0
    mine = namespace["model"].state_dict()
    assert all(torch.equal(mine[k], v) for k, v in exported.state_dict().items())
    with torch.no_grad():  # the snippet's preprocessing and model give the probabilities it printed
        assert torch.allclose(exported(namespace["x"][None]).softmax(dim=1)[0], namespace["probs"])


def test_the_readme_snippet_gives_exactly_predict_py_s_probabilities(example, capsys):
    """The snippet resizes as training and predict.py do (bilinear), so on the same photo it prints predict.py's
    probabilities (PIL's default bicubic gave 0.894 where predict.py said 0.786)."""
    import torch

    root, _ = example
    namespace: dict = {}
    with contextlib.chdir(root):
        exec(compile(fenced_block(readme(), "python"), "README.md (readme-test: python)", "exec"), namespace)
        capsys.readouterr()
        proc = check(run_here("predict.py", "--weights", "runs/mine/model", "photo.png", "--json", "--top-k", "2"))
    (result,) = json.loads(proc.stdout)
    assert all(step["as_trained"] for step in result["preprocess"])  # predict.py added nothing of its own
    names = namespace["config"]["class_names"]
    predicted = torch.zeros(len(names), dtype=torch.float64)
    for top in result["top_k"]:
        predicted[names.index(top["class"])] = top["prob"]
    assert torch.allclose(namespace["probs"].double(), predicted, rtol=0, atol=1e-6), (namespace["probs"], predicted)
