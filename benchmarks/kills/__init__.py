"""The kill campaign, ``python scripts/soak.py kills --trials N [--processes 2]`` (docs/faults.md): ``campaign``
SIGKILLs a training run at random moments (steps, saves, evaluations, exports, the summary) and resumes it each
time; ``verdict`` judges each finished run against a straight one (weights bit for bit, metrics.jsonl and the
folder whole) and writes the report.
"""
