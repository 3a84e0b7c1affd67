"""Horovod: horovodrun on the master starts one rank per placed GPU (CPU: per worker) over SSH, with Gloo;
Horovod's ring all-reduce averages the gradients (trainer.launchers.horovod) in place of DDP's.

The ranks are placed as dtlab places ddp (`-H` lists the placed workers in order, so rank 0 runs on the
first, where its result lands). Each rank reads its own node's socket interface (the file the units
read), so nodes whose interfaces are named differently still agree. The ranks run outside dtlab's units
(horovodrun's SSH starts them): `stop` ends them by the PIDs they left in the attempt's output dir.
A fault plan's `recovery: elastic` runs Horovod Elastic (trainer/launchers/_horovod_elastic.py).
Installed only where `horovod_install` is true (the horovod role; dtlab builds Horovod 0.28.1 itself,
see roles/horovod/README.md).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from dtlab import paths, remote, roles
from dtlab.cell import Cell
from dtlab.checks import CheckRow, NodeStates
from dtlab.inventory import Cluster, Node
from dtlab.launch import CellPaths, Launch, Placement, driver_on_master, place, trainer_env
from dtlab.pins import pinned
from dtlab.pipconfig import uv_install
from dtlab.platforms.base import (
    DTLAB_RETRY,
    Platform,
    PreflightError,
    ResetSteps,
    Run,
    Say,
    Upstream,
    register,
)
from trainer import progress, strategies

NAME = "horovod"
LABEL = "horovod (horovodrun, Gloo)"
TRAINER_MODULE = "trainer.launchers.horovod"
START_TIMEOUT_S = 60  # horovodrun's wait for every rank to reach its rendezvous
# Horovod Elastic (a fault plan's `recovery: elastic`): the driver blacklists a lost rank's host and
# resets the survivors once (the plan's one fault), waiting at most this long for the ranks it needs.
ELASTIC_OPTIONS = ("--reset-limit", "1", "--elastic-timeout", "120")
# The strategies that leave the gradients to the launcher (the trainer's own fact:
# Strategy.runs_under_gradient_syncing_launcher; the contract test keeps the two equal).
STRATEGIES = (strategies.DEFAULT,)
# What the build script needs beside torch and cloudpickle in the venv it builds in (its setup_requires).
BUILD_REQUIREMENTS = ("psutil", "pyyaml", "packaging", "cffi", "setuptools>=70.1")
# Printed by the probe on a node whose trainer venv has Horovod with PyTorch and Gloo built in.
BUILT = "pytorch+gloo"
PROBE = ("import horovod.torch as h, sys; "
         f"sys.stdout.write('{BUILT}' if h.gloo_built() else 'pytorch, no gloo')")


def gpu_build_args(cluster: Cluster, torch_requirement: str) -> list[str]:
    """The build script's GPU arguments as the horovod role passes them (horovod_gpu_operations: auto builds
    NCCL's for a CUDA build of torch, e.g. torch==2.13.0+cu126), or none."""
    node = cluster.nodes[0]
    node_os = str(cluster.require("dtlab_node_os"))
    operations = roles.role_value(node, "horovod", "horovod_gpu_operations", node_os)
    if operations == "NCCL" or (operations == "auto" and "+cu" in torch_requirement):
        return ["--gpu-operations", "NCCL",
                "--cuda-cc-list", roles.role_value(node, "horovod", "horovod_cuda_cc_list", node_os)]
    return []


def installed(cluster: Cluster) -> bool:
    return bool(cluster.var("horovod_install", False))


def horovodrun(cluster: Cluster) -> str:
    return f"{cluster.venv_dir}/bin/horovodrun"


def rank_command(cluster: Cluster, paths: CellPaths) -> str:
    """What horovodrun runs for each rank, on its node: that node's interface for torch's Gloo group and
    Horovod's own, then the launcher."""
    env_file = shlex.quote(cluster.socket_env_file)
    launcher = shlex.join([cluster.python, "-m", TRAINER_MODULE, "--config", paths.config_path])
    return (f"set -a; . {env_file}; set +a; export HOROVOD_GLOO_IFACE=\"$GLOO_SOCKET_IFNAME\"; "
            f"cd {shlex.quote(cluster.code_dir)} && exec {launcher}")


