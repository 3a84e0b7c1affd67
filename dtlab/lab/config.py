"""The lab's shape: one instance's names, addresses and paths, derived from group_vars/lab.yml."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from dtlab import paths
from dtlab.errors import DtlabError

LAB_VARS_FILE = paths.LAB_VARS_FILE
DEFAULT_LAB_NAME = "dtlab"
# Host-side state: the image cache survives `lab.down --wipe`; node state lives per instance.
IMAGE_CACHE_DIR = Path(os.environ.get("DTLAB_IMAGE_CACHE", "/var/cache/dtlab/images"))
LAB_RUN_ROOT = Path(os.environ.get("DTLAB_LAB_ROOT", "/var/lib/dtlab/lab"))
# .deb files the apt proxies fetched, shared by all labs (apt verifies each against signed indexes).
APT_ARCHIVE_CACHE_DIR = Path(os.environ.get("DTLAB_APT_CACHE", "/var/cache/dtlab/apt-archives"))
NETNS_DIR = Path("/run/netns")
# Names become Linux ifnames (<= 15 chars) and directory names.
_LAB_NAME = re.compile(r"^[a-z][a-z0-9]{0,19}$")
_IFNAME_TAG_MAX = 8


@dataclass(frozen=True)
class LabConfig:
    name: str
    node_count: int
    subnet: ipaddress.IPv4Network
    address_range: ipaddress.IPv4Network
    node_address_offset: int
    node_name_prefix: str
    apt_proxy_port: int
    image_suite: str
    image_base_packages: tuple[str, ...]
    image_extra_packages: tuple[str, ...]
    wheelhouse_mount: str
    node_ifname: str  # the node side of each veth (lab_node_ifname), named like a KVM guest NIC
    shared_checkpoint_mount: str = ""  # dtlab_shared_checkpoint_dir: the lab's shared disk in each node
    bundle_mount: str = ""  # dtlab_bundle_dir (group_vars/all.yml): an offline lab's bundle in each node

    # --- names --------------------------------------------------------------
    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_LAB_NAME

    @property
    def node_names(self) -> list[str]:
        return [f"{self.node_name_prefix}{index}" for index in range(self.node_count)]

    @property
    def ifname_tag(self) -> str:
        """Short, per-instance prefix of the host-side interface names."""
        if len(self.name) <= _IFNAME_TAG_MAX:
            return self.name
        return self.name[:3] + hashlib.sha1(self.name.encode()).hexdigest()[:_IFNAME_TAG_MAX - 3]

    @property
    def bridge_ifname(self) -> str:
        return f"{self.ifname_tag}-br"

    def veth_host_ifname(self, node: str) -> str:
        return f"{self.ifname_tag}-n{self.node_index(node)}"

    def netns_name(self, node: str) -> str:
        return f"dtlab-{self.name}-{node}"

    def node_index(self, node: str) -> int:
        if node not in self.node_names:
            raise DtlabError(f"lab {self.name}: no node {node!r}; nodes are {', '.join(self.node_names)}")
        return self.node_names.index(node)

    # --- addresses ----------------------------------------------------------
    @property
    def bridge_address(self) -> ipaddress.IPv4Address:
        return self.subnet.network_address + 1

    def node_address(self, node: str) -> ipaddress.IPv4Address:
        return self.subnet.network_address + self.node_address_offset + self.node_index(node)

    @property
    def apt_proxy_url(self) -> str:
        return f"http://{self.bridge_address}:{self.apt_proxy_port}/"

    # --- paths --------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        """Host-side state of this instance: node upper dirs, mounts, PID files, logs."""
        return LAB_RUN_ROOT / self.name

    def node_dir(self, node: str) -> Path:
        return self.run_dir / node

    @property
    def shared_dir(self) -> Path:
        """The host directory every node mounts read-write at shared_checkpoint_mount (its "NFS")."""
        return self.run_dir / "shared"

    @property
    def controller_dir(self) -> Path:
        """Controller-side secrets of this instance (git-ignored): SSH key pair, known_hosts."""
        return paths.STATE_DIR / "lab" / self.name

    @property
    def private_key_path(self) -> Path:
        return self.controller_dir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.controller_dir / "known_hosts"

    @property
    def inventory_path(self) -> Path:
        filename = "lab.yml" if self.is_default else f"lab-{self.name}.yml"
        return paths.INVENTORY_DIR / filename

    @property
    def cluster_name(self) -> str:
        """Name results and secrets are filed under (dtlab_cluster_name)."""
        return "lab" if self.is_default else f"lab-{self.name}"


def _lab_vars() -> dict:
    try:
        return yaml.safe_load(LAB_VARS_FILE.read_text()) or {}
    except OSError as error:
        raise DtlabError(f"{LAB_VARS_FILE}: cannot read ({error.strerror}); restore it from git") from error


def _derived_subnet(name: str, address_range: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """A deterministic /24 for a non-default lab, away from the default's /24 (x.x.77.0)."""
    third_octet = 100 + zlib.crc32(name.encode()) % 150
    base = int(address_range.network_address) + (third_octet << 8)
    return ipaddress.IPv4Network((base, 24))


