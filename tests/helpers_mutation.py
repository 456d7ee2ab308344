"""scripts/mutation_check.py's modules, for tests/unit/test_mutation_check.py and
tests/integration/test_mutation_check_runs.py."""

from __future__ import annotations

import sys

from conftest import REPO

SCRIPT = REPO / "scripts" / "mutation_check.py"


def _load():
    """The check's modules (scripts/mutation/), imported as the script imports them: with scripts/ first on the path."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from mutation import mutants, report, runner
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return mutants, runner, report


M, RUN, REP = _load()  # the mutant list, the runner, the report
