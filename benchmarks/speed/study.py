"""The bf16 study, inside a plain-loop process: every precision and memory-format variant of one model stepped
round-robin in the same process (so machine noise hits them alike), and a profile of where forward and backward
time goes, by op category."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.speed.plain import PlainTrainer

STUDY_VARIANTS: tuple[dict[str, Any], ...] = (
    {"name": "fp32", "bf16": False, "channels_last": False},
    {"name": "bf16", "bf16": True, "channels_last": False},
    {"name": "fp32+channels_last", "bf16": False, "channels_last": True},
    {"name": "bf16+channels_last", "bf16": True, "channels_last": True},
    {"name": "fp32+fused_adam", "bf16": False, "channels_last": False, "fused": True},
    {"name": "bf16+channels_last+fused_adam", "bf16": True, "channels_last": True, "fused": True},
)
PROFILED_VARIANTS = ("fp32", "bf16", "bf16+channels_last")


def _op_category(name: str) -> str:
    if "conv" in name:
        return "convolution"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "matmul"
    if name in ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous"):
        return "cast/copy"
    if "batch_norm" in name:
        return "batch_norm"
    return "other"


def _study(spec: dict[str, Any]) -> dict[str, Any]:
    """All variants of one model stepped round-robin in this process (same noise for all); fwd+bwd profile."""
    from torch.profiler import ProfilerActivity, profile

    model, batch, rounds = spec["model"], spec["batch"], spec["rounds"]
    per_round, warm = 1, 2  # variants alternate every step: machine noise hits all of them alike
    total = warm + rounds * per_round + 1
    shape = {"channels": spec.get("channels", 1), "image_size": spec.get("image_size", 28)}
    trainers = {
        v["name"]: PlainTrainer(
            model, batch, total, bf16=v["bf16"], channels_last=v["channels_last"], fused=v.get("fused"), **shape
        )
        for v in spec["variants"]
    }
    times: dict[str, dict[str, list[float]]] = {k: {"step": [], "fb": [], "opt": []} for k in trainers}
    for trainer in trainers.values():
        for i in range(warm):
            trainer.step(i)
    step = warm
    for _ in range(rounds):
        for name, trainer in trainers.items():
            for i in range(per_round):
                d, f, o = trainer.step(step + i)
                times[name]["step"].append(d + f + o)
                times[name]["fb"].append(f)
                times[name]["opt"].append(o)
        step += per_round
    results = []
    for v in spec["variants"]:
        t = times[v["name"]]
        results.append(
            {
                **v,
                "step_ms": 1000 * statistics.median(t["step"]),
                "forward_backward_ms": 1000 * statistics.median(t["fb"]),
                "optimizer_ms": 1000 * statistics.median(t["opt"]),
            }
        )
    profiles: dict[str, Any] = {}
    for name in PROFILED_VARIANTS if spec.get("profile") else ():
        if name not in trainers:
            continue
        trainer = trainers[name]
        images, labels = trainer.batch_at(step)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            trainer.forward_backward(images, labels)
        trainer.optimizer_step()
        events = [(e.key, e.self_cpu_time_total / 1000.0) for e in prof.key_averages()]
        categories: dict[str, float] = {}
        for key, ms in events:
            categories[_op_category(key)] = categories.get(_op_category(key), 0.0) + ms
        top = sorted(events, key=lambda e: -e[1])[:6]
        profiles[name] = {
            "forward_backward_ms": sum(ms for _, ms in events),
            "categories_ms": {k: round(v, 2) for k, v in sorted(categories.items())},
            "top_ops_ms": [[k, round(ms, 2)] for k, ms in top],
        }
    return {
        "model": model,
        "batch": batch,
        "rounds": rounds,
        "steps_per_round": per_round,
        "variants": results,
        "profiles": profiles,
    }


def _study_variants(model: str, mode: str) -> list[dict[str, Any]]:
    if mode == "full":
        return list(STUDY_VARIANTS)
    chosen = [v for v in STUDY_VARIANTS if not v.get("fused")]
    if model == "mnist_cnn":  # its step is dominated by Adam on a 25.7M-parameter dense layer
        chosen.append(next(v for v in STUDY_VARIANTS if v["name"] == "fp32+fused_adam"))
    return chosen