def load_config(name: str | None = None, node_count: int | None = None,
                subnet: str | None = None) -> LabConfig:
    """The instance `name` (default: $DTLAB_LAB_NAME or "dtlab") as group_vars/lab.yml shapes it."""
    name = name or os.environ.get("DTLAB_LAB_NAME") or DEFAULT_LAB_NAME
    if not _LAB_NAME.match(name):
        raise DtlabError(f"lab name {name!r}: use 1-20 lowercase letters/digits starting with a letter")
    lab_vars = _lab_vars()

    def key(key_name: str):
        if key_name not in lab_vars:
            raise DtlabError(f"{LAB_VARS_FILE}: {key_name}: missing; restore it from git")
        return lab_vars[key_name]

    try:
        address_range = ipaddress.IPv4Network(key("lab_address_range"))
        subnet_text = subnet or os.environ.get("DTLAB_LAB_SUBNET")
        if subnet_text:
            chosen_subnet = ipaddress.IPv4Network(subnet_text)
        elif name == DEFAULT_LAB_NAME:
            chosen_subnet = ipaddress.IPv4Network(key("lab_default_subnet"))
        else:
            chosen_subnet = _derived_subnet(name, address_range)
    except ValueError as error:
        raise DtlabError(f"lab subnet: {error}; give a /24 like 10.213.77.0/24") from error
    if chosen_subnet.prefixlen != 24 or not chosen_subnet.subnet_of(address_range):
        raise DtlabError(f"lab subnet {chosen_subnet}: must be a /24 inside {address_range}"
                         " (the guarded range)")
    count = int(node_count if node_count is not None else key("lab_node_count"))
    offset = int(key("lab_node_address_offset"))
    if not 2 <= count <= 250 - offset:
        raise DtlabError(f"{LAB_VARS_FILE}: lab_node_count: must be 2..{250 - offset}, got {count}")
    return LabConfig(
        name=name,
        node_count=count,
        subnet=chosen_subnet,
        address_range=address_range,
        node_address_offset=offset,
        node_name_prefix=str(key("lab_node_name_prefix")),
        apt_proxy_port=int(key("lab_apt_proxy_port")),
        image_suite=str(key("lab_image_suite")),
        image_base_packages=tuple(key("lab_image_base_packages")),
        image_extra_packages=tuple(key("lab_image_extra_packages")),
        wheelhouse_mount=str(key("lab_wheelhouse_mount")),
        node_ifname=str(key("lab_node_ifname")),
        shared_checkpoint_mount=str(lab_vars.get("dtlab_shared_checkpoint_dir") or ""),
        bundle_mount=str(_all_vars().get("dtlab_bundle_dir") or ""),
    )


def _all_vars() -> dict:
    """group_vars/all.yml, for the one plain path the lab's nodes need from it (dtlab_bundle_dir)."""
    path = paths.INVENTORY_DIR / "group_vars" / "all.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
