"""The goals of issues 12 and 29, each with its measured value and whether it is met: portable vs plain, data wait,
DDP scaling, bf16 on AMX CPUs, the default run (in seconds, and against the plain script doing its work), time to
accuracy (digits vs the seed-000 recipe, MNIST-format data vs pytorch/examples' recipe), ``--help``, the airbench
recipe. Reported, never asserted: nothing here fails a run."""

from __future__ import annotations

from typing import Any

from benchmarks.common import _ratio
from benchmarks.speed.speedrun import TARGET as TARGET_SPEEDRUN
from benchmarks.speed.time_to_accuracy import TARGET_ACCURACY

GOAL_RATIO_VS_PLAIN = 0.98
GOAL_DATA_WAIT = 0.05
GOAL_DDP_SCALING = 0.9
GOAL_BF16_SPEEDUP = 2.0  # on CPUs with AMX (issue 12); CPUs without AMX report it as not applicable
GOAL_BF16_MFU = 0.25
GOAL_DEFAULT_RUN_S = 4.0
GOAL_DEFAULT_RUN_ACCURACY = 0.97
GOAL_T2A_SPEEDUP = 5.0
GOAL_HELP_S = 2.0
GOAL_STARTUP_RATIO = 1.25  # issue 29: the default run <= 1.25x the plain script doing the same work
GOAL_MNIST_SPEEDUP = 4.0  # issue 29: time to 98% on MNIST-format data >= 4x faster than pytorch/examples' recipe
GOAL_BF16_GAIN_KEPT = 0.95  # issue 29: the portable's bf16/fp32 gain >= 0.95x the plain loop's on the same model


def _goal(
    goal: str, value: float | None, threshold: float, higher_is_better: bool = True, best_window: float | None = None
) -> dict[str, Any]:
    met = None if value is None else (value >= threshold if higher_is_better else value <= threshold)
    return {"goal": goal, "value": value, "value_best_window": best_window, "threshold": threshold, "met": met}


def evaluate_goals(
    results: list[dict[str, Any]],
    t2a: dict[str, Any] | None,
    help_timing: dict[str, Any],
    default_run: dict[str, Any] | None = None,
    cpu_kind: str = "unknown",
) -> list[dict[str, Any]]:
    """Each goal of the issue with the measured value; reported, never asserted.

    ``value`` uses the steady-state means (summary.json); ``value_best_window`` the best
    10-step windows of both sides (less sensitive to other processes on the CPU), where measured.
    """
    goals = []
    index = {(r["setup"], r["model"]): r for r in results}
    for r in results:
        if r.get("ratio_vs_plain") is not None and (r["setup"] in ("cpu_fp32", "cuda_fp32") or r["model"] == "lenet"):
            where = r["setup"] if r["setup"] != "cuda_fp32" else f"1 GPU, {r.get('workload', 'mnist')}"
            goals.append(
                _goal(
                    f"portable >= {GOAL_RATIO_VS_PLAIN}x plain samples/s ({r['model']}, {where})",
                    r["ratio_vs_plain"],
                    GOAL_RATIO_VS_PLAIN,
                    best_window=r.get("ratio_vs_plain_best_window"),
                )
            )
    waits = [r for r in results if r["data_wait_fraction"] is not None]
    if waits:
        worst = max(waits, key=lambda r: r["data_wait_fraction"])
        goals.append(
            _goal(
                f"data wait <= {GOAL_DATA_WAIT:.0%} of step time (worst: {worst['model']}, {worst['setup']})",
                worst["data_wait_fraction"],
                GOAL_DATA_WAIT,
                higher_is_better=False,
            )
        )
    for r in results:
        base = index.get(("cpu_fp32", r["model"]))
        if r["setup"] == "gloo_2proc" and base:
            goals.append(
                _goal(
                    f"2-process gloo >= {GOAL_DDP_SCALING}x 1-process samples/s ({r['model']}, same global batch)",
                    r.get("speedup_vs_cpu_fp32"),
                    GOAL_DDP_SCALING,
                    best_window=_ratio(r.get("best_window_samples_per_s"), base.get("best_window_samples_per_s")),
                )
            )
    goals += _bf16_goals(index, cpu_kind)
    goals += _default_run_goals(default_run)
    goals += _mnist_goals((t2a or {}).get("mnist_vs_examples"))
    digits = (t2a or {}).get("digits") or {}
    if digits.get("speedup") is not None:
        lower = bool(digits.get("speedup_is_lower_bound"))
        g = _goal(
            f"time to {TARGET_ACCURACY:.0%} on digits >= {GOAL_T2A_SPEEDUP:g}x faster than the seed-000 recipe"
            + (" (lower bound: seed-000 did not reach it in its budget)" if lower else ""),
            digits["speedup"],
            GOAL_T2A_SPEEDUP,
        )
        if lower and not g["met"]:
            g["met"] = None  # a lower bound below the goal decides nothing
        goals.append(g)
    if "median_s" in help_timing:
        goals.append(
            _goal(
                f"python scripts/train.py --help < {GOAL_HELP_S:g} s",
                help_timing["median_s"],
                GOAL_HELP_S,
                higher_is_better=False,
            )
        )
    return goals


