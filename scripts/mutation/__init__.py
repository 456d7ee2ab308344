"""The parts of the mutation check, whose command line is ``scripts/mutation_check.py``: the mutant list and what
a mutant is (``mutants``), the runner that plants each mutant in a private copy of the working tree and runs its
tests (``runner``), and the table, summary and exit status of a report (``report``). Standard library only."""
