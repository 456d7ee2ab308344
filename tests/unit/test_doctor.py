"""accel_train.doctor: launch plans and traps of accelerate config files, on mocked machines; the plans of
the shipped and wizard-made configs against real launches (or, where they need GPUs or machines we lack,
against what accelerate's own ``launch_command`` starts); ``--smoke``.

The in-process tests; whole runs and launches are in ../integration/test_doctor_runs.py.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS
from helpers_doctor import MULTI_CPU_STYLE, finding, run_view, write

from accel_train import netif
from accel_train.doctor import (
    CUDA_TYPES,
    Environment,
    devices_report,
    diagnose_config,
    format_json,
    format_report,
    parse_visible_devices,
)
from accel_train.doctor.smoke import disagreements, observed
from accel_train.errors import UserError


def make_env(gpus: int = 0, **kw) -> Environment:
    kw.setdefault("cpu_count", 8)
    kw.setdefault("port_in_use", lambda port: False)
    kw.setdefault("cuda_device_names", [f"Mock GPU {i}" for i in range(gpus)])
    return Environment(cuda_device_count=gpus, **kw)


def diagnose(tmp_path: Path, text: str, env: Environment | None = None, **kw):
    return diagnose_config(write(tmp_path, text), env or make_env(), **kw)


CPU_SINGLE = textwrap.dedent("""
    compute_environment: LOCAL_MACHINE
    distributed_type: 'NO'
    num_processes: 1
    use_cpu: true
    mixed_precision: 'no'
""").lstrip()


SINGLE_GPU = textwrap.dedent("""
    distributed_type: 'NO'
    num_processes: 1
    gpu_ids: '0'
    mixed_precision: 'no'
""").lstrip()


MULTI_GPU = textwrap.dedent("""
    distributed_type: MULTI_GPU
    num_processes: 4
    gpu_ids: all
    mixed_precision: 'bf16'
""").lstrip()


MULTI_NODE = textwrap.dedent("""
    distributed_type: MULTI_GPU
    num_machines: 2
    num_processes: 8
    machine_rank: {rank}
    main_process_ip: 10.0.0.1
    main_process_port: {port}
    mixed_precision: 'no'