def _bf16_goals(index: dict[tuple[str, str], dict[str, Any]], cpu_kind: str) -> list[dict[str, Any]]:
    """bf16 resnet18 >= 2x fp32 and bf16 MFU >= 25%: goals for AMX CPUs; elsewhere measured, marked n/a.

    On every CPU kind, each model measured in bf16 and fp32: the portable loop keeps >= 95% of the gain (or loss)
    that the plain loop gets from bf16 on the same model (issue 29), so the loop adds nothing that bf16 pays for.
    """
    goals = []
    for (setup, model), r in sorted(index.items()):
        portable, plain = r.get("speedup_vs_cpu_fp32"), r.get("plain_speedup_vs_cpu_fp32")  # set beside cpu_fp32
        if not setup.startswith("cpu_bf16") or portable is None or not plain:
            continue
        goals.append(
            _goal(
                f"the portable's bf16 gain >= {GOAL_BF16_GAIN_KEPT}x the plain loop's ({model}, {setup} vs cpu_fp32: "
                f"portable {portable:.2f}x, plain {plain:.2f}x; CPU kind: {cpu_kind})",
                portable / plain,
                GOAL_BF16_GAIN_KEPT,
            )
        )
    for setup in ("cpu_bf16", "cpu_bf16_cl"):
        r, base = index.get((setup, "resnet18")), index.get(("cpu_fp32", "resnet18"))
        if not (r and base):
            continue
        tag = f"CPU kind: {cpu_kind}" + ("" if cpu_kind == "amx" else "; the goal is for AMX CPUs")
        speed = _goal(
            f"bf16 >= {GOAL_BF16_SPEEDUP}x fp32 samples/s for resnet18 ({setup} vs cpu_fp32; {tag})",
            r.get("speedup_vs_cpu_fp32"),
            GOAL_BF16_SPEEDUP,
            best_window=_ratio(r.get("best_window_samples_per_s"), base.get("best_window_samples_per_s")),
        )
        mfu = _goal(f"bf16 MFU >= {GOAL_BF16_MFU:.0%} for resnet18 ({setup}; {tag})", r.get("mfu"), GOAL_BF16_MFU)
        for g in (speed, mfu):
            if cpu_kind != "amx":
                g["met"] = None  # not applicable: without AMX bf16 is expected to be slower (README)
            goals.append(g)
    return goals


def _speedrun_goals(speedrun: dict[str, Any]) -> list[dict[str, Any]]:
    if "final_accuracy" not in speedrun:
        return []
    goal = f"airbench recipe: {TARGET_SPEEDRUN:.0%} on {speedrun['data']} (flip TTA, {speedrun['steps']} steps)"
    g = _goal(goal, speedrun["final_accuracy"], TARGET_SPEEDRUN)
    if speedrun["data"] != "CIFAR-10":
        g["met"] = None  # synthetic data says the mode works, nothing about airbench
    return [g]


def _mnist_goals(row: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Time to 98% on MNIST-format data vs pytorch/examples' recipe, ours with the speed-run recipe
    (``configs/mnist_speedrun.yaml``, as pytorch/examples' is its recipe for MNIST) and, for reference, with
    ``scripts/train.py``'s defaults (measured, never judged: a default is tuned for any dataset, not for a race);
    judged on real MNIST at 98% only (synthetic data or the ``--quick`` target: measured, marked n/a)."""
    if not row or "speedup" not in row:
        return []
    target, synthetic = row["target_accuracy"], row.get("synthetic", True)
    where = "synthetic MNIST-shaped data" if synthetic or target < 0.98 else "MNIST"
    sides = [("recipe_speedup", "ours with configs/mnist_speedrun.yaml")] if "recipe_speedup" in row else []
    goals = []
    for key, ours in [*sides, ("speedup", "ours with scripts/train.py's defaults")]:
        g = _goal(
            f"time to {target:.0%} on {where} >= {GOAL_MNIST_SPEEDUP:g}x faster than pytorch/examples' mnist recipe, "
            f"from process start, {ours} (median of {row.get('repeats', '?')})"
            + ("; the goal is for 98% on real MNIST" if synthetic or target < 0.98 else "")
            + ("; for reference, not judged" if key == "speedup" and sides else ""),
            row[key],
            GOAL_MNIST_SPEEDUP,
        )
        if synthetic or target < 0.98 or (key == "speedup" and sides):
            g["met"] = None  # synthetic data or a lower target says the row works, not whether the goal is met
        goals.append(g)
    return goals


def _default_run_goals(default_run: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not default_run or "process_wall_s" not in default_run:
        return []
    startup = []
    if "ratio_vs_plain" in default_run:
        startup.append(
            _goal(
                f"python scripts/train.py (defaults) <= {GOAL_STARTUP_RATIO:g}x the plain script doing the same work, "
                f"from process start (median of {len(default_run['runs_s'])}, interleaved)",
                default_run["ratio_vs_plain"],
                GOAL_STARTUP_RATIO,
                higher_is_better=False,
                best_window=default_run.get("ratio_vs_plain_min"),
            )
        )
    return startup + [
        _goal(
            f"python scripts/train.py (defaults) <= {GOAL_DEFAULT_RUN_S:g} s from process start",
            default_run["process_wall_s"],
            GOAL_DEFAULT_RUN_S,
            higher_is_better=False,
        ),
        _goal(
            f"... with eval_accuracy >= {GOAL_DEFAULT_RUN_ACCURACY}",
            default_run.get("eval_accuracy"),
            GOAL_DEFAULT_RUN_ACCURACY,
        ),
    ]
