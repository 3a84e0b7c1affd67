"""The cluster as the harness sees it: its nodes (Node) and the shared facts of its group_vars (Cluster)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtlab.errors import DtlabError

# Group layout shared by the lab inventory and inventory/cluster.example.yml.
MASTER_GROUP = "master"
WORKERS_GROUP = "workers"
# A group whose presence marks the local lab (its settings live in group_vars/lab.yml).
LAB_GROUP = "lab"


@dataclass(frozen=True)
class Node:
    """One host as the harness sees it: how to reach it and what it offers to training."""

    name: str
    address: str
    groups: tuple[str, ...]
    ssh_user: str
    ssh_port: int = 22
    ssh_key: str | None = None
    ssh_args: tuple[str, ...] = ()
    known_hosts_file: str | None = None
    gpu_indices: tuple[int, ...] = ()
    device: str = "cuda"
    # Raw host variables and a renderer for them: only the keys asked for are templated, so lookups
    # with side effects (the generated-secret password lookups) never run just because we read the inventory.
    hostvars: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)
    render: Any = field(default=None, repr=False, compare=False, hash=False)

    @property
    def is_master(self) -> bool:
        return MASTER_GROUP in self.groups

    @property
    def is_worker(self) -> bool:
        return WORKERS_GROUP in self.groups

    @property
    def uses_gpu(self) -> bool:
        return self.device == "cuda" and bool(self.gpu_indices)

    def var(self, key: str, default: Any = None) -> Any:
        if key not in self.hostvars:
            return default
        value = self.hostvars[key]
        return self.render(key, value) if self.render else value


@dataclass(frozen=True)
class Cluster:
    """The nodes of one inventory plus the shared facts (ports, paths, device) from its group_vars."""

    name: str
    inventory_path: Path
    nodes: tuple[Node, ...]

    @property
    def master(self) -> Node | None:
        masters = [n for n in self.nodes if n.is_master]
        return masters[0] if masters else None

    def require_master(self, needed_by: str) -> Node:
        """The master node, or one line saying that `needed_by` needs a host in group master."""
        if self.master is None:
            raise DtlabError(
                f"inventory {self.inventory_path}: {needed_by} needs a host in group {MASTER_GROUP}"
            )
        return self.master

    @property
    def workers(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.is_worker)

    @property
    def is_lab(self) -> bool:
        return any(LAB_GROUP in n.groups for n in self.nodes)

    @property
    def device(self) -> str:
        """cuda if any worker trains on GPUs, else cpu (each 'GPU' of a cell is then a one-thread worker)."""
        return "cuda" if any(w.uses_gpu for w in self.workers) else "cpu"

    @property
    def max_gpus(self) -> int:
        """Most GPUs one cell can use: every worker's visible GPUs, or one CPU slot per worker."""
        if self.device == "cuda":
            return sum(len(w.gpu_indices) for w in self.workers if w.uses_gpu)
        return len(self.workers)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise DtlabError(
            f"{self.inventory_path}: no host named {name!r}; hosts are {[n.name for n in self.nodes]}"
        )

    def var(self, key: str, default: Any = None) -> Any:
        """A shared fact (port, path, version); the master's view of it, else the first node's."""
        source = self.master or (self.nodes[0] if self.nodes else None)
        return source.var(key, default) if source else default

    def require(self, key: str) -> Any:
        value = self.var(key)
        if value in (None, ""):
            raise DtlabError(
                f"{self.inventory_path}: variable {key} is not set; define it in group_vars/all.yml"
            )
        return value

    # Named shortcuts for the facts every module needs; the values live in group_vars only.
    @property
    def user(self) -> str:
        return str(self.require("dtlab_user"))

    @property
    def venv_dir(self) -> str:
        return str(self.require("dtlab_venv_dir"))

    @property
    def code_dir(self) -> str:
        return str(self.require("dtlab_code_dir"))

    @property
    def data_dir(self) -> str:
        return str(self.require("dtlab_data_dir"))

    @property
    def runs_dir(self) -> str:
        return str(self.require("dtlab_runs_dir"))

    @property
    def shared_checkpoint_dir(self) -> str | None:
        """Where every worker reads and writes checkpoints (one mount on all), or None: each its own disk."""
        return str(self.var("dtlab_shared_checkpoint_dir") or "") or None

    @property
    def socket_env_file(self) -> str:
        """The file on each node naming gloo's and NCCL's interface (the common role writes it from the
        node's facts); every trainer unit reads it."""
        return str(self.require("dtlab_socket_env_file"))

    @property
    def threads_per_worker(self) -> int:
        """CPU threads of each training process (dtlab_threads_per_worker, group_vars/all.yml)."""
        return int(self.require("dtlab_threads_per_worker"))

    @property
    def python(self) -> str:
        return f"{self.venv_dir}/bin/python"

    @property
    def trainer_runtime(self) -> str:
        """native or docker (the study's Listing 4.1): how the platforms that start torchrun run it."""
        return str(self.require("dtlab_trainer_runtime"))

    @property
    def trainer_image(self) -> str:
        """The trainer's Docker image, name:tag, as the trainer role builds it (group_vars/all.yml): the
        docker runtime runs it, trainer.deploy builds it (or finds it, from an offline bundle)."""
        return f"{self.require('trainer_docker_image_name')}:{self.require('trainer_docker_image_tag')}"

