"""cluster.check's GPU rows and socket interface row, from the answers nodes and masters give.

The GPU probe runs for real here (this venv's CPU torch: its real output); GPU answers use torch's own
formats (get_arch_list() of the CUDA 12.6 and 12.8 builds, get_device_capability()); Determined's agents
are built with the SDK's own bindings and serialised as detmaster.agents() receives them; Spark's workers
as the master's /json/ writes them (JsonProtocol.writeWorkerInfo, resources as {"name", "addresses"}).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from determined.common.api import bindings

from dtlab import cluster as cluster_module
from dtlab import gpucompat
from dtlab.platforms import determined as determined_platform
from dtlab.platforms import spark

# torch.cuda.get_arch_list() of the CUDA 12.6 builds (still Pascal) and of the CUDA 12.8 ones (Turing on).
CU126_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU128_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]
GTX_1060 = {"index": 0, "name": "NVIDIA GeForce GTX 1060 6GB", "capability": [6, 1], "matmul_max_error": 0.0}


def report(arch_list, *devices, torch="2.13.0+cu126", cuda="12.6"):
    return {"torch": torch, "cuda": cuda, "available": True, "arch_list": arch_list, "devices": list(devices)}


@pytest.fixture
def gpu1(gpu_cluster):
    return gpu_cluster.node("gpu1")  # gpu_indices [0, 1]


@pytest.mark.slow  # imports torch in a fresh interpreter: about 10 s on 2 cores
def test_the_probe_runs_in_a_real_venv_and_a_cpu_build_is_a_clear_failure(gpu1):
    answer = subprocess.run(
        [sys.executable, "-c", cluster_module.GPU_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin:/bin"},
    )
    assert answer.returncode == 0, answer.stderr[-2000:]
    probed = json.loads(answer.stdout.strip().splitlines()[-1])
    assert probed["available"] is False and probed["cuda"] is None and probed["devices"] == []
    [row] = cluster_module.gpu_usable_rows(gpu1, probed)
    assert not row.ok and row.required
    assert row.detail == f"CUDA not available to torch {probed['torch']}: a CPU-only build"


def test_a_pascal_gpu_runs_the_cuda_12_6_build_and_not_the_12_8_one(gpu1):
    second = {**GTX_1060, "index": 1}
    ok = cluster_module.gpu_usable_rows(gpu1, report(CU126_ARCHS, GTX_1060, second))
    assert [r.ok for r in ok] == [True, True]
    assert ok[0].detail == (
        "GPU 0 (NVIDIA GeForce GTX 1060 6GB, sm_61): torch 2.13.0+cu126, CUDA 12.6 runs it "
        "(sm_60); matmul matches the CPU's"
    )
    refused = cluster_module.gpu_usable_rows(
        gpu1, report(CU128_ARCHS, GTX_1060, second, torch="2.13.0+cu128", cuda="12.8")
    )
    assert [r.ok for r in refused] == [False, False]
    assert (
        "has no kernels for it (arch list sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120)"
        in refused[0].detail
    )
    assert refused[0].detail.endswith("install a torch build that covers sm_61")


@pytest.mark.parametrize(
    ("capability", "arch_list", "runs"),
    [
        ((6, 1), CU126_ARCHS, "sm_60"),  # a cubin runs on the same major, same or newer minor
        ((6, 0), ["sm_61", "sm_70"], None),  # ...never on an older minor or another major
        ((12, 0), CU126_ARCHS, None),  # Blackwell on a 12.6 build: the well-known refusal
        ((12, 0), CU128_ARCHS, "sm_120"),
        ((12, 1), CU128_ARCHS, "sm_120"),
        ((9, 0), ["sm_80", "compute_80"], "compute_80"),  # PTX: the driver compiles it for newer GPUs
        ((9, 0), ["sm_90a"], "sm_90a"),
        ((9, 1), ["sm_90a"], None),  # arch-specific code runs on that very capability only
    ],
)
def test_capability_against_torchs_arch_list(capability, arch_list, runs):
    assert cluster_module.arch_runs_on(capability, arch_list) == runs


def test_a_failed_matmul_or_a_missing_gpu_fails_its_row(gpu1):
    broken = {
        **GTX_1060,
        "index": 1,
        "error": "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    }
    del broken["matmul_max_error"]
    rows = cluster_module.gpu_usable_rows(gpu1, report(CU126_ARCHS, GTX_1060, broken))
    assert [r.ok for r in rows] == [True, False]
    assert rows[1].detail.startswith(
        "GPU 1 (NVIDIA GeForce GTX 1060 6GB, sm_61): matmul failed: RuntimeError"
    )
    wrong = cluster_module.gpu_usable_rows(gpu1, report(CU126_ARCHS, {**GTX_1060, "matmul_max_error": 0.5}))
    assert wrong[0].detail == "1 GPU(s) visible to torch; inventory expects gpu_indices [0, 1]"
    assert not wrong[0].ok and not wrong[1].ok and "matmul differs from the CPU's by 0.5" in wrong[1].detail


def agents_as_the_master_lists_them(slots_by_agent: dict[str, int]) -> list[dict]:
    """GET /api/v1/agents through the SDK's bindings, as detmaster.agents() returns it."""

    def slot(index):
        device = bindings.v1Device(
            id=index,
            brand="NVIDIA GeForce GTX 1060 6GB",
            uuid=f"GPU-{index}",
            type=bindings.devicev1Type.CUDA,
        )
        return bindings.v1Slot(id=str(index), device=device, enabled=True, draining=False)

    agents = [
        bindings.v1Agent(
            id=agent_id,
            slotStats=bindings.v1SlotStats(brandStats={}, typeStats={}),
            slots={f"/agents/{agent_id}/slots/{i}": slot(i) for i in range(count)},
        )
        for agent_id, count in slots_by_agent.items()
    ]
    return json.loads(json.dumps(bindings.v1GetAgentsResponse(agents=agents).to_json()))["agents"]