def driver_script(cluster: Cluster, placement: Placement, paths: CellPaths, elastic: bool = False) -> str:
    """The driver unit's shell: horovodrun with the placed hosts in order, on the master's interface;
    `elastic`: Horovod Elastic on those fixed hosts, going on with as few as one rank (ELASTIC_OPTIONS)."""
    hosts = ",".join(f"{slot.node.address}:{slot.nproc}" for slot in placement.slots)
    world_size = sum(slot.nproc for slot in placement.slots)
    elastic_options = ["--min-np", "1", "--max-np", str(world_size), *ELASTIC_OPTIONS] if elastic else []
    options = shlex.join([horovodrun(cluster), "--gloo", "-np", str(world_size), "-H", hosts,
                          "--start-timeout", str(START_TIMEOUT_S), *elastic_options])
    ranks = shlex.join(["sh", "-c", rank_command(cluster, paths)])
    return f'exec {options} --network-interfaces "$GLOO_SOCKET_IFNAME" {ranks}'


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    placement = place(cluster, cell)
    paths = CellPaths(cluster, cell, attempt)
    master = cluster.require_master("horovod cells")
    argv = ["sh", "-c", driver_script(cluster, placement, paths, cell.elastic)]
    launch = driver_on_master(cluster, placement, paths, argv, trainer_env(cluster, master), timeout_s, LABEL,
                              result_node=placement.slots[0].node)
    if cell.elastic:  # the survivors resume the checkpoint that more ranks wrote
        launch.trainer_config["elastic"] = True
    return launch


def stop_ranks_command(cluster: Cluster, cell_dirs: str) -> str:
    """Kill the ranks of the cells under `cell_dirs` (a shell glob) on this node, by the PIDs they left
    in each attempt's output dir, each checked to be the venv's Python (a finished rank's PID may have
    been reused)."""
    pid_files = f"{cell_dirs}/attempt-*/out/{progress.RANKS_DIR}/*.pid"
    return remote.kill_by_pid_files(cluster.python, pid_files) + "; true"


