"""The target cluster, read with Ansible's own inventory API so group_vars and host_vars apply.

The inventory is the one chosen by the `inventory =` line of ansible.cfg (the same one
`ansible-playbook site.yml` uses); ANSIBLE_INVENTORY or an explicit path (-i/--inventory)
overrides it. Everything the harness knows about nodes, ports and paths comes from here.
"""

from __future__ import annotations

import configparser
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtlab import paths
from dtlab.errors import DtlabError

# Group layout shared by the lab inventory and inventory/cluster.example.yml.
MASTER_GROUP = "master"
WORKERS_GROUP = "workers"
# A group whose presence marks the local lab (its settings live in group_vars/lab.yml).
LAB_GROUP = "lab"
_PLUGINS_READY = False


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
    socket_ifname: str = "eth0"
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
    def rendezvous_port(self) -> int:
        return int(self.require("dtlab_rendezvous_port"))

    @property
    def spark_master_port(self) -> int:
        return int(self.require("spark_master_port"))

    @property
    def spark_master_webui_port(self) -> int:
        return int(self.require("spark_master_webui_port"))

    @property
    def determined_master_port(self) -> int:
        return int(self.require("determined_master_port"))

    @property
    def postgresql_port(self) -> int:
        return int(self.require("postgresql_port"))

    @property
    def python(self) -> str:
        return f"{self.venv_dir}/bin/python"

    @property
    def trainer_runtime(self) -> str:
        """native or docker (the study's Listing 4.1) for DDP cells."""
        return str(self.require("dtlab_trainer_runtime"))

    @property
    def has_determined_master(self) -> bool:
        """True where the Determined binaries are installed; the lab skips them (no download here)."""
        return bool(self.require("determined_install_binaries")) and self.master is not None


def default_inventory_path() -> Path:
    """The inventory ansible-playbook would use: ANSIBLE_INVENTORY, else ansible.cfg's `inventory =`."""
    from_env = os.environ.get("ANSIBLE_INVENTORY")
    if from_env:
        return Path(from_env.split(",")[0]).expanduser()
    parser = configparser.ConfigParser()
    if not parser.read(paths.ANSIBLE_CFG) or not parser.has_option("defaults", "inventory"):
        raise DtlabError(f"{paths.ANSIBLE_CFG}: no `inventory =` line in [defaults]; add one or pass -i")
    configured = Path(parser.get("defaults", "inventory").split(",")[0].strip()).expanduser()
    return configured if configured.is_absolute() else paths.REPO_ROOT / configured


def _ssh_options(args_text: str) -> tuple[tuple[str, ...], str | None]:
    """Split ansible_ssh_common_args/extra_args; pull out UserKnownHostsFile for the SSH client."""
    args = tuple(shlex.split(args_text or ""))
    known_hosts = None
    for i, arg in enumerate(args):
        option = (
            arg[2:]
            if arg.startswith("-o") and len(arg) > 2
            else (args[i + 1] if arg == "-o" and i + 1 < len(args) else "")
        )
        key, _, value = option.replace("=", " ", 1).partition(" ")
        if key.strip().lower() == "userknownhostsfile":
            known_hosts = value.strip().strip('"').split()[0]
    return args, known_hosts


def _gpu_indices(where: str, raw: Any) -> tuple[int, ...]:
    if raw in (None, ""):
        return ()
    if isinstance(raw, str):
        raw = [part for part in raw.replace(",", " ").split()]
    if not isinstance(raw, list | tuple):
        raise DtlabError(f"{where}: gpu_indices must be a list of GPU numbers, got {raw!r}")
    indices = []
    for item in raw:
        try:
            indices.append(int(item))
        except (TypeError, ValueError):
            raise DtlabError(
                f"{where}: gpu_indices entry {item!r} is not a number; write e.g. [0, 1]"
            ) from None
    return tuple(indices)


