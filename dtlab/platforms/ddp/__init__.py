"""DDP: torchrun on each selected worker at once over SSH, rendezvous on the first selected worker.

Natively from the node venv, or inside Docker as the study's Listing 4.1 ran it (host network, the
code mounted at /app) when the inventory sets dtlab_trainer_runtime: docker.
"""

from __future__ import annotations

from collections.abc import Sequence

from dtlab.cell import Cell
from dtlab.checks import CheckRow, NodeStates
from dtlab.inventory import Cluster, Node
from dtlab.launch import (
    CellPaths,
    Launch,
    Slot,
    place,
    serve_config,
    serve_url,
    serving,
    trainer_config,
    trainer_env,
    unit,
)
from dtlab.platforms.base import DTLAB_RETRY, Platform, ResetSteps, Upstream, register
from dtlab.remote import UnitSpec

NAME = "ddp"
LABEL = "ddp (torchrun)"
TRAINER_MODULE = "trainer.launchers.torchrun"
# A search cell (scenario C): the plan's trials one after another under one torchrun, each on the cell's
# workers, with or without dtlab's own ASHA rule (the baseline Ray Tune and Determined are set against).
SWEEP_MODULE = "trainer.launchers.sweep"
SWEEP_LABEL = "sweep (torchrun, one trial at a time)"
AGENT_MODULE = "trainer.launchers.agent"  # torch.distributed.run, unchanged
# A serve cell (scenario C): the plain baseline, one FastAPI app in one uvicorn process on each worker.
SERVE_MODULE = "trainer.launchers.serve"
SERVE_LABEL = "plain (FastAPI + uvicorn, one process a worker)"


def rendezvous_port(cluster: Cluster) -> int:
    """torchrun's static rendezvous port on the first placed worker (slurm's torchrun takes it too)."""
    return int(cluster.require("dtlab_rendezvous_port"))


# Elastic recovery (a fault plan's `recovery: elastic`): torchrun's own restart of its worker group after
# a node is lost, the survivors meeting again at the c10d rendezvous and going on with fewer workers.
ELASTIC_MAX_RESTARTS = 1
# Once the round has its minimum (1 node), how long it waits for more before it starts: the nodes' units
# start within a second of each other, a lost node never comes back in time.
ELASTIC_LAST_CALL_S = 10


def rendezvous_args(node_count: int, index: int, address: str, port: int, elastic_id: str | None = None
                    ) -> list[str]:
    """torchrun's rendezvous flags: static (env://) on `address`, as in the study, or with `elastic_id`
    elastic (c10d, 1 to node_count nodes, restarts after a lost node). The store is node 0's agent's, said
    outright (is_host): torch's guess compares the address with what the node's own hostname resolves to."""
    if elastic_id is None:
        return [f"--nnodes={node_count}", f"--node_rank={index}", f"--master_addr={address}",
                f"--master_port={port}"]
    return [f"--nnodes=1:{node_count}", "--rdzv-backend=c10d", f"--rdzv-endpoint={address}:{port}",
            f"--rdzv-id={elastic_id}", f"--max-restarts={ELASTIC_MAX_RESTARTS}",
            f"--rdzv-conf=last_call_timeout={ELASTIC_LAST_CALL_S},is_host={str(index == 0).lower()}"]


def torchrun_argv(
    python: str,
    slots: tuple[Slot, ...],
    index: int,
    rendezvous: Node,
    port: int,
    module: str,
    config_path: str,
    elastic_id: str | None = None,
    module_args: Sequence[str] = (),
) -> list[str]:
    """One node's torchrun: static rendezvous (env://) on the first worker, as in the study, or elastic
    with `elastic_id` (rendezvous_args).

    Through trainer.launchers.agent: torchrun itself, minus ~2 s of Python's collection at its exit.
    """
    return [
        python,
        "-m",
        AGENT_MODULE,
        *rendezvous_args(len(slots), index, rendezvous.address, port, elastic_id),
        f"--nproc_per_node={slots[index].nproc}",
        "-m",
        module,
        "--config",
        config_path,
        *module_args,
    ]


