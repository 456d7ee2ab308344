"""The kill campaign's verdict (``campaign``): its report (:func:`report`), and on each finished run
(:func:`verify_run`), against a straight run of the same command:

* ``model/`` and ``best/`` weights equal the straight run's bit for bit (``torch.equal``);
* every line of ``metrics.jsonl`` is whole (newline-terminated) and strict JSON (no NaN/Infinity);
* **each train step exactly once**, as ``run_records.read_metrics`` reads the log (what ``accel-plot-runs``, the
  plots and users read: the last record of each (event, step) wins): train steps 1..N, each once, with the
  straight run's values (times aside), and the straight run's evaluations. In the file itself, a step a killed
  attempt logged after its last checkpoint is logged again by the next attempt, after its ``resume`` record at
  step s (docs/run-folder.md): such repeats are counted ("superseded"), not faults. A fault is a record an
  attempt logs twice, or one from before its resume point (a train, epoch or checkpoint record at step <= s, an
  evaluation at step < s; the final evaluation of step s may come again);
* ``summary.json`` and ``confusion.json`` hold the straight run's figures (times aside), ``config.yaml`` parses;
* nothing half-written is left (:func:`leftovers`): no atomic-write temporary (``.NAME.*.tmp``), no ``.tmp-``
  checkpoint folder, no ``--overwrite`` journal, no name a run does not write; ``abandoned/`` (the records of an
  attempt killed before the first checkpoint: docs/run-folder.md, "Starting over") is normal.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

ATOMIC_TMP = re.compile(r"\..+\.tmp")  # fsio.atomic_write's and plots' temporaries: .NAME.XXXX.tmp
_JOURNAL = (".replacing", ".replaced", ".restoring", ".returning", ".replaced-discard")
_RUN_NAMES = {
    ".accel_train_run", ".lock", "config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "model", "best",
    "curves.png", "confusion.json", "confusion.png", "abandoned",
}  # fmt: skip
TRAIN_KEYS, EVAL_KEYS = ("epoch", "loss", "accuracy", "lr"), ("epoch", "eval_loss", "eval_accuracy", "eval_samples")
SUMMARY_KEYS = (
    "eval_accuracy", "eval_loss", "eval_samples", "global_step", "epochs_completed", "samples_seen",
    "best_eval_accuracy", "best_step", "nonfinite_skipped", "world_size", "global_batch",
)  # fmt: skip


def _strict(line: str) -> dict:
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


STEPPED = ("train", "eval", "checkpoint", "epoch")


def attempts_in(records: list[dict]) -> list[tuple[int, list[dict]]]:
    """The records of each attempt, split at the ``resume`` records: (the step it resumed at, 0 for the first;
    its records)."""
    out: list[tuple[int, list[dict]]] = [(0, [])]
    for rec in records:
        if rec.get("event") == "resume":
            out.append((rec["step"], []))
        out[-1][1].append(rec)
    return out


def relogged(records: list[dict]) -> tuple[list[str], int, int]:
    """Records logged more than once, judged attempt by attempt (module docstring). Returns the faults, the train
    steps among them, and the lines a later attempt legitimately logged again (what read_metrics supersedes)."""
    faults: list[str] = []
    train_faults = superseded = 0
    seen: set[tuple[str, int]] = set()
    for start, recs in attempts_in(records):
        mine: set[tuple[str, int]] = set()
        for r in recs:
            if r.get("event") not in STEPPED:
                continue
            key = (r["event"], r["step"])
            before_start = r["step"] < start or (r["step"] == start and r["event"] != "eval")
            if key in mine or before_start:
                faults.append(f"{key} logged again by the attempt resumed at step {start}")
                train_faults += r["event"] == "train"
            elif key in seen:
                superseded += 1
            mine.add(key)
        seen |= mine
    return faults, train_faults, superseded


def _load(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _same_weights(a: Path, b: Path) -> tuple[bool, float]:
    import torch

    x, y = _load(a), _load(b)
    if x.keys() != y.keys():
        return False, math.inf
    diff = max((x[k].double() - y[k].double()).abs().max().item() for k in x)
    return all(torch.equal(x[k], y[k]) for k in x), diff


def _check_metrics(run: Path, straight: Path, steps: int, problems: list[str]) -> dict[str, Any]:
    from accel_train.run_records import read_metrics

    text = (run / "metrics.jsonl").read_text()
    if text and not text.endswith("\n"):
        problems.append("metrics.jsonl ends in half a line")
    records = []
    for i, line in enumerate(text.splitlines(), 1):
        try:
            records.append(_strict(line))
        except ValueError as exc:
            problems.append(f"metrics.jsonl:{i} is not strict JSON ({exc})")
    faults, twice, superseded = relogged(records)
    problems += faults[:10]
    read = read_metrics(run)
    logged = [r["step"] for r in read.get("train", [])]
    missing = sorted(set(range(1, steps + 1)) - set(logged))
    if missing or len(logged) != steps:
        problems.append(f"train steps missing {missing[:10]}, or others: {len(logged)} steps")
    theirs = _by_event(straight)
    for event, keys in (("train", TRAIN_KEYS), ("eval", EVAL_KEYS)):
        mine = {r["step"]: r for r in read.get(event, [])}
        differ = [s for s in theirs[event] if s not in mine or _pick(mine[s], keys) != _pick(theirs[event][s], keys)]
        if differ or mine.keys() != theirs[event].keys():
            problems.append(f"{event} records differ from the straight run's at steps {differ[:10]}")
    return {"duplicated_steps": twice, "missing_steps": len(missing), "superseded_lines": superseded}


def _by_event(run: Path) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {"train": {}, "eval": {}}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["event"] in out:
            out[r["event"]][r["step"]] = r
    return out


def _pick(record: dict, keys: tuple[str, ...]) -> tuple:
    return tuple(record.get(k) for k in keys)


def leftovers(run: Path) -> list[str]:
    """Anything half-written, or not a run's own name, in the finished run folder (module docstring)."""
    found = [name for name in os.listdir(run) if name not in _RUN_NAMES]
    for dirpath, dirnames, filenames in os.walk(run):
        rel = Path(dirpath).relative_to(run)
        for name in dirnames + filenames:
            if name.startswith(".tmp-") or ATOMIC_TMP.fullmatch(name) or name in _JOURNAL:
                found.append(str(rel / name))
    for p in (run / "checkpoints").iterdir():
        if not re.fullmatch(r"step_\d{8}", p.name) or not (p / "progress.json").is_file():
            found.append(f"checkpoints/{p.name}")
    return sorted(set(found))


