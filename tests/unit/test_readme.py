"""The README a newcomer reads first (issue 27, item 5): short, navigable, every link lands, and its example runs.

The end-to-end example (an image folder -> train -> predict -> evaluate -> the weights in your own script) is read
out of README.md by its ``<!-- readme-test: NAME -->`` markers, so this runs what the README says, not a copy.


The in-process tests; whole runs and launches are in ../integration/test_readme_runs.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

README = REPO / "README.md"


MAX_LINES = 300


CPU_WHEELS = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"


QUICKSTART = (
    "python3 -m pip install -c constraints.txt -r requirements.txt -e . && python3 scripts/train.py",
    "python3 -m pip install -c constraints.txt -r requirements-dev.txt && python3 -m pytest",
)


def readme() -> str:
    return README.read_text()


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


def _runs_in_order(text: str) -> list[tuple[str, str, bool]]:
    """(command, the run folder it writes, whether it continues or replaces that run) for every training command
    of the README's code blocks, in the order a reader meets them."""
    import shlex

    runs = []
    for block in re.findall(r"^```(?:bash|python)\n(.*?)^```", text, re.S | re.M):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            api = re.search(r"accel_train\.train\(.*output_dir=\"([^\"]+)\"", line)
            if api:
                runs.append((line, api.group(1), False))
                continue
            if "scripts/train.py" not in line or "[flags]" in line:
                continue
            argv = shlex.split(line.split("#")[0].split("&&")[-1])
            out = argv[argv.index("--output-dir") + 1] if "--output-dir" in argv else "runs/default"
            runs.append((line.strip(), out, "--resume" in argv or "--overwrite" in argv))
    return runs


def test_the_readmes_runs_followed_in_order_never_collide():
    """Followed top to bottom, no example trains into a folder an earlier one filled (it would stop with 'already
    holds a run'), unless it resumes or replaces that run on purpose."""
    seen: dict[str, str] = {}
    runs = _runs_in_order(readme())
    assert len(runs) >= 6, runs
    for command, out, continues in runs:
        if out in seen and not continues:
            raise AssertionError(f"{command!r} writes {out}, which {seen[out]!r} already filled")
        seen.setdefault(out, command)
