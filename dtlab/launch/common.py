"""What every launcher shares: placement (which nodes and GPUs a cell gets), its paths on the nodes,
its trainer config and environment, and the Launch it returns.

A launcher turns (cluster, cell, attempt) into a list of Jobs: one named unit per node. bench starts them
all at once through dtlab.remote, follows their logs, and fetches the result from `result_node`.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import yaml

from dtlab.cell import DEFAULT_DATA_PATH, Cell, trainer_options
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.matrix.tasks import LoadPlan
from dtlab.remote import UnitSpec, unit_name
from trainer.config import PREDICT_PATH
from trainer.search import SEARCH_FILE_NAME


class ExternalJob(Protocol):
    """A cell's job that runs outside dtlab's units (an experiment on a platform's own scheduler)."""

    result_key: ClassVar[str]  # the result.json key under which its view of the run is kept

    def run(self) -> dict[str, Any]:
        """Start it, wait for it (bounded) and return its scheduler's view of the run; raises on failure."""

    def cancel(self) -> None:
        """Stop it where it runs (Ctrl-C)."""


@dataclass(frozen=True)
class Slot:
    """What one worker contributes to a cell: nproc_per_node processes on these GPUs (none on CPU)."""

    node: Node
    nproc: int
    gpu_indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Placement:
    cell: Cell
    device: str
    slots: tuple[Slot, ...]

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(slot.node for slot in self.slots)

    @property
    def world_size(self) -> int:
        return sum(slot.nproc for slot in self.slots)


def place(cluster: Cluster, cell: Cell) -> Placement:
    """The cell's N GPUs from the workers in inventory order, each giving its visible GPUs.

    On a CPU-only inventory, N GPUs means N workers with one process (one thread) each.
    """
    wanted = cell.gpus
    slots: list[Slot] = []
    if cluster.device == "cuda":
        for worker in cluster.workers:
            if wanted == 0:
                break
            if not worker.uses_gpu:
                continue
            taken = worker.gpu_indices[:wanted]
            slots.append(Slot(worker, len(taken), tuple(taken)))
            wanted -= len(taken)
    else:
        for worker in cluster.workers[:wanted]:
            slots.append(Slot(worker, 1))
            wanted -= 1
    if wanted > 0:
        raise DtlabError(
            f"cell {cell.key}: needs {cell.gpus} {'GPUs' if cluster.device == 'cuda' else 'workers'} "
            f"but inventory {cluster.inventory_path.name} offers {cluster.max_gpus}; lower gpus in "
            "experiments/matrix.yml or add workers"
        )
    return Placement(cell, cluster.device, tuple(slots))


@dataclass(frozen=True)
class CellPaths:
    """Where one cell's files live on the nodes; the checkpoint dir is shared by attempts (resume)."""

    cluster: Cluster
    cell: Cell
    attempt: int

    @property
    def cell_dir(self) -> str:
        return f"{self.cluster.runs_dir}/{self.cell.key}"

    @property
    def attempt_dir(self) -> str:
        return f"{self.cell_dir}/attempt-{self.attempt}"

    @property
    def output_dir(self) -> str:
        return f"{self.attempt_dir}/out"

    @property
    def result_path(self) -> str:
        """What the cell's launcher writes when it ends well: a run's result.json, a search's search.json."""
        return f"{self.output_dir}/{SEARCH_FILE_NAME if self.cell.search else 'result.json'}"

    @property
    def search_plan_path(self) -> str:
        """A search cell's plan (Cell.task_plan), which every way's launcher reads."""
        return f"{self.attempt_dir}/search-plan.json"

    @property
    def checkpoint_root(self) -> str:
        """The cell's folder that holds its checkpoints: on the shared mount when the inventory has one."""
        shared = self.cluster.shared_checkpoint_dir
        return f"{shared}/{self.cell.key}" if shared else self.cell_dir

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.checkpoint_root}/checkpoints"

    @property
    def config_path(self) -> str:
        return f"{self.attempt_dir}/trainer.yml"

    def log_path(self, node: Node) -> str:
        return f"{self.attempt_dir}/{node.name}.log"

    @property
    def cache_dir(self) -> str:
        return f"{self.cluster.data_dir}/token-cache"

    @property
    def platform_data_dir(self) -> str | None:
        """A platform ETL's raw reviews and rows (data_path platform), on the disk every node mounts."""
        shared = self.cluster.shared_checkpoint_dir
        return f"{shared}/platform-data" if shared else None


@dataclass(frozen=True)
class Serving:
    """What bench does with a serve cell's servers: first the trainer's own answers, computed by the
    `expected` unit on its node and written to `expected_path`; then, once every URL answers, the load
    test against `urls` (dtlab/loadtest.py) from the controller."""

    expected: tuple[Node, UnitSpec]
    expected_path: str
    urls: tuple[str, ...]
    load: LoadPlan
    replicas: int  # serving processes (uvicorn's, Ray Serve's replicas)


