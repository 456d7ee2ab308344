#!/usr/bin/env python
"""Mutation check (issue 32): plant small plausible bugs in the code that carries the project's promises, one at a
time, and check that the default tests catch each of them.

    python3 scripts/mutation_check.py                       # every mutant: a table and a summary line
    python3 scripts/mutation_check.py --json > mutation.json
    python3 scripts/mutation_check.py --list                # the mutants (and whether any is stale); runs nothing
    python3 scripts/mutation_check.py --only clipping-switched-off best-chosen-in-reverse --timeout 300

Why: a green suite says the tests pass, not that they would fail on a broken promise. Before the tests of
tests/integration/test_promises_runs.py existed, clipping switched off, the best checkpoint chosen in reverse or
exports keeping ``module.`` prefixes all passed the default suite. Each mutant (the list is in
scripts/mutation/mutants.py) is one such bug; a mutant the tests do not catch is a promise nothing checks.

How: the tracked and untracked-not-ignored files of the working tree (so uncommitted work is checked too) are
copied into a temporary folder; there, each mutant replaces its ``old`` snippet (which must occur exactly once
in its file, else the mutant is "stale": the code moved and the list must follow) with ``new``, runs
``python3 -m pytest -x -q -p no:cacheprovider -rfE -n 0 <its tests>`` with the copy first on PYTHONPATH (the
tests' child processes inherit it: ``accel_train.doctor.launching.child_env`` keeps PYTHONPATH), and puts the file back.
First the union of all the mutants' tests runs once unmutated (the baseline): a mutant "caught" by a test that
already fails means nothing, so a failing baseline stops the check.

Results: "caught" (pytest exit 1: a test failed), "survived" (exit 0), "timeout" (over --timeout; not caught),
"error" (exit 2-5: collection or usage error, no tests; not caught), "stale" (not run). A mutant whose
``equivalent`` field argues that it cannot change behaviour is listed but not run.

Exit status: 0 every mutant run was caught; 1 a mutant survived, timed out or errored; 2 the check itself cannot
be trusted (a stale mutant, a failing baseline, the copy importing another accel_train, bad arguments).
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from mutation.mutants import MUTANTS, CheckError, load_mutants, select
from mutation.report import exit_status, list_mutants, summary_line, table
from mutation.runner import kill_running, run_check

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TIMEOUT = 600.0
DEFAULT_BASELINE_TIMEOUT = 3600.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON (progress goes to stderr)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    p.add_argument("--list", action="store_true", help="list the mutants and check they are not stale; run nothing")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per mutant (default %(default)g)")
    p.add_argument(
        "--baseline-timeout", type=float, default=DEFAULT_BASELINE_TIMEOUT, help="seconds for the unmutated run"
    )
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)")
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout to copy (default: this script's)")
    p.add_argument("--mutants", type=Path, help="a JSON list of mutants to use instead of the built-in list")
    p.add_argument("--logs", type=Path, help="keep each pytest run's output in this folder")
    args = p.parse_args(argv)
    if args.timeout <= 0 or args.baseline_timeout <= 0 or args.jobs < 1:
        p.error("--timeout and --baseline-timeout must be > 0 and --jobs >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repo = args.repo.resolve()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        mutants = select(load_mutants(args.mutants) if args.mutants else MUTANTS, args.only)
        if args.list:
            return list_mutants(repo, mutants, args.json)
        report = run_check(repo, mutants, args.timeout, args.baseline_timeout, args.jobs, args.logs)
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(exc), "mutants": []}))
        return 2
    finally:
        kill_running()
    if args.json:
        print(json.dumps(report, indent=2))
        print(summary_line(report), file=sys.stderr)
    else:
        print(table(report))
        print(summary_line(report))
    return exit_status(report)


if __name__ == "__main__":
    sys.exit(main())
