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

from dtlab import remote
from dtlab.cell import Cell
from dtlab.checks import CheckRow, NodeStates, service_state
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.launch import CellPaths, Launch, Placement, driver_on_master, place, trainer_env
from dtlab.platforms.base import (
    DTLAB_RETRY,
    Platform,
    PreflightError,
    ResetSteps,
    Upstream,
    missing_unit_row,
    register,
)
from dtlab.platforms.ddp import TRAINER_MODULE, rendezvous_port, torchrun_argv
from dtlab.remote import UNIT_PREFIX
from dtlab.waiting import wait_until

NAME = "slurm"
IDLE_WAIT_S = 30  # slurmd re-registers, and a node completes its last job, within seconds
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
                             rendezvous_port(cluster), TRAINER_MODULE, paths.config_path)
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


# --- what Slurm says: asked with its own clients on the master (slurm-client, the slurm role) ---

# sinfo's short node states (%t). Ready: takes a new exclusive job at once. Usable: up, perhaps busy.
# Held: out of service until `scontrol update state=resume` (cluster.reset does it).
READY_STATES = ("idle",)
USABLE_STATES = ("idle", "alloc", "mix", "comp")
HELD_STATES = ("drain", "drng", "down", "fail", "failg")


def base_state(state: str) -> str:
    """The state without sinfo's flags (down* = not responding, idle~ = powered off, ...)."""
    return state.rstrip("*~#!%$@^-")


def parse_nodes(sinfo_output: str) -> dict[str, str]:
    """{node: short state} from `sinfo -h -N -o '%N %t'`; a state ends in * when slurmd does not answer."""
    states: dict[str, str] = {}
    for line in sinfo_output.splitlines():
        fields = line.split()
        if len(fields) == 2:
            states[fields[0]] = fields[1]
    return states


def node_states(cluster: Cluster) -> dict[str, str]:
    """Each node of dtlab's partition with its short state, as slurmctld sees it; DtlabError when sinfo
    cannot ask it (slurmctld down, munge refused)."""
    master = cluster.require_master("Slurm")
    partition = shlex.quote(str(cluster.require("slurm_partition")))
    answer = remote.run(master, f"sinfo -h -N -p {partition} -o '%N %t'", timeout=30)
    if not answer.ok:
        why = (answer.stderr or answer.stdout).strip().splitlines()
        raise DtlabError(f"host {master.name}: sinfo: {why[-1] if why else f'exit {answer.exit_code}'}")
    return parse_nodes(answer.stdout)


def wait_for_nodes(cluster: Cluster, nodes: tuple[Node, ...], timeout_s: float) -> dict[str, str]:
    """The nodes' Slurm states once all are ready for a job, or after `timeout_s` (slurmd registers again
    for a few seconds after a restart, and a node completes its last job); {} when sinfo fails."""

    def states() -> dict[str, str]:
        try:
            return node_states(cluster)
        except DtlabError:
            return {}

    def ready(answer: dict[str, str]) -> bool:
        return not answer or all(answer.get(node.name) in READY_STATES for node in nodes)

    return wait_until(states, until=ready, timeout_s=timeout_s, every_s=1) or {}


def resume_held_nodes(cluster: Cluster, say) -> None:
    """Return drained, down or failed workers to service (Slurm keeps them out until told)."""
    try:
        states = node_states(cluster)
    except DtlabError as error:
        say(f"  [yellow]could not ask Slurm for its nodes ({error})[/]")
        return
    held = [w.name for w in cluster.workers if base_state(states.get(w.name, "")) in HELD_STATES]
    if not held:
        say("  no node drained or down")
        return
    answer = remote.run(cluster.master, f"scontrol update nodename={','.join(held)} state=resume", timeout=30)
    say(f"  resumed {', '.join(held)}" if answer.ok else
        f"  [red]could not resume {', '.join(held)}: {(answer.stderr or answer.stdout).strip()[-200:]}[/]")