@dataclass
class Launch:
    """Everything bench needs to run one attempt of one cell."""

    cell: Cell
    placement: Placement
    paths: CellPaths
    jobs: list[tuple[Node, UnitSpec]]
    prepare_nodes: tuple[Node, ...]  # nodes that get the trainer config and output dirs
    result_node: Node  # where rank 0's (or the driver's) result.json lands
    trainer_config: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    # For launchers that run elsewhere (Determined with a master): an ExternalJob, run instead of jobs.
    external: ExternalJob | None = None
    # Logs written on nodes that run no unit of the cell (Slurm's tasks): bench copies each into the
    # attempt folder when the units have ended, as <node>.log.
    node_logs: tuple[tuple[Node, str], ...] = ()
    # A JSON file of the platform's own wall-clock marks (Slurm's queue), on this node at this path:
    # bench adds them to the attempt's clock (harness_timeline_unix).
    platform_marks: tuple[Node, str] | None = None
    # Files beside the trainer config on every prepared node, {path: text}, beyond a search cell's plan
    # (which prepare_command writes for every platform): what the platform wrote for it.
    files: dict[str, str] = field(default_factory=dict)
    # What the platform adds to the recorded result beyond what its launcher wrote (JSON data).
    result_extra: dict[str, Any] = field(default_factory=dict)
    # A serve cell's: its jobs are the servers, which serve until bench stops them (dtlab/bench/serve.py).
    serving: Serving | None = None

    def result_nodes(self, lost: str | None = None) -> tuple[Node, ...]:
        """Where to look for result.json: `result_node`; after an elastic plan lost node `lost`, also every
        other node that ran a unit of the cell (the survivors' new rendezvous may give rank 0 to any)."""
        if lost is None:
            return (self.result_node,)
        seen: dict[str, Node] = {}
        for node in (self.result_node, *(n for n, _ in self.jobs)):
            if node.name != lost:
                seen.setdefault(node.name, node)
        return tuple(seen.values()) or (self.result_node,)

    @property
    def all_nodes(self) -> tuple[Node, ...]:
        seen: dict[str, Node] = {}
        for node in (*self.prepare_nodes, *(n for n, _ in self.jobs), self.result_node):
            seen.setdefault(node.name, node)
        return tuple(seen.values())


def trainer_config(cluster: Cluster, placement: Placement, paths: CellPaths, label: str) -> dict[str, Any]:
    """The YAML the trainer reads: the cell's options plus device, threads and this attempt's paths."""
    config = trainer_options(placement.cell)
    config.update(
        device=placement.device,
        threads=cluster.threads_per_worker,
        output_dir=paths.output_dir,
        checkpoint_dir=paths.checkpoint_dir,
        cache_dir=paths.cache_dir,
        framework_label=label,
    )
    if placement.cell.data_path != DEFAULT_DATA_PATH:  # runner.check_cells refuses it without a shared disk
        config["platform_data_dir"] = paths.platform_data_dir
    return config


EXPECTED_MODULE = "trainer.launchers.expected"


def serve_url(node: Node, port: int | str) -> str:
    return f"http://{node.address}:{port}{PREDICT_PATH}"


def serve_config(cluster: Cluster, placement: Placement, paths: CellPaths, label: str) -> dict[str, Any]:
    """A serve cell's trainer config: its trained cell's options (the checkpoint's config hash is the
    served config's), reading that cell's checkpoints, with this attempt's own output dir."""
    trained = placement.cell.trained
    config = trainer_config(cluster, dataclasses.replace(placement, cell=trained), paths, label)
    config["checkpoint_dir"] = CellPaths(cluster, trained, 1).checkpoint_dir  # shared by its attempts
    return config


def serving(cluster: Cluster, placement: Placement, paths: CellPaths, timeout_s: int, urls: list[str],
            replicas: int) -> Serving:
    """A serve cell's expected answers (on its first placed worker, where the checkpoint and the data
    are) and its load test against `urls`."""
    cell, node = placement.cell, placement.slots[0].node
    load = LoadPlan.from_dict(dict(cell.task_plan["load"]), where=f"cell {cell.key}")
    out = f"{paths.output_dir}/expected.json"
    expected = UnitSpec(
        unit=unit_name(f"{cell.key}-expected", node.name),
        argv=[cluster.python, "-m", EXPECTED_MODULE, "--config", paths.config_path, "--reviews",
              str(load.requests), "--out", out],
        log_path=f"{paths.attempt_dir}/{node.name}-expected.log",
        user=cluster.user,
        workdir=cluster.code_dir,
        env=trainer_env(cluster, node, placement.slots[0]),
        environment_files=(cluster.socket_env_file,),
        runtime_max_s=timeout_s,
    )
    return Serving((node, expected), out, tuple(urls), load, replicas)


