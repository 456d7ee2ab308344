"""scripts/slurm/train.sbatch under a real Slurm: slurmctld, slurmd and munged for one node (this machine),
started here and stopped afterwards.

The job is submitted as a CPU cluster's user would (no GRES, 2 CPU ranks) with an output folder whose name has
a space. A 1-minute time limit cuts the run: the job must requeue itself and finish; a `scontrol requeue` from
outside must be survived too. Both end with the weights of a run that never stopped, bit for bit, and no step
logged twice. A run that needs 5 attempts (each adds 20 steps) is requeued 4 times, with no cap, and completes
with the same weights; attempts that make no progress end the job after two in a row; a submit folder gone from
the node ends it with one line. A second Slurm of two nodes (two slurmds, each in its own network namespace)
trains one run on both. Slurm's timers tick every 30 s, so these take minutes: marked ``cluster`` (``python3 -m
pytest -m cluster``, the second step of .ci/run); the last tests (the script's text, its submit-folder check and
the launcher's one-line refusal of a broken config file, without Slurm) run by default. As root,
the fixture installs slurm-wlm and munge with apt-get when they are missing; elsewhere, or when a daemon is
refused, the tests skip and say why.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from checks import assert_one_line_error, free_port
from conftest import FAST, REPO, _env, check, max_abs_diff, metrics, run_script, weights

SBATCH = "scripts/slurm/train.sbatch"
# LeNet that sleeps in each training forward of the job's first attempt (SLURM_RESTART_COUNT unset or 0): that attempt
# outlasts Slurm's time-limit warning or the test's requeue, the next one finishes at full speed. The numbers are
# LeNet's (the reference run never sleeps).
SLOW_MODEL = """
import os, time
from accel_train.models.lenet import LeNet

class SlowLeNet(LeNet):
    def forward(self, x):
        if self.training and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
            time.sleep(float(os.environ.get("SLOW_STEP_S", "0")))
        return super().forward(x)
"""
# LeNet that, in each process, takes BLOCK_AT training steps and then waits in the next forward until the process
# gets SIGTERM (Slurm's time-limit warning): every attempt of a job adds BLOCK_AT steps, however late the warning comes
# (the ranks stop at the step boundary of that forward: a multiple of --log-every). HANG_AT: a forward that never ends
# (an attempt that cannot reach a step boundary before the limit). Unset, it is LeNet.
BLOCKING_MODEL = """
import os, signal, time
from accel_train.models.lenet import LeNet

class BlockingLeNet(LeNet):
    forwards = 0
    stopping = False

    def forward(self, x):
        if self.training:
            cls = type(self)
            cls.forwards += 1
            if cls.forwards == 1:  # the trainer's SIGTERM handler is in place: note the signal, then call it
                previous = signal.getsignal(signal.SIGTERM)

                def on_term(signum, frame):
                    cls.stopping = True
                    if callable(previous):
                        previous(signum, frame)

                signal.signal(signal.SIGTERM, on_term)
            if cls.forwards == int(os.environ.get("BLOCK_AT", "0")):
                deadline = time.monotonic() + 300
                while not cls.stopping and time.monotonic() < deadline:
                    time.sleep(0.1)
            if cls.forwards == int(os.environ.get("HANG_AT", "0")):
                time.sleep(300)
        return super().forward(x)
