"""The plain loop's processes: one long-lived server per process layout (one process, or torchrun ranks) that
measures on request through JSON files, so each plain measurement is taken right next to the portable run it is
compared with, for one start-up per layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accel_train.doctor.launching import REPO, child_env
from accel_train.run_dir import pid_alive
from accel_train.runtime import available_cores
from benchmarks.common import _load_json, _tail
from benchmarks.speed.devices import visible_devices
from benchmarks.speed.plain import _plain_measure
from benchmarks.speed.setups import WINDOW_STEPS, BenchOptions, Setup
from benchmarks.speed.study import _study


def _write_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _child_server(spec: dict[str, Any]) -> None:
    """A plain-loop process (or DDP rank) that stays up and measures on request.

    The parent writes ``cmd_<k>.json``; every rank runs it and writes
    ``res_<k>.rank<r>.json``. One start-up per setup, yet each plain measurement
    is taken right next to the portable run it is compared with.
    """
    import resource

    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    torch.set_num_threads(spec.get("threads") or max(1, available_cores() // local_world))  # runtime's rule, idle
    if world > 1:
        dist.init_process_group("gloo")
    rank = int(os.environ.get("RANK", "0") or 0)
    directory, parent = Path(spec["dir"]), int(spec["parent_pid"])
    k = 0
    while True:
        cmd_path = directory / f"cmd_{k}.json"
        while not cmd_path.exists():
            if not pid_alive(parent):
                os._exit(1)
            time.sleep(0.05)
        command = _load_json(cmd_path)
        if command.get("exit"):
            break
        try:
            result = _study(command) if command.get("kind") == "study" else _plain_measure(command)
        except Exception as exc:  # report it, keep serving
            result = {"model": command.get("model"), "error": f"{type(exc).__name__}: {exc}"}
        result["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        _write_atomic(directory / f"res_{k}.rank{rank}.json", result)
        k += 1
    if world > 1:
        from accel_train.runtime import finish_process

        dist.barrier()
        dist.destroy_process_group()
        finish_process(0)


class PlainServer:
    """The parent's handle on one plain-loop process (1 process, or ``processes`` torchrun ranks)."""

    def __init__(self, setup: Setup, work: Path, tag: str, threads: int | None = None):
        self.setup = setup
        self.dir = work / f"plain_{setup.name}_{tag}"
        self.dir.mkdir(parents=True, exist_ok=True)
        spec_path = self.dir / "spec.json"
        _write_atomic(spec_path, {"dir": str(self.dir), "parent_pid": os.getpid(), "threads": threads})
        child = ["-m", "benchmarks.speed.run", "--child", "server", str(spec_path)]
        if setup.processes > 1:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(setup.processes),
                *child,
            ]
        else:
            cmd = [sys.executable, *child]
        env = child_env()
        visible = visible_devices(setup)  # CPU: none; one CUDA process: one GPU, the portable run's
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        self.cuda_visible_devices = visible
        self.log_path = self.dir / "output.txt"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.k = 0

    def _output_tail(self) -> str:
        try:
            return _tail(self.log_path.read_text())
        except OSError:
            return ""

    def request(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        k = self.k
        self.k += 1
        if self.proc.poll() is not None:
            return {
                "model": command.get("model"),
                "error": f"plain loop process exited {self.proc.returncode}: {self._output_tail()}",
            }
        _write_atomic(self.dir / f"cmd_{k}.json", command)
        wanted = [self.dir / f"res_{k}.rank{r}.json" for r in range(self.setup.processes)]
        deadline = time.monotonic() + timeout
        while not all(p.exists() for p in wanted):
            if self.proc.poll() is not None:
                return {
                    "model": command.get("model"),
                    "error": f"plain loop process exited {self.proc.returncode}: {self._output_tail()}",
                }
            if time.monotonic() > deadline:
                self.proc.kill()
                return {"model": command.get("model"), "error": f"timed out after {timeout:.0f}s"}
            time.sleep(0.02)
        return _load_json(wanted[0])  # rank 0: global samples/s; its phase times

    def close(self) -> None:
        if self.proc.poll() is None:
            _write_atomic(self.dir / f"cmd_{self.k}.json", {"exit": True})
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class ServerPool:
    """One plain-loop server per (processes, device): fp32, bf16 and channels_last are per-request flags."""

    def __init__(self, work: Path):
        self.work = work
        self.servers: dict[tuple[int, str], PlainServer] = {}

    def get(self, setup: Setup) -> PlainServer:
        key = (setup.processes, setup.device)
        if key not in self.servers:
            self.servers[key] = PlainServer(setup, self.work, f"{setup.processes}p_{setup.device}")
        return self.servers[key]

    def close(self, processes: int | None = None) -> None:
        for key in [k for k in self.servers if processes is None or k[0] == processes]:
            self.servers.pop(key).close()


def plain_command(setup: Setup, model: str, opts: BenchOptions) -> dict[str, Any]:
    workload = opts.workload_for(setup)
    return {
        "model": model,
        "batch": workload.plans[model].batch,
        "steps": opts.steps(model, workload),
        "channels": workload.channels,
        "image_size": workload.image_size,
        "bf16": setup.bf16,
        "channels_last": setup.channels_last,
        "device": setup.device,
        "tf32": opts.cuda_tf32(setup),
        "log_every": WINDOW_STEPS,
        "sync_probe_steps": (6 if opts.mode == "full" else 1) if setup.processes > 1 else 0,
    }
