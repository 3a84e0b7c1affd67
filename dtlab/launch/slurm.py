"""Slurm: the ddp launch's torchrun commands, started by Slurm. The driver on the master submits one
`sbatch --wait` job; its srun starts one task a node, and each task execs that node's torchrun, the very
command ddp's unit runs there (ddp.torchrun_argv, natively: Slurm runs no containers here).

The job asks for the placed workers by name (--nodelist), so node ranks and the rendezvous host (the first
placed worker, where rank 0 writes the result) are dtlab's placement, as for ddp. Slurm, not dtlab, picks
the GPUs (--gres; it sets CUDA_VISIBLE_DEVICES). Each task tees its output to its node's log in the attempt
dir, which bench copies back; the driver follows the step live (sattach) and cancels the job when stopped.
"""

from __future__ import annotations

import math
import shlex

from dtlab.cell import Cell
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.launch.common import CellPaths, Launch, Placement, driver_on_master, place, trainer_env
from dtlab.launch.ddp import TRAINER_MODULE, torchrun_argv
from dtlab.remote import UNIT_PREFIX

LABEL = "slurm (sbatch + srun torchrun)"
DRIVER_MODULE = "trainer.launchers.slurm"
MARKS_FILE = "slurm-job.json"  # in the master's output dir: the driver's queue marks
BATCH_LOG = "slurm-batch.log"  # the batch step's output, on the first placed worker (srun's own errors)


def job_name(cell: Cell) -> str:
    """The name of the cell's Slurm job; cluster.reset and bench.stop_cell cancel by it."""
    return f"{UNIT_PREFIX}{cell.key}"


def task_script(cluster: Cluster, placement: Placement, paths: CellPaths) -> str:
    """Bash run by each srun task: its node's torchrun, chosen by the node's Slurm name (= inventory name)."""
    branches = []
    for index, slot in enumerate(placement.slots):
        env = trainer_env(cluster, slot.node)  # without a slot: no CUDA_VISIBLE_DEVICES, Slurm sets it
        argv = torchrun_argv(cluster.python, placement.slots, index, placement.slots[0].node,
                             cluster.rendezvous_port, TRAINER_MODULE, paths.config_path)
        command = shlex.join(["env", *(f"{key}={value}" for key, value in env.items()), *argv])
        log = shlex.quote(paths.log_path(slot.node))
        branches.append(f"  {shlex.quote(slot.node.name)}) exec > >(tee -a {log}) 2>&1; exec {command} ;;")
    return "\n".join([
        # gloo's and NCCL's interface on this node, as ddp's units read it (EnvironmentFile=)
        f"set -a; . {shlex.quote(cluster.socket_env_file)}; set +a",
        'case "$SLURMD_NODENAME" in',
        *branches,
        '  *) echo "dtlab: node $SLURMD_NODENAME is not in this cell\'s placement" >&2; exit 2 ;;',
        "esac",
    ])


def sbatch_options(cluster: Cluster, placement: Placement, paths: CellPaths, timeout_s: int) -> list[str]:
    """The job: the placed workers whole (--exclusive, as every platform gets them), one task each."""
    per_node = {slot.nproc for slot in placement.slots}
    if len(per_node) > 1:
        raise DtlabError(f"cell {placement.cell.key}: a slurm job asks every node for the same number of "
                         f"GPUs, but the placement takes {[slot.nproc for slot in placement.slots]}")
    gres = [f"--gres=gpu:{per_node.pop()}"] if placement.device == "cuda" else []
    srun = ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1", "bash", "-c",
            task_script(cluster, placement, paths)]
    return [
        f"--job-name={job_name(placement.cell)}",
        f"--partition={cluster.require('slurm_partition')}",
        f"--nodes={len(placement.slots)}",
        f"--nodelist={','.join(node.name for node in placement.nodes)}",
        "--ntasks-per-node=1",
        "--exclusive",
        f"--time={math.ceil(timeout_s / 60)}",  # Slurm ends the job at the cell's timeout too
        f"--output={paths.attempt_dir}/{BATCH_LOG}",
        *gres,
        f"--wrap={shlex.join(srun)}",
    ]


def build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    placement = place(cluster, cell)
    paths = CellPaths(cluster, cell, attempt)
    master = cluster.require_master("slurm cells")
    marks = f"{paths.output_dir}/{MARKS_FILE}"
    argv = [cluster.python, "-m", DRIVER_MODULE, "--marks", marks, "--",
            *sbatch_options(cluster, placement, paths, timeout_s)]
    launch = driver_on_master(cluster, placement, paths, argv, trainer_env(cluster, master), timeout_s, LABEL,
                              result_node=placement.slots[0].node)
    launch.node_logs = tuple((node, paths.log_path(node)) for node in placement.nodes)
    launch.platform_marks = (master, marks)
    return launch
