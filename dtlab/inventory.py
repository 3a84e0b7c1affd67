"""The target cluster, read with Ansible's own inventory API so group_vars and host_vars apply.

The inventory is the one chosen by the `inventory =` line of ansible.cfg (the same one
`ansible-playbook site.yml` uses, found and read by Ansible's own configuration, so ANSIBLE_CONFIG
applies); ANSIBLE_INVENTORY or an explicit path (-i/--inventory) overrides it. Everything the
harness knows about nodes, ports and paths comes from here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.pins import pinned

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
    def ray_head_address(self) -> str:
        """host:port of the Ray head's GCS on the master, where Ray drivers and workers join."""
        return f"{self.require_master('Ray').address}:{int(self.require('ray_gcs_port'))}"

    @property
    def ray_dashboard_url(self) -> str:
        """The Ray dashboard and Jobs API on the master's cluster address (token-authenticated)."""
        return f"http://{self.require_master('Ray').address}:{int(self.require('ray_dashboard_port'))}"

    @property
    def ray_auth_token_file(self) -> str:
        """The token file on every node (0600, dtlab_user's): RAY_AUTH_TOKEN_PATH for Ray's processes."""
        return str(self.require("ray_auth_token_file"))

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
        """native or docker (the study's Listing 4.1) for DDP cells."""
        return str(self.require("dtlab_trainer_runtime"))

    @property
    def has_determined_master(self) -> bool:
        """True where the Determined binaries are installed; the lab skips them (no download here)."""
        return bool(self.require("determined_install_binaries")) and self.master is not None


def default_inventory_path() -> Path:
    """The inventory ansible-playbook would use: ANSIBLE_INVENTORY, else the config file's `inventory =`.

    Ansible's own configuration reads it (its DEFAULT_HOST_LIST setting), so its precedence and path
    rules hold: a relative path in the file is relative to the file, one in ANSIBLE_INVENTORY to the
    working directory. The file is Ansible's choice too (see ansible_config_file).
    """
    from ansible.config.manager import ConfigManager

    config_file = ansible_config_file()
    config = ConfigManager(str(config_file) if config_file else None)
    hosts, origin = config.get_config_value_and_origin("DEFAULT_HOST_LIST")
    if origin == "default":  # no ANSIBLE_INVENTORY, no `inventory =`: Ansible would read /etc/ansible/hosts
        raise DtlabError(
            f"{config_file or paths.ANSIBLE_CFG}: no `inventory =` line in [defaults]; add one or pass -i"
        )
    return Path(hosts[0])


def ansible_config_file() -> Path | None:
    """The ansible.cfg Ansible reads here (ANSIBLE_CONFIG, else ./ansible.cfg), found by Ansible itself.

    Where Ansible would fall back to ~/.ansible.cfg or /etc/ansible/ansible.cfg, the repository's
    ansible.cfg is used instead: the harness belongs to this repository, and invoke finds tasks.py from
    any folder below it, as ansible-playbook site.yml runs from its root.
    """
    from ansible.config.manager import find_ini_config_file

    found = find_ini_config_file()
    fallbacks = {Path("~/.ansible.cfg").expanduser(), Path("/etc/ansible/ansible.cfg")}
    if found and ("ANSIBLE_CONFIG" in os.environ or Path(found) not in fallbacks):
        return Path(found)
    return paths.ANSIBLE_CFG if paths.ANSIBLE_CFG.is_file() else (Path(found) if found else None)


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


# --- reading and checking an inventory -------------------------------------------------------------
# The one implementation of the inventory checks: every `invoke` command reads the cluster with
# load_cluster, and site.yml's first play (ansible/validate.yml) calls it through the action plugin
# plugins/action/dtlab_inventory_check.py, so both refuse a bad inventory with the same line.

# Documentation ranges (RFC 5737, RFC 3849): inventory/cluster.example.yml's placeholder addresses.
PLACEHOLDER_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
# Every variable named *_port (ansible_port, dtlab_rendezvous_port, spark_master_port, ...) is a TCP port.
PORT_SUFFIX = "_port"
# How spark cells run (spark_session): each its own application, or a session on a Connect server.
SPARK_SESSIONS = ("application", "connect")
YAML_SUFFIXES = (".yml", ".yaml", ".json")


