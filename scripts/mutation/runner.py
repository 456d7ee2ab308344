"""The mutation check's runner: the private copy of the working tree (uncommitted work included) that imports its
own accel_train, pytest run there with a timeout that ends every process it started, the baseline of the
unmutated tests, each mutant planted, run and put back, and what a run's exit code and output say (``judge``)."""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mutation.mutants import PACKAGE, CheckError, Mutant, stale_reason


@dataclass
class Result:
    name: str
    promise: str
    status: str  # caught | survived | timeout | error | stale
    by: str | None = None
    seconds: float = 0.0
    detail: str = ""
    file: str = ""
    tests: list[str] = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return self.status == "caught"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "promise": self.promise,
            "caught": self.caught,
            "by": self.by,
            "seconds": round(self.seconds, 1),
            "status": self.status,
            "detail": self.detail,
        }


# ---- the private copy ------------------------------------------------------------------------------------------------
def working_tree_files(repo: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files of ``repo``'s working tree (uncommitted work included)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CheckError(f"cannot list the files of {repo} with git ({exc}); run it in a git checkout") from None
    return sorted({name for name in os.fsdecode(out).split("\0") if name})


def make_copy(repo: Path, dest: Path, files: list[str]) -> None:
    """Copy ``files`` (relative to ``repo``) into ``dest``; files deleted in the working tree stay deleted."""
    for name in files:
        src, dst = repo / name, dest / name
        if not os.path.lexists(src) or src.is_dir():
            continue  # deleted but still tracked, or a submodule
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def child_env(copy: Path, repo: Path) -> dict[str, str]:
    """This environment with the copy first on PYTHONPATH, nothing of ``repo`` on it, and no bytecode written.

    No .pyc: a mutant and the original of the same size written within one second would share a cached one.
    No PYTEST_* variables: an outer pytest's (PYTEST_ADDOPTS, xdist's worker ids) would change how the runs go.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not _inside(Path(p), repo)]
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *keep])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


_PROBE = (
    "import importlib.util, json, subprocess, sys\n"
    f'child = "import importlib.util; print(importlib.util.find_spec({PACKAGE!r}).origin)"\n'
    f"here = importlib.util.find_spec({PACKAGE!r}).origin\n"
    "there = subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip()\n"
    "print(json.dumps([here, there]))\n"
)


def check_isolation(copy: Path, repo: Path) -> None:
    """The copy's package is what a run there imports, in its own process and in a child it starts.

    The checkout may be installed in editable mode (a finder that maps the package to ``repo``); it comes after
    PYTHONPATH on the import path, which this proves instead of assuming.
    """
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=copy, env=child_env(copy, repo), capture_output=True, text=True
    )
    try:
        origins = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " ".join(proc.stderr.split())[-300:]
        raise CheckError(
            f"cannot import {PACKAGE} in the copy {copy}: {tail}; check that the copy is complete"
        ) from None
    wrong = [o for o in origins if not o or not _inside(Path(o), copy)]
    if wrong:
        raise CheckError(
            f"the copy {copy} imports {PACKAGE} from {wrong[0]}, not from the copy: a mutant there would "
            "test other code; remove what puts that path before PYTHONPATH (a .pth file or PYTHONHOME)"
        )


# ---- running pytest --------------------------------------------------------------------------------------------------
def pytest_cmd(tests: list[str]) -> list[str]:
    """Sequential (xdist's ``-n 0``), deterministic (no random order), stop at the first failure, list failures."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "0"]
    if importlib.util.find_spec("pytest_randomly") is not None:
        cmd += ["-p", "no:randomly"]
    return [*cmd, *tests]


_RUNNING: set[subprocess.Popen] = set()
_RUNNING_LOCK = threading.Lock()


def run_pytest(copy: Path, repo: Path, tests: list[str], timeout: float, log: Path) -> tuple[int | None, float, str]:
    """``(exit code or None on timeout, seconds, output)`` of pytest on ``tests`` in ``copy``.

    pytest runs in its own session so that a timeout ends it with every process it started (the tests launch
    ``accelerate launch`` ranks); its output goes to ``log`` (a pipe could be held open by a stray grandchild).
    """
    basetemp = log.with_suffix(".tmp")
    shutil.rmtree(basetemp, ignore_errors=True)
    cmd = [*pytest_cmd(tests), f"--basetemp={basetemp}"]
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd, cwd=copy, env=child_env(copy, repo), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        code: int | None = None
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _kill(proc)  # on a timeout, and after a failing test whose children still run (blocked ranks)
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
    seconds = time.perf_counter() - start
    shutil.rmtree(basetemp, ignore_errors=True)
    return code, seconds, log.read_text(encoding="utf-8", errors="replace")


def _kill(proc: subprocess.Popen) -> None:
    """End ``proc``'s whole process group (it leads its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def kill_running() -> None:
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _kill(proc)


_OUTCOME = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$")


def first_failure(output: str) -> str | None:
    """The node id of the first FAILED line of pytest's short summary (``-rfE``), else of the first ERROR line."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        match = _OUTCOME.match(line.strip())
        if match and match.group(1) not in found:
            found[match.group(1)] = match.group(2).strip()
    return found.get("FAILED") or found.get("ERROR")


def _tail(output: str, lines: int = 3) -> str:
    kept = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-400:]


def judge(mutant: Mutant, code: int | None, seconds: float, output: str) -> Result:
    """What a run of ``mutant``'s tests says: exit 1 (a test failed) is the only "caught"."""
    result = Result(mutant.name, mutant.promise, "error", seconds=seconds, file=mutant.file, tests=list(mutant.tests))
    if code is None:
        result.status, result.detail = "timeout", f"its tests ran past {seconds:.0f} s"
    elif code == 1:
        result.status, result.by = "caught", first_failure(output)
    elif code == 0:
        result.status, result.detail = "survived", "its tests pass with the bug planted"
    else:
        result.detail = f"pytest exit {code}: {_tail(output)}"
    return result


def plant(copy: Path, mutant: Mutant) -> bytes:
    """Replace ``old`` by ``new`` in the copy; returns the file's original bytes for :func:`restore`."""
    path = copy / mutant.file
    original = path.read_bytes()
    text = original.decode("utf-8")
    path.write_bytes(text.replace(mutant.old, mutant.new, 1).encode("utf-8"))
    return original


def restore(copy: Path, mutant: Mutant, original: bytes) -> None:
    (copy / mutant.file).write_bytes(original)


# ---- the check -------------------------------------------------------------------------------------------------------
def baseline_groups(mutants: tuple[Mutant, ...]) -> list[list[str]]:
    """The union of the mutants' tests as pytest invocations: plain node ids and files together (a node id inside
    a file that runs whole is dropped), each selection that carries options (``-k ...``) on its own."""
    plain: list[str] = []
    with_options: list[list[str]] = []
    for mutant in mutants:
        if any(arg.startswith("-") for arg in mutant.tests):
            if list(mutant.tests) not in with_options:
                with_options.append(list(mutant.tests))
            continue
        plain += [t for t in mutant.tests if t not in plain]
    whole = {t for t in plain if "::" not in t}
    plain = [t for t in plain if "::" not in t or t.split("::")[0] not in whole]
    return ([plain] if plain else []) + with_options


def run_baseline(copy: Path, repo: Path, mutants: tuple[Mutant, ...], timeout: float, logs: Path) -> float:
    """Run the union of the tests unmutated; a failure ends the check (exit 2) with one line."""
    total = 0.0
    for i, tests in enumerate(baseline_groups(mutants)):
        code, seconds, output = run_pytest(copy, repo, tests, timeout, logs / f"baseline-{i}.log")
        total += seconds
        if code != 0:
            what = "ran past the baseline timeout" if code is None else f"fails (pytest exit {code})"
            failed = first_failure(output) or _tail(output, 1)
            raise BaselineError(
                f"the baseline {what} without any mutant: {failed}; fix the suite first (a mutant 'caught' by a "
                f"failing test means nothing), or raise --baseline-timeout"
            )
    return total


class BaselineError(CheckError):
    """The unmutated tests fail: no mutant result could be trusted."""


def run_check(
    repo: Path, mutants: tuple[Mutant, ...], timeout: float, baseline_timeout: float, jobs: int, logs: Path | None
) -> dict[str, Any]:
    """Baseline, then each mutant in a private copy; returns the report (see ``--json``)."""
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="mutation-check-"))
    try:
        log_dir = logs or work / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        files = working_tree_files(repo)
        copies: queue.Queue[Path] = queue.Queue()
        for i in range(max(1, jobs)):
            copy = work / f"copy-{i}"
            make_copy(repo, copy, files)
            copies.put(copy)
        first = work / "copy-0"
        check_isolation(first, repo)
        stale = {m.name: stale_reason(first, m) for m in mutants}
        to_run = [m for m in mutants if not stale[m.name] and not m.equivalent]
        _progress(f"baseline: {sum(len(g) for g in baseline_groups(tuple(to_run)))} test selections, unmutated")
        baseline_s = run_baseline(first, repo, tuple(to_run), baseline_timeout, log_dir) if to_run else 0.0
        _progress(f"baseline passed in {baseline_s:.0f} s")
        done: list[str] = []

        def one(mutant: Mutant) -> Result:
            copy = copies.get()
            try:
                original = plant(copy, mutant)
                try:
                    log = log_dir / f"{mutant.name}.log"
                    code, seconds, output = run_pytest(copy, repo, list(mutant.tests), timeout, log)
                finally:
                    restore(copy, mutant, original)
            finally:
                copies.put(copy)
            result = judge(mutant, code, seconds, output)
            with _RUNNING_LOCK:
                done.append(mutant.name)
                _progress(
                    f"[{len(done)}/{len(to_run)}] {mutant.name}: {result.status} {result.by or ''} ({seconds:.0f} s)"
                )
            return result

        ran = {r.name: r for r in run_all(one, to_run, jobs)}
        results = []
        for m in mutants:
            if stale[m.name]:
                results.append(
                    Result(m.name, m.promise, "stale", detail=stale[m.name], file=m.file, tests=list(m.tests))
                )
            elif m.name in ran:
                results.append(ran[m.name])
        return {
            "mutants": [r.to_json() for r in results],
            "equivalent": [
                {"name": m.name, "promise": m.promise, "why": m.equivalent} for m in mutants if m.equivalent
            ],
            "baseline_s": round(baseline_s, 1),
            "total_s": round(time.perf_counter() - start, 1),
            "timeout_s": timeout,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_all(one, mutants: list[Mutant], jobs: int) -> list[Result]:
    """``one(mutant)`` for each mutant, ``jobs`` at a time. An interruption (Ctrl-C, SIGTERM) cancels the mutants
    not started and ends the pytest runs under way, instead of waiting for them."""
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = [pool.submit(one, m) for m in mutants]
        results = [f.result() for f in futures]
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        kill_running()
        raise
    pool.shutdown()
    return results


def _progress(line: str) -> None:
    print(f"mutation check: {line}", file=sys.stderr, flush=True)