"""
STEPS = 100
TRAIN = ["--model", "slow_lenet:SlowLeNet", "--optimizer", "sgd", "--max-steps", str(STEPS), "--log-every", "10"]
SLOW_STEP_S = "0.6"  # 100 steps >= 60 s: longer than Slurm lets the first attempt run before its warning (55 s)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def _slurm_here() -> bool:
    return all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "munged", "sbatch"))


def _install_slurm() -> str | None:
    """None once slurmctld, slurmd, munged and sbatch are here (apt-get installs them as root); else why not."""
    if _slurm_here():
        return None
    if os.geteuid() != 0:
        return "Slurm is not installed and installing it (apt-get install slurm-wlm munge) needs root"
    if not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Two xdist workers set up their clusters at once: without the lock the second apt-get found dpkg's lock taken
    # and its tests were skipped, so CI passed with Slurm untested. The second waits, then finds Slurm installed.
    with open(Path(tempfile.gettempdir()) / "accel_train_slurm_install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _slurm_here():
            return None
        cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "slurm-wlm", "munge"]  # and others' apt
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return f"apt-get install slurm-wlm munge failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return None


def _slurm_conf(root: Path, ctld: str, nodes: list[str]) -> str:
    """One partition over ``nodes`` (``NodeName=...`` lines); ``%n`` keeps each slurmd's files apart."""
    names = ",".join(line.split()[0].removeprefix("NodeName=") for line in nodes)
    ctld_port = free_port()
    slurmd_port = next(p for p in iter(free_port, None) if p != ctld_port)
    return f"""ClusterName=accel{os.getpid()}
SlurmctldHost={ctld}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/ctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
JobRequeue=1
MinJobAge=3600
KillWait=30
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{chr(10).join(nodes)}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def _log_tails(root: Path) -> str:
    return " | ".join(f"{p.name}: {p.read_text()[-300:]}" for p in sorted((root / "log").glob("*.log")))


def _prepare(tmp_path_factory) -> Path:
    """Root and Slurm present (or skip); a folder with a fresh munge key."""
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld, slurmd and munged needs root")
    why = _install_slurm()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "ctld", "log"):
        (root / sub).mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    return root


@contextlib.contextmanager
def _cluster(root: Path, conf_text: str, slurmds: list[list[str]]):
    """munged, slurmctld and the ``slurmds`` commands started, every node idle; yields the clients' environment.
    Afterwards every job is cancelled and the daemons stopped."""
    conf = root / "slurm.conf"
    conf.write_text(conf_text)
    for node in re.findall(r"^NodeName=(\S+)", conf_text, re.M):
        (root / f"spool-{node}").mkdir()  # slurmd makes no SlurmdSpoolDir
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge = [f"--key-file={root}/munge/munge.key", f"--socket={root}/munge/socket", f"--pid-file={root}/munge/pid"]
    munge += [f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed", "--foreground", "--force"]
    commands = [["munged", *munge], ["slurmctld", "-D", "-i", "-f", str(conf)]]
    commands += [[*cmd, "-D", "-f", str(conf)] if cmd[-1] == "slurmd" else cmd for cmd in slurmds]
    daemons = [  # they log to root/log
        subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for cmd in commands
    ]
    try:
        deadline = time.monotonic() + 60
        while _sinfo(env).count("idle") < len(slurmds):
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                pytest.skip(f"the Slurm of {len(slurmds)} node(s) did not come up: {_log_tails(root)}")
            time.sleep(1)
        yield env
    finally:
        _cancel_all_jobs(env)
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in reversed(daemons):
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm (this host, 2 CPUs) in a temporary folder; yields the environment its clients need."""
    root = _prepare(tmp_path_factory)
    host = socket.gethostname().split(".")[0]
    with _cluster(root, _slurm_conf(root, host, [f"NodeName={host} CPUs=2 State=UNKNOWN"]), [["slurmd"]]) as env:
        yield env


def _cancel_all_jobs(env: dict[str, str]) -> None:
    """No job step outlives the daemons (a failed test may leave one running)."""
    subprocess.run(["scancel", "--user", getpass.getuser()], env=env, capture_output=True, timeout=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _squeue(env):
        time.sleep(1)


def _squeue(env: dict[str, str]) -> str:
    done = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, timeout=30)
    return done.stdout.strip()


def _sinfo(env: dict[str, str]) -> str:
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True, timeout=30)
    return done.stdout


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    (folder / "slow_lenet.py").write_text(SLOW_MODEL)
    (folder / "blocking_lenet.py").write_text(BLOCKING_MODEL)
    return folder


def _pythonpath(model_dir: Path) -> str:
    return os.pathsep.join([str(REPO), str(model_dir)])


@pytest.fixture(scope="module")
def straight(tmp_path_factory, model_dir):
    """The same training, never stopped: 2 CPU ranks under accelerate launch, without the sleep."""
    out = tmp_path_factory.mktemp("straight") / "run"
    env = {"PYTHONPATH": _pythonpath(model_dir), "SLOW_STEP_S": "0"}
    check(run_script("train.py", *TRAIN, *FAST, "--output-dir", str(out), config="multi_cpu.yaml", env=env))
    return out


