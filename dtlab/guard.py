"""The lab's guard route: the host blackholes the whole lab address range, so a packet to a lab address
never leaves the machine, even while no lab is up.

remote checks it before any SSH to a lab address; lab installs it. It sits below both, so the generic
remote layer never imports the lab.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from functools import cache

import yaml

from dtlab import paths
from dtlab.errors import DtlabError


@cache
def lab_address_range() -> ipaddress.IPv4Network:
    """The range every lab lives in (group_vars/lab.yml's lab_address_range)."""
    try:
        return ipaddress.IPv4Network(yaml.safe_load(paths.LAB_VARS_FILE.read_text())["lab_address_range"])
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise DtlabError(
            f"{paths.LAB_VARS_FILE}: no valid lab_address_range ({error}); restore it from git"
        ) from None


def guard_present(address_range: ipaddress.IPv4Network) -> bool:
    """True if the host blackholes the whole range (packets to it never leave the host)."""
    argv = ["ip", "-j", "route", "show", "type", "blackhole", "exact", str(address_range)]
    try:
        answer = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError as error:
        raise DtlabError("ip: not installed; install iproute2 (scripts/setup.sh does)") from error
    routes = json.loads(answer.stdout or "[]")
    return any(route.get("type") == "blackhole" for route in routes)


def assert_safe_target(address: str) -> None:
    """Refuse to send a packet to a lab address unless the guard route is in place.

    Without the guard, traffic to a lab address while the lab is down would leave through the default
    route; that is forbidden. Other addresses (loopback, a real cluster) pass through unchecked.
    """
    try:
        target = ipaddress.ip_address(address)
    except ValueError:
        return  # a DNS name: the user's real cluster
    address_range = lab_address_range()
    if target in address_range and not guard_present(address_range):
        raise DtlabError(f"lab address {address}: the guard route `blackhole {address_range}` is missing;"
                         " run `invoke lab.up` (it installs the guard first) before talking to lab nodes")