def load_cluster(inventory: str | Path | None = None, *, allow_placeholders: bool = False) -> Cluster:
    """Read and check the inventory (default: ansible.cfg's); the first problem is one DtlabError line.

    Nothing is written and no node is contacted: variables render only when read (the generated-secret
    lookups never run here) and Ansible's fact cache is not opened. With allow_placeholders, the
    documentation addresses of inventory/cluster.example.yml pass (for commands that contact no node).
    """
    path = check_source_readable(inventory)
    loader, manager, variables = _read(path)
    where = f"inventory {path}"
    hosts = manager.get_hosts()
    _check_groups(where, manager)

    nodes = [_node(where, host, loader, variables, allow_placeholders) for host in hosts]
    cluster = Cluster(
        name=str(nodes[0].var("dtlab_cluster_name") or path.stem), inventory_path=path, nodes=tuple(nodes)
    )
    _check_cluster(where, cluster)
    return cluster


def inventory_path(inventory: str | Path | None = None) -> Path:
    """The inventory's absolute path (default: ansible.cfg's); a mistyped one fails here."""
    path = Path(inventory).expanduser() if inventory else default_inventory_path()
    if not path.is_absolute():
        path = (Path.cwd() / path).resolve()
    if not path.exists():
        hint = (
            "run `invoke lab.up` to create it"
            if path.name.startswith("lab")
            else "check the path given to -i/--inventory or ansible.cfg's `inventory =` line"
        )
        raise DtlabError(f"inventory {path}: no such file; {hint}")
    return path


def check_source_readable(inventory: str | Path | None = None) -> Path:
    """The inventory's path once it exists and its YAML (and its group_vars' and host_vars') parses.

    The checks Ansible's inventory plugins only warn about; also run by the dtlab_inventory plugin, so
    ansible-playbook refuses the same source with the same line."""
    path = inventory_path(inventory)
    _check_yaml_syntax(path)
    return path


