"""The kill campaign (issue 42): ``python scripts/soak.py kills --trials N [--processes 2]``.

A training run is SIGKILLed at random moments and resumed each time with the same command and ``--resume auto``
until it finishes; then it is compared with a straight run of the same command. When the run finishes with kills
of the campaign left, the next run starts in a new folder (``--kills-per-run``, 10 by default, so each run also
meets a kill before its first checkpoint and in its final evaluation, export and summary).

**What a kill is.** On 1 process: ``scripts/train.py`` and everything it started. On 2 processes
(``accelerate launch --config_file multi_cpu.yaml``): the node dies, the launcher and both ranks (torchrun starts
each rank in a session of its own, so the process tree is killed, not one group); with ``--rank-kills F`` a
fraction F of the kills takes one rank only (an OOM kill: the others stop on their own, and the launcher exits).
The next attempt starts once every killed process is gone, as on a new node.

**When.** Each attempt draws a trigger (seeded): a time after its start (uniform up to the time it needs to
reach its target step: many land in start-up), a train step, the start of a checkpoint save (a new
``checkpoints/.tmp-step_*`` folder), an evaluation (a train record at an evaluation step), a ``best/`` export (an
evaluation that the straight run shows improving), or the final phase (the last train step: final evaluation,
export, summary, plots), then a random delay within that phase's length as the straight run measured it. The
last fifth of each run's kills are final-phase ones; the others aim at progress spread over the run.

**Where it landed** is read with the processes frozen (SIGSTOP) right before the SIGKILL: a new ``.tmp-step_*``
folder is a checkpoint save (of the step being trained) or the deletion of an old checkpoint (``--keep-last``),
a temporary in ``best/`` an export, the last record the attempt logged says the rest (:func:`landed`).

**The verdict** on each finished run: :func:`benchmarks.kills.verdict.verify_run`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accel_train.doctor.launching import REPO, child_env, script_cmd
from benchmarks.kills.verdict import ATOMIC_TMP, report, verify_run

EVAL_EVERY, CHECKPOINT_EVERY = 15, 10
#: One run: LeNet on 20 synthetic classes (the accuracy improves over many evaluations: many best/ exports),
#: 64 steps an epoch (the epoch ends evaluate and checkpoint too), every record logged, plots on.
RUN_ARGS = (
    "--model", "lenet", "--dataset", "synthetic", "--synthetic-classes", "20", "--lr", "0.0005",
    "--global-batch-size", "32", "--log-every", "1", "--eval-every", str(EVAL_EVERY),
    "--checkpoint-every", str(CHECKPOINT_EVERY), "--threads", "1", "--report-to", "none", "--no-progress",
    "--resume", "auto",
)  # fmt: skip
STEPS_PER_EPOCH = 2048 // 32  # --synthetic-size (default 2048) / --global-batch-size
TRIGGERS = {"time": 0.2, "step": 0.25, "checkpoint": 0.25, "eval": 0.15, "export": 0.15}
POLL_S = 0.001


def command(run: Path, steps: int, processes: int) -> list[str]:
    args = (*RUN_ARGS, "--max-steps", str(steps), "--output-dir", str(run))
    return script_cmd("train.py", *args, config="multi_cpu.yaml" if processes == 2 else None)


# ---- watching a run ------------------------------------------------------------------------------------------------
class MetricsTail:
    """The records one attempt appends to ``metrics.jsonl`` (from the last whole line on when it starts; a restart
    moving the file to ``abandoned/`` and starting a new one is followed)."""

    def __init__(self, path: Path):
        self.path, self.records, self._buf = path, [], b""
        try:
            self._ino = os.stat(path).st_ino
            data = path.read_bytes()
            self._offset = data.rfind(b"\n") + 1  # a half line a killed writer left is cut by the resume
        except FileNotFoundError:
            self._ino, self._offset = None, 0

    def read(self) -> list[dict]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self.records
        if st.st_ino != self._ino:
            self._ino, self._offset, self._buf = st.st_ino, 0, b""
        if st.st_size > self._offset:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
            self._offset += len(chunk)
            *lines, self._buf = (self._buf + chunk).split(b"\n")
            for line in lines:
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    pass  # judged in verify_run
        return self.records


def _ids(folder: Path) -> set[tuple[str, int]]:
    """(name, inode) of the entries of ``folder``: what was there before an attempt started."""
    try:
        return {(e.name, e.inode()) for e in os.scandir(folder)}
    except OSError:
        return set()


def _new(folder: Path, before: set[tuple[str, int]], test) -> list[str]:
    return [name for name, ino in _ids(folder) - before if test(name)]


def _tree(root: int) -> list[int]:
    """``root`` and every process below it (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += parents.get(pid, [])
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [v for v in env if v.startswith(b"RANK=")]
    return int(found[0][5:]) if found else None


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# ---- the straight run ----------------------------------------------------------------------------------------------
@dataclass
class Reference:
    """The straight run, and how long each phase took in it (the kill delays are drawn within these)."""

    path: Path
    steps: int
    start_s: float  # the process start to its first record
    step_s: float
    eval_s: float
    save_s: float
    finish_s: float  # the last train record to the process's exit
    evals: list[int] = field(default_factory=list)
    improved: list[int] = field(default_factory=list)  # evaluations that rewrote best/


def straight_run(work: Path, steps: int, processes: int, log: Path) -> Reference:
    path = work / "straight"
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command(path, steps, processes), cwd=REPO, env=child_env(), stdout=out, stderr=subprocess.STDOUT
        )
    tail, first, last_train = MetricsTail(path / "metrics.jsonl"), None, None
    while proc.poll() is None:
        records = tail.read()
        first = first or (time.monotonic() if records else None)
        if records and records[-1]["event"] == "train" and records[-1]["step"] == steps and last_train is None:
            last_train = time.monotonic()
        time.sleep(POLL_S * 5)
    end = time.monotonic()
    if proc.returncode != 0:
        raise RuntimeError(f"the straight run failed (exit {proc.returncode}); see {log}")
    return _measure(path, steps, first or t0, t0, last_train or end, end)


