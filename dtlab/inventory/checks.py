"""Reading and checking an inventory: read_cluster, and every check of groups, hosts, addresses and ports.
The checks a platform makes of its own variables are handed in (InventoryChecks), by dtlab.platforms."""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtlab.errors import DtlabError
from dtlab.inventory.model import MASTER_GROUP, WORKERS_GROUP, Cluster, Node
from dtlab.inventory.source import _first_line, _read, check_source_readable
from dtlab.roles import all_defaults

# --- reading and checking an inventory -------------------------------------------------------------
# The one implementation of the inventory checks: every `invoke` command reads the cluster with
# dtlab.platforms.load_cluster (read_cluster with the platforms' checks), and site.yml's first play (its
# validation play) calls that through the action plugin plugins/action/dtlab_inventory_check.py, so both
# refuse a bad inventory with the same line.

# Documentation ranges (RFC 5737, RFC 3849): inventory/cluster.example.yml's placeholder addresses.
PLACEHOLDER_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
# Every variable named *_port (ansible_port, dtlab_rendezvous_port, ...) is a TCP port.
PORT_SUFFIX = "_port"
# What one hour of a node costs (optional, in the site's currency): the report's cost per run.
NODE_COST_VARIABLE = "node_cost_per_hour"


@dataclass(frozen=True)
class InventoryChecks:
    """What the inventory's readers add to its own checks (the platforms': dtlab.platforms.INVENTORY_CHECKS).
    Each check raises DtlabError, one line starting with the `where` it is given."""

    # A range of ports one service takes a port from, by its first and last port's variables: no other
    # port of the host may lie inside it.
    port_ranges: tuple[tuple[str, str], ...] = ()
    host: tuple[Callable[[str, Node], None], ...] = ()  # each host, as it is read
    cluster: tuple[Callable[[str, Cluster], None], ...] = ()  # across hosts, once all are read


def read_cluster(inventory: str | Path | None = None, *, allow_placeholders: bool = False,
                 checks: InventoryChecks = InventoryChecks()) -> Cluster:
    """Read and check the inventory (default: ansible.cfg's); the first problem is one DtlabError line.

    Nothing is written and no node is contacted: variables render only when read (the generated-secret
    lookups never run here) and Ansible's fact cache is not opened. With allow_placeholders, the
    documentation addresses of inventory/cluster.example.yml pass (for commands that contact no node).
    `checks` are run too, at their moments; dtlab.platforms.load_cluster hands in every platform's.
    """
    path = check_source_readable(inventory)
    loader, manager, variables = _read(path)
    where = f"inventory {path}"
    hosts = manager.get_hosts()
    _check_groups(where, manager)

    nodes = [_node(where, host, loader, variables, allow_placeholders, checks) for host in hosts]
    cluster = Cluster(
        name=str(nodes[0].var("dtlab_cluster_name") or path.stem), inventory_path=path, nodes=tuple(nodes)
    )
    _check_cluster(where, cluster)
    for check in checks.cluster:
        check(where, cluster)
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


def _node(where: str, host: Any, loader: Any, variables: Any, allow_placeholders: bool,
          checks: InventoryChecks) -> Node:
    """One host as a Node; its address, ports, GPU indices and device are checked on the way, then `checks`'
    host checks."""
    # The roles' defaults under the inventory's variables, as Ansible layers them in a play.
    raw = {**all_defaults(), **variables.get_vars(host=host, include_hostvars=False)}
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
    _check_distinct_ports(where, ports, checks.port_ranges)
    gpu_indices = _gpu_indices(where, get("gpu_indices", []))
    _check_cost(where, get(NODE_COST_VARIABLE))
    device = str(get("dtlab_device", "cuda"))
    if device not in ("cuda", "cpu"):
        raise DtlabError(f"{where}: dtlab_device must be cuda or cpu, got {device!r}")
    ssh_args, known_hosts = _ssh_options(
        f"{get('ansible_ssh_common_args', '')} {get('ansible_ssh_extra_args', '')}"
    )
    node = Node(
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
    for check in checks.host:
        check(where, node)
    return node


def _check_cost(where: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise DtlabError(f"{where}: {NODE_COST_VARIABLE} must be a number >= 0 (what an hour of the node "
                         f"costs), got {value!r}")


def _is_placeholder(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # a host name
    return any(ip in net for net in PLACEHOLDER_NETWORKS if net.version == ip.version)


def _check_distinct_ports(where: str, ports: dict[str, int], ranges: tuple[tuple[str, str], ...]) -> None:
    """Two services on one port (or one inside another's range) would fail at start, on the node: refused
    here, before a secret is generated or a node contacted."""
    owner: dict[int, str] = {}
    for key, number in ports.items():
        if number in owner:
            raise DtlabError(f"{where}: {owner[number]} and {key} are both {number}; give each service "
                             "a port of its own")
        owner[number] = key
    for first, last in ranges:
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
    """Checks across nodes: one address per node."""
    seen: dict[str, str] = {}
    for node in cluster.nodes:
        if node.address in seen:
            raise DtlabError(
                f"{where}: hosts {seen[node.address]} and {node.name} share ansible_host {node.address};"
                " give each node its own address"
            )
        seen[node.address] = node.name
