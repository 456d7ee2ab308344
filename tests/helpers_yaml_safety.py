"""Hyperparameter files for the YAML safety tests (tests/unit/test_yaml_safety.py and
tests/integration/test_yaml_safety_runs.py): a writer and a "billion laughs" alias bomb."""

from __future__ import annotations

from pathlib import Path


def write(tmp_path: Path, text: str, name: str = "hp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def billion_laughs(levels: int = 9, final_key: str | None = None, key: str | None = None) -> str:
    """A "billion laughs" document: anchor i is a list of 9 aliases to anchor i-1 (9**levels strings).

    ``key`` puts every anchor on that same (repeated) key; ``final_key`` adds ``final_key: [*last x 9]``.
    """
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"{key or names[0]}: &{names[0]} [" + ", ".join(['"lol"'] * 9) + "]"]
    for prev, cur in zip(names[:-1], names[1:], strict=True):
        lines.append(f"{key or cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    if final_key:
        lines.append(f"{final_key}: [" + ", ".join([f"*{names[-1]}"] * 9) + "]")
    return "\n".join(lines) + "\n"