def docker_argv(
    cluster: Cluster, cell: Cell, node: Node, slot: Slot, env: dict[str, str], inner: list[str]
) -> list[str]:
    """Listing 4.1: docker run --gpus --network host -v code:/app image torchrun ..."""
    image = cluster.trainer_image
    argv = [
        "docker",
        "run",
        "--rm",
        f"--name={unit(cell, node)}",
        "--network=host",
        "--ipc=host",
        f"--user={cluster.user}",
        "-v",
        f"{cluster.code_dir}:/app:ro",
        "-v",
        f"{cluster.runs_dir}:{cluster.runs_dir}",
        "-v",
        f"{cluster.data_dir}:{cluster.data_dir}",
        *(("-v", f"{shared}:{shared}") if (shared := cluster.shared_checkpoint_dir) else ()),
        "-w",
        "/app",
        f"--env-file={cluster.socket_env_file}",  # gloo's and NCCL's interface on this node
    ]
    if slot.gpu_indices:
        argv += ["--gpus", f"device={','.join(str(i) for i in slot.gpu_indices)}"]
    for key, value in {**env, "PYTHONPATH": "/app"}.items():
        if key != "CUDA_VISIBLE_DEVICES":  # --gpus already narrows the container's view
            argv += ["-e", f"{key}={value}"]
    return [*argv, image, "python", *inner[1:]]


def build(
    cluster: Cluster,
    cell: Cell,
    attempt: int,
    timeout_s: int,
    *,
    module: str = TRAINER_MODULE,
    label: str = LABEL,
    extra_env: dict[str, str] | None = None,
) -> Launch:
    placement = place(cluster, cell)
    paths = CellPaths(cluster, cell, attempt)
    first = placement.slots[0].node
    elastic_id = f"{unit(cell, first)}-a{attempt}" if cell.elastic else None  # one rendezvous per attempt
    # A search cell's launcher reads its plan; its slots are the cell's workers (its busy fraction's).
    search = ["--search", paths.search_plan_path, "--slots", str(len(placement.slots))] if cell.search else []
    docker = cluster.trainer_runtime == "docker"
    jobs = []
    for index, slot in enumerate(placement.slots):
        env = {**trainer_env(cluster, slot.node, slot), **(extra_env or {})}
        argv = torchrun_argv(cluster.python, placement.slots, index, first, rendezvous_port(cluster), module,
                             paths.config_path, elastic_id, search)
        if docker:
            argv = docker_argv(cluster, cell, slot.node, slot, env, argv)
        jobs.append(
            (
                slot.node,
                UnitSpec(
                    unit=unit(cell, slot.node),
                    argv=argv,
                    log_path=paths.log_path(slot.node),
                    user=None if docker else cluster.user,
                    workdir=cluster.code_dir,
                    env=env,
                    environment_files=(cluster.socket_env_file,),
                    runtime_max_s=timeout_s,
                ),
            )
        )
    config = trainer_config(cluster, placement, paths, label)
    if cell.elastic:  # the survivors resume the checkpoint that more workers wrote
        config["elastic"] = True
    return Launch(
        cell=cell,
        placement=placement,
        paths=paths,
        jobs=jobs,
        prepare_nodes=placement.nodes,
        result_node=first,
        trainer_config=config,
        label=label,
    )


