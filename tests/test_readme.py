"""The README a newcomer reads first (issue 27, item 5): short, navigable, every link lands, and its example runs.

The end-to-end example (an image folder -> train -> predict -> evaluate -> the weights in your own script) is read
out of README.md by its ``<!-- readme-test: NAME -->`` markers, so this runs what the README says, not a copy.
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
MAX_LINES = 300
CPU_WHEELS = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"
QUICKSTART = (
    "python3 -m pip install -c constraints.txt -r requirements.txt -e . && python3 scripts/train.py",
    "python3 -m pip install -c constraints.txt -r requirements-dev.txt && python3 -m pytest",
)
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


def outside_code(text: str) -> str:
    """``text`` without its fenced code blocks (a ``#`` there is a comment, not a heading)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (not ``-`` or ``_``), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", outside_code(text), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    """The targets of the Markdown links and images outside code blocks."""
    return re.findall(r"\]\(([^)\s]+)\)", outside_code(text))


def test_readme_fits_in_a_few_screens():
    n = len(readme().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; keep it to {MAX_LINES} and move depth to docs/*.md"


def test_table_of_contents_lists_every_section_and_each_link_lands():
    text = readme()
    toc = re.search(r"^## Contents\n(.*?)^## ", text, re.S | re.M)
    assert toc, "README.md has no '## Contents' section before the other sections"
    entries = re.findall(r"^- \[[^\]]+\]\((#[^)]+)\)$", toc.group(1), re.M)
    assert entries, "the table of contents lists no '- [Section](#anchor)' entries"
    present = anchors(text)
    assert [e for e in entries if e[1:] not in present] == [], "table of contents entries with no such heading"
    sections = [slug(h) for h in re.findall(r"^## +(.+)$", outside_code(text), re.M) if h.strip() != "Contents"]
    assert [s for s in sections if f"#{s}" not in entries] == [], "sections missing from the table of contents"


@pytest.mark.parametrize("doc", [README, *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_points_to_something_that_exists(doc: Path):
    broken = []
    for target in links(doc.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here (no network)
            continue
        path, _, fragment = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest})")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text()):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    assert broken == [], f"{doc.relative_to(REPO)}: broken links: {broken}"


def test_cpu_only_install_comes_before_the_quickstart_commands():
    text = readme()
    assert CPU_WHEELS in text, "the README no longer says how to install the CPU build of torch"
    for command in QUICKSTART:
        assert f"```bash\n{command}\n```" in text, f"the Quickstart command changed: {command}"
        assert text.index(CPU_WHEELS) < text.index(command), "a reader going top-down meets the CPU advice too late"


def test_no_figures_that_go_stale_on_every_change():
    """Test counts, suite minutes and measured seconds belong in docs/performance.md, with their date and machine."""
    text = readme()
    stale = [
        r"\b\d[\d,]* (?:tests?|passed|failed|skipped|xfailed)\b",
        r"\b\d+(?:\.\d+)? ?(?:min|mins|minutes)\b",
        r"\b\d+(?:\.\d+)? ?(?:s|ms|seconds)\b(?![-\w])",
        r"\b\d+(?:\.\d+)? samples/s\b",
        r"<!-- benchmark:begin",
    ]
    found = [m.group(0) for pattern in stale for m in re.finditer(pattern, text)]
    assert found == [], f"README.md holds figures that go stale: {found}"


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
