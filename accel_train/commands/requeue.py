"""What ``scripts/slurm/train.sbatch`` asks between the attempts of a job: the run's step, and whether to requeue.

python -m accel_train.commands.requeue step -- TRAIN_ARGS
    prints the global step of the run's latest complete checkpoint (0 without one): the run folder is the one
    ``scripts/train.py TRAIN_ARGS`` writes (``--output-dir``, else ``--config``'s ``output_dir``, else the default)
python -m accel_train.commands.requeue decide --job J --restarts R --start-step S --max-stalled K
        [--max-requeues N] -- TRAIN_ARGS
    after an attempt stopped at the time limit: exit 0 to requeue the job, 1 not to; one line says why

A job requeues as long as its attempts make progress (a checkpoint newer than step S, the step when the attempt
started) and stops after K attempts in a row that saved none, or (``--max-requeues``) after N restarts in all. The
count of attempts in a row without progress survives the requeue in the run folder (``run_dir.REQUEUE_STATE``,
keyed by the job id: a new job starts counting at 0).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from accel_train.cli import ArgumentParser
from accel_train.errors import UserError
from accel_train.run_dir import REQUEUE_STATE, RunDir


@dataclass(frozen=True)
class Decision:
    requeue: bool
    stalled: int  # attempts in a row, this one included, that saved no new checkpoint
    line: str


def decide(
    *, start_step: int, step: int, stalled_before: int, restarts: int, max_stalled: int, max_requeues: int | None
) -> Decision:
    """Requeue after an attempt that went from ``start_step`` to ``step``? ``stalled_before``: the attempts in a row
    before it that made no progress; ``restarts``: the job's restarts so far (``SLURM_RESTART_COUNT``). The line
    goes on with what the caller does: "requeueing job J" or nothing."""
    progressed = step > start_step
    stalled = 0 if progressed else stalled_before + 1
    did = f"this attempt went from step {start_step} to {step}" if progressed else f"no progress past step {step}"
    if max_requeues is not None and restarts >= max_requeues:
        why = f"{restarts} restart(s) of MAX_REQUEUES={max_requeues} spent"
        return Decision(False, stalled, f"not requeued: {why} ({did}; submit again to continue)")
    if stalled >= max_stalled:
        why = f"{stalled} attempt(s) in a row saved no checkpoint past step {step} (MAX_STALLED_REQUEUES={max_stalled})"
        return Decision(
            False,
            stalled,
            f"not requeued: {why}; an attempt must reach a step boundary and save before the time limit: read this "
            "log for why it did not (start-up time, a step longer than the warning), then submit again to continue",
        )
    if progressed:
        return Decision(True, 0, did)
    return Decision(
        True, stalled, f"{did} ({stalled} attempt(s) in a row; the job stops at MAX_STALLED_REQUEUES={max_stalled})"
    )


def run_folder(train_args: Sequence[str]) -> RunDir:
    """The run folder ``scripts/train.py train_args`` writes: flags over ``--config`` over the default."""
    from accel_train.config import TrainConfig, build_parser

    ns = vars(build_parser().parse_known_args(list(train_args))[0])
    if "output_dir" not in ns and ns.get("config"):
        from accel_train.config_yaml import load_yaml_config

        ns.update(load_yaml_config(ns["config"], TrainConfig))
    return RunDir(ns.get("output_dir") or TrainConfig.output_dir)


def last_step(run: RunDir) -> int:
    """The global step of the run's latest complete checkpoint; 0 without one."""
    from accel_train.checkpoint.state import list_checkpoints

    found = list_checkpoints(run)
    return found[-1][0] if found else 0


def _stalled_before(run: RunDir, job: str) -> int:
    """Attempts in a row of job ``job`` that made no progress, as the last decision recorded it."""
    try:
        saved = json.loads((run / REQUEUE_STATE).read_text())
        return int(saved["stalled"]) if saved.get("job") == job else 0
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return 0  # none yet (or unreadable): this job has no attempt without progress on record


def _record(run: RunDir, job: str, decision: Decision, step: int) -> None:
    from accel_train.fsio import write_json_atomic

    run.path.mkdir(parents=True, exist_ok=True)  # an attempt stopped before the run made its folder
    write_json_atomic(run / REQUEUE_STATE, {"job": job, "stalled": decision.stalled, "step": step}, "requeue state")


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m accel_train.commands.requeue", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("step", help="print the run's last checkpointed step")
    dec = sub.add_parser("decide", help="exit 0 to requeue the job after a time-limit stop, 1 not to")
    dec.add_argument("--job", required=True, help="the Slurm job id (SLURM_JOB_ID)")
    dec.add_argument("--restarts", type=int, default=0, help="SLURM_RESTART_COUNT")
    dec.add_argument("--start-step", type=int, required=True, help="the run's step when the attempt started")
    dec.add_argument("--max-stalled", type=int, default=2, help="attempts in a row without progress that end the job")
    dec.add_argument("--max-requeues", type=int, default=None, help="restarts in all that end the job (default: none)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = _parser().parse_args(ours)
    run = run_folder(train_args)
    step = last_step(run)
    if args.what == "step":
        print(step)
        return 0
    decision = decide(
        start_step=args.start_step,
        step=step,
        stalled_before=_stalled_before(run, args.job),
        restarts=args.restarts,
        max_stalled=args.max_stalled,
        max_requeues=args.max_requeues,
    )
    _record(run, args.job, decision, step)
    then = f": requeueing job {args.job} (restart {args.restarts + 1})" if decision.requeue else ""
    stopped = "accel_train: time limit: the ranks stopped (the last checkpoint is kept)"
    print(f"{stopped}; {decision.line}{then}", flush=True)
    return 0 if decision.requeue else 1


def cli_main() -> None:
    try:
        code = main()
    except UserError as exc:
        print(f"error: {' '.join(str(exc).splitlines())}", file=sys.stderr, flush=True)
        code = exc.exit_code
    sys.exit(code)


if __name__ == "__main__":
    cli_main()