def serve_build(cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
    """A serve cell: one plain server on each placed worker, at that worker's cluster address."""
    placement, paths = place(cluster, cell), CellPaths(cluster, cell, attempt)
    port = int(cell.task_plan["port"])
    jobs = [(slot.node, UnitSpec(
        unit=unit(cell, slot.node),
        argv=[cluster.python, "-m", SERVE_MODULE, "--config", paths.config_path, "--host", slot.node.address,
              "--port", str(port)],
        log_path=paths.log_path(slot.node),
        user=cluster.user,
        workdir=cluster.code_dir,
        env=trainer_env(cluster, slot.node, slot),
        environment_files=(cluster.socket_env_file,),
        runtime_max_s=timeout_s,
    )) for slot in placement.slots]
    urls = [serve_url(slot.node, port) for slot in placement.slots]
    return Launch(cell=cell, placement=placement, paths=paths, jobs=jobs, prepare_nodes=placement.nodes,
                  result_node=placement.slots[0].node, label=SERVE_LABEL,
                  trainer_config=serve_config(cluster, placement, paths, SERVE_LABEL),
                  serving=serving(cluster, placement, paths, timeout_s, urls, len(jobs)))


def rendezvous_listeners_command(port: int) -> str:
    """Prints the processes listening on the rendezvous port ("pid=..,name" pairs; nothing when free)."""
    return (f"ss -Hltnp 'sport = :{port}' 2>/dev/null | grep -o 'users:.*' | tr '\\n' ' '")


class Ddp(Platform):
    name = NAME
    label = "PyTorch DDP"
    upstream_health = Upstream(  # checked by hand on the date given
        project="PyTorch (torch.distributed, torchrun)",
        maintained=True,
        last_release=("torch 2.13.0 is the release dtlab pins (constraints.txt); "
                      "release date not recorded here"),
        source="https://github.com/pytorch/pytorch/releases",
        checked="2026-11-29",
    )
    colour = "#1f77b4"
    description = "torchrun on each placed worker, static rendezvous on the first (the study's baseline)"
    launcher_files = ("trainer/launchers/torchrun.py",)
    server = "the plain server: FastAPI + uvicorn, one process a worker (trainer/launchers/serve.py)"
    roles = ()  # torchrun comes with torch: the trainer venv (and image) every platform shares
    variable_prefixes = ("dtlab_rendezvous_",)
    check_names = ("ddp rendezvous port",)
    reset_title = "DDP: torchrun lives in each cell's units (stopped above); is the rendezvous port free?"

    def build(self, cluster: Cluster, cell: Cell, attempt: int, timeout_s: int) -> Launch:
        if cell.search:
            return build(cluster, cell, attempt, timeout_s, module=SWEEP_MODULE, label=SWEEP_LABEL)
        if cell.trained:
            return serve_build(cluster, cell, attempt, timeout_s)
        return build(cluster, cell, attempt, timeout_s)

    def search_refusal(self, cluster: Cluster, early_stopping: str) -> str | None:
        return None  # the sweep runs the plan with dtlab's ASHA rule or without early stopping

    def probe_lines(self, cluster: Cluster, node: Node) -> list[str]:
        if node not in cluster.workers:
            return []
        return [f"echo ddp.rendezvous=$({rendezvous_listeners_command(rendezvous_port(cluster))})"]

    def check_rows(self, cluster: Cluster, states: NodeStates) -> list[CheckRow]:
        """The rendezvous port free on each worker: a process left holding it (a torchrun started by hand,
        a stray rank) makes the next cell placed first there fail at its rendezvous."""
        rows = []
        for worker in cluster.workers:
            values = states.get(worker.name)
            if values is None:
                continue
            holders = values.get("ddp.rendezvous", "").strip()
            running = [u for u in values.get("units", "").split(",") if u]
            port = rendezvous_port(cluster)
            if not holders:
                rows.append(CheckRow(self.check_names[0], worker.name, True, f"{port} free"))
            elif running:  # a cell of its own may hold it now
                rows.append(CheckRow(self.check_names[0], worker.name, True,
                                     f"{port} in use while {len(running)} dtlab unit(s) run: {holders}",
                                     required=False))
            else:
                rows.append(CheckRow(self.check_names[0], worker.name, False,
                                     f"{port} held with no dtlab unit running: {holders}; stop that "
                                     "process, or set dtlab_rendezvous_port"))
        return rows

    def reset(self, steps: ResetSteps) -> list[CheckRow]:
        """Nothing of DDP outlives a cell's units; a port still held after they stopped is reported
        (never killed: the process is not dtlab's) by the check that ends the reset."""
        steps.say("  nothing to restart; the rendezvous port is checked below")
        return []

    def recovery(self, cluster: Cluster) -> str:
        # The study's torchrun: static rendezvous, no --max-restarts; a user reruns it, as dtlab does.
        return DTLAB_RETRY

    def elastic_refusal(self, cluster: Cluster) -> str | None:
        if cluster.trainer_runtime == "docker":  # the unit runs the docker client, not the container
            return ("recovery elastic: with dtlab_trainer_runtime docker a lost node's container outlives "
                    "its unit; use the native runtime, or recovery restart")
        return None

    def elastic_recovery(self, cluster: Cluster) -> str:
        return (f"torchrun's elastic rendezvous (c10d, --nnodes=1:N, --max-restarts={ELASTIC_MAX_RESTARTS}): "
                "the survivors meet again and go on from the checkpoint with fewer workers")


PLATFORM = register(Ddp())
