"""Filter dtlab_interface_holding: the network interface that holds an address, read from a node's facts.

group_vars/all.yml's dtlab_node_socket_ifname uses it to find, per node, the interface its ansible_host
is on (the one gloo and NCCL must use), unless the inventory names one with dtlab_socket_ifname:

    {{ ansible_facts | dtlab_interface_holding(ansible_host) }}    ->  "enp1s0"

The facts are Ansible's own (setup module): one entry per interface with its `device` name and its
`ipv4`, `ipv4_secondaries` and `ipv6` addresses; interface names are read from `device`, never rebuilt
from the fact keys (which Ansible mangles: `-` and `:` become `_`).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ansible.errors import AnsibleFilterError


def _addresses(interface: dict[str, Any]) -> list[str]:
    """Every address an interface's facts list (primary and secondary IPv4, IPv6)."""
    found = []
    primary = interface.get("ipv4")
    for entry in [primary] if isinstance(primary, dict) else []:
        found.append(str(entry.get("address", "")))
    for key in ("ipv4_secondaries", "ipv6"):
        found += [
            str(entry.get("address", "")) for entry in interface.get(key) or [] if isinstance(entry, dict)
        ]
    return [address for address in found if address]


def _same_address(left: str, right: str) -> bool:
    try:
        return ipaddress.ip_address(left.split("%")[0]) == ipaddress.ip_address(right.split("%")[0])
    except ValueError:
        return False


def interfaces_with_addresses(facts: dict[str, Any]) -> dict[str, list[str]]:
    """{interface name: its addresses} from a node's facts (with or without the ansible_ prefix)."""
    interfaces = {}
    for value in facts.values():
        if isinstance(value, dict) and isinstance(value.get("device"), str) and "active" in value:
            interfaces[value["device"]] = _addresses(value)
    return interfaces


def dtlab_interface_holding(facts: dict[str, Any], address: str) -> str:
    """The name of the interface that holds `address`; one clear error when none (or several) do."""
    address = str(address)
    interfaces = interfaces_with_addresses(facts)
    holding = sorted(
        name
        for name, addresses in interfaces.items()
        if any(_same_address(address, held) for held in addresses)
    )
    if len(holding) == 1:
        return holding[0]
    host = facts.get("hostname") or facts.get("ansible_hostname") or "this node"
    if not holding:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            reason = f"ansible_host {address} is a name, not an address"
        else:
            listed = "; ".join(
                f"{name} {', '.join(addresses) or '(no address)'}"
                for name, addresses in sorted(interfaces.items())
            )
            reason = (
                f"no interface holds ansible_host {address} (interfaces: {listed or 'none in the facts'})"
            )
    else:
        reason = f"ansible_host {address} is on several interfaces ({', '.join(holding)})"
    raise AnsibleFilterError(
        f"{host}: {reason}; set dtlab_socket_ifname for this host to the interface"
        " the nodes talk to each other over"
    )


class FilterModule:
    def filters(self):
        return {"dtlab_interface_holding": dtlab_interface_holding}