def load_cluster(inventory: str | Path | None = None) -> Cluster:
    """Read the inventory (default: ansible.cfg's) into a Cluster; variables render when first read."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.vars.manager import VariableManager

    global _PLUGINS_READY
    if not _PLUGINS_READY:  # lookups in group_vars (e.g. lookup('env')) need it; it may be set up once
        init_plugin_loader()
        _PLUGINS_READY = True

    path = Path(inventory).expanduser() if inventory else default_inventory_path()
    if not path.is_absolute():
        path = (Path.cwd() / path).resolve()
    if not path.exists():
        hint = "run `invoke lab.up` to create it" if "lab" in path.name else "check -i/--inventory"
        raise DtlabError(f"inventory {path}: no such file; {hint}")

    loader = DataLoader()
    try:
        manager = InventoryManager(loader=loader, sources=[str(path)], parse=True)
    except Exception as exc:  # ansible raises many types; the user needs one line
        raise DtlabError(f"inventory {path}: cannot be parsed: {str(exc).splitlines()[0]}") from None
    variables = VariableManager(loader=loader, inventory=manager)
    hosts = manager.get_hosts()
    if not hosts:
        raise DtlabError(f"inventory {path}: no hosts (is it a valid Ansible inventory?)")

    nodes = []
    for host in hosts:
        raw = variables.get_vars(host=host, include_hostvars=False)
        where = f"inventory {path}: host {host.name}"
        render = _renderer(loader, raw, where)

        def get(key: str, default: Any = None, _raw=raw, _render=render) -> Any:
            return _render(key, _raw[key]) if key in _raw else default

        address = str(get("ansible_host") or host.name)
        ssh_args, known_hosts = _ssh_options(
            f"{get('ansible_ssh_common_args', '')} {get('ansible_ssh_extra_args', '')}"
        )
        try:
            ssh_port = int(get("ansible_port") or get("ansible_ssh_port") or 22)
        except (TypeError, ValueError):
            raise DtlabError(f"{where}: ansible_port must be a number") from None
        nodes.append(
            Node(
                name=host.name,
                address=address,
                groups=tuple(sorted(g.name for g in host.get_groups() if g.name != "all")),
                ssh_user=str(get("ansible_user") or get("ansible_ssh_user") or "root"),
                ssh_port=ssh_port,
                ssh_key=get("ansible_ssh_private_key_file") or get("ansible_private_key_file"),
                ssh_args=ssh_args,
                known_hosts_file=known_hosts,
                gpu_indices=_gpu_indices(where, get("gpu_indices")),
                device=str(get("dtlab_device", "cuda")),
                socket_ifname=str(get("dtlab_socket_ifname", "eth0")),
                hostvars=dict(raw),
                render=render,
            )
        )

    nodes.sort(key=lambda n: _inventory_order(manager, n.name))
    cluster = Cluster(
        name=str(nodes[0].var("dtlab_cluster_name") or path.stem), inventory_path=path, nodes=tuple(nodes)
    )
    _validate(cluster)
    return cluster


def _renderer(loader: Any, raw: dict[str, Any], where: str):
    """Template one variable on demand against the host's variables (group_vars, host_vars, inventory_dir)."""
    from ansible.template import Templar

    templar = Templar(loader=loader, variables=raw)

    def render(key: str, value: Any) -> Any:
        try:
            return templar.template(value)
        except Exception as exc:
            raise DtlabError(f"{where}: variable {key} does not render: {str(exc).splitlines()[0]}") from None

    return render


def _inventory_order(manager: Any, name: str) -> int:
    """Workers in the order the inventory lists them (Ansible keeps file order in get_hosts())."""
    return [h.name for h in manager.get_hosts()].index(name)


def _validate(cluster: Cluster) -> None:
    where = f"inventory {cluster.inventory_path}"
    groups = {g for n in cluster.nodes for g in n.groups}
    if MASTER_GROUP not in groups:
        raise DtlabError(
            f"{where}: no '{MASTER_GROUP}' group; add the master host under children.{MASTER_GROUP}"
        )
    masters = [n.name for n in cluster.nodes if n.is_master]
    if len(masters) > 1:
        raise DtlabError(
            f"{where}: {len(masters)} hosts in '{MASTER_GROUP}' ({', '.join(masters)}); keep exactly one"
        )
    if not cluster.workers:
        raise DtlabError(f"{where}: no hosts in '{WORKERS_GROUP}'; add at least one worker")
    for node in cluster.nodes:
        if node.device not in ("cuda", "cpu"):
            raise DtlabError(
                f"{where}: host {node.name}: dtlab_device must be cuda or cpu, got {node.device!r}"
            )
    seen: dict[str, str] = {}
    for node in cluster.nodes:
        if node.address in seen:
            raise DtlabError(
                f"{where}: hosts {seen[node.address]} and {node.name} share address {node.address}"
            )
        seen[node.address] = node.name
