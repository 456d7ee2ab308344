"""Print constraints.txt for this environment: the exact installed version of everything requirements.txt and
requirements-dev.txt pull in (their closure, read from the installed packages' metadata), minus the
platform-specific builds. Run it after the suite passed: ``python3 scripts/freeze_constraints.py > constraints.txt``.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
HEADER = """\
# Exact versions the test suite last ran with (`python3 -m pytest`, 2 cores, Python 3.11, x86_64), for the
# README's two set-up commands and .ci/run: `pip install -c constraints.txt ...` gives a fresh machine what CI
# tested. The ranges in requirements*.txt stay as they are; without this file pip takes the newest versions they
# allow (scripts/check_fresh_install.sh runs the suite that way, to learn early when a new release breaks us).
#
# Left out on purpose: torch, torchvision, triton, nvidia-* and cuda-* (the build depends on the platform: the
# dev/CI machines install torch from their local disk, laptops take the CPU wheels the README names, GPU machines
# bring their own), and pip/setuptools. The suite last ran with torch {torch} and torchvision {torchvision}.
#
# Regenerate after a dependency change, once the suite passed: python3 scripts/freeze_constraints.py > constraints.txt
"""
LEFT_OUT = re.compile(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*|pip|setuptools)$")


def _top_requirements() -> list[Requirement]:
    tops = []
    for name in ("requirements.txt", "requirements-dev.txt"):
        for line in (REPO / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-"):
                tops.append(Requirement(line))
    return tops


def closure() -> dict[str, str]:
    """Canonical name -> installed version, for every package the requirements pull in (markers evaluated)."""
    found: dict[str, str] = {}
    stack = [(r, frozenset(r.extras)) for r in _top_requirements()]
    seen: set[tuple[str, frozenset]] = set()
    while stack:
        req, extras = stack.pop()
        key = (canonicalize_name(req.name), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue  # a marker-only or optional dependency that is not installed here
        found[key[0]] = dist.version
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (extras or {""})):
                stack.append((dep, frozenset(dep.extras)))
    return found


def main() -> int:
    pins = closure()
    missing = [r.name for r in _top_requirements() if canonicalize_name(r.name) not in pins]
    if missing:
        print(f"not installed here: {', '.join(missing)}; install requirements-dev.txt first", file=sys.stderr)
        return 1
    print(HEADER.format(torch=pins.get("torch", "?"), torchvision=pins.get("torchvision", "?")))
    for name in sorted(pins):
        if not LEFT_OUT.match(name):
            print(f"{name}=={pins[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