def test_each_determined_agent_must_offer_one_cuda_slot_per_gpu(gpu_cluster):
    workers = list(gpu_cluster.workers[:3])  # 2 GPUs each
    rows = determined_platform.slot_rows(
        workers, agents_as_the_master_lists_them({"gpu1": 2, "gpu2": 0})
    )
    assert [(r.node, r.ok) for r in rows] == [("gpu1", True), ("gpu2", False), ("gpu3", False)]
    assert rows[0].detail == "agent gpu1: 2 CUDA slot(s) of 2, expected 2"
    assert rows[1].detail == "agent gpu2: 0 CUDA slot(s) of 0, expected 2"  # a broken driver: no slots
    assert rows[2].detail == "agent gpu3 is not registered with the master (agents: gpu1, gpu2)"


def test_each_spark_worker_must_offer_its_gpus(gpu_cluster):
    def worker(host, addresses):
        gpus = {"gpu": {"name": "gpu", "addresses": addresses}} if addresses is not None else {}
        return {
            "id": f"worker-{host}",
            "host": host,
            "port": 40000,
            "cores": 4,
            "memory": 8192,
            "resources": gpus,
            "resourcesused": {},
            "resourcesfree": gpus,
            "state": "ALIVE",
        }

    alive = [worker("127.0.10.11", ["0", "1"]), worker("127.0.10.12", None)]
    rows = spark.gpu_rows(list(gpu_cluster.workers[:3]), alive)
    assert [(r.node, r.ok) for r in rows] == [("gpu1", True), ("gpu2", False), ("gpu3", False)]
    assert rows[0].detail == "gpu amount 2 (addresses 0,1), expected 2"
    assert rows[1].detail == "gpu amount 0 (addresses none), expected 2"
    assert rows[2].detail == "no alive Spark worker on 127.0.10.13 at the master"


def test_a_cpu_inventory_says_no_gpu_on_every_gpu_row_and_asks_no_node(cpu_cluster):
    rows = cluster_module.check_gpus(cpu_cluster, list(cpu_cluster.workers))  # no node answers: none asked
    assert {(r.check, r.node) for r in rows} == {
        (c, n) for c in ("gpu usable", "determined slots", "spark GPUs") for n in ("n1", "n2")
    }
    assert all(r.ok and not r.required and r.detail == "no GPU (cpu inventory)" for r in rows)
    assert cluster_module.failed(rows) == []


def test_the_socket_interface_row_reads_the_nodes_file(cpu_cluster):
    node = cpu_cluster.node("n1")  # 127.0.20.11
    row = cluster_module.socket_interface_row(
        cpu_cluster, node, {"ifname": "enp1s0", "addresses": "127.0.20.11/24 fe80::1/64"}
    )
    assert row.ok and row.detail == "enp1s0 127.0.20.11/24 fe80::1/64"
    elsewhere = cluster_module.socket_interface_row(
        cpu_cluster, node, {"ifname": "ib0", "addresses": "10.9.0.2/16"}
    )
    assert (
        elsewhere.ok and "the inventory's dtlab_socket_ifname; 127.0.20.11 is elsewhere" in elsewhere.detail
    )
    missing = cluster_module.socket_interface_row(cpu_cluster, node, {"ifname": ""})
    assert not missing.ok
    assert missing.detail == "no interface in /etc/dtlab/veth9.env; run ansible-playbook site.yml"
    gone = cluster_module.socket_interface_row(cpu_cluster, node, {"ifname": "enp9s0", "addresses": ""})
    assert not gone.ok and gone.detail == "enp9s0 (from /etc/dtlab/veth9.env) has no address on the node"


# --- a real GPU's answer (tests/fixtures/gpu-h200: an H200 with torch 2.11.0+cu130, 2026-11-26) ---------

REAL_H200_PROBE = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "gpu-h200" / "gpu-probe.json").read_text())


def test_a_real_gpus_probe_answer_is_one_usable_row(gpu1):
    one_gpu = dataclasses.replace(gpu1, gpu_indices=(0,))
    [row] = cluster_module.gpu_usable_rows(one_gpu, REAL_H200_PROBE)
    assert row.ok, row
    assert "sm_90" in row.detail and "NVIDIA H200" in row.detail
    assert cluster_module.arch_runs_on((9, 0), REAL_H200_PROBE["arch_list"]) == "sm_90"
    # The same answer on a node whose inventory expects two GPUs is a failed row, not a pass.
    assert not all(row.ok for row in cluster_module.gpu_usable_rows(gpu1, REAL_H200_PROBE))


def test_the_cu130_builds_machine_code_is_what_a_real_cu130_build_lists():
    """gpu_compat.yml's cu130 `sass` against torch.cuda.get_arch_list() of a real cu130 build. That build
    (2.11.0+cu130) listed no compute_XY entry: the `ptx` line of 2.13's cu130 is not confirmed by it."""
    cu130 = gpucompat.load().build("cu130")
    real_sass = [entry for entry in REAL_H200_PROBE["arch_list"] if entry.startswith("sm_")]
    assert [f"sm_{c.replace('.', '')}" for c in cu130.sass] == real_sass
    assert gpucompat.load().choose([gpucompat.NodeGpus("h200", ("NVIDIA H200",), ("9.0",))], 580) == cu130