class Slurm(Platform):
    name = NAME
    label = "Slurm"
    upstream_health = Upstream(  # checked by hand on the date given
        project="Slurm (SchedMD; the distribution's packages)",
        maintained=True,
        last_release="the distribution's packages: 22.05 on Debian 12, 23.11 on Ubuntu 24.04 (roles/slurm)",
        source="https://github.com/SchedMD/slurm/tags",
        checked="2026-11-29",
    )
    colour = "#8c564b"
    description = "one sbatch job per cell; srun starts ddp's torchrun on each placed worker"
    launcher_files = ("trainer/launchers/slurm.py", "trainer/launchers/_slurm.py")
    roles = ("slurm",)
    variable_prefixes = ("slurm_",)
    service_variables = ("slurm_munge_service", "slurm_slurmctld_service", "slurm_slurmd_service")
    check_names = ("slurm controller", "slurm node")
    reset_title = "Slurm: cancel dtlab's jobs, start slurmd where it is down, resume drained nodes"

    def build(self, cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
        return build(cluster, cell, attempt, timeout_s)

    def preflight(self, cluster: Cluster, planned: Launch, sessions: remote.Sessions | None) -> None:
        """slurmctld answers and shows each placed worker idle in dtlab's partition (bounded wait)."""
        nodes = planned.placement.nodes
        head = cluster.master.name if cluster.master else None
        try:
            states = node_states(cluster)
        except DtlabError as error:
            raise PreflightError(f"preflight: {error}; run `invoke cluster.reset`", head) from None
        if any(states.get(node.name) not in READY_STATES for node in nodes):
            states = wait_for_nodes(cluster, nodes, IDLE_WAIT_S) or states
        busy = [f"{node.name} is {states.get(node.name, 'not in it')}"
                for node in nodes if states.get(node.name) not in READY_STATES]
        if busy:
            raise PreflightError(
                f"preflight: Slurm partition {cluster.var('slurm_partition')} on {head}: {', '.join(busy)}; "
                "the cell needs them idle: run `invoke cluster.reset`",
                head,
            )

    def stop(self, cluster: Cluster, cell: Cell, sessions: remote.Sessions | None, timeout_s: int) -> None:
        """The driver cancels its job when stopped; a driver killed outright cannot: cancel by name, then
        wait (bounded) until the job has left the queue, its processes on the nodes ended."""
        if cluster.master is None:
            return
        name = shlex.quote(job_name(cell))
        remote.run(cluster.master,
                   f"scancel --name={name}; for _ in $(seq {timeout_s * 5}); do "
                   f'[ -z "$(squeue -h --name={name})" ] && break; sleep 0.2; done',
                   timeout=timeout_s + 10, sessions=sessions)

    def check_rows(self, cluster: Cluster, states: NodeStates) -> list[CheckRow]:
        """slurmctld (its unit, and dtlab's partition as sinfo shows it) and each worker's slurmd and munge,
        with the node's Slurm state (idle, alloc, drain, down*: a trailing * means slurmd does not answer)."""
        master = cluster.master
        if master is None or master.name not in states:
            return []
        units = self.units(cluster)
        ctld_unit, slurmd_unit, munge_unit = (units["slurm_slurmctld_service"], units["slurm_slurmd_service"],
                                              units["slurm_munge_service"])
        state = service_state(states, master.name, ctld_unit)
        if not state:
            return [missing_unit_row("slurm controller", master, ctld_unit)]
        try:
            slurm_states = node_states(cluster)
        except DtlabError as error:
            return [CheckRow("slurm controller", master.name, False, f"{ctld_unit} {state}; {error}")]
        usable = [w for w in cluster.workers if slurm_states.get(w.name) in USABLE_STATES]
        all_up = state == "active" and len(usable) == len(cluster.workers)
        rows = [CheckRow("slurm controller", master.name, all_up,
                         f"{ctld_unit} {state}; partition {cluster.var('slurm_partition')}: "
                         f"{len(usable)}/{len(cluster.workers)} workers up")]
        for worker in cluster.workers:
            daemon = service_state(states, worker.name, slurmd_unit)
            munge = service_state(states, worker.name, munge_unit)
            slurm_state = slurm_states.get(worker.name, "not in the partition")
            rows.append(CheckRow("slurm node", worker.name,
                                 daemon == "active" and munge == "active" and worker in usable,
                                 f"{slurmd_unit} {daemon or 'not installed'}, "
                                 f"{munge_unit} {munge or 'not installed'}; Slurm says {slurm_state}"))
        return rows

    def reset(self, steps: ResetSteps) -> list[CheckRow]:
        cluster = steps.cluster
        steps.run(steps.masters, f"scancel --user={shlex.quote(cluster.user)} 2>/dev/null; true",
                  "cancel slurm jobs", 60)
        slurmd = shlex.quote(self.units(cluster)["slurm_slurmd_service"] + ".service")
        start_slurmd = (f'[ -z "$(systemctl list-unit-files --plain --no-legend {slurmd})" ] || '
                        f"systemctl is-active -q {slurmd} || systemctl restart {slurmd}")
        steps.run(cluster.workers, start_slurmd, "start slurmd", 120)
        if steps.masters:
            resume_held_nodes(cluster, steps.say)
        return []

    def wait_ready(self, cluster: Cluster, workers: list[Node], timeout_s: float) -> None:
        wait_for_nodes(cluster, tuple(workers), timeout_s)

    def recovery(self, cluster: Cluster) -> str:
        # --requeue acts on a node failure, not on a task that exits: a failed job is resubmitted.
        return DTLAB_RETRY


PLATFORM = register(Slurm())
