"""Print accel_train's layers as its imports make them: each module one floor above everything it imports.

    python3 scripts/layers.py                        # floors, top first (packages such as data/ as one room)
    python3 scripts/layers.py --modules              # every module on its own
    python3 scripts/layers.py --package benchmarks   # the harness's floors (its folders as rooms)

Imports inside functions count (they run too); imports under ``if TYPE_CHECKING:`` do not. A circle has no
floors: the script then names it and exits 1 (``tests/unit/test_packaging.py`` keeps the package free of them).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "accel_train"


def _imports(path: Path, module: str, inside_functions: bool = True, root: str = PACKAGE) -> set[str]:
    """The modules of package ``root`` that ``module`` imports at module level and (``inside_functions``) in its
    functions; never those under ``if TYPE_CHECKING:``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith(root))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                if base.startswith(root):
                    found.add(base)
                    found.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)) or inside_functions:  # a guarded import runs at import time
                visit(list(ast.iter_child_nodes(node)))

    visit(ast.parse(path.read_text()).body)
    return found


def import_graph(root: Path | None = None, inside_functions: bool = True) -> dict[str, set[str]]:
    """module -> the modules of the package in folder ``root`` (default: accel_train) that it imports
    (``inside_functions``: counting imports in functions)."""
    root = root or REPO / PACKAGE
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {
        name: {m for m in _imports(path, name, inside_functions, root.name) if m in modules and m != name}
        for name, path in modules.items()
    }


def _room(module: str, by_module: bool) -> str:
    parts = module.split(".")
    return module if by_module or len(parts) == 1 else ".".join(parts[:2])


def floors(graph: dict[str, set[str]], by_module: bool = False) -> dict[str, int]:
    """room -> floor (1: imports nothing of the package). Raises ValueError naming a circle."""
    rooms: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        rooms[_room(a, by_module)].update(_room(b, by_module) for b in targets)
    for room, targets in rooms.items():
        targets.discard(room)
    floor: dict[str, int] = {}
    path: list[str] = []

    def place(room: str) -> int:
        if room in path:
            raise ValueError("import circle: " + " -> ".join([*path[path.index(room) :], room]))
        if room not in floor:
            path.append(room)
            floor[room] = 1 + max((place(t) for t in sorted(rooms.get(room, ()))), default=0)
            path.pop()
        return floor[room]

    for room in sorted(rooms):
        place(room)
    return floor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="every module on its own, not packages as one room")
    parser.add_argument("--package", default=PACKAGE, help=f"the package folder to read (default: {PACKAGE})")
    args = parser.parse_args(argv)
    package = args.package.strip("/")
    if not (REPO / package / "__init__.py").is_file():
        print(f"layers: {REPO / package} is not a package of this repository", file=sys.stderr)
        return 2
    try:
        placed = floors(import_graph(REPO / package), by_module=args.modules)
    except ValueError as exc:
        print(f"layers: {exc}", file=sys.stderr)
        return 1
    by_floor: dict[int, list[str]] = defaultdict(list)
    for room, k in placed.items():
        by_floor[k].append(room.removeprefix(f"{package}.") if room != package else f"{package} (__init__)")
    lines = [f"{k:2d}  {'  '.join(sorted(by_floor[k]))}" for k in sorted(by_floor, reverse=True)]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