def _check_yaml_syntax(path: Path) -> None:
    """YAML syntax errors in the inventory and its group_vars/host_vars, in the YAML parser's own words."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the parser Ansible uses
    for file in _yaml_files(path):
        text = file.read_text(errors="replace")
        if file.suffix == ".json" and _is_json(text):  # Ansible reads JSON first, then YAML
            continue
        try:
            for _ in yaml.compose_all(text, Loader=loader):  # syntax only: custom tags (!vault) compose
                pass
        except yaml.YAMLError as error:
            raise DtlabError(f"inventory {file}: {_yaml_error_line(error)}; fix the YAML there") from None


def _yaml_files(path: Path) -> list[Path]:
    """The YAML files Ansible reads for an inventory: the file (or a folder's), group_vars, host_vars."""
    if path.is_file():
        files, inventory_dir = ([path] if path.suffix in YAML_SUFFIXES else []), path.parent
    else:
        files, inventory_dir = (
            sorted(f for f in path.iterdir() if f.is_file() and f.suffix in YAML_SUFFIXES),
            path,
        )
    for vars_dir in (inventory_dir / "group_vars", inventory_dir / "host_vars"):
        if vars_dir.is_dir():  # like Ansible's host_group_vars: .yml/.yaml/.json or no suffix, no dot files
            files += sorted(
                f
                for f in vars_dir.rglob("*")
                if f.is_file()
                and (f.suffix in YAML_SUFFIXES or not f.suffix)
                and not any(part.startswith(".") for part in f.relative_to(vars_dir).parts)
            )
    return files


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _yaml_error_line(error: Any) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    line = f"YAML syntax error{where}: {problem}"
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context and context_mark and (not mark or context_mark.line != mark.line):
        line += f" ({context} that starts at line {context_mark.line + 1})"
    return line


_reading = False


def reading_inventory() -> bool:
    """Whether load_cluster is parsing an inventory with Ansible's InventoryManager right now."""
    return _reading


def _read(path: Path) -> tuple[Any, Any, Any]:
    """Ansible's loader, inventory and variables for one source; parse failures become one line."""
    import ansible.constants as constants
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager

    # Lookups in group_vars need the plugin loader; inside ansible-playbook (validate.yml) it is set up.
    if not AnsibleCollectionConfig.collection_finder:
        init_plugin_loader()
    loader = DataLoader()
    global _reading
    with _parse_failures() as failures:
        _reading = True  # the dtlab_inventory plugin, called by this parse, leaves the checks to us
        try:
            manager = InventoryManager(loader=loader, sources=[str(path)], parse=True)
        except Exception as exc:  # ansible raises many types; the user needs one line
            raise DtlabError(f"inventory {path}: cannot be parsed: {_first_line(exc)}") from None
        finally:
            _reading = False
    if not manager.get_hosts():
        if failures:  # the reason of the plugin meant for this file: yaml for .yml, else ini
            preferred = "yaml" if path.suffix in YAML_SUFFIXES else "ini"
            reason = failures.get(preferred) or next(iter(failures.values()))
            raise DtlabError(
                f"inventory {path}: not an Ansible inventory: {reason.rstrip('.')};"
                " see inventory/cluster.example.yml for the layout"
            )
        raise DtlabError(f"inventory {path}: no hosts; see inventory/cluster.example.yml for the layout")
    # The harness never reads facts: a memory cache, so reading writes nothing under .dtlab/facts.
    configured_cache, constants.CACHE_PLUGIN = constants.CACHE_PLUGIN, "ansible.builtin.memory"
    try:
        variables = VariableManager(loader=loader, inventory=manager)
    finally:
        constants.CACHE_PLUGIN = configured_cache
    return loader, manager, variables


@contextlib.contextmanager
def _parse_failures():
    """Collect (not print) Ansible's per-plugin parse failures; one of them becomes the message."""
    from ansible.utils.display import Display

    display = Display()
    failures: dict[str, str] = {}  # plugin name -> its first line

    def error_as_warning(msg, exception, **kwargs):
        plugin = re.search(r"with '([^']+)' plugin", msg or "")
        failures[plugin.group(1) if plugin else str(len(failures))] = _first_line(exception)

    def warning(msg, *args, **kwargs):
        if not msg.startswith(("Unable to parse", "No inventory was parsed")):
            type(display).warning(display, msg, *args, **kwargs)

    display.error_as_warning, display.warning = error_as_warning, warning
    try:
        yield failures
    finally:
        del display.error_as_warning, display.warning


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _check_groups(where: str, manager: Any) -> None:
    groups = manager.groups
    masters = [h.name for h in groups[MASTER_GROUP].get_hosts()] if MASTER_GROUP in groups else []
    workers = [h.name for h in groups[WORKERS_GROUP].get_hosts()] if WORKERS_GROUP in groups else []
    if not masters:
        raise DtlabError(
            f"{where}: no host in group '{MASTER_GROUP}'; put exactly one host under {MASTER_GROUP} "
            "(see inventory/cluster.example.yml)"
        )
    if len(masters) > 1:
        raise DtlabError(
            f"{where}: group '{MASTER_GROUP}' has {len(masters)} hosts ({', '.join(masters)}); "
            f"keep exactly one host under {MASTER_GROUP}"
        )
    if not workers:
        raise DtlabError(
            f"{where}: no host in group '{WORKERS_GROUP}'; put the training nodes under {WORKERS_GROUP}"
        )


def _node(where: str, host: Any, loader: Any, variables: Any, allow_placeholders: bool) -> Node:
    """One host as a Node; its address, ports, GPU indices and device are checked on the way."""
    raw = variables.get_vars(host=host, include_hostvars=False)
    where = f"{where}: host {host.name}"
    render = _renderer(loader, raw, where)

    def get(key: str, default: Any = None) -> Any:
        return render(key, raw[key]) if key in raw else default

    address = get("ansible_host")
    if address in (None, ""):
        raise DtlabError(f"{where}: no ansible_host; set ansible_host: <its IP address> under {host.name}")
    address = str(address)
    if not allow_placeholders and _is_placeholder(address):
        raise DtlabError(
            f"{where}: ansible_host {address} is a documentation placeholder (from"
            " inventory/cluster.example.yml); set the node's real address"
        )
    ports = {key: _port(where, key, get(key)) for key in sorted(raw) if key.endswith(PORT_SUFFIX)}
    _check_distinct_ports(where, ports)
    gpu_indices = _gpu_indices(where, get("gpu_indices", []))
    device = str(get("dtlab_device", "cuda"))
    if device not in ("cuda", "cpu"):
        raise DtlabError(f"{where}: dtlab_device must be cuda or cpu, got {device!r}")
    _check_spark_version(where, get("spark_version"))
    spark_session = get("spark_session", "application")
    if spark_session not in SPARK_SESSIONS:
        raise DtlabError(f"{where}: spark_session must be {' or '.join(SPARK_SESSIONS)}, "
                         f"got {spark_session!r}")
    ssh_args, known_hosts = _ssh_options(
        f"{get('ansible_ssh_common_args', '')} {get('ansible_ssh_extra_args', '')}"
    )
    return Node(
        name=host.name,
        address=address,
        groups=tuple(sorted(g.name for g in host.get_groups() if g.name != "all")),
        ssh_user=str(get("ansible_user") or get("ansible_ssh_user") or "root"),
        ssh_port=ports.get("ansible_port") or ports.get("ansible_ssh_port") or 22,
        ssh_key=get("ansible_ssh_private_key_file") or get("ansible_private_key_file"),
        ssh_args=ssh_args,
        known_hosts_file=known_hosts,
        gpu_indices=gpu_indices,
        device=device,
        hostvars=dict(raw),
        render=render,
    )


def _is_placeholder(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # a host name
    return any(ip in net for net in PLACEHOLDER_NETWORKS if net.version == ip.version)


# A range of ports one service takes a port from, by its first and last port's variables.
PORT_RANGES = (("ray_min_worker_port", "ray_max_worker_port"),)


def _check_distinct_ports(where: str, ports: dict[str, int]) -> None:
    """Two services on one port (or one inside another's range) would fail at start, on the node: refused
    here, before a secret is generated or a node contacted."""
    owner: dict[int, str] = {}
    for key, number in ports.items():
        if number in owner:
            raise DtlabError(f"{where}: {owner[number]} and {key} are both {number}; give each service "
                             "a port of its own")
        owner[number] = key
    for first, last in PORT_RANGES:
        if first in ports and last in ports:
            inside = [key for key, number in ports.items()
                      if key not in (first, last) and ports[first] <= number <= ports[last]]
            if inside:
                raise DtlabError(f"{where}: {inside[0]} {ports[inside[0]]} is inside {first}..{last} "
                                 f"({ports[first]}-{ports[last]}); move it out of that range")


def _port(where: str, key: str, value: Any) -> int:
    """A TCP port: a whole number from 1 to 65535 (a digit string, as templates may render, is one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number: int | None = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    else:
        number = None
    if number is None or not 1 <= number <= 65535:
        raise DtlabError(f"{where}: {key} {value!r} is not a port; use a whole number from 1 to 65535")
    return number


def _gpu_indices(where: str, raw: Any) -> tuple[int, ...]:
    """The GPUs a node offers: a YAML list of distinct non-negative integers ([] for none)."""
    if not isinstance(raw, list | tuple):
        raise DtlabError(
            f"{where}: gpu_indices {raw!r} is not a list; write a list of GPU numbers,"
            " e.g. gpu_indices: [0, 1] ([] for none)"
        )
    for item in raw:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise DtlabError(
                f"{where}: gpu_indices entry {item!r} is not a GPU number; use non-negative integers,"
                " e.g. gpu_indices: [0, 1]"
            )
    repeated = sorted({i for i in raw if raw.count(i) > 1})
    if repeated:
        raise DtlabError(
            f"{where}: gpu_indices {list(raw)} lists GPU {repeated[0]} more than once; list each GPU once"
        )
    return tuple(raw)


def _renderer(loader: Any, raw: dict[str, Any], where: str):
    """Template one variable on demand against the host's variables (group_vars, host_vars, inventory_dir)."""
    from ansible.template import Templar

    templar = Templar(loader=loader, variables=raw)

    def render(key: str, value: Any) -> Any:
        try:
            return templar.template(value)
        except Exception as exc:
            raise DtlabError(f"{where}: variable {key} does not render: {_first_line(exc)}") from None

    return render


def _check_cluster(where: str, cluster: Cluster) -> None:
    """Checks across nodes: one address per node, one Determined agent_id per worker."""
    seen: dict[str, str] = {}
    for node in cluster.nodes:
        if node.address in seen:
            raise DtlabError(
                f"{where}: hosts {seen[node.address]} and {node.name} share ansible_host {node.address};"
                " give each node its own address"
            )
        seen[node.address] = node.name
    agents: dict[str, str] = {}
    for worker in cluster.workers:  # same default as the determined_agent role: the inventory name
        agent_id = str(worker.var("determined_agent_id") or worker.name)
        if agent_id in agents:
            raise DtlabError(
                f"{where}: determined_agent_id '{agent_id}' is used by {agents[agent_id]} and {worker.name};"
                " give each worker its own determined_agent_id"
            )
        agents[agent_id] = worker.name


def _check_spark_version(where: str, version: Any) -> None:
    """A host's spark_version (the Spark it runs) must be the pyspark pin's release: the nodes' driver."""
    if version in (None, ""):
        return  # no Spark facts in this inventory (no group_vars/all.yml); the spark role requires them
    version = str(version).strip()
    pin = pinned("pyspark")
    if pin is None:
        raise DtlabError(f"{paths.CONSTRAINTS_FILE}: no pyspark==<version> pin; spark_version follows it")
    if version.split(".")[:2] != pin.split(".")[:2]:
        raise DtlabError(
            f"{where}: spark_version {version} does not match pyspark=={pin} in constraints.txt (the nodes'"
            f" Spark driver); remove the spark_version override, or pin pyspark=={version} in constraints.txt"
        )