class Horovod(Platform):
    name = NAME
    label = "Horovod"
    upstream_health = Upstream(  # checked by hand on the date given
        project="Horovod (horovod/horovod)",
        maintained=False,
        last_release="0.28.1, 12 June 2023; no release since (its C++17 fix, merged in 2024, is in none)",
        source="PyPI's horovod release history (roles/horovod/README.md)",
        checked="2026-11-29",
    )
    colour = "#e377c2"
    description = "horovodrun on the master starts the ranks over SSH; Horovod's Gloo ring averages gradients"
    launcher_files = ("trainer/launchers/horovod.py",)
    roles = ("horovod",)
    variable_prefixes = ("horovod_",)
    check_names = ("horovod",)
    reset_title = "Horovod: end ranks left behind by a stopped horovodrun (by their PIDs)"

    def strategy_refusal(self, strategy: str) -> str | None:
        if strategy in STRATEGIES:
            return None
        return (f"strategy {strategy} cannot run under Horovod, whose optimizer averages every gradient "
                f"itself; use strategy {' or '.join(STRATEGIES)} on horovod, "
                f"or {strategy} on another platform")

    def offline_wheels(self, cluster: Cluster) -> list[str]:
        """Its wheel (dtlab builds it: PyPI has 0.28.1's C++14 sdist alone) and cloudpickle, if installed."""
        return [NAME, "cloudpickle"] if installed(cluster) else []

    def build_offline_wheels(self, cluster: Cluster, wheels: Path, torch: str, run: Run, say: Say) -> None:
        """The wheel against the bundle's torch, as the horovod role builds it on the controller (the same
        script, build venv and wheelhouse, so either reuses the other's), and the cloudpickle it needs."""
        version = str(cluster.var("horovod_version"))
        cloudpickle = f"cloudpickle=={cluster.var('horovod_cloudpickle_version')}"
        venv = paths.STATE_DIR / "horovod-build-venv"
        if not (venv / "bin/python").exists():
            run([sys.executable, "-m", "venv", str(venv)], "the Horovod build venv", 300)
        install, uv_environment = uv_install(venv / "bin/python", "--find-links", str(wheels),
                                             "-c", str(paths.CONSTRAINTS_FILE), torch, cloudpickle,
                                             *BUILD_REQUIREMENTS)
        run(["env", *(f"{name}={value}" for name, value in uv_environment.items()), *install],
            "the Horovod build venv", 3600)
        paths.WHEELHOUSE_DIR.mkdir(parents=True, exist_ok=True)
        gpu_args = gpu_build_args(cluster, torch)
        say(f"bundle: wheels: Horovod {version} against {torch}{' with NCCL' if gpu_args else ''}"
            " (about 5 minutes, once)")
        script = paths.REPO_ROOT / "scripts/build-horovod-wheel.sh"
        built = run([str(script), "--python", str(venv / "bin/python"), "--out", str(paths.WHEELHOUSE_DIR),
                     "--version", version, "--sha256", str(cluster.var("horovod_sdist_sha256")), *gpu_args],
                    "scripts/build-horovod-wheel.sh", 3600)
        wheel = Path(built.stdout.strip().splitlines()[-1])
        shutil.copy2(wheel, wheels / wheel.name)
        run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--only-binary=:all:", "--dest", str(wheels), cloudpickle], "pip download cloudpickle", 600)

    def start_controller_build(self, cluster: Cluster, log: Path) -> subprocess.Popen | None:
        """Horovod's compile (minutes on 2 cores) where the horovod role would run it on the controller (a
        wheelhouse cluster: the lab), against the pinned torch in a venv of its own, into the wheelhouse the
        role builds into: the role's build step waits on the script's lock, then finds the wheel."""
        if not installed(cluster) or cluster.var("dtlab_bundle") or \
                cluster.var("trainer_install_source") != "wheelhouse":
            return None
        venv = paths.STATE_DIR / "horovod-prebuild-venv"
        cloudpickle = f"cloudpickle=={cluster.var('horovod_cloudpickle_version')}"
        requirements = [f"torch=={pinned('torch')}", cloudpickle, *BUILD_REQUIREMENTS]
        # uv, as setup.sh: torch's 200 MB unpacked in seconds, not pip's half minute of the CPU the lab's
        # image and converge are using beside it.
        install, uv_environment = uv_install(venv / "bin/python", "-c", str(paths.CONSTRAINTS_FILE),
                                             *requirements)
        script = " && ".join([
            shlex.join([sys.executable, "-m", "venv", str(venv)]),
            shlex.join(["env", *(f"{name}={value}" for name, value in uv_environment.items()), *install]),
            shlex.join([str(paths.REPO_ROOT / "scripts/build-horovod-wheel.sh"), "--python",
                        str(venv / "bin/python"), "--out", str(paths.WHEELHOUSE_DIR),
                        "--version", str(cluster.var("horovod_version")),
                        "--sha256", str(cluster.var("horovod_sdist_sha256"))])])
        paths.WHEELHOUSE_DIR.mkdir(parents=True, exist_ok=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            return subprocess.Popen(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def build(self, cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
        return build(cluster, cell, attempt, timeout_s)

    def preflight(self, cluster: Cluster, planned: Launch, sessions: remote.Sessions | None) -> None:
        if not installed(cluster):
            raise PreflightError("preflight: Horovod is not installed on this inventory (horovod_install: "
                                 "false); set it to true and run ansible-playbook site.yml")

    def stop(self, cluster: Cluster, cell: Cell, sessions: remote.Sessions | None, timeout_s: int) -> None:
        cell_dir = shlex.quote(CellPaths(cluster, cell, 1).cell_dir)
        remote.run_all(cluster.workers, stop_ranks_command(cluster, cell_dir), timeout=timeout_s)

    def probe_lines(self, cluster: Cluster, node: Node) -> list[str]:
        if not installed(cluster):
            return []
        probe = shlex.join([cluster.python, "-c", PROBE])
        return [f"echo horovod.built=$({probe} 2>&1 | tail -n 1)"]

    def check_rows(self, cluster: Cluster, states: NodeStates) -> list[CheckRow]:
        """On the master (horovodrun) and each worker (the ranks): Horovod with PyTorch and Gloo."""
        nodes = [node for node in cluster.nodes if node.name in states]
        if not installed(cluster):
            return [CheckRow("horovod", node.name, True, "not installed here (horovod_install: false)",
                             required=False) for node in nodes]
        rows = []
        for node in nodes:
            built = states[node.name].get("horovod.built", "").strip()
            rows.append(CheckRow("horovod", node.name, built == BUILT,
                                 "PyTorch and Gloo built in" if built == BUILT
                                 else f"{cluster.python}: {built or 'no answer'}; "
                                 "run ansible-playbook site.yml"))
        return rows

    def reset(self, steps: ResetSteps) -> list[CheckRow]:
        """horovodrun stops with its driver unit (step 1); its ranks, started over SSH, may outlive it."""
        every_cell = f"{shlex.quote(steps.cluster.runs_dir)}/{NAME}-*"  # cell keys start with the platform
        steps.run(steps.cluster.workers, stop_ranks_command(steps.cluster, every_cell),
                  "stop horovod ranks", 60)
        return []

    def recovery(self, cluster: Cluster) -> str:
        # A static horovodrun job ends every rank when one fails (its elastic mode: recovery elastic).
        return DTLAB_RETRY

    def elastic_refusal(self, cluster: Cluster) -> str | None:
        return None  # the ranks run natively under either trainer runtime (rank_command)

    def elastic_recovery(self, cluster: Cluster) -> str:
        return ("Horovod Elastic (horovodrun --min-np 1, hvd.elastic.run): the lost rank's host is "
                "blacklisted, the survivors reset and go on from the checkpoint with fewer ranks")


PLATFORM = register(Horovod())
