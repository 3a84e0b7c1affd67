"""Reading and checking an inventory: load_cluster, and every check of groups, hosts, ports and versions."""

from __future__ import annotations

import ipaddress
import shlex
from pathlib import Path
from typing import Any

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.inventory.model import MASTER_GROUP, WORKERS_GROUP, Cluster, Node
from dtlab.inventory.source import _first_line, _read, check_source_readable
from dtlab.pins import pinned

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