""").lstrip()


def test_cpu_single_process(tmp_path):
    diag = diagnose(tmp_path, CPU_SINGLE)
    assert diag.ok and not diag.warnings, diag.findings
    assert diag.plan["launcher"] == "simple"
    assert diag.plan["world_size"] == 1
    assert diag.plan["device"] == "cpu"
    assert diag.plan["backend"] is None
    assert diag.plan["mixed_precision"] == "no"


@pytest.mark.parametrize("gpus", [0, 4])
def test_multi_cpu_style_is_gloo_ddp_on_cpu(tmp_path, gpus):
    diag = diagnose(tmp_path, MULTI_CPU_STYLE, make_env(gpus))
    assert diag.ok and not diag.warnings, diag.findings
    plan = diag.plan
    assert plan["summary"] == "2 processes, gloo DDP on CPU (GPUs hidden by gpu_ids '-1,-1')"
    assert (plan["launcher"], plan["world_size"], plan["backend"], plan["device"]) == ("torchrun", 2, "gloo", "cpu")
    assert "multi-gpu-without-gpu" not in diag.codes()


def test_single_gpu(tmp_path):
    diag = diagnose(tmp_path, SINGLE_GPU, make_env(1))
    assert diag.ok and not diag.warnings, diag.findings
    assert diag.plan["device"] == "cuda" and diag.plan["world_size"] == 1


def test_multi_gpu(tmp_path):
    diag = diagnose(tmp_path, MULTI_GPU, make_env(4))
    assert diag.ok and not diag.warnings, diag.findings
    plan = diag.plan
    assert (plan["launcher"], plan["world_size"], plan["backend"], plan["device"]) == ("torchrun", 4, "nccl", "cuda")
    assert plan["mixed_precision"] == "bf16"


@pytest.mark.parametrize("rank", [0, 1])
def test_multi_node(tmp_path, rank):
    diag = diagnose(tmp_path, MULTI_NODE.format(rank=rank, port=29500), make_env(4))
    assert diag.ok and not diag.warnings, diag.findings
    assert diag.plan["processes_per_machine"] == 4
    assert diag.plan["world_size"] == 8
    assert diag.plan["machine_rank"] == rank


def _routes(table: dict):
    return lambda host: table.get(host)


def test_multi_node_names_the_interface_and_warns_of_a_loopback_hostname(tmp_path, monkeypatch):
    """Issue 31: gloo and NCCL take their address from the hostname; where it is loopback train.py sets the
    interface that reaches main_process_ip itself, and the doctor says which, and why."""
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    route = netif.Route("10.0.0.1", "10.0.0.7", "ens5")
    env = make_env(4, route_to=_routes({"10.0.0.1": route}), hostname=("node7", "127.0.1.1"))
    diag = diagnose(tmp_path, MULTI_NODE.format(rank=1, port=29500), env)
    assert finding(diag, "socket-interface").message == (
        "this machine reaches main_process_ip 10.0.0.1 through interface ens5 (10.0.0.7); train.py sets "
        "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME=ens5 in each process (set it yourself to choose another)"
    )
    warning = finding(diag, "hostname-loopback")
    assert warning.level == "warning" and diag.ok
    assert "node7 resolves to the loopback address 127.0.1.1" in warning.message
    assert "train.py now sets GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME=ens5 itself" in warning.message
    good_hostname = make_env(4, route_to=_routes({"10.0.0.1": route}), hostname=("node7", "10.0.0.7"))
    assert not diagnose(tmp_path, MULTI_NODE.format(rank=1, port=29500), good_hostname).warnings
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")  # the user's choice wins: said, and no warning
    diag = diagnose(tmp_path, MULTI_NODE.format(rank=1, port=29500), env)
    assert "you set GLOO_SOCKET_IFNAME=ib0, which train.py keeps" in finding(diag, "socket-interface").message
    assert not diag.warnings, diag.findings


def test_multi_node_main_process_ip_without_a_route_or_on_loopback(tmp_path):
    text = MULTI_NODE.format(rank=1, port=29500)
    diag = diagnose(tmp_path, text, make_env(4, route_to=_routes({}), hostname=("node7", "127.0.1.1")))
    assert finding(diag, "main-process-ip-unreachable").level == "warning"
    here = netif.Route("127.0.0.1", "127.0.0.1", "lo")
    env = make_env(4, route_to=_routes({"127.0.0.1": here}), hostname=("node7", "127.0.1.1"))
    diag = diagnose(tmp_path, text.replace("10.0.0.1", "127.0.0.1"), env)
    assert finding(diag, "main-process-ip-loopback").level == "info" and not diag.warnings, diag.findings
    named = make_env(4, route_to=_routes({"node0": netif.Route("node0", "127.0.1.1", "lo")}), hostname=("node0", None))
    diag = diagnose(tmp_path, text.replace("10.0.0.1", "node0"), named)
    assert finding(diag, "main-process-ip-loopback-name").level == "warning"


def test_this_machines_routes_are_what_the_doctor_asks():
    env = Environment.detect()
    assert env.route_to("127.0.0.1") == netif.Route("127.0.0.1", "127.0.0.1", "lo")
    assert env.hostname == (socket.gethostname(), netif.hostname_address())


def test_json_config_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"distributed_type": "MULTI_GPU", "num_processes": 2, "gpu_ids": "-1,-1"}))
    diag = diagnose_config(path, make_env())
    assert diag.ok, diag.findings
    assert diag.plan["world_size"] == 2


def test_multi_cpu_without_mpirun_is_started_by_train_py_on_one_machine(tmp_path):
    diag = diagnose(tmp_path, "distributed_type: MULTI_CPU\nnum_processes: 2\n")
    f = finding(diag, "multi-cpu-relaunched")
    assert f.level == "info" and "starts the 2 ranks itself" in f.message and diag.ok
    assert diag.plan["launcher"] == "simple" and diag.plan["relaunch"]
    assert diag.plan["run"] == run_view(2, "MULTI_CPU", "cpu", "no")  # as test_multi_cpu_wizard's runs record


def test_distributed_type_no_with_several_processes_is_refused_by_train_py(tmp_path):
    # the simple launcher starts one process and sets MASTER_PORT; runtime.check_launch then refuses to run alone
    diag = diagnose(tmp_path, "distributed_type: 'NO'\nnum_processes: 2\n", make_env(4))
    f = finding(diag, "num-processes-ignored")
    assert f.level == "error" and "num_processes: 1" in f.message
    assert diag.plan["run"] is None and "refuses" in diag.plan["summary"]


def test_multi_cpu_without_mpirun_on_several_machines_starts_one_process(tmp_path):
    text = "distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmain_process_ip: 10.0.0.1\n"
    text += "main_process_port: 29500\n"
    diag = diagnose(tmp_path, text)
    f = finding(diag, "multi-cpu-one-process")
    assert f.level == "error" and "multi_cpu.yaml" in f.message


def test_multi_cpu_with_mpirun(tmp_path):
    text = "distributed_type: MULTI_CPU\nnum_processes: 4\nmpirun_config:\n  mpirun_hostfile: /etc/hosts.mpi\n"
    diag = diagnose(tmp_path, text, make_env(mpirun_available=True))
    assert diag.ok, diag.findings
    assert diag.plan["launcher"] == "mpirun" and diag.plan["world_size"] == 4
    missing = diagnose(tmp_path, text, make_env(mpirun_available=False))
    assert finding(missing, "mpirun-missing").level == "error"


@pytest.mark.parametrize("dist", ["MULTI_GPU", "FSDP"])
def test_multi_gpu_without_gpu(tmp_path, dist):
    diag = diagnose(tmp_path, f"distributed_type: {dist}\nnum_processes: 2\n", make_env(0))
    f = finding(diag, "multi-gpu-without-gpu")
    assert f.level == "warning" and "gloo" in f.message and "multi_cpu.yaml" in f.message
    assert diag.ok
    assert diag.plan["world_size"] == 2 and diag.plan["device"] == "cpu"


def test_multi_gpu_hidden_by_shell_cvd_is_deliberate(tmp_path):
    env = make_env(0, cuda_visible_devices="-1")
    diag = diagnose(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\n", env)
    assert "multi-gpu-without-gpu" not in diag.codes()
    assert diag.plan["backend"] == "gloo"


def test_gpu_ids_minus_one_alone_is_refused_by_accelerate(tmp_path):
    # accelerate 1.15 raises "Less than two GPU ids were configured" for MULTI_GPU on one machine
    diag = diagnose(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: '-1'\n")
    f = finding(diag, "too-few-gpu-ids")
    assert f.level == "error" and "'-1,-1'" in f.message
    one = diagnose(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: '1'\n", make_env(4))
    assert "too-few-gpu-ids" in one.codes("error")


@pytest.mark.parametrize(
    "text",
    [CPU_SINGLE.replace("'no'", "fp16"), "distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: fp16\n"],
)
def test_fp16_on_cpu(tmp_path, text):
    diag = diagnose(tmp_path, text)
    assert finding(diag, "fp16-on-cpu").level == "warning"
    assert diag.plan["mixed_precision"] == "no (fp16 ignored on CPU)"


def test_bf16_on_cpu_is_fine(tmp_path):
    diag = diagnose(tmp_path, CPU_SINGLE.replace("'no'", "bf16"), make_env(cpu_bf16="amx"))
    assert [(f.level, f.code) for f in diag.findings] == [("info", "bf16-on-cpu")]
    assert "faster" in diag.findings[0].message
    assert diag.plan["mixed_precision"] == "bf16"


def test_bf16_on_a_cpu_with_avx512_bf16_only_says_to_measure(tmp_path):
    diag = diagnose(tmp_path, CPU_SINGLE.replace("'no'", "bf16"), make_env(cpu_bf16="avx512_bf16"))
    assert [(f.level, f.code) for f in diag.findings] == [("info", "bf16-on-cpu")]
    assert "either way" in diag.findings[0].message and "python -m benchmarks" in diag.findings[0].message


def test_bf16_on_a_cpu_without_bf16_warns_that_it_is_slower(tmp_path):
    diag = diagnose(tmp_path, CPU_SINGLE.replace("'no'", "bf16"), make_env(cpu_bf16="none"))
    assert [(f.level, f.code) for f in diag.findings] == [("warning", "bf16-on-cpu")]
    assert "slower than fp32" in diag.findings[0].message


def test_fp16_on_gpu_is_fine(tmp_path):
    diag = diagnose(tmp_path, MULTI_GPU.replace("'bf16'", "fp16"), make_env(4))
    assert not diag.findings and diag.plan["mixed_precision"] == "fp16"


def test_too_many_processes_on_gpus(tmp_path):
    diag = diagnose(tmp_path, MULTI_GPU.replace("num_processes: 4", "num_processes: 8"), make_env(4))
    assert finding(diag, "too-many-processes").level == "error"


def test_too_many_processes_on_cpu(tmp_path):
    text = MULTI_CPU_STYLE.replace("num_processes: 2", "num_processes: 8")
    diag = diagnose(tmp_path, text, make_env(0, cpu_count=2))
    assert finding(diag, "too-many-processes").level == "warning"
    assert diag.ok


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("distributed_type: 'NO'\ngpu_ids: '3'\n", 2),
        ("distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: '0,4'\n", 4),
    ],
)
def test_gpu_ids_missing(tmp_path, text, gpus):
    diag = diagnose(tmp_path, text, make_env(gpus))
    f = finding(diag, "gpu-ids-missing")
    assert f.level == "error" and "CUDA_VISIBLE_DEVICES" in f.message and "renumbered" in f.message


def test_gpu_ids_subset_renumbered(tmp_path):
    diag = diagnose(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: '2,3'\n", make_env(4))
    assert not diag.findings
    assert diag.plan["visible_gpus"] == 2 and diag.plan["world_size"] == 2


def test_gpu_ids_replace_cuda_visible_devices(tmp_path):
    env = make_env(2, cuda_visible_devices="2,3", physical_gpu_count=4)
    diag = diagnose(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: '0,1'\n", env)
    f = finding(diag, "gpu-ids-override-cvd")
    assert f.level == "warning" and "'2,3'" in f.message
    assert diag.ok


def test_gpu_ids_on_a_machine_without_gpus_runs_on_cpu(tmp_path):
    diag = diagnose(tmp_path, SINGLE_GPU, make_env(0))
    assert diag.ok and diag.plan["device"] == "cpu"


def test_listening_socket_is_detected():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert Environment().port_in_use(port)


def test_port_in_use_real_socket(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        env = make_env(4)
        env.port_in_use = Environment().port_in_use  # the real check
        single = diagnose(tmp_path, MULTI_GPU + f"main_process_port: {port}\n", env)
        assert finding(single, "port-in-use").level == "warning"
        assert single.ok
        rank0 = diagnose(tmp_path, MULTI_NODE.format(rank=0, port=port), env)
        assert finding(rank0, "port-in-use").level == "error"


def test_port_in_use_mocked(tmp_path):
    asked = []

    def busy(port):
        asked.append(port)
        return True

    env = make_env(4, port_in_use=busy)
    assert finding(diagnose(tmp_path, MULTI_GPU, env), "port-in-use").level == "warning"
    assert asked == [29500]  # accelerate's default port
    assert finding(diagnose(tmp_path, MULTI_NODE.format(rank=0, port=1234), env), "port-in-use").level == "error"
    assert "port-in-use" not in diagnose(tmp_path, MULTI_NODE.format(rank=1, port=1234), env).codes()
    assert "port-in-use" not in diagnose(tmp_path, MULTI_GPU + "main_process_port: 0\n", env).codes()
    assert "port-in-use" not in diagnose(tmp_path, CPU_SINGLE, env).codes()


def test_data_parallel_single_process(tmp_path):
    diag = diagnose(tmp_path, "distributed_type: 'NO'\nmixed_precision: 'no'\n", make_env(4))
    f = finding(diag, "dp-single-process")
    assert f.level == "info" and diag.ok
    assert diag.plan["data_parallel"] and "DataParallel" in diag.plan["summary"]


def test_multi_node_not_divisible(tmp_path):
    diag = diagnose(tmp_path, MULTI_NODE.format(rank=0, port=29500).replace("num_processes: 8", "num_processes: 7"))
    assert finding(diag, "num-processes-not-divisible").level == "error"


def test_multi_node_without_ip(tmp_path):
    text = MULTI_NODE.format(rank=1, port=29500).replace("main_process_ip: 10.0.0.1\n", "")
    diag = diagnose(tmp_path, text, make_env(4))
    assert finding(diag, "main-process-ip-missing").level == "error"


def test_use_cpu_is_ignored_by_torchrun(tmp_path):
    diag = diagnose(tmp_path, MULTI_GPU + "use_cpu: true\n", make_env(4))
    assert finding(diag, "use-cpu-ignored").level == "warning"
    assert diag.plan["device"] == "cuda" and diag.plan["world_size"] == 4


def test_cpu_flag_on_one_machine_is_started_by_train_py(tmp_path):
    diag = diagnose(tmp_path, MULTI_CPU_STYLE, cpu=True)
    assert finding(diag, "multi-cpu-relaunched").level == "info"
    # accelerate's simple launcher starts one process, which starts the 2 ranks (accel_train.elastic)
    assert diag.plan["launcher"] == "simple" and diag.plan["relaunch"] and diag.plan["world_size"] == 2


def test_deepspeed_not_installed(tmp_path):
    from accelerate.utils import is_deepspeed_available

    diag = diagnose(tmp_path, "distributed_type: DEEPSPEED\nnum_processes: 2\n", make_env(2))
    assert diag.plan["launcher"] == "deepspeed" and diag.plan["world_size"] == 2
    assert ("deepspeed-missing" in diag.codes("error")) is not is_deepspeed_available()


def test_what_accelerate_refuses_is_an_error_with_its_reason(tmp_path):
    text = (
        "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
        "  fsdp_cpu_ram_efficient_loading: true\n  fsdp_sync_module_states: false\n"
    )
    diag = diagnose(tmp_path, text, make_env(2))
    f = finding(diag, "launch-refused")
    assert f.level == "error" and "fsdp_sync_module_states" in f.message and not diag.plan


def test_distributed_type_missing(tmp_path):
    diag = diagnose(tmp_path, "num_processes: 1\n")
    assert "distributed-type-missing" in diag.codes("error")


def test_sagemaker_is_not_planned(tmp_path):
    # (with distributed_type 'NO' accelerate 1.15 adds num_processes and then refuses its own SageMaker config)
    text = (
        "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: DATA_PARALLEL\nmixed_precision: 'no'\n"
        "ec2_instance_type: ml.p3.2xlarge\niam_role_name: role\nregion: us-east-1\n"
    )
    diag = diagnose(tmp_path, text)
    assert diag.codes() == ["sagemaker-not-checked"] and diag.plan["launcher"] == "sagemaker"


def test_num_processes_missing(tmp_path):
    diag = diagnose(tmp_path, "distributed_type: MULTI_GPU\n")
    assert finding(diag, "num-processes-missing").level == "error"


@pytest.mark.parametrize(
    ("line", "key", "fix"),
    [
        ("distributed_type: NO", "distributed_type", "distributed_type: 'NO'"),
        ("mixed_precision: no", "mixed_precision", "mixed_precision: 'no'"),
        ("gpu_ids: 0", "gpu_ids", "gpu_ids: '0'"),
        ("dynamo_backend: NO", "dynamo_backend", "dynamo_backend: 'NO'"),
    ],
)
def test_unquoted_yaml_scalar(tmp_path, line, key, fix):
    base = {"distributed_type": "distributed_type: 'NO'", "num_processes": "num_processes: 1"}
    base[key] = line
    text = "compute_environment: LOCAL_MACHINE\n" + "\n".join(base.values()) + "\n"
    lineno = text.splitlines().index(line) + 1
    diag = diagnose(tmp_path, text)
    f = finding(diag, "unquoted-yaml-scalar")
    assert f.level == "error"
    assert key in f.message and f"line {lineno}" in f.message and fix in f.message
    # quoted, it is fine
    quoted = diagnose(tmp_path, text.replace(line, fix))
    assert "unquoted-yaml-scalar" not in quoted.codes()


def test_unquoted_nested_and_bool_by_convention(tmp_path):
    text = "distributed_type: 'NO'\ndowncast_bf16: no\ndynamo_config:\n  dynamo_backend: NO\n"
    diag = diagnose(tmp_path, text)
    levels = {f.message.split(":")[1].strip(): f.level for f in diag.findings if f.code == "unquoted-yaml-scalar"}
    assert levels == {"downcast_bf16": "warning", "dynamo_backend": "error"}


def test_plain_strings_are_not_flagged(tmp_path):
    text = "distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: 0,1\nmain_process_ip: 10.0.0.1\n"
    diag = diagnose(tmp_path, text, make_env(2))
    assert not diag.findings


def test_unknown_key_suggests(tmp_path):
    diag = diagnose(tmp_path, "distributed_type: 'NO'\nnum_proceses: 1\n")
    f = finding(diag, "unknown-key")
    assert f.level == "error" and "num_processes" in f.message and "line 2" in f.message
    assert "config-load-failed" not in diag.codes()  # same problem, said once


def test_accelerate_loader_failure_is_a_finding(tmp_path):
    diag = diagnose(tmp_path, "distributed_type: MULTI_TPU\nnum_processes: 2\n")
    f = finding(diag, "config-load-failed")
    assert f.level == "error" and "MULTI_TPU" in f.message


@pytest.mark.parametrize("text", ["distributed_type: [\n", "- a\n- b\n", ""])
def test_broken_yaml_is_a_finding(tmp_path, text):
    diag = diagnose(tmp_path, text)
    assert not diag.ok
    assert diag.codes()[0] in ("yaml-parse-error", "not-a-mapping")


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        diagnose_config(tmp_path / "nope.yaml", make_env())


def test_parse_visible_devices():
    assert parse_visible_devices(None) is None
    assert parse_visible_devices("2,3") == [2, 3]
    assert parse_visible_devices("-1") == []
    assert parse_visible_devices("") == []
    assert parse_visible_devices("-1,-1") == []
    assert parse_visible_devices("1,-1,2") == [1]
    assert parse_visible_devices("0,0") == []
    assert parse_visible_devices("GPU-aa,GPU-bb") == ["GPU-aa", "GPU-bb"]


def test_devices_report_cuda_visible_devices_mapping():
    report = devices_report(make_env(2, cuda_visible_devices="2,3"))
    assert report["logical_to_physical"] == {"cuda:0": 2, "cuda:1": 3}
    assert report["try_all_gpus"] == ["cuda:0", "cuda:1"] and report["try_gpu"] == "cuda:0"
    assert "renumbered" in report["cuda_visible_devices_note"]


def test_devices_report_identity_and_hidden():
    report = devices_report(make_env(3))
    assert report["logical_to_physical"] == {"cuda:0": 0, "cuda:1": 1, "cuda:2": 2}
    for hidden in ("-1", ""):
        report = devices_report(make_env(0, cuda_visible_devices=hidden))
        assert report["logical_to_physical"] == {}
        assert report["try_all_gpus"] == ["cpu"] and report["try_gpu"] == "cpu"
        assert "hides every GPU" in report["cuda_visible_devices_note"]


def test_format_report_text_and_json(tmp_path):
    env = make_env(0, versions={"torch": "2.14.1"}, default_config_path="/x/default_config.yaml")
    good = diagnose(tmp_path, MULTI_CPU_STYLE, env)
    bad_text = "distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmain_process_ip: 10.0.0.1\n"
    bad = diagnose_config(write(tmp_path, bad_text + "main_process_port: 29500\n", "bad.yaml"), env)
    text = format_report(env, [good, bad])
    assert "try_all_gpus() -> [cpu]" in text and "torch 2.14.1" in text and "/x/default_config.yaml" in text
    assert "2 processes, gloo DDP on CPU" in text and "[multi-cpu-one-process]" in text
    data = json.loads(format_json(env, [good, bad]))
    assert data["ok"] is False
    assert [c["ok"] for c in data["configs"]] == [True, False]
    assert data["configs"][1]["findings"][0]["code"] == "multi-cpu-one-process"


def test_environment_detect():
    env = Environment.detect()
    assert env.cpu_count >= 1 and env.cuda_device_count >= 0
    assert set(env.versions) >= {"torch", "accelerate"}


def _repo_configs() -> list[Path]:
    if not CONFIGS.is_dir():
        return []
    return sorted([*CONFIGS.glob("*.yaml"), *CONFIGS.glob("*.yml")])


def _env_for(path: Path) -> Environment:
    """A machine the config is meant for: CPU-able configs on 0 GPUs, GPU configs on enough mocked GPUs."""
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        return make_env(0)
    gpu_ids = cfg.get("gpu_ids")
    ids = parse_visible_devices(None if gpu_ids in (None, "all") else str(gpu_ids))
    hidden = ids == [] or cfg.get("use_cpu") is True
    dist = cfg.get("distributed_type")
    gpu_named = "gpu" in path.stem.lower() or path.stem.startswith("dp")
    wants_gpu = not hidden and (dist in CUDA_TYPES or ids is not None or gpu_named)
    mpirun = bool((cfg.get("mpirun_config") or {}).get("mpirun_hostfile"))  # an mpirun example gets mpirun
    if not wants_gpu:
        return make_env(0, mpirun_available=mpirun)
    machines = cfg.get("num_machines") or 1
    per_machine = int(cfg.get("num_processes") or 1) // int(machines)
    highest = max((i for i in ids or [] if isinstance(i, int)), default=-1)
    at_least = 2 if path.stem.startswith("dp") else 1  # DataParallel is about one process seeing several GPUs
    return make_env(max(per_machine, highest + 1, at_least), mpirun_available=mpirun)


@pytest.mark.skipif(not _repo_configs(), reason="no accelerate_configs/*.yaml in the repository yet")
@pytest.mark.parametrize("path", _repo_configs(), ids=lambda p: p.name)
def test_repo_accelerate_configs_have_no_errors(path):
    diag = diagnose_config(path, _env_for(path))
    assert diag.ok, "\n".join(f"[{f.code}] {f.message}" for f in diag.errors)


def _started_by_accelerate(config: Path, launch_args: tuple, monkeypatch) -> dict:
    """accelerate's real ``launch_command``, stopped where it starts processes: what it would start, and with what."""
    import torch.distributed.run as distrib_run
    from accelerate.commands import launch as cli

    started: dict = {}

    def simple(args):  # accelerate's own command and environment for one process, whichever way it then starts it
        cmd, env = cli.prepare_simple_launcher_cmd_env(args)
        started.update(launcher="simple", nproc_per_node=1, nnodes=1, cmd=cmd, env=dict(env))

    def torchrun(args):
        nnodes = int(str(args.nnodes).split(":")[-1])
        started.update(
            launcher="torchrun", nproc_per_node=int(args.nproc_per_node), nnodes=nnodes, env=dict(os.environ)
        )

    monkeypatch.setattr(cli, "simple_launcher", simple)
    monkeypatch.setattr(distrib_run, "run", torchrun)
    monkeypatch.setattr(cli, "check_cuda_p2p_ib_support", lambda: True)
    monkeypatch.setattr("accelerate.utils.launch.is_port_in_use", lambda port: False)
    args = cli.launch_command_parser().parse_args([*launch_args, "--config_file", str(config), "train.py"])
    cli.launch_command(args)
    return started


