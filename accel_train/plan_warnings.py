"""Warnings about a run's plan that only make sense once its length is known (``build`` computes it).

Settings that are valid on their own but do nothing in a run this short: a warm-up longer than the run
(the LR never reaches ``--lr``), ``--eval-every`` / ``--checkpoint-every`` beyond the last step (they never
fire); crop settings for a dataset that is not augmented. Each is one ``warning:`` line; the run goes on.
The dataset's own notes (e.g. how an image folder of mixed modes was converted) are printed here too, once,
on the main process.
"""

from __future__ import annotations

from typing import Any


def run_length_warnings(cfg: Any, total_steps: int) -> list[str]:
    """The warnings for ``cfg`` (a ``TrainConfig``) in a run of ``total_steps`` optimizer steps."""
    run = f"the run has {total_steps} optimizer step(s)"
    warnings = []
    if cfg.warmup_steps > total_steps:
        warnings.append(
            f"--warmup-steps {cfg.warmup_steps} is longer than the run ({run}): the LR never reaches --lr "
            f"{cfg.lr:g}; use at most {total_steps} warm-up steps"
        )
    if cfg.eval_every > total_steps:
        warnings.append(
            f"--eval-every {cfg.eval_every} is beyond the run ({run}): it never fires, evaluation happens only at "
            "epoch ends and at the end; use a smaller value, or 0"
        )
    if cfg.checkpoint_every > total_steps:
        ends = "epoch-end checkpoints only" if cfg.checkpoint_epochs else "no checkpoint before the end"
        warnings.append(
            f"--checkpoint-every {cfg.checkpoint_every} is beyond the run ({run}): it never fires ({ends}); "
            "use a smaller value, or 0"
        )
    return warnings


def warn_about_run(cfg: Any, rt: Any, splits: Any, total_steps: int) -> None:
    """Print the run-length warnings (``rt.warn``) and the dataset's notes (``splits.extra['notes']``)."""
    for message in run_length_warnings(cfg, total_steps):
        rt.warn(message)
    if (cfg.crop_padding is not None or cfg.crop_padding_mode != "constant") and not splits.extra.get("augment"):
        rt.warn(
            f"--crop-padding/--crop-padding-mode change the random crop, but {cfg.dataset} is not augmented in this "
            "run; pass --augment (folders, hub datasets and mnist augment only when asked), or drop them"
        )
    for note in splits.extra.get("notes", ()):
        rt.warn(note)