def _submit(
    slurm, model_dir, out: Path, *sbatch_args: str, extra_env: dict[str, str] | None = None, train: list[str] = TRAIN
) -> str:
    env = _env({**slurm, "PYTHONPATH": _pythonpath(model_dir), "SLOW_STEP_S": SLOW_STEP_S, "PROCS_PER_NODE": "2"})
    env.update(extra_env or {})
    out.parent.mkdir(parents=True)  # where Slurm writes the job's log: it creates no folder
    cmd = ["sbatch", "--parsable", "--cpus-per-task=2", f"--output={out.parent}/job-%j.out", *sbatch_args, SBATCH]
    done = subprocess.run(
        [*cmd, *train, *FAST, "--output-dir", str(out)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _job(slurm, job_id: str) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=slurm, capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


def _wait_until_ended(slurm, job_id: str, timeout: float = 600) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while (job := _job(slurm, job_id)).get("JobState") not in ENDED:
        assert time.monotonic() < deadline, job
        time.sleep(2)
    return job


def _check_like_straight(out: Path, straight: Path, log: str, total: int = STEPS) -> float:
    """The run finished with the straight run's weights, no step logged twice, no launcher traceback."""
    assert "Traceback" not in log, log[-4000:]
    assert "accel_train: the run is finished" in log, log[-4000:]
    steps = [m["step"] for m in metrics(out) if m["event"] == "train"]
    assert steps == list(range(10, total + 1, 10)), steps
    diff = max_abs_diff(weights(straight), weights(out))
    assert diff == 0.0
    print("\n" + "\n".join(line for line in log.splitlines() if "stopped at step" in line or "requeueing" in line))
    return diff


@pytest.mark.cluster
def test_time_limit_requeues_the_job_until_the_run_is_finished(slurm, model_dir, straight, tmp_path):
    """--time=1: Slurm's warning stops the ranks with a checkpoint and the job requeues itself, then finishes."""
    out = tmp_path / "my runs" / "a"
    start = time.monotonic()
    job_id = _submit(slurm, model_dir, out, "--time=1", "--signal=B:USR1@5", extra_env={"MAX_REQUEUES": "8"})
    job = _wait_until_ended(slurm, job_id)
    log = (out.parent / f"job-{job_id}.out").read_text()
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), (job, log[-4000:])
    requeues = int(job["Restarts"])
    assert requeues >= 1 and log.count("the ranks stop at the next step boundary") == requeues, log[-4000:]
    assert log.count(f"requeueing job {job_id}") == requeues, log[-4000:]
    diff = _check_like_straight(out, straight, log)
    print(f"\ntime limit: {requeues} requeue(s), max weight diff {diff}, {time.monotonic() - start:.0f} s")


@pytest.mark.cluster
def test_requeue_from_outside_continues_the_run(slurm, model_dir, straight, tmp_path):
    """`scontrol requeue` (as a preemption does): every rank saves, Slurm restarts the job, --resume auto finishes."""
    out = tmp_path / "my runs" / "b"
    start = time.monotonic()
    job_id = _submit(slurm, model_dir, out, "--time=10")
    deadline = time.monotonic() + 300
    while not out.joinpath("metrics.jsonl").exists() or not any(m["step"] >= 30 for m in metrics(out)):
        assert time.monotonic() < deadline and _job(slurm, job_id).get("JobState") not in ENDED, _job(slurm, job_id)
        time.sleep(1)
    subprocess.run(["scontrol", "requeue", job_id], env=slurm, check=True)
    job = _wait_until_ended(slurm, job_id)
    log = (out.parent / f"job-{job_id}.out").read_text()
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("COMPLETED", "0:0", "1"), (job, log[-4000:])
    assert "received SIGTERM" in log and "requeueing" not in log, log[-4000:]
    diff = _check_like_straight(out, straight, log)
    print(f"\nexternal requeue: 1 requeue, max weight diff {diff}, {time.monotonic() - start:.0f} s")


LONG_STEPS = 90  # 20 steps an attempt: 5 attempts, the last one finishing (80 -> 90) without waiting for a warning
LONG = ["--model", "blocking_lenet:BlockingLeNet", "--optimizer", "sgd", "--max-steps", str(LONG_STEPS)]
LONG += ["--log-every", "10"]


@pytest.mark.cluster
def test_a_run_that_progresses_is_requeued_until_it_completes(slurm, model_dir, tmp_path):
    """Issue 42: a run needing more attempts than a restart cap would allow. Every attempt adds 20 steps, then waits
    for the time-limit warning; the job requeues itself after each (MAX_STALLED_REQUEUES and MAX_REQUEUES unset:
    no cap while attempts progress) and ends COMPLETED with the weights of a run that never stopped, bit for bit."""
    straight = tmp_path / "straight"
    env = {"PYTHONPATH": _pythonpath(model_dir)}
    check(run_script("train.py", *LONG, *FAST, "--output-dir", str(straight), config="multi_cpu.yaml", env=env))
    out = tmp_path / "my runs" / "long"
    start = time.monotonic()
    job_id = _submit(slurm, model_dir, out, "--time=1", "--signal=B:USR1@5", train=LONG, extra_env={"BLOCK_AT": "20"})
    job = _wait_until_ended(slurm, job_id, timeout=900)
    log = (out.parent / f"job-{job_id}.out").read_text()
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), (job, log[-4000:])
    requeues = int(job["Restarts"])
    moves = [tuple(map(int, m)) for m in re.findall(r"this attempt went from step (\d+) to (\d+): requeueing", log)]
    # an attempt whose ranks start after the warning (a loaded machine) makes no progress: it is requeued too, once
    idle = re.findall(r"no progress past step \d+ \(1 attempt\(s\) in a row.*: requeueing", log)
    assert requeues >= 4 and len(moves) + len(idle) == requeues == log.count(f"requeueing job {job_id}"), log[-6000:]
    assert len(moves) >= 4 and all(b > a for a, b in moves) and "not requeued" not in log, log[-6000:]
    diff = _check_like_straight(out, straight, log, total=LONG_STEPS)
    took = time.monotonic() - start
    print(f"\nprogressing run: {requeues} requeues {moves} ({len(idle)} without progress), max weight diff {diff}")
    print(f"{took:.0f} s from submission to the end (the straight run before it not counted)")


