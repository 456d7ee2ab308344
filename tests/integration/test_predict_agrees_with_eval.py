"""Issue 27, item 1: ``accel-predict`` with its defaults answers as ``accel-evaluate`` does on in-distribution images.

A small CNN trained on a folder of generated shapes (large circles, squares, triangles in random colours on
white, 20 to 32 pixels, read at 16x16) is given new images from the same generator. Many hold a large dark shape, so
their most common colour is dark though their page is white: the old polarity check inverted exactly those
(large circles came back "square" at 0.8-0.999). Now predict must apply the training pipeline only (PIL resize,
normalise), list it per image, and agree with eval on every image: the same confusion matrix and the same loss.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FAST, check, run_here
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle")
SIDES = (20, 32)  # the generator's image sides; the model reads 16 x 16


def draw_shape(shape: str, side: int, rng: np.random.Generator) -> Image.Image:
    """One ``shape`` in a random colour (one channel below 120: never near white) on a white ``side`` square,
    large: from 60% of the side across to all of it but a 2-pixel margin (the page stays white at the edges)."""
    image = Image.new("RGB", (side, side), (255, 255, 255))
    colour = rng.integers(0, 256, 3)
    colour[rng.integers(0, 3)] = rng.integers(0, 120)
    fill = tuple(int(c) for c in colour)
    s = int(rng.integers(round(side * 0.6), side - 3))
    x, y = int(rng.integers(2, side - s - 1)), int(rng.integers(2, side - s - 1))
    draw = ImageDraw.Draw(image)
    if shape == "circle":
        draw.ellipse((x, y, x + s - 1, y + s - 1), fill=fill)
    elif shape == "square":
        draw.rectangle((x, y, x + s - 1, y + s - 1), fill=fill)
    else:
        draw.polygon([(x + (s - 1) / 2, y), (x, y + s - 1), (x + s - 1, y + s - 1)], fill=fill)
    return image


def write_shapes(root: Path, per_class: int, seed: int) -> Path:
    """``root/<shape>/NNN.png``, ``per_class`` each."""
    rng = np.random.default_rng(seed)
    for shape in CLASSES:
        (root / shape).mkdir(parents=True)
        for i in range(per_class):
            draw_shape(shape, int(rng.integers(SIDES[0], SIDES[1] + 1)), rng).save(root / shape / f"{i:03d}.png")
    return root


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory) -> tuple[Path, Path]:
    """(export, a flat folder of 60 new images): mnist_cnn, 4 epochs on 240 shapes, in this process."""
    from accel_train.config import parse_config
    from accel_train.loop import fit

    root = tmp_path_factory.mktemp("shapes")
    write_shapes(root / "data" / "train", 80, seed=1)
    write_shapes(root / "data" / "test", 5, seed=2)
    new = write_shapes(root / "new", 20, seed=3)
    flags = ["--dataset", f"imagefolder:{root / 'data'}", "--model", "mnist_cnn", "--image-size", "16"]
    fit(parse_config([*flags, "--epochs", "4", "--batch-size", "32", "--output-dir", str(root / "run"), *FAST]))
    return root / "run" / "model", new


def _predict(weights: Path, folder: Path) -> list[dict]:
    proc = check(run_here("predict.py", "--weights", str(weights), str(folder), "--json", "--top-k", str(len(CLASSES))))
    return json.loads(proc.stdout)


def _evaluate(weights: Path, folder: Path, report: Path) -> dict:
    check(run_here("eval.py", "--weights", str(weights), "--dataset", f"imagefolder:{folder}", "--out", str(report)))
    return json.loads(report.read_text())


def test_predict_with_defaults_gives_evals_answers_on_new_images(shapes_run, tmp_path, record_property):
    from accel_train.preprocess import _background

    weights, new = shapes_run
    record = json.loads((weights / "config.json").read_text())["preprocess"]
    assert record["fit"] == "stretch" and record["border"][0] >= 0.75  # every page white: a polarity is proven
    dark = []  # images whose most common colour is the shape's, and dark: what the old polarity check inverted
    for path in sorted(new.rglob("*.png")):
        with Image.open(path) as image:
            gray = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255).mean(-1)
        if _background(gray) < 0.5:
            dark.append(path.parent.name)
    assert len(dark) >= 6 and dark.count("circle") >= 2, f"large dark shapes in the new images: {dark}"

    results = _predict(weights, new)
    report = _evaluate(weights, new, tmp_path / "eval.json")
    assert report["samples"] == len(results) == 60

    confusion = [[0] * len(CLASSES) for _ in CLASSES]
    nll = 0.0
    for result in results:
        truth = CLASSES.index(Path(result["image"]).parent.name)
        confusion[truth][result["top_k"][0]["index"]] += 1
        nll -= float(np.log(next(c["prob"] for c in result["top_k"] if c["index"] == truth)))
    figures = {"eval_accuracy": report["accuracy"], "large_dark_shapes": len(dark)}
    record_property("predict_vs_eval", figures)
    assert report["accuracy"] >= 0.6, figures  # the model learned the shapes: agreeing is not trivial
    assert confusion == report["confusion_matrix"], (confusion, report["confusion_matrix"])
    # the same inputs, not just the same argmax: another resampler (torch's instead of PIL's) moves this by 2e-5
    assert nll / len(results) == pytest.approx(report["loss"], abs=1e-6)


def test_json_lists_each_images_preprocessing(shapes_run, tmp_path):
    weights, new = shapes_run
    for result in _predict(weights, new):
        with Image.open(result["image"]) as image:
            side = image.width
        steps = result["preprocess"]
        expected = ["resize", "normalize"] if side != 16 else ["normalize"]
        assert [s["step"] for s in steps] == expected, (result["image"], steps)
        assert all(s["as_trained"] for s in steps), steps
        if side != 16:
            assert steps[0]["detail"] == f"{side}x{side} -> 16x16 (PIL bilinear)"
    proc = check(run_here("predict.py", "--weights", str(weights), str(new / "circle")))
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("preprocessing: as imagefolder:") and "resized to 16x16 (PIL bilinear)" in lines[0]
    assert lines[1] == "preprocessing: nothing else: no image needed inverting", proc.stderr
    assert len(proc.stdout.splitlines()) == 20  # stdout: one line of classes per image, as before


def test_predict_scores_the_images_against_the_class_folders_they_are_in(shapes_run, tmp_path):
    """Images in subfolders named after the model's classes (issue 50, item 5): the top-1 against those names, in
    words on stderr and per image in --json; images in other folders are counted as not scored, alone not named."""
    import shutil

    weights, new = shapes_run
    results = _predict(weights, new)
    truth = [Path(r["image"]).parent.name for r in results]
    right = sum(r["top_k"][0]["class"] == t for r, t in zip(results, truth, strict=True))
    assert [r["folder_class"] for r in results] == truth
    assert sum(r["correct"] for r in results) == right
    proc = check(run_here("predict.py", "--weights", str(weights), str(new)))
    assert proc.stderr.splitlines()[-1] == f"top-1 against the folder names: {right / 60:.4f} ({right}/60)"
    assert len(proc.stdout.splitlines()) == 60  # stdout: still one line of classes per image

    other = tmp_path / "photos"
    other.mkdir()
    for path in sorted(new.rglob("00[0-2].png")):
        shutil.copy(path, other / f"{path.parent.name}_{path.name}")
    alone = check(run_here("predict.py", "--weights", str(weights), str(other)))
    assert "top-1" not in alone.stderr and "not scored" not in alone.stderr
    assert all("folder_class" not in r for r in _predict(weights, other))
    mixed = check(run_here("predict.py", "--weights", str(weights), str(new / "circle"), str(other)))
    circles = sum(r["top_k"][0]["class"] == t == "circle" for r, t in zip(results, truth, strict=True))
    assert mixed.stderr.splitlines()[-1] == (
        f"top-1 against the folder names: {circles / 20:.4f} ({circles}/20; 9 images in folders not named after "
        "a class are not scored)"
    )