@pytest.mark.parametrize("path", _repo_configs(), ids=lambda p: p.name)
def test_plan_equals_what_accelerate_launch_starts(path, monkeypatch):
    """Every shipped config, GPU and multi-machine ones included, on a machine that has what it needs."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the mocked machine's GPUs are all visible
    env = _env_for(path)
    plan = diagnose_config(path, env).plan
    started = _started_by_accelerate(path, (), monkeypatch)
    assert plan["launcher"] == started["launcher"]
    assert plan["processes_per_machine"] == started["nproc_per_node"]
    assert plan["world_size"] == started["nproc_per_node"] * started["nnodes"]
    given = started["env"]  # what the processes would get
    assert plan["cuda_visible_devices"] == given.get("CUDA_VISIBLE_DEVICES")
    # what the run must record, on this mocked machine, from what accelerate would start
    ids = parse_visible_devices(given.get("CUDA_VISIBLE_DEVICES"))
    visible = env.cuda_device_count if ids is None else len(ids)
    cpu = given.get("ACCELERATE_USE_CPU") == "True" or visible == 0
    if started["launcher"] == "simple":
        dt = "NO"
    else:
        dt = "MULTI_CPU" if cpu else "FSDP" if given.get("ACCELERATE_USE_FSDP") == "true" else "MULTI_GPU"
    data_parallel = dt == "NO" and not cpu and visible > 1
    expected = run_view(plan["world_size"], dt, "cpu" if cpu else "cuda", given["ACCELERATE_MIXED_PRECISION"])
    assert plan["run"] == {**expected, "data_parallel": data_parallel}
    assert data_parallel == path.stem.startswith("dp")


def test_observed_falls_back_to_the_resolved_config(tmp_path):
    resolved = {"world_size": 2, "distributed_type": "MULTI_CPU", "device": "cpu:1", "mixed_precision": "bf16"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model": "lenet", "resolved": resolved}))
    seen = observed(tmp_path)
    assert seen == resolved  # (data_parallel is only in summary.json)
    assert not disagreements(run_view(2, "MULTI_CPU", "cpu", "bf16"), seen)
    assert disagreements(run_view(2, "MULTI_CPU", "cuda", "bf16"), seen) == ["device"]


def test_smoke_needs_a_config(capsys):
    from accel_train.cli import run_main
    from accel_train.commands.doctor import main

    with pytest.raises(SystemExit) as info:
        run_main(main, ["--smoke"])
    assert info.value.code == 2 and "--config_file" in capsys.readouterr().err


# ---- launcher failures the doctor calls errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,code,needles",
    [
        ("distributed_type: MULTI_GPU\nnum_processes: 0\n", "invalid-value", ["num_processes: 0 is invalid"]),
        ("distributed_type: 'NO'\nnum_processes: 0\n", "invalid-value", ["num_processes: 0 is invalid"]),
        ("distributed_type: 'NO'\nmixed_precision: fp8\n", "fp8-unavailable", ["fp8 needs a CUDA GPU", "'bf16'"]),
        ("distributed_type: 'NO'\nuse_cpu: true\nmixed_precision: fp8\n", "fp8-unavailable", ["runs on cpu"]),
    ],
    ids=["num-processes-0-multi-gpu", "num-processes-0", "fp8-on-cpu", "fp8-use-cpu"],
)
def test_doctor_calls_launcher_failures_errors(tmp_path, text, code, needles):
    from accel_train.doctor import Environment, diagnose_config

    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    diag = diagnose_config(path, Environment(cuda_device_count=0, cpu_count=2, port_in_use=lambda port: False))
    found = [f for f in diag.findings if f.level == "error" and f.code == code]
    assert found and not diag.ok, diag.findings
    for needle in needles:
        assert needle in found[0].message, found[0].message


def test_doctor_gpu_ids_all_on_cpu_is_fine(tmp_path):
    from accel_train.doctor import Environment, diagnose_config

    path = tmp_path / "accelerate.yaml"
    path.write_text("distributed_type: 'NO'\nnum_processes: 1\ngpu_ids: all\nmixed_precision: 'no'\n")
    diag = diagnose_config(path, Environment(cuda_device_count=0, cpu_count=2, port_in_use=lambda port: False))
    assert diag.ok and not diag.warnings, diag.findings