@pytest.mark.cluster
def test_attempts_that_make_no_progress_end_the_job(slurm, model_dir, tmp_path):
    """An attempt whose step never ends (HANG_AT=1: no step boundary, so no checkpoint, before the limit) is requeued
    once; the second in a row ends the job (MAX_STALLED_REQUEUES=2, the default) with one line, not an endless loop."""
    out = tmp_path / "my runs" / "stalled"
    start = time.monotonic()
    job_id = _submit(
        slurm,
        model_dir,
        out,
        "--time=1",
        "--signal=B:USR1@5",
        train=[*LONG, "--stop-grace", "3"],
        extra_env={"HANG_AT": "1"},
    )
    job = _wait_until_ended(slurm, job_id, timeout=600)
    log = (out.parent / f"job-{job_id}.out").read_text()
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("FAILED", "143:0", "1"), (job, log[-4000:])
    assert "no progress past step 0 (1 attempt(s) in a row" in log and log.count("requeueing job") == 1, log[-4000:]
    stops = [line for line in log.splitlines() if "not requeued" in line]
    assert len(stops) == 1 and "2 attempt(s) in a row saved no checkpoint past step 0" in stops[0], log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    print(f"\nstalled run: {stops[0]}\n{time.monotonic() - start:.0f} s")


@pytest.mark.cluster
def test_a_submit_folder_gone_from_the_node_ends_the_job_with_one_line(slurm, tmp_path):
    """Slurm starts a job whose SLURM_SUBMIT_DIR is missing in /tmp; the script must not train from there."""
    gone, logs = tmp_path / "gone", tmp_path / "logs"
    gone.mkdir()
    logs.mkdir()
    cmd = ["sbatch", "--parsable", "--hold", f"--output={logs}/job-%j.out", str(REPO / SBATCH), "--max-steps", "2"]
    done = subprocess.run(cmd, cwd=gone, env=_env(slurm), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    gone.rmdir()
    subprocess.run(["scontrol", "release", job_id], env=slurm, check=True)
    job = _wait_until_ended(slurm, job_id, timeout=300)
    log = (logs / f"job-{job_id}.out").read_text()
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "2:0"), (job, log)
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: SLURM_SUBMIT_DIR={gone} is not a folder on {socket.gethostname()}; submit from the "
        "repository's folder, on a file system every node sees"
    ], log
    assert "accel_train: job" not in log and "Traceback" not in log, log


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def _two_machines(tag: str):
    """Two network namespaces on a bridge (10.213.0.2 and .3; this namespace is .1): two machines' networks on one
    box. Yields their names; deleted afterwards."""
    bridge, spaces = f"acb{tag}", [f"acn{tag}_{i}" for i in (1, 2)]
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", "10.213.0.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, space in enumerate(spaces, start=2):
            _ip("netns", "add", space)
            _ip("link", "add", f"ach{tag}_{i}", "type", "veth", "peer", "name", f"acc{tag}_{i}")
            _ip("link", "set", f"acc{tag}_{i}", "netns", space)
            _ip("link", "set", f"ach{tag}_{i}", "master", bridge, "up")
            for cmd in (["addr", "add", f"10.213.0.{i}/24", "dev", f"acc{tag}_{i}"], ["link", "set", "lo", "up"]):
                _ip("-n", space, *cmd)
            _ip("-n", space, "link", "set", f"acc{tag}_{i}", "up")
        yield spaces
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"two network namespaces could not be made: {getattr(exc, 'stderr', '') or exc}")
    finally:
        for space in spaces:
            subprocess.run(["ip", "netns", "del", space], capture_output=True)  # takes its veth pair along
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@pytest.fixture(scope="module")
def slurm_two_nodes(tmp_path_factory):
    """Slurm with two nodes, node1 and node2, each a slurmd in its own network namespace (one CPU each) with its
    own /etc/hosts (this host's name is its own address there, so gloo binds to it); slurmctld stays here."""
    root = _prepare(tmp_path_factory)
    host = socket.gethostname().split(".")[0]
    with _two_machines(str(os.getpid() % 100000)) as spaces:
        slurmds = []
        for i, space in enumerate(spaces, start=1):
            hosts = root / f"hosts-{i}"
            hosts.write_text(f"127.0.0.1 localhost\n10.213.0.2 node1\n10.213.0.3 node2\n10.213.0.{i + 1} {host}\n")
            inside = f"mount --bind {hosts} /etc/hosts && exec slurmd -D -f {root}/slurm.conf -N node{i}"
            slurmds.append(["nsenter", f"--net=/run/netns/{space}", "unshare", "--mount", "--propagation", "private"])
            slurmds[-1] += ["bash", "-c", inside]
        nodes = [f"NodeName=node{i} NodeAddr=10.213.0.{i + 1} CPUs=1 State=UNKNOWN" for i in (1, 2)]
        with _cluster(root, _slurm_conf(root, f"{host}(10.213.0.1)", nodes), slurmds) as env:
            yield env