def verify_run(run: Path, straight: Path, steps: int) -> dict[str, Any]:
    """The verdict on the finished ``run`` of ``steps`` steps against the ``straight`` one (module docstring)."""
    import yaml

    problems: list[str] = []
    verdict: dict[str, Any] = {}
    for sub in ("model", "best"):
        same, diff = _same_weights(straight / sub / "model.safetensors", run / sub / "model.safetensors")
        verdict[f"{sub}_max_abs_diff"] = diff
        if not same:
            problems.append(f"{sub}/ weights differ from the straight run's (max |dw| {diff})")
    verdict["weights_differ"] = int(not all(verdict[f"{s}_max_abs_diff"] == 0 for s in ("model", "best")))
    verdict.update(_check_metrics(run, straight, steps, problems))
    for name, keys in (("summary.json", SUMMARY_KEYS), ("confusion.json", ("class_names", "matrix"))):
        try:
            mine = _strict((run / name).read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        theirs = json.loads((straight / name).read_text())
        if _pick(mine, keys) != _pick(theirs, keys):
            problems.append(f"{name} differs from the straight run's")
    try:
        yaml.safe_load((run / "config.yaml").read_text())
    except (OSError, yaml.YAMLError) as exc:
        problems.append(f"config.yaml: {exc}")
    for name in ("curves.png", "confusion.png"):
        if not (run / name).is_file():
            problems.append(f"no {name}")
    verdict["leftovers"] = [f"{run.name}/{x}" for x in leftovers(run)]
    if verdict["leftovers"]:
        problems.append(f"left over: {verdict['leftovers']}")
    verdict["problems"], verdict["ok"] = problems, not problems
    return verdict


def report(runs: list[dict], processes: int, wall: float, ref: dict) -> dict[str, Any]:
    kills = [a for r in runs for a in r["attempts"] if a["killed"]]
    phases: dict[str, int] = {}
    for a in kills:
        key = a["phase"] + ("" if a["had_checkpoint"] else " (before the first checkpoint)")
        phases[key] = phases.get(key, 0) + 1
    verdicts = [r["verdict"] for r in runs]
    return {
        "processes": processes,
        "kills": len(kills),
        "kills_one_rank": sum(a["who"] != "all" for a in kills),
        "runs": len(runs),
        "attempts": sum(len(r["attempts"]) for r in runs),
        "phases": dict(sorted(phases.items(), key=lambda kv: -kv[1])),
        "runs_ok": sum(v["ok"] for v in verdicts),
        "weight_differences": sum(v.get("weights_differ", 0) for v in verdicts),
        "duplicated_steps": sum(v.get("duplicated_steps", 0) for v in verdicts),
        "missing_steps": sum(v.get("missing_steps", 0) for v in verdicts),
        "superseded_lines": sum(v.get("superseded_lines", 0) for v in verdicts),
        "leftovers": [x for v in verdicts for x in v.get("leftovers", [])],
        "refused_in_use": sum(bool(a.get("in_use")) for r in runs for a in r["attempts"]),
        "failed_attempts": [a for r in runs for a in r["attempts"] if not a["killed"] and a["returncode"] != 0],
        "hangs": sum(a["returncode"] is None for r in runs for a in r["attempts"]),  # killed after 5-15 minutes
        "lingering_processes": sum(a.get("lingered", 0) for a in kills),  # alive 2 minutes after the kill
        "wall_time_s": round(wall, 1),
        "straight_run": ref,
        "ok": bool(runs) and all(v["ok"] for v in verdicts) and not any(a.get("lingered") for a in kills),
        "runs_detail": runs,
    }


def summary_lines(result: dict[str, Any]) -> list[str]:
    return [
        f"{result['processes']} process(es): {result['kills']} kills ({result['kills_one_rank']} of one rank only) "
        f"over {result['runs']} runs, {result['attempts']} attempts, {result['wall_time_s']:.0f}s",
        "landed in: " + ", ".join(f"{k} {v}" for k, v in result["phases"].items()),
        f"runs identical and complete: {result['runs_ok']}/{result['runs']}; weight differences "
        f"{result['weight_differences']}; duplicated steps {result['duplicated_steps']}; missing steps "
        f"{result['missing_steps']} ({result['superseded_lines']} lines superseded by resumes); leftovers "
        f"{len(result['leftovers'])}; refused as in use {result['refused_in_use']}; failed attempts "
        f"{len(result['failed_attempts'])} (hangs {result['hangs']}); processes alive 2 minutes after a kill "
        f"{result['lingering_processes']}",
    ]