def _measure(path: Path, steps: int, first: float, t0: float, last_train: float, end: float) -> Reference:
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r["time_s"] for r in records if r["event"] == "train"}
    gaps = [train[s] - train[s - 1] for s in train if s - 1 in train]
    evals = [r for r in records if r["event"] == "eval"]
    saves, last = [], 0.0
    for r in records:
        if r["event"] == "checkpoint":
            saves.append(r["time_s"] - last)
        last = r["time_s"]
    improved, best = [], -1.0
    for r in evals:
        if r["eval_accuracy"] > best:
            improved.append(r["step"])
            best = r["eval_accuracy"]
    return Reference(
        path=path,
        steps=steps,
        start_s=first - t0,
        step_s=statistics.median(gaps),
        eval_s=statistics.median(r["time_s"] - train[r["step"]] for r in evals),
        save_s=statistics.median(saves),
        finish_s=end - last_train,
        evals=[r["step"] for r in evals],
        improved=improved,
    )


# ---- one attempt ---------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    trigger: str  # time, step, checkpoint, eval, export, final
    target: int  # the step from which the trigger counts
    delay: float  # seconds after the trigger fires (time: after the start)
    rank: int | None = None  # kill this rank only (2 processes); None: every process


def plan_kill(rng: random.Random, ref: Reference, resumes_at: int, nonfinal_left: int, final: bool) -> Plan:
    """The next kill: a trigger, the step it aims past and a delay within the phase's length."""
    if final:
        return Plan("final", ref.steps, rng.uniform(0, 0.75 * ref.finish_s))  # its exit takes the rest
    room = max(1, ref.steps - resumes_at - 1)
    target = min(ref.steps - 1, resumes_at + rng.randint(1, max(1, 2 * room // (nonfinal_left + 1))))
    trigger = rng.choices(list(TRIGGERS), weights=list(TRIGGERS.values()))[0]
    if trigger == "export" and not any(s >= target for s in ref.improved):
        trigger = "eval"
    if trigger == "eval" and not any(target <= s < ref.steps for s in ref.evals):
        trigger = "step"
    delay = {
        "time": rng.uniform(0, ref.start_s + (target - resumes_at) * ref.step_s * 1.5),
        "step": rng.uniform(0, ref.step_s),
        "checkpoint": rng.uniform(0, ref.save_s / 2),  # seen late: the poll, a loaded machine
        "eval": rng.uniform(0, ref.eval_s),
        "export": rng.uniform(0, ref.save_s / 2),
    }[trigger]
    return Plan(trigger, target, delay)


class Attempt:
    """One start of the run's command, watched (its records, new checkpoint folders) and maybe killed."""

    def __init__(self, cmd: list[str], run: Path, log: Path, ref: Reference):
        self.run, self.ref, self.steps = run, ref, ref.steps
        self.before = {sub: _ids(run / sub) for sub in ("", "checkpoints", "best", "model")}
        self.tail = MetricsTail(run / "metrics.jsonl")
        self.t0 = time.monotonic()
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=child_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def new_saves(self) -> list[str]:
        return _new(self.run / "checkpoints", self.before["checkpoints"], lambda n: n.startswith(".tmp-"))

    def fired(self, plan: Plan, records: list[dict]) -> bool:
        """Whether ``plan``'s trigger has happened in this attempt."""
        if plan.trigger == "time":
            return time.monotonic() - self.t0 >= plan.delay
        train = [r["step"] for r in records if r["event"] == "train"]
        if plan.trigger == "final":
            return self.steps in train or any(r["event"] == "resume" and r["step"] == self.steps for r in records)
        if not train or train[-1] < plan.target:
            return False
        last = records[-1]
        if plan.trigger == "checkpoint":
            return bool(self.new_saves())
        if plan.trigger == "eval":
            return last["event"] == "train" and last["step"] in _eval_steps(self.steps)
        if plan.trigger == "export":
            return last["event"] == "eval" and last["step"] in self.ref.improved
        return True

    def wait_for(self, plan: Plan) -> bool:
        """Wait until ``plan`` fires and its delay has passed; False if the process ended first."""
        while self.proc.poll() is None:
            if self.fired(plan, self.tail.read()):
                if plan.trigger != "time":
                    _sleep_while_running(self.proc, plan.delay)
                return self.proc.poll() is None
            time.sleep(POLL_S)
        return False

    def _freeze(self, plan: Plan) -> tuple[list[int], list[int], str]:
        """SIGSTOP what the plan kills (the whole tree, or one rank's); returns (stopped, every process, who)."""
        everyone, who = _tree(self.proc.pid), "all"
        if plan.rank is not None:
            pids = [p for p in everyone if _rank_of(p) == plan.rank][:1]
            if pids:  # before the ranks exist (a kill in the launcher's start-up), the node dies instead
                stopped = _tree(pids[0])
                _signal_all(stopped, signal.SIGSTOP)
                return stopped, everyone, f"rank {plan.rank}"
        stopped: list[int] = []
        while set(everyone) - set(stopped):  # stop until nothing new was started meanwhile
            _signal_all(everyone, signal.SIGSTOP)
            stopped, everyone = everyone, _tree(self.proc.pid)
        return stopped, everyone, who

    def kill(self, plan: Plan) -> dict[str, Any]:
        """Freeze, read where the run is, SIGKILL; returns where it landed. Waits until every process is gone."""
        stopped, everyone, who = self._freeze(plan)
        where = landed(self)
        _signal_all(stopped, signal.SIGKILL)
        rc = self.wait(300)  # one rank killed: the others and the launcher leave on their own
        deadline = time.monotonic() + 120
        while _tree_left(everyone) and time.monotonic() < deadline:
            time.sleep(0.01)
        lingering = _tree_left(everyone)
        _signal_all(lingering, signal.SIGKILL)
        return {**where, "who": who, "returncode": rc, "lingered": len(lingering)}

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None (every process killed) when the run has not ended within ``timeout``: a hang."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_all(_tree(self.proc.pid), signal.SIGKILL)
            self.proc.wait()
            return None


def _tree_left(pids: list[int]) -> list[int]:
    return [p for p in pids if _running(p)]


def _sleep_while_running(proc, seconds: float) -> None:
    end = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(min(POLL_S, max(0.0, end - time.monotonic())))


def _eval_steps(steps: int) -> set[int]:
    """Where the run evaluates: every EVAL_EVERY steps and at each epoch's end."""
    return {s for s in range(1, steps + 1) if s % EVAL_EVERY == 0 or s % STEPS_PER_EPOCH == 0}


def landed(attempt: Attempt) -> dict[str, Any]:
    """Where the (frozen) run is: read from what it wrote, and what it was writing."""
    run, before, ref = attempt.run, attempt.before, attempt.ref
    records = attempt.tail.read()
    train = [r["step"] for r in records if r["event"] == "train"]
    resumed_at = next((r["step"] for r in records if r["event"] == "resume"), None)
    last = records[-1] if records else None
    tmp = ATOMIC_TMP.fullmatch
    at_end = attempt.steps in train or resumed_at == attempt.steps
    saves = attempt.new_saves()
    if saves:
        saved_step = train[-1] if train else resumed_at
        retired = all(int(name.rsplit("_", 1)[1]) != saved_step for name in saves)
        phase = "checkpoint retirement (keep-last)" if retired else "checkpoint save"
    elif _new(run / "best", before["best"], tmp):
        phase = "export best/"
    elif at_end:
        phase = _final_phase(run, before)
    elif last is None:
        opened = any(name == "config.yaml" for name, _ in _ids(run) - before[""])
        phase = "start-up (folder opened)" if opened else "start-up"
    elif last["event"] == "train" and last["step"] in _eval_steps(attempt.steps):
        phase = "eval"
    elif last["event"] == "eval" and last["step"] in ref.improved:
        phase = "export best/"
    else:
        phase = "step"
    has_ckpt = any(n.startswith("step_") for n, _ in _ids(run / "checkpoints"))
    return {"phase": phase, "step": train[-1] if train else resumed_at, "had_checkpoint": has_ckpt}


def _final_phase(run: Path, before: dict[str, set]) -> str:
    tmp = ATOMIC_TMP.fullmatch
    top = _ids(run) - before[""]
    if any(name == "summary.json" for name, _ in top):
        return "final: after summary"
    if _new(run / "model", before["model"], tmp):
        return "final: export"
    if any(tmp(name) for name, _ in top) or _new(run / "model", before["model"], lambda n: n == "model.safetensors"):
        return "final: summary"
    return "final: evaluation"


# ---- the campaign --------------------------------------------------------------------------------------------------
def _latest_checkpoint(run: Path) -> int:
    steps = [int(p.name[5:]) for p in (run / "checkpoints").glob("step_*") if (p / "progress.json").is_file()]
    return max(steps, default=0)


def run_with_kills(
    rng: random.Random, ref: Reference, run: Path, logs: Path, kills: int, processes: int, rank_kills: float
) -> dict[str, Any]:
    """One run to its end with up to ``kills`` kills; returns its attempts and verdict."""
    final_kills = max(1, kills // 5) if kills >= 3 else 0
    attempts: list[dict[str, Any]] = []
    failures = 0
    while len(attempts) < 4 * kills + 20:
        killed = sum(a["killed"] for a in attempts)
        left = kills - killed
        plan = None
        if left > 0:
            plan = plan_kill(rng, ref, _latest_checkpoint(run), max(0, left - final_kills), left <= final_kills)
            if processes > 1 and rng.random() < rank_kills:
                plan.rank = rng.randrange(processes)
        log = logs / f"{run.name}-attempt{len(attempts):03d}.log"
        attempt = Attempt(command(run, ref.steps, processes), run, log, ref)
        record: dict[str, Any] = {"attempt": len(attempts), "plan": asdict(plan) if plan else None, "log": str(log)}
        if plan is not None and attempt.wait_for(plan):
            record.update(killed=True, **attempt.kill(plan))
        else:
            rc = attempt.wait(900)
            text = log.read_text(errors="replace")
            record.update(killed=False, returncode=rc, in_use="is in use by another run" in text)
            if rc != 0:  # None: it hung
                failures += 1
                record["error"] = text[-2000:]
        record["seconds"] = round(time.monotonic() - attempt.t0, 2)
        attempts.append(record)
        _print_attempt(run.name, record)
        if not record["killed"] and record["returncode"] == 0:
            return {"run": str(run), "attempts": attempts, "verdict": verify_run(run, ref.path, ref.steps)}
        if failures >= 3:
            break
    return {"run": str(run), "attempts": attempts, "verdict": {"ok": False, "problems": ["did not finish"]}}


def _print_attempt(name: str, rec: dict[str, Any]) -> None:
    plan = rec["plan"]
    if rec["killed"]:
        print(
            f"{name} attempt {rec['attempt']}: killed ({rec['who']}) aiming at {plan['trigger']} >= step "
            f"{plan['target']}; landed in {rec['phase']} at step {rec['step']} ({rec['seconds']}s)",
            flush=True,
        )
    else:
        more = " (refused: folder in use)" if rec.get("in_use") else ""
        print(f"{name} attempt {rec['attempt']}: exit {rec['returncode']}{more} ({rec['seconds']}s)", flush=True)


def campaign(trials: int, work: Path, steps: int, processes: int, seed: int, per_run: int, rank_kills: float) -> dict:
    """``trials`` kills over as many runs as they need; returns the whole record (see the module docstring)."""
    rng = random.Random(seed)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ref = straight_run(work, steps, processes, logs / "straight.log")
    print(f"straight run: {json.dumps({k: v for k, v in asdict(ref).items() if k.endswith('_s')})}", flush=True)
    runs: list[dict[str, Any]] = []
    killed = 0
    while killed < trials:
        run = work / f"run_{len(runs):02d}"
        result = run_with_kills(rng, ref, run, logs, min(per_run, trials - killed), processes, rank_kills)
        runs.append(result)
        done = sum(a["killed"] for a in result["attempts"])
        killed += done
        print(f"{run.name}: {done} kills, {'ok' if result['verdict']['ok'] else result['verdict']}", flush=True)
        if done == 0 and not result["verdict"]["ok"]:
            break
    return report(runs, processes, time.monotonic() - t0, asdict(ref) | {"path": str(ref.path)})