@pytest.mark.cluster
def test_two_nodes_train_together_like_multi_cpu(slurm_two_nodes, tmp_path):
    """--nodes=2: one launcher per node, machine ranks from SLURM_NODEID, rendezvous on node1; the weights of one
    machine's 2 ranks (multi_cpu.yaml) within the multi-node promise (1e-6: each rank has 2 threads there, 1 here)."""
    out, straight_out = tmp_path / "my runs" / "two", tmp_path / "straight"
    out.parent.mkdir()
    args = ["--optimizer", "sgd", "--max-steps", "40", "--log-every", "10", *FAST]
    check(run_script("train.py", *args, "--output-dir", str(straight_out), config="multi_cpu.yaml"))
    env = _env({**slurm_two_nodes, "PROCS_PER_NODE": "1"})
    cmd = ["sbatch", "--parsable", "--nodes=2", "--cpus-per-task=1", f"--output={out.parent}/job-%j.out", SBATCH]
    done = subprocess.run([*cmd, *args, "--output-dir", str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    job = _wait_until_ended(slurm_two_nodes, job_id)
    log = (out.parent / f"job-{job_id}.out").read_text()
    assert (job["JobState"], job["ExitCode"], job["NodeList"]) == ("COMPLETED", "0:0", "node[1-2]"), log[-4000:]
    assert "2 node(s) x 1 rank(s)" in log and "Traceback" not in log, log[-4000:]
    assert [m["step"] for m in metrics(out) if m["event"] == "train"] == [10, 20, 30, 40]
    diff = max_abs_diff(weights(straight_out), weights(out))
    assert diff <= 1e-6
    print(f"\ntwo nodes: max weight diff {diff} from one machine's 2 ranks")


@pytest.mark.parametrize("where", ["missing", "not the repository"])
def test_a_submit_folder_that_is_not_the_repository_is_one_line_and_exit_2(tmp_path, where):
    """Before anything runs (no Slurm needed: the check is the script's first)."""
    folder = tmp_path / "gone" if where == "missing" else tmp_path
    env = _env({"SLURM_SUBMIT_DIR": str(folder)})
    proc = subprocess.run(["bash", str(REPO / SBATCH), "--max-steps", "2"], env=env, capture_output=True, text=True)
    assert_one_line_error(proc, str(folder), "submit from the repository's folder")


def test_the_launcher_refuses_a_broken_config_file_with_one_line(tmp_path):
    """The launcher train.sbatch runs, in a real process (its imports print nothing more): a YAML list."""
    config = tmp_path / "list.yaml"
    config.write_text("- distributed_type: MULTI_CPU\n")
    cmd = [sys.executable, "-m", "accel_train.commands.launch", "--config_file", str(config), "scripts/train.py"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, str(config), "must be a mapping of keys", "scripts/doctor.py --config_file")


def test_sbatch_is_valid_bash_and_passes_arguments_whole():
    """No `$*` (it splits "my runs/a"), no GRES and no nvidia-smi (a CPU cluster refuses or lacks them)."""
    text = (REPO / SBATCH).read_text()
    subprocess.run(["bash", "-n", str(REPO / SBATCH)], check=True)
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("$*" in line or "nvidia-smi" in line for line in code), code
    assert not re.search(r"^#SBATCH +--(gres|gpus)", text, re.M)
    assert re.search(r"^#SBATCH --signal=B:USR1@\d+", text, re.M)
