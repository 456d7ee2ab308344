"""What a mutation check reports: the table of mutants with their result and what caught them, the summary
line, the exit status (0 all caught, 1 one was not, 2 a stale mutant), and ``--list``, the mutants and whether
each is stale, without running anything."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mutation.mutants import Mutant, stale_reason


def exit_status(report: dict[str, Any]) -> int:
    statuses = [m["status"] for m in report["mutants"]]
    if "stale" in statuses:
        return 2
    return 0 if all(s == "caught" for s in statuses) else 1


def summary_line(report: dict[str, Any]) -> str:
    statuses = [m["status"] for m in report["mutants"]]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in ("survived", "timeout", "error", "stale") if s in statuses)
    return (
        f"mutation check: {statuses.count('caught')} of {len(statuses)} mutants caught"
        + (f" ({counts})" if counts else "")
        + f" in {report['total_s']:.0f} s (baseline {report['baseline_s']:.0f} s)"
    )


def table(report: dict[str, Any]) -> str:
    rows = [("mutant", "promise", "result", "seconds", "caught by / why not")]
    for m in report["mutants"]:
        rows.append((m["name"], m["promise"], m["status"], f"{m['seconds']:.0f}", m["by"] or m["detail"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(c.ljust(w) if i != 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False)))
        for r in rows
    ]
    lines = [f"{line}  {r[4]}" for line, r in zip(lines, rows, strict=True)]
    for e in report.get("equivalent", []):
        lines.append(f"{e['name']}  (not run: argued equivalent: {e['why']})")
    return "\n".join(lines)


def list_mutants(repo: Path, mutants: tuple[Mutant, ...], as_json: bool) -> int:
    """``--list``: the mutants and whether each is stale at this commit; exit 2 if any is."""
    entries = []
    for m in mutants:
        entry = {k: v for k, v in asdict(m).items() if k not in ("old", "new")}
        entry["tests"] = list(m.tests)
        entry["stale"] = stale_reason(repo, m) or None
        entries.append(entry)
    if as_json:
        print(json.dumps({"mutants": entries}, indent=2))
    else:
        for e in entries:
            mark = f"  STALE: {e['stale']}" if e["stale"] else ""
            mark += "  (argued equivalent: not run)" if e["equivalent"] else ""
            print(f"{e['name']}  [{e['promise']}]  {e['file']}  -> {' '.join(e['tests'])}{mark}")
        print(f"{len(entries)} mutants")
    return 2 if any(e["stale"] for e in entries) else 0
