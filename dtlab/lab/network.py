"""Lab networking on the host: the guard route, the bridge, and one netns + veth per node."""

from __future__ import annotations

import ipaddress
import json

from dtlab.errors import DtlabError
from dtlab.guard import guard_present
from dtlab.lab.config import NETNS_DIR, LabConfig
from dtlab.lab.host import run
from dtlab.lab.state import LabState


# --- the guard ----------------------------------------------------------------
def ensure_guard(address_range: ipaddress.IPv4Network) -> None:
    """Install `blackhole <range>` (shared by all labs, never removed: harmless when idle)."""
    if not guard_present(address_range):
        run(["ip", "route", "add", "blackhole", str(address_range)], check=False)  # a parallel lab may win
    if not guard_present(address_range):
        raise DtlabError(f"lab: cannot install the guard route `blackhole {address_range}`;"
                         f" run `ip route add blackhole {address_range}` as root and retry")


def assert_guard(config: LabConfig) -> None:
    """Call before sending anything to a lab address: without the guard it could leave the machine."""
    if not guard_present(config.address_range):
        raise DtlabError(f"lab {config.name}: the guard route `blackhole {config.address_range}` is missing;"
                         " run `invoke lab.up` (it installs the guard first) before talking to lab nodes")


# --- queries ------------------------------------------------------------------
def link_exists(ifname: str, netns: str | None = None) -> bool:
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return run([*prefix, "link", "show", "dev", ifname], check=False).returncode == 0


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def _clashes(config: LabConfig) -> list[str]:
    """Routes or addresses in the lab's /24 that belong to something other than this lab's bridge."""
    found = []
    for route in json.loads(run(["ip", "-j", "route", "show", "table", "all"]).stdout or "[]"):
        destination = route.get("dst", "")
        if route.get("type") in ("blackhole", "local", "broadcast") or destination in ("", "default"):
            continue
        try:
            network = ipaddress.ip_network(destination, strict=False)
        except ValueError:
            continue
        ours = route.get("dev") == config.bridge_ifname
        if network.version == 4 and network.overlaps(config.subnet) and not ours:
            found.append(f"route {destination} dev {route.get('dev')}")
    for link in json.loads(run(["ip", "-j", "addr", "show"]).stdout or "[]"):
        for address in link.get("addr_info", []):
            if address.get("family") != "inet" or link["ifname"] == config.bridge_ifname:
                continue
            if ipaddress.ip_address(address["local"]) in config.subnet:
                found.append(f"address {address['local']} on {link['ifname']}")
    return found


# --- bridge -------------------------------------------------------------------
def ensure_bridge(config: LabConfig, state: LabState) -> None:
    bridge = config.bridge_ifname
    if link_exists(bridge) and bridge not in state.created("links"):
        raise DtlabError(f"lab {config.name}: interface {bridge} exists but this lab did not create it;"
                         f" delete it (`ip link delete {bridge}`) or choose another --name")
    clashes = _clashes(config)
    if clashes:
        raise DtlabError(f"lab {config.name}: subnet {config.subnet} is already in use ({clashes[0]});"
                         " choose another with --subnet or DTLAB_LAB_SUBNET")
    if not link_exists(bridge):
        state.record_created("links", bridge)
        run(["ip", "link", "add", "name", bridge, "type", "bridge"])
    run(["ip", "addr", "replace", f"{config.bridge_address}/{config.subnet.prefixlen}", "dev", bridge])
    run(["ip", "link", "set", bridge, "up"])


# --- per node -----------------------------------------------------------------
def ensure_node_network(config: LabConfig, state: LabState, node: str) -> None:
    """netns `dtlab-<lab>-<node>` holding the node's interface (config.node_ifname: its address, no
    default route) on the bridge."""
    netns = config.netns_name(node)
    veth = config.veth_host_ifname(node)
    if netns_exists(netns) and netns not in state.created("netns"):
        raise DtlabError(f"lab {config.name}: network namespace {netns} exists, not created by this lab;"
                         f" delete it (`ip netns delete {netns}`) if it is a leftover")
    if not netns_exists(netns):
        state.record_created("netns", netns)
        run(["ip", "netns", "add", netns])
    if link_exists(veth) and not link_exists(config.node_ifname, netns):
        # A pair from before the node side was renamed (eth0 -> lab_node_ifname): make it anew.
        run(["ip", "link", "delete", veth])
    if not link_exists(veth):
        if link_exists(config.node_ifname, netns):  # half of a pair whose host side is gone
            run(["ip", "-n", netns, "link", "delete", config.node_ifname])
        state.record_created("links", veth)
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", config.node_ifname, "netns", netns])
    run(["ip", "link", "set", veth, "master", config.bridge_ifname, "up"])
    address = f"{config.node_address(node)}/{config.subnet.prefixlen}"
    run(["ip", "-n", netns, "addr", "replace", address, "dev", config.node_ifname])
    run(["ip", "-n", netns, "link", "set", config.node_ifname, "up"])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])


def remove_created(state: LabState) -> None:
    """Delete the netns and links this lab created (by name, as recorded), and nothing else."""
    for netns in list(state.created("netns")):
        if netns_exists(netns):
            run(["ip", "netns", "delete", netns], check=False)
        if not netns_exists(netns):
            state.forget_created("netns", netns)
    for link in list(state.created("links")):
        if link_exists(link):
            run(["ip", "link", "delete", link], check=False)
        if not link_exists(link):
            state.forget_created("links", link)