def search_files(paths: CellPaths) -> dict[str, str]:
    """A search cell's plan as the file its launcher reads; {} for any other cell."""
    return {paths.search_plan_path: json.dumps(dict(paths.cell.task_plan), sort_keys=True)} \
        if paths.cell.search else {}


def trainer_env(cluster: Cluster, node: Node, slot: Slot | None = None) -> dict[str, str]:
    """Environment of a trainer process: code on the path, threads, visible GPUs. gloo's and NCCL's
    interface is not here: each node's unit reads it from cluster.socket_env_file (the common role
    writes it from that node's facts)."""
    env = {
        "PYTHONPATH": cluster.code_dir,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HOME": f"{cluster.data_dir}/huggingface",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if slot is not None and slot.gpu_indices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in slot.gpu_indices)
    env.update({str(k): str(v) for k, v in (cluster.var("dtlab_trainer_env") or {}).items()})
    return env


def driver_on_master(
    cluster: Cluster,
    placement: Placement,
    paths: CellPaths,
    argv: list[str],
    env: dict[str, str],
    timeout_s: int,
    label: str,
    result_node: Node | None = None,
    environment_files: Sequence[str] = (),
) -> Launch:
    """A launch whose one unit is a driver on the master that lets its platform start the N trainers.

    Every worker gets the attempt's dirs, since the platform (Spark, Ray) may put rank 0 on any worker;
    their drivers copy rank 0's result to their own output_dir, so the result is fetched from the master
    unless `result_node` says where rank 0 runs (Slurm: dtlab's first placed node). The driver's unit
    reads `environment_files` (secrets it must not see in argv) after the node's socket env file.
    """
    master = cluster.require_master(f"{placement.cell.framework} cells")
    job = UnitSpec(
        unit=unit(placement.cell, master),
        argv=argv,
        log_path=paths.log_path(master),
        user=cluster.user,
        workdir=cluster.code_dir,
        env=env,
        environment_files=(cluster.socket_env_file, *environment_files),
        runtime_max_s=timeout_s,
    )
    return Launch(
        cell=placement.cell,
        placement=placement,
        paths=paths,
        jobs=[(master, job)],
        prepare_nodes=(master, *cluster.workers),
        result_node=result_node or master,
        trainer_config=trainer_config(cluster, placement, paths, label),
        label=label,
    )


def prepare_command(launch: Launch, owner: str, fresh: bool) -> str:
    """Shell run on each prepared node: attempt dirs owned by the trainer user, the config file (and a
    search cell's plan, and the launch's files), and (on its own disk) the checkpoint dir. A shared one
    is shared_checkpoint_command's, from one node.

    fresh: drop the cell's old checkpoints (a new run); a retry keeps them and the trainer resumes.
    """
    p = launch.paths
    local_checkpoints = not p.cluster.shared_checkpoint_dir
    config_text = yaml.safe_dump(launch.trainer_config, sort_keys=True)
    files = "".join(f" && printf %s {shlex.quote(text)} > {shlex.quote(path)}"
                    for path, text in {**search_files(p), **launch.files}.items())
    dirs = " ".join(shlex.quote(d) for d in (p.output_dir, p.cache_dir,
                                             *((p.checkpoint_dir,) if local_checkpoints else ())))
    drop = f"rm -rf {shlex.quote(p.checkpoint_dir)} && " if fresh and local_checkpoints else ""
    return (
        f"{drop}rm -rf {shlex.quote(p.attempt_dir)} && mkdir -p {dirs} && "
        f"printf %s {shlex.quote(config_text)} > {shlex.quote(p.config_path)}{files} && "
        f"chown -R {shlex.quote(owner)} {shlex.quote(p.cell_dir)} {shlex.quote(p.cache_dir)}"
    )


def shared_checkpoint_command(launch: Launch, owner: str, fresh: bool) -> str | None:
    """The cell's checkpoint dir on the shared mount, prepared once from one node (nodes doing it at
    once would race each other's rm and chown); None without a shared checkpoint dir."""
    p = launch.paths
    if not p.cluster.shared_checkpoint_dir:
        return None
    drop = f"rm -rf {shlex.quote(p.checkpoint_dir)} && " if fresh else ""
    etl = ""  # its ETL's folder, whose staged reviews later cells reuse: made and owned, never emptied
    if "platform_data_dir" in launch.trainer_config:
        etl = (f" && mkdir -p {shlex.quote(p.platform_data_dir)} && "
               f"chown {shlex.quote(owner)} {shlex.quote(p.platform_data_dir)}")
    return (f"{drop}mkdir -p {shlex.quote(p.checkpoint_dir)} && "
            f"chown -R {shlex.quote(owner)} {shlex.quote(p.checkpoint_root)}{etl}")


def unit(cell: Cell, node: Node) -> str:
    return unit_name(cell.key, node.name)
